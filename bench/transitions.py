"""Block transitions: how late is each phase change written, against its scheduled boundary?

N training plans (default 20) under the demo profile, each bought with one 1-minute block; the
blocks start ``--stagger`` seconds apart (default 5 s, the demo profile's start grid), so some
plans go Active while others expire. A watch on trainingplans stamps every phase change with
the moment it reached us; the lag of a change is that stamp minus its boundary, read from the
plan's own ``status.reservedCapacity`` (start for Active, end for Expired).

Target: every transition within 1 s of its scheduled time.

    .venv/bin/python bench/transitions.py [--plans 20] [--stagger 5] [--lead 40]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    API, BenchError, Harness, epoch, fmt, machine, metric_sum, parse_ts, pool, print_figures, run, step,
    summary, ts, utcnow, verdict, wait_for,
)

ITYPE = "ml.p5.48xlarge"
TARGET = 1.0


def main(h: Harness, args: argparse.Namespace) -> int:
    if args.stagger % 5:
        raise BenchError("--stagger must be a multiple of 5 s (the demo profile's start grid)")
    op = h.start_operator("demo")

    lock = threading.Lock()
    phases: dict[str, list[tuple[float, str]]] = {}  # plan -> [(t_read, phase)] on each change
    blocks: dict[str, list[dict]] = {}

    def on_plan(kind: str, obj: dict, t: float) -> None:
        name = obj["metadata"]["name"]
        st = obj.get("status") or {}
        with lock:
            if st.get("reservedCapacity"):
                blocks[name] = st["reservedCapacity"]
            seen = phases.setdefault(name, [])
            phase = st.get("phase")
            if phase and (not seen or seen[-1][1] != phase):
                seen.append((t, phase))
                rc = blocks.get(name) or []
                boundary = None
                if rc and phase == "Active":
                    boundary = parse_ts(rc[0]["startTime"])
                elif rc and phase == "Expired":
                    boundary = parse_ts(rc[0]["endTime"])
                extra = f"  lag {t - epoch(boundary):+.3f} s" if boundary else ""
                step(f"{name}: {phase}{extra}")

    h.watch("/apis/hyperplan.dev/v1alpha1/trainingplans", on_plan)

    h.create("capacitypools", pool("bench-transitions", ITYPE, max(args.plans, 1), "us-east-1a"))
    now = utcnow().replace(microsecond=0)
    base = now + timedelta(seconds=args.lead)
    base += timedelta(seconds=(-base.second) % 5)
    names = [f"trans-{i:03d}" for i in range(args.plans)]
    step(f"creating {args.plans} plans: 1-minute blocks from {ts(base)}, {args.stagger} s apart")
    for i, name in enumerate(names):
        start = base + timedelta(seconds=i * args.stagger)
        h.create("trainingplans", {
            "apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": name},
            "spec": {"instanceType": ITYPE, "instanceCount": 1, "targetResource": "hyperpod-cluster",
                     "duration": "1m", "autoPurchase": True, "startTimeAfter": ts(start),
                     "endTimeBefore": ts(start + timedelta(minutes=1))}})

    def bought() -> bool:
        h.tick()
        with lock:
            failed = [n for n, s in phases.items() if s and s[-1][1] == "Failed"]
            if failed:
                raise BenchError(f"plans failed to buy their block: {failed} (see kubectl describe)")
            return all(n in blocks for n in names)

    wait_deadline = epoch(base) - time.time() - 1
    if wait_deadline <= 0:
        raise BenchError("creating the plans took longer than --lead; raise --lead")
    wait_for(bought, timeout=wait_deadline, what="every plan to be bought before the first block starts")
    with lock:
        last_end = max(parse_ts(b[0]["endTime"]) for b in blocks.values())
    step(f"all {args.plans} plans bought; the last block ends at {ts(last_end)}; waiting for every transition")

    def done() -> bool:
        h.tick()
        with lock:
            return all(s and s[-1][1] == "Expired" for n, s in phases.items() if n in names)

    try:
        wait_for(done, timeout=epoch(last_end) - time.time() + 20, what="every plan to expire", interval=0.5)
    except BenchError as e:
        step(f"WARNING: {e}; reporting what was seen")

    # Lags: each plan's Active against its start, Expired against its end.
    lags: list[tuple[str, str, float]] = []
    missing: list[str] = []
    with lock:
        for name in names:
            rc = blocks.get(name)
            if not rc:
                missing.append(f"{name}: never bought")
                continue
            start, end = parse_ts(rc[0]["startTime"]), parse_ts(rc[0]["endTime"])
            for phase, boundary in (("Active", start), ("Expired", end)):
                seen = next((t for t, p in phases.get(name, []) if p == phase), None)
                if seen is None:
                    missing.append(f"{name}: {phase} never seen")
                else:
                    lags.append((name, phase, seen - epoch(boundary)))
    if not lags:
        raise BenchError("no transition was observed")
    values = [lag for _, _, lag in lags]
    s = summary(values)
    early = [x for x in lags if x[2] < 0]
    late = sorted((x for x in lags if x[2] > TARGET), key=lambda x: -x[2])

    m = op.metrics()
    hist_count = metric_sum(m, "hyperplan_transition_lag_seconds_count")
    hist_sum = metric_sum(m, "hyperplan_transition_lag_seconds_sum")
    within_1s = metric_sum(m, "hyperplan_transition_lag_seconds_bucket", lambda l: l.get("le") == "1.0")
    errors = op.log_lines("ERROR") + op.log_lines("Traceback")

    step(f"operator histogram: {hist_count:.0f} transitions, mean {hist_sum / max(hist_count, 1):.3f} s, "
         f"{within_1s:.0f} within 1 s")
    for name, phase, lag in late[:10]:
        step(f"late: {name} {phase} {lag:+.3f} s")
    for line in missing:
        step(f"missing: {line}")
    if errors:
        step(f"operator log has {len(errors)} ERROR/Traceback lines, first: {errors[0][:200]}")

    ok = s["max"] <= TARGET and not missing and not early
    rows = [
        ("machine", machine(), "", ""),
        ("plans / transitions measured", f"{args.plans} / {s['n']}", f"{2 * args.plans}", verdict(not missing)),
        ("lag p50", fmt(s["p50"]), "", ""),
        ("lag p95", fmt(s["p95"]), "", ""),
        ("lag max", fmt(s["max"]), f"<= {TARGET:.0f} s", verdict(s["max"] <= TARGET)),
        ("lag min", fmt(s["min"]), ">= 0 (never early)", verdict(not early)),
        ("transitions later than 1 s", str(len(late)), "0", verdict(not late)),
        ("operator histogram mean (boundary to write)", fmt(hist_sum / max(hist_count, 1)), "", ""),
    ]
    print_figures("transitions", rows)
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plans", type=int, default=20)
    ap.add_argument("--stagger", type=int, default=5, help="seconds between block starts (multiple of 5)")
    ap.add_argument("--lead", type=int, default=40, help="seconds from now to the first block start")
    args = ap.parse_args()
    budget = args.lead + (args.plans * args.stagger) + 60 + 150
    run(lambda h: main(h, args), "transitions", budget=budget)
