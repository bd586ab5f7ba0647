"""The real group pass (controllers.group.reconciler.reconcile_group) against a Runtime of recording fakes.

The group and its plan live in a FakeKube, the nodes in a FakeProvider that the node store lists
before each pass (tests/unit/fake_runtime.py); the plan's wakes go to the real WorkQueue, not
started, so a wake stays readable as ``queue.woken``. The block and times are those of
tests/unit/test_groups.py: the demo policy, a two-UltraServer block from T0 to T0 + 3 min.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from hyperplan.actuation.providers.base import LABEL_NODE_ID, taints_of
from hyperplan.api.models import CapacityPool
from hyperplan.api.vocabulary import FINALIZER, GROUP_FINALIZER, ULTRASERVER_INSTANCE_TYPE
from hyperplan.controllers.group.reconciler import ADOPTION_RETRY, drain_group, reconcile_group
from hyperplan.runtime.workqueue import WorkQueue
from hyperplan.planning import health
from hyperplan.planning import naming
from hyperplan.planning.memory import GroupMemory
from hyperplan.planning.policy import DEMO
from tests.unit.fake_runtime import GROUPS_PLURAL, World, make_world

UTC = timezone.utc
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(seconds=10)
TERMINATION = T0 + timedelta(minutes=3) - timedelta(seconds=20)  # demo: instances stop 20 s before the end
CHECKPOINT = TERMINATION - timedelta(seconds=5)  # demo: workloads are asked to checkpoint 5 s ahead
GRACE = timedelta(seconds=5)
X72 = "ml.u-p6e-gb200x72"
PLAN, GROUP = "p", "w"
H = "c64f9691"  # 8 hex of sha256("rc-abc-0"): the block part of node names
ACTIVE = [f"hp-w-{H}-0-0", f"hp-w-{H}-0-1"]
SPARE = f"hp-w-{H}-0-2"  # the spare of the group's UltraServer (fill-first: both actives on us-0)


def plan() -> dict[str, Any]:
    block = {"id": "rc-abc-0", "availabilityZone": "use1-az3", "instanceType": ULTRASERVER_INSTANCE_TYPE,
             "instanceCount": 36, "startTime": "2026-12-01T12:00:00Z", "endTime": "2026-12-01T12:03:00Z",
             "ultraServerType": X72, "ultraServerCount": 2}
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "TrainingPlan",
            "metadata": {"name": PLAN, "uid": "uid-p", "generation": 1},
            "spec": {"ultraServerType": X72, "ultraServerCount": 2, "targetResource": "hyperpod-cluster",
                     "duration": "3m"},
            "status": {"phase": "Active", "reservedCapacity": [block]}}


def pool() -> CapacityPool:
    """The pool whose ledger holds the plan's block: a group reads its plan's blocks there, not
    in the plan's status."""
    return CapacityPool.model_validate({
        "metadata": {"name": "pool-x72"},
        "spec": {"instanceType": ULTRASERVER_INSTANCE_TYPE, "availabilityZone": "use1-az3", "instanceCount": 36,
                 "ultraServerType": X72},
        "status": {"reservations": [{"trainingPlan": PLAN, "trainingPlanUid": "uid-p", "reservedCapacityId": "rc-abc-0",
                                     "startTime": "2026-12-01T12:00:00Z", "endTime": "2026-12-01T12:03:00Z",
                                     "instanceCount": 36}]}})


def group(finalizers: tuple[str, ...] = (GROUP_FINALIZER,), **spec: Any) -> dict[str, Any]:
    # rebootBudget 0: a failed node is replaced at once (the ladder's reboots: test_a_failed_node_is_rebooted_*).
    fields = {"trainingPlanRef": PLAN, "instanceType": ULTRASERVER_INSTANCE_TYPE, "instanceCount": 2,
              "healthCheck": {"graceSeconds": 5, "maxUnhealthy": 2, "rebootBudget": 0}, **spec}
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "InstanceGroup",
            "metadata": {"name": GROUP, "uid": "uid-w", "generation": 1, "finalizers": list(finalizers),
                         "creationTimestamp": "2026-12-01T11:00:00Z"},
            "spec": fields}


@pytest.fixture
def worlds(monkeypatch: pytest.MonkeyPatch):
    made: list[World] = []

    def make(*groups: dict[str, Any]) -> World:
        world = make_world(monkeypatch, NOW, DEMO, plans=[plan()], groups=list(groups or [group()]), pools=[pool()])
        made.append(world)
        return world
    yield make
    for world in made:
        world.close()


def run(world: World) -> datetime | None:
    """One pass over the group once the node watch has caught up, on a fresh queue (so ``woken``
    tells what this pass woke, not what the node events did), the recorders emptied first."""
    world.list_nodes()
    world.rt.queue = WorkQueue(lambda: world.now)
    world.calls.clear()
    world.events.clear()
    world.provider.calls.clear()
    world.pods.calls.clear()
    return world.run(reconcile_group, GROUP)


def set_ready(world: World, node: str, status: str, since: datetime) -> None:
    world.provider.nodes[node].status = client.V1NodeStatus(conditions=[
        client.V1NodeCondition(type="Ready", status=status, last_transition_time=since)])


def running(world: World) -> None:
    """The group's three nodes made by a first pass at the block start, Ready since then."""
    world.now = T0
    run(world)
    for node in world.provider.nodes:
        set_ready(world, node, "True", T0)
    world.now = NOW
    run(world)  # the pass that sees them Ready


