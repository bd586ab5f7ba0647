"""What a TrainingPlan's status should be, and whether to buy now: one pure decision.

Input: the spec, the status written last time, the plan's reservations found in the
capacity ledger, the pools, the policy, optional usage counts from instance groups, and
`now`. Output: the whole desired status, the offering to buy (if any), the events to
post, and when to look again. The handler carries the decision out; a purchase result
is fed back by deciding again with the new reservations.

Phases are derived, never remembered: a plan with reservations in the ledger is bought,
and its phase follows from its blocks and the clock. That is why a restart at any
moment loses nothing. The one remembered verdict is ``Failed``: it holds until the spec
changes (a new generation), so a failed purchase is not silently retried.

Status is output: what a purchase buys is never read from the status. ``spec.offeringId`` names
an offering by its id, a digest of its blocks and of the spec (``planning.offerings.offering_id``);
the decision searches again from the spec and the pools and buys the offering with that id, or
refuses (docs/security.md, "Status is output").

A bought plan is extended by the entries of ``spec.extensions`` (extension offering ids, listed in
``status.extensionOfferings``): the decision names the next one to buy (``PlanDecision.extend``),
found again by a search from the ledger's blocks, and derives each entry's state from the ledger.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Mapping, Sequence

from hyperplan.api.models import (
    Condition, ExtensionOffering, ExtensionStatus, Offering as OfferingStatus, ReservedCapacity, TrainingPlanSpec,
    MAX_ADDED_ULTRASERVERS, TrainingPlanStatus, UltraServerReplacement, UltraServerStatus, UltraServerWanted,
)
from hyperplan.planning.blocks import Block
from hyperplan.api.vocabulary import (
    ULTRASERVER_INSTANCES, REASON_EXTENSION_NOT_OFFERED, REASON_REMOTE_EXTENDING, REASON_REMOTE_EXTENSION_FAILED, REASON_OFFERING_MISMATCH, REASON_OFFERING_NO_LONGER_OFFERED,
    REASON_OFFERING_NOT_FOUND, to_rfc3339,
)
from hyperplan.planning.offerings import (
    Extension, Offering, OfferingRequest, PoolSnapshot, RuleViolation, extension_held, find_extension, find_offering,
    could_be_offered, rank_key, rank_offerings, search_extensions, search_offerings, validate_request,
)
from hyperplan.planning import counts
from hyperplan.planning import naming
from hyperplan.planning import placement
from hyperplan.planning import recovery
from hyperplan.planning.policy import Policy, format_duration, parse_duration
from hyperplan.planning.schedule import PlanSchedule, plan_block_schedule

PENDING, SCHEDULED, ACTIVE, EXPIRED, FAILED = "Pending", "Scheduled", "Active", "Expired", "Failed"


@dataclass(frozen=True)
class PlanUsage:
    """What instance groups hold of the plan's current block (from the group and node watch)."""

    in_use: int = 0
    unhealthy: int = 0
    available_spares: int = 0
    ultra_servers: tuple[UltraServerStatus, ...] = ()
    unhealthy_spares: int = 0  # of ``unhealthy``: spares, which stand in for configured spares
    # UltraServers of the block the groups' nodes must leave with no free one to go to (the groups'
    # ``status.ultraServersWanted``: input to check, see :func:`ultraserver_to_buy`).
    wanted: tuple[UltraServerWanted, ...] = ()
    # The cloud's UltraServer behind each of the block's (by membership of the groups' lent
    # nodes, ``placement.cloud_ultraservers``): how the remote's UltraServer health finds them.
    cloud_ultraservers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class PlanDecision:
    status: TrainingPlanStatus
    buy: Offering | None = None
    events: list[Event] = field(default_factory=list)
    wake_at: datetime | None = None
    extend: Extension | None = None  # the extension of spec.extensions to buy now (one per pass)
    # An UltraServer to buy from the block's pool for the rest of the block (one per pass).
    add_ultraserver: Block | None = None


def current_block(purchased: Sequence[Block], target: str, policy: Policy,
                  now: datetime) -> Block | None:
    """The plan's block that runs at ``now``, else the next one; None after the last."""
    blocks = sorted(purchased, key=lambda p: p.start)
    schedule = plan_block_schedule([(p.start, p.end) for p in blocks], target, policy, now)
    return None if schedule.current_or_next_block is None else blocks[schedule.current_or_next_block]


