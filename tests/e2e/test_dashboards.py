"""Every panel of the committed dashboards answers from a real Prometheus, and metrics follow objects.

One scenario (demo profile) on the session's operator, scraped every second by the session's real
Prometheus from before the scenario starts: a pool of two x36 UltraServers and a plan on them, a
group of 10 (8 + 2 active, a spare per UltraServer), an injected node failure and the spare that
takes over, and a second plan whose block is still ahead. Then:
- every target expression of every panel of ``deploy/grafana/*.json``, with ``$plan``, ``$group``
  and ``$pool`` set to the scenario's objects, returns at least one series with a value over the
  scenario's time range (a panel that shows nothing fails the test);
- ``/metrics`` read with the block active has samples for every declared ``hyperplan_`` family;
- once the group, the plans and the pools are deleted, none of their series is left.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hyperplan_dev.prometheus import Prometheus
from hyperplan.monitoring.dashboards import targets
from tests.e2e.scenarios import (
    API, Context, group_body, plan_body, pool_body, scenario, ts, utcnow, wait_phase,
)
from tests.kube import eventually

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
ITYPE = "ml.p6e-gb200.36xlarge"
# x36 (9 instances each): the x72 pools of test_instancegroups.py are not ours to race for.
US_TYPE = "ml.u-p6e-gb200x36"
GROUP_SIZE = 10  # 8 on the first UltraServer, 2 on the second, a spare on each
RATE_INTERVAL = "15s"  # what Grafana's $__rate_interval is for a 1s scrape and a short range


def _nodes(k, group: str) -> list[dict]:
    return k.get("nodes", None, "-l", f"hyperplan.dev/instance-group={group}")["items"]


def _set_not_ready(kube, node: str, since) -> None:
    when = ts(since)
    kube.core.patch_node_status(node, {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "HyperplanTest", "message": "set by the e2e test",
         "lastHeartbeatTime": when, "lastTransitionTime": when}]}})


def _families_without_samples(text: str) -> list[str]:
    return sorted(f.name for f in text_string_to_metric_families(text)
                  if f.name.startswith("hyperplan_") and not f.samples)


def _read_metrics(ctx: Context) -> str:
    """The operator's /metrics now (retried while it is restarting, as another test may make it)."""
    assert ctx.metrics is not None, "the scenarios fixture passes the operator's /metrics reader"

    def read() -> str | None:
        try:
            return ctx.metrics()
        except OSError:
            return None

    return eventually(read, timeout=60, what="the operator's /metrics")


