"""Kueue AdmissionCheck controller: workloads start on a training plan only when a block can hold them.

hyperplan serves the ``AdmissionCheck``\\s (``kueue.x-k8s.io/v1beta2``) whose
``spec.controllerName`` is ``hyperplan.dev/training-plan`` and whose ``spec.parameters`` name a
TrainingPlan (``apiGroup: hyperplan.dev, kind: TrainingPlan, name: <plan>``):

* each such check gets ``Active=True`` while its plan exists, else ``Active=False`` with the
  reason (``PlanNotFound``, ``InvalidParameters``);
* each Workload that carries the check and holds quota gets the check's state from
  :func:`hyperplan.planning.admission.decide_admission` (Ready, Retry with a message and
  ``requeueAfterSeconds``, Rejected). ``Ready`` comes with ``podSetUpdates`` that pin the pods
  to the plan's nodes (``hyperplan.dev/training-plan``) or, on a ``training-job`` plan, to the
  nodes provisioned for that workload (``hyperplan.dev/workload``);
* on a ``training-job`` plan the admitted workloads' nodes are created, kept warm, reused and
  drained as :func:`hyperplan.planning.trainingjobs.decide_job_nodes` says, through the KWOK
  node provider.

**One loop per plan that checks name.** Kueue's objects get no kopf daemon: a kopf daemon
puts a finalizer on the object it serves, and a Kueue AdmissionCheck must not hang in
Terminating because hyperplan is not running. Instead the AdmissionCheck watch starts one
asyncio loop per plan named by a check (:class:`KueueState`), run by the same
:func:`~hyperplan.handlers.context.reconcile_forever` as the other daemons: it sleeps until the
plan's next block boundary, a keep-alive expiry, or a wake-up from a Workload, the plan or a
check changing. The loop ends when no check names the plan any more. Only ``on.event``
handlers watch Kueue's kinds, so kopf never patches them (no annotations, no finalizers).

**Writes.** A check's entry on a Workload is written with a server-side apply of that one
entry on the ``status`` subresource, forcing ownership with the field manager
``hyperplan-admission`` (as Kueue's own check controllers do; without force the apply conflicts
with the manager ``kueue``), and only when the state is Pending and the decision differs from
what the entry says: one write per change, with an Event on the Workload. The ``Active``
condition of a check is applied the same way, when it changes.

**Without Kueue.** When Kueue's CRDs are not installed, kopf resolves no resource for these
handlers: it logs once "Unresolved resources cannot be served (try creating their CRDs)" and
watches nothing for them; it keeps observing CRDs (the chart lets it list and watch them) and
starts these watches when Kueue is installed later. Nothing here runs until then, so the
operator neither fails nor polls.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import kopf
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from hyperplan import metrics
from hyperplan.actuation.groups import signal_checkpoint
from hyperplan.actuation.nodes import ACCELERATORS, KwokProvider
from hyperplan.api.models import GROUP, VERSION, TrainingPlan, to_rfc3339
from hyperplan.handlers.context import Runtime, reconcile_forever
from hyperplan.planning import admission as ad
from hyperplan.planning import groups as gr
from hyperplan.planning import naming as nm
from hyperplan.planning import placement as pl
from hyperplan.planning import trainingjobs as tj
from hyperplan.planning.schedule import plan_block_schedule

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
KUEUE_API = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
FIELD_MANAGER = "hyperplan-admission"
APPLY = "application/apply-patch+yaml"
KIND = "kueue-plan"
log = logging.getLogger("hyperplan.kueue")


class Stop:
    """A stop flag for a loop of our own, shaped like kopf's DaemonStopped (truthy once set)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def __bool__(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> bool:
        return await self._event.wait()


@dataclass
class KueueState:
    """The checks this operator serves (name -> plan, None when the parameters are invalid),
    the loop running for each plan they name, and the threads their API calls run on.

    The calls run on threads of their own (``executor``), not on asyncio's default executor
    that the plan and group daemons share: a slow Workload listing or a burst of node creates
    for jobs must never hold up a block transition or a spare promotion."""

    checks: dict[str, str | None] = field(default_factory=dict)
    loops: dict[str, tuple[asyncio.Task, Stop]] = field(default_factory=dict)
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=2, thread_name_prefix="kueue-admission"))

    async def call(self, fn, *args):
        """``fn(*args)`` on this controller's threads, with the caller's context (kopf's event
        poster lives in context variables)."""
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, functools.partial(context.run, fn, *args))

    def checks_of(self, plan: str) -> list[str]:
        return sorted(c for c, p in self.checks.items() if p == plan)

    def ensure_loop(self, rt: Runtime, plan: str) -> None:
        running = self.loops.get(plan)
        if running is not None and not running[0].done() and not running[1]:
            rt.wakeups.wake(KIND, plan)
            return
        stop = Stop()
        task = asyncio.get_running_loop().create_task(
            reconcile_forever(rt, KIND, plan, "KueueAdmission", lambda: reconcile_plan_workloads(rt, plan, stop),
                              stop, log), name=f"kueue-admission-{plan}")
        self.loops[plan] = (task, stop)

    def stop_all(self) -> None:
        for _, stop in self.loops.values():
            stop.set()