def reserved_capacity(purchased: Sequence[Block], target: str, policy: Policy,
                      now: datetime) -> tuple[PlanSchedule, list[ReservedCapacity]]:
    """The plan's block schedule at ``now`` and its ``status.reservedCapacity``, from the blocks
    the ledger holds for it (never from its status, which others may write)."""
    blocks = sorted(purchased, key=lambda p: p.start)
    schedule = plan_block_schedule([(b.start, b.end) for b in blocks], target, policy, now)
    return schedule, [b.to_reserved(state.termination_time, state.status) for b, state in zip(blocks, schedule.blocks)]


def block_usage(block: Block, spares_per_ultraserver: int, nodes: Sequence[counts.ObservedNode],
                replacements: Sequence[UltraServerReplacement] = (),
                wanted: Sequence[UltraServerWanted] = ()) -> PlanUsage:
    """What the groups' nodes hold of ``block``: the plan's counts and one report per UltraServer,
    each replaced one naming its replacement (from the groups' ``replacements``, checked as the
    groups check them)."""
    ultraservers = placement.ultraservers_for_block(block.id, block.ultra_server_type, block.instances_with_additions,
                                                    spares_per_ultraserver)
    block_counts = counts.plan_counts(block.instances_with_additions, sum(u.spare_count for u in ultraservers), nodes)
    reports = counts.ultraserver_reports(ultraservers, block.availability_zone, nodes)
    replaced = recovery.block_replacements(replacements, block.id, [u.id for u in ultraservers])
    return PlanUsage(in_use=block_counts.in_use, unhealthy=block_counts.unhealthy, available_spares=block_counts.available_spares,
                     ultra_servers=tuple(UltraServerStatus.model_validate(
                         {**r.as_status(), **({"replacedBy": replaced[r.id].replacement} if r.id in replaced else {})})
                         for r in reports),
                     unhealthy_spares=sum(1 for n in nodes if n.healthy is False and n.role == naming.ROLE_SPARE),
                     wanted=tuple(wanted))


CONDITION_ULTRASERVER_ADDED = "UltraServerAdded"
REASON_ULTRASERVER_ADDED = "UltraServerAdded"
REASON_NO_ULTRASERVER_IN_POOL = "NoUltraServerInPool"


def addition_id(block_id: str, index: int) -> str:
    """The ledger id of the UltraServer bought for the rest of block ``block_id`` in place of its
    UltraServer of index ``index``: one per failed UltraServer, so that a retry buys nothing twice."""
    return f"{block_id}-r{index}"


def ultraserver_to_buy(block: Block, termination: datetime, usage: PlanUsage, now: datetime) -> Block | None:
    """The UltraServer to buy from the block's pool for the rest of ``block`` (the current one; it
    ends at ``termination`` for the groups), or None.

    The groups' ``ultraServersWanted`` are input to check: an entry counts only when it names this
    block and one of its UltraServers that the plan's own view of the nodes shows impaired or of
    unknown health, that is not replaced yet, and that no UltraServer was bought for before; and
    only while no UltraServer of the block is free (healthy, not replaced, none of the groups'
    nodes in use on it): the groups move to a free one without buying. The oldest entry first;
    one UltraServer a pass, at most ``MAX_ADDED_ULTRASERVERS`` per block."""
    unit = ULTRASERVER_INSTANCES.get(block.ultra_server_type or "")
    if unit is None or not usage.wanted or not block.start <= now < termination \
            or len(block.additions) >= MAX_ADDED_ULTRASERVERS:
        return None
    reports = {u.id: u for u in usage.ultra_servers}
    replaced = {u.id for u in usage.ultra_servers if u.replaced_by}
    targets = {u.replaced_by for u in usage.ultra_servers if u.replaced_by}
    if any(u.in_use_instance_count == 0 and u.health_status == "ok" and u.id not in replaced
           and u.id not in targets for u in usage.ultra_servers):
        return None
    index_of = {u.id: i for i, u in enumerate(usage.ultra_servers)}
    bought_for = {a.in_place_of for a in block.additions}
    for w in sorted(usage.wanted, key=lambda w: (w.since, w.failed)):
        report = reports.get(w.failed)
        if w.reserved_capacity_id != block.id or report is None or report.health_status == "ok" \
                or w.failed in replaced or w.failed in bought_for:
            continue
        return Block(pool=block.pool, availability_zone=block.availability_zone, instance_type=block.instance_type,
                     instance_count=unit, start=now.replace(microsecond=0), end=block.end,
                     ultra_server_type=block.ultra_server_type, id=addition_id(block.id, index_of[w.failed]),
                     adds_to=block.id, in_place_of=w.failed)
    return None


