"""Prometheus metrics of the operator (prefix ``hyperplan_``), served on HYPERPLAN_METRICS_PORT."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RECONCILES = Counter(
    "hyperplan_reconciles_total", "Reconcile passes, by kind and result.", ["kind", "result"])
STATUS_WRITES = Counter(
    "hyperplan_status_writes_total", "Status patches written, by kind.", ["kind"])
PURCHASES = Counter(
    "hyperplan_purchases_total", "Training-plan purchases, by result reason.", ["result"])
TRANSITION_LAG = Histogram(
    "hyperplan_transition_lag_seconds",
    "Delay between a scheduled block boundary and the reconcile that acted on it.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10))
PLANS = Gauge("hyperplan_training_plans", "Training plans, by phase.", ["phase"])
PLAN_INSTANCES = Gauge(
    "hyperplan_training_plan_instances", "Instance counts of a plan's current block, by kind of count.",
    ["plan", "count"])
GROUP_NODES = Gauge(
    "hyperplan_instance_group_nodes", "Nodes of an instance group, by state.", ["group", "state"])
REMEDIATION_BLOCKED = Gauge(
    "hyperplan_instance_group_remediation_blocked",
    "1 while maxUnhealthy stops remediation of a group (RemediationAllowed=False), else 0.", ["group"])
REMEDIATIONS = Counter(
    "hyperplan_remediations_total", "Health remediation actions taken, by action.", ["action"])

LEADER = Gauge(
    "hyperplan_leader", "1 while this replica holds the leader Lease and acts, 0 while it stands by.")


def serve(port: int) -> None:
    if port:
        start_http_server(port, addr="0.0.0.0")
