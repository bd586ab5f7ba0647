"""Nodes of a ``training-job`` plan: provisioned per admitted Kueue workload, kept warm, drained.

A ``training-job`` plan has no instance groups: its instances exist for the jobs that run on
it, as on SageMaker. :func:`decide_job_nodes` says, for one plan at ``now``, which nodes should
exist and for whom:

* Each workload admitted into the usable block (its check ``Ready``, still holding quota, not
  finished) gets the instances it needs (:func:`hyperplan.planning.admission.instances_needed`)
  as nodes of that block, in the block's AZ, labelled ``hyperplan.dev/workload=<namespace>.<name>``
  (the check's ``podSetUpdates`` put the same label in the pods' nodeSelector, so its pods land
  there and nowhere else). Blocks of one plan may be in different AZs; the nodes follow the
  block that is usable now.
* On UltraServer blocks a workload goes where it fits best: the one UltraServer with the least
  room that still holds it, else the fewest UltraServers (:func:`hyperplan.planning.placement.place_groups`
  on the room each UltraServer has left). So several jobs share one UltraServer, and one job
  crosses NVLink domains only when it must. The block's configured spares are not materialised
  for jobs (a job is rescheduled by Kueue, not healed in place); only the usable instances are
  slots.
* A workload that still runs on the plan's nodes after the check that admitted it went (deleted,
  or handed to another controller) keeps the nodes it has (:func:`still_running_holders`) until
  it finishes or is evicted, or the block drains.
* When a workload finishes or is evicted its nodes are released at once, unless the plan sets
  ``spec.keepAlivePeriodSeconds`` (SageMaker's managed warm pools): then they stay, labelled
  ``hyperplan.dev/workload=""`` and annotated with the time they go, and the next workload
  admitted into the block takes them before any new node is created.
* From the block's termination time on (and for nodes of any block that is not usable now)
  the nodes drain as an instance group's do: cordon, evict, and remove once empty or at the
  block's end.

Node names are ``hp-<plan>-<hash8(block)>-<slot>`` (:func:`hyperplan.planning.naming.node_name`
with the plan in the group's place), so a restart finds the same slots and never duplicates a node.

Pure: plain values and ``now`` in, a :class:`JobNodeDecision` out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Collection, Mapping, Sequence

from hyperplan.planning import naming
from hyperplan.planning import placement
from hyperplan.planning import reading

from hyperplan.api.vocabulary import (  # noqa: F401  (the keys re-exported)
    ANNOTATION_KEEP_ALIVE_UNTIL, LABEL_TRUSTED_WORKLOAD, LABEL_WORKLOAD, to_rfc3339,
)


def workload_label_value(namespace: str, name: str) -> str:
    """The ``hyperplan.dev/workload`` label value of a Kueue workload (a valid label value)."""
    return naming.label_value(f"{namespace}.{name}")


@dataclass(frozen=True)
class JobBlock:
    """The block whose nodes the plan's jobs may use now."""

    id: str
    availability_zone: str
    instance_type: str
    instance_count: int
    termination_time: datetime
    end: datetime
    ultra_server_type: str | None = None
    spares_per_ultraserver: int = 0

    def ultraservers(self) -> tuple[placement.UltraServer, ...]:
        return placement.ultraservers_for_block(self.id, self.ultra_server_type, self.instance_count,
                                         self.spares_per_ultraserver)

    def slots(self) -> list[tuple[placement.UltraServer | None, str]]:
        """Every slot a job node can take: the usable instances of each UltraServer, or 0..n-1."""
        servers = self.ultraservers()
        if not servers:
            return [(None, str(j)) for j in range(self.instance_count)]
        return [(u, f"{u.index}-{j}") for u in servers for j in range(u.usable)]


@dataclass(frozen=True)
class Holder:
    """An admitted workload and the instances it needs."""

    workload: str  # label value (workload_label_value)
    instances: int


@dataclass(frozen=True)
class JobNode:
    """One existing node of the plan, from its labels and annotations."""

    name: str
    block_id: str  # its reserved-capacity label value
    slot: str
    workload: str  # "" when idle (kept warm)
    keep_alive_until: datetime | None = None
    cordoned: bool = False
    signalled: bool = False  # carries the checkpoint signal (planning.groups.CONDITION_BLOCK_TERMINATING)


@dataclass(frozen=True)
class Drain:
    node: str
    deadline: datetime  # remove it then even if pods are left
    reason: str