def added_condition(block: Block | None, generation: int, prior: Sequence[Condition],
                    now: datetime) -> Condition | None:
    """``UltraServerAdded`` True while the current block has UltraServers bought in place of failed
    ones (which, for which); absent otherwise (a refusal is written by :func:`addition_refused`)."""
    if block is None or not block.additions:
        return None
    return condition(CONDITION_ULTRASERVER_ADDED, True, REASON_ULTRASERVER_ADDED, "; ".join(
        f"UltraServer {naming.ultraserver_id(block.id, (block.ultra_server_count or 0) + i)} bought from pool "
        f"{a.pool} for the rest of block {block.id} (until {to_rfc3339(a.end)}) at {to_rfc3339(a.start)}"
        + (f", in place of {a.in_place_of}" if a.in_place_of else "") for i, a in enumerate(block.additions)),
        generation, prior, now)


def addition_refused(decision: PlanDecision, generation: int, prior: TrainingPlanStatus, addition: Block,
                     why: RuleViolation, now: datetime) -> PlanDecision:
    """The decision after the pool refused ``addition``: ``UltraServerAdded=False`` says why (the
    groups' own condition says that their nodes stay and are replaced in place), and a Warning
    Event the first time."""
    message = (f"no UltraServer of pool {addition.pool} to buy for the rest of block {addition.adds_to} in place "
               f"of {addition.in_place_of}: {why.message}")
    status = decision.status.model_copy(deep=True)
    status.conditions = [c for c in status.conditions if c.type != CONDITION_ULTRASERVER_ADDED]
    status.conditions.append(condition(CONDITION_ULTRASERVER_ADDED, False, REASON_NO_ULTRASERVER_IN_POOL, message,
                                       generation, prior.conditions, now))
    events = list(decision.events)
    if _reason(prior, CONDITION_ULTRASERVER_ADDED) != REASON_NO_ULTRASERVER_IN_POOL:
        events.append(Event("Warning", REASON_NO_ULTRASERVER_IN_POOL, message))
    return PlanDecision(status=status, events=events, wake_at=decision.wake_at)


def request_of(spec: TrainingPlanSpec, duration: timedelta) -> OfferingRequest:
    return OfferingRequest(
        instance_type=spec.instance_type, instance_count=spec.instance_count,
        ultra_server_type=spec.ultra_server_type, ultra_server_count=spec.ultra_server_count,
        target=spec.target_resource, duration=duration,
        start_after=spec.start_time_after, end_before=spec.end_time_before)


def condition(type_: str, ok: bool, reason: str, message: str, generation: int,
              prior: Sequence[Condition], now: datetime) -> Condition:
    """A condition whose lastTransitionTime moves only when its status flips."""
    status = "True" if ok else "False"
    before = next((c for c in prior if c.type == type_), None)
    since = before.last_transition_time if before and before.status == status else now
    return Condition(type=type_, status=status, reason=reason, message=message,
                     last_transition_time=since, observed_generation=generation)


