"""What every node provider shares: the :class:`NodeProvider` protocol, what a create returns
(:class:`MadeNode`), and the guarded writes every provider makes (a uid in each patch, a taint
list written over the resourceVersion it was built from: :func:`write_over_read`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Protocol, runtime_checkable

from kubernetes import client
from kubernetes.client.rest import ApiException

from hyperplan.actuation.kube import Kube
from hyperplan.api.models import NodeClaimRef
from hyperplan.api.vocabulary import (
    ANNOTATION_EVICTING_SINCE,
    ANNOTATION_HEALTH_SINCE,
    OWN_PREFIX,
)
from hyperplan.planning import lending, naming, nodefacts, placement, recovery

LABEL_NODE_ID = lending.LABEL_NODE_ID


LABEL_POOL = lending.LABEL_POOL


POOL_FREE = lending.POOL_FREE


POOL_HELD = lending.POOL_HELD


# A rebooted node's Ready condition until it is back (KWOK's stage and the real kubelet replace it).
REBOOT_REASON = "Rebooting"


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


def accelerators(instance_type: str) -> tuple[str, int] | None:
    """The accelerator resource and count of ``instance_type``, named as SageMaker names it
    (``ml.p5.48xlarge``) or as EC2 does (``p5.48xlarge``: an EC2 Capacity Block's, docs/aws.md)."""
    return ACCELERATORS.get(instance_type) or ACCELERATORS.get(f"ml.{instance_type}")


def node_capacity(instance_type: str) -> dict[str, str]:
    """Allocatable resources of a fake node of ``instance_type``."""
    capacity = {"cpu": "192", "memory": "2048Gi", "pods": "110", "ephemeral-storage": "30Ti"}
    found = accelerators(instance_type)
    if found is not None:
        resource, count = found
        capacity[resource] = str(count)
    return capacity


def taints_of(node: client.V1Node) -> tuple[naming.Taint, ...]:
    return tuple(naming.Taint(t.key, t.value or "", t.effect) for t in (node.spec.taints or []))


def taint_body(taints: list[naming.Taint] | tuple[naming.Taint, ...]) -> list[dict[str, str]]:
    return [{"key": t.key, "value": t.value, "effect": t.effect} for t in taints]


def merged_taints(node: client.V1Node, want: tuple[naming.Taint, ...], managed_keys: set[str]) -> list[naming.Taint]:
    """The node's taints with the managed keys replaced by ``want``; other taints kept."""
    kept = [t for t in taints_of(node) if t.key not in managed_keys]
    return kept + list(want)


@dataclass(frozen=True)
class MadeNode:
    """The Node that now stands for a spec: its name and uid as the API server answered, and for
    a lent node what it looked like before (the group keeps all three in its status)."""

    name: str
    uid: str
    lent: lending.LentRecord | None = None
    # karpenter: the NodeClaim made (its Node comes later; name is the node id, uid "" until then)
    node_claim: NodeClaimRef | None = None


@runtime_checkable
class NodeProvider(Protocol):
    """Create, change, release and list the nodes of instance groups.

    ``node`` is the Node's name as the group recorded it, ``uid`` its uid ("" where unknown:
    no check). ``create`` returns the Node that now stands for ``spec`` (a static provider
    adopts an existing node); ``release`` says in words what became of the node, for the
    event the handler posts. ``update`` returns the lent record with the keys it set for the
    first time (static) or None; ``cordon`` whether it cordoned the node now.
    """

    def create(self, spec: placement.NodeSpec, claim: str = "") -> MadeNode: ...

    def update(self, node: str, spec: placement.NodeSpec, managed_keys: set[str], uid: str = "",
               lent: lending.LentRecord | None = None) -> lending.LentRecord | None: ...

    def cordon(self, node: str, uid: str = "") -> bool: ...

    def release(self, node: str, uid: str = "", lent: lending.LentRecord | None = None,
                cordoned: bool = False) -> str: ...

    def list(self, group: str) -> list[client.V1Node]: ...

    def mark_unhealthy(self, node: str, health_status: str, taint: naming.Taint,
                       last_seen: client.V1Node | None = None, fault: str | None = None) -> None:
        """Label the node's health ``health_status`` and add ``taint`` (other taints kept).
        ``last_seen``: the node as the caller last saw it (see :meth:`KwokProvider.mark_unhealthy`);
        ``fault``: the health signal it is marked for (HyperPod's fault labels, with hyperpod_labels)."""
        ...

    def promote_spare(self, node: str, replacing: str, last_seen: client.V1Node | None = None) -> None:
        """Make spare ``node`` active in place of ``replacing``: role ``active``, label
        ``hyperplan.dev/replaces=<replacing>``, the spare taint removed (other taints kept)."""
        ...

    def mark_healthy(self, node: str, last_seen: client.V1Node | None = None) -> None:
        """Undo :meth:`mark_unhealthy` for a node back from its reboot (:func:`mark_healthy_patch`)."""
        ...

    def annotate(self, node: str, annotations: dict[str, str | None], uid: str = "") -> None:
        """Set (or, with None, remove) annotations on the node; a node that is gone is no error."""
        ...

    def set_condition(self, node: str, condition: dict[str, str], uid: str = "") -> None:
        """Set one condition (``type``, ``status``, ``reason``, ``message``, times) in the node's
        status, the others kept; a node that is gone is no error."""
        ...

    def reboot(self, node: str, uid: str = "") -> None:
        """Restart the node: it goes NotReady (Ready=False) and comes back Ready by itself, under
        the same name and uid with its labels and taints kept (the node lifecycle controller's
        ``node.kubernetes.io/not-ready`` taint comes and goes meanwhile, as with any NotReady
        node). The caller watches for the return; nothing more is to be called.

        A node that is gone, or another node of that name (``uid``, as :func:`guarded`), is no
        error: nothing is done. A second call while a reboot is under way starts no second one:
        a KWOK node's Ready condition says ``Rebooting`` until it is back; a static node's reboot
        Job, named from the node's name and uid, has not finished. A call after the reboot ended
        is a new reboot."""
        ...


def guarded(patch: dict, uid: str | None) -> dict:
    """``patch`` with ``metadata.uid`` set to ``uid`` (when known): the API server refuses a patch
    whose uid is not the node's (422, the uid is immutable), so a node deleted and made again
    under the same name by someone else is never written."""
    if uid:
        patch.setdefault("metadata", {})["uid"] = uid
    return patch


def uid_of(node: client.V1Node | None) -> str:
    return (node.metadata.uid or "") if node is not None and node.metadata else ""


def gone_or_another(e: ApiException) -> bool:
    """Whether a write failed because the node is gone (404) or is another node of that name (the
    uid in the patch, or the delete's uid precondition, does not match: 422 or 409 naming the uid)."""
    return e.status == 404 or (e.status in (409, 422) and "uid" in str(e.body or "").lower())


TAINT_WRITE_ATTEMPTS = 5


class NodeKeptChanging(RuntimeError):
    """Every attempt to write a node's taint list met a newer node (409 each time)."""


def write_over_read(kube: Kube, node: str, make: Callable[[client.V1Node], dict | None], uid: str = "",
                    last_seen: client.V1Node | None = None) -> bool:
    """Write the patch ``make`` builds from the node over the resourceVersion it was built from.

    A node's taint list is written whole (a merge patch replaces lists), so a patch built from one
    read must not land on a node that changed since: the node lifecycle controller adds and removes
    ``node.kubernetes.io/*`` taints at any moment, and a list written over its change would remove
    its taint (or put back one it removed, which the node policy refuses). Each patch carries the
    resourceVersion of the node it was made from; the API server answers 409 when the node moved
    on, and the node is read again and the patch made again from it. ``last_seen`` (the watch's
    copy) saves the first read when it has a resourceVersion.

    ``uid`` (the node the group holds; "" takes any) is checked on every read and sent in the
    patch. False when the node is gone or is another node of that name, or when ``make`` answers
    None (nothing to write); raises :class:`NodeKeptChanging` after
    :data:`TAINT_WRITE_ATTEMPTS` conflicts in a row."""
    current = last_seen if (last_seen is not None and last_seen.metadata
                            and last_seen.metadata.resource_version) else None
    for _ in range(TAINT_WRITE_ATTEMPTS):
        if current is None:
            current = read_node_or_none(kube, node)
        if current is None or (uid and uid_of(current) != uid):
            return False
        body = make(current)
        if body is None:
            return False
        body = guarded(body, uid_of(current))
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        try:
            kube.core.patch_node(node, body)
            return True
        except ApiException as e:
            if gone_or_another(e):
                return False
            if e.status != 409:
                raise
        current = None  # it changed since: read it again
    raise NodeKeptChanging(f"node {node} changed under each of {TAINT_WRITE_ATTEMPTS} writes of its taints")


def mark_unhealthy_patch(current: client.V1Node, health_status: str, taint: naming.Taint,
                         hyperpod: bool = False, fault: str | None = None) -> dict:
    """Label the node's health ``health_status`` and add ``taint``; with ``hyperpod`` (the setting
    hyperpod_labels) HyperPod's health label and taint beside them, and its fault labels for the
    health signal ``fault`` (``recovery.hyperpod_fault``)."""
    labels = {naming.LABEL_HEALTH: health_status}
    want = (taint, naming.SAGEMAKER_UNHEALTHY_TAINT) if hyperpod else (taint,)
    if hyperpod:
        labels.update(nodefacts.hyperpod_mirror(labels))
        if fault:
            labels.update(recovery.hyperpod_fault(fault))
    taints = merged_taints(current, want, {t.key for t in want})
    return guarded({"metadata": {"labels": labels}, "spec": {"taints": taint_body(taints)}}, uid_of(current))


def mark_healthy_patch(current: client.V1Node, hyperpod: bool = False) -> dict:
    """A node back from its reboot serves again: hyperplan's health label says ``Schedulable``,
    the unhealthy taints (hyperplan's and HyperPod's) and the operator's notes of its failure
    (health signal, eviction start) go; a HyperPod health label becomes ``Schedulable`` too when
    it says ``Unschedulable*`` (the request the reboot carried out, as HyperPod's own recovery
    leaves it) or ``hyperpod`` (the setting hyperpod_labels) has hyperplan write it."""
    labels: dict[str, str | None] = {naming.LABEL_HEALTH: naming.HEALTH_SCHEDULABLE}
    if hyperpod or nodefacts.is_unschedulable((current.metadata.labels or {}).get(naming.LABEL_SAGEMAKER_HEALTH)):
        labels[naming.LABEL_SAGEMAKER_HEALTH] = naming.HEALTH_SCHEDULABLE
    if hyperpod:  # the fault is over: its labels go
        labels.update({key: None for key in recovery.FAULT_LABELS if key in (current.metadata.labels or {})})
    keep = [t for t in taints_of(current)
            if t.key not in (naming.UNHEALTHY_TAINT.key, naming.SAGEMAKER_UNHEALTHY_TAINT.key)]
    return guarded({"metadata": {"labels": labels, "annotations": {
        ANNOTATION_HEALTH_SINCE: None, ANNOTATION_EVICTING_SINCE: None}},
        "spec": {"taints": taint_body(keep) or None}}, uid_of(current))


def promote_spare_patch(current: client.V1Node, replacing: str) -> dict:
    keep = [t for t in taints_of(current) if t.key != naming.SPARE_TAINT.key]
    return guarded({"metadata": {"labels": {naming.LABEL_ROLE: naming.ROLE_ACTIVE, naming.LABEL_REPLACES: replacing}},
                    "spec": {"taints": taint_body(keep) or None}}, uid_of(current))


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def ready_condition(node: client.V1Node) -> client.V1NodeCondition | None:
    return next((c for c in ((node.status.conditions if node.status else None) or []) if c.type == "Ready"), None)


def rebooting(node: client.V1Node) -> bool:
    """Whether the node is being rebooted: Ready=False with reason ``Rebooting``."""
    ready = ready_condition(node)
    return ready is not None and ready.status == "False" and ready.reason == REBOOT_REASON


def read_node_or_none(kube: Kube, node: str) -> client.V1Node | None:
    """The node of that name, None when it is gone (404)."""
    try:
        return kube.core.read_node(node)
    except ApiException as e:
        if e.status != 404:
            raise
        return None


def delete_guarded(delete: Callable[[client.V1DeleteOptions | None], Any], uid: str) -> str:
    """``delete(options)`` with ``uid`` as its precondition (none when ""): ``"deleted"``, ``"gone"``
    (404), or ``"another"`` (an object of that name with another uid now, left alone)."""
    options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)) if uid else None
    try:
        delete(options)
    except ApiException as e:
        if e.status == 404:
            return "gone"
        if gone_or_another(e):
            return "another"
        raise
    return "deleted"


