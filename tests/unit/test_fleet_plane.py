"""The fleet plane (Plane(node_status_seconds=N)): KWOK's heartbeat and Lease at a kubelet's rate,
and the controller-manager's grace periods to match; the default stays what the tests need."""

from __future__ import annotations

import pytest
import yaml

from hyperplan.devcluster.plane import kwok_stages, lease_seconds


def heartbeat_delay(text: str) -> dict:
    stage = next(s for s in yaml.safe_load_all(text) if s["metadata"]["name"] == "hyperplan-node-heartbeat")
    return stage["spec"]["delay"]


@pytest.mark.parametrize("seconds, delay, lease", [
    (None, {"durationMilliseconds": 20000, "jitterDurationMilliseconds": 25000}, 40),
    (300, {"durationMilliseconds": 300000, "jitterDurationMilliseconds": 360000}, 1200),
], ids=["tests-default", "kubelet-rate"])
def test_the_heartbeat_and_lease_follow_the_node_status_interval(seconds, delay, lease) -> None:
    text = kwok_stages(seconds)
    assert heartbeat_delay(text) == delay
    assert lease_seconds(seconds) == lease
    # only the heartbeat changes: the pod-delete stage keeps its 2 s
    stages = {s["metadata"]["name"]: s for s in yaml.safe_load_all(text)}
    assert stages["hyperplan-pod-delete"]["spec"]["delay"] == {"durationMilliseconds": 2000}
