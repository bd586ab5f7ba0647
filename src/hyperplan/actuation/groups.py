"""An InstanceGroup's nodes, read and changed: the two ends of a group's pass.

* :func:`observe_nodes` turns the nodes a provider lists into what planning judges
  (:class:`~hyperplan.planning.groups.ObservedGroupNode`), with the nodes deleted from
  under the group that the memory still holds, and says which health-signal notes the
  nodes need, and the values of theirs it could not read (:class:`Observation`).
* :func:`apply_decision` carries out a :class:`~hyperplan.planning.groups.GroupDecision`
  through the group's :class:`~hyperplan.actuation.providers.base.NodeProvider` and
  :class:`~hyperplan.actuation.pods.NodePods`, on the nodes the group holds by its record
  (``planning.ownership``: each provider call names the node by the name and uid recorded,
  never by a label): first, together (each writes a node no other
  one writes), the health-signal notes, marks, spare promotions and creates; then evictions and
  removals, the updates, the deep health checks' Jobs (through
  :class:`~hyperplan.actuation.deepchecks.DeepCheckJobs`), the checkpoint signal (pods annotated,
  node condition set), the drains. It
  returns what it did (:class:`Applied`): the events to post, whether a create lost a race
  for a free static node or found none to lend, and what the group's record gains and loses
  (the nodes made, with their uids; cordons and lent records moved; the nodes released). It never touches the operator's memory; the
  handler applies the result on the event loop.
* :func:`drain_node` is the one drain step, :func:`drain_nodes` runs it for many nodes at once;
  a pass and the group's deletion both drain through it.

Sync: the handler runs :func:`apply_decision` in a worker thread.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from kubernetes import client

from hyperplan import metrics, threads
from hyperplan.api.vocabulary import to_rfc3339
from hyperplan.actuation.deepchecks import DeepCheckJobs, Target
from hyperplan.actuation.pods import DrainProgress, NodePods
from hyperplan.actuation.providers.base import AdoptionConflict, NodeProvider, NoFreeNode, taints_of
from hyperplan.api.models import GroupNode
from hyperplan.planning.lending import LentRecord
from hyperplan.planning.memory import GroupMemory, PresentNode, Vanished
from hyperplan.planning import reading
from hyperplan.planning import deepchecks
from hyperplan.planning import health
from hyperplan.planning import naming
from hyperplan.planning import nodefacts
from hyperplan.planning import placement
from hyperplan.planning.groups import (
    ANNOTATION_BLOCK_TERMINATION, CONDITION_BLOCK_TERMINATING, REASON_CHECKPOINT, Checkpoint, GroupDecision,
    ObservedGroupNode, managed_taint_keys,
)
from hyperplan.planning.plans import Event

# A pass's new nodes (with its health notes, marks and promotions) go out this many at once: a
# block's start is a burst of creates, and Karpenter's own provisioner sends a NodePool's claims
# all at once. At 8, a group's 288 NodeClaims took 6 to 16 s against an API server busy with
# Karpenter's launches of the first ones, where Karpenter's own took 4 (docs/benchmarks.md).
CREATE_WORKERS = 32
DRAIN_WORKERS = 8  # drains at once per pass: each lists and evicts pods, heavier than a create
NODE_WRITE_THREADS = threads.size("node-write")  # all groups' node writes at once (run_together)
T = TypeVar("T")
log = logging.getLogger("hyperplan.groups")

NodeBody = dict  # the Kubernetes reference an event is posted on (None: the group)


Records = Mapping[str, GroupNode]  # the group's record of the nodes it holds, by node id


def target(nid: str, node: client.V1Node | None, records: Records | None) -> tuple[str, str]:
    """The name and uid a provider call names node ``nid`` by: the group's record of it, or (for
    callers without a record) the Node as listed; never a label."""
    entry = (records or {}).get(nid)
    if entry is not None:
        return entry.name, entry.uid
    if node is not None:
        return node.metadata.name, node.metadata.uid or ""
    return nid, ""


def node_ref(node: client.V1Node) -> NodeBody:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.metadata.name, "uid": node.metadata.uid}}


# --------------------------------------------------------------------------- reading


def being_evacuated(node: client.V1Node) -> bool:
    """Whether the node was marked for replacement (its pods leave before it does)."""
    return (nodefacts.marked_for_replacement(node.metadata.labels or {})
            or health.ANNOTATION_EVICTING_SINCE in (node.metadata.annotations or {}))


def count_pods(pods: NodePods, raw: Sequence[client.V1Node]) -> dict[str, int]:
    """The pods still on the nodes marked for replacement, by node name (sync, thread): their
    removal waits until none is left. Other nodes' pods are not read."""
    return {n.metadata.name: pods.count(n.metadata.name) for n in raw if being_evacuated(n)}


