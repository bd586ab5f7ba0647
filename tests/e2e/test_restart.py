"""kill -9 at awkward moments, then a restart: no duplicate node, no orphan, no double booking.

Runs after every side-by-side scenario has finished, since it kills the shared operator.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import timedelta

from tests.e2e.scenarios import parse_ts, ts, utcnow
from tests.kube import eventually

API = "hyperplan.dev/v1alpha1"


def test_kill_during_purchase_and_provisioning_converges(scenarios, operator, crds) -> None:
    for future in scenarios.values():  # the shared operator is about to die: let the others finish
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
