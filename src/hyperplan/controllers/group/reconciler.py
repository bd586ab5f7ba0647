"""The InstanceGroup controller: passes over each group that hold nodes only while a block is usable.

Each pass (:func:`reconcile_group`) reads the group, its plan, the groups sharing the plan
and the group's nodes; ``planning.ownership`` keeps only the nodes in the group's record
(``status.nodes``, by name and uid: a node's labels prove nothing) and reports the others;
``actuation.groups.observe_nodes`` turns the held nodes into observations
(with the group's memory, ``planning.memory``); ``planning.groups.decide_group`` says what
should exist; ``actuation.groups.apply_decision`` carries it out through the group's node
provider (health notes, marks and spare promotions, new nodes, label and taint updates,
drains and removals) and returns what it did, which the handler notes in the memory; then
one status patch (the record of the nodes held among it) and the events. The passes run on the operator's work queue
(``runtime.workqueue``), keyed by the label value of the group's name (which its nodes carry);
the group is looked at again at its next block boundary, health deadline or drain retry, or
when a node, the plan or the group changes (its generation or its labels). The operator's own
finalizer is put on before a pass decides (:func:`hold_finalizer`), so no node exists before it;
a group being deleted is a pass too (:func:`delete_group`): its nodes drained and removed, then
the finalizer taken off. Groups and plans share this one lifecycle: the work queue, generation
changes, the operator's finalizer; kopf only delivers the watch events.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

import kopf
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from hyperplan import metrics
from hyperplan.actuation.groups import (
    Applied, apply_decision, being_evacuated, count_pods, drain_nodes, node_ref, observe_nodes, releases_of,
)
from hyperplan.api.models import (
    GroupNode, InstanceGroup, InstanceGroupStatus, TrainingPlan, VanishedRecord,
)
from hyperplan.actuation.providers.karpenter import read_offerings
from hyperplan.api.vocabulary import FINALIZER, GROUP_FINALIZER, REASON_CLAIM_DELETED, REASON_UNREADABLE
from hyperplan.runtime.context import Runtime, status_of, status_patch, ultraserver_replacements
from hyperplan.runtime.views import as_the_ledger_holds, workloads_assigned_to
from hyperplan.runtime.workqueue import Pace, PassPhases
from hyperplan.planning import deepchecks
from hyperplan.planning import health
from hyperplan.planning import lending
from hyperplan.planning import naming
from hyperplan.planning import ownership
from hyperplan.planning import placement
from hyperplan.planning import recovery
from hyperplan.planning.groups import BoundPlan, GroupDecision, PassFacts, Peer, decide_group
from hyperplan.planning.memory import Vanished, vanished_labels
from hyperplan.planning.nodefacts import NodeFacts, facts_of_v1
from hyperplan.planning.plans import Event
from hyperplan.planning.tenancy import Selector, allows, selector_of

PLURAL = "instancegroups"
# A pass over a large group costs the event loop (and the GIL its create threads and the client
# share) tens to hundreds of milliseconds; while a group's nodes come up, every node event would
# start the next one at once. A pass that took longer than PACE.start waits as long as it took
# (at most PACE.most) before the next one that an event asks for, so a group keeps at most half of the
# loop. Its own deadlines (grace ends, block boundaries) are never delayed (runtime.workqueue).
PACE = Pace(start=0.05, most=0.5)
ADOPTION_RETRY = timedelta(seconds=1)  # after a lost race for a free static node
RECORD_CONFLICT_RETRY = timedelta(seconds=1)  # after another writer changed the group's status
DRAIN_RETRY = timedelta(seconds=1)  # a deleted group's nodes still draining
# While a NodeClaim waits for its Node: no watch event says when Karpenter writes the claim's
# status (the operator watches Nodes, not claims), so the pass looks again at this pace.
LAUNCH_POLL = timedelta(seconds=2)
KIND = "group"
T = TypeVar("T")
log = logging.getLogger("hyperplan.instancegroup")


def bound_plan(plan: TrainingPlan) -> BoundPlan:
    selector = plan.spec.instance_group_selector
    return BoundPlan(name=plan.metadata["name"], target=plan.spec.target_resource,
                    instance_type=plan.spec.instance_type, ultra_server_type=plan.spec.ultra_server_type,
                    spares_per_ultraserver=plan.spec.spare_instances_per_ultra_server,
                    blocks=tuple(sorted(plan.status.reserved_capacity, key=lambda b: b.start_time)),
                    group_selector=selector_of(selector.wire()) if selector is not None else None)


def peers_of(groups: list[dict[str, Any]], plan: str, selector: Selector | None = None) -> list[Peer]:
    """Groups bound to ``plan``, oldest first (then by name): the placement order. A group the
    plan's ``instanceGroupSelector`` does not let in is no peer: it takes no room on the block."""
    bound = [g for g in groups if g.get("spec", {}).get("trainingPlanRef") == plan
             and not g["metadata"].get("deletionTimestamp") and allows(selector, g["metadata"].get("labels"))]
    bound.sort(key=lambda g: (g["metadata"].get("creationTimestamp", ""), g["metadata"]["name"]))
    out = []
    for g in bound:
        specs = (g["spec"].get("placement") or {}).get("placementSpecifications") or []
        out.append(Peer(g["metadata"]["name"], int(g["spec"].get("instanceCount", 0)),
                        tuple((p["ultraServerId"], int(p["instanceCount"])) for p in specs),
                        ultraserver_replacements(g)))
    return out


