"""The committed monitoring files are what hyperplan.monitoring generates, and they hang together."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hyperplan import metrics
from hyperplan.monitoring import alerts, dashboards
from hyperplan.monitoring.generate import generated_files

ROOT = Path(__file__).resolve().parents[2]
OVERVIEW = ROOT / "deploy" / "grafana" / "hyperplan-overview.json"


@pytest.mark.parametrize("rel", sorted(generated_files()))
def test_committed_file_matches_the_generator(rel: str) -> None:
    path = ROOT / rel
    assert path.is_file(), f"{rel} is missing; run `make dashboards`"
    assert path.read_text() == generated_files()[rel], f"{rel} drifted from its generator; run `make dashboards`"


def test_check_mode_fails_on_a_drifted_copy(tmp_path: Path) -> None:
    for rel, text in generated_files().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    run = [sys.executable, "-m", "hyperplan.monitoring", "--check", "--root", str(tmp_path)]
    assert subprocess.run(run, capture_output=True, text=True).returncode == 0
    edited = tmp_path / "deploy" / "grafana" / "hyperplan-overview.json"
    edited.write_text(edited.read_text().replace("Plans by phase", "Plans"))
    proc = subprocess.run(run, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "deploy/grafana/hyperplan-overview.json" in proc.stderr


def overview() -> dict:
    return json.loads(OVERVIEW.read_text())


def test_overview_has_the_panels_a_wall_screen_needs() -> None:
    panels = {p["title"]: p for p in overview()["panels"] if p["type"] != "row"}
    wanted = {
        "Plans by phase": "bargauge", "Plan phase over time": "state-timeline",
        "Pool capacity: sold vs free": "timeseries", "Group nodes by state": "timeseries",
        "UltraServer health": "status-history", "Spares available per UltraServer": "timeseries",
        "Remediations": "timeseries", "Spare promotion latency": "timeseries",
        "Transition lag": "timeseries", "Reconcile errors": "timeseries",
        "Until the active block's termination": "stat", "Until the next block starts": "stat",
        "Nodes by health": "timeseries", "Time to recover": "timeseries", "Reboots by result": "timeseries",
        "Replaced past the reboot budget": "timeseries", "Deep health checks by result": "timeseries",
    }
    assert {t: panels[t]["type"] for t in wanted if t in panels} == wanted
    for p in panels.values():
        assert p["description"], f"panel {p['title']!r} does not say what it answers"
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    ids = [p["id"] for p in overview()["panels"]]
    assert len(ids) == len(set(ids))


def test_template_variables_for_plan_group_and_pool() -> None:
    variables = {v["name"]: v for v in overview()["templating"]["list"]}
    assert set(variables) == {"datasource", "plan", "group", "pool"}
    for name in ("plan", "group", "pool"):
        v = variables[name]
        assert v["type"] == "query" and v["multi"] and v["includeAll"] and v["allValue"] == ".*"
        metric, label = dashboards.VARIABLES[name]
        assert v["query"] == f"label_values({metric}, {label})"
    # Every variable filters at least one panel.
    exprs = " ".join(e for _, _, e in dashboards.targets(overview()))
    for name in ("plan", "group", "pool"):
        assert f"${name}" in exprs


def test_targets_use_declared_metrics_and_labels_only() -> None:
    declared = metrics.declared_families()
    suffix = re.compile(r"_(bucket|sum|count|total)$")
    for title, ref, expr in dashboards.targets(overview()):
        used = set(re.findall(r"\bhyperplan_[a-z_]+", expr))
        assert used, f"{title}/{ref}: no hyperplan_ metric"
        for name in used:
            family = name if name in declared else suffix.sub("", name)
            assert family in declared, f"{title}/{ref}: {name} is not a declared metric"
        for name, selector in re.findall(r"\b(hyperplan_[a-z_]+)\{([^}]*)\}", expr):
            family = name if name in declared else suffix.sub("", name)
            for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector):
                assert label in declared[family][1], f"{title}/{ref}: {family} has no label {label!r}"
        assert set(re.findall(r"\$(\w+)", expr)) <= {"plan", "group", "pool", "__rate_interval"}, expr


def test_chart_rules_read_each_threshold_from_values() -> None:
    template = alerts.chart_template()
    for t in alerts.THRESHOLDS:
        assert f"{{{{ .Values.monitoring.prometheusRule.{t.value_path} }}}}" in template
        assert t.token not in template
    values = yaml.safe_load((ROOT / "charts" / "hyperplan" / "values.yaml").read_text())
    assert {t.value_path: t.default for t in alerts.THRESHOLDS} == {
        k: v for k, v in values["monitoring"]["prometheusRule"].items() if k in {t.value_path for t in alerts.THRESHOLDS}}
    # Prometheus's own templates reach the PrometheusRule as they are in alerts.yml.
    assert "{{ $labels" not in template
    assert '{{ "{{" }} $labels.plan {{ "}}" }}' in template