def observe_node(node: client.V1Node, now: datetime, keys: naming.TopologyKeys,
                 first_sight: Callable[[str, str], datetime], pods_left: int | None = None,
                 nid: str | None = None, assigned_by: tuple[str, ...] = ()) -> ObservedGroupNode:
    """One node as planning judges it, under id ``nid`` (the group's record of it; the node's
    name when None). ``first_sight(node_id, value)`` says when this process
    first saw the node's ``Unschedulable*`` health label; the node's own record
    (:data:`~hyperplan.planning.health.ANNOTATION_HEALTH_SINCE`) wins when it is earlier.
    ``pods_left``: the pods on it (counted for nodes marked for replacement only);
    ``assigned_by``: the Kueue workloads whose topology assignment names it (read for those only)."""
    facts = nodefacts.facts_of_v1(node, keys, now)
    annotations = node.metadata.annotations or {}
    bad = facts.unschedulable_health
    name = nid or node.metadata.name
    since = None
    if bad:
        recorded = annotations.get(health.ANNOTATION_HEALTH_SINCE)
        since = health.health_label_since(bad, recorded, first_sight(name, bad))
    return ObservedGroupNode(
        health=health.NodeObservation(
            name=name, conditions=facts.conditions, health_label=facts.health, health_label_since=since,
            role=facts.role, ultraserver_id=facts.ultraserver_id, created=facts.created, slot=facts.slot,
            generation=facts.generation, replaces=facts.replaces, pods_left=pods_left, assigned_by=assigned_by,
            evicting_since=reading.time_or_none(annotations.get(health.ANNOTATION_EVICTING_SINCE))),
        labels=facts.labels, taints=taints_of(node), unschedulable=facts.cordoned,
        ready=facts.is_ready, deleting=facts.deleting)


def vanished_observation(v: Vanished, keys: naming.TopologyKeys) -> ObservedGroupNode:
    """A node deleted from under the group, as an observation of a node that no longer exists."""
    labels = dict(v.labels)
    return ObservedGroupNode(
        health=health.NodeObservation(name=v.name, exists=False, deleted_since=v.since,
                                  role=labels.get(naming.LABEL_ROLE, naming.ROLE_ACTIVE),
                                  ultraserver_id=labels.get(keys.ultraserver_id), slot=reading.slot_of(labels),
                                  generation=reading.generation_of(labels), replaces=labels.get(naming.LABEL_REPLACES)),
        labels=labels, taints=(), unschedulable=True, ready=False)


def health_signal_note(node: client.V1Node, seen: ObservedGroupNode) -> tuple[str, str | None] | None:
    """The change of the node's health-signal record this pass needs, as (node id, new value or
    None to remove it), or None when the record is right. Written once per new ``Unschedulable*``
    value and removed when the label goes, so that a restarted operator counts the grace from
    the first sight, and a signal that comes back later starts a new grace."""
    recorded = (node.metadata.annotations or {}).get(health.ANNOTATION_HEALTH_SINCE)
    value, since = seen.health.health_label, seen.health.health_label_since
    want = health.health_signal_record(value, since) if since is not None else None
    return None if recorded == want else (seen.name, want)


