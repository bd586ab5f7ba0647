"""Values someone else wrote on a group's nodes never stall the group.

A group at an active block has three nodes. With kubectl, one gets a
``hyperplan.dev/health-signal-since`` without a timezone and another a sixty-digit
``hyperplan.dev/generation``; then the third fails (its health label says ``Unschedulable``).
The operator posts a Warning Event ``UnreadableValue`` naming each spoiled node and key, once,
reads the values as absent (and writes its own back), and still replaces the failed node (a new
node of the next generation in its slot: a plain block has no spares): the
group's passes never fail and it is Ready again with three nodes.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

from tests.e2e.scenarios import (
    Context, events_for, group_body, late_scenario, plan_body, pool_body, ts, utcnow, wait_phase,
)
from tests.kube import eventually

NAIVE = "2026-12-01T12:00:00"  # no timezone
SIXTY_DIGITS = "1" * 60


def _nodes(k, group: str) -> list[dict]:
    return k.get("nodes", None, "-l", f"hyperplan.dev/instance-group={group}")["items"]


def _condition(k, group: str, type_: str) -> dict | None:
    conds = (k.get("instancegroup", group).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_), None)


@late_scenario
def unreadable_values_on_nodes(ctx: Context) -> dict:
    k, tag = ctx.kubectl, uuid.uuid4().hex[:5]
    name, itype = f"strict-{tag}", f"ml.strict-{tag}.xlarge"  # a type of its own: no pool to share
    # A block of 4 for a group of 3: room for the replacement beside the node it replaces.
    k.create(pool_body(name, itype, 4, az="us-east-1c"))
    k.create(plan_body(name, itype, 4, duration="4m", autoPurchase=True,
                       startTimeAfter=ts(utcnow() + timedelta(seconds=15))))
    k.create(group_body(name, name, itype, 3, healthCheck={"graceSeconds": 5, "maxUnhealthy": 1, "rebootBudget": 0}))
    wait_phase(k, "instancegroup", name, "Ready", timeout=120)
    naive_node, huge_node, failing_node = sorted(n["metadata"]["name"] for n in _nodes(k, name))

    k.run("annotate", "node", naive_node, "--overwrite", f"hyperplan.dev/health-signal-since=Unschedulable@{NAIVE}")
    k.run("label", "node", huge_node, "--overwrite", f"hyperplan.dev/generation={SIXTY_DIGITS}")

    def warned() -> dict | None:
        found = {n: [e for e in events_for(k, n) if e.get("reason") == "UnreadableValue"]
                 for n in (naive_node, huge_node)}
        return found if all(found.values()) else None

    warnings = eventually(warned, timeout=60, what="an UnreadableValue Warning on each spoiled node")
    k.run("label", "node", failing_node, "--overwrite", "hyperplan.dev/node-health-status=Unschedulable")

    def replaced() -> list[dict] | None:
        nodes = _nodes(k, name)
        names = {n["metadata"]["name"] for n in nodes}
        return nodes if failing_node not in names and f"{failing_node}-g1" in names and len(nodes) == 3 else None

    nodes = eventually(replaced, timeout=90, interval=1, what="the failed node replaced")
    whole = eventually(lambda: (s := k.get("instancegroup", name).get("status") or {}).get("phase") == "Ready"
                       and s.get("readyCount") == 3 and s, timeout=60, what="group Ready again")
    out = {"name": name, "nodes": nodes, "status": whole, "failing": failing_node,
           "naive": naive_node, "huge": huge_node,
           "warnings": {n: [e for e in events_for(k, n) if e.get("reason") == "UnreadableValue"]
                        for n in (naive_node, huge_node)},
           "first_warnings": warnings,
           "group_events": [e for e in events_for(k, name) if e.get("reason") == "UnreadableValue"],
           "reconciled": _condition(k, name, "Reconciled"), "operator": ctx.operator}
    k.delete("instancegroup", name, "--wait=true", "--timeout=60s")
    k.delete("trainingplan", name, "--wait=true", "--timeout=60s")
    k.delete("capacitypool", name)
    return out


def test_unreadable_values_are_reported_once_and_the_group_goes_on(late_scenarios) -> None:
    r = late_scenarios["unreadable_values_on_nodes"].result(timeout=600)
    naive, huge = r["naive"], r["huge"]
    [naive_warning], [huge_warning] = r["warnings"][naive], r["warnings"][huge]  # once, not every pass
    assert naive_warning["type"] == "Warning"
    assert naive_warning["message"] == (f"node {naive}: annotation hyperplan.dev/health-signal-since: "
                                        f"'Unschedulable@{NAIVE}' has a time that has no timezone; ignored")
    assert huge_warning["message"] == (f"node {huge}: label hyperplan.dev/generation: '{SIXTY_DIGITS}' "
                                       "is out of range (0 to 1000000); ignored")
    assert sorted(e["message"] for e in r["group_events"]) == sorted(
        [naive_warning["message"], huge_warning["message"]])
    # The failure of the third node was remediated: replaced by a node of the next generation.
    by_name = {n["metadata"]["name"]: n for n in r["nodes"]}
    assert r["failing"] not in by_name
    backfill = by_name[f"{r['failing']}-g1"]  # a plain block has no spares: a new node in the slot
    assert backfill["metadata"]["labels"]["hyperplan.dev/generation"] == "1"
    # The spoiled values were read as absent, and the operator's own written back.
    assert by_name[huge]["metadata"]["labels"]["hyperplan.dev/generation"] == "0"
    assert "hyperplan.dev/health-signal-since" not in (by_name[naive]["metadata"].get("annotations") or {})
    # No pass failed.
    assert r["reconciled"] is None or r["reconciled"]["status"] == "True", json.dumps(r["reconciled"])
    log = r["operator"].log.read_text()
    assert "Traceback" not in "\n".join(line for line in log.splitlines() if r["name"] in line)
