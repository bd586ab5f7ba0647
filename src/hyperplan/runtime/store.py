"""The operator's read side: what its watches already hold, read by every pass instead of the API.

kopf keeps one watch stream per kind. Each kind a pass reads (plans, pools, groups) is also
registered as a kopf *index* (in hyperplan.wiring.events), fed by that same stream; the nodes come from the operator's
own node watch (runtime.nodewatch, which kopf's per-event cost made necessary at fleet size).
So a pass reads its object, the pools and its nodes from memory: no GET or LIST per pass. API
reads stay where optimistic concurrency needs them (the ledger re-reads a pool after a 409).

Why kopf indexes and not a dict filled by ``@kopf.on.event``: kopf fills every index from the
initial listing of *every* indexed kind before it runs any other handler. A pass therefore never
sees a half-listed world; a bought plan that saw no pools yet would think itself unbought.

What is kept is a slim copy: the fields passes read, without ``managedFields`` and kopf's
last-handled-configuration annotation (which repeat the object), so memory grows with the
fleet, not with the size of the API server's bookkeeping. Plans, the many objects, are kept as
deflated compact JSON (:class:`PackedObject`) and parsed again on each read: a bought plan
(three offerings, its blocks, conditions) is about 9 KiB as Python dicts and 0.8 KiB packed,
and a plan is read only by its own passes and its group's (tens of microseconds each).

Write-through: the operator's own writes (a pool's ledger, a plan's status) are remembered with
the resourceVersion the API server returned, and a read prefers whichever copy is newer, so the
next pass does not act on its own stale write while the watch event is on its way. The
resourceVersion comparison is only a freshness hint (both are etcd revisions); correctness does
not depend on it: a stale pool makes the ledger's write fail with 409, and it re-reads.

Other modules add their kinds to the same store (:meth:`WatchCache.add_kind`: the Kueue
controller's Workloads and AdmissionChecks), read them with :meth:`WatchCache.get` and
:meth:`WatchCache.objects`, and use the same write-through (:meth:`WatchCache.wrote`,
:meth:`WatchCache.watched`, :meth:`WatchCache.forget`) and the same "list the nodes again after
our own write" (:meth:`WatchCache.must_list_nodes`).

The named read operations are on :class:`WatchCache` (``rt.cache``); its parsed views of the
pools are memoised per resourceVersion, and each ledger line is parsed once and shared by every
version of its pool that holds it (:meth:`WatchCache.share_ledger`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, TypeVar

from kubernetes import client

from hyperplan.api.models import CapacityPool, Reservation
from hyperplan.api.vocabulary import ANNOTATION_LAST_HANDLED, OWN_PREFIX, from_rfc3339
from hyperplan.planning.blocks import Block, with_additions
from hyperplan.planning.offerings import Busy, PoolSnapshot
from hyperplan.planning.tenancy import selector_of

PLANS, POOLS, GROUPS, NODES = "hp_plans", "hp_pools", "hp_groups", "nodes"  # NODES: the node store
# Kueue's Workloads (when Kueue is on): kopf's index of them (wiring.kueue) and their kind here.
WORKLOADS_INDEX, WORKLOADS = "hp_kueue_workloads", "workloads"
KEEP_ANNOTATION_PREFIXES = (OWN_PREFIX,)
# How long a worker thread waits for the event loop to take its copy of an index (the loop is
# busy for at most a pass's slice, tens to hundreds of milliseconds); past it the read fails, and
# so does the pass that made it, which the work queue retries.
LOOP_READ_SECONDS = 30.0
T = TypeVar("T")
DROP_ANNOTATIONS = (ANNOTATION_LAST_HANDLED,)


def _metadata(meta: Mapping[str, Any], *, with_annotations: bool) -> dict[str, Any]:
    out = {k: meta[k] for k in ("name", "uid", "generation", "resourceVersion", "creationTimestamp",
                                "deletionTimestamp") if meta.get(k) is not None}
    if meta.get("labels"):
        out["labels"] = dict(meta["labels"])
    if with_annotations and meta.get("annotations"):
        kept = {k: v for k, v in meta["annotations"].items()
                if k.startswith(KEEP_ANNOTATION_PREFIXES) and k not in DROP_ANNOTATIONS}
        if kept:
            out["annotations"] = kept
    if meta.get("finalizers"):
        out["finalizers"] = list(meta["finalizers"])
    return out


def slim_object(body: Mapping[str, Any]) -> dict[str, Any]:
    """A hyperplan object as passes read it: kind, the metadata they use, spec and status.

    ``spec`` and ``status`` are the event's own parsed JSON, shared, not copied (kopf's body view
    hands out the raw nested dicts; each watch event is parsed afresh and nobody mutates them:
    the ledger builds a new status for its writes). Copying them would cost a pool's whole ledger
    on every pool event."""
    return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
            "metadata": _metadata(body.get("metadata") or {}, with_annotations=True),
            "spec": _raw(body.get("spec")), "status": _raw(body.get("status"))}


def slim_node(body: Mapping[str, Any]) -> dict[str, Any]:
    """A node as passes read it: metadata, taints, unschedulable and the conditions' verdicts
    (not their heartbeats or messages, which change every few seconds and are never read)."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    return {"metadata": _metadata(body.get("metadata") or {}, with_annotations=True),
            "spec": {"taints": [dict(t) for t in spec.get("taints") or []],
                     "unschedulable": bool(spec.get("unschedulable")),
                     # how a karpenter group ties a Node to its NodeClaim (planning.ownership.bind_claims)
                     **({"providerID": spec["providerID"]} if spec.get("providerID") else {})},
            "status": {"conditions": [{"type": c.get("type"), "status": c.get("status"),
                                       "lastTransitionTime": c.get("lastTransitionTime")}
                                      for c in status.get("conditions") or []]}}


