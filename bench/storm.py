"""A failure storm: 40 nodes fail at once across 20 groups; how soon does each spare serve, and
how soon is each failed node's backfill Ready?

20 plans of one ml.u-p6e-gb200x36 UltraServer each (9 instances, ``spareInstancesPerUltraServer``
2; hyperpod-cluster, autoPurchase, demo profile) and 20 InstanceGroups of 7 (7 active + 2 spares
= 9 nodes each, 180 nodes), ``healthCheck.graceSeconds`` ``--grace`` and ``maxUnhealthy`` 3, so
two failures per group stay under the bound. Once every group is Ready, two active nodes of
every group get the health label the operator reads (``hyperplan.dev/node-health-status=
Unschedulable``, as a health agent sets it; with ``rebootBudget`` 0 the ladder replaces), all 40 patches sent together from 40
threads. A raw watch on the nodes stamps, per failed node:

* the grace end: the moment the watch delivered the label (the same stream the operator
  reads; both stamps below are taken the same way) plus the grace; the operator's own record of
  its first sight (``hyperplan.dev/health-signal-since``) is printed beside it;
* spare serving: the spare that carries ``hyperplan.dev/replaces=<failed node>`` has lost the
  ``hyperplan.dev/spare`` taint and has role ``active`` (what a user sees on the Node);
* backfill Ready: the node in the failed node's slot with the next generation is Ready.

Targets: every spare serving within 2 s of its grace end; every backfill Ready within
10 s of it. Prints max, p50 and p95 of each, and the verdicts.

    .venv/bin/python bench/storm.py [--groups 20] [--per-group 2] [--grace 2] [--lead 25]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    API, BenchError, Harness, epoch, has_taint, loadavg, machine, metric_sum, node_ready, parse_ts, pool,
    print_figures, proc_cpu_seconds, run, scrape, step, summary, ts, utcnow, verdict, wait_for,
)

GB200, X36 = "ml.p6e-gb200.36xlarge", "ml.u-p6e-gb200x36"
AZ = "us-west-2c"
ACTIVE, SPARES = 7, 2
SPARE_TAINT = "hyperplan.dev/spare"
HEALTH = "hyperplan.dev/node-health-status"
# A health agent's verdict. (UnschedulablePendingReboot, which this bench sent before the recovery
# ladder, is now an admin's request for a reboot: the node is rebooted, whatever rebootBudget says,
# and no backfill is made.)
SIGNAL = "Unschedulable"
SINCE_ANNOTATION = "hyperplan.dev/health-signal-since"
GROUP_LABEL = "hyperplan.dev/instance-group"
SPARE_TARGET, BACKFILL_TARGET = 2.0, 10.0


def labels(node: dict) -> dict:
    return node["metadata"].get("labels") or {}


class Fleet:
    """Every group node as the watch last saw it, with the first moment each was seen serving
    (an active node without the spare taint) and Ready."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objs: dict[str, dict] = {}
        self.serving_at: dict[str, float] = {}
        self.ready_at: dict[str, float] = {}
        self.deleted_at: dict[str, float] = {}
        self.since_record: dict[str, str] = {}  # the operator's record of first sight, by node
        self.labelled_at: dict[str, float] = {}  # when the watch first saw the node's failure label

    def on_event(self, kind: str, obj: dict, t: float) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                self.objs.pop(name, None)
                self.deleted_at.setdefault(name, t)
                return
            self.objs[name] = obj
            if labels(obj).get(HEALTH) == SIGNAL:
                self.labelled_at.setdefault(name, t)
            record = (obj["metadata"].get("annotations") or {}).get(SINCE_ANNOTATION)
            if record:
                self.since_record.setdefault(name, record)
            if labels(obj).get("hyperplan.dev/role") == "active" and not has_taint(obj, SPARE_TAINT):
                self.serving_at.setdefault(name, t)
            if node_ready(obj):
                self.ready_at.setdefault(name, t)

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.objs.values())


def group_whole(h: Harness, fleet: Fleet, group: str) -> bool:
    ns = [n for n in fleet.snapshot() if labels(n).get(GROUP_LABEL) == group]
    ok = [n for n in ns if node_ready(n) and labels(n).get(HEALTH) == "Schedulable"]
    spares = [n for n in ok if labels(n).get("hyperplan.dev/role") == "spare" and has_taint(n, SPARE_TAINT)]
    return len(ns) == ACTIVE + SPARES and len(ok) == len(ns) and len(spares) == SPARES


