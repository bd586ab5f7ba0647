"""The operator as its own process (`hyperplan run`, demo profile) against the session's plane."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from concurrent.futures import Future, ThreadPoolExecutor

from hyperplan.actuation.kube import Kube, api_client
from hyperplan_dev import prometheus
from hyperplan_dev.plane import Plane, free_port
from tests.e2e.scenarios import LATE_REGISTRY, REGISTRY, Context
from tests.kube import Kubectl, eventually


@dataclass
class Operator:
    """The operator process: started, killed and restarted with the same settings."""

    log: Path
    metrics_port: int
    liveness_port: int
    env: dict
    proc: subprocess.Popen | None = None
    sagemaker_api_port: int | None = None  # hyperplan's SageMaker API (served by the replica that leads)

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "hyperplan.cli", "run"], env=self.env,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def kill_and_restart(self) -> None:
        """kill -9 (no chance to clean up), then a new process with the same settings."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.start()
        self.wait_alive()

    def wait_alive(self) -> None:
        def alive() -> bool:
            assert self.proc.poll() is None, f"operator exited early:\n{self.log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        eventually(alive, timeout=60, what="operator liveness endpoint")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()


def start_replica(plane: Plane, log: Path, identity: str) -> Operator:
    """One `hyperplan run` replica. Its identity in the leader Lease stays the same across
    :meth:`Operator.kill_and_restart`, as a container restarted in the same pod keeps its name."""
    metrics_port, liveness_port, api_port = free_port(), free_port(), free_port()
    env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig), "HYPERPLAN_POLICY": "demo",
           "HYPERPLAN_METRICS_PORT": str(metrics_port), "HYPERPLAN_LIVENESS_PORT": str(liveness_port),
           "HYPERPLAN_LEADER_ELECTION_IDENTITY": identity, "HYPERPLAN_SAGEMAKER_API_PORT": str(api_port),
           "HYPERPLAN_API_KEY_NAMESPACE": "default", "HYPERPLAN_AWS_ACCOUNT_ID": "111122223333"}
    op = Operator(log, metrics_port, liveness_port, env, sagemaker_api_port=api_port)
    op.start()
    op.wait_alive()
    return op


def stop_replica(op: Operator) -> None:
    """SIGTERM, which must exit 0 within 30 s."""
    proc = op.proc
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"operator did not stop within 30s of SIGTERM (log {op.log})")
    print(f"[operator] log: {op.log}")
    assert rc == 0, f"operator exited {rc} on SIGTERM:\n{op.log.read_text()[-3000:]}"


LEADER, STANDBY = "e2e-replica-0", "e2e-replica-1"


@pytest.fixture(scope="session")
def operator(plane: Plane, crds: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Operator:
    """The acting replica for all e2e scenarios: the first to take the leader Lease."""
    op = start_replica(plane, tmp_path_factory.mktemp("operator") / "operator.log", LEADER)
    eventually(lambda: (crds.get_or_none("lease", "hyperplan-leader") or {}).get("spec", {})
               .get("holderIdentity") == LEADER, timeout=30, what=f"{LEADER} holding the lease")
    yield op
    stop_replica(op)


@pytest.fixture(scope="session")
def standby(operator: Operator, plane: Plane, tmp_path_factory: pytest.TempPathFactory) -> Operator:
    """A second replica beside the leader for the whole run, as the chart runs two: it must
    stand by, writing nothing, while the leader lives."""
    op = start_replica(plane, tmp_path_factory.mktemp("standby") / "operator.log", STANDBY)
    yield op
    stop_replica(op)


@pytest.fixture(scope="session")
def session_prometheus(operator: Operator, tmp_path_factory: pytest.TempPathFactory):
    """A real Prometheus scraping the operator every second from before the scenarios start."""
    p = prometheus.start([f"127.0.0.1:{operator.metrics_port}"], tmp_path_factory.mktemp("prometheus"))
    yield p
    p.stop()


def side_by_side(registry: dict, operator: Operator, crds: Kubectl, plane: Plane, name: str,
                 replicas: tuple[Operator, ...] = ()):
    """Start every scenario of ``registry`` at once on the one operator; yield their futures."""
    ctx = Context(kubectl=crds, kube=Kube(api_client(str(plane.kubeconfig))), operator=operator,
                  metrics=operator.metrics,
                  sagemaker_api_urls=tuple(f"http://127.0.0.1:{op.sagemaker_api_port}" for op in (operator, *replicas)),
                  kubeconfig=str(plane.kubeconfig))
    pool = ThreadPoolExecutor(max_workers=max(1, len(registry)), thread_name_prefix=name)
    yield {key: pool.submit(fn, ctx) for key, fn in registry.items()}
    pool.shutdown(wait=True)


@pytest.fixture(scope="session")
def scenarios(operator: Operator, standby: Operator, crds: Kubectl, plane: Plane,
              session_prometheus: prometheus.Prometheus) -> dict[str, Future]:
    """Every registered scenario, started at once on the one operator; tests read their records."""
    yield from side_by_side(REGISTRY, operator, crds, plane, "scenario", (standby,))


@pytest.fixture(scope="session")
def late_scenarios(scenarios: dict[str, Future], operator: Operator, crds: Kubectl,
                   plane: Plane) -> dict[str, Future]:
    """The late scenarios (see scenarios.LATE_REGISTRY), side by side once the first wave is done."""
    for future in scenarios.values():
        future.exception(timeout=900)
    yield from side_by_side(LATE_REGISTRY, operator, crds, plane, "late")
