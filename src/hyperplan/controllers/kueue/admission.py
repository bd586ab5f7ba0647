"""Workload admission, keyed by plan: a Workload starts on a training plan only when a block can
hold it, and a ``training-job`` plan's job nodes follow its workloads.

Each plan that an AdmissionCheck of ours names is a key of the work queue (kind
:data:`~hyperplan.controllers.kueue.state.PLAN_KIND`), passed over at the plan's next block
boundary, a keep-alive expiry, or a wake from a Workload, the plan or a check changing
(:mod:`hyperplan.wiring.kueue` routes them). One pass (:func:`reconcile_plan_workloads`):

* each Workload that carries one of the plan's checks and holds quota gets the check's state
  from :func:`hyperplan.planning.admission.decide_plan_admission` (Ready, Retry with a message and
  ``requeueAfterSeconds``, Rejected). ``Ready`` comes with ``podSetUpdates`` that pin the pods
  to the plan's nodes (``hyperplan.dev/training-plan``) or, on a ``training-job`` plan, to the
  nodes provisioned for that workload (``hyperplan.dev/workload``);
* on a ``training-job`` plan the admitted workloads' nodes are created, kept warm, reused and
  drained as :func:`hyperplan.planning.trainingjobs.decide_job_nodes` says, carried out by
  :func:`hyperplan.actuation.jobnodes.apply_job_nodes` on a worker thread; the facts it returns
  (Events, nodes released) are recorded here, on the event loop. A job node's
  ``keep-alive-until`` that does not read strictly (:mod:`hyperplan.planning.reading`) counts as
  absent, and a Warning Event (``UnreadableValue``) on the node and the plan names the node and
  the key, once per value.

The pass never writes a check's ``Active`` condition: :mod:`hyperplan.controllers.kueue.checks` does.
Its loop ends when no check names the plan any more and none of its job nodes is left.

**Reads.** A pass makes no API read: the checks it serves come from
:class:`~hyperplan.controllers.kueue.state.KueueState`; the Workloads (our newer writes preferred),
the plan, its groups' nodes and the job nodes from the operator's watch cache, copied on the
event loop. The job nodes are listed
from the API once after a pass that wrote to them (as a group's nodes are).

**Writes.** A check's entry on a Workload is written with a server-side apply of that one
entry on the ``status`` subresource, forcing ownership with the field manager
``hyperplan-admission`` (as Kueue's own check controllers do; without force the apply conflicts
with the manager ``kueue``), and only when the state is Pending and the decision differs from
what the entry says: one write per change, with an Event on the Workload. Every write goes
through :class:`hyperplan.actuation.kueue.KueueWrites` (``KueueState.writes``), so the passes
are unit-tested with a recording fake (``tests/unit/test_kueue_passes.py``).
"""

from __future__ import annotations

import logging
import secrets
from datetime import datetime, timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from hyperplan.actuation.jobnodes import WARNING_REASONS, apply_job_nodes
from hyperplan.actuation.kueue import KUEUE_API
from hyperplan.actuation.providers.base import NodeProvider, accelerators
from hyperplan.api.models import GROUP, VERSION, GroupNode, TrainingPlan
from hyperplan.actuation.groups import node_ref
from hyperplan.api.vocabulary import ANNOTATION_KEEP_ALIVE_UNTIL, REASON_UNREADABLE, to_rfc3339
from hyperplan.runtime.context import Runtime
from hyperplan.runtime.views import as_the_ledger_holds
from hyperplan.controllers.kueue.state import WORKLOADS, job_nodes, state_of, workload, workloads_with
from hyperplan.planning import admission
from hyperplan.planning import groups
from hyperplan.planning import naming
from hyperplan.planning import nodefacts
from hyperplan.planning import ownership
from hyperplan.planning import placement
from hyperplan.planning import reading
from hyperplan.planning import trainingjobs
from hyperplan.planning.schedule import plan_block_schedule

log = logging.getLogger("hyperplan.kueue")
PLANS = "trainingplans"
RECORD_RETRY = timedelta(seconds=1)  # after the plan changed under a write of its job-node record


# --------------------------------------------------------------------------- reading


