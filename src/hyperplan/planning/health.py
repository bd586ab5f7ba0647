"""Node health verdicts and remediation plans for an instance group.

Pure: observations and ``now`` in, values out; no I/O, no clock, stdlib only. Modelled on
Cluster API's MachineHealthCheck (``healthCheckTargets``): detection returns a verdict
and the next moment worth looking again; remediation is a separate, bounded plan that the
handler carries out.

Signals
-------
A node is judged **unhealthy** when one of these signals has lasted at least
``HealthCheck.grace`` (measured from the signal's own start time, so a restart of the
operator does not reset the clock):

* ``Ready`` condition ``False`` or ``Unknown`` (since its ``lastTransitionTime``);
* a configured bad condition, e.g. ``AcceleratedHardwareReady=False`` (since its
  ``lastTransitionTime``);
* the health label (``hyperplan.dev/`` or ``sagemaker.amazonaws.com/node-health-status``)
  says ``Unschedulable*`` (since ``health_label_since``);
* the node was deleted from under the group (since ``deleted_since``);
* the node never reported a ``Ready`` condition within ``startup_timeout`` of ``created``
  (Cluster API's ``nodeStartupTimeout``);
* the node failed its deep health checks (``check_failed``, from the group's record,
  :mod:`hyperplan.planning.deepchecks`): judged at once, without a grace (the checks are the verdict).

A label or deletion whose start time the caller does not know (``None``) counts as having
started long ago: it is judged at once rather than never. A node whose signals clear
before their grace ends is simply healthy. A dead kubelet shows as ``Ready=Unknown``: the
node lifecycle controller sets it once the node's Lease is stale, so the operator does not
watch Leases itself (docs/design-decisions.md, "Node Leases").

Batching close deadlines
------------------------
``next_check`` is when to judge again: the earliest pending deadline, moved on to the last
pending deadline within :data:`HEALTH_BATCH_WINDOW` of it, so that failures whose graces end
a few milliseconds apart are judged in one pass and their writes go out together (in a storm a
pass's writes take seconds, and a failure left for the next pass waits for all of them). For
the same reason a node whose grace has just ended (less than the window ago) and whose
remediation has not started (it is not marked ``UnschedulablePendingReplacement`` yet) is
**held**: when another pending deadline falls within the window of that node's own grace end,
the node stays pending until that deadline, and both are judged then. This happens when
something else (an event) wakes the group between the two deadlines. Either way no node is
ever judged unhealthy before its own grace ends, and none is judged more than the window
after it.

Remediation
-----------
``max_unhealthy`` is a count or a percentage of the group's node count, rounded **down**
like Cluster API (``intstr`` with ``roundUp=false``): ``20%`` of 10 nodes is 2, of 4 nodes
0 - so small groups need an explicit count to remediate at all. Remediation is allowed
while the unhealthy count is at most that bound; above it nothing is done and the plan
says ``TooManyUnhealthy``.

A plan lists actions phase by phase, each phase in the failed nodes' name order:
``MarkUnhealthy`` (label ``UnschedulablePendingReplacement`` and the NoSchedule taint
:data:`UNHEALTHY_TAINT`), ``PromoteSpare`` (a spare takes over a failed active node: the
healthiest spare on the same UltraServer, else on another of the group's UltraServers; none
that is still in its deep health checks, and none for a failed node whose slot has its
replacement already), ``Backfill`` (a new node in the failed node's slot with the next generation: a spare on
UltraServer groups that promoted one, otherwise an active node) and ``RemoveNode``.
Backfill comes before RemoveNode on purpose (make before break): until the replacement
exists the failed node stays, cordoned, carrying its slot and generation, so a crash
between two steps never loses the generation and the replacement never reuses the failed
node's name. Without time left in the block there is no backfill, and the failed node
stays cordoned until the block drains. Each step is skipped when already done (label set,
a spare already carries ``hyperplan.dev/replaces=<failed node>``, replacement exists), so
repeating the plan after a partial run converges.

Evacuation
----------
Once a failed node's replacement serves, its pods leave before the node does
(:func:`evacuate`): they are evicted through the Eviction API (which gives each the
``DisruptionTarget`` condition, so a Job whose ``podFailurePolicy`` ignores that condition
spends no retry); on a dead node (``Ready`` not ``True``), whose kubelet cannot stop them, the
pods still there after ``dead_node_eviction_timeout`` are marked ``Failed`` with a
``DisruptionTarget`` condition of hyperplan's own (reason :data:`REASON_DELETED_BY_HYPERPLAN`)
and deleted at once. ``RemoveNode`` proceeds only when no pod is left, so no pod is ever shown
on a node that no longer exists. When the eviction started is kept on the node
(:data:`ANNOTATION_EVICTING_SINCE`), so a restart neither waits anew nor forces early.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from hyperplan.api.vocabulary import (  # noqa: F401  (the node memory's keys re-exported)
    ANNOTATION_EVICTING_SINCE, ANNOTATION_HEALTH_SINCE, REASON_DELETED_BY_HYPERPLAN, Unreadable, to_rfc3339,
)
from hyperplan.planning import reading
from hyperplan.planning import recovery
from hyperplan.planning.naming import (
    HEALTH_PENDING_REBOOT,
    HEALTH_PENDING_REPLACEMENT,
    HEALTH_UNSCHEDULABLE,
    ROLE_ACTIVE,
    ROLE_SPARE,
    UNHEALTHY_TAINT,
    Taint,
)
from hyperplan.planning.nodefacts import READY, NodeCondition, is_unschedulable, marked_for_replacement
from hyperplan.planning.placement import SlotState, UltraServer


# ---------------------------------------------------------------------------- memory on the node


def health_signal_record(value: str, since: datetime) -> str:
    """To the microsecond: the grace counts from the earlier of this record and the first sight,
    so a record cut to the whole second ended the grace up to a second early (bench/storm.py)."""
    return f"{value}@{to_rfc3339(since, micro=True)}"


def parse_health_signal_record(text: str | None) -> tuple[str, datetime] | None:
    """The (value, since) of a :data:`ANNOTATION_HEALTH_SINCE` value; None when missing or
    unreadable (:func:`hyperplan.planning.reading.read_health_signal_record`)."""
    try:
        return reading.read_health_signal_record(text) if text else None
    except Unreadable:
        return None


def health_label_since(value: str | None, recorded: str | None, first_seen: datetime) -> datetime | None:
    """When the grace of health label ``value`` started: the time recorded on the node for that
    same value (if it is earlier), else ``first_seen`` (this process's first sight)."""
    if not value:
        return None
    record = parse_health_signal_record(recorded)
    if record is not None and record[0] == value:
        return min(record[1], first_seen)
    return first_seen




def removed_by_operator(labels: Mapping[str, str], cordoned_by_operator: bool) -> bool:
    """Whether a node that was deleted had been put on its way out by the operator: cordoned by
    its drain (``cordoned_by_operator``: the group's record says so, ``status.nodes[].cordoned``;
    never an annotation on the node, which its kubelet could write) or marked for replacement
    (the label asks for the replacement that its deletion gets anyway). Both outlive a restart;
    anything else deleted from under a group is a failure."""
    return cordoned_by_operator or marked_for_replacement(labels)

REASON_TOO_MANY_UNHEALTHY = "TooManyUnhealthy"
REASON_INVALID_MAX_UNHEALTHY = "InvalidMaxUnhealthy"
SIGNAL_DELETED = "NodeDeleted"
SIGNAL_STARTUP_TIMEOUT = "NodeStartupTimeout"
SIGNAL_DEEP_CHECK_FAILED = recovery.SIGNAL_DEEP_CHECK_FAILED

HEALTH_BATCH_WINDOW = timedelta(milliseconds=500)
"""How late a failure may be judged so that it goes in one pass with a close one (see "Batching
close deadlines" in the module docstring). Never before a grace ends, at most this long after:
a storm labels many nodes within milliseconds, and a group pass that acted on one of them while
the next was a few milliseconds short of its grace left that one to wait seconds for the pass's
writes (docs/benchmarks.md 5.6). Small against any sensible grace (seconds to minutes)."""

DEFAULT_BAD_CONDITIONS: tuple[tuple[str, str], ...] = (
    ("AcceleratedHardwareReady", "False"),
    ("GpuHealthy", "False"),
)


@dataclass(frozen=True)
class NodeObservation:
    """One of the group's nodes (or an expected node that is gone) as the handler saw it.

    ``health_label`` is whichever of the hyperplan or SageMaker health labels says
    ``Unschedulable*`` (else either's value), ``health_label_since`` when it was first seen.
    ``slot``/``generation`` come from the node's ``hyperplan.dev/slot`` and
    ``hyperplan.dev/generation`` labels, ``replaces`` from ``hyperplan.dev/replaces`` (set on
    a promoted spare).
    """

    name: str
    exists: bool = True
    conditions: tuple[NodeCondition, ...] = ()
    health_label: str | None = None
    health_label_since: datetime | None = None
    role: str = ROLE_ACTIVE
    ultraserver_id: str | None = None
    deleted_since: datetime | None = None
    created: datetime | None = None
    slot: str | None = None
    generation: int = 0
    replaces: str | None = None
    pods_left: int | None = None  # pods a drain would wait for; None: not counted this pass
    # Kueue workloads (namespace/name) whose topology assignment still names the node: its removal
    # waits a while for Kueue to move them (see evacuate); only read for nodes being evacuated.
    assigned_by: tuple[str, ...] = ()
    evicting_since: datetime | None = None  # see ANNOTATION_EVICTING_SINCE
    # Its deep health checks (planning.deepchecks, by the group's record): running (it is no spare
    # to promote meanwhile), or failed at that time (a signal without grace).
    checking: bool = False
    check_failed: datetime | None = None

    def condition(self, type_: str) -> NodeCondition | None:
        for c in self.conditions:
            if c.type == type_:
                return c
        return None

    @property
    def ready(self) -> bool:
        c = self.condition(READY)
        return self.exists and c is not None and c.status == "True"


@dataclass(frozen=True)
class HealthCheck:
    grace: timedelta = timedelta(seconds=30)
    bad_conditions: tuple[tuple[str, str], ...] = DEFAULT_BAD_CONDITIONS
    max_unhealthy: int | str = "20%"
    startup_timeout: timedelta | None = timedelta(minutes=10)

    @classmethod
    def from_spec(cls, grace_seconds: int = 30, max_unhealthy: int | str = "20%",
                  unhealthy_conditions: Sequence[str] | None = None) -> HealthCheck:
        """From an InstanceGroup's ``spec.healthCheck`` (conditions as ``Type=Status``)."""
        bad = (DEFAULT_BAD_CONDITIONS if unhealthy_conditions is None
               else tuple(parse_condition_spec(c) for c in unhealthy_conditions))
        return cls(timedelta(seconds=grace_seconds), bad, max_unhealthy)


def parse_condition_spec(text: str) -> tuple[str, str]:
    """``"GpuHealthy=False"`` -> ``("GpuHealthy", "False")``; ``ValueError`` if malformed."""
    type_, sep, status = text.partition("=")
    if not sep or not type_.strip() or status.strip() not in ("True", "False", "Unknown"):
        raise ValueError(f"condition {text!r} is not Type=True|False|Unknown")
    return type_.strip(), status.strip()


@dataclass(frozen=True)
class HealthVerdict:
    """``unhealthy`` and ``healthy`` partition the nodes; ``pending`` lists the healthy
    nodes with a signal still inside its grace, or held (``held``: when each one's grace
    ended) to be judged with a close deadline; ``next_check`` when to judge them (``None``:
    nothing pending), see "Batching close deadlines" in the module docstring;
    ``grace_ended`` when the grace of each unhealthy node's signal ended (when known), and
    ``first_seen`` when that signal started (its first sight: the grace counts from it)."""

    unhealthy: Mapping[str, str]
    healthy: tuple[str, ...]
    pending: Mapping[str, str]
    next_check: datetime | None
    grace_ended: Mapping[str, datetime] = field(default_factory=dict)
    held: Mapping[str, datetime] = field(default_factory=dict)
    first_seen: Mapping[str, datetime] = field(default_factory=dict)


_Signal = tuple[str, datetime | None, timedelta]


def _signals(node: NodeObservation, check: HealthCheck) -> list[_Signal]:
    """(reason, since, timeout) of every current signal, in a fixed order."""
    if not node.exists:
        return [(SIGNAL_DELETED, node.deleted_since, check.grace)]
    out: list[_Signal] = []
    ready = node.condition(READY)
    if ready is not None and ready.status in ("False", "Unknown"):
        out.append((f"{READY}={ready.status}", ready.last_transition_time, check.grace))
    for type_, bad_status in check.bad_conditions:
        if type_ == READY and ready is not None and ready.status in ("False", "Unknown"):
            continue  # already covered
        c = node.condition(type_)
        if c is not None and c.status == bad_status:
            out.append((f"{type_}={bad_status}", c.last_transition_time, check.grace))
    if is_unschedulable(node.health_label):
        out.append((f"NodeHealthStatus={node.health_label}", node.health_label_since,
                    check.grace))
    if ready is None and check.startup_timeout is not None and node.created is not None:
        out.append((SIGNAL_STARTUP_TIMEOUT, node.created, check.startup_timeout))
    if node.check_failed is not None:
        out.append((SIGNAL_DEEP_CHECK_FAILED, node.check_failed, timedelta(0)))
    return out


def standing_faults(node: NodeObservation, check: HealthCheck) -> dict[str, datetime]:
    """The node's conditions in a bad status now (``Ready`` False or Unknown, a configured bad
    condition), by type, with their transition times: the faults whose first sight the recovery
    clocks keep (planning.recovery.clock_faults)."""
    bad = set(check.bad_conditions)
    return {c.type: c.last_transition_time for c in node.conditions
            if (c.type == READY and c.status in ("False", "Unknown")) or (c.type, c.status) in bad}


def evaluate_health(nodes: Sequence[NodeObservation], check: HealthCheck, now: datetime,
                    batch_window: timedelta = HEALTH_BATCH_WINDOW) -> HealthVerdict:
    """Judge every node at ``now`` (see the module docstring); ``batch_window``: see
    :data:`HEALTH_BATCH_WINDOW` (zero judges every node at its own deadline)."""
    unhealthy: dict[str, str] = {}
    grace_ended: dict[str, datetime] = {}
    first_seen: dict[str, datetime] = {}
    pending: dict[str, str] = {}
    deadlines: dict[str, datetime] = {}  # of the pending nodes: when the first signal's grace ends
    fresh: dict[str, datetime] = {}  # unhealthy, grace ended within the window, remediation not started
    healthy: list[str] = []
    for node in sorted(nodes, key=lambda n: n.name):
        expired: list[tuple[datetime | None, int, str, timedelta]] = []
        waiting: list[tuple[datetime, int, str]] = []
        for i, (reason, since, timeout) in enumerate(_signals(node, check)):
            deadline = None if since is None else since + timeout
            if deadline is None or deadline <= now:
                expired.append((deadline, i, reason, timeout))
            else:
                waiting.append((deadline, i, reason))
        if expired:
            # the signal that passed its grace first (unknown start = earliest)
            expired.sort(key=lambda e: (e[0] is not None, e[0] or now, e[1]))
            ended, reason = expired[0][0], expired[0][2]
            unhealthy[node.name] = reason
            if ended is not None:
                grace_ended[node.name] = ended
                first_seen[node.name] = ended - expired[0][3]
                if ended > now - batch_window and node.health_label != HEALTH_PENDING_REPLACEMENT:
                    fresh[node.name] = ended
            continue
        if waiting:
            waiting.sort()
            pending[node.name] = waiting[0][2]
            deadlines[node.name] = waiting[0][0]
        healthy.append(node.name)

    held: dict[str, datetime] = {}
    next_check = None
    if fresh:
        # Hold the fresh failures for a pending deadline within the window of the earliest of
        # them: acting then is at most the window late for each.
        next_check = batch_end(deadlines.values(), min(fresh.values()), batch_window)
        if next_check is not None:
            held = fresh
            for name in held:
                pending[name] = unhealthy.pop(name)
                del grace_ended[name], first_seen[name]
            healthy = sorted(healthy + list(held))
    if next_check is None and deadlines:
        next_check = batch_end(deadlines.values(), min(deadlines.values()), batch_window)
    return HealthVerdict(unhealthy, tuple(healthy), pending, next_check, grace_ended, held, first_seen)


def batch_end(deadlines: Iterable[datetime], anchor: datetime, window: timedelta) -> datetime | None:
    """The last of ``deadlines`` within ``window`` after ``anchor`` (None: none is): a pass then
    judges every one of them, none before its own deadline and none more than the window late.
    The window counts from the anchor, not from deadline to deadline, so a chain of close
    deadlines is cut at the window rather than stretched without end."""
    return max((d for d in deadlines if d <= anchor + window), default=None)


# --------------------------------------------------------------------------- circuit breaker


def max_unhealthy_limit(max_unhealthy: int | str, total: int) -> int:
    """The bound as a count: an int or ``"N"`` as is, ``"N%"`` of ``total`` rounded down.

    Raises ``ValueError`` for anything else (negative, ``"x%"``, a bool).
    """
    if isinstance(max_unhealthy, bool):
        raise ValueError(f"maxUnhealthy must be a count or a percentage, got {max_unhealthy!r}")
    if isinstance(max_unhealthy, int):
        value = max_unhealthy
    elif isinstance(max_unhealthy, str) and max_unhealthy.strip().endswith("%"):
        digits = max_unhealthy.strip()[:-1]
        if not digits.isdigit():
            raise ValueError(f"maxUnhealthy {max_unhealthy!r} is not a percentage such as 20%")
        return total * int(digits) // 100
    elif isinstance(max_unhealthy, str) and max_unhealthy.strip().isdigit():
        value = int(max_unhealthy.strip())
    else:
        raise ValueError(f"maxUnhealthy {max_unhealthy!r} is not a count or a percentage")
    if value < 0:
        raise ValueError(f"maxUnhealthy must be >= 0, got {value}")
    return value


def remediation_allowed(unhealthy_count: int, total: int,
                        max_unhealthy: int | str) -> tuple[bool, str]:
    """Whether ``unhealthy_count`` of ``total`` nodes may be remediated, and why (or why not)."""
    try:
        limit = max_unhealthy_limit(max_unhealthy, total)
    except ValueError as exc:
        return False, f"remediation paused: {exc}"
    spec = f"maxUnhealthy {max_unhealthy}" + (
        f" ({limit} of {total})" if isinstance(max_unhealthy, str) and "%" in max_unhealthy
        else "")
    if unhealthy_count > limit:
        return False, (f"{unhealthy_count} of {total} nodes are unhealthy, more than {spec} "
                       "allows; remediation paused")
    return True, f"{unhealthy_count} of {total} nodes are unhealthy, within {spec}"


# --------------------------------------------------------------------------- remediation


@dataclass(frozen=True)
class MarkUnhealthy:
    """Label the node ``hyperplan.dev/node-health-status=<health_status>`` and add ``taint``."""

    node: str
    reason: str
    health_status: str = HEALTH_PENDING_REPLACEMENT
    taint: Taint = UNHEALTHY_TAINT
    # For the metrics, not compared: how the reboot under way ended when this mark ends one
    # (planning.recovery.REBOOT_RESULTS), and whether the node is replaced past its reboot budget.
    reboot_result: str | None = field(default=None, compare=False)
    over_budget: bool = field(default=False, compare=False)
    # The health signal the node is marked for (``reason`` may say more, during a reboot): HyperPod's
    # fault labels are made from it (nodefacts.hyperpod_fault). None: ``reason`` is the signal.
    signal: str | None = field(default=None, compare=False)

    @property
    def fault(self) -> str:
        return self.signal or self.reason


@dataclass(frozen=True)
class PromoteSpare:
    """Make ``spare`` active in place of ``replacing``: role label ``active``, label
    ``hyperplan.dev/replaces=<replacing>``, spare taint removed."""

    spare: str
    replacing: str
    ultraserver_id: str | None
    same_ultraserver: bool
    # When the failed node's grace ended and its fault was first seen (for the latency
    # histograms); not compared.
    grace_ended: datetime | None = field(default=None, compare=False)
    fault_since: datetime | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Backfill:
    """Create the node for ``slot`` at ``generation`` with ``role`` (replacing a failed node).

    Feed :meth:`slot_state` into :func:`~hyperplan.planning.placement.desired_nodes` to get
    its name, labels and taints.
    """

    replacing: str
    slot: str
    generation: int
    role: str
    ultraserver_id: str | None

    def slot_state(self) -> SlotState:
        return SlotState(self.generation, self.role)


@dataclass(frozen=True)
class RemoveNode:
    node: str
    reason: str
    # For the time to recover (not compared): the first sight of the node's fault, and when its
    # replacement reported Ready (planning.groups sets it once the replacement serves).
    fault_since: datetime | None = field(default=None, compare=False)
    serving_since: datetime | None = field(default=None, compare=False)


@dataclass(frozen=True)
class EvictPods:
    """Evict the pods of failed ``node`` (its replacement serves). ``start``: the first attempt
    (record when it started); ``force``: the node is dead and its eviction deadline passed, so
    the pods still there are marked Failed with ``DisruptionTarget`` and deleted (grace 0)."""

    node: str
    reason: str
    start: bool = False
    force: bool = False


@dataclass(frozen=True)
class RebootNode:
    """Reboot ``node`` through its provider (planning.recovery): it goes NotReady and comes back
    under the same name. ``requested``: an admin asked for it (a health label)."""

    node: str
    reason: str
    requested: bool = False


@dataclass(frozen=True)
class RecoverNode:
    """``node`` is back from its reboot and healthy: its health label and taint go, and it serves
    again, as a spare when ``as_spare`` (a spare took over its work, or it was one)."""

    node: str
    as_spare: bool
    fault_since: datetime | None = field(default=None, compare=False)  # for the time to recover


Action = MarkUnhealthy | PromoteSpare | Backfill | EvictPods | RemoveNode | RebootNode | RecoverNode


EVICTION_RETRY = timedelta(seconds=1)
# While a node reboots its group is looked at this often, besides the wake its return should bring:
# in one recovery storm a group's pass ran only at its reboot's timeout, 50 s after its nodes were
# back (docs/benchmarks.md). A poll bounds what a missed wake costs.
REBOOT_POLL = timedelta(seconds=2)
# How long a failed node with no pod left is kept while a Kueue workload's topology assignment
# still names it, counted from the eviction's start (see evacuate).
KUEUE_MOVE_WAIT = timedelta(seconds=60)


@dataclass(frozen=True)
class Evacuation:
    """What :func:`evacuate` says about a failed node's pods."""

    action: EvictPods | None  # what to do this pass (None: nothing, the pods are gone)
    done: bool  # no pod left: the node may be removed
    next_check: datetime | None = None  # when to look again while pods remain


def evacuate(node: NodeObservation, reason: str, now: datetime, dead_node_timeout: timedelta) -> Evacuation:
    """The pods of failed ``node``, whose replacement serves (see the module docstring).

    Pods not counted yet (``pods_left`` None) are evicted; a count of 0 means done, unless a
    Kueue workload's topology assignment still names the node (``assigned_by``): then the node
    stays, and its pods are swept again each retry, until Kueue has moved the assignment or
    :data:`KUEUE_MOVE_WAIT` has passed since the eviction began. Kueue pins each new pod of a TAS
    workload to a node of its assignment; a pod pinned to a node that is gone stays Pending for
    good (Kueue v0.17 fails such a stray pod only while its node exists), so the node goes once
    nothing will be pinned there (docs/failover.md). A live node's pods are evicted until they
    are gone (a PodDisruptionBudget may hold them; the block's end drains what is left). A dead
    node's pods are forced out from ``evicting_since + dead_node_timeout`` on.
    """
    since = node.evicting_since
    if node.pods_left == 0:
        if not node.assigned_by:
            return Evacuation(None, True)
        if since is None:
            return Evacuation(EvictPods(node.name, reason, start=True), False, now + EVICTION_RETRY)
        if now >= since + KUEUE_MOVE_WAIT:
            return Evacuation(None, True)
        return Evacuation(EvictPods(node.name, reason), False, min(since + KUEUE_MOVE_WAIT, now + EVICTION_RETRY))
    if since is None:
        return Evacuation(EvictPods(node.name, reason, start=True), False, now + EVICTION_RETRY)
    if node.ready:
        return Evacuation(EvictPods(node.name, reason), False, now + EVICTION_RETRY)
    # Counted from the later of the eviction's start and the node's loss of Ready, so a node that
    # only just stopped answering (a kubelet restart) gets the whole timeout before its pods are
    # forced out: their containers may still run there.
    lost = max((c.last_transition_time for c in node.conditions if c.type == "Ready"), default=since)
    deadline = max(since, lost) + dead_node_timeout
    if now >= deadline:
        return Evacuation(EvictPods(node.name, reason, force=True), False, now + EVICTION_RETRY)
    return Evacuation(EvictPods(node.name, reason), False, min(deadline, now + EVICTION_RETRY))


@dataclass(frozen=True)
class RemediationPlan:
    allowed: bool
    actions: tuple[Action, ...]
    reason: str | None
    message: str
    unhealthy_count: int = 0
    # The recovery clocks the plan moves (by node id; planning.recovery), for the group's record.
    recovery: Mapping[str, recovery.RecoveryState] = field(default_factory=dict)
    next_check: datetime | None = None  # a reboot under way times out then
    rebooting: tuple[str, ...] = ()  # nodes with a reboot under way (after this plan)

    def slot_states(self) -> dict[str, SlotState]:
        """The slot states the plan's backfills create, for ``desired_nodes(slots=...)``."""
        return {a.slot: a.slot_state() for a in self.actions if isinstance(a, Backfill)}


def _pick_spare(failed: NodeObservation, nodes: Sequence[NodeObservation],
                verdict: HealthVerdict, taken: set[str],
                us_index: Mapping[str, int]) -> NodeObservation | None:
    candidates = [
        n for n in nodes
        if n.role == ROLE_SPARE and n.exists and n.name not in taken and not n.checking
        and n.name not in verdict.unhealthy and n.name not in verdict.held  # held: its grace has ended
    ]
    if not candidates:
        return None

    def rank(n: NodeObservation) -> tuple:
        return (
            n.ultraserver_id != failed.ultraserver_id,  # same UltraServer first
            n.name in verdict.pending,                  # then the healthiest
            not n.ready,
            us_index.get(n.ultraserver_id or "", len(us_index)),
            n.ultraserver_id or "",
            n.name,
        )

    return min(candidates, key=rank)


def plan_remediation(
    verdict: HealthVerdict,
    nodes: Sequence[NodeObservation],
    ultraservers: Sequence[UltraServer] = (),
    *,
    block_has_time_left: bool,
    uses_spares: bool,
    max_unhealthy: int | str = "20%",
    ladder: recovery.Ladder = recovery.REPLACE_ONLY,
    clocks: Mapping[str, recovery.RecoveryState] | None = None,
    now: datetime | None = None,
) -> RemediationPlan:
    """What to do about the group's unhealthy ``nodes`` (see the module docstring), climbing
    ``ladder`` (planning.recovery) with each node's recovery clock from ``clocks`` (by node id).

    ``nodes`` are all of the group's nodes on the block (their count is the base of a
    percentage ``max_unhealthy``); ``ultraservers`` order spares on other UltraServers. A node
    with a reboot under way counts as unhealthy until it has recovered.
    """
    clocks = clocks or {}
    by_name = {n.name: n for n in nodes}
    rebooting = {name for name, c in clocks.items() if c.rebooting_since is not None and name in by_name}
    candidates = sorted((set(verdict.unhealthy) & set(by_name)) | rebooting)
    if not candidates:
        return RemediationPlan(True, (), None, "no unhealthy nodes", 0)
    already_promoted = {n.replaces for n in nodes if n.exists and n.replaces}
    when = now or datetime.min

    def covered(node: NodeObservation) -> bool:
        return (not uses_spares or node.role == ROLE_SPARE or node.name in already_promoted
                or _pick_spare(node, nodes, verdict, set(), {}) is not None)

    steps = {name: recovery.next_step(
        exists=by_name[name].exists, conditions=by_name[name].conditions, health_label=by_name[name].health_label,
        reason=verdict.unhealthy.get(name), state=clocks.get(name, recovery.RecoveryState()), ladder=ladder,
        covered=covered(by_name[name]), now=when) for name in candidates}
    recovered = [name for name in candidates if steps[name] is not None and steps[name].kind == recovery.RECOVERED]
    failed = [name for name in candidates if steps[name] is not None and steps[name].kind != recovery.RECOVERED]
    moved: dict[str, recovery.RecoveryState] = {}
    early: list[Action] = []
    for name in recovered:  # back from a reboot: always allowed (fewer unhealthy nodes)
        node = by_name[name]
        early.append(RecoverNode(name, node.role == ROLE_SPARE or name in already_promoted, clocks[name].since))
        moved[name] = clocks[name].recovered()
    if not failed:
        return RemediationPlan(True, tuple(early), None, "no unhealthy nodes", 0, moved)
    allowed, message = remediation_allowed(len(failed), len(nodes), max_unhealthy)
    if not allowed:
        return RemediationPlan(False, tuple(early), REASON_TOO_MANY_UNHEALTHY, message, len(failed), moved,
                               rebooting=tuple(sorted(rebooting)))

    us_index = {u.id: u.index for u in ultraservers}
    taken: set[str] = set()
    marks: list[Action] = []
    promotions: list[Action] = []
    reboots: list[Action] = []
    backfills: list[Action] = []
    removals: list[Action] = []
    notes: list[str] = []
    next_check = None
    still_rebooting: set[str] = set()

    for name in failed:
        node, step = by_name[name], steps[name]
        reason = verdict.unhealthy.get(name) or step.why
        state = clocks.get(name, recovery.RecoveryState())
        first = state.since or verdict.first_seen.get(name) or when  # the fault's first sight
        promoted = name in already_promoted
        covered_here = promoted  # a spare of its own UltraServer serves in its place
        # A replacement made in its slot already (no spare could serve when it failed: none was
        # healthy, or checked) takes its place: a spare that can serve later is not promoted for it
        # too, which would leave one active node too many and the spare demoted again.
        backfilled = node.slot is not None and any(
            o.exists and o.slot == node.slot and o.generation > node.generation for o in nodes)
        if step.kind != recovery.LABEL_ONLY and uses_spares and node.role == ROLE_ACTIVE and not promoted \
                and not backfilled:
            spare = _pick_spare(node, nodes, verdict, taken, us_index)
            if spare is None:
                notes.append(f"no healthy spare to replace {name}")
            else:
                taken.add(spare.name)
                promoted = True
                covered_here = spare.ultraserver_id == node.ultraserver_id
                promotions.append(PromoteSpare(
                    spare.name, name, spare.ultraserver_id,
                    spare.ultraserver_id == node.ultraserver_id, verdict.grace_ended.get(name), first))
        if step.kind == recovery.REBOOT and not step.requested and uses_spares and node.role == ROLE_ACTIVE \
                and not covered_here:
            # Its UltraServer's spares went to failures before it in this pass: never more reboots
            # at once than an UltraServer's spares cover; this one is replaced in its slot.
            step = recovery.Step(recovery.REPLACE, f"{reason}: no spare of its UltraServer covers it during a reboot")
        label = {recovery.REBOOT: HEALTH_PENDING_REBOOT, recovery.WAIT: HEALTH_PENDING_REBOOT,
                 recovery.LABEL_ONLY: HEALTH_UNSCHEDULABLE}.get(step.kind, HEALTH_PENDING_REPLACEMENT)
        already_unschedulable = bool(node.health_label and node.health_label.startswith(HEALTH_UNSCHEDULABLE))
        if node.exists and node.health_label != label and not (step.kind == recovery.LABEL_ONLY
                                                                and already_unschedulable):
            marks.append(MarkUnhealthy(name, step.why if state.rebooting_since else reason, health_status=label,
                                       reboot_result=step.result, over_budget=step.over_budget, signal=reason))
        if step.kind == recovery.LABEL_ONLY:
            continue

        if step.kind == recovery.REBOOT:
            reboots.append(RebootNode(name, step.why, step.requested))
            moved[name] = state.started(when, ladder.reboot_window, step.requested, first)
            still_rebooting.add(name)
            next_check = _earliest(next_check, when + min(ladder.reboot_timeout, REBOOT_POLL))
            continue
        if step.kind == recovery.WAIT:
            still_rebooting.add(name)
            next_check = _earliest(next_check, min(step.until, when + REBOOT_POLL))
            continue
        if state.rebooting_since is not None or state.since is None:  # the reboot did not help, or none ran
            moved[name] = state = replace(state.ended() if state.rebooting_since is not None else state, since=first)

        replaced = node.slot is not None and any(
            o.exists and o.slot == node.slot and o.generation > node.generation
            for o in nodes)
        if not replaced:
            if node.slot is None:
                notes.append(f"{name} has no slot label; not backfilled")
            elif not block_has_time_left:
                notes.append(f"no time left in the block to backfill {name}; "
                             "it stays cordoned")
            else:
                role = ROLE_SPARE if (node.role == ROLE_SPARE or promoted) else ROLE_ACTIVE
                backfills.append(Backfill(name, node.slot, node.generation + 1, role,
                                          node.ultraserver_id))
                replaced = True
        if node.exists and replaced:
            removals.append(RemoveNode(name, reason, state.since))

    actions = tuple(early + marks + promotions + reboots + backfills + removals)
    if still_rebooting:
        notes.append(f"{len(still_rebooting)} rebooting")
    if notes:
        message = f"{message}; " + "; ".join(notes)
    return RemediationPlan(True, actions, None, message, len(failed), moved, next_check,
                           tuple(sorted(still_rebooting)))


def _earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else min(a, b)