def patches(world: World) -> list[dict[str, Any]]:
    return world.status_patches(GROUPS_PLURAL)


# --------------------------------------------------------------------------- the finalizer guard


@pytest.mark.parametrize("finalizers, written", [
    ((GROUP_FINALIZER,), None),
    ((), [GROUP_FINALIZER]),
    ((FINALIZER,), [GROUP_FINALIZER]),
    (("example.com/keep", FINALIZER), ["example.com/keep", GROUP_FINALIZER]),
], ids=["with-the-operators-finalizer-writes-none", "without-one-puts-it-on-first",
        "kopfs-finalizer-of-earlier-versions-is-replaced", "anyone-elses-finalizer-is-kept"])
def test_the_operators_finalizer_is_on_the_group_before_any_node_is_made(worlds, finalizers, written) -> None:
    world = worlds(group(finalizers=finalizers))

    assert run(world) == CHECKPOINT

    writes = [call for call in world.calls if call[0] == "set_finalizers"]
    assert writes == ([] if written is None else [("set_finalizers", GROUPS_PLURAL, GROUP, written)])
    assert world.kube.objects[(GROUPS_PLURAL, GROUP)]["metadata"]["finalizers"] == (written or list(finalizers))
    created = [*ACTIVE, SPARE]
    assert sorted(node for op, node in world.provider.calls if op == "create") == created
    assert sorted(world.provider.nodes) == created
    # A creating pass writes its intent (planning.ownership), then its one status patch.
    *intent, status = patches(world)
    assert len(intent) == 1
    assert (status["phase"], status["desiredCount"], status["reservedCapacityId"]) == ("Provisioning", 2, "rc-abc-0")
    assert sorted(message.split()[0] for _, _, reason, message in world.events if reason == "NodeCreated") == created


@pytest.mark.parametrize("pools, created", [
    ([pool()], [*ACTIVE, SPARE]),
    ([], []),
], ids=["the-ledger-holds-the-block-creates-its-nodes", "a-block-only-in-the-plans-status-creates-nothing"])
def test_a_group_provisions_only_blocks_the_ledger_holds(monkeypatch: pytest.MonkeyPatch, pools, created) -> None:
    """The plan's ``status.reservedCapacity`` (which whoever may write the status could forge)
    is not where a group reads its plan's blocks: the pools' ledger is."""
    world = make_world(monkeypatch, NOW, DEMO, plans=[plan()], groups=[group()], pools=pools)
    try:
        run(world)
        assert sorted(node for op, node in world.provider.calls if op == "create") == created
        assert sorted(world.provider.nodes) == created
    finally:
        world.close()


# --------------------------------------------------------------------------- a lost race for a free node


@pytest.mark.parametrize("conflicts, wake", [
    (0, CHECKPOINT),
    (1, NOW + ADOPTION_RETRY),
    (3, NOW + ADOPTION_RETRY),
], ids=["no-race", "one-create-loses-its-race", "every-create-loses-its-race"])
def test_a_create_that_loses_the_race_for_a_free_node_looks_again_shortly(worlds, conflicts, wake) -> None:
    world = worlds()
    world.provider.adoption_conflicts = conflicts

    assert run(world) == wake

    assert len(world.provider.nodes) == 3 - conflicts
    assert world.reasons().count("NodeCreated") == 3 - conflicts
    assert world.rt.group_memory.short_of_free_nodes() == []  # a race, not a shortage of free nodes


# --------------------------------------------------------------------------- nothing changed


@pytest.mark.parametrize("step, patched, plan_woken", [
    pytest.param(step, patched, woken, id=step) for step, patched, woken in [
        ("first-pass-creates-the-nodes", True, True),
        ("the-nodes-turn-ready", True, True),
        ("nothing-changed", False, False),
        ("a-heartbeat-only", False, False),
    ]])
def test_a_pass_writes_its_status_and_wakes_its_plan_only_when_something_moved(worlds, step, patched,
                                                                             plan_woken) -> None:
    world = worlds()
    world.now = T0
    if step != "first-pass-creates-the-nodes":
        run(world)
        for node in world.provider.nodes:
            set_ready(world, node, "True", T0)
        world.now = NOW
    if step in ("nothing-changed", "a-heartbeat-only"):
        run(world)
    if step == "a-heartbeat-only":  # a new resourceVersion, nothing the group or its plan reads
        for node in world.provider.nodes.values():
            node.metadata.resource_version = "heartbeat-2"

    run(world)

    assert bool(patches(world)) is patched
    assert len(patches(world)) <= (2 if step == "first-pass-creates-the-nodes" else 1)  # 2: intent first
    assert world.rt.queue.woken("plan", PLAN) is plan_woken
    if not patched:
        assert world.provider.calls == [] and world.events == []
        assert world.kube.objects[(GROUPS_PLURAL, GROUP)]["status"]["phase"] == "Ready"


# --------------------------------------------------------------------------- a failed node


