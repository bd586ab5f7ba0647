"""The picture ``make demo`` writes at its end: the overview dashboard's main panels, from Prometheus.

:func:`collect` asks a real Prometheus for the run's series (``query_range`` over the run);
:func:`draw_overview` plots what it is given and fetches nothing, so a test feeds it synthetic
``query_range`` results. Panels, top to bottom, titled like their counterparts on the overview
dashboard (``deploy/grafana/``):

1. each plan's phase over time (``hyperplan_training_plan_phase{plan,phase} == 1``), a state timeline;
2. each UltraServer's health over time (``hyperplan_ultraserver_health{plan,ultraserver,status} == 1``);
3. the group's nodes by state (``hyperplan_instance_group_nodes{group,state}``);
4. the group's nodes by health (``hyperplan_instance_group_node_health{group,state}``): the node the
   demo reboots shows as ``rebooting`` and ``UnschedulablePendingReboot`` until it is back
   ``Schedulable``, with the reboots by result (``hyperplan_reboots_total``) and the mean time to
   recover per action (``hyperplan_recovery_seconds``) in the panel's title;
5. remediations: a marker per action (mark, promote, backfill, remove, reboot, recover) where
   ``hyperplan_remediations_total{action}`` rose during the run, with the spare promotion latency
   (``hyperplan_spare_promotion_seconds``) in the panel's title.

The demo's own moments (the injected failure, the reboot it asks for and the node back as a
spare) are drawn as vertical lines on every panel. A
metric without data gives its panel a "no data" note rather than an error, so the picture is
written even when a metric is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")  # files only: no display on a build machine

import matplotlib.dates as mdates  # noqa: E402
import matplotlib.patches  # noqa: E402,F401 - matplotlib.patches.Patch for legends
import matplotlib.ticker  # noqa: E402,F401 - the health panel's tick labels
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

Series = dict[str, Any]  # one query_range result item: {"metric": {...}, "values": [[ts, "v"], ...]}

QUERIES = {
    "plan_phase": "hyperplan_training_plan_phase == 1",
    "ultraserver_health": "hyperplan_ultraserver_health == 1",
    "group_nodes": "hyperplan_instance_group_nodes",
    "remediations": "hyperplan_remediations_total",
    "promotion_sum": "sum(hyperplan_spare_promotion_seconds_sum)",
    "promotion_count": "sum(hyperplan_spare_promotion_seconds_count)",
    "node_health": "hyperplan_instance_group_node_health",
    "reboots": "sum by (result) (hyperplan_reboots_total)",
    "recovery_sum": "sum by (action) (hyperplan_recovery_seconds_sum)",
    "recovery_count": "sum by (action) (hyperplan_recovery_seconds_count)",
}

PHASE_COLORS = {"Pending": "#e6b800", "Scheduled": "#4c9be8", "Active": "#2ca02c", "Expired": "#9e9e9e",
                "Failed": "#d62728"}
HEALTH_COLORS = {"ok": "#2ca02c", "impaired": "#d62728", "insufficient-data": "#bdbdbd"}
STATE_COLORS = {"desired": "#555555", "ready": "#2ca02c", "spare": "#4c9be8", "unhealthy": "#d62728",
                "present": "#9467bd"}
ACTION_COLORS = {"mark": "#d62728", "promote": "#2ca02c", "backfill": "#4c9be8", "remove": "#9e9e9e",
                 "reboot": "#ff7f0e", "recover": "#17becf"}
HEALTH_STATE_COLORS = {"Schedulable": "#2ca02c", "Unschedulable": "#8c564b", "UnschedulablePendingReboot": "#ff7f0e",
                       "UnschedulablePendingReplacement": "#d62728", "rebooting": "#e6b800"}
RECOVERY_ACTIONS = ("reboot", "promote", "replace")


@dataclass
class RunData:
    """What Prometheus recorded of one run: ``query_range`` results by :data:`QUERIES` key."""

    start: datetime
    end: datetime
    step: float
    series: dict[str, list[Series]] = field(default_factory=dict)


@dataclass(frozen=True)
class Moment:
    """A moment the demo itself knows (e.g. when it injected a failure), drawn as a vertical line."""

    time: datetime
    label: str


def collect(prom: Any, start: datetime, end: datetime, step: float = 1.0) -> RunData:
    """``query_range`` of every :data:`QUERIES` entry over ``[start, end]`` from ``prom``.

    ``prom``: a :class:`hyperplan_dev.prometheus.Prometheus` (anything with ``api``).
    """
    data = RunData(start, end, step)
    for key, expr in QUERIES.items():
        result = prom.api("query_range", query=expr, start=f"{start.timestamp():.3f}",
                          end=f"{end.timestamp():.3f}", step=f"{step:g}")
        data.series[key] = result.get("result", [])
    return data


# ----------------------------------------------------------------------------- shaping the series


def _t(ts: float) -> datetime:
    return datetime.fromtimestamp(float(ts), tz=timezone.utc)


def segments(values: Sequence[Sequence[Any]], step: float) -> list[tuple[float, float]]:
    """Runs of samples no more than 1.5 steps apart, as ``(start, width)`` in seconds since the epoch.

    A state series (``== 1`` filtered) has samples only while the state holds; each run is one
    bar of the state timeline, one step wide past its last sample.
    """
    out: list[tuple[float, float]] = []
    run_start = prev = None
    for ts, _ in values:
        ts = float(ts)
        if prev is not None and ts - prev > 1.5 * step:
            out.append((run_start, prev + step - run_start))
            run_start = None
        if run_start is None:
            run_start = ts
        prev = ts
    if run_start is not None:
        out.append((run_start, prev + step - run_start))
    return out


def lanes(series: list[Series], lane_label: str, state_label: str) -> dict[str, list[tuple[str, list]]]:
    """``{lane: [(state, segments-ready values), ...]}`` from state series (one series per lane and state)."""
    out: dict[str, list[tuple[str, list]]] = {}
    for s in series:
        m = s.get("metric", {})
        out.setdefault(m.get(lane_label, "?"), []).append((m.get(state_label, "?"), s.get("values", [])))
    return dict(sorted(out.items()))


def increments(values: Sequence[Sequence[Any]]) -> list[tuple[datetime, float]]:
    """When a counter rose during the run, and by how much (a reset counts its new value)."""
    out, last = [], None
    for ts, v in values:
        v = float(v)
        if last is not None and v != last:
            rise = v - last if v > last else v
            if rise > 0:
                out.append((_t(ts), rise))
        last = v
    return out


def promotion_summary(data: RunData) -> str:
    """``1 spare promotion, mean 10.2 s`` from the histogram's sum and count at the end of the run."""
    def last(key: str) -> float | None:
        series = data.series.get(key) or []
        return float(series[0]["values"][-1][1]) if series and series[0].get("values") else None

    total, count = last("promotion_sum"), last("promotion_count")
    if not count:
        return "no spare promotion recorded"
    plural = "s" if count != 1 else ""
    return f"{count:.0f} spare promotion{plural}, mean {total / count:.1f} s from grace end to spare serving"


