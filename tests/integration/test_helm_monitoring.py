"""The chart's monitoring objects: ServiceMonitor, PrometheusRule and the Grafana dashboard ConfigMap.

Rendered offline (lint, values, one rule source), then checked by the real API server with the
Prometheus Operator's CRDs (generated from its Go types, see tests/fixtures/prometheus-operator-crds/):
a server-side dry-run and an install and uninstall of the chart with all three enabled.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from hyperplan_dev.plane import Plane
from tests.integration.test_helm_chart import CHART, render  # the helm fixture: tests/integration/conftest.py
from tests.kube import Kubectl

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
OVERVIEW = ROOT / "deploy" / "grafana" / "hyperplan-overview.json"
PROMETHEUS_OPERATOR_CRDS = ROOT / "tests" / "fixtures" / "prometheus-operator-crds"
ALL_ON = ("--set", "serviceMonitor.enabled=true", "--set", "monitoring.prometheusRule.enabled=true",
          "--set", "monitoring.dashboards.enabled=true")


def kinds(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs}


# --------------------------------------------------------------------------- offline


def test_monitoring_objects_are_off_by_default(helm) -> None:
    assert not {"ServiceMonitor", "PrometheusRule", "ConfigMap"} & set(kinds(render(helm)))


def test_chart_lints_strictly_with_monitoring_on(helm) -> None:
    proc = helm("lint", "--strict", str(CHART), *ALL_ON)
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def test_prometheus_rule_is_alerts_yml_with_extra_labels(helm) -> None:
    objs = kinds(render(helm, *ALL_ON, "--set", "monitoring.prometheusRule.labels.release=kube-prometheus-stack",
                        namespace="monitoring"))
    rule = objs["PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["metadata"]["labels"]["app.kubernetes.io/name"] == "hyperplan"
    # One source, two renderings: with default values the chart's rules are alerts.yml's.
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def test_alert_thresholds_come_from_values(helm) -> None:
    objs = kinds(render(helm, *ALL_ON, "--set", "monitoring.prometheusRule.blockEndingLeadSeconds=600",
                        "--set", "monitoring.prometheusRule.poolSoldOutHours=6"))
    rules = {r["alert"]: r for g in objs["PrometheusRule"]["spec"]["groups"] for r in g["rules"]}
    assert rules["HyperplanBlockEndingWithNodes"]["expr"].endswith("seconds_to_termination < 600")
    assert "{{ 600 | humanizeDuration }}" in rules["HyperplanBlockEndingWithNodes"]["annotations"]["description"]
    assert rules["HyperplanPoolSoldOut"]["expr"].endswith(">= 6 * 3600")
    assert "next 6 hours" in rules["HyperplanPoolSoldOut"]["annotations"]["summary"]


@pytest.mark.parametrize("bad", ["monitoring.prometheusRule.poolSoldOutHours=0",
                                 "monitoring.prometheusRule.blockEndingLeadSeconds=soon",
                                 "monitoring.dashboards.enable=true"])
def test_bad_monitoring_values_are_rejected_naming_the_field(helm, bad: str) -> None:
    proc = helm("template", "hp", str(CHART), "--set", bad, check=False)
    assert proc.returncode != 0
    assert bad.split("=")[0].split(".")[-1] in proc.stderr, proc.stderr


def test_dashboard_configmap_carries_the_committed_dashboards(helm) -> None:
    objs = kinds(render(helm, *ALL_ON, "--set", "monitoring.dashboards.annotations.grafana_folder=Capacity",
                        "--set", "monitoring.dashboards.namespace=grafana"))
    cm = objs["ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Capacity"}
    assert cm["metadata"]["namespace"] == "grafana"
    assert set(cm["data"]) == {p.name for p in (ROOT / "deploy" / "grafana").glob("*.json")}
    assert json.loads(cm["data"]["hyperplan-overview.json"]) == json.loads(OVERVIEW.read_text())


# --------------------------------------------------------------------------- against the API server


@pytest.fixture(scope="module")
def prometheus_operator_crds(crds: Kubectl):
    """ServiceMonitor and PrometheusRule CRDs on the plane for this module, removed after it."""
    crds.run("apply", "--server-side", "-f", str(PROMETHEUS_OPERATOR_CRDS))
    for plural in ("servicemonitors", "prometheusrules"):
        crds.run("wait", "--for=condition=Established", "--timeout=60s", f"crd/{plural}.monitoring.coreos.com")
    yield crds
    crds.run("delete", "-f", str(PROMETHEUS_OPERATOR_CRDS), "--ignore-not-found", "--wait=false", check=False)


def test_monitoring_objects_pass_server_side_dry_run(helm, prometheus_operator_crds: Kubectl) -> None:
    manifests = helm("template", "hp-mon-dry", str(CHART), "--namespace", "default", *ALL_ON).stdout
    proc = prometheus_operator_crds.run("apply", "--dry-run=server", "-f", "-", input=manifests)
    lines = proc.stdout.splitlines()
    assert all(l.endswith("(server dry run)") for l in lines), proc.stdout
    for kind in ("servicemonitor", "prometheusrule", "configmap"):
        assert any(l.startswith(f"{kind}.") or l.startswith(f"{kind}/") for l in lines), proc.stdout


def test_install_with_monitoring_on_and_uninstall(helm, plane: Plane, prometheus_operator_crds: Kubectl) -> None:
    k = prometheus_operator_crds
    ns, name = f"hp-mon-{uuid.uuid4().hex[:6]}", "hyperplan"
    kc = f"--kubeconfig={plane.kubeconfig}"
    k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        out = helm("install", name, str(CHART), kc, "--namespace", ns, *ALL_ON,
                   "--set", "monitoring.prometheusRule.labels.release=kps",
                   "--set", "nodeSelector.hyperplan\\.dev/helm-test=nowhere").stdout
        assert "STATUS: deployed" in out
        rule = k.get("prometheusrule", name, "-n", ns)
        assert rule["metadata"]["labels"]["release"] == "kps"
        # What the API server stored (after its schema's defaulting and pruning) is alerts.yml.
        assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
        monitor = k.get("servicemonitor", name, "-n", ns)
        assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
        cm = k.get("configmap", f"{name}-dashboards", "-n", ns)
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(cm["data"]["hyperplan-overview.json"])["uid"] == "hyperplan-overview"
        helm("uninstall", name, kc, "--namespace", ns, "--wait", "--timeout=60s")
        for kind, obj in (("prometheusrule", name), ("servicemonitor", name), ("configmap", f"{name}-dashboards")):
            proc = k.run("get", kind, obj, "-n", ns, check=False)
            assert "NotFound" in proc.stderr, f"{kind}/{obj} survived helm uninstall"
    finally:
        helm("uninstall", name, kc, "--namespace", ns, check=False)
        k.run("delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False)
