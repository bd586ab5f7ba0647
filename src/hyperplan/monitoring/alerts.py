"""The operator's alert rules: one source, two renderings.

:data:`RULES` is the source. :func:`prometheus_rules_file` renders it as a Prometheus rule
file (``deploy/prometheus/alerts.yml``, loaded by ``rule_files`` and tested by ``promtool``)
with the thresholds' defaults; :func:`chart_template` renders the same rules as the chart's
``PrometheusRule`` template, with each threshold read from the chart's values and every
Prometheus template (``{{ $labels.x }}``) escaped from Helm. Rendered with the default values,
the chart's rules equal the file's (tests/integration/test_helm_chart.py checks that).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml


@dataclass(frozen=True)
class Threshold:
    """A number in a rule that a user tunes: ``token`` in the rule text, a chart value."""

    token: str
    value_path: str  # under .Values.monitoring.prometheusRule
    default: int
    meaning: str


BLOCK_ENDING_LEAD = Threshold(
    "__BLOCK_ENDING_LEAD_SECONDS__", "blockEndingLeadSeconds", 3600,
    "how long before a block's termination time to warn that its groups still have nodes")
POOL_SOLD_OUT_HOURS = Threshold(
    "__POOL_SOLD_OUT_HOURS__", "poolSoldOutHours", 24,
    "how many hours ahead a pool must have no room left before it counts as sold out")
THRESHOLDS = (BLOCK_ENDING_LEAD, POOL_SOLD_OUT_HOURS)

GROUP = "hyperplan"

RULES: list[dict[str, Any]] = [
    {
        "alert": "HyperplanOperatorDown",
        "expr": 'up{job="hyperplan"} == 0 or absent(up{job="hyperplan"})',
        "for": "5m",
        "labels": {"severity": "critical"},
        "annotations": {
            "summary": "The hyperplan operator is not being scraped",
            "description": 'Prometheus has not scraped the hyperplan operator (job="hyperplan") for 5 minutes. '
                           "Plans do not change phase and failed nodes are not replaced while it is down.",
        },
    },
    {
        "alert": "HyperplanReconcileErrors",
        "expr": 'sum by (kind) (rate(hyperplan_reconciles_total{result="error"}[5m])) > 0',
        "for": "10m",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "{{ $labels.kind }} reconciles keep failing",
            "description": "{{ $labels.kind }} reconciles have failed for 10 minutes "
                           "({{ $value | humanize }} errors per second); see the operator's log and the "
                           "objects' conditions and Events.",
        },
    },
    {
        "alert": "HyperplanTransitionLagHigh",
        "expr": "histogram_quantile(0.99, sum by (le) (rate(hyperplan_transition_lag_seconds_bucket[15m]))) > 1",
        "for": "5m",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "Block transitions land late",
            "description": "The 99th percentile of the delay between a block boundary and the reconcile that "
                           "acted on it is {{ $value | humanizeDuration }} (aim: under 1s). Nodes appear or "
                           "drain late.",
        },
    },
    # Unhealthy nodes for 15 minutes and no remediation action: remediation is paused by
    # maxUnhealthy, or there is no time left in the block and no spare to promote.
    {
        "alert": "HyperplanRemediationBlocked",
        "expr": 'sum by (group) (hyperplan_instance_group_nodes{state="unhealthy"}) > 0 '
                "unless on() (sum(increase(hyperplan_remediations_total[15m])) > 0)",
        "for": "15m",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "Unhealthy nodes of instance group {{ $labels.group }} are not being replaced",
            "description": "Instance group {{ $labels.group }} has had {{ $value }} unhealthy node(s) for 15 "
                           "minutes without a remediation action. Check the group's conditions and Events "
                           "(maxUnhealthy) and the plan's spare capacity.",
        },
    },
    {
        "alert": "HyperplanRemediationPaused",
        "expr": "max by (group) (hyperplan_instance_group_remediation_blocked) == 1",
        "for": "5m",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "Remediation of instance group {{ $labels.group }} is paused by maxUnhealthy",
            "description": "More nodes of instance group {{ $labels.group }} are unhealthy than its "
                           "healthCheck.maxUnhealthy allows, so none is replaced (condition "
                           "RemediationAllowed=False). Look for a common cause before raising the bound.",
        },
    },
    # The recovery ladder never reboots a node past its group's budget: a node that fails again
    # after rebootBudget reboots within the window is replaced. So the honest signal of a node
    # "rebooted past its budget" is that replacement, counted when the ladder decides it (a count of
    # reboots per node would need a series per node, and an admin's requested reboots have no budget).
    {
        "alert": "HyperplanRebootBudgetExhausted",
        "expr": "sum by (group) (increase(hyperplan_reboot_budget_exhausted_total[1h])) > 0",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "A node of instance group {{ $labels.group }} failed again after its reboots and was replaced",
            "description": "At least one node of instance group {{ $labels.group }} failed again in the last hour "
                           "after using its reboot budget (healthCheck.rebootBudget reboots within "
                           "rebootWindowSeconds). The recovery ladder replaced it, at the cost of its "
                           "UltraServer's spare or of new capacity: a reboot no longer helps it. A node that "
                           "keeps failing after reboots points to its hardware, several in one group to a "
                           "common cause; the group's NodeUnhealthy Events name the nodes. (This counts the "
                           "ladder's replacements: it never reboots past the budget itself, and an admin's "
                           "requested reboots have no budget.)",
        },
    },
    {
        "alert": "HyperplanPurchaseFailed",
        "expr": 'sum by (result) (increase(hyperplan_purchases_total{result!="Purchased"}[30m])) > 0',
        "labels": {"severity": "info"},
        "annotations": {
            "summary": "Training-plan purchases failed: {{ $labels.result }}",
            "description": "At least one training-plan purchase failed with reason {{ $labels.result }} in the "
                           "last 30 minutes; the plans concerned are in phase Failed with that reason.",
        },
    },
    # The block's capacity goes away (nodes drain from its termination time) while the plan's
    # groups still hold nodes: jobs should checkpoint, or the next block be bought.
    # Still firing after the termination time means the drain is stuck.
    {
        "alert": "HyperplanBlockEndingWithNodes",
        "expr": "sum by (plan) (hyperplan_instance_group_nodes{state=\"present\"} "
                "* on (group) group_left (plan) hyperplan_instance_group_info) > 0 "
                f"and on (plan) hyperplan_training_plan_seconds_to_termination < {BLOCK_ENDING_LEAD.token}",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "The active block of training plan {{ $labels.plan }} terminates soon; "
                       "its groups still have nodes",
            "description": "Training plan {{ $labels.plan }} reaches its block's termination time within "
                           f"{{{{ {BLOCK_ENDING_LEAD.token} | humanizeDuration }}}}, and its instance groups "
                           "still have {{ $value }} node(s). They are drained from the termination time on: "
                           "checkpoint running jobs, or buy the next block.",
        },
    },
    # An UltraServer with work on it has used up its spares: the next failure there has no
    # NVLink-local replacement (a spare of another UltraServer, or none, takes over).
    {
        "alert": "HyperplanUltraServerNoSpare",
        "expr": 'max by (plan, ultraserver) (hyperplan_ultraserver_instances{count="spare"}) == 0 '
                'and on (plan, ultraserver) max by (plan, ultraserver) '
                '(hyperplan_ultraserver_instances{count="in_use"}) > 0 '
                'and on (plan, ultraserver) max by (plan, ultraserver) '
                '(hyperplan_ultraserver_instances{count="configured_spare"}) > 0',
        "for": "5m",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "UltraServer {{ $labels.ultraserver }} of plan {{ $labels.plan }} has no spare left",
            "description": "UltraServer {{ $labels.ultraserver }} of training plan {{ $labels.plan }} runs "
                           "in-use instances but has had no available spare for 5 minutes: the next failed "
                           "node there is not replaced within its NVLink domain. Look at its unhealthy "
                           "nodes and why their replacements are not Ready.",
        },
    },
    # Nothing more can be bought from the pool for the next N hours.
    {
        "alert": "HyperplanPoolSoldOut",
        "expr": "max by (pool, instance_type, availability_zone) (hyperplan_capacity_pool_seconds_until_free) "
                f">= {POOL_SOLD_OUT_HOURS.token} * 3600",
        "for": "10m",
        "labels": {"severity": "info"},
        "annotations": {
            "summary": "Capacity pool {{ $labels.pool }} is sold out for the next "
                       f"{POOL_SOLD_OUT_HOURS.token} hours",
            "description": "Capacity pool {{ $labels.pool }} ({{ $labels.instance_type }} in "
                           "{{ $labels.availability_zone }}) has no room for another instance (or "
                           "UltraServer) for {{ $value | humanizeDuration }}. Plans asking for it get no "
                           "offerings until then.",
        },
    },
]


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = ">" if len(text) > 60 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _str)


def _dump(data: Any, indent: int = 0) -> str:
    text = yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=100, default_flow_style=False)
    return "".join((" " * indent + line if line.strip() else line) for line in text.splitlines(True))


def rule_groups() -> list[dict[str, Any]]:
    return [{"name": GROUP, "rules": RULES}]


def prometheus_rules_file() -> str:
    """``deploy/prometheus/alerts.yml``: the rules with each threshold at its default."""
    text = _dump({"groups": rule_groups()})
    for t in THRESHOLDS:
        text = text.replace(t.token, str(t.default))
    header = ("# Alert rules for the hyperplan operator. Generated by `make dashboards` from\n"
              "# src/hyperplan/monitoring/alerts.py (edit there); the chart's PrometheusRule is the\n"
              "# same rules. Tested by alerts_test.yml:\n"
              "#   promtool check rules deploy/prometheus/alerts.yml\n"
              "#   promtool test rules deploy/prometheus/alerts_test.yml\n"
              "# Thresholds (defaults here; chart values monitoring.prometheusRule.*):\n")
    header += "".join(f"#   {t.value_path} = {t.default}: {t.meaning}\n" for t in THRESHOLDS)
    return header + text


def _escape_for_helm(text: str) -> str:
    """Prometheus's ``{{ }}`` templates, passed through Helm untouched."""
    return re.sub(r"\{\{|\}\}", lambda m: '{{ "{{" }}' if m.group() == "{{" else '{{ "}}" }}', text)


def chart_template() -> str:
    """The chart's ``templates/prometheusrule.yaml``."""
    body = _escape_for_helm(_dump(rule_groups(), indent=4))
    for t in THRESHOLDS:
        body = body.replace(t.token, f"{{{{ .Values.monitoring.prometheusRule.{t.value_path} }}}}")
    return (
        "{{- /* Generated by `make dashboards` from src/hyperplan/monitoring/alerts.py: do not edit. */}}\n"
        "{{- if .Values.monitoring.prometheusRule.enabled }}\n"
        "apiVersion: monitoring.coreos.com/v1\n"
        "kind: PrometheusRule\n"
        "metadata:\n"
        "  name: {{ include \"hyperplan.fullname\" . }}\n"
        "  namespace: {{ .Release.Namespace }}\n"
        "  labels:\n"
        "    {{- include \"hyperplan.labels\" . | nindent 4 }}\n"
        "    {{- with .Values.monitoring.prometheusRule.labels }}\n"
        "    {{- toYaml . | nindent 4 }}\n"
        "    {{- end }}\n"
        "spec:\n"
        "  groups:\n"
        f"{body}"
        "{{- end }}\n"
    )
