"""decide_group: an InstanceGroup's nodes to create, update and drain, its remediation, status,
events and wake time; the apply step (actuation.groups) against the recording FakeProvider;
the group memory (planning.memory) and its pruning.

Nodes live in a FakeProvider; the real ``observe_nodes`` reads them (with a real GroupMemory)
and the real ``apply_decision`` carries out each decision on them, so a scenario can assert on
each decision between its steps. What a whole pass does (its finalizer guard, its one status
patch, its events and wakes, scenarios judged only by their effects) is tested on the real
``reconcile_group`` in tests/unit/test_group_pass.py. All times are fixed; nothing reads the clock.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest
from kubernetes import client

from hyperplan.actuation.groups import (
    Applied, Observation, apply_decision, count_pods, drain_node, observe_node, observe_nodes,
    releases_of,
)
from hyperplan_testing.fakes import FakeNodePods, FakeProvider
from hyperplan.actuation.providers.base import LABEL_NODE_ID, NodeProvider, taints_of
from hyperplan.api.models import InstanceGroupSpec, InstanceGroupStatus, ReservedCapacity
from hyperplan.planning import health
from hyperplan.planning import naming
from hyperplan.planning import placement
from hyperplan.planning import reading
from hyperplan.planning.groups import (
    CONDITION_BLOCK_TERMINATING,
    GroupDecision,
    ObservedGroupNode,
    Peer,
    BoundPlan,
    check_binding,
    checkpoint_time,
    decide_group,
    plan_checkpoint,
)
from hyperplan.planning.memory import GroupMemory, PresentNode
from hyperplan.planning.nodefacts import unschedulable_health
from hyperplan.planning.plans import Event
from hyperplan.planning.policy import DEMO

UTC = timezone.utc
US_TYPE = placement.ULTRASERVER_INSTANCE_TYPE
X72 = "ml.u-p6e-gb200x72"
AZ = "use1-az3"
US_KEY = "topology.k8s.aws/ultraserver-id"
LAYERS = tuple(f"topology.k8s.aws/network-node-layer-{i}" for i in (1, 2, 3))

# Demo policy: a hyperpod-cluster block stops its instances 20 s before its end.
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
END = T0 + timedelta(minutes=3)
TERMINATION = END - timedelta(seconds=20)
CHECKPOINT = TERMINATION - timedelta(seconds=5)  # demo: workloads are asked to checkpoint 5 s ahead
NOW = T0 + timedelta(seconds=10)

BLOCK = ReservedCapacity(id="rc-abc-0", availability_zone=AZ, instance_type=US_TYPE, instance_count=36,
                         start_time=T0, end_time=END, ultra_server_type=X72, ultra_server_count=2)
BLOCK2 = ReservedCapacity(id="rc-abc-1", availability_zone=AZ, instance_type=US_TYPE, instance_count=36,
                          start_time=T0 + timedelta(minutes=5), end_time=T0 + timedelta(minutes=8),
                          ultra_server_type=X72, ultra_server_count=2)
PLAN = BoundPlan("p", "hyperpod-cluster", None, X72, 1, (BLOCK,))
TWO_BLOCKS = BoundPlan("p", "hyperpod-cluster", None, X72, 1, (BLOCK, BLOCK2))
US0, US1 = "rc-abc-0-us-0", "rc-abc-0-us-1"
H = "c64f9691"  # 8 hex of sha256("rc-abc-0"): the block part of node names
H2 = "1deffe37"  # ... of "rc-abc-1"


def spec(count: int = 20, *, instance_type: str = US_TYPE, max_unhealthy: int | str = 2, reboot_budget: int = 0,
         **kw) -> InstanceGroupSpec:
    """The group's spec. ``reboot_budget`` 0 (replace at once): most tests here are about the
    replacement; the ladder's reboots are tested under "the recovery ladder" below."""
    return InstanceGroupSpec(training_plan_ref="p", instance_type=instance_type, instance_count=count,
                             health_check={"graceSeconds": 5, "maxUnhealthy": max_unhealthy,
                                           "rebootBudget": reboot_budget, "rebootTimeoutSeconds": 30}, **kw)


SPEC = spec()


def name(slot: str, group: str = "w", h: str = H) -> str:
    return f"hp-{group}-{h}-{slot}"


# --------------------------------------------------------------------------- the cluster, through the real code


class NodeHandle:
    """One node of the fake provider, with setters for what tests change on it."""

    def __init__(self, node: client.V1Node):
        self.node = node

    @property
    def labels(self) -> dict[str, str]:
        return self.node.metadata.labels

    @property
    def taints(self) -> tuple[naming.Taint, ...]:
        return taints_of(self.node)

    def _ready(self) -> client.V1NodeCondition | None:
        conditions = (self.node.status.conditions if self.node.status else None) or []
        return next((c for c in conditions if c.type == "Ready"), None)

    @property
    def ready(self) -> str | None:
        c = self._ready()
        return c.status if c else None

    @ready.setter
    def ready(self, status: str | None) -> None:
        """The Ready condition's status (None: no Ready condition yet, a node starting up)."""
        others = [c for c in (self.node.status.conditions if self.node.status else None) or [] if c.type != "Ready"]
        since = self._ready().last_transition_time if self._ready() else T0
        ready = [] if status is None else [client.V1NodeCondition(type="Ready", status=status,
                                                                  last_transition_time=since)]
        self.node.status = client.V1NodeStatus(conditions=others + ready)

    @property
    def ready_since(self) -> datetime:
        return self._ready().last_transition_time

    @ready_since.setter
    def ready_since(self, when: datetime) -> None:
        self._ready().last_transition_time = when

    @property
    def health_since(self) -> datetime | None:
        return None

    @health_since.setter
    def health_since(self, when: datetime) -> None:
        """When the node's health label was first seen, as the node's own record keeps it."""
        value = self.labels[naming.LABEL_HEALTH]
        annotations = dict(self.node.metadata.annotations or {})
        annotations[health.ANNOTATION_HEALTH_SINCE] = health.health_signal_record(value, when)
        self.node.metadata.annotations = annotations

    @property
    def deleting(self) -> bool:
        return self.node.metadata.deletion_timestamp is not None

    @deleting.setter
    def deleting(self, value: bool) -> None:
        self.node.metadata.deletion_timestamp = T0 if value else None


class Cluster:
    """A group's nodes in the recording FakeProvider, read and changed by the real
    ``actuation.groups.observe_nodes`` and ``apply_decision`` with a real GroupMemory, for a
    decision the test made and inspected itself (the real pass returns only its wake time)."""

    def __init__(self, specs=(), since: datetime = T0, group: str = "w"):
        self.now = since
        self.group = group
        self.provider = FakeProvider(clock=lambda: self.now)
        self.pods = FakeNodePods()
        self.memory = GroupMemory()
        self.last: Observation | None = None
        for s in specs:
            self.provider.create(s)
            self[s.name].ready = "True"
            self[s.name].ready_since = since

    def __getitem__(self, node: str) -> NodeHandle:
        return NodeHandle(self.provider.nodes[node])

    def __delitem__(self, node: str) -> None:
        del self.provider.nodes[node]

    def __iter__(self):
        return iter(list(self.provider.nodes))

    def __contains__(self, node: str) -> bool:
        return node in self.provider.nodes

    def values(self) -> list[NodeHandle]:
        return [NodeHandle(n) for n in self.provider.nodes.values()]

    def observe(self, now: datetime | None = None) -> Observation:
        raw = self.provider.list(self.group)
        self.last = observe_nodes(self.group, raw, self.memory, now or self.now, KEYS, count_pods(self.pods, raw))
        return self.last

    def apply(self, d: GroupDecision, now: datetime, new_ready: str | None = "True") -> Applied:
        seen = self.last if self.last is not None else self.observe(now)
        self.now = now
        self.memory.note_releasing(self.group, releases_of(d))
        applied = apply_decision(self.provider, self.pods, d, seen.raw, seen.health_notes, now, lambda: now,
                                 self.group)
        self.memory.note_short_of_free_nodes(self.group, applied.short_of_free_nodes)
        for s in d.create:
            self[s.name].ready = new_ready
            if new_ready is not None:
                self[s.name].ready_since = now
        self.last = None
        return applied


KEYS = naming.TopologyKeys()


def observed(cluster: Cluster, now: datetime | None = None) -> list[ObservedGroupNode]:
    """What a pass observes (the real observe_nodes): existing nodes, then vanished ones."""
    return cluster.observe(now).nodes


def cluster_of(specs: list[placement.NodeSpec], since: datetime = T0) -> Cluster:
    return Cluster(specs, since)


def apply(d: GroupDecision, cluster: Cluster, now: datetime, new_ready: str | None = "True") -> Applied:
    """Carry out a decision as the handler does (actuation.groups.apply_decision)."""
    return cluster.apply(d, now, new_ready)


def decide(nodes=(), *, now: datetime = NOW, s: InstanceGroupSpec = SPEC, plan: BoundPlan | None = PLAN,
           peers=None, prior: InstanceGroupStatus | None = None, group: str = "w",
           generation: int = 1) -> GroupDecision:
    peers = peers if peers is not None else [Peer(group, s.instance_count)]
    return decide_group(group, generation, s, prior or InstanceGroupStatus(), plan, peers, list(nodes), DEMO, now)


def ready_cond(d: GroupDecision):
    return next(c for c in d.status.conditions if c.type == "Ready")


def conds(d: GroupDecision) -> list[tuple[str, str, str]]:
    return [(c.type, c.status, c.reason) for c in d.status.conditions]


def kinds(events: list[Event]) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in events]


FIRST = decide()  # the 22 nodes of the 20-instance group at block start
RUNNING = {s.name for s in FIRST.create}


def running() -> Cluster:
    """The group's 22 nodes, all Ready since the block start."""
    return cluster_of(FIRST.create)


# =========================================================================== no usable block


def test_plan_missing():
    d = decide(plan=None)

    assert d.status.phase == "Waiting"
    assert conds(d) == [("Ready", "False", "PlanNotFound")]
    assert ready_cond(d).message == "training plan p does not exist yet"
    assert d.events == [Event("Normal", "PlanNotFound", "training plan p does not exist yet")]
    assert (d.create, d.update, d.drain, d.remediation) == ([], [], [], ())
    assert d.wake_at is None
    assert d.block is None


def test_plan_missing_drains_existing_nodes_at_once():
    d = decide(observed(running()), plan=None)

    assert d.status.phase == "Draining"
    assert sorted(x.node for x in d.drain) == sorted(RUNNING)
    assert {(x.deadline, x.reason) for x in d.drain} == {(NOW, "PlanNotFound")}
    assert d.create == []
    assert d.wake_at == NOW + timedelta(seconds=1)


TRAINING_JOB_PLAN = BoundPlan("p", "training-job", None, X72, 1, (BLOCK,))
P5_PLAN = BoundPlan("p", "hyperpod-cluster", "ml.p5.48xlarge", None, 1, (BLOCK,))


def assert_failed_without_nodes(d, reason: str, message: str, unbound: bool = False) -> None:
    """A group that breaks a rule: Failed, the rule in its condition (and in Bound=False when it is
    a binding rule) and a Warning, and no nodes."""
    assert d.status.phase == "Failed"
    assert conds(d) == [("Ready", "False", reason)] + ([("Bound", "False", reason)] if unbound else [])
    assert ready_cond(d).message == message
    assert d.events == [Event("Warning", reason, message)]
    assert (d.create, d.update, d.drain, d.remediation) == ([], [], [], ())
    assert d.wake_at is None


@pytest.mark.parametrize(
    "plan, s, reason, message",
    [
        pytest.param(TRAINING_JOB_PLAN, SPEC, "PlanTargetNotHyperPod",
                     "training plan p targets training-job; instance groups need a hyperpod-cluster plan",
                     id="plan-targets-training-job"),
        pytest.param(PLAN, spec(instance_type="ml.p5.48xlarge"), "InstanceTypeMismatch",
                     "group wants ml.p5.48xlarge but training plan p reserves ml.p6e-gb200.36xlarge",
                     id="plain-type-on-ultraserver-plan"),
        pytest.param(P5_PLAN, SPEC, "InstanceTypeMismatch",
                     "group wants ml.p6e-gb200.36xlarge but training plan p reserves ml.p5.48xlarge",
                     id="ultraserver-type-on-plain-plan"),
    ],
)
def test_binding_rule_broken_fails_without_nodes(plan, s, reason, message):
    d = decide(plan=plan, s=s)

    assert_failed_without_nodes(d, reason, message, unbound=True)


