"""``hyperplan status``: plans, their blocks on a time axis, UltraServers and group nodes in one view.

Two halves, kept apart so that the view is testable without a cluster:

* :func:`gather` reads the API (pools, plans, groups, the groups' nodes) into a :class:`Snapshot`,
  plain dataclasses with no client objects in them; :meth:`Snapshot.to_dict` is the ``-o json``
  form, with stable camelCase keys.
* :func:`render` turns a snapshot and a ``now`` into a rich renderable. Nothing in it reads the
  clock, so a test renders a fixed snapshot at a fixed ``now`` into a fixed-width console and
  reads the text.

Where a block sits on the time axis (past, active, next) is computed from its times and ``now``,
not from its recorded status, so the picture is right even between two reconciles.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable

from rich import box
from rich.console import Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from hyperplan.api.models import (CapacityPoolSpec, CapacityPoolStatus, HealthCheckSpec, InstanceGroupStatus,
                                  TrainingPlanStatus, from_rfc3339, to_rfc3339)
from hyperplan.api.vocabulary import CHECK_FAILED, CONDITION_NODES_LAUNCHED
from hyperplan.planning import naming
from hyperplan.planning.nodefacts import NodeFacts, facts_of_v1

# ----------------------------------------------------------------------------- the snapshot

PAST, ACTIVE, NEXT = "past", "active", "next"

# Node states, in the order a node is classified (the first that applies wins).
UNHEALTHY, DRAINING, PROVISIONING, SPARE, SERVING = "unhealthy", "draining", "provisioning", "spare", "active"
REBOOTING = "rebooting"  # effective health UnschedulablePendingReboot (NodeFacts.rebooting): the ladder's reboot
CHECKING = "checking"  # Ready, its deep health checks under way (deep-health-check-status InProgress)
NODE_STATES = (SERVING, SPARE, PROVISIONING, CHECKING, DRAINING, REBOOTING, UNHEALTHY)


@dataclass
class Block:
    id: str
    availability_zone: str
    instance_count: int
    start_time: datetime
    end_time: datetime
    termination_time: datetime | None
    status: str

    def when(self, now: datetime) -> str:
        """``past``, ``active`` or ``next``, from the block's times and ``now``."""
        if self.end_time <= now:
            return PAST
        if self.start_time <= now:
            return ACTIVE
        return NEXT


@dataclass
class UltraServer:
    id: str
    availability_zone: str
    health_status: str
    total_instance_count: int
    in_use_instance_count: int
    available_instance_count: int
    configured_spare_instance_count: int
    available_spare_instance_count: int
    unhealthy_instance_count: int
    spare_nodes: list[str] = field(default_factory=list)
    replaced_by: str | None = None  # the groups' nodes on it moved there (an UltraServer replaced)


@dataclass
class Plan:
    name: str
    phase: str
    instance_type: str
    availability_zone: str
    total_instance_count: int
    in_use_instance_count: int
    available_instance_count: int
    available_spare_instance_count: int
    unhealthy_instance_count: int
    next_transition_time: datetime | None
    blocks: list[Block] = field(default_factory=list)
    ultra_servers: list[UltraServer] = field(default_factory=list)
    message: str = ""


@dataclass
class Node:
    name: str
    role: str
    state: str
    ultra_server: str | None
    # A reboot under way started then, by the group's record (status.nodes[].recovery): a node
    # labelled UnschedulablePendingReboot without it is asked for a reboot that has not started.
    rebooting_since: datetime | None = None
    # Its deep health checks, by the group's record (status.nodes[].deepHealthCheck): which, and
    # since when (the start they answer: the node made, or back from its reboot).
    checks: tuple[str, ...] = ()
    checking_since: datetime | None = None


