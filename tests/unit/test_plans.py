"""decide_plan: a TrainingPlan's whole desired status, the offering to buy, events and wake time.

Also the in-memory capacity ledger (FakeLedger) that the plan handler's unit tests use.

All times are fixed; nothing here reads the clock or talks to a cluster.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hyperplan_testing.fakes import FakeLedger
from hyperplan.actuation.ledger import (
    CapacityLedger,
    blocks_of,
    pool_snapshot,
    reserved_capacity_id,
)
from hyperplan.api.models import (
    CapacityPool,
    CapacityPoolSpec,
    Condition,
    Reservation,
    TrainingPlanSpec,
    TrainingPlanStatus,
    UltraServerStatus,
    UnavailableWindow,
)
from hyperplan.planning.offerings import (
    ULTRASERVER_INSTANCE_TYPE,
    Block,
    Offering,
    RuleViolation,
)
from hyperplan.planning.plans import (
    Event,
    PlanUsage,
    decide_plan,
    failed,
)
from hyperplan.planning.policy import DEMO, SAGEMAKER

UTC = timezone.utc
P5 = "ml.p5.48xlarge"
X72 = "ml.u-p6e-gb200x72"

# Search time: midnight UTC. Under the sagemaker policy blocks start and end at 11:30 UTC,
# and the first start at least 30 min after the search is 2027-01-04 11:30.
NOW = datetime(2027, 1, 4, 0, 0, tzinfo=UTC)


def at(day: int, hour: int = 11, minute: int = 30) -> datetime:
    return datetime(2027, 1, day, hour, minute, tzinfo=UTC)


def pool(name: str, az: str, count: int = 8, *, instance_type: str = P5, ultra: str | None = None,
         unavailable: tuple[tuple[datetime, datetime, int], ...] = (),
         reservations: tuple[Reservation, ...] = ()) -> CapacityPool:
    p = CapacityPool(
        metadata={"name": name},
        spec=CapacityPoolSpec(
            instance_type=instance_type, availability_zone=az, instance_count=count,
            ultra_server_type=ultra,
            unavailable=[UnavailableWindow(start=s, end=e, instance_count=c) for s, e, c in unavailable]))
    p.status.reservations = list(reservations)
    return p


# Pool A (az1) is sold out for one day from 01-05 11:30; pool B (az2) is free. A 48 h
# hyperpod-cluster request then has three offerings, best first:
#   1. B, one contiguous block 01-04 -> 01-06 (ends first);
#   2. A, two 24 h blocks around the sold-out day (ends 01-07; a different AZ than 1);
#   3. A, one contiguous block 01-06 -> 01-08 (ends last, but in one block).
# B split into 24 h + 24 h ends with offering 1 and has more blocks, so it is dropped.
POOL_A = pool("pool-a", "use1-az1", unavailable=((at(5), at(6), 8),))
POOL_B = pool("pool-b", "use1-az2")
POOLS = [pool_snapshot(POOL_A), pool_snapshot(POOL_B)]
EXPECTED_OFFERINGS = [
    [("pool-b", "use1-az2", at(4), at(6))],
    [("pool-a", "use1-az1", at(4), at(5)), ("pool-a", "use1-az1", at(6), at(7))],
    [("pool-a", "use1-az1", at(6), at(8))],
]
# Sold out for longer than capacity is sold ahead (56 days).
SOLD_OUT = [pool_snapshot(pool("pool-a", "use1-az1", unavailable=((at(1), at(1) + timedelta(days=90), 8),)))]


def spec(**kw) -> TrainingPlanSpec:
    fields = dict(instance_type=P5, instance_count=8, target_resource="hyperpod-cluster", duration="48h")
    fields.update(kw)
    return TrainingPlanSpec(**fields)


def shown_blocks(status_offering) -> list[tuple]:
    return [(b.capacity_pool, b.availability_zone, b.start_time, b.end_time) for b in status_offering.blocks]


def cond(status: TrainingPlanStatus, type_: str) -> Condition:
    found = [c for c in status.conditions if c.type == type_]
    assert len(found) == 1, status.conditions
    return found[0]


def summary(status: TrainingPlanStatus) -> list[tuple]:
    return [(c.type, c.status, c.reason) for c in status.conditions]


def kinds(events: list[Event]) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in events]


# =========================================================================== Pending


def test_pending_lists_offerings_best_first():
    d = decide_plan(spec(), 1, TrainingPlanStatus(), [], POOLS, SAGEMAKER, NOW)

    assert d.status.phase == "Pending"
    assert [shown_blocks(o) for o in d.status.offerings] == EXPECTED_OFFERINGS
    assert [(o.duration_hours, o.duration_minutes) for o in d.status.offerings] == [(48, 0)] * 3
    assert all(o.id.startswith(f"tpo-{o.blocks[0].start_time:%Y%m%dt%H%M%S}-") and len(o.id) == 36
               for o in d.status.offerings)
    assert len({o.id for o in d.status.offerings}) == 3
    assert all(b.instance_type == P5 and b.instance_count == 8
               for o in d.status.offerings for b in o.blocks)
    assert summary(d.status) == [("OfferingsAvailable", "True", "OfferingsFound"),
                                 ("Purchased", "False", "NotPurchased")]
    assert cond(d.status, "OfferingsAvailable").message == (
        "3 offering(s) found; set spec.offeringId to buy one, or spec.autoPurchase")
    assert all(c.last_transition_time == NOW and c.observed_generation == 1 for c in d.status.conditions)
    assert d.status.observed_generation == 1
    assert d.status.next_transition_time is None
    assert d.buy is None
    assert d.events == [Event("Normal", "OfferingsFound",
                              "3 offering(s) found; set spec.offeringId to buy one, or spec.autoPurchase")]
    # Look again when the earliest offering can no longer be bought (5 min before its start).
    assert d.wake_at == at(4, 11, 25)


def test_offerings_found_event_is_posted_once():
    first = decide_plan(spec(), 1, TrainingPlanStatus(), [], POOLS, SAGEMAKER, NOW)
    later = NOW + timedelta(minutes=10)
    again = decide_plan(spec(), 1, first.status, [], POOLS, SAGEMAKER, later)

    assert kinds(first.events) == [("Normal", "OfferingsFound")]
    assert again.events == []
    assert [shown_blocks(o) for o in again.status.offerings] == EXPECTED_OFFERINGS
    # Neither condition flipped, so neither transition time moved.
    assert [c.last_transition_time for c in again.status.conditions] == [NOW, NOW]


def test_no_capacity_is_not_an_error():
    d = decide_plan(spec(), 1, TrainingPlanStatus(), [], SOLD_OUT, SAGEMAKER, NOW)

    assert d.status.phase == "Pending"
    assert d.status.offerings == []
    assert summary(d.status) == [("OfferingsAvailable", "False", "NoCapacity"),
                                 ("Purchased", "False", "NotPurchased")]
    message = "no capacity fits the request in the window; searching again when pools change"
    assert cond(d.status, "OfferingsAvailable").message == message
    assert d.events == [Event("Normal", "NoCapacity", message)]
    assert d.buy is None
    assert d.wake_at is None

    # Said once: the next pass with the same answer posts nothing.
    again = decide_plan(spec(), 1, d.status, [], SOLD_OUT, SAGEMAKER, NOW + timedelta(minutes=1))
    assert again.events == []
    assert cond(again.status, "OfferingsAvailable").last_transition_time == NOW


def test_capacity_appearing_flips_the_condition_and_posts_offerings_found():
    none = decide_plan(spec(), 1, TrainingPlanStatus(), [], SOLD_OUT, SAGEMAKER, NOW)
    later = NOW + timedelta(minutes=3)
    some = decide_plan(spec(), 1, none.status, [], POOLS, SAGEMAKER, later)

    assert summary(some.status)[0] == ("OfferingsAvailable", "True", "OfferingsFound")
    assert cond(some.status, "OfferingsAvailable").last_transition_time == later
    assert cond(some.status, "Purchased").last_transition_time == NOW  # still False
    assert kinds(some.events) == [("Normal", "OfferingsFound")]


# =========================================================================== rule violations


@pytest.mark.parametrize(
    "fields, reason, message",
    [
        pytest.param(dict(duration="36h"), "DurationNotWholeDays",
                     "duration 1d12h is not a whole number of days (a day is 1d under policy sagemaker)",
                     id="duration-not-whole-days"),
        pytest.param(dict(duration="183d"), "DurationOutOfRange",
                     "duration 183d is outside 1d to 182d", id="duration-too-long"),
        pytest.param(dict(duration="0d"), "DurationOutOfRange",
                     "duration 0s is outside 1d to 182d", id="duration-zero"),
        pytest.param(dict(start_time_after=NOW + timedelta(days=60)), "StartTooFarAhead",
                     "the earliest possible start 2027-03-05T11:30:00Z is more than 56d ahead; "
                     "a plan must start by 2027-03-01T00:00:00Z", id="start-too-far-ahead"),
        pytest.param(dict(start_time_after=at(10), end_time_before=at(11)), "WindowTooShort",
                     "the window 2027-01-10T11:30:00Z to 2027-01-11T11:30:00Z is shorter than the "
                     "duration 2d", id="window-shorter-than-duration"),
        pytest.param(dict(end_time_before=NOW + timedelta(days=2, minutes=10)), "StartTooSoon",
                     "to end by 2027-01-06T00:10:00Z the plan would have to start by "
                     "2027-01-04T00:10:00Z, but plans start at 2027-01-04T00:30:00Z at the earliest",
                     id="start-too-soon"),
        pytest.param(dict(duration="2 days"), "InvalidDuration",
                     "invalid duration '2 days': use whole numbers with units d, h, m, s, largest unit "
                     "first, e.g. '48h', '2d', '1h30m'", id="invalid-duration-text"),
        pytest.param(dict(duration="h48"), "InvalidDuration",
                     "invalid duration 'h48': use whole numbers with units d, h, m, s, largest unit "
                     "first, e.g. '48h', '2d', '1h30m'", id="invalid-duration-unit-first"),
    ],
)
def test_rule_violation_fails_the_plan(fields, reason, message):
    d = decide_plan(spec(**fields), 1, TrainingPlanStatus(), [], POOLS, SAGEMAKER, NOW)

    assert d.status.phase == "Failed"
    assert summary(d.status) == [("Failed", "True", reason), ("Purchased", "False", reason)]
    assert [c.message for c in d.status.conditions] == [message, message]
    assert d.status.observed_generation == 1
    assert d.events == [Event("Warning", reason, message)]
    assert d.buy is None
    assert d.wake_at is None


def test_several_violations_report_the_first_reason_and_every_message():
    # Past the schema (which would reject the target at apply time), planning still says why.
    s = spec().model_copy(update={"target_resource": "inference", "duration": "36h"})
    d = decide_plan(s, 1, TrainingPlanStatus(), [], POOLS, SAGEMAKER, NOW)

    assert summary(d.status)[0] == ("Failed", "True", "UnknownTargetResource")
    assert cond(d.status, "Failed").message == (
        "targetResource 'inference' is not one of training-job, hyperpod-cluster; "
        "duration 1d12h is not a whole number of days (a day is 1d under policy sagemaker)")


def test_failed_is_sticky_while_the_generation_is_unchanged():
    bad = decide_plan(spec(duration="36h"), 1, TrainingPlanStatus(), [], POOLS, SAGEMAKER, NOW)
    # Same generation: even a spec that would now pass is not re-evaluated (no silent retry).
    later = NOW + timedelta(hours=1)
    same = decide_plan(spec(), 1, bad.status, [], POOLS, SAGEMAKER, later)

    assert same.status == bad.status
    assert same.status.phase == "Failed"
    assert same.events == []
    assert same.buy is None
    assert same.wake_at is None


def test_a_new_generation_is_evaluated_again():
    bad = decide_plan(spec(duration="36h"), 1, TrainingPlanStatus(), [], POOLS, SAGEMAKER, NOW)
    later = NOW + timedelta(minutes=5)
    fixed = decide_plan(spec(), 2, bad.status, [], POOLS, SAGEMAKER, later)

    assert fixed.status.phase == "Pending"
    assert fixed.status.observed_generation == 2
    assert [shown_blocks(o) for o in fixed.status.offerings] == EXPECTED_OFFERINGS
    assert summary(fixed.status) == [("OfferingsAvailable", "True", "OfferingsFound"),
                                     ("Purchased", "False", "NotPurchased")]
    assert all(c.observed_generation == 2 for c in fixed.status.conditions)
    assert kinds(fixed.events) == [("Normal", "OfferingsFound")]


def test_a_new_generation_with_another_violation_posts_a_new_warning():
    bad = decide_plan(spec(duration="36h"), 1, TrainingPlanStatus(), [], POOLS, SAGEMAKER, NOW)
    later = NOW + timedelta(minutes=5)
    still = decide_plan(spec(duration="183d"), 2, bad.status, [], POOLS, SAGEMAKER, later)

    assert still.status.phase == "Failed"
    assert still.status.observed_generation == 2
    assert summary(still.status) == [("Failed", "True", "DurationOutOfRange"),
                                     ("Purchased", "False", "DurationOutOfRange")]
    assert kinds(still.events) == [("Warning", "DurationOutOfRange")]
    # Purchased stayed False: its transition time is kept.
    assert cond(still.status, "Purchased").last_transition_time == NOW


def test_failed_condition_keeps_its_transition_time_while_it_stays_true():
    """Kubernetes conventions: lastTransitionTime moves only when the status flips.

    A plan that failed at NOW and fails again (new generation, still invalid) has had
    Failed=True all along, so its Failed condition must keep lastTransitionTime == NOW.
    """
    bad = decide_plan(spec(duration="36h"), 1, TrainingPlanStatus(), [], POOLS, SAGEMAKER, NOW)
    later = NOW + timedelta(minutes=5)
    still = decide_plan(spec(duration="183d"), 2, bad.status, [], POOLS, SAGEMAKER, later)

    assert cond(bad.status, "Failed").status == "True"
    assert cond(still.status, "Failed").status == "True"
    assert cond(still.status, "Failed").last_transition_time == NOW


# =========================================================================== buying


def test_a_chosen_offering_id_is_bought_as_the_search_finds_it():
    searched = decide_plan(spec(), 1, TrainingPlanStatus(), [], POOLS, SAGEMAKER, NOW)
    chosen = searched.status.offerings[1]
    later = NOW + timedelta(minutes=2)
    d = decide_plan(spec(offering_id=chosen.id), 2, searched.status, [], POOLS, SAGEMAKER, later)

    assert d.buy is not None
    assert d.buy.id == chosen.id
    assert [(b.pool, b.availability_zone, b.start, b.end) for b in d.buy.blocks] == EXPECTED_OFFERINGS[1]
    assert all(b.instance_type == P5 and b.instance_count == 8 for b in d.buy.blocks)
    assert d.status.phase == "Pending"
    assert d.status.offerings == searched.status.offerings
    assert summary(d.status) == [("OfferingsAvailable", "True", "OfferingsFound"),
                                 ("Purchased", "False", "Purchasing")]
    assert cond(d.status, "Purchased").message == f"buying offering {chosen.id}"
    assert d.events == []
    assert d.wake_at is None


def test_offering_id_not_among_the_offerings_fails():
    searched = decide_plan(spec(), 1, TrainingPlanStatus(), [], POOLS, SAGEMAKER, NOW)
    d = decide_plan(spec(offering_id="tpo-0000000000000000"), 2, searched.status, [], POOLS, SAGEMAKER, NOW)

    message = "offering tpo-0000000000000000 is not among this plan's offerings"
    assert d.status.phase == "Failed"
    assert summary(d.status) == [("Failed", "True", "OfferingNotFound"),
                                 ("Purchased", "False", "OfferingNotFound")]
    assert cond(d.status, "Failed").message == message
    assert d.events == [Event("Warning", "OfferingNotFound", message)]
    assert d.buy is None


@pytest.mark.parametrize(
    "pools, buys, phase_reason",
    [
        pytest.param(POOLS, 0, ("OfferingsAvailable", "True", "OfferingsFound"), id="buys-the-best"),
        pytest.param(SOLD_OUT, None, ("OfferingsAvailable", "False", "NoCapacity"), id="nothing-to-buy"),
    ],
)
def test_auto_purchase(pools, buys, phase_reason):
    d = decide_plan(spec(auto_purchase=True), 1, TrainingPlanStatus(), [], pools, SAGEMAKER, NOW)

    assert summary(d.status)[0] == phase_reason
    if buys is None:
        assert d.buy is None
        assert cond(d.status, "Purchased").reason == "NotPurchased"
    else:
        assert d.buy is not None
        assert d.buy.id == d.status.offerings[buys].id
        assert [(b.pool, b.availability_zone, b.start, b.end) for b in d.buy.blocks] == EXPECTED_OFFERINGS[buys]
        assert cond(d.status, "Purchased").reason == "Purchasing"
        assert d.wake_at is None


# =========================================================================== bought plans

# Two blocks with a gap: 01-04 11:30 -> 01-06 11:30 and 01-08 11:30 -> 01-09 11:30.
# hyperpod-cluster: instances stop 60 min before each block's end.
BOUGHT = [
    Block("pool-a", "use1-az1", P5, 8, at(4), at(6), id="rc-a"),
    Block("pool-a", "use1-az1", P5, 8, at(8), at(9), id="rc-b"),
]


def bought(now: datetime, prior: TrainingPlanStatus | None = None, usage: PlanUsage = PlanUsage(),
           purchased=BOUGHT, s: TrainingPlanSpec | None = None, generation: int = 3):
    prior = prior if prior is not None else TrainingPlanStatus(phase="Pending")
    return decide_plan(s or spec(offering_id="tpo-x"), generation, prior, purchased, [], SAGEMAKER, now, usage)


@pytest.mark.parametrize(
    "now, phase, statuses, next_transition, total",
    [
        pytest.param(NOW, "Scheduled", ["Scheduled", "Scheduled"], at(4), 8, id="before-first-block"),
        pytest.param(at(4), "Active", ["Active", "Scheduled"], at(6, 10, 30), 8, id="first-block-starts"),
        pytest.param(at(5), "Active", ["Active", "Scheduled"], at(6, 10, 30), 8, id="inside-first-block"),
        pytest.param(at(6, 10, 45), "Active", ["Active", "Scheduled"], at(6), 8,
                     id="first-block-terminating"),
        pytest.param(at(6), "Scheduled", ["Expired", "Scheduled"], at(8), 8, id="first-block-ends"),
        pytest.param(at(7), "Scheduled", ["Expired", "Scheduled"], at(8), 8, id="in-the-gap"),
        pytest.param(at(8, 12), "Active", ["Expired", "Active"], at(9, 10, 30), 8, id="inside-second-block"),
        pytest.param(at(9), "Expired", ["Expired", "Expired"], None, 0, id="after-last-block"),
        pytest.param(at(20), "Expired", ["Expired", "Expired"], None, 0, id="long-after"),
    ],
)
def test_bought_plan_phase_over_time(now, phase, statuses, next_transition, total):
    d = bought(now)
    st = d.status

    assert st.phase == phase
    assert [r.status for r in st.reserved_capacity] == statuses
    assert [r.id for r in st.reserved_capacity] == ["rc-a", "rc-b"]
    assert [(r.start_time, r.end_time) for r in st.reserved_capacity] == [(at(4), at(6)), (at(8), at(9))]
    assert [r.termination_time for r in st.reserved_capacity] == [at(6, 10, 30), at(9, 10, 30)]
    assert [(r.capacity_pool, r.availability_zone, r.instance_type, r.instance_count)
            for r in st.reserved_capacity] == [("pool-a", "use1-az1", P5, 8)] * 2
    assert st.next_transition_time == next_transition
    assert d.wake_at == next_transition
    assert d.buy is None
    assert st.total_instance_count == total
    assert st.availability_zone == "use1-az1"
    assert st.observed_generation == 3
    assert st.purchased_offering_id == "tpo-x"
    assert summary(st) == [("Purchased", "True", "Purchased"),
                           ("Active", "True" if phase == "Active" else "False", phase)]
    assert cond(st, "Purchased").message == "2 reserved-capacity block(s) bought"


@pytest.mark.parametrize(
    "now, message",
    [
        pytest.param(NOW, "next block rc-a starts at 2027-01-04T11:30:00+00:00", id="scheduled"),
        pytest.param(at(5), "block rc-a runs until 2027-01-06T11:30:00+00:00 (8 x ml.p5.48xlarge in use1-az1)",
                     id="active"),
        pytest.param(at(7), "next block rc-b starts at 2027-01-08T11:30:00+00:00", id="gap"),
        pytest.param(at(10), "all blocks have ended", id="expired"),
    ],
)
def test_active_condition_message_names_the_current_or_next_block(now, message):
    assert cond(bought(now).status, "Active").message == message


def test_blocks_found_out_of_order_are_reported_by_start():
    d = bought(at(7), purchased=list(reversed(BOUGHT)))
    assert [r.id for r in d.status.reserved_capacity] == ["rc-a", "rc-b"]
    assert [r.status for r in d.status.reserved_capacity] == ["Expired", "Scheduled"]


def test_demo_policy_plan_runs_in_minutes_with_a_twenty_second_termination_lead():
    t0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    blocks = [Block("pool-a", "use1-az1", P5, 4, t0, t0 + timedelta(minutes=3), id="rc-d")]
    d = decide_plan(spec(instance_count=4, duration="3m", offering_id="tpo-x"), 1,
                    TrainingPlanStatus(phase="Scheduled"), blocks, [], DEMO, t0 + timedelta(seconds=30))
    assert d.status.phase == "Active"
    assert d.status.reserved_capacity[0].termination_time == t0 + timedelta(minutes=2, seconds=40)
    assert d.wake_at == t0 + timedelta(minutes=2, seconds=40)


# (prior time or None for "just bought", now, events)
@pytest.mark.parametrize(
    "prior_at, now, events",
    [
        pytest.param(None, NOW, [("Normal", "Scheduled")], id="just-bought"),
        pytest.param(NOW, NOW + timedelta(hours=1), [], id="still-scheduled"),
        pytest.param(NOW, at(4), [("Normal", "Active"), ("Normal", "BlockActive")], id="first-block-starts"),
        pytest.param(at(4), at(5), [], id="still-active"),
        pytest.param(at(5), at(6, 10, 45), [], id="terminating-is-still-active"),
        pytest.param(at(5), at(7), [("Normal", "Scheduled"), ("Normal", "BlockExpired")], id="into-the-gap"),
        pytest.param(at(7), at(8, 12), [("Normal", "Active"), ("Normal", "BlockActive")],
                     id="second-block-starts"),
        pytest.param(at(8, 12), at(9, 12), [("Normal", "Expired"), ("Normal", "BlockExpired")],
                     id="last-block-ends"),
        pytest.param(at(9, 12), at(12), [], id="still-expired"),
        pytest.param(NOW, at(7), [("Normal", "BlockExpired")], id="slept-through-a-whole-block"),
    ],
)
def test_events_only_when_the_phase_or_a_block_status_changes(prior_at, now, events):
    prior = bought(prior_at).status if prior_at is not None else TrainingPlanStatus(phase="Pending")
    assert kinds(bought(now, prior=prior).events) == events


def test_phase_and_block_event_messages():
    d = bought(at(5), prior=bought(NOW).status)
    assert d.events == [
        Event("Normal", "Active",
              "block rc-a runs until 2027-01-06T11:30:00+00:00 (8 x ml.p5.48xlarge in use1-az1)"),
        Event("Normal", "BlockActive", "reserved capacity rc-a (8 x ml.p5.48xlarge in use1-az1) is Active"),
    ]


def test_active_condition_transition_time_moves_only_when_it_flips():
    scheduled = bought(NOW)
    active = bought(at(5), prior=scheduled.status)
    active_later = bought(at(5, 18), prior=active.status)

    assert cond(scheduled.status, "Active").last_transition_time == NOW
    assert cond(active.status, "Active").last_transition_time == at(5)  # False -> True
    assert cond(active.status, "Purchased").last_transition_time == NOW  # True all along
    assert cond(active_later.status, "Active").last_transition_time == at(5)
    assert cond(active_later.status, "Purchased").last_transition_time == NOW


def test_purchased_flips_true_at_the_first_bought_pass():
    searched = decide_plan(spec(), 1, TrainingPlanStatus(), [], POOLS, SAGEMAKER, NOW)
    later = NOW + timedelta(minutes=1)
    d = bought(later, prior=searched.status)
    assert cond(searched.status, "Purchased").status == "False"
    assert cond(d.status, "Purchased").last_transition_time == later
    # The offerings shown before the purchase stay on the status.
    assert d.status.offerings == searched.status.offerings


# --------------------------------------------------------------------------- counts

US_BLOCK = [Block("pool-u", "use1-az3", ULTRASERVER_INSTANCE_TYPE, 36, at(4), at(6), ultra_server_type=X72,
                  id="rc-u")]
US_REPORT = (
    UltraServerStatus(id="rc-u-us-0", availability_zone="use1-az3", total_instance_count=18,
                      configured_spare_instance_count=1, available_instance_count=0,
                      in_use_instance_count=17, available_spare_instance_count=1,
                      unhealthy_instance_count=0, health_status="ok"),
    UltraServerStatus(id="rc-u-us-1", availability_zone="use1-az3", total_instance_count=18,
                      configured_spare_instance_count=1, available_instance_count=13,
                      in_use_instance_count=3, available_spare_instance_count=0,
                      unhealthy_instance_count=1, health_status="impaired"),
)


def us_spec(spares: int = 1) -> TrainingPlanSpec:
    return TrainingPlanSpec(ultra_server_type=X72, ultra_server_count=2, target_resource="hyperpod-cluster",
                            duration="2d", spare_instances_per_ultra_server=spares, offering_id="tpo-u")


@pytest.mark.parametrize(
    "spares, usage, expected",
    [
        # (total, inUse, unhealthy, availableSpares, available)
        pytest.param(1, PlanUsage(), (36, 0, 0, 0, 34), id="nothing-in-use"),
        pytest.param(1, PlanUsage(in_use=20, unhealthy=1, available_spares=1, ultra_servers=US_REPORT),
                     (36, 20, 1, 1, 13), id="20-in-use-1-unhealthy"),
        pytest.param(2, PlanUsage(in_use=20, unhealthy=1, available_spares=4),
                     (36, 20, 1, 4, 11), id="two-spares-per-ultraserver"),
        pytest.param(0, PlanUsage(in_use=36), (36, 36, 0, 0, 0), id="all-in-use-no-spares"),
        pytest.param(1, PlanUsage(in_use=34, unhealthy=2), (36, 34, 2, 0, 0), id="never-negative"),
    ],
)
def test_counts_of_an_ultraserver_plan(spares, usage, expected):
    d = bought(at(5), usage=usage, purchased=US_BLOCK, s=us_spec(spares))
    st = d.status

    assert (st.total_instance_count, st.in_use_instance_count, st.unhealthy_instance_count,
            st.available_spare_instance_count, st.available_instance_count) == expected
    assert st.total_ultra_server_count == 2
    assert st.reserved_capacity[0].ultra_server_type == X72
    assert st.reserved_capacity[0].ultra_server_count == 2
    assert st.reserved_capacity[0].instance_type == ULTRASERVER_INSTANCE_TYPE
    assert st.ultra_servers == list(usage.ultra_servers)
    assert st.availability_zone == "use1-az3"


def test_counts_after_the_plan_expired_are_zero():
    d = bought(at(7), usage=PlanUsage(), purchased=US_BLOCK, s=us_spec())
    st = d.status
    assert st.phase == "Expired"
    assert (st.total_instance_count, st.available_instance_count, st.total_ultra_server_count) == (0, 0, None)
    assert st.availability_zone == "use1-az3"


# =========================================================================== failed()


def test_failed_after_a_purchase_keeps_offerings_and_posts_once():
    searched = decide_plan(spec(), 1, TrainingPlanStatus(), [], POOLS, SAGEMAKER, NOW)
    why = RuleViolation("OfferingUnavailable", "taken")
    first = failed(searched.status, 2, why, NOW)
    again = failed(first.status, 2, why, NOW + timedelta(seconds=5))

    assert first.status.phase == "Failed"
    assert first.status.offerings == searched.status.offerings
    assert first.events == [Event("Warning", "OfferingUnavailable", "taken")]
    assert again.events == []


# =========================================================================== FakeLedger

T = datetime(2027, 2, 1, 11, 30, tzinfo=UTC)


def one_block_offering(pool_name: str = "pool-a", az: str = "use1-az1", count: int = 8,
                       start: datetime = T, days: int = 2) -> Offering:
    return Offering.from_blocks([Block(pool_name, az, P5, count, start, start + timedelta(days=days))])


def ledger_pools() -> list[CapacityPool]:
    return [pool("pool-a", "use1-az1"), pool("pool-b", "use1-az2")]


def test_fake_ledger_satisfies_the_protocol():
    assert isinstance(FakeLedger(), CapacityLedger)


def test_purchase_writes_one_reservation_per_block_into_its_pool():
    ledger = FakeLedger(pool_objects=ledger_pools())
    offering = Offering.from_blocks([
        Block("pool-a", "use1-az1", P5, 8, T, T + timedelta(days=1)),
        Block("pool-b", "use1-az2", P5, 8, T + timedelta(days=3), T + timedelta(days=4)),
    ])
    result = ledger.purchase("llama", "1234abcd-5678-90ef", offering, SAGEMAKER, T - timedelta(days=1))

    assert result.ok
    assert result.violation is None
    a, b = ledger.pool_objects
    assert a.status.reservations == [Reservation(
        training_plan="llama", training_plan_uid="1234abcd-5678-90ef", reserved_capacity_id="rc-1234abcd5678-0",
        start_time=T, end_time=T + timedelta(days=1), instance_count=8)]
    assert b.status.reservations == [Reservation(
        training_plan="llama", training_plan_uid="1234abcd-5678-90ef", reserved_capacity_id="rc-1234abcd5678-1",
        start_time=T + timedelta(days=3), end_time=T + timedelta(days=4), instance_count=8)]
    assert [(b.pool, b.availability_zone, b.id) for b in result.blocks] == [
        ("pool-a", "use1-az1", "rc-1234abcd5678-0"), ("pool-b", "use1-az2", "rc-1234abcd5678-1")]
    assert result.blocks == tuple(blocks_of(ledger.pool_objects, "1234abcd-5678-90ef"))
    assert ledger.calls == [("purchase", ("llama", offering.id))]
    assert reserved_capacity_id("1234abcd-5678-90ef", 1) == "rc-1234abcd5678-1"


def test_the_same_capacity_cannot_be_sold_twice():
    ledger = FakeLedger(pool_objects=ledger_pools())
    offering = one_block_offering()
    first = ledger.purchase("one", "uid-one", offering, SAGEMAKER, T - timedelta(days=1))
    second = ledger.purchase("two", "uid-two", offering, SAGEMAKER, T - timedelta(days=1))

    assert first.ok
    assert not second.ok
    assert second.violation.reason == "OfferingUnavailable"
    assert second.violation.message == (
        f"block 1 of offering {offering.id} (8 x ml.p5.48xlarge in use1-az1, 2027-02-01T11:30:00Z to "
        "2027-02-03T11:30:00Z) is no longer free in pool 'pool-a': 8 of 8 instances are taken then")
    assert second.blocks == ()
    assert [r.training_plan for r in ledger.pool_objects[0].status.reservations] == ["one"]
    # What the offering search sees of the pool afterwards: busy for the sold block.
    snap = pool_snapshot(ledger.pool_objects[0])
    assert [(b.start, b.end, b.instance_count) for b in snap.busy] == [(T, T + timedelta(days=2), 8)]


def test_capacity_left_beside_a_reservation_can_still_be_sold():
    ledger = FakeLedger(pool_objects=ledger_pools())
    assert ledger.purchase("one", "uid-one", one_block_offering(count=4), SAGEMAKER, T - timedelta(days=1)).ok
    assert ledger.purchase("two", "uid-two", one_block_offering(count=4), SAGEMAKER, T - timedelta(days=1)).ok
    third = ledger.purchase("three", "uid-three", one_block_offering(count=1), SAGEMAKER, T - timedelta(days=1))
    assert third.violation.reason == "OfferingUnavailable"
    assert [r.training_plan for r in ledger.pool_objects[0].status.reservations] == ["one", "two"]


def test_purchase_too_late_fails():
    ledger = FakeLedger(pool_objects=ledger_pools())
    result = ledger.purchase("one", "uid-one", one_block_offering(), SAGEMAKER, T - timedelta(minutes=4))
    assert result.violation.reason == "PurchaseTooLate"
    assert ledger.pool_objects[0].status.reservations == []


def test_purchase_fails_as_told():
    why = RuleViolation("LedgerContention", "injected")
    ledger = FakeLedger(pool_objects=ledger_pools(), fail_with=why)
    result = ledger.purchase("one", "uid-one", one_block_offering(), SAGEMAKER, T - timedelta(days=1))
    assert result.violation == why
    assert all(p.status.reservations == [] for p in ledger.pool_objects)
    assert ledger.calls == [("purchase", ("one", one_block_offering().id))]


def test_purchase_repeated_by_the_same_plan_is_idempotent():
    """A retried purchase (crash between ledger write and status patch) must not double-book.

    The ledger module promises: "a pool that already holds [a reservation id] is left alone"
    (KubeLedger._add does so); the fake must behave the same.
    """
    ledger = FakeLedger(pool_objects=ledger_pools())
    offering = one_block_offering()
    first = ledger.purchase("one", "uid-one", offering, SAGEMAKER, T - timedelta(days=1))
    again = ledger.purchase("one", "uid-one", offering, SAGEMAKER, T - timedelta(days=1))

    assert first.ok and again.ok
    assert [r.reserved_capacity_id for r in ledger.pool_objects[0].status.reservations] == ["rc-uidone-0"]


def sold(plan: str, uid: str, index: int, start: datetime, days: int = 1, count: int = 2) -> Reservation:
    return Reservation(training_plan=plan, training_plan_uid=uid, reserved_capacity_id=f"rc-{plan}-{index}",
                       start_time=start, end_time=start + timedelta(days=days), instance_count=count)


@pytest.mark.parametrize(
    "now, released, left_a, left_b",
    [
        pytest.param(T + timedelta(days=1, hours=12), 2, ["rc-mine-0", "rc-other-0"], ["rc-other-1"],
                     id="first-block-ended"),
        pytest.param(T - timedelta(days=1), 3, ["rc-other-0"], ["rc-other-1"], id="before-any-block"),
        pytest.param(None, 3, ["rc-other-0"], ["rc-other-1"], id="all-when-now-is-none"),
        pytest.param(T + timedelta(days=30), 0, ["rc-mine-0", "rc-other-0", "rc-mine-1"],
                     ["rc-mine-2", "rc-other-1"], id="everything-ended"),
    ],
)
def test_release_frees_only_the_plans_unexpired_reservations(now, released, left_a, left_b):
    a = pool("pool-a", "use1-az1", reservations=(
        sold("mine", "uid-mine", 0, T), sold("other", "uid-other", 0, T), sold("mine", "uid-mine", 1, T + timedelta(days=2))))
    b = pool("pool-b", "use1-az2", reservations=(
        sold("mine", "uid-mine", 2, T + timedelta(days=3)), sold("other", "uid-other", 1, T + timedelta(days=3))))
    ledger = FakeLedger(pool_objects=[a, b])

    assert ledger.release("uid-mine", now) == released
    assert [r.reserved_capacity_id for r in a.status.reservations] == left_a
    assert [r.reserved_capacity_id for r in b.status.reservations] == left_b
    assert ledger.calls == [("release", "uid-mine")]
