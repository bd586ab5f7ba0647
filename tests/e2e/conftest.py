"""The operator as its own process (`hyperplan run`, demo profile) against the session's plane."""

from __future__ import annotations

import pytest

from concurrent.futures import Future, ThreadPoolExecutor

from hyperplan.actuation.kube import Kube, api_client
from hyperplan_dev import build, prometheus
from hyperplan_dev import karpenter as karpenter_plane
from hyperplan_dev.plane import Plane
from tests.e2e.scenarios import LATE_REGISTRY, REGISTRY, Context
from tests.harness import Operator, start_replica, stop_replica  # noqa: F401 (tests import Operator from here)
from tests.kube import Kubectl, eventually


LEADER, STANDBY = "e2e-replica-0", "e2e-replica-1"
# The karpenter scenarios' zones (Karpenter reads its instance types and zones once, at its start),
# and how long a NodeClaim may wait for its Node before the operator makes it again (the settings'
# 5 minutes would outlast a scenario's block).
KARPENTER_ZONES = ("us-karp-a", "us-karp-b")
OPERATOR_ENV = {"HYPERPLAN_KARPENTER_LAUNCH_TIMEOUT_SECONDS": "20"}


def operator_env(plane: Plane) -> dict[str, str]:
    """The replicas' settings: OPERATOR_ENV, and the plane's Karpenter's instance-type file (what
    it offers; `hyperplan dev env` prints the same), read by the operator once Karpenter writes it."""
    return {**OPERATOR_ENV,
            "HYPERPLAN_KARPENTER_INSTANCE_TYPES_FILE": str(karpenter_plane.Karpenter(plane).instance_types_file)}


@pytest.fixture(scope="session")
def operator(plane: Plane, crds: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Operator:
    """The acting replica for all e2e scenarios: the first to take the leader Lease."""
    op = start_replica(plane, tmp_path_factory.mktemp("operator") / "operator.log", LEADER, env=operator_env(plane))
    eventually(lambda: (crds.get_or_none("lease", "hyperplan-leader") or {}).get("spec", {})
               .get("holderIdentity") == LEADER, timeout=30, what=f"{LEADER} holding the lease")
    yield op
    stop_replica(op)


@pytest.fixture(scope="session")
def standby(operator: Operator, plane: Plane, tmp_path_factory: pytest.TempPathFactory) -> Operator:
    """A second replica beside the leader for the whole run, as the chart runs two: it must
    stand by, writing nothing, while the leader lives."""
    op = start_replica(plane, tmp_path_factory.mktemp("standby") / "operator.log", STANDBY, env=operator_env(plane))
    yield op
    stop_replica(op)


@pytest.fixture(scope="session")
def session_prometheus(operator: Operator, tmp_path_factory: pytest.TempPathFactory):
    """A real Prometheus scraping the operator every second from before the scenarios start."""
    p = prometheus.start([f"127.0.0.1:{operator.metrics_port}"], tmp_path_factory.mktemp("prometheus"))
    yield p
    p.stop()


@pytest.fixture(scope="session")
def karpenter(plane: Plane, crds: Kubectl) -> karpenter_plane.Karpenter:
    """Real Karpenter (its kwok provider) beside the plane for the whole run, started as `hyperplan
    dev up --karpenter` starts it (which makes the node class the operator's NodeClaims name,
    ``karpenter_node_class``'s default: this fixture does not); stopped by its pid."""
    if not build.component("karpenter").is_built():
        pytest.fail(f"Karpenter {build.KARPENTER_VERSION} is not in the binary cache; `make binaries` builds it",
                    pytrace=False)
    k = karpenter_plane.Karpenter(plane, log=lambda line: print(f"[karpenter] {line}", flush=True),
                                  zones=(*karpenter_plane.ZONES, *KARPENTER_ZONES))
    k.start()
    yield k
    k.stop()


def side_by_side(registry: dict, operator: Operator, crds: Kubectl, plane: Plane, name: str,
                 replicas: tuple[Operator, ...] = ()):
    """Start every scenario of ``registry`` at once on the one operator; yield their futures."""
    ctx = Context(kubectl=crds, kube=Kube(api_client(str(plane.kubeconfig))), operator=operator, plane=plane,
                  metrics=operator.metrics,
                  sagemaker_api_urls=tuple(f"http://127.0.0.1:{op.sagemaker_api_port}" for op in (operator, *replicas)),
                  kubeconfig=str(plane.kubeconfig))
    pool = ThreadPoolExecutor(max_workers=max(1, len(registry)), thread_name_prefix=name)
    yield {key: pool.submit(fn, ctx) for key, fn in registry.items()}
    pool.shutdown(wait=True)


@pytest.fixture(scope="session")
def scenarios(operator: Operator, standby: Operator, crds: Kubectl, plane: Plane,
              session_prometheus: prometheus.Prometheus, karpenter: karpenter_plane.Karpenter) -> dict[str, Future]:
    """Every registered scenario, started at once on the one operator; tests read their records."""
    yield from side_by_side(REGISTRY, operator, crds, plane, "scenario", (standby,))


@pytest.fixture(scope="session")
def late_scenarios(scenarios: dict[str, Future], operator: Operator, crds: Kubectl,
                   plane: Plane) -> dict[str, Future]:
    """The late scenarios (see scenarios.LATE_REGISTRY), side by side once the first wave is done."""
    for future in scenarios.values():
        future.exception(timeout=900)
    yield from side_by_side(LATE_REGISTRY, operator, crds, plane, "late")
