"""One pass of the Kueue AdmissionCheck controller (handlers/kueue*.py), with recording fakes.

The pass reads the plan from a fake watch cache, the Workloads and job nodes from kopf-shaped
indexes (dicts of lists, filled by the real index functions), and writes through
:class:`hyperplan_testing.fakes.RecordingKueueWrites`, a :class:`FakeProvider` and
:class:`FakeNodePods`. ``rt.kube`` is None: any API call a pass made would fail the test.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from hyperplan_testing.fakes import FakeNodePods, FakeProvider, RecordingKueueWrites
from hyperplan.actuation.kueue import KueueWrites
from hyperplan.actuation import jobnodes
from hyperplan.wiring import kueue
from hyperplan.controllers.kueue import admission as kueue_admission
from hyperplan.controllers.kueue import checks as kueue_checks
from hyperplan.api.models import GroupNode
from hyperplan.runtime.store import GROUPS, NODES, PLANS, POOLS, WatchCache, slim_object, v1_node
from hyperplan.wiring.events import hp_plans
from hyperplan.controllers.kueue.state import (
    CHECK_KIND, CHECKS, CHECKS_INDEX, PLAN_KIND, WORKLOADS, WORKLOADS_INDEX, KueueState, slim_check, slim_workload,
    workloads_with,
)
from hyperplan.runtime.nodewatch import NodeChange, NodeStore
from hyperplan.runtime.workqueue import WorkQueue
from hyperplan.planning import naming
from hyperplan.planning import trainingjobs
from hyperplan.planning.naming import TopologyKeys
from hyperplan.planning.policy import get_policy

NOW = datetime(2027, 1, 1, 12, 0, tzinfo=timezone.utc)
PLAN, CHECK, NS = "llama", "llama-check", "team"
ITYPE = "ml.p5.48xlarge"
BLOCK = "rc-a"


async def plan_event(rt, name: str, type_: str | None) -> None:
    """A plan's watch event as the Kueue controller hears it: through its listener of
    ``wiring.events.plan_event`` (on the event loop, as kopf calls it)."""
    kueue.plan_changed_for_admission(rt, name, type_)


def plan_obj(target: str = "training-job", **status: Any) -> dict[str, Any]:
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "TrainingPlan",
            "metadata": {"name": PLAN, "uid": "plan-uid"},
            "spec": {"instanceType": ITYPE, "instanceCount": 8, "targetResource": target, "duration": "1d"},
            "status": {"phase": "Active", "reservedCapacity": [
                {"id": BLOCK, "availabilityZone": "us-east-1a", "instanceType": ITYPE, "instanceCount": 8,
                 "startTime": "2027-01-01T11:00:00Z", "endTime": "2027-01-02T11:00:00Z", "status": "Active"}],
                       **status}}


def pool_obj() -> dict[str, Any]:
    """The pool whose ledger holds the plan's block: the controller reads a plan's blocks there,
    not in the plan's status."""
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "CapacityPool", "metadata": {"name": "pool-a"},
            "spec": {"instanceType": ITYPE, "availabilityZone": "us-east-1a", "instanceCount": 8},
            "status": {"reservations": [{"trainingPlan": PLAN, "trainingPlanUid": "plan-uid",
                                         "reservedCapacityId": BLOCK, "startTime": "2027-01-01T11:00:00Z",
                                         "endTime": "2027-01-02T11:00:00Z", "instanceCount": 8}]}}


def workload(name: str, *, state: str = "Pending", admitted: bool = False, finished: bool = False,
             evicted: bool = False, pods: int = 2, check: str = CHECK, created: str = "2027-01-01T11:30:00Z",
             rv: str = "10") -> dict[str, Any]:
    conditions = [{"type": "QuotaReserved", "status": "True"}]
    if admitted:
        conditions.append({"type": "Admitted", "status": "True"})
    if finished:
        conditions.append({"type": "Finished", "status": "True"})
    if evicted:
        conditions.append({"type": "Evicted", "status": "True"})
    entry: dict[str, Any] = {"name": check, "state": state, "lastTransitionTime": created}
    if state == "Ready":
        entry["podSetUpdates"] = [{"name": "main", "labels": {naming.LABEL_RESERVED_CAPACITY: BLOCK},
                                   "nodeSelector": {trainingjobs.LABEL_TRUSTED_WORKLOAD: trainingjobs.workload_label_value(NS, name)}}]
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": rv,
                         "creationTimestamp": created},
            "spec": {"podSets": [{"name": "main", "count": pods, "template": {"spec": {"containers": [
                {"name": "train", "resources": {"requests": {"nvidia.com/gpu": "8"}}}]}}}]},
            "status": {"conditions": conditions, "admissionChecks": [entry]}}