def decide_plan(spec: TrainingPlanSpec, generation: int, prior: TrainingPlanStatus,
                purchased: Sequence[Block], pools: Sequence[PoolSnapshot], policy: Policy,
                now: datetime, usage: PlanUsage = PlanUsage(), uid: str = "",
                remote: Sequence[Offering] = (), remote_extensions: Sequence[Extension] = (),
                extending: Mapping[str, str] | None = None) -> PlanDecision:
    """``uid`` is the plan's metadata.uid: extension offering ids are cut for one plan, so without it
    (a caller that only searches) a bought plan's extensions are neither offered nor decided, and
    the status keeps what the last pass wrote of them. ``remote`` are the offerings remote pools'
    endpoints answered in this pass (planning.remote): ranked with the local ones, and the only
    place an ``offeringId`` of a remote pool is found. ``remote_extensions`` are the extension
    offerings a remote answered for the plan's last block (planning.remote.extensions_offered),
    the only place an extension of a remote block is found; ``extending``, the extensions the
    remote has taken that the blocks do not show yet, by local id, with the remote's status
    (planning.remote.extensions_underway)."""
    if purchased:
        decision = _bought(spec, generation, prior, purchased, policy, now, usage)
        if not uid:
            decision.status.extensions = list(prior.extensions)
            return decision
        decision.status.extension_offerings = [
            ExtensionOffering(id=e.id, reserved_capacity_id=e.block.id, capacity_pool=e.block.pool,
                              availability_zone=e.block.availability_zone, start_time=e.start, end_time=e.end,
                              duration_days=e.days)
            for e in [*search_extensions(uid, purchased, pools, policy, now), *remote_extensions]]
        if spec.extensions or prior.extensions:
            _decide_extensions(decision, spec, generation, prior, uid, purchased, pools, policy, now,
                               remote_extensions, extending or {})
        return decision
    if prior.phase == FAILED and prior.observed_generation == generation:
        return PlanDecision(status=prior)
    try:
        duration = parse_duration(spec.duration)
    except ValueError as e:
        return failed(prior, generation, RuleViolation("InvalidDuration", str(e)), now)
    request = request_of(spec, duration)
    violations = validate_request(request, policy, now)
    if violations:
        return failed(prior, generation, RuleViolation(
            violations[0].reason, "; ".join(v.message for v in violations)), now)

    offerings = search_offerings(request, pools, policy, now)
    if remote:
        offerings = rank_offerings([*offerings, *remote])
    shown = [o.to_status() for o in offerings]
    wake = min((o.start - policy.min_purchase_lead for o in offerings), default=None)
    if spec.offering_id:
        wanted = next((o for o in [*offerings, *remote] if o.id == spec.offering_id), None) \
            or find_offering(request, pools, policy, now, spec.offering_id)
        why = refusal(spec.offering_id, wanted, request, prior.offerings)
        if why is not None:
            refused = failed(prior, generation, why, now)
            refused.status.offerings = shown
            return refused
        return _pending(spec, generation, prior, shown, now, buy=wanted, wake=None)
    if spec.auto_purchase and offerings:
        return _pending(spec, generation, prior, shown, now, buy=_auto_pick(offerings, remote, uid), wake=None)
    return _pending(spec, generation, prior, shown, now, buy=None, wake=wake)


def _auto_pick(offerings: Sequence[Offering], remote: Sequence[Offering], uid: str) -> Offering:
    """The offering an ``autoPurchase`` plan buys: the best. When the best are a remote's and
    several are equally good (the same end, as many blocks and zones, in other pools), each plan
    takes one of them by its uid: plans searching a remote at the same moment are answered the
    same offerings, and all buying the first made all but one lose the race at the remote and
    search again (a local pool's ledger re-checks a batch at once instead, so local plans take the
    first)."""
    best = offerings[0]
    remote_ids = {o.id for o in remote}
    if best.id not in remote_ids or not uid:
        return best
    equal = [o for o in offerings if o.id in remote_ids and rank_key(o)[:4] == rank_key(best)[:4]]
    return equal[int(hashlib.sha256(uid.encode()).hexdigest()[:8], 16) % len(equal)]


def refusal(wanted: str, found: Offering | None, request: OfferingRequest,
            listed: Sequence[OfferingStatus]) -> RuleViolation | None:
    """Why the offering ``spec.offeringId`` (``wanted``) names is not bought, or None to buy
    ``found``, what the search again found under that id. ``listed`` is the plan's
    ``status.offerings``, which anyone allowed to write the status may have rewritten: it never
    says what is bought, but a listing of ``wanted`` that differs from ``found`` refuses the
    purchase, since the user may have chosen by what it showed."""
    entry = next((o for o in listed if o.id == wanted), None)
    if found is not None and (entry is None or Offering.from_status(entry) == found):
        return None
    if entry is None:
        return RuleViolation(REASON_OFFERING_NOT_FOUND, f"offering {wanted} is not among this plan's offerings")
    if found is not None or not could_be_offered(entry, request):
        return RuleViolation(REASON_OFFERING_MISMATCH, (
            f"offering {wanted} as status.offerings lists it ({_blocks_text(entry)}) does not match the spec "
            f"({_request_text(request)}) and the pools: the operator's search did not list it; nothing was bought"))
    return RuleViolation(REASON_OFFERING_NO_LONGER_OFFERED, (
        f"offering {wanted} is no longer offered: a search again from the spec and the pools does not "
        "find it (its capacity was sold, its pool changed, or it starts too soon to buy); nothing was bought"))