@dataclass(frozen=True, slots=True)
class PackedObject:
    """A slim object as compact JSON, deflated, parsed again on every read (see the module
    docstring). A bought plan: 2.3 KiB of JSON, 0.8 KiB deflated; a read costs ~45 us."""

    data: bytes

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> "PackedObject":
        return cls(zlib.compress(json.dumps(obj, separators=(",", ":"), default=_plain).encode(), 1))

    def unpack(self) -> dict[str, Any]:
        return json.loads(zlib.decompress(self.data))


def _plain(value: Any) -> Any:
    """A kopf view (or another mapping or sequence) nested in a body, as plain JSON."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (list, tuple)) or hasattr(value, "__iter__"):
        return list(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def _raw(value: Any) -> dict[str, Any]:
    """The plain dict under a kopf view (or the dict itself); a copy only for an odd mapping."""
    if isinstance(value, dict):
        return value
    return dict(value) if isinstance(value, Mapping) else {}


def _rv(obj: Mapping[str, Any] | None) -> int:
    try:
        return int((obj or {}).get("metadata", {}).get("resourceVersion") or -1)
    except (TypeError, ValueError):
        return -1


@dataclass
class _ParsedPool:
    resource_version: str
    snapshot: PoolSnapshot
    by_plan_uid: dict[str, list[Block]]
    line_keys: frozenset[tuple]


@dataclass(frozen=True, slots=True)
class _Line:
    """One line of a pool's ledger, parsed once and shared by every version of the pool that
    holds it: its key in :attr:`WatchCache._lines`, its dict as the watch delivered it first,
    what it takes from the pool (``busy``) and, when a plan bought it, the plan's block."""

    key: tuple
    raw: dict[str, Any]
    busy: Busy
    plan_uid: str
    block: Block | None


