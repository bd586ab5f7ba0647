"""The fleet plane (Plane(node_status_seconds=N)): KWOK's heartbeat and Lease at a kubelet's rate,
and the controller-manager's grace periods to match; the default stays what the tests need."""

from __future__ import annotations

import pytest
import yaml

from hyperplan_dev.plane import kwok_stages, lease_seconds


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


def test_a_plane_that_audits_writes_logs_them_with_their_client(tmp_path) -> None:
    """Plane(audit_writes=True): the API server logs writes only (Metadata level: who and what, no
    bodies) as JSON lines, so that a benchmark can count the operator's writes by User-Agent."""
    from hyperplan_dev.plane import Plane

    plane = Plane(root=tmp_path, audit_writes=True)
    flags = plane._audit_flags()
    assert f"--audit-log-path={plane.audit_log}" in flags and "--audit-log-format=json" in flags
    assert "--audit-log-mode=blocking" in flags  # no batch in flight when a window is read
    policy = yaml.safe_load((tmp_path / "audit-policy.yaml").read_text())
    assert policy["rules"][0] == {"level": "Metadata",
                                  "verbs": ["create", "update", "patch", "delete", "deletecollection"]}
    assert policy["rules"][-1] == {"level": "None"}
    assert Plane(root=tmp_path)._audit_flags() == []


def test_the_operator_names_itself_to_the_api_server(tmp_path) -> None:
    """Every request of the operator's API client says User-Agent hyperplan/<version>."""
    from hyperplan import __version__
    from hyperplan.actuation.kube import api_client

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    api = api_client(str(kubeconfig))
    assert api.default_headers["User-Agent"] == f"hyperplan/{__version__}"
