"""Kueue AdmissionCheck controller: kopf's registration and the routing of its events.

hyperplan serves the ``AdmissionCheck``\\s (``kueue.x-k8s.io/v1beta2``) whose
``spec.controllerName`` is ``hyperplan.dev/training-plan`` and whose ``spec.parameters`` name a
TrainingPlan (``apiGroup: hyperplan.dev, kind: TrainingPlan, name: <plan>``). It is two
reconcilers on the operator's work queue (``runtime.workqueue``), and one actuator:

* :mod:`hyperplan.controllers.kueue.checks`, keyed by AdmissionCheck (kind ``kueue-check``): the
  only writer of a check's ``Active`` condition;
* :mod:`hyperplan.controllers.kueue.admission`, keyed by plan (kind ``kueue-plan``): the checks'
  entries on the Workloads, and on a ``training-job`` plan the job nodes;
* :mod:`hyperplan.actuation.jobnodes`: the job nodes' side effects, on worker threads, returning
  what they did.

What they know is :class:`hyperplan.controllers.kueue.state.KueueState`, written on the event loop
only, and the Workloads and AdmissionChecks kept by the operator's watch cache
(:class:`hyperplan.runtime.store.WatchCache`, with its write-through). This module owns
nothing: it adds those two kinds to the watch cache at startup, registers the two passes, and turns each watch event into the state it changes and the keys it
wakes.

**No kopf daemon, no finalizer.** A kopf daemon puts a finalizer on the object it serves, and a
Kueue AdmissionCheck must not hang in Terminating because hyperplan is not running. Only
``on.event`` handlers and an index watch Kueue's kinds, so kopf never patches them (no
annotations, no finalizers). A plan's admission loop (``KueueState.loops``) ends when no check
names the plan any more and none of its job nodes is left.

**Without Kueue.** When Kueue's CRDs are not installed, kopf resolves no resource for these
handlers: it logs once "Unresolved resources cannot be served (try creating their CRDs)" and
watches nothing for them; it keeps observing CRDs (the chart lets it list and watch them) and
starts these watches when Kueue is installed later. Nothing here runs until then, so the
operator neither fails nor polls. kopf holds its handlers back until every indexed kind has
had its initial listing; a kind that is not installed has none to wait for, and once Kueue is
installed the wait is one listing of its Workloads. With ``HYPERPLAN_KUEUE_ENABLED=false``
(the chart's ``kueue.enabled: false``, which also drops the RBAC rules for Kueue's kinds) this
module is not imported at all: a watch the operator may not list would hold every handler back.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import kopf

from hyperplan.actuation.kueue import KUEUE_GROUP, KUEUE_VERSION
from hyperplan.controllers.kueue import checks as kueue_checks
from hyperplan.runtime.context import Runtime
from hyperplan.controllers.kueue.admission import reconcile_plan_workloads
from hyperplan.controllers.kueue.state import (
    CHECK_KIND, CHECKS, CHECKS_INDEX, PLAN_KIND, WORKLOADS, WORKLOADS_INDEX, KueueState, slim_check, slim_workload,
    state_of,
)
from hyperplan.runtime.nodewatch import DELETED, NodeChange
from hyperplan.planning import admission
from hyperplan.planning import naming
from hyperplan.planning import trainingjobs

KUEUE_WORKERS = 16  # plans passed over at once (their calls share the controller's 2 threads)
log = logging.getLogger("hyperplan.kueue")


@kopf.index(KUEUE_GROUP, KUEUE_VERSION, "workloads")
async def hp_kueue_workloads(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str], dict]:
    """Workloads by ("check", name) for each admission check they carry, by ("workload",
    label value) for the job nodes that carry it, and by ("node", hostname) for each node its
    topology assignment names (a failed node's removal waits for Kueue to move it)."""
    wl = slim_workload(body)
    keys = {("workload", trainingjobs.workload_label_value(namespace or "", name)): wl}
    for node in wl["status"]["assignedNodes"]:
        keys[("node", node)] = wl
    for entry in wl["status"]["admissionChecks"]:
        if entry.get("name"):
            keys[("check", entry["name"])] = wl
    return keys


@kopf.index(KUEUE_GROUP, KUEUE_VERSION, "admissionchecks")
async def hp_kueue_checks(name: str, body: kopf.Body, **_: Any) -> dict[str, dict]:
    """AdmissionChecks by name, as the check controller reads them."""
    return {name: slim_check(body)}


@kopf.on.startup()
async def kueue_startup(memo: kopf.Memo, **kwargs: Any) -> None:
    """Add the Workloads and the AdmissionChecks to the watch cache (kopf hands their indexes
    to startup handlers, filled before any other handler), listen to job node changes, and run
    the checks' and the plans' passes on the work queue."""
    rt: Runtime = memo.runtime
    state_of(rt)
    rt.cache.add_kind(WORKLOADS, WORKLOADS_INDEX, kwargs[WORKLOADS_INDEX], slim_workload)
    rt.cache.add_kind(CHECKS, CHECKS_INDEX, kwargs[CHECKS_INDEX], slim_check)
    rt.node_store.listeners.append(lambda change: job_node_changed(rt, change))
    rt.plan_listeners.append(lambda name, type, _body: plan_changed_for_admission(rt, name, type))
    kueue_checks.register(rt)
    rt.queue.register(PLAN_KIND, lambda plan: reconcile_plan_workloads(rt, plan), label="KueueAdmission",
                      workers=KUEUE_WORKERS)


async def check_changed(rt: Runtime, name: str, body: Mapping[str, Any], type: str | None) -> None:
    """A check appeared, changed or went: serve it (or stop serving its plan)."""
    state = state_of(rt)
    before = state.checks.get(name)
    spec = body.get("spec") or {}
    if spec.get("controllerName") != admission.CONTROLLER_NAME or type == "DELETED":
        # Not ours (any more), or gone: stop writing to it and its workloads. Its plan's loop
        # looks again (and ends, once no other check names the plan and no job node is left).
        state.drop_check(name)
        rt.queue.forget(CHECK_KIND, name)
        rt.cache.forget(CHECKS, name)
        if before:
            state.wake(rt, before)
        return
    plan, _ = admission.check_parameters(spec.get("parameters"))
    state.serve_check(name, plan)
    rt.cache.watched(CHECKS, name, (body.get("metadata") or {}).get("resourceVersion"))
    if before and before != plan:
        state.wake(rt, before)
    rt.queue.wake(CHECK_KIND, name)
    if plan is not None:
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
    key = f"{namespace}/{name}" if namespace else name
    if type == "DELETED":
        memo.runtime.cache.forget(WORKLOADS, key)  # nothing of it is kept once it is gone
    else:
        memo.runtime.cache.watched(WORKLOADS, key, body.get("metadata", {}).get("resourceVersion"))
    for plan in plans_to_wake(state, namespace, name, body):
        state.wake(memo.runtime, plan)


def job_node_changed(rt: Runtime, change: NodeChange) -> None:
    """A job node of a plan that has no loop changed (a node listener, wiring.nodes): start
    one, so that the node is released once no workload runs on it."""
    plan = change.labels.get(naming.LABEL_PLAN)
    if trainingjobs.LABEL_WORKLOAD not in change.labels or not plan or change.type == DELETED:
        return
    state = state_of(rt)
    if plan not in state.loops and rt.cache.plan(plan) is not None:
        state.ensure_loop(rt, plan)


def plan_changed_for_admission(rt: Runtime, name: str, type: str | None) -> None:
    """A plan appeared, changed or went (a listener of ``wiring.events.plan_event``): the checks
    naming it look at their ``Active`` again, and its admission loop looks again. A plan first
    seen (kopf's initial listing, after a restart) that still has job nodes but no check naming
    it gets a loop, so that its nodes are released once no workload runs on them."""
    state = state_of(rt)
    rt.queue.start()
    state.wake_checks_of(rt, name)
    if type is None and name not in state.loops and rt.cache.job_nodes(naming.label_value(name)):
        state.ensure_loop(rt, name)
        return
    if type is not None:
        state.wake(rt, name)