@dataclass
class WatchCache:
    """Named reads of what the operator watches (see the module docstring)."""

    _indexes: Mapping[str, Any] | None = None
    _written: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    _parsed_pools: dict[str, _ParsedPool] = field(default_factory=dict)
    _pool_models: dict[str, tuple[str, CapacityPool | None]] = field(default_factory=dict)  # by name: (rv, model)
    _lines: dict[tuple, _Line] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # The owners of nodes, ("group" or "job", label value), whose last pass wrote to their nodes:
    # their next pass lists the nodes from the API once, so that it never acts on a view older
    # than its own writes (the watch events of those writes may still be on their way). Touched on
    # the event loop only.
    _nodes_wrote: set[tuple[str, str]] = field(default_factory=set)
    # The kinds added by :meth:`add_kind`: their indexes, and how an object we wrote is slimmed.
    _kinds: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    _slims: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = field(default_factory=dict)
    # The loop kopf runs on (set by :meth:`bind`): kopf's indexes are read there (:meth:`_on_loop`).
    _loop: asyncio.AbstractEventLoop | None = None
    _loop_thread: int | None = None
    # Moves with every plan the watch delivers (wiring.events.plan_event) or the operator
    # writes: a reader that derived something from every plan (the SageMaker API's listing, whose
    # every page walks them) may keep it while this stays the same.
    plans_version: int = 0

    def bind(self, indices: Mapping[str, Any]) -> None:
        """Read from kopf's indexes (and the node store) from now on. Called on the event loop (in
        kopf's startup handler): that loop is the one every copy of an index is taken on."""
        self._indexes = {name: indices[name] for name in (PLANS, POOLS, GROUPS, NODES)}
        try:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
        except RuntimeError:  # bound outside a loop (unit tests): nothing else changes the indexes
            self._loop, self._loop_thread = None, None

    def add_kind(self, kind: str, index_name: str, index: Mapping[str, Any],
                 slim: Callable[[Mapping[str, Any]], dict[str, Any]]) -> None:
        """Keep another kind in the same store: ``index`` is the kopf index of its objects
        (bound by the startup handler of the module that watches it, as Kueue's Workloads and
        AdmissionChecks are), ``slim`` what :meth:`wrote` keeps of an object we wrote."""
        self._kinds[index_name] = index
        self._slims[kind] = slim

    @property
    def bound(self) -> bool:
        return self._indexes is not None

    # ------------------------------------------------------------------ raw objects

    def has_index(self, index: str) -> bool:
        """Whether ``index`` is held (a kind added, or a kopf index registered: Kueue's are not
        when it is turned off)."""
        return index in self._kinds or (self._indexes is not None and index in self._indexes)

    def _index(self, index: str) -> Mapping[str, Any]:
        if index in self._kinds:
            return self._kinds[index]
        if self._indexes is None:
            raise RuntimeError("the watch cache is read before kopf started (no indexes bound)")
        return self._indexes[index]

    def _on_loop(self, take: Callable[[], T]) -> T:
        """``take()``, run where kopf's indexes are safe to read: on the event loop.

        kopf changes its indexes on the loop only, and a dict that changes while another thread
        iterates it raises (or, between two reads, shows half an update). A pass on the loop reads
        them directly; a worker thread (the ledger's purchases re-read the pools) hands ``take``
        to the loop and waits for the copy it makes: lists of the objects, which the thread may
        then read at leisure, since nobody mutates a watched object. With no loop bound or running
        (unit tests, after shutdown) nothing else changes the indexes, so the read is direct."""
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread or not loop.is_running():
            return take()
        copied: concurrent.futures.Future = concurrent.futures.Future()

        def on_loop() -> None:
            try:
                copied.set_result(take())
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                copied.set_exception(e)

        loop.call_soon_threadsafe(on_loop)
        return copied.result(timeout=LOOP_READ_SECONDS)

    def _copy(self, index: str, key: Any) -> list[dict[str, Any]]:
        store = self._index(index).get(key)
        return list(store) if store is not None else []

    def _values(self, index: str, key: Any) -> list[dict[str, Any]]:
        """The objects ``index`` holds under ``key`` (a copy of the list). The node store locks
        for itself (its watch runs on a thread of its own); kopf's indexes are read on the loop."""
        if index == NODES:
            return self._copy(index, key)
        return self._on_loop(lambda: self._copy(index, key))

    def _each(self, index: str) -> list[Any]:
        """The first object under every key of a kopf index (the object of each name), in one
        visit of the loop, sorted by key."""
        def take() -> list[Any]:
            found = self._index(index)
            return [next(iter(found.get(k) or ()), None) for k in sorted(found.keys())]
        return [o for o in self._on_loop(take) if o is not None]

    def _fresh(self, kind: str, name: str, watched: dict[str, Any] | None) -> dict[str, Any] | None:
        with self._lock:
            written = self._written.get((kind, name))
            if written is None:
                return watched
            if watched is None or _rv(watched) >= _rv(written):
                # gone (deleted) or the watch caught up with our write: the watch is the truth now
                del self._written[(kind, name)]
                return watched
            return written

    def get(self, index: str, kind: str, name: str) -> dict[str, Any] | None:
        """The object of ``kind`` that ``index`` holds under ``name`` (None when there is none):
        the watched copy, or our write of it while that is newer."""
        found = self._values(index, name)
        watched = found[0] if found else None
        if isinstance(watched, PackedObject):
            watched = watched.unpack()
        return self._fresh(kind, name, watched)

    def objects(self, index: str, kind: str, key: Any) -> list[dict[str, Any]]:
        """The objects of ``kind`` that ``index`` holds under ``key`` (an index may hold many
        under one key, and one object under many), each the watched copy or our newer write."""
        return [self._fresh(kind, object_key(o), o) for o in self._values(index, key)]  # type: ignore[misc]

    def wrote(self, kind: str, obj: Mapping[str, Any]) -> None:
        """Remember an object as the API server returned it after our write (write-through)."""
        slim = self._slims.get(kind, slim_object)(obj)
        if kind == "capacitypools":
            slim = self.share_ledger(slim)
        key = (kind, object_key(slim))
        with self._lock:
            before = self._written.get(key)
            if before is None or _rv(slim) > _rv(before):
                self._written[key] = slim
            if kind == "trainingplans":
                self.plans_version += 1

    def watched(self, kind: str, name: str, resource_version: Any) -> None:
        """The watch delivered ``name`` at ``resource_version``: our write-through copy of it is
        no newer, so drop it now rather than on the next read: a Scheduled plan may not be read
        again until its block starts, and its copy is a whole slim plan (about 9 KiB)."""
        key = (kind, name)
        with self._lock:
            written = self._written.get(key)
            if written is not None and _rv({"metadata": {"resourceVersion": resource_version}}) >= _rv(written):
                del self._written[key]

    def plan(self, name: str) -> dict[str, Any] | None:
        """The TrainingPlan ``name`` (slim; None when it does not exist)."""
        return self.get(PLANS, "trainingplans", name)

    def plan_entries(self) -> list[tuple[str, Any]]:
        """Every TrainingPlan as the index holds it (a :class:`PackedObject`, unpacked by the
        caller when it needs to), or our write-through copy while that is newer (a dict), sorted
        by name. For readers that keep what they derive from a plan per version of it (the
        SageMaker API's listings of thousands of plans), so they unpack only what changed."""
        def take() -> list[tuple[str, Any]]:
            found = self._index(PLANS)
            return [(k, next(iter(found.get(k) or ()), None)) for k in sorted(found.keys())]
        with self._lock:
            written = {name for kind, name in self._written if kind == "trainingplans"}
        out = []
        for name, entry in self._on_loop(take):
            if entry is None:
                continue
            if name in written:
                entry = self._fresh("trainingplans", name, entry.unpack() if isinstance(entry, PackedObject) else entry)
                if entry is None:
                    continue
            out.append((name, entry))
        return out

    def group(self, name: str) -> dict[str, Any] | None:
        return self.get(GROUPS, "instancegroups", name)

    def groups(self) -> list[dict[str, Any]]:
        """Every InstanceGroup (slim), sorted by name."""
        return self._every(GROUPS, "instancegroups")

    def pool_objects(self) -> list[dict[str, Any]]:
        """Every CapacityPool (slim), sorted by name."""
        return self._every(POOLS, "capacitypools")

    def _every(self, index: str, kind: str) -> list[dict[str, Any]]:
        watched = (o.unpack() if isinstance(o, PackedObject) else o for o in self._each(index))
        found = (self._fresh(kind, object_key(o), o) for o in watched)
        return [o for o in found if o is not None]

    # ------------------------------------------------------------------ nodes

    def group_nodes(self, group_label: str) -> list[dict[str, Any]]:
        """The nodes labelled ``hyperplan.dev/instance-group=<group_label>`` (slim)."""
        return sorted(self._values(NODES, ("group", group_label)), key=lambda n: n["metadata"]["name"])

    def group_nodes_v1(self, group_label: str) -> list[client.V1Node]:
        """The group's nodes as the Kubernetes client's models (what node providers return)."""
        return [v1_node(n) for n in self.group_nodes(group_label)]

    def job_nodes(self, plan_label: str) -> list[dict[str, Any]]:
        """The job nodes of a ``training-job`` plan, by its label value (slim)."""
        return sorted(self._values(NODES, ("job", plan_label)), key=lambda n: n["metadata"]["name"])

    def note_nodes_wrote(self, owner: str, label: str, wrote: bool) -> None:
        """Whether the pass of a node owner (``"group"`` or ``"job"``, and its label value)
        wrote to its nodes (see :meth:`must_list_nodes`)."""
        if wrote:
            self._nodes_wrote.add((owner, label))
        else:
            self._nodes_wrote.discard((owner, label))

    def must_list_nodes(self, owner: str, label: str) -> bool:
        """True when the owner's last pass wrote to its nodes: list them from the API this once."""
        return (owner, label) in self._nodes_wrote or self._indexes is None

    def note_group_wrote(self, group_label: str, wrote: bool) -> None:
        self.note_nodes_wrote("group", group_label, wrote)

    def must_list_group_nodes(self, group_label: str) -> bool:
        return self.must_list_nodes("group", group_label)

    def block_nodes(self, reserved_capacity_label: str) -> list[dict[str, Any]]:
        """The group nodes of one reserved-capacity block, by its label value (slim)."""
        return sorted(self._values(NODES, ("block", reserved_capacity_label)), key=lambda n: n["metadata"]["name"])

    # ------------------------------------------------------------------ the ledger, parsed

    def share_ledger(self, pool: dict[str, Any]) -> dict[str, Any]:
        """``pool`` with each ledger line replaced by the equal line already held, if any.

        Every watch event and every ledger write brings a pool's whole ledger, parsed afresh: at
        1,000 lines a pool, ten pools and hundreds of writes a minute, a fleet's purchases made
        dicts (and their parsed Busy and Block) that each lived for exactly one pool version,
        interleaved on the heap with the plans' long-lived objects. Shared, a line's dict is
        allocated once, and a new version's copies die with the event that brought them
        (docs/benchmarks.md 5.9)."""
        status = pool.get("status") or {}
        lines = status.get("reservations")
        if not lines:
            return pool
        where = _pool_key(pool)
        return {**pool, "status": {**status, "reservations": [self._shared(where, r) for r in lines]}}

    def _shared(self, where: tuple, raw: Any) -> Any:
        """The held dict equal to the ledger line ``raw``; ``raw`` itself when it does not parse
        (a pass that reads the pool then reports it: an index handler must not fail on it)."""
        try:
            return self._line(where, raw).raw
        except (ValueError, TypeError, AttributeError):
            return raw

    def _line(self, where: tuple, raw: Mapping[str, Any]) -> _Line:
        """The ledger line ``raw`` of the pool ``where`` (:func:`_pool_key`), parsed once: a
        reservation never changes after it is written (one that did is parsed again)."""
        key = (*where, raw.get("reservedCapacityId"))
        with self._lock:
            found = self._lines.get(key)
        if found is not None and (found.raw is raw or found.raw == raw):
            return found
        r = Reservation.model_validate(raw)
        pool, zone, itype, ultra = where
        line = _Line(key, raw if isinstance(raw, dict) else dict(raw), Busy(r.start_time, r.end_time, r.instance_count),
                     r.training_plan_uid or "",
                     Block.from_reservation(r, pool, zone, itype, ultra) if r.training_plan_uid else None)
        with self._lock:
            self._lines[key] = line
        return line

    def _parsed(self, obj: dict[str, Any]) -> _ParsedPool:
        name, rv = obj["metadata"]["name"], obj["metadata"].get("resourceVersion", "")
        with self._lock:
            cached = self._parsed_pools.get(name)
        if cached is not None and cached.resource_version == rv and rv:
            return cached
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        where = _pool_key(obj)
        lines = [self._line(where, r) for r in status.get("reservations") or []]
        busy = [Busy(_time(w["start"]), _time(w["end"]), int(w["instanceCount"]))
                for w in spec.get("unavailable") or []]
        busy += [line.busy for line in lines]
        by_uid: dict[str, list[Block]] = {}
        for line in lines:
            if line.block is not None:
                by_uid.setdefault(line.plan_uid, []).append(line.block)
        parsed = _ParsedPool(rv, PoolSnapshot(
            name=name, instance_type=spec.get("instanceType", ""),
            availability_zone=spec.get("availabilityZone", ""), instance_count=int(spec.get("instanceCount", 0)),
            ultra_server_type=spec.get("ultraServerType"), busy=tuple(busy),
            plan_selector=selector_of(spec.get("trainingPlanSelector"))), by_uid,
            frozenset(line.key for line in lines))
        with self._lock:
            self._parsed_pools[name] = parsed
            held = sum(len(p.line_keys) for p in self._parsed_pools.values())
            if len(self._lines) > 2 * held + 1000:  # prune lines that left every ledger
                live = frozenset().union(*(p.line_keys for p in self._parsed_pools.values()))
                self._lines = {k: v for k, v in self._lines.items() if k in live}
        return parsed

    def pool_model(self, obj: dict[str, Any]) -> CapacityPool | None:
        """The pool as the API's model (None: it does not parse), parsed once per resourceVersion
        and shared by the passes that read it: every pass of a plan bought from a remote source
        reads every remote pool it may buy from, each with the ledger lines of every plan bought
        there, and parsing them afresh each pass took a fifth of the operator's time in
        bench/remote_purchases.py (docs/benchmarks.md). Read only: a caller never changes it."""
        name, rv = obj["metadata"]["name"], obj["metadata"].get("resourceVersion", "")
        with self._lock:
            cached = self._pool_models.get(name)
        if cached is not None and cached[0] == rv and rv:
            return cached[1]
        model = CapacityPool.parsed_or_none(obj)
        with self._lock:
            self._pool_models[name] = (rv, model)
        return model

    def pool_snapshots(self, pools: Iterable[dict[str, Any]] | None = None) -> list[PoolSnapshot]:
        """What planning sees of every pool: its size minus `unavailable` windows and reservations."""
        return [self._parsed(p).snapshot for p in (self.pool_objects() if pools is None else pools)]

    def blocks_of(self, plan_uid: str, pools: Iterable[dict[str, Any]] | None = None) -> list[Block]:
        """The blocks the plan with ``plan_uid`` holds in every pool's ledger, ordered by start."""
        found = [b for p in (self.pool_objects() if pools is None else pools)
                 for b in self._parsed(p).by_plan_uid.get(plan_uid, ())]
        return with_additions(sorted(found, key=lambda b: (b.start, b.id)))

    def forget(self, kind: str, name: str) -> None:
        """Drop what the operator remembers of a deleted object (its write-through copy, and a
        pool's parsed ledger), so that churn leaves nothing behind."""
        with self._lock:
            self._written.pop((kind, name), None)
            if kind == "capacitypools":
                self._parsed_pools.pop(name, None)
                self._pool_models.pop(name, None)
                self._lines = {k: v for k, v in self._lines.items() if k[0] != name}


