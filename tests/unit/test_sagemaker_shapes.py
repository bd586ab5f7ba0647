"""Every answer of hyperplan's SageMaker API against botocore's own model
(hyperplan_testing.botocore_shapes): the checker itself, every served operation driven once by
the real boto3 with each answer checked (the autouse ``model_checked`` of
tests/unit/test_sagemaker_api.py checks every answer of every test there too), and the fixes the
checker found: node hostnames of the model's pattern, labels the model can carry, node ids of
the model's pattern in a batch's answer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes.client.exceptions import ApiException

from hyperplan.sagemaker import hyperpod, operations
from hyperplan_testing import botocore_shapes
from tests.aws.clients import boto3_calls
from tests.unit.test_sagemaker_api import (  # noqa: F401 - model_checked: every answer here is checked
    ACCOUNT, ANSWERS, Server, group, model_checked, model_violations, node, ok, plan, signed_in,
)

PLAN_ARN = f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:training-plan/"
EVENT = "0b1e7c7e-0000-4000-8000-000000000001"
RC_ARN = f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:reserved-capacity/"


# --------------------------------------------------------------------------- the checker


@pytest.mark.parametrize("operation, answer, found", [
    pytest.param("DescribeClusterNode", {"NodeDetails": {"PrivateDnsHostname": "node-0"}}, "pattern",
                 id="pattern"),
    pytest.param("DescribeClusterNode", {"NodeDetails": {"InstanceStatus": {"Status": "Sleeping"}}}, "enum",
                 id="enum"),
    pytest.param("DescribeClusterNode", {"NodeDetails": {"InstanceStatus": {"Message": "m"}}}, "required",
                 id="required-member"),
    pytest.param("DescribeClusterNode", {"NodeDetails": {"ThreadsPerCore": 3}}, "range", id="range"),
    pytest.param("DescribeClusterNode", {"NodeDetails": {"LaunchTime": "2027-01-01T00:00:00Z"}}, "epoch",
                 id="timestamp-as-epoch"),
    pytest.param("DescribeClusterNode", {"NodeDetails": {"KubernetesConfig": {"CurrentLabels": {"a": ""}}}},
                 "bounds", id="empty-label-value"),
    pytest.param("DescribeClusterNode", {"NodeDetails": {"Nickname": "x"}}, "no member", id="unknown-member"),
    pytest.param("ListClusterNodes", {}, "required", id="required-list"),
    pytest.param("ListClusterNodes", {"ClusterNodeSummaries": "none"}, "list", id="list-type"),
    pytest.param("BatchRebootClusterNodes", {"Failed": [{"NodeId": "node-0", "ErrorCode": "InstanceIdNotFound",
                                                         "Message": "m"}]}, "pattern", id="nested-list-pattern"),
    pytest.param("BatchRebootClusterNodes", {"Successful": []}, "bounds", id="list-length"),
    pytest.param("ListTags", {"Tags": [{"Key": "team#1", "Value": "v"}]}, "pattern", id="unicode-class-pattern"),
    pytest.param("DescribeTrainingPlan", {"TrainingPlanArn": PLAN_ARN + "p", "TrainingPlanName": "p",
                                          "Status": "Active", "TotalInstanceCount": True}, "integer",
                 id="a-boolean-is-no-integer"),
])
def test_the_checker_finds_each_kind_of_violation(operation: str, answer: dict, found: str) -> None:
    violations = botocore_shapes.violations(operation, answer)
    assert any(found in v for v in violations), violations


def test_the_checker_passes_what_the_model_allows() -> None:
    assert botocore_shapes.violations("ListTags", {"Tags": [{"Key": "cost centre", "Value": "ml/42 = über+@"}]}) == []
    assert botocore_shapes.violations("DescribeClusterNode", {"NodeDetails": {
        "PrivateDnsHostname": "ip-10-1-2-3.us-west-2.compute.internal", "PrivatePrimaryIp": "10.1.2.3",
        "InstanceStatus": {"Status": "DeepHealthCheckInProgress"}, "LaunchTime": 1.5,
        "KubernetesConfig": {"CurrentLabels": {"topology.kubernetes.io/zone": "us-west-2a"}}}}) == []


@pytest.mark.parametrize("status, body, found", [
    pytest.param(400, {"__type": "ResourceNotFound", "message": "m"}, "neither", id="not-modeled-for-the-op"),
    pytest.param(200, {"__type": "ValidationException", "message": "m"}, "status", id="not-an-error-status"),
    pytest.param(400, {"message": "m"}, "error body", id="no-type"),
])
def test_the_checker_finds_errors_the_model_does_not_list(status: int, body: dict, found: str) -> None:
    violations = botocore_shapes.error_violations("ListTags", status, body)
    assert any(found in v for v in violations), violations
    assert botocore_shapes.error_violations("DescribeCluster", 400, {"__type": "ResourceNotFound", "message": "m"}) \
        == []


def test_the_modeled_errors_of_every_served_operation_are_the_models() -> None:
    assert set(operations.MODELED_ERRORS) == set(operations.OPERATIONS)
    for operation, codes in operations.MODELED_ERRORS.items():
        assert codes == botocore_shapes.modeled_errors(operation), operation


def test_a_specific_error_the_model_does_not_list_is_a_validation_exception() -> None:
    from hyperplan.sagemaker.wire import ApiError

    conflict = ApiError("ConflictException", "changed meanwhile")
    assert operations.modeled(conflict, "UpdateCluster") is conflict
    assert operations.modeled(conflict, "ExtendTrainingPlan").code == "ValidationException"
    assert operations.modeled(ApiError("ResourceNotFound", "m"), "ListTags").code == "ValidationException"


# --------------------------------------------------------------------------- every operation, once


def labelled(name: str, **more) -> dict:
    """A node of the group ``trainers`` with labels and taints as Kubernetes allows them."""
    made = node(name, "trainers", created=more.pop("created", "2027-03-01T02:00:00Z"))
    made["metadata"]["labels"].update({"empty": "", "team": "vision"}, **more.pop("labels", {}))
    made["spec"]["taints"] = [{"key": "dedicated", "effect": "NoSchedule"},
                              {"key": "team", "value": "vision", "effect": "NoExecute"}]
    made.update(more)
    return made


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    plans = {"ultra": [plan("ultra", "Active", 2, ultra=True)], "plain": [plan("plain", "Scheduled", 5)]}
    nodes = {("group", "trainers"): [
        labelled("trainers-0", status={"addresses": [{"type": "InternalIP", "address": "192.168.7.21"}],
                                       "conditions": [{"type": "Ready", "status": "True"}]}),
        labelled("trainers-1", labels={"sagemaker.amazonaws.com/deep-health-check-status": "InProgress"},
                 created="2027-03-01T02:00:01Z"),
        labelled("trainers-2", created="2027-03-01T02:00:02Z")]}
    s = Server(plans, {"trainers": [group("trainers", "ultra", 3)]}, nodes)
    s.writes.events = [{"metadata": {"name": "e", "namespace": "default", "uid": EVENT}, "type": "Warning",
                        "involvedObject": {"kind": "Node", "name": "trainers-0"}, "reason": "NodeUnhealthy",
                        "message": "m", "lastTimestamp": "2027-03-01T02:00:00Z"}]
    yield s
    s.close()


def every_operation(server: Server) -> list[dict]:
    """One call of each served operation, each to be answered 200."""
    ids = [hyperpod.instance_id(f"trainers-{i}") for i in range(3)]
    return [
        {"op": "search_training_plan_offerings", "args": {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 2,
                                                          "DurationHours": 48}},
        {"op": "search_training_plan_offerings", "args": {"TrainingPlanArn": PLAN_ARN + "plain"}},
        {"op": "create_training_plan", "args": {"TrainingPlanName": "ultra",
                                                "TrainingPlanOfferingId": "set-below"}},
        {"op": "extend_training_plan", "args": {"TrainingPlanExtensionOfferingId": "set-below"}},
        {"op": "describe_training_plan_extension_history", "args": {"TrainingPlanArn": PLAN_ARN + "plain"}},
        {"op": "describe_training_plan", "args": {"TrainingPlanName": "ultra"}},
        {"op": "list_training_plans", "args": {}},
        {"op": "describe_reserved_capacity", "args": {"ReservedCapacityArn": RC_ARN + "rc-ultra"}},
        {"op": "list_ultra_servers_by_reserved_capacity", "args": {"ReservedCapacityArn": RC_ARN + "rc-ultra"}},
        {"op": "list_tags", "args": {"ResourceArn": PLAN_ARN + "ultra"}},
        {"op": "add_tags", "args": {"ResourceArn": PLAN_ARN + "plain", "Tags": [{"Key": "team", "Value": "vision"}]}},
        {"op": "delete_tags", "args": {"ResourceArn": PLAN_ARN + "plain", "TagKeys": ["team"]}},
        {"op": "describe_cluster", "args": {"ClusterName": "lab"}},
        {"op": "list_clusters", "args": {}},
        {"op": "list_cluster_nodes", "args": {"ClusterName": "lab"}},
        {"op": "describe_cluster_node", "args": {"ClusterName": "lab", "NodeId": ids[0]}},
        {"op": "describe_cluster_node", "args": {"ClusterName": "lab", "NodeId": ids[1]}},
        {"op": "update_cluster", "args": {"ClusterName": "lab", "InstanceGroups": [
            {"InstanceGroupName": "trainers", "InstanceCount": 3,
             "ExecutionRole": "arn:aws:iam::111122223333:role/hp"}]}},
        {"op": "batch_replace_cluster_nodes", "args": {"ClusterName": "lab", "NodeIds": [ids[2]]}},
        {"op": "batch_reboot_cluster_nodes", "args": {"ClusterName": "lab",
                                                      "NodeIds": [ids[2], "i-00000000000000000"]}},
        {"op": "list_cluster_events", "args": {"ClusterName": "lab"}},
        {"op": "describe_cluster_event", "args": {"ClusterName": "lab", "EventId": EVENT}},
    ]


def test_every_served_operation_answers_as_the_model_says(server: Server) -> None:
    """Each operation hyperplan serves, driven by boto3 and answered 200; every answer (the JSON
    as it crossed the wire) is checked against the model by ``model_checked``."""
    from hyperplan.sagemaker.operations import api_extension_id

    calls = every_operation(server)
    endpoint = signed_in(server)
    [offers] = [ok(a) for a in boto3_calls(endpoint, calls[:1])]
    # A create the plan of that name already answers (a retry of the same offering by its maker)
    # would need the offering it was made of: buy a fresh one instead, under a new name.
    calls[2]["args"] = {"TrainingPlanName": "bought", "Tags": [{"Key": "team", "Value": "vision"}],
                        "TrainingPlanOfferingId": offers["TrainingPlanOfferings"][0]["TrainingPlanOfferingId"]}
    calls[3]["args"]["TrainingPlanExtensionOfferingId"] = api_extension_id("tpe-20270101t000000-0123456789abcdef",
                                                                           "plain")
    answers = boto3_calls(endpoint, calls[1:])
    try:
        extend = answers[2]
        assert extend.get("error", {}).get("code") == "ResourceNotFound"  # a made-up extension: not ours
        assert all("ok" in a for i, a in enumerate(answers) if i != 2), answers
        answered = {a.operation for a in ANSWERS if a.status == 200}
        assert set(operations.OPERATIONS) - answered == {"ExtendTrainingPlan"}
        assert model_violations(list(ANSWERS)) == []
        nodes = {n["InstanceId"]: n for n in answers[13]["ok"]["ClusterNodeSummaries"]}
        ids = [hyperpod.instance_id(f"trainers-{i}") for i in range(3)]
        assert nodes[ids[0]]["PrivateDnsHostname"] == "ip-192-168-7-21.us-west-2.compute.internal"
        assert nodes[ids[1]]["InstanceStatus"]["Status"] == "DeepHealthCheckInProgress"
        detail = answers[14]["ok"]["NodeDetails"]
        assert detail["PrivatePrimaryIp"] == "192.168.7.21"
        assert detail["KubernetesConfig"]["CurrentLabels"]["team"] == "vision"
        assert "empty" not in detail["KubernetesConfig"]["CurrentLabels"]
        assert detail["KubernetesConfig"]["CurrentTaints"] == [
            {"Key": "dedicated", "Effect": "NoSchedule"}, {"Key": "team", "Value": "vision", "Effect": "NoExecute"}]
    finally:
        server.plans.pop("bought", None)


def test_a_made_up_hostname_is_stable_and_of_the_pattern() -> None:
    first, again = hyperpod.private_ip("node-a"), hyperpod.private_ip("node-a")
    assert first == again and first.startswith("10.") and first != hyperpod.private_ip("node-b")
    assert hyperpod.private_dns_hostname("10.1.2.3", "us-east-1") == "ip-10-1-2-3.ec2.internal"
    assert hyperpod.private_ip("n", {"status": {"addresses": [{"type": "Hostname", "address": "n"},
                                                              {"type": "InternalIP", "address": "fd00::1"},
                                                              {"type": "InternalIP", "address": "172.16.0.9"}]}}) \
        == "172.16.0.9"


# --------------------------------------------------------------------------- batches


@pytest.mark.parametrize("op", ["batch_replace_cluster_nodes", "batch_reboot_cluster_nodes"])
def test_a_node_id_of_another_pattern_is_refused_before_anything_is_done(server: Server, op: str) -> None:
    server.writes.calls.clear()
    answer = boto3_calls(signed_in(server), [{"op": op, "args": {
        "ClusterName": "lab", "NodeIds": [hyperpod.instance_id("trainers-0"), "trainers-1"]}}])[0]
    assert answer["error"]["code"] == "ValidationException" and "trainers-1" in answer["error"]["message"]
    assert server.writes.calls == []


def test_a_node_named_twice_is_acted_on_once_and_a_refusal_fails_only_its_node(server: Server, monkeypatch) -> None:
    ids = [hyperpod.instance_id(f"trainers-{i}") for i in range(3)]
    real = server.writes.label_node

    def label_node(user: str, name: str, labels: dict) -> None:
        if name == "trainers-1":
            raise ApiException(status=403, reason="Forbidden")  # admission refused this one node
        real(user, name, labels)

    monkeypatch.setattr(server.writes, "label_node", label_node)
    server.writes.calls.clear()
    [answer] = boto3_calls(signed_in(server), [{"op": "batch_reboot_cluster_nodes", "args": {
        "ClusterName": "lab", "NodeIds": [ids[0], ids[1], ids[0], ids[2]]}}])
    got = ok(answer)
    assert got["Successful"] == [ids[0], ids[2]]
    assert [(f["NodeId"], f["ErrorCode"]) for f in got["Failed"]] == [(ids[1], "InvalidInstanceStatus")]
    assert [c[2] for c in server.writes.calls] == ["trainers-0", "trainers-2"]


# --------------------------------------------------------------------------- the cluster as its groups have it


def cluster_ctx(groups: list[dict], nodes: dict | None = None, **more) -> operations.Context:
    from datetime import datetime, timezone

    from hyperplan.runtime.store import GROUPS, NODES, PLANS, POOLS, WatchCache

    cache = WatchCache()
    cache.bind({PLANS: {"ultra": [plan("ultra", "Active", 2, ultra=True)]}, POOLS: {},
                GROUPS: {g["metadata"]["name"]: [g] for g in groups}, NODES: nodes or {}})
    return operations.Context(fleet=cache, account=ACCOUNT, region="us-west-2", now=datetime.now(timezone.utc),
                              cluster_name="lab", **more)


def shaped(name: str, phase: str = "Ready", **spec) -> dict:
    made = group(name, "ultra", 2)
    made["spec"].update(spec)
    made["status"] = {"phase": phase}
    return made


def test_describe_cluster_reports_each_groups_labels_taints_checks_and_recovery() -> None:
    labelled_group = shaped("trainers", labels={"team": "vision", "tier": "gold"},
                            taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}],
                            onStartDeepHealthChecks=["InstanceStress"], nodeRecovery="None")
    on_node = node("trainers-0", "trainers")
    on_node["metadata"]["labels"]["team"] = "vision"  # tier not applied yet
    on_node["spec"]["taints"] = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]
    ctx = cluster_ctx([labelled_group], {("group", "trainers"): [on_node]},
                      eks_cluster_arn="arn:aws:eks:us-west-2:123456789012:cluster/lab")
    got = operations.call("DescribeCluster", {"ClusterName": "lab"}, ctx)
    assert botocore_shapes.violations("DescribeCluster", got) == []
    [details] = got["InstanceGroups"]
    assert details["KubernetesConfig"] == {
        "CurrentLabels": {"team": "vision"}, "DesiredLabels": {"team": "vision", "tier": "gold"},
        "CurrentTaints": [{"Key": "dedicated", "Value": "ml", "Effect": "NoSchedule"}],
        "DesiredTaints": [{"Key": "dedicated", "Value": "ml", "Effect": "NoSchedule"}]}
    assert details["OnStartDeepHealthChecks"] == ["InstanceStress"]
    assert got["NodeRecovery"] == "None"
    assert got["Orchestrator"] == {"Eks": {"ClusterArn": "arn:aws:eks:us-west-2:123456789012:cluster/lab"}}
    assert "Orchestrator" not in operations.call("DescribeCluster", {"ClusterName": "lab"}, cluster_ctx([]))


@pytest.mark.parametrize("phases, status, recovery", [
    pytest.param(["Ready", "Ready"], "InService", "Automatic", id="all-ready"),
    pytest.param(["Ready", "Provisioning"], "Updating", "Automatic", id="one-scaling"),
    pytest.param(["Ready", "Waiting"], "Updating", "Automatic", id="one-being-made"),
    pytest.param(["Ready", "Failed"], "InService", "Automatic", id="one-failed"),
    pytest.param(["Failed", "Failed"], "Failed", "Automatic", id="all-failed"),
])
def test_the_clusters_status_is_its_groups(phases: list[str], status: str, recovery: str) -> None:
    ctx = cluster_ctx([shaped(f"g{i}", phase) for i, phase in enumerate(phases)])
    got = operations.call("DescribeCluster", {"ClusterName": "lab"}, ctx)
    assert botocore_shapes.violations("DescribeCluster", got) == []
    assert (got["ClusterStatus"], got["NodeRecovery"]) == (status, recovery)
    assert ("FailureMessage" in got) == ("Failed" in phases)
    [summary] = operations.call("ListClusters", {}, ctx)["ClusterSummaries"]
    assert summary["ClusterStatus"] == status


def test_groups_that_differ_in_recovery_answer_none_for_the_cluster() -> None:
    ctx = cluster_ctx([shaped("a", nodeRecovery="None"), shaped("b")])
    assert "NodeRecovery" not in operations.call("DescribeCluster", {"ClusterName": "lab"}, ctx)


@pytest.mark.parametrize("body, shown", [
    pytest.param({}, True, id="no-filter"),
    pytest.param({"CreationTimeAfter": 1800000000}, True, id="created-after"),  # 2027-02-01 is 1801440000
    pytest.param({"CreationTimeAfter": 1801440000}, False, id="not-strictly-after"),
    pytest.param({"CreationTimeBefore": 1800000000}, False, id="created-before"),
    pytest.param({"NameContains": "la"}, True, id="name-contains"),
    pytest.param({"NameContains": "other"}, False, id="another-name"),
    pytest.param({"TrainingPlanArn": PLAN_ARN + "ultra"}, True, id="its-plan"),
    pytest.param({"TrainingPlanArn": PLAN_ARN + "other"}, False, id="another-plan"),
])
def test_list_clusters_honours_its_filters(body: dict, shown: bool) -> None:
    got = operations.call("ListClusters", body, cluster_ctx([shaped("trainers")]))
    assert botocore_shapes.violations("ListClusters", got) == []
    assert len(got["ClusterSummaries"]) == (1 if shown else 0)


@pytest.mark.parametrize("body", [
    pytest.param({"MaxResults": 0}, id="max-results-minimum"),
    pytest.param({"MaxResults": 101}, id="max-results-maximum"),
    pytest.param({"NameContains": "a_b"}, id="name-contains-pattern"),
    pytest.param({"NameContains": "a" * 64}, id="name-contains-length"),
    pytest.param({"SortBy": "SIZE"}, id="sort-by-enum"),
    pytest.param({"SortOrder": "Up"}, id="sort-order-enum"),
    pytest.param({"TrainingPlanArn": "arn:aws:s3:::bucket-of-fifty-characters-or-more-to-pass-length"},
                 id="plan-arn-pattern"),
    pytest.param({"CreationTimeAfter": "yesterday"}, id="time-type"),
    pytest.param({"NextToken": "forged"}, id="forged-token"),
])
def test_list_clusters_checks_its_inputs(body: dict) -> None:
    from hyperplan.sagemaker.wire import ApiError

    with pytest.raises(ApiError) as refused:
        operations.call("ListClusters", body, cluster_ctx([shaped("trainers")]))
    assert refused.value.code == "ValidationException"


def test_a_bought_blocks_ultraservers_are_listed_before_it_runs() -> None:
    from datetime import datetime, timezone

    from hyperplan.runtime.store import GROUPS, NODES, PLANS, POOLS, WatchCache

    scheduled = plan("later", "Scheduled", 30, ultra=True)
    scheduled["spec"]["spareInstancesPerUltraServer"] = 2
    expired = plan("done", "Expired", 1, ultra=True)
    cache = WatchCache()
    cache.bind({PLANS: {"later": [scheduled], "done": [expired]}, POOLS: {}, GROUPS: {}, NODES: {}})
    ctx = operations.Context(fleet=cache, account=ACCOUNT, region="us-west-2", now=datetime.now(timezone.utc))
    got = operations.call("ListUltraServersByReservedCapacity", {"ReservedCapacityArn": RC_ARN + "rc-later"}, ctx)
    assert botocore_shapes.violations("ListUltraServersByReservedCapacity", got) == []
    assert [(u["UltraServerId"], u["TotalInstanceCount"], u["ConfiguredSpareInstanceCount"], u["HealthStatus"])
            for u in got["UltraServers"]] == [(f"rc-later-us-{i}", 9, 2, "Insufficient-Data") for i in range(4)]
    first = operations.call("ListUltraServersByReservedCapacity",
                            {"ReservedCapacityArn": RC_ARN + "rc-later", "MaxResults": 3}, ctx)
    assert len(first["UltraServers"]) == 3 and first["NextToken"]
    assert operations.call("ListUltraServersByReservedCapacity", {"ReservedCapacityArn": RC_ARN + "rc-done"},
                           ctx)["UltraServers"] == []


def test_the_orchestrator_setting_reaches_describe_cluster() -> None:
    from pydantic import ValidationError

    from hyperplan.settings import Settings
    from tests.aws.clients import boto3_call

    eks = "arn:aws:eks:us-west-2:123456789012:cluster/lab"
    assert Settings(eks_cluster_arn=eks).eks_cluster_arn == eks
    with pytest.raises(ValidationError):
        Settings(eks_cluster_arn="arn:aws:sagemaker:us-west-2:123456789012:cluster/abcdefabcdef")
    s = Server({"ultra": [plan("ultra", "Active", 2, ultra=True)]}, {"trainers": [group("trainers", "ultra", 1)]},
               eks_cluster_arn=eks)
    try:
        got = ok(boto3_call(signed_in(s), "describe_cluster", ClusterName="lab"))
    finally:
        s.close()
    assert got["Orchestrator"] == {"Eks": {"ClusterArn": eks}}
