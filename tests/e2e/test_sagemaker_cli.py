"""The AWS CLI (1.46.3, unmodified) drives every operation hyperplan's SageMaker API serves against
the running operator, as a user whose RBAC allows them: a bought UltraServer block listed before it
runs, then the HyperPod reads of a group that serves (DescribeCluster, ListClusters,
ListClusterNodes, DescribeClusterNode), UpdateCluster, the batch calls, and the training-plan
operations from a search to an extension and its history, tags included."""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta

from hyperplan.sagemaker import operations
from tests.aws.clients import Endpoint, aws_cli
from tests.aws.keys import grant_plan_reads, mint_key, serving
from tests.e2e.scenarios import (
    API, Context, first_block, group_body, parse_ts, pool_body, scenario, ts, utcnow, wait_phase,
)
from tests.kube import eventually

ACCOUNT = "111122223333"  # HYPERPLAN_AWS_ACCOUNT_ID of the e2e replicas
ITYPE, US_TYPE = "ml.p6e-gb200.36xlarge", "ml.u-p6e-gb200x36"  # 9 instances an UltraServer
ROLE = "arn:aws:iam::111122223333:role/hyperplan"


def cli(endpoint: Endpoint, operation: str, *args: str) -> dict:
    """``aws sagemaker <operation> <args> --output json``: its exit code and what it printed."""
    done = aws_cli(endpoint, "sagemaker", operation, *args, "--output", "json")
    return {"rc": done.returncode, "out": json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip()
            else {}, "err": done.stderr[-2000:]}


