"""Placement of instance-group nodes on a reserved-capacity block, and the desired node set.

Pure: plain values in, plain values out; no I/O, no clock, stdlib only.

The model
---------
A reserved-capacity block is either a plain block (``count`` nodes, no UltraServers, no
spares) or a block of whole UltraServers (``ml.u-p6e-gb200x72`` = 18 instances,
``ml.u-p6e-gb200x36`` = 9). Each UltraServer keeps ``spare_count`` of its instances as
spares, so only ``instance_count - spare_count`` of them can be handed to groups as
active nodes (:func:`ultraservers_for_block`).

Placement (:func:`place_groups`) takes the groups bound to the block in an explicit,
deterministic order (the caller decides: by creation time, then name) and:

1. reserves every *explicit* placement first (SageMaker's ``InstancePlacementConfig``:
   ``(ultraServerId, instanceCount)`` pairs), in group order, so a group that names its
   UltraServers is never crowded out by a fill-first group that merely comes earlier;
2. then places every fill-first group, in order, on what is left:

   * if one UltraServer can hold the whole group, the group goes there - the one with the
     *least* room that still fits (best fit; ties go to the lowest index). On empty
     UltraServers this is plain fill-first (14 on two x72 -> all on the first); on shared
     ones it fills what earlier groups left before opening a fresh NVLink domain, and
     never splits a group that one domain can hold;
   * otherwise it takes whole UltraServers, most room first (ties: lowest index), and the
     remainder goes to the best-fitting one (20 on two empty x72 -> 17 + 3). This uses the
     fewest UltraServers possible, since crossing UltraServers means EFA instead of NVLink.

   A group is placed whole or not at all: when it does not fit it gets an error and holds
   nothing, and later groups may use the room.

Spare ownership (:func:`spare_owners`): each UltraServer's spares are materialised as
nodes by the first group (in the given order) that holds active nodes on it, so a group
always finds its UltraServer's spares beside its active nodes, and promotion of a spare
never crosses a group boundary. Spares of UltraServers that no group uses are not created
(they are still reported as configured spares by :func:`plan_counts`).

Node names, labels and taints live in :mod:`hyperplan.planning.naming`; what a plan's nodes
count as (in use, unhealthy, spares, UltraServer health) in :mod:`hyperplan.planning.counts`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from hyperplan.api.vocabulary import ULTRASERVER_INSTANCE_TYPE, ULTRASERVER_INSTANCES  # noqa: F401
from hyperplan.planning.nodefacts import effective_health, hyperpod_mirror, is_unschedulable
from hyperplan.planning.reading import generation_of, slot_of
from hyperplan.planning.naming import (
    HEALTH_SCHEDULABLE,
    LABEL_GENERATION,
    LABEL_GROUP,
    LABEL_HEALTH,
    LABEL_HOSTNAME,
    LABEL_INSTANCE_TYPE,
    LABEL_PLAN,
    LABEL_RESERVED_CAPACITY,
    LABEL_ROLE,
    LABEL_SLOT,
    LABEL_ZONE,
    ROLE_ACTIVE,
    ROLE_SPARE,
    SPARE_TAINT,
    Taint,
    TopologyKeys,
    SAGEMAKER_UNHEALTHY_TAINT,
    UNHEALTHY_TAINT,
    label_value,
    network_node_id,
    node_name,
    ultraserver_id,
)

# --------------------------------------------------------------------------- constants

DEFAULT_SPARES_PER_ULTRASERVER = 1

# Placement error reasons (condition reasons on the InstanceGroup).
REASON_INSUFFICIENT_CAPACITY = "InsufficientCapacity"
REASON_UNKNOWN_ULTRASERVER = "UnknownUltraServer"
REASON_PLACEMENT_EXCEEDS_CAPACITY = "PlacementExceedsCapacity"
REASON_PLACEMENT_COUNT_MISMATCH = "PlacementCountMismatch"
REASON_INVALID_PLACEMENT = "InvalidPlacement"


# --------------------------------------------------------------------------- UltraServers


@dataclass(frozen=True)
class UltraServer:
    id: str
    index: int
    instance_count: int
    spare_count: int

    @property
    def usable(self) -> int:
        """Instances that can be handed to groups as active nodes."""
        return self.instance_count - self.spare_count


def ultraservers_for_block(
    reserved_capacity_id: str,
    ultra_server_type: str | None,
    instance_count: int,
    spare_per_ultraserver: int = DEFAULT_SPARES_PER_ULTRASERVER,
) -> tuple[UltraServer, ...]:
    """The UltraServers of a block, ``()`` for a block without UltraServers.

    Raises ``ValueError`` for an unknown UltraServer type, an instance count that is not a
    whole number of UltraServers, or a spare count outside ``0 .. instances-1``.
    """
    if not ultra_server_type:
        return ()
    size = ULTRASERVER_INSTANCES.get(ultra_server_type)
    if size is None:
        raise ValueError(f"unknown UltraServer type {ultra_server_type!r}; "
                         f"known: {', '.join(sorted(ULTRASERVER_INSTANCES))}")
    if instance_count <= 0 or instance_count % size:
        raise ValueError(f"{instance_count} instances is not a whole number of "
                         f"{ultra_server_type} UltraServers ({size} instances each)")
    if not 0 <= spare_per_ultraserver < size:
        raise ValueError(f"spares per UltraServer must be between 0 and {size - 1}, "
                         f"got {spare_per_ultraserver}")
    return tuple(
        UltraServer(ultraserver_id(reserved_capacity_id, i), i, size, spare_per_ultraserver)
        for i in range(instance_count // size)
    )


# --------------------------------------------------------------------------- placement


@dataclass(frozen=True)
class GroupRequest:
    name: str
    instance_count: int
    explicit: tuple[tuple[str, int], ...] = ()  # ((ultraServerId, count), ...)


@dataclass(frozen=True)
class PlacementResult:
    """Where one group's active nodes go, or why they cannot be placed.

    ``allocations`` lists ``(ultraServerId, activeCount)`` in UltraServer index order; it is
    empty on blocks without UltraServers, where the group simply has ``instance_count``
    nodes. ``reason``/``message`` are set (and ``allocations`` empty) when placement failed.
    """

    group: str
    instance_count: int
    allocations: tuple[tuple[str, int], ...] = ()
    reason: str | None = None
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None

    @property
    def counts(self) -> dict[str, int]:
        """``{ultraServerId: active count}``."""
        return dict(self.allocations)


def _fail(group: GroupRequest, reason: str, message: str) -> PlacementResult:
    return PlacementResult(group.name, group.instance_count, (), reason, message)


def _fill(need: int, room: dict[str, int], order: Sequence[UltraServer]) -> dict[str, int]:
    """Best-fit/fewest-UltraServers allocation of ``need`` (caller checked it fits)."""
    alloc: dict[str, int] = {}
    free = [u for u in order if room[u.id] > 0]
    while need > 0:
        fitting = [u for u in free if room[u.id] >= need]
        if fitting:
            best = min(fitting, key=lambda u: (room[u.id], u.index))
            alloc[best.id] = alloc.get(best.id, 0) + need
            return alloc
        biggest = min(free, key=lambda u: (-room[u.id], u.index))
        alloc[biggest.id] = room[biggest.id]
        need -= room[biggest.id]
        free.remove(biggest)
    return alloc


def place_groups(
    groups: Sequence[GroupRequest],
    ultraservers: Sequence[UltraServer],
    *,
    capacity: int | None = None,
) -> dict[str, PlacementResult]:
    """Place ``groups`` (in the given order) on a block; see the module docstring.

    ``capacity`` bounds the total of a block without UltraServers (groups beyond it, in
    order, get ``InsufficientCapacity``); ``None`` means unchecked. On UltraServer blocks
    the bound is the UltraServers' usable instances. The result has one entry per group,
    in input order. Raises ``ValueError`` for duplicate group names (a caller bug).
    """
    names = [g.name for g in groups]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate group names in {names}")
    results: dict[str, PlacementResult] = {}

    def invalid(g: GroupRequest) -> PlacementResult | None:
        if g.instance_count < 0:
            return _fail(g, REASON_INVALID_PLACEMENT,
                         f"instance count must be >= 0, got {g.instance_count}")
        seen: set[str] = set()
        for us_id, count in g.explicit:
            if count < 0:
                return _fail(g, REASON_INVALID_PLACEMENT,
                             f"placement for UltraServer {us_id} has negative count {count}")
            if us_id in seen:
                return _fail(g, REASON_INVALID_PLACEMENT,
                             f"UltraServer {us_id} is named more than once in the placement")
            seen.add(us_id)
        return None

    if not ultraservers:
        used = 0
        for g in groups:
            bad = invalid(g)
            if bad is None and g.explicit:
                bad = _fail(g, REASON_UNKNOWN_ULTRASERVER,
                            "the placement names UltraServers "
                            f"({', '.join(u for u, _ in g.explicit)}) but the block has none")
            if bad is None and capacity is not None and used + g.instance_count > capacity:
                bad = _fail(g, REASON_INSUFFICIENT_CAPACITY,
                            f"{g.instance_count} instances requested, "
                            f"{max(capacity - used, 0)} of {capacity} left in the block")
            if bad is None:
                used += g.instance_count
                bad = PlacementResult(g.name, g.instance_count)
            results[g.name] = bad
        return results

    by_id = {u.id: u for u in ultraservers}
    order = sorted(ultraservers, key=lambda u: u.index)
    room = {u.id: u.usable for u in ultraservers}

    def result(g: GroupRequest, alloc: Mapping[str, int]) -> PlacementResult:
        allocations = tuple((u.id, alloc[u.id]) for u in order if alloc.get(u.id, 0) > 0)
        return PlacementResult(g.name, g.instance_count, allocations)

    # 1. explicit placements, in order
    for g in groups:
        if not g.explicit:
            continue
        bad = invalid(g)
        if bad is None:
            unknown = [u for u, _ in g.explicit if u not in by_id]
            if unknown:
                bad = _fail(g, REASON_UNKNOWN_ULTRASERVER,
                            f"unknown UltraServer(s) {', '.join(unknown)}; the block has "
                            f"{', '.join(u.id for u in order)}")
        if bad is None:
            total = sum(c for _, c in g.explicit)
            if total != g.instance_count:
                bad = _fail(g, REASON_PLACEMENT_COUNT_MISMATCH,
                            f"the placement places {total} instances but the group asks "
                            f"for {g.instance_count}")
        if bad is None:
            for us_id, count in g.explicit:
                if count > room[us_id]:
                    u = by_id[us_id]
                    taken = u.usable - room[us_id]
                    bad = _fail(g, REASON_PLACEMENT_EXCEEDS_CAPACITY,
                                f"{count} instances on UltraServer {us_id}, which has "
                                f"{u.usable} usable ({u.instance_count} minus {u.spare_count} "
                                f"spare), {taken} already placed, {room[us_id]} left")
                    break
        if bad is None:
            for us_id, count in g.explicit:
                room[us_id] -= count
            bad = result(g, dict(g.explicit))
        results[g.name] = bad

    # 2. fill-first groups, in order
    for g in groups:
        if g.explicit:
            continue
        bad = invalid(g)
        if bad is None:
            left = sum(room.values())
            if g.instance_count > left:
                usable = sum(u.usable for u in order)
                bad = _fail(g, REASON_INSUFFICIENT_CAPACITY,
                            f"{g.instance_count} instances requested, {left} of {usable} "
                            f"usable instances left on {len(order)} UltraServer(s)")
        if bad is None:
            alloc = _fill(g.instance_count, room, order)
            for us_id, count in alloc.items():
                room[us_id] -= count
            bad = result(g, alloc)
        results[g.name] = bad

    return {name: results[name] for name in names}


def spare_owners(
    placements: Mapping[str, PlacementResult], order: Sequence[str] | None = None
) -> dict[str, str]:
    """``{ultraServerId: group}``: who materialises each UltraServer's spares.

    The owner is the first group in ``order`` (default: the mapping's order, which
    :func:`place_groups` keeps as its input order) that holds active nodes on the
    UltraServer. UltraServers without active nodes have no owner; their spares are not
    created.
    """
    owners: dict[str, str] = {}
    for name in (order if order is not None else list(placements)):
        p = placements.get(name)
        if p is None or not p.ok:
            continue
        for us_id, count in p.allocations:
            if count > 0 and us_id not in owners:
                owners[us_id] = name
    return owners


def spare_ultraservers(group: str, owners: Mapping[str, str]) -> tuple[str, ...]:
    """The UltraServer ids whose spares ``group`` holds (sorted)."""
    return tuple(sorted(us for us, g in owners.items() if g == group))


def standing_in(replacements: Mapping[str, str]) -> dict[str, str]:
    """``{failed: the UltraServer its nodes are on now}`` from ``{failed: replacement}``: a
    replacement that failed in turn was replaced too, so each failed one maps to the last of its
    chain (a loop, which the operator never writes, is cut where it closes)."""
    out: dict[str, str] = {}
    for failed, at in replacements.items():
        seen = {failed}
        while at in replacements and at not in seen:
            seen.add(at)
            at = replacements[at]
        out[failed] = at
    return out


def place_with_replacements(
    groups: Sequence[GroupRequest],
    ultraservers: Sequence[UltraServer],
    replacements: Mapping[str, str],
) -> dict[str, PlacementResult]:
    """:func:`place_groups` on a block some of whose UltraServers were replaced
    (``{failed: replacement}``, planning.recovery.plan_ultraserver_replacement).

    The groups are placed as before on the block's UltraServers with each replacement left out,
    since it stands in for the one it replaced; then what was placed on a failed UltraServer is on
    its replacement. So no group moves but those that were on the failed one, and a group made
    later that lands on a failed UltraServer lands on its replacement.
    """
    if not replacements:
        return place_groups(groups, ultraservers)
    moved = standing_in(replacements)
    stand_ins = set(replacements.values())  # each stands in for the one it replaced
    logical = [u for u in ultraservers if u.id not in stand_ins]
    index = {u.id: u.index for u in ultraservers}
    out: dict[str, PlacementResult] = {}
    for name, result in place_groups(groups, logical).items():
        if not result.ok:
            out[name] = result
            continue
        alloc: dict[str, int] = {}
        for us_id, count in result.allocations:
            at = moved.get(us_id, us_id)
            alloc[at] = alloc.get(at, 0) + count
        out[name] = replace(result, allocations=tuple(sorted(alloc.items(), key=lambda a: index.get(a[0], 0))))
    return out


# --------------------------------------------------------------------------- desired nodes


@dataclass(frozen=True)
class SlotState:
    """What the cluster says about a group's slot: its current generation, role and health.

    Read back from existing nodes with :func:`slot_states_from_labels` and passed to
    :func:`desired_nodes`, so that a promotion (a spare now active, its old slot refilled
    by a spare) and a replacement's generation survive the next reconcile and a restart.
    """

    generation: int = 0
    role: str | None = None
    health: str = HEALTH_SCHEDULABLE

    @property
    def unhealthy(self) -> bool:
        return is_unschedulable(self.health)


def slot_states_from_labels(nodes_labels: Iterable[Mapping[str, str]]) -> dict[str, SlotState]:
    """Slot states from the labels of a group's existing nodes on one block.

    A slot's health is its node's effective health (``nodefacts.effective_health``: the worse of
    hyperplan's and HyperPod's labels), ``Schedulable`` when neither is set. Nodes without a slot
    label are ignored. When a slot has several nodes (a replacement exists before the failed node
    is gone) the highest generation wins.
    """
    states: dict[str, SlotState] = {}
    for labels in nodes_labels:
        slot = slot_of(labels)  # unreadable values count as absent (planning.reading)
        if not slot:
            continue
        generation = generation_of(labels)
        role = labels.get(LABEL_ROLE)
        state = SlotState(generation, role if role in (ROLE_ACTIVE, ROLE_SPARE) else None,
                          effective_health(labels) or HEALTH_SCHEDULABLE)
        if slot not in states or generation > states[slot].generation:
            states[slot] = state
    return states


@dataclass(frozen=True)
class NodeSpec:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    role: str
    ultraserver_id: str | None
    instance_type: str
    availability_zone: str
    slot: str = "0"
    generation: int = 0
    # For a lent node: the cloud's UltraServer behind each of the group's UltraServers that
    # holds lent nodes already (:func:`cloud_ultraservers`), so that the node is chosen from
    # the same one (``lending.choose_free_node``). Empty for the other providers.
    cloud_ultraservers: Mapping[str, str] = field(default_factory=dict)


def cloud_ultraservers(members: Iterable[tuple[str | None, str | None]]) -> dict[str, str]:
    """Which of the cloud's UltraServers each of hyperplan's is, by membership.

    ``members`` holds one pair per node: the UltraServer hyperplan placed it on, and the
    cloud's UltraServer id the node carried before hyperplan labelled it (None when unknown:
    a node hyperplan made, or a lent node that carried none). hyperplan's UltraServer ``u``
    is the cloud's ``c`` when every node of ``u`` came from ``c`` and no node of another of
    hyperplan's UltraServers did: a mixed or unknown membership pairs nothing, since pairing
    by guess would pass one machine's health to another (the cloud's ``Impaired`` reaches a
    plan's UltraServer only through this pairing; ``planning.remote.with_remote_health``).
    """
    clouds: dict[str, set[str | None]] = {}
    for ours, cloud in members:
        if ours:
            clouds.setdefault(ours, set()).add(cloud)
    single = {ours: next(iter(c)) for ours, c in clouds.items() if len(c) == 1 and None not in c}
    claimed: dict[str, int] = {}
    for c in clouds.values():
        for cloud in c - {None}:
            claimed[cloud] = claimed.get(cloud, 0) + 1
    return {ours: cloud for ours, cloud in single.items() if claimed[cloud] == 1}


def topology_labels(
    availability_zone: str, reserved_capacity_id: str, ultraserver: UltraServer,
    keys: TopologyKeys = TopologyKeys(),
) -> dict[str, str]:
    """The UltraServer topology labels of a node (layer-1 top .. layer-3 NVLink domain)."""
    return {
        keys.ultraserver_id: ultraserver.id,
        keys.layer1: network_node_id("layer-1", availability_zone),
        keys.layer2: network_node_id("layer-2", reserved_capacity_id),
        keys.layer3: network_node_id("layer-3", ultraserver.id),
    }


def _assign_roles(layout: Sequence[tuple[object, Sequence[str], int, int]],
                  states: Mapping[str, SlotState]) -> dict[str, str]:
    """Roles for every slot of the group, with quotas counted for the whole group.

    ``layout`` lists, per UltraServer, its slot keys and its active and spare counts. The
    group needs ``sum(active)`` active nodes and ``sum(spare)`` spares in all. Healthy
    slots keep their recorded role while the group-wide quota lasts, so a spare promoted
    across UltraServers stays active and its backfill stays a spare; the rest take what is
    left, preferring the role of their position in the UltraServer's layout (its first
    ``active`` slots are active), unhealthy slots last. A shrink thus turns the surplus
    active slots into spares instead of keeping them active."""
    quota = {ROLE_ACTIVE: sum(a for _, _, a, _ in layout), ROLE_SPARE: sum(sp for _, _, _, sp in layout)}
    roles: dict[str, str] = {}
    for _, slots, _, _ in layout:
        for slot in slots:
            st = states.get(slot)
            if st is not None and not st.unhealthy and st.role in quota and quota[st.role] > 0:
                roles[slot] = st.role
                quota[st.role] -= 1
    rest = [(slot, ROLE_ACTIVE if j < active else ROLE_SPARE)
            for _, slots, active, _ in layout for j, slot in enumerate(slots) if slot not in roles]

    def unhealthy(slot: str) -> bool:
        return slot in states and states[slot].unhealthy

    def take(slot: str, role: str) -> None:
        if quota[role] <= 0:
            role = ROLE_SPARE if role == ROLE_ACTIVE else ROLE_ACTIVE
        roles[slot] = role
        quota[role] -= 1

    # Healthy slots in an active position first, then the other healthy slots (active while
    # the group still needs active nodes, so a failed slot's role moves to a healthy one),
    # then the unhealthy slots take what is left.
    for slot, preferred in rest:
        if preferred == ROLE_ACTIVE and not unhealthy(slot):
            take(slot, ROLE_ACTIVE)
    for slot, _ in rest:
        if slot not in roles and not unhealthy(slot):
            take(slot, ROLE_ACTIVE)
    for slot, _ in rest:
        if slot not in roles:
            take(slot, ROLE_ACTIVE)
    return roles


def desired_nodes(
    group: str,
    plan: str,
    reserved_capacity_id: str,
    instance_type: str,
    availability_zone: str,
    placement: PlacementResult,
    ultraservers: Sequence[UltraServer] = (),
    spare_ultraservers: Collection[str] = (),
    extra_labels: Mapping[str, str] | None = None,
    extra_taints: Sequence[Taint] = (),
    keys: TopologyKeys = TopologyKeys(),
    slots: Mapping[str, SlotState] | None = None,
) -> list[NodeSpec]:
    """The nodes ``group`` should have on this block, sorted by UltraServer index and slot.

    On an UltraServer block the group has, per UltraServer it uses, its active count from
    ``placement`` plus, for UltraServers in ``spare_ultraservers`` (see
    :func:`spare_owners`), that UltraServer's spares. Without UltraServers it has
    ``placement.instance_count`` active nodes and no spares.

    Labels: the group's ``extra_labels``, overridden by the operator's own (instance type,
    zone, hostname, group, plan, reserved capacity, role, health, slot, generation and, on
    UltraServers, the topology keys). Taints: ``extra_taints``, plus :data:`SPARE_TAINT` on
    spares and :data:`UNHEALTHY_TAINT` on slots whose state is unhealthy. The health label
    is ``Schedulable`` for new slots and the recorded value for known ones, so a reconcile
    never clears a health mark.

    Raises ``ValueError`` if ``placement`` failed: the caller reports the failure and must
    not read it as "no nodes wanted".
    """
    if not placement.ok:
        raise ValueError(f"placement of group {group} failed: {placement.reason}: "
                         f"{placement.message}")
    states = dict(slots or {})
    extra = dict(extra_labels or {})
    group_value = label_value(group)
    base = {
        LABEL_INSTANCE_TYPE: instance_type,
        LABEL_ZONE: availability_zone,
        LABEL_GROUP: group_value,
        LABEL_PLAN: label_value(plan),
        LABEL_RESERVED_CAPACITY: label_value(reserved_capacity_id),
    }

    # (ultraserver or None, slot keys, active quota, spare quota)
    layout: list[tuple[UltraServer | None, list[str], int, int]] = []
    if ultraservers:
        counts = placement.counts
        for u in sorted(ultraservers, key=lambda u: u.index):
            active = counts.get(u.id, 0)
            spare = u.spare_count if u.id in spare_ultraservers else 0
            if active + spare:
                layout.append((u, [f"{u.index}-{j}" for j in range(active + spare)],
                               active, spare))
    elif placement.instance_count:
        n = placement.instance_count
        layout.append((None, [str(j) for j in range(n)], n, 0))

    nodes: list[NodeSpec] = []
    roles = _assign_roles(layout, states)
    for u, slot_keys, active, spare in layout:
        for slot in slot_keys:
            st = states.get(slot, SlotState())
            role = roles[slot]
            name = node_name(group, reserved_capacity_id, slot, st.generation)
            labels = dict(extra)
            labels.update(base)
            labels[LABEL_HOSTNAME] = name
            labels[LABEL_ROLE] = role
            labels[LABEL_HEALTH] = st.health
            labels[LABEL_SLOT] = slot
            labels[LABEL_GENERATION] = str(st.generation)
            if u is not None:
                labels.update(topology_labels(availability_zone, reserved_capacity_id, u, keys))
            ours = []
            if role == ROLE_SPARE:
                ours.append(SPARE_TAINT)
            if st.unhealthy:
                ours.append(UNHEALTHY_TAINT)
            ours_keys = {(t.key, t.effect) for t in ours}
            taints = tuple(t for t in extra_taints if (t.key, t.effect) not in ours_keys)
            taints += tuple(ours)
            nodes.append(NodeSpec(name, labels, taints, role, u.id if u else None,
                                  instance_type, availability_zone, slot, st.generation))
    return nodes


def hyperpod_dressed(spec: NodeSpec) -> NodeSpec:
    """``spec`` with HyperPod's labels beside hyperplan's (``nodefacts.hyperpod_mirror``: health and
    deep-health-check status) and HyperPod's taint beside hyperplan's unhealthy one, for the
    setting ``hyperpod_labels``."""
    labels = {**spec.labels, **hyperpod_mirror(spec.labels)}
    taints = tuple(t for t in spec.taints if t.key != SAGEMAKER_UNHEALTHY_TAINT.key)
    if UNHEALTHY_TAINT in spec.taints:
        taints += (SAGEMAKER_UNHEALTHY_TAINT,)
    return replace(spec, labels=labels, taints=taints)
