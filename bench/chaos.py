"""Chaos: kill -9 the leader 30+ times, restart the API server twice and etcd once, under a mixed
workload, and check hyperplan's invariants after every fault, on watch events and at the end.

Two ``hyperplan run`` replicas elect a leader on the Lease ``default/hyperplan-leader`` with a
short lease (4 s, renew deadline 3 s, retry 1 s) so that many failovers fit in a few minutes.
This script plays the kubelet too: a replica that exits on its own (it lost the lease while the
API server was away) is started again.

The workload (demo profile: a "day" is a minute), all created at the start:

* three CapacityPools; auto-purchasing TrainingPlans that race for them (three p5 plans of 8
  for 16 instances, four trn1 plans of 4 for 8, three UltraServer plans for four x36
  UltraServers), so some get later or split blocks; one plan deleted (its reservations go back);
* InstanceGroups (``nodeProvider: kwok``) on those plans: UltraServer groups with a spare per
  UltraServer, plain groups, two groups sharing one plan; blocks that start during the run,
  end (drains) and start again;
* node failures (a GPU health agent's ``AcceleratedHardwareReady=False``) with spare promotions
  and backfills; two group deletions (one in the middle of its block).

Faults, in the fault window: kill -9 of the replica the Lease names, at random moments (some
aimed at a block start or a failure's grace end), each followed either by a restart of the same
identity at once (it takes its own Lease back) or, after the standby took over, by a restart as
the standby; ``kube-apiserver`` restarted twice (once killed, once stopped), ``etcd`` restarted
once (its data kept).

Invariants (hyperplan_testing.invariants): no two live nodes in one slot; no node without a live group;
no pool's ledger above its capacity (on every pool watch event); no plan bought twice (the ledger
matches each plan's blocks after a settling time; a bought plan's blocks never change on any
watch event); no spare promoted twice for one failure (on every node watch event); every group
converges to its desired counts within CONVERGE_S of its block start, a failure's grace end, or
the end of the faults; a deleted group's nodes are gone, a block's nodes drained by its end.

    .venv/bin/python bench/chaos.py [--kills 30] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
from _common import (  # noqa: E402
    API, PYTHON, ROOT, STATE, BenchError, Harness, free_port, machine, parse_ts, pool, print_figures, run,
    step, ts, utcnow, verdict,
)
from hyperplan_testing import invariants as inv  # noqa: E402

LEASE, RENEW, RETRY = 4, 3, 1
CONVERGE_S = 60.0  # the stated bound: a group is at its desired counts this long after a trigger
GIVE_UP_S = 150.0  # an expectation still unmet after this long is reported as never converged
DRAIN_S = 20.0  # the demo profile's hyperpod-cluster termination lead: nodes gone by the block's end
SETTLE_S = 30.0  # a plan/ledger mismatch must outlast this (a purchase writes the ledger first)
GB, GB_US = "ml.p6e-gb200.36xlarge", "ml.u-p6e-gb200x36"
US_USABLE = 8  # x36 = 9 instances, 1 spare
P5, TRN = "ml.p5.48xlarge", "ml.trn1.32xlarge"
GRACE = 3


def now_s() -> float:
    return time.time()


# --------------------------------------------------------------------------- replicas


@dataclass
class Replica:
    identity: str
    plane_kubeconfig: Path
    proc: subprocess.Popen | None = None
    held: bool = False  # the fault thread is handling it; the supervisor leaves it alone
    starts: int = 0
    offset: int = 0  # where this start's lines begin in the (appended) log
    metrics_port: int = 0

    @property
    def log(self) -> Path:
        return STATE / f"chaos-{self.identity}.log"

    def start(self) -> None:
        self.metrics_port = free_port()
        env = {**os.environ, "KUBECONFIG": str(self.plane_kubeconfig), "HYPERPLAN_POLICY": "demo",
               "HYPERPLAN_METRICS_PORT": str(self.metrics_port), "HYPERPLAN_LIVENESS_PORT": str(free_port()),
               "HYPERPLAN_LEADER_ELECTION_IDENTITY": self.identity,
               "HYPERPLAN_LEASE_DURATION_SECONDS": str(LEASE), "HYPERPLAN_RENEW_DEADLINE_SECONDS": str(RENEW),
               "HYPERPLAN_RETRY_PERIOD_SECONDS": str(RETRY)}
        env.pop("HYPERPLAN_STATE_DIR", None)
        self.offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            out.write(f"---- chaos: start #{self.starts + 1} of {self.identity} at {ts(utcnow())}\n".encode())
            out.flush()
            self.proc = subprocess.Popen([str(PYTHON), "-m", "hyperplan.cli", "run"], env=env, cwd=ROOT,
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.starts += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def reconciles(self) -> float:
        """Reconcile passes this start has finished (its /metrics), 0 when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return 0.0
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                   if ln.startswith("hyperplan_reconciles_total{"))

    def kill9(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if not self.alive():
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill9()

    def lines(self, *needles: str, this_start: bool = False) -> list[str]:
        try:
            with open(self.log, "rb") as f:
                if this_start:
                    f.seek(self.offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return []
        return [ln for ln in text.splitlines() if all(n in ln for n in needles)]


# --------------------------------------------------------------------------- what the watches show


@dataclass
class Violation:
    t: float
    what: str
    text: str
    excerpt: list[str] = field(default_factory=list)


class Cluster:
    """Nodes, groups, plans and pools as the watches last showed them, plus the per-event checks."""

    def __init__(self, t0: float, excerpt: Callable[[str], list[str]]):
        self.t0 = t0
        self.lock = threading.RLock()
        self.holders: list[tuple[float, str]] = []  # (t_read, holderIdentity) at each change of the Lease
        self.node_created: dict[str, float] = {}  # node -> when the watch first showed it
        self.node_deleted: dict[str, float] = {}
        self.node_promoted: dict[str, float] = {}  # spare -> when it first carried hyperplan.dev/replaces
        self.objs: dict[str, dict[str, dict]] = {"nodes": {}, "instancegroups": {}, "trainingplans": {},
                                                  "capacitypools": {}}
        self.promotions = inv.PromotionHistory()
        self.purchases = inv.PurchaseHistory()
        self.checks: Counter[str] = Counter()
        self.violations: list[Violation] = []
        self._reported: set[str] = set()
        self.excerpt = excerpt

    def violate(self, what: str, text: str, names: list[str] | None = None) -> None:
        key = f"{what}: {text}"
        with self.lock:
            if key in self._reported:
                return
            self._reported.add(key)
        lines = []
        for name in names or []:
            lines += self.excerpt(name)
        v = Violation(now_s() - self.t0, what, text, lines[-8:])
        self.violations.append(v)
        step(f"VIOLATION ({what}): {text}")
        for ln in v.excerpt:
            step(f"    log: {ln[:220]}")

    def handler(self, kind: str):
        def on_event(etype: str, obj: dict, t: float) -> None:
            with self.lock:
                name = obj["metadata"]["name"]
                if etype == "DELETED":
                    self.objs[kind].pop(name, None)
                else:
                    self.objs[kind][name] = obj
                if kind == "nodes":
                    if etype == "ADDED":
                        self.node_created.setdefault(name, t)
                    elif etype == "DELETED":
                        self.node_deleted.setdefault(name, t)
                    if (obj["metadata"].get("labels") or {}).get(inv.LABEL_REPLACES):
                        self.node_promoted.setdefault(name, t)
            self._check_event(kind, obj)

        def on_list(items: list[dict], t: float) -> None:
            with self.lock:
                self.objs[kind] = {o["metadata"]["name"]: o for o in items}
            for o in items:
                self._check_event(kind, o)

        return on_event, on_list

    def _check_event(self, kind: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        if kind == "capacitypools":
            self.checks["ledger within capacity (pool watch event)"] += 1
            for text in inv.ledger_overbooking(obj):
                self.violate("ledger above capacity", text, [name])
            self.checks["ledger entry written once (pool watch event)"] += 1
            for text in self.purchases.pool(obj):
                self.violate("reservation rewritten", text, [name])
        elif kind == "trainingplans":
            self.checks["plan bought once (plan watch event)"] += 1
            for text in self.purchases.plan(obj):
                self.violate("plan bought twice", text, [name])
        elif kind == "nodes":
            self.checks["one spare per failure (node watch event)"] += 1
            for text in self.promotions.node(obj):
                self.violate("spare promoted twice", text, [name, obj["metadata"].get("labels", {}).get(
                    inv.LABEL_REPLACES, name)])
            self.checks["one live node per slot (node watch event)"] += 1
            with self.lock:
                nodes = list(self.objs["nodes"].values())
            for text in inv.slot_conflicts(nodes):
                self.violate("two live nodes in one slot", text, text.split(": ", 1)[1].split(", "))

    def on_lease(self, etype: str, obj: dict, t: float) -> None:
        if obj["metadata"]["name"] != "hyperplan-leader":
            return
        holder = "" if etype == "DELETED" else (obj.get("spec") or {}).get("holderIdentity") or ""
        with self.lock:
            if not self.holders or self.holders[-1][1] != holder:
                self.holders.append((t, holder))

    def holder_at(self, t: float) -> tuple[str, float]:
        """Who the Lease named at ``t`` and since when (as the watch saw it)."""
        with self.lock:
            found = ("", 0.0)
            for since, holder in self.holders:
                if since <= t:
                    found = (holder, since)
            return found

    def get(self, kind: str) -> list[dict]:
        with self.lock:
            return list(self.objs[kind].values())

    def one(self, kind: str, name: str) -> dict | None:
        with self.lock:
            return self.objs[kind].get(name)


# --------------------------------------------------------------------------- convergence


@dataclass
class Expectation:
    """Something that must become true within CONVERGE_S of ``since`` (a trigger)."""

    kind: str  # "block start", "failure", "faults ended", "group deleted", "drain"
    group: str
    since: float
    check: Callable[[], str | None]  # None: met; else why not yet
    desc: str
    took: float | None = None
    last_reason: str = ""
    cancelled: bool = False


# --------------------------------------------------------------------------- the workload


@dataclass
class GroupDef:
    name: str
    plan: str
    itype: str
    count: int
    ultra: bool
    delete_at: float | None = None  # seconds after the workload's start
    failures_at: tuple[float, ...] = ()  # seconds after the block start

    @property
    def expected(self) -> inv.Expected:
        return inv.Expected(self.count, math.ceil(self.count / US_USABLE) if self.ultra else 0)


def workload(t0: datetime) -> tuple[list[dict], list[tuple[float, dict]], list[GroupDef], list[tuple[float, str]]]:
    """Pools, plans (with the second after the start at which each is created), groups, other steps.

    At the start, plans race: three UltraServer plans want 5 of the 4 x36 UltraServers (one
    loses: Failed, or a later window), four trn1 plans of 4 want the same 8 instances. Plans
    created 20 s later find the pools busy and get later blocks. A group is created once its
    plan is bought, so the groups of a plan that lost its race never exist.
    """
    after = lambda s: ts(t0 + timedelta(seconds=s))  # noqa: E731
    pools = [pool("chaos-gb", GB, 36, "us-west-2a", ultra=GB_US),
             pool("chaos-p5", P5, 24, "us-east-1a"),
             pool("chaos-trn", TRN, 8, "us-east-1b")]
    pools[1]["spec"]["unavailable"] = [{"start": after(150), "end": after(210), "instanceCount": 8}]

    def plan(name: str, duration: str, start: float, end: float | None = None, **spec) -> dict:
        body = {"targetResource": "hyperpod-cluster", "duration": duration, "autoPurchase": True,
                "startTimeAfter": after(start), **spec}
        if end is not None:
            body["endTimeBefore"] = after(end)
        return {"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": name}, "spec": body}

    plans = [
        (0.0, plan("gb-main", "5m", 30, ultraServerType=GB_US, ultraServerCount=2)),
        (0.0, plan("gb-late", "2m", 30, ultraServerType=GB_US, ultraServerCount=2)),
        (0.0, plan("gb-race", "2m", 30, ultraServerType=GB_US, ultraServerCount=1)),  # 5 wanted of 4
        (0.0, plan("p5-a", "2m", 25, 400, instanceType=P5, instanceCount=8)),
        (0.0, plan("p5-b", "2m", 25, 400, instanceType=P5, instanceCount=8)),
        (0.0, plan("p5-c", "2m", 25, 400, instanceType=P5, instanceCount=8)),
        *[(0.0, plan(f"trn-{i}", "1m", 20, 200, instanceType=TRN, instanceCount=4)) for i in range(4)],
        (20.0, plan("gb-next", "2m", 30, ultraServerType=GB_US, ultraServerCount=1)),  # after a busy window
        (20.0, plan("p5-next", "2m", 25, 400, instanceType=P5, instanceCount=8)),
    ]
    groups = [
        GroupDef("gb-main-w", "gb-main", GB, 12, True, failures_at=(25, 70, 125, 175, 230)),
        GroupDef("gb-late-w", "gb-late", GB, 10, True, failures_at=(30,)),
        GroupDef("gb-race-w", "gb-race", GB, 6, True, failures_at=(35,)),
        GroupDef("gb-next-w", "gb-next", GB, 6, True, failures_at=(30,)),
        GroupDef("p5-a-w", "p5-a", P5, 4, False, failures_at=(40,)),
        GroupDef("p5-a-x", "p5-a", P5, 4, False, delete_at=90),  # shares p5-a; deleted in its block
        GroupDef("p5-b-w", "p5-b", P5, 8, False),
        GroupDef("p5-c-w", "p5-c", P5, 4, False, delete_at=20),  # deleted before its block starts
        GroupDef("p5-next-w", "p5-next", P5, 8, False, failures_at=(30,)),
    ]
    other = [(70.0, "delete plan trn-3")]
    return pools, plans, groups, other


# --------------------------------------------------------------------------- the run


class Chaos:
    def __init__(self, h: Harness, args: argparse.Namespace):
        self.h = h
        self.args = args
        self.rng = random.Random(args.seed)
        self.replicas = [Replica(i, h.plane.kubeconfig) for i in ("chaos-a", "chaos-b")]
        for r in self.replicas:  # each run reads only its own logs
            r.log.unlink(missing_ok=True)
        self.t_start = now_s() - (time.monotonic() - _common._T0)  # el() reads like the step stamps
        self.cluster = Cluster(self.t_start, self.excerpt)
        self.expectations: list[Expectation] = []
        self.exp_lock = threading.Lock()
        self.faults: Counter[str] = Counter()
        self.fault_log: list[tuple[float, str, float]] = []
        self.handovers: list[tuple[str, float]] = []  # (how, kill -9 -> a replica leads again)
        self.snapshot_checks: Counter[str] = Counter()
        self.self_exits = 0
        self.failures: list[tuple[str, str, float]] = []  # (group, node, signal time)
        self.done = threading.Event()
        self.faults_over = threading.Event()
        self.errors: list[str] = []
        self.fault_no = 0
        self.block_seen: set[tuple[str, str]] = set()
        self.drain_seen: set[tuple[str, str]] = set()
        self.deleted_groups: set[str] = set()
        self.created_groups: set[str] = set()
        self.aim_at: list[float] = []  # moments worth a kill: block starts, grace ends
        self.aim_added: set[float] = set()

    # -- helpers

    def el(self) -> float:
        return now_s() - self.t_start

    def excerpt(self, name: str) -> list[str]:
        out = []
        for r in self.replicas:
            out += [f"{r.identity}: {ln}" for ln in r.lines(name)[-4:]]
        return out

    def holder(self) -> str | None:
        from kubernetes import client
        try:
            lease = client.CoordinationV1Api(self.h.client).read_namespaced_lease("hyperplan-leader", "default",
                                                                                   _request_timeout=3)
            return lease.spec.holder_identity or ""
        except Exception:  # noqa: BLE001 - the API server may be restarting
            return None

    def api_list(self, path: str) -> list[dict]:
        return self.h.api.get(path, timeout=10)["items"]

    def retry(self, fn: Callable[[], object], what: str, timeout: float = 60) -> object:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return fn()
            except Exception as e:  # noqa: BLE001 - the API server may be restarting
                if time.monotonic() > deadline:
                    raise BenchError(f"{what} failed for {timeout:.0f}s: {e}") from e
                time.sleep(0.5)

    def expect(self, e: Expectation) -> None:
        with self.exp_lock:
            self.expectations.append(e)
        step(f"expect [{e.kind}] {e.group}: {e.desc} within {CONVERGE_S:.0f} s")

    # -- supervisor: the kubelet's part

    def supervise(self) -> None:
        while not self.done.is_set():
            for r in self.replicas:
                if not r.held and r.proc is not None and not r.alive():
                    self.self_exits += 1
                    step(f"supervisor: {r.identity} exited by itself (code {r.proc.returncode}; "
                         f"{(r.lines('lost the lease') or ['no lost-lease line'])[-1][-90:]}); starting it again")
                    r.start()
            time.sleep(0.3)

    # -- snapshot checks after each fault

    def snapshot_check(self, label: str, final: bool = False) -> int:
        """Every invariant against fresh lists from the API server; returns violations found."""
        before = len(self.cluster.violations)
        g = "/apis/hyperplan.dev/v1alpha1"
        nodes = self.retry(lambda: self.api_list("/api/v1/nodes"), "listing nodes")
        groups = self.retry(lambda: self.api_list(f"{g}/instancegroups"), "listing groups")
        pools = self.retry(lambda: self.api_list(f"{g}/capacitypools"), "listing pools")
        plans = self.retry(lambda: self.api_list(f"{g}/trainingplans"), "listing plans")
        ran = []
        # 1. slots
        for text in inv.slot_conflicts(nodes):
            self.cluster.violate("two live nodes in one slot", text, text.split(": ", 1)[1].split(", "))
        ran.append("slots")
        # 2. orphans: confirmed by reading the node and its group again (the two lists are not atomic)
        for text in inv.orphaned_nodes(nodes, groups, allow_deleting=not final):
            node = text.split()[1]
            group = text.split("group ")[1].split(",")[0]
            time.sleep(1)
            still = self.retry(lambda: self._exists(f"/api/v1/nodes/{node}"), "reading a node")
            g_obj = self.retry(lambda: self._get_or_none(f"{g}/instancegroups/{group}"), "reading a group")
            if still and (g_obj is None or (final and g_obj["metadata"].get("deletionTimestamp"))):
                self.cluster.violate("node without a live group", text, [node, group])
        ran.append("orphans")
        # 3. ledger within capacity
        for p in pools:
            for text in inv.ledger_overbooking(p):
                self.cluster.violate("ledger above capacity", text, [p["metadata"]["name"]])
        ran.append("ledger")
        # 4. no plan bought twice: a mismatch must outlast SETTLE_S
        deadline = time.monotonic() + SETTLE_S
        mismatches = inv.ledger_mismatches(plans, pools, utcnow())
        while mismatches and time.monotonic() < deadline:
            time.sleep(1)
            pools = self.retry(lambda: self.api_list(f"{g}/capacitypools"), "listing pools")
            plans = self.retry(lambda: self.api_list(f"{g}/trainingplans"), "listing plans")
            mismatches = inv.ledger_mismatches(plans, pools, utcnow())
        for text in mismatches:
            self.cluster.violate("plan and ledger disagree", text, [text.split()[1].strip(":")])
        ran.append("purchases")
        # 5. promotions: the watch history (every node version seen so far)
        ran.append(f"promotions ({self.cluster.promotions.promotions} seen)")
        # 6. final only: nodes only where a group holds a usable block
        if final:
            for node in nodes:
                labels = node["metadata"].get("labels") or {}
                if inv.LABEL_GROUP not in labels:
                    continue
                grp = next((x for x in groups if x["metadata"]["name"] == labels[inv.LABEL_GROUP]), None)
                block = ((grp or {}).get("status") or {}).get("reservedCapacityId")
                if grp is not None and (block != labels.get(inv.LABEL_RESERVED_CAPACITY)
                                        or grp["status"].get("phase") not in ("Ready", "Provisioning")):
                    self.cluster.violate("node outside its group's usable block",
                                         f"node {node['metadata']['name']} on block "
                                         f"{labels.get(inv.LABEL_RESERVED_CAPACITY)}; group {grp['metadata']['name']} "
                                         f"is {grp['status'].get('phase')} on {block}", [node["metadata"]["name"]])
            ran.append("stray nodes")
        for name in ran:
            self.snapshot_checks[name.split(" ")[0]] += 1
        found = len(self.cluster.violations) - before
        step(f"check after {label}: {', '.join(ran)}: {'ok' if not found else f'{found} VIOLATION(S)'} "
             f"({len(nodes)} nodes, {len(groups)} groups, {len(plans)} plans)")
        return found

    def _exists(self, path: str) -> bool:
        return self._get_or_none(path) is not None

    def _get_or_none(self, path: str) -> dict | None:
        try:
            return self.h.api.get(path, timeout=5)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    # -- faults

    def lost_without_plane_fault(self, lost: list[str], plane_at: list[float]) -> int:
        """Lost-lease exits with no API server or etcd restart in the 20 s before them."""
        n = 0
        for stamp in lost:
            t = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=timezone.utc).timestamp() - self.t_start
            if not any(0 <= t - p <= 20 + 20 for p in plane_at):  # a restart takes up to ~20 s itself
                n += 1
        return n

    def wait_leader(self, timeout: float = 60) -> Replica | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.done.is_set():
            name = self.holder()
            r = next((r for r in self.replicas if r.identity == name), None)
            if r is not None and r.alive() and r.lines("leading as", this_start=True):
                return r
            time.sleep(0.3)
        return None

    def kill_leader(self) -> None:
        leader = self.wait_leader()
        if leader is None:
            step("no live leader within 60 s; skipping this kill")
            self.faults["kill skipped (no leader)"] += 1
            return
        other = next(r for r in self.replicas if r is not leader)
        at_once = self.rng.random() < 0.5
        self.fault_no += 1
        leader.held = True
        try:
            t = self.el()
            leader.kill9()
            if at_once:
                leader.start()
                self.faults["kill -9 leader, restarted at once"] += 1
                how = "restarted at once (same identity)"
            else:
                took = None
                t_kill = time.monotonic()
                while time.monotonic() - t_kill < LEASE + 30:
                    if self.holder() == other.identity:
                        took = time.monotonic() - t_kill
                        break
                    time.sleep(0.1)
                leader.start()
                self.faults["kill -9 leader, standby takes over"] += 1
                how = (f"standby {other.identity} took the lease {took:.1f} s later; restarted as standby"
                       if took is not None else "standby did NOT take the lease within lease + 30 s; restarted")
                if took is None:
                    self.errors.append(f"fault #{self.fault_no}: {how}")
        finally:
            leader.held = False
        back = self.wait_leader(60)
        lead = self.el() - t
        step(f"fault #{self.fault_no} at {t:.1f} s: kill -9 leader {leader.identity}; {how}; "
             + (f"{back.identity} leads {lead:.1f} s after the kill" if back else "NO leader 60 s after the kill"))
        self.fault_log.append((t, f"kill -9 {leader.identity}", lead))
        self.handovers.append(("at once" if at_once else "standby", lead))
        self.snapshot_check(f"fault #{self.fault_no} (kill -9 {leader.identity})")

    def restart_plane(self, name: str, how: signal.Signals) -> None:
        self.fault_no += 1
        t = self.el()
        step(f"fault #{self.fault_no} at {t:.1f} s: restarting {name} ({how.name})")
        took = self.h.plane.restart(name, how)
        self.faults[f"{name} restart"] += 1
        self.fault_log.append((t, f"{name} restart ({how.name})", took))
        step(f"fault #{self.fault_no}: {name} serving again after {took:.1f} s")
        self.snapshot_check(f"fault #{self.fault_no} ({name} restart)")

    def fault_loop(self) -> None:
        """30+ kills of the leader, and the plane restarts after a quarter, half and three quarters.

        Each kill waits until a replica leads, then either kills it within 1.5 s (``--early``
        share of the kills: during kopf's start) or waits for its first finished reconcile pass
        and lets it act 0-4 s more, or aims at a workload moment close by (a block start, a
        failure's grace end).
        """
        kills = self.args.kills
        plane_faults = [(kills // 4, "kube-apiserver", signal.SIGKILL), (kills // 2, "etcd", signal.SIGTERM),
                        (3 * kills // 4, "kube-apiserver", signal.SIGTERM)]
        done_kills = 0
        try:
            while not self.done.is_set() and done_kills < kills:
                if plane_faults and done_kills >= plane_faults[0][0]:
                    _, name, how = plane_faults.pop(0)
                    self.restart_plane(name, how)
                    continue
                leader = self.wait_leader()
                if leader is None:
                    step("no live leader within 60 s before a kill")
                early = self.rng.random() < self.args.early
                if leader is not None and not early:
                    # Let it act: kopf's start under load takes seconds before the first pass.
                    deadline = time.monotonic() + 30
                    while leader.alive() and leader.reconciles() < 1 and time.monotonic() < deadline \
                            and not self.done.is_set():
                        time.sleep(0.2)
                acting = self.rng.uniform(0, 1.5) if early else self.rng.uniform(0, 4)
                soon = [a for a in self.aim_at if 0 < a - now_s() < 8]
                if soon and self.rng.random() < 0.6:
                    acting = soon[0] - now_s() + self.rng.uniform(-0.5, 1.0)
                    self.aim_at.remove(soon[0])
                    step(f"next kill aimed at a workload moment in {acting:.1f} s")
                self.done.wait(max(0.0, acting))
                if self.done.is_set():
                    break
                self.kill_leader()
                done_kills += 1
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"fault thread: {type(e).__name__}: {e}")
            step(f"fault thread failed: {e}")
        finally:
            self.faults_over.set()
            step(f"faults over at {self.el():.1f} s")

    # -- the workload

    def block_of(self, plan: str) -> list[dict]:
        p = self.cluster.one("trainingplans", plan)
        return ((p or {}).get("status") or {}).get("reservedCapacity") or []

    def group_nodes(self, group: str) -> list[dict]:
        return [n for n in self.cluster.get("nodes")
                if (n["metadata"].get("labels") or {}).get(inv.LABEL_GROUP) == group]

    def whole(self, g: GroupDef, block: str | None = None) -> str | None:
        obj = self.cluster.one("instancegroups", g.name)
        if obj is None:
            return "group not seen"
        nodes = self.group_nodes(g.name)
        why = inv.group_shortfall(obj, nodes, g.expected)
        if why is None and block is not None and any(
                (n["metadata"].get("labels") or {}).get(inv.LABEL_RESERVED_CAPACITY) != block for n in nodes):
            return "nodes on another block"
        return why

    def inject_failure(self, g: GroupDef) -> None:
        nodes = [n for n in self.group_nodes(g.name) if (n["metadata"].get("labels") or {}).get(inv.LABEL_ROLE) == "active"
                 and inv.live(n) and inv.node_ready(n)]
        failed = {f[1] for f in self.failures}
        nodes = [n for n in nodes if n["metadata"]["name"] not in failed]
        if not nodes:
            step(f"failure on {g.name}: no healthy active node to fail; skipped")
            return
        victim = self.rng.choice(sorted(nodes, key=lambda n: n["metadata"]["name"]))["metadata"]["name"]
        signal_at = float(int(now_s()) + 1)
        time.sleep(max(0.0, signal_at - now_s()) + 0.01)
        self.set_failed(victim, signal_at)
        self.failures.append((g.name, victim, signal_at))
        self.aim_at.append(signal_at + GRACE)
        step(f"failure on {g.name}: {victim} AcceleratedHardwareReady=False since {ts(datetime.fromtimestamp(signal_at, timezone.utc))}")
        last_said = [now_s()]

        def replaced() -> str | None:
            if self.cluster.one("nodes", victim) is not None:
                node = self.cluster.one("nodes", victim)
                conds = (node.get("status") or {}).get("conditions") or []
                if not any(c.get("type") == "AcceleratedHardwareReady" and c.get("status") == "False" for c in conds) \
                        and not inv.marked_unhealthy(node) and now_s() - last_said[0] > 2:
                    last_said[0] = now_s()
                    step(f"failure on {g.name}: {victim} lost its condition (a heartbeat wrote it back); set again")
                    # A heartbeat rendered before our patch wrote the old conditions back: the agent
                    # says so again, with the original failure time.
                    threading.Thread(target=self.set_failed, args=(victim, signal_at), daemon=True).start()
                return f"{victim} still there"
            return self.whole(g)

        self.expect(Expectation("failure", g.name, signal_at + GRACE, replaced,
                                f"{victim} replaced and the group whole again"))

    def set_failed(self, node: str, since: float) -> None:
        from kubernetes.client.rest import ApiException
        when = ts(datetime.fromtimestamp(since, timezone.utc))
        body = {"status": {"conditions": [{"type": "AcceleratedHardwareReady", "status": "False",
                                           "reason": "ChaosGpuFault", "message": "set by bench/chaos.py",
                                           "lastHeartbeatTime": when, "lastTransitionTime": when}]}}

        def call() -> None:
            try:
                self.h.core.patch_node_status(node, body)
            except ApiException as e:
                if e.status != 404:  # gone already: replaced
                    raise

        self.retry(call, f"failing {node}", timeout=30)

    def create_group(self, g: GroupDef) -> None:
        from kubernetes.client.rest import ApiException

        def call() -> None:
            try:
                self.h.create("instancegroups", {
                    "apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": g.name},
                    "spec": {"trainingPlanRef": g.plan, "instanceType": g.itype, "instanceCount": g.count,
                             "nodeProvider": "kwok", "healthCheck": {"graceSeconds": GRACE, "maxUnhealthy": 2, "rebootBudget": 0}}})
            except ApiException as e:
                if e.status != 409:
                    raise

        self.retry(call, f"creating group {g.name}")
        self.created_groups.add(g.name)
        step(f"workload: plan {g.plan} bought; created group {g.name} ({g.count} nodes"
             + (f" + {g.expected.spares} spares)" if g.ultra else ")"))

    def delete_group(self, g: GroupDef) -> None:
        if g.name not in self.created_groups:
            step(f"workload: group {g.name} was never created (its plan was not bought); nothing to delete")
            return
        from kubernetes.client.rest import ApiException
        self.deleted_groups.add(g.name)
        self.cancel(g.name, "its group was deleted")

        def call():
            try:
                self.h.custom.delete_cluster_custom_object("hyperplan.dev", "v1alpha1", "instancegroups", g.name)
            except ApiException as e:
                if e.status != 404:
                    raise

        self.retry(call, f"deleting group {g.name}")
        step(f"workload: deleted group {g.name} ({len(self.group_nodes(g.name))} nodes)")
        self.expect(Expectation("group deleted", g.name, now_s(), lambda: (
            None if self.cluster.one("instancegroups", g.name) is None and not self.group_nodes(g.name)
            else f"{len(self.group_nodes(g.name))} nodes left"), "nodes drained and the group gone"))

    def cancel(self, group: str, why: str) -> None:
        """Drop what a group was expected to reach; one already past the bound is a violation."""
        with self.exp_lock:
            open_ = [e for e in self.expectations if e.group == group and e.took is None and not e.cancelled
                     and e.kind not in ("drain", "group deleted")]
            for e in open_:
                e.cancelled = True
        for e in open_:
            if now_s() - e.since > CONVERGE_S:
                self.cluster.violate("did not converge", f"[{e.kind}] {group}: {e.desc}: still {e.last_reason} "
                                     f"after {now_s() - e.since:.0f} s, when {why}", [group])

    def workload_loop(self, groups: list[GroupDef], other: list[tuple[float, str]], t0: float) -> None:
        """Block starts, failures, drains, deletions, as the plans' blocks come."""
        pending_failures: dict[tuple[str, str], list[float]] = {}
        todo = sorted([(g.delete_at, "delete", g) for g in groups if g.delete_at is not None]
                      + [(t, o, None) for t, o in other], key=lambda x: x[0])
        try:
            while not self.done.is_set():
                now = now_s()
                while todo and now - t0 >= todo[0][0]:
                    _, what, g = todo.pop(0)
                    if what == "delete":
                        self.delete_group(g)
                    elif isinstance(what, tuple):
                        body = what[1]
                        self.retry(lambda: self.h.create("trainingplans", body), "creating a plan")
                        step(f"workload: created plan {body['metadata']['name']} (the pools are busy now)")
                    elif what.startswith("delete plan"):
                        name = what.split()[-1]
                        self.retry(lambda: self.h.custom.delete_cluster_custom_object(
                            "hyperplan.dev", "v1alpha1", "trainingplans", name), f"deleting plan {name}")
                        step(f"workload: deleted plan {name} (its reservations go back to the pool)")
                for g in groups:
                    if g.name in self.deleted_groups:
                        continue
                    if g.name not in self.created_groups:
                        if self.block_of(g.plan):
                            self.create_group(g)
                        continue
                    for b in self.block_of(g.plan):
                        start, term = parse_ts(b["startTime"]).timestamp(), parse_ts(b["terminationTime"]).timestamp()
                        key = (g.name, b["id"])
                        if key not in self.block_seen and start <= now < term - 5:
                            self.block_seen.add(key)
                            self.expect(Expectation(
                                "block start", g.name, max(start, t0), lambda g=g, b=b: self.whole(g, b["id"]),
                                f"{g.expected.active} active + {g.expected.spares} spares on block {b['id']}"))
                            pending_failures[key] = [start + f for f in g.failures_at if start + f < term - 25]
                        elif key not in self.block_seen and now < start:
                            if start not in self.aim_added:
                                self.aim_added.add(start)
                                self.aim_at.append(start)
                        if key not in self.drain_seen and now >= term:
                            self.drain_seen.add(key)
                            self.cancel(g.name, f"block {b['id']} reached its termination time")
                            self.expect(Expectation(
                                "drain", g.name, term, lambda g=g, b=b: (None if not any(
                                    (n["metadata"].get("labels") or {}).get(inv.LABEL_RESERVED_CAPACITY) == b["id"]
                                    for n in self.group_nodes(g.name)) else "nodes of the block left"),
                                f"nodes of block {b['id']} drained by its end"))
                        due = pending_failures.get(key) or []
                        with self.exp_lock:
                            failing = any(e.group == g.name and e.kind == "failure" and e.took is None
                                          and not e.cancelled for e in self.expectations)
                        while len(due) > 1 and now >= due[1]:
                            due.pop(0)  # the group was not whole in time for this one: skip it
                        if due and now >= due[0] and not failing and self.whole(g, b["id"]) is None:
                            due.pop(0)  # only a whole group gets the next failure, so each is timed alone
                            self.inject_failure(g)
                time.sleep(0.2)
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"workload thread: {type(e).__name__}: {e}")
            step(f"workload thread failed: {type(e).__name__}: {e}")

    def monitor_loop(self) -> None:
        while not self.done.is_set():
            with self.exp_lock:
                pending = [e for e in self.expectations if e.took is None and not e.cancelled]
            for e in pending:
                t = now_s()
                if t < e.since:
                    continue
                try:
                    why = e.check()
                except Exception as ex:  # noqa: BLE001
                    why = f"check failed: {ex}"
                if why is None:
                    e.took = t - e.since
                    step(f"converged [{e.kind}] {e.group}: {e.desc} in {e.took:.1f} s"
                         + ("" if e.took <= bound(e) else f" (ABOVE the {bound(e):.0f} s bound)"))
                else:
                    e.last_reason = why
                    if t - e.since > GIVE_UP_S:
                        e.cancelled = True
                        self.cluster.violate("did not converge", f"[{e.kind}] {e.group}: {e.desc}: still {why} "
                                             f"after {GIVE_UP_S:.0f} s", [e.group])
            time.sleep(0.25)


def bound(e: Expectation) -> float:
    """Drains must be done by the block's end (the demo profile's hyperpod lead after the
    termination time); everything else within CONVERGE_S."""
    return DRAIN_S if e.kind == "drain" else CONVERGE_S


def stale_leader_actions(r: Replica) -> list[str]:
    """Actions a replica logged after it logged that it had lost the lease (same start)."""
    out, lost = [], None
    for ln in r.lines(""):
        if ln.startswith("---- chaos: start"):
            lost = None
        elif "lost the lease" in ln:
            lost = ln[:23]
        elif lost and ("hyperplan.instancegroup: group" in ln or "hyperplan.trainingplan: plan" in ln) \
                and "reconcile of" not in ln:
            out.append(f"{r.identity} lost the lease at {lost[11:]}, then logged: {ln[11:23]} {ln.split(': ', 1)[1][:160]}")
    return out


ONE_ACTOR_MARGIN = 1.0


def actions_by_a_non_holder(c: Chaos) -> list[str]:
    """Node writes a replica logged that the API shows happening while the Lease named another.

    For each NodeCreated / SparePromoted / NodeRemoved line in a replica's log, the watch gives the
    moment the change reached the API server (a node's first ADDED, its first version with
    ``hyperplan.dev/replaces``, its DELETED); if the Lease then had named another replica for more
    than ONE_ACTOR_MARGIN seconds, two replicas acted at once.
    """
    out = []
    for r in c.replicas:
        for ln in r.lines(""):
            if "hyperplan.instancegroup: group" not in ln:
                continue
            text = ln.split(": ", 1)[1] if ": " in ln else ln
            seen = None
            if ": NodeCreated: " in text:
                node = text.split(": NodeCreated: ")[1].split()[0]
                seen = c.cluster.node_created.get(node)
            elif ": SparePromoted: spare " in text:
                node = text.split(": SparePromoted: spare ")[1].split()[0]
                seen = c.cluster.node_promoted.get(node)
            elif ": NodeRemoved: " in text:
                node = text.split(": NodeRemoved: ")[1].split()[0]
                seen = c.cluster.node_deleted.get(node)
            if seen is None:
                continue
            holder, since = c.cluster.holder_at(seen)
            if holder and holder != r.identity and seen - since > ONE_ACTOR_MARGIN:
                out.append(f"{r.identity} logged {ln[11:23]} {text[:150]}; the API showed it at "
                           f"{datetime.fromtimestamp(seen, timezone.utc):%H:%M:%S.%f}"[:-3]
                           + f", {seen - since:.1f} s after the Lease named {holder}")
    return out


def main(h: Harness, args: argparse.Namespace) -> int:
    c = Chaos(h, args)
    for kind in ("nodes", "instancegroups", "trainingplans", "capacitypools"):
        on_event, on_list = c.cluster.handler(kind)
        path = "/api/v1/nodes" if kind == "nodes" else f"/apis/hyperplan.dev/v1alpha1/{kind}"
        h.watch(path, on_event, on_list=on_list)
    h.watch("/apis/coordination.k8s.io/v1/namespaces/default/leases", c.cluster.on_lease)
    for r in c.replicas:
        r.start()
    step(f"started replicas {', '.join(f'{r.identity} (pid {r.proc.pid})' for r in c.replicas)}; "
         f"lease {LEASE} s, renew deadline {RENEW} s, retry {RETRY} s")
    if c.wait_leader(90) is None:
        raise BenchError("no replica took the lease within 90 s")
    step(f"leader: {c.holder()}")

    t0 = utcnow()
    pools, timed_plans, groups, other = workload(t0)
    plans = [body for _, body in timed_plans]
    for body in pools:
        h.create("capacitypools", body)
    for at, body in timed_plans:
        if at == 0:
            h.create("trainingplans", body)
    other += [(at, ("create plan", body)) for at, body in timed_plans if at > 0]
    step(f"workload started: {len(pools)} pools, {sum(1 for a, _ in timed_plans if a == 0)} racing plans; "
         f"{sum(1 for a, _ in timed_plans if a > 0)} plans and {len(groups)} groups (once their plan is bought) to come")

    threads = [threading.Thread(target=c.supervise, daemon=True, name="supervisor"),
               threading.Thread(target=c.monitor_loop, daemon=True, name="monitor"),
               threading.Thread(target=c.workload_loop, args=(groups, other, t0.timestamp()), daemon=True,
                                name="workload")]
    for t in threads:
        t.start()
    time.sleep(args.warmup)
    faults = threading.Thread(target=c.fault_loop, daemon=True, name="faults")
    faults.start()
    try:
        faults.join()
        t_end = now_s()
        for g in groups:
            if g.name in c.deleted_groups:
                continue
            usable = [b for b in c.block_of(g.plan) if parse_ts(b["startTime"]).timestamp() <= t_end
                      < parse_ts(b["terminationTime"]).timestamp() - CONVERGE_S / 2]
            if usable:
                c.expect(Expectation("faults ended", g.name, t_end, lambda g=g, b=usable[0]: c.whole(g, b["id"]),
                                     f"whole on block {usable[0]['id']} after the last fault"))
        # Let the workload play out: the blocks that end within the run drain, every expectation
        # is met (or given up on).
        ends = [parse_ts(b["endTime"]).timestamp() for p in plans for b in c.block_of(p["metadata"]["name"])]
        finish = min(max([t_end, *[e for e in ends if e < t_end + args.tail]]) + 5, t_end + args.tail)
        step(f"faults over; letting the workload run until {finish - c.t_start:.0f} s")
        while True:
            with c.exp_lock:
                open_ = [e for e in c.expectations if e.took is None and not e.cancelled]
            if now_s() >= finish and not open_:
                break
            if now_s() > finish + GIVE_UP_S + 10:
                break
            time.sleep(0.5)
        c.snapshot_check("the end", final=True)
    finally:
        c.done.set()
        for r in c.replicas:
            r.held = True
        for r in c.replicas:
            r.stop()

    return report(c, groups)


def _med_max(values: list[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    return f"{ordered[len(ordered) // 2]:.1f} s / {ordered[-1]:.1f} s (n={len(values)})"


def report(c: Chaos, groups: list[GroupDef]) -> int:
    total = now_s() - c.t_start
    met = [e for e in c.expectations if e.took is not None]
    worst = max(met, key=lambda e: e.took, default=None)
    by_kind: dict[str, float] = {}
    for e in met:
        by_kind[e.kind] = max(by_kind.get(e.kind, 0.0), e.took)
    watch_checks = sum(c.cluster.checks.values())
    snap_checks = sum(c.snapshot_checks.values())
    kills = sum(v for k, v in c.faults.items() if k.startswith("kill -9"))
    violations = c.cluster.violations
    over = [e for e in met if e.took > bound(e)]
    stale = [a for r in c.replicas for a in stale_leader_actions(r)]
    two_actors = actions_by_a_non_holder(c)
    lost = [ln[:23] for r in c.replicas for ln in r.lines("lost the lease")]
    plane_at = [t for t, what, _ in c.fault_log if "restart" in what]
    rows = [("machine", machine(), "", "")]
    for kind, n in sorted(c.faults.items()):
        rows.append((f"faults: {kind}", str(n), "", ""))
    rows += [
        ("faults: kill -9 of the leader (total)", str(kills), f">= {c.args.kills}", verdict(kills >= c.args.kills)),
        ("kill -9 -> a replica leads again (median / max), restarted at once",
         _med_max([t for how, t in c.handovers if how == "at once"]), "", ""),
        ("kill -9 -> a replica leads again (median / max), standby takes over",
         _med_max([t for how, t in c.handovers if how == "standby"]), f"<= {LEASE + 2} s (lease + 2 s)", ""),
        ("replica exits on a lost lease (restarted, as a kubelet would)", str(c.self_exits), "", ""),
        ("node failures injected / promotions seen", f"{len(c.failures)} / {c.cluster.promotions.promotions}", "", ""),
        ("invariant checks after faults and at the end", f"{snap_checks} ({', '.join(f'{k} {v}' for k, v in sorted(c.snapshot_checks.items()))})", "", ""),
        ("invariant checks on watch events", str(watch_checks), "", ""),
        ("violations", str(len(violations)), "0", verdict(not violations)),
        ("convergence expectations met", f"{len(met)} of {len(c.expectations)} "
         f"({sum(1 for e in c.expectations if e.cancelled and e.took is None)} cancelled by a drain or deletion)", "", ""),
        ("worst convergence", f"{worst.took:.1f} s ({worst.kind}, {worst.group})" if worst else "n/a",
         f"<= {CONVERGE_S:.0f} s", verdict(worst is not None and not over)),
    ]
    for kind, t in sorted(by_kind.items()):
        b = DRAIN_S if kind == "drain" else CONVERGE_S
        rows.append((f"  worst after {kind}" + (" (from the termination time)" if kind == "drain" else ""),
                     f"{t:.1f} s", f"<= {b:.0f} s", verdict(t <= b)))
    rows += [("leader exits on a lost lease (all / with no plane restart in the 20 s before)",
              f"{len(lost)} / {c.lost_without_plane_fault(lost, plane_at)}", "", ""),
             ("actions logged by a replica after it logged the loss of its lease", str(len(stale)), "0",
              verdict(not stale)),
             ("node writes seen on the API while the Lease named another replica (> 1 s)", str(len(two_actors)),
              "0", verdict(not two_actors)),
             ("Lease holder changes seen on the watch", str(len(c.cluster.holders) - 1), "", "")]
    rows += [("total run time (plane, workload, faults, checks)", f"{total:.0f} s", "< 600 s", verdict(total < 600)),
             ("fault-thread or workload errors", str(len(c.errors)), "0", verdict(not c.errors))]
    print_figures("chaos", rows)
    for v in violations:
        print(f"violation at {v.t:.1f} s: {v.what}: {v.text}")
        for ln in v.excerpt:
            print(f"    {ln[:300]}")
    for e in c.errors:
        print(f"error: {e}")
    for a in stale:
        print(f"stale leader: {a}")
    for a in two_actors:
        print(f"two actors: {a}")
    for p in c.cluster.get("trainingplans"):
        st = p.get("status") or {}
        reason = next((f"{x.get('reason')}: {x.get('message', '')[:90]}" for x in st.get("conditions", [])
                       if x.get("status") == "False"), "")
        print(f"plan {p['metadata']['name']}: {st.get('phase')} "
              + ", ".join(f"{b['startTime'][11:19]}-{b['endTime'][11:19]} x{b['instanceCount']}"
                          for b in st.get("reservedCapacity") or []) + (f" ({reason})" if st.get("phase") == "Failed" else ""))
    tracebacks = sum(len(r.lines("Traceback")) for r in c.replicas)
    failed_passes = Counter()
    for r in c.replicas:
        for ln in r.lines("reconcile of"):
            failed_passes[ln.split("reconcile of ")[1].split()[0]] += 1
    print(f"failed reconcile passes (retried after 5 s; API server or etcd away): {dict(failed_passes)}")
    print(f"operator logs: {', '.join(str(r.log) for r in c.replicas)} ({tracebacks} tracebacks, "
          f"{sum(r.starts for r in c.replicas)} starts)")
    summary = {"faults": dict(c.faults), "kills": kills, "self_exits": c.self_exits, "snapshot_checks": snap_checks,
               "watch_checks": watch_checks, "violations": [v.__dict__ for v in violations],
               "worst_convergence": worst.took if worst else None, "worst_by_kind": by_kind,
               "total_s": total, "failures": len(c.failures), "promotions": c.cluster.promotions.promotions,
               "fault_log": c.fault_log, "errors": c.errors}
    (STATE / "chaos-summary.json").write_text(json.dumps(summary, indent=2, default=str))
    summary["stale_leader_actions"] = stale
    summary["two_actors"] = two_actors
    (STATE / "chaos-summary.json").write_text(json.dumps(summary, indent=2, default=str))
    ok = not violations and not c.errors and not stale and not two_actors and worst is not None and not over and kills >= c.args.kills and total < 600
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=30, help="kill -9 of the leader (at least)")
    ap.add_argument("--early", type=float, default=0.5, help="share of kills during the leader's start")
    ap.add_argument("--warmup", type=float, default=1, help="seconds between the workload and the first fault")
    ap.add_argument("--tail", type=float, default=90, help="at most this long after the faults for blocks to end")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock, printed)")
    args = ap.parse_args()
    if args.seed is None:
        args.seed = int(time.time()) % 100000
    step(f"chaos: seed {args.seed}")
    run(lambda h: main(h, args), "chaos", budget=900)
