"""Fixtures shared by the integration tests."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from hyperplan_dev import build
from tests.kube import Kubectl


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory):
    """``helm(*args)``: the built Helm with its cache, config and data in a temporary folder."""
    home = tmp_path_factory.mktemp("helm")
    env = {**os.environ, "HELM_CACHE_HOME": str(home / "cache"),
           "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}
    env.pop("KUBECONFIG", None)

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(build.binary("helm")), *args], env=env, capture_output=True,
                              text=True, timeout=180)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc

    return run


@pytest.fixture
def namespace(crds: Kubectl):
    """A namespace of the test's own, deleted after it (without waiting)."""
    name = f"it-{uuid.uuid4().hex[:6]}"
    crds.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    crds.delete("namespace", name, "--wait=false")
