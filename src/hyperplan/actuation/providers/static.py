"""Existing nodes lent to groups (:class:`StaticProvider`): adopted from the free pool, handed back
as they were found (what to adopt and what the patches say is :mod:`hyperplan.planning.lending`)."""

from __future__ import annotations

import logging
import threading

from kubernetes import client
from kubernetes.client.rest import ApiException

from hyperplan.actuation.kube import Kube
from hyperplan.actuation.pods import RebootJob, job_finished, reboot_job_body
from hyperplan.actuation.providers.base import (
    LABEL_POOL,
    OWN_CONDITION_PREFIX,
    POOL_FREE,
    AdoptionConflict,
    MadeNode,
    NodeProvider,
    NoFreeNode,
    annotate_node,
    mark_healthy_patch,
    mark_unhealthy_patch,
    promote_spare_patch,
    read_node_or_none,
    set_node_condition,
    set_node_conditions_removed,
    taints_of,
    uid_of,
    write_over_read,
)
from hyperplan.api.vocabulary import (
    ANNOTATION_CLAIM,
)
from hyperplan.planning import lending, naming, placement

log = logging.getLogger(__name__)


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
        annotate_node(self.kube, node, annotations, uid)

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


def pool_node(node: client.V1Node) -> lending.PoolNode:
    """A node as :mod:`hyperplan.planning.lending` sees it."""
    meta, spec, status = node.metadata, node.spec, node.status
    return lending.PoolNode(
        name=meta.name, resource_version=meta.resource_version or "", uid=meta.uid, labels=dict(meta.labels or {}),
        annotations=dict(meta.annotations or {}), taints=taints_of(node),
        unschedulable=bool(spec and spec.unschedulable),
        conditions={c.type: c.status for c in (status.conditions or [])} if status else {},
        deleting=meta.deletion_timestamp is not None)


_static: type[NodeProvider] = StaticProvider