def job_node(slot: str, workload_name: str, *, keep_alive_until: str | None = None) -> dict[str, Any]:
    name = naming.node_name(PLAN, BLOCK, slot)
    annotations = {trainingjobs.ANNOTATION_KEEP_ALIVE_UNTIL: keep_alive_until} if keep_alive_until else {}
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": {
        naming.LABEL_PLAN: naming.label_value(PLAN), naming.LABEL_RESERVED_CAPACITY: naming.label_value(BLOCK),
        naming.LABEL_SLOT: slot, trainingjobs.LABEL_WORKLOAD: trainingjobs.workload_label_value(NS, workload_name) if workload_name else ""},
        "annotations": annotations}, "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def check_body(name: str = CHECK, controller: str = "hyperplan.dev/training-plan", plan: str = PLAN) -> dict:
    return {"metadata": {"name": name, "generation": 1, "resourceVersion": "5"},
            "spec": {"controllerName": controller,
                     "parameters": {"apiGroup": "hyperplan.dev", "kind": "TrainingPlan", "name": plan}},
            "status": {"conditions": [{"type": "Active", "status": "True", "reason": "PlanFound",
                                       "message": f"serving training plan {plan} (training-job)",
                                       "lastTransitionTime": "2027-01-01T10:00:00Z"}]}}


def index(workloads: list[dict]) -> dict:
    """The Workload index as kopf holds it, filled by the real index function."""
    out: dict = {}
    for wl in workloads:
        for key, value in asyncio.run(kueue.hp_kueue_workloads(namespace=wl["metadata"]["namespace"],
                                                            name=wl["metadata"]["name"], body=wl)).items():
            out.setdefault(key, []).append(value)
    return out


def runtime(plan: dict | None, workloads: list[dict], nodes: list[dict], *, checks: tuple[str, ...] = (CHECK,),
            pods: dict[str, list[str]] | None = None, guarded: set[str] = frozenset(),
            writes: KueueWrites | None = None, pools: tuple[dict, ...] | None = None,
            recorded: bool = True) -> SimpleNamespace:
    """A runtime whose watch cache is the real one, over kopf-shaped indexes filled by the real
    index functions (``indexes``: the Kueue ones, for a test to change as kopf would).
    ``recorded``: the plan's record (``status.jobNodes``) holds ``nodes``, as hyperplan made them;
    without the plan, the controller's copy of its last record does."""
    entries = [{"name": n["metadata"]["name"], "uid": n["metadata"]["uid"], "nodeId": n["metadata"]["name"]}
               for n in nodes] if recorded else []
    if plan is not None and recorded:
        plan = {**plan, "status": {**plan.get("status", {}), "jobNodes": entries}}
    provider = FakeProvider(clock=lambda: NOW)
    for n in nodes:
        provider.nodes[n["metadata"]["name"]] = v1_node(n)
    state = KueueState(writes=writes or RecordingKueueWrites())
    if plan is not None:
        state.writes.plans[PLAN] = plan
    if plan is None and entries:
        state.job_records[PLAN] = [GroupNode.model_validate(e) for e in entries]
    for c in checks:
        state.checks[c] = PLAN
        state.loops.add(PLAN)  # as check_changed leaves it
    store = NodeStore()
    for n in nodes:
        store.apply("ADDED", n)
    cache = WatchCache()
    cache.bind({PLANS: {PLAN: [asyncio.run(hp_plans(name=PLAN, body=plan))[PLAN]]} if plan else {},
                POOLS: {p["metadata"]["name"]: [slim_object(p)] for p in ((pool_obj(),) if pools is None else pools)},
                GROUPS: {}, NODES: store})
    indexes = {WORKLOADS_INDEX: index(workloads),
               CHECKS_INDEX: {c: [asyncio.run(kueue.hp_kueue_checks(name=c, body=check_body(c)))[c]] for c in checks}}
    cache.add_kind(WORKLOADS, WORKLOADS_INDEX, indexes[WORKLOADS_INDEX], slim_workload)
    cache.add_kind(CHECKS, CHECKS_INDEX, indexes[CHECKS_INDEX], slim_check)
    return SimpleNamespace(cache=cache, indexes=indexes, clock=lambda: NOW,
                           policy=get_policy("sagemaker"), keys=TopologyKeys(), queue=WorkQueue(), kueue=state,
                           providers={"kwok": provider}, pods=FakeNodePods(pods=dict(pods or {}), guarded=set(guarded)),
                           kube=None)