@scenario
def sagemaker_cli(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    ultra, plain, user = f"smc-us-{tag}", f"smc-{tag}", f"sm-cli-{tag}"
    plain_type = f"ml.smc-{tag}.xlarge"
    k.create(pool_body(ultra, ITYPE, 9, az=f"us-smc-{tag}", ultraServerType=US_TYPE,
                       trainingPlanSelector={"matchLabels": {"e2e-scenario": ultra}}))
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": ultra, "labels": {"e2e-scenario": ultra}},
              "spec": {"ultraServerType": US_TYPE, "ultraServerCount": 1, "targetResource": "hyperpod-cluster",
                       "duration": "3m", "autoPurchase": True, "spareInstancesPerUltraServer": 1,
                       "startTimeAfter": ts(utcnow() + timedelta(seconds=40))}})
    k.create(group_body(ultra, ultra, ITYPE, 2, labels={"team": f"t{tag}"}))
    k.create(pool_body(plain, plain_type, 4, az="us-east-1c"))
    key_id, secret = mint_key(ctx, user)
    grant_plan_reads(ctx, user, user,
                     {"apiGroups": ["hyperplan.dev"], "resources": ["trainingplans"], "verbs": ["create", "patch"]},
                     {"apiGroups": ["hyperplan.dev"], "resources": ["instancegroups"], "verbs": ["list", "patch"]},
                     {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]},
                     {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]})
    endpoint = serving(ctx, key_id, secret)
    out: dict = {"tag": tag, "ultra": ultra, "plain": plain}
    arn = f"arn:aws:sagemaker:us-west-2:{ACCOUNT}"

    # Bought, not running yet: its UltraServer is listed from the purchase.
    block = first_block(k, ultra)
    out["block"] = block
    rc_arn = f"{arn}:reserved-capacity/{block['id']}"
    if (k.get("trainingplan", ultra).get("status") or {}).get("phase") == "Scheduled":
        answer = cli(endpoint, "list-ultra-servers-by-reserved-capacity", "--reserved-capacity-arn", rc_arn)
        # Kept only if it was answered before the block's start: the CLI takes a moment to start, and
        # a block that starts meanwhile is a running one, with the health its nodes give.
        if utcnow() < parse_ts(block["startTime"]):
            out["ultra_before"] = answer

    # The HyperPod side, once the group serves.
    wait_phase(k, "instancegroup", ultra, "Ready", timeout=180)
    calls: dict[str, dict] = {}
    calls["DescribeCluster"] = cli(endpoint, "describe-cluster", "--cluster-name", "hyperplan")
    calls["ListClusters"] = cli(endpoint, "list-clusters", "--name-contains", "hyper")
    calls["ListClusterNodes"] = cli(endpoint, "list-cluster-nodes", "--cluster-name", "hyperplan",
                                    "--instance-group-name-contains", ultra)
    nodes = calls["ListClusterNodes"]["out"].get("ClusterNodeSummaries") or [{}]
    calls["DescribeClusterNode"] = cli(endpoint, "describe-cluster-node", "--cluster-name", "hyperplan",
                                       "--node-id", nodes[0].get("InstanceId", "i-00000000000000000"))
    calls["UpdateCluster"] = cli(endpoint, "update-cluster", "--cluster-name", "hyperplan", "--instance-groups",
                                 json.dumps([{"InstanceGroupName": ultra, "InstanceCount": 2, "ExecutionRole": ROLE,
                                              "KubernetesConfig": {"Labels": {"team": f"t{tag}"}}}]))
    calls["UpdateClusterRefused"] = cli(endpoint, "update-cluster", "--cluster-name", "hyperplan", "--instance-groups",
                                        json.dumps([{"InstanceGroupName": ultra, "InstanceCount": 2,
                                                     "ExecutionRole": ROLE, "ThreadsPerCore": 1}]))
    missing = "i-00000000000000000"  # a node of the pattern that this cluster has not: nothing is disturbed
    calls["BatchRebootClusterNodes"] = cli(endpoint, "batch-reboot-cluster-nodes", "--cluster-name", "hyperplan",
                                           "--node-ids", missing)
    calls["BatchReplaceClusterNodes"] = cli(endpoint, "batch-replace-cluster-nodes", "--cluster-name", "hyperplan",
                                            "--node-ids", missing)
    calls["ListClusterEvents"] = cli(endpoint, "list-cluster-events", "--cluster-name", "hyperplan",
                                     "--instance-group-name", ultra)
    events = calls["ListClusterEvents"]["out"].get("Events") or [{}]
    calls["DescribeClusterEvent"] = cli(endpoint, "describe-cluster-event", "--cluster-name", "hyperplan",
                                        "--event-id", events[0].get("EventId", "00000000-0000-4000-8000-000000000000"))
    calls["DescribeReservedCapacity"] = cli(endpoint, "describe-reserved-capacity", "--reserved-capacity-arn", rc_arn)
    calls["ListUltraServersByReservedCapacity"] = cli(endpoint, "list-ultra-servers-by-reserved-capacity",
                                                      "--reserved-capacity-arn", rc_arn)
    out["group_spec"] = k.get("instancegroup", ultra)["spec"]

    # The training plans, from a search to an extension.
    after = ts(utcnow() + timedelta(seconds=20))
    calls["SearchTrainingPlanOfferings"] = cli(
        endpoint, "search-training-plan-offerings", "--instance-type", plain_type, "--instance-count", "2",
        "--duration-hours", "48", "--start-time-after", after, "--target-resources", "hyperpod-cluster")
    calls["SearchOutsideTheRules"] = cli(
        endpoint, "search-training-plan-offerings", "--instance-type", plain_type, "--instance-count", "2",
        "--duration-hours", str(183 * 24), "--target-resources", "hyperpod-cluster")
    offers = calls["SearchTrainingPlanOfferings"]["out"].get("TrainingPlanOfferings") or [{}]
    calls["CreateTrainingPlan"] = cli(endpoint, "create-training-plan", "--training-plan-name", plain,
                                      "--training-plan-offering-id", offers[0].get("TrainingPlanOfferingId", "none"),
                                      "--tags", "Key=team,Value=cli")
    calls["DescribeTrainingPlan"] = cli(endpoint, "describe-training-plan", "--training-plan-name", plain)
    calls["ListTrainingPlans"] = cli(endpoint, "list-training-plans", "--max-items", "5")
    calls["AddTags"] = cli(endpoint, "add-tags", "--resource-arn", f"{arn}:training-plan/{plain}",
                           "--tags", "Key=env,Value=e2e")
    calls["DeleteTags"] = cli(endpoint, "delete-tags", "--resource-arn", f"{arn}:training-plan/{plain}",
                              "--tag-keys", "team")
    calls["ListTags"] = cli(endpoint, "list-tags", "--resource-arn", f"{arn}:training-plan/{plain}")
    first_block(k, plain, timeout=120)  # bought (Scheduled, or Active already: it starts 20 s after the search)
    extensions = cli(endpoint, "search-training-plan-offerings", "--training-plan-arn", f"{arn}:training-plan/{plain}",
                     "--duration-hours", "24")
    calls["SearchExtensions"] = extensions
    offered = extensions["out"].get("TrainingPlanExtensionOfferings") or [{}]
    calls["ExtendTrainingPlan"] = cli(endpoint, "extend-training-plan", "--training-plan-extension-offering-id",
                                      offered[0].get("TrainingPlanExtensionOfferingId", "none"))
    calls["DescribeTrainingPlanExtensionHistory"] = eventually(
        lambda: (h := cli(endpoint, "describe-training-plan-extension-history", "--training-plan-arn",
                          f"{arn}:training-plan/{plain}"))["out"].get("TrainingPlanExtensions") and h,
        timeout=60, interval=2, what="the extension in the history")
    out["calls"] = calls
    k.delete("instancegroup", ultra)
    for name in (ultra, plain):
        k.delete("trainingplan", name)
    return out


