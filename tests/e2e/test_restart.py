"""kill -9 at awkward moments, then a restart: no duplicate node, no orphan, no double booking.

Runs after every side-by-side scenario has finished, since it kills the shared operator.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from datetime import timedelta

from tests.e2e.scenarios import (
    events_for, first_block, group_body, parse_ts, plan_body, pool_body, ts, utcnow, wait_phase,
)
from tests.kube import eventually

API = "hyperplan.dev/v1alpha1"


def test_kill_during_purchase_and_provisioning_converges(scenarios, late_scenarios, operator, crds) -> None:
    # The shared operator is about to die: let every other scenario finish first.
    for future in [*scenarios.values(), *late_scenarios.values()]:
        future.exception(timeout=900)
    k = crds
    tag = uuid.uuid4().hex[:5]
    itype = f"ml.kill-{tag}.xlarge"
    k.create({"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": f"kill-{tag}"},
              "spec": {"instanceType": itype, "availabilityZone": "us-east-1k", "instanceCount": 16}})
    start = utcnow() + timedelta(seconds=30)
    plans = [f"kill-{tag}-{i}" for i in range(6)]
    k.apply([{"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": p},
              "spec": {"instanceType": itype, "instanceCount": 8, "targetResource": "hyperpod-cluster",
                       "duration": "2m", "autoPurchase": True, "startTimeAfter": ts(start),
                       "endTimeBefore": ts(start + timedelta(minutes=3))}} for p in plans])
    operator.kill_and_restart()  # while the purchases race

    def decided_status(p: str) -> dict | None:
        s = k.get("trainingplan", p).get("status") or {}
        no_capacity = any(c["type"] == "OfferingsAvailable" and c["status"] == "False"
                          for c in s.get("conditions", []))
        return s if s.get("phase") in ("Scheduled", "Active", "Failed") or no_capacity else None

    decided = {p: eventually(lambda p=p: decided_status(p), timeout=60, what=f"{p} decided") for p in plans}
    ledger = k.get("capacitypool", f"kill-{tag}")["status"]["reservations"]
    # Two plans of 8 fit in the 16 at a time; each bought plan holds exactly its own blocks.
    by_plan = Counter(r["trainingPlan"] for r in ledger)
    bought = [p for p, s in decided.items() if s["phase"] in ("Scheduled", "Active")]
    assert sorted(by_plan) == sorted(bought)
    for p in bought:
        assert by_plan[p] == len(decided[p]["reservedCapacity"])
    t = min(parse_ts(r["startTime"]) for r in ledger)
    end = max(parse_ts(r["endTime"]) for r in ledger)
    while t < end:
        assert sum(r["instanceCount"] for r in ledger if parse_ts(r["startTime"]) <= t < parse_ts(r["endTime"])) <= 16
        t += timedelta(seconds=1)

    assert bought, "some plan must have bought the free capacity"
    first = min(bought, key=lambda p: parse_ts(decided[p]["reservedCapacity"][0]["startTime"]))
    k.apply({"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": f"kill-{tag}"},
             "spec": {"trainingPlanRef": first, "instanceType": itype, "instanceCount": 8}})
    block_start = parse_ts(decided[first]["reservedCapacity"][0]["startTime"])
    assert utcnow() < block_start, "the test was too slow to kill the operator at the block start"
    eventually(lambda: utcnow() >= block_start, timeout=90, interval=0.05, what="block start")
    operator.kill_and_restart()  # while the nodes are being created
    group = eventually(lambda: (s := k.get("instancegroup", f"kill-{tag}").get("status") or {})
                       .get("phase") == "Ready" and s, timeout=60, what="group Ready after restart")
    nodes = k.get("nodes", None, "-l", f"hyperplan.dev/instance-group=kill-{tag}")["items"]
    slots = [n["metadata"]["labels"]["hyperplan.dev/slot"] for n in nodes]
    assert len(nodes) == 8 and sorted(slots) == sorted(set(slots))
    assert group["readyCount"] == 8


def _setup_group(k, tag: str, count: int, **group_spec) -> tuple[str, dict]:
    itype, name = f"ml.mem-{tag}.xlarge", f"mem-{tag}"
    k.create(pool_body(name, itype, count, az="us-east-1m"))
    k.create(plan_body(name, itype, count, duration="1m", autoPurchase=True,
                       startTimeAfter=ts(utcnow() + timedelta(seconds=10))))
    k.create(group_body(name, name, itype, count, **group_spec))
    block = first_block(k, name)
    wait_phase(k, "instancegroup", name, "Ready")
    return name, block


def test_restart_in_the_middle_of_a_grace_neither_judges_early_nor_forgets(scenarios, late_scenarios, operator,
                                                                          crds) -> None:
    """The grace of a health label counts from its first sight, which the node itself keeps
    (annotation hyperplan.dev/health-signal-since): a restart 8 s into a 20 s grace marks the
    node when the grace ends, not 20 s after the restart."""
    for future in [*scenarios.values(), *late_scenarios.values()]:
        future.exception(timeout=900)
    k, grace = crds, 20
    group, _ = _setup_group(k, uuid.uuid4().hex[:5], 2, healthCheck={"graceSeconds": grace, "maxUnhealthy": 1, "rebootBudget": 0})
    victim = k.get("nodes", None, "-l", f"hyperplan.dev/instance-group={group}")["items"][0]["metadata"]["name"]
    t0 = utcnow()
    # (over the Schedulable hyperplan writes there beside its own label: hyperPodLabels)
    k.run("label", "node", victim, "--overwrite", "sagemaker.amazonaws.com/node-health-status=Unschedulable")
    recorded = eventually(lambda: (k.get("node", victim)["metadata"].get("annotations") or {})
                          .get("hyperplan.dev/health-signal-since"), timeout=10, what="the signal recorded")
    assert recorded.startswith("Unschedulable@")
    assert abs((parse_ts(recorded.split("@")[1]) - t0).total_seconds()) <= 3
    eventually(lambda: utcnow() >= t0 + timedelta(seconds=8), timeout=20, interval=0.1, what="8 s into the grace")
    operator.kill_and_restart()

    def marked():
        node = k.get_or_none("node", victim)
        if node is None:  # marked, replaced and removed between two polls: the Event says when
            event = next((e for e in events_for(k, victim) if e.get("reason") == "NodeUnhealthy"
                          and "UnschedulablePendingReplacement" in e.get("message", "")), None)
            return event and parse_ts(event.get("firstTimestamp") or event.get("eventTime") or event["lastTimestamp"])
        labels = node["metadata"].get("labels") or {}
        return labels.get("hyperplan.dev/node-health-status") == "UnschedulablePendingReplacement" and utcnow()

    when = eventually(marked, timeout=60, interval=0.25, what=f"{victim} marked after the grace")
    assert when >= t0 + timedelta(seconds=grace - 1), f"judged early: {(when - t0).total_seconds():.1f} s"
    assert when <= t0 + timedelta(seconds=grace + 6), \
        f"the grace started anew at the restart: marked {(when - t0).total_seconds():.1f} s after the label"


def test_restart_in_the_middle_of_a_drain_keeps_its_deadline(scenarios, late_scenarios, operator, crds) -> None:
    """A drain held up by a PodDisruptionBudget goes on after a restart: the guarded node goes by
    the block's end, and its deletion is not taken for a failure (no replacement is made)."""
    for future in [*scenarios.values(), *late_scenarios.values()]:
        future.exception(timeout=900)
    k, tag = crds, uuid.uuid4().hex[:5]
    group, block = _setup_group(k, tag, 1)
    k.apply([
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
         "metadata": {"name": f"mem-{tag}", "namespace": "default"},
         "spec": {"minAvailable": 1, "selector": {"matchLabels": {"mem": tag}}}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": f"mem-{tag}", "namespace": "default", "labels": {"mem": tag}},
         "spec": {"nodeSelector": {"hyperplan.dev/instance-group": group},
                  "containers": [{"name": "c", "image": "trainer"}]}},
    ])
    eventually(lambda: k.get("pod", f"mem-{tag}", "-n", "default")["status"].get("phase") == "Running",
               timeout=60, what="guarded pod Running")
    (node,) = k.get("nodes", None, "-l", f"hyperplan.dev/instance-group={group}")["items"]
    name = node["metadata"]["name"]
    termination, end = parse_ts(block["terminationTime"]), parse_ts(block["endTime"])
    eventually(lambda: k.get("node", name)["spec"].get("unschedulable"), timeout=120, interval=0.25,
               what="the drain started (node cordoned)")
    # That the cordon was hyperplan's is in the group's record, not on the node (its kubelet could write that).
    eventually(lambda: [e.get("cordoned") for e in (k.get("instancegroup", group).get("status") or {}).get("nodes") or []
                        if e["name"] == name] == [True], timeout=30, what="the cordon recorded")
    assert "hyperplan.dev/cordoned" not in (k.get("node", name)["metadata"].get("annotations") or {})
    operator.kill_and_restart()
    gone = eventually(lambda: k.get_or_none("node", name) is None and utcnow(), timeout=120, interval=0.25,
                      what=f"{name} removed")
    assert gone >= termination + timedelta(seconds=5), "the PDB was not honoured after the restart"
    assert gone <= end + timedelta(seconds=3), f"removed {(gone - end).total_seconds():.1f} s after the block end"
    time.sleep(3)
    status = k.get("instancegroup", group).get("status") or {}
    assert not [e for e in status.get("nodes") or [] if "vanished" in e], status  # its own removal is no failure
    assert k.get("nodes", None, "-l", f"hyperplan.dev/instance-group={group}")["items"] == []