async def check_event(rt: SimpleNamespace, body: dict, type: str) -> None:
    """A check's watch event: kopf updates its index, then calls the handler."""
    name = body["metadata"]["name"]
    if type == "DELETED":
        rt.indexes[CHECKS_INDEX].pop(name, None)
    else:
        rt.indexes[CHECKS_INDEX][name] = [(await kueue.hp_kueue_checks(name=name, body=body))[name]]
    await kueue.check_changed(rt, name, body, type)


def run_pass(rt: SimpleNamespace) -> datetime | None:
    async def go() -> datetime | None:
        return await kueue_admission.reconcile_plan_workloads(rt, PLAN)
    return asyncio.run(go())


def writes_of(rt) -> RecordingKueueWrites:
    return rt.kueue.writes


# --------------------------------------------------------------------------- an unreadable plan


@pytest.mark.parametrize("broken", [
    {"targetResource": "cluster-of-dreams"},
    {"instanceCount": 3},
    {"keepAlivePeriodSeconds": -1},
], ids=["unknown-target", "instance-count-not-allowed", "negative-keep-alive"])
def test_an_unreadable_plan_fails_the_pass_instead_of_rejecting_workloads(broken: dict) -> None:
    plan = plan_obj()
    plan["spec"].update(broken)
    rt = runtime(plan, [workload("train")], [job_node("0", "train")])
    with pytest.raises(ValueError, match="training plan llama cannot be read"):
        run_pass(rt)
    w = writes_of(rt)
    assert (w.entries, w.actives, w.events, w.node_workloads) == ([], [], [], [])
    assert rt.providers["kwok"].calls == [] and rt.pods.calls == []  # its job nodes are left alone


# --------------------------------------------------------------------------- failed writes


@pytest.mark.parametrize("status, logged", [(500, True), (409, True), (404, False)],
                         ids=["server-error", "conflict", "workload-gone"])
def test_one_workloads_failed_write_does_not_abort_the_pass(status: int, logged: bool, caplog) -> None:
    first = workload("first", created="2027-01-01T11:00:00Z")
    second = workload("second", created="2027-01-01T11:10:00Z")
    rt = runtime(plan_obj(), [first, second], [], writes=RecordingKueueWrites(refuse={"team/first": status}))
    run_pass(rt)
    w = writes_of(rt)
    assert [(key, e["state"]) for key, e in w.entries] == [("team/second", "Ready")]
    assert [(obj, reason) for obj, _, reason, _ in w.events if obj.startswith("team/")] == \
        [("team/second", "AdmissionCheckReady")]
    assert ("writing check llama-check failed" in caplog.text) is logged
    # The refused workload's instances are still counted: the second is admitted beside it, and
    # the job nodes are made for both (the first's write is retried by the next pass).
    made = sorted(n.metadata.labels[trainingjobs.LABEL_WORKLOAD] for n in rt.providers["kwok"].nodes.values())
    assert made == ["team.first"] * 2 + ["team.second"] * 2


# --------------------------------------------------------------------------- released nodes wait for pods


@pytest.mark.parametrize("pods, guarded, released", [
    ({}, set(), True),
    ({"NODE": ["team/old-0"]}, set(), True),            # evicted now, gone at once
    ({"NODE": ["team/old-0"]}, {"team/old-0"}, False),  # still stopping (or a budget holds it)
], ids=["no-pods", "pods-evicted-at-once", "pods-still-stopping"])
def test_a_released_job_node_waits_for_its_pods(pods: dict, guarded: set, released: bool) -> None:
    node = job_node("0", "old")
    name = node["metadata"]["name"]
    pods = {name if k == "NODE" else k: v for k, v in pods.items()}
    rt = runtime(plan_obj(), [], [node], pods=pods, guarded=guarded)
    plan, schedule = kueue_admission.admission_plan(rt, kueue_admission.plan_object(rt, PLAN), NOW)[1]
    wake, left = asyncio.run(kueue_admission.reconcile_job_nodes(rt, PLAN, plan, schedule, [], NOW))
    assert ("evict", name) in rt.pods.calls
    assert (name not in rt.providers["kwok"].nodes) is released
    assert left == (0 if released else 1)
    removed = [m for _, _, reason, m in writes_of(rt).events if reason == "NodeRemoved"]
    assert bool(removed) is released
    if not released:
        assert wake == NOW + timedelta(seconds=1)  # looked at again shortly


# --------------------------------------------------------------------------- checks handed over or deleted


@pytest.mark.parametrize("event_type, controller", [
    ("MODIFIED", "example.com/another-controller"),
    ("DELETED", "hyperplan.dev/training-plan"),
], ids=["handed-to-another-controller", "deleted"])
def test_a_check_no_longer_ours_is_no_longer_served(event_type: str, controller: str) -> None:
    rt = runtime(plan_obj(), [workload("train")], [])

    async def go() -> None:
        await check_event(rt, check_body(controller=controller), event_type)
        assert rt.queue.woken(PLAN_KIND, PLAN)  # its plan's loop looks again
        await kueue_admission.reconcile_plan_workloads(rt, PLAN)
        await kueue_checks.reconcile_check(rt, CHECK)
    asyncio.run(go())
    assert CHECK not in rt.kueue.checks
    w = writes_of(rt)
    assert (w.entries, w.actives) == ([], [])  # neither its workloads nor the check itself are written


