"""Extending a plan's last block (spec.extensions): the pure extension search, how a pass knows an
extension is bought from the ledger alone, the plan's decision, the ledger's in-place write, and
the real plan pass over recording fakes.

Extensions are written as strings so that each table row reads as the answer a user would see:
"pool:old end→new end (days)" (times UTC).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from hyperplan.actuation.ledger import KubeLedger
from hyperplan.api.models import (
    PURCHASED_SPEC_FIELDS, to_rfc3339, CapacityPool, CapacityPoolSpec, Reservation, TrainingPlanSpec, TrainingPlanStatus,
)
from hyperplan.controllers.plan.reconciler import reconcile_plan
from hyperplan.planning.blocks import Block
from hyperplan.planning.offerings import (
    Busy, PoolSnapshot, extension_held, extension_id, find_extension, search_extensions,
)
from hyperplan.planning.plans import decide_plan
from hyperplan.planning.policy import DEMO, SAGEMAKER
from tests.unit.fake_runtime import PLANS_PLURAL, make_world
from tests.unit.test_ledger_batches import FakeKube as LedgerKube

UTC = timezone.utc
NOW = datetime(2027, 1, 4, 0, 0, tzinfo=UTC)
START = datetime(2027, 1, 5, 11, 30, tzinfo=UTC)  # the bought block: 2 days from here
END = START + timedelta(days=2)
P5 = "ml.p5.48xlarge"
UID = "uid-llama"
BLOCK = Block(pool="pool-a", availability_zone="use1-az1", instance_type=P5, instance_count=8,
              start=START, end=END, id="rc-uidllama-0")


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def pool(count: int = 8, busy: tuple = (), name: str = "pool-a", zone: str = "use1-az1",
         itype: str = P5) -> PoolSnapshot:
    lines = tuple(Busy(ts(a), ts(b), n) for a, b, n in busy)
    return PoolSnapshot(name=name, instance_type=itype, availability_zone=zone, instance_count=count,
                        busy=(Busy(START, END, BLOCK.instance_count),) + lines)  # the plan's own line too


def shown(extensions) -> list[str]:
    return [f"{e.block.pool}:{e.start:%m-%d %H:%M}→{e.end:%m-%d %H:%M} ({e.days}d)" for e in extensions]


# --------------------------------------------------------------------------- the search


@pytest.mark.parametrize("pools, blocks, now, days, expected", [
    ([pool()], [BLOCK], NOW, None,
     ["pool-a:01-07 11:30→01-08 11:30 (1d)", "pool-a:01-07 11:30→01-14 11:30 (7d)",
      "pool-a:01-07 11:30→07-08 11:30 (182d)"]),
    ([pool(busy=[("2027-01-10 11:30", "2027-02-01 00:00", 8)])], [BLOCK], NOW, None,
     ["pool-a:01-07 11:30→01-08 11:30 (1d)", "pool-a:01-07 11:30→01-10 11:30 (3d)"]),
    ([pool(busy=[("2027-01-07 11:30", "2027-01-08 11:30", 1)])], [BLOCK], NOW, None, []),
    ([pool(count=12, busy=[("2027-01-07 11:30", "2027-01-08 11:30", 4)])], [BLOCK], NOW, None,
     ["pool-a:01-07 11:30→01-08 11:30 (1d)", "pool-a:01-07 11:30→01-14 11:30 (7d)",
      "pool-a:01-07 11:30→07-08 11:30 (182d)"]),
    ([pool()], [BLOCK], NOW, 2, ["pool-a:01-07 11:30→01-09 11:30 (2d)"]),
    ([pool(busy=[("2027-01-10 11:30", "2027-02-01 00:00", 8)])], [BLOCK], NOW, 4, []),
    ([pool()], [BLOCK], NOW, 183, []),
    ([pool()], [BLOCK], END - timedelta(minutes=4), None, []),
    ([pool()], [BLOCK], END - timedelta(days=57), None, []),
    ([pool(zone="use1-az2")], [BLOCK], NOW, None, []),
    ([pool(name="pool-b")], [BLOCK], NOW, None, []),
    ([pool()], [], NOW, None, []),
    ([pool()], [replace(BLOCK, start=START - timedelta(days=5), end=START - timedelta(days=3), id="rc-0"), BLOCK],
     NOW, 1, ["pool-a:01-07 11:30→01-08 11:30 (1d)"]),
], ids=["free-pool-offers-1-7-and-the-longest", "room-until-another-plan-shortens-the-longest",
        "no-room-right-after-the-block", "room-for-the-block-s-count-beside-others",
        "a-duration-asked-for", "a-duration-asked-for-longer-than-the-room", "longer-than-the-policy-allows",
        "too-late-to-buy-before-the-block-ends", "the-block-ends-beyond-max-start-ahead",
        "the-pool-moved-zone", "the-pool-is-gone", "an-unbought-plan", "the-last-of-two-blocks"])
def test_search_extensions(pools, blocks, now, days, expected) -> None:
    assert shown(search_extensions(UID, blocks, pools, SAGEMAKER, now, days)) == expected


def test_the_demo_profile_reads_a_day_as_a_minute() -> None:
    now = datetime(2027, 1, 1, 12, 0, tzinfo=UTC)
    block = replace(BLOCK, start=now + timedelta(seconds=30), end=now + timedelta(seconds=90))
    found = search_extensions(UID, [block], [pool()], DEMO, now, 2)
    assert [(e.start, e.end) for e in found] == [(block.end, block.end + timedelta(minutes=2))]


def test_an_extension_is_found_again_only_under_the_id_hyperplan_cut() -> None:
    [one, seven, _] = search_extensions(UID, [BLOCK], [pool()], SAGEMAKER, NOW)
    assert find_extension(UID, [BLOCK], [pool()], SAGEMAKER, NOW, seven.id) == seven
    assert one.id.startswith("tpe-20270107t113000-") and len(one.id) == len("tpe-20270107t113000-") + 16
    other_plan = extension_id("uid-other", BLOCK, seven.end)
    tampered = seven.id[:-1] + ("0" if seven.id[-1] != "0" else "1")
    for wanted in (other_plan, tampered, "tpo-20270107t113000-0123456789abcdef", "made-up"):
        assert find_extension(UID, [BLOCK], [pool()], SAGEMAKER, NOW, wanted) is None
    sold = pool(busy=[("2027-01-10 11:30", "2027-02-01 00:00", 8)])  # the room after day 3 is sold
    assert find_extension(UID, [BLOCK], [sold], SAGEMAKER, NOW, seven.id) is None
    assert find_extension(UID, [BLOCK], [sold], SAGEMAKER, NOW, one.id) == one


def test_the_ledger_alone_says_which_extensions_are_bought() -> None:
    [first] = search_extensions(UID, [BLOCK], [pool()], SAGEMAKER, NOW, 1)
    assert extension_held(UID, [BLOCK], SAGEMAKER, first.id) is None
    once = replace(BLOCK, end=first.end)  # the ledger line runs on
    assert extension_held(UID, [once], SAGEMAKER, first.id) == first
    [second] = search_extensions(UID, [once], [pool()], SAGEMAKER, NOW, 7)
    twice = replace(BLOCK, end=second.end)
    assert extension_held(UID, [twice], SAGEMAKER, first.id) == first
    assert extension_held(UID, [twice], SAGEMAKER, second.id) == second
    assert extension_held("uid-other", [twice], SAGEMAKER, first.id) is None


# --------------------------------------------------------------------------- the decision


def spec(*extensions: str) -> TrainingPlanSpec:
    return TrainingPlanSpec.model_validate({
        "instanceType": P5, "instanceCount": 8, "targetResource": "hyperpod-cluster", "duration": "2d",
        "offeringId": "tpo-20270105t113000-0123456789abcdef",
        "extensions": [{"offeringId": e} for e in extensions]})


def entries(status: TrainingPlanStatus) -> list[tuple]:
    return [(e.status, e.reason, e.end_time) for e in status.extensions]


def test_a_bought_plan_buys_its_extension_then_shows_it_bought() -> None:
    [ext] = search_extensions(UID, [BLOCK], [pool()], SAGEMAKER, NOW, 1)
    decision = decide_plan(spec(ext.id), 2, TrainingPlanStatus(), [BLOCK], [pool()], SAGEMAKER, NOW, uid=UID)
    assert decision.extend == ext
    assert entries(decision.status) == [("Pending", "Extending", ext.end)]
    extended = replace(BLOCK, end=ext.end)
    after = decide_plan(spec(ext.id), 2, decision.status, [extended], [pool()], SAGEMAKER, NOW, uid=UID)
    assert after.extend is None
    assert entries(after.status) == [("Scheduled", None, ext.end)]
    assert after.status.extensions[0].extended_at == NOW and after.status.extensions[0].duration_days == 1
    assert after.status.reserved_capacity[0].end_time == ext.end  # the block runs on, same id
    assert after.status.reserved_capacity[0].id == BLOCK.id
    [extended_condition] = [c for c in after.status.conditions if c.type == "Extended"]
    assert extended_condition.status == "True"
    assert [e.reason for e in after.events] == ["Extended"]
    again = decide_plan(spec(ext.id), 2, after.status, [extended], [pool()], SAGEMAKER, NOW + timedelta(days=4),
                        uid=UID)
    assert entries(again.status) == [("Active", None, ext.end)]
    assert "Extended" not in [e.reason for e in again.events]  # told once
    assert again.status.extensions[0].extended_at == NOW


def test_an_extension_not_cut_for_the_plan_fails_and_stays_failed() -> None:
    made_up = "tpe-20270107t113000-0123456789abcdef"
    decision = decide_plan(spec(made_up), 2, TrainingPlanStatus(), [BLOCK], [pool()], SAGEMAKER, NOW, uid=UID)
    assert decision.extend is None
    assert entries(decision.status) == [("Failed", "ExtensionNotOffered", None)]
    assert [(e.type, e.reason) for e in decision.events if e.type == "Warning"] == [("Warning", "ExtensionNotOffered")]
    [condition] = [c for c in decision.status.conditions if c.type == "Extended"]
    assert (condition.status, condition.reason) == ("False", "ExtensionNotOffered")
    assert decision.status.phase == "Scheduled"  # the plan itself is untouched
    again = decide_plan(spec(made_up), 2, decision.status, [BLOCK], [pool()], SAGEMAKER, NOW, uid=UID)
    assert entries(again.status) == entries(decision.status) and again.events == []


def test_later_extensions_wait_for_the_one_before() -> None:
    [one] = search_extensions(UID, [BLOCK], [pool()], SAGEMAKER, NOW, 1)
    [after_one] = search_extensions(UID, [replace(BLOCK, end=one.end)], [pool()], SAGEMAKER, NOW, 1)
    decision = decide_plan(spec(one.id, after_one.id), 2, TrainingPlanStatus(), [BLOCK], [pool()], SAGEMAKER, NOW,
                           uid=UID)
    assert decision.extend == one
    assert [(e.status, e.reason) for e in decision.status.extensions] == [("Pending", "Extending"),
                                                                          ("Pending", "Waiting")]
    then = decide_plan(spec(one.id, after_one.id), 2, decision.status, [replace(BLOCK, end=one.end)], [pool()],
                       SAGEMAKER, NOW, uid=UID)
    assert then.extend == after_one


def test_an_unbought_plan_lists_its_extensions_as_waiting_for_the_purchase() -> None:
    unbought = spec("tpe-20270107t113000-0123456789abcdef").model_copy(update={"offering_id": ""})
    decision = decide_plan(unbought, 1, TrainingPlanStatus(), [], [pool()], SAGEMAKER, NOW, uid=UID)
    assert decision.extend is None and decision.status.phase == "Pending"
    assert [(e.status, e.reason) for e in decision.status.extensions] == [("Pending", "NotPurchased")]


def test_every_spec_field_but_extensions_is_fixed_by_a_purchase() -> None:
    assert set(PURCHASED_SPEC_FIELDS) == {field.alias for name, field in TrainingPlanSpec.model_fields.items()
                                          if name != "extensions"}


# --------------------------------------------------------------------------- the ledger's write


def test_the_ledger_runs_the_block_on_in_place_and_rechecks_after_a_conflict() -> None:
    kube = LedgerKube()
    kube.add_pool("pool-a", 8)
    kube.pools["pool-a"]["spec"]["availabilityZone"] = "use1-az1"
    kube.pools["pool-a"]["status"]["reservations"] = [Reservation(
        training_plan="llama", training_plan_uid=UID, reserved_capacity_id=BLOCK.id, start_time=START,
        end_time=END, instance_count=8).wire()]
    ledger = KubeLedger(kube)
    [ext] = search_extensions(UID, [BLOCK], [pool()], SAGEMAKER, NOW, 3)
    kube.conflicts_left = 1
    result = ledger.extend("llama", UID, ext, SAGEMAKER, NOW)
    assert result.ok, result.violation
    assert [(b.id, b.start, b.end) for b in result.blocks] == [(BLOCK.id, START, ext.end)]
    [line] = kube.pools["pool-a"]["status"]["reservations"]
    assert Reservation.model_validate(line).end_time == ext.end
    writes = len(kube.writes)
    assert ledger.extend("llama", UID, ext, SAGEMAKER, NOW).ok  # a retry writes nothing
    assert len(kube.writes) == writes
    [later] = search_extensions(UID, list(result.blocks), [pool()], SAGEMAKER, NOW, 1)
    kube.pools["pool-a"]["status"]["reservations"].append(Reservation(
        training_plan="rival", training_plan_uid="uid-rival", reserved_capacity_id="rc-rival-0",
        start_time=ext.end, end_time=ext.end + timedelta(days=1), instance_count=1).wire())
    refused = ledger.extend("llama", UID, later, SAGEMAKER, NOW)
    assert refused.violation is not None and refused.violation.reason == "OfferingUnavailable"
    assert Reservation.model_validate(kube.pools["pool-a"]["status"]["reservations"][0]).end_time == ext.end


# --------------------------------------------------------------------------- the plan pass


def pass_world(monkeypatch, *extensions: str, rival: bool = False):
    pools = [CapacityPool(metadata={"name": "pool-a"}, spec=CapacityPoolSpec(
        instance_type=P5, availability_zone="use1-az1", instance_count=8))]
    pools[0].status.reservations.append(Reservation(
        training_plan="llama", training_plan_uid=UID, reserved_capacity_id=BLOCK.id, start_time=START,
        end_time=END, instance_count=8))
    body: dict[str, Any] = {
        "apiVersion": "hyperplan.dev/v1alpha1", "kind": "TrainingPlan",
        "metadata": {"name": "llama", "uid": UID, "generation": 2, "finalizers": ["hyperplan.dev/release-reservations"]},
        "spec": spec(*extensions).wire(), "status": {"phase": "Scheduled"}}
    world = make_world(monkeypatch, NOW, SAGEMAKER, plans=[body], pools=pools)
    if rival:  # another plan takes the room after the block; the pool watch has not shown it yet
        world.pool_watch.pause()
        pools[0].status.reservations.append(Reservation(
            training_plan="rival", training_plan_uid="uid-rival", reserved_capacity_id="rc-rival-0",
            start_time=END, end_time=END + timedelta(days=1), instance_count=8))
    return world


@pytest.mark.parametrize("rival", [False, True], ids=["bought", "room-sold-meanwhile"])
def test_the_plan_pass_extends_or_reports_why_not(monkeypatch, rival: bool) -> None:
    [ext] = search_extensions(UID, [BLOCK], [pool()], SAGEMAKER, NOW, 1)
    world = pass_world(monkeypatch, ext.id, rival=rival)
    try:
        world.run(reconcile_plan, "llama")
        assert [c[0] for c in world.calls] == ["extend", "patch_status"]
        [status] = world.status_patches(PLANS_PLURAL)
        [line] = [r for r in world.ledger.pool_objects[0].status.reservations if r.training_plan_uid == UID]
        [entry] = status["extensions"]
        [condition] = [c for c in status["conditions"] if c["type"] == "Extended"]
        if not rival:
            assert line.end_time == ext.end
            assert status["reservedCapacity"][0]["endTime"].startswith("2027-01-08T11:30:00")
            assert (entry["status"], entry["reservedCapacityId"], entry["durationDays"]) == ("Scheduled", BLOCK.id, 1)
            assert condition["status"] == "True"
            assert [e[2] for e in world.events] == ["Extended"]
            # what a kubectl user reads to extend again: offerings from the new end
            assert {o["startTime"] for o in status["extensionOfferings"]} == {to_rfc3339(ext.end)}
            assert [o["durationDays"] for o in status["extensionOfferings"]] == [1, 7, 182]
        else:
            assert line.end_time == END  # nothing bought
            assert (entry["status"], entry["reason"]) == ("Failed", "OfferingUnavailable")
            assert (condition["status"], condition["reason"]) == ("False", "OfferingUnavailable")
            assert [(e[1], e[2]) for e in world.events] == [("Warning", "OfferingUnavailable")]
            assert status["phase"] == "Scheduled"
        world.calls.clear()
        world.pool_watch.held = None
        world.run(reconcile_plan, "llama")
        assert "extend" not in [c[0] for c in world.calls]  # bought once, or failed once: never bought again
        if rival:  # the room sold shows now: no extension is offered any more
            assert world.status_patches(PLANS_PLURAL)[-1]["extensionOfferings"] == []
    finally:
        world.close()


def test_what_the_status_says_of_an_extension_decides_nothing_but_a_failure() -> None:
    [ext] = search_extensions(UID, [BLOCK], [pool()], SAGEMAKER, NOW, 1)
    claims = TrainingPlanStatus.model_validate({"extensions": [
        {"offeringId": ext.id, "status": "Active", "endTime": "2027-06-01T00:00:00Z"}]})
    # The status claims it bought; the ledger does not hold it: it is bought now.
    decision = decide_plan(spec(ext.id), 2, claims, [BLOCK], [pool()], SAGEMAKER, NOW, uid=UID)
    assert decision.extend == ext and entries(decision.status) == [("Pending", "Extending", ext.end)]
    # A status lost after the purchase: the ledger alone says it is bought (not bought again).
    lost = decide_plan(spec(ext.id), 2, TrainingPlanStatus(), [replace(BLOCK, end=ext.end)], [pool()], SAGEMAKER,
                       NOW, uid=UID)
    assert lost.extend is None and entries(lost.status) == [("Scheduled", None, ext.end)]


def test_a_refused_extension_lets_the_pass_decide_the_next_one(monkeypatch) -> None:
    """The user asked for 7 days, then (the same pass) for 1 day instead: the room after day 1 was
    sold meanwhile, so the ledger refuses the 7 and the pass goes on to buy the 1."""
    [one, seven, _] = search_extensions(UID, [BLOCK], [pool()], SAGEMAKER, NOW)
    world = pass_world(monkeypatch, seven.id, one.id)
    try:
        world.pool_watch.pause()
        world.ledger.pool_objects[0].status.reservations.append(Reservation(
            training_plan="rival", training_plan_uid="uid-rival", reserved_capacity_id="rc-rival-0",
            start_time=one.end, end_time=one.end + timedelta(days=30), instance_count=8))
        world.run(reconcile_plan, "llama")
        assert [c[0] for c in world.calls] == ["extend", "extend", "patch_status"]
        [status] = world.status_patches(PLANS_PLURAL)
        assert [(e["offeringId"], e["status"]) for e in status["extensions"]] == [(seven.id, "Failed"),
                                                                                 (one.id, "Scheduled")]
        assert [(e[1], e[2]) for e in world.events] == [("Warning", "OfferingUnavailable"), ("Normal", "Extended")]
        [line] = [r for r in world.ledger.pool_objects[0].status.reservations if r.training_plan_uid == UID]
        assert line.end_time == one.end
    finally:
        world.close()
