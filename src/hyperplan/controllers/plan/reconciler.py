"""TrainingPlan handlers: a pass per plan when it is seen, changed, woken or falls due.

Each pass reads the plan, the pools and the block's nodes from the watch cache
(``runtime.store``, no API read), asks ``planning.plans.decide_plan`` what the status should
be, buys through the ledger when the decision says so, and writes one status patch when
anything changed. Between passes a plan costs one timer for its next block boundary, held by
the operator's one work queue (``runtime.workqueue.WorkQueue``, started with kopf); a
pool change, a change to the plan's spec or nodes, or its groups wake it: no polling, and no
task or daemon per plan (a kopf daemon per plan cost about 97 KiB each at 5,000 plans:
docs/benchmarks.md 5.4).

A plan's lifecycle is the operator's own, not kopf's change handlers (which cost every plan two
PATCHes, its last-handled-configuration annotation and kopf's finalizer, and every plan event a
diff of that annotation: docs/benchmarks.md 5.9). A spec change is a ``metadata.generation``
ahead of the ``status.observedGeneration`` of the last pass. The finalizer
(``hyperplan.dev/release-reservations``) goes on before the first purchase and stays while the
plan may hold reservations (a plan that never bought has nothing to release and is deleted at
once); a plan being deleted gets one more pass, which releases its reservations and then removes
the finalizer: a pass that was buying finishes first, since one plan's passes never overlap.

An auto-purchase that loses a race for its offering (another plan bought the capacity between
the search and the ledger write) searches again against the ledger as the purchase just read
it and buys the next best offering (:func:`purchase`); only a plan whose window has no room
left fails.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping

import kopf
from pydantic import ValidationError

from hyperplan import metrics
from hyperplan.actuation.ledger import CapacityLedger, PurchaseResult
from hyperplan.api.models import MAX_EXTENSIONS, TrainingPlan, TrainingPlanSpec, TrainingPlanStatus
from hyperplan.api.vocabulary import FINALIZER, PLAN_FINALIZER, REASON_OFFERING_UNAVAILABLE, REASON_REMOTE_EXTENDING
from hyperplan.controllers.plan import remote as remote_plans
from hyperplan.runtime.context import (
    Runtime, status_of, status_patch, ultraserver_replacements, ultraservers_wanted,
)
from hyperplan.planning import counts
from hyperplan.planning import naming
from hyperplan.planning import placement
from hyperplan.planning.blocks import Block
from hyperplan.planning.nodefacts import facts_of_dict

from hyperplan.planning.offerings import Offering, OfferingRequest, RuleViolation
from hyperplan.planning.remote import waiting_for_remote, with_remote_health
from hyperplan.planning.plans import (
    FAILED, PENDING, Event, PlanDecision, PlanUsage, addition_refused, block_usage, current_block, decide_plan,
    extension_failed, extension_wanted, failed, request_of,
)
from hyperplan.planning.policy import Policy, parse_duration
from hyperplan.planning.tenancy import pools_for_plan

PLURAL = "trainingplans"
KIND = "plan"
LOST_RACE = REASON_OFFERING_UNAVAILABLE  # the ledger's re-check: the offered capacity was sold meanwhile
PURCHASE_SEARCHES = 8  # purchases (a first one and searches again) per pass before trying next pass
CONTENDED_RETRY = timedelta(seconds=1)
REMOTE_WAITING = timedelta(seconds=2)  # a plan waiting for a remote endpoint to buy looks again this soon,
REMOTE_WAITING_MOST = timedelta(seconds=20)  # and later the longer it waits, up to this
REMOTE_FOLLOW = timedelta(minutes=5)  # a plan bought remotely looks at its remote plan at least this often
# A remote purchase answered but not held yet writes no status this long (the Event says it was
# bought): most remotes hold the blocks within seconds, and the plan's next write is then its
# Scheduled or Active; one still waiting after it shows Pending, RemotePurchasing.
REMOTE_QUIET = timedelta(seconds=10)
log = logging.getLogger("hyperplan.trainingplan")


def plan_observed_node(node: Mapping[str, Any], keys: naming.TopologyKeys) -> counts.ObservedNode:
    """A node (as the watch cache holds it) as the plan's counters see it: unhealthy when either
    health label says so, of unknown health while its Ready is unknown (``NodeFacts.health_verdict``)."""
    facts = facts_of_dict(node, keys)
    return counts.ObservedNode(facts.name, facts.group or "", facts.role, facts.ultraserver_id, facts.health_verdict,
                               facts.is_ready, facts.pending_replacement)


def node_usage(rt: Runtime, plan: TrainingPlan, purchased: list[Block], now: datetime,
               pair_cloud_ultraservers: bool = False) -> PlanUsage:
    """What the groups' nodes hold of the plan's current (or next) block, from the watch cache;
    with ``pair_cloud_ultraservers`` (the remote told UltraServer health), which cloud
    UltraServer each of the block's is (``PlanUsage.cloud_ultraservers``)."""
    block = current_block(purchased, plan.spec.target_resource, rt.policy, now)
    if block is None:
        return PlanUsage()
    live = [n for n in rt.cache.block_nodes(naming.label_value(block.id)) if not n["metadata"].get("deletionTimestamp")]
    nodes = [plan_observed_node(n, rt.keys) for n in live]
    name = plan.metadata.get("name")
    groups = [g for g in rt.cache.groups() if (g.get("spec") or {}).get("trainingPlanRef") == name] \
        if block.ultra_server_type else []
    usage = block_usage(block, plan.spec.spare_instances_per_ultra_server, nodes,
                        [r for g in groups for r in ultraserver_replacements(g)],
                        [w for g in groups for w in ultraservers_wanted(g)])
    if not groups or not pair_cloud_ultraservers:
        return usage
    lent = lent_from(groups, rt.keys.ultraserver_id)
    return replace(usage, cloud_ultraservers=placement.cloud_ultraservers(
        (seen.ultraserver_id, lent[uid]) for raw, seen in zip(live, nodes) if (uid := raw["metadata"].get("uid")) in lent))