# --------------------------------------------------------------------------- the loop's end


@pytest.mark.parametrize("nodes, check_arrives, stops", [
    ([], False, True),
    ([], True, False),
    ([job_node("0", "train")], False, False),
], ids=["still-unnamed-stops", "named-meanwhile-keeps-running", "running-job-keeps-it"])
def test_a_plan_loop_stops_only_when_still_unnamed(nodes: list, check_arrives: bool, stops: bool) -> None:
    running = workload("train", state="Ready", admitted=True)
    rt = runtime(plan_obj(), [running], nodes, checks=())
    state = rt.kueue
    state.loops.add(PLAN)
    real_call = state.call

    async def call(fn, *args):
        out = await real_call(fn, *args)
        if check_arrives and fn is jobnodes.apply_job_nodes:  # a check naming the plan comes meanwhile
            state.checks["late-check"] = PLAN
        return out

    state.call = call
    wake = run_pass(rt)
    assert (PLAN in state.loops) is not stops
    if stops:
        assert wake is None  # no timer is left for it either


# --------------------------------------------------------------------------- the last check deleted (task 2)


@pytest.mark.parametrize("train, kept", [
    (dict(admitted=True), True),
    (dict(admitted=True, finished=True), False),
    (dict(admitted=True, evicted=True), False),
    (None, False),
], ids=["still-running-keeps-its-nodes", "finished-releases", "evicted-releases", "workload-gone-releases"])
def test_deleting_the_last_check_keeps_a_running_workloads_nodes(train: dict | None, kept: bool) -> None:
    nodes = [job_node("0", "train"), job_node("1", "train")]
    workloads = [workload("train", state="Ready", **train)] if train is not None else []
    rt = runtime(plan_obj(), workloads, nodes, checks=())
    rt.kueue.loops.add(PLAN)
    run_pass(rt)
    left = set(rt.providers["kwok"].nodes)
    assert (left == {n["metadata"]["name"] for n in nodes}) is kept
    assert (left == set()) is not kept
    assert (PLAN in rt.kueue.loops) is kept  # the loop goes on while the job runs on its nodes
    if kept:
        assert rt.pods.calls == []  # nothing evicted
        assert rt.kueue.job_workloads == {"team.train": PLAN}  # its Workload's changes wake the plan
        assert kueue.plans_to_wake(rt.kueue, NS, "train", {"status": {}}) == {PLAN}


def test_a_running_workload_without_a_check_holds_its_room_against_new_ones() -> None:
    """6 of the block's 8 instances run a workload whose check is gone; a new one needing 4 waits."""
    nodes = [job_node(str(i), "old") for i in range(6)]
    old = workload("old", state="Ready", admitted=True, pods=6, check="deleted-check")
    rt = runtime(plan_obj(), [old, workload("new", pods=4)], nodes)
    run_pass(rt)
    w = writes_of(rt)
    assert [(k, e["state"]) for k, e in w.entries] == [("team/new", "Retry")]
    assert "other admitted workloads hold 6, 2 free" in w.entries[0][1]["message"]
    assert len(rt.providers["kwok"].nodes) == 6 and rt.pods.calls == []


# --------------------------------------------------------------------------- no API reads on the hot path


def test_a_pass_reads_nothing_from_the_api_until_it_has_written_nodes() -> None:
    """``rt.kube`` is None: a pass reads the checks, Workloads and job nodes from what the watches
    hold. Only after a pass that wrote to the job nodes does the next list them, once."""
    rt = runtime(plan_obj(), [workload("train")], [])
    run_pass(rt)
    w = writes_of(rt)
    assert w.listed == []
    assert [(k, e["state"]) for k, e in w.entries] == [("team/train", "Ready")]
    assert len(rt.providers["kwok"].nodes) == 2
    w.nodes = list(rt.providers["kwok"].nodes.values())  # what the API now says
    run_pass(rt)
    assert w.listed == [naming.label_value(PLAN)] * 2  # this pass: once for the outside holders, once for the nodes
    run_pass(rt)  # nothing written by the previous pass: back to the index
    assert w.listed == [naming.label_value(PLAN)] * 2