EC2_X72_BLOCK = BLOCK.model_copy(update={"instance_type": "p6e-gb200.36xlarge"})


@pytest.mark.parametrize("instance_type, problem", [
    ("p6e-gb200.36xlarge", None),
    ("ml.p6e-gb200.36xlarge", ("InstanceTypeMismatch",
                               "group wants ml.p6e-gb200.36xlarge but training plan p reserves p6e-gb200.36xlarge")),
], ids=["ec2-type-as-the-block", "sagemaker-type"])
def test_an_ultraserver_plan_bought_as_ec2_capacity_blocks_reserves_ec2s_type(instance_type, problem):
    """An EC2 UltraServer Capacity Block holds EC2's instance type (planning.capacity_blocks), the
    type Karpenter's nodes carry: the group says that type."""
    plan = BoundPlan("p", "hyperpod-cluster", None, X72, 1, (EC2_X72_BLOCK,))
    assert check_binding(spec(instance_type=instance_type), plan) == problem


def test_binding_rule_broken_drains_existing_nodes():
    cluster = running()
    cluster[name("0-3")].deleting = True  # already on its way out: not drained twice
    d = decide(observed(cluster), plan=TRAINING_JOB_PLAN)

    assert sorted(x.node for x in d.drain) == sorted(set(RUNNING) - {name("0-3")})
    assert {(x.deadline, x.reason) for x in d.drain} == {(NOW, "PlanTargetNotHyperPod")}
    assert d.create == []
    assert kinds(d.events) == [("Warning", "PlanTargetNotHyperPod")]
    assert d.status.phase == "Draining"
    assert d.wake_at == NOW + timedelta(seconds=1)


def test_plan_not_bought_yet():
    d = decide(plan=BoundPlan("p", "hyperpod-cluster", None, X72, 1, ()))

    assert d.status.phase == "Waiting"
    assert conds(d) == [("Ready", "False", "PlanNotPurchased")]
    assert ready_cond(d).message == "training plan p has no reserved capacity yet"
    assert kinds(d.events) == [("Normal", "PlanNotPurchased")]
    assert d.create == []
    assert d.wake_at is None


def test_before_the_block_waits_until_its_start():
    d = decide(now=T0 - timedelta(seconds=30))

    assert d.status.phase == "Waiting"
    assert conds(d) == [("Ready", "False", "NoActiveBlock")]
    assert ready_cond(d).message == "next block rc-abc-0 starts at 2026-12-01T12:00:00+00:00"
    assert d.status.availability_zone == AZ
    assert d.status.next_transition_time == T0
    assert d.wake_at == T0
    assert (d.create, d.drain) == ([], [])


def test_waiting_event_is_posted_once():
    first = decide(now=T0 - timedelta(seconds=30))
    again = decide(now=T0 - timedelta(seconds=20), prior=first.status)
    assert kinds(first.events) == [("Normal", "NoActiveBlock")]
    assert again.events == []
    assert ready_cond(again).last_transition_time == T0 - timedelta(seconds=30)


# =========================================================================== during the block


def test_block_start_creates_active_nodes_fill_first_plus_one_spare_per_ultraserver():
    d = FIRST

    us0 = [name(f"0-{j}") for j in range(18)]
    us1 = [name(f"1-{j}") for j in range(4)]
    assert [c.name for c in d.create] == us0 + us1
    roles = {c.name: c.role for c in d.create}
    assert [n for n in us0 + us1 if roles[n] == naming.ROLE_SPARE] == [name("0-17"), name("1-3")]
    assert Counter((c.ultraserver_id, c.role) for c in d.create) == {
        (US0, "active"): 17, (US0, "spare"): 1, (US1, "active"): 3, (US1, "spare"): 1}
    assert {c.name: c.taints for c in d.create if c.taints} == {
        name("0-17"): (naming.SPARE_TAINT,), name("1-3"): (naming.SPARE_TAINT,)}
    assert (d.update, d.drain, d.remediation) == ([], [], ())
    assert d.block == BLOCK


def test_node_labels():
    by_name = {c.name: c for c in FIRST.create}
    first = by_name[name("0-0")]
    layers = {k: first.labels[k] for k in LAYERS}
    assert {k: v for k, v in first.labels.items() if k not in LAYERS} == {
        "node.kubernetes.io/instance-type": US_TYPE,
        "topology.kubernetes.io/zone": AZ,
        "kubernetes.io/hostname": name("0-0"),
        "hyperplan.dev/instance-group": "w",
        "hyperplan.dev/training-plan": "p",
        "hyperplan.dev/reserved-capacity": "rc-abc-0",
        "hyperplan.dev/role": "active",
        "hyperplan.dev/node-health-status": "Schedulable",
        "sagemaker.amazonaws.com/node-health-status": "Schedulable",  # HyperPod's key beside it (hyperpod_labels)
        "hyperplan.dev/slot": "0-0",
        "hyperplan.dev/generation": "0",
        US_KEY: US0,
    }
    assert all(re.fullmatch(r"nn-[0-9a-f]{17}", v) for v in layers.values())
    assert len(set(layers.values())) == 3
    spare = by_name[name("1-3")]
    assert (spare.labels["hyperplan.dev/role"], spare.labels[US_KEY], spare.labels["hyperplan.dev/slot"]) == (
        "spare", US1, "1-3")
    # layer-1 (AZ) and layer-2 (block) are shared by every node; layer-3 is the NVLink domain.
    for key in LAYERS[:2]:
        assert {c.labels[key] for c in FIRST.create} == {first.labels[key]}
    layer3 = {(c.ultraserver_id, c.labels[LAYERS[2]]) for c in FIRST.create}
    assert len(layer3) == 2 and len({v for _, v in layer3}) == 2
    assert all(c.availability_zone == AZ and c.instance_type == US_TYPE for c in FIRST.create)


def test_group_labels_and_taints_go_on_every_node():
    gpu = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    d = decide(s=spec(labels={"team": "llm", "hyperplan.dev/role": "mine"}, taints=[gpu]))
    taint = naming.Taint("nvidia.com/gpu", "present", "NoSchedule")

    assert len(d.create) == 22
    assert all(c.labels["team"] == "llm" for c in d.create)
    # The operator's own labels win over the group's.
    assert Counter(c.labels["hyperplan.dev/role"] for c in d.create) == {"active": 20, "spare": 2}
    assert Counter(c.taints for c in d.create) == {(taint,): 20, (taint, naming.SPARE_TAINT): 2}


def test_block_start_status():
    d = FIRST
    st = d.status

    assert st.phase == "Provisioning"
    assert conds(d) == [("Ready", "False", "Provisioning"), ("RemediationAllowed", "True", "WithinBounds")]
    assert ready_cond(d).message == "0/20 active nodes Ready, 0 spare(s) in use1-az3 on block rc-abc-0"
    assert (st.desired_count, st.ready_count, st.spare_count, st.unhealthy_count) == (20, 0, 0, 0)
    assert (st.availability_zone, st.reserved_capacity_id) == (AZ, "rc-abc-0")
    assert st.next_transition_time == TERMINATION
    assert st.observed_generation == 1
    assert all(c.last_transition_time == NOW for c in st.conditions)
    assert d.events == [Event("Normal", "Provisioning",
                              "0/20 active nodes Ready, 0 spare(s) in use1-az3 on block rc-abc-0")]
    assert d.wake_at == CHECKPOINT  # the checkpoint signal, 5 s before the termination time


@pytest.mark.parametrize(
    "count, expected",
    [
        pytest.param(14, {(US0, "active"): 14, (US0, "spare"): 1}, id="14-fits-on-the-first"),
        pytest.param(17, {(US0, "active"): 17, (US0, "spare"): 1}, id="17-fills-the-first"),
        pytest.param(18, {(US0, "active"): 17, (US0, "spare"): 1, (US1, "active"): 1, (US1, "spare"): 1},
                     id="18-spills-one"),
        pytest.param(34, {(US0, "active"): 17, (US0, "spare"): 1, (US1, "active"): 17, (US1, "spare"): 1},
                     id="34-fills-both"),
        pytest.param(0, {}, id="zero"),
    ],
)
def test_fill_first_layout(count, expected):
    d = decide(s=spec(count))
    assert Counter((c.ultraserver_id, c.role) for c in d.create) == expected
    assert d.status.desired_count == count


@pytest.mark.parametrize(
    "peers, s, reason, message",
    [
        pytest.param([Peer("w", 35)], spec(35), "InsufficientCapacity",
                     "35 instances requested, 34 of 34 usable instances left on 2 UltraServer(s)",
                     id="more-than-the-plan-holds"),
        pytest.param([Peer("a", 27), Peer("w", 10)], spec(10), "InsufficientCapacity",
                     "10 instances requested, 7 of 34 usable instances left on 2 UltraServer(s)",
                     id="an-earlier-group-took-the-room"),
        pytest.param([Peer("w", 20, (("rc-abc-0-us-7", 20),))], spec(20), "UnknownUltraServer",
                     "unknown UltraServer(s) rc-abc-0-us-7; the block has rc-abc-0-us-0, rc-abc-0-us-1",
                     id="explicit-unknown-ultraserver"),
        pytest.param([Peer("w", 20, ((US0, 10),))], spec(20), "PlacementCountMismatch",
                     "the placement places 10 instances but the group asks for 20",
                     id="explicit-count-mismatch"),
        pytest.param([Peer("w", 18, ((US0, 18),))], spec(18), "PlacementExceedsCapacity",
                     "18 instances on UltraServer rc-abc-0-us-0, which has 17 usable (18 minus 1 spare), "
                     "0 already placed, 17 left", id="explicit-over-an-ultraserver"),
        pytest.param([Peer("other", 3)], spec(3), "InvalidPlacement", "group is not among the plan's groups",
                     id="not-among-the-peers"),
        pytest.param([Peer("w", 3), Peer("w", 3)], spec(3), "InvalidPlacement",
                     "duplicate group names in ['w', 'w']", id="duplicate-peers"),
    ],
)
def test_placement_failure_fails_the_group(peers, s, reason, message):
    d = decide(s=s, peers=peers)

    assert_failed_without_nodes(d, reason, message)


def test_explicit_placement_is_honoured():
    d = decide(s=spec(6), peers=[Peer("w", 6, ((US1, 4), (US0, 2)))])
    assert Counter((c.ultraserver_id, c.role) for c in d.create) == {
        (US0, "active"): 2, (US0, "spare"): 1, (US1, "active"): 4, (US1, "spare"): 1}


@pytest.mark.parametrize(
    "b_count, a_layout, b_layout",
    [
        # b does not fit beside a on the first UltraServer: it opens the second and owns its spare.
        pytest.param(10, {(US0, "active"): 14, (US0, "spare"): 1},
                     {(US1, "active"): 10, (US1, "spare"): 1}, id="second-group-on-the-next-ultraserver"),
        # b fits in what a left on the first: best fit, no new NVLink domain; a owns the spare.
        pytest.param(3, {(US0, "active"): 14, (US0, "spare"): 1}, {(US0, "active"): 3},
                     id="second-group-fills-the-first"),
    ],
)
def test_two_groups_sharing_a_plan(b_count, a_layout, b_layout):
    peers = [Peer("a", 14), Peer("b", b_count)]
    a = decide(s=spec(14), peers=peers, group="a")
    b = decide(s=spec(b_count), peers=peers, group="b")

    assert Counter((c.ultraserver_id, c.role) for c in a.create) == a_layout
    assert Counter((c.ultraserver_id, c.role) for c in b.create) == b_layout
    a_names = {c.name for c in a.create}
    b_names = {c.name for c in b.create}
    assert not a_names & b_names
    assert all(n.startswith(f"hp-a-{H}-") for n in a_names)
    assert all(n.startswith(f"hp-b-{H}-") for n in b_names)
    assert {c.labels["hyperplan.dev/instance-group"] for c in b.create} == {"b"}
    # Together they never hold more active nodes on an UltraServer than it has usable.
    active = Counter(c.ultraserver_id for c in a.create + b.create if c.role == naming.ROLE_ACTIVE)
    assert all(v <= 17 for v in active.values())
    # Each UltraServer's spare exists once, with the first group that uses it.
    spares = Counter(c.ultraserver_id for c in a.create + b.create if c.role == naming.ROLE_SPARE)
    assert all(v == 1 for v in spares.values())