def test_a_failed_node_past_its_grace_is_marked_and_its_spare_promoted(worlds) -> None:
    world = worlds()
    running(world)
    failed = ACTIVE[1]
    set_ready(world, failed, "False", NOW)

    assert run(world) == NOW + GRACE  # inside its grace: only a check at its end
    assert world.provider.calls == []

    world.now = NOW + GRACE + timedelta(seconds=1)
    run(world)

    calls = world.provider.calls
    assert sorted(calls[:3]) == [("create", failed + "-g1"), ("mark_unhealthy", failed), ("promote_spare", SPARE)]
    spare = world.provider.nodes[SPARE].metadata.labels
    assert (spare[naming.LABEL_ROLE], spare[naming.LABEL_REPLACES]) == (naming.ROLE_ACTIVE, failed)
    assert world.provider.nodes[failed].metadata.labels[naming.LABEL_HEALTH] == "UnschedulablePendingReplacement"
    # Each node's event goes on the node and on the group.
    promoted = [(obj, kind, message) for obj, kind, reason, message in world.events if reason == "SparePromoted"]
    message = f"spare {SPARE} (same UltraServer) replaces {failed}"
    assert promoted == [(SPARE, "Normal", message), (GROUP, "Normal", message)]
    assert [obj for obj, _, reason, _ in world.events if reason == "NodeUnhealthy"] == [failed, GROUP]
    _intent, status = patches(world)  # the backfill's intent, then the pass's patch
    assert status["unhealthyCount"] == 1
    assert world.rt.queue.woken("plan", PLAN)


# --------------------------------------------------------------------------- an unreadable group


def test_an_unreadable_group_gets_a_warning_and_nothing_else(worlds) -> None:
    world = worlds(group(instanceCount=-1))

    assert run(world) is None

    assert world.calls == [] and world.provider.calls == []
    assert [(obj, kind, reason) for obj, kind, reason, _ in world.events] == [(GROUP, "Warning", "InvalidSpec")]
    assert not world.rt.queue.woken("plan", PLAN)



# --------------------------------------------------------------------------- passes in a row


def test_a_remediation_pass_marks_promotes_and_backfills_then_the_next_removes_the_failed_node(worlds) -> None:
    world = worlds()
    running(world)
    failed = ACTIVE[1]
    set_ready(world, failed, "False", NOW)
    world.now = NOW + timedelta(seconds=10)  # past its grace

    wake = run(world)

    # Mark, promotion and backfill write different nodes and go out together (in any order);
    # then, the spare serving, the failed node's pods are evicted, the start of it noted on the node.
    calls = world.provider.calls
    assert sorted(calls[:3]) == [("create", failed + "-g1"), ("mark_unhealthy", failed), ("promote_spare", SPARE)]
    assert calls[3:] == [("annotate", failed)]
    assert world.pods.calls == [("evict", failed)]
    assert world.provider.nodes[failed].metadata.annotations[health.ANNOTATION_EVICTING_SINCE] == \
        "2026-12-01T12:00:20.000000Z"
    assert naming.UNHEALTHY_TAINT in taints_of(world.provider.nodes[failed])
    assert naming.SPARE_TAINT not in taints_of(world.provider.nodes[SPARE])
    node_events = [(obj, kind, reason) for obj, kind, reason, _ in world.events
                   if reason in ("NodeUnhealthy", "SparePromoted", "NodeCreated", "PodsEvicted")]
    assert node_events == [
        (failed, "Warning", "NodeUnhealthy"), (GROUP, "Warning", "NodeUnhealthy"),
        (SPARE, "Normal", "SparePromoted"), (GROUP, "Normal", "SparePromoted"),
        (GROUP, "Normal", "NodeCreated"),
        (failed, "Normal", "PodsEvicted"), (GROUP, "Normal", "PodsEvicted")]
    assert ("release", failed) not in calls and failed in world.provider.nodes
    assert failed + "-g1" in world.provider.nodes  # no lost race
    assert world.rt.group_memory.short_of_free_nodes() == []  # and no shortage of free nodes
    assert wake == world.now + timedelta(seconds=1)  # the eviction is looked at again shortly

    # Once the backfill is Ready, the failed node goes through the provider; its absence is no failure.
    set_ready(world, failed + "-g1", "True", world.now)
    world.now += timedelta(seconds=1)
    run(world)
    # (its health label, set by the mark, is recorded first, as for any Unschedulable* label)
    assert world.provider.calls == [("annotate", failed), ("release", failed)]
    assert failed not in world.provider.nodes
    assert [(reason, message) for obj, _, reason, message in world.events if obj == GROUP
            and reason == "NodeRemoved"] == [("NodeRemoved", f"{failed} removed: Ready=False; {failed} deleted")]
    world.now += timedelta(seconds=1)
    run(world)
    # not taken for a node deleted from under the group: nothing to replace, nothing to warn of
    record = world.kube.objects[(GROUPS_PLURAL, GROUP)]["status"]["nodes"]
    assert failed not in [e["name"] for e in record] and not [e for e in record if "vanished" in e]
    assert world.provider.calls == [] and [e for e in world.events if e[1] == "Warning"] == []