@dataclass
class JobNodeDecision:
    create: list[placement.NodeSpec] = field(default_factory=list)
    assign: list[tuple[str, str]] = field(default_factory=list)  # (warm node, workload)
    keep_warm: list[tuple[str, datetime, str]] = field(default_factory=list)  # (node, until, previous workload)
    release: list[tuple[str, str]] = field(default_factory=list)  # (node, why)
    drain: list[Drain] = field(default_factory=list)
    checkpoint: list[str] = field(default_factory=list)  # nodes whose workloads are asked to checkpoint now
    short: dict[str, int] = field(default_factory=dict)  # workload -> instances no slot was left for
    wake_at: datetime | None = None


def node_spec(plan: str, block: JobBlock, server: placement.UltraServer | None, slot: str, workload: str,
              keys: naming.TopologyKeys = naming.TopologyKeys()) -> placement.NodeSpec:
    """A job node of ``workload`` on ``slot`` of ``block``, with hyperplan's labels."""
    name = naming.node_name(plan, block.id, slot)
    labels = {
        naming.LABEL_INSTANCE_TYPE: block.instance_type,
        naming.LABEL_ZONE: block.availability_zone,
        naming.LABEL_HOSTNAME: name,
        naming.LABEL_PLAN: naming.label_value(plan),
        naming.LABEL_RESERVED_CAPACITY: naming.label_value(block.id),
        naming.LABEL_ROLE: naming.ROLE_ACTIVE,
        naming.LABEL_HEALTH: naming.HEALTH_SCHEDULABLE,
        naming.LABEL_SLOT: slot,
        naming.LABEL_GENERATION: "0",
        LABEL_WORKLOAD: workload,
        LABEL_TRUSTED_WORKLOAD: workload,
    }
    if server is not None:
        labels.update(placement.topology_labels(block.availability_zone, block.id, server, keys))
    return placement.NodeSpec(name, labels, (), naming.ROLE_ACTIVE, server.id if server else None,
                       block.instance_type, block.availability_zone, slot)


def decide_job_nodes(plan: str, block: JobBlock | None, holders: Sequence[Holder], nodes: Sequence[JobNode],
                     keep_alive: timedelta | None, now: datetime,
                     keys: naming.TopologyKeys = naming.TopologyKeys(),
                     checkpoint_lead: timedelta | None = None, names_taken: Collection[str] = ()) -> JobNodeDecision:
    """What to do with a training-job plan's nodes (see the module docstring).

    ``block`` is the block that is active now (None in a gap or after the plan), even when
    past its termination time: its nodes then drain until its end. ``holders`` are in
    admission order: when slots run short, the earlier workload is served first. From
    ``checkpoint_lead`` before the termination time on, the block's nodes that do not carry the
    checkpoint signal yet are listed in ``checkpoint`` (as an instance group's are, see
    docs/checkpoint.md); the drain still starts at the termination time. ``names_taken``: node
    names that nodes outside the plan's record hold (a node labelled as the plan's by anyone):
    their slots are not made again (the create would collide), nor are those nodes used.
    """
    d = JobNodeDecision()
    block_value = naming.label_value(block.id) if block is not None else None
    usable = block is not None and now < block.termination_time
    wakes: list[datetime] = []
    if block is not None and checkpoint_lead is not None:
        signal_at = block.termination_time - checkpoint_lead
        if now >= signal_at:
            d.checkpoint = sorted(n.name for n in nodes if n.block_id == block_value and not n.signalled)
        else:
            wakes.append(signal_at)

    mine = [n for n in nodes if n.block_id == block_value] if block is not None else []
    for n in nodes:
        if n not in mine:
            d.drain.append(Drain(n.name, now, "its block is not active"))
    if block is not None and not usable:
        for n in mine:
            d.drain.append(Drain(n.name, block.end,
                                 f"block {block.id} reached its termination time {to_rfc3339(block.termination_time)}"))
        if mine:
            wakes.append(block.end)
        d.wake_at = min(wakes, default=None)
        return d
    if block is None:
        return d

    wakes.append(block.termination_time)
    need = {h.workload: h.instances for h in holders}
    held: dict[str, list[JobNode]] = {}
    warm: list[JobNode] = []
    for n in sorted(mine, key=lambda n: n.name):
        if n.workload and n.workload in need and len(held.get(n.workload, [])) < need[n.workload]:
            held.setdefault(n.workload, []).append(n)
        elif n.workload:  # its workload finished, was evicted, or needs fewer now
            if keep_alive:
                until = now + keep_alive
                d.keep_warm.append((n.name, until, n.workload))
                warm.append(JobNode(n.name, n.block_id, n.slot, "", until))
                wakes.append(until)
            else:
                d.release.append((n.name, f"workload {n.workload} no longer runs on it"))
        elif n.keep_alive_until is None or n.keep_alive_until <= now or not keep_alive:
            d.release.append((n.name, "its keep-alive period ended"))
        else:
            warm.append(n)
            wakes.append(n.keep_alive_until)

    taken = {n.slot for n in mine}
    slots = [(u, s) for u, s in block.slots() if naming.node_name(plan, block.id, s) not in names_taken]
    free_slots = [(u, s) for u, s in slots if s not in taken]
    server_of = {s: u for u, s in slots}
    for h in holders:
        short = h.instances - len(held.get(h.workload, []))
        if short <= 0:
            continue
        chosen = _choose(short, warm, free_slots, block, server_of)
        for kind, item in chosen:
            if kind == "warm":
                warm.remove(item)
                d.assign.append((item.name, h.workload))
            else:
                free_slots.remove(item)
                d.create.append(node_spec(plan, block, item[0], item[1], h.workload, keys))
        if len(chosen) < short:
            d.short[h.workload] = short - len(chosen)
    d.wake_at = min((w for w in wakes if w > now), default=None)
    return d


