"""NodeProvider.reboot against the real API server, KWOK and the Job controller of the local plane.

A KWOK node made by KwokProvider.create goes NotReady at once, stays so (KWOK's heartbeat does not
write over the Rebooting condition), and comes back Ready by itself at the time it was given,
under the same name and uid with its labels and taints, and heartbeats on. A static node gets its
reboot Job pinned to it (no kubelet here runs it), and a second call makes no second Job.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from kubernetes import client

from hyperplan.actuation.kube import Kube, api_client
from hyperplan.actuation.pods import REBOOT_JOB_COMPONENT, RebootJob, reboot_job_name
from hyperplan.actuation.providers.base import REBOOT_REASON, ready_condition
from hyperplan.actuation.providers.kwok import ANNOTATION_REBOOT_UNTIL, KwokProvider
from hyperplan.actuation.providers.static import StaticProvider
from hyperplan.api.vocabulary import from_rfc3339
from hyperplan.planning import lending, naming, placement
from tests.kube import Kubectl, eventually

REBOOT_SECONDS = 6
# Taints the node lifecycle controller puts on a NotReady node and takes off again.
CONTROLLERS = "node.kubernetes.io/"


@pytest.fixture
def kube(plane) -> Kube:
    return Kube(api_client(str(plane.kubeconfig)))


def ready(kube: Kube, name: str) -> client.V1NodeCondition | None:
    return ready_condition(kube.core.read_node(name))


def own_taints(node: client.V1Node) -> list[tuple[str, str, str]]:
    return sorted((t.key, t.value or "", t.effect) for t in (node.spec.taints or []) if not t.key.startswith(CONTROLLERS))


@pytest.fixture
def kwok_node(crds: Kubectl, kube: Kube):
    """A Ready KWOK node made by the provider, with labels and taints as a group's spare has them."""
    name = f"hp-reboot-{uuid.uuid4().hex[:6]}"
    spec = placement.NodeSpec(
        name, {naming.LABEL_GROUP: "reboot-g", naming.LABEL_ROLE: naming.ROLE_SPARE, "team": "frontier"},
        (naming.SPARE_TAINT, naming.Taint("example.com/dedicated", "frontier", "NoSchedule")), "spare", None,
        "ml.p5.48xlarge", "us-reboot-1a")
    made = KwokProvider(kube).create(spec)
    assert made.uid
    eventually(lambda: (r := ready(kube, name)) is not None and r.status == "True", timeout=60,
               what="KWOK to initialise the node Ready")
    yield made
    crds.delete("node", name, "--wait=false")


def test_a_kwok_node_reboots_and_comes_back_by_itself(kube: Kube, kwok_node) -> None:
    name = kwok_node.name
    before = kube.core.read_node(name)
    provider = KwokProvider(kube, reboot_seconds=REBOOT_SECONDS)
    started = datetime.now(timezone.utc)
    provider.reboot(name, kwok_node.uid)

    # NotReady at once, Rebooting, with the time it is back.
    down = ready(kube, name)
    assert (down.status, down.reason) == ("False", REBOOT_REASON)
    until_text = kube.core.read_node(name).metadata.annotations[ANNOTATION_REBOOT_UNTIL]
    until = from_rfc3339(until_text)
    assert abs((until - started).total_seconds() - REBOOT_SECONDS) < 2
    # A second call while it is under way starts no second reboot: the time stays.
    time.sleep(1)
    provider.reboot(name, kwok_node.uid)
    assert kube.core.read_node(name).metadata.annotations[ANNOTATION_REBOOT_UNTIL] == until_text
    # Still down a little before the time: nothing (KWOK's heartbeat, the lifecycle controller's
    # taint, which makes KWOK match its stages again) brought it back early.
    time.sleep(max(0.0, (until - datetime.now(timezone.utc)).total_seconds() - 1.5))
    still = ready(kube, name)
    assert (still.status, still.reason) == ("False", REBOOT_REASON)

    # Back Ready by itself, at about the time, under the same name and uid.
    back = eventually(lambda: (r := ready(kube, name)) is not None and r.status == "True" and r,
                      timeout=REBOOT_SECONDS + 10, interval=0.2, what="KWOK to bring the node back Ready")
    assert back.reason == "KubeletReady"
    assert until - timedelta(seconds=1.5) <= back.last_transition_time <= until + timedelta(seconds=5)
    after = kube.core.read_node(name)
    assert after.metadata.uid == kwok_node.uid
    assert after.metadata.labels == before.metadata.labels
    # Its taints: ours as they were, once the lifecycle controller has taken its not-ready taint off.
    eventually(lambda: own_taints(kube.core.read_node(name)) == own_taints(before)
               and not [t for t in kube.core.read_node(name).spec.taints or [] if t.key.startswith(CONTROLLERS)],
               timeout=30, what="the node's taints as before the reboot")
    assert [t.key for t in kube.core.read_node(name).spec.taints] == [t.key for t in before.spec.taints]
    # The other conditions were kept.
    kinds = lambda n: sorted(c.type for c in n.status.conditions)  # noqa: E731
    assert kinds(after) == kinds(before)

    # It heartbeats on: the heartbeat stage matches it again (every 20 to 45 s on this plane).
    eventually(lambda: ready(kube, name).last_heartbeat_time > back.last_heartbeat_time, timeout=60,
               interval=1, what="a heartbeat after the reboot")
    assert ready(kube, name).status == "True"