def _last(series: Series) -> float:
    values = series.get("values") or []
    return float(values[-1][1]) if values else 0.0


def _first(series: Series) -> float:
    values = series.get("values") or []
    return float(values[0][1]) if values else 0.0


def recovery_summary(data: RunData) -> str:
    """``1 reboot recovered; time to recover: reboot 21.4 s, promote 10.2 s`` from the counters and
    histograms as the run left them (what rose during the run: the first sample is subtracted)."""
    reboots = {s["metric"].get("result", "?"): _last(s) - _first(s) for s in data.series.get("reboots") or []}
    parts = [f"{n:.0f} reboot{'s' if n != 1 else ''} {result}" for result, n in reboots.items() if n > 0]
    sums = {s["metric"].get("action", "?"): s for s in data.series.get("recovery_sum") or []}
    counts = {s["metric"].get("action", "?"): s for s in data.series.get("recovery_count") or []}
    means = []
    for action in RECOVERY_ACTIONS:
        if action in sums and action in counts:
            n = _last(counts[action]) - _first(counts[action])
            if n > 0:
                means.append(f"{action} {(_last(sums[action]) - _first(sums[action])) / n:.1f} s")
    text = "; ".join(parts) if parts else "no reboot recorded"
    return f"{text}; mean time to recover: {', '.join(means)}" if means else text


