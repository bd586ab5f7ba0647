"""Nodes for a 64-instance group: the operator against the floor of the bare API calls.

1. The floor: 64 KWOK nodes (annotation kwok.x-k8s.io/node=fake, the labels, capacity and
   allocatable the operator's KWOK provider writes) created with one ``create_node`` call each,
   from the same Python Kubernetes client the operator uses, one after the other; timed from
   the first call until a node watch has seen all 64 Ready. One node is created and deleted first
   as a warm-up; then ``--floor-runs`` runs (default 3; the nodes are deleted in between), whose
   median is the floor. One more run creates them from 8 threads at once, for comparison (the
   operator creates a group's nodes one after the other).
2. The operator (demo profile, its own process): a plan of 64 x ml.p5.48xlarge
   (hyperpod-cluster, autoPurchase, block starting ~20 s ahead) and an InstanceGroup of 64 nodes;
   timed from the block's start (``status.reservedCapacity[0].startTime``) until the watch has
   seen all 64 group nodes Ready. ``--runs`` times (default 3; each run a new plan and group, the
   previous group deleted and its nodes gone first); the median is compared with the floor.

Target: operator time <= 1.3 x the floor, on the same control plane.

    .venv/bin/python bench/nodes_ready.py [--nodes 64] [--floor-runs 3] [--runs 3] [--lead 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    API, GROUP, VERSION, BenchError, Harness, epoch, fmt, machine, metric_sum, node_ready, parse_ts, pool,
    loadavg, print_figures, proc_cpu_seconds, run, step, ts, utcnow, verdict, wait_for,
)

ITYPE = "ml.p5.48xlarge"
AZ = "us-east-1a"
TARGET_RATIO = 1.3
GROUP_LABEL = "hyperplan.dev/instance-group"


class NodeTracker:
    """First-seen and first-Ready wall times of the nodes of one group label, from a watch."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.added: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.present: set[str] = set()

    def on_event(self, kind: str, obj: dict, t: float) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                self.present.discard(name)
                return
            self.present.add(name)
            self.added.setdefault(name, t)
            if node_ready(obj):
                self.ready.setdefault(name, t)

    def ready_count(self) -> int:
        with self.lock:
            return len(self.ready)

    def last_ready(self) -> float:
        with self.lock:
            return max(self.ready.values())


def plane_cpu(h: Harness) -> dict[str, float]:
    """CPU seconds so far of the plane's processes (and the operator's, when it runs)."""
    pids = dict((h.plane.state().pids if h.plane.state() else {}))
    if h.operator is not None:
        pids["operator"] = h.operator.pid
    out = {}
    for name, pid in pids.items():
        try:
            out[name] = proc_cpu_seconds(pid)
        except OSError:
            pass
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after if k in before}


def show_cpu(d: dict[str, float]) -> str:
    short = {"kube-apiserver": "apiserver", "etcd": "etcd", "kwok": "kwok", "operator": "operator"}
    return ", ".join(f"{short[k]} {d[k]:.2f}" for k in short if k in d)


def field_managers(h: Harness, group: str) -> str:
    """Who wrote the group's nodes, from managedFields: manager, operation, subresource -> node count."""
    from collections import Counter

    seen: Counter = Counter()
    for node in h.api.get(f"/api/v1/nodes?labelSelector={GROUP_LABEL}%3D{group}")["items"]:
        for m in node["metadata"].get("managedFields") or []:
            seen[(m.get("manager", "?").split("/")[0], m.get("operation"), m.get("subresource", ""))] += 1
    return "; ".join(f"{m} {op}{'/' + sub if sub else ''} x{n}" for (m, op, sub), n in sorted(seen.items()))


