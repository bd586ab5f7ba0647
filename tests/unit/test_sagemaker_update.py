"""UpdateCluster applies what hyperplan models (counts, Kubernetes labels and taints, deep checks,
node recovery) and refuses anything else by name before it writes; the groups of one call change
together or none does."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from kubernetes.client.exceptions import ApiException

from hyperplan.runtime.store import GROUPS, NODES, PLANS, POOLS, WatchCache
from hyperplan.sagemaker import operations
from hyperplan.sagemaker.wire import ApiError
from tests.unit.test_sagemaker_api import ACCOUNT, RecordingWrites, group, plan

ROLE = "arn:aws:iam::111122223333:role/hp"
PLAN_ARN = f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:training-plan/"


def world() -> tuple[operations.Context, RecordingWrites]:
    plans = {"ultra": [plan("ultra", "Active", 2, ultra=True)]}
    a, b = group("a", "ultra", 2), group("b", "ultra", 1)
    a["spec"].update(labels={"team": "vision", "tier": "gold"}, taints=[{"key": "gpu", "value": "", "effect": "NoSchedule"}],
                     onStartDeepHealthChecks=["InstanceStress"])
    cache = WatchCache()
    cache.bind({PLANS: plans, POOLS: {}, GROUPS: {"a": [a], "b": [b]}, NODES: {}})
    writes = RecordingWrites()
    writes.plans = plans
    return operations.Context(fleet=cache, account=ACCOUNT, region="us-west-2", now=datetime.now(timezone.utc),
                              cluster_name="lab", user="alice", writes=writes), writes


def spec(name: str, count: int, **more) -> dict:
    return {"InstanceGroupName": name, "InstanceCount": count, "ExecutionRole": ROLE, **more}


def test_counts_labels_taints_and_checks_are_applied_in_one_patch_per_group() -> None:
    ctx, writes = world()
    operations.call("UpdateCluster", {"ClusterName": "lab", "InstanceGroups": [
        spec("a", 4, KubernetesConfig={"Labels": {"team": "speech"},
                                       "Taints": [{"Key": "gpu", "Effect": "NoExecute"}]},
             OnStartDeepHealthChecks=["InstanceStress", "InstanceConnectivity"]),
        spec("b", 3)]}, ctx)
    assert writes.calls == [
        ("patch_group", "alice", "a", {"spec": {
            "instanceCount": 4, "onStartDeepHealthChecks": ["InstanceStress", "InstanceConnectivity"],
            "labels": {"tier": None, "team": "speech"}, "taints": [{"key": "gpu", "value": "", "effect": "NoExecute"}]}}),
        ("patch_group", "alice", "b", {"spec": {"instanceCount": 3}})]


def test_what_is_so_already_writes_nothing() -> None:
    ctx, writes = world()
    operations.call("UpdateCluster", {"ClusterName": "lab", "NodeRecovery": "Automatic", "InstanceGroups": [
        spec("a", 2, InstanceType="ml.p6e-gb200.36xlarge", TrainingPlanArn=PLAN_ARN + "ultra",
             KubernetesConfig={"Labels": {"team": "vision", "tier": "gold"},
                               "Taints": [{"Key": "gpu", "Effect": "NoSchedule"}]},
             OnStartDeepHealthChecks=["InstanceStress"])]}, ctx)
    assert writes.calls == []


def test_node_recovery_alone_is_set_on_every_group() -> None:
    ctx, writes = world()
    operations.call("UpdateCluster", {"ClusterName": "lab", "NodeRecovery": "None"}, ctx)
    assert writes.calls == [("patch_group", "alice", "a", {"spec": {"nodeRecovery": "None"}}),
                            ("patch_group", "alice", "b", {"spec": {"nodeRecovery": "None"}})]


@pytest.mark.parametrize("body, named", [
    pytest.param({"InstanceGroups": [spec("a", 3, LifeCycleConfig={"SourceS3Uri": "s3://b/p", "OnCreate": "x.sh"})]},
                 "LifeCycleConfig", id="lifecycle-config"),
    pytest.param({"InstanceGroups": [spec("a", 3, ThreadsPerCore=1)]}, "ThreadsPerCore", id="threads-per-core"),
    pytest.param({"InstanceGroups": [spec("a", 3, MinInstanceCount=1)]}, "MinInstanceCount", id="min-count"),
    pytest.param({"InstanceGroups": [spec("a", 3, InstanceType="ml.p5.48xlarge")]}, "InstanceType",
                 id="another-instance-type"),
    pytest.param({"InstanceGroups": [spec("a", 3, TrainingPlanArn=PLAN_ARN + "other")]}, "TrainingPlanArn",
                 id="another-plan"),
    pytest.param({"InstanceGroups": [spec("a", 3, OnStartDeepHealthChecks=["MultiNodeTrainingValidation"])]},
                 "MultiNodeTrainingValidation", id="a-check-not-run"),
    pytest.param({"InstanceGroups": [spec("a", 3, KubernetesConfig={"Labels": {"a": "b"}, "Extra": 1})]}, "Extra",
                 id="kubernetes-config-member"),
    pytest.param({"InstanceGroups": [spec("a", 3, KubernetesConfig={"Labels": {"team": "a b"}})]}, "team",
                 id="label-value-pattern"),
    pytest.param({"InstanceGroups": [spec("a", 3), spec("b", 2, ImageId="ami-0123456789abcdef0")]}, "ImageId",
                 id="the-second-group-refused"),
    pytest.param({"InstanceGroups": [spec("a", 3)], "AutoScaling": {"Mode": "Enable"}}, "AutoScaling",
                 id="auto-scaling"),
    pytest.param({"NodeRecovery": "None", "ClusterRole": ROLE}, "ClusterRole", id="cluster-role"),
    pytest.param({"InstanceGroups": [spec("a", 3)], "InstanceGroupsToDelete": ["b"]}, "InstanceGroupsToDelete",
                 id="groups-to-delete"),
    pytest.param({"InstanceGroups": [spec("a", 3), spec("a", 4)]}, "more than once", id="a-group-twice"),
    pytest.param({}, "InstanceGroups or NodeRecovery", id="nothing-asked"),
])
def test_anything_not_applied_is_refused_by_name_before_anything_is_written(body: dict, named: str) -> None:
    ctx, writes = world()
    with pytest.raises(ApiError) as refused:
        operations.call("UpdateCluster", {"ClusterName": "lab", **body}, ctx)
    assert refused.value.code == "ValidationException" and named in refused.value.message, refused.value
    assert writes.calls == []


def test_a_refusal_of_one_group_sets_the_others_back() -> None:
    ctx, writes = world()
    real = writes.patch_group

    def patch_group(user: str, name: str, patch: dict) -> None:
        if name == "b":
            raise ApiException(status=422, reason="Unprocessable Entity")
        real(user, name, patch)

    writes.patch_group = patch_group
    with pytest.raises(ApiException):
        operations.call("UpdateCluster", {"ClusterName": "lab", "InstanceGroups": [
            spec("a", 4, KubernetesConfig={"Labels": {"team": "speech", "new": "x"}}), spec("b", 3)]}, ctx)
    assert writes.calls == [
        ("patch_group", "alice", "a", {"spec": {"instanceCount": 4, "labels": {"tier": None, "team": "speech",
                                                                              "new": "x"}}}),
        ("patch_group", "alice", "a", {"spec": {"instanceCount": 2, "labels": {"new": None, "team": "vision",
                                                                              "tier": "gold"}}})]


def test_a_new_group_name_creates_a_group_bound_as_the_request_says() -> None:
    ctx, writes = world()
    operations.call("UpdateCluster", {"ClusterName": "lab", "NodeRecovery": "None", "InstanceGroups": [
        spec("a", 3), spec("fresh", 2, TrainingPlanArn=PLAN_ARN + "ultra", OnStartDeepHealthChecks=["InstanceStress"],
                          KubernetesConfig={"Labels": {"team": "new"}, "Taints": [{"Key": "gpu", "Effect": "NoSchedule"}]})]},
                    ctx)
    assert writes.calls == [
        ("patch_group", "alice", "a", {"spec": {"instanceCount": 3, "nodeRecovery": "None"}}),
        ("patch_group", "alice", "b", {"spec": {"nodeRecovery": "None"}}),
        ("create_group", "alice", "fresh", {
            "trainingPlanRef": "ultra", "instanceType": "ml.p6e-gb200.36xlarge", "instanceCount": 2,
            "nodeRecovery": "None", "onStartDeepHealthChecks": ["InstanceStress"], "labels": {"team": "new"},
            "taints": [{"key": "gpu", "value": "", "effect": "NoSchedule"}]})]


@pytest.mark.parametrize("extra, code", [
    pytest.param({}, "ValidationException", id="no-plan"),
    pytest.param({"TrainingPlanArn": PLAN_ARN + "nobody"}, "ResourceNotFound", id="an-unknown-plan"),
    pytest.param({"TrainingPlanArn": PLAN_ARN + "ultra", "InstanceType": "ml.p5.48xlarge"}, "ValidationException",
                 id="not-the-plans-type"),
])
def test_a_new_group_that_cannot_be_made_writes_nothing(extra: dict, code: str) -> None:
    ctx, writes = world()
    with pytest.raises(ApiError) as refused:
        operations.call("UpdateCluster", {"ClusterName": "lab", "InstanceGroups": [spec("a", 3), spec("fresh", 1, **extra)]},
                        ctx)
    assert refused.value.code == code and writes.calls == []


def test_a_refused_creation_sets_the_patched_groups_back() -> None:
    ctx, writes = world()

    def create_group(user: str, body: dict) -> None:
        raise ApiException(status=403, reason="Forbidden")  # the caller may not create groups

    writes.create_group = create_group
    with pytest.raises(ApiException):
        operations.call("UpdateCluster", {"ClusterName": "lab", "InstanceGroups": [
            spec("a", 3), spec("fresh", 1, TrainingPlanArn=PLAN_ARN + "ultra")]}, ctx)
    assert writes.calls == [("patch_group", "alice", "a", {"spec": {"instanceCount": 3}}),
                            ("patch_group", "alice", "a", {"spec": {"instanceCount": 2}})]