def test_the_aws_cli_runs_every_served_operation(scenarios) -> None:
    record = scenarios["sagemaker_cli"].result(timeout=900)
    calls = record["calls"]
    refused = {"UpdateClusterRefused", "SearchOutsideTheRules"}
    if not calls["ListClusterEvents"]["out"].get("Events"):  # no Event of the group yet: nothing to describe
        refused.add("DescribeClusterEvent")
        assert "ResourceNotFound" in calls["DescribeClusterEvent"]["err"]
    failed = {op: c["err"] for op, c in calls.items() if op not in refused and c["rc"] != 0}
    assert failed == {}
    assert set(operations.OPERATIONS) <= set(calls)
    assert calls["UpdateClusterRefused"]["rc"] == 255 and "ThreadsPerCore" in calls["UpdateClusterRefused"]["err"]
    assert record["group_spec"]["instanceCount"] == 2  # the refused update wrote nothing
    assert calls["SearchOutsideTheRules"]["rc"] == 255 and "DurationOutOfRange" in calls["SearchOutsideTheRules"]["err"]
    assert calls["ListTags"]["out"]["Tags"] == [{"Key": "env", "Value": "e2e"}]
    assert calls["BatchRebootClusterNodes"]["out"]["Failed"][0]["ErrorCode"] == "InstanceIdNotFound"


def test_the_cluster_and_its_nodes_as_describe_cluster_and_describe_cluster_node_read_them(scenarios) -> None:
    record = scenarios["sagemaker_cli"].result(timeout=900)
    calls, ultra, tag = record["calls"], record["ultra"], record["tag"]
    described = calls["DescribeCluster"]["out"]
    assert described["ClusterName"] == "hyperplan" and described["ClusterStatus"] in ("InService", "Updating")
    [group] = [g for g in described["InstanceGroups"] if g["InstanceGroupName"] == ultra]
    # CurrentCount counts the group's nodes, the UltraServer's spare (spareInstancesPerUltraServer 1) among them
    assert (group["CurrentCount"], group["TargetCount"], group["Status"]) == (3, 2, "InService")
    assert group["TrainingPlanArn"].endswith(f":training-plan/{ultra}")
    assert group["KubernetesConfig"]["DesiredLabels"] == group["KubernetesConfig"]["CurrentLabels"] == {"team": f"t{tag}"}
    assert any(s["ClusterName"] == "hyperplan" for s in calls["ListClusters"]["out"]["ClusterSummaries"])
    nodes = calls["ListClusterNodes"]["out"]["ClusterNodeSummaries"]
    assert len(nodes) == 3 and all(n["InstanceStatus"]["Status"] == "Running" for n in nodes)
    detail = calls["DescribeClusterNode"]["out"]["NodeDetails"]
    assert re.fullmatch(r"ip-(\d+-){3}\d+\.us-west-2\.compute\.internal", detail["PrivateDnsHostname"])
    assert detail["UltraServerInfo"]["Type"] == US_TYPE
    assert detail["KubernetesConfig"]["CurrentLabels"]["team"] == f"t{tag}"


def test_a_bought_ultraserver_is_listed_before_its_block_runs_and_while_it_runs(scenarios) -> None:
    record = scenarios["sagemaker_cli"].result(timeout=900)
    block = record["block"]
    if "ultra_before" in record:  # the block had not started when the scenario looked
        [before] = record["ultra_before"]["out"]["UltraServers"]
        assert (before["UltraServerId"], before["TotalInstanceCount"], before["ConfiguredSpareInstanceCount"],
                before["HealthStatus"]) == (f"{block['id']}-us-0", 9, 1, "Insufficient-Data")
    [running] = record["calls"]["ListUltraServersByReservedCapacity"]["out"]["UltraServers"]
    assert running["UltraServerId"] == f"{block['id']}-us-0" and running["TotalInstanceCount"] == 9
    described = record["calls"]["DescribeReservedCapacity"]["out"]
    assert described["ReservedCapacityType"] == "UltraServer" and described["UltraServerSummary"]["UltraServerCount"] == 1
