"""Node providers: where an instance group's nodes come from, behind one Protocol.

* :class:`KwokProvider` creates Node objects annotated ``kwok.x-k8s.io/node=fake`` with
  capacity that fits the instance type; KWOK keeps them Ready and runs their pods.
* :class:`StaticProvider` adopts existing nodes labelled ``node-restriction.kubernetes.io/hyperplan-pool=free`` of the
  right instance type and zone (kind's workers, say) and labels and taints them while the
  group holds them; when it lets go it hands them back as it found them (see
  :mod:`hyperplan.planning.lending`). It never creates or deletes a node.
* :class:`hyperplan.actuation.fakes.FakeProvider` keeps nodes in memory and records every call, for unit tests.

Besides creating, changing and releasing nodes, a provider carries out the health actions
of remediation on them (:meth:`NodeProvider.mark_unhealthy`, :meth:`NodeProvider.promote_spare`,
:meth:`NodeProvider.reboot`) and keeps the operator's notes on a node
(:meth:`NodeProvider.annotate`), so that everything the operator writes on a group's nodes goes
through one seam. What happens to the pods on a
node (eviction for a drain) goes through :class:`NodePods` (the API server, or a recording fake).

Every node a provider hands out carries the label ``hyperplan.dev/node-id`` with the
deterministic name planning chose (:class:`~hyperplan.planning.placement.NodeSpec`);
for KWOK it is also the node's name. Nodes are listed by the group label, but a label is
never proof of anything: ``create`` returns the Node's name and uid (:class:`MadeNode`), the
group keeps them in its status (``planning.ownership``), and every other call names the node
by that name and, with ``uid``, refuses to touch another node of the same name (a uid in a
patch and a uid precondition on a delete; the API server refuses either for another node).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from kubernetes import client
from kubernetes.client.rest import ApiException

from hyperplan.actuation.kube import Kube
from hyperplan.api.models import NodeClaimRef
from hyperplan.api.vocabulary import (
    ANNOTATION_CLAIM, ANNOTATION_EVICTING_SINCE, ANNOTATION_HEALTH_SINCE, OWN_PREFIX, to_rfc3339,
)
from hyperplan.planning import lending
from hyperplan.planning import naming
from hyperplan.planning import nodefacts
from hyperplan.planning import placement
from hyperplan.planning import recovery
from hyperplan.settings import DEFAULT_REBOOT_COMMAND, Settings

log = logging.getLogger(__name__)

LABEL_NODE_ID = lending.LABEL_NODE_ID
LABEL_POOL = lending.LABEL_POOL
POOL_FREE = lending.POOL_FREE
POOL_HELD = lending.POOL_HELD
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# A rebooted node's Ready condition until it is back (KWOK's stage and the real kubelet replace it).
REBOOT_REASON = "Rebooting"
# When a rebooted KWOK node is back: the stage hyperplan-node-reboot of
# src/hyperplan_dev/kwok-stages.yaml waits until then (an absolute time, so that the node's other
# changes meanwhile, each of which makes KWOK match its stages again, do not restart the wait).
ANNOTATION_REBOOT_UNTIL = f"{OWN_PREFIX}reboot-until"
DEFAULT_KWOK_REBOOT_SECONDS = 10.0

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


def _taint_body(taints: list[naming.Taint] | tuple[naming.Taint, ...]) -> list[dict[str, str]]:
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
    return guarded({"metadata": {"labels": labels}, "spec": {"taints": _taint_body(taints)}}, uid_of(current))


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
        "spec": {"taints": _taint_body(keep) or None}}, uid_of(current))


def promote_spare_patch(current: client.V1Node, replacing: str) -> dict:
    keep = [t for t in taints_of(current) if t.key != naming.SPARE_TAINT.key]
    return guarded({"metadata": {"labels": {naming.LABEL_ROLE: naming.ROLE_ACTIVE, naming.LABEL_REPLACES: replacing}},
                    "spec": {"taints": _taint_body(keep) or None}}, uid_of(current))


def kwok_node_body(spec: placement.NodeSpec, claim: str = "") -> dict[str, Any]:
    """The Node object :class:`KwokProvider` creates for ``spec`` (also what bench/provisioning.py's
    bare client creates, so that its floor makes exactly the operator's objects); ``claim``: the
    nonce whose digest the group's record holds (``planning.ownership``)."""
    annotations = {KWOK_ANNOTATION: "fake", **({ANNOTATION_CLAIM: claim} if claim else {})}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": spec.name,
                     "labels": {**spec.labels, LABEL_NODE_ID: spec.name, **lending.trusted_labels(spec.labels)},
                     "annotations": annotations},
        "spec": {"taints": _taint_body(spec.taints)},
        "status": {"capacity": node_capacity(spec.instance_type),
                   "allocatable": node_capacity(spec.instance_type)},
    }


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def ready_condition(node: client.V1Node) -> client.V1NodeCondition | None:
    return next((c for c in ((node.status.conditions if node.status else None) or []) if c.type == "Ready"), None)