def test_our_own_write_is_preferred_over_an_older_watched_copy() -> None:
    rt = runtime(plan_obj(), [workload("train", rv="10")], [])
    rt.cache.wrote(WORKLOADS, workload("train", state="Ready", rv="11"))
    assert [w["status"]["admissionChecks"][0]["state"] for w in workloads_with(rt, CHECK)] == ["Ready"]
    rt.indexes[WORKLOADS_INDEX].update(index([workload("train", state="Ready", rv="12")]))  # the watch caught up
    assert workloads_with(rt, CHECK)[0]["metadata"]["resourceVersion"] == "12"
    assert rt.cache._written == {}


@pytest.mark.parametrize("plan_exists, has_loop, event_type, starts", [
    (True, False, "ADDED", True),
    (True, True, "MODIFIED", False),
    (False, False, "ADDED", False),
    (True, False, "DELETED", False),
], ids=["plan-without-loop-starts-one", "loop-running", "unknown-plan", "node-deleted"])
def test_a_job_node_of_a_plan_without_a_loop_starts_one(plan_exists, has_loop, event_type, starts) -> None:
    """After a restart with no check naming the plan, its job nodes still get a loop (released
    once no workload runs on them)."""
    rt = runtime(plan_obj() if plan_exists else None, [], [job_node("0", "train")], checks=())
    state = rt.kueue
    if has_loop:
        state.loops.add(PLAN)
    started: list[str] = []
    state.ensure_loop = lambda _rt, plan: started.append(plan)
    node = job_node("0", "train")
    kueue.job_node_changed(rt, NodeChange(event_type, node["metadata"]["name"], node["metadata"]["labels"], node))
    assert started == ([PLAN] if starts else [])


@pytest.mark.parametrize("event_type, has_loop, has_job_nodes, starts", [
    (None, False, True, True),
    (None, False, False, False),
    (None, True, True, False),
    ("MODIFIED", False, True, False),
], ids=["first-seen-with-job-nodes-starts-one", "first-seen-no-job-nodes", "loop-running", "later-event"])
def test_a_plan_first_seen_with_job_nodes_gets_a_loop(event_type, has_loop, has_job_nodes, starts) -> None:
    """After a restart the node store is listed before kopf lists the plans: the plan's first
    event starts the loop of a plan whose job nodes no check names any more."""
    rt = runtime(plan_obj(), [], [job_node("0", "train")] if has_job_nodes else [], checks=())
    state = rt.kueue
    if has_loop:
        state.loops.add(PLAN)
    started: list[str] = []
    state.ensure_loop = lambda _rt, plan: started.append(plan)
    asyncio.run(plan_event(rt, PLAN, event_type))
    assert started == ([PLAN] if starts else [])


# --------------------------------------------------------------------------- the check controller


def run_check_pass(rt: SimpleNamespace, name: str = CHECK) -> None:
    asyncio.run(kueue_checks.reconcile_check(rt, name))


def deleting(plan: dict) -> dict:
    return {**plan, "metadata": {**plan["metadata"], "deletionTimestamp": "2027-01-01T11:59:00Z"}}


@pytest.mark.parametrize("plan, parameters, written", [
    (plan_obj(), None, None),  # the check already says Active=True for it: no write
    (plan_obj(target="hyperpod-cluster"), None, ("True", "PlanFound", "serving training plan llama (hyperpod-cluster)")),
    (None, None, ("False", "PlanNotFound", "training plan llama does not exist")),
    (deleting(plan_obj()), None, ("False", "PlanNotFound", "training plan llama does not exist")),
    (plan_obj(), {"apiGroup": "hyperplan.dev", "kind": "TrainingPlan", "name": ""},
     ("False", "InvalidParameters", "spec.parameters.name is empty: it must name a TrainingPlan")),
], ids=["unchanged-writes-nothing", "target-changed", "plan-missing", "plan-being-deleted", "invalid-parameters"])
def test_the_check_pass_writes_active_once_when_it_changes(plan, parameters, written) -> None:
    rt = runtime(plan, [], [])
    body = check_body()
    if parameters is not None:
        body["spec"]["parameters"] = parameters
    asyncio.run(check_event(rt, body, "MODIFIED"))
    run_check_pass(rt)
    run_check_pass(rt)  # what it wrote is what the check now says: the second pass writes nothing
    w = writes_of(rt)
    assert [(c["status"], c["reason"], c["message"]) for _, c in w.actives] == ([written] if written else [])
    if written:
        condition = w.actives[0][1]
        same_status = written[0] == "True"
        assert condition["lastTransitionTime"] == ("2027-01-01T10:00:00Z" if same_status else "2027-01-01T12:00:00Z")
        assert rt.cache.get(CHECKS_INDEX, CHECKS, CHECK)["status"]["conditions"] == [condition]  # our write, kept