def state_of(rt: Runtime) -> KueueState:
    if rt.kueue is None:
        rt.kueue = KueueState()
    return rt.kueue


# --------------------------------------------------------------------------- reading


def plan_view(rt: Runtime, obj: dict[str, Any] | None, now: datetime) -> tuple[ad.PlanView | None, Any]:
    """The plan as admission sees it, and its block schedule (None when not bought)."""
    if obj is None:
        return None, None
    try:
        plan = TrainingPlan.model_validate(obj)
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
            usable -= spares * len(pl.ultraservers_for_block(b.id, b.ultra_server_type, b.instance_count, spares))
        termination = b.termination_time or max(b.start_time, rt.policy.termination_time(b.end_time, spec.target_resource))
        blocks.append(ad.BlockView(b.id, b.availability_zone, b.instance_type, usable, b.start_time, b.end_time,
                                   termination))
    failure = next((c.message for c in status.conditions if c.status == "False" and c.message), "")
    itype = spec.instance_type or pl.ULTRASERVER_INSTANCE_TYPE
    view = ad.PlanView(plan.metadata["name"], spec.target_resource, status.phase, tuple(blocks), failure,
                       ACCELERATORS.get(itype))
    schedule = None
    if status.reserved_capacity:
        schedule = plan_block_schedule([(b.start_time, b.end_time) for b in status.reserved_capacity],
                                       spec.target_resource, rt.policy, now)
    return view, (plan, schedule)


def ready_group_nodes(rt: Runtime, plan: str, block_id: str) -> int:
    """Ready, schedulable, healthy active nodes of the plan's instance groups on the block
    (from the watch cache of group nodes)."""
    count = 0
    for n in rt.cache.block_nodes(nm.label_value(block_id)):
        meta = n["metadata"]
        labels = meta.get("labels") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in n["status"]["conditions"])
        healthy = not (labels.get(nm.LABEL_HEALTH) or "").startswith(nm.HEALTH_UNSCHEDULABLE)
        if ready and healthy and labels.get(nm.LABEL_PLAN) == nm.label_value(plan) \
                and labels.get(nm.LABEL_ROLE) == nm.ROLE_ACTIVE and not n["spec"]["unschedulable"] \
                and not meta.get("deletionTimestamp"):
            count += 1
    return count


def list_workloads(rt: Runtime) -> list[dict[str, Any]]:
    return rt.kube.custom.list_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "workloads")["items"]


# --------------------------------------------------------------------------- writing


def apply_check_entry(rt: Runtime, wl: dict[str, Any], entry: dict[str, Any]) -> None:
    """Server-side apply of one admission-check entry on the Workload's status (sync)."""
    meta = wl["metadata"]
    body = {"apiVersion": KUEUE_API, "kind": "Workload",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "status": {"admissionChecks": [entry]}}
    rt.kube.custom.patch_namespaced_custom_object_status(
        KUEUE_GROUP, KUEUE_VERSION, meta["namespace"], "workloads", meta["name"], body,
        field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)
    metrics.STATUS_WRITES.labels("Workload").inc()


def apply_check_active(rt: Runtime, check: dict[str, Any], active: ad.CheckActive) -> bool:
    """Apply the check's ``Active`` condition when it differs from what the check says (sync)."""
    prior = next((c for c in (check.get("status") or {}).get("conditions") or [] if c.get("type") == "Active"), None)
    if prior and (prior.get("status"), prior.get("reason"), prior.get("message")) == \
            (active.status, active.reason, active.message):
        return False
    since = prior["lastTransitionTime"] if prior and prior.get("status") == active.status else to_rfc3339(rt.clock())
    condition = {"type": "Active", "status": active.status, "reason": active.reason, "message": active.message,
                 "lastTransitionTime": since, "observedGeneration": check["metadata"].get("generation", 1)}
    body = {"apiVersion": KUEUE_API, "kind": "AdmissionCheck", "metadata": {"name": check["metadata"]["name"]},
            "status": {"conditions": [condition]}}
    rt.kube.custom.patch_cluster_custom_object_status(
        KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", check["metadata"]["name"], body,
        field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)
    metrics.STATUS_WRITES.labels("AdmissionCheck").inc()
    return True


