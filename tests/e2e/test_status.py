"""`hyperplan status` as a user runs it, against the operator working on a real UltraServer plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

from tests.e2e.scenarios import Context, late_scenario, parse_ts, ts, utcnow
from tests.kube import eventually

API = "hyperplan.dev/v1alpha1"
ITYPE = "ml.p6e-gb200.36xlarge"
US_TYPE = "ml.u-p6e-gb200x72"


def hyperplan_status(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "hyperplan.cli", "status", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def status_json(kubeconfig: Path) -> dict:
    proc = hyperplan_status(kubeconfig, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def named(items: list[dict], name: str) -> dict | None:
    return next((i for i in items if i["name"] == name), None)


@late_scenario
def status_view(ctx: Context) -> dict:
    """One x72 UltraServer, a group of 4 (+1 spare); `hyperplan status` read while Ready and after a failure.

    The grace is long (30 s) so that the failed node is still there, NotReady, when the view reads it.
    """
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    plan, group = f"st-{tag}", f"st-workers-{tag}"
    k.create({"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": f"st-{tag}"},
              "spec": {"instanceType": ITYPE, "ultraServerType": US_TYPE, "availabilityZone": f"us-st-{tag}",
                       "instanceCount": 18}})
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": plan},
              "spec": {"ultraServerType": US_TYPE, "ultraServerCount": 1, "targetResource": "hyperpod-cluster",
                       "duration": "2m", "autoPurchase": True,
                       "startTimeAfter": ts(utcnow() + timedelta(seconds=20))}})
    k.create({"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": group},
              "spec": {"trainingPlanRef": plan, "instanceType": ITYPE, "instanceCount": 4,
                       "healthCheck": {"graceSeconds": 30, "maxUnhealthy": 2, "rebootBudget": 0}}})  # the view must catch the failed node
    out: dict = {"plan": plan, "group": group, "pool": f"st-{tag}", "az": f"us-st-{tag}"}

    def scheduled() -> dict | None:
        p = named(status_json(k.kubeconfig)["plans"], plan)
        return p if p and p["phase"] == "Scheduled" and p["blocks"] else None

    out["scheduled"] = eventually(scheduled, timeout=90, interval=1, what=f"{plan} Scheduled in the view")
    # Offerings come from every x72 pool; pools other scenarios left behind may sell this plan its
    # block. The view must show where the API says the block is.
    bought = k.get("trainingplan", plan)["status"]
    out["az"] = bought["availabilityZone"]
    out["pool"] = bought["reservedCapacity"][0].get("capacityPool") or f"st-{tag}"

    def ready() -> dict | None:
        doc = status_json(k.kubeconfig)
        g, p = named(doc["groups"], group), named(doc["plans"], plan)
        # The plan counts the group's nodes on its own pass, a moment after the group's: the view
        # has settled once both say the same (its UltraServer judged from Ready nodes).
        settled = p and [u.get("healthStatus") for u in p.get("ultraServers") or []] == ["ok"]
        return doc if g and g["phase"] == "Ready" and g["nodesByState"]["spare"] == 1 and settled else None

    out["ready"] = eventually(ready, timeout=120, interval=1, what=f"{group} Ready in the view")
    table = hyperplan_status(k.kubeconfig)
    out["table"] = (table.returncode, table.stdout, table.stderr)

    victim = sorted(n["name"] for n in named(out["ready"]["groups"], group)["nodes"] if n["role"] == "active")[0]
    failed_at = ts(utcnow())

    def fail() -> None:
        ctx.kube.core.patch_node_status(victim, {"status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "StatusTest", "message": "injected by the test",
             "lastHeartbeatTime": ts(utcnow()), "lastTransitionTime": failed_at}]}})

    fail()

    def unhealthy_seen() -> dict | None:
        doc = status_json(k.kubeconfig)
        g = named(doc["groups"], group)
        if g and any(n["name"] == victim and n["state"] == "unhealthy" for n in g["nodes"]):
            return doc
        # KWOK's heartbeat may write back a Ready=True it rendered before our patch; an agent
        # that sees its node still failing says so again.
        if g and any(n["name"] == victim for n in g["nodes"]):
            fail()
        return None

    out["victim"] = victim
    out["after_failure"] = eventually(unhealthy_seen, timeout=60, interval=0.5, what=f"{victim} unhealthy")
    for kind, name in (("instancegroup", group), ("trainingplan", plan), ("capacitypool", f"st-{tag}")):
        k.delete(kind, name, "--wait=false")
    return out


def _record(late_scenarios) -> dict:
    return late_scenarios["status_view"].result(timeout=600)


def test_json_shows_the_bought_plan_with_its_next_block(late_scenarios) -> None:
    r = _record(late_scenarios)
    p = r["scheduled"]
    assert p["availabilityZone"] == r["az"] and p["instanceType"] == ITYPE and p["totalInstanceCount"] == 18
    (block,) = p["blocks"]
    assert block["when"] == "next" and block["instanceCount"] == 18 and block["availabilityZone"] == r["az"]
    assert parse_ts(block["endTime"]) - parse_ts(block["startTime"]) == timedelta(minutes=2)
    assert parse_ts(p["nextTransitionTime"]) == parse_ts(block["startTime"])


def test_json_shows_the_ready_group_its_ultraserver_and_spare(late_scenarios) -> None:
    r = _record(late_scenarios)
    doc = r["ready"]
    p = named(doc["plans"], r["plan"])
    assert p["phase"] == "Active" and [b["when"] for b in p["blocks"]] == ["active"]
    (us,) = p["ultraServers"]
    assert us["healthStatus"] == "ok" and us["inUseInstanceCount"] == 4
    assert us["configuredSpareInstanceCount"] == 1 and us["availableSpareInstanceCount"] == 1
    g = named(doc["groups"], r["group"])
    assert g["trainingPlan"] == r["plan"] and g["availabilityZone"] == r["az"]
    assert g["nodesByState"] == {"active": 4, "spare": 1, "provisioning": 0, "checking": 0, "draining": 0, "rebooting": 0, "unhealthy": 0}
    (spare,) = [n["name"] for n in g["nodes"] if n["state"] == "spare"]
    assert us["spareNodes"] == [spare]
    assert all(n["ultraServer"] == us["id"] for n in g["nodes"])
    pool = named(doc["pools"], r["pool"])
    assert pool["soldNow"] >= 18 and pool["freeNow"] == pool["instanceCount"] - pool["soldNow"], pool


def test_json_shows_a_failed_node_as_unhealthy(late_scenarios) -> None:
    r = _record(late_scenarios)
    g = named(r["after_failure"]["groups"], r["group"])
    assert g["nodesByState"]["unhealthy"] >= 1
    assert next(n for n in g["nodes"] if n["name"] == r["victim"])["state"] == "unhealthy"


def test_the_table_names_the_plan_group_and_ultraserver(late_scenarios) -> None:
    r = _record(late_scenarios)
    rc, out, err = r["table"]
    assert rc == 0, err
    us_id = named(r["ready"]["plans"], r["plan"])["ultraServers"][0]["id"]
    plan_line = next(line for line in out.splitlines() if line.lstrip().startswith(r["plan"] + " "))
    assert "Active" in plan_line and "█" in plan_line and "│" in plan_line
    assert any(us_id in line and " ok " in line and "1/1" in line for line in out.splitlines())
    assert any(r["group"] in line and "Ready" in line and "active 4" in line and "spare 1" in line
               for line in out.splitlines())


def test_a_missing_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    proc = hyperplan_status(tmp_path / "nope")
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: the kubeconfig {tmp_path / 'nope'} does not exist"
