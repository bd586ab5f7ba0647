"""Tenancy on the local plane: a plan lets in only the groups its selector matches, and a pool sells
only to the plans its selector matches (docs/security.md, "Trust model").

A plan with ``instanceGroupSelector: {matchLabels: {team: a}}`` and two groups, labelled team=a and
team=b: the first gets its node and is Ready; the second is ``Bound=False`` with reason
``NotAllowed``, a Warning Event says so, and no node carries its name. A pool with
``trainingPlanSelector: {matchLabels: {team: x}}`` and a plan labelled team=y, the only pool of its
type: the plan stays Pending with no offerings, and the pool's ledger stays empty.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

from tests.e2e.scenarios import (
    Context, events_for, group_body, plan_body, pool_body, scenario, ts, utcnow, wait_phase,
)
from tests.kube import eventually


def labelled(body: dict, **labels: str) -> dict:
    body["metadata"]["labels"] = labels
    return body


@scenario
def groups_the_plan_lets_in(ctx: Context) -> dict:
    k, tag = ctx.kubectl, uuid.uuid4().hex[:5]
    itype, plan = f"ml.tenancy-{tag}.xlarge", f"team-a-{tag}"
    start = utcnow() + timedelta(seconds=20)
    k.create(pool_body(plan, itype, 4, az="us-east-1c"))
    k.create(plan_body(plan, itype, 2, duration="2m", autoPurchase=True, startTimeAfter=ts(start),
                       instanceGroupSelector={"matchLabels": {"team": "a"}}))
    allowed, intruder = f"a-{tag}", f"b-{tag}"
    k.create(labelled(group_body(allowed, plan, itype, 1), team="a"))
    k.create(labelled(group_body(intruder, plan, itype, 1), team="b"))

    def not_allowed() -> dict | None:
        conds = (k.get("instancegroup", intruder).get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "Bound" and c["status"] == "False"), None)

    bound = eventually(not_allowed, timeout=60, what="Bound=False on the group the plan does not let in")
    ready = wait_phase(k, "instancegroup", allowed, "Ready", timeout=120)
    intruder_status = k.get("instancegroup", intruder)["status"]
    nodes = {name: [n["metadata"]["name"] for n in
                    k.get("nodes", None, "-l", f"hyperplan.dev/instance-group={name}")["items"]]
             for name in (allowed, intruder)}
    events = [e for e in events_for(k, intruder) if e.get("reason") == "NotAllowed"]
    for name in (allowed, intruder):
        k.delete("instancegroup", name, "--wait=true", "--timeout=60s")
    k.delete("trainingplan", plan, "--wait=true", "--timeout=60s")
    k.delete("capacitypool", plan)
    return {"plan": plan, "bound": bound, "ready": ready, "intruder": intruder_status, "nodes": nodes,
            "events": events, "allowed": allowed, "intruder_name": intruder}


def test_a_plan_binds_only_the_groups_its_selector_lets_in(scenarios) -> None:
    r = scenarios["groups_the_plan_lets_in"].result(timeout=600)
    assert r["ready"]["readyCount"] == 1
    assert len(r["nodes"][r["allowed"]]) == 1
    assert r["nodes"][r["intruder_name"]] == []
    assert r["bound"]["reason"] == "NotAllowed"
    assert f"training plan {r['plan']} allows only instance groups with labels matching team=a" \
        in r["bound"]["message"]
    assert r["intruder"]["phase"] == "Failed"
    assert r["intruder"].get("desiredCount", 0) == 0
    assert r["events"] and r["events"][0]["type"] == "Warning", r["events"]


@scenario
def plans_the_pool_sells_to(ctx: Context) -> dict:
    k, tag = ctx.kubectl, uuid.uuid4().hex[:5]
    itype, name = f"ml.tenancy-pool-{tag}.xlarge", f"team-y-{tag}"
    k.create(pool_body(name, itype, 4, az="us-east-1c", trainingPlanSelector={"matchLabels": {"team": "x"}}))
    k.create(labelled(plan_body(name, itype, 2, duration="2m", autoPurchase=True,
                                startTimeAfter=ts(utcnow() + timedelta(seconds=20))), team="y"))
    pending = wait_phase(k, "trainingplan", name, "Pending", timeout=60)
    time.sleep(10)  # several passes later: still nothing bought
    later = k.get("trainingplan", name)["status"]
    pool = k.get("capacitypool", name)
    k.delete("trainingplan", name, "--wait=true", "--timeout=60s")
    k.delete("capacitypool", name)
    return {"pending": pending, "later": later, "pool": pool}


def test_a_plan_the_pool_does_not_sell_to_sees_no_offerings_from_it(scenarios) -> None:
    r = scenarios["plans_the_pool_sells_to"].result(timeout=600)
    later = r["later"]
    assert later["phase"] == "Pending"
    assert later.get("offerings", []) == []
    assert later.get("reservedCapacity", []) == []
    offered = next(c for c in later["conditions"] if c["type"] == "OfferingsAvailable")
    assert (offered["status"], offered["reason"]) == ("False", "NoCapacity")
    assert (r["pool"].get("status") or {}).get("reservations", []) == []