# ----------------------------------------------------------------------------- drawing


def _no_data(ax: Any, metric: str) -> None:
    ax.text(0.5, 0.5, f"no data for {metric}", transform=ax.transAxes, ha="center", va="center",
            color="#888888", fontsize=10)
    ax.set_yticks([])


def _state_timeline(ax: Any, series: list[Series], lane_label: str, state_label: str,
                    colors: dict[str, str], step: float) -> None:
    rows = lanes(series, lane_label, state_label)
    seen: dict[str, Any] = {}
    for i, (lane, states) in enumerate(rows.items()):
        for state, values in states:
            spans = [(mdates.date2num(_t(a)), (mdates.date2num(_t(a + w)) - mdates.date2num(_t(a))))
                     for a, w in segments(values, step)]
            color = colors.get(state, "#8c564b")
            ax.broken_barh(spans, (i - 0.4, 0.8), facecolors=color, label=state)
            seen.setdefault(state, color)
    ax.set_yticks(range(len(rows)), list(rows))
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.invert_yaxis()
    order = list(colors)  # the legend lists states in their natural order, not by first sight
    handles = [matplotlib.patches.Patch(color=c, label=s)
               for s, c in sorted(seen.items(), key=lambda sc: order.index(sc[0]) if sc[0] in order else 99)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=8, frameon=False)