async def reconcile_group(rt: Runtime, name: str) -> datetime | None:
    """One pass: read, decide (planning), apply (actuation), one status patch, events."""
    # Read, from the watch cache (runtime.store): the group, its plan, the groups sharing the
    # plan, the group's nodes. A pass right after one that wrote to the nodes lists them from the
    # API once instead, so it never acts on a view older than its own writes.
    obj = rt.cache.group(name)
    if obj is None:
        return None
    if obj["metadata"].get("deletionTimestamp"):
        return await delete_group(rt, obj)
    phases = PassPhases()
    try:
        group = InstanceGroup.model_validate(obj)
    except ValidationError as e:
        kopf.event(obj, type="Warning", reason="InvalidSpec", message=str(e)[:900])
        return None
    held_obj = await hold_finalizer(rt, obj)
    if held_obj is None:  # changed or deleted meanwhile: the next pass reads it again
        return rt.clock() + RECORD_CONFLICT_RETRY
    obj = held_obj
    plan_obj = rt.cache.plan(group.spec.training_plan_ref)
    groups = rt.cache.groups()
    provider = rt.providers[group.spec.node_provider]
    fresh = rt.cache.must_list_group_nodes(naming.label_value(name))
    if fresh:
        listed = await in_thread(rt, provider.list, name)
    else:
        listed = rt.cache.group_nodes_v1(naming.label_value(name))
    node_claims = await claims_of(rt, group, provider, name)
    held = held_nodes(group.spec.node_provider, group.status, listed, node_claims, rt.clock(), launch_timeout(rt))
    if held.sorted.unaccounted and not fresh:
        # A recorded node the watch cache does not show: made by a pass whose creates the watch
        # has not shown yet (after a restart: a claim whose create may never have happened), or
        # gone. Only the API server can say which; without asking, the pass could neither make
        # it again nor forget it.
        fresh = True
        listed = await in_thread(rt, provider.list, name)
        held = held_nodes(group.spec.node_provider, group.status, listed, node_claims, rt.clock(), launch_timeout(rt))
    raw, records = held.raw, held.records
    pod_counts = (await in_thread(rt, count_pods, rt.pods, raw)  # nodes marked for replacement only
                  if any(being_evacuated(n) for n in raw) else {})
    kueue_assigned = {n.metadata.name: workloads_assigned_to(rt, n.metadata.name)
                      for n in raw if being_evacuated(n)}
    # The deep health checks' Jobs, while one runs (their ends wake no pass: the pass polls).
    awaited = deepchecks.awaited(group.status.nodes)
    check_jobs = await in_thread(rt, rt.checks.list, name, awaited) if awaited else None

    # Decide.
    phases.mark("read")
    now, key = rt.clock(), naming.label_value(name)
    plan = bound_plan(as_the_ledger_holds(rt, plan_obj, now)) if plan_obj else None  # blocks: the ledger's
    rt.group_memory.bind(key, group.spec.training_plan_ref)
    nodes_moved = rt.group_memory.note_nodes_read(key, node_fingerprint(raw))
    # Nodes deleted from under the group, as its record keeps them (an entry held by name and uid,
    # never a list of names anyone with the status could write; a time to come counts as now).
    rt.group_memory.restore_vanished(key, [Vanished(e.node_id, e.vanished.labels, min(e.vanished.since, now))
                                           for e in group.status.nodes or () if e.vanished is not None and e.uid])
    report_unrecorded(rt, obj, key, held)
    seen = observe_nodes(key, raw, rt.group_memory, now, rt.keys, pod_counts,
                         {entry.name: nid for nid, entry in records.items()}, kueue_assigned)
    first_seen = set(rt.group_memory.note_unreadable(key, [finding for _, finding in seen.unreadable]))
    unreadable = [(node, Event("Warning", REASON_UNREADABLE, finding.message))
                  for node, finding in seen.unreadable if finding in first_seen]  # once per node, key and value
    post_events(obj, unreadable)
    peers = peers_of(groups, group.spec.training_plan_ref, plan.group_selector if plan else None)
    generation = obj["metadata"].get("generation", 1)
    launch = await launch_facts(rt, group, provider, key, held, node_claims)
    decision = decide_group(name, generation, group.spec, group.status, plan, peers, seen.nodes, rt.policy, now,
                            rt.keys, obj["metadata"].get("labels") or {}, check_jobs, rt.settings.hyperpod_labels,
                            pass_facts(rt, obj, group, held, seen, records, fresh, now, launch))
    if decision.launch_memory is not None:
        provider.launch_memory[key] = decision.launch_memory
    for reason in decision.launch_failures:
        metrics.KARPENTER_LAUNCH_FAILURES.labels(reason).inc()
    # A NodeClaim still launching holds its slot while planning still wants the slot; one it no
    # longer wants (the block ended, the count went down), or that timed out, is deleted now.
    launching, let_go = decision.launching, decision.let_go

    # Intent first: the record names each node about to be made, with the digest of the nonce the
    # node will carry, before the node exists (planning.ownership: a crash in between loses nothing).
    # The same for a reboot: its clock is in the record before the node goes down.
    claims = {spec.name: secrets.token_hex(16) for spec in decision.create}
    rebooting = any(isinstance(a, health.RebootNode) for a in decision.remediation)
    # The record is written only over the one this pass read (resourceVersion): another writer (the
    # group's deletion, recording its cordons) may have changed it meanwhile, and a list in a merge
    # patch replaces the whole list.
    record_rv = obj["metadata"].get("resourceVersion")
    phases.mark("decide")
    if claims or rebooting:
        intent = recorded(ownership.next_record(
            held.sorted, [ownership.pending_entry(n, c) for n, c in claims.items()], listed_fresh=fresh,
            launching=launching, vanished=vanished_records(rt, key)), decision)
        try:
            written = await in_thread(rt, rt.kube.patch_status, PLURAL, name, {"nodes": [e.wire() for e in intent]},
                                      record_rv)
        except ApiException as e:
            if e.status != 409:
                raise
            log.info("group %s: its status changed since this pass read it; deciding again", name)
            return now + RECORD_CONFLICT_RETRY  # nothing was done
        if written:
            rt.cache.wrote(PLURAL, written)
            record_rv = written["metadata"].get("resourceVersion")

    # Apply, then remember what was done (on the event loop).
    phases.mark("intent")
    rt.group_memory.note_releasing(key, releases_of(decision))
    checking = decision.checks is not None and bool(decision.checks.start or decision.checks.finished
                                                     or decision.checks.began)
    writes = bool(decision.create or decision.update or decision.drain or decision.remediation
                  or decision.checkpoint or seen.health_notes or checking)
    applied = (await in_thread(rt, apply_decision, provider, rt.pods, decision, seen.raw, seen.health_notes,
                               now, rt.clock, name, records, claims, rt.checks) if writes else Applied())
    if let_go:
        # (their entries are out of the record already; the slot's new claim, made above, is in it)
        applied.events.extend(await in_thread(rt, delete_claims, provider, let_go))
    rt.cache.note_group_wrote(key, writes)
    rt.group_memory.note_short_of_free_nodes(key, applied.short_of_free_nodes)  # see wiring.nodes

    # One status patch, then the events.
    phases.mark("apply")
    status = decision.status.model_copy(update={"nodes": recorded(ownership.next_record(
        held.sorted, applied.made, applied.changed, applied.released, listed_fresh=fresh,
        launching=launching, vanished=vanished_records(rt, key)), decision)})
    record_retry = None
    desired, current = status.wire(), status_of(InstanceGroupStatus, obj).wire()
    if claims or rebooting or desired != current:  # with claims or a reboot: the intent is replaced
        record_moved = bool(claims or rebooting) or desired.get("nodes") != current.get("nodes")
        patch = status_patch(desired if record_moved else {k: v for k, v in desired.items() if k != "nodes"},
                             current, keep=("nodes",))
        # Over the record read, when there is one to lose (a new group's first record replaces nothing).
        guard = record_rv if record_moved and (current.get("nodes") or claims or rebooting) else None
        try:
            written = await in_thread(rt, rt.kube.patch_status, PLURAL, name, patch, guard)
        except ApiException as e:
            if e.status != 409:
                raise
            written = await in_thread(rt, record_again, rt, name, applied, decision, patch)
            if written is None:  # the rest of the status still lands; the record at the next pass
                written = await in_thread(rt, rt.kube.patch_status, PLURAL, name,
                                          {k: v for k, v in desired.items() if k != "nodes"})
                record_retry = now + RECORD_CONFLICT_RETRY
        if written:
            rt.cache.wrote(PLURAL, written)
        metrics.STATUS_WRITES.labels("InstanceGroup").inc()
    phases.mark("status")
    post_events(obj, [(None, ev) for ev in decision.events] + applied.events)
    for ev in decision.plan_events if plan_obj is not None else ():  # logged with the group's already
        kopf.event(plan_obj, type=ev.type, reason=ev.reason, message=ev.message)
    for reason in decision.ultraserver_reasons:
        metrics.ULTRASERVER_REPLACEMENTS.labels(reason).inc()
    if decision.plan_events:  # the plan's other groups place as if the replacement were the failed one
        for peer in peers:
            if peer.name != name:
                rt.queue.wake(KIND, naming.label_value(peer.name))
    for pod, ev in applied.pod_events:
        kopf.event(pod, type=ev.type, reason=ev.reason, message=ev.message)
    metrics.observe_group_pass(name, group.status, status,
                               decision.block.start_time if decision.block else None, rt.clock())
    if plan is not None and (nodes_moved or decision.create or decision.drain or decision.remediation
                             or decision.update
                             or status.ultra_servers_wanted != group.status.ultra_servers_wanted):
        # Its counts follow the nodes (see wiring.nodes); it may buy an UltraServer a group wants.
        rt.queue.wake("plan", plan.name)
    phases.mark("events")
    phases.report(f"group {name}", len(decision.create))
    wake_at = decision.wake_at if record_retry is None else min(t for t in (decision.wake_at, record_retry) if t)
    if launching or any(e.node_claim is not None for e in applied.made):
        # A claim waits for its Node (made now, or before): no watch event says when Karpenter ties
        # them (the Node's labels come before the claim's nodeName), or that it never will.
        again = now + LAUNCH_POLL
        if held.launch_deadline is not None:  # and a claim whose Node never comes is let go then
            again = min(again, held.launch_deadline)
        wake_at = again if wake_at is None else min(wake_at, again)
    if applied.lost_race:  # another writer adopted the free node first: choose again shortly
        retry = now + ADOPTION_RETRY
        return retry if wake_at is None else min(wake_at, retry)
    return wake_at


