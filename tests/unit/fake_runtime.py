"""A Runtime built from the recording fakes, for running the real plan and group passes.

The API server is a :class:`FakeKube`; the watches are a real :class:`WatchCache` bound, as kopf
binds it, to indexes that read the FakeKube's plans and groups as they are now (the watch has
caught up, unless a test pauses it) and the FakeLedger's pools (:class:`WatchedPools`); the nodes are a real
:class:`NodeStore` listed again from the :class:`FakeProvider` before each pass. Everything that
writes (the FakeKube, the FakeLedger) records into one list, ``World.calls``, so a test can read
their order.
``kopf.event`` and ``kopf.info`` are replaced by a recorder (``World.events``).
"""

from __future__ import annotations

import asyncio
import json
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterator

import kopf
from kubernetes import client

from hyperplan_testing.fakes import (
    FakeDeepCheckJobs, FakeKarpenterProvider, FakeKube, FakeLedger, FakeNodePods, FakeProvider,
)
from hyperplan.api.models import CapacityPool
from hyperplan.runtime.store import GROUPS, NODES, PLANS, POOLS, WatchCache
from hyperplan.runtime.context import Runtime
from hyperplan.wiring.nodes import node_changed
from hyperplan.runtime.nodewatch import NodeStore
from hyperplan.runtime.workqueue import WorkQueue
from hyperplan.planning import naming
from hyperplan.planning.policy import Policy
from hyperplan.settings import Settings

PLANS_PLURAL, GROUPS_PLURAL = "trainingplans", "instancegroups"


class PausableIndex:
    """A kopf index (``get(name)`` gives a list of bodies) over what ``_current`` returns;
    :meth:`pause` holds what it shows, as a watch whose next events are still on their way."""

    held: dict[str, dict[str, Any]] | None = None

    def _current(self) -> dict[str, dict[str, Any]]:
        raise NotImplementedError

    def _shown(self) -> dict[str, dict[str, Any]]:
        return self.held if self.held is not None else self._current()

    def get(self, name: str) -> list[dict[str, Any]] | None:
        found = self._shown().get(name)
        return None if found is None else [found]

    def keys(self) -> Iterator[str]:
        return iter(list(self._shown()))

    def pause(self) -> None:
        self.held = dict(self._current())


@dataclass
class Watched(PausableIndex):
    """One kind's index over the FakeKube's objects."""

    kube: FakeKube
    plural: str
    held: dict[str, dict[str, Any]] | None = None

    def _current(self) -> dict[str, dict[str, Any]]:
        return {name: obj for (plural, name), obj in self.kube.objects.items() if plural == self.plural}


@dataclass
class WatchedPools(PausableIndex):
    """The pools' index over the FakeLedger's pools, each at a resourceVersion that moves with its
    content (paused: as a watch that has not yet delivered the ledger's latest writes, another
    plan's purchase, say)."""

    ledger: FakeLedger
    held: dict[str, dict[str, Any]] | None = None

    def _current(self) -> dict[str, dict[str, Any]]:
        out = {}
        for pool in self.ledger.pool_objects:
            body = pool.wire()
            version = zlib.crc32(json.dumps(body, sort_keys=True).encode())
            out[pool.metadata["name"]] = {**body, "metadata": {**body["metadata"], "resourceVersion": str(version)}}
        return out


@dataclass
class World:
    rt: Runtime
    plan_watch: Watched
    pool_watch: WatchedPools
    kube: FakeKube
    ledger: FakeLedger
    provider: FakeProvider
    pods: FakeNodePods
    nodes: NodeStore
    now: datetime
    calls: list[tuple] = field(default_factory=list)
    events: list[tuple[str, str, str, str]] = field(default_factory=list)  # (object, type, reason, message)
    karpenter: Any = None  # hyperplan_testing.fakes.FakeKarpenterProvider, for nodeProvider: karpenter
    checks: Any = None  # hyperplan_testing.fakes.FakeDeepCheckJobs: the deep health checks' Jobs

    def record_event(self, obj: Any, *, type: str, reason: str, message: str = "") -> None:
        name = (obj.get("metadata") or {}).get("name", "") if isinstance(obj, dict) else obj.metadata.name
        self.events.append((name, type, reason, message))

    def reasons(self) -> list[str]:
        return [reason for _, _, reason, _ in self.events]

    def list_nodes(self) -> None:
        """The node watch lists the provider's nodes again (what the API server now holds) and
        hands each change to the operator's node handler, as the watch thread does."""
        api = client.ApiClient()
        for change in self.nodes.replace([api.sanitize_for_serialization(n) for n in self.provider.nodes.values()],
                                         first=False):
            node_changed(self.rt, change)

    def run(self, reconcile: Any, name: str) -> datetime | None:
        """One pass of ``reconcile`` (reconcile_plan or reconcile_group) over ``name``, after the
        node watch has caught up."""
        self.list_nodes()
        return asyncio.run(reconcile(self.rt, name))

    def status_patches(self, plural: str) -> list[dict[str, Any]]:
        return [call[3] for call in self.calls if call[:2] == ("patch_status", plural)]

    def close(self) -> None:
        self.rt.purchase_threads.shutdown()
        self.rt.group_threads.shutdown()


def make_world(monkeypatch: Any, now: datetime, policy: Policy, *, plans: list[dict] = (),
               groups: list[dict] = (), pools: list[CapacityPool] = ()) -> World:
    calls: list[tuple] = []
    kube = FakeKube(calls=calls)
    for plan in plans:
        kube.put(PLANS_PLURAL, plan)
    for group in groups:
        kube.put(GROUPS_PLURAL, group)
    ledger = FakeLedger(pool_objects=list(pools), calls=calls)
    provider = FakeProvider(clock=lambda: world.now)
    karpenter = FakeKarpenterProvider(nodes=provider.nodes, clock=lambda: world.now)  # one node store
    pods = FakeNodePods()
    checks = FakeDeepCheckJobs()
    store = NodeStore()
    cache = WatchCache()
    pool_watch = WatchedPools(ledger)
    plan_watch = Watched(kube, PLANS_PLURAL)
    cache.bind({PLANS: plan_watch, GROUPS: Watched(kube, GROUPS_PLURAL),
                POOLS: pool_watch, NODES: store})
    rt = Runtime(settings=Settings(), policy=policy, kube=kube, ledger=ledger, providers={"kwok": provider, "karpenter": karpenter},
                 clock=lambda: world.now, cache=cache, pods=pods, checks=checks, node_store=store,
                 queue=WorkQueue(lambda: world.now))
    for group in groups:  # as the group's watch event does (controllers.group.reconciler.group_event)
        rt.group_names[naming.label_value(group["metadata"]["name"])] = group["metadata"]["name"]
    world = World(rt, plan_watch, pool_watch, kube, ledger, provider, pods, store, now, calls, karpenter=karpenter,
                  checks=checks)
    monkeypatch.setattr(kopf, "event", world.record_event)
    monkeypatch.setattr(kopf, "info", lambda obj, *, reason, message="": world.record_event(
        obj, type="Normal", reason=reason, message=message))
    return world
