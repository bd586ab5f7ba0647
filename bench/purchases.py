"""Purchases at scale: N auto-purchasing plans over P pools, the operator against the floor.

1. The floor (no operator running): a bare client, the same Python Kubernetes client the operator
   uses, makes the writes a purchase needs, one plan after the other: create the plan, append
   its reservation to a pool's ``status.reservations`` (a whole-status replace carrying the
   resourceVersion it holds, as the ledger does), and patch the plan's status to ``Scheduled``
   (a status of the operator's shape: three offerings, the reserved block, two conditions). The
   plans are spread over the pools round-robin. Timed from the first create to the last status
   patch; then every floor object is deleted.
2. The operator (demo profile, its own process): the same pools, then the same N plan creates one
   after the other (1 x ml.p5.48xlarge, hyperpod-cluster, ``duration: 1m``, autoPurchase, a
   45-minute window starting 5 minutes ahead, so each pool has room for every plan). Timed from the
   first create until a raw watch has seen every plan settle (``Scheduled`` or ``Failed``).

Target: the operator's time within 2x the floor, and every plan
with room in its window ends ``Scheduled``. Also printed: the plans by phase (and the reasons of
the failed ones), the apiserver's requests during each run by verb and resource
(``apiserver_request_total``), per plan and per operator reconcile, the operator's CPU and RSS,
and the load average at the start and the end.

    .venv/bin/python bench/purchases.py [--plans 1000] [--pools 10] [--pool-size 64] [--window 45]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    loadavg, increase, api_requests,
    API, GROUP, VERSION, BenchError, Harness, machine, metric_sum, pool, print_figures, proc_cpu_seconds,
    proc_rss_mib, run, step, ts, utcnow, verdict,
)

ITYPE = "ml.p5.48xlarge"
AZS = [f"us-east-1{c}" for c in "abcdef"] + [f"us-west-2{c}" for c in "abcd"] + [f"eu-west-1{c}" for c in "abc"]
TARGET_RATIO = 2.0


def show_requests(c: Counter, per: float, unit: str, only: str = "") -> str:
    rows = sorted(((v, k) for k, v in c.items() if only in k[1]), reverse=True)
    return ", ".join(f"{verb} {res} {n:.0f} ({n / per:.2f}/{unit})" for n, (verb, res) in rows) or "none"


def plan_body(name: str, start_after: str, end_before: str, label: str = "purchases") -> dict:
    return {"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": name, "labels": {"bench": label}},
            "spec": {"instanceType": ITYPE, "instanceCount": 1, "targetResource": "hyperpod-cluster",
                     "duration": "1m", "autoPurchase": True, "startTimeAfter": start_after,
                     "endTimeBefore": end_before}}


def floor_status(pool_name: str, az: str, rc_id: str, start, end, now: str) -> dict:
    """A Scheduled status of the shape the operator writes (offerings, block, conditions, counts)."""
    block = {"availabilityZone": az, "instanceType": ITYPE, "instanceCount": 1, "startTime": ts(start),
             "endTime": ts(end), "capacityPool": pool_name}
    offerings = [{"id": f"of-{rc_id}-{k}", "durationHours": 0, "durationMinutes": 1,
                  "blocks": [dict(block, startTime=ts(start + timedelta(seconds=5 * k)),
                                  endTime=ts(end + timedelta(seconds=5 * k)))]} for k in range(3)]
    cond = lambda t, s, r, m: {"type": t, "status": s, "reason": r, "message": m,  # noqa: E731
                               "lastTransitionTime": now, "observedGeneration": 1}
    return {"phase": "Scheduled", "offerings": offerings, "purchasedOfferingId": offerings[0]["id"],
            "reservedCapacity": [dict(block, id=rc_id, status="Scheduled",
                                      terminationTime=ts(end - timedelta(seconds=20)))],
            "availabilityZone": az, "totalInstanceCount": 1, "inUseInstanceCount": 0,
            "unhealthyInstanceCount": 0, "availableSpareInstanceCount": 0, "availableInstanceCount": 1,
            "ultraServers": [], "nextTransitionTime": ts(start), "observedGeneration": 1,
            "conditions": [cond("Purchased", "True", "Purchased", "1 reserved-capacity block(s) bought"),
                           cond("Active", "False", "Scheduled", f"next block {rc_id} starts at {ts(start)}")]}


def run_floor(h: Harness, args, start_after, end_before, prefix: str = "floor") -> dict:
    pools = {}
    for p in range(args.pools):
        pools[p] = h.create("capacitypools", pool(f"{prefix}-{p:02d}", ITYPE, args.pool_size, AZS[p % len(AZS)]))
    start, end = start_after, start_after + timedelta(minutes=1)
    a0 = api_requests(h.api.metrics())
    step(f"floor: {args.plans} x (create plan, pool ledger write, plan status patch), one after the other")
    t0 = time.monotonic()
    for i in range(args.plans):
        name = f"{prefix}-{i:05d}"
        created = h.create("trainingplans", plan_body(name, ts(start_after), ts(end_before), "floor"))
        p = i % args.pools
        obj = pools[p]
        rc_id = f"rc-{created['metadata']['uid'].replace('-', '')[:12]}-0"
        slot = timedelta(seconds=5 * (i // (args.pools * args.pool_size)))
        obj.setdefault("status", {}).setdefault("reservations", []).append({
            "trainingPlan": name, "trainingPlanUid": created["metadata"]["uid"], "reservedCapacityId": rc_id,
            "startTime": ts(start + slot), "endTime": ts(end + slot), "instanceCount": 1})
        updated = h.custom.replace_cluster_custom_object_status(GROUP, VERSION, "capacitypools",
                                                                obj["metadata"]["name"], obj)
        obj["metadata"]["resourceVersion"] = updated["metadata"]["resourceVersion"]
        h.custom.patch_cluster_custom_object_status(
            GROUP, VERSION, "trainingplans", name,
            {"status": floor_status(obj["metadata"]["name"], obj["spec"]["availabilityZone"], rc_id,
                                    start + slot, end + slot, ts(utcnow()))})
        if (i + 1) % max(1, args.plans // 10) == 0:
            step(f"  floor: {i + 1} plans written ({time.monotonic() - t0:.1f} s)")
    elapsed = time.monotonic() - t0
    requests = increase(api_requests(h.api.metrics()), a0)
    step(f"floor: {elapsed:.2f} s; deleting the floor's plans and pools")
    h.custom.delete_collection_cluster_custom_object(GROUP, VERSION, "trainingplans", label_selector="bench=floor")
    for p in range(args.pools):
        h.custom.delete_cluster_custom_object(GROUP, VERSION, "capacitypools", f"{prefix}-{p:02d}")

    def gone() -> bool:
        return not h.api.get(f"/apis/{GROUP}/{VERSION}/trainingplans?limit=1&labelSelector=bench%3Dfloor")["items"]

    deadline = time.monotonic() + 120
    while not gone():
        if time.monotonic() > deadline:
            raise BenchError("the floor's plans were not deleted within 120 s")
        time.sleep(0.5)
    return {"seconds": elapsed, "requests": requests}


class PhaseTracker:
    """Each plan's phase from a raw watch, and when it first settled (Scheduled or Failed)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.phase: dict[str, str] = {}
        self.reason: dict[str, str] = {}
        self.settled_at: dict[str, float] = {}
        self.flips = 0  # phase changes after a plan first settled
        self.events: Counter = Counter()  # watch events by plan: its writes (the create and each status patch)

    def on_event(self, kind: str, obj: dict, t: float) -> None:
        name = obj["metadata"]["name"]
        st = obj.get("status") or {}
        phase = st.get("phase") or "none"
        with self.lock:
            self.events[name] += 1
            if kind == "DELETED":
                self.phase.pop(name, None)
                return
            before = self.phase.get(name)
            self.phase[name] = phase
            if phase == "Failed":
                self.reason[name] = next((c.get("reason") for c in st.get("conditions") or []
                                          if c.get("type") == "Failed"), "?")
            if phase in ("Scheduled", "Failed"):
                if name in self.settled_at and before != phase:
                    self.flips += 1
                self.settled_at.setdefault(name, t)

    def counts(self) -> Counter:
        with self.lock:
            return Counter(self.phase.values())


