"""Every implementation of a Protocol (real and fake) has its methods with the same parameters."""

from __future__ import annotations

import inspect

import pytest

from hyperplan.actuation.deepchecks import DeepCheckJobs, KubeDeepCheckJobs
from hyperplan_testing.fakes import (
    FakeDeepCheckJobs, FakeKube, FakeLedger, FakeLeaseStore, FakeNodePods, FakeProvider, RecordingKueueWrites,
)
from hyperplan.actuation.kube import Kube
from hyperplan.actuation.kueue import KubeKueueWrites, KueueWrites
from hyperplan.actuation.leadership import KubeLeaseStore, LeaseStore
from hyperplan.actuation.ledger import CapacityLedger, KubeLedger
from hyperplan.actuation.pods import KubeNodePods, NodePods
from hyperplan.actuation.providers.base import NodeProvider
from hyperplan.actuation.providers.kwok import KwokProvider
from hyperplan.actuation.providers.static import StaticProvider


def _methods(proto: type) -> list[str]:
    return [m for m, v in vars(proto).items() if callable(v) and not m.startswith("_")]


@pytest.mark.parametrize("impl, proto", [
    (KwokProvider, NodeProvider), (StaticProvider, NodeProvider), (FakeProvider, NodeProvider),
    (KubeNodePods, NodePods), (FakeNodePods, NodePods),
    (KubeLedger, CapacityLedger), (FakeLedger, CapacityLedger),
    (KubeLeaseStore, LeaseStore), (FakeLeaseStore, LeaseStore),
    (KubeKueueWrites, KueueWrites), (RecordingKueueWrites, KueueWrites),
    (KubeDeepCheckJobs, DeepCheckJobs), (FakeDeepCheckJobs, DeepCheckJobs),
], ids=lambda x: x.__name__)
def test_implementation_matches_protocol(impl: type, proto: type) -> None:
    assert _methods(proto), f"{proto.__name__} declares no methods"
    for name in _methods(proto):
        want = list(inspect.signature(getattr(proto, name)).parameters)
        have = list(inspect.signature(getattr(impl, name)).parameters)
        assert have == want, f"{impl.__name__}.{name}{have} != {proto.__name__}.{name}{want}"


@pytest.mark.parametrize("name", ["get_object", "patch_status", "set_finalizers"])
def test_fake_kube_has_the_parameters_of_the_kube_calls_passes_make(name: str) -> None:
    """``Kube`` is a class, not a Protocol: the FakeKube stands in for the calls on hyperplan objects."""
    assert list(inspect.signature(getattr(FakeKube, name)).parameters) == \
        list(inspect.signature(getattr(Kube, name)).parameters)
