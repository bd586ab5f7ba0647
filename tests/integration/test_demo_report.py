"""The demo picture's queries against a real Prometheus scraping an exporter of the contract's metrics."""

from __future__ import annotations

import shutil
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from hyperplan_dev import demo_report
from hyperplan_dev import prometheus
from hyperplan_dev.plane import free_port


@pytest.fixture
def exporter() -> tuple[int, dict]:
    """The metric families the picture reads, served on a free port from this process."""
    reg = CollectorRegistry()
    m = {
        "phase": Gauge("hyperplan_training_plan_phase", "", ["plan", "phase"], registry=reg),
        "health": Gauge("hyperplan_ultraserver_health", "", ["plan", "ultraserver", "status"], registry=reg),
        "nodes": Gauge("hyperplan_instance_group_nodes", "", ["group", "state"], registry=reg),
        "remediations": Counter("hyperplan_remediations_total", "", ["action"], registry=reg),
        "promotion": Histogram("hyperplan_spare_promotion_seconds", "", registry=reg),
        "node_health": Gauge("hyperplan_instance_group_node_health", "", ["group", "state"], registry=reg),
        "reboots": Counter("hyperplan_reboots_total", "", ["result"], registry=reg),
        "recovery": Histogram("hyperplan_recovery_seconds", "", ["action"], registry=reg),
    }
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    yield port, m
    server.shutdown()


def test_collect_reads_the_run_back_from_prometheus(exporter, tmp_path: Path) -> None:
    assert shutil.which("prometheus") or Path(prometheus.DEFAULT_BINARY).is_file(), \
        "prometheus is not installed (Debian package prometheus; .ci/run installs it)"
    port, m = exporter
    for phase in ("Scheduled", "Active"):
        m["phase"].labels("p1", phase).set(1 if phase == "Scheduled" else 0)
    m["health"].labels("p1", "us-0", "ok").set(1)
    m["nodes"].labels("g1", "ready").set(20)
    m["remediations"].labels("promote")
    m["node_health"].labels("g1", "Schedulable").set(3)
    m["node_health"].labels("g1", "rebooting").set(0)
    m["reboots"].labels("recovered")
    m["recovery"].labels("reboot")
    start = datetime.now(timezone.utc)
    with prometheus.start([f"127.0.0.1:{port}"], tmp_path / "prom") as prom:
        prom.wait_for('hyperplan_training_plan_phase{phase="Scheduled"} == 1', timeout=30)
        time.sleep(2)
        m["phase"].labels("p1", "Scheduled").set(0)
        m["phase"].labels("p1", "Active").set(1)
        m["remediations"].labels("promote").inc()
        m["promotion"].observe(1.5)
        m["node_health"].labels("g1", "Schedulable").set(2)
        m["node_health"].labels("g1", "rebooting").set(1)
        prom.wait_for('hyperplan_instance_group_node_health{state="rebooting"} == 1', timeout=30)
        time.sleep(1.5)
        m["node_health"].labels("g1", "Schedulable").set(3)
        m["node_health"].labels("g1", "rebooting").set(0)
        m["reboots"].labels("recovered").inc()
        m["recovery"].labels("reboot").observe(21.5)
        prom.wait_for('hyperplan_training_plan_phase{phase="Active"} == 1', timeout=30)
        prom.wait_for("hyperplan_spare_promotion_seconds_count > 0", timeout=30)
        prom.wait_for("hyperplan_recovery_seconds_count > 0", timeout=30)
        time.sleep(1.5)
        data = demo_report.collect(prom, start, datetime.now(timezone.utc) + timedelta(seconds=1), step=1)

    phases = {s["metric"]["phase"]: s["values"] for s in data.series["plan_phase"]}
    assert set(phases) == {"Scheduled", "Active"}  # only the current phase's samples (== 1)
    assert max(float(t) for t, _ in phases["Scheduled"]) < min(float(t) for t, _ in phases["Active"])
    assert [s["metric"]["status"] for s in data.series["ultraserver_health"]] == ["ok"]
    assert float(data.series["group_nodes"][0]["values"][-1][1]) == 20
    (promote,) = [s for s in data.series["remediations"] if s["metric"]["action"] == "promote"]
    assert float(promote["values"][0][1]) == 0 and float(promote["values"][-1][1]) == 1
    assert [rise for _, rise in demo_report.increments(promote["values"])] == [1]
    assert demo_report.promotion_summary(data) == "1 spare promotion, mean 1.5 s from grace end to spare serving"

    rebooting = next(s for s in data.series["node_health"] if s["metric"]["state"] == "rebooting")
    assert [float(v) for _, v in rebooting["values"]][0] == 0 and max(float(v) for _, v in rebooting["values"]) == 1
    assert float(rebooting["values"][-1][1]) == 0  # back
    assert demo_report.recovery_summary(data) == "1 reboot recovered; mean time to recover: reboot 21.5 s"

    fig = demo_report.draw_overview(data)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["p1"]
    path = demo_report.write_overview(data, tmp_path / "overview.png")
    assert path.stat().st_size > 20_000
