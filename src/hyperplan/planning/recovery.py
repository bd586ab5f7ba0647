"""The recovery ladder: what a failed node gets before it is replaced, as HyperPod does it.

In a reserved block a replacement is the dear action: the block's capacity is fixed, so a new
node comes out of the UltraServer's spare (which is then gone) or from nowhere. A reboot costs
nothing but the minutes it takes, and most faults (a wedged driver, a kubelet that stopped
answering) do not survive one. So by default a failed node is rebooted first, and replaced only
when the reboot did not help. Pure: observations, the node's recovery clock and ``now`` in, one
:class:`Step` out; :func:`hyperplan.planning.health.plan_remediation` turns the steps into
actions.

The ladder (README, "Recovery"):

=====================================================  =======================================
the failed node                                        step
=====================================================  =======================================
labelled ``UnschedulablePendingReplacement``           replace (an admin's request, or ours)
labelled ``UnschedulablePendingReboot``, no reboot     reboot (an admin's request; no budget)
under way
``nodeRecovery: None``                                 label only (taint, Event); nothing else
deleted, or never reported Ready (startup timeout)     replace: nothing to reboot
failed its deep health checks (planning.deepchecks)    replace: it was just made or just
                                                       rebooted; another reboot would not help
rebooted ``rebootBudget`` times within the window      replace: it failed again after a reboot
an active node of an UltraServer no spare covers       replace: a reboot would leave the job
                                                       short of its NVLink domain until it ends
anything else                                          reboot (its spare is promoted first)
=====================================================  =======================================

A reboot under way (:attr:`RecoveryState.rebooting_since`) ends in one of three ways: the node
reports ``Ready=True`` with a transition after the reboot started and no fault left but the
operator's own label (**recovered**: it serves again, as its UltraServer's spare when a spare
took over its work); ``Ready=True`` with a fault still there (**replace**); or no ``Ready=True``
within ``rebootTimeoutSeconds`` (**replace**).

The clocks are the operator's own, kept in the group's record (``status.nodes[].recovery``),
never read from the node: the reboots within the window, and each fault's first sight
(:func:`clock_faults`): a fault's grace counts from when it was first seen, not from its
condition's ``lastTransitionTime``, and a fault that clears is remembered for the grace, so a
condition that flaps cannot reset its grace. A restart of the operator keeps both; a fault
that comes back after a reboot counts against the budget. The record also keeps, from the
ladder's first action on a node until it serves again or is removed, the first sight of the
fault that recovery answers (:attr:`RecoveryState.since`): a fault's own clock is forgotten once
it clears (its condition may clear during the reboot), and the time to recover
(``hyperplan_recovery_seconds``) counts from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from hyperplan.api.models import FaultClock, GroupNode, HealthCheckSpec, NodeRecovery, UltraServerReplacement
from hyperplan.planning.naming import (HEALTH_PENDING_REBOOT, HEALTH_PENDING_REPLACEMENT, LABEL_SAGEMAKER_FAULT_REASONS,
                                       LABEL_SAGEMAKER_FAULT_TYPES)
from hyperplan.planning.nodefacts import READY

REBOOT = "Reboot"
WAIT = "WaitForReboot"
RECOVERED = "Recovered"
REPLACE = "Replace"
LABEL_ONLY = "LabelOnly"

SIGNAL_DELETED = "NodeDeleted"  # health.SIGNAL_DELETED (health imports this module)
SIGNAL_STARTUP_TIMEOUT = "NodeStartupTimeout"
SIGNAL_DEEP_CHECK_FAILED = "DeepHealthCheckFailed"  # the node failed its deep health checks (planning.deepchecks)
LABEL_SIGNAL_PREFIX = "NodeHealthStatus="  # a reason of health's that is only a health label


# --------------------------------------------------------------------------- HyperPod's fault labels

FAULT_LABELS = (LABEL_SAGEMAKER_FAULT_TYPES, LABEL_SAGEMAKER_FAULT_REASONS)
# The fault kinds of the health signals (the reasons of planning.health), as HyperPod's fault-types
# label carries them: a node that stopped being Ready, a bad node condition (a hardware or driver
# condition of the group's healthCheck), a health label an admin or HyperPod's agent set, no Ready
# condition within the startup timeout, a failed deep health check.
FAULT_NOT_READY, FAULT_CONDITION, FAULT_REQUESTED = "NodeNotReady", "NodeCondition", "HealthLabel"
FAULT_STARTUP, FAULT_DEEP_CHECK = "NodeStartupTimeout", "DeepHealthCheck"


def _label_value(text: str) -> str:
    """``text`` as a label value: letters, digits, ``-_.`` only, at most 63, alphanumeric ends."""
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in text)[:63]
    return cleaned.strip("-_.") or "Unknown"


def hyperpod_fault(signal: str) -> dict[str, str]:
    """HyperPod's fault labels for the health signal a node was marked for (``Ready=False``,
    ``AcceleratedHardwareReady=False``, ``NodeHealthStatus=UnschedulablePendingReboot``,
    ``NodeStartupTimeout``, ``DeepHealthCheckFailed``, ...): the kind in ``fault-types``, the
    detail in ``fault-reasons`` (``ReadyFalse``, ``AcceleratedHardwareReadyFalse``, the label's value)."""
    if signal.startswith(LABEL_SIGNAL_PREFIX):
        kind, detail = FAULT_REQUESTED, signal.split("=", 1)[1]
    elif signal.startswith(f"{READY}="):
        kind, detail = FAULT_NOT_READY, signal.replace("=", "")
    elif "=" in signal:
        kind, detail = FAULT_CONDITION, signal.replace("=", "")
    elif signal == SIGNAL_STARTUP_TIMEOUT:
        kind, detail = FAULT_STARTUP, "NoReadyCondition"
    elif signal == SIGNAL_DEEP_CHECK_FAILED:
        kind, detail = FAULT_DEEP_CHECK, signal
    else:
        kind = detail = signal
    return {LABEL_SAGEMAKER_FAULT_TYPES: _label_value(kind), LABEL_SAGEMAKER_FAULT_REASONS: _label_value(detail)}


# How a reboot ended (Step.result; the metric hyperplan_reboots_total).
REBOOT_RECOVERED = "recovered"  # back Ready with no fault left: it serves again
REBOOT_TIMEOUT = "timeout"  # not back Ready within rebootTimeoutSeconds: replaced
REBOOT_FAILED = "failed"  # back Ready with its fault still there, or deleted meanwhile: replaced
REBOOT_RESULTS = (REBOOT_RECOVERED, REBOOT_TIMEOUT, REBOOT_FAILED)


@dataclass(frozen=True)
class Ladder:
    """The group's recovery settings (``spec.nodeRecovery`` and ``spec.healthCheck``)."""

    automatic: bool = True
    reboot_budget: int = 1
    reboot_window: timedelta = timedelta(hours=1)
    reboot_timeout: timedelta = timedelta(minutes=10)

    @classmethod
    def from_spec(cls, node_recovery: str, check: HealthCheckSpec) -> Ladder:
        return cls(node_recovery != "None", check.reboot_budget, timedelta(seconds=check.reboot_window_seconds),
                   timedelta(seconds=check.reboot_timeout_seconds))


REPLACE_ONLY = Ladder(reboot_budget=0)
"""Today's one action: every failure is replaced (what a group with ``rebootBudget: 0`` gets)."""


Fault = tuple[str, datetime, "datetime | None"]  # (condition type, first seen, cleared or None)


@dataclass(frozen=True)
class RecoveryState:
    """A node's recovery clocks, as the group's record keeps them (:class:`NodeRecovery`)."""

    reboots: tuple[datetime, ...] = ()
    rebooting_since: datetime | None = None
    requested: bool = False
    faults: tuple[Fault, ...] = ()
    since: datetime | None = None  # the first sight of the fault the recovery under way answers

    @classmethod
    def from_record(cls, record: NodeRecovery | None) -> RecoveryState:
        if record is None:
            return cls()
        return cls(tuple(record.reboots), record.rebooting_since, record.requested,
                   tuple((f.condition, f.since, f.cleared) for f in record.faults), record.fault_since)

    def to_record(self) -> NodeRecovery | None:
        if not self.reboots and self.rebooting_since is None and not self.faults and self.since is None:
            return None
        return NodeRecovery(reboots=list(self.reboots), rebooting_since=self.rebooting_since,
                            requested=self.requested,
                            faults=[FaultClock(condition=c, since=s, cleared=x) for c, s, x in self.faults],
                            fault_since=self.since)

    def recent(self, now: datetime, window: timedelta) -> tuple[datetime, ...]:
        """The reboots that count against the budget at ``now``."""
        return tuple(t for t in self.reboots if t > now - window)

    def started(self, now: datetime, window: timedelta, requested: bool,
                since: datetime | None = None) -> RecoveryState:
        """The clock once a reboot starts at ``now`` (reboots out of the window are forgotten), for
        a fault first seen at ``since`` (kept when the recovery's first sight is known already)."""
        return replace(self, reboots=(*self.recent(now, window), now)[-16:], rebooting_since=now, requested=requested,
                       since=self.since or since)

    def ended(self) -> RecoveryState:
        """A reboot over without help, the node to be replaced: a fresh start for its faults; the
        recovery's first sight stays until the node is removed."""
        return RecoveryState(self.reboots, None, False, (), self.since)

    def recovered(self) -> RecoveryState:
        """Back from a reboot and serving: of this recovery only its reboots are left."""
        return RecoveryState(self.reboots)


def clock_faults(state: RecoveryState, standing: Mapping[str, datetime], now: datetime,
                 memory: timedelta) -> RecoveryState:
    """The fault clocks after a pass that saw the faults ``standing`` (condition type -> the
    condition's lastTransitionTime). A fault keeps the first time it was seen, whatever its
    condition's transition time says since; one that clears is remembered for ``memory`` (the
    grace), so a condition that flaps (healthy again for less than the grace) cannot reset its
    grace: when it comes back, its grace still counts from its first sight."""
    known = {c: (since, cleared) for c, since, cleared in state.faults}
    out: list[Fault] = []
    for condition, seen in standing.items():
        since = known.get(condition, (seen, None))[0]
        out.append((condition, min(since, seen), None))
    for condition, (since, cleared) in known.items():
        if condition not in standing:
            cleared = cleared or now
            if now - cleared < memory:
                out.append((condition, since, cleared))
    return replace(state, faults=tuple(sorted(out)))


def clocked(conditions: Sequence, state: RecoveryState, standing: Mapping[str, datetime]) -> tuple:
    """``conditions`` with each standing fault's transition time moved back to its first sight."""
    first = {c: since for c, since, _ in state.faults}
    return tuple(replace(c, last_transition_time=first[c.type])
                 if c.type in standing and c.type in first and first[c.type] < c.last_transition_time else c
                 for c in conditions)


@dataclass(frozen=True)
class Step:
    """What the ladder says for one failed node, and why (for the Event and the docs)."""

    kind: str
    why: str
    requested: bool = False  # a reboot an admin asked for
    until: datetime | None = None  # WAIT: when the reboot times out
    result: str | None = None  # how the reboot under way ended (REBOOT_RESULTS), when this step ends one
    over_budget: bool = False  # REPLACE: it failed again after rebootBudget reboots within the window


def back_from_reboot(conditions, since: datetime) -> bool:
    """Whether the node reported ``Ready=True`` with a transition since the reboot started."""
    ready = next((c for c in conditions if c.type == READY), None)
    return ready is not None and ready.status == "True" and ready.last_transition_time >= since


def next_step(*, exists: bool, conditions, health_label: str | None, reason: str | None,
              state: RecoveryState, ladder: Ladder, covered: bool, now: datetime) -> Step | None:
    """The ladder's step for one node (see the module docstring), or None: nothing to do.

    ``reason``: the health verdict's reason when the node is unhealthy, else None (a node with a
    reboot under way is asked either way). ``covered``: nothing the node serves is lost while it
    reboots (it is a spare, a spare serves in its place or can be promoted now, or its group has
    no UltraServers).
    """
    if state.rebooting_since is not None:
        since = state.rebooting_since
        if exists and back_from_reboot(conditions, since):
            if reason is not None and not reason.startswith(LABEL_SIGNAL_PREFIX):  # a fault beside our label
                return Step(REPLACE, f"{reason} after its reboot", result=REBOOT_FAILED)
            return Step(RECOVERED, "back Ready after its reboot", result=REBOOT_RECOVERED)
        if not exists:
            return Step(REPLACE, "deleted during its reboot", result=REBOOT_FAILED)
        if now >= since + ladder.reboot_timeout:
            return Step(REPLACE, f"not back Ready within {int(ladder.reboot_timeout.total_seconds())}s of its reboot",
                        result=REBOOT_TIMEOUT)
        return Step(WAIT, "rebooting", until=since + ladder.reboot_timeout)
    if reason is None:
        return None
    if health_label == HEALTH_PENDING_REPLACEMENT:
        return Step(REPLACE, f"{reason}: replacement requested")
    if health_label == HEALTH_PENDING_REBOOT and exists:
        return Step(REBOOT, f"{reason}: reboot requested", requested=True)
    if not ladder.automatic:
        return Step(LABEL_ONLY, f"{reason}; nodeRecovery is None: labelled only")
    if not exists or reason in (SIGNAL_DELETED, SIGNAL_STARTUP_TIMEOUT):
        return Step(REPLACE, f"{reason}: nothing to reboot")
    if reason == SIGNAL_DEEP_CHECK_FAILED:
        return Step(REPLACE, f"{reason}: a node that fails its deep health checks is replaced")
    if ladder.reboot_budget == 0:
        return Step(REPLACE, reason)
    recent = state.recent(now, ladder.reboot_window)
    if len(recent) >= ladder.reboot_budget:
        return Step(REPLACE, f"{reason} again: rebooted {len(recent)} time(s) within "
                             f"{int(ladder.reboot_window.total_seconds())}s (rebootBudget {ladder.reboot_budget})",
                    over_budget=True)
    if not covered:
        return Step(REPLACE, f"{reason}: no spare covers it during a reboot")
    return Step(REBOOT, reason)


def recorded(entries: Sequence[GroupNode], moved: Mapping[str, RecoveryState]) -> list[GroupNode]:
    """The group's record with the recovery clocks a pass ``moved`` (by node id: planning names a
    node by its id, which is a static or Karpenter node's slot, not its name)."""
    return [entry.model_copy(update={"recovery": moved[entry.node_id].to_record()}) if entry.node_id in moved
            else entry for entry in entries]


# --------------------------------------------------------------------------- the last rung: the UltraServer

REASON_BEYOND_SPARES = "FailuresBeyondSpares"
REASON_IMPAIRED = "ImpairedTooLong"
REASON_REPLACED = "UltraServerReplaced"
REASON_NO_FREE_ULTRASERVER = "NoFreeUltraServer"
# The group's nodes move to the UltraServer its plan bought in place of theirs (at the group's ask)
# though the failed one was made whole meanwhile by replacements in place: what was bought for the
# group is used (the plan buys only while it sees the UltraServer impaired).
REASON_BOUGHT = "UltraServerBought"
CONDITION_ULTRASERVER_REPLACEMENT = "UltraServerReplacement"


@dataclass(frozen=True)
class UltraServerMove:
    """The group's nodes on UltraServer ``failed`` move to ``replacement`` (None: the block has no
    free UltraServer for them, and the ladder goes on on ``failed``); ``why`` says which rule."""

    failed: str
    replacement: str | None
    reason: str
    why: str


@dataclass(frozen=True)
class UltraServerVerdict:
    moves: tuple[UltraServerMove, ...] = ()
    next_check: datetime | None = None  # an impaired UltraServer reaches replaceUltraServerAfterSeconds then


def plan_ultraserver_replacement(
    ultraservers: Sequence, allocations: Mapping[str, int], mine: Mapping[str, int],
    failed: Mapping[str, Sequence[datetime]], replacements: Mapping[str, str], after: timedelta | None,
    now: datetime, bought: Mapping[str, str] | None = None,
) -> UltraServerVerdict:
    """Which UltraServers the group's nodes must leave, and for where (pure).

    ``ultraservers``: the block's (planning.placement.UltraServer); ``allocations``: every group's
    active nodes per UltraServer, as placed now (after earlier replacements); ``mine``: this group's;
    ``failed``: per UltraServer, when each of this group's failed nodes on it was first seen (nodes
    past their grace, rebooting, deleted; not those recovered); ``replacements``: the block's
    ``{failed: replacement}`` so far (a failed one is judged no more, and neither is a target).

    An UltraServer the group holds active nodes on can no longer hold them when more of them failed
    than it keeps spares (its spares are gone and the rest is short), or, with ``after`` set, when
    one of them has been failed for ``after``. Their replacement is the free UltraServer (no group's
    active nodes on it, not unavailable, room for all that is placed on the failed one) with the
    lowest index, one per failed UltraServer. Without one, the move says so (``replacement`` None).

    ``bought``: ``{failed: bought}``, the UltraServers the plan bought for the rest of the block in
    place of failed ones. A failed one's nodes go there first, and go there even when the failed
    one holds them again (``REASON_BOUGHT``): replacements in place may have made it whole while
    the plan bought.
    """
    bought = bought or {}
    retired = set(replacements)
    taken = retired | set(replacements.values())
    moves: list[UltraServerMove] = []
    next_check: datetime | None = None
    for u in sorted(ultraservers, key=lambda u: u.index):
        if mine.get(u.id, 0) <= 0 or u.id in retired:
            continue
        faults = sorted(failed.get(u.id, ()))
        if len(faults) > u.spare_count:
            reason = REASON_BEYOND_SPARES
            why = (f"{len(faults)} of the group's nodes on UltraServer {u.id} failed, more than its "
                   f"{u.spare_count} spare(s): it cannot hold the group's {mine[u.id]} active nodes")
        elif after is not None and faults and now - faults[0] >= after:
            reason = REASON_IMPAIRED
            why = (f"UltraServer {u.id} has been impaired since {faults[0].isoformat()} "
                   f"(replaceUltraServerAfterSeconds {int(after.total_seconds())})")
        elif u.id in bought:
            reason = REASON_BOUGHT
            why = f"UltraServer {bought[u.id]} was bought for the rest of the block in place of {u.id}"
        else:
            if after is not None and faults:
                at = faults[0] + after
                next_check = at if next_check is None else min(next_check, at)
            continue
        need = allocations.get(u.id, 0)
        free = [v for v in sorted(ultraservers, key=lambda v: (v.id != bought.get(u.id), v.index))
                if v.id != u.id and v.id not in taken and allocations.get(v.id, 0) == 0 and v.usable >= need]
        if reason == REASON_BOUGHT:
            free = [v for v in free if v.id == bought[u.id]]
            if not free:
                continue  # taken by another move, or in use: the failed one holds the nodes
        target = free[0].id if free else None
        if target is not None:
            taken.add(target)
        moves.append(UltraServerMove(u.id, target, reason, why))
    return UltraServerVerdict(tuple(moves), next_check)


def block_replacements(entries: Sequence[UltraServerReplacement], block: str,
                       ultraserver_ids: Sequence[str]) -> dict[str, UltraServerReplacement]:
    """``{failed: its replacement entry}`` for ``block`` from the replacements the groups' statuses
    record, oldest first: status is input to check, so an entry is taken only when both are
    UltraServers of the block, the failed one is not taken already, and the replacement is neither
    a failed one nor standing in for another. (A replacement that fails later is replaced in turn:
    its entry comes after the one it stands in for.)"""
    known = set(ultraserver_ids)
    out: dict[str, UltraServerReplacement] = {}
    for e in sorted(entries, key=lambda e: (e.since, e.failed, e.replacement)):
        if e.reserved_capacity_id == block and e.failed in known and e.replacement in known \
                and e.failed != e.replacement and e.failed not in out and e.replacement not in out \
                and e.replacement not in {x.replacement for x in out.values()}:
            out[e.failed] = e
    return out