def rebooting(node: client.V1Node) -> bool:
    """Whether the node is being rebooted: Ready=False with reason ``Rebooting``."""
    ready = ready_condition(node)
    return ready is not None and ready.status == "False" and ready.reason == REBOOT_REASON


def kwok_reboot_patches(uid: str, now: datetime, seconds: float) -> tuple[dict, dict]:
    """The two writes of a KWOK node's reboot: the annotation saying when it is back (a node
    patch), then Ready=False reason ``Rebooting`` (a status patch; the other conditions merge by
    type and stay). The annotation goes first, so that KWOK never sees the Rebooting node
    without its time (it would schedule the stage's fixed default until the annotation came).
    The annotation stays after the return: it says when the node last came back."""
    until = now + timedelta(seconds=seconds)
    meta = guarded({"metadata": {"annotations": {ANNOTATION_REBOOT_UNTIL: to_rfc3339(until, micro=True)}}}, uid)
    at = to_rfc3339(now)
    status = guarded({"status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": REBOOT_REASON,
        "message": f"rebooted by hyperplan; back at {to_rfc3339(until)}",
        "lastTransitionTime": at, "lastHeartbeatTime": at}]}}, uid)
    return meta, status


class KwokProvider:
    """Fake nodes that KWOK keeps alive on the local control plane (or any cluster with KWOK).

    ``reboot_seconds`` (``HYPERPLAN_KWOK_REBOOT_SECONDS``, 10 s): how long a rebooted node stays
    NotReady. The provider writes the Rebooting condition and the time it is back; KWOK's stage
    ``hyperplan-node-reboot`` (src/hyperplan_dev/kwok-stages.yaml) sets it Ready again then, and
    its heartbeat goes on as before. ``clock`` stamps the reboot (tests pass a fixed one)."""

    def __init__(self, kube: Kube, reboot_seconds: float = DEFAULT_KWOK_REBOOT_SECONDS,
                 clock: Callable[[], datetime] = _utcnow, hyperpod_labels: bool = False):
        self.kube = kube
        self.reboot_seconds = reboot_seconds
        self.clock = clock
        self.hyperpod_labels = hyperpod_labels  # the marks write HyperPod's label and taint too

    def create(self, spec: placement.NodeSpec, claim: str = "") -> MadeNode:
        """Create the node (carrying ``claim``); its name and uid. A node of that name that exists already (409) is
        no error, but its uid is not known (""): only a node this call made is recorded as a
        group's (``actuation.groups`` reports the other, Warning ``NodeNameTaken``)."""
        try:
            # The answer is not read into the client's model, only its uid out of the JSON:
            # parsing 288 Nodes of a group into the model cost the event loop's GIL more than
            # the calls themselves (bench/provisioning.py).
            answer = self.kube.core.create_node(kwok_node_body(spec, claim), _preload_content=False)
            made = json.loads(answer.read())
            answer.release_conn()
        except ApiException as e:
            if e.status != 409:
                raise
            return MadeNode(spec.name, "")
        return MadeNode(spec.name, str((made.get("metadata") or {}).get("uid") or ""))

    def update(self, node: str, spec: placement.NodeSpec, managed_keys: set[str], uid: str = "",
               lent: lending.LentRecord | None = None) -> lending.LentRecord | None:
        write_over_read(self.kube, node, lambda current: {
            "metadata": {"labels": dict(spec.labels)},
            "spec": {"taints": _taint_body(merged_taints(current, spec.taints, managed_keys)) or None}}, uid)
        return None

    def cordon(self, node: str, uid: str = "") -> bool:
        # That the cordon was the operator's is kept in the group's record (status.nodes[].cordoned),
        # not on the node, whose kubelet could write it.
        try:
            self.kube.core.patch_node(node, guarded({"spec": {"unschedulable": True}}, uid))
        except ApiException as e:
            if not gone_or_another(e):
                raise
            return False
        return True

    def release(self, node: str, uid: str = "", lent: lending.LentRecord | None = None,
                cordoned: bool = False) -> str:
        if delete_guarded(lambda options: self.kube.core.delete_node(node, body=options), uid) == "another":
            return f"{node} is another node now (its uid is not {uid}): left alone"
        return f"{node} deleted"

    def list(self, group: str) -> list[client.V1Node]:
        return self.kube.list_nodes(f"{naming.LABEL_GROUP}={naming.label_value(group)}")

    def mark_unhealthy(self, node: str, health_status: str, taint: naming.Taint,
                       last_seen: client.V1Node | None = None, fault: str | None = None) -> None:
        """The taints are replaced whole, so the patch is made from a read of the node. With
        ``last_seen`` (the node from the watch cache) that read is skipped: the patch carries its
        resourceVersion, and only a node changed since (409) is read again. In a storm of
        failures this halves the calls of the marks and promotions."""
        self._patch_from(node, last_seen, lambda n: mark_unhealthy_patch(n, health_status, taint, self.hyperpod_labels,
                                                                           fault))

    def promote_spare(self, node: str, replacing: str, last_seen: client.V1Node | None = None) -> None:
        self._patch_from(node, last_seen, lambda n: promote_spare_patch(n, replacing))

    def mark_healthy(self, node: str, last_seen: client.V1Node | None = None) -> None:
        self._patch_from(node, last_seen, lambda n: mark_healthy_patch(n, self.hyperpod_labels))

    def _patch_from(self, node: str, last_seen: client.V1Node | None,
                    make: Callable[[client.V1Node], dict]) -> None:
        """The patch ``make`` builds from the node (:func:`write_over_read`); it carries the uid of
        ``last_seen`` (the node the group holds), so a read that finds another node of that name
        writes nothing."""
        write_over_read(self.kube, node, make, uid_of(last_seen), last_seen)

    def annotate(self, node: str, annotations: dict[str, str | None], uid: str = "") -> None:
        try:
            self.kube.core.patch_node(node, guarded({"metadata": {"annotations": annotations}}, uid))
        except ApiException as e:
            if not gone_or_another(e):
                raise

    def set_condition(self, node: str, condition: dict[str, str], uid: str = "") -> None:
        set_node_condition(self.kube, node, condition, uid)

    def reboot(self, node: str, uid: str = "") -> None:
        """Read the node (a Rebooting one is left alone: its reboot is under way), then write
        :func:`kwok_reboot_patches` with the uid read, so that a node made again under the
        name between the read and the writes is not touched."""
        current = read_node_or_none(self.kube, node)
        if current is None or (uid and uid_of(current) != uid) or rebooting(current):
            return
        meta, status = kwok_reboot_patches(uid_of(current), self.clock(), self.reboot_seconds)
        try:
            self.kube.core.patch_node(node, meta)
            self.kube.core.patch_node_status(node, status)
        except ApiException as e:
            if not gone_or_another(e):
                raise


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


