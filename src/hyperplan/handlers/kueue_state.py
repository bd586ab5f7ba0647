"""What the Kueue controller knows: :class:`KueueState`, its one owner of state.

Every field of :class:`KueueState` is written on the event loop only, through its methods,
which refuse to run on any other thread: the passes (:mod:`hyperplan.handlers.kueue` and
:mod:`hyperplan.handlers.kueue_checks`) hand values to worker threads and apply what the
threads return. Reads are on the event loop too, so the kopf indexes and the node store (which
the event loop changes) are copied where they are read, and the copies are what threads get.

What is kept and why:

* ``checks`` and ``check_bodies``: the AdmissionChecks served, each as its last watch event (or
  our last write) showed it; the check controller reads them, so no pass reads a check from the
  API;
* ``loops``: the plans the admission pass runs for (keys of the work queue), those the checks
  name and those with job nodes left;
* ``written``: the Workloads as our own writes returned them, preferred while newer than the
  index's copy (the watch event of a write comes later), and ``nodes_wrote``: the plans whose
  last pass wrote to their job nodes (their next pass lists the nodes from the API once, so it
  never acts on a view older than its own writes);
* ``job_workloads``: which plan's job nodes a workload (label value) runs on, so that a change
  of that Workload wakes the plan even when no check of it is left.
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

from hyperplan.actuation.kueue import KUEUE_API, KubeKueueWrites, KueueWrites
from hyperplan.handlers.cache import v1_node
from hyperplan.handlers.context import Runtime

PLAN_KIND = "kueue-plan"  # the work queue's kind of the admission pass, keyed by plan
CHECK_KIND = "kueue-check"  # the work queue's kind of the check controller, keyed by AdmissionCheck


def resource_version(obj: Mapping[str, Any] | None) -> int:
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion") or -1)
    except (TypeError, ValueError):
        return -1


@dataclass
class KueueState:
    """What the Kueue controller knows and runs (see the module docstring for each field).

    ``workloads`` is the kopf index of Workloads, ``job_nodes`` the node store's view by plan
    (both bound at startup); ``writes`` the side effects (a recording fake in tests);
    ``executor`` the threads the passes' calls run on, not asyncio's default executor that the
    plan and group passes share: a burst of node creates for jobs must never hold up a block
    transition or a spare promotion. ``loop_thread`` is the thread the state was made on (the
    event loop's); every method that writes a field checks it.
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

    def serve_check(self, name: str, plan: str | None, body: Mapping[str, Any]) -> None:
        """A check of ours as a watch event showed it (``plan``: what its parameters name)."""
        self.on_loop()
        self.checks[name] = plan
        slim = slim_check(body)
        if resource_version(slim) >= resource_version(self.check_bodies.get(name)):
            self.check_bodies[name] = slim

    def drop_check(self, name: str) -> None:
        """The check is gone, or no longer ours."""
        self.on_loop()
        self.checks.pop(name, None)
        self.check_bodies.pop(name, None)

    def wrote_check(self, name: str, returned: Mapping[str, Any] | None, condition: dict[str, Any]) -> None:
        """Our write of the check's ``Active`` condition: keep what the API server returned, or
        (when it returned nothing) what we wrote, until a newer watch event."""
        self.on_loop()
        if name not in self.checks:  # dropped while the write was on its way
            return
        known = self.check_bodies.get(name)
        if returned is not None and resource_version(returned) > resource_version(known):
            self.check_bodies[name] = slim_check(returned)
        elif known is not None and returned is None:  # what we wrote is what the check says now
            others = [c for c in known["status"]["conditions"] if c.get("type") != "Active"]
            self.check_bodies[name] = {**known, "status": {"conditions": [*others, condition]}}

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

    # ------------------------------------------------------------------ Workloads (no API call)

    def _fresh(self, wl: dict[str, Any]) -> dict[str, Any]:
        meta = wl.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        mine = self.written.get(key)
        if mine is None:
            return wl
        if resource_version(wl) >= resource_version(mine):  # the watch caught up with our write
            self.on_loop()
            self.written.pop(key, None)
            return wl
        return mine

    def _index(self) -> Mapping[Any, Any]:
        if self.workloads is None:
            raise RuntimeError("the Workload index is read before kopf started (not bound)")
        return self.workloads

    def workloads_with(self, check: str) -> list[dict[str, Any]]:
        """The Workloads that carry ``check`` (from the index, or our newer write)."""
        return [self._fresh(w) for w in list(self._index().get(("check", check)) or [])]

    def workload(self, label_value: str) -> dict[str, Any] | None:
        """The Workload whose ``hyperplan.dev/workload`` label value is ``label_value``."""
        found = list(self._index().get(("workload", label_value)) or [])
        return self._fresh(found[0]) if found else None

    def wrote_workload(self, obj: Mapping[str, Any] | None) -> None:
        if obj:
            self.on_loop()
            slim = slim_workload(obj)
            meta = slim["metadata"]
            key = (meta.get("namespace", ""), meta.get("name", ""))
            if resource_version(slim) > resource_version(self.written.get(key)):
                self.written[key] = slim

    def workload_gone(self, namespace: str, name: str) -> None:
        self.on_loop()
        self.written.pop((namespace, name), None)  # nothing of it is kept once it is gone

    # ------------------------------------------------------------------ job nodes

    def indexed_job_nodes(self, plan_label: str) -> list[client.V1Node] | None:
        """The plan's job nodes from the node store (a copy, by name), or None when they are to
        be listed from the API: right after a pass that wrote to them (the watch events of those
        writes may still be on their way)."""
        if plan_label in self.nodes_wrote or self.job_nodes is None:
            return None
        return [v1_node(n) for n in sorted(list(self.job_nodes.get(plan_label) or []),
                                           key=lambda n: n["metadata"]["name"])]

    def note_nodes_wrote(self, plan_label: str, wrote: bool) -> None:
        self.on_loop()
        if wrote:
            self.nodes_wrote.add(plan_label)
        else:
            self.nodes_wrote.discard(plan_label)

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