def pass_facts(rt: Runtime, obj: dict[str, Any], group: InstanceGroup, held: Held, seen: Any,
               records: dict[str, GroupNode], fresh: bool, now: datetime,
               launch: ownership.LaunchFacts | None = None) -> PassFacts:
    """What bounds this pass's creates besides the group and its nodes (``planning.groups.PassFacts``)."""
    bound = None
    if group.spec.node_provider == "static":
        # A lent node joins the cloud UltraServer its UltraServer's other lent nodes came from.
        bound = placement.cloud_ultraservers((n.health.ultraserver_id, lending.cloud_ultraserver_before(
            records.get(n.name), rt.keys.ultraserver_id)) for n in seen.nodes if n.health.exists)
    binding = held.binding
    return PassFacts(
        # The pass puts the finalizer on before it decides (hold_finalizer); no node exists before it.
        finalizer_held=GROUP_FINALIZER in obj["metadata"].get("finalizers", []),
        # No node of a name another node holds (KWOK would refuse it) or that the record holds but
        # the watch cache does not show yet.
        names_taken=frozenset({n.name for n in held.sorted.unrecorded}
                              | (set() if fresh else {e.node_id for e in held.sorted.missing})),
        launching=tuple(binding.launching) if binding is not None else (),
        expired=tuple(binding.expired) if binding is not None else (),
        cloud_ultraservers=bound,
        launch=launch,
        unrecorded=ownership.unrecorded_condition(held.sorted.unrecorded, group.metadata["name"],
                                                  obj["metadata"].get("generation", 1), group.status.conditions, now))


