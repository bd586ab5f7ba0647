"""Node events: a change to a group's node wakes that group (no polling); the group's pass wakes
its plan when the nodes it read changed, so that a plan's passes follow its groups' (paced)
passes rather than every node event (288 nodes coming up: a few events each)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from kubernetes import client

from hyperplan import metrics
from hyperplan.actuation.kube import api_client
from hyperplan.actuation.providers.base import LABEL_POOL, POOL_FREE
from hyperplan.runtime.nodewatch import DELETED, NodeChange, NodeWatch
from hyperplan.planning.health import removed_by_operator
from hyperplan.planning.naming import LABEL_GROUP, LABEL_PLAN
from hyperplan.planning.nodefacts import effective_health, unschedulable_health

log = logging.getLogger("hyperplan.nodes")


async def start_node_watch(rt: Any) -> None:
    """List the nodes into the runtime's node store, then watch them on a thread of their own
    (runtime.nodewatch). kopf runs no other handler or daemon before its startup handlers are
    done, so no pass ever reads a half-listed store."""
    loop = asyncio.get_running_loop()
    core = client.CoreV1Api(api_client(rt.settings.kubeconfig))  # its own connection for the stream
    watch = NodeWatch(core, rt.node_store, lambda change: loop.call_soon_threadsafe(node_changed, rt, change))
    started = time.monotonic()
    for change in await asyncio.to_thread(watch.list, True):
        node_changed(rt, change)
    log.info("node watch: %d node(s) of groups, jobs and the free pool listed in %.1fs",
             len(rt.node_store), time.monotonic() - started)
    watch.start()
    rt.node_watch = watch


async def stop_node_watch(rt: Any) -> None:
    watch = getattr(rt, "node_watch", None)
    if watch is not None:
        await asyncio.to_thread(watch.close)


def node_changed(rt: Any, change: NodeChange) -> None:
    """A node event that changed what the operator reads (on the event loop): the node metrics'
    group, then the wake-ups of its group, of the groups waiting for a free node, and of the
    other listeners (the Kueue controller's job nodes)."""
    group = change.labels.get(LABEL_GROUP)
    metrics.OBSERVED.put_node(change.name, None if change.type == DELETED else group, effective_health(change.labels))
    if group:
        group_node_changed(rt, change.name, group, change.labels, change.node, change.type)
    if change.left_group:  # relabelled or handed back: the group it left counts without it
        rt.queue.wake("group", change.left_group)
    if change.labels.get(LABEL_POOL) == POOL_FREE and change.type not in (None, DELETED):
        for waiting in rt.group_memory.short_of_free_nodes():
            rt.queue.wake("group", waiting)
    for listener in rt.node_store.listeners:
        listener(change)


def group_node_changed(rt: Any, name: str, group: str, labels: Mapping[str, str], node: Mapping[str, Any],
                       type: str | None) -> None:
    """A change to a group's node wakes that group (heartbeats never get here)."""
    if type is None:
        return  # the first listing: every group gets a pass on start anyway
    # The node id from the group's own record (name and uid), never from the node's labels: a node
    # that carries the group's label and another node's id would otherwise start that node's grace
    # or report it deleted. A node the record does not hold only wakes the group (it is reported
    # there, planning.ownership).
    entry = recorded_entry(rt, group, name, (node.get("metadata") or {}).get("uid") or "")
    node_id = entry.get("nodeId") if entry is not None else None
    if type == DELETED and node_id is not None:
        # Unless the operator removed it, the node was deleted from under the group: a failure
        # signal, judged after the grace.
        rt.group_memory.note_deleted(group, node_id, labels, rt.clock(),
                                     by_operator=removed_by_operator(labels, entry.get("cordoned") is True))
    bad = unschedulable_health(labels)
    if bad and type != DELETED and node_id is not None and rt.group_memory.holds(group):
        # The grace of a health label counts from its first sight: the event, not the group's
        # next pass (which may be busy carrying out the last one when a storm of labels comes).
        rt.group_memory.first_sight(group, node_id, bad, rt.clock())
    rt.queue.wake("group", group)
    if type == DELETED and labels.get(LABEL_PLAN):  # its group may be gone, with no pass to wake the plan
        rt.queue.wake("plan", labels[LABEL_PLAN])


def recorded_entry(rt: Any, group: str, name: str, uid: str) -> Mapping[str, Any] | None:
    """The entry under which group ``group`` (its label value) records the node named ``name``
    with ``uid`` (its ``status.nodes``, from the watch cache: ``nodeId``, ``cordoned``, ...), or
    None when the record does not hold it."""
    group_name = rt.group_names.get(group)
    obj = rt.cache.group(group_name) if group_name else None
    for entry in ((obj or {}).get("status") or {}).get("nodes") or ():
        if entry.get("name") == name and entry.get("uid") and entry.get("uid") == uid:
            return entry
    return None


def plan_digest(body: Mapping[str, Any]) -> str:
    """What a group reads of its plan (``instancegroup.bound_plan``): the spec fields it binds and
    places by, the reserved capacity blocks, and whether the plan is being deleted. The plan's
    own status writes (phase, counts, conditions, UltraServer health) leave it unchanged, so they
    wake no group: each group pass that changes the nodes wakes the plan, and a plan write that
    woke every group again made a loop that only pacing bounded."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    return json.dumps([
        [spec.get(k) for k in ("targetResource", "instanceType", "ultraServerType", "spareInstancesPerUltraServer",
                               "instanceGroupSelector")],
        status.get("reservedCapacity") or [],
        bool((body.get("metadata") or {}).get("deletionTimestamp")),
    ], sort_keys=True, default=str)


def plan_wakes_groups(digests: dict[str, str], name: str, type: str | None, body: Mapping[str, Any]) -> bool:
    """Whether a plan's watch event (``type`` None: the initial listing) concerns its groups,
    keeping ``digests`` (by plan name) up to date and pruned on deletion."""
    if type == "DELETED":
        digests.pop(name, None)
        return True
    digest = plan_digest(body)
    unchanged = digests.get(name) == digest
    digests[name] = digest
    return type is not None and (type == "ADDED" or not unchanged)
