"""What the Kueue controller knows: :class:`KueueState`, its one owner of state, and its reads.

Every field of :class:`KueueState` is written on the event loop only, through its methods,
which refuse to run on any other thread: the passes (:mod:`hyperplan.controllers.kueue.admission`
and :mod:`hyperplan.controllers.kueue.checks`) hand values to worker threads and apply what the
threads return. What is kept and why:

* ``checks``: the AdmissionChecks served (name -> the plan their parameters name, None when
  they are invalid), from their watch events, so that a Workload's or a plan's change finds the
  keys it wakes without reading anything;
* ``loops``: the plans the admission pass runs for (keys of the work queue), those the checks
  name and those with job nodes left;
* ``job_workloads``: which plan's job nodes a workload (label value) runs on, so that a change
  of that Workload wakes the plan even when no check of it is left;
* ``unreadable``: the unreadable values found on a plan's job nodes by its last pass, so that
  each gets one Warning Event, not one per pass.

The objects themselves are not kept here: the Workloads and the AdmissionChecks are kinds of
the operator's watch cache (:class:`hyperplan.runtime.store.WatchCache`, ``rt.cache``), fed by
kopf indexes (:data:`WORKLOADS_INDEX`, :data:`CHECKS_INDEX`), with its write-through of our own
writes; the job nodes are its node store's, listed again from the API after a pass that wrote
to them (:meth:`WatchCache.must_list_nodes`). They are read on the event loop, and the copies
are what threads get.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from kubernetes import client

from hyperplan import threads
from hyperplan.api.models import GroupNode
from hyperplan.actuation.kueue import KUEUE_API, KubeKueueWrites, KueueWrites
from hyperplan.runtime.store import WORKLOADS, WORKLOADS_INDEX, v1_node
from hyperplan.runtime.context import Runtime
from hyperplan.planning import admission

CHECKS_INDEX = "hp_kueue_checks"  # kopf's index of AdmissionChecks (wiring.kueue)
CHECKS = "admissionchecks"  # its kind in the watch cache
PLAN_KIND = "kueue-plan"  # the work queue's kind of the admission pass, keyed by plan
CHECK_KIND = "kueue-check"  # the work queue's kind of the check controller, keyed by AdmissionCheck


@dataclass
class KueueState:
    """What the Kueue controller knows and runs (see the module docstring for each field).

    ``writes``: the side effects (a recording fake in tests); ``executor``: the threads the passes' calls run on, not asyncio's default executor that the
    plan and group passes share: a burst of node creates for jobs must never hold up a block
    transition or a spare promotion. ``loop_thread`` is the thread the state was made on (the
    event loop's); every method that writes a field checks it.
    """

    checks: dict[str, str | None] = field(default_factory=dict)
    loops: set[str] = field(default_factory=set)
    job_workloads: dict[str, str] = field(default_factory=dict)
    unreadable: dict[str, set[Any]] = field(default_factory=dict)
    # Each plan's job-node record as its last pass left it (the plan's status holds it; this copy
    # serves the drain of a plan that is gone), and the unrecorded nodes already reported.
    job_records: dict[str, list[GroupNode]] = field(default_factory=dict)
    unrecorded: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    writes: KueueWrites | None = None
    executor: ThreadPoolExecutor = field(default_factory=lambda: threads.new_pool("kueue-admission"))
    loop_thread: int = field(default_factory=threading.get_ident)

    def on_loop(self) -> None:
        """Refuse to write the state from any thread but the event loop's."""
        if threading.get_ident() != self.loop_thread:
            raise RuntimeError(f"KueueState written from thread {threading.current_thread().name}, "
                               "not the event loop's: a thread returns values, the loop applies them")

    async def call(self, fn, *args):
        """``fn(*args)`` on this controller's threads, with the caller's context (kopf's event
        poster lives in context variables)."""
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, functools.partial(context.run, fn, *args))

    # ------------------------------------------------------------------ checks

    def checks_of(self, plan: str) -> list[str]:
        return sorted(c for c, p in self.checks.items() if p == plan)

    def serve_check(self, name: str, plan: str | None) -> None:
        """A check of ours, as its watch event showed it (``plan``: what its parameters name)."""
        self.on_loop()
        self.checks[name] = plan

    def drop_check(self, name: str) -> None:
        """The check is gone, or no longer ours."""
        self.on_loop()
        self.checks.pop(name, None)

    # ------------------------------------------------------------------ loops

    def ensure_loop(self, rt: Runtime, plan: str) -> None:
        """Pass over ``plan`` now, and from now on whenever it is woken or falls due."""
        self.on_loop()
        self.loops.add(plan)
        rt.queue.wake(PLAN_KIND, plan)

    def end_loop(self, plan: str) -> None:
        self.on_loop()
        self.loops.discard(plan)

    def wake(self, rt: Runtime, plan: str) -> None:
        """Pass over ``plan`` again if its loop runs."""
        if plan in self.loops:
            rt.queue.wake(PLAN_KIND, plan)

    def wake_checks_of(self, rt: Runtime, plan: str) -> None:
        """The checks that name ``plan`` look at their ``Active`` condition again."""
        for check in self.checks_of(plan):
            rt.queue.wake(CHECK_KIND, check)

    # ------------------------------------------------------------------ job nodes

    def note_unreadable(self, plan: str, findings: Iterable[Any]) -> list[Any]:
        """The pass found ``findings`` (``planning.reading.Finding``) on ``plan``'s job nodes: those
        the last pass did not find, each reported once (one that goes and comes back is new again)."""
        self.on_loop()
        return _first_seen(self.unreadable, plan, findings)

    def note_unrecorded(self, plan: str, nodes: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """``plan``'s nodes (name, uid) that wear its job labels but are not in its record: those the
        last pass did not find, each reported once."""
        self.on_loop()
        return _first_seen(self.unrecorded, plan, nodes)

    def note_job_record(self, plan: str, record: list[GroupNode] | None) -> None:
        self.on_loop()
        if record:
            self.job_records[plan] = list(record)
        else:
            self.job_records.pop(plan, None)

    def note_job_workloads(self, plan: str, workloads: Iterable[str], *, complete: bool) -> None:
        """The workloads that run on ``plan``'s job nodes; ``complete``: these are all of them
        (the others no longer run there)."""
        self.on_loop()
        on_nodes = set(workloads)
        if complete:
            for workload, of_plan in list(self.job_workloads.items()):
                if of_plan == plan and workload not in on_nodes:
                    self.job_workloads.pop(workload, None)
        for workload in on_nodes:
            self.job_workloads[workload] = plan


def _first_seen(seen: dict[str, set[Any]], plan: str, found: Iterable[Any]) -> list[Any]:
    """Of ``found`` (in order, once each), those ``seen[plan]`` did not hold; ``seen[plan]`` becomes
    ``found`` (dropped when empty), so one that goes and comes back is new again."""
    now = list(dict.fromkeys(found))
    fresh = [f for f in now if f not in seen.get(plan, set())]
    if now:
        seen[plan] = set(now)
    else:
        seen.pop(plan, None)
    return fresh


def check_object(rt: Runtime, name: str) -> dict[str, Any] | None:
    """The AdmissionCheck as its last watch event (or our newer write) showed it."""
    return rt.cache.get(CHECKS_INDEX, CHECKS, name)


def workloads_with(rt: Runtime, check: str) -> list[dict[str, Any]]:
    """The Workloads that carry ``check`` (from the index, or our newer write)."""
    return rt.cache.objects(WORKLOADS_INDEX, WORKLOADS, ("check", check))


def workload(rt: Runtime, label_value: str) -> dict[str, Any] | None:
    """The Workload whose ``hyperplan.dev/workload`` label value is ``label_value``."""
    found = rt.cache.objects(WORKLOADS_INDEX, WORKLOADS, ("workload", label_value))
    return found[0] if found else None


def job_nodes(rt: Runtime, plan_label: str) -> list[client.V1Node] | None:
    """The plan's job nodes from the node store (a copy, by name), or None when they are to be
    listed from the API: right after a pass that wrote to them."""
    if rt.cache.must_list_nodes("job", plan_label):
        return None
    return [v1_node(n) for n in rt.cache.job_nodes(plan_label)]


def state_of(rt: Runtime) -> KueueState:
    """The Kueue controller's memory, which the runtime holds for it (made on first use)."""
    if rt.kueue is None:
        rt.kueue = KueueState(writes=KubeKueueWrites(rt.kube))
    assert isinstance(rt.kueue, KueueState)
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
                   "admissionChecks": [dict(c) for c in status.get("admissionChecks") or []],
                   "assignedNodes": list(admission.assigned_hostnames(body))},
    }


def slim_check(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("name", "generation", "resourceVersion") if meta.get(k) is not None},
            "spec": dict(body.get("spec") or {}),
            "status": {"conditions": [dict(c) for c in (body.get("status") or {}).get("conditions") or []]}}
