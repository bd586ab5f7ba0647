"""Provisioning a fleet-sized group: 288 nodes (16 x ml.u-p6e-gb200x72 UltraServers) against the
floor of the same creates from a bare client with the same parallelism.

1. The floor: the 288 Node objects the operator makes for a group of 16 x72 UltraServers (17
   active + 1 spare each) - the same labels, taints, annotation and capacity, computed by the
   operator's own ``decide_group`` and ``kwok_node_body`` - created by a bare Python client (the
   operator's client library, called as ``KwokProvider.create`` calls it) from as many threads as
   the operator uses for a pass's creates (``actuation.groups.CREATE_WORKERS``). Timed from the first call until a raw node watch has
   seen all of them Ready (KWOK makes them Ready). Before each run (floor or operator) the
   previous run's node Leases must be gone, and a floor run waits ``--settle`` s more, as an
   operator run waits its lead time. ``--floor-runs`` runs before the operator
   starts and as many again after it stopped, because the machine's load drifts; the floor is the
   median of all of them (each half is printed too). One node is created and deleted first.
2. The operator (demo profile, its own process): a plan of 16 x ml.u-p6e-gb200x72
   (hyperpod-cluster, autoPurchase, block ~``--lead`` s ahead) and an InstanceGroup of 272; timed
   from the block's ``startTime`` until the watch has seen all 288 group nodes Ready. ``--runs``
   runs (each a new plan and group; the previous group is deleted and its nodes gone first).

Target: the median operator time <= 1.3 x the floor, on the same control plane.

    .venv/bin/python bench/provisioning.py [--ultraservers 16] [--floor-runs 3] [--runs 3] [--lead 25]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    BenchError, Harness, fmt, loadavg, machine, metric_sum, pool, print_figures, run, step, utcnow, verdict,
    wait_for,
)
from nodes_ready import NodeTracker, cpu_delta, group_to_ready, plane_cpu, remove_group, show_cpu  # noqa: E402

from hyperplan.actuation.groups import CREATE_WORKERS  # noqa: E402
from hyperplan.actuation.providers.kwok import kwok_node_body  # noqa: E402
from hyperplan.api.models import InstanceGroupSpec, InstanceGroupStatus, ReservedCapacity  # noqa: E402
from hyperplan.planning import placement  # noqa: E402
from hyperplan.planning.groups import Peer, BoundPlan, decide_group  # noqa: E402
from hyperplan.planning.policy import DEMO  # noqa: E402

GB200, X72 = "ml.p6e-gb200.36xlarge", "ml.u-p6e-gb200x72"
PER_ULTRASERVER = 18  # 17 active + 1 spare
AZ = "us-west-2b"
TARGET_RATIO = 1.3
GROUP_LABEL = "hyperplan.dev/instance-group"


def floor_bodies(group: str, ultraservers: int) -> list[dict]:
    """The Node objects the operator's first pass creates for a group of ``17 x ultraservers``
    on a fresh block of ``ultraservers`` x72 UltraServers (planning decides them, as in a pass)."""
    now = utcnow()
    count = PER_ULTRASERVER * ultraservers
    block = ReservedCapacity(id=f"rc-{group}", availability_zone=AZ, instance_type=placement.ULTRASERVER_INSTANCE_TYPE,
                             instance_count=count, start_time=now - timedelta(seconds=1),
                             end_time=now + timedelta(minutes=3), ultra_server_type=X72,
                             ultra_server_count=ultraservers)
    plan = BoundPlan(group, "hyperpod-cluster", None, X72, 1, (block,))
    spec = InstanceGroupSpec(training_plan_ref=group, instance_type=GB200, instance_count=17 * ultraservers)
    d = decide_group(group, 1, spec, InstanceGroupStatus(), plan, [Peer(group, spec.instance_count)], [], DEMO, now)
    if len(d.create) != count:
        raise BenchError(f"planning made {len(d.create)} nodes for the floor, expected {count}")
    return [kwok_node_body(s) for s in d.create]


def node_leases(h: Harness) -> int:
    return len(h.api.get("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")["items"])


def settle(h: Harness, seconds: float) -> None:
    """Let the plane finish the last run's aftermath before the next is timed, as an operator run
    does in its lead time: the deleted nodes' Leases (kube-controller-manager's garbage collector)
    gone, and ``seconds`` without a timed run."""
    wait_for(lambda: node_leases(h) == 0, timeout=120, what="the deleted nodes' Leases gone", interval=0.5)
    time.sleep(seconds)


def floor_run(h: Harness, label: str, group: str, ultraservers: int, settle_s: float) -> dict:
    settle(h, settle_s)
    bodies = floor_bodies(group, ultraservers)
    n = len(bodies)
    tracker = NodeTracker()
    w = h.watch("/api/v1/nodes", tracker.on_event, labelSelector=f"{GROUP_LABEL}={group}")
    load = loadavg()
    a0 = h.api.metrics()
    procs0 = plane_cpu(h)
    t0 = time.time()
    def create(body: dict) -> None:  # as KwokProvider.create calls it: the answer is not parsed
        answer = h.core.create_node(body, _preload_content=False)
        answer.read()
        answer.release_conn()

    with ThreadPoolExecutor(CREATE_WORKERS) as workers:
        list(workers.map(create, bodies))
    t_calls = time.time() - t0
    wait_for(lambda: tracker.ready_count() >= n, timeout=180, what=f"{n} floor nodes Ready ({group})", interval=0.05)
    total = tracker.last_ready() - t0
    procs = cpu_delta(procs0, plane_cpu(h))
    patches = node_patches(a0, h.api.metrics())
    step(f"{label}: {n} creates from {CREATE_WORKERS} threads took {t_calls:.2f} s; all Ready after {total:.2f} s "
         f"(load {load}); CPU s meanwhile: {show_cpu(procs)}; node PATCHes (by anyone; kube-controller-manager's "
         f"not-ready taint) {patches:.0f}")
    h.core.delete_collection_node(label_selector=f"{GROUP_LABEL}={group}")
    wait_for(lambda: not tracker.present, timeout=120, what=f"floor nodes of {group} deleted", interval=0.1)
    w.stop()
    return {"calls": t_calls, "ready": total, "load": load, "procs": procs, "patches": patches}


def node_patches(before: str, after: str) -> float:
    where = lambda l: l.get("resource") == "nodes" and l.get("verb") == "PATCH" and not l.get("subresource")  # noqa: E731
    return metric_sum(after, "apiserver_request_total", where) - metric_sum(before, "apiserver_request_total", where)


def operator_run(h: Harness, i: int, ultraservers: int, lead: int) -> dict:
    settle(h, 0)
    name = f"prov-{i}"
    r, tracker, w = group_to_ready(
        h, i, name, {"ultraServerType": X72, "ultraServerCount": ultraservers},
        {"instanceType": GB200, "instanceCount": 17 * ultraservers}, PER_ULTRASERVER * ultraservers, lead,
        buy_timeout=90, ready_timeout=180)
    remove_group(h, name, tracker, w, timeout=240)
    return r


def main(h: Harness, args: argparse.Namespace) -> int:
    us = args.ultraservers
    n = PER_ULTRASERVER * us
    warm = floor_bodies("warmup", 1)[0]
    h.core.create_node(warm)
    h.core.delete_node(warm["metadata"]["name"])
    before = [floor_run(h, f"floor run {r + 1} (before)", f"floor-a{r}", us, args.settle)
              for r in range(args.floor_runs)]

    h.start_operator("demo")
    h.create("capacitypools", pool("prov-gb200", GB200, n * args.runs, AZ, ultra=X72))
    runs = [operator_run(h, i, us, args.lead) for i in range(args.runs)]
    h.stop_operator()

    after = [floor_run(h, f"floor run {r + 1} (after)", f"floor-b{r}", us, args.settle)
             for r in range(args.floor_runs)]
    floors = before + after
    floor = statistics.median(f["ready"] for f in floors)
    op_time = statistics.median(r["ready"] for r in runs)
    ratio = op_time / floor
    rows = [
        ("machine", machine(), "", ""),
        *[(f"floor run {i + 1} ({'before' if i < len(before) else 'after'}): {n} creates from {CREATE_WORKERS} "
           "threads, calls / all Ready (load)", f"{f['calls']:.2f} s / {f['ready']:.2f} s ({f['load']})", "", "")
          for i, f in enumerate(floors)],
        ("floor: median before / after / all", " / ".join(fmt(statistics.median(f["ready"] for f in x), 2)
                                                         for x in (before, after, floors)), "", ""),
        *[(f"operator run {i + 1}: block start to first node / last node / all Ready (load)",
           f"{r['first']:.2f} / {r['last']:.2f} / {r['ready']:.2f} s ({r['load']})", "", "")
          for i, r in enumerate(runs)],
        ("operator per run: CPU s / reconciles / status writes / node POSTs / LISTs / PATCHes",
         "; ".join(f"{r['cpu']:.2f}/{r['reconciles']:.0f}/{r['status_writes']:.0f}/{r['node_posts']:.0f}/"
                   f"{r['node_lists']:.0f}/{r['node_patches']:.0f}" for r in runs), "", ""),
        ("node PATCHes per floor run (kube-controller-manager's not-ready taint, added and removed)",
         ", ".join(f"{f['patches']:.0f}" for f in floors), "", ""),
        *[(f"floor run {i + 1}: CPU s of the plane meanwhile", show_cpu(f["procs"]), "", "")
          for i, f in enumerate(floors)],
        *[(f"operator run {i + 1}: CPU s from 1 s before the start to all Ready", show_cpu(r["procs"]), "", "")
          for i, r in enumerate(runs)],
        (f"operator: median block start to all {n} Ready", fmt(op_time, 2), "", ""),
        ("ratio operator / floor (medians)", f"{ratio:.2f}x", f"<= {TARGET_RATIO}x", verdict(ratio <= TARGET_RATIO)),
        ("ratio against the floor before / after only",
         " / ".join(f"{op_time / statistics.median(f['ready'] for f in x):.2f}x" for x in (before, after)), "", ""),
        ("load average at the end", loadavg(), "", ""),
    ]
    print_figures("provisioning", rows)
    return 0 if ratio <= TARGET_RATIO and not any(r["early"] for r in runs) else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ultraservers", type=int, default=16, help="x72 UltraServers in the plan (18 nodes each)")
    ap.add_argument("--floor-runs", type=int, default=3, help="floor runs before the operator, and again after")
    ap.add_argument("--runs", type=int, default=3, help="operator runs (each a new plan and group)")
    ap.add_argument("--lead", type=int, default=25, help="seconds from now to the plan's startTimeAfter")
    ap.add_argument("--settle", type=float, default=20,
                    help="seconds of quiet before each floor run (an operator run has its --lead)")
    args = ap.parse_args()
    run(lambda h: main(h, args), "provisioning", budget=300 + args.floor_runs * 2 * (120 + args.settle) + args.runs * (args.lead + 300))
