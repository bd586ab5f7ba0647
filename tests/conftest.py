"""Session fixtures: one local control plane per test run, started here and stopped here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hyperplan_dev.plane import Plane
from tests.harness import apply_crds
from tests.kube import Kubectl

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def plane() -> Plane:
    """The local control plane in ``.state/test``; started if not already running, stopped after.
    ``HYPERPLAN_TEST_PLANE=NAME``: a named plane of its own instead (free ports, Kueue on), so that
    a second test run on the machine never shares or stops the first one's."""
    log = lambda line: print(f"[plane] {line}", flush=True)  # noqa: E731
    named = os.environ.get("HYPERPLAN_TEST_PLANE")
    p = Plane(name=named, with_kueue=True, log=log) if named else Plane(root=ROOT / ".state" / "test", log=log)
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