def _blocks_text(entry: OfferingStatus) -> str:
    return " + ".join(f"{b.instance_count} x {b.instance_type} in {b.capacity_pool or '?'} "
                      f"{to_rfc3339(b.start_time)} to {to_rfc3339(b.end_time)}" for b in entry.blocks) or "no blocks"


def _request_text(request: OfferingRequest) -> str:
    what = (f"{request.ultra_server_count} x {request.ultra_server_type}" if request.is_ultra_server
            else f"{request.instance_count} x {request.instance_type}")
    return f"{what} for {format_duration(request.duration)}"


def failed(prior: TrainingPlanStatus, generation: int, why: RuleViolation, now: datetime) -> PlanDecision:
    status = prior.model_copy(deep=True)
    status.phase = FAILED
    status.next_transition_time = None
    status.observed_generation = generation
    status.conditions = [
        condition("Failed", True, why.reason, why.message, generation, prior.conditions, now),
        condition("Purchased", False, why.reason, why.message, generation, prior.conditions, now),
    ]
    events = [] if prior.phase == FAILED and _reason(prior, "Failed") == why.reason else [
        Event("Warning", why.reason, why.message)]
    return PlanDecision(status=status, events=events)


def _reason(status: TrainingPlanStatus, type_: str) -> str | None:
    return next((c.reason for c in status.conditions if c.type == type_), None)


def _pending(spec: TrainingPlanSpec, generation: int, prior: TrainingPlanStatus,
             shown: list[OfferingStatus], now: datetime, buy: Offering | None,
             wake: datetime | None) -> PlanDecision:
    found = bool(shown)
    message = (f"{len(shown)} offering(s) found; set spec.offeringId to buy one, or spec.autoPurchase"
               if found else "no capacity fits the request in the window; searching again when pools change")
    status = TrainingPlanStatus(
        phase=PENDING, offerings=shown, next_transition_time=None, observed_generation=generation,
        extensions=[ExtensionStatus(offering_id=e.offering_id, reason="NotPurchased",
                                    message="the plan is not bought yet: only a bought plan can be extended")
                    for e in spec.extensions],
        conditions=[
            condition("OfferingsAvailable", found, "OfferingsFound" if found else "NoCapacity",
                      message, generation, prior.conditions, now),
            condition("Purchased", False, "Purchasing" if buy else "NotPurchased",
                      f"buying offering {buy.id}" if buy else "no offering bought yet",
                      generation, prior.conditions, now),
        ])
    events = []
    if not found and _reason(prior, "OfferingsAvailable") != "NoCapacity":
        events.append(Event("Normal", "NoCapacity", message))
    if found and _reason(prior, "OfferingsAvailable") != "OfferingsFound":
        events.append(Event("Normal", "OfferingsFound", message))
    return PlanDecision(status=status, buy=buy, events=events, wake_at=wake)


