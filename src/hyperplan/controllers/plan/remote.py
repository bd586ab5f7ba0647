"""The remote half of a plan's pass: pools whose capacity a remote source sells.

A remote source is a SageMaker Training Plans endpoint or EC2 Capacity Blocks; this module sees
either through one protocol (:class:`~hyperplan.actuation.remote.CapacitySeller`: find_offerings, buy,
remote plans), made for the pool's ``spec.source`` by ``rt.remote`` (actuation.remote.RemoteSources),
and never asks which kind it is. Below, "remote plan" is a SageMaker training plan, or the capacity
reservations one EC2 purchase made (planning.capacity_blocks).

A plan that may buy from a remote pool (its ``trainingPlanSelector`` lets it, and the pool sells
the plan's instance or UltraServer type) looks at the remote in its pass, in a purchase thread:

1. **Follow** (:func:`look`): the remote plans its uid named, from the pool's paced listing
   (:class:`~hyperplan.actuation.remote.RemoteFollower`). The blocks of the live one are recorded
   as the plan's lines of the pool's ledger (``KubeLedger.record_remote``), so that the groups,
   the Kueue controller and the plan's status read them as they read a local pool's; a remote plan
   that failed or whose blocks changed rewrites the lines. A live remote plan that holds no block
   yet (the remote buys after CreateTrainingPlan answers) keeps the plan Pending, waiting.
2. **Search**, only while the plan holds nothing live there: one search with the plan's request
   (SearchTrainingPlanOfferings, DescribeCapacityBlockOfferings), the answers filtered by the
   pool's type and zone (by the seller) and its fee ceiling (planning.remote.within_fee), ranked
   with the local offerings by decide_plan.
3. **Buy** (:func:`buy`) when the decision picks a remote offering, under the name of the next
   attempt (the seller never buys twice for a plan: see CapacitySeller.buy), recorded as in 1.

Nothing here is read from the plan's status: the remote's answers and the pool's spec decide.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Mapping, Sequence

from hyperplan.actuation.remote.calls import CapacitySeller, NotBought, RemoteError
from hyperplan.api.models import CapacityPool, TrainingPlanSpec
from hyperplan.api.vocabulary import (
    REASON_EXTENSION_NOT_OFFERED, REASON_OFFERING_UNAVAILABLE, TAG_TRAINING_PLAN, TAG_TRAINING_PLAN_UID,
)
from hyperplan.planning.blocks import Block
from hyperplan.planning.offerings import Extension, Offering, OfferingRequest, RuleViolation, matching_pools
from hyperplan.planning.policy import Policy
from hyperplan.planning.remote import (
    MAX_ATTEMPTS, ExtensionRecord, PoolTerms, RemoteExtension, RemoteOffering, RemotePlan, RemoteStanding,
    behind_the_clock, extension_not_shown, extensions_underway, mirror_lines, pool_sells, remote_plan_name, same_lines,
    standing_of, within_fee,
)

log = logging.getLogger("hyperplan.trainingplan")

WAITING_AGE = 2.0  # seconds: how old a listing a plan waiting for the remote to buy accepts (its wait)
FOLLOW_AGE = 5.0  # seconds: for a plan that holds blocks (at a boundary, many plans share a listing)


@dataclass
class RemoteLook:
    """What the remote pools hold and offer for one plan in this pass."""

    blocks: list[Block] | None = None  # the plan's blocks after a record changed them (None: unchanged)
    waiting: tuple[RemotePlan, str] | None = None  # a live remote plan without blocks yet, and its endpoint
    behind: bool = False  # the remote's answer is behind the clock (a block past its start not Active yet)
    offerings: list[RemoteOffering] = field(default_factory=list)
    next_attempt: dict[str, int] = field(default_factory=dict)  # by pool
    exhausted: list[str] = field(default_factory=list)  # pools where MAX_ATTEMPTS remote plans failed
    notes: list[str] = field(default_factory=list)  # what was not believed or not bought, for the log
    # Extensions of the plan's last block, when a remote holds it: what the remote offers now,
    # what it has taken that the blocks do not show yet (by local id, with its status), and the
    # remote plan they extend.
    extensions: list[RemoteExtension] = field(default_factory=list)
    extending: dict[str, str] = field(default_factory=dict)
    extended_plan: RemotePlan | None = None
    # The remote's health of the running UltraServer block's UltraServers, by id (empty: none told).
    ultra_health: dict[str, str] = field(default_factory=dict)

    def extension(self, ext: Extension | None) -> RemoteExtension | None:
        return next((r for r in self.extensions if ext is not None and r.extension.id == ext.id), None)

    def offering(self, offering: Offering | None) -> RemoteOffering | None:
        return next((r for r in self.offerings if offering is not None and r.offering.id == offering.id), None)


def remote_pools(pool_objects: Sequence[Mapping[str, Any]], allowed: set[str],
                 parse: Callable[[Any], "CapacityPool | None"] | None = None) -> list[CapacityPool]:
    """The remote pools among ``pool_objects`` whose names are in ``allowed`` (the plan may buy),
    each parsed by ``parse`` (the watch cache's, which parses a pool version once: WatchCache.pool_model);
    one that does not parse sells nothing (the schema keeps these out)."""
    out = []
    for obj in pool_objects:
        if not (obj.get("spec") or {}).get("source") or obj["metadata"]["name"] not in allowed:
            continue
        pool = (parse or CapacityPool.parsed_or_none)(obj)
        if pool is not None:
            out.append(pool)
    return out


def _endpoint(pool: CapacityPool) -> tuple:
    source = pool.spec.source.remote
    return (source.field_name, source.endpoint, source.region, source.credentials_secret)


def look(rt: Any, pools: Sequence[CapacityPool], snapshots: Sequence[Any], name: str, uid: str,
         spec: TrainingPlanSpec, request: OfferingRequest | None, holds: set[str], search: bool,
         purchased: Sequence[Block] = (), extending: bool = False) -> RemoteLook:
    """Follow the plan's remote plans in ``pools`` and, with ``search``, search where it holds
    nothing live (sync: a purchase thread). ``holds``: the pools where its lines are now
    (``purchased``: its blocks there). ``request`` is None when the spec cannot be searched (the
    decision then says why). ``extending``: ``spec.extensions`` names one the blocks do not hold
    yet (planning.plans.extension_wanted), so the remote's extension history is read and its
    extension offerings searched now, not paced.

    Pools that name one endpoint and key (one per zone of a capacity cluster, say) are one
    seller: its remote plans are listed once, each block is recorded in the pool of its type and
    zone, and one search serves them all, its answer split by pool."""
    seen = RemoteLook()
    followed: dict[str, tuple[CapacitySeller, RemotePlan, CapacityPool]] = {}  # by pool: a live plan's seller
    records: list[ExtensionRecord] = []
    by_name = {s.name: s for s in snapshots}
    sells = {p.name for p in matching_pools(request, [by_name[p.metadata["name"]] for p in pools])} \
        if request is not None else set()
    sellers: dict[tuple, list[CapacityPool]] = {}
    for pool in pools:
        if pool.metadata["name"] in holds or pool.metadata["name"] in sells:
            sellers.setdefault(_endpoint(pool), []).append(pool)
    for group in sellers.values():
        first, source = group[0].metadata["name"], group[0].spec.source.remote
        capacity = rt.remote.capacity(first, source)
        age = FOLLOW_AGE if any(p.metadata["name"] in holds for p in group) else WAITING_AGE
        now = rt.clock()
        standing = _fresh(rt, first, source, rt.remote.plans(first, source, age), uid, age, now)
        held_here = any(p.metadata["name"] in holds for p in group)
        if extending and held_here and standing.live is not None and standing.live.blocks:
            taken = capacity.extension_history(standing.live)
            records += taken
            if extension_not_shown(taken, standing.live):  # the remote took it: read its plan, not the listing
                fresh = rt.remote.describe(first, source, standing.live.name, uid, older_than=WAITING_AGE)
                if fresh is not None:
                    standing = standing_of([fresh, *standing.failed], uid)
        seen.behind = seen.behind or (standing.live is not None and behind_the_clock(standing.live, now))
        recorded = False
        for pool in group:
            lines, _ = mirror_lines(standing.live, name, uid, pool.spec.instance_type,
                                    pool.spec.availability_zone) if standing.live else ([], [])
            recorded = recorded or bool(lines)
            mine = [r for r in pool.status.reservations if r.training_plan_uid == uid]
            if not same_lines([r.wire() for r in mine], [r.wire() for r in lines]):
                seen.blocks = rt.ledger.record_remote(pool.metadata["name"], name, uid, lines)
            seen.next_attempt[pool.metadata["name"]] = standing.next_attempt
        if standing.live is not None:
            seen.notes += [f"block {b.arn} is {b.instance_count} x {b.instance_type} in {b.availability_zone or '?'}, "
                           "not what any pool of its endpoint sells" for b in standing.live.blocks
                           if not any(pool_sells(b, p.spec.instance_type, p.spec.availability_zone) for p in group)]
            if standing.live.live and not recorded:
                seen.waiting = (standing.live, capacity.endpoint)
            if held_here and standing.live.live and recorded:
                followed.update({p.metadata["name"]: (capacity, standing.live, p) for p in group})
        if standing.exhausted:
            seen.exhausted += [p.metadata["name"] for p in group]
            continue
        selling = [p for p in group if p.metadata["name"] in sells]
        if not (search and standing.live is None and selling and request is not None):
            continue
        terms = [PoolTerms(p.metadata["name"], p.spec.instance_type, p.spec.availability_zone,
                           p.spec.ultra_server_type) for p in selling]
        ceilings = {p.metadata["name"]: p.spec.source.remote.max_upfront_fee for p in selling}
        for offering in capacity.find_offerings(request, rt.policy, terms):
            pool_name = offering.offering.blocks[0].pool
            ceiling = ceilings.get(pool_name)
            if pool_name not in ceilings:
                continue  # a seller that answers for a pool it was not asked about is not believed
            if within_fee(offering, ceiling):
                seen.offerings.append(offering)
            else:
                seen.notes.append(f"offering {offering.offering.id} of pool {pool_name} costs "
                                  f"{offering.upfront_fee or 'an unknown fee'} {offering.currency or ''}, "
                                  f"above the pool's maxUpfrontFee {ceiling}")
    _look_at_extensions(rt, seen, uid, seen.blocks if seen.blocks is not None else list(purchased), followed,
                        records, extending)
    _look_at_ultra_servers(rt, seen, uid, followed)
    return seen


ULTRASERVERS_EVERY = 60.0  # seconds: a running UltraServer block's UltraServers listed at the remote at most this often


def _look_at_ultra_servers(rt: Any, seen: RemoteLook, uid: str,
                           followed: Mapping[str, tuple[CapacitySeller, RemotePlan, CapacityPool]]) -> None:
    """The remote's health of the UltraServers of the plan's running UltraServer block
    (ListUltraServersByReservedCapacity, paced to :data:`ULTRASERVERS_EVERY`; planning.remote,
    "UltraServers"). A failed listing keeps the last answer and fails nothing: the plan's own
    counts come from its nodes."""
    now = rt.clock()
    running = [(capacity, b) for capacity, remote, _ in followed.values() for b in remote.blocks
               if b.ultra_server_type and b.start <= now < b.end]
    if not running:
        rt.remote.ultra_health.pop(uid, None)
        return
    capacity, block = running[0]
    cached = rt.remote.ultra_health.get(uid)
    if cached is not None and cached[1] == block.arn and now.timestamp() - cached[0] < ULTRASERVERS_EVERY:
        seen.ultra_health = cached[2]
        return
    try:
        health = capacity.ultra_server_health(block)
    except RemoteError as e:
        seen.notes.append(f"the UltraServers of block {block.arn} could not be listed: {e}")
        seen.ultra_health = cached[2] if cached is not None and cached[1] == block.arn else {}
        return
    rt.remote.ultra_health[uid] = (now.timestamp(), block.arn, health)
    seen.ultra_health = health


EXTENSION_OFFERS_EVERY = 60.0  # seconds: a plan's remote extension offerings searched again at most this often


def _look_at_extensions(rt: Any, seen: RemoteLook, uid: str, blocks: Sequence[Block],
                        followed: Mapping[str, tuple[CapacitySeller, RemotePlan, CapacityPool]],
                        records: Sequence[ExtensionRecord], extending: bool) -> None:
    """The extension offerings of the plan's last block when a remote holds it (one search with
    the remote plan's ARN; paced to :data:`EXTENSION_OFFERS_EVERY` unless an extension is to be
    bought now), those above the pool's fee ceiling left out, and the extensions the remote took
    that the blocks do not show yet."""
    if not blocks:
        return
    last = max(blocks, key=lambda b: (b.end, b.start))
    if last.pool not in followed:
        return
    capacity, remote, pool = followed[last.pool]
    seen.extended_plan = remote
    seen.extending = extensions_underway(records, uid, blocks)
    cut = (last.id, last.end)
    cached = rt.remote.extension_offers.get(uid)
    if not extending and cached is not None and cached[1] == cut and rt.clock().timestamp() - cached[0] \
            < EXTENSION_OFFERS_EVERY:
        offered = cached[2]
    else:
        offered = capacity.find_extensions(remote, uid, blocks, rt.policy)
        rt.remote.extension_offers[uid] = (rt.clock().timestamp(), cut, offered)
    ceiling = pool.spec.source.remote.max_upfront_fee
    for ext in offered:
        if within_fee(ext, ceiling):
            seen.extensions.append(ext)
        else:
            seen.notes.append(f"extension {ext.extension.id} of block {last.id} costs {ext.upfront_fee or 'an unknown fee'} "
                              f"{ext.currency or ''}, above pool {last.pool}'s maxUpfrontFee {ceiling}")


def _fresh(rt: Any, pool: str, source: Any, listed: Sequence[RemotePlan], uid: str, age: float,
           now: datetime) -> RemoteStanding:
    """The plan's standing at the remote from the shared listing, and from its live remote plan's
    own answer when the listing is older than the plan accepts (``age``) and either that plan holds
    no block yet (it waits for the remote to buy) or the listing is behind the clock (a boundary
    passed). The follower lists again no sooner than ten times as long as the last listing took;
    under a full e2e run's load one listing served for over a minute: a block the remote held 0.6 s
    after the create reached the plan 74 s later, and its start 23 s late."""
    standing = standing_of(listed, uid)
    live = standing.live
    if live is None or not live.live or (live.blocks and not behind_the_clock(live, now)):
        return standing
    fresh = rt.remote.describe(pool, source, live.name, uid, older_than=age)
    if fresh is None:
        return standing
    return standing_of([fresh if p.name == fresh.name else p for p in listed], uid)


@dataclass(frozen=True)
class RemoteBuy:
    blocks: list[Block] | None = None  # bought and recorded
    waiting: tuple[RemotePlan, str] | None = None  # bought, the remote holds no block yet
    violation: RuleViolation | None = None  # not bought: why (a lost race searches again)


def buy(rt: Any, pool: CapacityPool, name: str, uid: str, spec: TrainingPlanSpec, offering: RemoteOffering,
        attempt: int) -> RemoteBuy:
    """Buy ``offering`` under the name of ``attempt`` and record what the remote holds then (sync: a
    purchase thread). Safe to repeat: the seller answers what it holds for the plan instead of
    buying again, and a name the listing had not shown yet is found by the next pass."""
    pool_name = pool.metadata["name"]
    if attempt >= MAX_ATTEMPTS:
        return RemoteBuy(violation=RuleViolation("RemotePurchaseFailed", (
            f"{MAX_ATTEMPTS} remote training plans of this plan failed at pool {pool_name}'s endpoint")))
    source = pool.spec.source.remote
    capacity = rt.remote.capacity(pool_name, source)
    remote_name = remote_plan_name(uid, attempt)
    spares = spec.spare_instances_per_ultra_server if spec.ultra_server_type else None  # plain instances: none
    try:
        remote = capacity.buy(remote_name, uid, offering, spares, {TAG_TRAINING_PLAN: name, TAG_TRAINING_PLAN_UID: uid})
    except NotBought as e:  # sold meanwhile, or something of ours the listing did not show: read it again
        rt.remote.forget(pool_name, source)
        return RemoteBuy(violation=RuleViolation(REASON_OFFERING_UNAVAILABLE, str(e)))
    rt.remote.saw(pool_name, source, remote)
    lines, _ = mirror_lines(remote, name, uid, pool.spec.instance_type, pool.spec.availability_zone)
    if not lines:
        return RemoteBuy(waiting=(remote, capacity.endpoint))
    return RemoteBuy(blocks=rt.ledger.record_remote(pool_name, name, uid, lines))


EXTEND_UNKNOWN_HOLD = 120.0  # seconds an ExtendTrainingPlan whose answer was lost holds the plan's next one
ANSWER_LOST = "AnswerLost"  # the remote's status of an extension asked for whose answer was lost


@dataclass(frozen=True)
class RemoteExtend:
    blocks: list[Block] | None = None  # the plan's blocks as recorded after (None: unchanged)
    taken: dict[str, str] = field(default_factory=dict)  # the extension the remote took, by local id: its status
    violation: RuleViolation | None = None  # not bought: why


def extend(rt: Any, pool: CapacityPool, name: str, uid: str, remote: RemotePlan,
           extension: RemoteExtension) -> RemoteExtend:
    """Buy ``extension`` of the remote plan (ExtendTrainingPlan, once: no retries) and record the
    remote plan as it answers then (sync: a purchase thread). Never asked twice for one plan while
    an answer is unknown: a call whose answer was lost (a timeout, a 5xx) holds the plan's next
    extension for :data:`EXTEND_UNKNOWN_HOLD`, unless the remote's history shows it meanwhile (the
    pass reads it first). A refusal (no right, no longer offered) fails the entry, not the pass."""
    pool_name, source, local_id = pool.metadata["name"], pool.spec.source.remote, extension.extension.id
    now = rt.clock().timestamp()
    since = rt.remote.extension_unknown.get(uid)
    if since is not None and now - since < EXTEND_UNKNOWN_HOLD:
        return RemoteExtend(taken={local_id: ANSWER_LOST})
    capacity = rt.remote.capacity(pool_name, source)
    try:
        capacity.extend(remote, extension)
    except NotBought as e:
        return RemoteExtend(violation=RuleViolation(REASON_EXTENSION_NOT_OFFERED, str(e)))
    except RemoteError as e:
        if e.refused:
            return RemoteExtend(violation=RuleViolation("RemoteRefused", (
                f"{e}: the key may need {capacity.extend_right}")))
        rt.remote.extension_unknown[uid] = now
        raise
    rt.remote.extension_unknown.pop(uid, None)
    rt.remote.extension_offers.pop(uid, None)
    fresh = capacity.remote_plan(remote.name, uid)  # a remote that extends at once shows the new end now
    blocks = None
    if fresh is not None:
        rt.remote.saw(pool_name, source, fresh)
        lines, _ = mirror_lines(fresh, name, uid, pool.spec.instance_type, pool.spec.availability_zone)
        mine = [r for r in pool.status.reservations if r.training_plan_uid == uid]
        if lines and not same_lines([r.wire() for r in mine], [r.wire() for r in lines]):
            blocks = rt.ledger.record_remote(pool_name, name, uid, lines)
    return RemoteExtend(blocks=blocks, taken={local_id: "Pending"})


def _a(noun: str) -> str:
    return f"{'an' if noun[:1] in 'AEIOU' else 'a'} {noun}"


def kept_message(pools: Sequence[CapacityPool], uid: str, now: datetime) -> str | None:
    """What a deleted plan leaves at its remote sources (None: nothing bought remotely): neither a
    SageMaker training plan nor an EC2 Capacity Block can be cancelled, so the remote keeps (and
    bills) it to its end."""
    kept: dict[str, set[str]] = {}
    for pool in pools:
        if pool.spec.source is None:
            continue
        for line in pool.status.reservations:
            if line.training_plan_uid == uid and line.end_time > now and line.remote_training_plan_arn:
                kept.setdefault(pool.spec.source.remote.noun, set()).add(
                    f"{line.remote_training_plan_arn} (until {line.end_time.isoformat()})")
    if not kept:
        return None
    return "; ".join(f"the remote {noun}(s) " + ", ".join(sorted(arns)) + f" stay bought at their endpoint: {_a(noun)} "
                     "cannot be cancelled; only this cluster's record of them is removed"
                     for noun, arns in sorted(kept.items()))


def pending_kept_message(rt: Any, pools: Sequence[CapacityPool], uid: str) -> str | None:
    """For a deleted plan that holds no remote block yet: the remote plans its uid named that are
    still live at their sources (bought, the remote still Pending: a SageMaker plan being bought, an
    EC2 Capacity Block being paid), read from each source's listing (at most 30 s old: the plan's
    own following keeps one fresh). None when there is none, or when no source answered (the
    deletion is never held up by an endpoint that is down; that is said in the log). Sync (a thread)."""
    kept: dict[str, list[str]] = {}
    seen: set[tuple] = set()
    for pool in pools:
        if pool.spec.source is None or _endpoint(pool) in seen:
            continue
        seen.add(_endpoint(pool))
        source = pool.spec.source.remote
        try:
            live = standing_of(rt.remote.plans(pool.metadata["name"], source, 30.0), uid).live
        except Exception as e:  # noqa: BLE001 - any failure: the deletion goes on without the warning
            log.warning("plan uid %s deleted: could not ask %s for its remote plans: %s", uid,
                        source.endpoint or f"AWS {source.service}", e)
            continue
        if live is not None:
            kept.setdefault(source.noun, []).append(f"{live.arn} ({live.status})")
    if not kept:
        return None
    return "; ".join(f"the remote {noun}(s) " + ", ".join(sorted(arns)) + f" stay at their endpoint: {_a(noun)} cannot "
                     "be cancelled, and one still being bought will be bought; only this cluster's record is removed"
                     for noun, arns in sorted(kept.items()))