def main(h: Harness, args: argparse.Namespace) -> int:
    load_start = loadavg()
    now = utcnow()
    start_after = now + timedelta(minutes=5)
    end_before = start_after + timedelta(minutes=args.window)
    floor = run_floor(h, args, start_after, end_before) if args.plans_floor else None

    op = h.start_operator("demo")
    for p in range(args.pools):
        h.create("capacitypools", pool(f"pool-{p:02d}", ITYPE, args.pool_size, AZS[p % len(AZS)]))
    tracker = PhaseTracker()
    h.watch(f"/apis/{GROUP}/{VERSION}/trainingplans", tracker.on_event)
    time.sleep(1)
    # A fresh window: the floor took time, and the plans must still have 45 minutes of room.
    start_after = utcnow() + timedelta(minutes=5)
    end_before = start_after + timedelta(minutes=args.window)
    m0, a0 = op.metrics(), api_requests(h.api.metrics())
    cpu0 = proc_cpu_seconds(op.pid)
    step(f"operator: creating {args.plans} plans (1 x {ITYPE}, 1m, window {args.window} min from "
         f"{ts(start_after)}, autoPurchase) over {args.pools} pools of {args.pool_size}")
    t0 = time.time()
    for i in range(args.plans):
        h.create("trainingplans", plan_body(f"plan-{i:05d}", ts(start_after), ts(end_before)))
        if (i + 1) % max(1, args.plans // 10) == 0:
            step(f"  created {i + 1} plans; settled so far {dict(tracker.counts())}")
    t_created = time.time() - t0
    deadline = time.monotonic() + args.settle_timeout
    last = None
    while True:
        h.tick()
        with tracker.lock:
            settled = len(tracker.settled_at)
        counts = tracker.counts()
        if counts != last:
            step(f"  settling: {dict(counts)} ({time.time() - t0:.1f} s since the first create, "
                 f"operator CPU {proc_cpu_seconds(op.pid) - cpu0:.1f} s, RSS {proc_rss_mib(op.pid):.0f} MiB, "
                 f"load {loadavg()})")
            last = counts
        if settled >= args.plans:
            break
        if time.monotonic() > deadline:
            step(f"NOT SETTLED within {args.settle_timeout} s: {dict(counts)}")
            break
        time.sleep(1)
    time.sleep(3)  # late flips (a Scheduled plan turned Failed, or back) would show now
    with tracker.lock:
        settle = (max(tracker.settled_at.values()) - t0) if tracker.settled_at else float("nan")
        reasons = Counter(tracker.reason[n] for n, ph in tracker.phase.items() if ph == "Failed")
        flips = tracker.flips
        all_settled = len(tracker.settled_at) >= args.plans
    counts = tracker.counts()
    m1, a1 = op.metrics(), api_requests(h.api.metrics())
    cpu = proc_cpu_seconds(op.pid) - cpu0
    rss = proc_rss_mib(op.pid)
    load_after_operator = loadavg()
    requests = increase(a1, a0)
    reconciles = metric_sum(m1, "hyperplan_reconciles_total", lambda l: l.get("kind") in (None, "TrainingPlan")) \
        - metric_sum(m0, "hyperplan_reconciles_total", lambda l: l.get("kind") in (None, "TrainingPlan"))
    status_writes = metric_sum(m1, "hyperplan_status_writes_total") - metric_sum(m0, "hyperplan_status_writes_total")
    conflicts = len(op.log_lines("ledger conflict"))
    step(f"operator API requests: {show_requests(requests, args.plans, 'plan')}")
    floors = [floor["seconds"]] if floor else []
    if floor:
        step(f"floor API requests: {show_requests(floor['requests'], args.plans, 'plan')}")
        # The machine's load drifts: the floor again after the operator run, and their mean is the floor.
        h.stop_operator()
        now = utcnow() + timedelta(minutes=5)
        floors.append(run_floor(h, args, now, now + timedelta(minutes=args.window), prefix="floor2")["seconds"])
    floor_mean = sum(floors) / len(floors) if floors else float("nan")

    ratio = settle / floor_mean if floor else float("nan")
    scheduled = counts.get("Scheduled", 0)
    reads = sum(v for (verb, res), v in requests.items() if verb in ("GET", "LIST") and "hyperplan.dev" in res
                or verb in ("GET", "LIST") and res == "core/nodes")
    rows = [
        ("machine", machine(), "", ""),
        ("load average at the start / after the operator run / the end",
         f"{load_start} / {load_after_operator} / {loadavg()}", "", ""),
        ("plans / pools x size", f"{args.plans} / {args.pools} x {args.pool_size} ({ITYPE}), window "
         f"{args.window} min", "", ""),
        ("floor: creates + ledger writes + status writes, one after the other (before / after; mean)",
         " / ".join(f"{f:.1f} s" for f in floors) + f"; {floor_mean:.1f} s" if floor else "not run", "", ""),
        ("operator: first create to the last plan settled", f"{settle:.1f} s"
         + ("" if all_settled else f" (NOT all settled within {args.settle_timeout} s)"), "", ""),
        ("  of which the creates alone (bench thread)", f"{t_created:.1f} s", "", ""),
        ("ratio operator / floor", f"{ratio:.2f}x", f"<= {TARGET_RATIO}x",
         verdict(ratio <= TARGET_RATIO) if floor else "n/a"),
        ("plans by phase", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), f"Scheduled {args.plans}",
         verdict(scheduled == args.plans)),
        ("failed, by reason", ", ".join(f"{k} {v}" for k, v in reasons.items()) or "none", "", ""),
        ("phase flips after settling", str(flips), "0", verdict(flips == 0)),
        ("operator: plan reconciles / status writes / ledger conflicts",
         f"{reconciles:.0f} / {status_writes:.0f} / {conflicts}", "", ""),
        ("operator: reads of hyperplan objects and nodes (GET+LIST) per plan / per reconcile",
         f"{reads / args.plans:.2f} / {reads / max(1, reconciles):.2f}", "", ""),
        ("operator: CPU while settling / RSS at the end", f"{cpu:.1f} s / {rss:.0f} MiB", "", ""),
    ]
    print_figures("purchases", rows)
    ok = floor is not None and ratio <= TARGET_RATIO and scheduled == args.plans and flips == 0
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plans", type=int, default=1000)
    ap.add_argument("--pools", type=int, default=10)
    ap.add_argument("--pool-size", type=int, default=64)
    ap.add_argument("--window", type=int, default=45, help="minutes of each plan's window")
    ap.add_argument("--settle-timeout", type=int, default=300)
    ap.add_argument("--no-floor", dest="plans_floor", action="store_false", help="skip the floor run")
    args = ap.parse_args()
    if args.pools > len(AZS):
        ap.error(f"--pools at most {len(AZS)}")
    run(lambda h: main(h, args), "purchases", budget=180 + args.plans * 0.3 + args.settle_timeout + 60)