def floor_body(group: str, i: int) -> dict:
    from hyperplan.actuation.providers.base import node_capacity

    name = f"{group}-{i:03d}"
    labels = {
        "node.kubernetes.io/instance-type": ITYPE, "topology.kubernetes.io/zone": AZ,
        GROUP_LABEL: group, "hyperplan.dev/training-plan": "floor", "hyperplan.dev/reserved-capacity": "rc-floor",
        "kubernetes.io/hostname": name, "hyperplan.dev/role": "active",
        "hyperplan.dev/node-health-status": "Schedulable", "hyperplan.dev/slot": str(i),
        "hyperplan.dev/generation": "0", "hyperplan.dev/node-id": name,
    }
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": {"taints": []},
            "status": {"capacity": node_capacity(ITYPE), "allocatable": node_capacity(ITYPE)}}


def floor_run(h: Harness, group: str, n: int, threads: int) -> dict:
    tracker = NodeTracker()
    w = h.watch("/api/v1/nodes", tracker.on_event, labelSelector=f"{GROUP_LABEL}={group}")
    bodies = [floor_body(group, i) for i in range(n)]
    cpu0 = time.process_time()
    procs0 = plane_cpu(h)
    t0 = time.time()
    if threads == 1:
        for body in bodies:
            h.core.create_node(body)
    else:
        with ThreadPoolExecutor(threads) as pool_:
            list(pool_.map(h.core.create_node, bodies))
    t_calls = time.time() - t0
    cpu = time.process_time() - cpu0  # this process: the calls, and the watch thread
    wait_for(lambda: tracker.ready_count() >= n, timeout=90, what=f"{n} floor nodes Ready ({group})",
             interval=0.05)
    total = tracker.last_ready() - t0
    procs = cpu_delta(procs0, plane_cpu(h))
    managers = field_managers(h, group)
    step(f"floor {group}: {n} create calls took {t_calls:.2f} s ({cpu:.2f} s CPU in this process); "
         f"all Ready after {total:.2f} s; CPU s meanwhile: {show_cpu(procs)}; field managers: {managers}")
    h.core.delete_collection_node(label_selector=f"{GROUP_LABEL}={group}")
    wait_for(lambda: not tracker.present, timeout=60, what=f"floor nodes of {group} deleted", interval=0.1)
    w.stop()
    return {"calls": t_calls, "ready": total, "cpu": cpu, "procs": procs}


def warm_up(h: Harness) -> None:
    """One node created and deleted, so that no measured run pays for the first connection."""
    body = floor_body("warmup", 0)
    h.core.create_node(body)
    h.core.delete_node(body["metadata"]["name"])


