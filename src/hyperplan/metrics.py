"""Prometheus metrics of the operator (prefix ``hyperplan_``), served on HYPERPLAN_METRICS_PORT.

Two kinds of metric live here:

- **Event metrics** (counters and histograms) that handlers update as things happen:
  reconciles, status writes, purchases, remediations, reboots and their results, transition
  lag, latencies (the time to recover among them).
- **Object metrics** (gauges per plan, group, pool and UltraServer) that are not stored as
  Prometheus samples: they are rendered at scrape time from :class:`ObservedObjects`, which
  keeps of each object only what its series show, updated on each watch event (a plan: its
  phase, five counts, its blocks' times and its UltraServers' counts; not its parsed status).
  A deleted object leaves that copy, so it leaves no stale series behind by construction, and
  time-relative values (seconds to a block's termination, what a pool has free now) are
  computed at the moment Prometheus asks. Cardinality is bounded by the objects: per plan 5
  phase series, per UltraServer 3 health and 6 count series, per pool 2 + 1, per group
  6 + 2 + 5 (its nodes' health states).

``serve`` answers ``/metrics`` with the registry's event metrics followed by the object
metrics written straight to the text format (:func:`render_object_metrics`), not through
``prometheus_client`` sample objects: at 10,000 plans that is about 120,000 series, which the
client's collector path took seconds to build on every scrape. One render serves every scrape
of the next HYPERPLAN_METRICS_CACHE_SECONDS (1 s), and the server bounds each request's time
and the connections it takes (:class:`MetricsServer`).
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple

from prometheus_client import (
    CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import ValidationError

from hyperplan.api.models import (
    InstanceGroupStatus, TrainingPlanStatus,
)
from hyperplan.api import vocabulary
from hyperplan.planning import offerings
from hyperplan.planning.naming import (
    HEALTH_PENDING_REBOOT, HEALTH_PENDING_REPLACEMENT, HEALTH_SCHEDULABLE, HEALTH_UNSCHEDULABLE, label_value,
)
from hyperplan.planning.nodefacts import is_unschedulable
from hyperplan.planning.recovery import REBOOT_RECOVERED, REBOOT_RESULTS

# --------------------------------------------------------------------------- event metrics

RECONCILES = Counter(
    "hyperplan_reconciles_total", "Reconcile passes, by kind and result.", ["kind", "result"])
RECONCILE_DURATION = Histogram(
    "hyperplan_reconcile_duration_seconds", "How long one reconcile pass took, by kind.", ["kind"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
STATUS_WRITES = Counter(
    "hyperplan_status_writes_total", "Status patches written, by kind.", ["kind"])
PURCHASES = Counter(
    "hyperplan_purchases_total", "Training-plan purchases, by result reason.", ["result"])
TRANSITION_LAG = Histogram(
    "hyperplan_transition_lag_seconds",
    "Delay between a scheduled block boundary and the reconcile that acted on it.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10))
LEADER = Gauge(
    "hyperplan_leader", "1 while this replica holds the leader Lease and acts, 0 while it stands by.")
REMEDIATIONS = Counter(
    "hyperplan_remediations_total", "Health remediation actions taken, by action.", ["action"])
GROUP_PROVISIONING = Histogram(
    "hyperplan_group_provisioning_seconds",
    "From a block's start to all of an instance group's active nodes Ready on it (phase Ready).",
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800))
SPARE_PROMOTION = Histogram(
    "hyperplan_spare_promotion_seconds",
    "From the end of a failed node's grace to a spare serving in its place.",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60))
REBOOTS = Counter(
    "hyperplan_reboots_total",
    "Reboots of failed nodes that ended, by result: recovered (back Ready with no fault left: it serves "
    "again), timeout (not back Ready within rebootTimeoutSeconds: replaced), failed (back Ready with its "
    "fault still there: replaced).", ["result"])
REBOOT_BUDGET_EXHAUSTED = Counter(
    "hyperplan_reboot_budget_exhausted_total",
    "Failed nodes the recovery ladder replaced because they failed again after rebootBudget reboots within "
    "rebootWindowSeconds, by instance group.", ["group"])
DEEP_HEALTH_CHECKS = Counter(
    "hyperplan_deep_health_checks_total",
    "Nodes whose deep health checks (onStartDeepHealthChecks, after the node was made or rebooted) ended, "
    "by result: passed (it serves), failed (it is replaced).", ["result"])
RECOVERY = Histogram(
    "hyperplan_recovery_seconds",
    "From a fault's first sight to the node or its replacement serving again, by action: reboot (the "
    "rebooted node serves again), promote (a spare serves in its place), replace (its replacement Ready).",
    ["action"], buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600))
ULTRASERVER_REPLACEMENTS = Counter(
    "hyperplan_ultraserver_replacements_total",
    "UltraServers whose groups' nodes moved to a free UltraServer of the block, by reason: "
    "FailuresBeyondSpares, ImpairedTooLong, UltraServerBought (to the one its plan bought in place of it, "
    "though replacements in place made it whole meanwhile); and NoFreeUltraServer each time a group first "
    "found none free for an UltraServer that could no longer hold its nodes.", ["reason"])
KARPENTER_LAUNCH_FAILURES = Counter(
    "hyperplan_karpenter_launch_failures_total",
    "A karpenter group's NodeClaims that did not launch, each counted once, by reason: Karpenter's, from the "
    "claim's Launched condition (e.g. LaunchFailed), or NodeClaimDeletedBeforeLaunch for a claim Karpenter "
    "deleted before it launched; and each time a group's own check first stopped its claims: NodeClassNotFound, "
    "NodeClassNotReady, NotOffered (its instance type or zone).", ["reason"])
REMOTE_CALLS = Counter(
    "hyperplan_remote_calls_total",
    "Calls to a remote SageMaker endpoint (a pool's spec.source), by operation and result (ok, or the "
    "error code the endpoint or the client gave).", ["operation", "result"])
REMOTE_CALL_DURATION = Histogram(
    "hyperplan_remote_call_duration_seconds", "How long one call to a remote SageMaker endpoint took "
    "(boto3's own retries included), by operation.", ["operation"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))

# Known label values start at 0, so rates and panels have a series before the first event.
KINDS = ("TrainingPlan", "InstanceGroup")
REMEDIATION_ACTIONS = ("mark", "promote", "backfill", "remove", "reboot", "recover")
RECOVERY_ACTIONS = ("reboot", "replace", "promote")
for _kind in KINDS:
    RECONCILE_DURATION.labels(_kind)
    STATUS_WRITES.labels(_kind)
    for _result in ("ok", "error"):
        RECONCILES.labels(_kind, _result)
for _action in REMEDIATION_ACTIONS:
    REMEDIATIONS.labels(_action)
for _result in REBOOT_RESULTS:
    REBOOTS.labels(_result)
for _action in RECOVERY_ACTIONS:
    RECOVERY.labels(_action)
for _result in ("passed", "failed"):
    DEEP_HEALTH_CHECKS.labels(_result)
for _reason in (vocabulary.REASON_CLAIM_DELETED, vocabulary.REASON_NODE_CLASS_NOT_FOUND,
                vocabulary.REASON_NODE_CLASS_NOT_READY, vocabulary.REASON_NOT_OFFERED):
    KARPENTER_LAUNCH_FAILURES.labels(_reason)  # hyperplan's own reasons; Karpenter's appear when seen
for _reason in ("FailuresBeyondSpares", "ImpairedTooLong", "UltraServerBought", "NoFreeUltraServer"):
    ULTRASERVER_REPLACEMENTS.labels(_reason)
PURCHASES.labels("Purchased")
PURCHASES.labels("UltraServerAdded")  # an UltraServer bought for the rest of a block (planning.plans)
REMOTE_OPERATIONS = ("SearchTrainingPlanOfferings", "CreateTrainingPlan", "DescribeTrainingPlan", "ListTrainingPlans")
for _operation in REMOTE_OPERATIONS:
    REMOTE_CALLS.labels(_operation, "ok")
    REMOTE_CALL_DURATION.labels(_operation)

# Group -> the block whose provisioning was already observed (once per group and block).
_provisioned: dict[str, str] = {}
_provisioned_lock = threading.Lock()


def observe_group_pass(group: str, prior: InstanceGroupStatus, status: InstanceGroupStatus,
                       block_start: datetime | None, now: datetime) -> None:
    """Observe provisioning latency when ``group`` first reaches phase Ready on a block.

    Once per group and block: a group that is whole again after a failure is remediation,
    not provisioning. The memory is in-process; after a restart a group already Ready is
    not observed again (its prior status says Ready), one still provisioning is.
    """
    REBOOT_BUDGET_EXHAUSTED.labels(group)  # 0 from the group's first pass on: its panel has a series
    block = status.reserved_capacity_id
    if status.phase != "Ready" or block is None or block_start is None:
        return
    with _provisioned_lock:
        if _provisioned.get(group) == block:
            return
        _provisioned[group] = block
    if prior.phase == "Ready" and prior.reserved_capacity_id == block:
        return  # already Ready before this process saw it
    GROUP_PROVISIONING.observe(max(0.0, (now - block_start).total_seconds()))


def observe_spare_promotion(grace_ended: datetime | None, now: datetime, fault_since: datetime | None = None) -> None:
    """A spare now serves in place of a node whose grace ended at ``grace_ended``, its fault first
    seen at ``fault_since``."""
    if grace_ended is not None:
        SPARE_PROMOTION.observe(max(0.0, (now - grace_ended).total_seconds()))
    observe_recovery("promote", fault_since, now)


def observe_recovery(action: str, fault_since: datetime | None, serving: datetime | None) -> None:
    """The node (or what took its place) serves again at ``serving`` after ``action``, its fault
    first seen at ``fault_since`` (either unknown: nothing to observe, e.g. a record from before
    the operator kept the first sight)."""
    if fault_since is not None and serving is not None:
        RECOVERY.labels(action).observe(max(0.0, (serving - fault_since).total_seconds()))


def observe_recovered(fault_since: datetime | None, now: datetime) -> None:
    """A rebooted node is back and serves again at ``now``."""
    REBOOTS.labels(REBOOT_RECOVERED).inc()
    observe_recovery("reboot", fault_since, now)


def observe_mark(group: str, reboot_result: str | None, over_budget: bool) -> None:
    """A failed node of ``group`` marked for what the ladder does next: the end of a reboot that
    did not help (``reboot_result``), or a replacement past the reboot budget."""
    if reboot_result is not None:
        REBOOTS.labels(reboot_result).inc()
    if over_budget:
        REBOOT_BUDGET_EXHAUSTED.labels(group).inc()


def forget_group(group: str) -> None:
    with _provisioned_lock:
        _provisioned.pop(group, None)
    with contextlib.suppress(KeyError):
        REBOOT_BUDGET_EXHAUSTED.remove(group)


# --------------------------------------------------------------------------- object metrics

PLAN_PHASES = ("Pending", "Scheduled", "Active", "Expired", "Failed")
PLAN_COUNTS = ("total", "in_use", "available", "spare", "unhealthy")
ULTRASERVER_STATUSES = ("ok", "impaired", "insufficient-data")
ULTRASERVER_COUNTS = ("total", "in_use", "available", "spare", "configured_spare", "unhealthy")
GROUP_STATES = ("desired", "ready", "spare", "unhealthy", "present")
REBOOTING = "rebooting"
NODE_HEALTH_STATES = (HEALTH_SCHEDULABLE, HEALTH_UNSCHEDULABLE, HEALTH_PENDING_REBOOT, HEALTH_PENDING_REPLACEMENT,
                      REBOOTING)
POOL_STATES = ("sold", "free")

# name -> (help, label names): every family ObjectMetrics serves, with or without samples.
OBJECT_FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "hyperplan_training_plans": ("Training plans, by phase.", ("phase",)),
    "hyperplan_training_plan_phase": (
        "1 for the plan's current phase, 0 for the others (one series per plan and phase).",
        ("plan", "phase")),
    "hyperplan_training_plan_instances": (
        "Instance counts of a plan's current (or next) block: total, in_use, available, spare "
        "(available spares), unhealthy.", ("plan", "count")),
    "hyperplan_training_plan_seconds_to_termination": (
        "Seconds until the termination time of the plan's active block (negative once it passed, "
        "until the block ends); absent without an active block.", ("plan",)),
    "hyperplan_training_plan_seconds_to_next_block_start": (
        "Seconds until the plan's next block starts; absent when no block is ahead.", ("plan",)),
    "hyperplan_ultraserver_health": (
        "1 for the UltraServer's health status (ok, impaired, insufficient-data), 0 for the others.",
        ("plan", "ultraserver", "status")),
    "hyperplan_ultraserver_instances": (
        "Instance counts of an UltraServer of a plan's current (or next) block.",
        ("plan", "ultraserver", "count")),
    "hyperplan_capacity_pool_instances": (
        "Instances of a capacity pool sold (reservations and unavailable windows) and free now.",
        ("pool", "instance_type", "availability_zone", "state")),
    "hyperplan_capacity_pool_seconds_until_free": (
        "Seconds until the pool next has room for one more instance (one whole UltraServer for an "
        "UltraServer pool); 0 when it has room now.", ("pool", "instance_type", "availability_zone")),
    "hyperplan_instance_group_nodes": (
        "Nodes of an instance group: desired, ready (active and Ready), spare (Ready), unhealthy "
        "(from its status) and present (nodes that exist, draining ones included).", ("group", "state")),
    "hyperplan_instance_group_node_health": (
        "Nodes of an instance group by health: the node's health label (either key; none counts as "
        "Schedulable): Schedulable, Unschedulable, UnschedulablePendingReboot, "
        "UnschedulablePendingReplacement; and rebooting, the nodes with a reboot under way by the group's "
        "record that are UnschedulablePendingReboot too.", ("group", "state")),
    "hyperplan_instance_group_remediation_blocked": (
        "1 while maxUnhealthy stops remediation of a group (RemediationAllowed=False), else 0.", ("group",)),
    "hyperplan_instance_group_info": (
        "1 per instance group, labelled with the training plan it is bound to.", ("group", "plan")),
}


@dataclass(frozen=True)
class _Group:
    plan: str
    status: InstanceGroupStatus


class _Plan(NamedTuple):
    """What a plan's series show, and nothing else (a parsed status with its offerings would
    cost kilobytes per plan): its phase and blocks, and its fixed series already in the text
    format, written once per watch event instead of once per scrape."""

    phase: str | None
    counts: tuple[int, int, int, int, int]  # in PLAN_COUNTS order
    blocks: tuple[tuple[datetime, datetime, datetime | None], ...]  # (start, end, termination) by start
    ultra_servers: tuple[tuple[str, str, tuple[int, ...]], ...]  # (id, health, counts in ULTRASERVER_COUNTS order)
    text: tuple[str, str, str, str] = ("", "", "", "")  # phase, instances, UltraServer health and counts

    @classmethod
    def of(cls, name: str, st: TrainingPlanStatus) -> "_Plan":
        blocks = tuple(sorted(((b.start_time, b.end_time, b.termination_time) for b in st.reserved_capacity),
                              key=lambda b: b[0]))
        uss = tuple((us.id, us.health_status, (
            us.total_instance_count, us.in_use_instance_count, us.available_instance_count,
            us.available_spare_instance_count, us.configured_spare_instance_count, us.unhealthy_instance_count))
            for us in st.ultra_servers)
        counts = (st.total_instance_count, st.in_use_instance_count, st.available_instance_count,
                  st.available_spare_instance_count, st.unhealthy_instance_count)
        return cls(st.phase, counts, blocks, uss, _plan_text(name, st.phase, counts, uss))


def _plan_text(name: str, phase: str | None, counts: tuple[int, ...],
               ultra_servers: tuple[tuple[str, str, tuple[int, ...]], ...]) -> tuple[str, str, str, str]:
    plan = _escape(name)
    phases = "".join(f'hyperplan_training_plan_phase{{plan="{plan}",phase="{p}"}} {"1.0" if phase == p else "0.0"}\n'
                     for p in PLAN_PHASES)
    instances = "".join(f'hyperplan_training_plan_instances{{plan="{plan}",count="{c}"}} {float(v)!r}\n'
                        for c, v in zip(PLAN_COUNTS, counts))
    health = "".join(
        f'hyperplan_ultraserver_health{{plan="{plan}",ultraserver="{_escape(us)}",status="{s}"}} '
        f'{"1.0" if h == s else "0.0"}\n' for us, h, _ in ultra_servers for s in ULTRASERVER_STATUSES)
    us_counts = "".join(
        f'hyperplan_ultraserver_instances{{plan="{plan}",ultraserver="{_escape(us)}",count="{c}"}} {float(v)!r}\n'
        for us, _, vs in ultra_servers for c, v in zip(ULTRASERVER_COUNTS, vs))
    return phases, instances, health, us_counts


def _escape(value: str) -> str:
    """A label value as the text format writes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')




