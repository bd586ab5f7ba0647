"""ARNs are read whole: only one this server hands out to the caller (its partition, the region
the request was signed for, its account) names a local object; another account's, region's or
partition's is ResourceNotFound, or a ValidationException where the model lists no
ResourceNotFound. A search outside the policy's rules is a ValidationException naming the rule."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hyperplan.runtime.store import GROUPS, NODES, PLANS, POOLS, WatchCache
from hyperplan.sagemaker import hyperpod, operations
from hyperplan.sagemaker.wire import ApiError
from hyperplan_testing import botocore_shapes
from tests.unit.test_sagemaker_api import ACCOUNT, P5_POOL, group, plan

OTHER = "210987654321"


def ctx_for(region: str = "us-west-2") -> operations.Context:
    cache = WatchCache()
    cache.bind({PLANS: {"ultra": [plan("ultra", "Active", 2, ultra=True)]}, POOLS: {"p5-west": [P5_POOL]},
                GROUPS: {"trainers": [group("trainers", "ultra", 3)]}, NODES: {}})
    return operations.Context(fleet=cache, account=ACCOUNT, region=region, now=datetime.now(timezone.utc),
                              cluster_name="lab", user="alice")


def arn(kind: str, name: str, *, partition: str = "aws", region: str = "us-west-2", account: str = ACCOUNT) -> str:
    return f"arn:{partition}:sagemaker:{region}:{account}:{kind}/{name}"


CLUSTER = hyperpod.cluster_id("lab")
FOREIGN = {"another-account": {"account": OTHER}, "another-region": {"region": "eu-west-1"},
           "another-partition": {"partition": "aws-cn"}}


@pytest.mark.parametrize("where", list(FOREIGN), ids=list(FOREIGN))
@pytest.mark.parametrize("operation, body_of, code", [
    pytest.param("DescribeTrainingPlan", lambda a: {"TrainingPlanName": a("training-plan", "ultra")},
                 "ResourceNotFound", id="describe-plan"),
    pytest.param("DescribeReservedCapacity", lambda a: {"ReservedCapacityArn": a("reserved-capacity", "rc-ultra")},
                 "ResourceNotFound", id="reserved-capacity"),
    pytest.param("ListUltraServersByReservedCapacity",
                 lambda a: {"ReservedCapacityArn": a("reserved-capacity", "rc-ultra")}, "ResourceNotFound",
                 id="ultraservers"),
    pytest.param("DescribeTrainingPlanExtensionHistory", lambda a: {"TrainingPlanArn": a("training-plan", "ultra")},
                 "ResourceNotFound", id="extension-history"),
    pytest.param("SearchTrainingPlanOfferings", lambda a: {"TrainingPlanArn": a("training-plan", "ultra")},
                 "ValidationException", id="search-extensions"),
    pytest.param("ListTags", lambda a: {"ResourceArn": a("training-plan", "ultra")}, "ValidationException",
                 id="list-tags"),
    pytest.param("DescribeCluster", lambda a: {"ClusterName": a("cluster", CLUSTER)}, "ResourceNotFound",
                 id="describe-cluster"),
    pytest.param("ListClusterNodes", lambda a: {"ClusterName": a("cluster", CLUSTER)}, "ResourceNotFound",
                 id="cluster-nodes"),
])
def test_a_foreign_arn_names_nothing_here(operation: str, body_of, code: str, where: str) -> None:
    ctx = ctx_for()
    local = body_of(arn)
    operations.call(operation, local, ctx)  # the ARN as handed out names the object
    with pytest.raises(ApiError) as refused:
        operations.call(operation, body_of(lambda kind, name: arn(kind, name, **FOREIGN[where])), ctx)
    assert refused.value.code == code
    assert code in botocore_shapes.modeled_errors(operation) | botocore_shapes.COMMON_ERRORS


def test_a_foreign_training_plan_arn_filters_every_cluster_out() -> None:
    ctx = ctx_for()
    assert operations.call("ListClusters", {"TrainingPlanArn": arn("training-plan", "ultra")}, ctx)["ClusterSummaries"]
    assert operations.call("ListClusters", {"TrainingPlanArn": arn("training-plan", "ultra", account=OTHER)},
                           ctx)["ClusterSummaries"] == []


@pytest.mark.parametrize("region, partition", [
    ("us-west-2", "aws"), ("cn-north-1", "aws-cn"), ("us-gov-west-1", "aws-us-gov"), ("us-isob-east-1", "aws-iso-b"),
])
def test_arns_carry_the_partition_of_the_region_signed_for(region: str, partition: str) -> None:
    ctx = ctx_for(region)
    described = operations.call("DescribeTrainingPlan", {"TrainingPlanName": "ultra"}, ctx)
    assert described["TrainingPlanArn"] == arn("training-plan", "ultra", partition=partition, region=region)
    assert operations.call("DescribeTrainingPlan", {"TrainingPlanName": described["TrainingPlanArn"]}, ctx) == described
    assert botocore_shapes.violations("DescribeTrainingPlan", described) == []


def search(**more) -> dict:
    return {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 4, "DurationHours": 48, **more}


@pytest.mark.parametrize("body, rule", [
    pytest.param(search(DurationHours=183 * 24), "DurationOutOfRange", id="more-than-182-days"),
    pytest.param(search(DurationHours=30), "DurationNotWholeDays", id="not-whole-days"),
    pytest.param(search(InstanceCount=3), "instanceCount", id="count-not-allowed"),
    pytest.param(search(StartTimeAfter=(datetime.now(timezone.utc) + timedelta(days=3)).timestamp()),
                 "StartTooFarAhead", id="too-far-ahead"),
    pytest.param(search(EndTimeBefore=(datetime.now(timezone.utc) + timedelta(seconds=30)).timestamp()),
                 "WindowTooShort", id="window-shorter-than-the-duration"),
])
def test_a_search_outside_the_policys_rules_names_the_rule(body: dict, rule: str) -> None:
    with pytest.raises(ApiError) as refused:
        operations.call("SearchTrainingPlanOfferings", body, ctx_for())
    assert refused.value.code == "ValidationException" and rule in refused.value.message, refused.value


def test_a_search_within_the_rules_answers_offerings() -> None:
    got = operations.call("SearchTrainingPlanOfferings", search(), ctx_for())
    assert got["TrainingPlanOfferings"] and botocore_shapes.violations("SearchTrainingPlanOfferings", got) == []