def group_to_ready(h: Harness, i: int, name: str, plan_spec: dict, group_spec: dict, n: int, lead: int,
                   buy_timeout: float = 60, ready_timeout: float = 90) -> tuple[dict, NodeTracker, Any]:
    """One operator run: a plan (``plan_spec`` plus its start ``lead`` seconds from now) and a group
    named ``name``, timed from the block's start until all ``n`` nodes of the group are Ready.

    Returns the figures (first and last node seen and all Ready, seconds after the block start;
    nodes seen before it; the operator's reconciles, status writes and CPU; the apiserver's node
    LISTs, POSTs and PATCHes; CPU by plane process; the load average), the tracker and its watch
    (the caller cleans up with :func:`remove_group`)."""
    tracker = NodeTracker()
    w = h.watch("/api/v1/nodes", tracker.on_event, labelSelector=f"{GROUP_LABEL}={name}")
    start_after = utcnow().replace(microsecond=0) + timedelta(seconds=lead)
    h.create("trainingplans", {
        "apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": name},
        "spec": {**plan_spec, "targetResource": "hyperpod-cluster", "duration": "3m", "autoPurchase": True,
                 "startTimeAfter": ts(start_after)}})
    h.create("instancegroups", {
        "apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": name},
        "spec": {"trainingPlanRef": name, **group_spec}})

    def bought():
        h.tick()
        st = h.status("trainingplans", name)
        if st.get("phase") == "Failed":
            raise BenchError(f"plan {name} failed: {st.get('conditions')}")
        return st.get("phase") == "Scheduled" and st.get("reservedCapacity") and st

    st = wait_for(bought, timeout=buy_timeout, what=f"plan {name} bought", interval=0.2)
    start = epoch(parse_ts(st["reservedCapacity"][0]["startTime"]))
    step(f"operator run {i + 1}: plan bought; block starts at {st['reservedCapacity'][0]['startTime']} "
         f"({start - time.time():.1f} s from now)")
    wait_for(lambda: time.time() > start - 1, timeout=max(0, start - time.time()) + 5, what="block start",
             interval=0.1)
    load = loadavg()
    op = h.operator
    m0, a0, cpu0, procs0 = op.metrics(), h.api.metrics(), proc_cpu_seconds(op.pid), plane_cpu(h)

    def all_ready():
        h.tick()
        return tracker.ready_count() >= n

    wait_for(all_ready, timeout=ready_timeout, what=f"{n} nodes of group {name} Ready", interval=0.05)
    m1, a1, cpu1, procs1 = op.metrics(), h.api.metrics(), proc_cpu_seconds(op.pid), plane_cpu(h)
    with tracker.lock:
        first_added = min(tracker.added.values()) - start
        last_added = max(tracker.added.values()) - start
        early = [x for x, t in tracker.added.items() if t < start]
    delta = lambda text0, text1, metric, where=lambda _: True: (  # noqa: E731
        metric_sum(text1, metric, where) - metric_sum(text0, metric, where))
    node_verb = lambda verb: delta(a0, a1, "apiserver_request_total",  # noqa: E731
                                   lambda l: l.get("resource") == "nodes" and l.get("verb") == verb
                                   and not l.get("subresource"))
    r = {"start": start, "first": first_added, "last": last_added, "ready": tracker.last_ready() - start,
         "early": len(early),
         "load": load, "reconciles": delta(m0, m1, "hyperplan_reconciles_total"),
         "status_writes": delta(m0, m1, "hyperplan_status_writes_total"),
         "node_lists": node_verb("LIST"), "node_posts": node_verb("POST"), "node_patches": node_verb("PATCH"),
         "cpu": cpu1 - cpu0, "procs": cpu_delta(procs0, procs1)}
    step(f"operator run {i + 1}: first node seen {first_added:+.2f} s after the block start, last node "
         f"{last_added:+.2f} s, all {n} Ready {r['ready']:.2f} s (load {load}); meanwhile the operator used "
         f"{r['cpu']:.2f} s CPU, ran {r['reconciles']:.0f} reconciles, wrote {r['status_writes']:.0f} statuses, "
         f"created {r['node_posts']:.0f} nodes, listed nodes {r['node_lists']:.0f} times and patched nodes "
         f"{r['node_patches']:.0f} times (apiserver counts); CPU s from 1 s before the start: {show_cpu(r['procs'])}")
    if early:
        step(f"WARNING: {len(early)} nodes appeared before the block started")
    return r, tracker, w


def remove_group(h: Harness, name: str, tracker: NodeTracker, w: Any, timeout: float) -> None:
    """Delete the run's group, wait until its nodes are gone, then delete its plan."""
    h.custom.delete_cluster_custom_object(GROUP, VERSION, "instancegroups", name)
    wait_for(lambda: not tracker.present, timeout=timeout, what=f"nodes of {name} removed", interval=0.2)
    h.custom.delete_cluster_custom_object(GROUP, VERSION, "trainingplans", name)
    w.stop()


def operator_run(h: Harness, i: int, n: int, lead: int) -> dict:
    name = f"bench-{n}-{i}"
    r, tracker, w = group_to_ready(h, i, name, {"instanceType": ITYPE, "instanceCount": n},
                                   {"instanceType": ITYPE, "instanceCount": n}, n, lead)
    r["managers"] = field_managers(h, name)
    step(f"operator run {i + 1}: field managers of the group's nodes: {r['managers']}")
    # Diagnostic: what one LIST of these nodes costs a Python client (the operator lists them on each pass).
    costs = []
    for _ in range(3):
        t0 = time.perf_counter()
        h.core.list_node(label_selector=f"{GROUP_LABEL}={name}")
        costs.append(time.perf_counter() - t0)
    r["list_cost"] = statistics.median(costs)
    # Clean up before the next run, so that it starts with as few nodes as the first.
    remove_group(h, name, tracker, w, timeout=60)
    return r


