"""An auto-purchase that loses the race for its offering searches again and buys the next one.

``controllers.plan.reconciler.purchase`` against an in-memory ledger whose first purchases are beaten
by a rival buyer: just before the plan's write lands, the rival takes exactly the capacity the
offering asks for. Only a plan whose window has no room left fails; a plan that loses every race
of a pass stays Pending and tries again (``contended``); an offering the user chose is never
swapped for another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

import pytest

from hyperplan_testing.fakes import FakeLedger
from hyperplan.actuation.ledger import PurchaseResult, pool_snapshot
from hyperplan.api.models import CapacityPool, CapacityPoolSpec, Reservation, TrainingPlanSpec, TrainingPlanStatus
from hyperplan.controllers.plan.reconciler import purchase
from hyperplan.planning.offerings import Offering
from hyperplan.planning.plans import decide_plan
from hyperplan.planning.policy import SAGEMAKER

UTC = timezone.utc
P5 = "ml.p5.48xlarge"
NOW = datetime(2027, 1, 4, 0, 0, tzinfo=UTC)


def at(day: int) -> datetime:
    return datetime(2027, 1, day, 11, 30, tzinfo=UTC)


def pools(count: int = 8) -> list[CapacityPool]:
    return [CapacityPool(metadata={"name": name}, spec=CapacityPoolSpec(
        instance_type=P5, availability_zone=az, instance_count=count))
        for name, az in (("pool-a", "use1-az1"), ("pool-b", "use1-az2"))]


@dataclass
class RacingLedger(FakeLedger):
    """A FakeLedger where a rival buys the offered capacity just before each of the first
    ``losses`` purchases lands, so the re-check finds it gone."""

    losses: int = 0
    rivals: list[str] = field(default_factory=list)

    def purchase(self, plan: str, plan_uid: str, offering: Offering, policy, now: datetime,
                 plan_labels=None) -> PurchaseResult:
        if len(self.rivals) < self.losses:
            rival = f"rival-{len(self.rivals)}"
            by_name = {p.metadata["name"]: p for p in self.pool_objects}
            for index, block in enumerate(offering.blocks):
                by_name[block.pool].status.reservations.append(Reservation(
                    training_plan=rival, training_plan_uid=rival, reserved_capacity_id=f"rc-{rival}-{index}",
                    start_time=block.start, end_time=block.end, instance_count=block.instance_count))
            self.rivals.append(rival)
        return super().purchase(plan, plan_uid, offering, policy, now, plan_labels)


def plan_spec(**kw) -> TrainingPlanSpec:
    fields = dict(instance_type=P5, instance_count=8, target_resource="hyperpod-cluster", duration="48h",
                  auto_purchase=True)
    fields.update(kw)
    return TrainingPlanSpec(**fields)


@dataclass(frozen=True)
class Case:
    id: str
    losses: int
    spec: TrainingPlanSpec
    bought: bool
    purchases: int
    contended: bool = False
    reason: str | None = None


CASES = [
    Case("wins-at-once", losses=0, spec=plan_spec(), bought=True, purchases=1),
    Case("loses-one-race-buys-the-next-offering", losses=1, spec=plan_spec(), bought=True, purchases=2),
    Case("loses-three-races-buys-the-fourth", losses=3, spec=plan_spec(), bought=True, purchases=4),
    # The window fits one 48 h block per pool: the rivals take both, then there is truly no room.
    Case("window-has-no-room-after-the-races-fails", losses=2,
         spec=plan_spec(start_time_after=NOW, end_time_before=at(6)), bought=False, purchases=2,
         reason="OfferingUnavailable"),
    Case("loses-every-race-of-the-pass-stays-pending", losses=100, spec=plan_spec(), bought=False,
         purchases=8, contended=True, reason="OfferingUnavailable"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_an_auto_purchase_that_loses_a_race_searches_again(case: Case):
    ledger = RacingLedger(pool_objects=pools(), losses=case.losses)
    first = decide_plan(case.spec, 1, TrainingPlanStatus(), [], [pool_snapshot(p) for p in ledger.pool_objects],
                        SAGEMAKER, NOW)
    assert first.buy is not None

    outcome = purchase(ledger, "llama", "uid-llama", case.spec, 1, first.status, first.buy, SAGEMAKER, lambda: NOW)

    assert outcome.result.ok is case.bought
    assert outcome.purchases == case.purchases == len([c for c in ledger.calls if c[0] == "purchase"])
    assert outcome.contended is case.contended
    assert (outcome.result.violation.reason if outcome.result.violation else None) == case.reason
    mine = [r for p in ledger.pool_objects for r in p.status.reservations if r.training_plan == "llama"]
    if case.bought:
        # One block bought, of the offering the last purchase tried, and not overlapping a rival's.
        assert [(r.start_time, r.end_time, r.instance_count) for r in mine] == [
            (b.start, b.end, b.instance_count) for b in outcome.offering.blocks]
        assert (outcome.offering.id == first.buy.id) is (case.losses == 0)
        for p in ledger.pool_objects:
            taken = [(r.start_time, r.end_time) for r in p.status.reservations]
            for s, e in taken:  # never overbooked: at every reservation start, at most the pool's size
                assert sum(r.instance_count for r in p.status.reservations
                           if r.start_time <= s < r.end_time) <= p.spec.instance_count
    else:
        assert mine == []


def test_a_chosen_offering_is_never_swapped_for_another():
    spec = plan_spec(auto_purchase=False)
    ledger = RacingLedger(pool_objects=pools(), losses=1)
    searched = decide_plan(spec, 1, TrainingPlanStatus(), [], [pool_snapshot(p) for p in ledger.pool_objects],
                           SAGEMAKER, NOW)
    chosen = spec.model_copy(update={"offering_id": searched.status.offerings[0].id})
    decision = decide_plan(chosen, 2, searched.status, [], [pool_snapshot(p) for p in ledger.pool_objects],
                           SAGEMAKER, NOW)

    outcome = purchase(ledger, "llama", "uid-llama", chosen, 2, decision.status, decision.buy, SAGEMAKER, lambda: NOW)

    assert not outcome.result.ok
    assert outcome.result.violation.reason == "OfferingUnavailable"
    assert outcome.purchases == 1
    assert outcome.offering.id == searched.status.offerings[0].id


def test_a_lost_race_reports_the_pools_it_was_rechecked_against():
    """What the search again runs on: the ledger as the failed purchase saw it (rival included)."""
    ledger = RacingLedger(pool_objects=pools(), losses=1)
    first = decide_plan(plan_spec(), 1, TrainingPlanStatus(), [], [pool_snapshot(p) for p in ledger.pool_objects],
                        SAGEMAKER, NOW)
    result = ledger.purchase("llama", "uid-llama", first.buy, SAGEMAKER, NOW)

    assert result.violation.reason == "OfferingUnavailable"
    busy = {s.name: [(b.start, b.end, b.instance_count) for b in s.busy] for s in result.pools}
    block = first.buy.blocks[0]
    assert busy[block.pool] == [(block.start, block.end, block.instance_count)]
