"""TrainingPlan handlers: one daemon per plan that reconciles, then sleeps to its next boundary.

Each pass reads the plan and the pools, asks ``planning.plans.decide_plan`` what the
status should be, buys through the ledger when the decision says so, and writes one
status patch when anything changed. Between passes the daemon sleeps until the plan's
next block boundary, a pool change, or a change to the plan itself: no polling.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any

import kopf
from pydantic import ValidationError

from hyperplan import metrics
from hyperplan.actuation.ledger import entries_of, pool_snapshot
from hyperplan.api.models import GROUP, VERSION, TrainingPlan, TrainingPlanStatus, UltraServerStatus
from hyperplan.handlers.context import Runtime, reconcile_forever, status_of
from hyperplan.planning import placement as pl
from hyperplan.planning.offerings import RuleViolation
from hyperplan.planning.plans import Event, PlanDecision, PlanUsage, Purchased, decide_plan, failed
from hyperplan.planning.schedule import plan_block_schedule

PLURAL = "trainingplans"
KIND = "plan"
log = logging.getLogger("hyperplan.trainingplan")


def purchased_blocks(entries) -> list[Purchased]:
    return [Purchased(id=e.reservation.reserved_capacity_id, pool=e.pool,
                      availability_zone=e.availability_zone, instance_type=e.instance_type,
                      instance_count=e.reservation.instance_count, start=e.reservation.start_time,
                      end=e.reservation.end_time, ultra_server_type=e.ultra_server_type)
            for e in entries]


def node_usage(rt: Runtime, plan: TrainingPlan, purchased: list[Purchased]) -> PlanUsage:
    """What the groups' nodes hold of the plan's current (or next) block. Sync (thread)."""
    schedule = plan_block_schedule([(p.start, p.end) for p in purchased], plan.spec.target_resource,
                                   rt.policy, rt.clock())
    if schedule.current_or_next_block is None:
        return PlanUsage()
    block = purchased[schedule.current_or_next_block]
    nodes = rt.kube.list_nodes(f"{pl.LABEL_RESERVED_CAPACITY}={pl.label_value(block.id)}")
    observed = [plan_observed_node(rt, n) for n in nodes if not n.metadata.deletion_timestamp]
    spares = plan.spec.spare_instances_per_ultra_server
    ultraservers = pl.ultraservers_for_block(block.id, block.ultra_server_type, block.instance_count, spares)
    counts = pl.plan_counts(block.instance_count, sum(u.spare_count for u in ultraservers), observed)
    reports = pl.ultraserver_reports(ultraservers, block.availability_zone, observed)
    return PlanUsage(in_use=counts.in_use, unhealthy=counts.unhealthy, available_spares=counts.available_spares,
                     ultra_servers=tuple(UltraServerStatus.model_validate(r.as_status()) for r in reports))


def plan_observed_node(rt: Runtime, node) -> pl.ObservedNode:
    """A node as the plan's counters see it, from its labels and Ready condition."""
    labels = node.metadata.labels or {}
    health = [labels.get(pl.LABEL_HEALTH) or "", labels.get(pl.LABEL_SAGEMAKER_HEALTH) or ""]
    ready = next((c.status for c in (node.status.conditions or []) if c.type == "Ready"), "Unknown") \
        if node.status else "Unknown"
    healthy = False if any(h.startswith(pl.HEALTH_UNSCHEDULABLE) for h in health) else (
        None if ready == "Unknown" else True)
    return pl.ObservedNode(node.metadata.name, labels.get(pl.LABEL_GROUP, ""), labels.get(pl.LABEL_ROLE, pl.ROLE_ACTIVE),
                           labels.get(rt.keys.ultraserver_id), healthy, ready == "True",
                           pl.HEALTH_PENDING_REPLACEMENT in health)


async def reconcile_plan(rt: Runtime, name: str) -> datetime | None:
    """One pass over one plan. Returns when to look again (None: only when woken)."""
    obj = await asyncio.to_thread(rt.kube.get_object, PLURAL, name)
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

    pools = await asyncio.to_thread(rt.ledger.pools)
    uid = obj["metadata"]["uid"]
    purchased = purchased_blocks(entries_of(pools, uid))
    usage = await asyncio.to_thread(node_usage, rt, plan, purchased) if purchased else PlanUsage()
    snapshots = [pool_snapshot(p) for p in pools]
    decision = decide_plan(plan.spec, generation, plan.status, purchased, snapshots, rt.policy, now, usage)

    if decision.buy is not None:
        result = await asyncio.to_thread(rt.ledger.purchase, name, uid, decision.buy, rt.policy, rt.clock())
        if result.ok:
            metrics.PURCHASES.labels("Purchased").inc()
            bought = decision.status.model_copy(update={"purchased_offering_id": decision.buy.id})
            decision = decide_plan(plan.spec, generation, bought, purchased_blocks(result.entries),
                                   snapshots, rt.policy, rt.clock(), usage)
            decision.events.insert(0, Event(
                "Normal", "Purchased",
                f"bought offering {decision.status.purchased_offering_id}: "
                + ", ".join(f"{r.instance_count} x {r.instance_type} in {r.availability_zone} "
                            f"{r.start_time.isoformat()} to {r.end_time.isoformat()}"
                            for r in decision.status.reserved_capacity)))
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
        await asyncio.to_thread(rt.kube.patch_status, PLURAL, obj["metadata"]["name"], desired)
        metrics.STATUS_WRITES.labels("TrainingPlan").inc()
        boundary = prior.next_transition_time
        if boundary and decision.status.phase != prior.phase:
            metrics.TRANSITION_LAG.observe(max(0.0, (rt.clock() - boundary).total_seconds()))
    for ev in decision.events:
        log.info("plan %s: %s: %s", obj["metadata"]["name"], ev.reason, ev.message)
        kopf.event(obj, type=ev.type, reason=ev.reason, message=ev.message)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10, initial_delay=0)
async def plan_daemon(name: str, stopped: kopf.DaemonStopped, memo: kopf.Memo, **_: Any) -> None:
    rt: Runtime = memo.runtime
    await reconcile_forever(rt, KIND, name, "TrainingPlan", lambda: reconcile_plan(rt, name), stopped, log,
                            PLURAL, name)


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def plan_spec_changed(name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.runtime.wakeups.wake(KIND, name)


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def release_plan(name: str, uid: str, memo: kopf.Memo, body: kopf.Body, **_: Any) -> None:
    """Give the plan's remaining reservations back to their pools before it goes away."""
    rt: Runtime = memo.runtime
    released = await asyncio.to_thread(rt.ledger.release, uid, rt.clock())
    if released:
        kopf.info(body, reason="Released", message=f"released {released} reservation(s) back to their pools")
    rt.unbought_plans.discard(name)
    rt.wake_groups_of(name)
