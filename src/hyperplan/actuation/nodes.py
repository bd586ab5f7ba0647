"""Node providers: where an instance group's nodes come from, behind one Protocol.

* :class:`KwokProvider` creates Node objects annotated ``kwok.x-k8s.io/node=fake`` with
  capacity that fits the instance type; KWOK keeps them Ready and runs their pods.
* :class:`StaticProvider` adopts existing nodes labelled ``hyperplan.dev/pool=free`` of the
  right instance type and zone (kind's workers, say), labels and uncordons them while the
  group holds them, and cordons and hands them back when it lets go. It never creates or
  deletes a node.
* :class:`FakeProvider` keeps nodes in memory and records every call, for unit tests.

Every node a provider hands out carries the label ``hyperplan.dev/node-id`` with the
deterministic name planning chose (:class:`~hyperplan.planning.placement.NodeSpec`);
for KWOK it is also the node's name. Nodes are found again by the group label, so a
restart neither duplicates nor orphans a node.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from kubernetes import client
from kubernetes.client.rest import ApiException

from hyperplan.actuation.kube import Kube
from hyperplan.planning import placement as pl

log = logging.getLogger(__name__)

LABEL_NODE_ID = "hyperplan.dev/node-id"
LABEL_POOL = "hyperplan.dev/pool"
POOL_FREE = "free"
POOL_HELD = "held"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"

# GPUs (or Trainium chips) per instance type; everything else gets CPU and memory only.
ACCELERATORS: dict[str, tuple[str, int]] = {
    "ml.p5.48xlarge": ("nvidia.com/gpu", 8),
    "ml.p5e.48xlarge": ("nvidia.com/gpu", 8),
    "ml.p5en.48xlarge": ("nvidia.com/gpu", 8),
    "ml.p4d.24xlarge": ("nvidia.com/gpu", 8),
    "ml.p4de.24xlarge": ("nvidia.com/gpu", 8),
    "ml.p6-b200.48xlarge": ("nvidia.com/gpu", 8),
    "ml.p6e-gb200.36xlarge": ("nvidia.com/gpu", 4),
    "ml.trn1.32xlarge": ("aws.amazon.com/neuron", 16),
    "ml.trn1n.32xlarge": ("aws.amazon.com/neuron", 16),
    "ml.trn2.48xlarge": ("aws.amazon.com/neuron", 16),
}


def node_capacity(instance_type: str) -> dict[str, str]:
    """Allocatable resources of a fake node of ``instance_type``."""
    capacity = {"cpu": "192", "memory": "2048Gi", "pods": "110", "ephemeral-storage": "30Ti"}
    if instance_type in ACCELERATORS:
        resource, count = ACCELERATORS[instance_type]
        capacity[resource] = str(count)
    return capacity


def taints_of(node: client.V1Node) -> tuple[pl.Taint, ...]:
    return tuple(pl.Taint(t.key, t.value or "", t.effect) for t in (node.spec.taints or []))


def _taint_body(taints: list[pl.Taint] | tuple[pl.Taint, ...]) -> list[dict[str, str]]:
    return [{"key": t.key, "value": t.value, "effect": t.effect} for t in taints]


def merged_taints(node: client.V1Node, want: tuple[pl.Taint, ...], managed_keys: set[str]) -> list[pl.Taint]:
    """The node's taints with the managed keys replaced by ``want``; other taints kept."""
    kept = [t for t in taints_of(node) if t.key not in managed_keys]
    return kept + list(want)


@runtime_checkable
class NodeProvider(Protocol):
    """Create, change, release and list the nodes of instance groups."""

    def create(self, spec: pl.NodeSpec) -> None: ...

    def update(self, node: str, spec: pl.NodeSpec, managed_keys: set[str]) -> None: ...

    def cordon(self, node: str) -> None: ...

    def release(self, node: str) -> None: ...

    def list(self, group: str) -> list[client.V1Node]: ...


