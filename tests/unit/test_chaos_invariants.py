"""The invariants the chaos run asserts (hyperplan_testing.invariants): each must catch what it names."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hyperplan_testing import invariants as inv
from hyperplan.api.models import to_rfc3339

T0 = datetime(2027, 1, 1, 12, 0, tzinfo=timezone.utc)


def at(seconds: float) -> str:
    return to_rfc3339(T0 + timedelta(seconds=seconds))


def node(name: str, group: str = "g", block: str = "rc-1", slot: str = "0", generation: int = 0,
         role: str = "active", health: str = "Schedulable", ready: bool = True, spare_taint: bool = False,
         replaces: str | None = None, deleting: bool = False) -> dict:
    labels = {"hyperplan.dev/instance-group": group, "hyperplan.dev/reserved-capacity": block,
              "hyperplan.dev/slot": slot, "hyperplan.dev/generation": str(generation),
              "hyperplan.dev/role": role, "hyperplan.dev/node-health-status": health}
    if replaces:
        labels["hyperplan.dev/replaces"] = replaces
    meta: dict = {"name": name, "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = at(0)
    taints = [{"key": "hyperplan.dev/spare", "value": "true", "effect": "NoSchedule"}] if spare_taint else []
    return {"metadata": meta, "spec": {"taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


@pytest.mark.parametrize("nodes, conflicts", [
    pytest.param([node("a", slot="0"), node("b", slot="1")], 0, id="one-node-per-slot"),
    pytest.param([node("a"), node("a-g1", generation=1)], 1, id="two-live-nodes-in-a-slot"),
    pytest.param([node("a", health="UnschedulablePendingReplacement"), node("a-g1", generation=1)], 0,
                 id="failed-node-marked-beside-its-replacement"),
    pytest.param([node("a", deleting=True), node("a-g1", generation=1)], 0, id="old-node-being-deleted"),
    pytest.param([node("a", block="rc-1"), node("b", block="rc-2")], 0, id="same-slot-on-two-blocks"),
    pytest.param([node("a", group="g1"), node("b", group="g2")], 0, id="same-slot-in-two-groups"),
    pytest.param([node("a"), node("b"), node("c")], 1, id="three-in-one-slot-is-one-conflict"),
    pytest.param([{"metadata": {"name": "foreign", "labels": {}}}, node("a")], 0, id="foreign-nodes-ignored"),
])
def test_slot_conflicts(nodes, conflicts) -> None:
    found = inv.slot_conflicts(nodes)
    assert len(found) == conflicts, found
    if conflicts:
        assert "live nodes" in found[0]


def pool(count: int, reservations=(), unavailable=()) -> dict:
    return {"metadata": {"name": "p"}, "spec": {"instanceCount": count, "unavailable": [
        {"start": at(s), "end": at(e), "instanceCount": n} for s, e, n in unavailable]},
        "status": {"reservations": [
            {"trainingPlan": f"plan-{i}", "trainingPlanUid": f"uid-{i}", "reservedCapacityId": f"rc-{i}",
             "startTime": at(s), "endTime": at(e), "instanceCount": n} for i, (s, e, n) in enumerate(reservations)]}}


@pytest.mark.parametrize("p, overbooked", [
    pytest.param(pool(16, [(0, 60, 8), (0, 60, 8)]), False, id="exactly-full"),
    pytest.param(pool(16, [(0, 60, 8), (30, 90, 16)]), True, id="overlap-above-capacity"),
    pytest.param(pool(16, [(0, 60, 16), (60, 120, 16)]), False, id="back-to-back-half-open"),
    pytest.param(pool(16, [(0, 60, 8)], unavailable=[(30, 40, 9)]), True, id="unavailable-window-counts"),
    pytest.param(pool(16, [(0, 60, 8)], unavailable=[(60, 70, 16)]), False, id="unavailable-after"),
    pytest.param(pool(8, []), False, id="empty-ledger"),
])
def test_ledger_overbooking(p, overbooked) -> None:
    found = inv.ledger_overbooking(p)
    assert bool(found) == overbooked, found


def plan(name: str, uid: str, blocks=()) -> dict:
    return {"metadata": {"name": name, "uid": uid}, "status": {"reservedCapacity": [
        {"id": i, "startTime": at(s), "endTime": at(e), "instanceCount": n} for i, s, e, n in blocks]}}


def ledger(*entries) -> dict:
    return {"metadata": {"name": "p"}, "spec": {"instanceCount": 64}, "status": {"reservations": [
        {"trainingPlan": plan_name, "trainingPlanUid": uid, "reservedCapacityId": rid, "startTime": at(s),
         "endTime": at(e), "instanceCount": n} for plan_name, uid, rid, s, e, n in entries]}}


@pytest.mark.parametrize("plans, pools, now, problem", [
    pytest.param([plan("a", "u1", [("rc-a", 0, 60, 8)])], [ledger(("a", "u1", "rc-a", 0, 60, 8))], 0, None,
                 id="bought-once-matches"),
    pytest.param([plan("a", "u1")], [ledger(("a", "u1", "rc-a", 0, 60, 8))], 0, "ledger",
                 id="ledger-holds-what-the-plan-does-not-show"),
    pytest.param([plan("a", "u1", [("rc-a", 0, 60, 8)])], [ledger()], 0, "does not hold",
                 id="plan-shows-what-the-ledger-does-not-hold"),
    pytest.param([plan("a", "u1", [("rc-a", 0, 60, 8)])],
                 [ledger(("a", "u1", "rc-a", 0, 60, 8)), ledger(("a", "u1", "rc-a", 0, 60, 8))], 0, "twice",
                 id="same-reservation-in-two-pools"),
    pytest.param([plan("a", "u1", [("rc-a", 0, 60, 8)])], [ledger(("a", "u1", "rc-a", 0, 120, 8))], 0, "ledger",
                 id="ledger-window-differs"),
    pytest.param([], [ledger(("gone", "u9", "rc-g", 0, 60, 8))], 30, "no longer exists",
                 id="gone-plan-leaked-its-reservation"),
    pytest.param([], [ledger(("gone", "u9", "rc-g", 0, 60, 8))], 60, None,
                 id="gone-plan-keeps-its-ended-history"),
])
def test_ledger_mismatches(plans, pools, now, problem) -> None:
    found = inv.ledger_mismatches(plans, pools, T0 + timedelta(seconds=now))
    if problem is None:
        assert found == []
    else:
        assert found and problem in found[0], found


def test_purchase_history_flags_a_second_purchase_and_a_rewritten_reservation() -> None:
    h = inv.PurchaseHistory()
    assert h.plan(plan("a", "u1")) == []  # not bought yet
    assert h.plan(plan("a", "u1", [("rc-a", 0, 60, 8)])) == []
    assert h.plan(plan("a", "u1", [("rc-a", 0, 60, 8)])) == []  # the same version again
    assert "bought again" in h.plan(plan("a", "u1", [("rc-a", 60, 120, 8)]))[0]
    assert h.pool(ledger(("a", "u1", "rc-a", 0, 60, 8))) == []
    assert "changed" in h.pool(ledger(("a", "u1", "rc-a", 5, 65, 8)))[0]


def test_promotion_history_allows_one_spare_per_failure() -> None:
    h = inv.PromotionHistory()
    assert h.node(node("s1", replaces="a")) == []
    assert h.node(node("s1", replaces="a")) == []  # later versions of the same spare
    assert h.node(node("s2", replaces="b")) == []  # another failure
    assert h.node(node("x")) == []
    found = h.node(node("s3", replaces="a"))
    assert found and "2 spares promoted for the failure of a" in found[0]
    assert h.promotions == 2


def group(name: str, phase: str = "Ready", ready: int = 2, desired: int = 2, unhealthy: int = 0,
          deleting: bool = False) -> dict:
    meta: dict = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = at(0)
    return {"metadata": meta, "status": {"phase": phase, "readyCount": ready, "desiredCount": desired,
                                         "unhealthyCount": unhealthy}}


@pytest.mark.parametrize("groups, allow_deleting, orphans", [
    pytest.param([group("g")], True, 0, id="group-alive"),
    pytest.param([], True, 1, id="group-gone"),
    pytest.param([group("g", deleting=True)], True, 0, id="group-deleting-nodes-draining"),
    pytest.param([group("g", deleting=True)], False, 1, id="group-deleting-after-convergence"),
])
def test_orphaned_nodes(groups, allow_deleting, orphans) -> None:
    found = inv.orphaned_nodes([node("a"), {"metadata": {"name": "foreign"}}], groups, allow_deleting=allow_deleting)
    assert len(found) == orphans, found


WHOLE = [node("a", slot="0-0"), node("b", slot="0-1"), node("s", slot="0-2", role="spare", spare_taint=True)]


@pytest.mark.parametrize("g, nodes, short", [
    pytest.param(group("g"), WHOLE, None, id="converged"),
    pytest.param(group("g", phase="Provisioning"), WHOLE, "phase", id="status-not-ready"),
    pytest.param(group("g", ready=1), WHOLE, "status ready", id="status-short"),
    pytest.param(group("g", unhealthy=1), WHOLE, "unhealthy", id="status-unhealthy"),
    pytest.param(group("g"), WHOLE[:2], "active", id="spare-missing"),
    pytest.param(group("g"), [*WHOLE[:2], node("s", slot="0-2", role="spare")], "active",
                 id="spare-without-its-taint"),
    pytest.param(group("g"), [*WHOLE, node("f", slot="0-3", health="UnschedulablePendingReplacement")], "active",
                 id="failed-node-still-there"),
    pytest.param(group("g"), [WHOLE[0], node("b", slot="0-1", ready=False), WHOLE[2]], "active",
                 id="active-node-not-ready"),
    pytest.param(group("g"), [*WHOLE[:2], node("s", slot="0-2", role="spare", spare_taint=True, block="rc-2")],
                 "blocks", id="nodes-on-two-blocks"),
])
def test_group_shortfall(g, nodes, short) -> None:
    found = inv.group_shortfall(g, nodes, inv.Expected(active=2, spares=1))
    if short is None:
        assert found is None
    else:
        assert found is not None and short in found, found
