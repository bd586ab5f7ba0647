"""What an InstanceGroup should hold now: one pure decision per reconcile.

Input: the group, its training plan, the groups that share the plan, the group's nodes
as observed, the policy and `now`. Output (:class:`GroupDecision`): the nodes that should
exist (with their labels and taints), the nodes to drain and remove, the health actions,
the status to write, the events to post and when to look again. The handler carries it
out through a node provider.

The rules:

* nodes exist only while one of the plan's blocks is usable: active and before its
  termination time (end minus the policy's lead for the plan's target);
* from the policy's checkpoint lead before the termination time, the workloads on the
  block's nodes are asked to checkpoint (:func:`plan_checkpoint`): pod annotation
  :data:`ANNOTATION_BLOCK_TERMINATION`, node condition :data:`CONDITION_BLOCK_TERMINATING`,
  Warning Events (docs/checkpoint.md);
* at the termination time every node of the group drains (cordon, evict, remove) with a
  deadline at the block's end;
* the group's instance type must be the plan's, the plan must target
  ``hyperpod-cluster``, and the count must fit what the plan's block offers beside the
  other groups (placement says so); a group that breaks a rule gets ``Failed``, a
  condition, an event and no nodes;
* health verdicts and bounded remediation come from :mod:`hyperplan.planning.health`;
* deep health checks (:mod:`hyperplan.planning.deepchecks`): a node made, or back from its
  reboot, is tainted and not counted Ready until its checks pass; one that fails them is
  remediated as a failed node.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Iterable, Mapping, Sequence

from hyperplan.api.models import (
    Condition, GroupNode, InstanceGroupSpec, InstanceGroupStatus, ReservedCapacity, UltraServerReplacement,
    UltraServerWanted,
)
from hyperplan.api.vocabulary import (  # noqa: F401  (the checkpoint words re-exported)
    ANNOTATION_BLOCK_TERMINATION, CONDITION_BLOCK_TERMINATING, HYPERPOD_CLUSTER, REASON_CHECKPOINT, to_rfc3339,
)
from hyperplan.planning import deepchecks
from hyperplan.planning import health
from hyperplan.planning import naming
from hyperplan.planning import ownership
from hyperplan.planning import placement
from hyperplan.planning import recovery
from hyperplan.planning import tenancy
from hyperplan.planning.nodefacts import READY as CONDITION_READY, is_unschedulable
from hyperplan.planning.plans import Event, condition
from hyperplan.planning.policy import Policy
from hyperplan.planning.schedule import plan_block_schedule

WAITING, PROVISIONING, READY, DRAINING, FAILED = "Waiting", "Provisioning", "Ready", "Draining", "Failed"
HYPERPOD = HYPERPOD_CLUSTER
DRAIN_RETRY = timedelta(seconds=1)


@dataclass(frozen=True)
class BoundPlan:
    """What a group needs of its training plan."""

    name: str
    target: str
    instance_type: str | None
    ultra_server_type: str | None
    spares_per_ultraserver: int
    blocks: tuple[ReservedCapacity, ...]
    group_selector: tenancy.Selector | None = None  # which groups may bind it (None: every group)


@dataclass(frozen=True)
class Peer:
    """A group bound to the same plan (this group included), in placement order."""

    name: str
    instance_count: int
    explicit: tuple[tuple[str, int], ...] = ()
    # The UltraServer replacements its status records (input to check: recovery.block_replacements).
    replacements: tuple[UltraServerReplacement, ...] = ()


@dataclass(frozen=True)
class ObservedGroupNode:
    """One of the group's nodes as found on the API server."""

    health: health.NodeObservation
    labels: Mapping[str, str]
    taints: tuple[naming.Taint, ...]
    unschedulable: bool
    ready: bool
    deleting: bool = False

    @property
    def name(self) -> str:
        return self.health.name

    @property
    def block(self) -> str | None:
        return self.labels.get(naming.LABEL_RESERVED_CAPACITY)


@dataclass(frozen=True)
class Drain:
    node: str
    deadline: datetime
    reason: str




@dataclass(frozen=True)
class Checkpoint:
    """Ask the workloads on ``nodes`` to checkpoint: block ``block`` reaches its termination
    time at ``termination``, when their nodes start to drain."""

    block: str
    termination: datetime
    nodes: tuple[str, ...]
    cause: str = ""  # why the nodes leave, when not the block's end (an UltraServer replaced)

    @property
    def annotation(self) -> str:
        return to_rfc3339(self.termination)

    @property
    def message(self) -> str:
        leaving = self.cause or f"block {self.block} reaches its termination time"
        return (f"{leaving} at {self.annotation}: checkpoint and exit; "
                f"pods are evicted from then on (annotation {ANNOTATION_BLOCK_TERMINATION})")


def checkpoint_time(termination: datetime, lead: timedelta) -> datetime:
    """When the workloads of a block terminating at ``termination`` are asked to checkpoint."""
    return termination - lead


def signalled(node: ObservedGroupNode) -> bool:
    """Whether the node carries the checkpoint signal (its condition is True)."""
    c = node.health.condition(CONDITION_BLOCK_TERMINATING)
    return c is not None and c.status == "True"