@dataclass
class ObservedObjects:
    """The operator's copy of its objects, fed by watch events (wiring.events).

    Written from the operator's event loop and read from the metrics server's thread, so
    every access takes the lock. Bodies that do not parse keep their last good copy out:
    a plan with an unreadable status counts as having no phase.
    """

    plans: dict[str, _Plan] = field(default_factory=dict)
    groups: dict[str, _Group] = field(default_factory=dict)
    pools: dict[str, offerings.PoolSnapshot] = field(default_factory=dict)
    nodes: dict[str, tuple[str, str]] = field(default_factory=dict)  # node name -> (its group, its health state)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def put_plan(self, name: str, body: dict[str, Any]) -> None:
        try:
            status = TrainingPlanStatus.model_validate(body.get("status") or {})
        except ValidationError:
            status = TrainingPlanStatus()
        plan = _Plan.of(name, status)
        with self._lock:
            self.plans[name] = plan

    def put_group(self, name: str, body: dict[str, Any]) -> None:
        try:
            status = InstanceGroupStatus.model_validate(body.get("status") or {})
        except ValidationError:
            status = InstanceGroupStatus()
        plan = (body.get("spec") or {}).get("trainingPlanRef") or ""
        with self._lock:
            self.groups[name] = _Group(plan, status)

    def put_pool_snapshot(self, name: str, snapshot: offerings.PoolSnapshot) -> None:
        """A pool as already parsed (by the watch cache, once per resourceVersion)."""
        with self._lock:
            self.pools[name] = snapshot

    def put_node(self, name: str, group: str | None, health: str | None = None) -> None:
        """A node of ``group`` (None: of none, or deleted) whose health label says ``health`` (the
        effective value of either key, planning.nodefacts)."""
        state = node_health_state(health)
        with self._lock:
            if group:
                self.nodes[name] = (group, state)
            else:
                self.nodes.pop(name, None)

    def drop(self, kind: str, name: str) -> None:
        with self._lock:
            getattr(self, kind).pop(name, None)

    def copy(self) -> "ObservedObjects":
        with self._lock:
            return ObservedObjects(dict(self.plans), dict(self.groups), dict(self.pools), dict(self.nodes))


