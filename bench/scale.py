"""The operator at fleet scale: memory, idle writes and idle CPU with many plans and nodes.

1. The operator (demo profile, its own process) with nothing to do: its RSS after ``--warmup``
   seconds is the idle operator's RSS.
2. ``--plans`` auto-purchasing plans (1 x ml.p5.48xlarge, 1 minute) over 10 pools of 64, in a
   window that starts 38 minutes ahead, so nothing falls due while the benchmark runs; created
   from 4 threads. Timed until every plan is Scheduled (or Failed, reported). RSS then.
3. ``--groups`` plans of 64 x ml.p5.48xlarge with a 3-hour block running now and one
   InstanceGroup of 64 KWOK nodes each, plus (unless ``--no-ultraserver``) a plan of 16
   ml.u-p6e-gb200x72 UltraServers and a group of 272 instances on them (16 x 17 active + 16
   spares = 288 nodes). Timed until every group node is Ready and every group Ready. RSS then.
4. An idle window of ``--idle`` seconds: the operator's CPU (utime + stime), its RSS every 10 s,
   its status writes, and the API server's writes by client from its audit log (the plane runs
   with ``audit_writes``): the operator's are those whose User-Agent is ``hyperplan/`` or
   ``kopf/``; the controller-manager's and KWOK's are counted beside them.

Targets: RSS at most the idle operator's + 200 MiB and flat over the idle window;
0 API writes and under 2 % of a core while idle. Memory per plan and per node are the RSS steps
of 2. and 3. divided by the plans and nodes. With ``BENCH_OPERATOR_TRACEMALLOC=<file>`` the
operator runs under tracemalloc and the script prints where its memory is at the end (tracing
itself costs memory and CPU: take the sites from such a run, the figures from an untraced one).

    .venv/bin/python bench/scale.py [--plans 10000] [--groups 16] [--idle 300] [--warmup 20]
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    AuditWrites, api_writes, loadavg, increase,
    API, GROUP, VERSION, BenchError, Harness, machine, metric_sum, node_ready, pool, print_figures,
    proc_cpu_seconds, proc_rss_mib, run, step, ts, utcnow, verdict,
)

ITYPE = "ml.p5.48xlarge"
GB200, X72 = "ml.p6e-gb200.36xlarge", "ml.u-p6e-gb200x72"
AZS = [f"us-east-1{c}" for c in "abcdef"] + [f"us-west-2{c}" for c in "abcd"]
RSS_BUDGET = 200.0  # MiB above the idle operator
CPU_TARGET = 2.0  # percent of one core
FLAT = 5.0  # MiB of growth over the idle window read as flat


def _by_agent(writes: Counter) -> Counter:
    out: Counter = Counter()
    for (agent, _res, _verb), n in writes.items():
        out[agent] += n
    return out


def settled_rss(pid: int, seconds: float = 40) -> float:
    """RSS once it has stopped moving by more than 1 MiB for ``seconds`` (at most 150 s): longer
    than the operator's malloc_trim interval (30 s, hyperplan.allocator), so that the figure is
    the steady state, not the heap of the last burst before it is handed back."""
    last, since, deadline = proc_rss_mib(pid), time.monotonic(), time.monotonic() + 150
    while time.monotonic() - since < seconds and time.monotonic() < deadline:
        time.sleep(1)
        now = proc_rss_mib(pid)
        if abs(now - last) > 1:
            last, since = now, time.monotonic()
    return proc_rss_mib(pid)


def create_plans(h: Harness, n: int) -> float:
    for p in range(10):
        h.create("capacitypools", pool(f"plans-{p:02d}", ITYPE, 64, AZS[p]))
    start = utcnow() + timedelta(minutes=38)
    spec = {"instanceType": ITYPE, "instanceCount": 1, "targetResource": "hyperpod-cluster", "duration": "1m",
            "autoPurchase": True, "startTimeAfter": ts(start), "endTimeBefore": ts(start + timedelta(minutes=17))}
    t0 = time.monotonic()

    def make(i: int) -> None:
        h.create("trainingplans", {"apiVersion": API, "kind": "TrainingPlan",
                                   "metadata": {"name": f"scale-{i:05d}"}, "spec": spec})
        if (i + 1) % 1000 == 0:
            step(f"  created {i + 1} plans ({time.monotonic() - t0:.0f} s)")

    with ThreadPoolExecutor(4) as ex:
        list(ex.map(make, range(n)))
    return time.monotonic() - t0


def list_all(h: Harness, path: str, what: str) -> list[dict]:
    """Every item of a LIST, in pages of 1,000 (one LIST of 10,000 plans timed out after 60 s
    while the API server was busy with the purchases); a page that times out is asked again, up
    to 5 times."""
    items: list[dict] = []
    cont = ""
    sep = "&" if "?" in path else "?"
    while True:
        paged = f"{path}{sep}limit=1000" + (f"&continue={urllib.parse.quote(cont)}" if cont else "")
        for attempt in range(5):
            try:
                page = h.api.get(paged, timeout=120)
                break
            except (TimeoutError, OSError) as e:
                step(f"  listing {what}: {type(e).__name__}: {e}; asking again ({attempt + 1}/5)")
        else:
            raise BenchError(f"could not list {what} 5 times in a row")
        items += page["items"]
        cont = (page.get("metadata") or {}).get("continue") or ""
        if not cont:
            return items


def phases(h: Harness, prefix: str) -> Counter:
    items = list_all(h, f"/apis/{GROUP}/{VERSION}/trainingplans", "the plans")
    return Counter((p.get("status") or {}).get("phase") or "none" for p in items
                   if p["metadata"]["name"].startswith(prefix))


def hold_nodes(h: Harness, groups: int, ultra: bool) -> int:
    start_after = ts(utcnow() + timedelta(seconds=15))
    if groups:
        h.create("capacitypools", pool("nodes-p5", ITYPE, 64 * groups, "eu-west-1a"))
    for j in range(groups):
        h.create("trainingplans", {"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": f"nodes-{j:03d}"},
                                   "spec": {"instanceType": ITYPE, "instanceCount": 64, "targetResource": "hyperpod-cluster",
                                            "duration": "180m", "autoPurchase": True, "startTimeAfter": start_after}})
        h.create("instancegroups", {"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": f"nodes-{j:03d}"},
                                    "spec": {"trainingPlanRef": f"nodes-{j:03d}", "instanceType": ITYPE,
                                             "instanceCount": 64}})
    total = 64 * groups
    if ultra:
        h.create("capacitypools", pool("nodes-gb200", GB200, 18 * 16, "eu-west-1b", ultra=X72))
        h.create("trainingplans", {"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": "nodes-x72"},
                                   "spec": {"ultraServerType": X72, "ultraServerCount": 16, "targetResource": "hyperpod-cluster",
                                            "duration": "180m", "autoPurchase": True, "startTimeAfter": start_after}})
        h.create("instancegroups", {"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": "nodes-x72"},
                                    "spec": {"trainingPlanRef": "nodes-x72", "instanceType": GB200,
                                             "instanceCount": 16 * 17}})
        total += 18 * 16
    step(f"{groups} group(s) of 64 ml.p5 nodes{' and one of 16 x72 UltraServers (288 nodes)' if ultra else ''}: "
         f"{total} nodes, blocks starting in ~15 s")
    return total


def main(h: Harness, args: argparse.Namespace) -> int:
    load_start = loadavg()
    # One replica, no election: on 2 shared cores the lease renewal thread of a busy operator
    # missed its 10 s deadline once (the operator then exits by design); that is measured by the
    # failover bench, not here.
    op = h.start_operator("demo", extra_env={"HYPERPLAN_LEADER_ELECTION": "false"})
    time.sleep(args.warmup)
    rss_idle = settled_rss(op.pid)
    step(f"idle operator: RSS {rss_idle:.1f} MiB")
    if op.start_tracing():
        step("tracemalloc started in the operator (SIGUSR2): the report holds what the plans and nodes add")

    t0 = time.monotonic()
    cpu0 = proc_cpu_seconds(op.pid)
    created = create_plans(h, args.plans)
    step(f"{args.plans} plans created in {created:.0f} s; waiting until they are bought")
    deadline = time.monotonic() + args.settle_timeout
    while True:
        h.tick()
        counts = phases(h, "scale-")
        step(f"  plans: {dict(counts)} ({time.monotonic() - t0:.0f} s, operator CPU {proc_cpu_seconds(op.pid) - cpu0:.0f} s, "
             f"RSS {proc_rss_mib(op.pid):.0f} MiB, load {loadavg()})")
        if counts.get("Scheduled", 0) + counts.get("Failed", 0) >= args.plans:
            break
        if time.monotonic() > deadline:  # report what was bought; the table says it did not settle
            step(f"NOT SETTLED: {args.plans} plans not all bought within {args.settle_timeout} s: {dict(counts)}")
            break
        time.sleep(10)
    plans_settle = time.monotonic() - t0
    plans_cpu = proc_cpu_seconds(op.pid) - cpu0
    rss_plans = settled_rss(op.pid)
    step(f"plans settled in {plans_settle:.0f} s ({plans_cpu:.0f} CPU-s); RSS {rss_plans:.1f} MiB")

    nodes = hold_nodes(h, args.groups, args.ultraserver)
    t1 = time.monotonic()
    names = [f"nodes-{j:03d}" for j in range(args.groups)] + (["nodes-x72"] if args.ultraserver else [])
    while True:
        h.tick()
        items = list_all(h, "/api/v1/nodes?labelSelector=hyperplan.dev%2Finstance-group", "the group nodes")
        ready = sum(1 for i in items if node_ready(i))
        groups_ready = sum(1 for g in names if h.status("instancegroups", g).get("phase") == "Ready")
        step(f"  nodes Ready {ready}/{nodes}, groups Ready {groups_ready}/{len(names)} "
             f"({time.monotonic() - t1:.0f} s, RSS {proc_rss_mib(op.pid):.0f} MiB, load {loadavg()})")
        if ready >= nodes and groups_ready == len(names):
            break
        if time.monotonic() - t1 > args.nodes_timeout:
            raise BenchError(f"nodes not Ready within {args.nodes_timeout} s: {ready}/{nodes}")
        time.sleep(5)
    nodes_ready = time.monotonic() - t1
    time.sleep(10)  # the last status writes of the groups and plans
    rss_nodes = settled_rss(op.pid)
    step(f"all {nodes} nodes Ready in {nodes_ready:.0f} s; RSS {rss_nodes:.1f} MiB")

    step(f"idle window: {args.idle} s")
    scrape0 = time.monotonic()
    m0 = op.metrics(timeout=120)  # /metrics took > 5 s at 5,000 plans before it was kept incrementally
    scrape_s = [time.monotonic() - scrape0]
    a0 = api_writes(h.api.metrics())
    audit = AuditWrites(h.plane.audit_log)
    audit.mark()
    t2, c2 = time.time(), proc_cpu_seconds(op.pid)
    samples = [(0.0, rss_nodes)]
    while time.time() - t2 < args.idle:
        time.sleep(min(10, args.idle - (time.time() - t2)))
        h.tick()
        samples.append((time.time() - t2, proc_rss_mib(op.pid)))
        step(f"  t={samples[-1][0]:4.0f} s  CPU {proc_cpu_seconds(op.pid) - c2:.2f} s  RSS {samples[-1][1]:.1f} MiB "
             f"load {loadavg()}")
    wall = time.time() - t2
    cpu = proc_cpu_seconds(op.pid) - c2
    scrape1 = time.monotonic()
    m1 = op.metrics(timeout=120)
    scrape_s.append(time.monotonic() - scrape1)
    a1 = api_writes(h.api.metrics())
    all_writes = increase(a1, a0)
    by_client = audit.since_mark()
    ours = AuditWrites.operators(by_client)
    status_writes = metric_sum(m1, "hyperplan_status_writes_total") - metric_sum(m0, "hyperplan_status_writes_total")
    idle_reconciles = metric_sum(m1, "hyperplan_reconciles_total") - metric_sum(m0, "hyperplan_reconciles_total")
    step("apiserver writes in the idle window: " + ", ".join(f"{r} {v} {n:.0f}" for (r, v), n in sorted(all_writes.items())))
    step("the same by client (audit log): " + (", ".join(f"{c} {r} {v} {n}" for (c, r, v), n in sorted(by_client.items()))
                                               or "none"))
    report = op.tracemalloc_report()
    if report:
        print("\n== where the operator's memory is (tracemalloc) ==\n" + report, flush=True)

    rss_end = samples[-1][1]
    growth = rss_end - rss_nodes
    above = max(s[1] for s in samples) - rss_idle
    cpu_pct = 100 * cpu / wall
    per_plan = (rss_plans - rss_idle) * 1024 / max(1, args.plans)
    per_node = (rss_nodes - rss_plans) * 1024 / max(1, nodes)
    counts = phases(h, "scale-")
    rows = [
        ("machine", machine(), "", ""),
        ("load average at the start / the end", f"{load_start} / {loadavg()}", "", ""),
        ("plans bought (Scheduled / Failed)", f"{counts.get('Scheduled', 0)} / {counts.get('Failed', 0)} of {args.plans}",
         f"{args.plans} / 0", verdict(counts.get("Scheduled", 0) == args.plans)),
        ("plans: first create to all bought / creates alone / operator CPU",
         f"{plans_settle:.0f} s / {created:.0f} s / {plans_cpu:.0f} s", "", ""),
        ("group nodes (groups of 64 + UltraServer group)", f"{nodes} in {len(names)} groups", "", ""),
        ("nodes: block start to all Ready (incl. status settle)", f"{nodes_ready:.0f} s", "", ""),
        ("operator RSS idle / with plans / with plans and nodes / after the idle window",
         f"{rss_idle:.1f} / {rss_plans:.1f} / {rss_nodes:.1f} / {rss_end:.1f} MiB", "", ""),
        ("RSS above the idle operator (max over the idle window)", f"{above:+.1f} MiB", f"<= {RSS_BUDGET:.0f} MiB",
         verdict(above <= RSS_BUDGET)),
        ("memory per plan / per node", f"{per_plan:.1f} KiB / {per_node:.1f} KiB", "", ""),
        (f"RSS growth over the idle window ({wall:.0f} s)", f"{growth:+.1f} MiB", f"< {FLAT:.0f} MiB",
         verdict(growth < FLAT)),
        ("idle: operator status writes / reconciles", f"{status_writes:.0f} / {idle_reconciles:.0f}", "0", verdict(status_writes == 0)),
        ("idle: API writes by the operator (audit log: User-Agent hyperplan/ or kopf/)",
         ", ".join(f"{c} {r} {v} {n}" for (c, r, v), n in sorted(ours.items())) or "0", "0", verdict(not ours)),
        ("idle: API writes by every other client (audit log)",
         ", ".join(f"{c} {n}" for c, n in sorted(_by_agent(by_client - ours).items())) or "0", "", ""),
        ("idle: apiserver writes, all clients (apiserver_request_total)", f"{sum(all_writes.values()):.0f}", "", ""),
        ("idle: operator CPU", f"{cpu:.1f} s = {cpu_pct:.2f} % of a core", f"< {CPU_TARGET:.0f} %",
         verdict(cpu_pct < CPU_TARGET)),
        ("operator /metrics: one scrape at the start / the end of the idle window (size)",
         f"{scrape_s[0]:.2f} s / {scrape_s[1]:.2f} s ({len(m1) / 2**20:.1f} MiB)", "", ""),
    ]
    print_figures("scale", rows)
    ok = above <= RSS_BUDGET and growth < FLAT and status_writes == 0 and not ours and cpu_pct < CPU_TARGET
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plans", type=int, default=10000)
    ap.add_argument("--groups", type=int, default=16, help="groups of 64 KWOK nodes (each with its own plan)")
    ap.add_argument("--no-ultraserver", dest="ultraserver", action="store_false",
                    help="leave out the group of 16 x72 UltraServers (288 nodes)")
    ap.add_argument("--idle", type=int, default=300, help="seconds of the idle window")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--settle-timeout", type=int, default=1500)
    ap.add_argument("--nodes-timeout", type=int, default=600)
    ap.add_argument("--node-status-seconds", type=int, default=300,
                    help="how often KWOK reports an unchanged node status (a kubelet: 300; tests: 20 to 25)")
    args = ap.parse_args()
    run(lambda h: main(h, args), "scale",
        budget=120 + args.warmup + args.settle_timeout + args.nodes_timeout + args.idle + 300,
        node_status_seconds=args.node_status_seconds, audit_writes=True)
