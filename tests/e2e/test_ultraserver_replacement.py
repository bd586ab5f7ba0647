"""An UltraServer that can no longer hold its group's nodes is replaced by a free one of the block
(issue 21, "Replace a failed UltraServer"; planning.recovery.plan_ultraserver_replacement).

A plan of two x36 UltraServers; a group of 8 (8 active + the spare: all on the first, the second
free), with ``rebootBudget: 0``. Two of its nodes on the first UltraServer fail (HyperPod's health
label ``Unschedulable``), one more than its one spare:

* the group's status records the replacement, its ``UltraServerReplacement`` condition and a
  Warning say which UltraServer replaced which, and so does the plan (``status.ultraServers[]
  .replacedBy`` and a Warning);
* the group's 9 nodes are made on the second UltraServer, and the group is Ready there, 8 + 1;
* every node of the first UltraServer gets the checkpoint signal before it is cordoned, and then
  goes: none is made again there.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

from tests.e2e.scenarios import Context, Recorder, events_for, scenario, ts, utcnow
from tests.kube import eventually

API = "hyperplan.dev/v1alpha1"
ITYPE = "ml.p6e-gb200.36xlarge"
US_TYPE = "ml.u-p6e-gb200x36"
US_LABEL = "topology.k8s.aws/ultraserver-id"
GROUP_LABEL = "hyperplan.dev/instance-group"
SIGNAL = "hyperplan.dev/BlockTerminating"


def _nodes(ctx: Context, group: str) -> list[dict]:
    return ctx.kubectl.get("nodes", None, "-l", f"{GROUP_LABEL}={group}")["items"]


def _state(node: dict) -> tuple[bool, bool]:
    """(signalled, cordoned) as the node shows them."""
    signalled = any(c["type"] == SIGNAL and c["status"] == "True" for c in (node.get("status") or {}).get("conditions") or [])
    return signalled, bool((node.get("spec") or {}).get("unschedulable"))


@scenario
def ultraserver_replaced(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    pool, plan, group = f"usr-pool-{tag}", f"usr-plan-{tag}", f"usr-{tag}"  # events are read by name
    k.create({"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": pool},
              "spec": {"instanceType": ITYPE, "ultraServerType": US_TYPE, "availabilityZone": f"us-usr-{tag}",
                       "instanceCount": 18, "trainingPlanSelector": {"matchLabels": {"e2e-scenario": plan}}}})
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": plan, "labels": {"e2e-scenario": plan}},
              "spec": {"ultraServerType": US_TYPE, "ultraServerCount": 2, "targetResource": "hyperpod-cluster",
                       "duration": "4m", "autoPurchase": True,
                       "startTimeAfter": ts(utcnow() + timedelta(seconds=15))}})
    k.create({"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": group},
              "spec": {"trainingPlanRef": plan, "instanceType": ITYPE, "instanceCount": 8,
                       "healthCheck": {"graceSeconds": 3, "maxUnhealthy": 2, "rebootBudget": 0}}})

    def ready_with(spares: int, us: str | None = None):
        st = k.get("instancegroup", group).get("status") or {}
        nodes = _nodes(ctx, group)
        if (st.get("phase"), st.get("readyCount"), st.get("spareCount")) != ("Ready", 8, spares):
            return None
        if us is not None and {n["metadata"]["labels"].get(US_LABEL) for n in nodes} != {us}:
            return None
        return st, nodes

    _, first = eventually(lambda: ready_with(1), timeout=150, what="group Ready on the first UltraServer")
    (failed_us,) = {n["metadata"]["labels"][US_LABEL] for n in first}
    old = sorted(n["metadata"]["name"] for n in first)
    # The signal and the cordon of every old node, as seen (the check: signalled first).
    seen = Recorder(lambda: {n["metadata"]["name"]: _state(n) for n in _nodes(ctx, group)
                             if n["metadata"]["name"] in old}, interval=0.2).start()
    victims = [n["metadata"]["name"] for n in first if n["metadata"]["labels"].get("hyperplan.dev/role") == "active"][:2]
    failed_at = utcnow()
    for v in victims:
        k.run("label", "node", v, "--overwrite", "sagemaker.amazonaws.com/node-health-status=Unschedulable")

    st, after = eventually(lambda: next((r for r in [ready_with(1)] if r and r[1] and all(
        n["metadata"]["labels"].get(US_LABEL) != failed_us for n in r[1])), None),
        timeout=120, interval=0.5, what="the group Ready on another UltraServer, the first one's nodes gone")
    moved_at = utcnow()
    plan_status = eventually(lambda: next((s for s in [k.get("trainingplan", plan).get("status") or {}]
                                           if any(u.get("replacedBy") for u in s.get("ultraServers") or [])), None),
                             timeout=30, what="the plan names the replacement")
    eventually(lambda: utcnow() > moved_at + timedelta(seconds=3), timeout=10, what="a few seconds more")
    counted = eventually(lambda: next((float(m.group(1)) for m in [re.search(
        r'^hyperplan_ultraserver_replacements_total\{reason="FailuresBeyondSpares"\} (\S+)$', ctx.metrics(), re.M)]
        if m and float(m.group(1)) >= 1), None), timeout=30, what="the replacement counted in /metrics")
    return {"counted": counted, "failed_us": failed_us, "old": old, "victims": victims, "failed_at": failed_at, "moved_at": moved_at,
            "status": st, "after": {n["metadata"]["name"]: n["metadata"]["labels"] for n in after},
            "states": seen.stop(), "plan_status": plan_status,
            "group_events": [(e["type"], e["reason"], e.get("message", "")) for e in events_for(k, group)],
            "plan_events": [(e["type"], e["reason"], e.get("message", "")) for e in events_for(k, plan)]}


def _record(scenarios) -> dict:
    return scenarios["ultraserver_replaced"].result(timeout=900)


def test_the_group_moves_to_the_free_ultraserver_and_is_ready_there(scenarios) -> None:
    r = _record(scenarios)
    (replacement,) = {labels[US_LABEL] for labels in r["after"].values()}
    assert replacement != r["failed_us"]
    assert len(r["after"]) == 9 and not set(r["after"]) & set(r["old"])
    assert sorted(labels["hyperplan.dev/role"] for labels in r["after"].values()) == ["active"] * 8 + ["spare"]
    entries = r["status"]["ultraServerReplacements"]
    assert [(e["failed"], e["replacement"], e["reason"]) for e in entries] == [
        (r["failed_us"], replacement, "FailuresBeyondSpares")]
    cond = next(c for c in r["status"]["conditions"] if c["type"] == "UltraServerReplacement")
    assert (cond["status"], cond["reason"]) == ("True", "UltraServerReplaced")
    assert f"UltraServer {r['failed_us']} replaced by {replacement}" in cond["message"]
    assert r["counted"] >= 1  # hyperplan_ultraserver_replacements_total{reason="FailuresBeyondSpares"}
    print(f"[ultraserver] replaced and Ready on {replacement} {(r['moved_at'] - r['failed_at']).total_seconds():.1f} s "
          "after the second failure")


def test_the_plan_and_the_events_say_which_ultraserver_replaced_which(scenarios) -> None:
    r = _record(scenarios)
    (replacement,) = {labels[US_LABEL] for labels in r["after"].values()}
    by_id = {u["id"]: u for u in r["plan_status"]["ultraServers"]}
    assert by_id[r["failed_us"]].get("replacedBy") == replacement
    assert "replacedBy" not in by_id[replacement]
    for events in (r["group_events"], r["plan_events"]):
        said = [m for t, reason, m in events if (t, reason) == ("Warning", "UltraServerReplaced")]
        assert len(said) == 1, events
        assert f"UltraServer {r['failed_us']} of block" in said[0] and f"replaced by {replacement}" in said[0]


def test_every_node_of_the_failed_ultraserver_is_signalled_before_it_drains(scenarios) -> None:
    r = _record(scenarios)
    first_signal: dict[str, object] = {}
    first_cordon: dict[str, object] = {}
    for when, states in r["states"]:
        for node, (signalled, cordoned) in states.items():
            if signalled:
                first_signal.setdefault(node, when)
            if cordoned:
                first_cordon.setdefault(node, when)
    assert set(first_signal) == set(r["old"]), (sorted(first_signal), r["old"])
    for node, cordoned in first_cordon.items():
        assert first_signal[node] <= cordoned, (node, first_signal[node], cordoned)
    assert r["states"][-1][1] == {}  # all gone
