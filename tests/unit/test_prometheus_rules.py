"""The shipped Prometheus files: valid for the real promtool, and the alert rules behave as tested.

``promtool test rules`` replays the series in ``alerts_test.yml`` through ``alerts.yml`` and
compares the alerts that fire (labels and rendered annotations) at each evaluation time. The
mutation test below shows that those tests can fail: with any one alert made silent, the
suite must notice.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
ALERTS = PROM / "alerts.yml"

def setup_module() -> None:
    # .ci/run installs Debian's prometheus package; without it these checks fail rather than hide.
    assert shutil.which("promtool"), "promtool is not installed (Debian package prometheus; .ci/run installs it)"


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def alert_names() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]


def test_alert_rules_are_valid() -> None:
    proc = promtool("check", "rules", str(ALERTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in proc.stdout


def exported_metrics() -> dict[str, set[str]]:
    """Sample names the operator exports (hyperplan.metrics), with their label names."""
    from hyperplan import metrics

    out: dict[str, set[str]] = {}
    for name, (type_, labels) in metrics.declared_families().items():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                    "gauge": ("",)}.get(type_, ("",))
        for suffix in suffixes:
            out[name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return out


def test_alert_rules_use_the_operators_metrics_and_labels() -> None:
    """A renamed metric or label would leave an alert silently empty; catch it here."""
    exported = exported_metrics()
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            expr = rule["expr"]
            used = set(re.findall(r"\bhyperplan_[a-z_]+", expr))
            assert used or rule["alert"] == "HyperplanOperatorDown", f"{rule['alert']}: no hyperplan_ metric"
            assert used <= set(exported), f"{rule['alert']}: unknown metrics {used - set(exported)}"
            for name, selector in re.findall(r"\b(hyperplan_[a-z_]+)\{([^}]*)\}", expr):
                for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector):
                    assert label in exported[name], f"{rule['alert']}: {name} has no label {label!r}"
            for grouping in re.findall(r"\bby\s*\(([^)]*)\)", expr):
                for label in filter(None, (l.strip() for l in grouping.split(","))):
                    assert any(label in exported[m] for m in used), \
                        f"{rule['alert']}: no metric of the rule has label {label!r}"


def test_alert_rule_unit_tests_pass() -> None:
    proc = promtool("test", "rules", str(PROM / "alerts_test.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@pytest.mark.parametrize("alert", alert_names())
def test_alert_rule_unit_tests_notice_a_silent_alert(alert: str, tmp_path: Path) -> None:
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["expr"] = "vector(1) == 0"  # never returns anything
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    shutil.copy(PROM / "alerts_test.yml", tmp_path / "alerts_test.yml")
    proc = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert proc.returncode != 0, f"alerts_test.yml has no firing case for {alert}"
    assert f"alertname: {alert}" in proc.stdout + proc.stderr


def test_scrape_config_is_valid_and_loads_the_alerts() -> None:
    proc = promtool("check", "config", str(PROM / "prometheus.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 1 rule files found" in proc.stdout
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert [j["job_name"] for j in cfg["scrape_configs"]] == ["hyperplan"]