@dataclass
class Observation:
    """A group's nodes as one pass found them."""

    nodes: list[ObservedGroupNode]  # existing nodes, then the ones deleted from under the group
    raw: dict[str, client.V1Node]  # existing nodes by node id
    health_notes: list[tuple[str, str | None]]  # (node id, record) to write on the nodes
    # The values of the nodes that could not be read (the pass read them as absent), with the node.
    unreadable: list[tuple[NodeBody, reading.Finding]] = field(default_factory=list)


def observe_nodes(group: str, raw: Sequence[client.V1Node], memory: GroupMemory, now: datetime,
                  keys: naming.TopologyKeys, pod_counts: Mapping[str, int] | None = None,
                  ids: Mapping[str, str] | None = None,
                  assigned: Mapping[str, tuple[str, ...]] | None = None) -> Observation:
    """Read a group's nodes (``group`` is its label value; ``pod_counts`` from :func:`count_pods`;
    ``ids``: each node's id by its name, from the group's record; ``assigned``: the Kueue
    workloads that a node's name is assigned to, for the nodes marked for replacement), and
    prune the group's memory.
    ``raw`` holds only the nodes the group holds (``planning.ownership.sort_nodes``).

    Runs on the event loop: it asks and updates ``memory``."""
    counts, ids, assigned = pod_counts or {}, ids or {}, assigned or {}
    seen = [observe_node(n, now, keys, lambda node, value: memory.first_sight(group, node, value, now),
                         counts.get(n.metadata.name), ids.get(n.metadata.name), assigned.get(n.metadata.name, ()))
            for n in raw]
    notes = [note for n, s in zip(raw, seen) if (note := health_signal_note(n, s)) is not None]
    present = [PresentNode(s.name, s.labels, nodefacts.unschedulable_health(s.labels)) for s in seen]
    vanished = memory.observe(group, present, now)
    memory.prune(group, present)
    unreadable = [(node_ref(n), finding) for n in raw
                  for finding in reading.node_findings(n.metadata.name, n.metadata.labels or {},
                                                       n.metadata.annotations or {})]
    return Observation(nodes=seen + [vanished_observation(v, keys) for v in vanished],
                       raw={s.name: n for s, n in zip(seen, raw)}, health_notes=notes, unreadable=unreadable)


# --------------------------------------------------------------------------- acting


@dataclass
class Applied:
    """What :func:`apply_decision` did."""

    events: list[tuple[NodeBody | None, Event]] = field(default_factory=list)
    pod_events: list[tuple[dict, Event]] = field(default_factory=list)  # posted on the pod only
    lost_race: bool = False  # a create lost a race for a free static node: look again soon
    short_of_free_nodes: bool = False  # a create found no lendable free static node
    made: list[GroupNode] = field(default_factory=list)  # created or adopted now, for the record
    changed: dict[str, GroupNode] = field(default_factory=dict)  # record entries moved, by node id
    released: set[str] = field(default_factory=set)  # node ids removed or handed back now


def releases_of(d: GroupDecision) -> list[str]:
    """The nodes a decision may remove (noted before it is carried out, see GroupMemory)."""
    return [a.node for a in d.remediation if isinstance(a, health.RemoveNode)] + [x.node for x in d.drain]


@dataclass(frozen=True)
class DrainOutcome:
    released: str | None  # what became of the node, in words, once it was released
    progress: DrainProgress
    events: tuple[tuple[NodeBody | None, Event], ...]
    cordoned: bool = False  # this step cordoned the node (the record notes it, for the hand-back)


def left_alone_note(progress: DrainProgress) -> str:
    """The pods a drain did not evict, for the removal event ("" when none)."""
    if not progress.left_alone:
        return ""
    return "; left running: " + ", ".join(f"{p} ({why})" for p, why in sorted(progress.left_alone.items()))


