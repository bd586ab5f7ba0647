"""What the SageMaker API has sold and the cache does not show bought yet counts as sold
(sagemaker.assumed): callers racing for one offering are answered the next one at once, instead of
each buying a plan of which one purchase wins at the ledger. Driven through the operations with the
real watch cache over fake watched objects, and a fake clock."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from kubernetes.client.exceptions import ApiException

from hyperplan.runtime.store import GROUPS, NODES, PLANS, POOLS, WatchCache
from hyperplan.planning.offerings import Busy, PoolSnapshot
from hyperplan.sagemaker import operations
from hyperplan.sagemaker.assumed import ASSUMED_FOR, FORGET_EVERY, AssumedPurchases, with_busy
from hyperplan.sagemaker.wire import ApiError

UTC = timezone.utc
NOW = datetime(2027, 3, 1, 12, 0, tzinfo=UTC)
ITYPE = "ml.p5.48xlarge"


class Writes:
    """Creates as the API server would answer them; ``shows`` says whether the watch brings the
    plan into the cache at once, ``refuse`` makes the API server refuse the create."""

    def __init__(self, plans: dict) -> None:
        self.plans, self.shows, self.refuse, self.made = plans, True, False, 0
        self.names: set[str] = set()  # what the API server holds, shown in the cache or not

    def create_plan(self, user: str, body: dict) -> dict | None:
        if self.refuse:
            raise ApiException(status=403, reason="Forbidden")
        name = body["metadata"]["name"]
        if name in self.names:
            return None  # 409: it exists
        self.names.add(name)
        self.made += 1
        made = {**body, "metadata": {**body["metadata"], "resourceVersion": "1", "uid": f"uid-{name}"}}
        if self.shows:
            self.plans[name] = [made]
        return made


class World:
    def __init__(self) -> None:
        self.plans: dict = {}
        self.pool = {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "CapacityPool",
                     "metadata": {"name": "p5", "resourceVersion": "1"},
                     "spec": {"instanceType": ITYPE, "availabilityZone": "us-west-2a", "instanceCount": 8}}
        self.cache = WatchCache()
        self.cache.bind({PLANS: self.plans, POOLS: {"p5": [self.pool]}, GROUPS: {}, NODES: {}})
        self.writes = Writes(self.plans)
        self.now = 0.0
        self.assumed = AssumedPurchases(clock=lambda: self.now)

    def call(self, operation: str, **body) -> dict:
        ctx = operations.Context(fleet=self.cache, account="123456789012", region="us-west-2", now=NOW,
                                 user="alice", writes=self.writes, assumed=self.assumed)
        return operations.call(operation, body, ctx)

    def offerings(self, count: int = 4) -> list[dict]:
        return self.call("SearchTrainingPlanOfferings", InstanceType=ITYPE, InstanceCount=count, DurationHours=24,
                         StartTimeAfter=(NOW + timedelta(minutes=1)).timestamp(),
                         TargetResources=["hyperpod-cluster"])["TrainingPlanOfferings"]

    def create(self, name: str, offering: dict) -> dict:
        return self.call("CreateTrainingPlan", TrainingPlanName=name,
                         TrainingPlanOfferingId=offering["TrainingPlanOfferingId"])

    def bought(self, name: str, offering: dict) -> None:
        """The operator's purchase ran: the plan's line is in the ledger, as the watch brings it."""
        [rc] = offering["ReservedCapacityOfferings"]
        line = {"trainingPlan": name, "trainingPlanUid": f"uid-{name}", "reservedCapacityId": f"rc-{name}",
                "startTime": _rfc3339(rc["StartTime"]), "endTime": _rfc3339(rc["EndTime"]),
                "instanceCount": rc["InstanceCount"]}
        reservations = [*(self.pool.get("status") or {}).get("reservations", []), line]
        version = str(int(self.pool["metadata"]["resourceVersion"]) + 1)
        self.pool.update(metadata={**self.pool["metadata"], "resourceVersion": version},
                         status={"reservations": reservations})


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat().replace("+00:00", "Z")


def starts(offerings: list[dict]) -> list[float]:
    return [o["ReservedCapacityOfferings"][0]["StartTime"] for o in offerings]


@pytest.fixture
def world() -> World:
    return World()


def test_creates_racing_for_one_offering_are_answered_the_next_one(world: World) -> None:
    [best, *_] = world.offerings(8)  # the whole pool: one buyer per slot
    assert world.create("first", best)["TrainingPlanArn"].endswith("/first")

    with pytest.raises(ApiError) as refused:  # the second caller's search was as old as the first's
        world.create("second", best)
    assert refused.value.code == "ResourceNotFound" and "search again" in refused.value.message
    again = world.offerings(8)
    assert starts(again)[0] > starts([best])[0]  # answered the next slot at once
    assert world.create("second", again[0])["TrainingPlanArn"].endswith("/second")
    assert world.writes.made == 2


def test_a_retry_of_the_create_that_sold_it_is_answered_as_before(world: World) -> None:
    [best, *_] = world.offerings(8)
    world.writes.shows = False  # the watch has not brought the plan yet
    world.create("first", best)
    with pytest.raises(ApiError) as again:  # boto3's own retry: the name exists, the cache does not show it
        world.create("first", best)
    assert again.value.code == "ResourceInUse"  # as before the assumption: not ResourceNotFound (sold)
    world.plans["first"] = [{"metadata": {"name": "first", "uid": "uid-first", "resourceVersion": "1",
                                          "annotations": {"hyperplan.dev/created-by": "alice"}},
                             "spec": {"offeringId": best["TrainingPlanOfferingId"].rsplit("-", 1)[0]}}]
    assert world.create("first", best)["TrainingPlanArn"].endswith("/first")  # once shown: the retry's answer
    assert world.writes.made == 1


def test_an_assumption_ends_when_the_ledger_shows_the_purchase_and_is_never_counted_twice(world: World) -> None:
    [best, *_] = world.offerings(4)
    world.create("first", best)
    assert starts(world.offerings(4))[0] == starts([best])[0]  # 4 of 8 assumed: room for 4 more there
    world.bought("first", best)
    assert starts(world.offerings(4))[0] == starts([best])[0]  # the ledger's 4, not the ledger's and the assumed
    assert len(world.assumed) == 0


def test_settled_assumptions_are_looked_for_at_most_every_so_often_and_meanwhile_count_as_taken(world: World) -> None:
    world.assumed = AssumedPurchases(clock=lambda: world.now, every=FORGET_EVERY)
    [best, *_] = world.offerings(4)
    world.create("first", best)
    world.bought("first", best)
    # Within FORGET_EVERY of the last look the purchase is both in the ledger and assumed: the
    # offering's start looks full (taken twice), never free.
    assert starts(world.offerings(4))[0] > starts([best])[0]
    assert len(world.assumed) == 1
    world.now += FORGET_EVERY
    assert starts(world.offerings(4))[0] == starts([best])[0]
    assert len(world.assumed) == 0


@pytest.mark.parametrize("end", ["refused", "failed", "deleted", "never-shown"])
def test_an_assumption_that_sold_nothing_gives_the_offering_back(world: World, end: str) -> None:
    [best, *_] = world.offerings(8)
    if end == "refused":
        world.writes.refuse = True
        with pytest.raises(ApiException):
            world.create("first", best)
    else:
        world.writes.shows = end != "never-shown"
        world.create("first", best)
        world.offerings(8)  # the cache shows the plan (or not) to the assumption
        if end == "failed":
            world.plans["first"][0]["status"] = {"phase": "Failed"}
        elif end == "deleted":
            del world.plans["first"]
        else:
            assert starts(world.offerings(8))[0] > starts([best])[0]  # still held within the hold
            world.now += ASSUMED_FOR + 1
    assert starts(world.offerings(8))[0] == starts([best])[0]
    assert len(world.assumed) == 0


@pytest.mark.parametrize("busy, extra", [
    ((), ((0, 10, 2),)),
    (((0, 10, 2),), ((5, 15, 3),)),
    (((0, 10, 2), (10, 20, 1)), ((10, 20, 4), (0, 5, 1))),
    (((0, 10, 2),), ((0, 10, 2),)),
], ids=["empty", "overlapping", "touching", "the-same-window"])
def test_busy_added_to_a_snapshot_makes_the_step_function_a_fresh_one_would(busy, extra) -> None:
    def b(entries):
        return tuple(Busy(NOW + timedelta(minutes=s), NOW + timedelta(minutes=e), n) for s, e, n in entries)
    snapshot = PoolSnapshot("p5", ITYPE, "us-west-2a", 8, busy=b(busy))
    merged = with_busy(snapshot, b(extra))
    fresh = PoolSnapshot("p5", ITYPE, "us-west-2a", 8, busy=b(busy) + b(extra))
    assert merged.usage == fresh.usage and merged.busy == fresh.busy