def _bought(spec: TrainingPlanSpec, generation: int, prior: TrainingPlanStatus,
            purchased: Sequence[Block], policy: Policy, now: datetime,
            usage: PlanUsage) -> PlanDecision:
    schedule, reserved = reserved_capacity(purchased, spec.target_resource, policy, now)
    at = schedule.current_or_next_block
    current = reserved[at] if at is not None else None
    block = sorted(purchased, key=lambda p: p.start)[at] if at is not None else None
    total = block.instances_with_additions if block else 0
    ultraservers = ((current.ultra_server_count or 0) + len(current.added_ultra_servers or ())) if current else 0
    spares = ultraservers * spec.spare_instances_per_ultra_server
    phase = schedule.phase
    status = TrainingPlanStatus(
        phase=phase, offerings=prior.offerings,
        purchased_offering_id=prior.purchased_offering_id or spec.offering_id or None,
        reserved_capacity=reserved,
        availability_zone=current.availability_zone if current else reserved[-1].availability_zone,
        total_instance_count=total,
        in_use_instance_count=usage.in_use,
        unhealthy_instance_count=usage.unhealthy,
        available_spare_instance_count=usage.available_spares,
        available_instance_count=counts.available_instances(total, usage.in_use, usage.unhealthy, spares,
                                                        usage.unhealthy_spares),
        total_ultra_server_count=ultraservers if current and current.ultra_server_count is not None else None,
        ultra_servers=list(usage.ultra_servers),
        next_transition_time=schedule.next_transition_time,
        observed_generation=generation,
        conditions=[
            condition("Purchased", True, "Purchased",
                      f"{len(reserved)} reserved-capacity block(s) bought", generation, prior.conditions, now),
            condition("Active", phase == ACTIVE, phase,
                      _phase_message(phase, current), generation, prior.conditions, now),
        ])
    added = added_condition(block, generation, prior.conditions, now)
    if added is not None:
        status.conditions.append(added)
    events = []
    if prior.phase != phase:
        events.append(Event("Normal", phase, _phase_message(phase, current)))
    before = {r.id: r.status for r in prior.reserved_capacity}
    for r in reserved:
        if r.id in before and before[r.id] != r.status:
            events.append(Event("Normal", f"Block{r.status}",
                                f"reserved capacity {r.id} ({r.instance_count} x {r.instance_type} in "
                                f"{r.availability_zone}) is {r.status}"))
    buy = ultraserver_to_buy(block, schedule.blocks[at].termination_time, usage, now) \
        if block is not None and phase == ACTIVE else None
    if buy is None and _reason(prior, CONDITION_ULTRASERVER_ADDED) == REASON_NO_ULTRASERVER_IN_POOL and added is None \
            and usage.wanted:  # still wanted, nothing to buy this pass: the refusal stands
        status.conditions.extend(c for c in prior.conditions if c.type == CONDITION_ULTRASERVER_ADDED)
    return PlanDecision(status=status, events=events, wake_at=schedule.next_transition_time, add_ultraserver=buy)


def _phase_message(phase: str, current: ReservedCapacity | None) -> str:
    if current is None:
        return "all blocks have ended"
    if phase == ACTIVE:
        return (f"block {current.id} runs until {current.end_time.isoformat()} "
                f"({current.instance_count} x {current.instance_type} in {current.availability_zone})")
    return f"next block {current.id} starts at {current.start_time.isoformat()}"


# --------------------------------------------------------------------------- extensions


def _decide_extensions(decision: PlanDecision, spec: TrainingPlanSpec, generation: int,
                       prior: TrainingPlanStatus, uid: str, purchased: Sequence[Block],
                       pools: Sequence[PoolSnapshot], policy: Policy, now: datetime,
                       remote_extensions: Sequence[Extension] = (), extending: Mapping[str, str] = {}) -> None:
    """``status.extensions``, the ``Extended`` condition and the extension to buy, into ``decision``.

    Each entry of ``spec.extensions``, in order: bought when the ledger's blocks already hold it
    (:func:`~hyperplan.planning.offerings.extension_held`; its status then follows from the
    clock); failed when the last pass recorded it failed (a remembered verdict, as a plan's
    ``Failed``: never retried silently); being bought when a remote has taken it and the blocks
    do not show it yet (``extending``: never bought again meanwhile; failed if the remote says it
    failed); else, for the first such entry, bought now if a search again from the ledger's
    blocks and the pools cuts it (``find_extension``), or a remote offers it now
    (``remote_extensions``), failed if not. Later entries wait for it: each extends the block as
    the one before leaves it."""
    before = {e.offering_id: e for e in prior.extensions}
    entries: list[ExtensionStatus] = []
    underway: str | None = None  # an extension the remote is buying: later entries wait for it
    for entry in spec.extensions:
        wanted, seen = entry.offering_id, before.get(entry.offering_id)
        held = extension_held(uid, purchased, policy, wanted)
        if held is not None:
            state = SCHEDULED if now < held.start else ACTIVE if now < held.end else EXPIRED
            entries.append(_entry(held, state, extended_at=(seen.extended_at if seen and seen.extended_at else now)))
            if seen is None or seen.status in (PENDING, FAILED):
                decision.events.append(Event("Normal", "Extended", _extension_text(held, "extended")))
            continue
        if seen is not None and seen.status == FAILED:
            entries.append(seen)
            continue
        if decision.extend is not None or underway is not None:
            first = decision.extend.id if decision.extend is not None else underway
            entries.append(ExtensionStatus(offering_id=wanted, reason="Waiting",
                                           message=f"waits for extension {first} before it"))
            continue
        remote_state = extending.get(wanted)
        if remote_state == FAILED:
            why = RuleViolation(REASON_REMOTE_EXTENSION_FAILED, (
                f"the remote endpoint took extension {wanted} and then failed it; its block was not extended"))
            entries.append(ExtensionStatus(offering_id=wanted, status=FAILED, reason=why.reason, message=why.message))
            decision.events.append(Event("Warning", why.reason, why.message))
            continue
        if remote_state is not None:
            underway = wanted
            entries.append(ExtensionStatus(
                offering_id=wanted, reason=REASON_REMOTE_EXTENDING, extended_at=seen.extended_at if seen else None,
                message=(f"the remote endpoint holds extension {wanted} ({remote_state}); waiting for its block "
                         "to show the new end")))
            continue
        found = find_extension(uid, purchased, pools, policy, now, wanted) or next(
            (e for e in remote_extensions if e.id == wanted), None)
        if found is None:
            why = RuleViolation(REASON_EXTENSION_NOT_OFFERED, (
                f"extension offering {wanted} is not offered for this plan now: a search again from its last "
                "block in the ledger and the pools does not cut it (another plan's or block's id, its room was "
                "sold, or it starts too soon to buy); nothing was bought"))
            entries.append(ExtensionStatus(offering_id=wanted, status=FAILED, reason=why.reason, message=why.message))
            decision.events.append(Event("Warning", why.reason, why.message))
            continue
        decision.extend = found
        entries.append(_entry(found, PENDING, reason="Extending", message=_extension_text(found, "buying")))
    decision.status.extensions = entries
    _extension_condition(decision.status, generation, prior, now)