def set_node_condition(kube: Kube, node_name: str, condition: dict[str, str], uid: str = "") -> None:
    """A strategic merge patch of the node's status: conditions merge by ``type``."""
    try:
        kube.core.patch_node_status(node_name, guarded({"status": {"conditions": [condition]}}, uid))
    except ApiException as e:
        if not gone_or_another(e):
            raise


@dataclass(frozen=True)
class RebootJob:
    """The admin's reboot action for static nodes, run as a Job pinned to the node: ``image`` and
    ``command`` (chart values ``nodeReboot.job``; the default restarts the container runtime
    and the kubelet of a kind node), in ``namespace`` (the operator's), deleted
    ``ttl_seconds`` after it finished, failed after ``deadline_seconds`` if it has not."""

    image: str = Settings.model_fields["reboot_job_image"].default
    command: tuple[str, ...] = DEFAULT_REBOOT_COMMAND
    namespace: str = "default"
    ttl_seconds: int = 600
    deadline_seconds: int = 600


REBOOT_JOB_COMPONENT = "node-reboot"  # app.kubernetes.io/component of reboot Jobs and their pods
ANNOTATION_REBOOT_NODE = f"{OWN_PREFIX}reboot-node"
ANNOTATION_REBOOT_NODE_UID = f"{OWN_PREFIX}reboot-node-uid"
_JOB_NAME_MAX = 63  # the Job controller labels its pods job-name=<name>: a label value


def reboot_job_name(node: str, uid: str) -> str:
    """``reboot-<node>-<hash of node and uid>``, at most 63 characters: the same for a retry of
    one reboot of one node, another for a node made again under that name."""
    digest = hashlib.sha256(f"{node}/{uid}".encode()).hexdigest()[:10]
    prefix = re.sub(r"[^a-z0-9-]", "-", node.lower())[: _JOB_NAME_MAX - len("reboot--") - len(digest)]
    prefix = prefix.strip("-")
    return f"reboot-{prefix}-{digest}" if prefix else f"reboot-{digest}"


def reboot_job_body(job: RebootJob, node: str, uid: str) -> dict[str, Any]:
    """The Job that runs ``job``'s command on ``node``: bound to it by ``nodeName`` (no
    scheduler, so neither taints nor a cordon keep it off), tolerating every taint (a NoExecute
    one would evict it), in the host's PID namespace, privileged and root (to reach the host's
    systemd), run once (``backoffLimit`` 0: a reboot that failed is not tried again by the Job
    controller; the caller sees the node not come back and decides), without an API token."""
    labels = {"app.kubernetes.io/name": "hyperplan", "app.kubernetes.io/component": REBOOT_JOB_COMPONENT}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": reboot_job_name(node, uid), "namespace": job.namespace, "labels": labels,
                     "annotations": {ANNOTATION_REBOOT_NODE: node, ANNOTATION_REBOOT_NODE_UID: uid}},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": job.deadline_seconds,
            "ttlSecondsAfterFinished": job.ttl_seconds,
            "template": {
                "metadata": {"labels": labels, "annotations": {ANNOTATION_REBOOT_NODE: node}},
                "spec": {
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "hostPID": True,
                    "automountServiceAccountToken": False,
                    "tolerations": [{"operator": "Exists"}],
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "reboot", "image": job.image, "command": list(job.command),
                        # root: an image's USER (the operator's image runs as 10001) would
                        # leave nsenter and the host's systemctl without the rights they need.
                        "securityContext": {"privileged": True, "runAsUser": 0, "runAsGroup": 0},
                    }],
                },
            },
        },
    }


