"""Plane.restart: one process of the local control plane stops and comes back, the cluster's data kept.

Runs its own small plane (in a temporary folder), since it stops the API server and etcd under it.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

from hyperplan_dev.plane import Plane
from tests.kube import Kubectl


@pytest.fixture(scope="module")
def own_plane(tmp_path_factory: pytest.TempPathFactory):
    plane = Plane(root=Path(tmp_path_factory.mktemp("restart-plane")), log=lambda _: None)
    plane.up()
    try:
        yield plane
    finally:
        plane.down(quiet=True)


def test_restarts_keep_ports_certificates_and_etcd_data(own_plane: Plane) -> None:
    k = Kubectl(own_plane.kubeconfig)
    name = f"kept-{uuid.uuid4().hex[:6]}"
    k.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"},
              "data": {"before": "restart"}})
    before = own_plane.state()
    server = own_plane.server

    for process, how in (("etcd", signal.SIGTERM), ("kube-apiserver", signal.SIGKILL),
                         ("kube-apiserver", signal.SIGTERM)):
        took = own_plane.restart(process, how)
        after = own_plane.state()
        assert after.pids[process] != before.pids[process], f"{process} was not started again"
        assert after.ports == before.ports and own_plane.server == server
        assert 0 < took < 120
        # The same kubeconfig (same certificates, same port) reads what was written before.
        assert k.get("configmap", name, "-n", "default")["data"] == {"before": "restart"}
        before = after
    assert {row[0]: row[1].startswith("running") for row in own_plane.status()} == {
        "etcd": True, "kube-apiserver": True, "kube-controller-manager": True, "kube-scheduler": True,
        "kwok": True, "kueue": True}


def test_restart_names_an_unknown_process(own_plane: Plane) -> None:
    with pytest.raises(ValueError, match="unknown plane process 'kubelet'"):
        own_plane.restart("kubelet")