# --------------------------------------------------------------------------- Ready


def test_ready_once_every_node_exists_and_is_ready():
    d = decide(observed(running()), prior=FIRST.status, now=NOW + timedelta(seconds=5))
    st = d.status

    assert st.phase == "Ready"
    assert conds(d) == [("Ready", "True", "NodesReady"), ("RemediationAllowed", "True", "WithinBounds")]
    message = "20/20 active nodes Ready, 2 spare(s) in use1-az3 on block rc-abc-0"
    assert ready_cond(d).message == message
    assert ready_cond(d).last_transition_time == NOW + timedelta(seconds=5)
    assert (st.desired_count, st.ready_count, st.spare_count, st.unhealthy_count) == (20, 20, 2, 0)
    assert (d.create, d.update, d.drain, d.remediation) == ([], [], [], ())
    assert d.events == [Event("Normal", "NodesReady", message)]
    assert d.wake_at == CHECKPOINT  # the checkpoint signal, 5 s before the termination time

    again = decide(observed(running()), prior=st, now=NOW + timedelta(seconds=9))
    assert again.events == []
    assert again.status.phase == "Ready"
    assert ready_cond(again).last_transition_time == NOW + timedelta(seconds=5)


@pytest.mark.parametrize(
    "not_ready, phase, ready_count, spare_count",
    [
        pytest.param([], "Ready", 20, 2, id="all-ready"),
        pytest.param(["1-3"], "Ready", 20, 1, id="a-spare-not-ready-yet"),
        pytest.param(["0-4"], "Provisioning", 19, 2, id="an-active-node-not-ready-yet"),
        pytest.param(["0-4", "0-5", "1-0"], "Provisioning", 17, 2, id="three-not-ready-yet"),
    ],
)
def test_ready_counts_nodes_that_report_ready(not_ready, phase, ready_count, spare_count):
    cluster = running()
    for slot in not_ready:
        cluster[name(slot)].ready = None  # no Ready condition yet (starting up)
    d = decide(observed(cluster))

    assert (d.status.phase, d.status.ready_count, d.status.spare_count) == (phase, ready_count, spare_count)
    assert (d.create, d.update, d.drain, d.remediation) == ([], [], [], ())


def test_missing_node_is_created_again_under_its_name():
    cluster = running()
    del cluster[name("1-1")]
    d = decide(observed(cluster))
    assert [c.name for c in d.create] == [name("1-1")]
    assert d.status.phase == "Provisioning"
    assert d.status.ready_count == 19


def test_group_shrinks_drains_the_nodes_it_no_longer_wants_with_the_block_end_as_deadline():
    d = decide(observed(running()), s=spec(14))
    assert {(x.deadline, x.reason) for x in d.drain} == {(END, "NotDesired")}
    assert {x.node for x in d.drain} >= {name(f"1-{j}") for j in range(4)}
    assert d.create == []
    assert d.status.phase == "Provisioning"
    assert d.wake_at == NOW + timedelta(seconds=1)


def test_group_shrunk_to_one_ultraserver_keeps_fourteen_active_nodes_and_its_spare():
    """20 -> 14: the group fits on the first UltraServer; once the drains are done it holds
    14 active nodes and that UltraServer's spare, like a fresh group of 14 (DESIGN 1)."""
    cluster = running()
    now = NOW
    d = decide(observed(cluster), s=spec(14), now=now, prior=READY_STATUS)
    for _ in range(3):
        apply(d, cluster, now)
        now += timedelta(seconds=1)
        d = decide(observed(cluster), s=spec(14), now=now, prior=d.status)

    assert (d.create, d.update, d.drain) == ([], [], [])
    assert Counter((n.labels[US_KEY], n.labels[naming.LABEL_ROLE]) for n in cluster.values()) == {
        (US0, "active"): 14, (US0, "spare"): 1}
    assert (d.status.ready_count, d.status.spare_count, d.status.desired_count) == (14, 1, 14)


@pytest.mark.parametrize("label", ["Unschedulable", "UnschedulablePendingReboot",
                                   "UnschedulablePendingReplacement"])
def test_a_node_with_an_unschedulable_health_label_is_never_drained_as_not_desired(label):
    cluster = running()
    cluster[name("1-1")].labels[naming.LABEL_HEALTH] = label
    cluster[name("1-1")].health_since = NOW  # within the grace: not yet judged
    d = decide(observed(cluster), s=spec(17))

    drained = {x.node for x in d.drain}
    assert drained == {name("1-0"), name("1-2"), name("1-3")}
    assert name("1-1") not in {u.name for u in d.update}


# --------------------------------------------------------------------------- end of the block


@pytest.mark.parametrize(
    "now",
    [
        pytest.param(TERMINATION, id="at-the-termination-time"),
        pytest.param(END - timedelta(seconds=1), id="just-before-the-end"),
    ],
)
def test_past_the_termination_time_every_node_drains_by_the_block_end(now):
    cluster = running()
    d = decide(observed(cluster), now=now, prior=FIRST.status)

    assert sorted(x.node for x in d.drain) == sorted(RUNNING)
    assert {(x.deadline, x.reason) for x in d.drain} == {(END, "BlockTerminating")}
    assert (d.create, d.update, d.remediation) == ([], [], ())
    assert d.status.phase == "Draining"
    assert conds(d) == [("Ready", "False", "BlockTerminating")]
    assert ready_cond(d).message == ("block rc-abc-0 stops at 2026-12-01T12:03:00+00:00; nodes drain from "
                                     "2026-12-01T12:02:40+00:00")
    assert (d.status.availability_zone, d.status.reserved_capacity_id) == (AZ, "rc-abc-0")
    assert d.status.next_transition_time == END
    # Nodes that never got the checkpoint signal (say, the operator was down through the lead)
    # get it now, before their pods are evicted.
    assert kinds(d.events) == [("Normal", "BlockTerminating"), ("Warning", "CheckpointRequested")]
    assert d.checkpoint is not None and set(d.checkpoint.nodes) == RUNNING
    assert d.wake_at == now + timedelta(seconds=1)


def test_past_the_termination_time_without_nodes_waits_for_the_end():
    d = decide(now=TERMINATION + timedelta(seconds=5))
    assert d.status.phase == "Waiting"
    assert d.drain == []
    assert d.wake_at == END


@pytest.mark.parametrize(
    "plan, now, message, wake, az",
    [
        pytest.param(TWO_BLOCKS, END + timedelta(seconds=30), "next block rc-abc-1 starts at 2026-12-01T12:05:00+00:00",
                     BLOCK2.start_time, AZ, id="in-the-gap"),
        pytest.param(PLAN, END, "training plan p has expired", None, None, id="plan-expired"),
    ],
)
def test_after_the_block_no_nodes_are_wanted(plan, now, message, wake, az):
    d = decide(plan=plan, now=now)
    assert d.status.phase == "Waiting"
    assert conds(d) == [("Ready", "False", "NoActiveBlock")]
    assert ready_cond(d).message == message
    assert (d.create, d.drain) == ([], [])
    assert d.wake_at == wake
    assert d.status.next_transition_time == wake
    assert d.status.availability_zone == az


def test_after_the_block_leftover_nodes_drain_at_once():
    d = decide(observed(running()), plan=TWO_BLOCKS, now=END + timedelta(seconds=30))
    assert sorted(x.node for x in d.drain) == sorted(RUNNING)
    assert {(x.deadline, x.reason) for x in d.drain} == {(END + timedelta(seconds=30), "NoActiveBlock")}
    assert d.status.phase == "Draining"
    assert d.wake_at == END + timedelta(seconds=31)


def test_next_block_creates_new_nodes_and_drains_the_old_blocks_nodes():
    now = BLOCK2.start_time + timedelta(seconds=1)
    d = decide(observed(running()), plan=TWO_BLOCKS, now=now)

    assert [c.name for c in d.create] == [name(f"0-{j}", h=H2) for j in range(18)] + [
        name(f"1-{j}", h=H2) for j in range(4)]
    assert {c.labels["hyperplan.dev/reserved-capacity"] for c in d.create} == {"rc-abc-1"}
    assert sorted(x.node for x in d.drain) == sorted(RUNNING)
    assert {(x.deadline, x.reason) for x in d.drain} == {(now, "OtherBlock")}
    assert d.status.reserved_capacity_id == "rc-abc-1"
    assert d.block == BLOCK2


# =========================================================================== health and remediation

FAIL_AT = NOW  # Ready=False from here; grace is 5 s
P1 = NOW + timedelta(seconds=10)


def failing(*slots: str, cluster: Cluster | None = None, since: datetime = FAIL_AT) -> Cluster:
    cluster = cluster if cluster is not None else running()
    for slot in slots:
        cluster[name(slot)].ready = "False"
        cluster[name(slot)].ready_since = since
    return cluster


READY_STATUS = decide(observed(running())).status


def test_a_failure_inside_its_grace_only_schedules_a_check():
    cluster = failing("0-1", since=P1 - timedelta(seconds=2))
    d = decide(observed(cluster), now=P1, prior=READY_STATUS)

    assert (d.create, d.update, d.drain, d.remediation) == ([], [], [], ())
    assert d.status.unhealthy_count == 0
    assert d.status.ready_count == 19
    assert d.wake_at == P1 + timedelta(seconds=3)  # when the grace ends


GRACE_END = FAIL_AT + timedelta(seconds=5)  # of a node failing at FAIL_AT


def marked(d: GroupDecision) -> list[str]:
    return [a.node for a in d.remediation if isinstance(a, health.MarkUnhealthy)]


@pytest.mark.parametrize(
    ("gap", "expected_wake", "expected_marked"),
    [
        pytest.param(timedelta(milliseconds=30), GRACE_END + timedelta(milliseconds=30), ["0-1", "0-10"],
                     id="30ms-apart-one-wake-at-the-later-acts-on-both"),
        pytest.param(timedelta(seconds=2), GRACE_END, ["0-1"], id="2s-apart-wake-at-the-first-acts-on-it"),
    ],
)
def test_close_health_deadlines_are_judged_in_one_pass(gap, expected_wake, expected_marked):
    cluster = failing("0-1")
    cluster = failing("0-10", cluster=cluster, since=FAIL_AT + gap)
    before = decide(observed(cluster), now=FAIL_AT + timedelta(seconds=1), prior=READY_STATUS)
    assert before.remediation == ()
    assert before.wake_at == expected_wake

    at_wake = decide(observed(cluster), now=before.wake_at, prior=READY_STATUS)
    assert marked(at_wake) == [name(s) for s in expected_marked]
    assert at_wake.status.unhealthy_count == len(expected_marked)


def test_a_pass_between_two_close_deadlines_holds_the_first_failure_for_the_second():
    """An event wakes the group 10 ms after the first grace ended, 20 ms before the second ends:
    nothing is acted on yet (neither is judged early, the first at most 0.5 s late), and the
    pass wakes at the second deadline, which acts on both."""
    cluster = failing("0-1")
    cluster = failing("0-10", cluster=cluster, since=FAIL_AT + timedelta(milliseconds=30))
    between = decide(observed(cluster), now=GRACE_END + timedelta(milliseconds=10), prior=READY_STATUS)
    assert (between.remediation, between.create, between.update, between.drain) == ((), [], [], [])
    assert between.status.unhealthy_count == 0
    assert between.wake_at == GRACE_END + timedelta(milliseconds=30)

    both = decide(observed(cluster), now=between.wake_at, prior=between.status)
    assert marked(both) == [name("0-1"), name("0-10")]


