"""The operator on a cluster without Kueue: it runs, says once that Kueue's kinds are not there, and
serves AdmissionChecks as soon as Kueue's CRDs are installed (no restart)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from hyperplan_dev import kueue
from hyperplan_dev.plane import Plane
from tests.kube import Kubectl, eventually

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bare_plane(tmp_path_factory: pytest.TempPathFactory):
    """A plane of its own, without Kueue."""
    plane = Plane(root=Path(tmp_path_factory.mktemp("no-kueue-plane")), log=lambda _: None, with_kueue=False)
    plane.up()
    try:
        yield plane
    finally:
        plane.down(quiet=True)


def test_operator_without_kueue_then_with_its_crds(bare_plane: Plane, tmp_path: Path) -> None:
    k = Kubectl(bare_plane.kubeconfig)
    k.run("apply", "-f", str(ROOT / "crds"))
    for plural in ("capacitypools", "trainingplans", "instancegroups"):
        k.run("wait", "--for=condition=Established", "--timeout=60s", f"crd/{plural}.hyperplan.dev")
    log = tmp_path / "operator.log"
    env = {**os.environ, "KUBECONFIG": str(bare_plane.kubeconfig), "HYPERPLAN_POLICY": "demo",
           "HYPERPLAN_METRICS_PORT": "0", "HYPERPLAN_LIVENESS_PORT": "0", "HYPERPLAN_LEADER_ELECTION": "false"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "hyperplan.cli", "run"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        tag = uuid.uuid4().hex[:5]
        itype = f"ml.nokueue-{tag}.xlarge"
        start = datetime.now(timezone.utc) + timedelta(minutes=5)
        k.create({"apiVersion": "hyperplan.dev/v1alpha1", "kind": "CapacityPool", "metadata": {"name": f"nk-{tag}"},
                  "spec": {"instanceType": itype, "availabilityZone": "us-east-1a", "instanceCount": 2}})
        k.create({"apiVersion": "hyperplan.dev/v1alpha1", "kind": "TrainingPlan", "metadata": {"name": f"nk-{tag}"},
                  "spec": {"instanceType": itype, "instanceCount": 2, "targetResource": "training-job",
                           "duration": "2m", "startTimeAfter": start.strftime("%Y-%m-%dT%H:%M:%SZ")}})
        # The operator does its work without Kueue ...
        eventually(lambda: (k.get("trainingplan", f"nk-{tag}").get("status") or {}).get("offerings"),
                   timeout=60, what="offerings found without Kueue installed")
        assert proc.poll() is None, log.read_text()[-3000:]
        text = log.read_text()
        unresolved = [line for line in text.splitlines() if "Unresolved resources cannot be served" in line]
        assert unresolved and all("kueue.x-k8s.io" in line for line in unresolved), text[-3000:]
        assert len(unresolved) <= 2, "said, not repeated"
        loud = [line for line in text.splitlines() if (" ERROR " in line or " WARNING " in line)
                and "kueue" in line.lower() and line not in unresolved]
        assert "Traceback" not in text and loud == [], text[-3000:]

        # ... and serves AdmissionChecks once Kueue's CRDs appear.
        k.run("apply", "--server-side", "-f", str(kueue.crd_dir()))
        k.run("wait", "--for=condition=Established", "--timeout=60s", "crd/admissionchecks.kueue.x-k8s.io")
        check = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck", "metadata": {"name": f"nk-{tag}"},
                 "spec": {"controllerName": "hyperplan.dev/training-plan",
                          "parameters": {"apiGroup": "hyperplan.dev", "kind": "TrainingPlan", "name": f"nk-{tag}"}}}
        # The first create may come before the API server serves the new kind.
        eventually(lambda: k.create(check, check=False).returncode == 0 or k.get_or_none(
            "admissionchecks.kueue.x-k8s.io", f"nk-{tag}"), timeout=30, what="AdmissionCheck created")

        def active() -> dict | None:
            obj = k.get("admissionchecks.kueue.x-k8s.io", f"nk-{tag}")
            return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Active"), None)

        condition = eventually(active, timeout=60, what="the check's Active condition")
        assert condition["status"] == "True" and condition["reason"] == "PlanFound", condition
        assert f"nk-{tag}" in condition["message"]
        # kopf wrote nothing on Kueue's object (no finalizer, no annotations of its own).
        meta = k.get("admissionchecks.kueue.x-k8s.io", f"nk-{tag}")["metadata"]
        assert not meta.get("finalizers")
        assert not [a for a in (meta.get("annotations") or {}) if a.startswith("hyperplan.dev/")]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
