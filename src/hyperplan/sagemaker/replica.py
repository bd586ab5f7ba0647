"""The SageMaker API as every replica serves it, the leader and the standby alike.

Both replicas serve the API (docs/sagemaker-api.md, "Where it runs"): each reads from a watch cache
of its own and writes through the API server as the key's identity, so only the leader's
reconciling acts on what either writes. kopf runs on the leader only (``hyperplan.operator``:
it starts once the Lease is held), so a standby has no kopf indexes to read. Here it gets a
read-only watch of its own: TrainingPlans, CapacityPools and InstanceGroups (:class:`KindStore`,
each fed by one watch stream) and the Nodes of groups (the operator's own
:class:`~hyperplan.runtime.nodewatch.NodeStore`), held in a
:class:`~hyperplan.runtime.store.WatchCache` exactly as kopf's indexes hold them (plans packed,
pools with their ledger lines shared, the same slim copies), so every operation reads the same
shapes on either replica. Nothing in it reconciles, wakes a pass or writes: its events only
change what the cache holds.

One path for both roles. The API is started before the election (:meth:`ReplicaApi.start`:
the first listing of every kind, then the port), and reads its own watches. When this replica
leads and kopf has listed every indexed kind (the first resource event kopf hands to a handler:
kopf runs none before all its indexes are filled), the API reads kopf's indexes instead
(:meth:`ReplicaApi.indexed`) and its own watches stop, so a leader holds one copy of the fleet.
So a replica promoted from standby serves on the same port without a gap, and a leader that has
just started never answers from an index kopf has not listed yet.

The watch streams are the node watch's own machinery (:class:`~hyperplan.runtime.nodewatch.NodeWatch`:
pages, bookmarks, resume, relist on 410), reading a custom kind through :class:`_KindLister`.
Events are applied on the event loop (``call_soon_threadsafe``), where the operations read the
indexes, so no read ever iterates a dict that a watch thread is changing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from aiohttp import web
from kubernetes import client

from hyperplan.actuation.kube import api_client
from hyperplan.api.vocabulary import GROUP, VERSION
from hyperplan.runtime.store import GROUPS, NODES, PLANS, POOLS, PackedObject, WatchCache, slim_object
from hyperplan.runtime.nodewatch import NodeStore, NodeWatch
from hyperplan.planning.offerings import PoolSnapshot
from hyperplan.planning.blocks import Block
from hyperplan.planning.policy import Policy
from hyperplan.sagemaker.access import SECRET_TYPE, Access, KubeAccess, KubeWrites, Writes
from hyperplan.sagemaker.hyperpod import EKS_CLUSTER_ARN
from hyperplan.sagemaker.server import check_address, make_app, serve
from hyperplan.settings import Settings

log = logging.getLogger("hyperplan.sagemaker")
RETRY_SECONDS = 5.0  # after a failed start (a listing refused, the port still held)
KINDS = {"trainingplans": PLANS, "capacitypools": POOLS, "instancegroups": GROUPS}


class SwitchedFleet:
    """The fleet the API reads (:class:`hyperplan.sagemaker.operations.Fleet`): the replica's own
    watch cache, then kopf's (:meth:`switch`). ``plans_version`` carries which one it is, so the
    listings' views of the one are never taken for the other's (``operations.PlanViews``)."""

    def __init__(self, fleet: Any) -> None:
        self.current = fleet
        self._epoch = 0

    def switch(self, fleet: Any) -> None:
        self.current = fleet
        self._epoch += 1

    @property
    def plans_version(self) -> tuple[int, Any] | None:
        version = getattr(self.current, "plans_version", None)
        return None if version is None else (self._epoch, version)

    def plan(self, name: str) -> dict[str, Any] | None:
        return self.current.plan(name)

    def plan_entries(self) -> list[tuple[str, Any]]:
        return self.current.plan_entries()

    def pool_snapshots(self) -> list[PoolSnapshot]:
        return self.current.pool_snapshots()

    def groups(self) -> list[dict[str, Any]]:
        return self.current.groups()

    def group_nodes(self, group_label: str) -> list[dict[str, Any]]:
        return self.current.group_nodes(group_label)

    def blocks_of(self, plan_uid: str) -> list[Block]:
        return self.current.blocks_of(plan_uid)


class _KindLister:
    """A custom kind, listed and watched through the call :class:`NodeWatch` makes
    (``list_node``, with the same arguments: ``limit``, ``_continue``, ``watch``,
    ``resource_version``, ``allow_watch_bookmarks``, ``timeout_seconds``, raw responses)."""

    def __init__(self, api: client.ApiClient, plural: str) -> None:
        self.objects = client.CustomObjectsApi(api)
        self.plural = plural

    def list_node(self, **kwargs: Any) -> Any:
        return self.objects.list_cluster_custom_object(GROUP, VERSION, self.plural, **kwargs)


class KindStore:
    """One kind's index as kopf would hold it (``{name: [slim copy]}``), fed by a watch thread
    through the store calls :class:`NodeWatch` makes (``apply`` per event, ``replace`` per
    listing). The slim copy is made on the watch thread; the change of the index is posted to
    the loop (``post``). Nothing is handed back to the watch: no change wakes anything."""

    def __init__(self, plural: str, cache: WatchCache, post: Callable[[Callable[[], None]], None]) -> None:
        self.plural = plural
        self.cache = cache
        self.index: dict[str, list[Any]] = {}
        self._post = post

    def held(self, obj: Mapping[str, Any]) -> Any:
        """What the index holds of ``obj``: what kopf's index handler of the kind makes of it
        (``runtime.store.hp_plans``, ``hp_pools``, ``hp_groups``)."""
        slim = slim_object(obj)
        if self.plural == "trainingplans":
            return PackedObject.of(slim)
        if self.plural == "capacitypools":
            return self.cache.share_ledger(slim)
        return slim

    def _moved(self) -> None:
        if self.plural == "trainingplans":
            self.cache.plans_version += 1

    def apply(self, type_: str, obj: Mapping[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return None
        value = None if type_ == "DELETED" else self.held(obj)

        def change() -> None:
            if value is None:
                self.index.pop(name, None)
                self.cache.forget(self.plural, name)
            else:
                self.index[name] = [value]
            self._moved()
        self._post(change)
        return None

    def replace(self, items: Iterable[Mapping[str, Any]], first: bool) -> list:
        listed = {o["metadata"]["name"]: [self.held(o)] for o in items if (o.get("metadata") or {}).get("name")}

        def change() -> None:
            for gone in set(self.index) - set(listed):
                self.cache.forget(self.plural, gone)
            self.index.clear()
            self.index.update(listed)
            self._moved()
        self._post(change)
        return []


class ReplicaCache:
    """This replica's own read-only watch cache: a :class:`WatchCache` bound to the
    :class:`KindStore` of each kind and a :class:`NodeStore` (see the module docstring)."""

    def __init__(self, kubeconfig: str | None, lister_of: Callable[[str], Any] | None = None) -> None:
        self.cache = WatchCache()
        self._lister_of = lister_of or (lambda plural: _lister(kubeconfig, plural))
        self.nodes = NodeStore()
        self.stores: dict[str, KindStore] = {}
        self.watches: list[NodeWatch] = []
        self.started = False

    async def start(self) -> None:
        """List every kind (the listings' changes are applied on the loop before this returns:
        each is posted before its thread ends), then watch each on a thread of its own. A failed
        start may be made again: it lists everything afresh."""
        loop = asyncio.get_running_loop()
        self.stores = {plural: KindStore(plural, self.cache, loop.call_soon_threadsafe) for plural in KINDS}
        self.cache.bind({**{KINDS[p]: s.index for p, s in self.stores.items()}, NODES: self.nodes})
        self.watches = [NodeWatch(self._lister_of(plural), store, _nothing) for plural, store in self.stores.items()]
        self.watches.append(NodeWatch(self._lister_of("nodes"), self.nodes, _nothing))
        started = time.monotonic()
        await asyncio.gather(*(asyncio.to_thread(w.list, True) for w in self.watches))
        await asyncio.sleep(0)  # the listings' posted changes run before anything after this
        for watch in self.watches:
            watch.start()
        self.started = True
        log.info("SageMaker API: own watch cache of %d plan(s), %d pool(s), %d group(s), %d node(s) listed in %.1fs",
                 *(len(self.stores[p].index) for p in KINDS), len(self.nodes), time.monotonic() - started)

    def close(self) -> None:
        """Stop every watch (blocks: a thread, or a caller that may wait)."""
        for watch in self.watches:
            watch.close()


def _lister(kubeconfig: str | None, plural: str) -> Any:
    """What a :class:`NodeWatch` of ``plural`` lists through: a client of its own (a watch
    stream holds its connection), the core API for nodes."""
    api = api_client(kubeconfig)
    return client.CoreV1Api(api) if plural == "nodes" else _KindLister(api, plural)


def _nothing(_: Any) -> None:
    """No change of the replica's own watch is handed on: it reconciles nothing."""