def ultraserver_groups(h: Harness, pool_name: str, az: str, names: list[str], lead: int,
                       health_check: Callable[[str], dict]) -> tuple[float, float]:
    """One x36 UltraServer plan (2 spares, 5 minutes from ``lead`` s on) and one group of 7 active
    nodes on it per name, from one pool; ``health_check(name)`` is the group's ``healthCheck``.
    Waits until every plan is bought; returns the first termination time and the last start (epoch)."""
    h.create("capacitypools", pool(pool_name, GB200, 9 * len(names), az, ultra=X36))
    start_after = ts(utcnow().replace(microsecond=0) + timedelta(seconds=lead))
    for name in names:
        h.create("trainingplans", {
            "apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": name},
            "spec": {"ultraServerType": X36, "ultraServerCount": 1, "spareInstancesPerUltraServer": SPARES,
                     "targetResource": "hyperpod-cluster", "duration": "5m", "autoPurchase": True,
                     "startTimeAfter": start_after}})
        h.create("instancegroups", {
            "apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": name},
            "spec": {"trainingPlanRef": name, "instanceType": GB200, "instanceCount": ACTIVE,
                     "healthCheck": health_check(name)}})
    step(f"{len(names)} plans of 1 x {X36} and {len(names)} groups of {ACTIVE} active + {SPARES} spares created")

    def bought():
        h.tick()
        sts = [h.status("trainingplans", n) for n in names]
        failed = [n for n, st in zip(names, sts) if st.get("phase") == "Failed"]
        if failed:
            raise BenchError(f"plans failed: {failed}: {sts[names.index(failed[0])].get('conditions')}")
        return all(st.get("reservedCapacity") for st in sts) and sts

    sts = wait_for(bought, timeout=120, what="every plan bought", interval=0.5)
    termination = min(epoch(parse_ts(st["reservedCapacity"][0]["terminationTime"])) for st in sts)
    start = max(epoch(parse_ts(st["reservedCapacity"][0]["startTime"])) for st in sts)
    step(f"every plan bought; the last block starts in {start - time.time():.1f} s")
    return termination, start