def lent_from(groups: list[Mapping[str, Any]], key: str) -> dict[str, str | None]:
    """The cloud UltraServer id (under ``key``) each node in the groups' records carried before
    the group labelled it, by the node's uid (None: a node hyperplan made, or one that carried
    none). Only recorded nodes count: a node that merely wears the block's label pairs nothing."""
    out: dict[str, str | None] = {}
    for g in groups:
        for entry in (g.get("status") or {}).get("nodes") or ():
            if not isinstance(entry, Mapping) or not entry.get("uid"):
                continue
            before = ((entry.get("lent") or {}).get("labels") or {}).get(key)  # the schema: strings
            out[str(entry["uid"])] = before or None
    return out


@dataclass(frozen=True)
class PurchaseOutcome:
    result: PurchaseResult
    offering: Offering  # the offering bought (or last tried)
    purchases: int  # ledger purchases made in this pass (1 + searches again)
    contended: bool = False  # lost every race of this pass: stay Pending, try again next pass


def purchase(ledger: CapacityLedger, name: str, uid: str, spec: TrainingPlanSpec, generation: int,
             prior: TrainingPlanStatus, offering: Offering, policy: Policy, clock: Callable[[], datetime],
             searches: int = PURCHASE_SEARCHES, labels: Mapping[str, str] | None = None) -> PurchaseOutcome:
    """Buy ``offering``. An auto-purchase that loses the race for it searches again against the
    pools the ledger just re-checked it against, and buys the best offering there, up to
    ``searches`` purchases in all; after that the plan stays Pending and tries again on its next
    pass. A purchase of an offering the user chose (``offeringId``) is never swapped. When the
    new search finds nothing, the window truly has no room left and the lost race's violation
    stands. ``labels`` are the plan's: the ledger lets it buy only from the pools that allow it, and
    the pools it hands back for the search again are only those. (Sync: runs in a worker thread.)"""
    for attempt in range(1, searches + 1):
        result = ledger.purchase(name, uid, offering, policy, clock(), labels)
        if result.ok or result.violation.reason != LOST_RACE or spec.offering_id or not spec.auto_purchase \
                or not result.pools:
            return PurchaseOutcome(result, offering, attempt)
        again = decide_plan(spec, generation, prior, [], pools_for_plan(result.pools, labels), policy, clock())
        if again.buy is None:
            return PurchaseOutcome(result, offering, attempt)
        log.info("plan %s: lost the race for offering %s; buying %s instead", name, offering.id, again.buy.id)
        offering = again.buy
    return PurchaseOutcome(result, offering, searches, contended=True)