def test_a_failed_node_is_marked_and_replaced_by_the_spare_on_its_ultraserver():
    d = decide(observed(failing("0-1")), now=P1, prior=READY_STATUS)

    assert d.remediation == (
        health.MarkUnhealthy(name("0-1"), "Ready=False"),
        health.PromoteSpare(name("0-17"), name("0-1"), US0, True),
        health.Backfill(name("0-1"), "0-1", 1, naming.ROLE_SPARE, US0),
        # The spare serves from this pass on: the failed node's pods are evicted at once.
        health.EvictPods(name("0-1"), "Ready=False", start=True),
    )
    # The backfill gets a new name (generation 1) in the failed node's slot, as the new spare.
    assert [(c.name, c.role, c.slot, c.generation, c.taints) for c in d.create] == [
        (name("0-1") + "-g1", "spare", "0-1", 1, (naming.SPARE_TAINT,))]
    assert d.create[0].labels["hyperplan.dev/generation"] == "1"
    assert d.create[0].labels[US_KEY] == US0
    # Nothing is removed before its replacement is Ready (make before break).
    assert d.drain == []
    assert d.update == []
    st = d.status
    # The status describes the group once this pass is applied: the promoted spare serves as
    # active (20 ready), one spare is up, the backfill is still to come.
    assert (st.phase, st.unhealthy_count, st.ready_count, st.spare_count) == ("Provisioning", 1, 20, 1)
    assert conds(d)[1] == ("RemediationAllowed", "True", "WithinBounds")
    assert d.status.conditions[1].message == "1 of 22 nodes are unhealthy, within maxUnhealthy 2"


def test_remediation_makes_before_it_breaks():
    cluster = failing("0-1")
    p1 = decide(observed(cluster), now=P1, prior=READY_STATUS)
    apply(p1, cluster, P1, new_ready=None)  # the replacement is created but not Ready yet

    p2_at = P1 + timedelta(seconds=1)
    p2 = decide(observed(cluster), now=p2_at, prior=p1.status)
    assert p2.remediation == ()  # RemoveNode waits for the replacement
    assert (p2.create, p2.update, p2.drain) == ([], [], [])
    assert name("0-1") in {o for o in cluster}
    # The promoted spare now serves in the failed node's stead.
    assert cluster[name("0-17")].labels[naming.LABEL_ROLE] == "active"
    assert (p2.status.ready_count, p2.status.spare_count, p2.status.unhealthy_count) == (20, 1, 1)

    cluster[name("0-1") + "-g1"].ready = "True"
    p3_at = p2_at + timedelta(seconds=1)
    p3 = decide(observed(cluster), now=p3_at, prior=p2.status)
    assert p3.remediation == (health.RemoveNode(name("0-1"), "Ready=False"),)
    assert (p3.create, p3.update, p3.drain) == ([], [], [])

    apply(p3, cluster, p3_at)
    p4 = decide(observed(cluster), now=p3_at + timedelta(seconds=1), prior=p3.status)
    assert (p4.create, p4.update, p4.drain, p4.remediation) == ([], [], [], ())
    assert (p4.status.phase, p4.status.ready_count, p4.status.spare_count, p4.status.unhealthy_count) == (
        "Ready", 20, 2, 0)
    assert Counter((n.labels[US_KEY], n.labels[naming.LABEL_ROLE]) for n in cluster.values()) == {
        (US0, "active"): 17, (US0, "spare"): 1, (US1, "active"): 3, (US1, "spare"): 1}
    assert sorted(cluster) == sorted((set(RUNNING) - {name("0-1")}) | {name("0-1") + "-g1"})


@pytest.mark.parametrize(
    "failures, promoted",
    [
        pytest.param(["0-1"], {"0-17": "0-1"}, id="same-ultraserver"),
        # 1-3 now serves on the second UltraServer beyond its 3 active slots: the fill-first
        # layout calls its slot a spare, yet it stays active.
        pytest.param(["0-1", "0-10"], {"0-17": "0-1", "1-3": "0-10"}, id="across-ultraservers"),
    ],
)
def test_a_promoted_spare_keeps_its_active_role(failures, promoted):
    cluster = failing(*failures)
    d = decide(observed(cluster), now=P1, prior=READY_STATUS)
    now = P1
    for _ in range(4):
        apply(d, cluster, now)
        now += timedelta(seconds=1)
        d = decide(observed(cluster), now=now, prior=d.status)
        for spare in promoted:
            assert name(spare) not in {u.name for u in d.update}
            assert name(spare) not in {x.node for x in d.drain}
    for spare, failed_slot in promoted.items():
        n = cluster[name(spare)]
        assert n.labels[naming.LABEL_ROLE] == "active"
        assert n.labels[naming.LABEL_REPLACES] == name(failed_slot)
        assert naming.SPARE_TAINT not in n.taints
    assert not {name(f) for f in failures} & set(cluster)  # the failed nodes are gone


def test_a_spare_promoted_across_ultraservers_stays_active_and_the_group_keeps_its_size():
    """Two failures on the first UltraServer, which has one spare: the second failure is
    covered by the second UltraServer's spare (1-3). Both backfills are spares
    (Backfill.role == "spare"), so after remediation the group has 20 active nodes and 2
    spares again, as it asked for.
    """
    cluster = failing("0-1", "0-10")
    p1 = decide(observed(cluster), now=P1, prior=READY_STATUS)
    assert p1.remediation == (
        health.MarkUnhealthy(name("0-1"), "Ready=False"),
        health.MarkUnhealthy(name("0-10"), "Ready=False"),
        health.PromoteSpare(name("0-17"), name("0-1"), US0, True),
        health.PromoteSpare(name("1-3"), name("0-10"), US1, False),
        health.Backfill(name("0-1"), "0-1", 1, naming.ROLE_SPARE, US0),
        health.Backfill(name("0-10"), "0-10", 1, naming.ROLE_SPARE, US0),
        health.EvictPods(name("0-1"), "Ready=False", start=True),
        health.EvictPods(name("0-10"), "Ready=False", start=True),
    )
    now = P1
    for _ in range(4):
        apply(p1, cluster, now)
        now += timedelta(seconds=1)
        p1 = decide(observed(cluster), now=now, prior=p1.status)

    assert cluster[name("1-3")].labels[naming.LABEL_ROLE] == "active"
    assert (p1.create, p1.update, p1.drain, p1.remediation) == ([], [], [], ())
    roles = Counter(n.labels[naming.LABEL_ROLE] for n in cluster.values())
    assert roles == {"active": 20, "spare": 2}
    assert (p1.status.ready_count, p1.status.spare_count) == (20, 2)


def test_each_backfill_is_created_with_the_role_its_backfill_action_names():
    """Backfill(role=...) says what node fills the failed slot; the NodeSpec created for it
    must carry that role (a promoted spare's slot is refilled by a spare)."""
    cluster = failing("0-1", "0-10")
    p1 = decide(observed(cluster), now=P1, prior=READY_STATUS)
    backfills = {name(a.slot) + f"-g{a.generation}": a.role
                 for a in p1.remediation if isinstance(a, health.Backfill)}
    assert backfills == {name("0-1") + "-g1": "spare", name("0-10") + "-g1": "spare"}
    assert {c.name: c.role for c in p1.create} == backfills


@pytest.mark.parametrize(
    "max_unhealthy, failures, condition, first_action",
    [
        pytest.param(2, ["0-1", "0-10"], ("RemediationAllowed", "True", "WithinBounds"),
                     health.MarkUnhealthy(name("0-1"), "Ready=False"), id="two-of-max-two"),
        pytest.param(2, ["0-1", "0-10", "1-0"], ("RemediationAllowed", "False", "TooManyUnhealthy"),
                     None, id="three-of-max-two"),
        pytest.param("10%", ["0-1", "0-10", "1-0"], ("RemediationAllowed", "False", "TooManyUnhealthy"),
                     None, id="three-of-10-percent-of-22"),
        pytest.param("20%", ["0-1", "0-10", "1-0"], ("RemediationAllowed", "True", "WithinBounds"),
                     health.MarkUnhealthy(name("0-1"), "Ready=False"), id="three-of-20-percent-of-22"),
        pytest.param(0, ["0-1"], ("RemediationAllowed", "False", "TooManyUnhealthy"), None,
                     id="one-of-max-zero"),
    ],
)
def test_max_unhealthy_bounds_remediation(max_unhealthy, failures, condition, first_action):
    d = decide(observed(failing(*failures)), now=P1, prior=READY_STATUS, s=spec(max_unhealthy=max_unhealthy))
    assert d.status.unhealthy_count == len(failures)
    assert conds(d)[1] == condition
    assert (d.remediation[0] if d.remediation else None) == first_action
    warned = ("Warning", "TooManyUnhealthy") in kinds(d.events)
    assert warned is (first_action is None)


def test_too_many_unhealthy_pauses_remediation_and_warns_once():
    cluster = failing("0-1", "0-10", "1-0")
    d = decide(observed(cluster), now=P1, prior=READY_STATUS)

    message = "3 of 22 nodes are unhealthy, more than maxUnhealthy 2 allows; remediation paused"
    assert d.remediation == ()
    assert (d.create, d.update, d.drain) == ([], [], [])  # failed nodes stay, nothing is replaced
    # Two of US 0's nodes failed, more than its one spare, and the block has no free UltraServer.
    assert conds(d) == [("Ready", "False", "Provisioning"), ("RemediationAllowed", "False", "TooManyUnhealthy"),
                        ("UltraServerReplacement", "False", "NoFreeUltraServer")]
    assert d.status.conditions[1].message == message
    assert d.status.conditions[1].last_transition_time == P1
    assert kinds(d.events) == [("Normal", "Provisioning"), ("Warning", "NoFreeUltraServer"),
                               ("Warning", "TooManyUnhealthy")]
    assert d.events[0].message == "17/20 active nodes Ready, 2 spare(s) in use1-az3 on block rc-abc-0"
    assert d.events[2].message == message
    assert d.status.unhealthy_count == 3

    again = decide(observed(cluster), now=P1 + timedelta(seconds=1), prior=d.status)
    assert again.events == []
    assert again.remediation == ()
    assert again.status.conditions[1].last_transition_time == P1


def test_remediation_resumes_when_the_count_drops():
    cluster = failing("0-1", "0-10", "1-0")
    blocked = decide(observed(cluster), now=P1, prior=READY_STATUS)
    cluster[name("1-0")].ready = "True"
    cluster[name("1-0")].ready_since = P1
    d = decide(observed(cluster), now=P1 + timedelta(seconds=1), prior=blocked.status)

    assert conds(d)[1] == ("RemediationAllowed", "True", "WithinBounds")
    assert d.status.conditions[1].last_transition_time == P1 + timedelta(seconds=1)
    assert [type(a).__name__ for a in d.remediation] == [
        "MarkUnhealthy", "MarkUnhealthy", "PromoteSpare", "PromoteSpare", "Backfill", "Backfill", "EvictPods",
        "EvictPods"]


def test_no_remediation_past_the_termination_time():
    d = decide(observed(failing("0-1")), now=TERMINATION)
    assert d.remediation == ()
    assert d.create == []
    assert {x.node for x in d.drain} == set(RUNNING)


# --------------------------------------------------------------------------- plain (non-UltraServer) block

PLAIN_BLOCK = ReservedCapacity(id="rc-p5-0", availability_zone="use1-az1", instance_type="ml.p5.48xlarge",
                               instance_count=8, start_time=T0, end_time=END)
PLAIN_PLAN = BoundPlan("p", "hyperpod-cluster", "ml.p5.48xlarge", None, 1, (PLAIN_BLOCK,))


