"""The recovery ladder end to end on KWOK (demo profile): reboot before replace.

One scenario on a plan of one x72 UltraServer and a group of 2 (plus its spare), healthCheck
grace 3 s, rebootBudget 1, rebootTimeoutSeconds 60; KWOK's reboot takes 10 s (the provider's
default, ``HYPERPLAN_KWOK_REBOOT_SECONDS``):

1. an active node goes NotReady: after the grace its spare is promoted, the node is labelled
   ``UnschedulablePendingReboot`` and rebooted (Ready=False, reason Rebooting, by the provider);
2. KWOK brings it back Ready under the same name and uid: it becomes the UltraServer's spare
   (``Schedulable``, role spare, spare taint), and no node is ever made;
3. the same node fails again within the window: it is replaced (``UnschedulablePendingReplacement``,
   a new spare in its slot, the failed node removed);
4. ``hyperplan node reboot`` on an active node: the spare is promoted and the node rebooted, whatever
   the budget, and it comes back as the spare;
5. boto3's ``batch_reboot_cluster_nodes`` (HyperPod's call, hyperplan's SageMaker API) on the other
   active node: the same, and HyperPod's label says ``Schedulable`` afterwards.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import timedelta

from hyperplan.sagemaker.hyperpod import instance_id
from tests.aws.clients import boto3_call
from tests.e2e.scenarios import Context, events_for, scenario, ts, utcnow
from tests.aws.keys import grant_plan_reads, mint_key, serving
from tests.kube import eventually

API = "hyperplan.dev/v1alpha1"
ITYPE = "ml.p6e-gb200.36xlarge"
US_TYPE = "ml.u-p6e-gb200x72"
HEALTH = "hyperplan.dev/node-health-status"
ROLE = "hyperplan.dev/role"


def _nodes(k, group: str) -> dict[str, dict]:
    return {n["metadata"]["name"]: n for n in
            k.get("nodes", None, "-l", f"hyperplan.dev/instance-group={group}")["items"]}


def _ready(node: dict | None) -> dict | None:
    return next((c for c in ((node or {}).get("status") or {}).get("conditions", []) if c["type"] == "Ready"), None)


def _fail(kube, node: str, since) -> None:
    """Ready=False as a node agent reports it (the failure keeps its first time)."""
    when = ts(since)
    kube.core.patch_node_status(node, {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "HyperplanTest", "message": "set by the e2e test",
         "lastHeartbeatTime": when, "lastTransitionTime": when}]}})


def _keep_failing(ctx: Context, node: str, since, acted):
    """A check for ``eventually``: ``acted(node)`` once the operator has acted on the failure, which
    is said again meanwhile (KWOK's heartbeat may write back a Ready=True it rendered before the
    failure was patched)."""
    def check() -> dict | None:
        n = ctx.kubectl.get_or_none("node", node)
        if n is None:
            return None
        ready = _ready(n)
        if ready and ready["status"] == "True" and n["metadata"]["labels"].get(HEALTH, "Schedulable") == "Schedulable":
            _fail(ctx.kube, node, since)
        return acted(n)
    return check


def _spare_of(nodes: dict[str, dict]) -> str:
    return next(name for name, n in nodes.items() if n["metadata"]["labels"][ROLE] == "spare")


@scenario
def recovery_ladder(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    plan, group = f"rb-{tag}", f"reboot-{tag}"
    out: dict = {"group": group}
    # The pool sells to this plan only, and the plan buys from it only: the first wave's other
    # UltraServer scenario (test_instancegroups) buys the same type, and offerings come from
    # every pool of a type.
    k.create({"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": f"rb-{tag}"},
              "spec": {"instanceType": ITYPE, "ultraServerType": US_TYPE, "availabilityZone": f"us-rb-{tag}",
                       "instanceCount": 18, "trainingPlanSelector": {"matchLabels": {"e2e-scenario": plan}}}})
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": plan, "labels": {"e2e-scenario": plan}},
              "spec": {"ultraServerType": US_TYPE, "ultraServerCount": 1, "targetResource": "hyperpod-cluster",
                       "duration": "4m", "autoPurchase": True,
                       "startTimeAfter": ts(utcnow() + timedelta(seconds=20))}})
    k.create({"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": group},
              "spec": {"trainingPlanRef": plan, "instanceType": ITYPE, "instanceCount": 2,
                       "healthCheck": {"graceSeconds": 3, "maxUnhealthy": 2, "rebootBudget": 1,
                                       "rebootWindowSeconds": 3600, "rebootTimeoutSeconds": 60}}})
    eventually(lambda: (k.get("instancegroup", group).get("status") or {}).get("phase") == "Ready",
               timeout=150, what="group Ready")
    nodes = _nodes(k, group)
    out["first_nodes"] = sorted(nodes)
    spare = _spare_of(nodes)
    victim = sorted(name for name, n in nodes.items() if n["metadata"]["labels"][ROLE] == "active")[0]
    uid = nodes[victim]["metadata"]["uid"]
    out.update(victim=victim, spare=spare)

    # 1. The victim fails: the spare is promoted, the victim rebooted.
    failed_at = utcnow()
    _fail(ctx.kube, victim, failed_at)
    rebooting = eventually(_keep_failing(
        ctx, victim, failed_at, lambda n: n["metadata"]["labels"].get(HEALTH) == "UnschedulablePendingReboot"
        and (_ready(n) or {}).get("reason") == "Rebooting" and n), timeout=30, interval=0.2, what="victim rebooting")
    out["rebooting"] = rebooting
    out["promoted"] = k.get("node", spare)
    out["rebooting_record"] = next(e for e in k.get("instancegroup", group)["status"]["nodes"] if e["name"] == victim)

    # 2. Back from the reboot: the UltraServer's spare, and no node was made.
    back = eventually(lambda: (n := k.get_or_none("node", victim)) is not None
                      and n["metadata"]["labels"].get(HEALTH) == "Schedulable"
                      and n["metadata"]["labels"][ROLE] == "spare" and (_ready(n) or {}).get("status") == "True" and n,
                      timeout=60, interval=0.5, what="victim back as the spare")
    out["back"], out["back_after"] = back, (utcnow() - failed_at).total_seconds()
    out["back_uid_same"] = back["metadata"]["uid"] == uid
    out["after_reboot_nodes"] = sorted(_nodes(k, group))
    out["after_reboot_status"] = eventually(
        lambda: (s := k.get("instancegroup", group)["status"]).get("phase") == "Ready" and s.get("spareCount") == 1
        and s, timeout=30, what="group Ready with its spare again")

    # 3. The same node fails again within the window: replaced.
    again_at = utcnow()
    _fail(ctx.kube, victim, again_at)
    marked = eventually(_keep_failing(
        ctx, victim, again_at, lambda n: n["metadata"]["labels"].get(HEALTH) == "UnschedulablePendingReplacement" and n),
        timeout=30, interval=0.2, what="victim marked for replacement")
    out["marked_again"] = marked
    eventually(lambda: k.get_or_none("node", victim) is None, timeout=60, what="victim removed")
    out["replaced_nodes"] = _nodes(k, group)

    # 4. An admin asks for a reboot of an active node from the CLI.
    nodes = eventually(lambda: (s := k.get("instancegroup", group)["status"]).get("phase") == "Ready"
                       and s.get("spareCount") == 1 and _nodes(k, group), timeout=60, what="Ready after the replacement")
    asked = sorted(name for name, n in nodes.items() if n["metadata"]["labels"][ROLE] == "active")[0]
    cli = subprocess.run([sys.executable, "-m", "hyperplan.cli", "node", "reboot", asked, "--kubeconfig",
                          ctx.kubeconfig], capture_output=True, text=True, timeout=60)
    out["cli"] = (cli.returncode, cli.stdout, cli.stderr)
    out["asked"] = asked
    eventually(lambda: ((_ready(k.get_or_none("node", asked)) or {}).get("reason") == "Rebooting"),
               timeout=30, interval=0.2, what="asked node rebooting")
    out["asked_back"] = eventually(
        lambda: (n := k.get_or_none("node", asked)) is not None and n["metadata"]["labels"].get(HEALTH) == "Schedulable"
        and n["metadata"]["labels"][ROLE] == "spare" and (_ready(n) or {}).get("status") == "True" and n,
        timeout=60, interval=0.5, what="asked node back as the spare")

    # 5. The same through HyperPod's own call, with boto3.
    user = f"rb-admin-{tag}"
    grant_plan_reads(ctx, user, f"rb-admin-{tag}",
                     {"apiGroups": ["hyperplan.dev"], "resources": ["instancegroups"], "verbs": ["get", "list"]},
                     {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]})
    endpoint = serving(ctx, *mint_key(ctx, user))
    nodes = eventually(lambda: (s := k.get("instancegroup", group)["status"]).get("phase") == "Ready"
                       and s.get("spareCount") == 1 and _nodes(k, group), timeout=60, what="Ready after the CLI reboot")
    other = sorted(name for name, n in nodes.items() if n["metadata"]["labels"][ROLE] == "active")[0]
    out["boto3_node"] = other
    out["boto3"] = boto3_call(endpoint, "batch_reboot_cluster_nodes", ClusterName="hyperplan",
                              NodeIds=[instance_id(other)])
    out["boto3_back"] = eventually(
        lambda: (n := k.get_or_none("node", other)) is not None and n["metadata"]["labels"].get(HEALTH) == "Schedulable"
        and n["metadata"]["labels"][ROLE] == "spare" and (_ready(n) or {}).get("status") == "True"
        and n["metadata"]["labels"].get("sagemaker.amazonaws.com/node-health-status") == "Schedulable" and n,
        timeout=60, interval=0.5, what="the node boto3 rebooted back as the spare")
    out["group_events"] = [e["reason"] for e in events_for(k, group)]
    return out


def _record(scenarios) -> dict:
    return scenarios["recovery_ladder"].result()


def test_a_failed_node_is_rebooted_after_its_spare_is_promoted(scenarios) -> None:
    r = _record(scenarios)
    promoted = r["promoted"]["metadata"]["labels"]
    assert (promoted[ROLE], promoted["hyperplan.dev/replaces"]) == ("active", r["victim"])
    assert {"key": "hyperplan.dev/unhealthy", "value": "true", "effect": "NoSchedule"} in r["rebooting"]["spec"]["taints"]
    assert r["rebooting_record"]["recovery"]["rebootingSince"]  # the clock is the group's own
    assert "NodeRebooting" in r["group_events"]


def test_a_rebooted_node_comes_back_as_its_ultraservers_spare_and_no_node_is_made(scenarios) -> None:
    r = _record(scenarios)
    back = r["back"]
    assert r["back_uid_same"]
    assert {"key": "hyperplan.dev/spare", "value": "true", "effect": "NoSchedule"} in back["spec"]["taints"]
    assert not any(t["key"] == "hyperplan.dev/unhealthy" for t in back["spec"].get("taints") or [])
    assert r["after_reboot_nodes"] == r["first_nodes"]  # the same three nodes: no new capacity
    assert r["back_after"] <= 3 + 10 + 20  # grace, the reboot, and slack for a busy machine
    assert (r["after_reboot_status"]["readyCount"], r["after_reboot_status"]["unhealthyCount"]) == (2, 0)
    assert "NodeRecovered" in r["group_events"]


def test_a_node_that_fails_again_within_the_window_is_replaced(scenarios) -> None:
    r = _record(scenarios)
    assert r["victim"] not in r["replaced_nodes"]
    made = [n for n in r["replaced_nodes"].values() if n["metadata"]["labels"]["hyperplan.dev/generation"] == "1"]
    assert len(made) == 1 and made[0]["metadata"]["labels"][ROLE] == "spare"
    assert "NodeRemoved" in r["group_events"]


def test_an_admin_reboots_a_node_from_the_cli(scenarios) -> None:
    r = _record(scenarios)
    code, stdout, stderr = r["cli"]
    assert code == 0, stderr
    assert stdout.strip() == f"{r['asked']}: reboot requested ({HEALTH}=UnschedulablePendingReboot)"
    assert r["asked_back"]["metadata"]["labels"][ROLE] == "spare"


def test_boto3_reboots_a_node_through_hyperpods_call(scenarios) -> None:
    r = _record(scenarios)
    assert r["boto3"].get("ok", {}).get("Successful") == [instance_id(r["boto3_node"])], r["boto3"]
    assert r["boto3_back"]["metadata"]["labels"][ROLE] == "spare"