async def reconcile_plan(rt: Runtime, name: str) -> datetime | None:
    """One pass over one plan. Returns when to look again (None: only when woken)."""
    obj = rt.cache.plan(name)
    if obj is None:
        rt.unbought_plans.discard(name)
        return None
    if obj["metadata"].get("deletionTimestamp"):
        await release_plan(rt, obj)
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
    labels = obj["metadata"].get("labels") or {}
    snapshots = pools_for_plan(rt.cache.pool_snapshots(pools), labels)  # the pools that let it buy
    holds = {b.pool for b in purchased}
    remote = remote_plans.remote_pools(pools, {s.name for s in snapshots} | holds, rt.cache.pool_model) if rt.remote else []
    seen = remote_plans.RemoteLook()
    if remote:
        searching = not purchased and not (plan.status.phase == FAILED and plan.status.observed_generation == generation)
        seen = await asyncio.get_running_loop().run_in_executor(
            rt.purchase_threads, remote_plans.look, rt, remote, rt.cache.pool_snapshots(pools), name, uid, plan.spec,
            _request(plan.spec), holds, searching, purchased,
            extension_wanted(plan.spec, plan.status, uid, purchased, rt.policy))
        for note in seen.notes:
            log.info("plan %s: %s", name, note)
        if seen.blocks is not None:
            purchased = seen.blocks
    usage = node_usage(rt, plan, purchased, now, bool(seen.ultra_health)) if purchased else PlanUsage()
    if seen.ultra_health:
        usage = replace(usage, ultra_servers=with_remote_health(usage.ultra_servers, seen.ultra_health,
                                                                usage.cloud_ultraservers))
    prior = plan.status
    if remote and not prior.purchased_offering_id:
        prior = prior.model_copy(update={"purchased_offering_id": _bought_remotely(rt, plan, uid, purchased, remote)})
    decision = decide_plan(plan.spec, generation, prior, purchased, snapshots, rt.policy, now, usage, uid,
                           remote=[o.offering for o in seen.offerings],
                           remote_extensions=[e.extension for e in seen.extensions], extending=seen.extending)
    quiet = False
    if seen.waiting is not None and not purchased:
        quiet = _quiet(rt, uid)
        decision = _unchanged(obj) if quiet else _waiting(decision, prior, generation, seen.waiting, rt.clock())

    if (decision.buy is not None or purchased or seen.waiting) and not await _hold_finalizer(rt, obj):
        return None  # deleted meanwhile: nothing was bought
    bought_remotely = seen.offering(decision.buy)
    if bought_remotely is not None:
        decision = await _buy_remote(rt, obj, plan, generation, decision, bought_remotely, seen, snapshots, usage)
        quiet = _quiet(rt, uid) and own_status(decision.status) == own_status(status_of(TrainingPlanStatus, obj))
    elif decision.buy is not None:
        outcome = await asyncio.get_running_loop().run_in_executor(
            rt.purchase_threads, purchase, rt.ledger, name, uid, plan.spec, generation, plan.status,
            decision.buy, rt.policy, rt.clock, PURCHASE_SEARCHES, labels)
        result = outcome.result
        if result.ok:
            metrics.PURCHASES.labels("Purchased").inc()
            bought = decision.status.model_copy(update={"purchased_offering_id": outcome.offering.id})
            decision = decide_plan(plan.spec, generation, bought, result.blocks,
                                   snapshots, rt.policy, rt.clock(), usage, uid)
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
    elif decision.extend is not None:
        decision = await _extend(rt, name, uid, plan, generation, decision, purchased, snapshots, usage, labels, seen)
    elif decision.add_ultraserver is not None:
        decision = await _add_ultraserver(rt, name, uid, plan, generation, decision, snapshots, usage, labels)

    await _write(rt, obj, decision)
    if decision.status.phase in (None, "Pending"):
        rt.unbought_plans.add(name)
    else:
        rt.unbought_plans.discard(name)
    if remote and not quiet:
        rt.remote.bought.pop(uid, None)  # written (or bought elsewhere, or failed): the status holds it now
    if remote:  # a remote changes without a local event: look again at least every REMOTE_FOLLOW
        # Waiting for the remote to buy, or for its answer to catch up with a boundary that passed.
        waiting = quiet or seen.behind or any(c.reason == "RemotePurchasing" for c in decision.status.conditions) \
            or any(e.reason == REASON_REMOTE_EXTENDING for e in decision.status.extensions)
        every = rt.remote.waiting_every(uid, waiting, rt.clock().timestamp(), REMOTE_WAITING.total_seconds(),
                                        REMOTE_WAITING_MOST.total_seconds())
        due = rt.clock() + (timedelta(seconds=every) if waiting else REMOTE_FOLLOW)
        wake = decision.wake_at if decision.wake_at and not waiting else None
        return min(wake, due) if wake else due
    return decision.wake_at