class KwokProvider:
    """Fake nodes that KWOK keeps alive on the local control plane (or any cluster with KWOK)."""

    def __init__(self, kube: Kube):
        self.kube = kube

    def create(self, spec: pl.NodeSpec) -> None:
        body = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": spec.name, "labels": {**spec.labels, LABEL_NODE_ID: spec.name},
                         "annotations": {KWOK_ANNOTATION: "fake"}},
            "spec": {"taints": _taint_body(spec.taints)},
            "status": {"capacity": node_capacity(spec.instance_type),
                       "allocatable": node_capacity(spec.instance_type)},
        }
        try:
            self.kube.core.create_node(body)
        except ApiException as e:
            if e.status != 409:  # already there: a previous pass (or life) created it
                raise

    def update(self, node: str, spec: pl.NodeSpec, managed_keys: set[str]) -> None:
        current = self.kube.core.read_node(node)
        taints = merged_taints(current, spec.taints, managed_keys)
        self.kube.core.patch_node(node, {"metadata": {"labels": dict(spec.labels)},
                                         "spec": {"taints": _taint_body(taints) or None}})

    def cordon(self, node: str) -> None:
        self.kube.core.patch_node(node, {"spec": {"unschedulable": True}})

    def release(self, node: str) -> None:
        try:
            self.kube.core.delete_node(node)
        except ApiException as e:
            if e.status != 404:
                raise

    def list(self, group: str) -> list[client.V1Node]:
        return self.kube.list_nodes(f"{pl.LABEL_GROUP}={pl.label_value(group)}")


class StaticProvider:
    """Existing nodes lent to groups: adopted from the free pool, handed back when released."""

    OWNED_LABELS = (pl.LABEL_GROUP, pl.LABEL_PLAN, pl.LABEL_RESERVED_CAPACITY, pl.LABEL_ROLE,
                    pl.LABEL_HEALTH, pl.LABEL_SLOT, pl.LABEL_GENERATION, LABEL_NODE_ID)

    def __init__(self, kube: Kube):
        self.kube = kube

    def _by_id(self, node_id: str) -> client.V1Node | None:
        found = self.kube.list_nodes(f"{LABEL_NODE_ID}={node_id}")
        return found[0] if found else None

    def create(self, spec: pl.NodeSpec) -> None:
        if self._by_id(spec.name):
            return
        free = self.kube.list_nodes(
            f"{LABEL_POOL}={POOL_FREE},{pl.LABEL_INSTANCE_TYPE}={spec.instance_type},"
            f"{pl.LABEL_ZONE}={spec.availability_zone}")
        if not free:
            raise NoFreeNode(f"no free node of {spec.instance_type} in {spec.availability_zone} "
                             f"(label {LABEL_POOL}={POOL_FREE})")
        node = sorted(free, key=lambda n: n.metadata.name)[0]
        labels = {k: v for k, v in spec.labels.items() if k != pl.LABEL_HOSTNAME}
        labels.update({LABEL_NODE_ID: spec.name, LABEL_POOL: POOL_HELD})
        taints = merged_taints(node, spec.taints, {t.key for t in spec.taints}
                               | {pl.SPARE_TAINT.key, pl.UNHEALTHY_TAINT.key})
        # resourceVersion makes two groups racing for the same free node safe: one gets 409.
        self.kube.core.patch_node(node.metadata.name, {
            "metadata": {"labels": labels, "resourceVersion": node.metadata.resource_version},
            "spec": {"unschedulable": None, "taints": _taint_body(taints) or None}})

    def update(self, node: str, spec: pl.NodeSpec, managed_keys: set[str]) -> None:
        current = self._by_id(node)
        if current is None:
            return
        labels = {k: v for k, v in spec.labels.items() if k != pl.LABEL_HOSTNAME}
        taints = merged_taints(current, spec.taints, managed_keys)
        self.kube.core.patch_node(current.metadata.name, {"metadata": {"labels": labels},
                                                          "spec": {"taints": _taint_body(taints) or None}})

    def cordon(self, node: str) -> None:
        current = self._by_id(node)
        if current is not None:
            self.kube.core.patch_node(current.metadata.name, {"spec": {"unschedulable": True}})

    def release(self, node: str) -> None:
        current = self._by_id(node)
        if current is None:
            return
        labels: dict[str, Any] = {k: None for k in self.OWNED_LABELS}
        labels[LABEL_POOL] = POOL_FREE
        keep = [t for t in taints_of(current) if not t.key.startswith("hyperplan.dev/")]
        self.kube.core.patch_node(current.metadata.name, {
            "metadata": {"labels": labels},
            "spec": {"unschedulable": True, "taints": _taint_body(keep) or None}})

    def list(self, group: str) -> list[client.V1Node]:
        return self.kube.list_nodes(f"{pl.LABEL_GROUP}={pl.label_value(group)}")