def main(h: Harness, args: argparse.Namespace) -> int:
    n = args.nodes
    warm_up(h)
    floors = []
    for r in range(args.floor_runs):
        step(f"floor run {r + 1}/{args.floor_runs}: {n} create_node calls, one after the other")
        floors.append(floor_run(h, f"floor-seq{r}", n, threads=1))
    step(f"floor, parallel: {n} create_node calls from 8 threads")
    parallel = floor_run(h, "floor-par", n, threads=8)
    floor = statistics.median(f["ready"] for f in floors)

    h.start_operator("demo")
    h.create("capacitypools", pool("bench-p5", ITYPE, n * args.runs, AZ))
    runs = [operator_run(h, i, n, args.lead) for i in range(args.runs)]
    op_time = statistics.median(r["ready"] for r in runs)
    ratio = op_time / floor
    rows = [
        ("machine", machine(), "", ""),
        *[(f"floor run {i + 1}: {n} sequential creates, calls / all Ready (client CPU)",
           f"{f['calls']:.2f} s / {f['ready']:.2f} s ({f['cpu']:.2f} s)", "", "") for i, f in enumerate(floors)],
        (f"floor: median of {len(floors)} sequential runs", fmt(floor, 2), "", ""),
        (f"{n} parallel creates (8 threads), calls / all Ready",
         f"{parallel['calls']:.2f} s / {parallel['ready']:.2f} s", "", ""),
        *[(f"operator run {i + 1}: block start to first node / last node / all Ready",
           f"{r['first']:.2f} / {r['last']:.2f} / {r['ready']:.2f} s", "", "") for i, r in enumerate(runs)],
        ("operator per run: CPU s / reconciles / status writes / node LISTs",
         "; ".join(f"{r['cpu']:.2f}/{r['reconciles']:.0f}/{r['status_writes']:.0f}/{r['node_lists']:.0f}"
                   for r in runs), "", ""),
        *[(f"floor run {i + 1}: CPU s of the plane meanwhile", show_cpu(f["procs"]), "", "")
          for i, f in enumerate(floors)],
        ("parallel creates: CPU s of the plane meanwhile", show_cpu(parallel["procs"]), "", ""),
        *[(f"operator run {i + 1}: CPU s from 1 s before the start to all Ready", show_cpu(r["procs"]), "", "")
          for i, r in enumerate(runs)],
        (f"one LIST of the {n} group nodes via the Python client (median)",
         f"{statistics.median(r['list_cost'] for r in runs) * 1000:.0f} ms", "", ""),
        (f"operator: median block start to all {n} Ready", fmt(op_time, 2), "", ""),
        ("ratio operator / floor (medians)", f"{ratio:.2f}x", f"<= {TARGET_RATIO}x", verdict(ratio <= TARGET_RATIO)),
        ("ratio operator / fastest floor run", f"{op_time / min(f['ready'] for f in floors):.2f}x", "", ""),
        ("ratio operator / parallel creates", f"{op_time / parallel['ready']:.2f}x", "(for information)", ""),
    ]
    print_figures("nodes_ready", rows)
    return 0 if ratio <= TARGET_RATIO and not any(r["early"] for r in runs) else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=64, help="group size (an allowed plan count: 1..64, powers of 2)")
    ap.add_argument("--floor-runs", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3, help="operator runs (each a new plan and group)")
    ap.add_argument("--lead", type=int, default=20, help="seconds from now to the plan's startTimeAfter")
    args = ap.parse_args()
    run(lambda h: main(h, args), "nodes_ready", budget=60 + args.runs * (args.lead + 60))