async def launch_facts(rt: Runtime, group: InstanceGroup, provider: Any, key: str, held: Held,
                       claims: list[ownership.ListedClaim] | None) -> ownership.LaunchFacts | None:
    """A karpenter group's launches as this pass finds them (``ownership.LaunchFacts``): its node
    class (read at most every few seconds, for every group), Karpenter's offerings (the kwok
    provider's instance-type file, when the settings name it), the group's claims Karpenter failed
    (their ``Launched`` condition, or deleted before they launched), and whether one launched.
    None for other groups."""
    if group.spec.node_provider != "karpenter":
        return None
    memory = provider.launch_memory.get(key, ownership.LaunchMemory())
    blocked = await in_thread(rt, provider.node_class_problem)
    offered = await in_thread(rt, read_offerings, rt.settings.karpenter_instance_types_file,
                              rt.settings.karpenter_capacity_type)
    binding, failures = held.binding, []
    if binding is not None:
        by_uid = {c.uid: c for c in claims or ()}
        for entry in binding.launching:
            listed = by_uid.get(entry.node_claim.uid) if entry.node_claim else None
            if listed is not None and listed.launch_failure is not None:
                failures.append(ownership.ClaimFailure(listed.name, listed.uid, listed.launch_failure))
        for entry in binding.gone:
            ref = entry.node_claim
            if ref is None:
                continue
            listed = by_uid.get(ref.uid)
            cause = listed.launch_failure if listed is not None else None
            failures.append(ownership.ClaimFailure(ref.name, ref.uid, cause or ownership.LaunchCause(
                REASON_CLAIM_DELETED, "deleted before it launched (Karpenter deletes a claim it cannot launch: "
                "insufficient capacity, or its node class not ready; the claim's Warning Events and Karpenter's "
                "log say which)"), gone=True))
    # A claim of the group's record that Karpenter launched (not one that only carries its label).
    ours = {e.node_claim.uid for e in group.status.nodes or () if e.node_claim is not None}
    ours |= {e.node_claim.uid for e in (binding.launching if binding is not None else ()) if e.node_claim is not None}
    return ownership.LaunchFacts(
        memory=memory, blocked=blocked, offered=offered, capacity_type=rt.settings.karpenter_capacity_type,
        failures=tuple(failures),
        launched=any(c.provider_id and not c.deleting and c.uid in ours for c in claims or ()))


