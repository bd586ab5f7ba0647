"""The kind tier: one real kind cluster per test session, made the way a user makes it.

The session fixture runs ``hyperplan dev kind up`` (the README's kind path: cluster named
``hyperplan`` from deploy/kind-config.yaml, the operator image built and ``kind load``ed, the chart
``helm install``ed under the demo profile) as its own process, and ``hyperplan dev kind down`` at
the end, which deletes the cluster and stops the dockerd that ``up`` started (by its pid). A
cluster that already answered before the session is reused and left running.

Where Docker is missing and cannot be installed, ``up`` fails with what to do, and so does every
test here: the tier is never skipped.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from hyperplan_dev.kind import CLUSTER_NAME, NAMESPACE, OPERATOR_IMAGE, RELEASE, KindCluster
from tests.kube import Kubectl

ROOT = Path(__file__).resolve().parents[2]
HYPERPLAN = str(Path(sys.executable).parent / "hyperplan")


@dataclass(frozen=True)
class KindEnv:
    """What the kind tier's tests get: the cluster, a kubectl on its kubeconfig, the node names."""

    cluster: KindCluster
    kubeconfig: Path
    kubectl: Kubectl
    control_plane: str
    workers: tuple[str, ...]
    namespace: str = NAMESPACE
    release: str = RELEASE
    operator_image: str = OPERATOR_IMAGE

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.control_plane, *self.workers)


def _hyperplan_kind(action: str, timeout: float) -> None:
    started = time.monotonic()
    print(f"[kind] hyperplan dev kind {action}", flush=True)
    proc = subprocess.Popen([HYPERPLAN, "dev", "kind", action], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            print(f"[kind] {line}", end="", flush=True)
        rc = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    if rc != 0:
        pytest.fail(f"`hyperplan dev kind {action}` failed (exit {rc}):\n{''.join(lines[-40:])}",
                    pytrace=False)


@pytest.fixture(scope="session")
def kind() -> KindEnv:
    cluster = KindCluster(root=ROOT, log=lambda line: print(f"[kind] {line}", flush=True))
    already = cluster.exists() and cluster._cluster_answers()
    try:
        _hyperplan_kind("up", timeout=1800)
    except BaseException:
        if not already:  # stop what `up` started before reporting its failure
            _hyperplan_kind("down", timeout=600)
        raise
    kubectl = Kubectl(cluster.kubeconfig)
    nodes = kubectl.get("nodes")["items"]
    control = [n["metadata"]["name"] for n in nodes
               if "node-role.kubernetes.io/control-plane" in n["metadata"].get("labels", {})]
    workers = sorted(n["metadata"]["name"] for n in nodes
                     if "node-role.kubernetes.io/control-plane" not in n["metadata"].get("labels", {}))
    assert len(control) == 1, f"expected one control-plane node of cluster {CLUSTER_NAME}: {control}"
    yield KindEnv(cluster=cluster, kubeconfig=cluster.kubeconfig, kubectl=kubectl,
                  control_plane=control[0], workers=tuple(workers))
    if not already:
        _hyperplan_kind("down", timeout=600)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The first test of the tier waits for `dev kind up`, which builds images on a cold cache."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.timeout(1800))