@dataclass
class InstanceGroup:
    name: str
    training_plan: str
    phase: str
    availability_zone: str
    desired_count: int
    ready_count: int
    spare_count: int
    unhealthy_count: int
    nodes: list[Node] = field(default_factory=list)
    message: str = ""
    reboot_timeout_seconds: int = HealthCheckSpec().reboot_timeout_seconds

    def rebooting(self) -> list[Node]:
        """The nodes the recovery ladder reboots, or is asked to (state ``rebooting``)."""
        return [n for n in self.nodes if n.state == REBOOTING]

    def checking(self) -> list[Node]:
        """The nodes whose deep health checks run (state ``checking``)."""
        return [n for n in self.nodes if n.state == CHECKING]

    def nodes_by_state(self) -> dict[str, int]:
        """Every state of :data:`NODE_STATES` with its count (zeros included: stable keys)."""
        counts = {s: 0 for s in NODE_STATES}
        for n in self.nodes:
            counts[n.state] += 1
        return counts


@dataclass
class Pool:
    name: str
    instance_type: str
    availability_zone: str
    instance_count: int
    sold_now: int
    unavailable_now: int

    @property
    def free_now(self) -> int:
        return max(0, self.instance_count - self.sold_now - self.unavailable_now)


@dataclass
class Snapshot:
    time: datetime
    pools: list[Pool] = field(default_factory=list)
    plans: list[Plan] = field(default_factory=list)
    groups: list[InstanceGroup] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The ``-o json`` document: camelCase keys, RFC 3339 times, counts always present."""
        now = self.time

        def camel(d: dict[str, Any]) -> dict[str, Any]:
            out = {}
            for k, v in d.items():
                head, *rest = k.split("_")
                key = head + "".join(p.capitalize() for p in rest)
                out[key] = to_rfc3339(v) if isinstance(v, datetime) else v
            return out

        plans = []
        for p in self.plans:
            d = camel({k: v for k, v in asdict(p).items() if k not in ("blocks", "ultra_servers")})
            d["blocks"] = [{**camel(asdict(b)), "when": b.when(now)} for b in p.blocks]
            d["ultraServers"] = [{k: v for k, v in camel(asdict(u)).items() if k != "replacedBy" or v}
                                 for u in p.ultra_servers]
            plans.append(d)
        groups = []
        for g in self.groups:
            d = camel({k: v for k, v in asdict(g).items() if k != "nodes"})
            d["nodesByState"] = g.nodes_by_state()
            d["nodes"] = [camel(asdict(n)) for n in g.nodes]
            groups.append(d)
        pools = [{**camel(asdict(p)), "freeNow": p.free_now} for p in self.pools]
        return {"time": to_rfc3339(now), "pools": pools, "plans": plans, "groups": groups}


# ----------------------------------------------------------------------------- from the API


def _time(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return from_rfc3339(str(value))


def _parse(model: type, raw: Any) -> Any:
    """``model`` from ``raw``, or the model's defaults when the object does not parse.

    The view must show a half-written or foreign object rather than crash on it.
    """
    try:
        return model.model_validate(raw or {})
    except ValueError:
        return model()


def _message(conditions: Iterable[Any]) -> str:
    """The message of the first condition that says something is wrong, else ''; a karpenter
    group's ``NodesLaunched=False`` (why its nodes do not come, with Karpenter's reason) before
    the rest, which it explains."""
    conditions = list(conditions)
    for c in conditions:
        if c.type == CONDITION_NODES_LAUNCHED and c.status == "False" and c.message:
            return f"{c.type}=False ({c.reason}): {c.message}"
    for c in conditions:
        bad = (c.type in ("Failed", "Degraded") and c.status == "True") or \
              (c.type in ("RemediationAllowed", "Ready", "Purchased") and c.status == "False")
        if bad and c.message:
            return f"{c.type}={c.status}: {c.message}"
    return ""


def node_state(facts: NodeFacts) -> str:
    """One node's state in its group's view (see :data:`NODE_STATES`), from its facts only: its
    health is their effective health (the worse of both keys), ``active`` exactly when the node
    serves (``NodeFacts.is_serving``), so that the view agrees with what Kueue admits onto."""
    if facts.rebooting:
        return REBOOTING
    if facts.is_unhealthy or facts.ready in ("False", "Unknown") or facts.deep_check == CHECK_FAILED:
        return UNHEALTHY
    if facts.cordoned or facts.deleting:
        return DRAINING
    if facts.ready is None:
        return PROVISIONING
    if facts.in_checks:
        return CHECKING
    if facts.is_spare:
        return SPARE
    return SERVING


def node_from_api(node: Any, ultraserver_label: str) -> tuple[str, Node]:
    """(the node's group label value, the node) from a ``V1Node``."""
    facts = facts_of_v1(node, naming.TopologyKeys(ultraserver_id=ultraserver_label))
    return facts.group or "", Node(
        name=facts.name, role=facts.labels.get(naming.LABEL_ROLE, ""), state=node_state(facts),
        ultra_server=facts.ultraserver_id)


def sold_now(status: CapacityPoolStatus, spec: CapacityPoolSpec, now: datetime) -> tuple[int, int]:
    """(instances of the pool's reservations running at ``now``, instances sold to others then)."""
    sold = sum(r.instance_count for r in status.reservations if r.start_time <= now < r.end_time)
    others = sum(w.instance_count for w in spec.unavailable if w.start <= now < w.end)
    return sold, others


def snapshot_from_objects(pools: list[dict], plans: list[dict], groups: list[dict],
                          nodes: list[tuple[str, Node]], now: datetime) -> Snapshot:
    """A snapshot from API object bodies (dicts) and the groups' nodes, at ``now``."""
    snap = Snapshot(time=now)
    for obj in sorted(pools, key=lambda o: o["metadata"]["name"]):
        spec = obj.get("spec") or {}
        pspec = _parse(CapacityPoolSpec, spec) if spec else None
        pstatus = _parse(CapacityPoolStatus, obj.get("status"))
        sold, others = sold_now(pstatus, pspec, now) if pspec else (0, 0)
        snap.pools.append(Pool(obj["metadata"]["name"], spec.get("instanceType", ""),
                               spec.get("availabilityZone", ""), int(spec.get("instanceCount") or 0),
                               sold, others))
    spares_by_us: dict[str, list[str]] = {}
    for _, n in nodes:
        if n.ultra_server and n.state == SPARE:
            spares_by_us.setdefault(n.ultra_server, []).append(n.name)
    for obj in sorted(plans, key=lambda o: o["metadata"]["name"]):
        spec = obj.get("spec") or {}
        st: TrainingPlanStatus = _parse(TrainingPlanStatus, obj.get("status"))
        blocks = [Block(b.id, b.availability_zone, b.instance_count, _time(b.start_time), _time(b.end_time),
                        _time(b.termination_time), b.status)
                  for b in sorted(st.reserved_capacity, key=lambda b: b.start_time)]
        uss = [UltraServer(u.id, u.availability_zone, u.health_status, u.total_instance_count,
                           u.in_use_instance_count, u.available_instance_count,
                           u.configured_spare_instance_count, u.available_spare_instance_count,
                           u.unhealthy_instance_count, sorted(spares_by_us.get(u.id, [])), u.replaced_by)
               for u in st.ultra_servers]
        itype = (spec.get("instanceType") or (st.reserved_capacity[0].instance_type if st.reserved_capacity
                                              else "") or spec.get("ultraServerType", ""))
        snap.plans.append(Plan(
            name=obj["metadata"]["name"], phase=st.phase or "", instance_type=itype,
            availability_zone=st.availability_zone or "", total_instance_count=st.total_instance_count,
            in_use_instance_count=st.in_use_instance_count,
            available_instance_count=st.available_instance_count,
            available_spare_instance_count=st.available_spare_instance_count,
            unhealthy_instance_count=st.unhealthy_instance_count,
            next_transition_time=_time(st.next_transition_time), blocks=blocks, ultra_servers=uss,
            message=_message(st.conditions)))
    by_group: dict[str, list[Node]] = {}
    for group_value, n in nodes:
        by_group.setdefault(group_value, []).append(n)
    for obj in sorted(groups, key=lambda o: o["metadata"]["name"]):
        name = obj["metadata"]["name"]
        spec = obj.get("spec") or {}
        st: InstanceGroupStatus = _parse(InstanceGroupStatus, obj.get("status"))
        record = {e.name: e for e in st.nodes or ()}

        def with_record(n: Node) -> Node:
            entry = record.get(n.name)
            if entry is None:
                return n
            recovery, check = entry.recovery, entry.deep_health_check
            return replace(n, rebooting_since=_time(recovery.rebooting_since) if recovery else None,
                           checks=tuple(check.checks) if check else (),
                           checking_since=_time(check.since) if check else None)
        members = [with_record(n) for n in by_group.get(naming.label_value(name), [])]
        snap.groups.append(InstanceGroup(
            name=name, training_plan=spec.get("trainingPlanRef", ""), phase=st.phase or "",
            availability_zone=st.availability_zone or "", desired_count=st.desired_count,
            ready_count=st.ready_count, spare_count=st.spare_count, unhealthy_count=st.unhealthy_count,
            nodes=sorted(members, key=lambda n: n.name), message=_message(st.conditions),
            reboot_timeout_seconds=_parse(HealthCheckSpec, spec.get("healthCheck")).reboot_timeout_seconds))
    return snap


def gather(kube: Any, now: datetime | None = None, ultraserver_label: str | None = None) -> Snapshot:
    """Read pools, plans, groups and the groups' nodes from the API (``kube``: actuation.kube.Kube).

    The snapshot's time is ``now``, else the moment the reads finished.
    """
    if ultraserver_label is None:
        from hyperplan.settings import Settings
        ultraserver_label = Settings().ultraserver_id_label
    pools = kube.list_objects("capacitypools")
    plans = kube.list_objects("trainingplans")
    groups = kube.list_objects("instancegroups")
    nodes = [node_from_api(n, ultraserver_label) for n in kube.list_nodes(naming.LABEL_GROUP)]
    return snapshot_from_objects(pools, plans, groups, nodes, now or utcnow())


# ----------------------------------------------------------------------------- rendering

MARK = {ACTIVE: "█", NEXT: "░", PAST: "▒"}
MARK_STYLE = {ACTIVE: "bold green", NEXT: "cyan", PAST: "grey50"}
NOW_MARK, EMPTY_MARK = "│", "·"
PHASE_STYLE = {"Active": "bold green", "Ready": "bold green", "Scheduled": "cyan", "Waiting": "cyan",
               "Pending": "yellow", "Provisioning": "yellow", "Draining": "magenta",
               "Expired": "grey50", "Failed": "bold red"}
HEALTH_STYLE = {naming.STATUS_OK: "bold green", naming.STATUS_IMPAIRED: "bold red",
                naming.STATUS_INSUFFICIENT_DATA: "yellow"}
STATE_STYLE = {SERVING: "green", SPARE: "cyan", PROVISIONING: "yellow", CHECKING: "blue", DRAINING: "magenta",
               REBOOTING: "bold yellow", UNHEALTHY: "bold red"}


@dataclass(frozen=True)
class Axis:
    """A time window drawn over ``width`` character cells."""

    start: datetime
    end: datetime
    width: int

    @classmethod
    def around(cls, blocks: Iterable[Block], now: datetime, width: int) -> "Axis":
        """From the earliest block start (or ``now``) to the latest block end (or ``now``), padded."""
        times = [now] + [t for b in blocks for t in (b.start_time, b.end_time)]
        start, end = min(times), max(times)
        if end - start < timedelta(minutes=1):
            end = start + timedelta(minutes=1)
        pad = (end - start) / (2 * width)
        return cls(start - pad, end + pad, width)

    def cell(self, moment: datetime) -> int:
        """The cell ``moment`` falls in, clamped to the axis."""
        frac = (moment - self.start) / (self.end - self.start)
        return min(self.width - 1, max(0, math.floor(frac * self.width)))

    def moment(self, cell: int) -> datetime:
        """The middle of ``cell``."""
        return self.start + (self.end - self.start) * ((cell + 0.5) / self.width)

    def label(self, moment: datetime) -> str:
        fmt = "%H:%M:%S" if self.end - self.start <= timedelta(days=1) else "%m-%d %H:%M"
        return moment.astimezone(timezone.utc).strftime(fmt)


def timeline(blocks: list[Block], now: datetime, axis: Axis) -> Text:
    """The blocks as a bar: █ active, ░ next, ▒ past, · no block, │ now.

    A block shorter than a cell still gets the cell of its middle, so no block disappears.
    """
    cells: list[str | None] = [None] * axis.width
    for i in range(axis.width):
        t = axis.moment(i)
        for b in blocks:
            if b.start_time <= t < b.end_time:
                cells[i] = b.when(now)
    for b in blocks:
        first, last = axis.cell(b.start_time), axis.cell(b.end_time - timedelta(microseconds=1))
        if all(cells[i] != b.when(now) for i in range(first, last + 1)):
            cells[axis.cell(b.start_time + (b.end_time - b.start_time) / 2)] = b.when(now)
    now_cell = axis.cell(now)
    text = Text()
    for i, kind in enumerate(cells):
        if i == now_cell:
            text.append(NOW_MARK, style="bold yellow")
        elif kind is None:
            text.append(EMPTY_MARK, style="grey37")
        else:
            text.append(MARK[kind], style=MARK_STYLE[kind])
    return text


def relative(moment: datetime | None, now: datetime) -> str:
    """``in 1m 5s``, ``3h 2m ago``: short, whole seconds."""
    if moment is None:
        return "-"
    seconds = round((moment - now).total_seconds())
    span = abs(seconds)
    days, rem = divmod(span, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    parts = [f"{v}{u}" for v, u in ((days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")) if v][:2]
    text = " ".join(parts) or "0s"
    return f"in {text}" if seconds >= 0 else f"{text} ago"


def _phase(phase: str) -> Text:
    return Text(phase or "-", style=PHASE_STYLE.get(phase, ""))


# Plan columns a narrow console drops, in this order (the time axis needs at least 16 cells).
OPTIONAL_PLAN_COLUMNS = ("type", "spares", "unhealthy")


def plans_table(snap: Snapshot, now: datetime, bar_width: int, dropped: Iterable[str] = ()) -> Table:
    """One row per plan and one per block, with the blocks drawn on one time axis for all plans."""
    dropped = set(dropped)
    axis = Axis.around([b for p in snap.plans for b in p.blocks], now, bar_width)
    table = Table(title="Training plans", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, expand=False,
                  caption=Text.assemble((MARK[ACTIVE], MARK_STYLE[ACTIVE]), " active  ",
                                        (MARK[NEXT], MARK_STYLE[NEXT]), " next  ",
                                        (MARK[PAST], MARK_STYLE[PAST]), " past  ",
                                        (NOW_MARK, "bold yellow"), f" now {axis.label(now)}"),
                  caption_justify="left")
    first, last = axis.label(axis.start), axis.label(axis.end)
    axis_header = (first + " " * (bar_width - len(first) - len(last)) + last if bar_width > len(first) + len(last)
                   else first if bar_width >= len(first) else "")
    blocks: list[Block] = []  # the current plan's, for the block rows' tree corners
    # (header, column options, the plan row's cell, a block row's cell)
    columns: list[tuple[str, dict, Callable[[Plan], Any], Callable[[Block], Any]]] = [
        ("plan / block", {}, lambda p: Text(p.name, style="bold"), lambda b: Text(
            f" {'└' if b is blocks[-1] else '├'} {b.id}", style="grey62")),
        ("phase", {}, lambda p: _phase(p.phase), lambda b: Text(b.when(now), style=MARK_STYLE[b.when(now)])),
        ("type", {}, lambda p: p.instance_type, lambda b: ""),
        ("AZ", {}, lambda p: p.availability_zone or "-", lambda b: b.availability_zone),
        ("in use", {"justify": "right"}, lambda p: f"{p.in_use_instance_count}/{p.total_instance_count}",
         lambda b: str(b.instance_count)),
        ("spares", {"justify": "right", "min_width": 6}, lambda p: str(p.available_spare_instance_count),
         lambda b: ""),
        ("unhealthy", {"justify": "right", "min_width": 9}, lambda p: str(p.unhealthy_instance_count),
         lambda b: ""),
        ("next transition", {"min_width": 17}, lambda p: relative(p.next_transition_time, now),
         lambda b: f"{axis.label(b.start_time)}–{axis.label(b.end_time)}"),
        (axis_header, {"min_width": bar_width}, lambda p: timeline(p.blocks, now, axis),
         lambda b: timeline([b], now, axis)),
    ]
    columns = [c for c in columns if c[0] not in dropped]
    for header, options, _, _ in columns:
        table.add_column(header, no_wrap=True, **options)
    for p in snap.plans:
        blocks = p.blocks
        table.add_row(*[plan_cell(p) for _, _, plan_cell, _ in columns])
        for b in blocks:
            table.add_row(*[block_cell(b) for _, _, _, block_cell in columns],
                          style="dim" if b.when(now) == PAST else "")
    if not snap.plans:
        table.add_row(Text("no training plans", style="grey50"))
    return table


def ultraservers_table(snap: Snapshot) -> Table:
    table = Table(title="UltraServers", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("plan", "left"), ("UltraServer", "left"), ("AZ", "left"), ("health", "left"),
                          ("in use", "right"), ("available", "right"), ("spares free/conf", "right"),
                          ("unhealthy", "right"), ("spare nodes", "left")):
        table.add_column(name, justify=justify, no_wrap=name != "spare nodes", overflow="fold")
    rows = [(p, u) for p in snap.plans for u in p.ultra_servers]
    for p, u in rows:
        table.add_row(p.name, u.id, u.availability_zone,
                      Text(f"replaced by {u.replaced_by}", style="bold red") if u.replaced_by
                      else Text(u.health_status, style=HEALTH_STYLE.get(u.health_status, "")),
                      str(u.in_use_instance_count), str(u.available_instance_count),
                      Text(f"{u.available_spare_instance_count}/{u.configured_spare_instance_count}",
                           style="bold red" if u.configured_spare_instance_count
                           and not u.available_spare_instance_count else ""),
                      str(u.unhealthy_instance_count), ", ".join(u.spare_nodes) or "-")
    if not rows:
        table.add_row(Text("no UltraServers", style="grey50"))
    return table


def node_states(counts: dict[str, int]) -> Text:
    text = Text()
    for state in NODE_STATES:
        if counts.get(state):
            if text:
                text.append("  ")
            text.append(f"{state} {counts[state]}", style=STATE_STYLE[state])
    return text or Text("no nodes", style="grey50")


def groups_table(snap: Snapshot) -> Table:
    table = Table(title="Instance groups", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("group", "left"), ("plan", "left"), ("phase", "left"), ("AZ", "left"),
                          ("desired", "right"), ("ready", "right"), ("nodes by state", "left")):
        table.add_column(name, justify=justify, no_wrap=True)
    for g in snap.groups:
        table.add_row(Text(g.name, style="bold"), g.training_plan, _phase(g.phase), g.availability_zone or "-",
                      str(g.desired_count), str(g.ready_count), node_states(g.nodes_by_state()))
    if not snap.groups:
        table.add_row(Text("no instance groups", style="grey50"))
    return table


def rebooting_table(snap: Snapshot, now: datetime) -> Table | None:
    """One row per node the recovery ladder reboots or is asked to, with the group's record of
    when the reboot started and when it times out (then the node is replaced); None when no node
    is rebooting (the nodes in their deep health checks: :func:`checking_table`)."""
    rows = [(g, n) for g in snap.groups for n in g.rebooting()]
    if not rows:
        return None
    table = Table(title="Rebooting nodes", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("group", "node", "role", "UltraServer", "reboot", "replaced if not back"):
        table.add_column(name, no_wrap=True)
    for g, n in rows:
        if n.rebooting_since is None:
            started, deadline = Text("asked (health label), not started", style="yellow"), "-"
        else:
            started = Text(f"started {relative(n.rebooting_since, now)}", style=STATE_STYLE[REBOOTING])
            deadline = relative(n.rebooting_since + timedelta(seconds=g.reboot_timeout_seconds), now)
        table.add_row(g.name, n.name, n.role or "-", n.ultra_server or "-", started, deadline)
    return table


def checking_table(snap: Snapshot, now: datetime) -> Table | None:
    """One row per node whose deep health checks run, with the checks and since when, by the
    group's record; None when no node is in its checks."""
    rows = [(g, n) for g in snap.groups for n in g.checking()]
    if not rows:
        return None
    table = Table(title="Nodes in deep health checks", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("group", "node", "role", "UltraServer", "checks", "since"):
        table.add_column(name, no_wrap=True)
    for g, n in rows:
        since = Text(relative(n.checking_since, now), style=STATE_STYLE[CHECKING]) if n.checking_since else "-"
        table.add_row(g.name, n.name, n.role or "-", n.ultra_server or "-", ", ".join(n.checks) or "-", since)
    return table


def pools_table(snap: Snapshot) -> Table:
    table = Table(title="Capacity pools", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("pool", "left"), ("type", "left"), ("AZ", "left"), ("instances", "right"),
                          ("sold now", "right"), ("others' now", "right"), ("free now", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    for p in snap.pools:
        table.add_row(p.name, p.instance_type, p.availability_zone, str(p.instance_count), str(p.sold_now),
                      str(p.unavailable_now), Text(str(p.free_now), style="bold red" if not p.free_now else ""))
    if not snap.pools:
        table.add_row(Text("no capacity pools", style="grey50"))
    return table


def problems(snap: Snapshot) -> Text | None:
    """One red line per plan or group whose conditions say something is wrong."""
    lines = [f"{kind} {o.name}: {o.message}" for kind, objs in (("plan", snap.plans), ("group", snap.groups))
             for o in objs if o.message]
    return Text("\n".join(lines), style="red") if lines else None


@dataclass
class View:
    """The whole view of ``snap`` at ``now``: plans with their blocks, UltraServers, groups, pools.

    The time axis takes what the console's width leaves (``bar_width`` fixes it instead).
    """

    snap: Snapshot
    now: datetime
    bar_width: int | None = None

    def __rich_console__(self, console: Any, options: Any) -> Iterable[RenderableType]:
        bar, dropped = self.bar_width, ()
        if bar is None:  # what the other columns leave, measured with a one-cell axis
            for n in range(len(OPTIONAL_PLAN_COLUMNS) + 1):  # a narrow console loses columns first
                dropped = OPTIONAL_PLAN_COLUMNS[:n]
                table = plans_table(self.snap, self.now, 1, dropped)
                room = options.max_width - Measurement.get(console, options, table).maximum
                if room >= 16:
                    break
            bar = min(80, max(16, room))
        snap, now = self.snap, self.now
        yield Text.assemble(("hyperplan status", "bold"), f"  {to_rfc3339(now)}",
                            (f"  (read {relative(snap.time, now)})", "grey50")
                            if abs((now - snap.time).total_seconds()) >= 1 else "")
        yield plans_table(snap, now, bar, dropped)
        if (notes := problems(snap)) is not None:
            yield notes
        yield ultraservers_table(snap)
        yield groups_table(snap)
        for table in (rebooting_table(snap, now), checking_table(snap, now)):
            if table is not None:
                yield table
        yield pools_table(snap)


def render(snap: Snapshot, now: datetime, bar_width: int | None = None) -> RenderableType:
    """The view of ``snap`` at ``now`` (see :class:`View`)."""
    return View(snap, now, bar_width)


# ----------------------------------------------------------------------------- the command


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def watch(read: Callable[[], Snapshot], show: Callable[[Snapshot], None], interval: float,
          stop: Callable[[], bool] = lambda: False,
          on_error: Callable[[Exception], None] | None = None) -> None:
    """Call ``show(read())`` every ``interval`` seconds until ``stop()`` (or Ctrl-C in the caller).

    A failed read goes to ``on_error`` (and the watch goes on) when given, else it ends the watch.
    """
    while not stop():
        started = time.monotonic()
        try:
            snap = read()
        except StatusError as e:
            if on_error is None:
                raise
            on_error(e)
        else:
            show(snap)
        time.sleep(max(0.0, interval - (time.monotonic() - started)))


class StatusError(RuntimeError):
    """What the user must fix before the view can be read (no kubeconfig, API down, CRDs missing)."""


def connect(kubeconfig: str | None) -> Any:
    """A :class:`~hyperplan.actuation.kube.Kube` from ``kubeconfig``, ``$KUBECONFIG`` or in-cluster."""
    from kubernetes.config import ConfigException

    import os

    from hyperplan.actuation.kube import Kube, api_client
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path and not os.path.isfile(path):
        raise StatusError(f"the kubeconfig {path} does not exist")
    try:
        return Kube(api_client(kubeconfig))
    except (ConfigException, OSError) as e:
        raise StatusError(f"cannot load a kubeconfig ({e}); pass --kubeconfig or set KUBECONFIG") from e


def read_snapshot(kube: Any) -> Snapshot:
    """:func:`gather` at the current time, with API failures turned into :class:`StatusError`."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError
    try:
        return gather(kube)
    except ApiException as e:
        if e.status == 404:
            raise StatusError("the hyperplan CRDs are not installed on this cluster "
                              "(kubectl apply -f crds/)") from e
        raise StatusError(f"the API server refused the read: {e.status} {e.reason}") from e
    except (HTTPError, OSError) as e:
        raise StatusError(f"cannot reach the API server: {e}") from e


def run_command(kubeconfig: str | None, output: str, watching: bool, interval: float,
                width: int | None = None) -> int:
    """``hyperplan status``: print the view (or JSON) once, or refresh it until Ctrl-C.

    Raises :class:`StatusError` when the first read fails; later failures of a watch are shown
    and the watch goes on.
    """
    import json
    import sys

    from rich.console import Console
    from rich.live import Live

    kube = connect(kubeconfig)
    snap = read_snapshot(kube)
    if output == "json":
        def show(s: Snapshot) -> None:
            # Watching: one document per line (JSON Lines); once: one indented document.
            print(json.dumps(s.to_dict(), indent=None if watching else 2), flush=True)
        show(snap)
        if watching:
            try:
                watch(lambda: read_snapshot(kube), show, interval,
                      on_error=lambda e: print(f"error: {e}", file=sys.stderr, flush=True))
            except KeyboardInterrupt:
                pass
        return 0
    console = Console(width=width)
    if not watching:
        console.print(render(snap, utcnow()))
        return 0
    last = [snap]
    try:
        with Live(render(snap, utcnow()), console=console, auto_refresh=False) as live:
            def show(s: Snapshot) -> None:
                last[0] = s
                live.update(render(s, utcnow()), refresh=True)

            def on_error(e: Exception) -> None:
                live.update(Group(render(last[0], utcnow()), Text(f"error: {e}", style="bold red")),
                            refresh=True)
            watch(lambda: read_snapshot(kube), show, interval, on_error=on_error)
    except KeyboardInterrupt:
        pass
    return 0