def vanished_records(rt: Runtime, key: str) -> dict[str, VanishedRecord]:
    """The group's nodes deleted from under it whose slots are not replaced yet, by node id, as
    their record entries keep them."""
    return {v.name: VanishedRecord(since=v.since, labels=vanished_labels(v.labels, rt.keys))
            for v in rt.group_memory.vanished(key)}


def cordoned_already(node: Any) -> bool:
    return bool(node.spec and node.spec.unschedulable)


async def write_record(rt: Runtime, name: str, record: list[GroupNode], rv: str | None) -> str | None:
    """The deletion's write of the group's record, over ``rv``; the new resourceVersion, None on a
    conflict (someone wrote meanwhile: the deletion looks again and reads the record anew)."""
    try:
        written = await in_thread(rt, rt.kube.patch_status, PLURAL, name, {"nodes": [e.wire() for e in record]}, rv)
    except ApiException as e:
        if e.status != 409:
            raise
        log.info("group %s: its status changed meanwhile; reading it again", name)
        return None
    return (written or {}).get("metadata", {}).get("resourceVersion") or ""


def recorded(entries: list[GroupNode], decision: GroupDecision) -> list[GroupNode]:
    """The record with what the decision moved in it: recovery clocks and deep health checks."""
    return recovery.recorded(deepchecks.recorded(entries, decision.checks.moved if decision.checks else {}),
                             decision.recovery)