def _request(spec: TrainingPlanSpec) -> OfferingRequest | None:
    try:
        return request_of(spec, parse_duration(spec.duration))
    except ValueError:
        return None  # decide_plan says why


def _bought_remotely(rt: Runtime, plan: TrainingPlan, uid: str, purchased: list[Block],
                     remote: list) -> str | None:
    """The local id of the offering the plan's remote purchase bought, for a status that does not
    show it yet (the buying pass wrote none: :data:`REMOTE_QUIET`): as this process bought it, or,
    after a restart, the id of the blocks the remote holds for it, which is the offering's when the
    remote sold what it offered (Offering.from_blocks; a plan not Scheduled yet has not extended)."""
    kept = rt.remote.bought.get(uid)
    if kept is not None:
        return kept[0]
    pools = {p.metadata["name"] for p in remote}
    if purchased and plan.status.phase in (None, PENDING) and all(b.pool in pools for b in purchased):
        return Offering.from_blocks(purchased, _request(plan.spec)).id
    return None


def _quiet(rt: Runtime, uid: str) -> bool:
    """Whether the plan's remote purchase is recent enough that a status showing the remote has not
    bought yet is not written (:data:`REMOTE_QUIET`)."""
    kept = rt.remote.bought.get(uid)
    return kept is not None and rt.clock().timestamp() - kept[1] < REMOTE_QUIET.total_seconds()


def _unchanged(obj: Mapping[str, Any]) -> PlanDecision:
    """A decision that writes nothing: the status as it is."""
    return PlanDecision(status=status_of(TrainingPlanStatus, obj))


def _waiting(decision: PlanDecision, prior: TrainingPlanStatus, generation: int, waiting: tuple,
             now: datetime) -> PlanDecision:
    """The plan waits for its remote plan to hold blocks (``prior``: its status, with the id of
    the offering it bought there: :func:`_bought_remotely`)."""
    remote, endpoint = waiting
    status = waiting_for_remote(decision.status, prior, generation, remote, endpoint, now)
    return PlanDecision(status=status, wake_at=now + REMOTE_WAITING,  # no search ran: nothing found or not
                        events=[e for e in decision.events if e.reason not in ("OfferingsFound", "NoCapacity")])


