"""What the operator remembers about its instance groups between passes: one owner, named operations.

A group's pass reads its nodes from the API; a few facts cannot be read there and live here:

* when this process first saw a node's ``Unschedulable*`` health label (the grace of that
  signal counts from it; the node also keeps it in an annotation, for restarts);
* the nodes the group held at its last pass, so that one missing now, and not released by
  the operator, is known to have been deleted from under the group (a failure signal);
* those vanished nodes, until their slot holds a replacement (also kept in the group's record,
  ``status.nodes[].vanished``, for restarts: only a node the record holds by name and uid);
* the nodes the operator is removing itself, so that their absence is no failure;
* the plan each group is bound to, whether its last pass found no free static node, and what
  nodes it read, so that a change wakes only the daemons it concerns.
* the values of its nodes that its last pass could not read (``planning.reading``), so that
  each is reported once, not on every pass;
* the nodes that carry its label but are not in its record (``planning.ownership``), so that
  each is reported once.

Pure like the rest of planning (no I/O, ``now`` passed in), but the one object that keeps
state: the handlers hold one instance (``Runtime.group_memory``). Every operation runs on the event
loop (kopf handlers and the group daemons' coroutines); worker threads return what they did
and the handler applies it here. Each pass prunes its
group (:meth:`GroupMemory.prune`), and a deleted group leaves nothing (:meth:`GroupMemory.forget_group`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from hyperplan.api.vocabulary import LABEL_NODE_ID
from hyperplan.planning import naming
from hyperplan.planning.reading import Finding, generation_of, slot_of


@dataclass(frozen=True)
class PresentNode:
    """What the memory needs of a node a pass found: its id, labels and current bad health label."""

    name: str
    labels: Mapping[str, str]
    bad_health_label: str | None = None

    @property
    def slot(self) -> str | None:
        return slot_of(self.labels)

    @property
    def generation(self) -> int:
        return generation_of(self.labels)


# What planning reads of a vanished node's last labels (actuation.groups.vanished_observation and
# placement.slot_states_from_labels): the record keeps these and the topology keys, nothing else.
VANISHED_KEYS = (naming.LABEL_GROUP, naming.LABEL_PLAN, naming.LABEL_RESERVED_CAPACITY, LABEL_NODE_ID,
                 naming.LABEL_SLOT, naming.LABEL_GENERATION, naming.LABEL_ROLE, naming.LABEL_REPLACES,
                 naming.LABEL_HEALTH)


def vanished_labels(labels: Mapping[str, str], keys: naming.TopologyKeys) -> dict[str, str]:
    """The labels of a vanished node that its record entry keeps (:data:`VANISHED_KEYS` and the
    topology keys): a bounded few, whatever else the node carried."""
    kept = (*VANISHED_KEYS, keys.ultraserver_id, keys.layer1, keys.layer2, keys.layer3)
    return {k: labels[k] for k in kept if k in labels}


@dataclass(frozen=True)
class Vanished:
    """A node deleted from under a group: its last labels and when it was found gone."""

    name: str
    labels: Mapping[str, str]
    since: datetime


@dataclass
class _Group:
    plan: str | None = None
    first_seen: dict[tuple[str, str], datetime] = field(default_factory=dict)
    known: dict[str, dict[str, str]] = field(default_factory=dict)
    vanished: dict[str, tuple[dict[str, str], datetime]] = field(default_factory=dict)
    releasing: set[str] = field(default_factory=set)
    short_of_free_nodes: bool = False
    nodes_read: int | None = None  # fingerprint of the nodes the last pass read
    unreadable: set[Finding] = field(default_factory=set)  # the values the last pass could not read
    unrecorded: set[tuple[str, str]] = field(default_factory=set)  # (name, uid) not in the group's record


class GroupMemory:
    """The operator's memory of its groups, by group label value (``naming.label_value``)."""

    def __init__(self) -> None:
        self._groups: dict[str, _Group] = {}

    def _group(self, group: str) -> _Group:
        return self._groups.setdefault(group, _Group())

    # ------------------------------------------------------------------ routing of wake-ups

    def bind(self, group: str, plan: str) -> None:
        """``group`` is bound to training plan ``plan`` (a change of the plan wakes it)."""
        self._group(group).plan = plan

    def groups_of(self, plan: str) -> list[str]:
        return [g for g, state in self._groups.items() if state.plan == plan]

    def note_short_of_free_nodes(self, group: str, short: bool) -> None:
        """Whether the group's last pass found no lendable free static node."""
        if short or group in self._groups:
            self._group(group).short_of_free_nodes = short

    def short_of_free_nodes(self) -> list[str]:
        """Groups a change to a free static node should wake."""
        return [g for g, state in self._groups.items() if state.short_of_free_nodes]

    def note_nodes_read(self, group: str, fingerprint: int) -> bool:
        """A pass read nodes with ``fingerprint`` (what the plan's counts read of them: names,
        labels, Ready, being deleted; ``controllers.group.reconciler.node_fingerprint``): whether they
        differ from what the group's last pass read, so that its plan's counts may have moved
        (the plan is woken through its groups' passes, not by every node event)."""
        state = self._group(group)
        changed = state.nodes_read != fingerprint
        state.nodes_read = fingerprint
        return changed

    # ------------------------------------------------------------------ health signals

    def first_sight(self, group: str, node: str, value: str, now: datetime) -> datetime:
        """When this process first saw ``node`` carry health label ``value`` (``now`` if never)."""
        return self._group(group).first_seen.setdefault((node, value), now)

    # ------------------------------------------------------------------ unreadable values

    def note_unreadable(self, group: str, findings: Iterable[Finding]) -> list[Finding]:
        """The pass found ``findings`` among the group's nodes: those the last pass did not find
        (each is reported once, not every pass; one that goes and comes back is new again)."""
        state = self._group(group)
        findings = list(dict.fromkeys(findings))
        fresh = [f for f in findings if f not in state.unreadable]
        state.unreadable = set(findings)
        return fresh

    # ------------------------------------------------------------------ nodes the group does not hold

    def note_unrecorded(self, group: str, nodes: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """The pass found ``nodes`` (name, uid) under the group's label but not in its record:
        those the last pass did not find (each is reported once; one that goes and comes back,
        or comes back as another node of the same name, is new again)."""
        state = self._group(group)
        nodes = list(dict.fromkeys(nodes))
        fresh = [n for n in nodes if n not in state.unrecorded]
        state.unrecorded = set(nodes)
        return fresh

    # ------------------------------------------------------------------ nodes leaving

    def note_releasing(self, group: str, nodes: Iterable[str]) -> None:
        """The operator is about to remove ``nodes`` (a drain or a remediation): their absence,
        and a deletion event for them, are no failure."""
        self._group(group).releasing.update(nodes)

    def note_deleted(self, group: str, node: str, labels: Mapping[str, str], now: datetime,
                     by_operator: bool = False) -> None:
        """A deletion event of one of ``group``'s nodes. Unless the operator removed it (noted as
        releasing, or ``by_operator`` read from the node's last state), it vanished: a failure
        signal judged after the grace. Events for groups this process does not hold are ignored."""
        state = self._groups.get(group)
        if state is None or node in state.releasing or by_operator:
            return
        state.vanished.setdefault(node, (dict(labels), now))

    def restore_vanished(self, group: str, entries: Iterable[Vanished]) -> None:
        """What an earlier process (or pass) kept in the group's record (``status.nodes[].vanished``)."""
        gone = self._group(group).vanished
        for v in entries:
            gone.setdefault(v.name, (dict(v.labels), v.since))

    def observe(self, group: str, present: Iterable[PresentNode], now: datetime) -> list[Vanished]:
        """The pass found ``present``: the nodes deleted from under the group, oldest record kept.

        A node held at the last pass, missing now and not being released by the operator has
        vanished (even if its deletion event is late). A vanished entry is dropped once its
        slot holds a newer generation (it was replaced), or a node of its slot and generation
        (which only that node could be: an entry restored from a record that says otherwise is
        wrong), or the node is back under its name.
        """
        state = self._group(group)
        present = list(present)
        names = {n.name for n in present}
        for node, labels in state.known.items():
            if node not in names and node not in state.vanished and node not in state.releasing:
                state.vanished[node] = (labels, now)
        state.known = {n.name: dict(n.labels) for n in present}
        newest: dict[str | None, int] = {}
        for n in present:
            newest[n.slot] = max(newest.get(n.slot, -1), n.generation)
        out = []
        for node, (labels, since) in list(state.vanished.items()):
            if node in names or newest.get(slot_of(labels), -1) >= generation_of(labels):
                del state.vanished[node]
                continue
            out.append(Vanished(node, labels, since))
        return sorted(out, key=lambda v: v.name)

    def vanished(self, group: str) -> list[Vanished]:
        state = self._groups.get(group)
        if state is None:
            return []
        return [Vanished(n, labels, since) for n, (labels, since) in sorted(state.vanished.items())]

    # ------------------------------------------------------------------ pruning

    def prune(self, group: str, present: Iterable[PresentNode]) -> None:
        """Forget what no longer concerns ``group`` after a pass that found ``present``:
        first sights of health labels a node no longer carries (or of nodes that are gone), and
        releases of nodes that are gone. Called every pass, after :meth:`observe`."""
        state = self._groups.get(group)
        if state is None:
            return
        bad = {n.name: n.bad_health_label for n in present}
        state.first_seen = {(node, value): when for (node, value), when in state.first_seen.items()
                             if bad.get(node) == value}
        state.releasing &= set(bad)

    def forget_group(self, group: str) -> None:
        """The group is gone: nothing of it stays."""
        self._groups.pop(group, None)

    def holds(self, group: str) -> bool:
        return group in self._groups

    def size(self) -> int:
        """Entries held over all groups (for tests and the curious)."""
        return sum(1 + len(s.first_seen) + len(s.known) + len(s.vanished) + len(s.releasing) + len(s.unreadable)
                   + len(s.unrecorded)
                   for s in self._groups.values())
