"""Node events: a change to a group's node wakes that group (no polling); the group's pass wakes
its plan when the nodes it read changed, so that a plan's passes follow its groups' (paced)
passes rather than every node event (288 nodes coming up: a few events each)."""

from __future__ import annotations

from typing import Any

import kopf

from hyperplan import metrics
from hyperplan.actuation.groups import bad_health_label
from hyperplan.actuation.nodes import LABEL_NODE_ID, LABEL_POOL, POOL_FREE
from hyperplan.api.vocabulary import GROUP, VERSION
from hyperplan.planning.health import removed_by_operator
from hyperplan.planning.naming import LABEL_GROUP, LABEL_PLAN


def node_digest(body: kopf.Body) -> tuple:
    """What the operator reads of a node. Heartbeats (KWOK or a kubelet refreshing
    lastHeartbeatTime every few seconds) leave it unchanged, so they wake nothing. A condition's
    lastTransitionTime is left out too: it matters only with a new status, which is in the
    digest, and KWOK's heartbeats re-render it in two alternating forms (docs/benchmarks.md 5.2),
    which woke every group on every heartbeat."""
    spec, status = body.get("spec", {}), body.get("status", {})
    return (
        tuple(sorted((body.get("metadata", {}).get("labels") or {}).items())),
        tuple(sorted((t.get("key"), t.get("value"), t.get("effect")) for t in spec.get("taints") or [])),
        bool(spec.get("unschedulable")),
        bool(body.get("metadata", {}).get("deletionTimestamp")),
        tuple(sorted((c.get("type"), c.get("status")) for c in status.get("conditions") or [])),
    )


@kopf.on.event("", "v1", "nodes")
async def node_changed(name: str, labels: kopf.Labels, body: kopf.Body, type: str | None,
                       memo: kopf.Memo, **_: Any) -> None:
    """Every node event, in one handler: kopf's cost per handler call (its context, outcome and
    logging per invocation) was most of an idle operator's CPU with thousands of heartbeating
    nodes, and three handlers ran for each heartbeat. Unfiltered, so that a node handed back
    without the group label leaves the group's count in the metrics."""
    rt = memo.runtime
    group = labels.get(LABEL_GROUP)
    metrics.OBSERVED.put_node(name, None if type == "DELETED" else group)
    if group:
        group_node_changed(rt, name, group, labels, body, type)
    else:
        rt.node_digests.pop(name, None)
    if labels.get(LABEL_POOL) == POOL_FREE:
        free_node_changed(rt, name, body, type)
    else:
        rt.free_node_digests.pop(name, None)


def group_node_changed(rt: Any, name: str, group: str, labels: kopf.Labels, body: kopf.Body,
                       type: str | None) -> None:
    """A change to a group's node wakes that group; a heartbeat wakes nobody."""
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
        rt.groups.note_deleted(group, node_id, labels, rt.clock(),
                               by_operator=removed_by_operator(labels, annotations))
    bad = bad_health_label(labels)
    if bad and type != "DELETED" and rt.groups.holds(group):
        # The grace of a health label counts from its first sight: the event, not the group's
        # next pass (which may be busy carrying out the last one when a storm of labels comes).
        rt.groups.first_sight(group, labels.get(LABEL_NODE_ID, name), bad, rt.clock())
    rt.wakeups.wake("group", group)
    if type == "DELETED" and labels.get(LABEL_PLAN):  # its group may be gone, with no pass to wake the plan
        rt.wakeups.wake("plan", labels[LABEL_PLAN])


def free_node_changed(rt: Any, name: str, body: kopf.Body, type: str | None) -> None:
    """A node of the free static pool appeared or changed (handed back, uncordoned, Ready again):
    the groups that last found no lendable node look again. Heartbeats wake nothing."""
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


@kopf.on.event(GROUP, VERSION, "trainingplans")
async def plan_changed(name: str, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A plan's blocks or phase changed: its groups look again (they compute block times themselves)."""
    if type is not None:
        memo.runtime.wake_groups_of(name)