async def _buy_remote(rt: Runtime, obj: dict[str, Any], plan: TrainingPlan, generation: int, decision: PlanDecision,
                      offering: Any, seen: remote_plans.RemoteLook, snapshots: list, usage: PlanUsage) -> PlanDecision:
    """Buy a remote pool's offering (controllers.plan.remote.buy) and decide from what it holds then."""
    name, uid = obj["metadata"]["name"], obj["metadata"]["uid"]
    pool_name = offering.offering.blocks[0].pool
    pool = next(p for p in remote_plans.remote_pools(rt.cache.pool_objects(), {pool_name}, rt.cache.pool_model))
    outcome = await asyncio.get_running_loop().run_in_executor(
        rt.purchase_threads, remote_plans.buy, rt, pool, name, uid, plan.spec, offering,
        seen.next_attempt.get(pool_name, 0))
    if outcome.violation is not None:
        metrics.PURCHASES.labels(outcome.violation.reason).inc()
        if outcome.violation.reason == LOST_RACE:
            log.info("plan %s: %s; searching again", name, outcome.violation.message)
            decision.wake_at = rt.clock() + CONTENDED_RETRY
            decision.buy = None
            return decision
        return failed(decision.status, generation, outcome.violation, rt.clock())
    metrics.PURCHASES.labels("Purchased").inc()
    rt.remote.bought[uid] = (offering.offering.id, rt.clock().timestamp())
    bought = decision.status.model_copy(update={"purchased_offering_id": offering.offering.id})
    if outcome.blocks is None:  # the remote buys after it answered: no status until REMOTE_QUIET passed
        remote, endpoint = outcome.waiting
        waiting = _unchanged(obj)
        waiting.events.append(Event("Normal", "Purchased", (
            f"bought offering {offering.offering.id} at {endpoint} as {remote.noun} {remote.name}; "
            "waiting for the remote to hold its blocks")))
        return waiting
    after = decide_plan(plan.spec, generation, bought, outcome.blocks, snapshots, rt.policy, rt.clock(), usage, uid)
    after.events.insert(0, Event("Normal", "Purchased", f"bought offering {offering.offering.id} remotely"))
    return after


async def _extend(rt: Runtime, name: str, uid: str, plan: TrainingPlan, generation: int, decision: PlanDecision,
                  purchased: list[Block], snapshots: list, usage: PlanUsage,
                  labels: Mapping[str, str], seen: remote_plans.RemoteLook) -> PlanDecision:
    """Buy the extensions the decisions name, one after another (each runs the block on where the
    one before left it; the ledger re-checks each), deciding again from the blocks as the ledger
    then holds them. A refusal fails that extension (kept in ``status.extensions``, a condition and
    a Warning Event), never the pass, and the entries after it are decided on. An extension of a
    remote block is bought at its remote (controllers.plan.remote.extend); the entries after it
    wait until the remote's block shows it."""
    prior, blocks, events = plan.status, purchased, list(decision.events)
    offered, extending = [e.extension for e in seen.extensions], dict(seen.extending)
    for _ in range(MAX_EXTENSIONS):
        extension = decision.extend
        if extension is None:
            break
        remote = seen.extension(extension)
        if remote is not None and seen.extended_plan is not None:
            pool = next(iter(remote_plans.remote_pools(rt.cache.pool_objects(), {extension.block.pool}, rt.cache.pool_model)), None)
            if pool is None:
                break  # the pool went meanwhile: the next pass decides without it
            outcome = await asyncio.get_running_loop().run_in_executor(
                rt.purchase_threads, remote_plans.extend, rt, pool, name, uid, seen.extended_plan, remote)
            result = PurchaseResult(blocks=tuple(outcome.blocks or blocks), violation=outcome.violation)
            extending.update(outcome.taken)
        else:
            result = await asyncio.get_running_loop().run_in_executor(
                rt.purchase_threads, rt.ledger.extend, name, uid, extension, rt.policy, rt.clock(), labels)
        if result.ok:
            metrics.PURCHASES.labels("Extended").inc()
            blocks = list(result.blocks)
        else:
            metrics.PURCHASES.labels(result.violation.reason).inc()
            refused = extension_failed(decision, generation, prior, extension.id, result.violation, rt.clock())
            events += refused.events
            prior = refused.status  # remembers the refusal: the next decision moves on
        decision = decide_plan(plan.spec, generation, prior, blocks, snapshots, rt.policy, rt.clock(), usage, uid,
                               remote_extensions=offered, extending=extending)
        events += decision.events
    decision.events = list(dict.fromkeys(events))  # the decisions again repeat the first one's events
    return decision