def node_health_state(value: str | None) -> str:
    """A node's health label value as one of the first four :data:`NODE_HEALTH_STATES`: an
    ``Unschedulable*`` value not among them counts as Unschedulable, anything else as Schedulable."""
    if value in NODE_HEALTH_STATES[:4]:
        return value
    return HEALTH_UNSCHEDULABLE if is_unschedulable(value) else HEALTH_SCHEDULABLE


def _current_and_next(blocks: tuple[tuple[datetime, datetime, datetime | None], ...], now: datetime):
    """The block running at ``now`` and the next one to start (each ``(start, end, termination)``),
    from blocks ordered by start."""
    current = next((b for b in blocks if b[0] <= now < b[1]), None)
    upcoming = next((b for b in blocks if b[0] > now), None)
    return current, upcoming


def object_samples(view: ObservedObjects, now: datetime) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every object series at ``now``: family name -> [(labels, value)]. Pure."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {name: [] for name in OBJECT_FAMILIES}

    def add(family: str, value: float, **labels: str) -> None:
        out[family].append((labels, float(value)))

    by_phase = dict.fromkeys(PLAN_PHASES, 0)
    phases, instances = out["hyperplan_training_plan_phase"], out["hyperplan_training_plan_instances"]
    for plan, st in sorted(view.plans.items()):
        if st.phase in by_phase:
            by_phase[st.phase] += 1
        for phase in PLAN_PHASES:
            phases.append(({"plan": plan, "phase": phase}, 1.0 if st.phase == phase else 0.0))
        for count, value in zip(PLAN_COUNTS, st.counts):
            instances.append(({"plan": plan, "count": count}, float(value)))
        if st.blocks:
            current, upcoming = _current_and_next(st.blocks, now)
            if current is not None and current[2] is not None:
                add("hyperplan_training_plan_seconds_to_termination", (current[2] - now).total_seconds(), plan=plan)
            if upcoming is not None:
                add("hyperplan_training_plan_seconds_to_next_block_start",
                    (upcoming[0] - now).total_seconds(), plan=plan)
        for us_id, health, counts in st.ultra_servers:
            for status in ULTRASERVER_STATUSES:
                add("hyperplan_ultraserver_health", 1 if health == status else 0,
                    plan=plan, ultraserver=us_id, status=status)
            for count, value in zip(ULTRASERVER_COUNTS, counts):
                add("hyperplan_ultraserver_instances", value, plan=plan, ultraserver=us_id, count=count)
    for phase, n in by_phase.items():
        add("hyperplan_training_plans", n, phase=phase)

    for name, pool in sorted(view.pools.items()):
        where = {"pool": name, "instance_type": pool.instance_type, "availability_zone": pool.availability_zone}
        sold = min(pool.instance_count, offerings.busy_at(pool, now))
        add("hyperplan_capacity_pool_instances", sold, state="sold", **where)
        add("hyperplan_capacity_pool_instances", pool.instance_count - sold, state="free", **where)
        unit = vocabulary.ULTRASERVER_INSTANCES.get(pool.ultra_server_type or "", 1)
        free = offerings.free_intervals(pool, unit, now)
        if free:
            add("hyperplan_capacity_pool_seconds_until_free",
                max(0.0, (free[0][0] - now).total_seconds()), **where)

    present: dict[str, int] = {}
    by_health: dict[tuple[str, str], int] = {}
    for group, state in view.nodes.values():  # nodes carry the group's name as a label value
        present[group] = present.get(group, 0) + 1
        by_health[group, state] = by_health.get((group, state), 0) + 1
    for name, g in sorted(view.groups.items()):
        st = g.status
        for state, value in zip(GROUP_STATES, (st.desired_count, st.ready_count, st.spare_count,
                                               st.unhealthy_count, present.get(label_value(name), 0))):
            add("hyperplan_instance_group_nodes", value, group=name, state=state)
        # The group's record and the node's label come by two watches: a node back from its reboot
        # (its label Schedulable again) whose record still says rebooting counted twice in CI. A
        # node counts as rebooting only while both say so.
        rebooting = sum(1 for e in st.nodes or () if e.recovery is not None and e.recovery.rebooting_since is not None
                        and (label_value(name), HEALTH_PENDING_REBOOT) == view.nodes.get(e.name))
        for state in NODE_HEALTH_STATES:
            value = rebooting if state == REBOOTING else by_health.get((label_value(name), state), 0)
            add("hyperplan_instance_group_node_health", value, group=name, state=state)
        blocked = any(c.type == "RemediationAllowed" and c.status == "False" for c in st.conditions)
        add("hyperplan_instance_group_remediation_blocked", 1 if blocked else 0, group=name)
        add("hyperplan_instance_group_info", 1, group=name, plan=g.plan)
    return out