def drain_node(provider: NodeProvider, pods: NodePods, node: client.V1Node, reason: str,
               deadline: datetime | None, now: datetime, record: GroupNode | None = None) -> DrainOutcome:
    """One drain step: cordon (once), ask to evict the node's pods, and release the node once
    none is left or ``deadline`` has passed (None: no deadline, wait for the pods). ``record``:
    the group's record of the node (its name, uid, lent record and cordon), None for a node
    the caller read itself (acted on by the listed name and uid)."""
    nid = record.node_id if record is not None else node.metadata.name
    name, uid = (record.name, record.uid) if record is not None else (node.metadata.name, node.metadata.uid or "")
    events: list[tuple[NodeBody | None, Event]] = []
    cordoned = False
    if not (node.spec and node.spec.unschedulable):
        cordoned = provider.cordon(name, uid) is not False
        until = f"until {deadline.isoformat()}" if deadline is not None else "until none is left"
        events.append((node_ref(node), Event("Normal", "Draining",
                                             f"{nid} cordoned ({reason}); evicting pods {until}")))
    progress = pods.evict(node.metadata.name)
    if progress.pods_left and (deadline is None or now < deadline):
        return DrainOutcome(None, progress, tuple(events), cordoned)
    lent = LentRecord.from_state(record.lent) if record is not None and record.lent is not None else None
    what = provider.release(name, uid, lent, cordoned or (record is not None and record.cordoned))
    events.append((node_ref(node), Event("Normal", "NodeRemoved",
                                         f"{nid} drained and removed ({reason}): {what}{left_alone_note(progress)}")))
    return DrainOutcome(what, progress, tuple(events), cordoned)


def signal_checkpoint(provider: NodeProvider, pods: NodePods, node: client.V1Node, checkpoint: Checkpoint,
                      now: datetime) -> list[tuple[dict, Event]]:
    """Ask the workloads on one node to checkpoint: annotate its pods (those a drain would
    evict), then set the node's condition (by the node's name, with its uid); the Warning
    Events for the pods annotated. Pods first: a crash in between leaves the node unsignalled,
    and the next pass finishes the job."""
    annotated = pods.annotate(node.metadata.name, {ANNOTATION_BLOCK_TERMINATION: checkpoint.annotation})
    provider.set_condition(node.metadata.name, {
        "type": CONDITION_BLOCK_TERMINATING, "status": "True", "reason": REASON_CHECKPOINT,
        "message": checkpoint.message, "lastTransitionTime": to_rfc3339(now), "lastHeartbeatTime": to_rfc3339(now)},
        node.metadata.uid or "")
    return [(ref, Event("Warning", REASON_CHECKPOINT, checkpoint.message)) for ref in annotated]


def evacuate_node(provider: NodeProvider, pods: NodePods, node: client.V1Node, action: health.EvictPods,
                  now: datetime) -> list[tuple[NodeBody | None, Event]]:
    """Move the pods off a failed node whose replacement serves: through the Eviction API, or
    on a dead node past its deadline, marked Failed with ``DisruptionTarget`` and deleted."""
    if action.start:  # the eviction deadline of a dead node counts from here, across restarts
        started = to_rfc3339(now, micro=True)  # to the microsecond
        provider.annotate(node.metadata.name, {health.ANNOTATION_EVICTING_SINCE: started}, node.metadata.uid or "")
    if action.force:
        message = (f"hyperplan: node {action.node} failed ({action.reason}) and its replacement serves; "
                   "the node does not answer, so its pods are deleted")
        gone = pods.force_delete(node.metadata.name, {
            "type": "DisruptionTarget", "status": "True", "reason": health.REASON_DELETED_BY_HYPERPLAN,
            "message": message, "lastTransitionTime": to_rfc3339(now)})
        if not gone:
            return []
        return [(node_ref(node), Event("Warning", "PodsDeleted",
                                       f"{action.node} does not answer: {len(gone)} pod(s) marked Failed "
                                       f"(DisruptionTarget) and deleted: {', '.join(sorted(gone))}"))]
    progress = pods.evict(node.metadata.name)
    if not action.start:
        return []
    return [(node_ref(node), Event("Normal", "PodsEvicted",
                                   f"{action.node} failed ({action.reason}) and its replacement serves: evicting "
                                   f"its {progress.pods_left} pod(s) before it is removed"))]


