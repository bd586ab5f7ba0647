"""What must hold of a cluster that hyperplan runs, whatever crashed or restarted.

Pure checks over API objects as the API server sends them (plain dicts, the JSON of a list or
a watch event): no I/O, no clock. ``bench/chaos.py`` runs them after every fault it injects
and on watch events; each check returns violations as readable sentences (empty: it holds).

* :func:`slot_conflicts` - no two live nodes in one slot of a group's block. A failed node
  marked ``UnschedulablePendingReplacement`` (or any ``Unschedulable*`` value, under hyperplan's
  or SageMaker's health label) legitimately
  shares its slot with the replacement of the next generation until it is removed (make
  before break, ``planning.health``), so it does not count as live; neither does a node
  being deleted.
* :func:`ledger_overbooking` - no pool's ledger (``status.reservations`` plus the
  ``spec.unavailable`` windows sold to others) above its ``instanceCount`` at any moment.
* :func:`ledger_mismatches` - no plan bought twice: every bought plan's
  ``status.reservedCapacity`` is exactly its entries in the ledger, no reservation id is in
  two places, nothing in the ledger belongs to a plan that is gone or was never bought.
* :class:`PurchaseHistory` - over a stream of plan and pool versions: once bought, a plan's
  blocks never change, and a ledger entry never changes.
* :class:`PromotionHistory` - over a stream of node versions: at most one node ever
  carries ``hyperplan.dev/replaces=<failed node>``.
* :func:`orphaned_nodes` - no node of hyperplan's without a live group.
* :func:`group_shortfall` - what keeps a group from its desired counts (None: converged).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hyperplan.api.models import from_rfc3339
from hyperplan.planning.nodefacts import facts_of_dict

from hyperplan.api.vocabulary import (
    LABEL_GROUP,
    LABEL_REPLACES,
    LABEL_RESERVED_CAPACITY,
    LABEL_ROLE,
    LABEL_SLOT,
    TAINT_SPARE as SPARE_TAINT,
)

Obj = Mapping[str, Any]


def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _labels(obj: Obj) -> Mapping[str, str]:
    return _meta(obj).get("labels") or {}


def _name(obj: Obj) -> str:
    return _meta(obj).get("name", "?")


def is_hyperplan_node(node: Obj) -> bool:
    return LABEL_GROUP in _labels(node)


def node_ready(node: Obj) -> bool:
    return facts_of_dict(node).is_ready


def has_taint(node: Obj, key: str) -> bool:
    return any(t.get("key") == key for t in (node.get("spec") or {}).get("taints") or [])


def marked_unhealthy(node: Obj) -> bool:
    """Whether a health label, hyperplan's or SageMaker's, says the node must take no work (as every
    reader of node health judges it: ``planning.nodefacts``)."""
    return facts_of_dict(node).is_unhealthy


def live(node: Obj) -> bool:
    """A node that holds its slot: not marked unhealthy and not being deleted."""
    return not marked_unhealthy(node) and not _meta(node).get("deletionTimestamp")


# --------------------------------------------------------------------------- slots


def slot_conflicts(nodes: Iterable[Obj]) -> list[str]:
    """Slots of a group's block held by more than one live node."""
    holders: dict[tuple[str, str, str], list[str]] = {}
    for node in nodes:
        labels = _labels(node)
        if not is_hyperplan_node(node) or LABEL_SLOT not in labels or not live(node):
            continue
        key = (labels[LABEL_GROUP], labels.get(LABEL_RESERVED_CAPACITY, ""), labels[LABEL_SLOT])
        holders.setdefault(key, []).append(_name(node))
    return [f"slot {slot} of group {group} on block {block} is held by {len(names)} live nodes: "
            f"{', '.join(sorted(names))}"
            for (group, block, slot), names in sorted(holders.items()) if len(names) > 1]


# --------------------------------------------------------------------------- the ledger


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime
    count: int
    what: str


def pool_windows(pool: Obj) -> list[Window]:
    """The pool's ``spec.unavailable`` windows and its ledger's reservations."""
    out = []
    for w in (pool.get("spec") or {}).get("unavailable") or []:
        out.append(Window(from_rfc3339(w["start"]), from_rfc3339(w["end"]), int(w["instanceCount"]),
                          "unavailable"))
    for r in (pool.get("status") or {}).get("reservations") or []:
        out.append(Window(from_rfc3339(r["startTime"]), from_rfc3339(r["endTime"]), int(r["instanceCount"]),
                          f"{r.get('reservedCapacityId')} ({r.get('trainingPlan')})"))
    return out