class ObjectMetrics(Collector):
    """Serves :data:`OBJECT_FAMILIES` from an :class:`ObservedObjects` at scrape time."""

    def __init__(self, observed: ObservedObjects, clock: Callable[[], datetime]) -> None:
        self.observed = observed
        self.clock = clock

    def _families(self) -> dict[str, GaugeMetricFamily]:
        return {name: GaugeMetricFamily(name, help_, labels=list(labels))
                for name, (help_, labels) in OBJECT_FAMILIES.items()}

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(self._families().values())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = self._families()
        for name, samples in object_samples(self.observed.copy(), self.clock()).items():
            labels = OBJECT_FAMILIES[name][1]
            for values, value in samples:
                families[name].add_metric([values[l] for l in labels], value)
        return iter(families.values())


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


_PLAN_TEXT_FAMILIES = ("hyperplan_training_plan_phase", "hyperplan_training_plan_instances",
                       "hyperplan_ultraserver_health", "hyperplan_ultraserver_instances")


_BATCH = 1000  # plans' lines per chunk written to the scrape's socket


def _batched(lines: Iterable[str]) -> Iterator[str]:
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) >= _BATCH:
            yield "".join(batch)
            batch = []
    if batch:
        yield "".join(batch)


def _to_boundaries(plans: list[tuple[str, _Plan]], now: datetime) -> tuple[list[str], list[str]]:
    """The lines of the seconds to each plan's termination and next block start, at ``now``."""
    to_termination: list[str] = []
    to_start: list[str] = []
    for name, st in plans:
        if not st.blocks:
            continue
        current, upcoming = _current_and_next(st.blocks, now)
        if current is not None and current[2] is not None:
            to_termination.append(f'hyperplan_training_plan_seconds_to_termination{{plan="{_escape(name)}"}} '
                                  f'{(current[2] - now).total_seconds()!r}\n')
        if upcoming is not None:
            to_start.append(f'hyperplan_training_plan_seconds_to_next_block_start{{plan="{_escape(name)}"}} '
                            f'{(upcoming[0] - now).total_seconds()!r}\n')
    return to_termination, to_start