def test_plain_block_has_no_spares_and_backfills_an_active_node():
    s = spec(4, instance_type="ml.p5.48xlarge", max_unhealthy=1)
    first = decide(s=s, plan=PLAIN_PLAN)
    names = [c.name for c in first.create]
    assert [c.slot for c in first.create] == ["0", "1", "2", "3"]
    assert {c.role for c in first.create} == {"active"}
    assert all(c.taints == () and US_KEY not in c.labels for c in first.create)

    cluster = cluster_of(first.create)
    cluster[names[2]].ready = "False"
    cluster[names[2]].ready_since = FAIL_AT
    d = decide(observed(cluster), s=s, plan=PLAIN_PLAN, now=P1)
    assert d.remediation == (health.MarkUnhealthy(names[2], "Ready=False"),
                             health.Backfill(names[2], "2", 1, naming.ROLE_ACTIVE, None))
    assert [(c.name, c.role) for c in d.create] == [(names[2] + "-g1", "active")]


def test_plain_block_group_larger_than_the_block():
    d = decide(s=spec(16, instance_type="ml.p5.48xlarge"), plan=PLAIN_PLAN)
    assert d.status.phase == "Failed"
    assert conds(d) == [("Ready", "False", "InsufficientCapacity")]
    assert ready_cond(d).message == "16 instances requested, 8 of 8 left in the block"


# =========================================================================== FakeProvider


def node_spec(n: str = "hp-w-x-0", group: str = "w", taints=(naming.SPARE_TAINT,), role: str = "spare") -> placement.NodeSpec:
    return placement.NodeSpec(n, {naming.LABEL_GROUP: group, naming.LABEL_ROLE: role}, tuple(taints), role, None,
                       "ml.p5.48xlarge", "use1-az1")


def test_fake_provider_satisfies_the_protocol():
    assert isinstance(FakeProvider(), NodeProvider)


def test_fake_provider_records_calls_and_keeps_nodes():
    p = FakeProvider()
    p.create(node_spec("n1"))
    p.create(node_spec("n1"))  # idempotent: the node is not replaced
    p.create(node_spec("n2", group="other", taints=()))
    custom = naming.Taint("team", "x", "NoSchedule")
    p.nodes["n1"].spec.taints.append(client.V1Taint(key="team", value="x", effect="NoSchedule"))
    p.update("n1", node_spec("n1", taints=(), role="active"), {naming.SPARE_TAINT.key})
    p.cordon("n1")

    assert p.calls == [("create", "n1"), ("create", "n1"), ("create", "n2"), ("update", "n1"), ("cordon", "n1")]
    n1 = p.nodes["n1"]
    assert n1.metadata.labels == {naming.LABEL_GROUP: "w", naming.LABEL_ROLE: "active", LABEL_NODE_ID: "n1"}
    assert [(t.key, t.value, t.effect) for t in n1.spec.taints] == [(custom.key, custom.value, custom.effect)]
    assert n1.spec.unschedulable is True
    assert [n.metadata.name for n in p.list("w")] == ["n1"]
    assert [n.metadata.name for n in p.list("other")] == ["n2"]

    p.release("n1")
    p.release("n1")  # already gone: no error
    assert [n.metadata.name for n in p.list("w")] == []
    assert p.calls[-2:] == [("release", "n1"), ("release", "n1")]


@pytest.mark.parametrize("op", ["create", "update", "cordon", "release"])
def test_fake_provider_fail_on_raises_and_still_records(op):
    p = FakeProvider()
    p.create(node_spec("n1"))
    p.fail_on = {op}
    call = {
        "create": lambda: p.create(node_spec("n2")),
        "update": lambda: p.update("n1", node_spec("n1", role="active"), set()),
        "cordon": lambda: p.cordon("n1"),
        "release": lambda: p.release("n1"),
    }[op]
    target = "n2" if op == "create" else "n1"

    with pytest.raises(RuntimeError, match=re.escape(f"injected failure in {op}({target})")):
        call()
    assert p.calls[-1] == (op, target)
    # The failed operation changed nothing.
    assert sorted(p.nodes) == ["n1"]
    assert p.nodes["n1"].metadata.labels[naming.LABEL_ROLE] == "spare"
    assert p.nodes["n1"].spec.unschedulable is None


# =========================================================================== the apply step (actuation.groups)


def test_a_drain_held_by_a_pdb_waits_until_its_deadline_then_removes_the_node():
    cluster = running()
    node = name("1-0")
    cluster.pods.pods[node] = ["default/guarded", "default/free"]
    cluster.pods.guarded = {"default/guarded"}
    d = decide(observed(cluster), s=spec(14), prior=READY_STATUS)
    assert node in {x.node for x in d.drain}
    cluster.provider.calls.clear()
    first = apply(d, cluster, NOW)

    assert ("cordon", node) in cluster.provider.calls
    assert ("release", node) not in cluster.provider.calls
    assert node in cluster
    assert cluster[node].node.spec.unschedulable is True
    assert cluster.pods.pods[node] == ["default/guarded"]
    assert any(ev.reason == "Draining" and body["metadata"]["name"] == node for body, ev in first.events)

    # Cordoned already: no second cordon, no second Draining event; past the deadline it goes.
    d2 = decide(observed(cluster, END), s=spec(14), now=END - timedelta(seconds=1), prior=d.status)
    drain = next(x for x in d2.drain if x.node == node)
    cluster.provider.calls.clear()
    at_deadline = apply(d2.__class__(status=d2.status, drain=[dataclasses.replace(drain, deadline=END)]), cluster, END)
    assert cluster.provider.calls == [("release", node)]
    assert node not in cluster
    assert [ev.reason for _, ev in at_deadline.events] == ["NodeRemoved"]


def test_drain_node_without_a_deadline_waits_for_every_pod():
    cluster = running()
    node = name("0-0")
    cluster.pods.pods[node] = ["default/guarded"]
    cluster.pods.guarded = {"default/guarded"}
    raw = cluster.provider.nodes[node]
    outcome = drain_node(cluster.provider, cluster.pods, raw, "GroupDeleted", None, END + timedelta(hours=1))
    assert outcome.released is None and outcome.progress.pods_left == 1
    assert [ev.reason for _, ev in outcome.events] == ["Draining"]
    assert outcome.events[0][1].message == f"{node} cordoned (GroupDeleted); evicting pods until none is left"
    cluster.pods.guarded = set()
    outcome = drain_node(cluster.provider, cluster.pods, raw, "GroupDeleted", None, END + timedelta(hours=1))
    assert outcome.released == f"{node} deleted"
    assert node not in cluster


@pytest.mark.parametrize(
    "labels, recorded, first_seen, label, since",
    [
        pytest.param({naming.LABEL_SAGEMAKER_HEALTH: "Unschedulable"}, None, NOW, "Unschedulable", NOW,
                     id="sagemaker-label-first-seen-now"),
        pytest.param({naming.LABEL_HEALTH: "Schedulable", naming.LABEL_SAGEMAKER_HEALTH: "UnschedulablePendingReboot"},
                     None, NOW, "UnschedulablePendingReboot", NOW, id="the-bad-label-wins"),
        pytest.param({naming.LABEL_SAGEMAKER_HEALTH: "Unschedulable"}, "Unschedulable@2026-12-01T12:00:02Z", NOW,
                     "Unschedulable", T0 + timedelta(seconds=2), id="the-nodes-earlier-record-wins-after-a-restart"),
        pytest.param({naming.LABEL_SAGEMAKER_HEALTH: "Unschedulable"}, "UnschedulablePendingReboot@2026-12-01T12:00:02Z",
                     NOW, "Unschedulable", NOW, id="a-record-of-another-value-is-ignored"),
        pytest.param({naming.LABEL_HEALTH: "Schedulable"}, None, NOW, "Schedulable", None, id="healthy"),
    ],
)
def test_observe_node_reads_the_health_label_and_its_start(labels, recorded, first_seen, label, since):
    node = client.V1Node(metadata=client.V1ObjectMeta(
        name="n", labels={LABEL_NODE_ID: "hp-n", naming.LABEL_SLOT: "0-1", naming.LABEL_GENERATION: "x", **labels},
        annotations={health.ANNOTATION_HEALTH_SINCE: recorded} if recorded else None), spec=client.V1NodeSpec())
    seen = observe_node(node, NOW + timedelta(seconds=30), KEYS, lambda n, v: first_seen, nid="hp-n")  # the record's id
    assert (seen.name, seen.health.health_label, seen.health.health_label_since) == ("hp-n", label, since)
    assert (seen.health.slot, seen.health.generation, seen.ready) == ("0-1", 0, False)  # bad generation: 0


# =========================================================================== the group memory (planning.memory)


def present(cluster: Cluster) -> list[PresentNode]:
    return [PresentNode(n, cluster[n].labels, unschedulable_health(cluster[n].labels)) for n in cluster]


def test_memory_drops_a_vanished_node_once_its_slot_is_replaced():
    cluster = running()
    observed(cluster, NOW)
    gone = name("0-3")
    del cluster[gone]  # deleted from under the group
    later = NOW + timedelta(seconds=1)
    nodes = observed(cluster, later)
    assert [(n.name, n.health.exists, n.health.deleted_since) for n in nodes if not n.health.exists] == [
        (gone, False, later)]
    assert [v.name for v in cluster.memory.vanished("w")] == [gone]

    # Its slot gets a newer generation: the entry goes, from the status too.
    cluster.provider.create(dataclasses.replace(
        next(s for s in FIRST.create if s.name == gone), name=gone + "-g1",
        labels={**next(s for s in FIRST.create if s.name == gone).labels, naming.LABEL_GENERATION: "1"}))
    nodes = observed(cluster, later + timedelta(seconds=1))
    assert all(n.health.exists for n in nodes)
    assert cluster.memory.vanished("w") == []


def test_memory_forgets_first_sights_and_releases_of_nodes_that_are_gone():
    m = GroupMemory()
    a, b = PresentNode("a", {}, "Unschedulable"), PresentNode("b", {}, None)
    assert m.first_sight("g", "a", "Unschedulable", NOW) == NOW
    assert m.first_sight("g", "a", "Unschedulable", NOW + timedelta(seconds=5)) == NOW  # the first sight stays
    m.first_sight("g", "b", "Unschedulable", NOW)  # b's label has gone since
    m.observe("g", [a, b], NOW)
    m.prune("g", [a, b])
    assert m.first_sight("g", "b", "Unschedulable", P1) == P1  # forgotten: a new signal starts anew
    assert m.first_sight("g", "a", "Unschedulable", P1) == NOW  # still carried: remembered
    m.prune("g", [a, b])  # b's new sight goes again

    m.note_releasing("g", ["a", "c"])  # the operator removes a (and c, which it never saw)
    m.observe("g", [b], P1)
    m.prune("g", [b])
    assert m.vanished("g") == []  # a was released: no failure
    assert m.size() == 2  # the group and b as last seen: nothing of a, c or the first sights
    assert m.first_sight("g", "a", "Unschedulable", P1) == P1


def test_a_deleted_group_leaves_nothing_in_the_memory():
    cluster = running()
    observed(cluster, NOW)
    del cluster[name("0-3")]
    observed(cluster, NOW + timedelta(seconds=1))
    cluster.memory.bind("w", "p")
    cluster.memory.note_short_of_free_nodes("w", True)
    assert cluster.memory.size() > 0 and cluster.memory.groups_of("p") == ["w"]

    cluster.memory.forget_group("w")
    assert cluster.memory.size() == 0
    assert (cluster.memory.groups_of("p"), cluster.memory.short_of_free_nodes(), cluster.memory.vanished("w")) == (
        [], [], [])
    # A late deletion event of one of its nodes does not bring it back.
    cluster.memory.note_deleted("w", name("0-4"), {}, P1)
    assert cluster.memory.size() == 0