def test_the_health_signal_record_is_written_with_the_pass_and_removed_with_the_label(worlds) -> None:
    world = worlds()
    running(world)
    node = ACTIVE[0]
    world.provider.nodes[node].metadata.labels[naming.LABEL_SAGEMAKER_HEALTH] = "Unschedulable"

    run(world)
    assert world.provider.calls == [("annotate", node)]
    assert world.provider.nodes[node].metadata.annotations[health.ANNOTATION_HEALTH_SINCE] == \
        "Unschedulable@2026-12-01T12:00:10.000000Z"

    # The same value later: nothing to write.
    world.now += timedelta(seconds=2)
    run(world)
    assert world.provider.calls == []

    # HyperPod's agent clears its label (to the Schedulable hyperplan wrote there at the create): the
    # record goes (and the memory of its first sight).
    world.provider.nodes[node].metadata.labels[naming.LABEL_SAGEMAKER_HEALTH] = naming.HEALTH_SCHEDULABLE
    run(world)
    assert world.provider.calls == [("annotate", node)]
    assert health.ANNOTATION_HEALTH_SINCE not in world.provider.nodes[node].metadata.annotations


# --------------------------------------------------------------------------- ownership from the group's record


def forged(name: str, **labels: str) -> client.V1Node:
    """A node that registered itself with the group's label (a kubelet may set hyperplan.dev/* labels)."""
    return client.V1Node(metadata=client.V1ObjectMeta(
        name=name, uid=f"uid-forged-{name}", creation_timestamp=T0,
        labels={naming.LABEL_GROUP: GROUP, **labels}), spec=client.V1NodeSpec())


@pytest.mark.parametrize("make_foreign", [
    pytest.param(lambda world: world.provider.nodes.__setitem__("forged", forged(
        "forged", **{LABEL_NODE_ID: ACTIVE[0], naming.LABEL_RESERVED_CAPACITY: "rc-other"})),
        id="forged-node-id-of-another-block"),
    pytest.param(lambda world: world.provider.nodes.__setitem__("forged", forged(
        "forged", **{LABEL_NODE_ID: ACTIVE[0], naming.LABEL_RESERVED_CAPACITY: "rc-abc-0",
                     naming.LABEL_SLOT: "0-0", naming.LABEL_ROLE: naming.ROLE_ACTIVE})),
        id="forged-node-id-on-the-groups-block"),
    pytest.param(lambda world: world.provider.nodes.__setitem__("forged", forged("forged")),
        id="forged-group-label-only"),
])
def test_a_node_that_claims_the_group_is_reported_and_left_alone(worlds, make_foreign) -> None:
    world = worlds()
    running(world)
    held = sorted(world.provider.nodes)
    make_foreign(world)

    for _ in range(3):
        world.now += timedelta(seconds=2)
        run(world)

        touched = [(op, node) for op, node in world.provider.calls if op != "create"]
        assert touched == []  # neither the bystander named by the label nor the forged node
        assert not any(world.provider.nodes[n].spec.unschedulable for n in world.provider.nodes)
    assert sorted(world.provider.nodes) == sorted(held + ["forged"])
    status = world.rt.cache.group(GROUP)["status"]
    assert sorted(n["name"] for n in status["nodes"]) == held
    [unrecorded] = [c for c in status["conditions"] if c["type"] == "UnrecordedNodes"]
    assert (unrecorded["status"], unrecorded["reason"]) == ("True", "NodeNotOwned")
    assert "forged" in unrecorded["message"]
    assert status["readyCount"] == 2  # the forged node is not counted


def test_a_forged_node_cannot_start_another_nodes_grace(worlds) -> None:
    """The node events key a health label's first sight by the group's record, not by the
    node-id label: a forged node labelled with a bystander's id and Unschedulable does not make
    the bystander's own label, minutes later, count as seen long ago."""
    world = worlds()
    running(world)
    world.provider.nodes["forged"] = forged("forged", **{LABEL_NODE_ID: ACTIVE[0],
                                                         naming.LABEL_HEALTH: "Unschedulable"})
    world.list_nodes()  # the forged node's event
    world.now += GRACE + timedelta(seconds=10)
    world.provider.nodes[ACTIVE[0]].metadata.labels[naming.LABEL_HEALTH] = "Unschedulable"
    run(world)
    assert [c for c in world.provider.calls if c[0] in ("mark_unhealthy", "promote_spare")] == []  # its own grace
    world.now += GRACE + timedelta(seconds=1)
    run(world)
    assert ("promote_spare", SPARE) in world.provider.calls


def test_a_node_not_owned_is_reported_once_per_node(worlds) -> None:
    world = worlds()
    running(world)
    world.provider.nodes["forged"] = forged("forged", **{LABEL_NODE_ID: ACTIVE[0]})
    reported = []
    for _ in range(3):
        world.now += timedelta(seconds=2)
        run(world)
        reported += [message for _, _, reason, message in world.events if reason == "NodeNotOwned"]
    assert len(reported) == 2  # once, on the node and on the group
    assert all(m.startswith(f"node forged (uid uid-forged-forged) carries the label of group {GROUP} as node id "
                            f"{ACTIVE[0]}") for m in reported)


def test_a_node_made_again_under_a_recorded_name_is_not_the_groups(worlds) -> None:
    """Same name, another uid (deleted and registered again by someone else): left alone, and the
    group does not make a node of that name while it stands."""
    world = worlds()
    running(world)
    world.provider.nodes[ACTIVE[0]].metadata.uid = "uid-someone-else"
    world.now += timedelta(seconds=2)
    run(world)
    assert [(op, node) for op, node in world.provider.calls if node == ACTIVE[0]] == []
    status = world.rt.cache.group(GROUP)["status"]
    assert ACTIVE[0] not in {n["name"] for n in status["nodes"]}
    assert any(c["type"] == "UnrecordedNodes" and ACTIVE[0] in c["message"] for c in status["conditions"])


