"""288 nodes through Karpenter (issue 24): a ``nodeProvider: karpenter`` group of 16 x72
UltraServers from its block's start to all Ready, against a bare client scaling a static NodePool
of the same 288 nodes, in the same run, on the same plane and the same Karpenter.

1. Karpenter's kwok provider (build.KARPENTER_VERSION) starts beside the bench's plane, with a
   KWOKNodeClass ``default``.
2. The floor, ``--floor-runs`` times: a static NodePool (``spec.replicas`` 288; the instance type,
   the zone, capacity type ``reserved``; ``expireAfter: Never``, budgets ``nodes: "0"``) created by
   a bare client, timed from the create until a raw node watch has seen 288 of its Nodes Ready; then
   the NodePool is deleted and its Nodes gone. This is what Karpenter itself takes for 288 nodes.
3. The operator (demo profile), ``--runs`` times: a plan of 16 x ml.u-p6e-gb200x72 and a karpenter
   InstanceGroup of 272 (17 active + 1 spare each): timed from the block's ``startTime`` until the
   watch has seen all 288 group Nodes Ready; then the group is deleted and its Nodes gone.

Target (issue 24): the median operator time within 1.3 x the median floor.

    .venv/bin/python bench/karpenter.py [--ultraservers 16] [--floor-runs 2] [--runs 2] [--lead 25]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BenchError, Harness, fmt, loadavg, machine, pool, print_figures, step, verdict, wait_for  # noqa: E402
from nodes_ready import NodeTracker, group_to_ready, remove_group  # noqa: E402

from hyperplan_dev import build  # noqa: E402
from hyperplan_dev import karpenter as karpenter_plane  # noqa: E402

GB200, X72 = "ml.p6e-gb200.36xlarge", "ml.u-p6e-gb200x72"
PER_ULTRASERVER = 18
AZ = "us-west-2b"  # one of hyperplan_dev.karpenter.ZONES
TARGET_RATIO = 1.3


def nodepool(name: str, replicas: int) -> dict:
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
            "spec": {"replicas": replicas, "disruption": {"budgets": [{"nodes": "0"}]},
                     "template": {"metadata": {"labels": {"bench": name}},
                                  "spec": {"nodeClassRef": {"group": karpenter_plane.NODECLASS_GROUP,
                                                            "kind": karpenter_plane.NODECLASS_KIND, "name": "default"},
                                           "expireAfter": "Never",
                                           "requirements": [
                                               {"key": "node.kubernetes.io/instance-type", "operator": "In",
                                                "values": [GB200]},
                                               {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [AZ]},
                                               {"key": "karpenter.sh/capacity-type", "operator": "In",
                                                "values": ["reserved"]}]}}}}


def floor_run(h: Harness, i: int, n: int) -> float:
    name = f"floor-{i}"
    tracker = NodeTracker()
    w = h.watch("/api/v1/nodes", tracker.on_event, labelSelector=f"bench={name}")
    t0 = time.time()
    h.custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", nodepool(name, n))
    wait_for(lambda: tracker.ready_count() >= n, timeout=300, what=f"{n} NodePool nodes Ready", interval=0.05)
    took = tracker.last_ready() - t0
    step(f"floor run {i + 1}: a static NodePool of {n}: all Ready {took:.2f} s after its create (load {loadavg()})")
    h.custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", name)
    wait_for(lambda: not tracker.present, timeout=300, what=f"nodes of NodePool {name} gone", interval=0.2)
    w.stop()
    return took


def main(h: Harness, args: argparse.Namespace) -> int:
    n = PER_ULTRASERVER * args.ultraservers
    if not build.component("karpenter").is_built():
        raise BenchError("Karpenter is not built: run `make binaries`")
    k = karpenter_plane.Karpenter(h.plane, log=lambda line: step(f"karpenter: {line}"))
    k.start()
    try:
        h.kubectl("apply", "-f", "-", input=(
            '{"apiVersion": "%s/v1alpha1", "kind": "%s", "metadata": {"name": "default"}}'
            % (karpenter_plane.NODECLASS_GROUP, karpenter_plane.NODECLASS_KIND)))
        floors = [floor_run(h, i, n) for i in range(args.floor_runs)]
        h.start_operator("demo", {"HYPERPLAN_KARPENTER_LAUNCH_TIMEOUT_SECONDS": "120"})
        h.create("capacitypools", pool("bench-x72", GB200, PER_ULTRASERVER * args.ultraservers * 2, AZ, X72))
        runs = []
        for i in range(args.runs):
            name = f"bench-karpenter-{i}"
            r, tracker, w = group_to_ready(
                h, i, name, {"ultraServerType": X72, "ultraServerCount": args.ultraservers},
                {"instanceType": GB200, "instanceCount": (PER_ULTRASERVER - 1) * args.ultraservers,
                 "nodeProvider": "karpenter"}, n, args.lead, ready_timeout=300)
            runs.append(r)
            remove_group(h, name, tracker, w, timeout=300)
        h.stop_operator()
    finally:
        k.stop()
    floor, ours = statistics.median(floors), statistics.median(r["ready"] for r in runs)
    ratio = ours / floor
    print_figures(f"{n} nodes through Karpenter", [
        ("machine", machine(), "", ""),
        ("floor: a static NodePool, create to all Ready (median; runs " + ", ".join(f"{x:.1f}" for x in floors) + ")",
         fmt(floor), "", ""),
        ("karpenter group, block start to all Ready (median; runs " + ", ".join(f"{r['ready']:.1f}" for r in runs)
         + ")", fmt(ours), "", ""),
        ("ratio to the floor", f"{ratio:.2f}x", f"<= {TARGET_RATIO}x", verdict(ratio <= TARGET_RATIO)),
    ])
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ultraservers", type=int, default=16)
    parser.add_argument("--floor-runs", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--lead", type=int, default=25)
    args = parser.parse_args()
    with Harness("karpenter", budget=1800) as h:
        sys.exit(main(h, args))