@pytest.mark.parametrize(
    "reads, moved",
    [
        pytest.param([(("a", "1"),)], [True], id="first-pass-wakes-the-plan"),
        pytest.param([(("a", "1"),), (("a", "1"),)], [True, False], id="same-nodes-no-wake"),
        pytest.param([(("a", "1"),), (("a", "2"),)], [True, True], id="a-node-relabelled"),
        pytest.param([(("a", "1"),), (("a", "1", "False"),)], [True, True], id="a-node-not-ready"),
        pytest.param([(("a", "1"),), (("a", "1", "True", "rv-2"),)], [True, False], id="a-heartbeat-no-wake"),
        pytest.param([(("a", "1"),), (("a", "1", "True", "rv-1", True),)], [True, True], id="a-node-deleting"),
        pytest.param([(("a", "1"),), (("a", "1"), ("b", "1"))], [True, True], id="a-node-added"),
        pytest.param([(("a", "1"), ("b", "1")), (("a", "1"),)], [True, True], id="a-node-gone"),
    ],
)
def test_a_plan_is_woken_when_its_groups_nodes_moved(reads, moved):
    """The group pass wakes its plan only when what the plan counts of its nodes changed since its
    last pass (wiring.nodes no longer wakes the plan on every node event): a heartbeat does not."""
    from hyperplan.controllers.group.reconciler import node_fingerprint

    m = GroupMemory()
    def node(name: str, label: str, ready: str = "True", rv: str = "rv-1", deleting: bool = False) -> client.V1Node:
        return client.V1Node(
            metadata=client.V1ObjectMeta(name=name, labels={"hyperplan.dev/role": label}, resource_version=rv,
                                         deletion_timestamp=NOW if deleting else None),
            status=client.V1NodeStatus(conditions=[client.V1NodeCondition(type="Ready", status=ready)]))

    raw = lambda reads: [node(*r) for r in reads]  # noqa: E731
    assert [m.note_nodes_read("w", node_fingerprint(raw(r))) for r in reads] == moved
    m.forget_group("w")
    assert m.size() == 0


@pytest.mark.parametrize(
    "releasing, by_operator, vanished",
    [
        pytest.param(False, False, True, id="deleted-from-under-the-group"),
        pytest.param(True, False, False, id="released-by-the-operator"),
        pytest.param(False, True, False, id="last-state-says-the-operator-removed-it"),
    ],
)
def test_a_deletion_event_is_a_failure_only_when_the_operator_did_not_remove_the_node(releasing, by_operator,
                                                                                      vanished):
    m = GroupMemory()
    m.observe("g", [PresentNode("a", {naming.LABEL_SLOT: "0"})], NOW)
    if releasing:
        m.note_releasing("g", ["a"])
    m.note_deleted("g", "a", {naming.LABEL_SLOT: "0"}, NOW, by_operator=by_operator)
    assert [v.name for v in m.vanished("g")] == (["a"] if vanished else [])


@pytest.mark.parametrize("labels, recorded_cordon, want", [
    pytest.param({}, True, True, id="the-record-says-the-drain-cordoned-it"),
    pytest.param({naming.LABEL_HEALTH: naming.HEALTH_PENDING_REPLACEMENT}, False, True, id="marked-for-replacement"),
    pytest.param({}, False, False, id="neither-a-failure"),
    pytest.param({naming.LABEL_HEALTH: naming.HEALTH_SCHEDULABLE}, False, False, id="schedulable-a-failure"),
])
def test_whose_deletion_it_was_comes_from_the_record_not_an_annotation(labels, recorded_cordon, want):
    """A kubelet may write hyperplan.dev/cordoned on its own Node; only the group's record says
    that the drain's cordon was the operator's (wiring.nodes reads its entry's ``cordoned``)."""
    assert health.removed_by_operator(labels, recorded_cordon) is want


# =========================================================================== checkpoint before drain


def obs(node: str, *, signalled: bool = False, exists: bool = True, deleting: bool = False) -> ObservedGroupNode:
    conditions = (health.NodeCondition(CONDITION_BLOCK_TERMINATING, "True", T0),) if signalled else ()
    return ObservedGroupNode(health=health.NodeObservation(name=node, exists=exists, conditions=conditions),
                             labels={}, taints=(), unschedulable=False, ready=True, deleting=deleting)


LEAD = timedelta(seconds=5)


@pytest.mark.parametrize(
    "now, nodes, expected",
    [
        pytest.param(CHECKPOINT - timedelta(seconds=1), [obs("a"), obs("b")], None, id="before-the-lead"),
        pytest.param(CHECKPOINT, [obs("b"), obs("a")], ("a", "b"), id="at-the-lead-every-node"),
        pytest.param(CHECKPOINT + timedelta(seconds=2), [obs("a", signalled=True), obs("b")], ("b",),
                     id="only-nodes-not-signalled-yet"),
        pytest.param(CHECKPOINT + timedelta(seconds=2), [obs("a", signalled=True), obs("b", signalled=True)], None,
                     id="all-signalled-nothing-to-do"),
        pytest.param(CHECKPOINT, [obs("a"), obs("gone", exists=False), obs("going", deleting=True)], ("a",),
                     id="not-nodes-that-are-gone-or-going"),
        pytest.param(TERMINATION + timedelta(seconds=3), [obs("a")], ("a",), id="late-still-before-the-drain"),
    ],
)
def test_plan_checkpoint(now, nodes, expected):
    cp = plan_checkpoint("rc-abc-0", TERMINATION, LEAD, nodes, now)
    assert (cp.nodes if cp else None) == expected
    if cp:
        assert (cp.block, cp.termination, cp.annotation) == ("rc-abc-0", TERMINATION, "2026-12-01T12:02:40Z")


@pytest.mark.parametrize(
    "lead, termination, expected",
    [
        pytest.param(timedelta(minutes=10), datetime(2027, 1, 3, 10, 30, tzinfo=UTC),
                     datetime(2027, 1, 3, 10, 20, tzinfo=UTC), id="sagemaker-10-min"),
        pytest.param(LEAD, TERMINATION, CHECKPOINT, id="demo-5-s"),
        pytest.param(timedelta(0), TERMINATION, TERMINATION, id="no-lead-signals-at-the-drain"),
    ],
)
def test_checkpoint_time(lead, termination, expected):
    assert checkpoint_time(termination, lead) == expected


def test_the_checkpoint_signal_comes_at_the_lead_once_and_the_drain_only_at_the_termination_time():
    cluster = running()
    cluster.pods.pods[name("0-0")] = ["default/trainer-0"]
    before = decide(observed(cluster, CHECKPOINT - timedelta(seconds=1)), now=CHECKPOINT - timedelta(seconds=1),
                    prior=READY_STATUS)
    assert before.checkpoint is None and before.wake_at == CHECKPOINT

    at = decide(observed(cluster, CHECKPOINT), now=CHECKPOINT, prior=before.status)
    assert at.checkpoint is not None and set(at.checkpoint.nodes) == RUNNING
    assert at.drain == [] and at.status.phase == "Ready"  # no drain before the termination time
    assert at.events == [Event("Warning", "CheckpointRequested",
                               "block rc-abc-0 reaches its termination time at 2026-12-01T12:02:40Z: checkpoint "
                               "and exit; pods are evicted from then on (annotation "
                               "hyperplan.dev/block-termination-time); 22 node(s) signalled")]
    assert at.wake_at == TERMINATION
    cluster.provider.calls.clear()
    applied = apply(at, cluster, CHECKPOINT)

    assert cluster.pods.annotations == {"default/trainer-0": {
        "hyperplan.dev/block-termination-time": "2026-12-01T12:02:40Z"}}
    assert [(ref["metadata"], ev.type, ev.reason) for ref, ev in applied.pod_events] == [
        ({"name": "trainer-0", "namespace": "default"}, "Warning", "CheckpointRequested")]
    assert sorted(n for op, n in cluster.provider.calls if op == "set_condition") == sorted(RUNNING)
    condition = next(c for c in cluster[name("0-0")].node.status.conditions if c.type == CONDITION_BLOCK_TERMINATING)
    assert (condition.status, condition.reason, condition.last_transition_time) == (
        "True", "CheckpointRequested", CHECKPOINT)

    # The next pass (woken by the node changes) has nothing left to signal, and posts nothing.
    again = decide(observed(cluster, CHECKPOINT + timedelta(seconds=1)), now=CHECKPOINT + timedelta(seconds=1),
                   prior=at.status)
    assert again.checkpoint is None and again.events == []
    # At the termination time the drain starts, with no second signal.
    drain = decide(observed(cluster, TERMINATION), now=TERMINATION, prior=again.status)
    assert drain.checkpoint is None
    assert {x.node for x in drain.drain} == RUNNING
    assert kinds(drain.events) == [("Normal", "BlockTerminating")]


# =========================================================================== evacuation before removal


def test_a_dead_nodes_pods_are_evicted_then_forced_out_and_only_then_is_the_node_removed():
    cluster = failing("0-1")  # Ready=False: dead
    failed = name("0-1")
    cluster.pods.pods[failed] = ["default/trainer-1", "default/guarded"]
    cluster.pods.guarded = {"default/guarded"}  # its eviction is refused (a PDB), so it stays

    p1 = decide(observed(cluster, P1), now=P1, prior=READY_STATUS)
    apply(p1, cluster, P1)  # promoted, backfill created Ready; pods evicted
    assert cluster.pods.pods[failed] == ["default/guarded"]
    assert cluster.pods.calls == [("evict", failed)]

    t = P1 + timedelta(seconds=1)
    p2 = decide(observed(cluster, t), now=t, prior=p1.status)
    # The backfill is Ready, but a pod is still on the failed node: no removal yet.
    assert [type(a).__name__ for a in p2.remediation] == ["EvictPods"]
    assert p2.remediation[0] == health.EvictPods(failed, "Ready=False")
    assert p2.wake_at == t + timedelta(seconds=1)
    apply(p2, cluster, t)
    assert failed in cluster

    # 3 s (demo) after the eviction started, the dead node's pods are marked Failed and deleted.
    t = P1 + DEMO.dead_node_eviction_timeout
    p3 = decide(observed(cluster, t), now=t, prior=p2.status)
    assert p3.remediation == (health.EvictPods(failed, "Ready=False", force=True),)
    cluster.pods.calls.clear()
    applied = apply(p3, cluster, t)
    assert cluster.pods.calls == [("force_delete", failed)]
    assert cluster.pods.conditions["default/guarded"] == [{
        "type": "DisruptionTarget", "status": "True", "reason": "DeletionByHyperplan",
        "message": f"hyperplan: node {failed} failed (Ready=False) and its replacement serves; the node does not "
                   "answer, so its pods are deleted",
        "lastTransitionTime": "2026-12-01T12:00:23Z"}]
    assert [(ev.type, ev.reason) for _, ev in applied.events] == [("Warning", "PodsDeleted")]
    assert failed in cluster  # removed on the next pass, once no pod is seen on it

    t += timedelta(seconds=1)
    p4 = decide(observed(cluster, t), now=t, prior=p3.status)
    assert p4.remediation == (health.RemoveNode(failed, "Ready=False"),)
    apply(p4, cluster, t)
    assert failed not in cluster


def test_a_live_failed_nodes_pods_are_evicted_never_forced_and_hold_its_removal():
    cluster = running()
    failed = name("0-1")
    cluster[failed].labels[naming.LABEL_HEALTH] = "Unschedulable"  # a health agent says so; the kubelet answers
    cluster[failed].health_since = FAIL_AT
    cluster.pods.pods[failed] = ["default/guarded"]
    cluster.pods.guarded = {"default/guarded"}
    d = decide(observed(cluster, P1), now=P1, prior=READY_STATUS)
    assert health.EvictPods(failed, "NodeHealthStatus=Unschedulable", start=True) in d.remediation
    now = P1
    for _ in range(5):
        apply(d, cluster, now)
        now += timedelta(seconds=10)
        d = decide(observed(cluster, now), now=now, prior=d.status)
    # (marked, its label now says UnschedulablePendingReplacement)
    assert d.remediation == (health.EvictPods(failed, "NodeHealthStatus=UnschedulablePendingReplacement"),)
    assert ("force_delete", failed) not in cluster.pods.calls
    assert failed in cluster and cluster.pods.pods[failed] == ["default/guarded"]

    cluster.pods.guarded = set()  # the budget allows it now
    apply(d, cluster, now)
    now += timedelta(seconds=1)
    d = decide(observed(cluster, now), now=now, prior=d.status)
    assert d.remediation == (health.RemoveNode(failed, "NodeHealthStatus=UnschedulablePendingReplacement"),)


