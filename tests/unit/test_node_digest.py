"""A node heartbeat wakes nothing; a change the operator reads does."""

import copy

import pytest

from hyperplan.runtime.nodewatch import node_digest

NODE = {
    "metadata": {"name": "n", "labels": {"hyperplan.dev/role": "active"}},
    "spec": {"taints": [{"key": "hyperplan.dev/spare", "value": "true", "effect": "NoSchedule"}]},
    "status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                               "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
}


def changed(edit) -> dict:
    node = copy.deepcopy(NODE)
    edit(node)
    return node


@pytest.mark.parametrize("node, same", [
    (changed(lambda n: n["status"]["conditions"][0].update(lastHeartbeatTime="2026-01-01T00:00:40Z")), True),
    (changed(lambda n: n["status"]["conditions"][0].update(status="False",
                                                           lastTransitionTime="2026-01-01T00:00:40Z")), False),
    (changed(lambda n: n["status"]["conditions"].append(
        {"type": "AcceleratedHardwareReady", "status": "False", "lastTransitionTime": "2026-01-01T00:00:40Z"})), False),
    (changed(lambda n: n["metadata"]["labels"].update({"hyperplan.dev/node-health-status": "Unschedulable"})), False),
    (changed(lambda n: n["spec"].update(taints=[])), False),
    (changed(lambda n: n["spec"].update(unschedulable=True)), False),
    (changed(lambda n: n["metadata"].update(deletionTimestamp="2026-01-01T00:01:00Z")), False),
    (changed(lambda n: n["status"]["conditions"][0].update(lastTransitionTime="2026-01-01T00:00:00.000000Z",
                                                           lastHeartbeatTime="2026-01-01T00:00:40Z")), True),
    (changed(lambda n: n["spec"]["taints"].append(
        {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})), True),
], ids=["heartbeat", "ready-false", "gpu-condition", "health-label", "taint-removed", "cordoned", "deleting",
        "heartbeat-rerenders-transition-time", "lifecycle-controller-taint"])
def test_only_what_the_operator_reads_counts(node: dict, same: bool) -> None:
    assert (node_digest(node) == node_digest(NODE)) is same
