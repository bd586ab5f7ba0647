"""Every file generated from hyperplan.monitoring, by path relative to the checkout."""

from __future__ import annotations

from hyperplan.monitoring import alerts, dashboards

ALERTS_FILE = "deploy/prometheus/alerts.yml"
RULE_TEMPLATE = "charts/hyperplan/templates/prometheusrule.yaml"
DASHBOARD_DIR = "deploy/grafana"
CHART_DASHBOARD_DIR = "charts/hyperplan/dashboards"  # .Files.Get reads only inside the chart


def generated_files() -> dict[str, str]:
    out = {ALERTS_FILE: alerts.prometheus_rules_file(), RULE_TEMPLATE: alerts.chart_template()}
    for name, text in dashboards.rendered().items():
        out[f"{DASHBOARD_DIR}/{name}"] = text
        out[f"{CHART_DASHBOARD_DIR}/{name}"] = text
    return out
