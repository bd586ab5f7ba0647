"""KubeNodePods: one listing of the cluster's pinned pods serves the drains of a pass; accelerators by either name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kubernetes import client

from hyperplan.actuation.pods import PINNED_FRESH, KubeNodePods, pinned_pods
from hyperplan.actuation.providers.base import accelerators, node_capacity


def pod(name: str, node: str = "", pinned_to: str = "") -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="ns", uid=f"uid-{name}", owner_references=[
            client.V1OwnerReference(api_version="batch/v1", kind="Job", name="j", uid="j", controller=True)]),
        spec=client.V1PodSpec(containers=[], node_name=node or None,
                              node_selector={"kubernetes.io/hostname": pinned_to} if pinned_to else None),
        status=client.V1PodStatus(phase="Running" if node else "Pending"))


class Core:
    """list_pod_for_all_namespaces answering the two field selectors the drains use; records them."""

    def __init__(self, pods: list[client.V1Pod]) -> None:
        self.pods, self.calls = pods, []

    def list_pod_for_all_namespaces(self, field_selector: str) -> SimpleNamespace:
        self.calls.append(field_selector)
        if field_selector.startswith("spec.nodeName=,"):
            return SimpleNamespace(items=[p for p in self.pods if not p.spec.node_name])
        node = field_selector.removeprefix("spec.nodeName=")
        return SimpleNamespace(items=[p for p in self.pods if p.spec.node_name == node])


PODS = [pod("a", node="n1"), pod("b", pinned_to="n1"), pod("c", pinned_to="n2"), pod("d"), pod("e", node="n2")]


def test_pinned_pods_are_grouped_by_the_node_they_are_pinned_to() -> None:
    found = pinned_pods(SimpleNamespace(core=Core(PODS)))
    assert {n: [p.metadata.name for p in ps] for n, ps in found.items()} == {"n1": ["b"], "n2": ["c"]}


def test_one_listing_of_pinned_pods_serves_many_nodes_until_it_is_old() -> None:
    now = [0.0]
    core = Core(PODS)
    pods = KubeNodePods(SimpleNamespace(core=core), clock=lambda: now[0])
    assert pods.count("n1") == 2  # bound a, pinned b
    assert pods.count("n2") == 2  # bound e, pinned c
    assert pods.count("n3") == 0
    unbound = [c for c in core.calls if c.startswith("spec.nodeName=,")]
    assert len(unbound) == 1, core.calls
    now[0] += PINNED_FRESH
    pods.count("n1")
    assert len([c for c in core.calls if c.startswith("spec.nodeName=,")]) == 2


def test_the_checkpoint_signal_lists_only_the_pods_bound_to_the_node() -> None:
    core = Core(PODS)

    def patch(name: str, namespace: str, body: dict) -> None:
        core.calls.append(f"patch {name}")

    core.patch_namespaced_pod = patch
    annotated = KubeNodePods(SimpleNamespace(core=core)).annotate("n1", {"x": "y"})
    assert [r["metadata"]["name"] for r in annotated] == ["a"]
    assert core.calls == ["spec.nodeName=n1", "patch a"]


@pytest.mark.parametrize("instance_type, found", [
    ("ml.p5.48xlarge", ("nvidia.com/gpu", 8)),
    ("p5.48xlarge", ("nvidia.com/gpu", 8)),  # EC2's name, as an EC2 Capacity Block's nodes carry it
    ("p6e-gb200.36xlarge", ("nvidia.com/gpu", 4)),
    ("m5.large", None),
], ids=["sagemaker-name", "ec2-name", "ec2-ultraserver-instance", "no-accelerator"])
def test_accelerators_are_known_by_either_name(instance_type, found) -> None:
    assert accelerators(instance_type) == found
    assert (node_capacity(instance_type).get(found[0]) if found else None) == (str(found[1]) if found else None)
