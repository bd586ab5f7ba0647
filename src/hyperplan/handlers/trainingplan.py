"""TrainingPlan handlers: a pass per plan when it is seen, changed, woken or falls due.

Each pass reads the plan, the pools and the block's nodes from the watch cache
(``handlers.cache``, no API read), asks ``planning.plans.decide_plan`` what the status should
be, buys through the ledger when the decision says so, and writes one status patch when
anything changed. Between passes a plan costs one timer for its next block boundary, held by
the one scheduler of all plans (``handlers.scheduler.PassScheduler``, started with kopf); a
pool change, a change to the plan's spec or nodes, or its groups wake it: no polling. (Until
issue 10's memory work each plan had a kopf daemon of its own; see docs/benchmarks.md 5.4.)

An auto-purchase that loses a race for its offering (another plan bought the capacity between
the search and the ledger write) searches again against the ledger as the purchase just read
it and buys the next best offering (:func:`purchase`); only a plan whose window has no room
left fails.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping

import kopf
from pydantic import ValidationError

from hyperplan import metrics
from hyperplan.actuation.ledger import CapacityLedger, PurchaseResult
from hyperplan.api.models import GROUP, VERSION, TrainingPlan, TrainingPlanSpec, TrainingPlanStatus
from hyperplan.handlers.context import Runtime, status_of
from hyperplan.handlers.scheduler import PassScheduler
from hyperplan.planning import counts as ct
from hyperplan.planning import naming as nm
from hyperplan.planning.blocks import Block
from hyperplan.planning.offerings import Offering, RuleViolation
from hyperplan.planning.plans import (
    Event, PlanDecision, PlanUsage, block_usage, current_block, decide_plan, failed,
)
from hyperplan.planning.policy import Policy

PLURAL = "trainingplans"
KIND = "plan"
LOST_RACE = "OfferingUnavailable"  # the ledger's re-check: the offered capacity was sold meanwhile
PURCHASE_SEARCHES = 8  # purchases (a first one and searches again) per pass before trying next pass
CONTENDED_RETRY = timedelta(seconds=1)
log = logging.getLogger("hyperplan.trainingplan")


def plan_observed_node(node: Mapping[str, Any], ultraserver_key: str) -> ct.ObservedNode:
    """A node (as the watch cache holds it) as the plan's counters see it: labels and Ready."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    health = [labels.get(nm.LABEL_HEALTH) or "", labels.get(nm.LABEL_SAGEMAKER_HEALTH) or ""]
    ready = next((c.get("status") for c in (node.get("status") or {}).get("conditions") or []
                  if c.get("type") == "Ready"), "Unknown")
    healthy = False if any(h.startswith(nm.HEALTH_UNSCHEDULABLE) for h in health) else (
        None if ready == "Unknown" else True)
    return ct.ObservedNode(meta.get("name", ""), labels.get(nm.LABEL_GROUP, ""), labels.get(nm.LABEL_ROLE, nm.ROLE_ACTIVE),
                           labels.get(ultraserver_key), healthy, ready == "True",
                           nm.HEALTH_PENDING_REPLACEMENT in health)


def node_usage(rt: Runtime, plan: TrainingPlan, purchased: list[Block], now: datetime) -> PlanUsage:
    """What the groups' nodes hold of the plan's current (or next) block, from the watch cache."""
    block = current_block(purchased, plan.spec.target_resource, rt.policy, now)
    if block is None:
        return PlanUsage()
    nodes = [plan_observed_node(n, rt.keys.ultraserver_id) for n in rt.cache.block_nodes(nm.label_value(block.id))
             if not n["metadata"].get("deletionTimestamp")]
    return block_usage(block, plan.spec.spare_instances_per_ultra_server, nodes)


@dataclass(frozen=True)
class PurchaseOutcome:
    result: PurchaseResult
    offering: Offering  # the offering bought (or last tried)
    purchases: int  # ledger purchases made in this pass (1 + searches again)
    contended: bool = False  # lost every race of this pass: stay Pending, try again next pass


def purchase(ledger: CapacityLedger, name: str, uid: str, spec: TrainingPlanSpec, generation: int,
             prior: TrainingPlanStatus, offering: Offering, policy: Policy, clock: Callable[[], datetime],
             searches: int = PURCHASE_SEARCHES) -> PurchaseOutcome:
    """Buy ``offering``. An auto-purchase that loses the race for it searches again against the
    pools the ledger just re-checked it against, and buys the best offering there, up to
    ``searches`` purchases in all; after that the plan stays Pending and tries again on its next
    pass. A purchase of an offering the user chose (``offeringId``) is never swapped. When the
    new search finds nothing, the window truly has no room left and the lost race's violation
    stands (Sync: runs in a worker thread.)"""
    for attempt in range(1, searches + 1):
        result = ledger.purchase(name, uid, offering, policy, clock())
        if result.ok or result.violation.reason != LOST_RACE or spec.offering_id or not spec.auto_purchase \
                or not result.pools:
            return PurchaseOutcome(result, offering, attempt)
        again = decide_plan(spec, generation, prior, [], result.pools, policy, clock())
        if again.buy is None:
            return PurchaseOutcome(result, offering, attempt)
        log.info("plan %s: lost the race for offering %s; buying %s instead", name, offering.id, again.buy.id)
        offering = again.buy
    return PurchaseOutcome(result, offering, searches, contended=True)