def test_without_spares_the_pods_leave_once_the_backfill_is_ready():
    s = spec(4, instance_type="ml.p5.48xlarge", max_unhealthy=1)
    first = decide(s=s, plan=PLAIN_PLAN)
    cluster = cluster_of(first.create)
    failed = first.create[2].name
    cluster[failed].ready = "False"
    cluster[failed].ready_since = FAIL_AT
    cluster.pods.pods[failed] = ["default/trainer-2"]
    d = decide(observed(cluster, P1), s=s, plan=PLAIN_PLAN, now=P1)
    assert not any(isinstance(a, health.EvictPods) for a in d.remediation)  # nothing serves in its stead yet
    apply(d, cluster, P1, new_ready=None)
    t = P1 + timedelta(seconds=1)
    d = decide(observed(cluster, t), s=s, plan=PLAIN_PLAN, now=t, prior=d.status)
    assert d.remediation == ()
    cluster[failed + "-g1"].ready = "True"
    d = decide(observed(cluster, t), s=s, plan=PLAIN_PLAN, now=t, prior=d.status)
    assert d.remediation == (health.EvictPods(failed, "Ready=False", start=True),)
    apply(d, cluster, t)
    t += timedelta(seconds=1)
    d = decide(observed(cluster, t), s=s, plan=PLAIN_PLAN, now=t, prior=d.status)
    assert d.remediation == (health.RemoveNode(failed, "Ready=False"),)


class _NodeApi:
    """A recording stand-in for the client's CoreV1Api: one node whose resourceVersion moves."""

    def __init__(self, rv: str, moves_after_read: int = 0):
        self.rv, self.calls, self.moves = rv, [], moves_after_read

    def read_node(self, name):
        self.calls.append(("read", name))
        rv = self.rv
        if self.moves:  # another writer (the node lifecycle controller) changes it right after the read
            self.moves -= 1
            self.rv = str(int(self.rv) + 1)
        return client.V1Node(metadata=client.V1ObjectMeta(name=name, resource_version=rv),
                             spec=client.V1NodeSpec(taints=[client.V1Taint(key=naming.SPARE_TAINT.key,
                                                                           effect="NoSchedule")]))

    def patch_node(self, name, body):
        from kubernetes.client.rest import ApiException

        sent = (body.get("metadata") or {}).get("resourceVersion")
        self.calls.append(("patch", name, sent))
        if sent is not None and sent != self.rv:
            raise ApiException(status=409, reason="Conflict")


@pytest.mark.parametrize(
    "last_seen_rv, moves, calls",
    [
        pytest.param(None, 0, [("read", "n"), ("patch", "n", "7")], id="nothing-seen-reads-first-writes-over-it"),
        pytest.param("7", 0, [("patch", "n", "7")], id="seen-current-patches-at-once"),
        pytest.param("6", 0, [("patch", "n", "6"), ("read", "n"), ("patch", "n", "7")],
                     id="seen-stale-409-reads-again"),
        pytest.param(None, 1, [("read", "n"), ("patch", "n", "7"), ("read", "n"), ("patch", "n", "8")],
                     id="changed-between-read-and-write-409-reads-again"),
    ],
)
def test_kwok_promotion_patches_from_the_node_last_seen_with_its_resource_version(last_seen_rv, moves, calls):
    """A taint list is written over the resourceVersion it was built from, never blind: a taint
    another controller added or removed in between is a conflict and a new read."""
    from hyperplan.actuation.providers.kwok import KwokProvider

    api = _NodeApi(rv="7", moves_after_read=moves)
    provider = KwokProvider(kube=type("K", (), {"core": api})())
    seen = None if last_seen_rv is None else client.V1Node(
        metadata=client.V1ObjectMeta(name="n", resource_version=last_seen_rv),
        spec=client.V1NodeSpec(taints=[client.V1Taint(key=naming.SPARE_TAINT.key, effect="NoSchedule")]))
    provider.promote_spare("n", "failed", seen)
    assert api.calls == calls


# =========================================================================== values others wrote badly (planning.reading)

NAIVE = "2026-12-01T12:00:00"  # no timezone
SIXTY_DIGITS = "1" * 60


def spoiled(cluster: Cluster) -> Cluster:
    """A group whose nodes 0-3 to 0-11 carry values written by someone else, none of them readable."""
    def annotate(slot: str, key: str, value: str) -> None:
        cluster[name(slot)].node.metadata.annotations = {**(cluster[name(slot)].node.metadata.annotations or {}),
                                                         key: value}
    annotate("0-3", health.ANNOTATION_EVICTING_SINCE, NAIVE)
    annotate("0-9", health.ANNOTATION_HEALTH_SINCE, f"Unschedulable@{NAIVE}")
    annotate("0-11", naming.ANNOTATION_CORDONED, "true")
    annotate("0-11", "hyperplan.dev/lent", "{not json")
    cluster[name("0-5")].labels[naming.LABEL_GENERATION] = SIXTY_DIGITS
    cluster[name("0-7")].labels[naming.LABEL_GENERATION] = "-4"
    return cluster


def test_a_pass_lists_each_unreadable_value_with_its_node():
    seen = spoiled(running()).observe(NOW)
    assert sorted((body["metadata"]["name"], f.message) for body, f in seen.unreadable) == [
        (name("0-11"), f"node {name('0-11')}: annotation hyperplan.dev/lent: '{{not json' is not JSON; ignored"),
        (name("0-3"), f"node {name('0-3')}: annotation hyperplan.dev/evicting-since: '{NAIVE}' has no timezone; "
                      "ignored"),
        (name("0-5"), f"node {name('0-5')}: label hyperplan.dev/generation: '{SIXTY_DIGITS}' is out of range "
                      "(0 to 1000000); ignored"),
        (name("0-7"), f"node {name('0-7')}: label hyperplan.dev/generation: '-4' is out of range (0 to 1000000); "
                      "ignored"),
        (name("0-9"), f"node {name('0-9')}: annotation hyperplan.dev/health-signal-since: 'Unschedulable@{NAIVE}' "
                      "has a time that has no timezone; ignored"),
    ]


def test_unreadable_values_on_some_nodes_never_stop_another_nodes_remediation():
    d = decide(observed(spoiled(failing("0-1"))), now=P1, prior=READY_STATUS)
    assert d.remediation == (
        health.MarkUnhealthy(name("0-1"), "Ready=False"),
        health.PromoteSpare(name("0-17"), name("0-1"), US0, True),
        health.Backfill(name("0-1"), "0-1", 1, naming.ROLE_SPARE, US0),
        health.EvictPods(name("0-1"), "Ready=False", start=True),
    )
    assert [c.name for c in d.create] == [name("0-1") + "-g1"]
    # The spoiled generations read as absent (0): the labels are set right again, no node is renamed.
    assert sorted((u.name, dict(u.labels).get(naming.LABEL_GENERATION)) for u in d.update) == [
        (name("0-5"), "0"), (name("0-7"), "0")]
    assert d.drain == []


def test_unreadable_values_on_some_nodes_never_stop_the_block_end_drains():
    d = decide(observed(spoiled(running()), TERMINATION), now=TERMINATION, prior=FIRST.status)
    assert sorted(x.node for x in d.drain) == sorted(RUNNING)
    assert {(x.deadline, x.reason) for x in d.drain} == {(END, "BlockTerminating")}


def test_an_eviction_start_without_a_timezone_starts_the_eviction_again():
    """A dead node's pods are forced out a timeout after the eviction started; a start that does
    not read is no start, so the eviction starts again (and its time is written again)."""
    cluster = failing("0-1")
    failed = name("0-1")
    cluster.pods.pods[failed] = ["default/guarded"]
    cluster.pods.guarded = {"default/guarded"}
    p1 = decide(observed(cluster, P1), now=P1, prior=READY_STATUS)
    apply(p1, cluster, P1)
    cluster[failed].node.metadata.annotations[health.ANNOTATION_EVICTING_SINCE] = NAIVE

    t = P1 + DEMO.dead_node_eviction_timeout
    p2 = decide(observed(cluster, t), now=t, prior=p1.status)
    assert p2.remediation == (health.EvictPods(failed, "Ready=False", start=True),)
    apply(p2, cluster, t)
    assert reading.read_time(cluster[failed].node.metadata.annotations[health.ANNOTATION_EVICTING_SINCE]) == t


# --------------------------------------------------------------------------- the recovery ladder

LADDER_SPEC = spec(reboot_budget=1)


def test_the_first_failure_is_rebooted_after_its_spare_is_promoted():
    d = decide(observed(failing("0-1")), now=P1, prior=READY_STATUS, s=LADDER_SPEC)
    assert d.remediation == (
        health.MarkUnhealthy(name("0-1"), "Ready=False", health_status="UnschedulablePendingReboot"),
        health.PromoteSpare(name("0-17"), name("0-1"), US0, True),
        health.RebootNode(name("0-1"), "Ready=False"),
        health.EvictPods(name("0-1"), "Rebooting", start=True),  # its pods move to the spare
    )
    assert d.create == []  # no new capacity
    assert d.recovery[name("0-1")].rebooting_since == P1


def test_never_more_reboots_at_once_than_spares_to_cover_them():
    """Two active nodes of one UltraServer fail together and it has one spare: the first is
    rebooted (its spare takes over), the second replaced, so no job is left short of its domain
    for the length of a reboot."""
    d = decide(observed(failing("0-1", "0-2")), now=P1, prior=READY_STATUS, s=LADDER_SPEC)
    reboots = [a.node for a in d.remediation if isinstance(a, health.RebootNode)]
    marks = {a.node: a.health_status for a in d.remediation if isinstance(a, health.MarkUnhealthy)}
    assert reboots == [name("0-1")]
    assert marks == {name("0-1"): "UnschedulablePendingReboot", name("0-2"): "UnschedulablePendingReplacement"}
    assert [a.replacing for a in d.remediation if isinstance(a, health.Backfill)] == [name("0-2")]


# =========================================================================== the last rung: an UltraServer replaced

from hyperplan.api.models import UltraServerReplacement  # noqa: E402
from hyperplan.planning import recovery  # noqa: E402

ONE_US = spec(17)  # 17 active + 1 spare: all on US 0; US 1 free
ONE_US_FIRST = decide(s=ONE_US)


def one_us_running(*failed: str, since: datetime = FAIL_AT) -> Cluster:
    return failing(*failed, cluster=cluster_of(ONE_US_FIRST.create), since=since)


def moved(d: GroupDecision) -> list[tuple[str, str, str]]:
    return [(r.failed, r.replacement, r.reason) for r in d.status.ultra_server_replacements]


def test_failures_beyond_its_spares_move_the_group_to_a_free_ultraserver_checkpoint_first():
    cluster = one_us_running("0-1", "0-2")  # two failed, one spare: US 0 cannot hold 17
    d = decide(observed(cluster), now=P1, s=ONE_US, prior=decide(observed(one_us_running()), s=ONE_US).status)

    assert moved(d) == [(US0, US1, "FailuresBeyondSpares")]
    assert d.status.ultra_server_replacements[0].since == P1
    # Its nodes are made on US 1 at once (17 active and US 1's spare), nothing is done about US 0's
    # failed nodes but their leaving: no promotion, no backfill there.
    assert sorted(s.slot for s in d.create) == sorted(f"1-{j}" for j in range(18))
    assert {s.ultraserver_id for s in d.create} == {US1}
    assert d.remediation == ()
    # US 0's nodes are asked to checkpoint now and drain from the checkpoint lead on.
    assert d.checkpoint is not None and sorted(d.checkpoint.nodes) == sorted(s.name for s in ONE_US_FIRST.create)
    assert d.checkpoint.termination == P1 + DEMO.checkpoint_lead
    assert d.checkpoint.message.startswith(f"UltraServer {US0} is replaced by {US1}: its nodes drain at ")
    assert d.drain == []
    assert d.wake_at <= P1 + DEMO.checkpoint_lead
    assert ("UltraServerReplacement", "True", "UltraServerReplaced") in conds(d)
    assert ("Warning", "UltraServerReplaced") in kinds(d.events)
    assert kinds(d.plan_events) == [("Warning", "UltraServerReplaced")]
    assert d.ultraserver_reasons == ("FailuresBeyondSpares",)  # counted once, by the pass that moved
    assert "2 of the group's nodes on UltraServer" in d.plan_events[0].message
    assert d.status.phase == "Provisioning"

    # After the lead: every node of US 0 drains (the failed ones too), none is made again there,
    # and the replacement is not announced twice.
    apply(d, cluster, P1)
    later = P1 + DEMO.checkpoint_lead
    again = decide(observed(cluster, later), now=later, s=ONE_US, prior=d.status)
    assert moved(again) == moved(d)
    assert sorted(x.node for x in again.drain) == sorted(s.name for s in ONE_US_FIRST.create)
    assert {x.reason for x in again.drain} == {"UltraServerReplaced"}
    assert again.create == [] and again.remediation == ()
    assert ("Warning", "UltraServerReplaced") not in kinds(again.events) and again.ultraserver_reasons == ()
    assert again.status.ready_count == 17 and again.status.spare_count == 1
    assert again.status.phase == "Ready"  # it serves on US 1 while US 0's nodes leave
    assert again.status.unhealthy_count == 0  # the leaving nodes are not the group's to count