def test_each_node_made_is_recorded_with_the_uid_the_api_answered(worlds) -> None:
    world = worlds()
    world.now = T0
    run(world)
    intent, status = patches(world)
    # Intent first: each node about to be made, with no uid and the digest of its nonce ...
    assert sorted((n["name"], n["uid"], len(n["claim"])) for n in intent["nodes"]) == sorted(
        (n, "", 64) for n in [*ACTIVE, SPARE])
    # ... then the pass's patch: the uid the API answered, and no claim.
    assert sorted((n["name"], n["uid"], n["nodeId"], n.get("claim")) for n in status["nodes"]) == sorted(
        (n, f"uid-{n}", n, None) for n in [*ACTIVE, SPARE])


def test_nodes_made_by_a_pass_whose_status_patch_was_lost_are_the_groups(worlds, monkeypatch) -> None:
    """The operator dies after its creates and before its status patch: the next pass holds the
    nodes by the claim they carry, reports none as not owned and makes none again."""
    world = worlds()
    world.now = T0
    real, writes = world.kube.patch_status, []

    def lost_after_the_intent(plural, name, status, resource_version=None):
        writes.append(status)
        if len(writes) > 1:
            raise RuntimeError("operator killed")
        return real(plural, name, status, resource_version)
    monkeypatch.setattr(world.kube, "patch_status", lost_after_the_intent)
    with pytest.raises(RuntimeError):
        run(world)
    assert sorted(world.provider.nodes) == sorted([*ACTIVE, SPARE])
    monkeypatch.setattr(world.kube, "patch_status", real)

    world.now = T0 + timedelta(seconds=2)
    run(world)

    assert [op for op, _ in world.provider.calls if op == "create"] == []
    assert "NodeNotOwned" not in world.reasons()
    status = world.rt.cache.group(GROUP)["status"]
    assert sorted((n["name"], n["uid"], n.get("claim")) for n in status["nodes"]) == sorted(
        (n, f"uid-{n}", None) for n in [*ACTIVE, SPARE])
    assert not any(c["type"] == "UnrecordedNodes" for c in status.get("conditions", []))


def test_a_recorded_node_the_watch_cache_does_not_show_is_asked_of_the_api_server(worlds) -> None:
    """An entry whose node was deleted behind the group's back: the watch cache may only lag
    behind the pass's own creates, so the pass lists the API server; the node is gone, and the
    entry stays in the record marked vanished until its slot is replaced."""
    world = worlds()
    running(world)
    del world.provider.nodes[ACTIVE[0]]
    world.now += timedelta(seconds=2)
    run(world)
    entries = {n["name"]: n for n in world.rt.cache.group(GROUP)["status"]["nodes"]}
    assert entries[ACTIVE[0]]["vanished"]["since"] == "2026-12-01T12:00:12Z"
    assert [n for n, e in entries.items() if "vanished" in e] == [ACTIVE[0]]


def vanished(world: World, node: str) -> dict[str, Any] | None:
    return next((e.get("vanished") for e in world.kube.objects[(GROUPS_PLURAL, GROUP)]["status"]["nodes"]
                 if e["name"] == node), None)


@pytest.mark.parametrize("restart", [False, True], ids=["same-process", "restarted-in-between"])
def test_a_node_deleted_from_under_the_group_is_replaced_once_from_its_record(worlds, restart) -> None:
    """The record keeps a vanished node (when, and a bounded few of its labels) until its slot
    holds a replacement: a restarted operator, whose memory is empty, still counts the grace from
    the first sight and replaces it once; then the entry goes."""
    world = worlds()
    running(world)
    gone = ACTIVE[1]
    world.provider.nodes[gone].metadata.labels.update({f"nfd.example.com/f{i}": "true" for i in range(40)})
    run(world)
    del world.provider.nodes[gone]
    world.now += timedelta(seconds=1)
    run(world)
    record = vanished(world, gone)
    assert record["since"] == "2026-12-01T12:00:11Z"
    assert record["labels"][naming.LABEL_SLOT] and not any(k.startswith("nfd.") for k in record["labels"])
    assert len(record["labels"]) <= 16
    assert not [c for c in world.provider.calls if c[0] == "create"]  # within its grace
    if restart:
        world.rt.group_memory = GroupMemory()
    world.now += GRACE + timedelta(seconds=1)
    run(world)
    assert ("promote_spare", SPARE) in world.provider.calls and ("create", gone + "-g1") in world.provider.calls
    assert vanished(world, gone) is not None  # until the replacement is in its slot, listed
    run(world)
    assert vanished(world, gone) is None and gone not in [e["name"] for e in
                                                           world.kube.objects[(GROUPS_PLURAL, GROUP)]["status"]["nodes"]]
    run(world)
    assert not [c for c in world.provider.calls if c[0] in ("create", "promote_spare")]  # replaced once


@pytest.mark.parametrize("forge", ["on-a-node-that-is-there", "without-a-uid", "with-its-slots-generation"])
def test_a_forged_vanished_record_changes_nothing(worlds, forge) -> None:
    """Only an entry the record holds by name and uid, whose node is not there, and that no node
    of its slot and generation contradicts, is taken as a node deleted from under the group."""
    world = worlds()
    running(world)
    obj = world.kube.objects[(GROUPS_PLURAL, GROUP)]
    entries = obj["status"]["nodes"]
    victim = next(e for e in entries if e["name"] == ACTIVE[0])
    labels = {k: v for k, v in world.provider.nodes[ACTIVE[0]].metadata.labels.items()
              if k.startswith("hyperplan.dev/")}
    forged = {"since": "2026-12-01T11:00:00Z", "labels": labels}
    if forge == "on-a-node-that-is-there":
        victim["vanished"] = forged
    elif forge == "without-a-uid":
        entries.append({"name": "ghost", "uid": "", "nodeId": "ghost", "vanished": forged})
    else:
        entries.append({"name": "ghost", "uid": "uid-ghost", "nodeId": "ghost", "vanished": forged})
    world.kube.put(GROUPS_PLURAL, obj)
    world.rt.group_memory = GroupMemory()  # as a restarted operator reads it
    run(world)
    assert not [c for c in world.provider.calls if c[0] in ("create", "promote_spare", "mark_unhealthy", "release")]
    status = world.kube.objects[(GROUPS_PLURAL, GROUP)]["status"]
    assert [e["name"] for e in status["nodes"] if "vanished" in e] == []
    assert (status["readyCount"], status["spareCount"], status["unhealthyCount"]) == (2, 1, 0)


def test_a_claim_whose_create_never_happened_does_not_stall_the_group(worlds) -> None:
    """Killed after the intent and before the creates: the next pass, from the watch cache, asks
    the API server about the claims no node answers, and makes the nodes."""
    world = worlds()
    world.now = T0
    world.provider.fail_on.add("create")
    with pytest.raises(RuntimeError):
        run(world)
    assert world.provider.nodes == {}
    assert all(n.get("claim") for n in world.rt.cache.group(GROUP)["status"]["nodes"])  # the intent landed
    world.provider.fail_on.clear()

    world.now = T0 + timedelta(seconds=2)
    run(world)

    assert sorted(world.provider.nodes) == sorted([*ACTIVE, SPARE])
    status = world.rt.cache.group(GROUP)["status"]
    assert sorted((n["name"], n["uid"], n.get("claim")) for n in status["nodes"]) == sorted(
        (n, f"uid-{n}", None) for n in [*ACTIVE, SPARE])


# --------------------------------------------------------------------------- the recovery ladder

LADDER = {"graceSeconds": 5, "maxUnhealthy": 2, "rebootBudget": 1, "rebootWindowSeconds": 3600,
          "rebootTimeoutSeconds": 30}


def record_of(world: World, node: str) -> dict[str, Any]:
    return next(n for n in world.rt.cache.group(GROUP)["status"]["nodes"] if n["name"] == node)


def rebooted(world: World) -> str:
    """The running group's second active node fails; the pass past its grace reboots it."""
    running(world)
    failed = ACTIVE[1]
    set_ready(world, failed, "False", NOW)
    world.now = NOW + GRACE + timedelta(seconds=1)
    run(world)
    return failed


def test_a_failed_node_is_rebooted_and_comes_back_as_its_ultraservers_spare(worlds) -> None:
    world = worlds(group(healthCheck=LADDER))
    running(world)
    failed = ACTIVE[1]
    set_ready(world, failed, "False", NOW)
    world.now = NOW + GRACE + timedelta(seconds=1)
    failed_at = world.now

    run(world)

    # The spare serves at once; the failed node is marked PendingReboot and rebooted, not replaced.
    calls = world.provider.calls
    assert sorted(c for c in calls if c[0] in ("mark_unhealthy", "promote_spare", "reboot", "create")) == [
        ("mark_unhealthy", failed), ("promote_spare", SPARE), ("reboot", failed)]
    labels = world.provider.nodes[failed].metadata.labels
    assert labels[naming.LABEL_HEALTH] == "UnschedulablePendingReboot"
    assert world.provider.nodes[SPARE].metadata.labels[naming.LABEL_ROLE] == naming.ROLE_ACTIVE
    assert "NodeRebooting" in world.reasons()
    # The clock is in the record, the intent first (before the node went down).
    intent, _final = patches(world)
    [entry] = [n for n in intent["nodes"] if n["name"] == failed]
    assert entry["recovery"]["rebootingSince"] == "2026-12-01T12:00:16Z"
    assert record_of(world, failed)["recovery"] == {"reboots": ["2026-12-01T12:00:16Z"],
                                                    "rebootingSince": "2026-12-01T12:00:16Z", "requested": False,
                                                    "faults": [{"condition": "Ready", "since": "2026-12-01T12:00:10Z"}],
                                                    "faultSince": "2026-12-01T12:00:10Z"}

    # Still down: waited for, nothing else done.
    world.now += timedelta(seconds=5)
    run(world)
    assert [c for c in world.provider.calls if c[0] in ("reboot", "create", "release")] == []

    # Back Ready: it serves again as the UltraServer's spare; no new node was ever made.
    world.provider.finish_reboot(failed, world.now)
    world.now += timedelta(seconds=1)
    run(world)
    back = world.provider.nodes[failed]
    assert back.metadata.labels[naming.LABEL_HEALTH] == "Schedulable"
    assert back.metadata.labels[naming.LABEL_ROLE] == naming.ROLE_SPARE
    assert naming.SPARE_TAINT in taints_of(back) and naming.UNHEALTHY_TAINT not in taints_of(back)
    assert "NodeRecovered" in world.reasons()
    assert sorted(world.provider.nodes) == sorted([*ACTIVE, SPARE])
    assert record_of(world, failed)["recovery"] == {"reboots": ["2026-12-01T12:00:16Z"], "requested": False, "faults": []}
    # The pass that brings it back does not count it unhealthy any more (it counted it both the
    # spare's and unhealthy, until the next pass).
    assert world.rt.cache.group(GROUP)["status"]["unhealthyCount"] == 0
    world.now += timedelta(seconds=1)
    run(world)
    status = world.rt.cache.group(GROUP)["status"]
    assert (status["phase"], status["readyCount"], status["spareCount"], status["unhealthyCount"]) == ("Ready", 2, 1, 0)
    assert failed_at < world.now


