"""The operator's own watch of Nodes: a store of the nodes it tracks, fed by one watch stream,
that hands on only the events that change what the operator reads.

Why not kopf, which watches the other kinds: a fleet's nodes send a status heartbeat every few
minutes each (a kubelet's ``nodeStatusReportFrequency``; KWOK every 20 to 45 s), and kopf
spends 3 to 5 ms of CPU on every event before any handler can say "nothing changed" (it
builds the object's diff base by deep copy, the causes, the handler kwargs and a task per
handler). With 256 KWOK nodes that was 4 to 6 % of a core for an operator with nothing to do
(docs/benchmarks.md 5.7); 5,000 nodes would have cost a third of one. Here a heartbeat costs
its JSON parse and a digest comparison, on this watch's own thread.

The guarantee the kopf indexes gave is kept: the first listing is made in a kopf startup
handler (:func:`hyperplan.wiring.nodes.start_node_watch`), which kopf finishes before it runs
any other handler or daemon, so a group's first pass never sees a half-listed world. After that
the stream runs on a thread; when the API server ends it (its timeout, or 410 Gone: the
resourceVersion compacted away), it resumes from the last resourceVersion it saw (bookmarks
keep that fresh) or lists again, and a new listing is compared with the store, so that nodes
that went meanwhile are reported deleted, like an informer's relist.

What is tracked: nodes with a group label (a group's nodes, by group and by reserved-capacity
block), job nodes (by plan), and nodes of the free static pool. The store keeps their slim copy
(``runtime.store.slim_node``) and the digest of what the operator reads
(:func:`node_digest`); every event replaces the slim copy (a heartbeat's new resourceVersion
keeps the marks' optimistic-concurrency patches from meeting a 409), but only an event whose
digest differs, or a node added or deleted, is handed on (to the event loop).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from hyperplan.actuation.providers.base import LABEL_POOL, POOL_FREE
from hyperplan.runtime.store import slim_node
from hyperplan.planning.naming import LABEL_GROUP, LABEL_PLAN, LABEL_RESERVED_CAPACITY
from hyperplan.planning.trainingjobs import LABEL_WORKLOAD

log = logging.getLogger("hyperplan.nodewatch")
ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
PAGE = 500  # nodes per page of a listing
WATCH_SECONDS = 300  # the API server ends a watch after this long; it is resumed at once
RETRY_SECONDS = 1.0  # after a failed listing or a broken stream


# Taints the node lifecycle controller sets from a node's conditions and cordon
# (node.kubernetes.io/not-ready, unreachable, unschedulable, memory-pressure, ...): the condition
# or the cordon itself is in the digest, and the operator's decisions read only its own taint keys.
CONDITION_TAINTS = "node.kubernetes.io/"


def node_digest(body: Mapping[str, Any]) -> tuple:
    """What the operator reads of a node. Heartbeats (KWOK or a kubelet refreshing
    lastHeartbeatTime) leave it unchanged, so they wake nothing. A condition's
    lastTransitionTime is left out too: it matters only with a new status, which is in the
    digest, and KWOK's heartbeats re-render it in two alternating forms (docs/benchmarks.md 5.2),
    which woke every group on every heartbeat. So are the taints of :data:`CONDITION_TAINTS`:
    they follow a condition the digest holds already, a controller-manager's minutes behind the
    condition when 5,000 nodes come up at once (docs/benchmarks.md 5.7), and each of their
    comings and goings woke a group for nothing."""
    meta, spec, status = body.get("metadata") or {}, body.get("spec") or {}, body.get("status") or {}
    return (
        tuple(sorted((meta.get("labels") or {}).items())),
        tuple(sorted((t.get("key"), t.get("value"), t.get("effect")) for t in spec.get("taints") or []
                     if not str(t.get("key", "")).startswith(CONDITION_TAINTS))),
        bool(spec.get("unschedulable")),
        bool(meta.get("deletionTimestamp")),
        tuple(sorted((c.get("type"), c.get("status")) for c in status.get("conditions") or [])),
    )


def node_keys(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The keys a node is found under: ("group", group label), ("block", reserved-capacity
    label) for a group's node, ("job", plan label) for a job node; none for an untracked one."""
    keys: list[tuple[str, str]] = []
    if LABEL_GROUP in labels:
        keys.append(("group", labels[LABEL_GROUP]))
        if labels.get(LABEL_RESERVED_CAPACITY):
            keys.append(("block", labels[LABEL_RESERVED_CAPACITY]))
    if LABEL_WORKLOAD in labels:  # a warm job node carries it empty: still the plan's job node
        keys.append(("job", labels.get(LABEL_PLAN, "")))
    return tuple(keys)