def ledger_overbooking(pool: Obj) -> list[str]:
    """Moments at which the pool's windows add up to more than its ``instanceCount``.

    Windows are half open, ``[start, end)``: a block that ends when the next starts does not
    overlap it. One sentence per overbooked stretch, naming what overlaps there.
    """
    spec = pool.get("spec") or {}
    if spec.get("source"):
        return []  # a remote pool's lines mirror what the remote sold: its own ledger is the remote's
    capacity = int(spec.get("instanceCount", 0))
    windows = pool_windows(pool)
    # Sweep over the boundaries; ends sort before starts at the same instant (half open).
    edges = sorted([(w.start, 1, w) for w in windows] + [(w.end, 0, w) for w in windows],
                   key=lambda e: (e[0], e[1]))
    out: list[str] = []
    used, current = 0, []
    for moment, is_start, w in edges:
        if is_start:
            used += w.count
            current.append(w)
            if used > capacity:
                out.append(f"pool {_name(pool)} holds {used} > {capacity} instances at {moment.isoformat()}: "
                           + ", ".join(f"{c.what} x{c.count}" for c in current))
        else:
            used -= w.count
            current.remove(w)
    return out


def _blocks_of_plan(plan: Obj, added: bool = True) -> set[tuple[str, datetime, datetime, int]]:
    """The plan's status blocks as (id, start, end, instances); with ``added``, each UltraServer bought
    for the rest of a block too (its own ledger line: from its start to the block's end)."""
    out = set()
    for b in (plan.get("status") or {}).get("reservedCapacity") or []:
        end = from_rfc3339(b["endTime"])
        out.add((b["id"], from_rfc3339(b["startTime"]), end, int(b["instanceCount"])))
        for a in b.get("addedUltraServers") or [] if added else []:
            out.add((a["id"], from_rfc3339(a["startTime"]), end, int(a["instanceCount"])))
    return out


def ledger_entries(pools: Iterable[Obj]) -> dict[str, list[tuple[str, Mapping[str, Any]]]]:
    """Reservations by plan uid: ``[(pool, reservation), ...]``."""
    out: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for pool in pools:
        for r in (pool.get("status") or {}).get("reservations") or []:
            out.setdefault(r.get("trainingPlanUid", ""), []).append((_name(pool), r))
    return out


def ledger_mismatches(plans: Iterable[Obj], pools: Iterable[Obj], now: datetime) -> list[str]:
    """Plans whose purchase and the ledger disagree (see the module docstring).

    A deleted plan gives back what has not ended by then; what had ended stays in the ledger
    as history, so only entries of a gone plan that end after ``now`` count as leaked.

    A purchase writes the ledger before the plan's status, so right after a purchase (or a
    crash in between) the ledger may hold a plan's entries that its status does not show
    yet; callers judge a mismatch only once it outlasts a settling time.
    """
    pools = list(pools)
    entries = ledger_entries(pools)
    out: list[str] = []
    seen_ids: dict[str, str] = {}
    for pool in pools:
        for r in (pool.get("status") or {}).get("reservations") or []:
            rid = r.get("reservedCapacityId", "")
            if rid in seen_ids:
                out.append(f"reservation {rid} appears twice in the ledger (pools {seen_ids[rid]} and {_name(pool)})")
            seen_ids[rid] = _name(pool)
    by_uid = {_meta(p).get("uid"): p for p in plans}
    for uid, found in sorted(entries.items()):
        plan = by_uid.get(uid)
        if plan is None:
            found = [(p, r) for p, r in found if from_rfc3339(r["endTime"]) > now]
            if not found:
                continue
            names = sorted({r.get("trainingPlan", "?") for _, r in found})
            out.append(f"the ledger holds {len(found)} reservation(s) of plan {', '.join(names)} (uid {uid}), "
                       "which no longer exists")
            continue
        ledger = {(r["reservedCapacityId"], from_rfc3339(r["startTime"]), from_rfc3339(r["endTime"]),
                   int(r["instanceCount"])) for _, r in found}
        status = _blocks_of_plan(plan)
        if ledger != status:
            out.append(f"plan {_name(plan)}: ledger {_fmt_blocks(ledger)} but status.reservedCapacity "
                       f"{_fmt_blocks(status)}")
    for uid, plan in by_uid.items():
        if uid not in entries and _blocks_of_plan(plan):
            out.append(f"plan {_name(plan)} shows blocks {_fmt_blocks(_blocks_of_plan(plan))} "
                       "that the ledger does not hold")
    return out


def _fmt_blocks(blocks: set[tuple[str, datetime, datetime, int]]) -> str:
    if not blocks:
        return "[]"
    return "[" + ", ".join(f"{i} {s:%H:%M:%S}-{e:%H:%M:%S} x{n}" for i, s, e, n in sorted(blocks)) + "]"