def test_a_node_that_fails_again_within_the_window_after_its_reboot_is_replaced(worlds) -> None:
    world = worlds(group(healthCheck=LADDER))
    failed = rebooted(world)
    world.provider.finish_reboot(failed, world.now)
    world.now += timedelta(seconds=1)
    run(world)
    run(world)  # the role and taints of a spare

    set_ready(world, failed, "False", world.now)  # the same fault, minutes later
    world.now += GRACE + timedelta(seconds=1)
    run(world)

    assert ("reboot", failed) not in world.provider.calls
    assert ("create", failed + "-g1") in world.provider.calls  # a new spare in its slot
    assert world.provider.nodes[failed].metadata.labels[naming.LABEL_HEALTH] == "UnschedulablePendingReplacement"


def test_a_node_not_back_within_the_reboot_timeout_is_replaced(worlds) -> None:
    world = worlds(group(healthCheck=LADDER))
    failed = rebooted(world)
    world.now += timedelta(seconds=31)
    run(world)
    assert world.provider.nodes[failed].metadata.labels[naming.LABEL_HEALTH] == "UnschedulablePendingReplacement"
    assert ("create", failed + "-g1") in world.provider.calls
    assert "rebootingSince" not in record_of(world, failed)["recovery"]


@pytest.mark.parametrize("key", [naming.LABEL_HEALTH, naming.LABEL_SAGEMAKER_HEALTH],
                         ids=["hyperplan-key", "sagemaker-key"])
def test_an_admin_asks_for_a_reboot_with_the_health_label(worlds, key) -> None:
    world = worlds(group(healthCheck=LADDER, nodeRecovery="None"))  # manual actions act even so
    running(world)
    node = ACTIVE[0]
    world.provider.nodes[node].metadata.labels[key] = "UnschedulablePendingReboot"
    run(world)  # the label is seen: its grace starts
    world.now += GRACE + timedelta(seconds=1)
    run(world)
    assert ("promote_spare", SPARE) in world.provider.calls and ("reboot", node) in world.provider.calls
    assert record_of(world, node)["recovery"]["requested"] is True

    world.provider.finish_reboot(node, world.now)
    world.now += timedelta(seconds=1)
    run(world)
    labels = world.provider.nodes[node].metadata.labels
    assert labels[naming.LABEL_HEALTH] == "Schedulable"
    if key == naming.LABEL_SAGEMAKER_HEALTH:  # carried out: HyperPod's label says so
        assert labels[key] == "Schedulable"
    world.now += timedelta(seconds=1)
    run(world)
    assert [c for c in world.provider.calls if c[0] == "reboot"] == []  # not asked again


def test_with_node_recovery_none_a_fault_is_only_labelled(worlds) -> None:
    world = worlds(group(healthCheck=LADDER, nodeRecovery="None"))
    running(world)
    failed = ACTIVE[1]
    set_ready(world, failed, "False", NOW)
    for _ in range(3):
        world.now += GRACE + timedelta(seconds=1)
        run(world)
    assert world.provider.nodes[failed].metadata.labels[naming.LABEL_HEALTH] == "Unschedulable"
    assert naming.UNHEALTHY_TAINT in taints_of(world.provider.nodes[failed])
    assert sorted(world.provider.nodes) == sorted([*ACTIVE, SPARE])
    assert world.provider.nodes[SPARE].metadata.labels[naming.LABEL_ROLE] == naming.ROLE_SPARE
    assert not any(op in ("reboot", "promote_spare", "create", "release") for op, _ in world.provider.calls)
    assert world.rt.cache.group(GROUP)["status"]["unhealthyCount"] == 1


# --------------------------------------------------------------------------- another writer of the record


def cordoned_meanwhile(world: World, monkeypatch, at_call: int) -> list[dict]:
    """Before the pass's ``at_call``-th status write, another writer (the group's deletion) records
    a cordon on the first entry, as the deletion handler does between its retries."""
    real, seen = world.kube.patch_status, []

    def patch(plural, name, status, resource_version=None):
        seen.append(status)
        if len(seen) == at_call:
            held = world.kube.objects[(plural, name)]
            nodes = [dict(e) for e in held["status"]["nodes"]]
            nodes[0]["cordoned"] = True
            real(plural, name, {"nodes": nodes})
        return real(plural, name, status, resource_version)
    monkeypatch.setattr(world.kube, "patch_status", patch)
    return seen