def plan_object(rt: Runtime, name: str) -> dict[str, Any] | None:
    """The plan from the watch cache, None when it is gone or being deleted (its blocks are
    going back to the pools)."""
    obj = rt.cache.plan(name)
    if obj is not None and obj["metadata"].get("deletionTimestamp"):
        return None
    return obj


def admission_plan(rt: Runtime, obj: dict[str, Any] | None, now: datetime) -> tuple[admission.AdmissionPlan | None, Any]:
    """The plan as admission sees it, and its block schedule (None when not bought)."""
    if obj is None:
        return None, None
    try:
        plan = as_the_ledger_holds(rt, obj, now)  # its blocks as the ledger holds them, not its status
    except ValidationError as e:
        # Not a verdict on the workloads: the plan's own handler reports the bad spec. Failing the
        # pass (retried with backoff) leaves every check and job node as it is until it is fixed.
        raise ValueError(f"training plan {obj['metadata']['name']} cannot be read: {e.error_count()} error(s)") from e
    spec, status = plan.spec, plan.status
    spares = spec.spare_instances_per_ultra_server
    blocks = []
    for b in status.reserved_capacity:
        usable = b.instance_count
        if b.ultra_server_type:
            usable -= spares * len(placement.ultraservers_for_block(b.id, b.ultra_server_type, b.instance_count, spares))
        termination = b.termination_time or max(b.start_time, rt.policy.termination_time(b.end_time, spec.target_resource))
        blocks.append(admission.BlockView(b.id, b.availability_zone, b.instance_type, usable, b.start_time, b.end_time,
                                   termination))
    failure = next((c.message for c in status.conditions if c.status == "False" and c.message), "")
    itype = groups.reserved_instance_type(spec.instance_type, spec.ultra_server_type, status.reserved_capacity)
    view = admission.AdmissionPlan(plan.metadata["name"], spec.target_resource, status.phase, tuple(blocks), failure,
                       accelerators(itype or ""))
    schedule = None
    if status.reserved_capacity:
        schedule = plan_block_schedule([(b.start_time, b.end_time) for b in status.reserved_capacity],
                                       spec.target_resource, rt.policy, now)
    return view, (plan, schedule)


def ready_group_nodes(rt: Runtime, plan: str, block_id: str) -> int:
    """The nodes of the plan's instance groups on the block that Kueue may admit work onto: those
    that serve (``NodeFacts.is_serving``: active, Ready, neither cordoned nor being deleted, and
    healthy by both health labels), from the watch cache of group nodes, and only those a group
    bound to the plan holds in its record (by name and uid): a node that labels itself as the
    plan's counts for nothing."""
    held = recorded_group_nodes(rt.cache.groups(), plan)
    facts = (nodefacts.facts_of_dict(n, rt.keys) for n in rt.cache.block_nodes(naming.label_value(block_id))
             if (n["metadata"].get("name"), n["metadata"].get("uid")) in held)
    return sum(1 for f in facts if f.is_serving and f.plan == naming.label_value(plan))


def recorded_group_nodes(groups: list[dict[str, Any]], plan: str) -> set[tuple[str, str]]:
    """(name, uid) of every node the records of the plan's groups hold (``status.nodes``)."""
    out: set[tuple[str, str]] = set()
    for g in groups:
        if (g.get("spec") or {}).get("trainingPlanRef") != plan:
            continue
        for entry in (g.get("status") or {}).get("nodes") or ():
            if isinstance(entry, dict) and entry.get("name") and entry.get("uid"):
                out.add((entry["name"], entry["uid"]))
    return out


# --------------------------------------------------------------------------- writing