def apply_decision(provider: NodeProvider, pods: NodePods, d: GroupDecision, raw: Mapping[str, client.V1Node],
                   health_notes: Iterable[tuple[str, str | None]], now: datetime,
                   clock: Callable[[], datetime], group: str = "", records: Records | None = None,
                   claims: Mapping[str, str] | None = None, checks: DeepCheckJobs | None = None) -> Applied:
    """Carry out a decision (see the module docstring) on the nodes ``raw`` (by node id), named
    to the provider as ``records`` (the group's record, by node id) has them; each new node
    carries its nonce from ``claims`` (by node id; the record holds its digest already); the
    deep health checks' Jobs go through ``checks``. Sync (thread)."""
    out = Applied()

    def name_of(nid: str) -> str:
        return target(nid, raw.get(nid), records)[0]

    def note(nid: str, record: str | None) -> list[tuple[NodeBody | None, Event]]:
        name, uid = target(nid, raw.get(nid), records)
        provider.annotate(name, {health.ANNOTATION_HEALTH_SINCE: record}, uid)
        return []

    def mark(action: health.MarkUnhealthy) -> list[tuple[NodeBody | None, Event]]:
        provider.mark_unhealthy(name_of(action.node), action.health_status, action.taint, raw[action.node],
                                action.fault)
        metrics.REMEDIATIONS.labels("mark").inc()
        metrics.observe_mark(group, action.reboot_result, action.over_budget)
        return [(node_ref(raw[action.node]), Event(
            "Warning", "NodeUnhealthy", f"{action.node}: {action.reason}; marked {action.health_status}"))]

    def promote(action: health.PromoteSpare) -> list[tuple[NodeBody | None, Event]]:
        provider.promote_spare(name_of(action.spare), action.replacing, raw[action.spare])
        metrics.REMEDIATIONS.labels("promote").inc()
        metrics.observe_spare_promotion(action.grace_ended, clock(), action.fault_since)
        where = "same UltraServer" if action.same_ultraserver else f"UltraServer {action.ultraserver_id}"
        return [(node_ref(raw[action.spare]), Event(
            "Normal", "SparePromoted", f"spare {action.spare} ({where}) replaces {action.replacing}"))]

    def recover(action: health.RecoverNode) -> list[tuple[NodeBody | None, Event]]:
        provider.mark_healthy(name_of(action.node), raw[action.node])
        metrics.REMEDIATIONS.labels("recover").inc()
        metrics.observe_recovered(action.fault_since, clock())
        back = "as its UltraServer's spare" if action.as_spare else "as before"
        return [(node_ref(raw[action.node]), Event("Normal", "NodeRecovered",
                                                   f"{action.node} is back Ready after its reboot and serves {back}"))]

    def reboot(action: health.RebootNode) -> list[tuple[NodeBody | None, Event]]:
        name, uid = target(action.node, raw.get(action.node), records)
        provider.reboot(name, uid)
        metrics.REMEDIATIONS.labels("reboot").inc()
        asked = " (requested)" if action.requested else ""
        return [(node_ref(raw[action.node]), Event("Warning", "NodeRebooting",
                                                   f"{action.node}: {action.reason}; rebooting{asked}"))]

    def release(nid: str) -> str:
        """Remove a failed node the group holds; one it no longer finds is gone already."""
        node, entry = raw.get(nid), (records or {}).get(nid)
        if node is None and entry is None:
            out.released.add(nid)
            return f"{nid} is gone already"
        name, uid = target(nid, node, records)
        lent = LentRecord.from_state(entry.lent) if entry is not None and entry.lent is not None else None
        out.released.add(nid)
        return provider.release(name, uid, lent, entry is not None and entry.cordoned)

    def create(spec: placement.NodeSpec) -> list[tuple[NodeBody | None, Event]] | None:
        try:
            node = provider.create(spec, (claims or {}).get(spec.name, ""))
        except NoFreeNode as e:
            return [(None, Event("Warning", "NoFreeNode", str(e)))]
        except AdoptionConflict as e:  # not an error: the next pass chooses again
            log.info("group %s: %s", group, e)
            return None
        made = f"{spec.name} ({spec.role}) in {spec.availability_zone}"
        if node.node_claim is not None:  # karpenter: the claim now, its Node when Karpenter registers it
            with made_lock:
                out.made.append(GroupNode(name=node.name, uid="", node_id=spec.name, node_claim=node.node_claim))
            return [(None, Event("Normal", "NodeClaimCreated", f"{made}: NodeClaim {node.node_claim.name}"))]
        if not node.uid:  # there already, not made by this call: not the group's, left alone
            return [(None, Event("Warning", "NodeNameTaken",
                                 f"node {node.name} exists and is not in the group's record: left alone"))]
        with made_lock:
            out.made.append(GroupNode(name=node.name, uid=node.uid, node_id=spec.name,
                                      lent=node.lent.state() if node.lent is not None else None))
        made_as = node.name
        if made_as == spec.name:
            return [(None, Event("Normal", "NodeCreated", made))]
        adopted = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": made_as}}
        return [(adopted, Event("Normal", "NodeAdopted", f"{made}: node {made_as} lent from the free pool"))]

    made_lock = threading.Lock()  # the creates run together
    # Each of these writes one node that none of the others writes (health-signal notes, marks of
    # failed nodes, spare promotions, new nodes and backfills), so they go out together: in a storm
    # of failures a spare serves, and its backfill is created, without waiting for the others.
    independent: list[Callable[[], list[tuple[NodeBody | None, Event]] | None]] = [
        functools.partial(note, nid, record) for nid, record in health_notes]
    for action in d.remediation:
        if isinstance(action, health.MarkUnhealthy) and action.node in raw:
            independent.append(functools.partial(mark, action))
        elif isinstance(action, health.PromoteSpare) and action.spare in raw:
            independent.append(functools.partial(promote, action))
        elif isinstance(action, health.RecoverNode) and action.node in raw:
            independent.append(functools.partial(recover, action))
    independent += [functools.partial(create, spec) for spec in d.create]
    for outcome in run_together(independent):
        if outcome is None:
            out.lost_race = True
        else:
            out.events.extend(outcome)

    # Then what depends on the state of others: a failed node reboots once it is marked (and its
    # spare promoted); pods leave a failed node once its replacement serves, and it goes once they
    # have left (decided across passes; in the remediation's order).
    for outcome in run_together([functools.partial(reboot, action) for action in d.remediation
                                 if isinstance(action, health.RebootNode) and action.node in raw]):
        out.events.extend(outcome)
    for action in d.remediation:
        if isinstance(action, health.EvictPods) and action.node in raw:
            out.events.extend(evacuate_node(provider, pods, raw[action.node], action, clock()))
        elif isinstance(action, health.RemoveNode):
            what = release(action.node)
            out.events.append((None, Event("Normal", "NodeRemoved", f"{action.node} removed: {action.reason}; {what}")))
            metrics.REMEDIATIONS.labels("remove").inc()
            metrics.observe_recovery("replace", action.fault_since, action.serving_since)
    out.short_of_free_nodes = any(ev.reason == "NoFreeNode" for _, ev in out.events)
    backfills = sum(1 for a in d.remediation if isinstance(a, health.Backfill))
    if backfills:
        metrics.REMEDIATIONS.labels("backfill").inc(backfills)
    for spec in d.update:
        entry = (records or {}).get(spec.name)
        name, uid = target(spec.name, raw.get(spec.name), records)
        before = LentRecord.from_state(entry.lent) if entry is not None and entry.lent is not None else None
        after = provider.update(name, spec, managed_taint_keys(spec), uid, before)
        if entry is not None and after is not None and after != before:
            out.changed[spec.name] = entry.model_copy(update={"lent": after.state()})
    if d.checks is not None:
        out.events.extend(apply_checks(checks, d, raw, records, group))
    if d.checkpoint is not None:  # before the drains: every pod is asked before it is evicted
        signal = [raw[n] for n in d.checkpoint.nodes if n in raw]
        for pod_events in run_together([functools.partial(signal_checkpoint, provider, pods, n, d.checkpoint, now)
                                        for n in signal]):
            out.pod_events.extend(pod_events)
    todo = [(raw[x.node], x.reason, x.deadline) for x in d.drain if x.node in raw]
    for nid, outcome in drain_nodes(provider, pods, todo, now, records):
        out.events.extend(outcome.events)
        entry = out.changed.get(nid) or (records or {}).get(nid)
        if outcome.released is not None:
            out.released.add(nid)
        elif outcome.cordoned and entry is not None:
            out.changed[nid] = entry.model_copy(update={"cordoned": True})
    return out