def draw_overview(data: RunData, moments: Sequence[Moment] = (), title: str = "hyperplan demo") -> Figure:
    """The overview figure of one run (see the module docstring for its panels)."""
    fig, axes = plt.subplots(5, 1, figsize=(12, 13.5), sharex=True,
                             gridspec_kw={"height_ratios": [1.2, 1, 1.4, 1.2, 1.2]})
    phase_ax, health_ax, nodes_ax, node_health_ax, rem_ax = axes

    phase_ax.set_title("Plan phase over time")
    if data.series.get("plan_phase"):
        _state_timeline(phase_ax, data.series["plan_phase"], "plan", "phase", PHASE_COLORS, data.step)
    else:
        _no_data(phase_ax, "hyperplan_training_plan_phase")

    health_ax.set_title("UltraServer health")
    if data.series.get("ultraserver_health"):
        _state_timeline(health_ax, data.series["ultraserver_health"], "ultraserver", "status",
                        HEALTH_COLORS, data.step)
    else:
        _no_data(health_ax, "hyperplan_ultraserver_health")

    nodes_ax.set_title("Group nodes by state")
    if data.series.get("group_nodes"):
        groups = {s["metric"].get("group", "?") for s in data.series["group_nodes"]}
        for s in sorted(data.series["group_nodes"], key=lambda s: (s["metric"].get("group", ""),
                                                                   s["metric"].get("state", ""))):
            m = s["metric"]
            label = m.get("state", "?") if len(groups) == 1 else f"{m.get('group')} {m.get('state')}"
            nodes_ax.step([_t(ts) for ts, _ in s["values"]], [float(v) for _, v in s["values"]], where="post",
                          label=label, color=STATE_COLORS.get(m.get("state", "")), linewidth=1.8)
        nodes_ax.set_ylabel("nodes")
        nodes_ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=8, frameon=False)
    else:
        _no_data(nodes_ax, "hyperplan_instance_group_nodes")

    node_health_ax.set_title(f"Nodes by health ({recovery_summary(data)})")
    if data.series.get("node_health"):
        # Only the states a node was in during the run: four of the five are 0 most of the time.
        shown = [s for s in data.series["node_health"] if any(float(v) for _, v in s.get("values", []))]
        groups = {s["metric"].get("group", "?") for s in shown}
        order = list(HEALTH_STATE_COLORS)
        for s in sorted(shown, key=lambda s: (s["metric"].get("group", ""),
                                              order.index(s["metric"].get("state")) if s["metric"].get("state")
                                              in order else 99)):
            m = s["metric"]
            label = m.get("state", "?") if len(groups) == 1 else f"{m.get('group')} {m.get('state')}"
            node_health_ax.step([_t(ts) for ts, _ in s["values"]], [float(v) for _, v in s["values"]], where="post",
                                label=label, color=HEALTH_STATE_COLORS.get(m.get("state", "")), linewidth=1.8)
        node_health_ax.set_ylabel("nodes")
        node_health_ax.set_yscale("symlog", linthresh=2)  # 20 Schedulable beside 1 rebooting: both readable
        top = max(float(v) for s in shown for _, v in s["values"])
        node_health_ax.set_yticks([t for t in (0, 1, 2, 5, 10, 20, 50, 100, 200, 500) if t <= max(2.0, top)])
        node_health_ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        node_health_ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        node_health_ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=8, frameon=False)
    else:
        _no_data(node_health_ax, "hyperplan_instance_group_node_health")

    rem_ax.set_title(f"Remediations ({promotion_summary(data)})")
    actions = {s["metric"].get("action", "?"): increments(s["values"]) for s in data.series.get("remediations", [])}
    if actions:
        # One lane per action, a marker where its counter rose: mark, promote, backfill and
        # remove happen within a second of each other, which lines of counts would draw on top
        # of each other.
        order = [a for a in ACTION_COLORS if a in actions] + sorted(a for a in actions if a not in ACTION_COLORS)
        for i, action in enumerate(order):
            events = actions[action]
            rem_ax.scatter([t for t, _ in events], [i] * len(events), marker="D", s=60, zorder=3,
                           color=ACTION_COLORS.get(action, "#8c564b"), label=action)
            for t, rise in events:
                if rise > 1:
                    rem_ax.annotate(f"×{rise:.0f}", (mdates.date2num(t), i), xytext=(6, 4),
                                    textcoords="offset points", fontsize=8)
        rem_ax.set_yticks(range(len(order)), order)
        rem_ax.set_ylim(-0.6, len(order) - 0.4)
        rem_ax.invert_yaxis()
    else:
        _no_data(rem_ax, "hyperplan_remediations_total")

    for ax in axes:
        for m in moments:
            ax.axvline(m.time, color="#d62728", linestyle="--", linewidth=1)
        ax.set_axisbelow(True)
        ax.grid(axis="x", color="#eeeeee")
    for i, m in enumerate(moments):  # labels stepped down so that close moments stay readable
        phase_ax.annotate(m.label, (mdates.date2num(m.time), 1.0), xycoords=("data", "axes fraction"),
                          xytext=(3, -2 - 12 * i), textcoords="offset points", va="top", fontsize=8,
                          color="#d62728", bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none",
                                                 "pad": 1})
    rem_ax.set_xlim(data.start, data.end)
    rem_ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=timezone.utc))
    rem_ax.set_xlabel("time (UTC)")
    fig.suptitle(f"{title}: {data.start:%Y-%m-%d %H:%M:%S} – {data.end:%H:%M:%S} UTC", fontsize=13)
    fig.tight_layout()
    return fig


def write_overview(data: RunData, path: Path, moments: Sequence[Moment] = (), title: str = "hyperplan demo") -> Path:
    """Draw the overview of ``data`` and save it as a PNG at ``path``."""
    fig = draw_overview(data, moments, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