def plan_checkpoint(block: str, termination: datetime, lead: timedelta, nodes: Sequence[ObservedGroupNode],
                    now: datetime, cause: str = "") -> Checkpoint | None:
    """The checkpoint signal due at ``now``, or None (too early, or every node has it).

    From ``termination - lead`` on (the drain phase included, should the operator have been
    down through the lead), each existing node of the block that does not carry
    :data:`CONDITION_BLOCK_TERMINATING` yet is signalled: its pods get the annotation, then the
    node gets the condition; a node that has it was signalled already (crash-safe: pods first).
    """
    if now < checkpoint_time(termination, lead):
        return None
    todo = tuple(sorted(n.name for n in nodes if n.health.exists and not n.deleting and not signalled(n)))
    return Checkpoint(block, termination, todo, cause) if todo else None


def checkpoint_events(checkpoint: Checkpoint | None, nodes: Sequence[ObservedGroupNode]) -> list[Event]:
    """The group's Warning when the first of its nodes is signalled (not again on later passes)."""
    if checkpoint is None or any(signalled(n) for n in nodes):
        return []
    return [Event("Warning", REASON_CHECKPOINT, f"{checkpoint.message}; {len(checkpoint.nodes)} node(s) signalled")]


@dataclass
class GroupDecision:
    status: InstanceGroupStatus
    block: ReservedCapacity | None = None
    create: list[placement.NodeSpec] = field(default_factory=list)
    update: list[placement.NodeSpec] = field(default_factory=list)
    drain: list[Drain] = field(default_factory=list)
    remediation: tuple[health.Action, ...] = ()
    # The recovery clocks the remediation moved (by node id), for the group's record.
    recovery: Mapping[str, recovery.RecoveryState] = field(default_factory=dict)
    checkpoint: Checkpoint | None = None  # carried out before the drains
    plan_events: list[Event] = field(default_factory=list)  # for the training plan (an UltraServer replaced)
    # For the metrics: the reasons of the UltraServer replacements this pass made, and NoFreeUltraServer
    # when it first found none free.
    ultraserver_reasons: tuple[str, ...] = ()
    checks: deepchecks.ChecksPlan | None = None  # the deep health checks' Jobs and record moves
    events: list[Event] = field(default_factory=list)
    wake_at: datetime | None = None
    # A karpenter group's NodeClaims still launching that keep their slots, and those let go (with why).
    launching: list[GroupNode] = field(default_factory=list)
    let_go: list[tuple[GroupNode, str]] = field(default_factory=list)
    # A karpenter group's launches (ownership.launch_verdict): the memory to keep, the reasons of
    # the launch failures to count (None: not a karpenter group).
    launch_memory: ownership.LaunchMemory | None = None
    launch_failures: tuple[str, ...] = ()


def _min_time(*times: datetime | None) -> datetime | None:
    present = [t for t in times if t is not None]
    return min(present) if present else None