def still_running_holders(nodes: Sequence[JobNode], known: Collection[str], running: Collection[str]) -> list[Holder]:
    """Workloads that run on the plan's nodes without a check of the plan deciding for them.

    A workload admitted through a check that was deleted since (or handed to another controller)
    is no longer among the admission's holders, but it still runs on its nodes: it keeps the
    nodes it has (no more) until it finishes or is evicted, or its block drains. ``known``: the
    workloads (label values) that carry one of the plan's checks, decided by the admission pass;
    ``running``: the workloads Kueue still has admitted (:func:`hyperplan.planning.admission.workload_runs`).
    In node-name order, so the result is stable.
    """
    held: dict[str, int] = {}
    for n in sorted(nodes, key=lambda n: n.name):
        if n.workload and n.workload not in known and n.workload in running:
            held[n.workload] = held.get(n.workload, 0) + 1
    return [Holder(w, count) for w, count in held.items()]


def _choose(count: int, warm: list[JobNode], free_slots: list[tuple[placement.UltraServer | None, str]],
            block: JobBlock, server_of: Mapping[str, placement.UltraServer | None]) -> list[tuple[str, object]]:
    """``count`` places for one workload: warm nodes first, then free slots (lowest first); on
    UltraServers first the best-fitting UltraServers by the room each has left."""
    servers = block.ultraservers()
    if not servers:
        picks: list[tuple[str, object]] = [("warm", n) for n in warm[:count]]
        picks += [("slot", s) for s in free_slots[: count - len(picks)]]
        return picks
    room = {u.id: 0 for u in servers}
    for n in warm:
        u = server_of.get(n.slot)
        if u is not None:
            room[u.id] += 1
    for u, _ in free_slots:
        room[u.id] += 1
    total = sum(room.values())
    want = min(count, total)
    if want == 0:
        return []
    # place_groups on UltraServers as large as the room they have left: best fit, fewest domains.
    left = [placement.UltraServer(u.id, u.index, room[u.id], 0) for u in servers if room[u.id] > 0]
    placed = placement.place_groups([placement.GroupRequest("w", want)], left)["w"]
    picks = []
    for us_id, n in placed.allocations:
        here_warm = [w for w in warm if (u := server_of.get(w.slot)) is not None and u.id == us_id]
        here_free = [s for s in free_slots if s[0] is not None and s[0].id == us_id]
        take = [("warm", w) for w in here_warm[:n]]
        take += [("slot", s) for s in here_free[: n - len(take)]]
        picks += take
    return picks


def job_nodes_from_labels(items: Sequence[tuple[str, Mapping[str, str], Mapping[str, str], bool, bool]]
                          ) -> list[JobNode]:
    """JobNodes from (name, labels, annotations, cordoned, signalled) of the plan's nodes."""
    out = []
    for name, labels, node_annotations, cordoned, signalled in items:
        when = reading.time_or_none(node_annotations.get(ANNOTATION_KEEP_ALIVE_UNTIL))  # unreadable: absent
        out.append(JobNode(name, labels.get(naming.LABEL_RESERVED_CAPACITY, ""), labels.get(naming.LABEL_SLOT, ""),
                           labels.get(LABEL_WORKLOAD, ""), when, cordoned, signalled))
    return out