def job_finished(job: client.V1Job) -> bool:
    """Whether the Job has ended (condition Complete or Failed True)."""
    conditions = (job.status.conditions if job.status else None) or []
    return any(c.type in ("Complete", "Failed") and c.status == "True" for c in conditions)


class StaticProvider:
    """Existing nodes lent to groups: adopted from the free pool, handed back when released.

    What to adopt, and what adopting, cordoning and handing back write, is decided in
    :mod:`hyperplan.planning.lending`; this class reads the nodes and sends the patches.

    Adoption is safe against other writers: the patch carries the node's resourceVersion,
    so when two operators (or a stale read) reach for the same node one gets 409 and
    chooses again. Inside one process, adoptions in flight claim their node first, so the
    parallel creates of one pass, and groups adopting at the same moment, never reach for
    the same node.
    """

    ADOPT_ATTEMPTS = 5
    CORDON_ATTEMPTS = 3
    REBOOT_ATTEMPTS = 3

    BLOCKS_KEPT = 256  # blocks whose UltraServers' cloud UltraServers this process remembers

    def __init__(self, kube: Kube, me: lending.OperatorIdentity | None = None, reboot_job: RebootJob | None = None,
                 hyperpod_labels: bool = False, ultraserver_key: str = naming.TOPOLOGY_ULTRASERVER_ID):
        """``reboot_job``: the admin's reboot action (:class:`RebootJob`; the chart's values);
        ``hyperpod_labels``: the marks write HyperPod's health label and taint too;
        ``ultraserver_key``: the label under which a free node names its cloud UltraServer
        (the topology key hyperplan writes, settings.ultraserver_id_label)."""
        self.kube = kube
        self.hyperpod_labels = hyperpod_labels
        self.ultraserver_key = ultraserver_key
        self.me = me or lending.OperatorIdentity()
        self.reboot_job = reboot_job or RebootJob(namespace=self.me.namespace or "default")
        self._claims: set[str] = set()
        # By block (its reserved-capacity label): hyperplan's UltraServer -> the cloud's, as this
        # process's adoptions chose them (the creates of one pass run together, before the group's
        # record shows the first choice). Per block: a cloud UltraServer an ended block used is
        # free for the next one.
        self._bound: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def _read(self, node: str, uid: str = "") -> client.V1Node | None:
        """The node of that name, if it is the one the group holds (``uid``; "" takes any)."""
        current = read_node_or_none(self.kube, node)
        return current if current is not None and (not uid or uid_of(current) == uid) else None

    def operator_nodes(self) -> set[str]:
        """Nodes that run a pod of the operator (this one or another replica)."""
        nodes = {self.me.node_name} if self.me.node_name else set()
        if self.me.selector:
            if self.me.namespace:
                pods = self.kube.core.list_namespaced_pod(self.me.namespace, label_selector=self.me.selector).items
            else:
                pods = self.kube.core.list_pod_for_all_namespaces(label_selector=self.me.selector).items
            nodes |= {p.spec.node_name for p in pods if p.spec and p.spec.node_name}
        return nodes

    def free_nodes(self, instance_type: str, zone: str) -> list[lending.PoolNode]:
        return [pool_node(n) for n in self.kube.list_nodes(
            f"{LABEL_POOL}={POOL_FREE},{naming.LABEL_INSTANCE_TYPE}={instance_type},{naming.LABEL_ZONE}={zone}")]

    def create(self, spec: placement.NodeSpec, claim: str = "") -> MadeNode:
        """Adopt a free node for ``spec``: the adopted node's name and uid, and what it looked
        like before (the group keeps it; nothing of it is written on the node but ``claim``).

        Raises :class:`NoFreeNode` when no free node may be lent (saying why each was left
        out) and :class:`AdoptionConflict` when every attempt lost a race (try again later).
        A node that already carries ``spec``'s id is not taken for it: a label proves nothing.
        """
        operator_nodes = self.operator_nodes()
        for attempt in range(1, self.ADOPT_ATTEMPTS + 1):
            free = self.free_nodes(spec.instance_type, spec.availability_zone)
            with self._lock:
                membership = self._membership(spec)
                choice = lending.choose_free_node(spec.name, free, operator_nodes, self._claims, membership)
                if choice.node is None:
                    break
                self._claims.add(choice.node.name)
                self._bind(spec, membership, choice.node)
            node = choice.node
            try:
                lent = lending.adoption_patch(node, spec.name, spec.labels, spec.taints, {t.key for t in spec.taints})
                if claim:
                    lent.patch["metadata"].setdefault("annotations", {})[ANNOTATION_CLAIM] = claim
                self.kube.core.patch_node(node.name, lent.patch)
                return MadeNode(node.name, node.uid or "", lent.record)
            except ApiException as e:
                if e.status != 409:
                    raise
                log.info("node %s changed while %s adopted it (attempt %d, 409 Conflict); choosing again",
                         node.name, spec.name, attempt)
            finally:
                with self._lock:
                    self._claims.discard(node.name)
        else:
            raise AdoptionConflict(f"{spec.name}: each of {self.ADOPT_ATTEMPTS} free nodes chosen changed "
                                   "before it could be adopted; trying again on the next pass")
        why = f": {choice.explain()}" if choice.skipped else ""
        raise NoFreeNode(f"no free node of {spec.instance_type} in {spec.availability_zone} "
                         f"(label {LABEL_POOL}={POOL_FREE}) for {spec.name}{why}")

    def _membership(self, spec: placement.NodeSpec) -> lending.Membership | None:
        """What ``spec``'s UltraServer asks of the node it takes (under the lock): the group's
        record wins over this process's own choices."""
        if not spec.ultraserver_id:
            return None
        return lending.Membership(self.ultraserver_key, spec.ultraserver_id,
                                  {**self._bound.get(self._block(spec), {}), **spec.cloud_ultraservers})

    @staticmethod
    def _block(spec: placement.NodeSpec) -> str:
        return spec.labels.get(naming.LABEL_RESERVED_CAPACITY, "")

    def _bind(self, spec: placement.NodeSpec, membership: lending.Membership | None, node: lending.PoolNode) -> None:
        """Remember the cloud UltraServer the first node of hyperplan's came from (under the lock)."""
        cloud = membership.cloud_of(node) if membership is not None else None
        if cloud is None or membership.ultraserver in membership.bound:
            return
        block = self._block(spec)
        if block not in self._bound and len(self._bound) >= self.BLOCKS_KEPT:
            self._bound.pop(next(iter(self._bound)))  # the oldest: that block is long over
        self._bound.setdefault(block, {})[membership.ultraserver] = cloud

    def update(self, node: str, spec: placement.NodeSpec, managed_keys: set[str], uid: str = "",
               lent: lending.LentRecord | None = None) -> lending.LentRecord | None:
        made: list[lending.LentRecord] = []

        def patch(current: client.V1Node) -> dict:
            change = lending.held_update_patch(pool_node(current), spec.name, spec.labels, spec.taints, managed_keys,
                                               lent)
            made[:] = [change.record]
            return change.patch

        return made[0] if write_over_read(self.kube, node, patch, uid) else lent

    def cordon(self, node: str, uid: str = "") -> bool:
        for _ in range(self.CORDON_ATTEMPTS):
            current = self._read(node, uid)
            patch = lending.cordon_patch(pool_node(current)) if current is not None else None
            if patch is None:
                return False
            try:
                self.kube.core.patch_node(current.metadata.name, patch)
                return True
            except ApiException as e:
                if e.status != 409:
                    raise
        return False

    def release(self, node: str, uid: str = "", lent: lending.LentRecord | None = None,
                cordoned: bool = False) -> str:
        read: list[tuple[client.V1Node, lending.HandBack]] = []

        def patch(current: client.V1Node) -> dict:
            read[:] = [(current, lending.hand_back(pool_node(current), lent, cordoned))]
            return read[0][1].patch

        if not write_over_read(self.kube, node, patch, uid):
            return f"{node} already handed back"
        current, back = read[0]
        ours = [c.type for c in (current.status.conditions if current.status else None) or []
                if c.type.startswith(OWN_CONDITION_PREFIX)]
        if ours:  # a condition hyperplan set for the group (the checkpoint signal) goes with it
            set_node_conditions_removed(self.kube, current.metadata.name, ours)
        return back.message

    def list(self, group: str) -> list[client.V1Node]:
        return self.kube.list_nodes(f"{naming.LABEL_GROUP}={naming.label_value(group)}")

    def mark_unhealthy(self, node: str, health_status: str, taint: naming.Taint,
                       last_seen: client.V1Node | None = None, fault: str | None = None) -> None:
        # Read again (no last_seen): the taints are replaced whole, over the resourceVersion read.
        write_over_read(self.kube, node, lambda n: mark_unhealthy_patch(n, health_status, taint, self.hyperpod_labels,
                                                                        fault), uid_of(last_seen))

    def promote_spare(self, node: str, replacing: str, last_seen: client.V1Node | None = None) -> None:
        write_over_read(self.kube, node, lambda n: promote_spare_patch(n, replacing), uid_of(last_seen))

    def mark_healthy(self, node: str, last_seen: client.V1Node | None = None) -> None:
        write_over_read(self.kube, node, lambda n: mark_healthy_patch(n, self.hyperpod_labels), uid_of(last_seen))

    def annotate(self, node: str, annotations: dict[str, str | None], uid: str = "") -> None:
        try:
            self.kube.core.patch_node(node, guarded({"metadata": {"annotations": annotations}}, uid))
        except ApiException as e:
            if not gone_or_another(e):
                raise

    def set_condition(self, node: str, condition: dict[str, str], uid: str = "") -> None:
        set_node_condition(self.kube, node, condition, uid)

    def reboot(self, node: str, uid: str = "") -> None:
        """Create the node's reboot Job (:func:`reboot_job_body`). One that exists already (409)
        is this reboot, under way, while it has not finished; a finished one is a past reboot:
        it is deleted (its uid as precondition) and the Job made again."""
        current = self._read(node, uid)
        if current is None:
            return
        body = reboot_job_body(self.reboot_job, current.metadata.name, uid_of(current))
        name, namespace = body["metadata"]["name"], self.reboot_job.namespace
        for _ in range(self.REBOOT_ATTEMPTS):
            try:
                self.kube.batch.create_namespaced_job(namespace, body)
                log.info("node %s: reboot Job %s/%s created", node, namespace, name)
                return
            except ApiException as e:
                if e.status != 409:
                    raise
            try:
                existing = self.kube.batch.read_namespaced_job(name, namespace)
            except ApiException as e:
                if e.status != 404:
                    raise
                continue  # it went meanwhile (its TTL): create it again
            if not job_finished(existing):
                return
            try:
                self.kube.batch.delete_namespaced_job(name, namespace, body=client.V1DeleteOptions(
                    propagation_policy="Background", preconditions=client.V1Preconditions(uid=existing.metadata.uid)))
            except ApiException as e:
                if e.status not in (404, 409):
                    raise
        log.warning("node %s: reboot Job %s/%s kept changing; not rebooted now", node, namespace, name)


