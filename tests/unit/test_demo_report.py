"""The demo's overview picture, drawn from synthetic query_range results shaped like Prometheus's."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import matplotlib.colors as mcolors
import matplotlib.dates as mdates
import pytest

from hyperplan_dev import demo_report

T0 = datetime(2027, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
END = T0 + timedelta(seconds=300)


def series(metric: dict, points: list[tuple[int, float]]) -> dict:
    """A query_range matrix item: values are [unix seconds, "value"] pairs, as Prometheus sends them."""
    return {"metric": metric, "values": [[T0.timestamp() + t, str(v)] for t, v in points]}


def every(a: int, b: int, value: float = 1) -> list[tuple[int, float]]:
    return [(t, value) for t in range(a, b)]


def run() -> demo_report.RunData:
    phase = "hyperplan_training_plan_phase"
    return demo_report.RunData(T0, END, 1.0, {
        "plan_phase": [
            series({"__name__": phase, "plan": "demo-split", "phase": "Scheduled"}, every(0, 60) + every(120, 150)),
            series({"__name__": phase, "plan": "demo-split", "phase": "Active"}, every(60, 120) + every(150, 210)),
            series({"__name__": phase, "plan": "demo-split", "phase": "Expired"}, every(210, 300)),
            series({"__name__": phase, "plan": "demo-gb200", "phase": "Active"}, every(30, 210)),
        ],
        "ultraserver_health": [
            series({"plan": "demo-gb200", "ultraserver": "rc-1-us-0", "status": "ok"}, every(40, 100) + every(115, 210)),
            series({"plan": "demo-gb200", "ultraserver": "rc-1-us-0", "status": "impaired"}, every(100, 115)),
            series({"plan": "demo-gb200", "ultraserver": "rc-1-us-1", "status": "ok"}, every(40, 210)),
        ],
        "group_nodes": [
            series({"group": "demo-workers", "state": "ready"}, every(30, 40, 0) + every(40, 100, 20)
                   + every(100, 112, 19) + every(112, 190, 20) + every(190, 300, 0)),
            series({"group": "demo-workers", "state": "spare"}, every(40, 112, 2) + every(112, 120, 1)
                   + every(120, 190, 2) + every(190, 300, 0)),
            series({"group": "demo-workers", "state": "unhealthy"}, every(100, 120, 1) + every(120, 300, 0)),
        ],
        "remediations": [
            series({"action": "mark"}, every(100, 110, 0) + every(110, 300, 1)),
            series({"action": "promote"}, every(105, 112, 0) + every(112, 300, 1)),
        ],
        "promotion_sum": [series({}, every(112, 300, 2.5))],
        "promotion_count": [series({}, every(112, 300, 1))],
        # the demo's reboot: asked at 150 s, its spare promoted and the node rebooting from 160 s,
        # back as a spare at 172 s
        "node_health": [
            series({"group": "demo-workers", "state": "Schedulable"}, every(30, 160, 22) + every(160, 172, 21)
                   + every(172, 300, 22)),
            series({"group": "demo-workers", "state": "UnschedulablePendingReboot"}, every(30, 150, 0)
                   + every(150, 172, 1) + every(172, 300, 0)),
            series({"group": "demo-workers", "state": "rebooting"}, every(30, 160, 0) + every(160, 172, 1)
                   + every(172, 300, 0)),
            series({"group": "demo-workers", "state": "UnschedulablePendingReplacement"}, every(30, 300, 0)),
        ],
        "reboots": [series({"result": "recovered"}, every(0, 172, 0) + every(172, 300, 1)),
                    series({"result": "timeout"}, every(0, 300, 0))],
        "recovery_sum": [series({"action": "reboot"}, every(0, 172, 0) + every(172, 300, 22.5)),
                         series({"action": "promote"}, every(0, 112, 0) + every(112, 160, 12.5)
                                + every(160, 300, 23.5))],
        "recovery_count": [series({"action": "reboot"}, every(0, 172, 0) + every(172, 300, 1)),
                           series({"action": "promote"}, every(0, 112, 0) + every(112, 160, 1)
                                  + every(160, 300, 2))],
    })


def texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts] + [ax.get_title() for ax in fig.axes]


def test_the_overview_has_the_five_panels_with_their_lanes_and_legends() -> None:
    fig = demo_report.draw_overview(run(), [demo_report.Moment(T0 + timedelta(seconds=100), "failure injected")])
    phase, health, nodes, node_health, rem = fig.axes
    assert [ax.get_title() for ax in fig.axes] == [
        "Plan phase over time", "UltraServer health", "Group nodes by state",
        "Nodes by health (1 reboot recovered; mean time to recover: reboot 22.5 s, promote 11.8 s)",
        "Remediations (1 spare promotion, mean 2.5 s from grace end to spare serving)"]
    # the states a node was in during the run, in their natural order (never-used ones left out)
    assert [t.get_text() for t in node_health.get_legend().get_texts()] == [
        "Schedulable", "UnschedulablePendingReboot", "rebooting"]
    assert [t.get_text() for t in phase.get_yticklabels()] == ["demo-gb200", "demo-split"]
    assert [t.get_text() for t in health.get_yticklabels()] == ["rc-1-us-0", "rc-1-us-1"]
    assert [t.get_text() for t in phase.get_legend().get_texts()] == ["Scheduled", "Active", "Expired"]
    assert [t.get_text() for t in health.get_legend().get_texts()] == ["ok", "impaired"]
    assert [t.get_text() for t in nodes.get_legend().get_texts()] == ["ready", "spare", "unhealthy"]
    assert [t.get_text() for t in rem.get_yticklabels()] == ["mark", "promote"]
    assert "failure injected" in texts(fig)
    assert all(any(line.get_linestyle() == "--" for line in ax.get_lines()) for ax in fig.axes)


def test_the_phase_timeline_draws_each_run_of_a_phase_as_a_bar_in_its_colour() -> None:
    fig = demo_report.draw_overview(run())
    phase = fig.axes[0]
    bars = {}
    for coll in phase.collections:
        colour = mcolors.to_hex(coll.get_facecolor()[0])
        bars.setdefault(colour, 0)
        bars[colour] += len(coll.get_paths())
    # demo-split: Scheduled twice (before each block), Active twice (the two blocks), Expired once.
    assert bars[demo_report.PHASE_COLORS["Scheduled"].lower()] == 2
    assert bars[demo_report.PHASE_COLORS["Active"].lower()] == 3  # two of demo-split, one of demo-gb200
    assert bars[demo_report.PHASE_COLORS["Expired"].lower()] == 1


def test_remediations_are_markers_where_their_counters_rose() -> None:
    data = run()
    data.series["remediations"].append(series({"action": "backfill"}, every(100, 120, 3) + every(120, 300, 5)))
    rem = demo_report.draw_overview(data).axes[4]
    assert [t.get_text() for t in rem.get_yticklabels()] == ["mark", "promote", "backfill"]
    points = {c.get_label(): [(mdates.num2date(x), y) for x, y in c.get_offsets()] for c in rem.collections}
    assert points["mark"] == [(T0 + timedelta(seconds=110), 0)]
    assert points["promote"] == [(T0 + timedelta(seconds=112), 1)]
    assert points["backfill"] == [(T0 + timedelta(seconds=120), 2)]
    assert [t.get_text() for t in rem.texts] == ["×2"]


@pytest.mark.parametrize("missing, note", [
    pytest.param("plan_phase", "no data for hyperplan_training_plan_phase", id="phase"),
    pytest.param("ultraserver_health", "no data for hyperplan_ultraserver_health", id="health"),
    pytest.param("group_nodes", "no data for hyperplan_instance_group_nodes", id="nodes"),
    pytest.param("remediations", "no data for hyperplan_remediations_total", id="remediations"),
    pytest.param("node_health", "no data for hyperplan_instance_group_node_health", id="node-health"),
])
def test_a_metric_without_data_gets_a_note_not_an_error(missing: str, note: str) -> None:
    data = run()
    data.series[missing] = []
    assert note in texts(demo_report.draw_overview(data))


def test_no_promotion_is_said_in_the_title() -> None:
    data = run()
    data.series["promotion_count"] = [series({}, every(0, 300, 0))]
    assert demo_report.draw_overview(data).axes[4].get_title() == "Remediations (no spare promotion recorded)"


def test_the_node_back_from_its_reboot_shows_in_the_health_panel() -> None:
    node_health = demo_report.draw_overview(run()).axes[3]
    lines = {line.get_label(): line for line in node_health.get_lines() if not line.get_label().startswith("_")}
    rebooting = lines["rebooting"]
    ys = dict(zip([mdates.date2num(t) for t in rebooting.get_xdata()], rebooting.get_ydata()))
    at = lambda s: ys[mdates.date2num(T0 + timedelta(seconds=s))]  # noqa: E731
    assert (at(150), at(165), at(180)) == (0, 1, 0)
    assert list(lines["Schedulable"].get_ydata())[-1] == 22  # every node Schedulable again at the end


@pytest.mark.parametrize("reboots, sums, counts, expected", [
    pytest.param([], [], [], "no reboot recorded", id="nothing"),
    pytest.param([({"result": "recovered"}, [0, 1])], [({"action": "reboot"}, [0, 21.4])],
                 [({"action": "reboot"}, [0, 1])], "1 reboot recovered; mean time to recover: reboot 21.4 s",
                 id="one-reboot-back"),
    pytest.param([({"result": "recovered"}, [0, 2]), ({"result": "timeout"}, [0, 1])],
                 [({"action": "replace"}, [5, 45]), ({"action": "reboot"}, [0, 40])],
                 [({"action": "replace"}, [1, 3]), ({"action": "reboot"}, [0, 2])],
                 "2 reboots recovered; 1 reboot timeout; mean time to recover: reboot 20.0 s, replace 20.0 s",
                 id="what-rose-during-the-run-in-action-order"),
    pytest.param([({"result": "failed"}, [1, 1])], [], [], "no reboot recorded", id="before-the-run-only"),
])
def test_recovery_summary(reboots, sums, counts, expected) -> None:
    def of(items):
        return [series(m, [(i, v) for i, v in enumerate(vs)]) for m, vs in items]
    data = demo_report.RunData(T0, END, 1.0, {"reboots": of(reboots), "recovery_sum": of(sums),
                                              "recovery_count": of(counts)})
    assert demo_report.recovery_summary(data) == expected


@pytest.mark.parametrize("points, expected", [
    pytest.param([0, 1, 2, 3], [(0, 4)], id="one-run"),
    pytest.param([0, 1, 5, 6], [(0, 2), (5, 2)], id="gap-splits"),
    pytest.param([7], [(7, 1)], id="single-sample"),
    pytest.param([], [], id="empty"),
])
def test_segments(points: list[int], expected: list[tuple[int, int]]) -> None:
    assert demo_report.segments([[p, "1"] for p in points], 1.0) == expected


@pytest.mark.parametrize("values, expected", [
    pytest.param(["0", "0", "1", "1"], [(2, 1)], id="one-rise"),
    pytest.param(["3", "4", "1", "2"], [(1, 1), (2, 1), (3, 1)], id="reset-counts-its-new-value"),
    pytest.param(["2", "2"], [], id="flat"),
    pytest.param(["0", "3"], [(1, 3)], id="several-at-once"),
])
def test_increments(values: list[str], expected: list[tuple[int, float]]) -> None:
    got = demo_report.increments([[T0.timestamp() + i, v] for i, v in enumerate(values)])
    assert got == [(T0 + timedelta(seconds=i), rise) for i, rise in expected]


def test_write_overview_saves_a_png(tmp_path: Path) -> None:
    path = demo_report.write_overview(run(), tmp_path / "out" / "overview.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000


class FakePrometheus:
    """Records the API calls :func:`collect` makes and answers each with one series."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def api(self, path: str, **params: str) -> dict:
        self.calls.append((path, params))
        return {"resultType": "matrix", "result": [series({"q": params["query"]}, [(0, 1)])]}


def test_collect_asks_query_range_over_the_run_for_every_query() -> None:
    prom = FakePrometheus()
    data = demo_report.collect(prom, T0, END, step=2)
    assert [c[0] for c in prom.calls] == ["query_range"] * len(demo_report.QUERIES)
    assert {c[1]["query"] for c in prom.calls} == set(demo_report.QUERIES.values())
    assert prom.calls[0][1]["start"] == f"{T0.timestamp():.3f}" and prom.calls[0][1]["step"] == "2"
    assert data.series["plan_phase"][0]["metric"] == {"q": demo_report.QUERIES["plan_phase"]}