def object_metrics_chunks(observed: ObservedObjects, now: datetime) -> Iterator[str]:
    """The object metrics in the Prometheus text format (0.0.4), in chunks, every family with
    its HELP and TYPE even without samples: what ``ObjectMetrics`` yields, written directly.

    A plan's fixed series are the text its last watch event wrote (:class:`_Plan`); only the
    seconds to its next boundaries are written now. The few pools and groups go through
    :func:`object_samples`. At 10,000 plans (about 100,000 lines) this takes a few tenths of a
    second, where the generic path (a dict per sample) took seconds, and chunks of 1,000 plans
    keep a scrape from holding all of its text at once."""
    view = observed.copy()
    plans = sorted(view.plans.items())
    view.plans = {}
    others = object_samples(view, now)
    to_termination, to_start = _to_boundaries(plans, now)
    by_phase = dict.fromkeys(PLAN_PHASES, 0)
    for _, st in plans:
        if st.phase in by_phase:
            by_phase[st.phase] += 1
    computed = {
        "hyperplan_training_plans": [f'hyperplan_training_plans{{phase="{phase}"}} {float(n)!r}\n'
                                     for phase, n in by_phase.items()],
        "hyperplan_training_plan_seconds_to_termination": to_termination,
        "hyperplan_training_plan_seconds_to_next_block_start": to_start,
    }
    for name, (help_, label_names) in OBJECT_FAMILIES.items():
        help_text = help_.replace("\\", "\\\\").replace("\n", "\\n")  # HELP escapes no quotes
        yield f"# HELP {name} {help_text}\n# TYPE {name} gauge\n"
        if name in _PLAN_TEXT_FAMILIES:
            i = _PLAN_TEXT_FAMILIES.index(name)
            yield from _batched(st.text[i] for _, st in plans if st.text[i])
        elif name in computed:
            yield from _batched(computed[name])
        else:
            yield from _batched(
                f"{name}{{{','.join(f'{k}={chr(34)}{_escape(labels[k])}{chr(34)}' for k in label_names)}}} {value!r}\n"
                for labels, value in others[name])