def test_a_second_reboot_after_the_first_is_a_new_one(kube: Kube, kwok_node) -> None:
    provider = KwokProvider(kube, reboot_seconds=2)
    provider.reboot(kwok_node.name, kwok_node.uid)
    first = kube.core.read_node(kwok_node.name).metadata.annotations[ANNOTATION_REBOOT_UNTIL]
    eventually(lambda: ready(kube, kwok_node.name).status == "True", timeout=15, interval=0.2, what="back")
    provider.reboot(kwok_node.name, kwok_node.uid)
    assert ready(kube, kwok_node.name).reason == REBOOT_REASON
    assert kube.core.read_node(kwok_node.name).metadata.annotations[ANNOTATION_REBOOT_UNTIL] > first
    eventually(lambda: ready(kube, kwok_node.name).status == "True", timeout=15, interval=0.2, what="back again")


def test_rebooting_a_kwok_node_that_is_gone_or_another_is_no_error(kube: Kube, kwok_node) -> None:
    provider = KwokProvider(kube, reboot_seconds=2)
    provider.reboot(f"hp-never-{uuid.uuid4().hex[:6]}", "some-uid")
    provider.reboot(kwok_node.name, "not-its-uid")
    r = ready(kube, kwok_node.name)
    assert (r.status, r.reason) != ("False", REBOOT_REASON)
    assert ANNOTATION_REBOOT_UNTIL not in (kube.core.read_node(kwok_node.name).metadata.annotations or {})


@pytest.fixture
def static_node(crds: Kubectl, kube: Kube):
    """A node of the static pool, held by a group, that no kubelet runs (not a KWOK node)."""
    name = f"static-reboot-{uuid.uuid4().hex[:6]}"
    crds.create({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": {lending.LABEL_POOL: lending.POOL_HELD, naming.LABEL_GROUP: "reboot-g"}}})
    yield kube.core.read_node(name)
    crds.delete("node", name, "--wait=false")


def test_a_static_node_gets_one_reboot_job_pinned_to_it(kube: Kube, namespace: str, static_node) -> None:
    name, uid = static_node.metadata.name, static_node.metadata.uid
    job = RebootJob(image="registry.example/reboot:1", command=("reboot-node",), namespace=namespace)
    provider = StaticProvider(kube, reboot_job=job)
    provider.reboot(name, uid)
    provider.reboot(name, uid)  # a retry while it is under way: the same Job, no second one

    selector = f"app.kubernetes.io/component={REBOOT_JOB_COMPONENT}"
    (made,) = kube.batch.list_namespaced_job(namespace, label_selector=selector).items
    assert made.metadata.name == reboot_job_name(name, uid)
    pod_spec = made.spec.template.spec
    assert pod_spec.node_name == name and pod_spec.host_pid is True
    assert [t.operator for t in pod_spec.tolerations] == ["Exists"]
    (c,) = pod_spec.containers
    assert (c.image, c.command) == ("registry.example/reboot:1", ["reboot-node"])
    assert (c.security_context.privileged, c.security_context.run_as_user) == (True, 0)
    assert made.spec.ttl_seconds_after_finished == 600 and made.spec.backoff_limit == 0
    # The Job controller makes its pod, bound to the node (no kubelet runs it here).
    pod = eventually(lambda: kube.core.list_namespaced_pod(namespace, label_selector=selector).items, timeout=60,
                     what="the Job controller to make the reboot pod")
    assert [p.spec.node_name for p in pod] == [name]
    # Another node under that name (another uid) or a node that is gone: nothing.
    provider.reboot(name, "not-its-uid")
    provider.reboot(f"static-never-{uuid.uuid4().hex[:6]}", "")
    assert len(kube.batch.list_namespaced_job(namespace, label_selector=selector).items) == 1
