"""What the operator does when it starts, stops, and sees a watch event of one of its kinds, each
in one place and in order.

kopf runs every handler registered for an event; spread over several modules, one plan event ran
five callbacks and the order they ran in (the metrics' copy, the read side's write-through copy,
the groups to wake, the plan's own pass) was the order of imports. Here each kind has one event
handler that does, in order:

1. **the read side**: the write-through copy of an object that the watch has now delivered is
   dropped (``WatchCache.watched``/``forget``); the kopf indexes themselves (``runtime.store``)
   are kopf's, filled before any handler runs;
2. **the object metrics' copy** (``metrics.OBSERVED``), so a deleted object's series leave
   ``/metrics`` with it;
3. **who must look again**: the object's own pass, and the passes that read it (a plan's groups
   when what they bind by changed; the plans not bought yet when a pool changed); then the
   listeners of other controllers (the Kueue AdmissionCheck controller, registered by its own
   module when Kueue is on).

The startup handler wires the runtime once: kopf's settings, the read side bound to kopf's
indexes and the node store, every kind's pass registered on the one work queue, then the node
watch listed (kopf runs no other handler before its startup handlers are done, so no pass reads
a half-listed world). The cleanup handler stops the node watch and the queue.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from hyperplan import metrics, threads
from hyperplan.api.vocabulary import ANNOTATION_PREFIX, FINALIZER, GROUP, VERSION
from hyperplan.controllers.group import reconciler as instancegroup
from hyperplan.wiring import nodes
from hyperplan.controllers.plan import reconciler as trainingplan
from hyperplan.runtime.store import NODES, PackedObject, slim_object
from hyperplan.runtime.context import Runtime
from hyperplan.planning.offerings import PoolSnapshot
from hyperplan.settings import Settings

PLANS, GROUPS, POOLS = "trainingplans", "instancegroups", "capacitypools"


def configure_kopf(settings: kopf.OperatorSettings, hp: Settings) -> None:
    """kopf's behaviour for this operator.

    Progress and the last-handled spec go into annotations, because our status schemas
    are structural (the API server would prune kopf's own ``status.kopf`` fields).
    """
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration")
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = hp.watch_server_timeout
    settings.watching.client_timeout = hp.watch_server_timeout + 30
    settings.execution.max_workers = threads.size("kopf")
    settings.batching.error_delays = [1, 2, 5, 10, 20, 30]
    settings.networking.error_backoffs = [1, 2, 5, 10]


# The read side's kopf indexes (runtime.store binds them at startup, by these names).
@kopf.index(GROUP, VERSION, PLANS)
async def hp_plans(name: str, body: kopf.Body, **_: Any) -> dict[str, PackedObject]:
    return {name: PackedObject.of(slim_object(body))}


@kopf.index(GROUP, VERSION, POOLS)
async def hp_pools(name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[str, dict[str, Any]]:
    return {name: memo.runtime.cache.share_ledger(slim_object(body))}


@kopf.index(GROUP, VERSION, GROUPS)
async def hp_groups(name: str, body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
    return {name: slim_object(body)}


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **indexes: Any) -> None:
    """Wire the runtime: kopf's settings, the read side, every kind's passes, the node watch. (The
    SageMaker API is served from before the election, hyperplan.sagemaker.replica; it reads this
    watch cache from kopf's first resource event on, see :func:`caught_up`.)"""
    rt: Runtime = memo.runtime
    configure_kopf(settings, rt.settings)
    # kopf hands its indexes (filled before any other handler) to startup handlers by name.
    rt.cache.bind({**indexes, NODES: rt.node_store})
    trainingplan.register_plan_passes(rt)
    instancegroup.register_group_passes(rt)
    await nodes.start_node_watch(rt)
    logger.info("policy profile %s; watching capacitypools, trainingplans, instancegroups, nodes",
                rt.policy.name)


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    """Stop the SageMaker API and the node watch, then the work queue (running passes get their grace)."""
    rt: Runtime = memo.runtime
    if rt.sagemaker_api is not None:
        await rt.sagemaker_api.cleanup()
        rt.sagemaker_api = None
    await nodes.stop_node_watch(rt)
    await rt.queue.stop()


def observe(observed: metrics.ObservedObjects, plural: str, name: str, type_: str | None,
            body: Mapping[str, Any], pool: PoolSnapshot | None = None) -> None:
    """Put or drop one object in the object metrics' copy (a pool as the read side parsed it)."""
    kind = {PLANS: "plans", GROUPS: "groups", POOLS: "pools"}[plural]
    if type_ == "DELETED":
        observed.drop(kind, name)
        if plural == GROUPS:
            metrics.forget_group(name)
    elif plural == PLANS:
        observed.put_plan(name, dict(body))
    elif plural == GROUPS:
        observed.put_group(name, dict(body))
    elif pool is not None:
        observed.put_pool_snapshot(name, pool)


def caught_up(rt: Runtime, plural: str, name: str, type_: str | None, body: kopf.Body) -> None:
    """The watch delivered ``name``: the read side's write-through copy of it is no newer. And
    kopf has listed every indexed kind (it hands no event on before): the SageMaker API reads
    its indexes from now on (hyperplan.sagemaker.replica.ReplicaApi.indexed)."""
    if rt.sagemaker_api is not None:
        rt.sagemaker_api.indexed(rt.cache)
    if type_ == "DELETED":
        rt.cache.forget(plural, name)
    else:
        rt.cache.watched(plural, name, body.get("metadata", {}).get("resourceVersion"))


@kopf.on.event(GROUP, VERSION, PLANS)
async def plan_event(name: str, type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    rt: Runtime = memo.runtime
    caught_up(rt, PLANS, name, type, body)
    rt.cache.plans_version += 1  # what the SageMaker API derived from every plan is stale now
    observe(metrics.OBSERVED, PLANS, name, type, body)
    if nodes.plan_wakes_groups(rt.plan_digests, name, type, body):
        rt.wake_groups_of(name)  # they compute block times themselves
    trainingplan.plan_event(rt, name, type, body)
    for listener in rt.plan_listeners:
        listener(name, type, body)


@kopf.on.event(GROUP, VERSION, GROUPS)
async def group_event(name: str, type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    rt: Runtime = memo.runtime
    caught_up(rt, GROUPS, name, type, body)
    observe(metrics.OBSERVED, GROUPS, name, type, body)
    instancegroup.group_event(rt, name, body, type)


@kopf.on.event(GROUP, VERSION, POOLS)
async def pool_event(name: str, type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A pool's snapshot comes from the read side, which parses each ledger line once: a pool's
    ledger grows with every purchase, and parsing all of it on every event would cost the square
    of the purchases. Plans not bought yet search again; bought plans do not depend on the pools."""
    rt: Runtime = memo.runtime
    caught_up(rt, POOLS, name, type, body)
    snapshot = None if type == "DELETED" else rt.cache.pool_snapshots([slim_object(body)])[0]
    observe(metrics.OBSERVED, POOLS, name, type, body, snapshot)
    if type is None:  # the initial listing, after which every plan gets a pass anyway
        return
    if remote_record_only(rt.pool_generations, name, type, body):
        return
    rt.wake_unbought_plans()


def remote_record_only(generations: dict[str, Any], name: str, type: str | None, body: Any) -> bool:
    """Whether a pool's event is only a change of a remote pool's record (the lines the operator
    writes from what its endpoint answered, controllers.plan.remote): no plan's offerings depend on
    them (a remote pool's offerings come from its endpoint), and waking every plan not bought yet
    on each such write made 1,000 remote purchases search 13,800 times (bench/remote_purchases).
    A change of its spec (a new generation) still wakes them."""
    if type == "DELETED":
        generations.pop(name, None)
        return False
    generation = (body.get("metadata") or {}).get("generation")
    seen, generations[name] = generations.get(name), generation
    return bool((body.get("spec") or {}).get("source")) and type == "MODIFIED" and seen == generation