OWN_CONDITION_PREFIX = OWN_PREFIX  # node conditions hyperplan sets (planning.groups)


def set_node_conditions_removed(kube: Kube, node_name: str, types: list[str]) -> None:
    """Remove conditions by type from the node's status (strategic merge ``$patch: delete``)."""
    try:
        kube.core.patch_node_status(node_name, {"status": {"conditions": [
            {"type": t, "$patch": "delete"} for t in types]}})
    except ApiException as e:
        if e.status != 404:
            raise


def pool_node(node: client.V1Node) -> lending.PoolNode:
    """A node as :mod:`hyperplan.planning.lending` sees it."""
    meta, spec, status = node.metadata, node.spec, node.status
    return lending.PoolNode(
        name=meta.name, resource_version=meta.resource_version or "", uid=meta.uid, labels=dict(meta.labels or {}),
        annotations=dict(meta.annotations or {}), taints=taints_of(node),
        unschedulable=bool(spec and spec.unschedulable),
        conditions={c.type: c.status for c in (status.conditions or [])} if status else {},
        deleting=meta.deletion_timestamp is not None)


class AdoptionConflict(RuntimeError):
    """Every free node chosen was changed by another writer first; the next pass tries again."""


class NoFreeNode(RuntimeError):
    """The static pool has no node left for a group."""