def record_again(rt: Runtime, name: str, applied: Applied, decision: GroupDecision, patch: dict[str, Any]) -> dict[str, Any] | None:
    """The pass's status patch lost to another writer of the group's status (409): what the pass
    did to the record (nodes made and released, entries changed, recovery clocks and checks moved)
    applied to the record as it is now, written over that one. A second conflict leaves it to the
    next pass (the nodes made carry their claims). Sync (thread)."""
    obj = rt.kube.get_object(PLURAL, name)
    if obj is None:
        return None
    now_recorded = [GroupNode.model_validate(e) for e in (obj.get("status") or {}).get("nodes") or []]
    record = ownership.apply_pass(now_recorded, applied.made, applied.changed, applied.released)
    try:
        return rt.kube.patch_status(PLURAL, name, {**patch, "nodes": [e.wire() for e in recorded(record, decision)]},
                                    obj["metadata"].get("resourceVersion"))
    except ApiException as e:
        if e.status != 409:
            raise
        log.info("group %s: its status changed twice during a pass; the next pass records again", name)
        return None


class Held:
    """The listed nodes the group holds by its record (``raw``, and ``records`` by node id), and
    the sort they came from (``sorted``: the unrecorded and missing ones too). For a karpenter
    group, the NodeClaims tied to their Nodes first (``binding``)."""

    def __init__(self, found: ownership.Sorted, by_name: dict[str, Any], binding: ownership.Binding | None = None,
                 launch_deadline: datetime | None = None):
        self.sorted = found
        self.raw = [by_name[node.name] for node, _ in found.held]
        self.records = {entry.node_id: entry for _, entry in found.held}
        self.by_name = by_name
        self.binding = binding
        self.launch_deadline = launch_deadline


def held_nodes(provider: str, status: InstanceGroupStatus, listed: list,
               claims: list[ownership.ListedClaim] | None = None, now: datetime | None = None,
               timeout: timedelta | None = None) -> Held:
    """Sort the nodes listed under the group's label by the group's record (a group whose status
    was written before the record existed is recorded now, see ``planning.ownership``). With
    ``claims`` (a karpenter group's NodeClaims, listed because its record waits on one), each
    claim is tied to its Node first (``ownership.bind_claims``)."""
    migrating = status.nodes is None and status.observed_generation is not None
    views = [ownership.ListedNode(n.metadata.name, n.metadata.uid or "", dict(n.metadata.labels or {}),
                                  dict(n.metadata.annotations or {}),
                                  (n.spec.provider_id if n.spec else None) or "",
                                  bool(n.metadata.deletion_timestamp)) for n in listed]
    record, binding, deadline = status.nodes, None, None
    if claims is not None and now is not None and timeout is not None:
        binding = ownership.bind_claims(status.nodes, claims, views, now, timeout)
        record, deadline = binding.record, binding.launch_deadline(timeout, claims)
        views = binding.not_arriving(views)
    found = ownership.sort_nodes(record, views, provider, migrating)
    return Held(found, {n.metadata.name: n for n in listed}, binding, deadline)


def launch_timeout(rt: Runtime) -> timedelta:
    return timedelta(seconds=rt.settings.karpenter_launch_timeout_seconds)


async def claims_of(rt: Runtime, group: InstanceGroup, provider: Any, name: str) -> list[ownership.ListedClaim] | None:
    """A karpenter group's NodeClaims, when its record needs them (``ownership.needs_claims``:
    a claim waits for its Node, or a create's answer was never recorded); None otherwise."""
    if group.spec.node_provider != "karpenter" or not ownership.needs_claims(group.status.nodes):
        return None
    return await in_thread(rt, provider.list_claims, name)


def delete_claims(provider: Any, let_go: list[tuple[GroupNode, str]]) -> list[tuple[dict | None, Event]]:
    """Delete the NodeClaims of launching entries let go; an Event each. Sync (thread)."""
    out: list[tuple[dict | None, Event]] = []
    for entry, why in let_go:
        assert entry.node_claim is not None
        what = provider.delete_claim(entry.node_claim.name, entry.node_claim.uid)
        out.append((None, Event("Normal" if "no longer wanted" in why else "Warning", "NodeClaimDeleted",
                                f"{entry.node_id}: {why}; {what}")))
    return out


def report_unrecorded(rt: Runtime, obj: dict[str, Any], key: str, held: Held) -> None:
    """A Warning Event (on the group and the node) for each node that carries the group's label
    but is not in its record, once per node."""
    fresh = set(rt.group_memory.note_unrecorded(key, [(n.name, n.uid) for n in held.sorted.unrecorded]))
    group = obj["metadata"]["name"]
    post_events(obj, [(node_ref(held.by_name[n.name]), Event("Warning", ownership.REASON_NOT_OWNED,
                                                             ownership.not_owned_message(n, group)))
                      for n in held.sorted.unrecorded if (n.name, n.uid) in fresh])


