"""The real plan pass (controllers.plan.reconciler.reconcile_plan) against a Runtime of recording fakes.

The plan lives in a FakeKube, the pools in a FakeLedger, both read through a real WatchCache
(tests/unit/fake_runtime.py). The kube's and the ledger's calls go to one list, so the order of
the finalizer write, the purchase and the status patch is what the test reads.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from hyperplan.api.models import CapacityPool, CapacityPoolSpec, Reservation
from hyperplan.api.vocabulary import FINALIZER, PLAN_FINALIZER
from hyperplan.controllers.plan.reconciler import reconcile_plan
from hyperplan.planning.policy import SAGEMAKER
from tests.unit.fake_runtime import PLANS_PLURAL, World, make_world

UTC = timezone.utc
NOW = datetime(2027, 1, 4, 0, 0, tzinfo=UTC)
FIRST_START = datetime(2027, 1, 4, 11, 30, tzinfo=UTC)  # the earliest block start SageMaker offers at NOW
P5 = "ml.p5.48xlarge"
NAME, UID = "llama", "uid-llama"


def pools() -> list[CapacityPool]:
    return [CapacityPool(metadata={"name": name}, spec=CapacityPoolSpec(
        instance_type=P5, availability_zone=zone, instance_count=8))
        for name, zone in (("pool-a", "use1-az1"), ("pool-b", "use1-az2"))]


def plan(generation: int = 1, finalizers: tuple[str, ...] = (), deleting: bool = False,
         status: dict | None = None, **spec: Any) -> dict[str, Any]:
    fields = {"instanceType": P5, "instanceCount": 8, "targetResource": "hyperpod-cluster", "duration": "48h",
              "autoPurchase": True, **spec}
    meta: dict[str, Any] = {"name": NAME, "uid": UID, "generation": generation}
    if finalizers:
        meta["finalizers"] = list(finalizers)
    if deleting:
        meta["deletionTimestamp"] = "2027-01-04T00:00:00Z"
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "TrainingPlan", "metadata": meta, "spec": fields,
            "status": status or {}}


@pytest.fixture
def worlds(monkeypatch: pytest.MonkeyPatch):
    made: list[World] = []

    def make(*plans: dict[str, Any]) -> World:
        world = make_world(monkeypatch, NOW, SAGEMAKER, plans=list(plans), pools=pools())
        made.append(world)
        return world
    yield make
    for world in made:
        world.close()


def held(world: World) -> dict[str, Any]:
    return world.kube.objects[(PLANS_PLURAL, NAME)]


def verbs(world: World) -> list[str]:
    return [call[0] for call in world.calls]


def purchases(world: World) -> list[str]:
    """The offerings the ledger was asked to buy, in order."""
    return [call[1][1] for call in world.calls if call[0] == "purchase"]


def rival_takes(world: World, pool: str, start: datetime) -> None:
    """Another plan buys all of ``pool`` from ``start`` for 48 h; the watch has not delivered it."""
    world.pool_watch.pause()
    target = next(p for p in world.ledger.pool_objects if p.metadata["name"] == pool)
    target.status.reservations.append(Reservation(
        training_plan="rival", training_plan_uid="uid-rival", reserved_capacity_id="rc-rival-0",
        start_time=start, end_time=start + timedelta(hours=48), instance_count=8))


def mine(world: World) -> list[tuple[str, datetime]]:
    return [(p.metadata["name"], r.start_time) for p in world.ledger.pool_objects for r in p.status.reservations
            if r.training_plan_uid == UID]


# --------------------------------------------------------------------------- buying


def test_an_unbought_auto_purchase_plan_holds_its_finalizer_then_buys_once_and_patches_once(worlds) -> None:
    world = worlds(plan())
    wake = world.run(reconcile_plan, NAME)

    # The finalizer goes on before the purchase: a deletion in between waits for the release.
    assert verbs(world) == ["set_finalizers", "purchase", "patch_status"]
    assert world.calls[0][3] == [PLAN_FINALIZER]
    assert held(world)["metadata"]["finalizers"] == [PLAN_FINALIZER]
    [status] = world.status_patches(PLANS_PLURAL)
    assert status["phase"] == "Scheduled"
    assert status["purchasedOfferingId"] == purchases(world)[0]
    assert [(r["capacityPool"], r["instanceCount"]) for r in status["reservedCapacity"]] == [("pool-a", 8)]
    assert world.reasons() == ["Purchased", "Scheduled"]
    assert world.events[0][:3] == (NAME, "Normal", "Purchased")
    assert f"bought offering {purchases(world)[0]}: 8 x {P5} in use1-az1" in world.events[0][3]
    # The next pass is at the block's start, the plan's next boundary.
    assert wake == FIRST_START == datetime.fromisoformat(status["nextTransitionTime"].replace("Z", "+00:00"))
    assert world.rt.unbought_plans == set()


@pytest.mark.parametrize("finalizers", [(PLAN_FINALIZER,), (FINALIZER, PLAN_FINALIZER)],
                         ids=["ours", "ours-beside-kopfs"])
def test_a_plan_whose_status_is_unchanged_writes_nothing(worlds, finalizers: tuple[str, ...]) -> None:
    world = worlds(plan(finalizers=finalizers))
    world.run(reconcile_plan, NAME)
    world.calls.clear()
    world.events.clear()

    wake = world.run(reconcile_plan, NAME)

    assert world.calls == []  # no finalizer write, no purchase, no status patch
    assert world.events == []
    assert wake == FIRST_START


# --------------------------------------------------------------------------- a lost race


@pytest.mark.parametrize("chosen, auto, bought, phase, reason", [
    (False, True, True, "Scheduled", None),
    (True, False, False, "Failed", "OfferingUnavailable"),
    (True, True, False, "Failed", "OfferingUnavailable"),
], ids=["auto-purchase-buys-the-next-offering", "chosen-offering-is-never-swapped",
        "chosen-offering-with-auto-purchase-on-is-never-swapped"])
def test_a_purchase_that_loses_the_race_for_its_offering(worlds, chosen: bool, auto: bool, bought: bool,
                                                         phase: str, reason: str | None) -> None:
    world = worlds(plan(autoPurchase=auto and not chosen))
    if chosen:  # the user picks the first offering the plan listed
        world.run(reconcile_plan, NAME)
        offered = held(world)["status"]["offerings"][0]["id"]
        world.kube.put(PLANS_PLURAL, plan(generation=2, status=held(world)["status"], autoPurchase=auto,
                                          offeringId=offered, finalizers=(PLAN_FINALIZER,)))
        world.calls.clear()
        world.events.clear()
    rival_takes(world, "pool-a", FIRST_START)  # the offering the pass's view ranks first

    world.run(reconcile_plan, NAME)

    tried = purchases(world)
    assert len(tried) == (2 if bought else 1)
    assert len(set(tried)) == len(tried)  # the search again buys another offering, never the lost one again
    [status] = world.status_patches(PLANS_PLURAL)
    assert status["phase"] == phase
    if bought:
        assert mine(world) == [("pool-b", FIRST_START)]
        assert status["purchasedOfferingId"] == tried[-1]
        assert world.reasons()[0] == "Purchased"
    else:
        assert mine(world) == []
        assert "purchasedOfferingId" not in status
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert (failed["status"], failed["reason"]) == ("True", reason)
        assert "Purchased" not in world.reasons()


@pytest.mark.parametrize("meanwhile, fails", [("changed", True), ("deleted", False)],
                         ids=["plan-changed-since-the-read-fails-the-pass", "plan-deleted-since-the-read-buys-nothing"])
def test_a_plan_that_moved_on_before_its_finalizer_write_buys_nothing(worlds, meanwhile: str, fails: bool) -> None:
    """The finalizer write names the resourceVersion the pass read: a plan changed since is
    refused (409, the pass fails and is retried), a plan gone is left alone."""
    world = worlds(plan())
    world.plan_watch.pause()  # the pass reads the plan as it was
    if meanwhile == "changed":
        world.kube.put(PLANS_PLURAL, plan(generation=2))
    else:
        del world.kube.objects[(PLANS_PLURAL, NAME)]

    if fails:
        with pytest.raises(ApiException) as refused:
            world.run(reconcile_plan, NAME)
        assert refused.value.status == 409
    else:
        assert world.run(reconcile_plan, NAME) is None

    assert verbs(world) == ["set_finalizers"]  # no purchase, no status patch
    assert mine(world) == [] and world.events == []


# --------------------------------------------------------------------------- deletion


def test_a_plan_being_deleted_releases_its_reservations_then_lets_go(worlds) -> None:
    world = worlds(plan())
    world.run(reconcile_plan, NAME)
    assert len(mine(world)) == 1
    world.kube.put(PLANS_PLURAL, {**held(world), "metadata": {
        **held(world)["metadata"], "deletionTimestamp": "2027-01-04T01:00:00Z"}})
    world.calls.clear()
    world.events.clear()

    wake = world.run(reconcile_plan, NAME)

    assert verbs(world) == ["release", "set_finalizers"]
    assert world.calls[0][1] == UID
    assert world.calls[1][3] == []
    assert mine(world) == []
    assert [(reason, message) for _, _, reason, message in world.events] == [
        ("Released", "released 1 reservation(s) back to their pools")]
    assert wake is None


def test_a_plan_deleted_without_our_finalizer_is_left_alone(worlds) -> None:
    world = worlds(plan(deleting=True))
    assert world.run(reconcile_plan, NAME) is None
    assert world.calls == [] and world.events == []


# --------------------------------------------------------------------------- an invalid spec


@pytest.mark.parametrize("broken", [
    {"instanceCount": 3},
    {"targetResource": "cluster-of-dreams"},
], ids=["instance-count-not-allowed", "unknown-target"])
def test_an_invalid_spec_fails_the_plan_without_buying(worlds, broken: dict[str, Any]) -> None:
    world = worlds(plan(**broken))

    wake = world.run(reconcile_plan, NAME)

    assert verbs(world) == ["patch_status"]
    [status] = world.status_patches(PLANS_PLURAL)
    assert status["phase"] == "Failed"
    assert sorted((c["type"], c["status"], c["reason"]) for c in status["conditions"]) == [
        ("Failed", "True", "InvalidSpec"), ("Purchased", "False", "InvalidSpec")]
    assert all(next(iter(broken)) in c["message"] for c in status["conditions"])
    assert wake is None
