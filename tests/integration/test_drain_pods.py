"""A drain's pods against the real API server and Job controller of the local plane.

A drain waits for and evicts the pods bound to the node and the pods not bound yet that a
scheduler pinned to it by its hostname (Kueue's topology ungater does so): a pinned pod left
behind a node that hyperplan removed stays Pending for good (bench/recovery_storm.py found one
under Kueue TAS). Evicted, it spends none of its Job's retries (``DisruptionTarget``).
"""

from __future__ import annotations

import json
import uuid

import pytest

from hyperplan.actuation.kube import Kube, api_client
from hyperplan.actuation.pods import KubeNodePods, pods_on
from hyperplan.actuation.providers.kwok import KwokProvider
from hyperplan.planning import naming, placement
from tests.kube import Kubectl, eventually


@pytest.fixture
def kube(plane) -> Kube:
    return Kube(api_client(str(plane.kubeconfig)))


@pytest.fixture
def cordoned_node(crds: Kubectl, kube: Kube):
    """A Ready KWOK node that is cordoned: a pod pinned to it by hostname stays Pending."""
    name = f"hp-drain-{uuid.uuid4().hex[:6]}"
    spec = placement.NodeSpec(name, {naming.LABEL_GROUP: "drain-g"}, (), "active", None,
                              "ml.p5.48xlarge", "us-drain-1a")
    made = KwokProvider(kube).create(spec)
    assert made.uid and KwokProvider(kube).cordon(name, made.uid)
    yield name
    crds.delete("node", name, "--wait=false")


def job(name: str, namespace: str, node: str) -> dict:
    """A one-pod Job pinned to ``node`` by hostname that a counted failure would fail, with the
    podFailurePolicy docs/failover.md recommends (a disruption spends no retry)."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace}, "spec": {
        "backoffLimit": 0,
        "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
        "template": {"spec": {
            "restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "train", "image": "registry.invalid/train:1"}]}}}}


def pod_names(kube: Kube, ns: str, job_name: str) -> dict[str, str]:
    return {p.metadata.name: p.metadata.uid
            for p in kube.core.list_namespaced_pod(ns, label_selector=f"job-name={job_name}").items
            if p.metadata.deletion_timestamp is None}


def test_a_pod_pinned_to_a_draining_node_is_evicted_without_spending_a_retry(
        crds: Kubectl, kube: Kube, namespace: str, cordoned_node: str) -> None:
    other = f"hp-elsewhere-{uuid.uuid4().hex[:6]}"  # pinned to a node that does not exist
    crds.create(job("pinned", namespace, cordoned_node))
    crds.create(job("elsewhere", namespace, other))
    first = eventually(lambda: pod_names(kube, namespace, "pinned") or None, timeout=30, what="the Job's pod")
    eventually(lambda: pod_names(kube, namespace, "elsewhere") or None, timeout=30, what="the other Job's pod")
    # Pending (the node is cordoned), not bound: yet a drain of the node counts it.
    pods = KubeNodePods(kube)
    assert [p.metadata.name for p in pods_on(kube, cordoned_node)] == list(first)
    assert pods.count(cordoned_node) == 1
    # A pod pinned to a node that is gone is that node's, not this one's.
    assert [p.metadata.labels["job-name"] for p in pods_on(kube, other)] == ["elsewhere"]

    progress = pods.evict(cordoned_node)
    assert progress.blocked == 0
    # Evicted: the Job controller makes the next pod, and the eviction spent no retry.
    eventually(lambda: (now := pod_names(kube, namespace, "pinned")) and not set(now) & set(first),
               timeout=30, what="the pinned pod evicted and its Job's next pod made")
    status = json.loads(crds.run("get", "job", "pinned", "-n", namespace, "-o", "json").stdout)["status"]
    assert not status.get("failed"), status
    assert not [c for c in status.get("conditions") or [] if c["type"] == "Failed" and c["status"] == "True"], status
    # The other Job's pod was left alone.
    assert pod_names(kube, namespace, "elsewhere")
