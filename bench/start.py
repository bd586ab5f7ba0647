"""An operator started with its fleet already in the cluster: the time to its first pass and until
every plan has had one (a restart or failover at fleet scale).

On its own plane (demo profile, Kueue and the SageMaker API off), for each ``--plans`` count in
turn (e.g. ``1000,2000,4000``; the plans are added to those of the round before):

1. With no operator running, the fleet is written as the operator would have left it: ``--pools``
   pools of ``--pool-size``, the plans (1 x ml.p5.48xlarge, ``duration: 1m``, autoPurchase, with
   the operator's finalizer), each with its line in a pool's ledger (the pools' statuses are
   written whole) and a ``Scheduled`` status of the operator's shape (bench/purchases.py's
   ``floor_status``), by ``--threads`` clients.
2. The operator is started and timed from its process start to its first reconcile
   (``hyperplan_reconciles_total`` of kind TrainingPlan, scraped every 0.25 s) and until every plan
   has had a pass (that counter at the plan count: every plan listed at start gets one); its CPU
   over that time is shown beside, and the plan status writes it made (the first start writes the
   status of each plan new in the round once: the bench's is not exactly the operator's). Then it
   is stopped (SIGTERM) before the next round's writes. With ``--restart`` it is started and timed
   once more on the fleet as it left it: what a failover or a restart meets.

    .venv/bin/python bench/start.py [--plans 1000,2000,4000] [--pools 10] [--pool-size 64] [--restart]
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    GROUP, VERSION, BenchError, Harness, loadavg, machine, metric_sum, pool, print_figures, proc_cpu_seconds,
    proc_rss_mib, run, step, ts, utcnow,
)
from purchases import AZS, ITYPE, floor_status, plan_body  # noqa: E402
from hyperplan.api.vocabulary import PLAN_FINALIZER  # noqa: E402


class Fleet:
    """The pools and plans written so far, so that each round adds plans to the same pools."""

    def __init__(self, h: Harness, args: argparse.Namespace) -> None:
        self.h, self.args = h, args
        self.pools = [h.create("capacitypools", pool(f"start-{p:02d}", ITYPE, args.pool_size, AZS[p % len(AZS)]))
                      for p in range(args.pools)]
        self.lines: list[list[dict]] = [[] for _ in self.pools]
        self.count = 0
        self.start = utcnow().replace(microsecond=0) + timedelta(minutes=args.ahead)
        self.end_before = self.start + timedelta(minutes=args.window)

    def grow_to(self, n: int) -> None:
        h, args = self.h, self.args
        new = list(range(self.count, n))
        step(f"writing plans {self.count} to {n - 1} ({args.threads} clients), their ledger lines and statuses")
        t0 = time.monotonic()

        def create(i: int) -> dict:
            body = plan_body(f"plan-{i:05d}", ts(self.start), ts(self.end_before), label="start")
            body["metadata"]["finalizers"] = [PLAN_FINALIZER]
            return h.create("trainingplans", body)

        with ThreadPoolExecutor(args.threads) as threads:
            created = list(threads.map(create, new))
        statuses = []
        for i, plan in zip(new, created):
            p = i % len(self.pools)
            uid = plan["metadata"]["uid"]
            rc_id = f"rc-{uid.replace('-', '')[:12]}-0"
            slot = timedelta(seconds=5 * (i // (len(self.pools) * args.pool_size)))
            start, end = self.start + slot, self.start + slot + timedelta(minutes=1)
            self.lines[p].append({"trainingPlan": plan["metadata"]["name"], "trainingPlanUid": uid,
                                  "reservedCapacityId": rc_id, "startTime": ts(start), "endTime": ts(end),
                                  "instanceCount": 1})
            pool_obj = self.pools[p]
            statuses.append((plan["metadata"]["name"], floor_status(
                pool_obj["metadata"]["name"], pool_obj["spec"]["availabilityZone"], rc_id, start, end, ts(utcnow()))))
        for p, pool_obj in enumerate(self.pools):
            pool_obj.setdefault("status", {})["reservations"] = self.lines[p]
            written = h.custom.replace_cluster_custom_object_status(GROUP, VERSION, "capacitypools",
                                                                   pool_obj["metadata"]["name"], pool_obj)
            pool_obj["metadata"]["resourceVersion"] = written["metadata"]["resourceVersion"]

        def patch(item: tuple[str, dict]) -> None:
            h.custom.patch_cluster_custom_object_status(GROUP, VERSION, "trainingplans", item[0], {"status": item[1]})

        with ThreadPoolExecutor(args.threads) as threads:
            list(threads.map(patch, statuses))
        self.count = n
        step(f"  {n} plans in {len(self.pools)} pools written ({time.monotonic() - t0:.1f} s)")


def timed_start(h: Harness, n: int, timeout: float) -> dict:
    """Start the operator; seconds from its start to its first plan pass and to ``n`` plan passes."""
    t0 = time.monotonic()
    op = h.start_operator("demo", extra_env={"HYPERPLAN_KUEUE_ENABLED": "false"})
    first = every = None
    writes = 0.0
    cpu_first = cpu_every = None
    last_report = time.monotonic()
    while every is None:
        h.tick()
        now = time.monotonic()
        if now - t0 > timeout:
            h.stop_operator()
            raise BenchError(f"{n} plans: not every plan had a pass within {timeout:.0f} s of the operator's start "
                             f"(first pass: {'none' if first is None else f'{first:.1f} s'})")
        try:
            text = op.metrics(timeout=2)
            passes = metric_sum(text, "hyperplan_reconciles_total", lambda labels: labels.get("kind") == "TrainingPlan")
            writes = metric_sum(text, "hyperplan_status_writes_total", lambda labels: labels.get("kind") == "TrainingPlan")
        except OSError:
            passes = 0.0
        if passes > 0 and first is None:
            first, cpu_first = now - t0, proc_cpu_seconds(op.pid)
            step(f"  first plan pass {first:.1f} s after the start")
        if passes >= n:
            every, cpu_every = now - t0, proc_cpu_seconds(op.pid)
        if now - last_report > 15:
            last_report = now
            step(f"  {now - t0:.0f} s: {passes:.0f} plan passes; operator CPU {proc_cpu_seconds(op.pid):.0f} s, "
                 f"RSS {proc_rss_mib(op.pid):.0f} MiB, load {loadavg()}")
        time.sleep(0.25)
    step(f"  every plan had a pass {every:.1f} s after the start (operator CPU {cpu_every:.1f} s, "
         f"{writes:.0f} plan status writes)")
    out = {"first": first, "every": every, "cpu_first": cpu_first, "cpu_every": cpu_every,
           "rss": proc_rss_mib(op.pid), "writes": writes}
    h.stop_operator()
    h.operator = None
    return out


def main(h: Harness, args: argparse.Namespace) -> int:
    counts = [int(x) for x in args.plans.split(",")]
    if counts != sorted(counts):
        raise BenchError("--plans must be increasing (each round adds plans to the last)")
    load_start = loadavg()
    fleet = Fleet(h, args)
    results = {}
    for n in counts:
        fleet.grow_to(n)
        results[f"{n} plans"] = timed_start(h, n, args.timeout)
        if args.restart:  # the fleet as the operator left it: what a failover or a restart meets
            results[f"{n} plans, restarted"] = timed_start(h, n, args.timeout)
    rows = [("machine", machine(), "", ""),
            ("load average at the start / the end", f"{load_start} / {loadavg()}", "", ""),
            ("pools / pool size", f"{args.pools} / {args.pool_size}", "", "")]
    for n, r in results.items():
        rows.append((f"{n}: first plan pass / every plan passed, from the operator's start",
                     f"{r['first']:.1f} s / {r['every']:.1f} s", "", ""))
        rows.append(("  operator CPU at the first pass / at every pass; RSS then; plan status writes",
                     f"{r['cpu_first']:.1f} s / {r['cpu_every']:.1f} s; {r['rss']:.0f} MiB; {r['writes']:.0f}", "", ""))
    print_figures("start", rows)
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plans", default="1000,2000,4000", help="plan counts, increasing, comma-separated")
    ap.add_argument("--pools", type=int, default=10)
    ap.add_argument("--pool-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=8, help="clients writing the plans")
    ap.add_argument("--ahead", type=int, default=40, help="minutes from now to the plans' window")
    ap.add_argument("--window", type=int, default=15, help="minutes of the plans' window")
    ap.add_argument("--restart", action="store_true", help="after each round's start, start the operator "
                    "again on the fleet as it left it (no status to write: a failover's start)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a start may take")
    args = ap.parse_args()
    run(lambda h: main(h, args), "start",
        budget=600 + len(args.plans.split(",")) * ((2 if args.restart else 1) * args.timeout + 300))