def test_one_failure_within_the_spares_is_no_reason_to_move():
    cluster = one_us_running("0-1")
    d = decide(observed(cluster), now=P1, s=ONE_US)

    assert moved(d) == []
    assert "UltraServerReplacement" not in [c for c, _, _ in conds(d)]
    assert any(isinstance(a, health.PromoteSpare) for a in d.remediation)


def test_an_ultraserver_impaired_for_longer_than_the_setting_is_replaced():
    s = InstanceGroupSpec(training_plan_ref="p", instance_type=US_TYPE, instance_count=17,
                          health_check={"graceSeconds": 5, "maxUnhealthy": 2, "rebootBudget": 0,
                                        "replaceUltraServerAfterSeconds": 60})
    cluster = one_us_running("0-1")
    early = decide(observed(cluster), now=P1, s=s)
    assert moved(early) == []
    assert early.wake_at <= FAIL_AT + timedelta(seconds=60)

    late = FAIL_AT + timedelta(seconds=61)
    d = decide(observed(cluster, late), now=late, s=s, prior=early.status)
    assert moved(d) == [(US0, US1, "ImpairedTooLong")]


def test_with_node_recovery_none_no_ultraserver_moves():
    s = spec(17, node_recovery="None")
    d = decide(observed(one_us_running("0-1", "0-2")), now=P1, s=s)

    assert moved(d) == [] and d.create == []


def test_a_peer_places_as_the_replacement_says_and_keeps_it_too():
    """Group v shares the plan; w's status recorded US 0 -> US 1, so v (placed on US 0 beside w's
    10) is on US 1 too, and keeps the entry in its own status."""
    entry = UltraServerReplacement(reserved_capacity_id=BLOCK.id, failed=US0, replacement=US1, since=P1,
                                   reason="FailuresBeyondSpares")
    before = decide(s=spec(5), peers=[Peer("w", 10), Peer("v", 5)], group="v", now=P1)
    assert {s.ultraserver_id for s in before.create} == {US0}
    d = decide(s=spec(5), peers=[Peer("w", 10, replacements=(entry,)), Peer("v", 5)], group="v", now=P1)

    assert {s.ultraserver_id for s in d.create} == {US1} and len(d.create) == 5  # w holds the spare
    assert moved(d) == [(US0, US1, "FailuresBeyondSpares")]


@pytest.mark.parametrize("entries, expected", [
    pytest.param([(BLOCK.id, US0, US1, 0)], {US0: US1}, id="one"),
    pytest.param([(BLOCK2.id, US0, US1, 0)], {}, id="another-block"),
    pytest.param([(BLOCK.id, US0, "rc-abc-0-us-7", 0)], {}, id="not-an-ultraserver-of-the-block"),
    pytest.param([(BLOCK.id, US0, US0, 0)], {}, id="itself"),
    pytest.param([(BLOCK.id, US0, US1, 1), (BLOCK.id, US0, "rc-abc-0-us-2", 0)], {US0: US1},
                 id="an-unknown-replacement-is-skipped"),
    pytest.param([(BLOCK.id, US1, US0, 1), (BLOCK.id, US0, US1, 0)], {US0: US1}, id="the-oldest-wins"),
    pytest.param([(BLOCK.id, US1, US0, 5), (BLOCK.id, US0, US1, 1)], {US0: US1}, id="a-failed-one-stands-in-for-none"),
])
def test_recorded_replacements_are_checked(entries, expected):
    made = [UltraServerReplacement(reserved_capacity_id=b, failed=f, replacement=r, since=T0 + timedelta(seconds=t))
            for b, f, r, t in entries]
    got = recovery.block_replacements(made, BLOCK.id, [US0, US1])
    assert {f: e.replacement for f, e in got.items()} == expected


def test_placement_with_replacements_moves_only_the_failed_ultraservers_groups():
    us = placement.ultraservers_for_block("rc", X72, 54, 1)  # three x72
    a, b, c = (u.id for u in us)
    groups = [placement.GroupRequest("g1", 17), placement.GroupRequest("g2", 10), placement.GroupRequest("g3", 5)]
    before = placement.place_groups(groups, us)
    assert before["g1"].counts == {a: 17} and before["g2"].counts == {b: 10} and before["g3"].counts == {b: 5}

    after = placement.place_with_replacements(groups, us, {a: c})
    assert after["g1"].counts == {c: 17}  # moved
    assert after["g2"].counts == {b: 10} and after["g3"].counts == {b: 5}  # stayed
    # a chain: the replacement failed too, and its nodes moved on
    four = placement.ultraservers_for_block("rc", X72, 72, 1)
    w, x, y, z = (u.id for u in four)
    chained = placement.place_with_replacements(groups, four, {w: y, y: z})
    assert chained["g1"].counts == {z: 17} and chained["g2"].counts == {x: 10}
    assert placement.standing_in({w: y, y: z}) == {w: z, y: z}
    # a group made later that fill-first puts on a failed UltraServer is on its replacement
    late = placement.place_with_replacements([*groups, placement.GroupRequest("g4", 2)], us, {a: c})
    assert late["g4"].counts == {b: 2}  # best fit: b has 2 left; c stands in for a (full)


def test_a_node_back_from_its_reboot_in_this_pass_is_not_counted_among_the_ultraservers_failed():
    """US 0 keeps one spare: its node 0-3 rebooted (the record's clock) and reports Ready again now,
    while 0-1 fails. One failed node, within the spare: no move (counting 0-3 too would move the
    group off an UltraServer that holds it)."""
    from hyperplan.api.models import GroupNode, NodeRecovery
    rebooted_at = FAIL_AT - timedelta(seconds=20)
    cluster = one_us_running("0-1")
    back = cluster[name("0-3")]
    back.labels[naming.LABEL_HEALTH] = naming.HEALTH_PENDING_REBOOT
    back.ready_since = rebooted_at + timedelta(seconds=10)  # Ready again after the reboot began
    entry = GroupNode(name=name("0-3"), uid="u", node_id=name("0-3"),
                      recovery=NodeRecovery(reboots=[rebooted_at], rebooting_since=rebooted_at, requested=True,
                                            fault_since=rebooted_at))
    prior = InstanceGroupStatus(nodes=[entry])
    d = decide(observed(cluster), now=P1, s=ONE_US, prior=prior)

    assert moved(d) == []
    assert any(isinstance(a, health.RecoverNode) and a.node == name("0-3") for a in d.remediation), d.remediation


# --------------------------------------------------------------------------- an UltraServer bought for the rest of the block

from hyperplan.api.models import AddedUltraServer  # noqa: E402

ONE_US_BLOCK = BLOCK.model_copy(update={"instance_count": 18, "ultra_server_count": 1})
ONE_US_PLAN = BoundPlan("p", "hyperpod-cluster", None, X72, 1, (ONE_US_BLOCK,))
ALONE_FIRST = decide(s=ONE_US, plan=ONE_US_PLAN)


def test_with_no_free_ultraserver_the_group_says_which_it_wants_and_keeps_when_it_first_did():
    cluster = failing("0-1", "0-2", cluster=cluster_of(ALONE_FIRST.create))
    d = decide(observed(cluster), now=P1, s=ONE_US, plan=ONE_US_PLAN, prior=ALONE_FIRST.status)

    assert moved(d) == []
    assert ("UltraServerReplacement", "False", "NoFreeUltraServer") in conds(d)
    assert [(w.reserved_capacity_id, w.failed, w.since) for w in d.status.ultra_servers_wanted] == \
        [(ONE_US_BLOCK.id, US0, P1)]
    later = P1 + timedelta(seconds=3)
    again = decide(observed(cluster, later), now=later, s=ONE_US, plan=ONE_US_PLAN, prior=d.status)
    assert [w.since for w in again.status.ultra_servers_wanted] == [P1]  # first wanted then, not now


def test_an_ultraserver_the_plan_bought_for_the_rest_of_the_block_is_where_the_group_moves():
    cluster = failing("0-1", "0-2", cluster=cluster_of(ALONE_FIRST.create))
    stuck = decide(observed(cluster), now=P1, s=ONE_US, plan=ONE_US_PLAN, prior=ALONE_FIRST.status)
    bought = ONE_US_BLOCK.model_copy(update={"added_ultra_servers": [AddedUltraServer(
        id=f"{ONE_US_BLOCK.id}-r0", start_time=P1, instance_count=18, in_place_of=US0)]})
    plan = BoundPlan("p", "hyperpod-cluster", None, X72, 1, (bought,))
    later = P1 + timedelta(seconds=2)
    d = decide(observed(cluster, later), now=later, s=ONE_US, plan=plan, prior=stuck.status)

    assert moved(d) == [(US0, US1, "FailuresBeyondSpares")]  # US 1: the bought one, after the block's own
    assert {s.ultraserver_id for s in d.create} == {US1} and len(d.create) == 18
    assert d.status.ultra_servers_wanted == []
    assert ("UltraServerReplacement", "True", "UltraServerReplaced") in conds(d)


def test_the_group_moves_to_the_ultraserver_bought_for_it_though_made_whole_meanwhile():
    """Seen in CI: the plan bought an UltraServer at the group's ask, and before the group saw it,
    replacements in place had made the failed one whole: the group stayed, and what was bought
    for it went unused. It moves there, the reason saying why."""
    bought = ONE_US_BLOCK.model_copy(update={"added_ultra_servers": [AddedUltraServer(
        id=f"{ONE_US_BLOCK.id}-r0", start_time=P1, instance_count=18, in_place_of=US0)]})
    plan = BoundPlan("p", "hyperpod-cluster", None, X72, 1, (bought,))
    whole = cluster_of(ALONE_FIRST.create)  # every node on US 0 healthy again
    later = P1 + timedelta(seconds=2)
    d = decide(observed(whole, later), now=later, s=ONE_US, plan=plan, prior=ALONE_FIRST.status)

    assert moved(d) == [(US0, US1, "UltraServerBought")]
    assert {s.ultraserver_id for s in d.create} == {US1} and len(d.create) == 18
    assert d.ultraserver_reasons == ("UltraServerBought",)


def test_without_an_ultraserver_bought_in_place_of_it_a_whole_ultraserver_keeps_the_group():
    other = ONE_US_BLOCK.model_copy(update={"added_ultra_servers": [AddedUltraServer(
        id=f"{ONE_US_BLOCK.id}-r7", start_time=P1, instance_count=18, in_place_of=f"{ONE_US_BLOCK.id}-us-7")]})
    plan = BoundPlan("p", "hyperpod-cluster", None, X72, 1, (other,))
    whole = cluster_of(ALONE_FIRST.create)
    later = P1 + timedelta(seconds=2)
    d = decide(observed(whole, later), now=later, s=ONE_US, plan=plan, prior=ALONE_FIRST.status)

    assert moved(d) == [] and d.create == []