@dataclass
class PurchaseHistory:
    """Every version of plans and pools seen on watches: a purchase happens once.

    ``plan(obj)`` and ``pool(obj)`` return violations: a plan whose bought blocks change once
    set (bought a second time), a reservation whose window, size or plan changes in the
    ledger (rewritten by a second purchase).
    """

    plans: dict[str, tuple[str, frozenset]] = field(default_factory=dict)
    reservations: dict[str, tuple[str, str, str, int]] = field(default_factory=dict)

    def plan(self, obj: Obj) -> list[str]:
        blocks = frozenset(_blocks_of_plan(obj, added=False))  # an UltraServer added later is no second purchase
        uid = _meta(obj).get("uid", "")
        if not blocks:
            return []
        first = self.plans.setdefault(uid, (_name(obj), blocks))
        if first[1] != blocks:
            return [f"plan {_name(obj)} was bought again: blocks {_fmt_blocks(set(first[1]))} became "
                    f"{_fmt_blocks(set(blocks))}"]
        return []

    def pool(self, obj: Obj) -> list[str]:
        out = []
        for r in (obj.get("status") or {}).get("reservations") or []:
            rid = r.get("reservedCapacityId", "")
            value = (r.get("trainingPlanUid", ""), r.get("startTime", ""), r.get("endTime", ""),
                     int(r.get("instanceCount", 0)))
            first = self.reservations.setdefault(rid, value)
            if first != value:
                out.append(f"reservation {rid} in pool {_name(obj)} changed from {first} to {value}")
        return out


@dataclass
class PromotionHistory:
    """Which nodes ever carried ``hyperplan.dev/replaces=<failed node>``, over all versions seen."""

    replacing: dict[str, set[str]] = field(default_factory=dict)

    def node(self, obj: Obj) -> list[str]:
        failed = _labels(obj).get(LABEL_REPLACES)
        if not failed:
            return []
        spares = self.replacing.setdefault(failed, set())
        new = _name(obj) not in spares
        spares.add(_name(obj))
        if new and len(spares) > 1:
            return [f"{len(spares)} spares promoted for the failure of {failed}: {', '.join(sorted(spares))}"]
        return []

    @property
    def promotions(self) -> int:
        return len(self.replacing)


# --------------------------------------------------------------------------- groups and nodes


def orphaned_nodes(nodes: Iterable[Obj], groups: Iterable[Obj], *, allow_deleting: bool = True) -> list[str]:
    """hyperplan's nodes whose group does not exist (or, with ``allow_deleting`` False, is
    being deleted: a deleting group's nodes are draining, which is fine until it converged)."""
    alive: dict[str, bool] = {}
    for g in groups:
        alive[_name(g)] = not _meta(g).get("deletionTimestamp")
    out = []
    for node in nodes:
        if not is_hyperplan_node(node):
            continue
        group = _labels(node)[LABEL_GROUP]
        if group not in alive:
            out.append(f"node {_name(node)} belongs to group {group}, which does not exist")
        elif not alive[group] and not allow_deleting:
            out.append(f"node {_name(node)} still belongs to group {group}, which is being deleted")
    return out


@dataclass(frozen=True)
class Expected:
    """What a converged group holds on its block: active nodes and spares."""

    active: int
    spares: int = 0


def group_shortfall(group: Obj, nodes: Sequence[Obj], expected: Expected) -> str | None:
    """Why ``group`` is not at its desired counts yet (None: it is).

    Converged means: the status says Ready with ``readyCount`` = the desired active count and
    no unhealthy node, and the cluster agrees - exactly ``active`` Ready, healthy, untainted
    active nodes and ``spares`` Ready spares carrying the spare taint, one block, nothing else.
    """
    st = group.get("status") or {}
    if st.get("phase") != "Ready":
        return f"phase {st.get('phase')}"
    if st.get("readyCount") != expected.active or st.get("desiredCount") != expected.active:
        return f"status ready {st.get('readyCount')}/{st.get('desiredCount')}, want {expected.active}"
    if st.get("unhealthyCount", 0):
        return f"status unhealthy {st.get('unhealthyCount')}"
    mine = [n for n in nodes if _labels(n).get(LABEL_GROUP) == _name(group)]
    blocks = {_labels(n).get(LABEL_RESERVED_CAPACITY) for n in mine}
    if len(blocks) > 1:
        return f"nodes on {len(blocks)} blocks"
    active = [n for n in mine if _labels(n).get(LABEL_ROLE) == "active" and node_ready(n) and not marked_unhealthy(n)
              and not has_taint(n, SPARE_TAINT)]
    spares = [n for n in mine if _labels(n).get(LABEL_ROLE) == "spare" and node_ready(n) and not marked_unhealthy(n)
              and has_taint(n, SPARE_TAINT)]
    if len(active) != expected.active or len(spares) != expected.spares or len(mine) != expected.active + expected.spares:
        return (f"{len(active)} active + {len(spares)} spare Ready of {len(mine)} nodes, "
                f"want {expected.active} + {expected.spares}")
    return None