class ReplicaApi:
    """The API of one replica: served from its own watch cache (:class:`ReplicaCache`) until
    kopf's indexes are listed on this replica (:meth:`indexed`), then from those."""

    def __init__(self, settings: Settings, api: client.ApiClient | None, clock: Callable[[], datetime],
                 policy: Policy, own: ReplicaCache | None = None, access: Access | None = None,
                 writes: Writes | None = None) -> None:
        """``own``, ``access`` and ``writes`` are the seams of the unit tests (by default: the
        replica's watches, keys and reviews, and writes, all through ``api``)."""
        self.settings = settings
        self.own = own or ReplicaCache(settings.kubeconfig)
        self.fleet = SwitchedFleet(self.own.cache)
        self.clock, self.policy = clock, policy
        self.namespace = settings.api_key_namespace or settings.pod_namespace or "default"
        self.access = access or KubeAccess(api, self.namespace)
        self.writes = writes or KubeWrites(api)
        self.runner: web.AppRunner | None = None
        self._task: asyncio.Task | None = None
        self._closed = False
        check_address(settings.sagemaker_api_address, bool(settings.sagemaker_api_tls_cert))  # fail now, not later

    @classmethod
    def of(cls, settings: Settings, runtime: Any) -> "ReplicaApi | None":
        """The API ``settings`` ask for (None when no port is set), with ``runtime``'s client,
        clock and policy (``runtime.context.Runtime``)."""
        if settings.sagemaker_api_port is None:
            return None
        return cls(settings, runtime.kube.api, runtime.clock, runtime.policy)

    def start(self) -> asyncio.Task:
        """List the own watch cache, then serve; in a task of its own (made before kopf starts,
        which cancels the tasks made after it), retried until it serves or :meth:`cleanup`."""
        self._task = asyncio.create_task(self._start(), name="sagemaker-api")
        return self._task

    async def _start(self) -> None:
        s = self.settings
        while not self._closed:
            try:
                if self.fleet.current is self.own.cache and not self.own.started:
                    await self.own.start()  # (not once kopf's indexes are read: see indexed)
                app = make_app(self.fleet, self.access, s.aws_account_id, self.clock, s.cluster_name, self.writes,
                               self.policy)
                app[EKS_CLUSTER_ARN] = s.eks_cluster_arn
                self.runner = await serve(app, s.sagemaker_api_address, s.sagemaker_api_port,
                                          s.sagemaker_api_tls_cert, s.sagemaker_api_tls_key)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a listing refused, the port held: try again
                log.error("SageMaker API: could not start (%s: %s); again in %.0fs", type(e).__name__, e, RETRY_SECONDS)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            scheme = "https" if s.sagemaker_api_tls_cert else "http"
            log.info("SageMaker API on %s://%s:%d (keys: Secrets of type %s in %s)", scheme, s.sagemaker_api_address,
                     s.sagemaker_api_port, SECRET_TYPE, self.namespace)
            return

    def indexed(self, cache: Any) -> None:
        """kopf has listed every kind into ``cache`` (called on the loop with each resource event
        kopf hands on: the first one switches, the rest cost a comparison). From now on the API
        reads ``cache``, and the own watches stop (on a thread: closing joins them)."""
        if self.fleet.current is cache:
            return
        self.fleet.switch(cache)
        own = self.own
        self.own = ReplicaCache(self.settings.kubeconfig, own._lister_of)  # never started: holds nothing
        threading.Thread(target=own.close, name="sagemaker-own-watch-close", daemon=True).start()
        log.info("SageMaker API: reading kopf's indexes now (own watches stopped)")

    async def cleanup(self) -> None:
        """Stop serving and watching (idempotent: kopf's cleanup and the run loop both call it)."""
        self._closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()
        await asyncio.to_thread(self.own.close)
