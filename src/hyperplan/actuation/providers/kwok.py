"""Fake nodes that KWOK keeps alive (:class:`KwokProvider`): created and deleted by the operator,
rebooted by a condition and a time that KWOK's stage reads."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, Callable

from kubernetes import client
from kubernetes.client.rest import ApiException

from hyperplan.actuation.kube import Kube
from hyperplan.actuation.providers.base import (
    LABEL_NODE_ID,
    REBOOT_REASON,
    MadeNode,
    NodeProvider,
    annotate_node,
    delete_guarded,
    gone_or_another,
    guarded,
    mark_healthy_patch,
    mark_unhealthy_patch,
    merged_taints,
    node_capacity,
    promote_spare_patch,
    read_node_or_none,
    rebooting,
    set_node_condition,
    taint_body,
    uid_of,
    utcnow,
    write_over_read,
)
from hyperplan.api.vocabulary import (
    ANNOTATION_CLAIM,
    ANNOTATION_REBOOT_UNTIL,
    KWOK_ANNOTATION,
    LABEL_TRUSTED_KWOK,
    to_rfc3339,
)
from hyperplan.planning import lending, naming, placement

DEFAULT_KWOK_REBOOT_SECONDS = 10.0


def kwok_node_body(spec: placement.NodeSpec, claim: str = "") -> dict[str, Any]:
    """The Node object :class:`KwokProvider` creates for ``spec`` (also what bench/provisioning.py's
    bare client creates, so that its floor makes exactly the operator's objects); ``claim``: the
    nonce whose digest the group's record holds (``planning.ownership``)."""
    annotations = {KWOK_ANNOTATION: "fake", **({ANNOTATION_CLAIM: claim} if claim else {})}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": spec.name,
                     "labels": {**spec.labels, LABEL_NODE_ID: spec.name, **lending.trusted_labels(spec.labels),
                                LABEL_TRUSTED_KWOK: "true"},
                     "annotations": annotations},
        "spec": {"taints": taint_body(spec.taints)},
        "status": {"capacity": node_capacity(spec.instance_type),
                   "allocatable": node_capacity(spec.instance_type)},
    }


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
                 clock: Callable[[], datetime] = utcnow, hyperpod_labels: bool = False):
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
            "spec": {"taints": taint_body(merged_taints(current, spec.taints, managed_keys)) or None}}, uid)
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
        annotate_node(self.kube, node, annotations, uid)

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


# Each provider satisfies the Protocol, stated the way Go's `var _ NodeProvider = KwokProvider{}` is:
# a type checker rejects these lines if a method goes missing or changes its signature.
_kwok: type[NodeProvider] = KwokProvider