def test_an_unreadable_plan_fails_the_check_pass_and_leaves_active_alone() -> None:
    plan = plan_obj()
    plan["spec"]["targetResource"] = "cluster-of-dreams"
    rt = runtime(plan, [], [])
    with pytest.raises(ValueError, match="training plan llama cannot be read"):
        run_check_pass(rt)
    assert writes_of(rt).actives == []


def test_the_admission_pass_never_writes_active() -> None:
    """Even when the check's Active is stale (its plan is gone), only the check's own pass writes it."""
    rt = runtime(None, [workload("train")], [])
    run_pass(rt)
    assert writes_of(rt).actives == []
    run_check_pass(rt)
    assert [(c["status"], c["reason"]) for _, c in writes_of(rt).actives] == [("False", "PlanNotFound")]


@pytest.mark.parametrize("event, woken", [
    ("check-ours", {("kueue-check", CHECK), ("kueue-plan", PLAN)}),
    ("check-invalid-parameters", {("kueue-check", CHECK)}),
    ("check-not-ours", set()),
    ("plan-modified", {("kueue-check", CHECK), ("kueue-plan", PLAN)}),
    ("plan-first-seen", {("kueue-check", CHECK)}),
    ("plan-deleted", {("kueue-check", CHECK), ("kueue-plan", PLAN)}),
], ids=lambda v: v if isinstance(v, str) else None)
def test_what_each_event_wakes(event: str, woken: set) -> None:
    """A check's Active is a function of the check and its plan: an event of either wakes the
    check's key; the plans' loops are woken as before."""
    rt = runtime(plan_obj(), [], [])
    rt.kueue.loops.add(PLAN)
    if event.startswith("check-"):
        body = check_body(controller="example.com/other" if event == "check-not-ours" else "hyperplan.dev/training-plan")
        if event == "check-invalid-parameters":
            body["spec"]["parameters"] = {}
        rt.kueue.checks.clear()  # not served yet: this event is its first
        rt.kueue.loops.clear()
        asyncio.run(check_event(rt, body, "ADDED"))
    else:
        kind = {"plan-modified": "MODIFIED", "plan-first-seen": None, "plan-deleted": "DELETED"}[event]
        asyncio.run(plan_event(rt, PLAN, kind))
    keys = {(kind, name) for kind in (CHECK_KIND, PLAN_KIND) for name in (CHECK, PLAN)
            if rt.queue.woken(kind, name)}
    assert keys == woken


# --------------------------------------------------------------------------- state written on the event loop only


class Watched:
    """Records the thread of every change of a container of :class:`KueueState`."""

    threads: list[int]

    def _note(self) -> None:
        self.threads.append(threading.get_ident())


def watched(container: Any, threads: list[int]) -> Any:
    mutators = {dict: ("__setitem__", "__delitem__", "pop", "popitem", "setdefault", "update", "clear"),
                set: ("add", "discard", "remove", "pop", "update", "clear", "difference_update")}
    base = type(container)

    def wrap(name: str):
        def method(self, *args, **kwargs):
            self._note()
            return getattr(base, name)(self, *args, **kwargs)
        return method

    cls = type(f"Watched{base.__name__.title()}", (Watched, base), {n: wrap(n) for n in mutators[base]})
    out = cls(container)
    out.threads = threads
    return out


def drained_plan_nodes() -> SimpleNamespace:
    """The plan is gone: its two job nodes drain, one pod still on each."""
    nodes = [job_node("0", "train"), job_node("1", "train")]
    return runtime(None, [workload("train", state="Ready", admitted=True)], nodes, checks=(),
                   pods={n["metadata"]["name"]: [f"team/train-{i}"] for i, n in enumerate(nodes)})


@pytest.mark.parametrize("scenario", [
    lambda: runtime(plan_obj(), [workload("train"), workload("other", pods=8)], []),
    lambda: runtime(plan_obj(), [], [job_node("0", "old")], pods={naming.node_name(PLAN, BLOCK, "0"): ["team/old-0"]},
                    guarded={"team/old-0"}),
    lambda: runtime(plan_obj(), [workload("old", state="Ready", admitted=True, pods=2, check="deleted-check")],
                    [job_node("0", "old"), job_node("1", "old")]),
    drained_plan_nodes,
    lambda: runtime(None, [], []),
], ids=["admit-and-create-nodes", "release-waits-for-pods", "running-outside-checks", "plan-gone-drains",
        "check-of-missing-plan"])