@dataclass(frozen=True)
class NodeChange:
    """A node event worth handing on: ``type`` is ADDED, MODIFIED or DELETED, or None for a node
    found by the first listing (as kopf reports the initial listing). ``node`` is the slim node
    (for DELETED, the last one held, with the deletion's labels when the event carried them).
    ``left_group``: the group whose node it was until this event (relabelled, handed back), which
    must look again too."""

    type: str | None
    name: str
    labels: Mapping[str, str]
    node: Mapping[str, Any]
    left_group: str | None = None  # the group it was in, when it is no longer that group's node


@dataclass
class _Held:
    node: dict[str, Any]
    digest: tuple
    keys: tuple[tuple[str, str], ...]


@dataclass
class NodeStore:
    """The tracked nodes, by name and by key (see :func:`node_keys`); thread-safe: the watch
    thread writes, passes read from the event loop and from worker threads."""

    _held: dict[str, _Held] = field(default_factory=dict)
    _by_key: dict[tuple[str, str], dict[str, dict[str, Any]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    listeners: list[Callable[[NodeChange], None]] = field(default_factory=list)

    # -- reads (the shape of a kopf index: ``get(key)`` gives the values, or None)

    def get(self, key: tuple[str, str]) -> list[dict[str, Any]] | None:
        with self._lock:
            found = self._by_key.get(key)
            return list(found.values()) if found else None

    def view(self, kind: str) -> "KeyView":
        """The nodes under one kind of key, read as ``view.get(value)`` (e.g. job nodes by plan)."""
        return KeyView(self, kind)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    # -- writes (the watch thread)

    def apply(self, type_: str, obj: Mapping[str, Any]) -> NodeChange | None:
        """Take one watch event; the change to hand on, or None (a heartbeat, an untracked node)."""
        meta = obj.get("metadata") or {}
        name, labels = meta.get("name", ""), dict(meta.get("labels") or {})
        keys = node_keys(labels)
        tracked = bool(keys) or labels.get(LABEL_POOL) == POOL_FREE  # the free pool's nodes have no key
        with self._lock:
            before = self._held.get(name)
            if type_ == DELETED or not tracked:
                if before is None:
                    return None
                self._drop(name, before)
                if type_ == DELETED:
                    slim = slim_node(obj) if meta else before.node
                    return NodeChange(DELETED, name, dict(slim["metadata"].get("labels") or {}), slim)
                # it lost the labels that made it ours (handed back, relabelled): a change for the
                # last group it was in, and the end of it here
                return NodeChange(MODIFIED, name, labels, slim_node(obj), _left_group(before, labels))
            slim, digest = slim_node(obj), node_digest(obj)
            self._put(name, _Held(slim, digest, keys), before)
        if before is None:  # new to the store: created, or newly labelled as ours
            return NodeChange(ADDED, name, labels, slim)
        if before.digest == digest:
            return None
        return NodeChange(MODIFIED, name, labels, slim, _left_group(before, labels))

    def replace(self, items: Iterable[Mapping[str, Any]], first: bool) -> list[NodeChange]:
        """A new listing: what changed against the store (all of it, as type None, on the first
        listing), with the nodes that went meanwhile as DELETED."""
        listed: set[str] = set()
        changes: list[NodeChange] = []
        for obj in items:
            name = (obj.get("metadata") or {}).get("name", "")
            listed.add(name)
            change = self.apply(MODIFIED, obj)
            with self._lock:
                held = self._held.get(name)
            if first and held is not None:
                changes.append(NodeChange(None, name, dict(held.node["metadata"].get("labels") or {}), held.node))
            elif change is not None:
                changes.append(change)
        with self._lock:
            gone = [(n, h) for n, h in self._held.items() if n not in listed]
            for name, held in gone:
                self._drop(name, held)
        changes += [NodeChange(DELETED, n, dict(h.node["metadata"].get("labels") or {}), h.node) for n, h in gone]
        return changes

    def _put(self, name: str, held: _Held, before: _Held | None) -> None:
        if before is not None:
            self._unindex(name, before)
        self._held[name] = held
        for key in held.keys:
            self._by_key.setdefault(key, {})[name] = held.node

    def _drop(self, name: str, held: _Held) -> None:
        self._held.pop(name, None)
        self._unindex(name, held)

    def _unindex(self, name: str, held: _Held) -> None:
        for key in held.keys:
            bucket = self._by_key.get(key)
            if bucket is not None:
                bucket.pop(name, None)
                if not bucket:
                    del self._by_key[key]


def _left_group(before: _Held, labels: Mapping[str, str]) -> str | None:
    was = next((value for kind, value in before.keys if kind == "group"), None)
    return was if was is not None and labels.get(LABEL_GROUP) != was else None


@dataclass(frozen=True)
class KeyView:
    store: NodeStore
    kind: str

    def get(self, value: str) -> list[dict[str, Any]] | None:
        return self.store.get((self.kind, value))


class Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class NodeWatch:
    """One Node watch stream feeding a :class:`NodeStore` (see the module docstring).

    ``core`` is a ``kubernetes.client.CoreV1Api``; responses are read raw
    (``_preload_content=False``) and parsed as plain JSON, never into the client's models.
    ``hand_on(change)`` is called on the watch thread for every change; the caller makes it
    thread-safe (``loop.call_soon_threadsafe``)."""

    def __init__(self, core: Any, store: NodeStore, hand_on: Callable[[NodeChange], None]):
        self.core = core
        self.store = store
        self.hand_on = hand_on
        self.resource_version = ""
        self.stop = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None
        self.events = 0  # watch events read (a figure for benchmarks and logs)

    def list(self, first: bool = False) -> list[NodeChange]:
        """List every node (in pages) into the store; the changes against what it held."""
        items: list[dict[str, Any]] = []
        cont = None
        while True:
            resp = self.core.list_node(limit=PAGE, _continue=cont, _preload_content=False,
                                       _request_timeout=(10, 120))
            try:
                page = json.loads(resp.data)
            finally:
                resp.release_conn()
            items += page.get("items") or []
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                self.resource_version = (page.get("metadata") or {}).get("resourceVersion", "")
                break
        return self.store.replace(items, first)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="node-watch", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5) -> None:
        self.stop.set()
        resp = self._response
        if resp is not None:
            try:
                # close() alone waits for the blocked read to return (the next event, a bookmark,
                # or the read timeout: minutes on a quiet fleet); shutdown() interrupts it.
                if hasattr(resp, "shutdown"):
                    resp.shutdown()
                resp.close()
            except Exception:  # noqa: BLE001 - closing a stream that broke anyway
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        """The watch thread: watch, resume, list again when the resourceVersion expired."""
        relist = False
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                if relist:
                    for change in self.list():
                        self.hand_on(change)
                    relist = False
                self._watch_once()
            except Expired:
                log.info("node watch: resourceVersion %s expired; listing again", self.resource_version)
                relist = True
            except Exception as e:  # noqa: BLE001 - the watch must outlive any one failure
                if self.stop.is_set():
                    return
                if getattr(e, "status", None) == 410:  # the expiry as an HTTP status, not an event
                    log.info("node watch: resourceVersion %s expired (410); listing again", self.resource_version)
                    relist = True
                    continue
                log.warning("node watch failed (%s: %s); resuming in %.0fs", type(e).__name__, e, RETRY_SECONDS)
                time.sleep(RETRY_SECONDS)
                continue
            if time.monotonic() - started < RETRY_SECONDS:  # a stream that ends at once: no busy loop
                self.stop.wait(RETRY_SECONDS)

    def _watch_once(self) -> None:
        resp = self.core.list_node(watch=True, resource_version=self.resource_version,
                                   allow_watch_bookmarks=True, timeout_seconds=WATCH_SECONDS,
                                   _preload_content=False, _request_timeout=(10, WATCH_SECONDS + 30))
        self._response = resp
        try:
            for line in _lines(resp):
                if self.stop.is_set():
                    return
                event = json.loads(line)
                self.take(event)
        finally:
            self._response = None
            resp.release_conn()

    def take(self, event: Mapping[str, Any]) -> None:
        """One watch event: into the store, and handed on if it changed what the operator reads."""
        self.events += 1
        type_, obj = event.get("type"), event.get("object") or {}
        if type_ == "ERROR":
            if obj.get("code") == 410:
                raise Expired(obj.get("message", ""))
            raise RuntimeError(f"watch error: {obj.get('message', obj)}")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.resource_version = rv
        if type_ == "BOOKMARK":
            return
        change = self.store.apply(type_, obj)
        if change is not None:
            self.hand_on(change)


def _lines(resp: Any) -> Iterator[bytes]:
    """The newline-separated JSON documents of a watch response, as they arrive."""
    buffer = b""
    for chunk in resp.stream(65536, decode_content=True):
        buffer += chunk
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                break
            line, buffer = buffer[:end], buffer[end + 1:]
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer
