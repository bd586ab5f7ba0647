"""The idle operator: with M bought plans and nothing due, does it write, spin or grow?

1. Baseline (before the operator starts): API writes the bare control plane makes in
   ``--baseline`` seconds (its own leases and the like), from the apiserver's
   ``apiserver_request_total``.
2. The operator (demo profile, its own process) and M training plans (default 200), each
   buying one 1-minute block about 52 minutes ahead (the demo profile allows at most 56), all from
   one pool; then wait until they settle: every plan Scheduled (or Failed, reported) and the
   operator's ``hyperplan_status_writes_total`` unchanged for 10 s.
3. For ``--idle`` seconds (default 60): API writes, counted twice, by the operator
   (``hyperplan_status_writes_total`` from its /metrics) and by the apiserver
   (``apiserver_request_total{verb=~"POST|PUT|PATCH|DELETE|APPLY"}`` from its /metrics, read
   with the plane's admin client certificate), and the operator's CPU time (utime + stime) and
   RSS from /proc/<pid>, sampled every 5 s.

Targets: no API writes, near-zero CPU (read here as under 1 % of one core),
memory flat (read here as RSS growing by less than 1 MiB over the window). The design's figure
is 1,000 plans and 5,000 nodes; this run has ``--plans`` plans and, by default, no nodes;
``--nodes N`` adds plans whose 3-hour block runs now and groups that hold N KWOK nodes
through the idle window (KWOK refreshes each node's heartbeat every 20 to 45 s).

    .venv/bin/python bench/idle.py [--plans 200] [--idle 60] [--baseline 30] [--nodes 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    api_writes, increase,
    API, BenchError, Harness, machine, metric_sum, scrape, pool, print_figures, proc_cpu_seconds, proc_rss_mib, run,
    step, ts, utcnow, verdict, wait_for,
)

ITYPE = "ml.p5.48xlarge"
CPU_TARGET = 1.0  # percent of one core
RSS_TARGET = 1.0  # MiB


def show(c: Counter) -> str:
    return ", ".join(f"{res} {verb} {n:.0f}" for (res, verb), n in sorted(c.items())) or "none"


def hold_nodes(h: Harness, n: int) -> None:
    """Plans with a block running now (3 hours) and groups holding ``n`` KWOK nodes in all."""
    sizes = [64] * (n // 64) + ([n % 64] if n % 64 else [])
    if any(size not in (1, 2, 4, 8, 16, 32, 64) for size in sizes):
        raise BenchError("--nodes must be at most 64 and a power of two, or a multiple of 64")
    h.create("capacitypools", pool("bench-idle-nodes", ITYPE, n, "us-east-1b"))
    start_after = ts(utcnow() + timedelta(seconds=12))
    for j, size in enumerate(sizes):
        h.create("trainingplans", {
            "apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": f"nodes-{j:03d}"},
            "spec": {"instanceType": ITYPE, "instanceCount": size, "targetResource": "hyperpod-cluster",
                     "duration": "180m", "autoPurchase": True, "startTimeAfter": start_after}})
        h.create("instancegroups", {
            "apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": f"nodes-{j:03d}"},
            "spec": {"trainingPlanRef": f"nodes-{j:03d}", "instanceType": ITYPE, "instanceCount": size}})
    step(f"{len(sizes)} plan(s) with a 3-hour block starting in ~15 s and groups of {n} nodes in all")

    def held() -> bool:
        h.tick()
        items = h.api.get("/api/v1/nodes?labelSelector=hyperplan.dev%2Finstance-group")["items"]
        ready = sum(1 for i in items if any(c["type"] == "Ready" and c["status"] == "True"
                                            for c in (i.get("status") or {}).get("conditions") or []))
        groups = [h.status("instancegroups", f"nodes-{j:03d}") for j in range(len(sizes))]
        return ready == n and all(g.get("phase") == "Ready" for g in groups)

    wait_for(held, timeout=90, what=f"{n} group nodes Ready", interval=1)
    step(f"{n} group nodes Ready")


def main(h: Harness, args: argparse.Namespace) -> int:
    baseline = Counter()
    if args.baseline > 0:
        step(f"baseline: API writes of the bare control plane for {args.baseline} s (no operator)")
        b0 = api_writes(h.api.metrics())
        time.sleep(args.baseline)
        baseline = increase(api_writes(h.api.metrics()), b0)
        step(f"baseline writes: {show(baseline)}")

    op = h.start_operator("demo")
    if args.nodes:
        hold_nodes(h, args.nodes)
    h.create("capacitypools", pool("bench-idle", ITYPE, args.plans, "us-east-1a"))
    start_after = ts(utcnow() + timedelta(minutes=52))
    step(f"creating {args.plans} plans (1 x {ITYPE}, 1-minute block after {start_after}, autoPurchase)")
    t_create = time.time()
    cpu_create = proc_cpu_seconds(op.pid)
    for i in range(args.plans):
        h.create("trainingplans", {
            "apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": f"idle-{i:04d}"},
            "spec": {"instanceType": ITYPE, "instanceCount": 1, "targetResource": "hyperpod-cluster",
                     "duration": "1m", "autoPurchase": True, "startTimeAfter": start_after}})
        if (i + 1) % 50 == 0:
            step(f"created {i + 1} plans")

    # Settle: every plan Scheduled, and no status write for 10 s.
    deadline = time.monotonic() + args.settle_timeout
    quiet_since, last_writes, last_change = time.monotonic(), -1.0, time.time()
    reconciles0 = metric_sum(op.metrics(), "hyperplan_reconciles_total")
    while True:
        h.tick()
        plans = h.api.get("/apis/hyperplan.dev/v1alpha1/trainingplans")["items"]
        phases = Counter((p.get("status") or {}).get("phase") or "none" for p in plans
                         if p["metadata"]["name"].startswith("idle-"))
        m = op.metrics()
        writes = metric_sum(m, "hyperplan_status_writes_total")
        reconciles = metric_sum(m, "hyperplan_reconciles_total") - reconciles0
        if writes != last_writes:
            quiet_since, last_writes, last_change = time.monotonic(), writes, time.time()
        decided = phases.get("Scheduled", 0) + phases.get("Failed", 0)
        settled = decided == args.plans and time.monotonic() - quiet_since >= 10
        step(f"settling: {dict(phases)}; operator status writes so far {writes:.0f}, reconciles {reconciles:.0f}, "
             f"CPU {proc_cpu_seconds(op.pid) - cpu_create:.1f} s")
        if settled:
            break
        if time.monotonic() > deadline:
            raise BenchError(f"the plans did not settle within {args.settle_timeout} s: {dict(phases)} "
                             f"(operator log: {op.log})")
        time.sleep(2)
    failed = Counter()
    for p in plans:
        st = p.get("status") or {}
        if st.get("phase") == "Failed":
            reason = next((c.get("reason") for c in st.get("conditions") or [] if c.get("type") == "Failed"), "?")
            failed[reason] += 1
    if failed:
        step(f"WARNING: {sum(failed.values())} plans Failed to buy: {dict(failed)}")
    settle = last_change - t_create
    settle_cpu = proc_cpu_seconds(op.pid) - cpu_create
    settle_reconciles = metric_sum(op.metrics(), "hyperplan_reconciles_total") - reconciles0
    step(f"settled: all {args.plans} plans Scheduled; the last status write was seen ~{settle:.0f} s after the "
         f"first create (polled every 2 s); operator CPU since the first create {settle_cpu:.1f} s, "
         f"{settle_reconciles:.0f} reconciles")

    # The idle window.
    step(f"idle window: {args.idle} s")
    m0, a0 = op.metrics(), api_writes(h.api.metrics())
    t0, cpu0, rss0 = time.time(), proc_cpu_seconds(op.pid), proc_rss_mib(op.pid)
    samples = [(0.0, 0.0, rss0)]
    step(f"  t=  0 s  CPU 0.00 s  RSS {rss0:.1f} MiB")
    while time.time() - t0 < args.idle:
        time.sleep(min(5, args.idle - (time.time() - t0)))
        h.tick()
        t, cpu, rss = time.time() - t0, proc_cpu_seconds(op.pid) - cpu0, proc_rss_mib(op.pid)
        samples.append((t, cpu, rss))
        step(f"  t={t:3.0f} s  CPU {cpu:.2f} s  RSS {rss:.1f} MiB")
    m1, a1 = op.metrics(), api_writes(h.api.metrics())
    wall = time.time() - t0
    cpu = proc_cpu_seconds(op.pid) - cpu0
    rss1 = proc_rss_mib(op.pid)

    op_writes = metric_sum(m1, "hyperplan_status_writes_total") - metric_sum(m0, "hyperplan_status_writes_total")
    op_reconciles = metric_sum(m1, "hyperplan_reconciles_total") - metric_sum(m0, "hyperplan_reconciles_total")
    by_kind = {kind: metric_sum(m1, "hyperplan_reconciles_total", lambda lb, k=kind: lb.get("kind") == k)
               - metric_sum(m0, "hyperplan_reconciles_total", lambda lb, k=kind: lb.get("kind") == k)
               for kind in sorted({lb.get("kind", "") for lb, _ in scrape(m1, "hyperplan_reconciles_total")})}
    writes = increase(a1, a0)
    ours = Counter({k: v for k, v in writes.items() if k[0].startswith("hyperplan.dev/")})
    events = sum(v for k, v in writes.items() if k[0] in ("core/events", "events.k8s.io/events"))
    total = sum(writes.values())
    base_rate = sum(baseline.values()) * 60 / args.baseline if args.baseline > 0 else float("nan")
    cpu_pct = 100 * cpu / wall
    growth = rss1 - rss0
    step(f"apiserver writes during the idle window: {show(writes)}")

    rows = [
        ("machine", machine(), "", ""),
        ("plans Scheduled / Failed", f"{phases.get('Scheduled', 0)} / {phases.get('Failed', 0)}"
         + (f" ({', '.join(f'{r} {n}' for r, n in failed.items())})" if failed else ""), f"{args.plans} / 0",
         verdict(not failed)),
        ("group nodes held through an active block", str(args.nodes), "", ""),
        ("settle: first create to last status write", f"{settle:.0f} s", "", ""),
        ("settle: operator CPU / reconciles", f"{settle_cpu:.1f} s / {settle_reconciles:.0f}", "", ""),
        ("idle window", f"{wall:.0f} s", "", ""),
        ("operator status writes (hyperplan_status_writes_total)", f"{op_writes:.0f}", "0", verdict(op_writes == 0)),
        ("operator reconciles (hyperplan_reconciles_total)", f"{op_reconciles:.0f}", "", ""),
        ("  by kind", ", ".join(f"{k} {v:.0f}" for k, v in by_kind.items() if v) or "none", "", ""),
        ("apiserver writes to hyperplan.dev objects", f"{sum(ours.values()):.0f}", "0", verdict(not ours)),
        ("apiserver writes to events", f"{events:.0f}", "0", verdict(events == 0)),
        ("apiserver writes, all (any client)", f"{total:.0f}", "", ""),
        ("  same, bare control plane (baseline, per 60 s)", f"{base_rate:.0f}", "", ""),
        ("operator CPU", f"{cpu:.2f} s = {cpu_pct:.2f} % of a core", f"< {CPU_TARGET:.0f} %",
         verdict(cpu_pct < CPU_TARGET)),
        ("operator RSS start / end / max", f"{rss0:.1f} / {rss1:.1f} / {max(s[2] for s in samples + [(0, 0, rss1)]):.1f} MiB",
         "", ""),
        ("operator RSS growth", f"{growth:+.1f} MiB", f"< {RSS_TARGET:.0f} MiB", verdict(growth < RSS_TARGET)),
    ]
    print_figures("idle", rows)
    ok = op_writes == 0 and not ours and events == 0 and cpu_pct < CPU_TARGET and growth < RSS_TARGET
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plans", type=int, default=200)
    ap.add_argument("--idle", type=int, default=60, help="seconds of the measured idle window")
    ap.add_argument("--baseline", type=int, default=30, help="seconds of the no-operator baseline (0: skip)")
    ap.add_argument("--settle-timeout", type=int, default=180)
    ap.add_argument("--nodes", type=int, default=0,
                    help="also hold this many KWOK nodes in groups with a block running (default 0)")
    args = ap.parse_args()
    run(lambda h: main(h, args), "idle", budget=60 + args.baseline + args.settle_timeout + args.idle + 30
                                           + (90 if args.nodes else 0))