def providers(kube: Kube, me: lending.OperatorIdentity | None = None,
              settings: Settings | None = None) -> dict[str, NodeProvider]:
    """The providers by name, with their reboot settings from ``settings`` (unset: read from the
    environment, ``HYPERPLAN_KWOK_REBOOT_SECONDS`` and ``HYPERPLAN_REBOOT_JOB_*``, which the
    chart sets). Reboot Jobs run in the operator's namespace (``me``), else ``default``."""
    s = settings or Settings()
    job = RebootJob(image=s.reboot_job_image, command=tuple(s.reboot_job_command),
                    namespace=(me.namespace if me else None) or s.pod_namespace or "default",
                    ttl_seconds=s.reboot_job_ttl_seconds, deadline_seconds=s.reboot_job_deadline_seconds)
    from hyperplan.actuation.karpenter import KarpenterProvider  # it builds on KwokProvider
    hyperpod = s.hyperpod_labels
    return {"kwok": KwokProvider(kube, s.kwok_reboot_seconds, hyperpod_labels=hyperpod),
            "static": StaticProvider(kube, me, job, hyperpod_labels=hyperpod, ultraserver_key=s.ultraserver_id_label),
            "karpenter": KarpenterProvider(kube, s.karpenter_node_class, s.karpenter_capacity_type,
                                           s.kwok_reboot_seconds, job, hyperpod_labels=hyperpod,
                                           reservation_label=s.karpenter_reservation_label)}