async def reconcile_plan(rt: Runtime, name: str) -> datetime | None:
    """One pass over one plan. Returns when to look again (None: only when woken)."""
    obj = rt.cache.plan(name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        rt.unbought_plans.discard(name)
        return None
    now = rt.clock()
    generation = obj["metadata"].get("generation", 1)
    try:
        plan = TrainingPlan.model_validate(obj)
    except ValidationError as e:
        prior = status_of(TrainingPlanStatus, obj)
        decision = failed(prior, generation, RuleViolation("InvalidSpec", _short(e)), now)
        await _write(rt, obj, decision)
        return None

    uid = obj["metadata"]["uid"]
    pools = rt.cache.pool_objects()
    purchased = rt.cache.blocks_of(uid, pools)
    usage = node_usage(rt, plan, purchased, now) if purchased else PlanUsage()
    snapshots = rt.cache.pool_snapshots(pools)
    decision = decide_plan(plan.spec, generation, plan.status, purchased, snapshots, rt.policy, now, usage)

    if decision.buy is not None:
        outcome = await asyncio.get_running_loop().run_in_executor(
            rt.purchase_threads, purchase, rt.ledger, name, uid, plan.spec, generation, plan.status,
            decision.buy, rt.policy, rt.clock)
        result = outcome.result
        if result.ok:
            metrics.PURCHASES.labels("Purchased").inc()
            bought = decision.status.model_copy(update={"purchased_offering_id": outcome.offering.id})
            decision = decide_plan(plan.spec, generation, bought, result.blocks,
                                   snapshots, rt.policy, rt.clock(), usage)
            decision.events.insert(0, Event(
                "Normal", "Purchased",
                f"bought offering {decision.status.purchased_offering_id}: "
                + ", ".join(f"{r.instance_count} x {r.instance_type} in {r.availability_zone} "
                            f"{r.start_time.isoformat()} to {r.end_time.isoformat()}"
                            for r in decision.status.reserved_capacity)))
        elif outcome.contended:
            metrics.PURCHASES.labels("Contended").inc()
            decision.wake_at = rt.clock() + CONTENDED_RETRY
        else:
            metrics.PURCHASES.labels(result.violation.reason).inc()
            decision = failed(decision.status, generation, result.violation, rt.clock())

    await _write(rt, obj, decision)
    if decision.status.phase in (None, "Pending"):
        rt.unbought_plans.add(name)
    else:
        rt.unbought_plans.discard(name)
    return decision.wake_at


def _short(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())[:900]


async def _write(rt: Runtime, obj: dict[str, Any], decision: PlanDecision) -> None:
    """The one status patch of a pass, skipped when nothing changed; then the events."""
    desired = decision.status.wire()
    prior = status_of(TrainingPlanStatus, obj)
    if desired != prior.wire():
        written = await asyncio.to_thread(rt.kube.patch_status, PLURAL, obj["metadata"]["name"], desired)
        if written:
            rt.cache.wrote(PLURAL, written)
        metrics.STATUS_WRITES.labels("TrainingPlan").inc()
        boundary = prior.next_transition_time
        if boundary and decision.status.phase != prior.phase:
            metrics.TRANSITION_LAG.observe(max(0.0, (rt.clock() - boundary).total_seconds()))
    for ev in decision.events:
        log.info("plan %s: %s: %s", obj["metadata"]["name"], ev.reason, ev.message)
        kopf.event(obj, type=ev.type, reason=ev.reason, message=ev.message)


@kopf.on.startup()
async def start_plan_passes(memo: kopf.Memo, **_: Any) -> None:
    """One scheduler for every plan's passes, for as long as kopf runs (only on the leader)."""
    rt: Runtime = memo.runtime
    rt.plans = PassScheduler("TrainingPlan", lambda name: reconcile_plan(rt, name), rt.clock, rt=rt, plural=PLURAL)
    rt.wakeups.route(KIND, rt.plans.wake)  # wake-ups wait in its queue until the workers start


@kopf.on.cleanup()
async def stop_plan_passes(memo: kopf.Memo, **_: Any) -> None:
    rt: Runtime = memo.runtime
    if rt.plans is not None:
        rt.wakeups.route(KIND, None)
        await rt.plans.stop()
        rt.plans = None


@kopf.on.event(GROUP, VERSION, PLURAL)
async def plan_seen(name: str, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A plan the operator has not passed over yet: listed at start (resume) or just created.
    Later events are its own status writes (which need no pass) or spec changes
    (:func:`plan_spec_changed`)."""
    rt: Runtime = memo.runtime
    if rt.plans is None:
        return
    # The workers start inside a kopf handler: their tasks inherit its context, which holds
    # kopf's queue for posting Events (kopf.event fails outside one). Idempotent.
    rt.plans.start()
    if type in (None, "ADDED"):
        rt.wakeups.wake(KIND, name)
    elif type == "DELETED":
        rt.plans.forget(name)


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def plan_spec_changed(name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.runtime.wakeups.wake(KIND, name)


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def release_plan(name: str, uid: str, memo: kopf.Memo, body: kopf.Body, **_: Any) -> None:
    """Give the plan's remaining reservations back to their pools before it goes away."""
    rt: Runtime = memo.runtime
    if rt.plans is not None:  # a pass that is buying now finishes first, so nothing is bought after
        await rt.plans.settled(name)
    released = await asyncio.to_thread(rt.ledger.release, uid, rt.clock())
    if released:
        kopf.info(body, reason="Released", message=f"released {released} reservation(s) back to their pools")
    rt.unbought_plans.discard(name)
    rt.wake_groups_of(name)
