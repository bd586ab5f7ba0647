"""HyperPod's own node labels and taint, written beside hyperplan's with the setting
``hyperpod_labels`` (on by default; the chart's ``hyperPodLabels``), and read under either key.

The UltraServers seed lists ``sagemaker.amazonaws.com/node-health-status`` (``Schedulable``,
``UnschedulablePendingReplacement``, ``UnschedulablePendingReboot``), its taint
``sagemaker.amazonaws.com/node-health-status=Unschedulable:NoSchedule`` and
``sagemaker.amazonaws.com/deep-health-check-status``: job templates and Kueue TAS written for
HyperPod select and tolerate by those keys.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from kubernetes import client

from hyperplan.actuation.providers.base import mark_healthy_patch, mark_unhealthy_patch
from hyperplan.planning import naming, nodefacts, placement, recovery
from hyperplan.settings import Settings
from tests.unit.test_group_pass import ACTIVE, GRACE, LADDER, NOW, SPARE, group, run, running, set_ready, worlds  # noqa: F401

HP = naming.LABEL_SAGEMAKER_HEALTH
HP_DEEP = naming.LABEL_SAGEMAKER_DEEP_HEALTH_CHECK
HP_TAINT = {"key": HP, "value": "Unschedulable", "effect": "NoSchedule"}
FAULT_TYPES, FAULT_REASONS = naming.LABEL_SAGEMAKER_FAULT_TYPES, naming.LABEL_SAGEMAKER_FAULT_REASONS
OUR_TAINT = {"key": naming.UNHEALTHY_TAINT.key, "value": "true", "effect": "NoSchedule"}


@pytest.mark.parametrize("labels, want", [
    ({naming.LABEL_HEALTH: "Schedulable", "team": "a"}, {HP: "Schedulable"}),
    ({naming.LABEL_HEALTH: "UnschedulablePendingReboot"}, {HP: "UnschedulablePendingReboot"}),
    ({naming.LABEL_DEEP_HEALTH_CHECK: "InProgress"}, {HP_DEEP: "InProgress"}),
    ({naming.LABEL_HEALTH: None}, {HP: None}),
    ({"team": "a"}, {}),
], ids=["health", "pending-reboot", "deep-check", "a-removal-too", "nothing-of-ours"])
def test_the_mirror_is_hyperpods_key_with_hyperplans_value(labels, want) -> None:
    assert nodefacts.hyperpod_mirror(labels) == want


def spec(*taints: naming.Taint, health: str = "Schedulable") -> placement.NodeSpec:
    return placement.NodeSpec("n", {naming.LABEL_HEALTH: health, "team": "a"}, taints, "active", "us-0", "t", "z")


@pytest.mark.parametrize("given, want_taints", [
    (spec(), ()),
    (spec(naming.SPARE_TAINT), (naming.SPARE_TAINT,)),
    (spec(naming.UNHEALTHY_TAINT, health="UnschedulablePendingReplacement"),
     (naming.UNHEALTHY_TAINT, naming.SAGEMAKER_UNHEALTHY_TAINT)),
    (spec(naming.SAGEMAKER_UNHEALTHY_TAINT), ()),  # HyperPod's taint follows hyperplan's, not the other way
], ids=["healthy", "spare", "marked", "a-stale-hyperpod-taint-goes"])
def test_a_desired_node_wears_hyperpods_label_and_taint_beside_ours(given, want_taints) -> None:
    got = placement.hyperpod_dressed(given)
    assert got.labels[HP] == given.labels[naming.LABEL_HEALTH] and got.labels["team"] == "a"
    assert got.taints == want_taints


def node(labels: dict[str, str], taints: list[dict[str, str]] = ()) -> client.V1Node:
    return client.V1Node(metadata=client.V1ObjectMeta(name="n", uid="u", labels=labels, annotations={}),
                         spec=client.V1NodeSpec(taints=[client.V1Taint(**t) for t in taints]))


@pytest.mark.parametrize("hyperpod, labels, taints", [
    (True, {naming.LABEL_HEALTH: "UnschedulablePendingReplacement", HP: "UnschedulablePendingReplacement"},
     [OUR_TAINT, HP_TAINT]),
    (False, {naming.LABEL_HEALTH: "UnschedulablePendingReplacement"}, [OUR_TAINT]),
], ids=["hyperpod-labels-on", "off"])
def test_the_mark_writes_hyperpods_label_and_taint_with_the_setting(hyperpod, labels, taints) -> None:
    patch = mark_unhealthy_patch(node({naming.LABEL_HEALTH: "Schedulable"}), "UnschedulablePendingReplacement",
                                 naming.UNHEALTHY_TAINT, hyperpod)
    assert patch["metadata"]["labels"] == labels
    assert patch["spec"]["taints"] == taints


@pytest.mark.parametrize("hyperpod, before, want", [
    (True, {HP: "UnschedulablePendingReboot"}, "Schedulable"),
    (False, {HP: "UnschedulablePendingReboot"}, "Schedulable"),  # the request the reboot carried out
    (True, {}, "Schedulable"),
    (False, {}, None),  # hyperplan does not write HyperPod's key
], ids=["on-marked", "off-an-admins-request", "on-unmarked", "off-unmarked"])
def test_back_from_its_reboot_both_labels_say_schedulable_and_both_taints_go(hyperpod, before, want) -> None:
    current = node({naming.LABEL_HEALTH: "UnschedulablePendingReboot", **before}, [OUR_TAINT, HP_TAINT])
    patch = mark_healthy_patch(current, hyperpod)
    assert patch["metadata"]["labels"].get(HP) == want
    assert patch["spec"]["taints"] is None


@pytest.mark.parametrize("signal, kind, detail", [
    ("Ready=False", "NodeNotReady", "ReadyFalse"),
    ("Ready=Unknown", "NodeNotReady", "ReadyUnknown"),
    ("AcceleratedHardwareReady=False", "NodeCondition", "AcceleratedHardwareReadyFalse"),
    ("NodeHealthStatus=UnschedulablePendingReboot", "HealthLabel", "UnschedulablePendingReboot"),
    ("NodeStartupTimeout", "NodeStartupTimeout", "NoReadyCondition"),
    ("DeepHealthCheckFailed", "DeepHealthCheck", "DeepHealthCheckFailed"),
    ("example.com/gpu-xid=79 (fell off the bus)", "NodeCondition", "example.com_gpu-xid79__fell_off_the_bus"),
    ("X" * 80, "X" * 63, "X" * 63),
], ids=["not-ready", "lost-contact", "hardware-condition", "asked-by-label", "never-ready", "deep-check",
        "a-condition-type-with-a-domain-and-spaces", "too-long-for-a-label"])
def test_hyperpods_fault_labels_say_the_kind_and_the_detail_of_the_signal(signal, kind, detail) -> None:
    labels = recovery.hyperpod_fault(signal)
    assert labels == {FAULT_TYPES: kind, FAULT_REASONS: detail}
    assert all(naming.label_value(v) == v for v in labels.values())  # each a valid label value


@pytest.mark.parametrize("hyperpod, fault, want", [
    (True, "Ready=False", {FAULT_TYPES: "NodeNotReady", FAULT_REASONS: "ReadyFalse"}),
    (True, None, {}),
    (False, "Ready=False", {}),
], ids=["on-with-a-signal", "on-without", "off"])
def test_the_mark_writes_hyperpods_fault_labels_with_the_setting(hyperpod, fault, want) -> None:
    patch = mark_unhealthy_patch(node({}), "UnschedulablePendingReboot", naming.UNHEALTHY_TAINT, hyperpod, fault)
    assert {k: v for k, v in patch["metadata"]["labels"].items() if k in recovery.FAULT_LABELS} == want


def test_the_group_writes_hyperpods_labels_by_default_and_reads_them_always(worlds) -> None:
    world = worlds(group(healthCheck=LADDER))
    running(world)
    labels = world.provider.nodes[ACTIVE[0]].metadata.labels
    assert (labels[naming.LABEL_HEALTH], labels[HP]) == ("Schedulable", "Schedulable")
    failed = ACTIVE[1]
    set_ready(world, failed, "False", NOW)
    world.now = NOW + GRACE + timedelta(seconds=1)
    run(world)
    marked = world.provider.nodes[failed]
    assert marked.metadata.labels[HP] == marked.metadata.labels[naming.LABEL_HEALTH] == "UnschedulablePendingReboot"
    assert (marked.metadata.labels[FAULT_TYPES], marked.metadata.labels[FAULT_REASONS]) == ("NodeNotReady", "ReadyFalse")
    assert naming.SAGEMAKER_UNHEALTHY_TAINT.key in {t.key for t in marked.spec.taints}
    world.provider.finish_reboot(failed, world.now)
    world.now += timedelta(seconds=1)
    run(world)
    back = world.provider.nodes[failed]
    assert back.metadata.labels[HP] == back.metadata.labels[naming.LABEL_HEALTH] == "Schedulable"
    assert FAULT_TYPES not in back.metadata.labels and FAULT_REASONS not in back.metadata.labels
    assert naming.SAGEMAKER_UNHEALTHY_TAINT.key not in {t.key for t in back.spec.taints or []}


def test_with_the_setting_off_no_hyperpod_key_is_written(worlds, monkeypatch) -> None:
    world = worlds(group(healthCheck=LADDER))
    world.rt.settings = Settings(hyperpod_labels=False)
    world.provider.hyperpod_labels = False
    running(world)
    assert all(HP not in n.metadata.labels for n in world.provider.nodes.values())
    failed = ACTIVE[1]
    set_ready(world, failed, "False", NOW)
    world.now = NOW + GRACE + timedelta(seconds=1)
    run(world)
    marked = world.provider.nodes[failed]
    assert marked.metadata.labels[naming.LABEL_HEALTH] == "UnschedulablePendingReboot" and HP not in marked.metadata.labels
    assert FAULT_TYPES not in marked.metadata.labels
    assert naming.SAGEMAKER_UNHEALTHY_TAINT.key not in {t.key for t in marked.spec.taints}
    # An admin's request under HyperPod's key is read all the same.
    world.provider.nodes[SPARE].metadata.labels[HP] = "UnschedulablePendingReplacement"
    assert nodefacts.unschedulable_health(world.provider.nodes[SPARE].metadata.labels) == \
        "UnschedulablePendingReplacement"