async def _add_ultraserver(rt: Runtime, name: str, uid: str, plan: TrainingPlan, generation: int,
                           decision: PlanDecision, snapshots: list, usage: PlanUsage,
                           labels: Mapping[str, str]) -> PlanDecision:
    """Buy the UltraServer the decision names for the rest of its block (the ledger re-checks the
    pool's room), then decide again from the blocks as the ledger holds them, so that the status
    shows it and the groups, woken, move to it; a refusal is a condition and a Warning, never a
    failed pass."""
    addition = decision.add_ultraserver
    assert addition is not None
    result = await asyncio.get_running_loop().run_in_executor(
        rt.purchase_threads, rt.ledger.add_ultraserver, name, uid, addition, labels)
    if not result.ok:
        metrics.PURCHASES.labels(result.violation.reason).inc()
        return addition_refused(decision, generation, plan.status, addition, result.violation, rt.clock())
    metrics.PURCHASES.labels("UltraServerAdded").inc()
    after = decide_plan(plan.spec, generation, plan.status, list(result.blocks), snapshots, rt.policy, rt.clock(),
                        usage, uid)
    after.add_ultraserver = None  # one a pass; the next pass decides on the groups' new statuses
    after.events = list(dict.fromkeys([*decision.events, Event("Warning", "UltraServerAdded", (
        f"bought an UltraServer ({addition.instance_count} x {addition.instance_type}) from pool {addition.pool} for "
        f"the rest of block {addition.adds_to}, until {addition.end.isoformat()}, in place of failed UltraServer "
        f"{addition.in_place_of}: the block had no free one")), *after.events]))  # the decision again repeats
    rt.wake_groups_of(name)
    return after


async def _hold_finalizer(rt: Runtime, obj: dict[str, Any]) -> bool:
    """Put the finalizer on a plan that buys or holds reservations, so that its deletion waits
    for the release (a plan that carries kopf's finalizer instead, which kopf removes from a kind
    it has no deletion handler for, gets this one on its next pass); False when the plan is gone. A 409 (the plan
    changed since the cache's copy) fails the pass, which is retried."""
    finalizers = [f for f in obj["metadata"].get("finalizers") or [] if f != FINALIZER]
    if PLAN_FINALIZER in finalizers:
        return True
    written = await asyncio.to_thread(rt.kube.set_finalizers, PLURAL, obj["metadata"]["name"],
                                      [*finalizers, PLAN_FINALIZER], obj["metadata"]["resourceVersion"])
    if written is None:
        return False
    rt.cache.wrote(PLURAL, written)
    return True


async def release_plan(rt: Runtime, obj: dict[str, Any]) -> None:
    """A plan being deleted: give its remaining reservations back to their pools, then let it go
    (remove the finalizer). Idempotent; a failure fails the pass, which is retried."""
    name, meta = obj["metadata"]["name"], obj["metadata"]
    rt.unbought_plans.discard(name)
    finalizers = meta.get("finalizers") or []
    if PLAN_FINALIZER not in finalizers and FINALIZER not in finalizers:
        return
    pools = rt.cache.pool_objects()
    remote_pools = remote_plans.remote_pools(pools, {p["metadata"]["name"] for p in pools}, rt.cache.pool_model)
    kept = remote_plans.kept_message(remote_pools, meta["uid"], rt.clock())
    if not kept and remote_pools and rt.remote is not None and not rt.cache.blocks_of(meta["uid"]):
        # Nothing bought remotely in the ledger yet, but a CreateTrainingPlan may have been answered:
        # its remote plan goes on (Pending, then bought) whatever happens to this one.
        kept = await asyncio.to_thread(remote_plans.pending_kept_message, rt, remote_pools, meta["uid"])
    if kept:
        kopf.warn(obj, reason="RemotePlanKept", message=kept)
    if rt.remote is not None:
        rt.remote.forget_plan(meta["uid"])
    released = await asyncio.to_thread(rt.ledger.release, meta["uid"], rt.clock())
    if released:
        kopf.info(obj, reason="Released", message=f"released {released} reservation(s) back to their pools")
    rt.wake_groups_of(name)
    await asyncio.to_thread(rt.kube.set_finalizers, PLURAL, name,
                            [f for f in finalizers if f not in (PLAN_FINALIZER, FINALIZER)], meta["resourceVersion"])


