"""Three clusters on one machine for the federation tests: a capacity cluster and two training
clusters, each a named local control plane (:class:`hyperplan_dev.plane.Plane`, no Kueue) with
its own operator process (`hyperplan run`, demo profile, its cluster name the plane's).

The capacity cluster's operator serves the SageMaker API on a free port (:attr:`Cluster.
sagemaker_api_url`), the training clusters' serve none. The three are started side by side, once
per session, in ``.state/federation/planes/<name>`` (``HYPERPLAN_STATE_DIR=.state/federation
hyperplan dev status --name capacity`` shows one); whatever an earlier run left there (the
planes' processes and the operators') is stopped by pid first, so each session starts on empty
planes. At the end every operator gets SIGTERM and every plane is stopped by the pids it
recorded, also when a start failed half way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from hyperplan.actuation.kube import Kube, api_client
from hyperplan_dev.plane import Plane, state_dir, stop_process_group
from tests.e2e.scenarios import Context
from tests.harness import ROOT, Operator, apply_crds, start_replica, stop_replica
from tests.kube import Kubectl, eventually

FEDERATION_STATE = ROOT / ".state" / "federation"
CAPACITY, TRAINING_A, TRAINING_B = "capacity", "training-a", "training-b"
MEMBERS = {CAPACITY: True, TRAINING_A: False, TRAINING_B: False}  # name: serves the SageMaker API


@dataclass(frozen=True)
class Cluster:
    """One member of the federation: its plane, its operator, and how a test talks to it."""

    name: str
    plane: Plane
    operator: Operator
    kubectl: Kubectl

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    @property
    def sagemaker_api_url(self) -> str | None:
        """hyperplan's SageMaker API on this cluster's operator (the capacity cluster's only)."""
        port = self.operator.sagemaker_api_port
        return None if port is None else f"http://127.0.0.1:{port}"

    def context(self) -> Context:
        """The e2e scenarios' context for this cluster (tests.e2e.scenarios), so that their
        helpers (plan_body, wait_phase, mint_key, ...) work on it as on the e2e plane."""
        return Context(kubectl=self.kubectl, kube=Kube(api_client(str(self.kubeconfig))),
                       operator=self.operator, metrics=self.operator.metrics,
                       sagemaker_api_urls=(self.sagemaker_api_url,) if self.sagemaker_api_url else (),
                       kubeconfig=str(self.kubeconfig))


def dev(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``hyperplan dev ARGS`` as a user runs it, over the federation's state folder."""
    return subprocess.run([sys.executable, "-m", "hyperplan.cli", "dev", *args], capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "HYPERPLAN_STATE_DIR": str(FEDERATION_STATE)})


def federation_plane(name: str) -> Plane:
    return Plane(name=name, root=state_dir(name, base=FEDERATION_STATE),
                 log=lambda line: print(f"[plane {name}] {line}", flush=True))


def operator_pid_file(plane: Plane) -> Path:
    return plane.dir / "operator.pid"


def stop_stale_operator(plane: Plane) -> None:
    """An operator an earlier session left on this plane (killed before its teardown), stopped by
    the pid it recorded, if that pid still runs `hyperplan run` at this plane's kubeconfig."""
    pid_file = operator_pid_file(plane)
    try:
        pid = int(pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (OSError, ValueError):
        pid = None
    if pid and b"hyperplan.cli" in cmdline and f"KUBECONFIG={plane.kubeconfig}".encode() in environ:
        stop_process_group(pid)
    pid_file.unlink(missing_ok=True)


def start_member(name: str, sagemaker_api: bool, logs: Path) -> Cluster:
    """A fresh plane with the CRDs, and its operator once it holds its leader Lease. A failure
    stops what this call started before it is raised."""
    plane = federation_plane(name)
    stop_stale_operator(plane)  # what an earlier run left, by the pids it recorded
    plane.down(quiet=True)
    try:
        plane.up()
        kubectl = apply_crds(Kubectl(plane.kubeconfig))
        identity = f"{name}-replica-0"
        op = start_replica(plane, logs / f"operator-{name}.log", identity, sagemaker_api=sagemaker_api,
                           env={"HYPERPLAN_CLUSTER_NAME": name, "HYPERPLAN_KUEUE_ENABLED": "false"})
        operator_pid_file(plane).write_text(str(op.proc.pid))
    except BaseException:
        plane.down(quiet=True)
        raise
    try:
        eventually(lambda: (kubectl.get_or_none("lease", "hyperplan-leader") or {}).get("spec", {})
                   .get("holderIdentity") == identity, timeout=60, what=f"{identity} holding the lease on {name}")
    except BaseException:
        stop_member(Cluster(name, plane, op, kubectl))
        raise
    return Cluster(name, plane, op, kubectl)


def stop_member(cluster: Cluster) -> None:
    """SIGTERM to the operator (which must exit 0), then the plane stopped, whatever the first did."""
    try:
        if cluster.operator.proc.poll() is None:
            stop_replica(cluster.operator)
    finally:
        operator_pid_file(cluster.plane).unlink(missing_ok=True)
        cluster.plane.down(quiet=True)


@pytest.fixture(scope="session")
def federation(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Cluster]:
    """The three members, started at once (a plane takes most of its start waiting on its API
    server; two cores take three side by side in little more than one's time)."""
    logs = tmp_path_factory.mktemp("federation")
    with ThreadPoolExecutor(max_workers=len(MEMBERS), thread_name_prefix="member") as pool:
        futures = {name: pool.submit(start_member, name, api, logs) for name, api in MEMBERS.items()}
    started = {name: f.result() for name, f in futures.items() if f.exception() is None}
    failed = [f.exception() for f in futures.values() if f.exception() is not None]
    try:
        if failed:
            raise failed[0]
        yield started
    finally:
        errors = []
        for cluster in started.values():
            try:
                stop_member(cluster)
            except Exception as e:  # the others are stopped all the same
                errors.append(e)
        print(f"[federation] operator logs in {logs}")
        if errors:
            raise errors[0]


@pytest.fixture(scope="session")
def capacity(federation: dict[str, Cluster]) -> Cluster:
    """The capacity cluster: its operator serves the SageMaker API at ``sagemaker_api_url``."""
    return federation[CAPACITY]


@pytest.fixture(scope="session")
def training_a(federation: dict[str, Cluster]) -> Cluster:
    return federation[TRAINING_A]


@pytest.fixture(scope="session")
def training_b(federation: dict[str, Cluster]) -> Cluster:
    return federation[TRAINING_B]