def render_object_metrics(observed: ObservedObjects, now: datetime) -> str:
    """:func:`object_metrics_chunks` as one text."""
    return "".join(object_metrics_chunks(observed, now))


OBSERVED = ObservedObjects()


def declared_families(registry: CollectorRegistry = REGISTRY) -> dict[str, tuple[str, set[str]]]:
    """Every ``hyperplan_`` family the registry declares: name -> (type, label names)."""
    out: dict[str, tuple[str, set[str]]] = {}
    for collector in list(registry._collector_to_names):  # noqa: SLF001 - no public listing
        describe = getattr(collector, "describe", None)
        for family in (describe() if describe else []):
            if family.name.startswith("hyperplan_"):
                labels = set(getattr(collector, "_labelnames", ()))
                if family.name in OBJECT_FAMILIES:
                    labels = set(OBJECT_FAMILIES[family.name][1])
                out[family.name] = (family.type, labels)
    if registry is REGISTRY:  # the object metrics are served beside the registry (see serve)
        out.update({name: ("gauge", set(labels)) for name, (_, labels) in OBJECT_FAMILIES.items()})
    return out


class RenderCache:
    """One render of the metrics shared by every scrape within ``seconds`` of its start, and by
    every scrape that waited for it (so N scrapers at once cost one render, even at 0 seconds).

    The render runs under the lock: a scrape that arrives during a render waits for that render
    rather than starting its own. The render is a list of byte chunks, not one joined text, so a
    cached render costs its text once, not twice.
    """

    def __init__(self, render: Callable[[], list[bytes]], seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._render = render
        self.seconds = seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._chunks: list[bytes] | None = None
        self._started = self._finished = float("-inf")

    def get(self) -> list[bytes]:
        asked = self._clock()
        with self._lock:
            now = self._clock()
            fresh = now - self._started < self.seconds or self._finished >= asked
            if self._chunks is None or not fresh:
                self._chunks = self._render()
                self._started, self._finished = now, self._clock()
            return self._chunks


def render_metrics() -> list[bytes]:
    """The registry's event metrics, then the object metrics of :data:`OBSERVED`, in chunks."""
    chunks = [generate_latest(REGISTRY)]
    chunks.extend(chunk.encode() for chunk in object_metrics_chunks(OBSERVED, _utcnow()))
    if len(OBSERVED.plans) >= 1000:  # what the render freed goes back (hyperplan.allocator)
        from hyperplan import allocator
        allocator.trim()
    return chunks


# What a connection past the cap gets, written without waiting, before the server closes it.
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
        b"Connection: close\r\nRetry-After: 1\r\n\r\nbusy\n")