# Each provider satisfies the Protocol, stated the way Go's `var _ NodeProvider = KwokProvider{}` is:
# a type checker rejects these lines if a method goes missing or changes its signature.
_kwok: type[NodeProvider] = KwokProvider
_static: type[NodeProvider] = StaticProvider


# --------------------------------------------------------------------------- drain


@dataclass(frozen=True)
class DrainProgress:
    pods_left: int  # pods the drain still waits for (evicted this pass or already terminating)
    blocked: int  # evictions refused by a PodDisruptionBudget this pass
    left_alone: dict[str, str] = field(default_factory=dict)  # namespace/name -> why it stays


def pod_view(pod: client.V1Pod) -> lending.PodView:
    meta = pod.metadata
    return lending.PodView(
        name=meta.name, namespace=meta.namespace, node_name=pod.spec.node_name if pod.spec else None,
        labels=dict(meta.labels or {}), owner_kinds=tuple(o.kind for o in (meta.owner_references or [])),
        mirror="kubernetes.io/config.mirror" in (meta.annotations or {}),
        terminating=meta.deletion_timestamp is not None)


HOSTNAME_LABEL = "kubernetes.io/hostname"


def pods_on(kube: Kube, node_name: str, pinned: Mapping[str, list[client.V1Pod]] | None = None,
            unbound: bool = True) -> list[client.V1Pod]:
    """The pods bound to ``node_name``, and (``unbound``) the pods not bound yet that are pinned to
    it by a ``nodeSelector`` on its hostname: a drain waits for and evicts both. ``pinned``: the
    pinned pods by node (:func:`pinned_pods`) when the caller listed them once for many nodes.

    A pinned pod is one a scheduler has placed in advance: Kueue's topology ungater pins each pod
    of a TAS workload to a node of its assignment. When a workload loses two nodes at once, the
    Job's replacement for the first can be pinned to the second before Kueue has moved the
    assignment off it; Kueue v0.17 fails such a stray pod only while that node exists (its node
    controller, on a node that is gone, only marks it unhealthy). A pinned pod left behind a node
    that hyperplan removed stays Pending for good (seen in bench/recovery_storm.py); evicted here,
    it carries ``DisruptionTarget`` (no retry spent) and its Job makes the next one, which Kueue
    pins by the current assignment."""
    bound = kube.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}").items
    if not unbound:
        return bound
    return bound + list((pinned if pinned is not None else pinned_pods(kube)).get(node_name, ()))


def pinned_pods(kube: Kube) -> dict[str, list[client.V1Pod]]:
    """The Pending pods not bound yet that a ``nodeSelector`` pins to one node by its hostname, by
    that node: one listing of the cluster's unbound pods serves every node (a field selector
    cannot select by ``nodeSelector``)."""
    out: dict[str, list[client.V1Pod]] = {}
    for pod in kube.core.list_pod_for_all_namespaces(field_selector="spec.nodeName=,status.phase=Pending").items:
        host = ((pod.spec.node_selector if pod.spec else None) or {}).get(HOSTNAME_LABEL)
        if host:
            out.setdefault(host, []).append(pod)
    return out


def pod_ref(pod: client.V1Pod) -> dict[str, Any]:
    meta = pod.metadata
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": meta.name, "namespace": meta.namespace, "uid": meta.uid}}


def annotate_pods(kube: Kube, node_name: str, annotations: dict[str, str],
                  me: lending.OperatorIdentity | None = None) -> list[dict[str, Any]]:
    """Annotate the pods on ``node_name`` that a drain would evict and that lack ``annotations``
    (a pod that went meanwhile is skipped); the references of the pods annotated."""
    # Only the pods bound to it: one that waits for the node has no work to save.
    pods = {(p.metadata.namespace, p.metadata.name): p for p in pods_on(kube, node_name, unbound=False)}
    sort = lending.sort_pods_for_drain([pod_view(p) for p in pods.values()], me or lending.OperatorIdentity())
    done = []
    for view in sort.evict:
        pod = pods[(view.namespace, view.name)]
        have = pod.metadata.annotations or {}
        if all(have.get(k) == v for k, v in annotations.items()):
            continue
        try:
            kube.core.patch_namespaced_pod(view.name, view.namespace, {"metadata": {"annotations": annotations}})
        except ApiException as e:
            if e.status != 404:
                raise
            continue
        done.append(pod_ref(pod))
    return done