def object_key(obj: Mapping[str, Any]) -> str:
    """How the store names an object: ``namespace/name`` for a namespaced one, else its name."""
    meta = obj.get("metadata") or {}
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta.get("name", "")


def v1_node(node: Mapping[str, Any]) -> client.V1Node:
    """A slim node (:func:`slim_node`) as the Kubernetes client's model, with the fields that
    observing, marking, promoting and draining a node read."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    return client.V1Node(
        metadata=client.V1ObjectMeta(
            name=meta.get("name"), uid=meta.get("uid"), resource_version=meta.get("resourceVersion"),
            labels=dict(meta.get("labels") or {}), annotations=dict(meta.get("annotations") or {}),
            creation_timestamp=_time(meta.get("creationTimestamp")),
            deletion_timestamp=_time(meta.get("deletionTimestamp"))),
        spec=client.V1NodeSpec(
            taints=[client.V1Taint(key=t.get("key"), value=t.get("value"), effect=t.get("effect"))
                    for t in spec.get("taints") or []] or None,
            unschedulable=bool(spec.get("unschedulable")) or None, provider_id=spec.get("providerID")),
        status=client.V1NodeStatus(conditions=[
            client.V1NodeCondition(type=c.get("type"), status=c.get("status"),
                                   last_transition_time=_time(c.get("lastTransitionTime")))
            for c in status.get("conditions") or []] or None))


def _pool_key(pool: Mapping[str, Any]) -> tuple[str, str, str, str | None]:
    """What a ledger line's block takes from its pool: the pool's name, AZ and types."""
    spec = pool.get("spec") or {}
    return (pool["metadata"]["name"], spec.get("availabilityZone", ""), spec.get("instanceType", ""),
            spec.get("ultraServerType"))


def _time(text: Any):

    return text if not isinstance(text, str) else from_rfc3339(text)