def entry_for(check: str, decision: admission.AdmissionDecision, prior: dict[str, Any] | None,
              pod_sets: tuple[admission.PodSetView, ...], selector: dict[str, str], now: datetime,
              labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The entry to apply: on Ready, ``podSetUpdates`` pin each pod set to ``selector`` and label
    its pods with ``labels`` (the block they were admitted into, read back on later passes)."""
    entry: dict[str, Any] = {"name": check, "state": decision.state, "message": decision.message[:32000]}
    same_state = prior is not None and prior.get("state") == decision.state
    entry["lastTransitionTime"] = prior["lastTransitionTime"] if same_state and prior.get("lastTransitionTime") \
        else to_rfc3339(now)
    if decision.requeue_after_seconds is not None:
        entry["requeueAfterSeconds"] = decision.requeue_after_seconds
    if decision.state == admission.READY and selector:
        entry["podSetUpdates"] = [{"name": ps.name, **({"labels": dict(labels)} if labels else {}),
                                   "nodeSelector": dict(selector)} for ps in pod_sets]
    return entry


def differs(prior: dict[str, Any] | None, entry: dict[str, Any]) -> bool:
    if prior is None:
        return True
    keys = ("state", "message", "requeueAfterSeconds", "podSetUpdates")
    return any(prior.get(k) != entry.get(k) for k in keys)


def workload_ref(wl: dict[str, Any]) -> dict[str, Any]:
    """The Workload as kopf's event poster needs it (list items may lack apiVersion and kind)."""
    return {**wl, "apiVersion": KUEUE_API, "kind": "Workload"}


# --------------------------------------------------------------------------- the pass


async def read_job_nodes(rt: Runtime, plan_label: str) -> list[client.V1Node]:
    """The nodes that wear the plan's job labels and are not being deleted: a copy of the node
    store's, or, right after a pass that wrote to them, listed from the API (on the controller's
    threads). Labels prove nothing: :func:`recorded_job_nodes` keeps the ones the plan's record
    holds."""
    return (await listed_job_nodes(rt, plan_label))[0]


async def listed_job_nodes(rt: Runtime, plan_label: str) -> tuple[list[client.V1Node], bool]:
    """:func:`read_job_nodes`, and whether they were listed from the API server (not the store)."""
    state = state_of(rt)
    nodes, fresh = job_nodes(rt, plan_label), False
    if nodes is None:
        nodes, fresh = await state.call(state.writes.list_job_nodes, plan_label), True
    return [n for n in nodes if not n.metadata.deletion_timestamp], fresh


def recorded_job_nodes(record: list[GroupNode] | None, listed: list[client.V1Node]) -> ownership.Sorted:
    """The listed job nodes the plan's record holds (by name and uid, or by the claim of a create
    under way), the ones it does not (a node anyone labelled so: never reused, never written), and
    the recorded ones not listed."""
    return ownership.sort_nodes(record or [], [ownership.ListedNode(
        n.metadata.name, n.metadata.uid or "", dict(n.metadata.labels or {}), dict(n.metadata.annotations or {}))
        for n in listed], "kwok")


def job_record(rt: Runtime, name: str, plan: TrainingPlan | None) -> list[GroupNode] | None:
    """The plan's record of its job nodes: its status's, or once the plan is gone the copy the
    controller kept of the last one it saw."""
    return plan.status.job_nodes if plan is not None else state_of(rt).job_records.get(name)


async def running_outside_checks(rt: Runtime, plan_name: str, known: set[str],
                                 record: list[GroupNode] | None) -> list[trainingjobs.Holder]:
    """Workloads on the plan's job nodes that no check of the plan decides for any more but that
    Kueue still runs (:func:`hyperplan.planning.trainingjobs.still_running_holders`)."""
    state = state_of(rt)
    listed = await read_job_nodes(rt, naming.label_value(plan_name))
    held = {node.name for node, _ in recorded_job_nodes(record, listed).held}
    nodes = [n for n in listed if n.metadata.name in held]
    on_nodes = {(n.metadata.labels or {}).get(trainingjobs.LABEL_WORKLOAD, "") for n in nodes} - {""}
    state.note_job_workloads(plan_name, on_nodes, complete=False)
    running = {w for w in on_nodes - known if (obj := workload(rt, w)) is not None and admission.workload_runs(obj)}
    views = trainingjobs.job_nodes_from_labels([(n.metadata.name, n.metadata.labels or {}, {}, False, False) for n in nodes])
    return trainingjobs.still_running_holders(views, known, running)


async def reconcile_plan_workloads(rt: Runtime, plan_name: str) -> datetime | None:
    """One pass over a plan named by AdmissionChecks: their workloads, then the job nodes.

    With no check naming the plan any more, the pass only serves the plan's job nodes: those of
    workloads that still run stay, the others are released (or kept warm for their keep-alive),
    and the loop ends once none is left.
    """
    state = state_of(rt)
    checks = state.checks_of(plan_name)
    now = rt.clock()
    view, extra = admission_plan(rt, plan_object(rt, plan_name), now)
    plan, schedule = extra if extra else (None, None)
    target = view.target if view else admission.TRAINING_JOB
    if not checks:
        outside = (await running_outside_checks(rt, plan_name, set(), job_record(rt, plan_name, plan))
                   if target == admission.TRAINING_JOB else [])
        wake, left = await reconcile_job_nodes(rt, plan_name, plan, schedule, outside, now)
        if not left and not state.checks_of(plan_name):  # a check may have come meanwhile
            state.end_loop(plan_name)
            return None
        return wake

    mine: list[admission.CheckedWorkload] = []
    seen: set[tuple[str, str]] = set()
    for check in checks:
        for wl in workloads_with(rt, check):
            meta = wl["metadata"]
            if (meta.get("namespace"), meta.get("name"), check) in seen:
                continue
            seen.add((meta.get("namespace"), meta.get("name"), check))
            progress = admission.workload_progress(wl, check)
            mine.append(admission.CheckedWorkload((wl, check), admission.workload_view(wl), progress,
                                           admission.admitted_block(_entry(wl, check), naming.LABEL_RESERVED_CAPACITY)))
    mine.sort(key=lambda m: (m.progress.since, m.ref[0]["metadata"].get("creationTimestamp", ""), m.view.key))

    usable = None
    if schedule is not None and schedule.usable_block is not None:
        usable = plan.status.reserved_capacity[schedule.usable_block]
    ready_nodes = None
    if target == admission.HYPERPOD_CLUSTER and usable is not None:
        ready_nodes = ready_group_nodes(rt, plan_name, usable.id)
    outside: list[trainingjobs.Holder] = []
    if target == admission.TRAINING_JOB:
        known = {trainingjobs.workload_label_value(m.view.namespace, m.view.name) for m in mine}
        outside = await running_outside_checks(rt, plan_name, known, job_record(rt, plan_name, plan))
    busy_retry = min(timedelta(seconds=60), max(timedelta(seconds=5), rt.policy.day / 12))
    decided = admission.decide_plan_admission(view, mine, naming.label_value(usable.id) if usable is not None else None, now,
                                       ready_nodes=ready_nodes, busy_retry=busy_retry, plan_name=plan_name,
                                       held_outside=sum(h.instances for h in outside))

    for w, decision in decided.decisions:
        wl, check = w.ref
        # The key a kubelet cannot set on its own Node: a node that labels itself with the workload
        # does not attract its pods (docs/security.md, "Which node labels a scheduler may trust").
        selector = ({trainingjobs.LABEL_TRUSTED_WORKLOAD: trainingjobs.workload_label_value(w.view.namespace, w.view.name)}
                    if target == admission.TRAINING_JOB else {naming.LABEL_PLAN: naming.label_value(plan_name)})
        labels = {naming.LABEL_RESERVED_CAPACITY: naming.label_value(decision.block_id)} if decision.block_id else {}
        prior = _entry(wl, check)
        entry = entry_for(check, decision, prior, w.view.pod_sets, selector, now, labels)
        if differs(prior, entry):
            try:
                written = await state.call(state.writes.apply_check_entry, wl, entry)
            except ApiException as e:  # gone meanwhile (404) or refused: the next pass decides again
                if e.status != 404:
                    log.warning("workload %s: writing check %s failed (%s): %s", w.view.key, check, e.status, e.reason)
                continue
            if written:
                rt.cache.wrote(WORKLOADS, written)
            log.info("workload %s: check %s %s (%s): %s", w.view.key, check, decision.state, decision.reason,
                     decision.message)
            state.writes.event(workload_ref(wl), "Warning" if decision.state == admission.REJECTED else "Normal",
                               f"AdmissionCheck{decision.state}", f"{check}: {decision.message}"[:1000])
    holders = [trainingjobs.Holder(trainingjobs.workload_label_value(w.view.namespace, w.view.name), n) for w, n in decided.holders]

    wakes = [schedule.next_transition_time] if schedule is not None else []
    if target == admission.TRAINING_JOB:
        wake, _ = await reconcile_job_nodes(rt, plan_name, plan, schedule, holders + outside, now)
        wakes.append(wake)
    return min((w for w in wakes if w is not None), default=None)


def _entry(wl: dict[str, Any], check: str) -> dict[str, Any] | None:
    return next((c for c in (wl.get("status") or {}).get("admissionChecks") or [] if c.get("name") == check), None)


# --------------------------------------------------------------------------- training-job nodes


async def reconcile_job_nodes(rt: Runtime, name: str, plan: TrainingPlan | None, schedule,
                              holders: list[trainingjobs.Holder], now: datetime) -> tuple[datetime | None, int]:
    """Create, hand over, keep warm, drain and release a training-job plan's nodes.

    ``holders``: the workloads that hold instances of the plan's usable block, in admission
    order. Returns when to look again and how many of the plan's job nodes are left. Without
    the plan (deleted) every node drains at once. The decision is made here; its side effects
    run on the controller's threads (:func:`hyperplan.actuation.jobnodes.apply_job_nodes`), and
    what they did is recorded here, on the event loop.
    """
    state = state_of(rt)
    label = naming.label_value(name)
    block = None
    if plan is not None and schedule is not None and schedule.active_block is not None:
        b = plan.status.reserved_capacity[schedule.active_block]
        bs = schedule.blocks[schedule.active_block]
        block = trainingjobs.JobBlock(b.id, b.availability_zone, b.instance_type, b.instance_count, bs.termination_time,
                            b.end_time, b.ultra_server_type, plan.spec.spare_instances_per_ultra_server
                            if b.ultra_server_type else 0)
    listed, fresh = await listed_job_nodes(rt, label)
    plan_ref = _plan_ref(plan)
    # The plan's record of its job nodes (its status; the last pass's copy once the plan is gone).
    record = job_record(rt, name, plan)
    found = recorded_job_nodes(record, listed)
    by_name = {n.metadata.name: n for n in listed}
    report_unrecorded(rt, name, plan_ref, [by_name[n.name] for n in found.unrecorded])
    raw = [by_name[node.name] for node, _ in found.held]
    report_unreadable(rt, name, plan_ref, raw)
    nodes = trainingjobs.job_nodes_from_labels([(n.metadata.name, n.metadata.labels or {}, n.metadata.annotations or {},
                                       bool(n.spec.unschedulable) if n.spec else False, _signalled(n))
                                      for n in raw])
    state.note_job_workloads(name, {n.workload for n in nodes if n.workload}, complete=True)
    decision = trainingjobs.JobNodeDecision()
    if raw or holders:
        keep = plan.spec.keep_alive_period_seconds if plan is not None else None
        decision = trainingjobs.decide_job_nodes(name, block, holders, nodes, timedelta(seconds=keep) if keep else None,
                                                 now, rt.keys, rt.policy.checkpoint_lead,
                                                 names_taken={n.name for n in found.unrecorded})
    # Intent first: the record names each node about to be made, with the digest of the nonce it
    # will carry, before it exists (as a group's does): a crash in between loses nothing.
    claims = {spec.name: secrets.token_hex(16) for spec in decision.create}
    rv = plan.metadata.get("resourceVersion") if plan is not None else None
    if claims:
        if plan is None:
            return now + RECORD_RETRY, len(raw)
        intent = ownership.next_record(found, [ownership.pending_entry(n, c) for n, c in claims.items()],
                                       listed_fresh=fresh)
        rv = await write_job_record(rt, name, intent, rv)
        if rv is None:  # the plan changed meanwhile: nothing was made
            return now + RECORD_RETRY, len(raw)
    provider: NodeProvider = rt.providers["kwok"]
    facts = await state.call(apply_job_nodes, provider, rt.pods, state.writes, decision, block,
                             {n.metadata.name: n for n in raw}, any(n.signalled for n in nodes), now, claims)
    for ref, event in facts.pod_events:
        state.writes.event(ref, event.type, event.reason, event.message)
    for reason, message in facts.events:
        log.info("plan %s: %s: %s", name, reason, message)
        if plan_ref is not None:
            state.writes.event(plan_ref, "Warning" if reason in WARNING_REASONS else "Normal", reason, message)
    rt.cache.note_nodes_wrote("job", label, facts.wrote)
    after = ownership.next_record(found, facts.made, released=facts.released, listed_fresh=fresh)
    state.note_job_record(name, after)
    wake = decision.wake_at
    if decision.drain or facts.evicting:  # evictions take a moment: look again shortly until the nodes are gone
        soon = now + timedelta(seconds=1)
        wake = soon if wake is None else min(wake, soon)
    if plan is not None and ([e.wire() for e in after] != [e.wire() for e in record or []] or claims):
        if await write_job_record(rt, name, after, rv) is None:  # the next pass records it (the claims)
            wake = now + RECORD_RETRY if wake is None else min(wake, now + RECORD_RETRY)
    return wake, len(raw) + len(decision.create) - len(facts.released)


async def write_job_record(rt: Runtime, name: str, record: list[GroupNode], rv: str | None) -> str | None:
    """The plan's record of its job nodes (``status.jobNodes``), written over ``rv``; the new
    resourceVersion, None when the plan changed meanwhile (409)."""
    state = state_of(rt)
    try:
        written = await state.call(state.writes.write_job_record, name, [e.wire() for e in record], rv)
    except ApiException as e:
        if e.status != 409:
            raise
        log.info("plan %s: its status changed meanwhile; recording its job nodes at the next pass", name)
        return None
    if written:
        rt.cache.wrote(PLANS, written)
    return ((written or {}).get("metadata") or {}).get("resourceVersion") or ""


def report_unrecorded(rt: Runtime, name: str, plan_ref: dict[str, Any] | None, nodes: list[client.V1Node]) -> None:
    """A Warning Event (``NodeNotOwned``) on the plan and the node for each node that wears the
    plan's job labels but is not in its record, once per node: it gets no workload and no write."""
    state = state_of(rt)
    fresh = set(state.note_unrecorded(name, [(n.metadata.name, n.metadata.uid or "") for n in nodes]))
    for n in nodes:
        if (n.metadata.name, n.metadata.uid or "") not in fresh:
            continue
        message = (f"node {n.metadata.name} wears training plan {name}'s job labels but is not in its record "
                   "(status.jobNodes): hyperplan did not make it, so it is neither reused nor written")
        log.warning("plan %s: %s", name, message)
        for target in (node_ref(n), plan_ref) if plan_ref is not None else (node_ref(n),):
            state.writes.event(target, "Warning", ownership.REASON_NOT_OWNED, message)


def _plan_ref(plan: TrainingPlan | None) -> dict[str, Any] | None:
    """The plan as an Event's object, None without one."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingPlan", "metadata": plan.metadata} \
        if plan is not None else None


def report_unreadable(rt: Runtime, name: str, plan_ref: dict[str, Any] | None, raw: list[client.V1Node]) -> None:
    """A Warning Event (``UnreadableValue``) on the job node and on the plan for each job node's
    ``keep-alive-until`` that does not read strictly (planning.reading), once per node, key and
    value; the pass reads such a value as absent (``trainingjobs.job_nodes_from_labels``), as the
    group pass does for its nodes."""
    state = state_of(rt)
    found = [(node_ref(n), finding) for n in raw
             for finding in reading.node_findings(n.metadata.name, {}, n.metadata.annotations or {})
             if finding.key == ANNOTATION_KEEP_ALIVE_UNTIL]
    fresh = set(state.note_unreadable(name, [finding for _, finding in found]))
    for ref, finding in found:
        if finding not in fresh:
            continue
        log.warning("plan %s: %s", name, finding.message)
        for target in (ref, plan_ref) if plan_ref is not None else (ref,):
            state.writes.event(target, "Warning", REASON_UNREADABLE, finding.message)


def _signalled(node: client.V1Node) -> bool:
    """Whether the node carries the checkpoint signal (docs/checkpoint.md)."""
    return any(c.type == groups.CONDITION_BLOCK_TERMINATING and c.status == "True"
               for c in ((node.status.conditions or []) if node.status else []))
