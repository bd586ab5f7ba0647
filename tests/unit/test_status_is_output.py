"""Status is output: what a plan buys comes from its spec, the policy and the pools, never from
``status.offerings``, which anyone allowed to write ``trainingplans/status`` may have rewritten.

The offering id is a digest of the blocks and the spec (planning.offerings.offering_id); with
``spec.offeringId`` set, the decision searches again and buys the offering carrying that id, or
refuses with a condition and a Warning Event. The forged cases rewrite a listed offering the
way a status writer would (camelCase JSON), then name it in ``spec.offeringId``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pytest

from hyperplan.actuation.ledger import pool_snapshot
from hyperplan.api.models import CapacityPool, CapacityPoolSpec, Reservation, TrainingPlanSpec, TrainingPlanStatus
from hyperplan.api.vocabulary import (
    PLAN_FINALIZER, REASON_OFFERING_MISMATCH, REASON_OFFERING_NO_LONGER_OFFERED, REASON_OFFERING_NOT_FOUND,
)
from hyperplan.controllers.plan.reconciler import reconcile_plan
from hyperplan.planning.blocks import Block
from hyperplan.planning.offerings import Offering, OfferingRequest, offering_id, start_named_by
from hyperplan.planning.plans import decide_plan, request_of
from hyperplan.planning.policy import SAGEMAKER, parse_duration
from tests.unit.fake_runtime import PLANS_PLURAL, make_world

UTC = timezone.utc
NOW = datetime(2027, 1, 4, 0, 0, tzinfo=UTC)  # SageMaker's first start from NOW: 2027-01-04 11:30
P5 = "ml.p5.48xlarge"
NAME, UID = "llama", "uid-llama"


def at(day: int, hour: int = 11, minute: int = 30) -> datetime:
    return datetime(2027, 1, day, hour, minute, tzinfo=UTC)


def capacity_pool(name: str, zone: str, count: int = 64, taken_from: datetime | None = None) -> CapacityPool:
    pool = CapacityPool(metadata={"name": name}, spec=CapacityPoolSpec(
        instance_type=P5, availability_zone=zone, instance_count=count))
    if taken_from is not None:  # another plan bought all of it for 60 days
        pool.status.reservations = [Reservation(
            training_plan="rival", training_plan_uid="uid-rival", reserved_capacity_id="rc-rival-0",
            start_time=taken_from, end_time=taken_from + timedelta(days=60), instance_count=count)]
    return pool


# Two big pools: room for far more than the 1 instance the spec asks for (the case).
POOLS = [pool_snapshot(capacity_pool("pool-a", "use1-az1")), pool_snapshot(capacity_pool("pool-b", "use1-az2"))]
SOLD = [pool_snapshot(capacity_pool("pool-a", "use1-az1", taken_from=at(1))),
        pool_snapshot(capacity_pool("pool-b", "use1-az2", taken_from=at(1)))]


def spec(**fields: Any) -> TrainingPlanSpec:
    return TrainingPlanSpec(**{"instance_type": P5, "instance_count": 1, "target_resource": "training-job",
                               "duration": "48h", **fields})


def request(**fields: Any) -> OfferingRequest:
    plan = spec(**fields)
    return request_of(plan, parse_duration(plan.duration))


# --------------------------------------------------------------------------- the digest

BLOCK = Block("pool-a", "use1-az1", P5, 1, at(4), at(6))


@pytest.mark.parametrize("blocks, asked", [
    pytest.param([replace(BLOCK, pool="pool-b")], request(), id="pool"),
    pytest.param([replace(BLOCK, availability_zone="use1-az2")], request(), id="zone"),
    pytest.param([replace(BLOCK, instance_type="ml.p4d.24xlarge")], request(), id="instance-type"),
    pytest.param([replace(BLOCK, instance_count=8)], request(), id="count"),
    pytest.param([replace(BLOCK, start=at(3))], request(), id="start"),
    pytest.param([replace(BLOCK, end=at(7))], request(), id="end"),
    pytest.param([replace(BLOCK, end=at(5)), Block("pool-a", "use1-az1", P5, 1, at(5), at(6))], request(),
                 id="one-block-cut-in-two"),
    pytest.param([BLOCK], request(instance_count=2), id="spec-count"),
    pytest.param([BLOCK], request(duration="72h"), id="spec-duration"),
    pytest.param([BLOCK], request(target_resource="hyperpod-cluster"), id="spec-target"),
    pytest.param([BLOCK], request(start_time_after=at(2)), id="spec-start-after"),
    pytest.param([BLOCK], request(end_time_before=at(20)), id="spec-end-before"),
])
def test_the_id_changes_with_every_block_field_and_every_spec_field_that_shapes_the_offering(blocks, asked) -> None:
    assert offering_id(blocks, asked) != offering_id([BLOCK], request())


def test_the_id_is_stable_and_names_its_start() -> None:
    first = offering_id([BLOCK], request())
    assert first == offering_id([BLOCK], request()) == Offering.from_blocks([BLOCK], request()).id
    assert first.startswith("tpo-20270104t113000-") and len(first) == 36
    assert start_named_by(first) == at(4)


@pytest.mark.parametrize("text", [
    "tpo-0000000000000000", "tpo-20271301t113000-0123456789abcdef", "tpo-20270104t113000-0123",
    "xyz-20270104t113000-0123456789abcdef", "tpo-20270104t113000-0123456789abcdef-x", "",
], ids=["old-form", "no-such-month", "short-digest", "other-prefix", "extra-part", "empty"])
def test_an_id_not_of_the_operators_form_names_no_start(text: str) -> None:
    assert start_named_by(text) is None


# --------------------------------------------------------------------------- buying with spec.offeringId


def searched() -> TrainingPlanStatus:
    return decide_plan(spec(), 1, TrainingPlanStatus(), [], POOLS, SAGEMAKER, NOW).status


def forge(status: TrainingPlanStatus, change: Callable[[dict[str, Any]], None]) -> tuple[TrainingPlanStatus, str]:
    """The status with its first offering rewritten by ``change`` (on the wire form), and the id
    the forged entry carries afterwards."""
    wire = status.wire()
    change(wire["offerings"][0])
    forged = TrainingPlanStatus.model_validate(wire)
    return forged, forged.offerings[0].id


def set_count(entry: dict[str, Any]) -> None:
    entry["blocks"][0]["instanceCount"] = 8


def later_end(entry: dict[str, Any]) -> None:
    entry["blocks"][0]["endTime"] = "2027-02-28T11:30:00Z"


def other_pool(entry: dict[str, Any]) -> None:
    block = entry["blocks"][0]
    block["capacityPool"], block["availabilityZone"] = "pool-expensive", "use1-az9"


def other_id(entry: dict[str, Any]) -> None:
    entry["id"] = "tpo-20270104t113000-0123456789abcdef"


def set_count_and_its_digest(entry: dict[str, Any]) -> None:
    """A forger who computes the digest too: the id then fits the blocks, but the search cuts no
    such offering for the spec."""
    set_count(entry)
    blocks = Offering.from_status(TrainingPlanStatus.model_validate({"offerings": [entry]}).offerings[0]).blocks
    entry["id"] = offering_id(blocks, request())


def unchanged(entry: dict[str, Any]) -> None:
    pass


@pytest.mark.parametrize("change, pools, now, reason", [
    pytest.param(set_count, POOLS, NOW, REASON_OFFERING_MISMATCH, id="forged-count"),
    pytest.param(later_end, POOLS, NOW, REASON_OFFERING_MISMATCH, id="forged-dates"),
    pytest.param(other_pool, POOLS, NOW, REASON_OFFERING_MISMATCH, id="forged-pool"),
    pytest.param(other_id, POOLS, NOW, REASON_OFFERING_MISMATCH, id="forged-id"),
    pytest.param(set_count_and_its_digest, POOLS, NOW, REASON_OFFERING_MISMATCH, id="forged-count-with-its-digest"),
    pytest.param(unchanged, SOLD, NOW, REASON_OFFERING_NO_LONGER_OFFERED, id="genuine-but-sold-since"),
    pytest.param(unchanged, POOLS, at(4, 11, 27), REASON_OFFERING_NO_LONGER_OFFERED,
                 id="genuine-but-too-late-to-buy"),
])
def test_an_offering_the_search_does_not_find_again_is_refused(change, pools, now: datetime, reason: str) -> None:
    forged, chosen = forge(searched(), change)

    decision = decide_plan(spec(offering_id=chosen), 2, forged, [], pools, SAGEMAKER, now)

    assert decision.buy is None  # nothing is bought
    assert decision.status.phase == "Failed"
    conditions = {c.type: (c.status, c.reason) for c in decision.status.conditions}
    assert conditions == {"Failed": ("True", reason), "Purchased": ("False", reason)}
    [event] = decision.events
    assert (event.type, event.reason) == ("Warning", reason)
    assert chosen in event.message and "nothing was bought" in event.message
    # The status shows what the search finds now, not the entry as it was written.
    assert forged.offerings[0] not in decision.status.offerings


def test_a_forged_count_is_named_in_the_refusal() -> None:
    forged, chosen = forge(searched(), set_count)
    [event] = decide_plan(spec(offering_id=chosen), 2, forged, [], POOLS, SAGEMAKER, NOW).events
    assert f"(8 x {P5} in pool-a 2027-01-04T11:30:00Z to 2027-01-06T11:30:00Z)" in event.message
    assert f"does not match the spec (1 x {P5} for 2d)" in event.message


def test_an_id_listed_nowhere_is_not_found() -> None:
    decision = decide_plan(spec(offering_id="tpo-20270104t113000-0123456789abcdef"), 2, searched(), [], POOLS,
                           SAGEMAKER, NOW)
    assert decision.buy is None
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", REASON_OFFERING_NOT_FOUND)]


@pytest.mark.parametrize("index, now", [
    pytest.param(0, NOW, id="best-offering-at-once"),
    pytest.param(1, NOW + timedelta(hours=2), id="second-offering-later"),
    # The search now opens at 2027-01-05 11:30 (30 min ahead), yet the first offering, seen at
    # midnight, still starts more than the 5 min a purchase needs ahead: it is found again.
    pytest.param(0, at(4, 11, 10), id="seen-at-midnight-bought-20-min-before-its-start"),
])
def test_a_genuine_offering_still_offered_is_bought_as_the_search_cuts_it(index: int, now: datetime) -> None:
    status = searched()
    chosen = status.offerings[index]
    forged, _ = forge(status, set_count) if index else (status, None)  # another entry's forgery is irrelevant

    decision = decide_plan(spec(offering_id=chosen.id), 2, forged, [], POOLS, SAGEMAKER, now)

    assert decision.buy is not None and decision.buy.id == chosen.id
    assert decision.buy == Offering.from_status(chosen)  # the same blocks the search listed
    assert all(block.instance_count == 1 for block in decision.buy.blocks)
    assert decision.status.phase == "Pending"


def test_auto_purchase_buys_the_searchs_best_whatever_the_status_lists() -> None:
    forged, _ = forge(searched(), set_count)
    decision = decide_plan(spec(auto_purchase=True), 2, forged, [], POOLS, SAGEMAKER, NOW)
    assert decision.buy is not None
    assert decision.buy.id == searched().offerings[0].id
    assert [b.instance_count for b in decision.buy.blocks] == [1]


# --------------------------------------------------------------------------- the plan pass


def plan_object(status: dict[str, Any], offering: str) -> dict[str, Any]:
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "TrainingPlan",
            "metadata": {"name": NAME, "uid": UID, "generation": 2, "finalizers": [PLAN_FINALIZER]},
            "spec": {"instanceType": P5, "instanceCount": 1, "targetResource": "training-job", "duration": "48h",
                     "offeringId": offering},
            "status": status}


@pytest.mark.parametrize("change, bought", [
    pytest.param(set_count, False, id="forged-count-buys-nothing"),
    pytest.param(unchanged, True, id="genuine-buys-the-spec"),
])
def test_the_plan_pass_buys_only_what_the_spec_asks(monkeypatch: pytest.MonkeyPatch, change, bought: bool) -> None:
    forged, chosen = forge(searched(), change)
    world = make_world(monkeypatch, NOW, SAGEMAKER, plans=[plan_object(forged.wire(), chosen)],
                       pools=[capacity_pool("pool-a", "use1-az1"), capacity_pool("pool-b", "use1-az2")])
    try:
        world.run(reconcile_plan, NAME)
        mine = [(p.metadata["name"], r.instance_count, r.start_time, r.end_time)
                for p in world.ledger.pool_objects for r in p.status.reservations if r.training_plan_uid == UID]
        [status] = world.status_patches(PLANS_PLURAL)
        if bought:
            assert mine == [("pool-a", 1, at(4), at(6))]
            assert status["phase"] == "Scheduled"
        else:
            assert mine == []
            assert [call[0] for call in world.calls if call[0] == "purchase"] == []
            assert status["phase"] == "Failed"
            failed = next(c for c in status["conditions"] if c["type"] == "Failed")
            assert failed["reason"] == REASON_OFFERING_MISMATCH
            assert [(type_, reason) for _, type_, reason, _ in world.events] == [("Warning", REASON_OFFERING_MISMATCH)]
    finally:
        world.close()