@scenario
def dashboard_story(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    pool, plan, group = f"dash-gb-{tag}", f"dash-gb-{tag}", f"dash-workers-{tag}"
    later_pool, later_plan = f"dash-later-{tag}", f"dash-later-{tag}"
    later_type = f"ml.dash-{tag}.xlarge"
    out: dict = {"pool": pool, "plan": plan, "group": group, "later_plan": later_plan,
                 "later_pool": later_pool, "start": utcnow()}
    # Only this scenario's plan buys its pool (offerings come from every pool of a type, and
    # test_ultraserver_replacement.py runs an x36 plan beside it).
    k.create(pool_body(pool, ITYPE, 18, az=f"us-west-{tag}", ultraServerType=US_TYPE,
                       trainingPlanSelector={"matchLabels": {"e2e-scenario": plan}}))
    k.create(pool_body(later_pool, later_type, 4))
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": plan, "labels": {"e2e-scenario": plan}},
              "spec": {
        "ultraServerType": US_TYPE, "ultraServerCount": 2, "targetResource": "hyperpod-cluster",
        # Starts 40 s in: not on the boundary at ~25 s where test_plans.py measures a transition.
        "duration": "3m", "autoPurchase": True, "startTimeAfter": ts(utcnow() + timedelta(seconds=40))}})
    # A block well ahead: a "next block start" to show all along.
    k.create(plan_body(later_plan, later_type, 2, duration="1m", autoPurchase=True,
                       startTimeAfter=ts(utcnow() + timedelta(minutes=30))))
    k.create(group_body(group, plan, ITYPE, GROUP_SIZE, healthCheck={"graceSeconds": 5, "maxUnhealthy": 2, "rebootBudget": 0}))
    wait_phase(k, "trainingplan", plan, "Scheduled", timeout=60)
    wait_phase(k, "trainingplan", later_plan, "Scheduled", timeout=60)
    wait_phase(k, "instancegroup", group, "Ready", timeout=150)

    # A node on the second UltraServer fails; its spare takes over; the group is whole again.
    nodes = _nodes(k, group)
    victim = sorted(n["metadata"]["name"] for n in nodes
                    if n["metadata"]["labels"]["hyperplan.dev/role"] == "active"
                    and n["metadata"]["labels"]["hyperplan.dev/slot"].startswith("1-"))[0]
    failed_at = utcnow()
    _set_not_ready(ctx.kube, victim, failed_at)

    def promoted() -> dict | None:
        node = k.get_or_none("node", victim)
        if node is not None and "hyperplan.dev/replaces" not in str(node) and any(
                c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", [])):
            _set_not_ready(ctx.kube, victim, failed_at)  # KWOK's heartbeat wrote Ready back
        return next((n for n in _nodes(k, group) if n["metadata"]["labels"].get("hyperplan.dev/replaces") == victim
                     and n["metadata"]["labels"]["hyperplan.dev/role"] == "active"), None)

    out["promoted"] = eventually(promoted, timeout=60, interval=0.2, what="spare promoted")["metadata"]["name"]
    eventually(lambda: k.get_or_none("node", victim) is None, timeout=60, what="failed node removed")

    def whole() -> dict | None:
        st = k.get("instancegroup", group).get("status") or {}
        return st if st.get("phase") == "Ready" and st.get("readyCount") == GROUP_SIZE and st.get("spareCount") == 2 \
            and st.get("unhealthyCount") == 0 else None

    eventually(whole, timeout=60, what="group whole again")
    ultraservers = [u["id"] for u in k.get("trainingplan", plan)["status"].get("ultraServers", [])]
    out["ultraservers"] = ultraservers
    # /metrics with the block active: every declared family must have samples.
    out["metrics_active"] = _read_metrics(ctx)
    out["end"] = utcnow() + timedelta(seconds=3)
    eventually(lambda: utcnow() > out["end"], timeout=10, interval=0.5, what="last scrapes")

    # Deleting the objects takes their series with them.
    k.delete("instancegroup", group, "--wait=true", "--timeout=120s")
    for name in (plan, later_plan):
        k.delete("trainingplan", name, "--wait=true", "--timeout=60s")
    for name in (pool, later_pool):
        k.delete("capacitypool", name, "--wait=true", "--timeout=60s")
    names = [pool, plan, group, later_plan, later_pool, *ultraservers]

    def clean() -> str | None:
        text = _read_metrics(ctx)
        return text if not any(f'"{n}"' in text for n in names) else None

    out["metrics_after_delete"] = eventually(clean, timeout=30, what="series of deleted objects gone")
    out["names"] = names
    return out


def _record(scenarios) -> dict:
    return scenarios["dashboard_story"].result(timeout=600)


def _regex_value(value: str) -> str:
    """A variable's value as Grafana puts it into ``=~"..."``: regex characters escaped for PromQL."""
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", value)


def _filled(expr: str, record: dict) -> str:
    values = {"plan": _regex_value(record["plan"]), "group": _regex_value(record["group"]),
              "pool": _regex_value(record["pool"]), "__rate_interval": RATE_INTERVAL}
    filled = re.sub(r"\$(\w+)", lambda m: values[m.group(1)], expr)
    assert "$" not in filled, filled
    return filled


def _range(prom: Prometheus, expr: str, record: dict) -> list[dict]:
    data = prom.api("query_range", query=expr, start=str(record["start"].timestamp()),
                    end=str(record["end"].timestamp()), step="1")
    return data["result"]


def _finite(series: list[dict]) -> list[dict]:
    return [s for s in series if any(math.isfinite(float(v)) for _, v in s["values"])]


PANEL_TARGETS = [(path.name, title, ref, expr) for path in DASHBOARDS
                 for title, ref, expr in targets(json.loads(path.read_text()))]


def test_the_dashboards_have_targets() -> None:
    assert DASHBOARDS and len(PANEL_TARGETS) >= 12


@pytest.mark.parametrize("dashboard, title, ref, expr", PANEL_TARGETS,
                         ids=[f"{d}:{t}:{r}" for d, t, r, _ in PANEL_TARGETS])
def test_every_panel_target_returns_series(scenarios, session_prometheus: Prometheus, dashboard: str,
                                           title: str, ref: str, expr: str) -> None:
    record = _record(scenarios)
    filled = _filled(expr, record)
    series = _finite(_range(session_prometheus, filled, record))
    assert series, f"panel {title!r} ({dashboard}, {ref}) shows nothing: {filled}"


def test_phase_timeline_and_node_panels_tell_the_story(scenarios, session_prometheus: Prometheus) -> None:
    """Beyond 'not empty': the values a viewer reads off the main panels match the scenario."""
    record = _record(scenarios)
    plan, group = record["plan"], record["group"]
    phases = _range(session_prometheus, _filled(next(
        e for _, t, _, e in PANEL_TARGETS if t == "Plan phase over time"), record), record)
    (mine,) = [s for s in phases if s["metric"].get("plan") == plan]
    seen = [int(float(v)) for _, v in mine["values"]]
    codes = [c for i, c in enumerate(seen) if i == 0 or seen[i - 1] != c]
    assert 2 in codes and codes[-1] == 3, f"Scheduled, then Active at the end expected; saw {codes}"
    present = _range(session_prometheus, f'hyperplan_instance_group_nodes{{group="{group}", state="present"}}', record)
    assert max(float(v) for _, v in present[0]["values"]) >= GROUP_SIZE + 2
    # (The UltraServer's `impaired` may last less than a scrape interval: its panel is only
    # required to show a series; test_instancegroups.py watches the status for it.)
    health = _range(session_prometheus, f'hyperplan_ultraserver_health{{plan="{plan}", status="ok"}}', record)
    assert len(health) == 2, "one health series per UltraServer of the plan"
    marks = _range(session_prometheus, 'sum(increase(hyperplan_remediations_total{action="mark"}[1m]))', record)
    assert any(float(v) > 0 for s in marks for _, v in s["values"]), "the failed node was marked"
    promotions = _range(session_prometheus, 'sum(increase(hyperplan_spare_promotion_seconds_count[1m]))', record)
    assert any(float(v) > 0 for s in promotions for _, v in s["values"])


def test_every_declared_family_has_samples_with_the_block_active(scenarios) -> None:
    text = _record(scenarios)["metrics_active"]
    assert "# TYPE hyperplan_training_plan_phase gauge" in text
    assert _families_without_samples(text) == []


def test_deleted_objects_leave_no_series(scenarios) -> None:
    record = _record(scenarios)
    text = record["metrics_after_delete"]
    assert all(f'"{n}"' in record["metrics_active"] for n in record["names"])  # they were there
    left = [line for line in text.splitlines() if any(f'"{n}"' in line for n in record["names"])]
    assert left == []
