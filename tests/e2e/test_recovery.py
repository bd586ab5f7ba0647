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

Along the way the operator's ``/metrics`` is read (the group's nodes per health state, the reboots
by result, the replacement past the budget, the time to recover per action), and at the end the
overview dashboard's recovery panels are asked of the session's real Prometheus over the scenario.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from hyperplan.monitoring.dashboards import targets
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


def _samples(text: str) -> dict[tuple, float]:
    """The ``hyperplan_`` samples of a /metrics text: (name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
            if f.name.startswith("hyperplan_") for s in f.samples}


def _read(ctx: Context) -> dict[tuple, float]:
    def read() -> dict[tuple, float] | None:
        try:
            return _samples(ctx.metrics())
        except OSError:  # another test restarted the operator meanwhile
            return None
    return eventually(read, timeout=60, what="the operator's /metrics")


def _read_until(ctx: Context, shows, timeout: float = 30) -> dict[tuple, float]:
    """The operator's /metrics once ``shows(samples)``, else as it last read after ``timeout``."""
    last: list[dict[tuple, float]] = []

    def read() -> dict[tuple, float] | None:
        last[:] = [_read(ctx)]
        return last[0] if shows(last[0]) else None
    try:
        return eventually(read, timeout=timeout, interval=0.3, what="the operator's /metrics")
    except AssertionError:
        return last[0] if last else _read(ctx)


