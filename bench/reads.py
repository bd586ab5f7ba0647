"""API reads per reconcile: what one pass of a plan and of a group asks the API server for.

The operator (demo profile, its own process) runs ``--groups`` plans with a block running now
(3 hours) and one InstanceGroup of ``--nodes`` KWOK nodes per plan. Once every node is Ready and
every group Ready, the script makes ``--rounds`` rounds of changes the operator must look at: in
each round, one node of every group gets a new value of a label of its own (``bench/touch``),
which wakes that group and its plan (a label is part of what the operator reads of a node). It
waits until the reconcile counter has been still for 2 s, then the next round.

Counted over the rounds, from the apiserver's ``apiserver_request_total`` (by verb and resource)
and the operator's ``hyperplan_reconciles_total`` (by kind): reads (GET, LIST) per reconcile, and
writes. The bench's own label PATCHes and its watch are subtracted (they are the only other
client, besides the plane's own controllers, whose requests show in the baseline line).

    .venv/bin/python bench/reads.py [--groups 4] [--nodes 16] [--rounds 10]
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
    loadavg, increase, api_requests,
    API, Harness, machine, metric_sum, node_ready, pool, print_figures, run, step, ts, utcnow, wait_for,
)

ITYPE = "ml.p5.48xlarge"
READS = ("GET", "LIST")


def reconciles(text: str, kind: str) -> float:
    return metric_sum(text, "hyperplan_reconciles_total", lambda l: l.get("kind") == kind)


def main(h: Harness, args: argparse.Namespace) -> int:
    load_start = loadavg()
    op = h.start_operator("demo")
    n, g = args.nodes, args.groups
    h.create("capacitypools", pool("bench-reads", ITYPE, n * g, "us-east-1a"))
    start_after = ts(utcnow() + timedelta(seconds=12))
    for j in range(g):
        h.create("trainingplans", {
            "apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": f"reads-{j:02d}"},
            "spec": {"instanceType": ITYPE, "instanceCount": n, "targetResource": "hyperpod-cluster",
                     "duration": "180m", "autoPurchase": True, "startTimeAfter": start_after}})
        h.create("instancegroups", {
            "apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": f"reads-{j:02d}"},
            "spec": {"trainingPlanRef": f"reads-{j:02d}", "instanceType": ITYPE, "instanceCount": n}})
    step(f"{g} plans with a 3-hour block starting in ~15 s, {g} groups of {n} nodes")

    def held() -> bool:
        h.tick()
        items = h.api.get("/api/v1/nodes?labelSelector=hyperplan.dev%2Finstance-group")["items"]
        groups = [h.status("instancegroups", f"reads-{j:02d}") for j in range(g)]
        return sum(1 for i in items if node_ready(i)) == n * g and all(x.get("phase") == "Ready" for x in groups)

    wait_for(held, timeout=120, what=f"{n * g} group nodes Ready", interval=1)
    step(f"{n * g} nodes Ready; letting the operator settle")

    def still(seconds: float) -> None:
        last, since = None, time.monotonic()
        while time.monotonic() - since < seconds:
            now = metric_sum(op.metrics(), "hyperplan_reconciles_total")
            if now != last:
                last, since = now, time.monotonic()
            time.sleep(0.25)

    still(3)
    nodes = {}
    for j in range(g):
        items = h.api.get(f"/api/v1/nodes?labelSelector=hyperplan.dev%2Finstance-group%3Dreads-{j:02d}")["items"]
        nodes[j] = sorted(i["metadata"]["name"] for i in items if "spare" not in
                          i["metadata"].get("labels", {}).get("hyperplan.dev/role", ""))
    m0, a0 = op.metrics(), api_requests(h.api.metrics())
    for r in range(args.rounds):
        for j in range(g):
            h.core.patch_node(nodes[j][r % len(nodes[j])], {"metadata": {"labels": {"bench/touch": str(r)}}})
        still(2)
        step(f"round {r + 1}/{args.rounds}: reconciles so far plan {reconciles(op.metrics(), 'TrainingPlan') - reconciles(m0, 'TrainingPlan'):.0f}, "
             f"group {reconciles(op.metrics(), 'InstanceGroup') - reconciles(m0, 'InstanceGroup'):.0f}")
    m1, a1 = op.metrics(), api_requests(h.api.metrics())
    req = increase(a1, a0)
    req[("PATCH", "core/nodes")] -= args.rounds * g  # the bench's own label patches
    plan_passes = reconciles(m1, "TrainingPlan") - reconciles(m0, "TrainingPlan")
    group_passes = reconciles(m1, "InstanceGroup") - reconciles(m0, "InstanceGroup")
    passes = plan_passes + group_passes
    reads = Counter({k: v for k, v in req.items() if k[0] in READS})
    writes = Counter({k: v for k, v in req.items() if k[0] not in READS + ("WATCH",) and v > 0})
    ours = lambda c: Counter({k: v for k, v in c.items()  # noqa: E731
                              if "hyperplan.dev" in k[1] or k[1] in ("core/nodes", "core/pods", "core/events")})
    step("reads: " + ", ".join(f"{v} {r} {c:.0f}" for (v, r), c in sorted(reads.items())))
    step("writes: " + ", ".join(f"{v} {r} {c:.0f}" for (v, r), c in sorted(writes.items())))
    rows = [
        ("machine", machine(), "", ""),
        ("load average at the start / the end", f"{load_start} / {loadavg()}", "", ""),
        ("groups x nodes / rounds", f"{g} x {n} / {args.rounds}", "", ""),
        ("reconciles: plan / group", f"{plan_passes:.0f} / {group_passes:.0f}", "", ""),
        ("reads of hyperplan objects, nodes, pods (GET+LIST)", f"{sum(ours(reads).values()):.0f}", "", ""),
        ("  per reconcile", f"{sum(ours(reads).values()) / max(1, passes):.2f}", "", ""),
        *[(f"  {verb} {res}", f"{c:.0f} ({c / max(1, passes):.2f} per reconcile)", "", "")
          for (verb, res), c in sorted(ours(reads).items())],
        ("writes of hyperplan objects, nodes, events", f"{sum(ours(writes).values()):.0f}", "", ""),
        *[(f"  {verb} {res}", f"{c:.0f}", "", "") for (verb, res), c in sorted(ours(writes).items())],
    ]
    print_figures("reads", rows)
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    if args.nodes not in (1, 2, 4, 8, 16, 32, 64):
        ap.error("--nodes must be one of 1, 2, 4, 8, 16, 32, 64")
    run(lambda h: main(h, args), "reads", budget=300 + args.rounds * 10)
