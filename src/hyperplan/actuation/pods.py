"""What happens to the pods on a group's nodes: eviction for a drain, the operator's notes on
pods, their forced deletion (:class:`NodePods`, :class:`KubeNodePods`), and the admin's reboot
action for a real node, run as a Job pinned to it (:class:`RebootJob`)."""

from __future__ import annotations

import hashlib
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from kubernetes import client
from kubernetes.client.rest import ApiException

from hyperplan.actuation.kube import Kube
from hyperplan.api.vocabulary import (
    ANNOTATION_REBOOT_NODE,
    ANNOTATION_REBOOT_NODE_UID,
)
from hyperplan.planning import lending
from hyperplan.settings import DEFAULT_REBOOT_COMMAND, Settings


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


_kube_pods: type[NodePods] = KubeNodePods  # it satisfies the Protocol
