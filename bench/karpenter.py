"""288 nodes through Karpenter: a ``nodeProvider: karpenter`` group of 16 x72
UltraServers from its block's start to all Ready, against a bare client scaling a static NodePool
of the same 288 nodes, in the same run, on the same plane and the same Karpenter.

1. Karpenter's kwok provider (build.KARPENTER_VERSION) starts beside the bench's plane, with a
   KWOKNodeClass ``default``.
2. For comparison, ``--claims-runs`` times: a bare client making the same number of standalone
   NodeClaims (no NodePool; the shape hyperplan makes) from as many threads as hyperplan's
   creates, timed from the first create until all their Nodes are Ready: Karpenter's time for
   claims of that shape, without hyperplan.
3. The floor, ``--floor-runs`` times: a static NodePool (``spec.replicas`` 288; the instance type,
   the zone, capacity type ``reserved``; ``expireAfter: Never``, budgets ``nodes: "0"``) created by
   a bare client, timed from the create until a raw node watch has seen 288 of its Nodes Ready; then
   the NodePool is deleted and its Nodes gone. This is what Karpenter itself takes for 288 nodes.
4. The operator (demo profile), ``--runs`` times, taking turns with the floor's runs (floor,
   group, floor, group, ...: what drifts over the bench weighs on both alike): a plan of 16 x
   ml.u-p6e-gb200x72 and a karpenter InstanceGroup of 272 (17 active + 1 spare each): timed from
   the block's ``startTime`` until the watch has seen all 288 group Nodes Ready; then the group
   is deleted and its Nodes gone.

Target: the median operator time within 1.3 x the median floor.

    .venv/bin/python bench/karpenter.py [--ultraservers 16] [--floor-runs 3] [--runs 3] [--claims-runs 0] [--lead 25]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
import statistics
import sys
import time
from pathlib import Path

from kubernetes.client.rest import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    AuditWrites, BenchError, Harness, fmt, loadavg, machine, metric_sum, pool, print_figures, step, verdict, wait_for,
)
from nodes_ready import NodeTracker, group_to_ready, remove_group  # noqa: E402

from hyperplan.actuation.groups import CREATE_WORKERS  # noqa: E402
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


CLAIMS = "/apis/karpenter.sh/v1/nodeclaims"
COUNTED = (("nodeclaims", "POST"), ("nodeclaims", "LIST"), ("nodeclaims", "WATCH"), ("nodeclaims", "PATCH"),
           ("nodeclaims", "PUT"), ("nodes", "POST"), ("nodes", "PATCH"), ("nodes", "LIST"), ("events", "POST"),
           ("instancegroups", "PATCH"))


def requests(h: Harness) -> dict[tuple[str, str], float]:
    """The API server's requests so far, by (resource, verb), of the kinds in :data:`COUNTED`
    (subresources included: Karpenter writes claims' status)."""
    text = h.api.metrics()
    return {(res, verb): metric_sum(text, "apiserver_request_total",
                                    lambda l, res=res, verb=verb: l.get("resource") == res and l.get("verb") == verb)
            for res, verb in COUNTED}


AUDIT: AuditWrites | None = None  # with --audit: the API server's writes by client, per run


def audited(what: str) -> None:
    """With --audit, the writes since the last mark by client (User-Agent), resource and verb."""
    if AUDIT is None:
        return
    writes = AUDIT.since_mark()
    rows = ", ".join(f"{agent} {verb} {res} {n}" for (agent, res, verb), n in writes.most_common(16))
    step(f"{what}: writes by client: {rows}")
    AUDIT.mark()


def timeline(claims: NodeTracker, nodes: NodeTracker, t0: float, before: dict, after: dict) -> str:
    """When the last claim and the last Node were first seen and the last Node Ready (from ``t0``),
    and the requests in between."""
    with claims.lock, nodes.lock:
        last_claim = max(claims.added.values(), default=t0) - t0
        last_node = max(nodes.added.values(), default=t0) - t0
    counts = ", ".join(f"{verb} {res} {after[(res, verb)] - before[(res, verb)]:.0f}" for res, verb in COUNTED)
    return f"last claim seen +{last_claim:.1f} s, last Node +{last_node:.1f} s; requests: {counts}"


def timed_run(h: Harness, name: str, n: int, claims_selector: str, make: Callable[[], None],
              unmake: Callable[[], None], what: str) -> float:
    """``make()`` timed from its start until ``n`` Nodes labelled ``bench=<name>`` are Ready (the claims
    of ``claims_selector`` and the API server's requests watched meanwhile); then ``unmake()`` and
    the Nodes gone."""
    tracker, claims = NodeTracker(), NodeTracker()
    w = h.watch("/api/v1/nodes", tracker.on_event, labelSelector=f"bench={name}")
    wc = h.watch(CLAIMS, claims.on_event, labelSelector=claims_selector)
    before = requests(h)
    if AUDIT is not None:
        AUDIT.mark()
    t0 = time.time()
    make()
    wait_for(lambda: tracker.ready_count() >= n, timeout=300, what=f"{n} nodes of {name} Ready", interval=0.05)
    took = tracker.last_ready() - t0
    step(f"{what}: all Ready {took:.2f} s after the first create (load {loadavg()}); "
         + timeline(claims, tracker, t0, before, requests(h)))
    audited(what)
    unmake()
    wait_for(lambda: not tracker.present, timeout=300, what=f"nodes of {name} gone", interval=0.2)
    w.stop()
    wc.stop()
    return took


def floor_run(h: Harness, i: int, n: int) -> float:
    """The floor: a static NodePool of ``n`` created by a bare client."""
    name = f"floor-{i}"
    return timed_run(
        h, name, n, f"karpenter.sh/nodepool={name}",
        lambda: h.custom.create_cluster_custom_object("karpenter.sh", "v1", "nodepools", nodepool(name, n)),
        lambda: delete_nodepool(h, name),
        f"floor run {i + 1}: a static NodePool of {n}")


def delete_nodepool(h: Harness, name: str, timeout: float = 300) -> None:
    """Delete the floor's NodePool; once Karpenter has deleted its claims, delete the Nodes it left
    behind. Karpenter v1.15.0 deletes a NodePool's claims, but a Node whose claim was deleted
    before it registered (still tainted ``karpenter.sh/unregistered``, no owner) stays: 9 of 288
    once, which no controller removed in 300 s. The floor's teardown is not timed."""
    h.custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", name)
    selector = f"karpenter.sh/nodepool={name}"
    wait_for(lambda: not h.custom.list_cluster_custom_object("karpenter.sh", "v1", "nodeclaims",
                                                             label_selector=selector)["items"],
             timeout=timeout, what=f"NodeClaims of {name} gone", interval=0.5)
    left = [node.metadata.name for node in h.core.list_node(label_selector=f"bench={name}").items
            if not node.metadata.deletion_timestamp]
    if left:
        step(f"Karpenter left {len(left)} Node(s) of {name} without a claim; the bench deletes them")
        for node in left:
            try:
                h.core.delete_node(node)
            except ApiException as e:
                if e.status != 404:
                    raise


def standalone_claim(name: str, i: int) -> dict:
    """A NodeClaim with no NodePool, as hyperplan makes one per slot (the same requirements, node
    class and its label, ``expireAfter`` and do-not-disrupt), without hyperplan's other labels."""
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": f"{name}-{i}", "labels": {"bench": name, "karpenter.kwok.sh/kwoknodeclass": "default"},
                         "annotations": {"karpenter.sh/do-not-disrupt": "true"}},
            "spec": {"nodeClassRef": {"group": karpenter_plane.NODECLASS_GROUP, "kind": karpenter_plane.NODECLASS_KIND,
                                      "name": "default"},
                     "expireAfter": "Never",
                     "requirements": nodepool(name, 0)["spec"]["template"]["spec"]["requirements"]}}


