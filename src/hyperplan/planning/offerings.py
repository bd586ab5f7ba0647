"""Offering search: cut training-plan offerings out of capacity pools.

Pure: the pools (with everything already taken from them) and `now` come in,
offerings or rule violations go out.

How the search works:

1. The request is checked against the policy (`validate_request`); an invalid
   request yields no offerings.
2. For every pool of the requested instance type (or UltraServer type), the
   stretches of time in which the requested count still fits are computed once.
3. Candidates: in every pool, the earliest contiguous block of the full
   duration; and for every split of the duration into two blocks of whole days
   (d1 + d2) and every allowed pair of pools, the earliest first block followed
   by the earliest second block after it. Taking the earliest first block is
   optimal: any later first block can only push the second one later.
   Capacity is sold at most `max_start_ahead` ahead, so every block (not only
   the first) starts within it; this also bounds the gap between blocks.
4. Candidates are ranked by earliest finish, then fewest blocks, then fewest
   AZs, then smallest gap. A candidate is dropped when a better-ranked one that
   was kept ends no later, has no more blocks and uses no AZ it does not: it
   would give the user nothing more. (This drops, for one, a free contiguous
   block cut in two.) The best three remain.
5. An offering's id is its first block's start and a digest of its blocks and
   the request (`offering_id`). A purchase of a chosen id searches again
   (`find_offering`), opening at the start the id names, and buys what that
   search cuts under the id: never an offering as a plan's status lists it.
6. Extensions (`search_extensions`): a bought plan's last block run on in the same
   pool from its end, for whole days, while the pool has room for its count right
   from that end on. An extension's id is its start and a digest of the plan, the
   block and the new end; buying one searches again (`find_extension`), and the
   ledger's blocks alone say which are bought (`extension_held`).
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from dataclasses import dataclass, replace
from functools import cached_property
from datetime import datetime, timedelta, timezone
from typing import Iterable, Sequence

from hyperplan.api.models import Offering as OfferingStatus, to_rfc3339
from hyperplan.api.vocabulary import (  # noqa: F401  (ULTRASERVER_INSTANCE_TYPE re-exported)
    REASON_OFFERING_UNAVAILABLE, SINGLE_AZ_TARGETS, TARGET_RESOURCES, ULTRASERVER_INSTANCE_TYPE, ULTRASERVER_INSTANCES,
)
from hyperplan.planning.blocks import Block
from hyperplan.planning.policy import Policy, format_duration
from hyperplan.planning.tenancy import Selector

MAX_OFFERINGS = 3


@dataclass(frozen=True)
class Busy:
    """Capacity already taken in a pool: an `unavailable` window or a ledger reservation."""

    start: datetime
    end: datetime
    instance_count: int


@dataclass(frozen=True)
class PoolSnapshot:
    name: str
    instance_type: str
    availability_zone: str
    instance_count: int
    ultra_server_type: str | None = None
    busy: tuple[Busy, ...] = ()
    plan_selector: Selector | None = None  # which plans may buy from the pool (planning.tenancy)

    @cached_property
    def usage(self) -> tuple[tuple[datetime, ...], tuple[int, ...]]:
        """The pool's busy instances as a step function: at each moment where it changes, how
        many are busy from then on. Computed once per snapshot: the operator keeps one snapshot
        per pool version, and every plan's search reads it (sorting a ledger of 1,000 lines for
        each search was a quarter of the event loop's time during a purchase burst:
        docs/benchmarks.md 5.9)."""
        deltas: dict[datetime, int] = {}
        for b in self.busy:
            if b.end > b.start:
                deltas[b.start] = deltas.get(b.start, 0) + b.instance_count
                deltas[b.end] = deltas.get(b.end, 0) - b.instance_count
        moments = tuple(sorted(deltas))
        levels, level = [], 0
        for moment in moments:
            level += deltas[moment]
            levels.append(level)
        return moments, tuple(levels)


@dataclass(frozen=True)
class OfferingRequest:
    """What a TrainingPlan asks for: either instance type + count or UltraServer type + count."""

    instance_type: str | None
    instance_count: int | None
    ultra_server_type: str | None
    ultra_server_count: int | None
    target: str
    duration: timedelta
    start_after: datetime | None = None
    end_before: datetime | None = None

    def canonical(self) -> str:
        """The fields that shape the offerings, as one string for :func:`offering_id`."""
        def moment(value: datetime | None) -> str:
            return "" if value is None else value.astimezone(timezone.utc).isoformat()
        return "|".join((self.instance_type or "", str(self.instance_count or ""), self.ultra_server_type or "",
                         str(self.ultra_server_count or ""), self.target, str(int(self.duration.total_seconds())),
                         moment(self.start_after), moment(self.end_before)))

    @property
    def is_ultra_server(self) -> bool:
        return self.ultra_server_type is not None

    @property
    def effective_instance_type(self) -> str | None:
        if self.is_ultra_server:
            return ULTRASERVER_INSTANCE_TYPE
        return self.instance_type

    @property
    def effective_instance_count(self) -> int | None:
        """Instances to reserve; for UltraServers, every instance of every UltraServer."""
        if not self.is_ultra_server:
            return self.instance_count
        per_server = ULTRASERVER_INSTANCES.get(self.ultra_server_type or "")
        if per_server is None or self.ultra_server_count is None:
            return None
        return per_server * self.ultra_server_count


ID_PREFIX = "tpo-"
_ID_START = "%Y%m%dt%H%M%S"  # the first block's start in an id, UTC: tpo-20270101t113000-<digest>


def offering_id(blocks: Sequence[Block], request: OfferingRequest | None = None) -> str:
    """The id of an offering: the first block's start (UTC, for a reader choosing by eye), then a
    digest of every block (pool, zone, type, count, start, end) and of the request fields that
    shaped them (``request`` is the plan's spec as the search read it). So the same blocks for the
    same spec always give the same id, an id names one offering for one spec, and a search again
    from the spec finds the offering its id names (:func:`find_offering`). Public, not a secret:
    anyone can compute it, so an id proves nothing by itself; the operator buys only offerings
    its own search yields."""
    canonical = ";".join(
        "|".join(
            (
                block.pool,
                block.availability_zone,
                block.instance_type,
                str(block.instance_count),
                block.start.astimezone(timezone.utc).isoformat(),
                block.end.astimezone(timezone.utc).isoformat(),
                block.ultra_server_type or "",
                str(block.ultra_server_count or ""),
            )
        )
        for block in blocks
    )
    if request is not None:
        canonical += "#" + request.canonical()
    start = min(block.start for block in blocks).astimezone(timezone.utc).strftime(_ID_START)
    return f"{ID_PREFIX}{start}-{hashlib.sha256(canonical.encode()).hexdigest()[:16]}"


def start_named_by(offering: str) -> datetime | None:
    """The start an offering id names (its first block's), or None when it is not an id of the
    :func:`offering_id` form."""
    parts = offering.split("-")
    if len(parts) != 3 or f"{parts[0]}-" != ID_PREFIX or len(parts[2]) != 16:
        return None
    try:
        return datetime.strptime(parts[1], _ID_START).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


@dataclass(frozen=True)
class Offering:
    id: str
    blocks: tuple[Block, ...]

    @classmethod
    def from_blocks(cls, blocks: Iterable[Block], request: OfferingRequest | None = None) -> Offering:
        """The offering of ``blocks``, cut for ``request`` (whose fields go into its id)."""
        ordered = tuple(sorted(blocks, key=lambda block: (block.start, block.pool)))
        if not ordered:
            raise ValueError("an offering needs at least one block")
        return cls(id=offering_id(ordered, request), blocks=ordered)

    def to_status(self) -> OfferingStatus:
        """The offering as a plan's ``status.offerings`` shows it."""
        seconds = int(self.duration.total_seconds())
        return OfferingStatus(id=self.id, duration_hours=seconds // 3600, duration_minutes=(seconds % 3600) // 60,
                              blocks=[block.to_offered() for block in self.blocks])

    @classmethod
    def from_status(cls, shown: OfferingStatus) -> Offering:
        """An offering as a plan's ``status.offerings`` shows it, id and blocks as written there.
        Whoever may write the status may have written it: never bought as it is, only compared
        (:func:`could_be_offered`)."""
        return cls(id=shown.id, blocks=tuple(Block.from_offered(block) for block in shown.blocks))

    @property
    def start(self) -> datetime:
        return self.blocks[0].start

    @property
    def end(self) -> datetime:
        return self.blocks[-1].end

    @property
    def duration(self) -> timedelta:
        """Reserved time, gaps between blocks not counted."""
        return sum((block.duration for block in self.blocks), timedelta(0))

    @property
    def availability_zones(self) -> tuple[str, ...]:
        """The AZs of the blocks, in block order, each once."""
        return tuple(dict.fromkeys(block.availability_zone for block in self.blocks))


@dataclass(frozen=True)
class RuleViolation:
    reason: str  # CamelCase, names the rule
    message: str


# --------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class _Window:
    first_start: datetime  # earliest start the policy and request allow, on the start grid
    latest_start: datetime  # every block must start by then (max_start_ahead)
    end_limit: datetime | None  # the whole offering must end by then (end_before)


def _search_window(request: OfferingRequest, policy: Policy, now: datetime) -> _Window:
    # An offering that starts sooner than min_purchase_lead could never be bought.
    earliest = now + max(policy.earliest_start_after_search, policy.min_purchase_lead)
    if request.start_after is not None and request.start_after > earliest:
        earliest = request.start_after
    return _Window(
        first_start=policy.align_up(earliest),
        latest_start=now + policy.max_start_ahead,
        end_limit=request.end_before,
    )


def validate_request(request: OfferingRequest, policy: Policy, now: datetime) -> list[RuleViolation]:
    """Every rule the request breaks under `policy` at `now`; empty when it may be searched."""
    violations: list[RuleViolation] = []
    if request.target not in TARGET_RESOURCES:
        violations.append(
            RuleViolation(
                "UnknownTargetResource",
                f"targetResource {request.target!r} is not one of {', '.join(TARGET_RESOURCES)}",
            )
        )
    violations += _validate_capacity(request, policy)
    duration_ok = _validate_duration(request.duration, policy, violations)
    if duration_ok:
        violations += _validate_window(request, policy, now)
    return violations


def _validate_capacity(request: OfferingRequest, policy: Policy) -> list[RuleViolation]:
    if request.is_ultra_server:
        problems = []
        per_server = ULTRASERVER_INSTANCES.get(request.ultra_server_type or "")
        if per_server is None:
            problems.append(
                RuleViolation(
                    "UnknownUltraServerType",
                    f"ultraServerType {request.ultra_server_type!r} is not one of "
                    f"{', '.join(sorted(ULTRASERVER_INSTANCES))}",
                )
            )
        if request.ultra_server_count is None or request.ultra_server_count < 1:
            problems.append(
                RuleViolation(
                    "UltraServerCountNotAllowed",
                    f"ultraServerCount must be a whole number of UltraServers, at least 1; "
                    f"got {request.ultra_server_count!r}",
                )
            )
        conflicting_type = request.instance_type not in (None, ULTRASERVER_INSTANCE_TYPE)
        conflicting_count = request.instance_count is not None and request.instance_count != (
            request.effective_instance_count
        )
        if conflicting_type or conflicting_count:
            problems.append(
                RuleViolation(
                    "InvalidCapacityRequest",
                    "give either instanceType + instanceCount or ultraServerType + ultraServerCount; "
                    f"UltraServers hold {ULTRASERVER_INSTANCE_TYPE} instances and are counted in whole "
                    "UltraServers",
                )
            )
        return problems

    if not request.instance_type or request.ultra_server_count is not None:
        return [
            RuleViolation(
                "InvalidCapacityRequest",
                "give either instanceType + instanceCount or ultraServerType + ultraServerCount",
            )
        ]
    if request.instance_count not in policy.allowed_instance_counts:
        allowed = ", ".join(str(count) for count in policy.allowed_instance_counts)
        return [
            RuleViolation(
                "InstanceCountNotAllowed",
                f"instanceCount {request.instance_count!r} is not allowed; choose one of {allowed}",
            )
        ]
    return []


def _validate_duration(duration: timedelta, policy: Policy, violations: list[RuleViolation]) -> bool:
    days = policy.whole_days(duration)
    if days is None:
        violations.append(
            RuleViolation(
                "DurationNotWholeDays",
                f"duration {format_duration(duration)} is not a whole number of days "
                f"(a day is {format_duration(policy.day)} under policy {policy.name})",
            )
        )
        return False
    if not policy.min_duration_days <= days <= policy.max_duration_days:
        violations.append(
            RuleViolation(
                "DurationOutOfRange",
                f"duration {format_duration(duration)} is outside "
                f"{format_duration(policy.min_duration)} to {format_duration(policy.max_duration)}",
            )
        )
        return False
    return True


def _validate_window(request: OfferingRequest, policy: Policy, now: datetime) -> list[RuleViolation]:
    window = _search_window(request, policy, now)
    if window.first_start > window.latest_start:
        return [
            RuleViolation(
                "StartTooFarAhead",
                f"the earliest possible start {_fmt_time(window.first_start)} is more than "
                f"{format_duration(policy.max_start_ahead)} ahead; a plan must start by "
                f"{_fmt_time(window.latest_start)}",
            )
        ]
    if request.end_before is None:
        return []
    latest_fitting_start = request.end_before - request.duration
    window_opens = request.start_after if request.start_after is not None else now
    policy_earliest = now + max(policy.earliest_start_after_search, policy.min_purchase_lead)
    if latest_fitting_start < window_opens:
        return [
            RuleViolation(
                "WindowTooShort",
                f"the window {_fmt_time(window_opens)} to {_fmt_time(request.end_before)} is shorter "
                f"than the duration {format_duration(request.duration)}",
            )
        ]
    if latest_fitting_start < policy_earliest:
        return [
            RuleViolation(
                "StartTooSoon",
                f"to end by {_fmt_time(request.end_before)} the plan would have to start by "
                f"{_fmt_time(latest_fitting_start)}, but plans start at "
                f"{_fmt_time(policy_earliest)} at the earliest",
            )
        ]
    if window.first_start > latest_fitting_start:
        return [
            RuleViolation(
                "WindowTooShort",
                f"no {format_duration(request.duration)} block on the start grid fits before "
                f"{_fmt_time(request.end_before)}: the first possible start is "
                f"{_fmt_time(window.first_start)}"
                + _alignment_note(policy),
            )
        ]
    return []


def _alignment_note(policy: Policy) -> str:
    if policy.end_time_of_day is None:
        return ""
    return f" (blocks end at {policy.end_time_of_day.strftime('%H:%M')} UTC)"


# --------------------------------------------------------------------------- search


class _FreeTimeline:
    """When a pool still has room for `count` more instances, from `since` on.

    `intervals` are the maximal stretches [start, end) in which the pool's size
    minus everything busy at every instant is at least `count`; end None means
    open-ended (after the last busy window).
    """

    def __init__(self, pool: PoolSnapshot, count: int, since: datetime, policy: Policy) -> None:
        self.pool = pool
        self.policy = policy
        self.intervals = free_intervals(pool, count, since)

    def earliest_fit(
        self,
        length: timedelta,
        not_before: datetime,
        latest_start: datetime | None,
        end_limit: datetime | None,
    ) -> datetime | None:
        """The earliest grid-aligned start of a free block of `length`, or None."""
        for free_start, free_end in self.intervals:
            if free_end is not None and free_end <= not_before:
                continue
            start = self.policy.align_up(max(free_start, not_before))
            if latest_start is not None and start > latest_start:
                return None
            if end_limit is not None and start + length > end_limit:
                return None
            if free_end is None or start + length <= free_end:
                return start
        return None


def free_intervals(
    pool: PoolSnapshot, count: int, since: datetime
) -> list[tuple[datetime, datetime | None]]:
    """The stretches [start, end) from ``since`` on in which ``count`` more instances fit in
    ``pool`` (end None: open-ended). Empty when the pool is smaller than ``count``."""
    limit = pool.instance_count - count  # the most that may be busy while we hold `count`
    if limit < 0:
        return []
    moments, levels = pool.usage
    first = bisect_right(moments, since)  # the steps after ``since``; the one before holds at it
    intervals: list[tuple[datetime, datetime | None]] = []
    open_since: datetime | None = since if (levels[first - 1] if first else 0) <= limit else None
    for i in range(first, len(moments)):
        moment, level = moments[i], levels[i]
        if level > limit and open_since is not None:
            intervals.append((open_since, moment))
            open_since = None
        elif level <= limit and open_since is None:
            open_since = moment
    if open_since is not None:
        intervals.append((open_since, None))
    return intervals


def busy_at(pool: PoolSnapshot, moment: datetime) -> int:
    """Instances of ``pool`` taken at ``moment`` (reservations and ``unavailable`` windows)."""
    return sum(b.instance_count for b in pool.busy if b.start <= moment < b.end)


def _peak_usage(busy: Iterable[Busy], start: datetime, end: datetime) -> int:
    """The most instances busy at any instant of [start, end)."""
    deltas: dict[datetime, int] = {}
    for window in busy:
        if window.start < end and window.end > start:
            clipped_start = max(window.start, start)
            clipped_end = min(window.end, end)
            deltas[clipped_start] = deltas.get(clipped_start, 0) + window.instance_count
            deltas[clipped_end] = deltas.get(clipped_end, 0) - window.instance_count
    usage = peak = 0
    for moment in sorted(deltas):
        usage += deltas[moment]
        peak = max(peak, usage)
    return peak


def matching_pools(request: OfferingRequest, pools: Iterable[PoolSnapshot]) -> list[PoolSnapshot]:
    """Pools that can serve the request. UltraServer pools sell only whole UltraServers."""
    if request.is_ultra_server:
        matching = [pool for pool in pools if pool.ultra_server_type == request.ultra_server_type]
    else:
        matching = [
            pool
            for pool in pools
            if pool.ultra_server_type is None and pool.instance_type == request.instance_type
        ]
    return sorted(matching, key=lambda pool: pool.name)


def search_offerings(
    request: OfferingRequest, pools: Sequence[PoolSnapshot], policy: Policy, now: datetime
) -> list[Offering]:
    """At most three offerings for `request`, best first. [] means no capacity (or an invalid request)."""
    if validate_request(request, policy, now):
        return []
    return rank_offerings(_candidates(request, pools, policy, _search_window(request, policy, now)))


def find_offering(
    request: OfferingRequest, pools: Sequence[PoolSnapshot], policy: Policy, now: datetime, wanted: str
) -> Offering | None:
    """The offering whose id is ``wanted``, found by searching again from `request` and `pools` at
    `now`, or None when no search would yield it now (an id that is not the digest of an offering
    the search cuts for this request, or one whose capacity is gone or which starts too soon to
    buy). The search opens at the start the id names, but never before a purchase may start (the
    request's ``start_after``, ``min_purchase_lead`` from now): an offering a user saw a while ago
    is found again while it can still be bought, and nothing but the id's digest is taken from
    outside the spec, the policy and the pools."""
    opens = start_named_by(wanted)
    if opens is None or validate_request(request, policy, now):
        return None
    earliest = now + policy.min_purchase_lead
    if request.start_after is not None and request.start_after > earliest:
        earliest = request.start_after
    window = _Window(first_start=policy.align_up(max(opens, earliest)),
                     latest_start=now + policy.max_start_ahead, end_limit=request.end_before)
    return next((o for o in _candidates(request, pools, policy, window) if o.id == wanted), None)


def could_be_offered(shown: OfferingStatus, request: OfferingRequest) -> bool:
    """Whether an offering as ``status.offerings`` lists it could have come from a search for
    `request`: its id is the digest of its blocks and the request, and its blocks hold what the
    request asks (count, type, duration, window). False for an entry rewritten after the search,
    even by someone who computed the digest again. Chooses the words of a refusal only."""
    listed = Offering.from_status(shown)
    if not listed.blocks or offering_id(listed.blocks, request) != shown.id:
        return False
    return (
        all(block.instance_count == request.effective_instance_count
            and block.instance_type == request.effective_instance_type for block in listed.blocks)
        and listed.duration == request.duration
        and (request.start_after is None or listed.start >= request.start_after)
        and (request.end_before is None or listed.end <= request.end_before)
    )


def _candidates(
    request: OfferingRequest, pools: Sequence[PoolSnapshot], policy: Policy, window: _Window
) -> list[Offering]:
    """Every offering the search cuts for `request` in `window`, unranked."""
    count = request.effective_instance_count
    assert count is not None  # the caller validated the request
    days = policy.whole_days(request.duration)
    assert days is not None
    timelines = [
        _FreeTimeline(pool, count, window.first_start, policy)
        for pool in matching_pools(request, pools)
        if pool.instance_count >= count
    ]

    def block(timeline: _FreeTimeline, start: datetime, length: timedelta) -> Block:
        pool = timeline.pool
        return Block(
            pool=pool.name,
            availability_zone=pool.availability_zone,
            instance_type=pool.instance_type,
            instance_count=count,
            start=start,
            end=start + length,
            ultra_server_type=request.ultra_server_type,
        )

    candidates: list[Offering] = []
    for timeline in timelines:
        start = timeline.earliest_fit(
            request.duration, window.first_start, window.latest_start, window.end_limit
        )
        if start is not None:
            candidates.append(Offering.from_blocks([block(timeline, start, request.duration)], request))

    single_az = request.target in SINGLE_AZ_TARGETS
    for first_days in range(1, days):
        first_length = policy.day * first_days
        second_length = policy.day * (days - first_days)
        for first in timelines:
            first_start = first.earliest_fit(
                first_length, window.first_start, window.latest_start, window.end_limit
            )
            if first_start is None:
                continue
            first_end = first_start + first_length
            for second in timelines:
                if single_az and second.pool.availability_zone != first.pool.availability_zone:
                    continue
                second_start = second.earliest_fit(
                    second_length, first_end, window.latest_start, window.end_limit
                )
                if second_start is None:
                    continue
                candidates.append(
                    Offering.from_blocks(
                        [block(first, first_start, first_length), block(second, second_start, second_length)],
                        request,
                    )
                )
    return candidates


def rank_key(offering: Offering) -> tuple:
    """How offerings rank, best first: the earliest end, the fewest blocks and zones, the
    shortest gap between blocks, then by start and pool (a stable order)."""
    return (
        offering.end,
        len(offering.blocks),
        len(offering.availability_zones),
        offering.end - offering.start,  # smallest gap between blocks
        tuple((block.start, block.pool) for block in offering.blocks),
    )


def rank_offerings(candidates: list[Offering]) -> list[Offering]:
    """The best MAX_OFFERINGS candidates, without duplicates or dominated ones."""
    kept: list[Offering] = []
    seen: set[str] = set()
    for offering in sorted(candidates, key=rank_key):
        if offering.id in seen:
            continue
        seen.add(offering.id)
        if any(_covers(better, offering) for better in kept):
            continue
        kept.append(offering)
        if len(kept) == MAX_OFFERINGS:
            break
    return kept


def _covers(better: Offering, other: Offering) -> bool:
    """Whether `better` gives the user at least what `other` gives: done no later, no more
    blocks, no AZ that `other` does not use."""
    return (
        better.end <= other.end
        and len(better.blocks) <= len(other.blocks)
        and set(better.availability_zones) <= set(other.availability_zones)
    )


# --------------------------------------------------------------------------- recheck


def recheck_offering(
    offering: Offering, pools: Sequence[PoolSnapshot], policy: Policy, now: datetime
) -> RuleViolation | None:
    """Whether `offering` may still be bought at `now`: None if so, else why not.

    `pools` must carry every reservation made since the search (the ledger),
    but not one for this offering itself.
    """
    lead = offering.start - now
    if lead < policy.min_purchase_lead:
        return RuleViolation(
            "PurchaseTooLate",
            f"offering {offering.id} starts at {_fmt_time(offering.start)}; a purchase must complete "
            f"at least {format_duration(policy.min_purchase_lead)} before the start",
        )
    pools_by_name = {pool.name: pool for pool in pools}
    for number, block in enumerate(offering.blocks, start=1):
        pool = pools_by_name.get(block.pool)
        if (
            pool is None
            or pool.instance_type != block.instance_type
            or pool.availability_zone != block.availability_zone
        ):
            return RuleViolation(
                REASON_OFFERING_UNAVAILABLE,
                f"block {number} of offering {offering.id}: capacity pool {block.pool!r} no longer "
                f"offers {block.instance_type} in {block.availability_zone}",
            )
        used = _peak_usage(pool.busy, block.start, block.end)
        if used + block.instance_count > pool.instance_count:
            return RuleViolation(
                REASON_OFFERING_UNAVAILABLE,
                f"block {number} of offering {offering.id} ({block.instance_count} x "
                f"{block.instance_type} in {block.availability_zone}, {_fmt_time(block.start)} to "
                f"{_fmt_time(block.end)}) is no longer free in pool {pool.name!r}: "
                f"{used} of {pool.instance_count} instances are taken then",
            )
    return None


def _fmt_time(moment: datetime) -> str:
    return to_rfc3339(moment)


# --------------------------------------------------------------------------- extensions


EXTENSION_ID_PREFIX = "tpe-"
EXTENSION_DAYS = (1, 7)  # the durations offered without one asked for, with the longest the room holds


@dataclass(frozen=True)
class Extension:
    """An extension offering: ``block`` (a bought block of the plan, as the ledger holds it before
    the extension) runs on in its pool from its end for ``days`` of the policy, until ``end``."""

    id: str
    block: Block
    end: datetime
    days: int

    @property
    def start(self) -> datetime:
        return self.block.end

    @property
    def added(self) -> Block:
        """The window the extension adds, as a block of the same pool (for the re-check)."""
        return replace(self.block, start=self.block.end, end=self.end, id="")

    @property
    def as_offering(self) -> Offering:
        """The extension as an offering of one block: what ``recheck_offering`` judges."""
        return Offering(id=self.id, blocks=(self.added,))


def extension_id(plan_uid: str, block: Block, end: datetime) -> str:
    """The id of the extension of ``block`` (bought by the plan ``plan_uid``) until ``end``: the
    extension's start (the block's end, UTC) and a digest of the plan, the block (id, pool, zone,
    type, count, times) and the new end. Like :func:`offering_id`, public: it names one extension
    of one block of one plan, and proves nothing by itself (:func:`find_extension`)."""
    canonical = "|".join((plan_uid, block.id, block.pool, block.availability_zone, block.instance_type,
                          str(block.instance_count), block.ultra_server_type or "",
                          block.start.astimezone(timezone.utc).isoformat(),
                          block.end.astimezone(timezone.utc).isoformat(), end.astimezone(timezone.utc).isoformat()))
    start = block.end.astimezone(timezone.utc).strftime(_ID_START)
    return f"{EXTENSION_ID_PREFIX}{start}-{hashlib.sha256(canonical.encode()).hexdigest()[:16]}"


def extension_start_named_by(wanted: str) -> datetime | None:
    """The start an extension offering id names, or None when it is not one of :func:`extension_id`."""
    if not wanted.startswith(EXTENSION_ID_PREFIX):
        return None
    return start_named_by(ID_PREFIX + wanted[len(EXTENSION_ID_PREFIX):])


def _extension_room(plan_uid: str, last: Block, pools: Sequence[PoolSnapshot], policy: Policy,
                    now: datetime) -> int:
    """How many whole policy days the pool of ``last`` has room for after it (0: none, or it may not
    be extended now). Rules: the pool still sells the block's type in its zone (and to this plan:
    ``pools`` are those that let it buy), the extension starts at the block's end, which must be at
    least ``min_purchase_lead`` and at most ``max_start_ahead`` ahead, and it is at most
    ``max_duration_days`` long."""
    pool = next((p for p in pools if p.name == last.pool), None)
    if pool is None or pool.instance_type != last.instance_type or pool.availability_zone != last.availability_zone:
        return 0
    start = last.end
    if start - now < policy.min_purchase_lead or start > now + policy.max_start_ahead:
        return 0
    # The plan's own lines end by ``start`` (``last`` is its last block), so they take no room.
    free = free_intervals(pool, last.instance_count, start)
    if not free or free[0][0] != start:
        return 0
    room = free[0][1]
    most = policy.max_duration_days if room is None else min(policy.max_duration_days, (room - start) // policy.day)
    return most if most >= policy.min_duration_days else 0


def search_extensions(plan_uid: str, blocks: Sequence[Block], pools: Sequence[PoolSnapshot], policy: Policy,
                      now: datetime, days: int | None = None) -> list[Extension]:
    """The extension offerings of a bought plan (``blocks``, as the ledger holds them): its last
    block run on in the same pool from its end, for ``days`` when asked, else for each of
    :data:`EXTENSION_DAYS` and the longest the room holds, shortest first (at most
    :data:`MAX_OFFERINGS`). Empty when the plan has no block, the pool has no room right after
    the last one, or the policy does not allow the extension (see :func:`_extension_room`)."""
    if not blocks:
        return []
    last = max(blocks, key=lambda b: (b.end, b.start))
    room = _extension_room(plan_uid, last, pools, policy, now)
    if days is not None:
        wanted = [days] if policy.min_duration_days <= days <= room else []
    else:
        wanted = sorted({d for d in EXTENSION_DAYS if policy.min_duration_days <= d <= room}
                        | ({room} if room else set()))
    offered = [Extension(extension_id(plan_uid, last, last.end + policy.day * d), last, last.end + policy.day * d, d)
               for d in wanted]
    return offered[:MAX_OFFERINGS]


def find_extension(plan_uid: str, blocks: Sequence[Block], pools: Sequence[PoolSnapshot], policy: Policy,
                   now: datetime, wanted: str) -> Extension | None:
    """The extension offering whose id is ``wanted``, found by searching again from the plan's
    blocks and the pools at ``now`` over every duration the room holds, or None when no search
    would cut it now (a made-up id, an id of another plan or block, capacity sold, too late)."""
    if not blocks or extension_start_named_by(wanted) is None:
        return None
    last = max(blocks, key=lambda b: (b.end, b.start))
    room = _extension_room(plan_uid, last, pools, policy, now)
    for d in range(policy.min_duration_days, room + 1):
        end = last.end + policy.day * d
        if extension_id(plan_uid, last, end) == wanted:
            return Extension(wanted, last, end, d)
    return None


def extension_held(plan_uid: str, blocks: Sequence[Block], policy: Policy, wanted: str) -> Extension | None:
    """The extension ``wanted`` names if the ledger already holds it: one of the plan's ``blocks``
    runs over the extension's whole window, and the id is that of extending the block as it was
    before (ending at the start the id names) for some whole number of days. The ledger keeps no
    record of extensions but the blocks' ends, so this is how a pass (or a restarted operator)
    knows an extension is bought, from nothing but the ledger."""
    start = extension_start_named_by(wanted)
    if start is None:
        return None
    for block in blocks:
        if not block.start < start < block.end:
            continue
        before = replace(block, end=start)
        for d in range(policy.min_duration_days, policy.max_duration_days + 1):
            end = start + policy.day * d
            if end > block.end:
                break
            if extension_id(plan_uid, before, end) == wanted:
                return Extension(wanted, before, end, d)
    return None