async def in_thread(rt: Runtime, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the groups' own threads (``Runtime.group_threads``), off the event loop."""
    return await asyncio.get_running_loop().run_in_executor(rt.group_threads, functools.partial(fn, *args))


def node_fingerprint(raw: list) -> int:
    """What the plan's counts read of the nodes (``trainingplan.plan_observed_node``): each node's
    name, labels, Ready status and whether it is being deleted. A node added, gone, relabelled or
    changing Ready moves it; a heartbeat (a new resourceVersion, nothing else) does not, so a
    group's pass wakes its plan only when the plan has something new to count."""
    def seen(facts: NodeFacts) -> tuple:
        return (facts.name, tuple(sorted(facts.labels.items())), facts.ready_status, facts.deleting)
    return hash(tuple(sorted(seen(facts_of_v1(n)) for n in raw)))


def post_events(group_obj: dict[str, Any], events: list[tuple[dict | None, Event]]) -> None:
    """Post each event on its node (and the group) or on the group, and log it."""
    for body, ev in events:
        log.info("group %s: %s: %s", group_obj["metadata"]["name"], ev.reason, ev.message)
        kopf.event(body or group_obj, type=ev.type, reason=ev.reason, message=ev.message)
        if body is not None:
            kopf.event(group_obj, type=ev.type, reason=ev.reason, message=ev.message)


def register_group_passes(rt: Runtime) -> None:
    """Every group's passes run on the work queue, for as long as kopf runs (only on the leader)."""
    rt.queue.register(KIND, lambda key: group_pass(rt, key), label="InstanceGroup", plural=PLURAL,
                      name_of=rt.group_names.get, pace=PACE)


async def group_pass(rt: Runtime, key: str) -> datetime | None:
    """The pass of the group whose key (the label value of its name) is ``key``."""
    name = rt.group_names.get(key)
    return None if name is None else await reconcile_group(rt, name)


def group_event(rt: Runtime, name: str, body: Mapping[str, Any], type: str | None) -> None:
    """A group gets a pass when it is listed at start (resume) or created, when it is being
    deleted, and when its spec or its labels changed; its nodes and its plan wake it after that.
    A changed count may move every group that shares the plan, and a group's labels say whether its
    plan lets it in (``instanceGroupSelector``): on either change the groups sharing its plan look
    again too. Its other events are its own status writes, which need none."""
    rt.queue.start()  # inside a kopf handler, for kopf.event (see the plan controller's plan_event)
    key = naming.label_value(name)
    if type == "DELETED":
        rt.group_names.pop(key, None)
        rt.group_seen.pop(key, None)
        rt.queue.forget(KIND, key)
        getattr(rt.providers.get("karpenter"), "launch_memory", {}).pop(key, None)  # its launches (launch_facts)
        return
    rt.group_names[key] = name
    meta = body.get("metadata") or {}
    seen = (meta.get("generation"), tuple(sorted((meta.get("labels") or {}).items())))
    changed = key in rt.group_seen and rt.group_seen[key] != seen
    rt.group_seen[key] = seen
    if type in (None, "ADDED") or meta.get("deletionTimestamp") or changed:
        rt.queue.wake(KIND, key)
    if changed:
        rt.wake_groups_of((body.get("spec") or {}).get("trainingPlanRef", ""))


async def hold_finalizer(rt: Runtime, obj: dict[str, Any]) -> dict[str, Any] | None:
    """The group with the operator's finalizer on it (put on now if it is not), so that its
    deletion waits for its nodes to be drained; kopf's finalizer of earlier versions is replaced.
    None when the group changed or went since it was read (the write is over its resourceVersion)."""
    finalizers = list(obj["metadata"].get("finalizers") or [])
    if GROUP_FINALIZER in finalizers and FINALIZER not in finalizers:
        return obj
    want = [f for f in finalizers if f != FINALIZER] + ([] if GROUP_FINALIZER in finalizers else [GROUP_FINALIZER])
    try:
        written = await in_thread(rt, rt.kube.set_finalizers, PLURAL, obj["metadata"]["name"], want,
                                  obj["metadata"]["resourceVersion"])
    except ApiException as e:
        if e.status != 409:
            raise
        return None
    if written is None:
        return None
    rt.cache.wrote(PLURAL, written)
    return written


async def delete_group(rt: Runtime, obj: dict[str, Any]) -> datetime | None:
    """A group being deleted: drain and remove every node it holds (:func:`drain_group`), then let it
    go (its finalizers, the operator's and kopf's of earlier versions, removed). Looks again while
    nodes still drain."""
    name, meta = obj["metadata"]["name"], obj["metadata"]
    finalizers = meta.get("finalizers") or []
    if GROUP_FINALIZER not in finalizers and FINALIZER not in finalizers:
        return None
    again = await drain_group(rt, name, obj.get("spec") or {}, obj)
    if again is not None:
        return again
    current = await in_thread(rt, rt.kube.get_object, PLURAL, name)
    if current is None:
        return None
    try:
        await in_thread(rt, rt.kube.set_finalizers, PLURAL, name,
                        [f for f in current["metadata"].get("finalizers") or [] if f not in (GROUP_FINALIZER, FINALIZER)],
                        current["metadata"]["resourceVersion"])
    except ApiException as e:
        if e.status != 409:
            raise
        return rt.clock() + RECORD_CONFLICT_RETRY
    return None


async def drain_group(rt: Runtime, name: str, spec: Mapping[str, Any], body: Mapping[str, Any]) -> datetime | None:
    """Drain and remove every node of the group; when to look again while nodes still drain (or the
    record changed under it), None when every node is gone."""
    key = naming.label_value(name)
    kind = spec.get("nodeProvider", "kwok")
    provider = rt.providers[kind]
    # The record as the API server has it now, not as kopf's body had it: the cordons recorded by
    # an earlier attempt must reach the hand-back of this one.
    current = await in_thread(rt, rt.kube.get_object, PLURAL, name) or dict(body)
    rv = current.get("metadata", {}).get("resourceVersion")
    status = status_of(InstanceGroupStatus, current)
    listed = await in_thread(rt, provider.list, name)
    claims = (await in_thread(rt, provider.list_claims, name)
              if kind == "karpenter" and ownership.needs_claims(status.nodes) else None)
    held = held_nodes(kind, status, listed, claims, rt.clock(), launch_timeout(rt))
    if held.binding is not None and (held.binding.launching or held.binding.expired or held.binding.gone):
        # NodeClaims whose Nodes never came (or are gone): deleted, and out of the record.
        let_go = [(e, "its group is being deleted") for e in held.binding.launching + held.binding.expired]
        post_events(dict(body), await in_thread(rt, delete_claims, provider, let_go))
        status = status.model_copy(update={"nodes": held.binding.record})
        rv = await write_record(rt, name, held.binding.record, rv)
        if rv is None:
            return rt.clock() + RECORD_CONFLICT_RETRY
        held = held_nodes(kind, status, listed)
    rt.group_memory.note_releasing(key, list(held.records))
    # Intent first: the nodes this attempt will cordon are recorded as cordoned by hyperplan before
    # the cordon (a node someone else cordoned is not), so that the hand-back uncordons exactly
    # those, whichever attempt hands them back.
    recorded = status.nodes or []
    to_cordon = {nid: entry.model_copy(update={"cordoned": True}) for nid, entry in held.records.items()
                 if not entry.cordoned and not cordoned_already(held.by_name[entry.name])}
    if to_cordon:
        recorded = ownership.next_record(held.sorted, changed=to_cordon)
        rv = await write_record(rt, name, recorded, rv)
        if rv is None:
            return rt.clock() + RECORD_CONFLICT_RETRY
        held = held_nodes(kind, status.model_copy(update={"nodes": recorded}), listed)
    drained = await in_thread(rt, drain_nodes, provider, rt.pods, [(n, "GroupDeleted", None) for n in held.raw],
                              rt.clock(), held.records)
    for _, outcome in drained:
        post_events(dict(body), list(outcome.events))
    released = {nid for nid, outcome in drained if outcome.released is not None}
    record = ownership.next_record(held.sorted, released=released)
    if (record != recorded or status.nodes is None) and await write_record(rt, name, record, rv) is None:
        return rt.clock() + RECORD_CONFLICT_RETRY
    if record:
        log.info("group %s: %d node(s) still draining", name, len(record))
        return rt.clock() + DRAIN_RETRY
    kopf.info(dict(body), reason="Drained", message=f"all nodes of {name} drained and removed")
    rt.group_memory.forget_group(key)
    rt.wake_groups_of(spec.get("trainingPlanRef", ""))  # they may take the room it leaves
    return None
