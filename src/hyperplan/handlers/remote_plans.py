"""The remote half of a plan's pass: pools whose capacity a SageMaker endpoint sells (issue 23).

A plan that may buy from a remote pool (its ``trainingPlanSelector`` lets it, and the pool sells
the plan's instance or UltraServer type) looks at the remote in its pass, in a purchase thread:

1. **Follow** (:func:`look`): the remote plans its uid named, from the pool's paced listing
   (:class:`~hyperplan.actuation.remote.RemoteFollower`). The blocks of the live one are recorded
   as the plan's lines of the pool's ledger (``KubeLedger.record_remote``), so that the groups,
   the Kueue controller and the plan's status read them as they read a local pool's; a remote plan
   that failed or whose blocks changed rewrites the lines. A live remote plan that holds no block
   yet (the remote buys after CreateTrainingPlan answers) keeps the plan Pending, waiting.
2. **Search**, only while the plan holds nothing live there: SearchTrainingPlanOfferings with the
   plan's request, the answers filtered by the pool's type, zone and fee ceiling
   (planning.remote.offerings_of, within_fee), ranked with the local offerings by decide_plan.
3. **Buy** (:func:`buy`) when the decision picks a remote offering: CreateTrainingPlan under the
   name of the next attempt, then DescribeTrainingPlan, recorded as in 1.

Nothing here is read from the plan's status: the remote's answers and the pool's spec decide.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Sequence

from hyperplan.actuation.remote import RemoteError
from hyperplan.api.models import CapacityPool, TrainingPlanSpec
from hyperplan.api.vocabulary import REASON_OFFERING_UNAVAILABLE, TAG_TRAINING_PLAN, TAG_TRAINING_PLAN_UID
from hyperplan.planning.blocks import Block
from hyperplan.planning.offerings import Offering, OfferingRequest, RuleViolation, matching_pools
from hyperplan.planning.policy import Policy
from hyperplan.planning.remote import (
    MAX_ATTEMPTS, RemoteOffering, RemotePlan, mirror_lines, offerings_of, plan_of, pool_sells, remote_plan_name,
    same_lines,
    search_arguments, standing_of, within_fee,
)

log = logging.getLogger("hyperplan.trainingplan")

WAITING_AGE = 2.0  # seconds: how old a listing a plan waiting for the remote to buy accepts (its wait)
FOLLOW_AGE = 5.0  # seconds: for a plan that holds blocks (at a boundary, many plans share a listing)


@dataclass
class RemoteLook:
    """What the remote pools hold and offer for one plan in this pass."""

    blocks: list[Block] | None = None  # the plan's blocks after a record changed them (None: unchanged)
    waiting: tuple[RemotePlan, str] | None = None  # a live remote plan without blocks yet, and its endpoint
    offerings: list[RemoteOffering] = field(default_factory=list)
    next_attempt: dict[str, int] = field(default_factory=dict)  # by pool
    exhausted: list[str] = field(default_factory=list)  # pools where MAX_ATTEMPTS remote plans failed
    notes: list[str] = field(default_factory=list)  # what was not believed or not bought, for the log

    def offering(self, offering: Offering | None) -> RemoteOffering | None:
        return next((r for r in self.offerings if offering is not None and r.offering.id == offering.id), None)


def remote_pools(pool_objects: Sequence[Mapping[str, Any]], allowed: set[str]) -> list[CapacityPool]:
    """The remote pools among ``pool_objects`` whose names are in ``allowed`` (the plan may buy)."""
    out = []
    for obj in pool_objects:
        if not (obj.get("spec") or {}).get("source") or obj["metadata"]["name"] not in allowed:
            continue
        try:
            out.append(CapacityPool.model_validate(obj))
        except ValueError:
            continue  # the schema keeps these out; an unreadable one sells nothing
    return out


def _endpoint(pool: CapacityPool) -> tuple:
    source = pool.spec.source.sage_maker
    return (source.endpoint, source.region, source.credentials_secret)


def look(rt: Any, pools: Sequence[CapacityPool], snapshots: Sequence[Any], name: str, uid: str,
         spec: TrainingPlanSpec, request: OfferingRequest | None, holds: set[str], search: bool) -> RemoteLook:
    """Follow the plan's remote plans in ``pools`` and, with ``search``, search where it holds
    nothing live (sync: a purchase thread). ``holds``: the pools where its lines are now.
    ``request`` is None when the spec cannot be searched (the decision then says why).

    Pools that name one endpoint and key (one per zone of a capacity cluster, say) are one
    seller: its remote plans are listed once, each block is recorded in the pool of its type and
    zone, and one search serves them all, its answer split by pool."""
    seen = RemoteLook()
    by_name = {s.name: s for s in snapshots}
    sells = {p.name for p in matching_pools(request, [by_name[p.metadata["name"]] for p in pools])} \
        if request is not None else set()
    sellers: dict[tuple, list[CapacityPool]] = {}
    for pool in pools:
        if pool.metadata["name"] in holds or pool.metadata["name"] in sells:
            sellers.setdefault(_endpoint(pool), []).append(pool)
    for group in sellers.values():
        first, source = group[0].metadata["name"], group[0].spec.source.sage_maker
        capacity = rt.remote.capacity(first, source)
        age = FOLLOW_AGE if any(p.metadata["name"] in holds for p in group) else WAITING_AGE
        standing = standing_of(rt.remote.plans(first, source, age), uid)
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
        if standing.exhausted:
            seen.exhausted += [p.metadata["name"] for p in group]
            continue
        selling = [p for p in group if p.metadata["name"] in sells]
        if not (search and standing.live is None and selling and request is not None):
            continue
        answer = capacity.search(search_arguments(request, rt.policy))
        for pool in selling:
            ceiling = pool.spec.source.sage_maker.max_upfront_fee
            for offering in offerings_of(answer, pool.metadata["name"], pool.spec.instance_type,
                                         pool.spec.availability_zone, pool.spec.ultra_server_type, request):
                if within_fee(offering, ceiling):
                    seen.offerings.append(offering)
                else:
                    seen.notes.append(f"offering {offering.offering.id} of pool {pool.metadata['name']} costs "
                                      f"{offering.upfront_fee or 'an unknown fee'} {offering.currency or ''}, "
                                      f"above the pool's maxUpfrontFee {ceiling}")
    return seen


@dataclass(frozen=True)
class RemoteBuy:
    blocks: list[Block] | None = None  # bought and recorded
    waiting: tuple[RemotePlan, str] | None = None  # bought, the remote holds no block yet
    violation: RuleViolation | None = None  # not bought: why (a lost race searches again)


def buy(rt: Any, pool: CapacityPool, name: str, uid: str, spec: TrainingPlanSpec, offering: RemoteOffering,
        attempt: int) -> RemoteBuy:
    """CreateTrainingPlan for ``offering`` under the name of ``attempt``, then read back what the
    remote holds (sync: a purchase thread). Safe to repeat: the same name with the same offering
    answers the same plan, and a name the listing had not shown yet is found by the next pass."""
    pool_name = pool.metadata["name"]
    if attempt >= MAX_ATTEMPTS:
        return RemoteBuy(violation=RuleViolation("RemotePurchaseFailed", (
            f"{MAX_ATTEMPTS} remote training plans of this plan failed at pool {pool_name}'s endpoint")))
    source = pool.spec.source.sage_maker
    capacity = rt.remote.capacity(pool_name, source)
    remote_name = remote_plan_name(uid, attempt)
    try:
        spares = spec.spare_instances_per_ultra_server if spec.ultra_server_type else None  # plain instances: none
        capacity.create_plan(remote_name, offering.remote_id, spares,
                             {TAG_TRAINING_PLAN: name, TAG_TRAINING_PLAN_UID: uid})
    except RemoteError as e:
        if e.code in ("ResourceNotFound", "ValidationException"):  # sold meanwhile, or no longer offered
            return RemoteBuy(violation=RuleViolation(REASON_OFFERING_UNAVAILABLE, (
                f"the endpoint {e.endpoint} no longer sells offering {offering.offering.id}: {e.message}")))
        if e.code == "ResourceInUse":  # the name is taken: a plan of ours the listing did not show yet
            rt.remote.forget(pool_name, source)
            return RemoteBuy(violation=RuleViolation(REASON_OFFERING_UNAVAILABLE, (
                f"the remote training plan {remote_name} exists already; reading it again")))
        raise
    answer = capacity.describe_plan(remote_name)
    if answer is None:  # an endpoint that answers a create and then does not know it: look again
        rt.remote.forget(pool_name, source)
        return RemoteBuy(violation=RuleViolation(REASON_OFFERING_UNAVAILABLE, (
            f"the endpoint {capacity.endpoint} does not show the remote plan {remote_name} it made yet")))
    remote = plan_of(answer)
    rt.remote.saw(pool_name, source, remote)
    lines, _ = mirror_lines(remote, name, uid, pool.spec.instance_type, pool.spec.availability_zone)
    if not lines:
        return RemoteBuy(waiting=(remote, capacity.endpoint))
    return RemoteBuy(blocks=rt.ledger.record_remote(pool_name, name, uid, lines))


def kept_message(pools: Sequence[CapacityPool], uid: str, now: datetime) -> str | None:
    """What a deleted plan leaves at its remote endpoints (None: nothing bought remotely): a
    SageMaker training plan cannot be cancelled, so the remote keeps (and bills) it to its end."""
    kept = []
    for pool in pools:
        for line in pool.status.reservations:
            if line.training_plan_uid == uid and line.end_time > now and line.remote_training_plan_arn:
                kept.append(f"{line.remote_training_plan_arn} (until {line.end_time.isoformat()})")
    if not kept:
        return None
    return ("the remote training plan(s) " + ", ".join(sorted(set(kept))) + " stay bought at their endpoint: a "
            "SageMaker training plan cannot be cancelled; only this cluster's record of them is removed")


def pending_kept_message(rt: Any, pools: Sequence[CapacityPool], uid: str) -> str | None:
    """For a deleted plan that holds no remote block yet: the remote plans its uid named that are
    still live at their endpoints (a CreateTrainingPlan answered, the remote still Pending), read
    from each endpoint's listing (at most 30 s old: the plan's own following keeps one fresh).
    None when there is none, or when no endpoint answered (the deletion is never held up by an
    endpoint that is down; that is said in the log). Sync (a thread)."""
    kept, seen = [], set()
    for pool in pools:
        source = pool.spec.source.sage_maker if pool.spec.source else None
        if source is None or (source.endpoint, source.region, source.credentials_secret) in seen:
            continue
        seen.add((source.endpoint, source.region, source.credentials_secret))
        try:
            live = standing_of(rt.remote.plans(pool.metadata["name"], source, 30.0), uid).live
        except Exception as e:  # noqa: BLE001 - any failure: the deletion goes on without the warning
            log.warning("plan uid %s deleted: could not ask %s for its remote plans: %s", uid,
                        source.endpoint or "AWS", e)
            continue
        if live is not None:
            kept.append(f"{live.arn} ({live.status})")
    if not kept:
        return None
    return ("the remote training plan(s) " + ", ".join(sorted(kept)) + " stay at their endpoint: a SageMaker training "
            "plan cannot be cancelled, and one still being bought will be bought; only this cluster's record is removed")