class NoFreeNode(RuntimeError):
    """The static pool has no node left for a group."""


@dataclass
class FakeProvider:
    """Nodes in memory; records calls; ``fail_on`` makes a named operation raise."""

    nodes: dict[str, client.V1Node] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    fail_on: set[str] = field(default_factory=set)

    def _maybe_fail(self, op: str, name: str) -> None:
        self.calls.append((op, name))
        if op in self.fail_on:
            raise RuntimeError(f"injected failure in {op}({name})")

    def create(self, spec: pl.NodeSpec) -> None:
        self._maybe_fail("create", spec.name)
        self.nodes.setdefault(spec.name, client.V1Node(
            metadata=client.V1ObjectMeta(name=spec.name, labels={**spec.labels, LABEL_NODE_ID: spec.name},
                                         creation_timestamp=datetime.now()),
            spec=client.V1NodeSpec(taints=[client.V1Taint(key=t.key, value=t.value, effect=t.effect)
                                           for t in spec.taints])))

    def update(self, node: str, spec: pl.NodeSpec, managed_keys: set[str]) -> None:
        self._maybe_fail("update", node)
        n = self.nodes[node]
        n.metadata.labels.update(spec.labels)
        n.spec.taints = [client.V1Taint(key=t.key, value=t.value, effect=t.effect)
                         for t in merged_taints(n, spec.taints, managed_keys)]

    def cordon(self, node: str) -> None:
        self._maybe_fail("cordon", node)
        self.nodes[node].spec.unschedulable = True

    def release(self, node: str) -> None:
        self._maybe_fail("release", node)
        self.nodes.pop(node, None)

    def list(self, group: str) -> list[client.V1Node]:
        return [n for n in self.nodes.values() if n.metadata.labels.get(pl.LABEL_GROUP) == pl.label_value(group)]


def providers(kube: Kube) -> dict[str, NodeProvider]:
    return {"kwok": KwokProvider(kube), "static": StaticProvider(kube)}


# Each provider satisfies the Protocol, stated the way Go's `var _ NodeProvider = KwokProvider{}` is:
# a type checker rejects these lines if a method goes missing or changes its signature.
_kwok: type[NodeProvider] = KwokProvider
_static: type[NodeProvider] = StaticProvider
_fake: type[NodeProvider] = FakeProvider


# --------------------------------------------------------------------------- drain


@dataclass(frozen=True)
class DrainProgress:
    pods_left: int
    blocked: int  # evictions refused by a PodDisruptionBudget this pass


def evict_pods(kube: Kube, node_name: str) -> DrainProgress:
    """Ask the Eviction API to evict every pod on ``node_name`` once; PDB refusals are counted."""
    pods = kube.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}").items
    left = [p for p in pods if p.metadata.deletion_timestamp is None]
    blocked = 0
    for pod in left:
        eviction = client.V1Eviction(metadata=client.V1ObjectMeta(
            name=pod.metadata.name, namespace=pod.metadata.namespace))
        try:
            kube.core.create_namespaced_pod_eviction(pod.metadata.name, pod.metadata.namespace, eviction)
        except ApiException as e:
            if e.status == 429:  # a PodDisruptionBudget says not now
                blocked += 1
            elif e.status != 404:
                raise
    return DrainProgress(pods_left=len(pods), blocked=blocked)