def test_no_state_is_written_from_a_worker_thread(scenario) -> None:
    """Three passes (admission, then the check's, then admission again, which lists the nodes it
    wrote): every change of a KueueState field, and of the watch cache's write-through, happens on the event loop's thread, while the
    writes themselves ran on the controller's threads."""
    rt = scenario()
    state = rt.kueue
    threads: list[int] = []
    for owner, names in ((state, ("checks", "loops", "job_workloads")), (rt.cache, ("_written", "_nodes_wrote"))):
        for name in names:
            setattr(owner, name, watched(getattr(owner, name), threads))
    state.loops.add(PLAN)
    writers: set[str] = set()
    real_call = state.call

    async def call(fn, *args):
        def on_thread(*a):
            writers.add(threading.current_thread().name)
            return fn(*a)
        return await real_call(on_thread, *args)

    state.call = call
    writes_of(rt).nodes = list(rt.providers["kwok"].nodes.values())
    run_pass(rt)
    run_check_pass(rt)
    writes_of(rt).nodes = list(rt.providers["kwok"].nodes.values())
    run_pass(rt)
    assert writers and all(name.startswith("kueue-admission") for name in writers)
    assert threads, "no state was changed: the scenario proves nothing"
    assert set(threads) == {threading.get_ident()}


def test_a_state_method_refuses_to_run_on_another_thread() -> None:
    state = KueueState(writes=RecordingKueueWrites())
    with ThreadPoolExecutor(max_workers=1) as pool:
        with pytest.raises(RuntimeError, match="not the event loop's"):
            pool.submit(state.serve_check, CHECK, PLAN).result()
    assert state.checks == {}


# --------------------------------------------------------------------------- job-node actuation returns facts


@pytest.mark.parametrize("pods_left, deadline_passed, cordoned, released, reasons", [
    (False, False, False, True, ["Draining", "NodeRemoved"]),
    (True, False, False, False, ["Draining"]),
    (True, True, False, True, ["Draining", "NodeRemoved"]),
    (True, False, True, False, []),  # cordoned by an earlier pass: not again
], ids=["pods-gone-released", "pods-left-waits", "deadline-passed-released", "already-cordoned"])
def test_a_job_node_drains_through_drain_node(pods_left, deadline_passed, cordoned, released, reasons) -> None:
    node = job_node("0", "train")
    name = node["metadata"]["name"]
    if cordoned:
        node["spec"]["unschedulable"] = True
    rt = runtime(plan_obj(), [], [node], pods={name: ["team/train-0"]}, guarded={"team/train-0"} if pods_left else set())
    deadline = NOW - timedelta(seconds=1) if deadline_passed else NOW + timedelta(minutes=5)
    decision = trainingjobs.JobNodeDecision(drain=[trainingjobs.Drain(name, deadline, "block ends")])
    facts = jobnodes.apply_job_nodes(rt.providers["kwok"], rt.pods, writes_of(rt), decision, None,
                                     {name: v1_node(node)}, False, NOW)
    assert [reason for reason, _ in facts.events] == reasons
    assert facts.released == ({name} if released else set()) and facts.wrote
    assert (name in rt.providers["kwok"].nodes) is not released
    assert writes_of(rt).events == []  # facts, not posts: the pass posts them on the event loop
    assert rt.cache._nodes_wrote == set()  # and records them there


# --------------------------------------------------------------------------- unreadable keep-alive-until


@pytest.mark.parametrize("value, problem", [
    ("2027-01-01T13:00:00", "has no timezone"),
    ("tomorrow", "is not an RFC 3339 time"),
    ("2027-01-01T13:00:00Z", None),
], ids=["no-timezone", "not-a-time", "readable"])
def test_an_unreadable_keep_alive_until_is_reported_once_on_the_node_and_the_plan(value: str,
                                                                                 problem: str | None) -> None:
    node = job_node("0", "", keep_alive_until=value)
    name = node["metadata"]["name"]
    rt = runtime(plan_obj(), [], [node])

    run_pass(rt)
    run_pass(rt)  # the same value again: no second Event

    unreadable = [(obj, type_, message) for obj, type_, reason, message in writes_of(rt).events
                  if reason == "UnreadableValue"]
    if problem is None:
        assert unreadable == []
        return
    message = f"node {name}: annotation hyperplan.dev/keep-alive-until: {value!r} {problem}; ignored"
    assert unreadable == [(name, "Warning", message), (PLAN, "Warning", message)]


# --------------------------------------------------------------------------- blocks from the ledger, not the status


@pytest.mark.parametrize("pools, state, nodes", [
    pytest.param(None, "Ready", 2, id="the-ledger-holds-the-block-admits"),
    pytest.param((), "Retry", 0, id="a-block-only-in-the-plans-status-admits-nothing"),
])
def test_a_workload_is_admitted_only_on_a_block_the_ledger_holds(pools, state: str, nodes: int) -> None:
    """The plan's ``status.reservedCapacity`` (which whoever may write the status could forge)
    is not where the controller reads the plan's blocks: the pools' ledger is."""
    rt = runtime(plan_obj(), [workload("train")], [], pools=pools)
    run_pass(rt)
    entries = writes_of(rt).entries
    assert [(key, entry["state"]) for key, entry in entries] == [("team/train", state)]
    if state == "Retry":
        assert "is not bought yet" in entries[0][1]["message"]
    assert len(rt.providers["kwok"].nodes) == nodes


