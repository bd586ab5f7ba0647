"""Grafana dashboards as code, built with grafana-foundation-sdk (Grafana's own typed builders).

:func:`overview` is the wall-screen dashboard of reserved capacity: which plans are in which
phase and how that changed, how long until blocks end or start, how full each pool is, each
group's nodes, UltraServer health and spares, how failed nodes recovered (reboots and their
results, the time to recover per action, nodes per health state), and how fast failures were handled. Every panel's
PromQL uses only metrics of :mod:`hyperplan.metrics`; ``$plan``, ``$group`` and ``$pool`` are
template variables (multi-value, "All" by default). The committed JSON (``deploy/grafana/``)
is :func:`rendered` output; a unit test fails when it drifts, and an e2e test runs every
target against a real Prometheus that scraped the operator through a scenario.

Why this library: see docs/design-decisions.md ("Dashboards as code").
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import bargauge, common as common_b, dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, statushistory, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync, DataSourceRef, ValueMap, ValueMappingResult, VariableRefresh, VariableSort,
)

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
PHASE_CODES = {"Pending": 1, "Scheduled": 2, "Active": 3, "Expired": 4, "Failed": 5}
PHASE_COLORS = {"Pending": "text", "Scheduled": "blue", "Active": "green", "Expired": "purple", "Failed": "red"}
HEALTH_CODES = {"ok": 1, "impaired": 2, "insufficient-data": 3}
HEALTH_COLORS = {"ok": "green", "impaired": "red", "insufficient-data": "gray"}
PLAN = 'plan=~"$plan"'
GROUP = 'group=~"$group"'
POOL = 'pool=~"$pool"'
# Template variables a target may use: name -> the metric and label its values come from.
VARIABLES = {
    "plan": ("hyperplan_training_plan_phase", "plan"),
    "group": ("hyperplan_instance_group_nodes", "group"),
    "pool": ("hyperplan_capacity_pool_instances", "pool"),
}


def _query(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).range().datasource(DATASOURCE)


def _coded(metric: str, label: str, codes: dict[str, int], selector: str, by: str) -> str:
    """One number per series for a 1/0-per-state gauge: the code of the state that is 1."""
    parts = " or ".join(f'{metric}{{{selector}, {label}="{state}"}} * {code}' for state, code in codes.items())
    return f"max by ({by}) ({parts})"


def _mapping(codes: dict[str, int], colors: dict[str, str]) -> ValueMap:
    return ValueMap(options={str(code): ValueMappingResult(text=state, color=colors[state], index=i)
                             for i, (state, code) in enumerate(codes.items())})


def _legend_right() -> common_b.VizLegendOptions:
    return (common_b.VizLegendOptions().display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.RIGHT).show_legend(True))


def _variable(name: str, label: str) -> dash.QueryVariable:
    metric, key = VARIABLES[name]
    return (dash.QueryVariable(name).label(label).datasource(DATASOURCE)
            .query(f"label_values({metric}, {key})").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC).multi(True).include_all(True).all_value(".*"))


def overview() -> dash.Dashboard:
    d = (dash.Dashboard("hyperplan: reserved capacity overview")
         .uid("hyperplan-overview")
         .description("Training plans, capacity pools, instance groups and UltraServers of the hyperplan "
                      "operator (metrics prefix hyperplan_).")
         .tags(["hyperplan", "capacity"])
         .time("now-6h", "now").refresh("30s").timezone("utc").readonly()
         .tooltip(DashboardCursorSync.CROSSHAIR)
         .with_variable(dash.DatasourceVariable("datasource").label("Data source").type("prometheus"))
         .with_variable(_variable("plan", "Training plan"))
         .with_variable(_variable("group", "Instance group"))
         .with_variable(_variable("pool", "Capacity pool")))

    def add(panel) -> None:
        d.with_panel(panel.datasource(DATASOURCE))

    d.with_row(dash.Row("Training plans"))
    add(
        bargauge.Panel().title("Plans by phase").span(6).height(7)
        .description("How many training plans are in each phase now (all plans).")
        .with_target(_query("sum by (phase) (hyperplan_training_plans)", "{{phase}}"))
        .orientation(common.VizOrientation.HORIZONTAL).display_mode(common.BarGaugeDisplayMode.BASIC)
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .min(0).decimals(0))
    add(
        statetimeline.Panel().title("Plan phase over time").span(18).height(7)
        .description("Each plan's phase (Pending, Scheduled, Active, Expired, Failed) over time: when "
                     "blocks started and ended, and gaps between them.")
        .with_target(_query(_coded("hyperplan_training_plan_phase", "phase", PHASE_CODES, PLAN, "plan"),
                            "{{plan}}"))
        .mappings([_mapping(PHASE_CODES, PHASE_COLORS)]).merge_values(True)
        .show_value(common.VisibilityMode.AUTO).legend(common_b.VizLegendOptions().show_legend(False)))
    add(
        stat.Panel().title("Until the active block's termination").span(8).height(6)
        .description("Time left until each plan's active block reaches its termination time, when "
                     "nodes start to drain (negative: passed, the block ends soon).")
        .with_target(_query(f"hyperplan_training_plan_seconds_to_termination{{{PLAN}}}", "{{plan}}"))
        .unit("s").reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]))
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME))
    add(
        stat.Panel().title("Until the next block starts").span(8).height(6)
        .description("Time until each plan's next reserved-capacity block starts.")
        .with_target(_query(f"hyperplan_training_plan_seconds_to_next_block_start{{{PLAN}}}", "{{plan}}"))
        .unit("s").reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]))
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME))
    add(
        timeseries.Panel().title("Plan instances").span(8).height(6)
        .description("Instances of each plan's current (or next) block: reserved in total, in use by "
                     "groups, available for a new group, available spares, unhealthy.")
        .with_target(_query(f"sum by (plan, count) (hyperplan_training_plan_instances{{{PLAN}}})",
                            "{{plan}} {{count}}"))
        .min(0).decimals(0).legend(_legend_right()))

    d.with_row(dash.Row("Capacity pools"))
    add(
        timeseries.Panel().title("Pool capacity: sold vs free").span(16).height(8)
        .description("Instances of each capacity pool sold (this operator's reservations and capacity "
                     "sold to others) and free, over time.")
        .with_target(_query(f"sum by (pool, state) (hyperplan_capacity_pool_instances{{{POOL}}})",
                            "{{pool}} {{state}}"))
        .stacking(common_b.StackingConfig().mode(common.StackingMode.NORMAL).group("A"))
        .fill_opacity(40).min(0).decimals(0).legend(_legend_right()))
    add(
        stat.Panel().title("Until a pool has room again").span(8).height(8)
        .description("How long until each pool has room for one more instance (one UltraServer for "
                     "UltraServer pools); 0 when it has room now.")
        .with_target(_query(f"max by (pool) (hyperplan_capacity_pool_seconds_until_free{{{POOL}}})",
                            "{{pool}}"))
        .unit("s").reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]))
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME))

    d.with_row(dash.Row("Instance groups and UltraServers"))
    add(
        timeseries.Panel().title("Group nodes by state").span(12).height(8)
        .description("Each instance group's nodes: desired active count, active and Ready, Ready spares, "
                     "unhealthy, and present (every node that exists, draining ones included).")
        .with_target(_query(f"sum by (group, state) (hyperplan_instance_group_nodes{{{GROUP}}})",
                            "{{group}} {{state}}"))
        .min(0).decimals(0).legend(_legend_right()))
    add(
        statushistory.Panel().title("UltraServer health").span(12).height(8)
        .description("Health of each UltraServer of the selected plans over time: ok, impaired (an "
                     "unhealthy instance), insufficient-data (no nodes to judge).")
        .with_target(_query(_coded("hyperplan_ultraserver_health", "status", HEALTH_CODES, PLAN,
                                   "plan, ultraserver"), "{{plan}} {{ultraserver}}"))
        .mappings([_mapping(HEALTH_CODES, HEALTH_COLORS)]).show_value(common.VisibilityMode.NEVER))
    add(
        timeseries.Panel().title("Spares available per UltraServer").span(12).height(7)
        .description("Healthy spare instances left on each UltraServer; 0 with instances in use means the "
                     "next failure there has no NVLink-local replacement.")
        .with_target(_query(f'sum by (plan, ultraserver) (hyperplan_ultraserver_instances{{{PLAN}, count="spare"}})',
                            "{{plan}} {{ultraserver}}"))
        .min(0).decimals(0).legend(_legend_right()))
    add(
        timeseries.Panel().title("UltraServer instances in use and unhealthy").span(12).height(7)
        .description("Instances in use by groups and unhealthy instances on each UltraServer.")
        .with_target(_query(
            f'sum by (plan, ultraserver, count) (hyperplan_ultraserver_instances{{{PLAN}, count=~"in_use|unhealthy"}})',
            "{{plan}} {{ultraserver}} {{count}}"))
        .min(0).decimals(0).legend(_legend_right()))

    d.with_row(dash.Row("Recovery: reboot before replace"))
    add(
        timeseries.Panel().title("Nodes by health").span(12).height(8)
        .description("Each group's nodes by their health label (either key: Schedulable, Unschedulable, "
                     "UnschedulablePendingReboot, UnschedulablePendingReplacement), and rebooting: the nodes "
                     "with a reboot under way (they are UnschedulablePendingReboot too).")
        .with_target(_query(f"sum by (group, state) (hyperplan_instance_group_node_health{{{GROUP}}})",
                            "{{group}} {{state}}"))
        .min(0).decimals(0).legend(_legend_right()))
    add(
        timeseries.Panel().title("Time to recover").span(12).height(8)
        .description("From a fault's first sight to the node or its replacement serving again, by action "
                     "(p50, p95): reboot (the rebooted node serves again), promote (a spare serves in its "
                     "place), replace (its replacement Ready).")
        .with_target(_query("histogram_quantile(0.5, sum by (le, action) "
                            "(rate(hyperplan_recovery_seconds_bucket[$__rate_interval])))", "{{action}} p50"))
        .with_target(_query("histogram_quantile(0.95, sum by (le, action) "
                            "(rate(hyperplan_recovery_seconds_bucket[$__rate_interval])))", "{{action}} p95", "B"))
        .unit("s").min(0).span_nulls(True).legend(_legend_right()))
    add(
        timeseries.Panel().title("Reboots by result").span(12).height(7)
        .description("Reboots of failed nodes that ended: recovered (back Ready with no fault left, serving "
                     "again: no capacity spent), timeout (not back within rebootTimeoutSeconds) and failed "
                     "(back with its fault still there), both replaced.")
        .with_target(_query("sum by (result) (increase(hyperplan_reboots_total[$__rate_interval]))", "{{result}}"))
        .draw_style(common.GraphDrawStyle.BARS).fill_opacity(60).min(0).legend(_legend_right()))
    add(
        timeseries.Panel().title("Deep health checks by result").span(12).height(7)
        .description("Nodes whose deep health checks (onStartDeepHealthChecks: InstanceStress, "
                     "InstanceConnectivity) ended, after the node was made or back from a reboot: passed "
                     "(it serves) and failed (it is replaced, the check's output in a DeepHealthCheckFailed "
                     "Event). Until then a node is tainted, shown checking by `hyperplan status`, and not "
                     "counted by Kueue.")
        .with_target(_query("sum by (result) (increase(hyperplan_deep_health_checks_total[$__rate_interval]))",
                            "{{result}}"))
        .draw_style(common.GraphDrawStyle.BARS).fill_opacity(60).min(0).decimals(0).legend(_legend_right()))
    add(
        timeseries.Panel().title("UltraServers replaced and bought").span(12).height(7)
        .description("The last rung: UltraServers whose groups' nodes moved to a free UltraServer of the "
                     "block, by reason (FailuresBeyondSpares, ImpairedTooLong; UltraServerBought: to the one bought in "
                     "place of theirs, which replacements in place made whole meanwhile), NoFreeUltraServer each time a "
                     "group found none free, and bought: UltraServers a plan bought from its pool for the rest "
                     "of the block in place of a failed one (addedUltraServers on the plan's block).")
        .with_target(_query("sum by (reason) (increase(hyperplan_ultraserver_replacements_total[$__rate_interval]))",
                            "{{reason}}"))
        .with_target(_query('sum(increase(hyperplan_purchases_total{result="UltraServerAdded"}[$__rate_interval]))',
                            "bought", "B"))
        .draw_style(common.GraphDrawStyle.BARS).fill_opacity(60).min(0).decimals(0).legend(_legend_right()))
    add(
        timeseries.Panel().title("Replaced past the reboot budget").span(12).height(7)
        .description("Nodes replaced because they failed again after rebootBudget reboots within "
                     "rebootWindowSeconds (alert HyperplanRebootBudgetExhausted): a node that keeps failing "
                     "after reboots points to its hardware.")
        .with_target(_query(f"sum by (group) (increase(hyperplan_reboot_budget_exhausted_total{{{GROUP}}}"
                            "[$__rate_interval]))", "{{group}}"))
        .draw_style(common.GraphDrawStyle.BARS).fill_opacity(60).min(0).decimals(0).legend(_legend_right()))

    d.with_row(dash.Row("Failures and the operator"))
    add(
        timeseries.Panel().title("Remediations").span(8).height(7)
        .description("Remediation actions taken: failed nodes marked, spares promoted, replacements "
                     "created (backfill), failed nodes removed, nodes rebooted and back from a reboot (recover).")
        .with_target(_query("sum by (action) (increase(hyperplan_remediations_total[$__rate_interval]))",
                            "{{action}}"))
        .draw_style(common.GraphDrawStyle.BARS).fill_opacity(60).min(0).legend(_legend_right()))
    add(
        timeseries.Panel().title("Spare promotion latency").span(8).height(7)
        .description("From the end of a failed node's grace to a spare serving in its place (p50, p95).")
        .with_target(_query("histogram_quantile(0.5, sum by (le) "
                            "(rate(hyperplan_spare_promotion_seconds_bucket[$__rate_interval])))", "p50"))
        .with_target(_query("histogram_quantile(0.95, sum by (le) "
                            "(rate(hyperplan_spare_promotion_seconds_bucket[$__rate_interval])))", "p95", "B"))
        .unit("s").min(0).span_nulls(True))
    add(
        timeseries.Panel().title("Group provisioning latency").span(8).height(7)
        .description("From a block's start to all of a group's active nodes Ready (p50, p95).")
        .with_target(_query("histogram_quantile(0.5, sum by (le) "
                            "(rate(hyperplan_group_provisioning_seconds_bucket[$__rate_interval])))", "p50"))
        .with_target(_query("histogram_quantile(0.95, sum by (le) "
                            "(rate(hyperplan_group_provisioning_seconds_bucket[$__rate_interval])))", "p95", "B"))
        .unit("s").min(0).span_nulls(True))
    add(
        timeseries.Panel().title("Transition lag").span(8).height(7)
        .description("Delay between a block boundary and the reconcile that acted on it (p99; aim: "
                     "under 1s).")
        .with_target(_query("histogram_quantile(0.99, sum by (le) "
                            "(rate(hyperplan_transition_lag_seconds_bucket[$__rate_interval])))", "p99"))
        .unit("s").min(0).span_nulls(True))
    add(
        timeseries.Panel().title("Reconcile errors").span(8).height(7)
        .description("Failed reconcile passes per second, by kind (retried after 5s; see the operator's "
                     "log and the objects' conditions).")
        .with_target(_query('sum by (kind) (rate(hyperplan_reconciles_total{result="error"}[$__rate_interval]))',
                            "{{kind}}"))
        .unit("reqps").min(0).legend(_legend_right()))
    add(
        timeseries.Panel().title("Reconcile duration").span(8).height(7)
        .description("How long reconcile passes take, by kind (p95).")
        .with_target(_query("histogram_quantile(0.95, sum by (le, kind) "
                            "(rate(hyperplan_reconcile_duration_seconds_bucket[$__rate_interval])))", "{{kind}}"))
        .unit("s").min(0).span_nulls(True))
    add(
        timeseries.Panel().title("Remote SageMaker calls").span(12).height(7)
        .description("Calls to the SageMaker endpoints that sell remote pools' capacity (docs/aws.md), "
                     "per second by operation and result: ok, or the error code (ResourceNotFound: an "
                     "offering sold meanwhile; EndpointConnectionError: the endpoint is down).")
        .with_target(_query("sum by (operation, result) (rate(hyperplan_remote_calls_total[$__rate_interval]))",
                            "{{operation}} {{result}}"))
        .unit("reqps").min(0).legend(_legend_right()))
    add(
        timeseries.Panel().title("Remote call latency").span(12).height(7)
        .description("How long calls to remote SageMaker endpoints take, by operation (p95; boto3's own "
                     "retries included).")
        .with_target(_query("histogram_quantile(0.95, sum by (le, operation) "
                            "(rate(hyperplan_remote_call_duration_seconds_bucket[$__rate_interval])))",
                            "{{operation}}"))
        .unit("s").min(0).span_nulls(True))
    return d


DASHBOARDS = {"hyperplan-overview.json": overview}


def as_dict(builder: dash.Dashboard) -> dict[str, Any]:
    """The dashboard's JSON model, panels numbered in order (the builders leave ids unset)."""
    model = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    for number, panel in enumerate(model.get("panels", []), start=1):
        panel["id"] = number
    return model


def rendered() -> dict[str, str]:
    """File name -> the dashboard JSON as committed (sorted keys, 2-space indent)."""
    return {name: json.dumps(as_dict(make()), indent=2, sort_keys=True) + "\n" for name, make in DASHBOARDS.items()}


def targets(model: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every target of every panel of a dashboard's JSON model."""
    out = []
    for panel in model.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for t in inner.get("targets", []) or []:
                if t.get("expr"):
                    out.append((inner.get("title", ""), t.get("refId", ""), t["expr"]))
    return out