def force_delete_pods(kube: Kube, node_name: str, condition: dict[str, str],
                      me: lending.OperatorIdentity | None = None,
                      pinned: Mapping[str, list[client.V1Pod]] | None = None) -> list[str]:
    """Delete the pods a drain of dead node ``node_name`` waits for, the way the pod garbage
    collector deletes orphans: first the status (``condition``, and phase ``Failed`` unless the
    pod already ended), so that a Job's ``podFailurePolicy`` sees the disruption and its
    controller lets go of the pod, then a delete with grace period 0 (no kubelet is left to wait
    for). Every pod is marked before its delete, an ended one too: the chart's pod policy lets
    the operator delete only the pods that carry the mark (docs/security.md, "Admission")."""
    pods = {(p.metadata.namespace, p.metadata.name): p for p in pods_on(kube, node_name, pinned)}
    sort = lending.sort_pods_for_drain([pod_view(p) for p in pods.values()], me or lending.OperatorIdentity())
    gone = []
    for view in (*sort.evict, *sort.terminating):
        pod = pods[(view.namespace, view.name)]
        ended = (pod.status.phase if pod.status else None) in ("Succeeded", "Failed")
        mark = {"conditions": [condition]} if ended else {"phase": "Failed", "conditions": [condition]}
        try:
            kube.core.patch_namespaced_pod_status(view.name, view.namespace, {"status": mark})
            kube.core.delete_namespaced_pod(view.name, view.namespace,
                                            body=client.V1DeleteOptions(grace_period_seconds=0))
        except ApiException as e:
            if e.status != 404:
                raise
            continue
        gone.append(view.ref)
    return gone


def evict_pods(kube: Kube, node_name: str, me: lending.OperatorIdentity | None = None,
               pinned: Mapping[str, list[client.V1Pod]] | None = None) -> DrainProgress:
    """Ask the Eviction API once to evict every pod on ``node_name`` that a drain should evict.

    The operator's own pods, DaemonSet pods and static pods stay
    (:func:`hyperplan.planning.lending.sort_pods_for_drain`); PDB refusals are counted.
    """
    sort = lending.sort_pods_for_drain([pod_view(p) for p in pods_on(kube, node_name, pinned)],
                                       me or lending.OperatorIdentity())
    blocked = 0
    for pod in sort.evict:
        eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod.name, namespace=pod.namespace))
        try:
            kube.core.create_namespaced_pod_eviction(pod.name, pod.namespace, eviction)
        except ApiException as e:
            if e.status == 429:  # a PodDisruptionBudget says not now
                blocked += 1
            elif e.status != 404:
                raise
    return DrainProgress(pods_left=sort.waiting_for, blocked=blocked, left_alone=dict(sort.left_alone))


@runtime_checkable
class NodePods(Protocol):
    """What the operator does to the pods on a node (by the node's name)."""

    def evict(self, node_name: str) -> DrainProgress:
        """Ask once to evict every pod a drain should evict (see :func:`evict_pods`)."""
        ...

    def annotate(self, node_name: str, annotations: dict[str, str]) -> list[dict[str, Any]]:
        """Set ``annotations`` on every pod of the node that a drain would evict (the operator's
        own, DaemonSet and static pods are left alone) and that lacks them; references
        (``apiVersion``, ``kind``, ``metadata``) of the pods annotated now, for their events."""
        ...

    def count(self, node_name: str) -> int:
        """The pods a drain of the node waits for (to evict, or terminating already)."""
        ...

    def force_delete(self, node_name: str, condition: dict[str, str]) -> list[str]:
        """For a dead node: mark each pod a drain waits for ``Failed`` with ``condition`` (a
        ``DisruptionTarget``), then delete it with grace period 0; the pods deleted
        (``namespace/name``)."""
        ...


PINNED_FRESH = 1.0  # seconds one listing of the pinned pods serves the drains of one pass


@dataclass
class KubeNodePods:
    """Pods on the API server, through the Eviction API.

    A pass drains or counts many nodes at once (from several threads): the cluster's unbound
    pinned pods (:func:`pinned_pods`) are listed once for all of them, and that listing serves
    for :data:`PINNED_FRESH` seconds; the pods bound to each node are listed per node (a field
    selector the API server answers from its index)."""

    kube: Kube
    me: lending.OperatorIdentity = field(default_factory=lending.OperatorIdentity)
    clock: Callable[[], float] = time.monotonic
    _pinned: tuple[float, dict[str, list[client.V1Pod]]] | None = field(default=None, repr=False)
    _pinned_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def pinned(self) -> dict[str, list[client.V1Pod]]:
        with self._pinned_lock:
            now = self.clock()
            if self._pinned is None or now - self._pinned[0] >= PINNED_FRESH:
                self._pinned = (now, pinned_pods(self.kube))
            return self._pinned[1]

    def evict(self, node_name: str) -> DrainProgress:
        return evict_pods(self.kube, node_name, self.me, self.pinned())

    def annotate(self, node_name: str, annotations: dict[str, str]) -> list[dict[str, Any]]:
        return annotate_pods(self.kube, node_name, annotations, self.me)

    def count(self, node_name: str) -> int:
        return lending.sort_pods_for_drain([pod_view(p) for p in pods_on(self.kube, node_name, self.pinned())],
                                           self.me).waiting_for

    def force_delete(self, node_name: str, condition: dict[str, str]) -> list[str]:
        return force_delete_pods(self.kube, node_name, condition, self.me, self.pinned())


_kube_pods: type[NodePods] = KubeNodePods