def apply_checks(checks: DeepCheckJobs | None, d: GroupDecision, raw: Mapping[str, client.V1Node],
                 records: Records | None, group: str) -> list[tuple[NodeBody | None, Event]]:
    """Make the check Jobs the decision asks for, on the nodes as the record names them, and say
    which runs began and ended (an Event each, on the node and the group; the failed checks'
    output in the failure's)."""
    plan = d.checks
    assert plan is not None
    events: list[tuple[NodeBody | None, Event]] = []
    targets = [Target(job, *target(job.node_id, raw.get(job.node_id), records)) for job in plan.start
               if job.node_id in raw]
    if targets and checks is not None:
        checks.start(group, targets)

    def on(nid: str) -> NodeBody | None:
        return node_ref(raw[nid]) if nid in raw else None

    for nid in plan.began:
        state = plan.states[nid]
        events.append((on(nid), Event("Normal", "DeepHealthCheckStarted",
                                      f"{nid}: {', '.join(state.checks)} started; tainted "
                                      f"{deepchecks.TAINT_DEEP_HEALTH_CHECK} until they pass")))
    for end in plan.finished:
        metrics.DEEP_HEALTH_CHECKS.labels("passed" if end.passed else "failed").inc()
        if end.passed:
            events.append((on(end.node_id), Event("Normal", "DeepHealthCheckPassed", f"{end.node_id}: {end.message}; "
                                                                               "it serves")))
        else:
            events.append((on(end.node_id), Event("Warning", "DeepHealthCheckFailed",
                                                  f"{end.node_id}: {end.message}; it does not serve")))
    return events