def claims_floor_run(h: Harness, i: int, n: int, threads: int = CREATE_WORKERS) -> float:
    """A bare client creating ``n`` standalone NodeClaims from ``threads`` threads (hyperplan's
    create width): what Karpenter takes for claims of the shape hyperplan makes, without hyperplan."""
    name = f"claims-{i}"

    def each(call: Callable[[int], object]) -> None:
        with ThreadPoolExecutor(threads) as pool_:
            list(pool_.map(call, range(n)))

    return timed_run(
        h, name, n, f"bench={name}",
        lambda: each(lambda j: h.custom.create_cluster_custom_object(
            "karpenter.sh", "v1", "nodeclaims", standalone_claim(name, j))),
        lambda: each(lambda j: h.custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodeclaims", f"{name}-{j}")),
        f"standalone claims run {i + 1}: {n} NodeClaims from a bare client")


def group_run(h: Harness, args: argparse.Namespace, i: int, n: int) -> dict:
    """The operator: a plan of ``args.ultraservers`` x72 UltraServers and a karpenter group on it,
    timed from the block's start until its ``n`` Nodes are Ready; then the group removed."""
    name = f"bench-karpenter-{i}"
    claims = NodeTracker()
    wc = h.watch(CLAIMS, claims.on_event, labelSelector=f"hyperplan.dev/instance-group={name}")
    before = requests(h)
    if AUDIT is not None:
        AUDIT.mark()
    r, tracker, w = group_to_ready(
        h, i, name, {"ultraServerType": X72, "ultraServerCount": args.ultraservers},
        {"instanceType": GB200, "instanceCount": (PER_ULTRASERVER - 1) * args.ultraservers,
         "nodeProvider": "karpenter"}, n, args.lead, ready_timeout=300)
    step(f"operator run {i + 1}: " + timeline(claims, tracker, r["start"], before, requests(h)))
    audited(f"operator run {i + 1} (from the plan's create)")
    remove_group(h, name, tracker, w, timeout=300)
    wc.stop()
    return r


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
        bare_claims = [claims_floor_run(h, i, n) for i in range(args.claims_runs)]
        h.start_operator("demo", {"HYPERPLAN_KARPENTER_LAUNCH_TIMEOUT_SECONDS": "120"})
        h.create("capacitypools", pool("bench-x72", GB200, PER_ULTRASERVER * args.ultraservers * 2, AZ, X72))
        # Floor and group runs take turns (floor, group, floor, ...), so that what drifts over a
        # run of the bench (the plane's history, Karpenter's caches, the machine) weighs on both
        # alike; the operator, idle during a floor run, stays up throughout.
        floors, runs = [], []
        for i in range(max(args.floor_runs, args.runs)):
            if i < args.floor_runs:
                floors.append(floor_run(h, i, n))
            if i < args.runs:
                runs.append(group_run(h, args, i, n))
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
    ] + ([
        ("bare client, standalone NodeClaims, first create to all Ready (median; runs "
         + ", ".join(f"{x:.1f}" for x in bare_claims) + ")", fmt(statistics.median(bare_claims)), "", ""),
        ("karpenter group / standalone claims", f"{ours / statistics.median(bare_claims):.2f}x", "", ""),
    ] if bare_claims else []))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ultraservers", type=int, default=16)
    parser.add_argument("--floor-runs", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--claims-runs", type=int, default=0,
                        help="runs of a bare client making the same number of standalone NodeClaims (for comparison)")
    parser.add_argument("--lead", type=int, default=25)
    parser.add_argument("--audit", action="store_true",
                        help="the API server audits every write; each run prints the writes by client")
    args = parser.parse_args()
    with Harness("karpenter", budget=1800, **({"audit_writes": True} if args.audit else {})) as h:
        if args.audit:
            AUDIT = AuditWrites(h.plane.audit_log)
        sys.exit(main(h, args))
