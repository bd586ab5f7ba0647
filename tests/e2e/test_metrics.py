"""The operator's Prometheus endpoint, scraped by a real Prometheus with the shipped alert rules."""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from hyperplan_dev import prometheus
from tests.e2e.conftest import Operator
from tests.e2e.scenarios import ts, utcnow
from tests.kube import Kubectl, eventually

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
API = "hyperplan.dev/v1alpha1"

def setup_module() -> None:
    # .ci/run installs Debian's prometheus package; without it these checks fail rather than hide.
    assert shutil.which("promtool"), "promtool is not installed (Debian package prometheus; .ci/run installs it)"


@pytest.fixture
def prom(operator: Operator, tmp_path: Path):
    """A real Prometheus scraping the operator every second, with deploy/prometheus/alerts.yml."""
    p = prometheus.start([f"127.0.0.1:{operator.metrics_port}"], tmp_path / "prometheus",
                         rule_files=[ALERTS])
    yield p
    p.stop()
    assert p.proc.poll() is not None


def value(result: list[dict]) -> float:
    (sample,) = result
    return float(sample["value"][1])


def test_prometheus_scrapes_the_operator(operator: Operator, prom: prometheus.Prometheus,
                                         crds: Kubectl) -> None:
    up = prom.wait_for('up{job="hyperplan"} == 1', timeout=30)
    assert up[0]["metric"]["instance"] == f"127.0.0.1:{operator.metrics_port}"

    # A plan that the operator searches offerings for: a reconcile that Prometheus must see.
    tag = uuid.uuid4().hex[:5]
    itype, name = f"ml.metrics-{tag}.xlarge", f"metrics-{tag}"
    t0 = utcnow().replace(microsecond=0)
    crds.create({"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": name},
                 "spec": {"instanceType": itype, "availabilityZone": "us-east-1a", "instanceCount": 2}})
    crds.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": name},
                 "spec": {"instanceType": itype, "instanceCount": 2, "targetResource": "training-job",
                          "duration": "2m", "startTimeAfter": ts(t0 + timedelta(minutes=1)),
                          "endTimeBefore": ts(t0 + timedelta(minutes=10))}})
    try:
        eventually(lambda: (crds.get("trainingplan", name).get("status") or {}).get("phase"),
                   timeout=60, what=f"plan {name} reconciled")
        reconciles = prom.wait_for(
            'hyperplan_reconciles_total{job="hyperplan", kind="TrainingPlan", result="ok"} > 0',
            timeout=30)
        assert value(reconciles) >= 1
        writes = prom.wait_for('hyperplan_status_writes_total{kind="TrainingPlan"} > 0', timeout=30)
        assert value(writes) >= 1
        # What Prometheus stored is what the endpoint serves (a counter only grows meanwhile).
        served = re.search(
            r'^hyperplan_reconciles_total\{kind="TrainingPlan",result="ok"\} (\S+)$',
            operator.metrics(), flags=re.M)
        assert served and float(served.group(1)) >= value(reconciles)
        # PromQL over the operator's series works as the alert rules use it.
        rate = prom.wait_for('sum by (kind) (rate(hyperplan_reconciles_total[30s]))', timeout=30)
        assert {r["metric"]["kind"] for r in rate} >= {"TrainingPlan"}
    finally:
        crds.delete("trainingplan", name, "--wait=true", "--timeout=60s")
        crds.delete("capacitypool", name)


def test_alert_rules_evaluate_against_the_live_operator(prom: prometheus.Prometheus) -> None:
    prom.wait_for('up{job="hyperplan"} == 1', timeout=30)

    def rules() -> list[dict]:
        return [r for g in prom.api("rules")["groups"] for r in g["rules"]]

    def evaluated() -> list[dict]:
        rs = rules()
        return rs if rs and not any(r["lastEvaluation"].startswith("0001") for r in rs) else []

    names = {r["name"] for r in eventually(evaluated, timeout=30, what="every alert rule evaluated")}
    assert names >= {"HyperplanOperatorDown", "HyperplanReconcileErrors",
                     "HyperplanTransitionLagHigh", "HyperplanRemediationBlocked",
                     "HyperplanPurchaseFailed"}
    broken = {r["name"]: r.get("lastError") for r in rules() if r["health"] != "ok"}
    assert broken == {}
    # The operator is being scraped, so the rule that pages for a missing operator goes quiet
    # (it may be pending from an evaluation before the first scrape).
    eventually(lambda: next(r for r in rules() if r["name"] == "HyperplanOperatorDown")["state"]
               == "inactive", timeout=15, what="HyperplanOperatorDown inactive")


def test_metrics_text_passes_promtool(operator: Operator) -> None:
    text = operator.metrics()
    assert "# TYPE hyperplan_reconciles_total counter" in text
    assert "# TYPE hyperplan_transition_lag_seconds histogram" in text
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=30)
    problems = [l for l in (proc.stdout + proc.stderr).splitlines() if l.strip()]
    ours = [l for l in problems if "hyperplan_" in l or "error" in l.lower()]
    assert ours == [], "\n".join(ours)