def node_writes() -> ThreadPoolExecutor:
    """The threads that every group's pass fans its node writes out to: one pool for the process
    (``hyperplan.threads``, "node-write"). A pool opened per call paid a thread start for every
    write of every pass, and nothing bounded them across groups."""
    return threads.shared_pool("node-write")


def run_together(calls: Sequence[Callable[[], T]], width: int = CREATE_WORKERS) -> list[T]:
    """Each call on :func:`node_writes`, at most ``width`` of this pass's at once (one group never
    takes the whole pool); the results in the order given. Every call runs even when one raises;
    then the first exception (in that order) is raised."""
    if len(calls) <= 1:
        return [c() for c in calls]
    pool = node_writes()
    futures: list[Future] = []
    running: set[Future] = set()
    for call in calls:
        if len(running) >= width:
            _, running = wait(running, return_when=FIRST_COMPLETED)
        future = pool.submit(call)
        futures.append(future)
        running.add(future)
    wait(running)
    return [f.result() for f in futures]


def drain_nodes(provider: NodeProvider, pods: NodePods,
                todo: Sequence[tuple[client.V1Node, str, datetime | None]],
                now: datetime, records: Records | None = None) -> list[tuple[str, DrainOutcome]]:
    """:func:`drain_node` for each (node, reason, deadline), from up to :data:`DRAIN_WORKERS`
    threads (the nodes are independent; one after the other, the 288 nodes of a group of 16 x72
    UltraServers took about 3 minutes to leave); (node id, outcome) in the order given. Sync."""
    if not todo:
        return []

    by_name = {entry.name: entry for entry in (records or {}).values()}

    def one(item: tuple[client.V1Node, str, datetime | None]) -> tuple[str, DrainOutcome]:
        node, reason, deadline = item
        record = by_name.get(node.metadata.name)
        return (record.node_id if record is not None else node.metadata.name,
                drain_node(provider, pods, node, reason, deadline, now, record))

    return run_together([functools.partial(one, item) for item in todo], DRAIN_WORKERS)