def entry_for(check: str, decision: ad.AdmissionDecision, prior: dict[str, Any] | None,
              pod_sets: tuple[ad.PodSetView, ...], selector: dict[str, str], now: datetime,
              labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The entry to apply: on Ready, ``podSetUpdates`` pin each pod set to ``selector`` and label
    its pods with ``labels`` (the block they were admitted into, read back on later passes)."""
    entry: dict[str, Any] = {"name": check, "state": decision.state, "message": decision.message[:32000]}
    same_state = prior is not None and prior.get("state") == decision.state
    entry["lastTransitionTime"] = prior["lastTransitionTime"] if same_state and prior.get("lastTransitionTime") \
        else to_rfc3339(now)
    if decision.requeue_after_seconds is not None:
        entry["requeueAfterSeconds"] = decision.requeue_after_seconds
    if decision.state == ad.READY and selector:
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


async def reconcile_plan_workloads(rt: Runtime, plan_name: str, stop: Stop) -> datetime | None:
    """One pass over a plan named by AdmissionChecks: the checks, their workloads, the job nodes.

    With no check naming the plan any more, the pass only lets go of the plan's job nodes
    (released, or kept warm for their keep-alive) and the loop ends once none is left.
    """
    state = state_of(rt)
    checks = state.checks_of(plan_name)
    now = rt.clock()
    plan_obj = rt.cache.plan(plan_name)
    if plan_obj is not None and plan_obj["metadata"].get("deletionTimestamp"):
        plan_obj = None  # being deleted: its blocks are going back to the pools
    view, extra = plan_view(rt, plan_obj, now)
    plan, schedule = extra if extra else (None, None)
    if not checks:
        wake, left = await state.call(reconcile_job_nodes, rt, plan_name, plan, schedule, [], now)
        if not left and not state.checks_of(plan_name):  # a check may have come meanwhile
            stop.set()
            if state.loops.get(plan_name, (None, None))[1] is stop:
                state.loops.pop(plan_name, None)
            return None
        return wake
    for check in checks:
        obj = await state.call(_get_check, rt, check)
        if obj is not None:
            active = ad.check_active((obj.get("spec") or {}).get("parameters"), view)
            if await state.call(apply_check_active, rt, obj, active):
                log.info("admission check %s: Active=%s (%s) %s", check, active.status, active.reason, active.message)

    workloads = await state.call(list_workloads, rt)
    mine: list[ad.CheckedWorkload] = []
    for wl in workloads:
        names = {c.get("name") for c in (wl.get("status") or {}).get("admissionChecks") or []}
        for check in checks:
            if check in names:
                progress = ad.workload_progress(wl, check)
                mine.append(ad.CheckedWorkload((wl, check), ad.workload_view(wl), progress,
                                               ad.admitted_block(_entry(wl, check), nm.LABEL_RESERVED_CAPACITY)))
    mine.sort(key=lambda m: (m.progress.since, m.ref[0]["metadata"].get("creationTimestamp", ""), m.view.key))

    target = view.target if view else ad.TRAINING_JOB
    usable = None
    if schedule is not None and schedule.usable_block is not None:
        usable = plan.status.reserved_capacity[schedule.usable_block]
    ready_nodes = None
    if target == ad.HYPERPOD_CLUSTER and usable is not None:
        ready_nodes = ready_group_nodes(rt, plan_name, usable.id)
    busy_retry = min(timedelta(seconds=60), max(timedelta(seconds=5), rt.policy.day / 12))
    decided = ad.decide_plan_admission(view, mine, nm.label_value(usable.id) if usable is not None else None, now,
                                       ready_nodes=ready_nodes, busy_retry=busy_retry, plan_name=plan_name)

    for w, decision in decided.decisions:
        wl, check = w.ref
        selector = ({tj.LABEL_WORKLOAD: tj.workload_label_value(w.view.namespace, w.view.name)}
                    if target == ad.TRAINING_JOB else {nm.LABEL_PLAN: nm.label_value(plan_name)})
        labels = {nm.LABEL_RESERVED_CAPACITY: nm.label_value(decision.block_id)} if decision.block_id else {}
        prior = _entry(wl, check)
        entry = entry_for(check, decision, prior, w.view.pod_sets, selector, now, labels)
        if differs(prior, entry):
            try:
                await state.call(apply_check_entry, rt, wl, entry)
            except ApiException as e:  # gone meanwhile (404) or refused: the next pass decides again
                if e.status != 404:
                    log.warning("workload %s: writing check %s failed (%s): %s", w.view.key, check, e.status, e.reason)
                continue
            log.info("workload %s: check %s %s (%s): %s", w.view.key, check, decision.state, decision.reason,
                     decision.message)
            kopf.event(workload_ref(wl), type="Warning" if decision.state == ad.REJECTED else "Normal",
                       reason=f"AdmissionCheck{decision.state}", message=f"{check}: {decision.message}"[:1000])
    holders = [(w.view, n) for w, n in decided.holders]

    wakes = [schedule.next_transition_time] if schedule is not None else []
    if target == ad.TRAINING_JOB:
        wake, _ = await state.call(reconcile_job_nodes, rt, plan_name, plan, schedule, holders, now)
        wakes.append(wake)
    return min((w for w in wakes if w is not None), default=None)


def _entry(wl: dict[str, Any], check: str) -> dict[str, Any] | None:
    return next((c for c in (wl.get("status") or {}).get("admissionChecks") or [] if c.get("name") == check), None)


def _get_check(rt: Runtime, name: str) -> dict[str, Any] | None:
    try:
        return rt.kube.custom.get_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


# --------------------------------------------------------------------------- training-job nodes


def reconcile_job_nodes(rt: Runtime, name: str, plan: TrainingPlan | None, schedule,
                        holders: list[tuple[ad.WorkloadView, int]], now: datetime) -> tuple[datetime | None, int]:
    """Create, hand over, keep warm, drain and release a training-job plan's nodes (sync, thread).

    Returns when to look again and how many of the plan's job nodes are left. Without the plan
    (deleted) every node drains at once.
    """
    block = None
    if plan is not None and schedule is not None and schedule.active_block is not None:
        b = plan.status.reserved_capacity[schedule.active_block]
        state = schedule.blocks[schedule.active_block]
        block = tj.JobBlock(b.id, b.availability_zone, b.instance_type, b.instance_count, state.termination_time,
                            b.end_time, b.ultra_server_type, plan.spec.spare_instances_per_ultra_server
                            if b.ultra_server_type else 0)
    raw = rt.kube.list_nodes(f"{nm.LABEL_PLAN}={nm.label_value(name)},{tj.LABEL_WORKLOAD}")
    raw = [n for n in raw if not n.metadata.deletion_timestamp]
    nodes = tj.job_nodes_from_labels([(n.metadata.name, n.metadata.labels or {}, n.metadata.annotations or {},
                                       bool(n.spec.unschedulable), _signalled(n)) for n in raw])
    if not raw and not holders:
        return None, 0
    keep = plan.spec.keep_alive_period_seconds if plan is not None else None
    decision = tj.decide_job_nodes(
        name, block, [tj.Holder(tj.workload_label_value(w.namespace, w.name), n) for w, n in holders],
        nodes, timedelta(seconds=keep) if keep else None, now, rt.keys, rt.policy.checkpoint_lead)
    provider: KwokProvider = rt.providers["kwok"]
    plan_ref = ({"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingPlan", "metadata": plan.metadata}
                if plan is not None else None)
    events: list[tuple[str, str]] = []
    removed: set[str] = set()
    for spec in decision.create:
        provider.create(spec)
        events.append(("NodeCreated", f"{spec.name} in {spec.availability_zone} for workload "
                                      f"{spec.labels[tj.LABEL_WORKLOAD]}"))
    for node, workload in decision.assign:
        rt.kube.core.patch_node(node, {"metadata": {"labels": {tj.LABEL_WORKLOAD: workload},
                                                    "annotations": {tj.ANNOTATION_KEEP_ALIVE_UNTIL: None}}})
        events.append(("NodeReused", f"warm node {node} now runs workload {workload}"))
    for node, until, previous in decision.keep_warm:
        rt.kube.core.patch_node(node, {"metadata": {"labels": {tj.LABEL_WORKLOAD: ""},
                                                    "annotations": {tj.ANNOTATION_KEEP_ALIVE_UNTIL: to_rfc3339(until)}}})
        events.append(("NodeKeptWarm", f"{node} of workload {previous} kept until {to_rfc3339(until)} "
                                       "(keepAlivePeriodSeconds)"))
    if decision.checkpoint and block is not None:  # before any drain: the workloads are asked first
        checkpoint = gr.Checkpoint(block.id, block.termination_time, tuple(decision.checkpoint))
        by_name = {n.metadata.name: n for n in raw}
        for node in decision.checkpoint:
            for ref, event in signal_checkpoint(provider, rt.pods, by_name[node], checkpoint, now):
                kopf.event(ref, type=event.type, reason=event.reason, message=event.message)
        if not any(n.signalled for n in nodes):
            events.append((gr.REASON_CHECKPOINT, f"{checkpoint.message}; {len(checkpoint.nodes)} node(s) signalled"))
    evicting = False
    for node, why in decision.release:
        progress = rt.pods.evict(node)
        if progress.pods_left:  # its pods stop with their grace period first; look again shortly
            evicting = True
            continue
        removed.add(node)
        events.append(("NodeRemoved", f"{node} removed ({why}): {provider.release(node)}"))
    cordoned = {n.name for n in nodes if n.cordoned}
    for drain in decision.drain:
        if drain.node not in cordoned:
            provider.cordon(drain.node)
            events.append(("Draining", f"{drain.node} cordoned ({drain.reason}); evicting pods until "
                                       f"{to_rfc3339(drain.deadline)}"))
        progress = rt.pods.evict(drain.node)
        if progress.pods_left == 0 or now >= drain.deadline:
            removed.add(drain.node)
            events.append(("NodeRemoved", f"{drain.node} drained and removed ({drain.reason}): "
                                          f"{provider.release(drain.node)}"))
    for workload, missing in decision.short.items():
        events.append(("NoSlotForWorkload", f"workload {workload} is short of {missing} instance(s) on block "
                                            f"{block.id if block else '-'}"))
    for reason, message in events:
        log.info("plan %s: %s: %s", name, reason, message)
        if plan_ref is not None:
            warning = reason in ("NoSlotForWorkload", gr.REASON_CHECKPOINT)
            kopf.event(plan_ref, type="Warning" if warning else "Normal", reason=reason, message=message)
    wake = decision.wake_at
    if decision.drain or evicting:  # evictions take a moment: look again shortly until the nodes are gone
        soon = now + timedelta(seconds=1)
        wake = soon if wake is None else min(wake, soon)
    return wake, len(raw) + len(decision.create) - len(removed)


def _signalled(node) -> bool:
    """Whether the node carries the checkpoint signal (docs/checkpoint.md)."""
    return any(c.type == gr.CONDITION_BLOCK_TERMINATING and c.status == "True"
               for c in ((node.status.conditions or []) if node.status else []))


# --------------------------------------------------------------------------- watches


@kopf.on.startup()
async def kueue_startup(memo: kopf.Memo, **_: Any) -> None:
    state_of(memo.runtime)


@kopf.on.cleanup()
async def kueue_cleanup(memo: kopf.Memo, **_: Any) -> None:
    state_of(memo.runtime).stop_all()


@kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, "admissionchecks")
async def admission_check_changed(name: str, body: kopf.Body, spec: kopf.Spec, type: str | None,
                                  memo: kopf.Memo, **_: Any) -> None:
    """A check appeared, changed or went: serve it (or stop serving its plan)."""
    rt: Runtime = memo.runtime
    state = state_of(rt)
    before = state.checks.get(name)
    if spec.get("controllerName") != ad.CONTROLLER_NAME:
        if name in state.checks:  # not ours (any more): stop writing to it and its workloads
            state.checks.pop(name)
            if before:
                rt.wakeups.wake(KIND, before)
        return
    if type == "DELETED":
        state.checks.pop(name, None)
        if before:
            rt.wakeups.wake(KIND, before)  # its loop ends if no other check names the plan
        return
    plan, why = ad.check_parameters(spec.get("parameters"))
    state.checks[name] = plan
    if before and before != plan:
        rt.wakeups.wake(KIND, before)
    if plan is None:
        active = ad.CheckActive("False", "InvalidParameters", why)
        if await state.call(apply_check_active, rt, dict(body), active):
            log.info("admission check %s: Active=False (InvalidParameters) %s", name, why)
        return
    state.ensure_loop(rt, plan)


@kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, "workloads")
async def workload_changed(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A Workload that carries one of our checks changed: its plan's loop looks again."""
    state = state_of(memo.runtime)
    for entry in (body.get("status") or {}).get("admissionChecks") or []:
        plan = state.checks.get(entry.get("name"))
        if plan:
            memo.runtime.wakeups.wake(KIND, plan)


@kopf.on.event(GROUP, VERSION, "trainingplans")
async def plan_changed_for_admission(name: str, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A plan's phase or blocks changed (or it appeared or went): the checks naming it look again."""
    state = state_of(memo.runtime)
    if type is not None and name in state.loops:
        memo.runtime.wakeups.wake(KIND, name)