def _value(samples: dict[tuple, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _health(samples: dict[tuple, float], group: str) -> dict[str, float]:
    return {dict(labels)["state"]: v for (name, labels), v in samples.items()
            if name == "hyperplan_instance_group_node_health" and dict(labels).get("group") == group}


def _spare_of(nodes: dict[str, dict]) -> str:
    return next(name for name, n in nodes.items() if n["metadata"]["labels"][ROLE] == "spare")


@scenario
def recovery_ladder(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    plan, group = f"rb-{tag}", f"reboot-{tag}"
    out: dict = {"group": group, "start": utcnow()}
    # The pool sells to this plan only, and the plan buys from it only: the first wave's other
    # UltraServer scenario (test_instancegroups) buys the same type, and offerings come from
    # every pool of a type.
    k.create({"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": f"rb-{tag}"},
              "spec": {"instanceType": ITYPE, "ultraServerType": US_TYPE, "availabilityZone": f"us-rb-{tag}",
                       "instanceCount": 18, "trainingPlanSelector": {"matchLabels": {"e2e-scenario": plan}}}})
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": plan, "labels": {"e2e-scenario": plan}},
              "spec": {"ultraServerType": US_TYPE, "ultraServerCount": 1, "targetResource": "hyperpod-cluster",
                       # 6 minutes: the five steps take 1.5 to 3 minutes, more under a full run's load,
                       # and each must end before the block's termination time drains the group.
                       "duration": "6m", "autoPurchase": True,
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
    # The gauge is set by the pass after the one whose status said Ready: read until it shows the three.
    out["metrics_before"] = eventually(lambda: (m := _read(ctx)) and _health(m, group).get("Schedulable") == 3 and m,
                                       timeout=10, interval=0.3, what="/metrics shows the three nodes Schedulable")

    # 1. The victim fails: the spare is promoted, the victim rebooted.
    failed_at = utcnow()
    _fail(ctx.kube, victim, failed_at)
    rebooting = eventually(_keep_failing(
        ctx, victim, failed_at, lambda n: n["metadata"]["labels"].get(HEALTH) == "UnschedulablePendingReboot"
        and (_ready(n) or {}).get("reason") == "Rebooting" and n), timeout=30, interval=0.2, what="victim rebooting")
    out["rebooting"] = rebooting
    out["promoted"] = k.get("node", spare)
    out["rebooting_record"] = next(e for e in k.get("instancegroup", group)["status"]["nodes"] if e["name"] == victim)
    out["health_rebooting"] = eventually(lambda: (h := _health(_read(ctx), group)).get("rebooting") == 1 and h,
                                         timeout=10, interval=0.3, what="/metrics shows the victim rebooting")

    # 2. Back from the reboot: the UltraServer's spare, and no node was made.
    back = eventually(lambda: (n := k.get_or_none("node", victim)) is not None
                      and n["metadata"]["labels"].get(HEALTH) == "Schedulable"
                      and n["metadata"]["labels"][ROLE] == "spare" and (_ready(n) or {}).get("status") == "True" and n,
                      timeout=60, interval=0.5, what="victim back as the spare")
    out["back"], out["back_after"] = back, (utcnow() - failed_at).total_seconds()
    out["back_uid_same"] = back["metadata"]["uid"] == uid
    out["after_reboot_nodes"] = sorted(_nodes(k, group))
    # The first Ready status with the spare back was once read still counting the node unhealthy
    # (CI: (2, 1)); wait for the group as it settles, its spare back and no node unhealthy.
    out["after_reboot_status"] = eventually(
        lambda: (s := k.get("instancegroup", group)["status"]).get("phase") == "Ready" and s.get("spareCount") == 1
        and not s.get("unhealthyCount") and s, timeout=30, what="group Ready with its spare again, none unhealthy")
    # The gauge is read from the operator's view of nodes and of the group's status, two watches:
    # once read with the node's label back but the status' reboot record not yet (CI, stop 31).
    out["metrics_back"] = eventually(
        lambda: (m := _read(ctx)) and _health(m, group).get("Schedulable") == 3
        and _health(m, group).get("rebooting") == 0 and m,
        timeout=20, interval=0.3, what="/metrics shows the three nodes Schedulable, none rebooting")

    # 3. The same node fails again within the window: replaced.
    again_at = utcnow()
    _fail(ctx.kube, victim, again_at)
    still_failing = _keep_failing(
        ctx, victim, again_at, lambda n: n["metadata"]["labels"].get(HEALTH) == "UnschedulablePendingReplacement" and n)

    def marked_or_replaced():
        # The replacement may be Ready, and the victim gone, between two polls: then the Event says it.
        return still_failing() or (k.get_or_none("node", victim) is None and next(
            (e for e in events_for(k, victim) if e.get("reason") == "NodeUnhealthy"
             and "UnschedulablePendingReplacement" in e.get("message", "")), None))
    marked = eventually(marked_or_replaced, timeout=30, interval=0.2, what="victim marked for replacement")
    out["marked_again"] = marked
    eventually(lambda: k.get_or_none("node", victim) is None, timeout=60, what="victim removed")
    out["replaced_nodes"] = _nodes(k, group)
    # Read until the replacement past the budget is counted (once read as 0 right after the
    # removal); after 30 s the last reading is kept and the test says what it showed.
    out["metrics_replaced"] = _read_until(ctx, lambda m: _value(
        m, "hyperplan_reboot_budget_exhausted_total", group=group) >= 1)

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
    assert out["boto3"].get("ok", {}).get("Successful") == [instance_id(other)], out["boto3"]

    def back_as_spare() -> dict | None:
        n = k.get_or_none("node", other)
        labels = (n or {}).get("metadata", {}).get("labels") or {}
        # On a timeout, the message says where the node stood (eventually reports the last failed assertion).
        assert n is not None and labels.get(HEALTH) == "Schedulable" and labels.get(ROLE) == "spare" \
            and (_ready(n) or {}).get("status") == "True" \
            and labels.get("sagemaker.amazonaws.com/node-health-status") == "Schedulable", \
            (n and {key: v for key, v in labels.items() if "health" in key or key == ROLE}, _ready(n or {}))
        return n
    out["boto3_back"] = eventually(back_as_spare, timeout=60, interval=0.5,
                                   what="the node boto3 rebooted back as the spare")
    out["group_events"] = [e["reason"] for e in events_for(k, group)]
    # The node's labels are written a moment before the pass counts its return: read until it has.
    recovered = ("hyperplan_reboots_total", (("result", "recovered"),))
    out["metrics_after"] = eventually(
        lambda: (m := _read(ctx)).get(recovered, 0.0) - out["metrics_before"].get(recovered, 0.0) >= 3 and m,
        timeout=15, what="the third reboot counted")
    out["end"] = utcnow() + timedelta(seconds=3)
    eventually(lambda: utcnow() > out["end"], timeout=10, interval=0.5, what="last scrapes")
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


def test_hyperpods_fault_labels_say_why_the_node_is_rebooted_and_go_when_it_serves_again(scenarios) -> None:
    r = _record(scenarios)
    labels = r["rebooting"]["metadata"]["labels"]
    assert (labels["sagemaker.amazonaws.com/fault-types"], labels["sagemaker.amazonaws.com/fault-reasons"]) == (
        "NodeNotReady", "ReadyFalse")  # the victim's Ready=False
    assert not any(k.startswith("sagemaker.amazonaws.com/fault-") for k in r["back"]["metadata"]["labels"])


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


# --------------------------------------------------------------------------- metrics and dashboards


def _moved(r: dict, name: str, after: str = "metrics_after", **labels: str) -> float:
    return _value(r[after], name, **labels) - _value(r["metrics_before"], name, **labels)


def test_the_groups_nodes_per_health_state_show_the_reboot_and_its_end(scenarios) -> None:
    r = _record(scenarios)
    assert _health(r["metrics_before"], r["group"]) == {
        "Schedulable": 3, "Unschedulable": 0, "UnschedulablePendingReboot": 0, "UnschedulablePendingReplacement": 0,
        "rebooting": 0}
    rebooting = r["health_rebooting"]
    assert (rebooting["rebooting"], rebooting["UnschedulablePendingReboot"], rebooting["Schedulable"]) == (1, 1, 2)
    assert _health(r["metrics_back"], r["group"])["rebooting"] == 0


def test_reboots_are_counted_by_result_and_the_replacement_past_the_budget_by_group(scenarios) -> None:
    r = _record(scenarios)
    # The victim, the node the CLI asked for and the one boto3 asked for came back; other scenarios
    # of the session may reboot too, so at least.
    assert _moved(r, "hyperplan_reboots_total", result="recovered") >= 3
    assert _moved(r, "hyperplan_reboots_total", "metrics_back", result="recovered") >= 1
    # Exactly one node of this group failed again within the window after its reboot.
    assert _value(r["metrics_before"], "hyperplan_reboot_budget_exhausted_total", group=r["group"]) == 0
    assert _value(r["metrics_replaced"], "hyperplan_reboot_budget_exhausted_total", group=r["group"]) == 1
    assert _value(r["metrics_after"], "hyperplan_reboot_budget_exhausted_total", group=r["group"]) == 1


def test_the_time_to_recover_is_observed_per_action(scenarios) -> None:
    r = _record(scenarios)
    counts = {a: _moved(r, "hyperplan_recovery_seconds_count", action=a) for a in ("reboot", "promote", "replace")}
    assert counts["reboot"] >= 3 and counts["promote"] >= 3 and counts["replace"] >= 1, counts
    # Every KWOK reboot keeps the node NotReady for 10 s, after a grace of 3 s here (other scenarios'
    # reboots too take their KWOK reboot at least): from the fault's first sight, at least 10 s.
    mean = _moved(r, "hyperplan_recovery_seconds_sum", action="reboot") / counts["reboot"]
    assert 10 <= mean <= 60, mean
    back = _moved(r, "hyperplan_recovery_seconds_sum", "metrics_back", action="reboot")
    assert 13 <= back <= r["back_after"] + 1  # the victim's: the grace, the reboot, until it was seen back


ROOT = Path(__file__).resolve().parents[2]
OVERVIEW = json.loads((ROOT / "deploy" / "grafana" / "hyperplan-overview.json").read_text())


def _panel(title: str, ref: str = "A") -> str:
    return next(expr for t, rf, expr in targets(OVERVIEW) if t == title and rf == ref)


def _over_the_scenario(prom, expr: str, r: dict) -> list[dict]:
    # The group's name is letters, digits and dashes: as a regex it matches itself.
    filled = re.sub(r"\$(\w+)", lambda m: {"group": r["group"], "__rate_interval": "15s"}[m.group(1)], expr)
    return prom.api("query_range", query=filled, start=str(r["start"].timestamp()), end=str(r["end"].timestamp()),
                    step="1")["result"]


def _peak(series: list[dict], **labels: str) -> float:
    values = [float(v) for s in series if all(s["metric"].get(k) == v for k, v in labels.items())
              for _, v in s["values"] if math.isfinite(float(v))]
    return max(values, default=0.0)


def test_the_dashboards_recovery_panels_show_the_reboot(scenarios, session_prometheus) -> None:
    """The overview's recovery row, asked of the real Prometheus that scraped the operator every
    second through the scenario: what a viewer reads off each panel."""
    r = _record(scenarios)
    health = _over_the_scenario(session_prometheus, _panel("Nodes by health"), r)
    # (Marked for replacement, the victim may be gone within a scrape: KWOK's new node is Ready at once.)
    assert _peak(health, group=r["group"], state="rebooting") == 1
    assert _peak(health, group=r["group"], state="UnschedulablePendingReboot") == 1
    # (3 serve; a scrape between the pass that marks a node and makes its replacement and the
    # watch's next event may count the replacement beside the node not yet seen marked: 4)
    assert _peak(health, group=r["group"], state="Schedulable") in (3, 4)
    reboots = _over_the_scenario(session_prometheus, _panel("Reboots by result"), r)
    assert _peak(reboots, result="recovered") > 0
    budget = _over_the_scenario(session_prometheus, _panel("Replaced past the reboot budget"), r)
    assert _peak(budget, group=r["group"]) > 0
    for ref in ("A", "B"):
        times = _over_the_scenario(session_prometheus, _panel("Time to recover", ref), r)
        assert _peak(times, action="reboot") >= 10, ref