def test_a_pass_whose_record_changed_meanwhile_does_nothing_and_looks_again(worlds, monkeypatch) -> None:
    world = worlds()
    running(world)
    failed = ACTIVE[1]
    set_ready(world, failed, "False", NOW)
    world.now = NOW + GRACE + timedelta(seconds=1)
    cordoned_meanwhile(world, monkeypatch, at_call=1)  # at the intent of the backfill
    wake = run(world)
    assert wake == world.now + timedelta(seconds=1)
    assert [c for c in world.provider.calls if c[0] in ("create", "promote_spare", "mark_unhealthy")] == []
    record = world.kube.objects[(GROUPS_PLURAL, GROUP)]["status"]["nodes"]
    assert record[0]["cordoned"] is True  # the other writer's cordon is not lost


def test_a_status_patch_that_lost_to_another_writer_is_merged_into_the_record_as_it_is_now(worlds,
                                                                                          monkeypatch) -> None:
    world = worlds()
    running(world)
    failed = ACTIVE[1]
    set_ready(world, failed, "False", NOW)
    world.now = NOW + GRACE + timedelta(seconds=1)
    cordoned_meanwhile(world, monkeypatch, at_call=2)  # after the intent, at the pass's own patch
    run(world)
    record = {e["nodeId"]: e for e in world.kube.objects[(GROUPS_PLURAL, GROUP)]["status"]["nodes"]}
    assert record[ACTIVE[0]]["cordoned"] is True  # the other writer's move is kept
    made = record[failed + "-g1"]
    assert (made["uid"], made.get("claim")) == (f"uid-{failed}-g1", None)  # and the pass's


def test_a_flapping_condition_does_not_reset_its_grace(worlds) -> None:
    """NotReady, Ready again within the grace, NotReady again: judged from the first sight of the
    fault (the group's record keeps it), not from the condition's last transition."""
    world = worlds()
    running(world)
    failed = ACTIVE[1]
    set_ready(world, failed, "False", NOW)
    run(world)
    set_ready(world, failed, "True", NOW + timedelta(seconds=2))
    world.now = NOW + timedelta(seconds=2)
    run(world)
    set_ready(world, failed, "False", NOW + timedelta(seconds=3))
    world.now = NOW + GRACE + timedelta(seconds=1)  # past the grace from the first sight, not from the last
    run(world)
    assert ("mark_unhealthy", failed) in world.provider.calls and ("promote_spare", SPARE) in world.provider.calls
    assert record_of(world, failed)["recovery"]["faults"][0]["since"] == "2026-12-01T12:00:10Z"


# --------------------------------------------------------------------------- the group's deletion


def test_the_deletion_records_each_cordon_before_it_and_the_hand_back_of_a_later_attempt_knows_it(
        worlds, monkeypatch) -> None:
    """A node whose pods hold the first attempt is handed back by a later one, called with kopf's
    body from before the first attempt's writes: the record read from the API server says
    hyperplan cordoned it (written before the cordon), so the hand-back uncordons it."""
    world = worlds()
    running(world)
    stale_body = dict(world.kube.objects[(GROUPS_PLURAL, GROUP)])
    world.pods.pods[ACTIVE[0]] = ["default/trainer"]
    world.pods.guarded.add("default/trainer")
    released: dict[str, bool] = {}
    real_release = world.provider.release

    def release(node, uid="", lent=None, cordoned=False):
        released[node] = cordoned
        return real_release(node, uid, lent, cordoned)
    monkeypatch.setattr(world.provider, "release", release)
    world.calls.clear()
    world.provider.calls.clear()
    spec = stale_body["spec"]

    assert asyncio.run(drain_group(world.rt, GROUP, spec, stale_body)) is not None  # looks again

    first_write = next(i for i, c in enumerate(world.calls) if c[:2] == ("patch_status", GROUPS_PLURAL))
    assert all(n["cordoned"] for n in world.calls[first_write][3]["nodes"])  # recorded ...
    assert world.provider.calls[0][0] == "cordon"  # ... then cordoned (the record was written first)
    assert ACTIVE[0] not in released

    world.pods.guarded.clear()
    assert asyncio.run(drain_group(world.rt, GROUP, spec, stale_body)) is None  # the old body again
    assert released == {ACTIVE[1]: True, SPARE: True, ACTIVE[0]: True}
    assert world.kube.objects[(GROUPS_PLURAL, GROUP)]["status"]["nodes"] == []



def test_a_status_patch_that_loses_twice_still_writes_the_phase_and_looks_again_soon(worlds, monkeypatch) -> None:
    """kopf writes the group too (its finalizer, its annotations): a pass whose record loses twice
    writes the rest of its status anyway and records at a pass a second later."""
    world = worlds()
    running(world)  # a record to guard
    set_ready(world, ACTIVE[1], "False", NOW)  # a fault: its clock moves the record
    real = world.kube.patch_status

    def patch(plural, name, status, resource_version=None):
        if resource_version:
            raise ApiException(status=409, reason="Conflict")
        return real(plural, name, status)
    monkeypatch.setattr(world.kube, "patch_status", patch)
    wake = run(world)
    assert wake == world.now + timedelta(seconds=1)
    status = world.kube.objects[(GROUPS_PLURAL, GROUP)]["status"]
    assert status["phase"] == "Provisioning"  # written (a node in its grace), the record left as it was
    assert "faults" not in (record_of(world, ACTIVE[1]).get("recovery") or {})
