"""Node events: a change to a group's node wakes that group (no polling); the group's pass wakes
its plan when the nodes it read changed, so that a plan's passes follow its groups' (paced)
passes rather than every node event (288 nodes coming up: a few events each)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import kopf

from hyperplan.actuation.groups import bad_health_label
from hyperplan.actuation.nodes import LABEL_NODE_ID, LABEL_POOL, POOL_FREE
from hyperplan.api.vocabulary import GROUP, VERSION
from hyperplan.planning.health import removed_by_operator
from hyperplan.planning.naming import LABEL_GROUP, LABEL_PLAN


def node_digest(body: kopf.Body) -> tuple:
    """What the operator reads of a node. Heartbeats (KWOK or a kubelet refreshing
    lastHeartbeatTime every few seconds) leave it unchanged, so they wake nothing."""
    spec, status = body.get("spec", {}), body.get("status", {})
    return (
        tuple(sorted((body.get("metadata", {}).get("labels") or {}).items())),
        tuple(sorted((t.get("key"), t.get("value"), t.get("effect")) for t in spec.get("taints") or [])),
        bool(spec.get("unschedulable")),
        bool(body.get("metadata", {}).get("deletionTimestamp")),
        tuple(sorted((c.get("type"), c.get("status"), c.get("lastTransitionTime"))
                     for c in status.get("conditions") or [])),
    )


@kopf.on.event("", "v1", "nodes", labels={LABEL_GROUP: kopf.PRESENT})
async def group_node_changed(name: str, labels: kopf.Labels, body: kopf.Body, type: str | None,
                             memo: kopf.Memo, **_: Any) -> None:
    rt = memo.runtime
    digest = node_digest(body)
    unchanged = rt.node_digests.get(name) == digest
    rt.node_digests[name] = digest
    if type is None or (type == "MODIFIED" and unchanged):
        return  # the initial listing (daemons reconcile on start anyway), or only a heartbeat
    if type == "DELETED":
        rt.node_digests.pop(name, None)
        node_id = labels.get(LABEL_NODE_ID, name)
        annotations = body.get("metadata", {}).get("annotations") or {}
        # Unless the operator removed it, the node was deleted from under the group: a failure
        # signal, judged after the grace.
        rt.groups.note_deleted(labels[LABEL_GROUP], node_id, labels, rt.clock(),
                               by_operator=removed_by_operator(labels, annotations))
    bad = bad_health_label(labels)
    if bad and type != "DELETED" and rt.groups.holds(labels[LABEL_GROUP]):
        # The grace of a health label counts from its first sight: the event, not the group's
        # next pass (which may be busy carrying out the last one when a storm of labels comes).
        rt.groups.first_sight(labels[LABEL_GROUP], labels.get(LABEL_NODE_ID, name), bad, rt.clock())
    rt.wakeups.wake("group", labels[LABEL_GROUP])
    if type == "DELETED" and labels.get(LABEL_PLAN):  # its group may be gone, with no pass to wake the plan
        rt.wakeups.wake("plan", labels[LABEL_PLAN])


@kopf.on.event("", "v1", "nodes", labels={LABEL_POOL: POOL_FREE})
async def free_node_changed(name: str, body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A node of the free static pool appeared or changed (handed back, uncordoned, Ready again):
    the groups that last found no lendable node look again. Heartbeats wake nothing."""
    rt = memo.runtime
    digest = node_digest(body)
    unchanged = rt.free_node_digests.get(name) == digest
    rt.free_node_digests[name] = digest
    if type == "DELETED":
        rt.free_node_digests.pop(name, None)
        return
    if type is None or unchanged:
        return
    for group in rt.groups.short_of_free_nodes():
        rt.wakeups.wake("group", group)


def plan_digest(body: Mapping[str, Any]) -> str:
    """What a group reads of its plan (``instancegroup.plan_view``): the spec fields it binds and
    places by, the reserved capacity blocks, and whether the plan is being deleted. The plan's
    own status writes (phase, counts, conditions, UltraServer health) leave it unchanged, so they
    wake no group: each group pass that changes the nodes wakes the plan, and a plan write that
    woke every group again made a loop that only pacing bounded."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    return json.dumps([
        [spec.get(k) for k in ("targetResource", "instanceType", "ultraServerType", "spareInstancesPerUltraServer")],
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


@kopf.on.event(GROUP, VERSION, "trainingplans")
async def plan_changed(name: str, type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A plan's blocks or what its groups bind by changed, or it went: its groups look again
    (they compute block times themselves). Its status writes alone wake nothing."""
    rt = memo.runtime
    if plan_wakes_groups(rt.plan_digests, name, type, body):
        rt.wake_groups_of(name)