def _short(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())[:900]


def own_status(status: TrainingPlanStatus) -> dict[str, Any]:
    """What the plan's pass writes of a status: all but ``jobNodes``, the Kueue controller's record."""
    wire = status.wire()
    wire.pop("jobNodes", None)
    return wire


async def _write(rt: Runtime, obj: dict[str, Any], decision: PlanDecision) -> None:
    """The one status patch of a pass, skipped when nothing changed; then the events. The record
    of a training-job plan's job nodes is the Kueue controller's: never written here."""
    desired = own_status(decision.status)
    prior = status_of(TrainingPlanStatus, obj)
    if desired != own_status(prior):
        written = await asyncio.to_thread(rt.kube.patch_status, PLURAL, obj["metadata"]["name"],
                                          status_patch(desired, own_status(prior)))
        if written:
            rt.cache.wrote(PLURAL, written)
        metrics.STATUS_WRITES.labels("TrainingPlan").inc()
        boundary = prior.next_transition_time
        if boundary and decision.status.phase != prior.phase:
            metrics.TRANSITION_LAG.observe(max(0.0, (rt.clock() - boundary).total_seconds()))
    for ev in decision.events:
        log.info("plan %s: %s: %s", obj["metadata"]["name"], ev.reason, ev.message)
        kopf.event(obj, type=ev.type, reason=ev.reason, message=ev.message)


def register_plan_passes(rt: Runtime) -> None:
    """Every plan's passes run on the work queue, for as long as kopf runs (only on the leader)."""
    rt.queue.register(KIND, lambda name: reconcile_plan(rt, name), label="TrainingPlan", plural=PLURAL)


def plan_event(rt: Runtime, name: str, type: str | None, body: Mapping[str, Any]) -> None:
    """A plan needs a pass when it is listed at start (resume) or created, when its spec changed
    (its generation is ahead of the last pass's ``observedGeneration``), and when it is being
    deleted, and when a plan not bought yet is relabelled (the pools that sell to it may change).
    Its other events are its own status writes, which need none."""
    # The workers start inside a kopf handler: their tasks inherit its context, which holds
    # kopf's queue for posting Events (kopf.event fails outside one). Idempotent.
    rt.queue.start()
    if type == "DELETED":
        rt.queue.forget(KIND, name)
        rt.plan_labels.pop(name, None)
        rt.plan_generations.pop(name, None)
        return
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    labels = tuple(sorted((meta.get("labels") or {}).items()))
    relabelled = rt.plan_labels.get(name, labels) != labels
    rt.plan_labels[name] = labels
    # A spec change is a generation this handler has not seen yet, which no pass has observed. A
    # plan whose passes fail has no observedGeneration, and the failure's own condition write is
    # an event: waking on it ran the failing pass again at once, past the queue's backoff (127
    # failures in 20 s while a remote endpoint was down, then 5 minutes' rest once it was back).
    generation = meta.get("generation")
    new_generation = rt.plan_generations.get(name) != generation
    rt.plan_generations[name] = generation
    if type in (None, "ADDED") or meta.get("deletionTimestamp") \
            or (new_generation and generation != status.get("observedGeneration")) \
            or (relabelled and name in rt.unbought_plans):  # the pools that sell to it may differ
        rt.queue.wake(KIND, name)