def check_binding(spec: InstanceGroupSpec, plan: BoundPlan,
                  labels: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """A rule the group (whose ``metadata.labels`` are ``labels``) breaks against its plan, as
    (reason, message), or None. The plan's ``instanceGroupSelector`` comes first: a group the
    plan's owner did not let in is told only that."""
    if plan.group_selector is not None and not plan.group_selector.matches(labels):
        return (tenancy.REASON_NOT_ALLOWED, tenancy.not_allowed_message(
            f"training plan {plan.name}", plan.group_selector, "instance groups with labels"))
    if plan.target != HYPERPOD:
        return ("PlanTargetNotHyperPod",
                f"training plan {plan.name} targets {plan.target}; instance groups need a "
                f"{HYPERPOD} plan")
    plan_type = reserved_instance_type(plan.instance_type, plan.ultra_server_type, plan.blocks)
    if spec.instance_type != plan_type:
        return ("InstanceTypeMismatch",
                f"group wants {spec.instance_type} but training plan {plan.name} reserves {plan_type}")
    return None


def reserved_instance_type(instance_type: str | None, ultra_server_type: str | None,
                           blocks: Iterable[ReservedCapacity]) -> str | None:
    """The instance type a plan (its spec's ``instance_type`` and ``ultra_server_type``, its
    ``blocks``) reserves: the spec's, or for an UltraServer plan its blocks' when they name one (an
    UltraServer block bought as an EC2 Capacity Block holds EC2's ``p6e-gb200.36xlarge``, the type
    its nodes carry where Karpenter launches them), else the type UltraServers hold
    (``ml.p6e-gb200.36xlarge``). The group's binding check and the Kueue admission check read it."""
    if not ultra_server_type:
        return instance_type
    bought = {b.instance_type for b in blocks}
    return bought.pop() if len(bought) == 1 else placement.ULTRASERVER_INSTANCE_TYPE


def with_added(block: ReservedCapacity) -> int:
    """The block's instances with those of the UltraServers its plan bought for the rest of it
    (``addedUltraServers``, read from the plan's ledger: runtime.views.as_the_ledger_holds)."""
    return block.instance_count + sum(a.instance_count for a in block.added_ultra_servers or ())


def bought_in_place(block: ReservedCapacity) -> dict[str, str]:
    """``{failed: bought}``: the UltraServers the plan bought for the rest of ``block`` (numbered
    after the block's own, in the order bought), by the one each was bought in place of."""
    first = block.ultra_server_count or 0
    return {a.in_place_of: naming.ultraserver_id(block.id, first + i)
            for i, a in enumerate(block.added_ultra_servers or ()) if a.in_place_of}


def wanted_ultraservers(block: ReservedCapacity, verdict: recovery.UltraServerVerdict,
                        prior: InstanceGroupStatus, now: datetime) -> list[UltraServerWanted]:
    """``status.ultraServersWanted``: the UltraServers the group's nodes must leave with no free one
    to go to (the plan may buy one for the rest of the block), each since it was first wanted."""
    since = {(w.reserved_capacity_id, w.failed): w.since for w in prior.ultra_servers_wanted}
    return [UltraServerWanted(reserved_capacity_id=block.id, failed=m.failed, since=since.get((block.id, m.failed), now))
            for m in verdict.moves if m.replacement is None]


def place_on_block(block: ReservedCapacity, plan: BoundPlan, peers: Sequence[Peer],
                   replacements: Mapping[str, str] | None = None,
                   ) -> tuple[tuple[placement.UltraServer, ...], dict[str, placement.PlacementResult]]:
    """The block's UltraServers and every peer's placement on them, ``replacements``
    (``{failed: replacement}``) taken into account."""
    ultraservers = placement.ultraservers_for_block(block.id, block.ultra_server_type, with_added(block),
                                                    plan.spares_per_ultraserver)
    requests = [placement.GroupRequest(p.name, p.instance_count, p.explicit) for p in peers]
    if ultraservers and replacements:
        return ultraservers, placement.place_with_replacements(requests, ultraservers, replacements)
    capacity = None if ultraservers else block.instance_count
    return ultraservers, placement.place_groups(requests, ultraservers, capacity=capacity)


def recorded_replacements(block: ReservedCapacity, plan: BoundPlan, peers: Sequence[Peer],
                          prior: InstanceGroupStatus) -> dict[str, UltraServerReplacement]:
    """The block's UltraServer replacements, ``{failed: entry}``, from every peer's status and this
    group's own (``prior``), checked (``recovery.block_replacements``). Every group of the plan
    keeps them all, so that none is lost with the group that made it."""
    if not block.ultra_server_type:
        return {}
    ids = [u.id for u in placement.ultraservers_for_block(block.id, block.ultra_server_type, with_added(block),
                                                          plan.spares_per_ultraserver)]
    entries = [*prior.ultra_server_replacements, *(r for p in peers for r in p.replacements)]
    return recovery.block_replacements(entries, block.id, ids)


def failed_by_ultraserver(on_block: Sequence[ObservedGroupNode], verdict: health.HealthVerdict,
                          clocks: Mapping[str, recovery.RecoveryState], now: datetime) -> dict[str, list[datetime]]:
    """Per UltraServer, the first sight of each of the group's failed nodes on it: past its grace,
    rebooting (not back yet) or deleted from under the group."""
    out: dict[str, list[datetime]] = {}
    for n in on_block:
        us, state = n.health.ultraserver_id, clocks.get(n.name, recovery.RecoveryState())
        if state.rebooting_since is not None and n.health.exists \
                and recovery.back_from_reboot(n.health.conditions, state.rebooting_since):
            continue  # back from its reboot in this pass (its mark goes now), or judged again next pass
        if us and (n.name in verdict.unhealthy or state.rebooting_since is not None or not n.health.exists):
            out.setdefault(us, []).append(state.since or verdict.first_seen.get(n.name) or now)
    return out


FINALIZER_WAIT = timedelta(seconds=1)  # a new group's first look after kopf put its finalizer on


@dataclass(frozen=True)
class PassFacts:
    """What the pass knows besides the group, its plan and its nodes that bounds what it may make.

    The decision takes them in, so that what :func:`decide_group` returns is exactly what the
    controller applies: no step after it edits the decision.

    ``finalizer_held``: the group's finalizer is on it (no node is made before it is, so deleting a
    group never orphans one). ``names_taken``: node names another node holds (KWOK would refuse
    the create), or that the record holds but the view does not show yet. ``launching`` and
    ``expired``: a karpenter group's NodeClaims still waiting for their Node, and those past the
    launch timeout (``ownership.ClaimBinding``). ``cloud_ultraservers``: for a static group, the
    cloud UltraServer each of hyperplan's UltraServers was lent from (None: not a static group).
    ``unrecorded``: the condition naming nodes that carry the group's label but are not in its
    record (``ownership.unrecorded_condition``), or None. ``launch``: a karpenter group's launches
    (its node class, Karpenter's offerings, its claims that failed; ``ownership.LaunchFacts``)."""

    finalizer_held: bool = True
    names_taken: frozenset[str] = frozenset()
    launching: tuple[GroupNode, ...] = ()
    expired: tuple[GroupNode, ...] = ()
    cloud_ultraservers: Mapping[str, str] | None = None
    unrecorded: Condition | None = None
    launch: ownership.LaunchFacts | None = None


REASON_LAUNCH_TIMEOUT = "no Node registered within the launch timeout"
REASON_SLOT_NOT_WANTED = "its slot is no longer wanted"


def decide_group(name: str, generation: int, spec: InstanceGroupSpec, prior: InstanceGroupStatus,
                 plan: BoundPlan | None, peers: Sequence[Peer], nodes: Sequence[ObservedGroupNode],
                 policy: Policy, now: datetime, keys: naming.TopologyKeys = naming.TopologyKeys(),
                 labels: Mapping[str, str] | None = None,
                 check_jobs: Mapping[str, deepchecks.JobResult] | None = None,
                 hyperpod_labels: bool = True, facts: PassFacts = PassFacts()) -> GroupDecision:
    """What the group ``name`` (its ``metadata.labels`` are ``labels``) should hold at ``now``;
    ``check_jobs``: the group's deep health check Jobs by name (None: not listed this pass);
    ``facts``: what else bounds the creates (:class:`PassFacts`). The result is final."""
    wanted = _decide_group(name, generation, spec, prior, plan, peers, nodes, policy, now, keys, labels, check_jobs,
                           hyperpod_labels)
    return bounded_by(wanted, facts, now, prior.conditions)


def bounded_by(decision: GroupDecision, facts: PassFacts, now: datetime,
               prior: Sequence[Condition] = ()) -> GroupDecision:
    """``decision`` within ``facts``: no create before the finalizer (look again in a second), none
    of a name taken or of a slot whose NodeClaim still launches, the static group's creates bound to
    their cloud UltraServers; the launching claims kept and the ones let go (with why); the
    unrecorded-nodes condition added to the status; a karpenter group's creates held while its
    claims cannot launch or back off, with its ``NodesLaunched`` condition and Warning
    (``ownership.launch_verdict``; ``prior``: the group's conditions before the pass)."""
    creates, wake = list(decision.create), decision.wake_at
    if creates and not facts.finalizer_held:
        creates, wake = [], now + FINALIZER_WAIT
    wanted = {spec.name for spec in creates}
    keep = [e for e in facts.launching if e.node_id in wanted]
    let_go = [(e, REASON_LAUNCH_TIMEOUT) for e in facts.expired]
    let_go += [(e, REASON_SLOT_NOT_WANTED) for e in facts.launching if e.node_id not in wanted]
    taken = facts.names_taken | {e.node_id for e in keep}
    creates = [spec for spec in creates if spec.name not in taken]
    if facts.cloud_ultraservers is not None and any(spec.ultraserver_id for spec in creates):
        bound = dict(facts.cloud_ultraservers)
        creates = [dataclasses.replace(spec, cloud_ultraservers=bound) for spec in creates]
    status, events, memory, counted = decision.status, decision.events, None, ()
    if facts.unrecorded is not None:
        status = status.model_copy(update={"conditions": [*status.conditions, facts.unrecorded]})
    if facts.launch is not None:
        verdict = ownership.launch_verdict(facts.launch, [(c.instance_type, c.availability_zone) for c in creates],
                                           status.observed_generation or 1, prior, now)
        if not verdict.creates_allowed:
            creates = []
        if verdict.condition is not None:
            status = status.model_copy(update={"conditions": [*status.conditions, verdict.condition]})
        events, memory, counted = [*events, *verdict.events], verdict.memory, verdict.counted
        wake = _min_time(wake, verdict.wake_at)
    return dataclasses.replace(decision, create=creates, wake_at=wake, status=status, launching=keep, let_go=let_go,
                               events=events, launch_memory=memory, launch_failures=counted)


def _decide_group(name: str, generation: int, spec: InstanceGroupSpec, prior: InstanceGroupStatus,
                  plan: BoundPlan | None, peers: Sequence[Peer], nodes: Sequence[ObservedGroupNode],
                  policy: Policy, now: datetime, keys: naming.TopologyKeys, labels: Mapping[str, str] | None,
                  check_jobs: Mapping[str, deepchecks.JobResult] | None, hyperpod_labels: bool) -> GroupDecision:
    """What the group wants, before :class:`PassFacts` bound it."""
    conds = prior.conditions
    broken = check_binding(spec, plan, labels) if plan is not None else None
    # Bound=False names the rule a group breaks against its plan (NotAllowed among them); a group
    # that binds carries no Bound condition, its Ready says the rest.
    unbound = [condition("Bound", False, *broken, generation, conds, now)] if broken else []

    def status(phase: str, reason: str, message: str, **fields) -> InstanceGroupStatus:
        ok = phase == READY
        made = [condition("Ready", ok, reason, message, generation, conds, now)]
        made += fields.pop("extra_conditions", [])
        made += unbound
        return InstanceGroupStatus(phase=phase, observed_generation=generation, conditions=made, **fields)

    def leave_all(phase: str, reason: str, message: str, deadline: datetime, wake: datetime | None,
                  **fields) -> GroupDecision:
        drains = [Drain(n.name, deadline, reason) for n in nodes if not n.deleting and n.health.exists]
        phase = DRAINING if drains else phase
        d = GroupDecision(status=status(phase, reason, message, **fields), drain=drains)
        d.wake_at = _min_time(wake, now + DRAIN_RETRY if drains else None)
        return d

    if plan is None:
        return _with_events(leave_all(WAITING, "PlanNotFound", f"training plan {spec.training_plan_ref} "
                                      "does not exist yet", now, None), prior)
    if broken:
        return _with_events(leave_all(FAILED, *broken, now, None), prior, warning=True)
    if not plan.blocks:
        return _with_events(leave_all(WAITING, "PlanNotPurchased",
                                      f"training plan {plan.name} has no reserved capacity yet", now, None), prior)

    schedule = plan_block_schedule([(b.start_time, b.end_time) for b in plan.blocks], plan.target, policy, now)
    usable = schedule.usable_block
    if usable is None:
        current = schedule.active_block
        if current is not None:  # past the termination time: drain until the block ends
            block = plan.blocks[current]
            termination = schedule.blocks[current].termination_time
            d = leave_all(
                WAITING, "BlockTerminating",
                f"block {block.id} stops at {block.end_time.isoformat()}; nodes drain from "
                f"{termination.isoformat()}",
                block.end_time, schedule.next_transition_time,
                availability_zone=block.availability_zone, reserved_capacity_id=block.id,
                next_transition_time=schedule.next_transition_time)
            on_block = [n for n in nodes if n.block == block.id]
            d.checkpoint = plan_checkpoint(block.id, termination, policy.checkpoint_lead, on_block, now)
            d.events += checkpoint_events(d.checkpoint, on_block)
            return _with_events(d, prior)
        upcoming = schedule.current_or_next_block
        message = (f"next block {plan.blocks[upcoming].id} starts at {plan.blocks[upcoming].start_time.isoformat()}"
                   if upcoming is not None else f"training plan {plan.name} has expired")
        return _with_events(leave_all(
            WAITING, "NoActiveBlock", message, now, schedule.next_transition_time,
            availability_zone=plan.blocks[upcoming].availability_zone if upcoming is not None else None,
            next_transition_time=schedule.next_transition_time), prior)

    block = plan.blocks[usable]
    try:
        moves = recorded_replacements(block, plan, peers, prior)
        ultraservers, placements = place_on_block(block, plan, peers, {f: m.replacement for f, m in moves.items()})
    except ValueError as e:
        return _with_events(leave_all(FAILED, "InvalidPlacement", str(e), now, None), prior, warning=True)
    mine = placements.get(name)
    if mine is None or not mine.ok:
        reason = mine.reason if mine else "InvalidPlacement"
        message = mine.message if mine else "group is not among the plan's groups"
        return _with_events(leave_all(FAILED, reason, message, now, None), prior, warning=True)

    termination = schedule.blocks[usable].termination_time
    on_block = [n for n in nodes if n.block == block.id]
    stray = [n for n in nodes if n.block != block.id]

    # Health: verdicts over the group's nodes on this block, then bounded remediation.
    check = health.HealthCheck.from_spec(spec.health_check.grace_seconds, spec.health_check.max_unhealthy,
                                     spec.health_check.unhealthy_conditions)
    # Each fault's grace counts from its first sight, which the group's record keeps (a condition
    # that flaps does not reset it): the observations carry those times (planning.recovery).
    ladder = recovery.Ladder.from_spec(spec.node_recovery, spec.health_check)
    # By node id, as the observations name nodes (a static or Karpenter node's name is not its id).
    recorded = {e.node_id: recovery.RecoveryState.from_record(e.recovery) for e in prior.nodes or () if e.recovery}
    clocks: dict[str, recovery.RecoveryState] = {}
    fault_moves: dict[str, recovery.RecoveryState] = {}
    checked = deepchecks.states_of(prior.nodes)  # by node id, which the observations are named by
    observations = []
    for n in on_block:
        seen, state = n.health, recorded.get(n.name, recovery.RecoveryState())
        run = checked.get(n.name)
        if run is not None and not run.serving:
            seen = dataclasses.replace(seen, checking=run.status == deepchecks.CHECK_IN_PROGRESS,
                                       check_failed=run.finished if run.status == deepchecks.CHECK_FAILED else None)
        if state.since is not None and seen.health_label == naming.HEALTH_PENDING_REPLACEMENT \
                and seen.health_label_since is not None:
            # The ladder chose to replace this node for a fault first seen then (its record's
            # faultSince): the mark is that verdict, judged from the fault's first sight, not a new
            # signal with a grace of its own, which would stop the replacement (a launching
            # NodeClaim let go, then made again) when the fault clears meanwhile.
            seen = dataclasses.replace(seen, health_label_since=min(seen.health_label_since, state.since))
        standing = health.standing_faults(seen, check)
        if standing or state.faults:
            clocked = recovery.clock_faults(state, standing, now, check.grace)
            if clocked != state:
                fault_moves[n.name] = state = clocked
            seen = dataclasses.replace(seen, conditions=recovery.clocked(seen.conditions, state, standing))
        if state != recovery.RecoveryState():
            clocks[n.name] = state
        observations.append(seen)
    verdict = health.evaluate_health(observations, check, now)

    # The last rung: the group's nodes leave an UltraServer that can no longer hold them, for a
    # free one of the block, all together (planning.recovery.plan_ultraserver_replacement).
    ultraserver_verdict = recovery.UltraServerVerdict()
    new_moves: dict[str, UltraServerReplacement] = {}
    if ultraservers and ladder.automatic:
        allocations: dict[str, int] = {}
        for p in placements.values():
            for us_id, count in p.allocations:
                allocations[us_id] = allocations.get(us_id, 0) + count
        after = spec.health_check.replace_ultra_server_after_seconds
        ultraserver_verdict = recovery.plan_ultraserver_replacement(
            ultraservers, allocations, mine.counts, failed_by_ultraserver(on_block, verdict, clocks, now),
            {f: m.replacement for f, m in moves.items()}, timedelta(seconds=after) if after is not None else None, now,
            bought_in_place(block))
        new_moves = {m.failed: UltraServerReplacement(reserved_capacity_id=block.id, failed=m.failed,
                                                      replacement=m.replacement, since=now, reason=m.reason)
                     for m in ultraserver_verdict.moves if m.replacement}
        if new_moves:
            moves = {**moves, **new_moves}
            ultraservers, placements = place_on_block(block, plan, peers, {f: m.replacement for f, m in moves.items()})
            mine = placements[name]
    leaving = {n.name: moves[n.health.ultraserver_id] for n in on_block if n.health.ultraserver_id in moves}
    if leaving:  # they drain (below); nothing else is done about them
        observations = [o for o in observations if o.name not in leaving]
        clocks = {k: v for k, v in clocks.items() if k not in leaving}
        verdict = health.evaluate_health(observations, check, now)
    remedy = health.plan_remediation(verdict, observations, ultraservers, block_has_time_left=now < termination,
                                     uses_spares=bool(ultraservers), max_unhealthy=check.max_unhealthy,
                                     ladder=ladder, clocks=clocks, now=now)

    # Make before break: a failed node goes only once its replacement is up and Ready, so the
    # slot is never empty and the failure stays visible (counts, UltraServer health) until then;
    # and only once its pods have left (evicted as soon as its replacement serves).
    by_slot = {(n.health.slot, n.health.generation): n for n in on_block}
    by_name = {n.name: n for n in on_block}
    actions, evacuation_check = _evacuate_before_removal(remedy.actions, on_block, by_name, by_slot, policy, now,
                                                         remedy.rebooting, checked)

    owners = placement.spare_owners(placements)
    slots = placement.slot_states_from_labels(n.labels for n in on_block if not n.deleting)
    slots.update(remedy.slot_states())
    for action in actions:  # a spare promoted in this pass is active from now on
        promoted = by_name.get(action.spare) if isinstance(action, health.PromoteSpare) else None
        if promoted is not None and promoted.health.slot in slots:
            slots[promoted.health.slot] = dataclasses.replace(slots[promoted.health.slot], role=naming.ROLE_ACTIVE)
    # A node back from its reboot serves again: as its UltraServer's spare when one took over.
    recovered = {a.node for a in actions if isinstance(a, health.RecoverNode)}
    for action in actions:
        back = by_name.get(action.node) if isinstance(action, health.RecoverNode) else None
        if back is not None and back.health.slot in slots:
            state = slots[back.health.slot]
            slots[back.health.slot] = dataclasses.replace(
                state, health=naming.HEALTH_SCHEDULABLE, role=naming.ROLE_SPARE if action.as_spare else state.role)
    desired = placement.desired_nodes(
        name, plan.name, block.id, spec.instance_type, block.availability_zone, mine, ultraservers,
        placement.spare_ultraservers(name, owners), spec.labels,
        [naming.Taint(t.key, t.value, t.effect) for t in spec.taints], keys, slots)
    if spec.node_provider == "karpenter":
        # A Karpenter node's hostname is its own (the kubelet's, or the cloud provider's): the slot
        # is its node id, never written over kubernetes.io/hostname.
        desired = [dataclasses.replace(d, labels={k: v for k, v in d.labels.items() if k != naming.LABEL_HOSTNAME})
                   for d in desired]
    existing = {n.name: n for n in on_block if n.health.exists}
    vanished = {n.name for n in on_block if not n.health.exists}  # deleted from under us
    new = [d.name for d in desired if d.name not in existing and d.name not in vanished]
    # Deep health checks: a node made now or back from its reboot now starts them; the labels and
    # taint of each node's checks go on it with its other labels (a new node is born with them).
    checks = deepchecks.plan_checks(
        spec.on_start_deep_health_checks, checked,
        [deepchecks.CheckNode(n.name, n.health.exists and not n.deleting, n.health.ultraserver_id) for n in on_block],
        new, recovered, check_jobs, now)
    desired = [deepchecks.dressed(d, checks.states.get(d.name)) for d in desired]
    if hyperpod_labels:  # HyperPod's labels and taint beside hyperplan's (settings.hyperpod_labels)
        desired = [placement.hyperpod_dressed(d) for d in desired]
    wanted = {d.name: d for d in desired}
    create = [d for d in desired if d.name in new]
    # Nodes with a failure signal leave only through remediation (or at the block's end).
    being_remediated = (set(verdict.unhealthy) | set(verdict.pending) | vanished | set(remedy.rebooting) | {
        n.name for n in on_block if is_unschedulable(n.health.health_label)}) - recovered
    kept = [d for d in desired if d.name in existing]
    promoting = {a.spare for a in actions if isinstance(a, health.PromoteSpare)}  # patched by the action
    hands_off = being_remediated | promoting
    update = [d for d in kept if d.name not in hands_off and _differs(d, existing[d.name])]
    removals = {a.node for a in actions if isinstance(a, health.RemoveNode)}
    drains = [Drain(n.name, block.end_time, "NotDesired") for n in existing.values()
              if n.name not in wanted and n.name not in removals and n.name not in being_remediated
              and n.name not in leaving and not n.deleting]
    drains += [Drain(n.name, now, "OtherBlock") for n in stray if not n.deleting and n.health.exists]
    # The nodes of a replaced UltraServer: the checkpoint signal when it was replaced, the drain
    # from the checkpoint lead on (the failed ones among them too), none made again there.
    leave_checkpoint, leave_at = None, None
    for failed, move in sorted(moves.items()):
        going = [n for n in on_block if n.name in leaving and leaving[n.name] is move]
        drain_from = move.since + policy.checkpoint_lead
        if leave_checkpoint is None:
            leave_checkpoint = plan_checkpoint(
                block.id, drain_from, policy.checkpoint_lead, going, now,
                cause=f"UltraServer {failed} is replaced by {move.replacement}: its nodes drain")
        for n in going:
            if n.deleting or not n.health.exists:
                continue
            if now >= drain_from:
                drains.append(Drain(n.name, drain_from + policy.dead_node_eviction_timeout, REASON_ULTRASERVER_REPLACED))
            else:
                leave_at = _min_time(leave_at, drain_from)

    checking = checks.not_serving() & set(existing)  # only checked nodes count
    up = [d for d in kept if existing[d.name].ready and d.name not in being_remediated and d.name not in checking]
    ready = sum(1 for d in up if d.role == naming.ROLE_ACTIVE)
    spares_up = sum(1 for d in up if d.role == naming.ROLE_SPARE)
    active_wanted = mine.instance_count
    # A replaced UltraServer's nodes leaving do not make the group less Ready: it serves on the
    # replacement (any other drain, a shrink's or another block's, does).
    settling = [x for x in drains if x.reason != REASON_ULTRASERVER_REPLACED]
    phase = READY if (ready >= active_wanted and not create and not settling) else PROVISIONING
    extra = [condition("RemediationAllowed", remedy.allowed,
                       "WithinBounds" if remedy.allowed else (remedy.reason or "TooManyUnhealthy"),
                       remedy.message, generation, conds, now)]
    replacement_condition = ultraserver_condition(moves, ultraserver_verdict, generation, conds, now)
    if replacement_condition is not None:
        extra.append(replacement_condition)
    message = (f"{ready}/{active_wanted} active nodes Ready, {spares_up} spare(s) in "
               f"{block.availability_zone} on block {block.id}")
    if checking:
        message += f"; {len(checking)} node(s) in deep health checks or failed them"
    decision = GroupDecision(
        status=status(phase, "NodesReady" if phase == READY else "Provisioning", message,
                      availability_zone=block.availability_zone, reserved_capacity_id=block.id,
                      desired_count=active_wanted, ready_count=ready, spare_count=spares_up,
                      unhealthy_count=len(verdict.unhealthy),
                      next_transition_time=schedule.next_transition_time, extra_conditions=extra,
                      ultra_server_replacements=sorted(moves.values(), key=lambda m: (m.since, m.failed)),
                      ultra_servers_wanted=wanted_ultraservers(block, ultraserver_verdict, prior, now)),
        block=block, create=create, update=update, drain=drains, remediation=actions,
        recovery={**fault_moves, **remedy.recovery}, checks=checks,
        checkpoint=leave_checkpoint or plan_checkpoint(block.id, termination, policy.checkpoint_lead, on_block, now))
    if leave_checkpoint is None:
        decision.events += checkpoint_events(decision.checkpoint, on_block)
    decision.events += ultraserver_events(moves, ultraserver_verdict, prior, leaving)
    decision.plan_events = [e for e in decision.events if e.reason == recovery.REASON_REPLACED]
    decision.ultraserver_reasons = tuple(m.reason for m in ultraserver_verdict.moves if m.failed in new_moves) + tuple(
        e.reason for e in decision.events if e.reason == recovery.REASON_NO_FREE_ULTRASERVER)
    signal_at = checkpoint_time(termination, policy.checkpoint_lead)
    # verdict.next_check batches grace ends that fall close together (health.HEALTH_BATCH_WINDOW).
    decision.wake_at = _min_time(schedule.next_transition_time, verdict.next_check, evacuation_check, remedy.next_check,
                                 now + DRAIN_RETRY if drains else None, signal_at if now < signal_at else None,
                                 checks.next_check, leave_at, ultraserver_verdict.next_check)
    if not remedy.allowed and _reason(prior.conditions, "RemediationAllowed") != remedy.reason:
        decision.events.append(Event("Warning", remedy.reason or "TooManyUnhealthy", remedy.message))
    return _with_events(decision, prior)


REASON_ULTRASERVER_REPLACED = recovery.REASON_REPLACED  # the drain of a replaced UltraServer's nodes


def ultraserver_condition(moves: Mapping[str, UltraServerReplacement], verdict: recovery.UltraServerVerdict,
                          generation: int, prior: Sequence[Condition], now: datetime) -> Condition | None:
    """``UltraServerReplacement``: True while the block has replaced UltraServers (which, by which,
    since when), False when one the group is on can no longer hold its nodes and the block has no
    free UltraServer for them; absent otherwise."""
    stuck = [m for m in verdict.moves if m.replacement is None]
    if stuck:
        return condition(recovery.CONDITION_ULTRASERVER_REPLACEMENT, False, recovery.REASON_NO_FREE_ULTRASERVER,
                         "; ".join(f"{m.why}, and the block has no free UltraServer with room for them: "
                                   "its failed nodes are replaced where they are" for m in stuck),
                         generation, prior, now)
    if moves:
        return condition(recovery.CONDITION_ULTRASERVER_REPLACEMENT, True, recovery.REASON_REPLACED,
                         "; ".join(f"UltraServer {m.failed} replaced by {m.replacement} at {to_rfc3339(m.since)} "
                                   f"({m.reason})" for m in sorted(moves.values(), key=lambda m: (m.since, m.failed))),
                         generation, prior, now)
    return None


def ultraserver_events(moves: Mapping[str, UltraServerReplacement], verdict: recovery.UltraServerVerdict,
                       prior: InstanceGroupStatus, leaving: Mapping[str, UltraServerReplacement]) -> list[Event]:
    """A Warning for each replacement the group's status did not hold yet (posted on the plan too),
    and one when the group first finds no free UltraServer for an UltraServer that needs it."""
    known = {(r.reserved_capacity_id, r.failed, r.replacement) for r in prior.ultra_server_replacements}
    why = {m.failed: m.why for m in verdict.moves}
    events = []
    for m in sorted(moves.values(), key=lambda m: (m.since, m.failed)):
        if (m.reserved_capacity_id, m.failed, m.replacement) in known:
            continue
        going = sum(1 for r in leaving.values() if r is m)
        events.append(Event("Warning", recovery.REASON_REPLACED,
                            f"UltraServer {m.failed} of block {m.reserved_capacity_id} replaced by {m.replacement}: "
                            f"{why.get(m.failed, m.reason)}; the group's {going} node(s) on it get the checkpoint "
                            f"signal and drain, its nodes are made on {m.replacement}"))
    if any(m.replacement is None for m in verdict.moves) and \
            _reason(prior.conditions, recovery.CONDITION_ULTRASERVER_REPLACEMENT) != recovery.REASON_NO_FREE_ULTRASERVER:
        events.append(Event("Warning", recovery.REASON_NO_FREE_ULTRASERVER,
                            "; ".join(m.why for m in verdict.moves if m.replacement is None)
                            + ": the block has no free UltraServer to move them to"))
    return events


def _evacuate_before_removal(planned: Sequence[health.Action], on_block: Sequence[ObservedGroupNode],
                             by_name: Mapping[str, ObservedGroupNode],
                             by_slot: Mapping[tuple[str | None, int], ObservedGroupNode], policy: Policy,
                             now: datetime, rebooting: Sequence[str] = (),
                             checked: Mapping[str, deepchecks.CheckState] | None = None,
                             ) -> tuple[tuple[health.Action, ...], datetime | None]:
    """The remediation with each failed node's pods evicted once its replacement serves (a spare
    promoted in its stead, or its backfill Ready and, with deep health checks, checked: ``checked``
    by node id) and its removal held until they are gone
    (:func:`hyperplan.planning.health.evacuate`), and the pods of each ``rebooting`` node whose
    spare serves evicted too; and when to look again at pods still leaving."""
    serving_for = {a.replacing for a in planned if isinstance(a, health.PromoteSpare)} | {
        n.health.replaces for n in on_block if n.health.exists and n.health.replaces}
    kept: list[health.Action] = []
    evictions: list[health.Action] = []
    removals: list[health.Action] = []
    check = None
    for name in sorted(set(rebooting) & serving_for):
        # A spare serves in its place: its pods move there, before and during the reboot.
        node = by_name.get(name)
        if node is not None and node.health.exists:
            evacuation = health.evacuate(node.health, "Rebooting", now, policy.dead_node_eviction_timeout)
            if evacuation.action is not None:
                evictions.append(evacuation.action)
            check = _min_time(check, evacuation.next_check)
    for action in planned:
        if not isinstance(action, health.RemoveNode):
            kept.append(action)
            continue
        failed = by_name.get(action.node)
        ready = _replacement_ready(failed, by_slot, checked)
        if failed is None or not (ready or failed.name in serving_for):
            continue
        evacuation = health.evacuate(failed.health, action.reason, now, policy.dead_node_eviction_timeout)
        if evacuation.action is not None:
            evictions.append(evacuation.action)
        if evacuation.done and ready:
            removals.append(dataclasses.replace(action, serving_since=_serving_since(failed, by_slot, checked)))
        check = _min_time(check, evacuation.next_check)
    return tuple(kept + evictions + removals), check


def _replacement_ready(failed: ObservedGroupNode | None,
                       by_slot: Mapping[tuple[str | None, int], ObservedGroupNode],
                       checked: Mapping[str, deepchecks.CheckState] | None = None) -> bool:
    """Whether the failed node's replacement serves: Ready, and past its deep health checks."""
    if failed is None or failed.health.slot is None:
        return True
    successor = by_slot.get((failed.health.slot, failed.health.generation + 1))
    run = (checked or {}).get(successor.name) if successor is not None else None
    return successor is not None and successor.ready and (run is None or run.serving)


def _serving_since(failed: ObservedGroupNode,
                   by_slot: Mapping[tuple[str | None, int], ObservedGroupNode],
                   checked: Mapping[str, deepchecks.CheckState] | None = None) -> datetime | None:
    """When the failed node's replacement reported Ready, or passed its deep health checks if that
    came later (None: it has no replacement)."""
    successor = by_slot.get((failed.health.slot, failed.health.generation + 1)) if failed.health.slot else None
    ready = successor.health.condition(CONDITION_READY) if successor is not None else None
    if ready is None or ready.status != "True":
        return None
    run = (checked or {}).get(successor.name)
    return max(ready.last_transition_time, run.finished) if run is not None and run.finished else \
        ready.last_transition_time


def _reason(conditions: Sequence[Condition], type_: str) -> str | None:
    return next((c.reason for c in conditions if c.type == type_), None)


def _with_events(d: GroupDecision, prior: InstanceGroupStatus, warning: bool = False) -> GroupDecision:
    """An event when the phase or the Ready reason changes."""
    ready = next(c for c in d.status.conditions if c.type == "Ready")
    if prior.phase != d.status.phase or _reason(prior.conditions, "Ready") != ready.reason:
        d.events.insert(0, Event("Warning" if warning else "Normal", ready.reason, ready.message))
    return d


def managed_taint_keys(want: placement.NodeSpec) -> set[str]:
    """Taint keys the operator owns on a node: its own and the group's; others are left alone."""
    return {t.key for t in want.taints} | {naming.SPARE_TAINT.key, naming.UNHEALTHY_TAINT.key,
                                           naming.SAGEMAKER_UNHEALTHY_TAINT.key, deepchecks.CHECK_TAINT.key}


def _differs(want: placement.NodeSpec, have: ObservedGroupNode) -> bool:
    if not want.labels.items() <= have.labels.items():  # a label missing or with another value
        return True
    keys = managed_taint_keys(want)
    return {t for t in have.taints if t.key in keys} != set(want.taints)