def annotate_node(kube: Kube, node: str, annotations: dict[str, str | None], uid: str = "") -> None:
    """A merge patch of the node's annotations (None removes one), guarded by ``uid``: a node that is
    gone, or another node of that name, is no error and is not written."""
    try:
        kube.core.patch_node(node, guarded({"metadata": {"annotations": annotations}}, uid))
    except ApiException as e:
        if not gone_or_another(e):
            raise


def set_node_condition(kube: Kube, node_name: str, condition: dict[str, str], uid: str = "") -> None:
    """A strategic merge patch of the node's status: conditions merge by ``type``."""
    try:
        kube.core.patch_node_status(node_name, guarded({"status": {"conditions": [condition]}}, uid))
    except ApiException as e:
        if not gone_or_another(e):
            raise


OWN_CONDITION_PREFIX = OWN_PREFIX  # node conditions hyperplan sets (planning.groups)


def set_node_conditions_removed(kube: Kube, node_name: str, types: list[str]) -> None:
    """Remove conditions by type from the node's status (strategic merge ``$patch: delete``)."""
    try:
        kube.core.patch_node_status(node_name, {"status": {"conditions": [
            {"type": t, "$patch": "delete"} for t in types]}})
    except ApiException as e:
        if e.status != 404:
            raise


class AdoptionConflict(RuntimeError):
    """Every free node chosen was changed by another writer first; the next pass tries again."""


class NoFreeNode(RuntimeError):
    """The static pool has no node left for a group."""