def main(h: Harness, args: argparse.Namespace) -> int:
    names = [f"storm-{i:02d}" for i in range(args.groups)]
    op = h.start_operator("demo")
    fleet = Fleet()
    h.watch("/api/v1/nodes", fleet.on_event, labelSelector=GROUP_LABEL)
    termination, start = ultraserver_groups(h, "storm-gb200", AZ, names, args.lead, lambda name: {
        "graceSeconds": args.grace, "maxUnhealthy": 3, "rebootBudget": 0})

    def all_whole():
        h.tick()
        if not all(group_whole(h, fleet, n) for n in names):
            return False
        return all(h.status("instancegroups", n).get("phase") == "Ready" for n in names)

    wait_for(all_whole, timeout=max(0, start - time.time()) + 180, what="every group Ready and whole", interval=0.5)
    step(f"every group Ready: {len(fleet.snapshot())} nodes")
    time.sleep(2)  # let the creates' own events settle

    # Two original active nodes of every group, on different slots.
    victims: list[dict] = []
    for name in names:
        actives = sorted((labels(n)["hyperplan.dev/slot"], n["metadata"]["name"]) for n in fleet.snapshot()
                         if labels(n).get(GROUP_LABEL) == name and labels(n).get("hyperplan.dev/role") == "active")
        for slot, node in actives[:args.per_group]:
            obj = next(o for o in fleet.snapshot() if o["metadata"]["name"] == node)
            victims.append({"group": name, "node": node, "slot": slot,
                            "generation": int(labels(obj).get("hyperplan.dev/generation", "0"))})
    if time.time() > termination - 60:
        raise BenchError("the blocks are about to end; raise the plans' duration")

    load = loadavg()
    op_cpu0, m0 = proc_cpu_seconds(op.pid), op.metrics()

    def fail(v: dict) -> None:
        v["sent"] = time.time()
        h.core.patch_node(v["node"], {"metadata": {"labels": {HEALTH: SIGNAL}}})
        v["stored"] = time.time()

    barrier_at = time.time()
    with ThreadPoolExecutor(len(victims)) as workers:
        list(workers.map(fail, victims))
    step(f"{len(victims)} nodes labelled {HEALTH}={SIGNAL} across {args.groups} groups: patches sent within "
         f"{max(v['sent'] for v in victims) - barrier_at:.2f} s, all stored within "
         f"{max(v['stored'] for v in victims) - barrier_at:.2f} s (load {load})")

    def replacement(v: dict) -> tuple[str | None, str | None]:
        spare = backfill = None
        for n in fleet.snapshot():
            lb = labels(n)
            if lb.get("hyperplan.dev/replaces") == v["node"]:
                spare = n["metadata"]["name"]
            if (lb.get(GROUP_LABEL) == v["group"] and lb.get("hyperplan.dev/slot") == v["slot"]
                    and lb.get("hyperplan.dev/generation") == str(v["generation"] + 1)):
                backfill = n["metadata"]["name"]
        return spare, backfill

    def done() -> bool:
        h.tick()
        with fleet.lock:
            served, ready = dict(fleet.serving_at), dict(fleet.ready_at)
        for v in victims:
            spare, backfill = replacement(v)
            if spare is None or spare not in served or backfill is None or backfill not in ready:
                return False
            v["spare"], v["backfill"] = spare, backfill
            v["served"], v["ready"] = served[spare], ready[backfill]
        return True

    wait_for(done, timeout=args.grace + 120, what="every spare serving and every backfill Ready", interval=0.05)
    op_cpu = proc_cpu_seconds(op.pid) - op_cpu0
    m1 = op.metrics()
    for v in victims:
        with fleet.lock:
            v["seen"] = fleet.labelled_at[v["node"]]
        v["due"] = v["seen"] + args.grace
        v["spare_lag"] = v["served"] - v["due"]
        v["backfill_lag"] = v["ready"] - v["due"]
        with fleet.lock:
            v["record"] = fleet.since_record.get(v["node"], "not seen").rpartition("@")[2]
        try:  # the grace as the operator counts it: from its own first sight of the label
            v["own_lag"] = v["served"] - (epoch(parse_ts(v["record"])) + args.grace)
        except ValueError:
            v["own_lag"] = float("nan")
    worst = max(victims, key=lambda v: v["spare_lag"])
    for v in sorted(victims, key=lambda v: v["node"]):
        step(f"{v['node']}: spare {v['spare']} serving {v['spare_lag']:+.3f} s, backfill {v['backfill']} Ready "
             f"{v['backfill_lag']:+.3f} s after the grace end (operator's first sight recorded {v['record']})")

    # The group whole again: every failed node removed, every new spare Ready.
    wait_for(lambda: all(v["node"] in fleet.deleted_at for v in victims) and all(group_whole(h, fleet, n) for n in names),
             timeout=120, what="every group whole again", interval=0.2)
    whole = time.time() - max(v["due"] for v in victims)
    spare_s, back_s = summary([v["spare_lag"] for v in victims]), summary([v["backfill_lag"] for v in victims])
    remediations = {labels_.get("action"): int(value) for labels_, value in scrape(m1, "hyperplan_remediations_total")}
    errors = op.log_lines("ERROR") + op.log_lines("Traceback")
    if errors:
        step(f"operator log has {len(errors)} ERROR/Traceback lines, first: {errors[0][:200]}")
    rows = [
        ("machine", machine(), "", ""),
        ("load average when the nodes failed / at the end", f"{load} / {loadavg()}", "", ""),
        ("label patch sent to label seen by the watch: max",
         f"{max(v['seen'] - v['sent'] for v in victims):.3f} s", "", ""),
        ("failures (groups x per group), grace", f"{len(victims)} ({args.groups} x {args.per_group}), {args.grace} s",
         "", ""),
        ("grace end to spare serving: p50 / p95 / max",
         f"{spare_s['p50']:.3f} / {spare_s['p95']:.3f} / {spare_s['max']:.3f} s", f"max <= {SPARE_TARGET:.0f} s",
         verdict(spare_s["max"] <= SPARE_TARGET)),
        # Two watch streams (this script's and the operator's) see one label a few ms apart, so
        # the first row can dip below 0 by that much; the second counts the grace from the
        # operator's own recorded first sight, which is what "never before the grace ends" means.
        ("grace end to spare serving: min, grace from this script's watch (ms apart from the operator's)",
         f"{spare_s['min']:.3f} s", "", ""),
        ("grace end to spare serving: min, grace from the operator's recorded first sight",
         f"{min(v['own_lag'] for v in victims):.3f} s", ">= 0",
         verdict(min(v["own_lag"] for v in victims) >= 0)),
        ("grace end to backfill Ready: p50 / p95 / max",
         f"{back_s['p50']:.3f} / {back_s['p95']:.3f} / {back_s['max']:.3f} s", f"max <= {BACKFILL_TARGET:.0f} s",
         verdict(back_s["max"] <= BACKFILL_TARGET)),
        ("slowest spare", f"{worst['spare']} for {worst['node']}", "", ""),
        ("last grace end to every group whole again (failed nodes removed)", f"{whole:.1f} s", "", ""),
        ("operator remediations mark / promote / remove / backfill",
         "/".join(str(remediations.get(a, 0)) for a in ("mark", "promote", "remove", "backfill")), "", ""),
        ("operator CPU s / reconciles, from the failures to the last backfill Ready",
         f"{op_cpu:.2f} / {metric_sum(m1, 'hyperplan_reconciles_total') - metric_sum(m0, 'hyperplan_reconciles_total'):.0f}",
         "", ""),
    ]
    print_figures("storm", rows)
    ok = spare_s["max"] <= SPARE_TARGET and min(v["own_lag"] for v in victims) >= 0 and back_s["max"] <= BACKFILL_TARGET
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=20)
    ap.add_argument("--per-group", type=int, default=2, help="failed nodes per group (at most 2: the spares)")
    ap.add_argument("--grace", type=int, default=2, help="healthCheck.graceSeconds of every group")
    ap.add_argument("--lead", type=int, default=25, help="seconds from now to the plans' startTimeAfter")
    args = ap.parse_args()
    if not 1 <= args.per_group <= SPARES:
        ap.error(f"--per-group must be 1..{SPARES}")
    run(lambda h: main(h, args), "storm", budget=args.lead + 420)
