"""The cost of one pass against the objects it concerns: decide_group and placement at 72, 288 and
1,152 nodes (4, 16 and 64 ml.u-p6e-gb200x72 UltraServers). Pure functions, no control plane.

For each size: a block of N UltraServers and a group holding all of it (17 active + 1 spare per
UltraServer); the nodes are created through the recording FakeProvider and observed with the
real ``actuation.groups.observe_nodes``, as the handler does. Timed (best of ``--repeat`` runs of
``--loops`` calls each, so a busy machine inflates nothing but the slowest runs):

* ``decide_group`` on the steady group (nothing to do), and with one active node NotReady past
  its grace (a mark, a spare promotion and a backfill decided);
* placement: the plan's counts and its per-UltraServer reports (``plan_counts``,
  ``ultraserver_reports``), what a plan pass computes from the block's nodes;
* ``observe_nodes`` (the read side of a group pass).

Linear cost means the time per node stays flat as the nodes grow 16-fold; the last column says
how far it moved. Prints a line per size and a table.

    .venv/bin/python bench/pass_cost.py [--repeat 5] [--loops 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from kubernetes import client  # noqa: E402

from hyperplan.actuation.groups import observe_nodes  # noqa: E402
from hyperplan_testing.fakes import FakeProvider  # noqa: E402
from hyperplan.api.models import InstanceGroupSpec, InstanceGroupStatus, ReservedCapacity  # noqa: E402
from hyperplan.planning import counts  # noqa: E402
from hyperplan.planning import naming  # noqa: E402
from hyperplan.planning import placement  # noqa: E402
from hyperplan.planning.groups import Peer, BoundPlan, decide_group  # noqa: E402
from hyperplan.planning.memory import GroupMemory  # noqa: E402
from hyperplan.planning.policy import DEMO  # noqa: E402

UTC = timezone.utc
X72 = "ml.u-p6e-gb200x72"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SIZES = (4, 16, 64)  # UltraServers: 72, 288, 1,152 nodes


def step(t0: float, msg: str) -> None:
    print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)


def best(fn: Callable[[], object], repeat: int, loops: int) -> float:
    """Seconds per call: the best of ``repeat`` runs of ``loops`` calls."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        times.append((time.perf_counter() - start) / loops)
    return min(times)


def set_ready(node: client.V1Node, status: str, since: datetime) -> None:
    node.status = client.V1NodeStatus(conditions=[client.V1NodeCondition(
        type="Ready", status=status, last_transition_time=since)])


def measure(ultraservers: int, repeat: int, loops: int) -> dict[str, float]:
    count = 18 * ultraservers
    block = ReservedCapacity(id="rc-bench-0", availability_zone="az1", instance_type=placement.ULTRASERVER_INSTANCE_TYPE,
                             instance_count=count, start_time=T0, end_time=T0 + timedelta(hours=3),
                             ultra_server_type=X72, ultra_server_count=ultraservers)
    plan = BoundPlan("p", "hyperpod-cluster", None, X72, 1, (block,))
    spec = InstanceGroupSpec(training_plan_ref="p", instance_type=placement.ULTRASERVER_INSTANCE_TYPE,
                             instance_count=17 * ultraservers,
                             health_check={"graceSeconds": 5, "maxUnhealthy": "20%", "rebootBudget": 0})
    peers = [Peer("w", spec.instance_count)]
    now = T0 + timedelta(minutes=1)
    first = decide_group("w", 1, spec, InstanceGroupStatus(), plan, peers, [], DEMO, T0 + timedelta(seconds=1))
    provider = FakeProvider(clock=lambda: T0)
    for s in first.create:
        provider.create(s)
        set_ready(provider.nodes[s.name], "True", T0 + timedelta(seconds=2))
    memory = GroupMemory()
    keys = naming.TopologyKeys()
    raw = provider.list("w")
    assert len(raw) == count, (len(raw), count)
    seen = observe_nodes("w", raw, memory, now, keys)
    steady = decide_group("w", 1, spec, first.status, plan, peers, seen.nodes, DEMO, now, keys)
    assert not (steady.create or steady.drain or steady.remediation), "the steady group must have nothing to do"

    victim = next(n for n in raw if (n.metadata.labels or {}).get(naming.LABEL_ROLE) == naming.ROLE_ACTIVE)
    set_ready(victim, "False", now - timedelta(seconds=30))
    failing = observe_nodes("w", provider.list("w"), GroupMemory(), now, keys)
    failed = decide_group("w", 1, spec, steady.status, plan, peers, failing.nodes, DEMO, now, keys)
    assert failed.remediation, "one node past its grace must be remediated"
    set_ready(victim, "True", T0 + timedelta(seconds=2))

    plan_nodes = [counts.ObservedNode(n.metadata.name, "w", (n.metadata.labels or {}).get(naming.LABEL_ROLE, naming.ROLE_ACTIVE),
                                  (n.metadata.labels or {}).get(keys.ultraserver_id), True, True, False) for n in raw]
    ultras = placement.ultraservers_for_block(block.id, X72, count, 1)

    def placement_cost() -> None:
        counts.plan_counts(count, ultraservers, plan_nodes)
        counts.ultraserver_reports(ultras, "az1", plan_nodes)

    return {
        "nodes": count,
        "decide_steady": best(lambda: decide_group("w", 1, spec, steady.status, plan, peers, seen.nodes, DEMO, now,
                                                   keys), repeat, loops),
        "decide_failure": best(lambda: decide_group("w", 1, spec, steady.status, plan, peers, failing.nodes, DEMO,
                                                    now, keys), repeat, loops),
        "placement": best(placement_cost, repeat, loops),
        "observe": best(lambda: observe_nodes("w", raw, GroupMemory(), now, keys), repeat, max(1, loops // 4)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--loops", type=int, default=20)
    args = ap.parse_args()
    t0 = time.monotonic()
    load = "/".join(Path("/proc/loadavg").read_text().split()[:3])
    step(t0, f"pass cost: decide_group, placement and observe_nodes at {', '.join(str(18 * s) for s in SIZES)} nodes; "
             f"load {load}")
    rows = []
    for size in SIZES:
        r = measure(size, args.repeat, args.loops)
        rows.append(r)
        step(t0, f"{r['nodes']:5d} nodes: decide (steady) {r['decide_steady'] * 1e3:.2f} ms, decide (one failure) "
                 f"{r['decide_failure'] * 1e3:.2f} ms, placement {r['placement'] * 1e3:.2f} ms, "
                 f"observe {r['observe'] * 1e3:.2f} ms")
    print("\n== pass cost: figures (per call; per node in parentheses) ==")
    header = ("nodes", "decide_group steady", "decide_group one failure", "placement (counts+reports)", "observe_nodes")
    keys = ("decide_steady", "decide_failure", "placement", "observe")
    lines = [header] + [(str(r["nodes"]),) + tuple(f"{r[k] * 1e3:.2f} ms ({r[k] * 1e6 / r['nodes']:.1f} us)"
                                                   for k in keys) for r in rows]
    growth = tuple(f"{(rows[-1][k] / rows[-1]['nodes']) / (rows[0][k] / rows[0]['nodes']):.2f}x" for k in keys)
    lines.append((f"per-node cost {rows[-1]['nodes']} vs {rows[0]['nodes']}",) + growth)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)))
    print(f"(linear: the per-node cost stays near 1.0x over a 16-fold growth; quadratic would be ~16x; "
          f"load at the end {'/'.join(Path('/proc/loadavg').read_text().split()[:3])})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
