"""Running hyperplan on a local control plane as a user does, shared by the test tiers that do so
(tests/e2e on the default plane, tests/federation on named ones): the CRDs applied with kubectl,
and operator replicas as their own processes (`hyperplan run`, demo profile), started, killed
and stopped by pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from hyperplan_dev.plane import Plane, free_port
from tests.kube import Kubectl, eventually

ROOT = Path(__file__).resolve().parent.parent


def apply_crds(kubectl: Kubectl) -> Kubectl:
    """The hyperplan CRDs applied with kubectl and Established."""
    kubectl.run("apply", "-f", str(ROOT / "crds"))
    for plural in ("capacitypools", "trainingplans", "instancegroups"):
        kubectl.run("wait", "--for=condition=Established", "--timeout=60s",
                    f"crd/{plural}.hyperplan.dev")
    return kubectl


@dataclass
class Operator:
    """The operator process: started, killed and restarted with the same settings."""

    log: Path
    metrics_port: int
    liveness_port: int
    env: dict
    proc: subprocess.Popen | None = None
    sagemaker_api_port: int | None = None  # hyperplan's SageMaker API (both replicas serve it)

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


def start_replica(plane: Plane, log: Path, identity: str, *, sagemaker_api: bool = True,
                  env: dict[str, str] | None = None) -> Operator:
    """One `hyperplan run` replica. Its identity in the leader Lease stays the same across
    :meth:`Operator.kill_and_restart`, as a container restarted in the same pod keeps its name.

    ``sagemaker_api=False``: no SageMaker API port (the replica serves none); ``env``: further
    HYPERPLAN_* settings over these. A replica that does not come alive is killed before the
    error is raised, so that a failed start leaves no process behind."""
    metrics_port, liveness_port = free_port(), free_port()
    api_port = free_port() if sagemaker_api else None
    base = {**os.environ, "KUBECONFIG": str(plane.kubeconfig), "HYPERPLAN_POLICY": "demo",
            "HYPERPLAN_METRICS_PORT": str(metrics_port), "HYPERPLAN_LIVENESS_PORT": str(liveness_port),
            "HYPERPLAN_LEADER_ELECTION_IDENTITY": identity,
            "HYPERPLAN_API_KEY_NAMESPACE": "default", "HYPERPLAN_AWS_ACCOUNT_ID": "111122223333"}
    if api_port is not None:
        base["HYPERPLAN_SAGEMAKER_API_PORT"] = str(api_port)
    else:
        base.pop("HYPERPLAN_SAGEMAKER_API_PORT", None)
    op = Operator(log, metrics_port, liveness_port, {**base, **(env or {})}, sagemaker_api_port=api_port)
    op.start()
    try:
        op.wait_alive()
    except BaseException:
        os.killpg(op.proc.pid, signal.SIGKILL)
        op.proc.wait()
        raise
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