# --------------------------------------------------------------------------- job nodes by the plan's record


def warm_plan() -> dict[str, Any]:
    plan = plan_obj()
    plan["spec"]["keepAlivePeriodSeconds"] = 600
    return plan


@pytest.mark.parametrize("recorded, reused", [
    pytest.param(True, True, id="a-warm-node-hyperplan-made-is-reused-with-a-uid-guard"),
    pytest.param(False, False, id="a-node-labelled-as-warm-by-hand-gets-no-workload-and-no-write"),
])
def test_only_a_recorded_warm_node_is_reused(recorded: bool, reused: bool) -> None:
    warm = job_node("0", "", keep_alive_until="2027-01-01T12:05:00Z")
    name = warm["metadata"]["name"]
    rt = runtime(warm_plan(), [workload("train", pods=1)], [warm], recorded=recorded)
    run_pass(rt)
    w = writes_of(rt)
    created = [node for op, node in rt.providers["kwok"].calls if op == "create"]
    if reused:
        assert w.node_workloads == [(name, trainingjobs.workload_label_value(NS, "train"), None)]
        assert w.workload_uids == [(name, f"uid-{name}")]
        assert created == []
        assert not [e for e in w.events if e[2] == "NodeNotOwned"]
    else:
        assert w.node_workloads == []  # the forged node is never written
        assert created and name not in created  # the workload gets a node hyperplan makes
        assert [(obj, reason) for obj, _, reason, _ in w.events if reason == "NodeNotOwned"] == \
            [(name, "NodeNotOwned"), (PLAN, "NodeNotOwned")]
        run_pass(rt)  # reported once per node
        assert len([e for e in w.events if e[2] == "NodeNotOwned"]) == 2


def test_a_job_node_is_recorded_before_it_is_made_and_with_its_uid_after() -> None:
    rt = runtime(plan_obj(), [workload("train", pods=2)], [])
    run_pass(rt)
    w = writes_of(rt)
    made = sorted(node for op, node in rt.providers["kwok"].calls if op == "create")
    assert len(made) == 2
    (_, intent), (_, after) = w.record_writes
    assert sorted(e["nodeId"] for e in intent) == made and all(e.get("claim") and not e["uid"] for e in intent)
    assert sorted(e["name"] for e in after) == made and all(e["uid"] and not e.get("claim") for e in after)
    assert w.plans[PLAN]["status"]["jobNodes"] == after


def test_a_record_written_meanwhile_makes_no_node_and_looks_again_soon() -> None:
    rt = runtime(plan_obj(), [workload("train", pods=2)], [], writes=RecordingKueueWrites(record_conflicts=1))
    wake = run_pass(rt)
    assert [op for op, _ in rt.providers["kwok"].calls if op == "create"] == []
    assert wake is not None and wake <= NOW + timedelta(seconds=1)
    run_pass(rt)  # the next pass records and makes them
    assert len([op for op, _ in rt.providers["kwok"].calls if op == "create"]) == 2


def test_a_hyperpod_plans_room_counts_only_the_nodes_its_groups_record() -> None:
    """A node that wears the plan's and the block's labels but is in no group's record (a kubelet
    labelled its own Node so) adds no room for Kueue to admit onto."""
    block = naming.label_value(BLOCK)

    def node(name: str, uid: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "uid": uid, "labels": {
            naming.LABEL_PLAN: naming.label_value(PLAN), naming.LABEL_RESERVED_CAPACITY: block,
            naming.LABEL_ROLE: naming.ROLE_ACTIVE, naming.LABEL_GROUP: "g"}},
            "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}

    group = {"metadata": {"name": "g"}, "spec": {"trainingPlanRef": PLAN},
             "status": {"nodes": [{"name": "real", "uid": "uid-real", "nodeId": "real"},
                                  {"name": "stale", "uid": "uid-old", "nodeId": "stale"}]}}
    nodes = [node("real", "uid-real"), node("forged", "uid-forged"), node("stale", "uid-new")]
    cache = SimpleNamespace(groups=lambda: [group], block_nodes=lambda label: nodes if label == block else [])
    rt = SimpleNamespace(cache=cache, keys=TopologyKeys())
    assert kueue_admission.ready_group_nodes(rt, PLAN, BLOCK) == 1
