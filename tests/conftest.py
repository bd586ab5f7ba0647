"""Session fixtures: one local control plane per test run, started here and stopped here."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperplan_dev.plane import Plane
from tests.harness import apply_crds
from tests.kube import Kubectl

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def plane() -> Plane:
    """The local control plane in ``.state/test``; started if not already running, stopped after."""
    p = Plane(root=ROOT / ".state" / "test", log=lambda line: print(f"[plane] {line}", flush=True))
    st = p.state()
    already = bool(st and p._all_alive(st) and p._ready(st))
    p.up()
    yield p
    if not already:
        p.down()


@pytest.fixture(scope="session")
def kubectl(plane: Plane) -> Kubectl:
    return Kubectl(plane.kubeconfig)


@pytest.fixture(scope="session")
def crds(kubectl: Kubectl) -> Kubectl:
    """The hyperplan CRDs applied with kubectl and Established."""
    return apply_crds(kubectl)
