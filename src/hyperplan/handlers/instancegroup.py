"""InstanceGroup handlers: one daemon per group that holds nodes only while a block is usable.

Each pass reads the group, its plan, the groups sharing the plan and the group's nodes,
asks ``planning.groups.decide_group`` what should exist, then acts through the group's
node provider: health marks and spare promotions first, then new nodes, label and taint
updates, drains and removals; then one status patch. The daemon sleeps until the next
block boundary, health deadline or drain retry, or until a node, the plan or the group
changes.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from hyperplan import metrics
from hyperplan.actuation.nodes import (
    LABEL_NODE_ID, AdoptionConflict, NoFreeNode, evict_pods, merged_taints, taints_of,
)
from hyperplan.api.models import GROUP, VERSION, InstanceGroup, InstanceGroupStatus, TrainingPlan, VanishedNode
from hyperplan.handlers.context import Runtime, reconcile_forever, status_of
from hyperplan.planning import health as hl
from hyperplan.planning import placement as pl
from hyperplan.planning.groups import (
    GroupDecision, ObservedGroupNode, Peer, PlanView, decide_group, managed_taint_keys,
)
from hyperplan.planning.plans import Event

PLURAL = "instancegroups"
FINALIZER = "hyperplan.dev/finalizer"  # set by kopf (settings.persistence.finalizer)
CREATE_WORKERS = 8
ADOPTION_RETRY = timedelta(seconds=1)  # after a lost race for a free static node
KIND = "group"
log = logging.getLogger("hyperplan.instancegroup")


def node_body(node: client.V1Node) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node.metadata.name, "uid": node.metadata.uid}}


def observe_node(rt: Runtime, node: client.V1Node, now: datetime) -> ObservedGroupNode:
    labels = node.metadata.labels or {}
    conditions = tuple(hl.NodeCondition(c.type, c.status, c.last_transition_time or now)
                       for c in (node.status.conditions if node.status and node.status.conditions else []))
    values = [labels.get(pl.LABEL_HEALTH), labels.get(pl.LABEL_SAGEMAKER_HEALTH)]
    bad = next((v for v in values if v and v.startswith(pl.HEALTH_UNSCHEDULABLE)), None)
    label = bad or next((v for v in values if v), None)
    name = labels.get(LABEL_NODE_ID, node.metadata.name)
    since = None
    if bad:
        recorded = (node.metadata.annotations or {}).get(hl.ANNOTATION_HEALTH_SINCE)
        since = hl.health_label_since(bad, recorded, rt.label_seen.setdefault((name, bad), now))
    try:
        generation = int(labels.get(pl.LABEL_GENERATION, "0"))
    except ValueError:
        generation = 0
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    return ObservedGroupNode(
        health=hl.NodeObservation(
            name=name, conditions=conditions, health_label=label, health_label_since=since,
            role=labels.get(pl.LABEL_ROLE, pl.ROLE_ACTIVE), ultraserver_id=labels.get(rt.keys.ultraserver_id),
            created=node.metadata.creation_timestamp, slot=labels.get(pl.LABEL_SLOT),
            generation=generation, replaces=labels.get(pl.LABEL_REPLACES)),
        labels=labels, taints=taints_of(node), unschedulable=bool(node.spec.unschedulable),
        ready=ready, deleting=node.metadata.deletion_timestamp is not None)


def record_health_signals(rt: Runtime, raw: list[client.V1Node], observed: list[ObservedGroupNode]) -> None:
    """Keep each node's health-signal start on the node itself (sync, thread).

    Written once per new ``Unschedulable*`` value, removed when the label goes, so that a
    restarted operator counts the grace from the first sight, and a signal that comes back
    later starts a new grace. The process's own memory of first sights is pruned alongside.
    """
    for node, seen in zip(raw, observed):
        recorded = (node.metadata.annotations or {}).get(hl.ANNOTATION_HEALTH_SINCE)
        value, since = seen.health.health_label, seen.health.health_label_since
        want = hl.health_signal_record(value, since) if since is not None else None
        if since is None:
            for key in [k for k in rt.label_seen if k[0] == seen.name]:
                del rt.label_seen[key]
        if recorded == want:
            continue
        try:
            rt.kube.core.patch_node(node.metadata.name,
                                    {"metadata": {"annotations": {hl.ANNOTATION_HEALTH_SINCE: want}}})
        except ApiException as e:
            if e.status != 404:  # gone meanwhile: nothing to remember
                raise


def vanished_nodes(rt: Runtime, group_key: str, present: list[ObservedGroupNode]) -> list[ObservedGroupNode]:
    """Nodes deleted from under the group, as observations that no longer exist.

    An entry is forgotten once its slot holds a newer generation (it was replaced) or the
    node came back under the same name.
    """
    gone = rt.vanished.setdefault(group_key, {})
    known = rt.known.setdefault(group_key, {})
    present_ids = {n.name for n in present}
    for node_id, labels in known.items():
        if node_id not in present_ids and node_id not in gone and node_id not in rt.releasing:
            gone[node_id] = (labels, rt.clock())
    known.clear()
    known.update({n.name: dict(n.labels) for n in present})
    newest = {}
    for n in present:
        newest[n.health.slot] = max(newest.get(n.health.slot, -1), n.health.generation)
    names = {n.name for n in present}
    out = []
    for node_id, (labels, when) in list(gone.items()):
        try:
            generation = int(labels.get(pl.LABEL_GENERATION, "0"))
        except ValueError:
            generation = 0
        slot = labels.get(pl.LABEL_SLOT)
        if node_id in names or newest.get(slot, -1) > generation:
            del gone[node_id]
            continue
        out.append(ObservedGroupNode(
            health=hl.NodeObservation(name=node_id, exists=False, deleted_since=when,
                                      role=labels.get(pl.LABEL_ROLE, pl.ROLE_ACTIVE),
                                      ultraserver_id=labels.get(rt.keys.ultraserver_id), slot=slot,
                                      generation=generation, replaces=labels.get(pl.LABEL_REPLACES)),
            labels=labels, taints=(), unschedulable=True, ready=False))
    return out


def release(rt: Runtime, provider, node_id: str, group_key: str) -> str:
    """Remove a node through its provider, noting that its deletion is ours, not a failure.

    Returns what became of the node, in words (deleted, or handed back to the free pool)."""
    rt.releasing.add(node_id)
    rt.known.get(group_key, {}).pop(node_id, None)
    return provider.release(node_id)


def left_alone_note(progress) -> str:
    """The pods a drain did not evict, for the removal event ("" when none)."""
    if not progress.left_alone:
        return ""
    return "; left running: " + ", ".join(f"{p} ({why})" for p, why in sorted(progress.left_alone.items()))


def plan_view(plan: TrainingPlan) -> PlanView:
    return PlanView(name=plan.metadata["name"], target=plan.spec.target_resource,
                    instance_type=plan.spec.instance_type, ultra_server_type=plan.spec.ultra_server_type,
                    spares_per_ultraserver=plan.spec.spare_instances_per_ultra_server,
                    blocks=tuple(sorted(plan.status.reserved_capacity, key=lambda b: b.start_time)))


def peers_of(groups: list[dict[str, Any]], plan: str) -> list[Peer]:
    """Groups bound to ``plan``, oldest first (then by name): the placement order."""
    bound = [g for g in groups if g.get("spec", {}).get("trainingPlanRef") == plan
             and not g["metadata"].get("deletionTimestamp")]
    bound.sort(key=lambda g: (g["metadata"].get("creationTimestamp", ""), g["metadata"]["name"]))
    out = []
    for g in bound:
        specs = (g["spec"].get("placement") or {}).get("placementSpecifications") or []
        out.append(Peer(g["metadata"]["name"], int(g["spec"].get("instanceCount", 0)),
                        tuple((p["ultraServerId"], int(p["instanceCount"])) for p in specs)))
    return out


async def reconcile_group(rt: Runtime, name: str) -> datetime | None:
    obj = await asyncio.to_thread(rt.kube.get_object, PLURAL, name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None
    generation = obj["metadata"].get("generation", 1)
    try:
        group = InstanceGroup.model_validate(obj)
    except ValidationError as e:
        kopf.event(obj, type="Warning", reason="InvalidSpec", message=str(e)[:900])
        return None
    rt.group_plans[pl.label_value(name)] = group.spec.training_plan_ref
    plan_obj = await asyncio.to_thread(rt.kube.get_object, "trainingplans", group.spec.training_plan_ref)
    plan = plan_view(TrainingPlan.model_validate(plan_obj)) if plan_obj else None
    groups = await asyncio.to_thread(rt.kube.list_objects, PLURAL)
    provider = rt.providers[group.spec.node_provider]
    raw = await asyncio.to_thread(provider.list, name)
    now = rt.clock()
    nodes = [observe_node(rt, n, now) for n in raw]
    await asyncio.to_thread(record_health_signals, rt, raw, nodes)
    group_key = pl.label_value(name)
    for v in group.status.vanished_nodes:  # after a restart: what the last process had seen
        rt.vanished.setdefault(group_key, {}).setdefault(v.name, (dict(v.labels), v.since))
    nodes += vanished_nodes(rt, group_key, nodes)
    decision = decide_group(name, generation, group.spec, group.status, plan,
                            peers_of(groups, group.spec.training_plan_ref), nodes, rt.policy, now, rt.keys)
    if decision.create and FINALIZER not in obj["metadata"].get("finalizers", []):
        # kopf adds the finalizer on its first pass over a new group; no node exists before it,
        # so deleting the group can never orphan one.
        decision.create = []
        decision.wake_at = now + timedelta(seconds=1)
    lost_race = await asyncio.to_thread(apply_decision, rt, obj, group.spec.node_provider, decision,
                                        {n.name: r for n, r in zip(nodes, raw)})
    decision.status.vanished_nodes = [
        VanishedNode(name=node_id, since=when, labels=labels)
        for node_id, (labels, when) in sorted(rt.vanished.get(group_key, {}).items())]
    desired = decision.status.wire()
    if desired != status_of(InstanceGroupStatus, obj).wire():
        await asyncio.to_thread(rt.kube.patch_status, PLURAL, name, desired)
        metrics.STATUS_WRITES.labels("InstanceGroup").inc()
    for ev in decision.events:
        log.info("group %s: %s: %s", name, ev.reason, ev.message)
        kopf.event(obj, type=ev.type, reason=ev.reason, message=ev.message)
    metrics.observe_group_pass(name, group.status, decision.status,
                               decision.block.start_time if decision.block else None, rt.clock())
    if plan is not None and (decision.create or decision.drain or decision.remediation or decision.update):
        rt.wakeups.wake("plan", plan.name)
    if lost_race:  # another writer adopted the free node first: choose again shortly
        retry = now + ADOPTION_RETRY
        return retry if decision.wake_at is None else min(decision.wake_at, retry)
    return decision.wake_at


def apply_decision(rt: Runtime, group_obj: dict[str, Any], provider_name: str, d: GroupDecision,
                   raw: dict[str, client.V1Node]) -> bool:
    """Carry out a decision: health actions, then creates and updates, then drains. Sync (thread).

    Returns whether a create lost a race for a free static node (the caller looks again soon)."""
    provider = rt.providers[provider_name]
    group_key = pl.label_value(group_obj["metadata"]["name"])
    events: list[tuple[dict | None, Event]] = []
    for action in d.remediation:
        node = raw.get(getattr(action, "node", None) or getattr(action, "spare", ""))
        if isinstance(action, hl.MarkUnhealthy) and node is not None:
            taints = merged_taints(node, (action.taint,), {action.taint.key})
            rt.kube.core.patch_node(node.metadata.name, {
                "metadata": {"labels": {pl.LABEL_HEALTH: action.health_status}},
                "spec": {"taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in taints]}})
            events.append((node_body(node), Event("Warning", "NodeUnhealthy",
                                                  f"{action.node}: {action.reason}; marked {action.health_status}")))
            metrics.REMEDIATIONS.labels("mark").inc()
        elif isinstance(action, hl.PromoteSpare) and node is not None:
            keep = [t for t in taints_of(node) if t.key != pl.SPARE_TAINT.key]
            rt.kube.core.patch_node(node.metadata.name, {
                "metadata": {"labels": {pl.LABEL_ROLE: pl.ROLE_ACTIVE, pl.LABEL_REPLACES: action.replacing}},
                "spec": {"taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in keep] or None}})
            where = "same UltraServer" if action.same_ultraserver else f"UltraServer {action.ultraserver_id}"
            events.append((node_body(node), Event("Normal", "SparePromoted",
                                                  f"spare {action.spare} ({where}) replaces {action.replacing}")))
            metrics.REMEDIATIONS.labels("promote").inc()
            metrics.observe_spare_promotion(action.grace_ended, rt.clock())
        elif isinstance(action, hl.RemoveNode):
            what = release(rt, provider, action.node, group_key)
            events.append((None, Event("Normal", "NodeRemoved", f"{action.node} removed: {action.reason}; {what}")))
            metrics.REMEDIATIONS.labels("remove").inc()
    def create(spec: pl.NodeSpec) -> tuple[dict | None, Event] | None:
        try:
            name = provider.create(spec)
        except NoFreeNode as e:
            return None, Event("Warning", "NoFreeNode", str(e))
        except AdoptionConflict as e:  # not an error: the next pass chooses again
            log.info("group %s: %s", group_obj["metadata"]["name"], e)
            return None
        made = f"{spec.name} ({spec.role}) in {spec.availability_zone}"
        if name == spec.name:
            return None, Event("Normal", "NodeCreated", made)
        adopted = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        return adopted, Event("Normal", "NodeAdopted", f"{made}: node {name} lent from the free pool")

    # Nodes are independent: their create calls go out together rather than one after another.
    lost_race = False
    with ThreadPoolExecutor(max_workers=min(CREATE_WORKERS, max(1, len(d.create)))) as pool:
        for outcome in pool.map(create, d.create):
            if outcome is None:
                lost_race = True
            else:
                events.append(outcome)
    if any(ev.reason == "NoFreeNode" for _, ev in events):
        rt.short_of_free_nodes.add(group_key)  # woken when a free node changes (handlers.nodes)
    else:
        rt.short_of_free_nodes.discard(group_key)
    backfills = sum(1 for a in d.remediation if isinstance(a, hl.Backfill))
    if backfills:
        metrics.REMEDIATIONS.labels("backfill").inc(backfills)
    for spec in d.update:
        provider.update(spec.name, spec, managed_taint_keys(spec))
    now = rt.clock()
    for drain in d.drain:
        node = raw.get(drain.node)
        if node is None:
            continue
        if not node.spec.unschedulable:
            provider.cordon(drain.node)
            events.append((node_body(node), Event("Normal", "Draining",
                                                  f"{drain.node} cordoned ({drain.reason}); evicting pods "
                                                  f"until {drain.deadline.isoformat()}")))
        progress = evict_pods(rt.kube, node.metadata.name, rt.me)
        if progress.pods_left == 0 or now >= drain.deadline:
            what = release(rt, provider, drain.node, group_key)
            events.append((node_body(node), Event(
                "Normal", "NodeRemoved",
                f"{drain.node} drained and removed ({drain.reason}): {what}{left_alone_note(progress)}")))
    for body, ev in events:
        log.info("group %s: %s: %s", group_obj["metadata"]["name"], ev.reason, ev.message)
        kopf.event(body or group_obj, type=ev.type, reason=ev.reason, message=ev.message)
        if body is not None:
            kopf.event(group_obj, type=ev.type, reason=ev.reason, message=ev.message)
    return lost_race


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10, initial_delay=0)
async def group_daemon(name: str, stopped: kopf.DaemonStopped, memo: kopf.Memo, **_: Any) -> None:
    rt: Runtime = memo.runtime
    await reconcile_forever(rt, KIND, pl.label_value(name), "InstanceGroup",
                            lambda: reconcile_group(rt, name), stopped, log, PLURAL, name)


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def group_spec_changed(name: str, spec: kopf.Spec, memo: kopf.Memo, **_: Any) -> None:
    """A changed count may move every group that shares the plan."""
    memo.runtime.wakeups.wake(KIND, pl.label_value(name))
    memo.runtime.wake_groups_of(spec.get("trainingPlanRef", ""))


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def drain_group(name: str, spec: kopf.Spec, memo: kopf.Memo, body: kopf.Body, **_: Any) -> None:
    """Drain and remove every node of the group before it goes away (retried until done)."""
    rt: Runtime = memo.runtime
    provider = rt.providers[spec.get("nodeProvider", "kwok")]
    nodes = await asyncio.to_thread(provider.list, name)
    for node in nodes:
        node_id = (node.metadata.labels or {}).get(LABEL_NODE_ID, node.metadata.name)
        if not node.spec.unschedulable:
            await asyncio.to_thread(provider.cordon, node_id)
        progress = await asyncio.to_thread(evict_pods, rt.kube, node.metadata.name, rt.me)
        if progress.pods_left == 0:
            what = await asyncio.to_thread(release, rt, provider, node_id, pl.label_value(name))
            log.info("group %s: %s drained and removed: %s%s", name, node_id, what, left_alone_note(progress))
    left = await asyncio.to_thread(provider.list, name)
    if left:
        raise kopf.TemporaryError(f"{len(left)} node(s) still draining", delay=1)
    kopf.info(body, reason="Drained", message=f"all nodes of {name} drained and removed")
    rt.group_plans.pop(pl.label_value(name), None)
    rt.short_of_free_nodes.discard(pl.label_value(name))
    rt.wake_groups_of(spec.get("trainingPlanRef", ""))  # they may take the room it leaves
