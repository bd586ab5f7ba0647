"""The local control plane is real Kubernetes: versions, KWOK nodes, scheduled pods, the dev CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

from hyperplan_dev import build
from hyperplan_dev.plane import Plane
from tests.kube import Kubectl, eventually


def test_binaries_report_the_pinned_release(kubectl: Kubectl) -> None:
    version = json.loads(kubectl.run("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == build.KUBERNETES_VERSION
    assert version["clientVersion"]["gitVersion"] == build.KUBERNETES_VERSION


def kwok_node(kubectl: Kubectl, prefix: str) -> str:
    """A fake node of KWOK's, by a fresh name."""
    node = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kubectl.apply({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {"kubernetes.io/hostname": node}},
        "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]},
    })
    return node


def test_kwok_node_becomes_ready_and_runs_a_pod(kubectl: Kubectl) -> None:
    node = kwok_node(kubectl, "kwok-smoke")

    def ready() -> bool:
        conds = kubectl.get("node", node).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    eventually(ready, timeout=60, what=f"node {node} Ready")
    pod = f"smoke-{uuid.uuid4().hex[:6]}"
    kubectl.apply({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": "default"},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                 "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
                 "containers": [{"name": "c", "image": "busybox"}]},
    })
    running = eventually(
        lambda: (p := kubectl.get("pod", pod, "-n", "default"))["status"].get("phase") == "Running" and p,
        timeout=60, what=f"pod {pod} Running")
    assert running["spec"]["nodeName"] == node
    kubectl.delete("pod", pod, "-n", "default", "--wait=true", "--timeout=60s")
    kubectl.delete("node", node)


def test_kwok_heartbeat_refreshes_only_the_kubelets_own_conditions(kubectl: Kubectl) -> None:
    """KWOK's heartbeat renders a node as it was up to 45 s before; a condition someone else set
    (a health agent, hyperplan's checkpoint signal) must be neither refreshed nor, once removed,
    written back as a bare type with no status (which a handed-back node once carried)."""
    node = kwok_node(kubectl, "kwok-beat")

    def conditions() -> dict[str, dict]:
        return {c["type"]: c for c in kubectl.get("node", node).get("status", {}).get("conditions", [])}

    try:
        eventually(lambda: conditions().get("Ready", {}).get("status") == "True", timeout=60,
                   what=f"node {node} Ready")
        stamp = "2026-01-01T00:00:00Z"
        kubectl.run("patch", "node", node, "--subresource=status", "--type=strategic", "-p", json.dumps(
            {"status": {"conditions": [{"type": "example.com/Checked", "status": "True", "reason": "Test",
                                        "message": "set by the test", "lastHeartbeatTime": stamp,
                                        "lastTransitionTime": stamp}]}}))
        ready_beat = conditions()["Ready"]["lastHeartbeatTime"]
        # The heartbeat comes 20 to 45 s after the node's last change.
        eventually(lambda: conditions()["Ready"]["lastHeartbeatTime"] != ready_beat, timeout=90,
                   what=f"a heartbeat of node {node}")
        checked = conditions()["example.com/Checked"]
        assert (checked["status"], checked["lastHeartbeatTime"]) == ("True", stamp)
    finally:
        kubectl.delete("node", node)


def _cli(plane: Plane, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYPERPLAN_STATE_DIR": str(plane.dir)}
    return subprocess.run([sys.executable, "-m", "hyperplan.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_dev_status_env_and_idempotent_up(plane: Plane) -> None:
    status = _cli(plane, "dev", "status")
    assert status.returncode == 0, status.stderr
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kueue"):
        line = next(l for l in status.stdout.splitlines() if l.startswith(name + " "))
        assert "running (pid" in line
    pids_before = plane.state().pids
    up = _cli(plane, "dev", "up")
    assert up.returncode == 0, up.stderr
    assert "already running" in up.stdout
    assert plane.state().pids == pids_before
    env = _cli(plane, "dev", "env").stdout.splitlines()
    assert f"export KUBECONFIG={plane.kubeconfig}" in env
    assert str(build.binary("kubectl").parent) in env[1]
    assert str(build.binary("helm").parent) in env[1]