class MetricsServer(ThreadingHTTPServer):
    """The ``/metrics`` server, bounded so that no client can make it cost the operator much.

    - **A deadline per request** (``timeout_seconds``): from the wait for a request's first byte
      to its response's last, whether the client is silent, trickles its request or does not read
      the body; past it the connection is shut down, and its thread is free. An idle keep-alive
      connection is closed after the same time (a scraper opens a new one).
    - **A shorter deadline for the headers** (``header_seconds``, at most the request's): a client
      that has not sent its request line and headers by then is shut down as well.
    - **A cap on connections** (``max_connections``): past it, the connection that has waited
      longest for its request line and headers is shut down to make room, so idle and half-sent
      connections cannot lock a scraper out; when every connection is being answered, a new one
      gets a 503 at once and is closed by the accepting thread, without a thread of its own.
    - **One render per** ``cache_seconds`` (:class:`RenderCache`), however many scrapers: a flood
      of scrapes must not compete for the interpreter with the Lease renewal thread, whose miss
      makes the process exit.
    """

    daemon_threads = True
    request_queue_size = 64  # socketserver's 5 drops the SYNs of scrapers that come together

    def __init__(self, address: tuple[str, int], *, timeout_seconds: float, max_connections: int,
                 cache_seconds: float, render: Callable[[], list[bytes]] = render_metrics,
                 header_seconds: float | None = None) -> None:
        super().__init__(address, _MetricsHandler)
        self.request_timeout = timeout_seconds
        self.header_timeout = min(timeout_seconds, header_seconds or timeout_seconds)
        self.renders = RenderCache(render, cache_seconds)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._waiting: dict[Any, None] = {}  # held connections not past their headers, oldest first
        self._waiting_lock = threading.Lock()

    EVICT_WAIT = 1.0  # how long the accepting thread waits for an evicted connection's slot

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            if not (self._evict() and self._slots.acquire(timeout=self.EVICT_WAIT)):
                self._refuse(request)
                return
        self.waiting(request, True)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.waiting(request, False)
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.waiting(request, False)
            self._slots.release()

    def waiting(self, request: Any, waits: bool) -> None:
        """``request``'s connection waits for a request's headers (or no longer does); one already
        waiting keeps its place (the time it has waited)."""
        with self._waiting_lock:
            if waits:
                self._waiting.setdefault(request, None)
            else:
                self._waiting.pop(request, None)

    def _evict(self) -> bool:
        """Shut down the connection that has waited longest for its headers (its thread then ends
        and frees its slot), of those with nothing unread (``serving.unread``: one whose request
        has just come is not chosen); False when there is none."""
        from hyperplan.serving import pending_bytes
        with self._waiting_lock:
            oldest = next((r for r in self._waiting if pending_bytes(r.fileno()) == 0), None)
            if oldest is None:
                return False
            del self._waiting[oldest]
        with contextlib.suppress(OSError):
            oldest.shutdown(socket.SHUT_RDWR)
        return True

    def _refuse(self, request: socket.socket) -> None:
        with contextlib.suppress(OSError):
            request.setblocking(False)
            request.send(BUSY)
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client cut at its deadline or gone in the middle of a body is not the server's error."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class _MetricsHandler(BaseHTTPRequestHandler):
    """``/metrics``: the registry's metrics, then the object metrics of :data:`OBSERVED`.

    The body is sent with HTTP/1.1 chunked transfer encoding, so that it ends by itself: the
    scraper does not depend on the connection's close to know the body is complete. That matters
    behind ``kubectl port-forward``, where the pod side's close does not reliably reach the local
    client (kubernetes/kubectl#1169): a close-delimited HTTP/1.0 body made Prometheus time out
    there. The connection stays open for the next scrape (keep-alive) within the server's deadline.
    """

    protocol_version = "HTTP/1.1"
    server: MetricsServer

    def setup(self) -> None:
        self.timeout = self.server.request_timeout  # no single read or write waits longer
        super().setup()

    def handle_one_request(self) -> None:
        deadline = threading.Timer(self.server.request_timeout, self._cut)
        deadline.daemon = True
        self._headers_due = threading.Timer(self.server.header_timeout, self._cut)
        self._headers_due.daemon = True
        deadline.start()
        self._headers_due.start()
        self.server.waiting(self.request, True)
        try:
            super().handle_one_request()
        finally:
            deadline.cancel()
            self._headers_due.cancel()

    def parse_request(self) -> bool:
        """The headers are in (read by ``parse_request``): the header deadline is met."""
        parsed = super().parse_request()
        self._headers_due.cancel()
        self.server.waiting(self.request, False)
        return parsed

    def _cut(self) -> None:
        """The request's deadline passed: wake the blocked read or write and end the connection."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.split("?")[0] not in ("/metrics", "/"):
            self.send_error(404)
            return
        chunks = self.server.renders.get()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for data in chunks:
            if data:  # an empty chunk would end the body
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, *_: Any) -> None:  # one line per scrape would drown the operator's log
        pass


def serve(port: int, address: str = "0.0.0.0", *, timeout_seconds: float = 10.0, max_connections: int = 8,
          cache_seconds: float = 1.0, render: Callable[[], list[bytes]] = render_metrics,
          header_seconds: float | None = None) -> MetricsServer | None:
    """Serve ``/metrics`` on ``address``:``port`` from a daemon thread (port 0: not at all);
    :class:`MetricsServer` says what the limits bound."""
    if not port:
        return None
    server = MetricsServer((address, port), timeout_seconds=timeout_seconds, max_connections=max_connections,
                           cache_seconds=cache_seconds, render=render, header_seconds=header_seconds)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
