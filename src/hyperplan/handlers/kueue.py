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
Terminating because hyperplan is not running. Instead each plan named by a check is a key of
the operator's work queue (``handlers.workqueue``, kind ``kueue-plan``), as plans and groups
are: it is passed over at the plan's next block boundary, a keep-alive expiry, or a wake from a
Workload, the plan or a check changing. Its loop (:attr:`KueueState.loops`) ends when no check
names the plan any more and none of its job nodes is left. Only ``on.event`` handlers and an
index watch Kueue's kinds, so kopf never patches them (no annotations, no finalizers).

**Reads.** A pass makes no API read: the checks are what their watch events said
(:class:`KueueState` keeps them), the Workloads come from a kopf index fed by the Workload watch
(``hp_kueue_workloads``, by check name and by workload), the plan and its groups' nodes from
the operator's watch cache, the job nodes (labelled ``hyperplan.dev/workload``) from the node
store of handlers.nodewatch, by plan. What the pass wrote is remembered with the resourceVersion the API
server returned, and preferred over an older watched copy; the job nodes are listed from the API
once after a pass that wrote to them (as a group's nodes are).

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
operator neither fails nor polls. kopf holds its handlers back until every indexed kind has
had its initial listing; a kind that is not installed has none to wait for, and once Kueue is
installed the wait is one listing of its Workloads. With ``HYPERPLAN_KUEUE_ENABLED=false``
(the chart's ``kueue.enabled: false``, which also drops the RBAC rules for Kueue's kinds) this
module is not imported at all: a watch the operator may not list would hold every handler back.

**Seams.** Every write goes through :class:`hyperplan.actuation.kueue.KueueWrites`
(``KueueState.writes``), so the passes are unit-tested with a recording fake
(``tests/unit/test_kueue_passes.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Mapping

import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from hyperplan.actuation.groups import signal_checkpoint
from hyperplan.actuation.kueue import KUEUE_API, KUEUE_GROUP, KUEUE_VERSION, KubeKueueWrites, KueueWrites
from hyperplan.actuation.nodes import ACCELERATORS, NodeProvider
from hyperplan.api.models import GROUP, VERSION, TrainingPlan, to_rfc3339
from hyperplan.handlers.cache import v1_node
from hyperplan.handlers.context import Runtime
from hyperplan.handlers.nodewatch import DELETED, NodeChange
from hyperplan.planning import admission
from hyperplan.planning import groups
from hyperplan.planning import naming
from hyperplan.planning import nodefacts
from hyperplan.planning import placement
from hyperplan.planning import trainingjobs
from hyperplan.planning.schedule import plan_block_schedule

KIND = "kueue-plan"
KUEUE_WORKERS = 16  # plans passed over at once (their calls share the controller's 2 threads)
WORKLOADS_INDEX = "hp_kueue_workloads"
log = logging.getLogger("hyperplan.kueue")


def _rv(obj: Mapping[str, Any] | None) -> int:
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion") or -1)
    except (TypeError, ValueError):
        return -1


def _snapshot(store: Any) -> list[Any]:
    """The values of one key of a kopf index, read from a worker thread (the event loop may
    change the store meanwhile: retry the copy)."""
    for _ in range(5):
        try:
            return list(store) if store is not None else []
        except RuntimeError:
            continue
    return list(store) if store is not None else []


@dataclass
class KueueState:
    """What the Kueue controller knows and runs.

    * ``checks``: the AdmissionChecks it serves (name -> plan, None when the parameters are
      invalid), and ``check_bodies``, each as its last watch event (or our last write) showed it;
    * ``loops``: the plans it passes over (keys of the work queue): those the checks name, and
      those with job nodes left;
    * ``workloads``: the kopf index, ``job_nodes``: the node store's view by plan (both bound at
      startup), ``written``: the Workloads as our own writes returned them (preferred while
      newer than the index's copy), ``nodes_wrote``: plans whose last pass wrote to their job nodes;
    * ``job_workloads``: which plan's job nodes a workload (label value) runs on, so that a
      change of that Workload wakes the plan even when no check of it is left;
    * ``writes``: the side effects (a recording fake in tests);
    * ``executor``: the threads the passes' calls run on, not asyncio's default executor that
      the plan and group daemons share: a burst of node creates for jobs must never hold up a
      block transition or a spare promotion.
    """

    checks: dict[str, str | None] = field(default_factory=dict)
    check_bodies: dict[str, dict[str, Any]] = field(default_factory=dict)
    loops: set[str] = field(default_factory=set)
    workloads: Mapping[Any, Any] | None = None
    job_nodes: Mapping[Any, Any] | None = None
    written: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    nodes_wrote: set[str] = field(default_factory=set)
    job_workloads: dict[str, str] = field(default_factory=dict)
    writes: KueueWrites | None = None
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
        """Pass over ``plan`` now, and from now on whenever it is woken or falls due."""
        self.loops.add(plan)
        rt.queue.wake(KIND, plan)

    def wake(self, rt: Runtime, plan: str) -> None:
        """Pass over ``plan`` again if its loop runs."""
        if plan in self.loops:
            rt.queue.wake(KIND, plan)

    # ------------------------------------------------------------------ reads (no API call)

    def _fresh(self, wl: dict[str, Any]) -> dict[str, Any]:
        meta = wl.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        mine = self.written.get(key)
        if mine is None:
            return wl
        if _rv(wl) >= _rv(mine):  # the watch caught up with our write
            self.written.pop(key, None)
            return wl
        return mine

    def workloads_with(self, check: str) -> list[dict[str, Any]]:
        """The Workloads that carry ``check`` (from the index, or our newer write)."""
        if self.workloads is None:
            raise RuntimeError("the Workload index is read before kopf started (not bound)")
        return [self._fresh(w) for w in _snapshot(self.workloads.get(("check", check)))]

    def workload(self, label_value: str) -> dict[str, Any] | None:
        """The Workload whose ``hyperplan.dev/workload`` label value is ``label_value``."""
        if self.workloads is None:
            raise RuntimeError("the Workload index is read before kopf started (not bound)")
        found = _snapshot(self.workloads.get(("workload", label_value)))
        return self._fresh(found[0]) if found else None

    def wrote_workload(self, obj: Mapping[str, Any] | None) -> None:
        if obj:
            slim = slim_workload(obj)
            meta = slim["metadata"]
            key = (meta.get("namespace", ""), meta.get("name", ""))
            if _rv(slim) > _rv(self.written.get(key)):
                self.written[key] = slim

    def plan_job_nodes(self, writes: KueueWrites, plan_label: str) -> list[client.V1Node]:
        """The plan's job nodes: from the index, or from the API right after a pass that wrote
        to them (the watch events of those writes may still be on their way)."""
        if plan_label in self.nodes_wrote or self.job_nodes is None:
            return writes.list_job_nodes(plan_label)
        return [v1_node(n) for n in sorted(_snapshot(self.job_nodes.get(plan_label)),
                                           key=lambda n: n["metadata"]["name"])]

    def note_nodes_wrote(self, plan_label: str, wrote: bool) -> None:
        if wrote:
            self.nodes_wrote.add(plan_label)
        else:
            self.nodes_wrote.discard(plan_label)


def state_of(rt: Runtime) -> KueueState:
    if rt.kueue is None:
        rt.kueue = KueueState(writes=KubeKueueWrites(rt.kube))
    return rt.kueue


def slim_workload(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Workload as the passes read it: identity, the pod sets' counts and requests, the maximum
    execution time, and the status' conditions and admission checks (not Kueue's admission
    details, which can be large on a TAS workload)."""
    meta, spec, status = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
    pod_sets = []
    for ps in spec.get("podSets") or []:
        containers = (((ps.get("template") or {}).get("spec")) or {}).get("containers") or []
        pod_sets.append({"name": ps.get("name"), "count": ps.get("count"), "template": {"spec": {"containers": [
            {"resources": dict(c.get("resources") or {})} for c in containers]}}})
    return {
        "apiVersion": KUEUE_API, "kind": "Workload",
        "metadata": {**{k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp",
                                             "deletionTimestamp") if meta.get(k) is not None},
                     "labels": dict(meta.get("labels") or {})},
        "spec": {"podSets": pod_sets, **({"maximumExecutionTimeSeconds": spec["maximumExecutionTimeSeconds"]}
                                         if spec.get("maximumExecutionTimeSeconds") is not None else {})},
        "status": {"conditions": [{"type": c.get("type"), "status": c.get("status"), "reason": c.get("reason")}
                                  for c in status.get("conditions") or []],
                   "admissionChecks": [dict(c) for c in status.get("admissionChecks") or []]},
    }


def slim_check(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("name", "generation", "resourceVersion") if meta.get(k) is not None},
            "spec": dict(body.get("spec") or {}),
            "status": {"conditions": [dict(c) for c in (body.get("status") or {}).get("conditions") or []]}}


# --------------------------------------------------------------------------- indexes


@kopf.index(KUEUE_GROUP, KUEUE_VERSION, "workloads")
async def hp_kueue_workloads(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict]:
    """Workloads by ("check", name) for each admission check they carry, and by ("workload",
    label value) for the job nodes that carry it."""
    wl = slim_workload(body)
    keys = {("workload", trainingjobs.workload_label_value(namespace or "", name)): wl}
    for entry in wl["status"]["admissionChecks"]:
        if entry.get("name"):
            keys[("check", entry["name"])] = wl
    return keys


# --------------------------------------------------------------------------- reading


def admission_plan(rt: Runtime, obj: dict[str, Any] | None, now: datetime) -> tuple[admission.AdmissionPlan | None, Any]:
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
            usable -= spares * len(placement.ultraservers_for_block(b.id, b.ultra_server_type, b.instance_count, spares))
        termination = b.termination_time or max(b.start_time, rt.policy.termination_time(b.end_time, spec.target_resource))
        blocks.append(admission.BlockView(b.id, b.availability_zone, b.instance_type, usable, b.start_time, b.end_time,
                                   termination))
    failure = next((c.message for c in status.conditions if c.status == "False" and c.message), "")
    itype = spec.instance_type or placement.ULTRASERVER_INSTANCE_TYPE
    view = admission.AdmissionPlan(plan.metadata["name"], spec.target_resource, status.phase, tuple(blocks), failure,
                       ACCELERATORS.get(itype))
    schedule = None
    if status.reserved_capacity:
        schedule = plan_block_schedule([(b.start_time, b.end_time) for b in status.reserved_capacity],
                                       spec.target_resource, rt.policy, now)
    return view, (plan, schedule)


def ready_group_nodes(rt: Runtime, plan: str, block_id: str) -> int:
    """The nodes of the plan's instance groups on the block that Kueue may admit work onto: those
    that serve (``NodeFacts.is_serving``: active, Ready, neither cordoned nor being deleted, and
    healthy by both health labels), from the watch cache of group nodes."""
    facts = (nodefacts.facts_of_dict(n, rt.keys) for n in rt.cache.block_nodes(naming.label_value(block_id)))
    return sum(1 for f in facts if f.is_serving and f.plan == naming.label_value(plan))


# --------------------------------------------------------------------------- writing


def apply_check_active(state: KueueState, check: dict[str, Any], active: admission.CheckActive, now: datetime) -> bool:
    """Apply the check's ``Active`` condition when it differs from what the check says (sync)."""
    prior = next((c for c in (check.get("status") or {}).get("conditions") or [] if c.get("type") == "Active"), None)
    if prior and (prior.get("status"), prior.get("reason"), prior.get("message")) == \
            (active.status, active.reason, active.message):
        return False
    since = prior["lastTransitionTime"] if prior and prior.get("status") == active.status else to_rfc3339(now)
    condition = {"type": "Active", "status": active.status, "reason": active.reason, "message": active.message,
                 "lastTransitionTime": since, "observedGeneration": check["metadata"].get("generation", 1)}
    out = state.writes.apply_check_active(check, condition)
    name = check["metadata"]["name"]
    known = state.check_bodies.get(name)
    if out is not None and _rv(out) > _rv(known):
        state.check_bodies[name] = slim_check(out)
    elif known is not None and out is None:  # what we wrote is what the check says now
        others = [c for c in known["status"]["conditions"] if c.get("type") != "Active"]
        state.check_bodies[name] = {**known, "status": {"conditions": [*others, condition]}}
    return True


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


def running_outside_checks(state: KueueState, plan_name: str, known: set[str]) -> list[trainingjobs.Holder]:
    """Workloads on the plan's job nodes that no check of the plan decides for any more but that
    Kueue still runs (:func:`hyperplan.planning.trainingjobs.still_running_holders`)."""
    label = naming.label_value(plan_name)
    nodes = [n for n in state.plan_job_nodes(state.writes, label) if not n.metadata.deletion_timestamp]
    on_nodes = {(n.metadata.labels or {}).get(trainingjobs.LABEL_WORKLOAD, "") for n in nodes} - {""}
    for workload in on_nodes:
        state.job_workloads[workload] = plan_name
    running = {w for w in on_nodes - known if (obj := state.workload(w)) is not None and admission.workload_runs(obj)}
    views = trainingjobs.job_nodes_from_labels([(n.metadata.name, n.metadata.labels or {}, {}, False, False) for n in nodes])
    return trainingjobs.still_running_holders(views, known, running)


async def reconcile_plan_workloads(rt: Runtime, plan_name: str) -> datetime | None:
    """One pass over a plan named by AdmissionChecks: the checks, their workloads, the job nodes.

    With no check naming the plan any more, the pass only serves the plan's job nodes: those of
    workloads that still run stay, the others are released (or kept warm for their keep-alive),
    and the loop ends once none is left.
    """
    state = state_of(rt)
    checks = state.checks_of(plan_name)
    now = rt.clock()
    plan_obj = rt.cache.plan(plan_name)
    if plan_obj is not None and plan_obj["metadata"].get("deletionTimestamp"):
        plan_obj = None  # being deleted: its blocks are going back to the pools
    view, extra = admission_plan(rt, plan_obj, now)
    plan, schedule = extra if extra else (None, None)
    target = view.target if view else admission.TRAINING_JOB
    if not checks:
        outside = await state.call(running_outside_checks, state, plan_name, set()) \
            if target == admission.TRAINING_JOB else []
        wake, left = await state.call(reconcile_job_nodes, rt, plan_name, plan, schedule, outside, now)
        if not left and not state.checks_of(plan_name):  # a check may have come meanwhile
            state.loops.discard(plan_name)
            return None
        return wake
    for check in checks:
        obj = state.check_bodies.get(check)
        if obj is not None:
            active = admission.check_active((obj.get("spec") or {}).get("parameters"), view)
            if await state.call(apply_check_active, state, obj, active, now):
                log.info("admission check %s: Active=%s (%s) %s", check, active.status, active.reason, active.message)

    mine: list[admission.CheckedWorkload] = []
    seen: set[tuple[str, str]] = set()
    for check in checks:
        for wl in state.workloads_with(check):
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
        outside = await state.call(running_outside_checks, state, plan_name, known)
    busy_retry = min(timedelta(seconds=60), max(timedelta(seconds=5), rt.policy.day / 12))
    decided = admission.decide_plan_admission(view, mine, naming.label_value(usable.id) if usable is not None else None, now,
                                       ready_nodes=ready_nodes, busy_retry=busy_retry, plan_name=plan_name,
                                       held_outside=sum(h.instances for h in outside))

    for w, decision in decided.decisions:
        wl, check = w.ref
        selector = ({trainingjobs.LABEL_WORKLOAD: trainingjobs.workload_label_value(w.view.namespace, w.view.name)}
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
            state.wrote_workload(written)
            log.info("workload %s: check %s %s (%s): %s", w.view.key, check, decision.state, decision.reason,
                     decision.message)
            state.writes.event(workload_ref(wl), "Warning" if decision.state == admission.REJECTED else "Normal",
                               f"AdmissionCheck{decision.state}", f"{check}: {decision.message}"[:1000])
    holders = [trainingjobs.Holder(trainingjobs.workload_label_value(w.view.namespace, w.view.name), n) for w, n in decided.holders]

    wakes = [schedule.next_transition_time] if schedule is not None else []
    if target == admission.TRAINING_JOB:
        wake, _ = await state.call(reconcile_job_nodes, rt, plan_name, plan, schedule, holders + outside, now)
        wakes.append(wake)
    return min((w for w in wakes if w is not None), default=None)


def _entry(wl: dict[str, Any], check: str) -> dict[str, Any] | None:
    return next((c for c in (wl.get("status") or {}).get("admissionChecks") or [] if c.get("name") == check), None)


# --------------------------------------------------------------------------- training-job nodes


def reconcile_job_nodes(rt: Runtime, name: str, plan: TrainingPlan | None, schedule,
                        holders: list[trainingjobs.Holder], now: datetime) -> tuple[datetime | None, int]:
    """Create, hand over, keep warm, drain and release a training-job plan's nodes (sync, thread).

    ``holders``: the workloads that hold instances of the plan's usable block, in admission
    order. Returns when to look again and how many of the plan's job nodes are left. Without
    the plan (deleted) every node drains at once. A node to release whose pods have not gone
    yet stays until they have (it is looked at again shortly).
    """
    state = state_of(rt)
    writes = state.writes
    label = naming.label_value(name)
    block = None
    if plan is not None and schedule is not None and schedule.active_block is not None:
        b = plan.status.reserved_capacity[schedule.active_block]
        bs = schedule.blocks[schedule.active_block]
        block = trainingjobs.JobBlock(b.id, b.availability_zone, b.instance_type, b.instance_count, bs.termination_time,
                            b.end_time, b.ultra_server_type, plan.spec.spare_instances_per_ultra_server
                            if b.ultra_server_type else 0)
    raw = [n for n in state.plan_job_nodes(writes, label) if not n.metadata.deletion_timestamp]
    nodes = trainingjobs.job_nodes_from_labels([(n.metadata.name, n.metadata.labels or {}, n.metadata.annotations or {},
                                       bool(n.spec.unschedulable) if n.spec else False, _signalled(n))
                                      for n in raw])
    on_nodes = {n.workload for n in nodes if n.workload}
    for workload, of_plan in list(state.job_workloads.items()):
        if of_plan == name and workload not in on_nodes:
            state.job_workloads.pop(workload, None)
    for workload in on_nodes:
        state.job_workloads[workload] = name
    if not raw and not holders:
        state.note_nodes_wrote(label, False)
        return None, 0
    keep = plan.spec.keep_alive_period_seconds if plan is not None else None
    decision = trainingjobs.decide_job_nodes(name, block, holders, nodes, timedelta(seconds=keep) if keep else None, now,
                                   rt.keys, rt.policy.checkpoint_lead)
    provider: NodeProvider = rt.providers["kwok"]
    plan_ref = ({"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingPlan", "metadata": plan.metadata}
                if plan is not None else None)
    events: list[tuple[str, str]] = []
    removed: set[str] = set()
    wrote = bool(decision.create or decision.assign or decision.keep_warm)
    for spec in decision.create:
        provider.create(spec)
        events.append(("NodeCreated", f"{spec.name} in {spec.availability_zone} for workload "
                                      f"{spec.labels[trainingjobs.LABEL_WORKLOAD]}"))
    for node, workload in decision.assign:
        writes.set_node_workload(node, workload, None)
        events.append(("NodeReused", f"warm node {node} now runs workload {workload}"))
    for node, until, previous in decision.keep_warm:
        writes.set_node_workload(node, "", to_rfc3339(until))
        events.append(("NodeKeptWarm", f"{node} of workload {previous} kept until {to_rfc3339(until)} "
                                       "(keepAlivePeriodSeconds)"))
    if decision.checkpoint and block is not None:  # before any drain: the workloads are asked first
        wrote = True
        checkpoint = groups.Checkpoint(block.id, block.termination_time, tuple(decision.checkpoint))
        by_name = {n.metadata.name: n for n in raw}
        for node in decision.checkpoint:
            for ref, event in signal_checkpoint(provider, rt.pods, by_name[node], checkpoint, now):
                writes.event(ref, event.type, event.reason, event.message)
        if not any(n.signalled for n in nodes):
            events.append((groups.REASON_CHECKPOINT, f"{checkpoint.message}; {len(checkpoint.nodes)} node(s) signalled"))
    evicting = False
    for node, why in decision.release:
        wrote = True
        progress = rt.pods.evict(node)
        if progress.pods_left:  # its pods stop with their grace period first; look again shortly
            evicting = True
            continue
        removed.add(node)
        events.append(("NodeRemoved", f"{node} removed ({why}): {provider.release(node)}"))
    cordoned = {n.name for n in nodes if n.cordoned}
    for drain in decision.drain:
        wrote = True
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
            warning = reason in ("NoSlotForWorkload", groups.REASON_CHECKPOINT)
            writes.event(plan_ref, "Warning" if warning else "Normal", reason, message)
    state.note_nodes_wrote(label, wrote)
    wake = decision.wake_at
    if decision.drain or evicting:  # evictions take a moment: look again shortly until the nodes are gone
        soon = now + timedelta(seconds=1)
        wake = soon if wake is None else min(wake, soon)
    return wake, len(raw) + len(decision.create) - len(removed)


def _signalled(node: client.V1Node) -> bool:
    """Whether the node carries the checkpoint signal (docs/checkpoint.md)."""
    return any(c.type == groups.CONDITION_BLOCK_TERMINATING and c.status == "True"
               for c in ((node.status.conditions or []) if node.status else []))


# --------------------------------------------------------------------------- watches


@kopf.on.startup()
async def kueue_startup(memo: kopf.Memo, **kwargs: Any) -> None:
    """Bind the Workload index (kopf hands it to startup handlers, filled before any other
    handler) and the job nodes (the node store, by plan), listen to job node changes, and run the
    plans' passes on the work queue."""
    rt: Runtime = memo.runtime
    state = state_of(rt)
    state.workloads = kwargs.get(WORKLOADS_INDEX)
    state.job_nodes = rt.node_store.view("job")
    rt.node_store.listeners.append(lambda change: job_node_changed(rt, change))
    rt.queue.register(KIND, lambda plan: reconcile_plan_workloads(rt, plan), label="KueueAdmission",
                      workers=KUEUE_WORKERS)


async def check_changed(rt: Runtime, name: str, body: Mapping[str, Any], type: str | None) -> None:
    """A check appeared, changed or went: serve it (or stop serving its plan)."""
    state = state_of(rt)
    before = state.checks.get(name)
    spec = body.get("spec") or {}
    if spec.get("controllerName") != admission.CONTROLLER_NAME or type == "DELETED":
        # Not ours (any more), or gone: stop writing to it and its workloads. Its plan's loop
        # looks again (and ends, once no other check names the plan and no job node is left).
        state.checks.pop(name, None)
        state.check_bodies.pop(name, None)
        if before:
            state.wake(rt, before)
        return
    plan, why = admission.check_parameters(spec.get("parameters"))
    state.checks[name] = plan
    slim = slim_check(body)
    if _rv(slim) >= _rv(state.check_bodies.get(name)):
        state.check_bodies[name] = slim
    if before and before != plan:
        state.wake(rt, before)
    if plan is None:
        active = admission.CheckActive("False", "InvalidParameters", why)
        if await state.call(apply_check_active, state, state.check_bodies[name], active, rt.clock()):
            log.info("admission check %s: Active=False (InvalidParameters) %s", name, why)
        return
    state.ensure_loop(rt, plan)


@kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, "admissionchecks")
async def admission_check_changed(name: str, body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    memo.runtime.queue.start()  # inside a kopf handler, for kopf.event (see trainingplan.plan_seen)
    await check_changed(memo.runtime, name, body, type)


def plans_to_wake(state: KueueState, namespace: str, name: str, body: Mapping[str, Any]) -> set[str]:
    """The plans whose loops a change of this Workload concerns: those of the checks it carries,
    and the plan whose job nodes it runs on (its check may be gone)."""
    plans = {state.checks.get(e.get("name")) for e in (body.get("status") or {}).get("admissionChecks") or []}
    plans.add(state.job_workloads.get(trainingjobs.workload_label_value(namespace or "", name)))
    return {p for p in plans if p}


@kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, "workloads")
async def workload_changed(namespace: str, name: str, body: kopf.Body, type: str | None, memo: kopf.Memo,
                           **_: Any) -> None:
    """A Workload that carries one of our checks, or runs on a job node, changed: its plan's loop
    looks again."""
    state = state_of(memo.runtime)
    memo.runtime.queue.start()
    if type == "DELETED":
        state.written.pop((namespace or "", name), None)  # nothing of it is kept once it is gone
    for plan in plans_to_wake(state, namespace, name, body):
        state.wake(memo.runtime, plan)


def job_node_changed(rt: Runtime, change: NodeChange) -> None:
    """A job node of a plan that has no loop changed (a node listener, handlers.nodes): start
    one, so that the node is released once no workload runs on it."""
    plan = change.labels.get(naming.LABEL_PLAN)
    if trainingjobs.LABEL_WORKLOAD not in change.labels or not plan or change.type == DELETED:
        return
    state = state_of(rt)
    if plan not in state.loops and rt.cache.plan(plan) is not None:
        state.ensure_loop(rt, plan)


@kopf.on.event(GROUP, VERSION, "trainingplans")
async def plan_changed_for_admission(name: str, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A plan's phase or blocks changed (or it appeared or went): the checks naming it look again.
    A plan first seen (kopf's initial listing, after a restart) that still has job nodes but no
    check naming it gets a loop, so that its nodes are released once no workload runs on them."""
    state = state_of(memo.runtime)
    memo.runtime.queue.start()
    if type is None and name not in state.loops and state.job_nodes is not None \
            and state.job_nodes.get(naming.label_value(name)):
        state.ensure_loop(memo.runtime, name)
        return
    if type is not None:
        state.wake(memo.runtime, name)