def extension_wanted(spec: TrainingPlanSpec, prior: TrainingPlanStatus, uid: str, blocks: Sequence[Block],
                     policy: Policy) -> bool:
    """Whether ``spec.extensions`` names an extension of a bought plan that its blocks do not hold
    and that the last pass did not fail: one to buy, or being bought."""
    failed = {e.offering_id for e in prior.extensions if e.status == FAILED}
    return bool(blocks) and any(e.offering_id not in failed and extension_held(uid, blocks, policy, e.offering_id) is None
                                for e in spec.extensions)


def extension_failed(decision: PlanDecision, generation: int, prior: TrainingPlanStatus, wanted: str,
                     why: RuleViolation, now: datetime) -> PlanDecision:
    """The decision after the ledger refused the extension ``wanted``: that entry failed (kept so,
    not retried), the ``Extended`` condition says why, and a Warning Event."""
    status = decision.status.model_copy(deep=True)
    for i, e in enumerate(status.extensions):
        if e.offering_id == wanted:
            status.extensions[i] = e.model_copy(update={"status": FAILED, "reason": why.reason,
                                                        "message": f"{why.message}; nothing was bought"})
    _extension_condition(status, generation, prior, now)
    return PlanDecision(status=status, events=[*decision.events, Event("Warning", why.reason, why.message)],
                        wake_at=decision.wake_at)


def _entry(ext: Extension, state: str, *, extended_at: datetime | None = None, reason: str | None = None,
           message: str | None = None) -> ExtensionStatus:
    return ExtensionStatus(offering_id=ext.id, status=state, reason=reason, message=message,
                           extended_at=extended_at, reserved_capacity_id=ext.block.id,
                           availability_zone=ext.block.availability_zone, start_time=ext.start, end_time=ext.end,
                           duration_days=ext.days)


def _extension_text(ext: Extension, verb: str) -> str:
    return (f"{verb} block {ext.block.id} ({ext.block.instance_count} x {ext.block.instance_type} in "
            f"{ext.block.availability_zone}) from {to_rfc3339(ext.start)} to {to_rfc3339(ext.end)} "
            f"(extension {ext.id})")


def _extension_condition(status: TrainingPlanStatus, generation: int, prior: TrainingPlanStatus,
                         now: datetime) -> None:
    """``Extended``, from the latest entry: True once it is bought, else why not (yet)."""
    status.conditions = [c for c in status.conditions if c.type != "Extended"]
    if not status.extensions:
        return
    last = status.extensions[-1]
    bought = last.status in (SCHEDULED, ACTIVE, EXPIRED)
    message = (f"extension {last.offering_id} runs block {last.reserved_capacity_id} until "
               f"{to_rfc3339(last.end_time)}" if bought and last.end_time else last.message or "")
    status.conditions.append(condition("Extended", bought, "Extended" if bought else (last.reason or last.status),
                                       message, generation, prior.conditions, now))
