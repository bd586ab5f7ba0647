"""A plan bought as EC2 Capacity Blocks: the real plan pass
(controllers.plan.reconciler.reconcile_plan) against a Runtime of recording fakes, the remote being
hyperplan_testing.fakes.FakeCapacityBlocks, a recording fake of the CapacitySeller protocol that answers
with EC2's shapes; and once through the real CapacityBlocks client under botocore's Stubber.

What a user sees is asserted: the plan's status and Events, the pool's ledger lines (the block's
id is the capacity reservation's id), and which calls the seller got (a retry never buys twice)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from hyperplan_testing.fakes import FakeCapacityBlocks
from hyperplan.actuation.remote.calls import RemoteError
from hyperplan.actuation.remote.sources import RemoteFollower, RemoteSources
from hyperplan.api.models import CapacityPool, CapacityPoolSpec, Ec2CapacityBlocksSource, PoolSource
from hyperplan.controllers.plan.reconciler import reconcile_plan, release_plan
from hyperplan.runtime.workqueue import describe_failure
from hyperplan.planning.policy import SAGEMAKER
from hyperplan.planning.remote import remote_plan_name
from tests.unit.fake_runtime import PLANS_PLURAL, World, make_world
from tests.unit.test_remote_plans import condition, later, lines, status  # the same plan, pool and clock

UTC = timezone.utc
NOW = datetime(2027, 1, 4, 0, 0, tzinfo=UTC)
START = datetime(2027, 1, 5, 11, 30, tzinfo=UTC)
P5, ZONE, POOL = "p5.48xlarge", "us-east-1a", "cb-p5"
NAME, UID = "llama", "0c6f9a52-1111-4a8e-9d6e-2a41c0ffee00"
RID = "cr-00000000000000000"  # FakeCapacityBlocks numbers its reservations


def blocks_pool(**source: Any) -> CapacityPool:
    return CapacityPool(metadata={"name": POOL}, spec=CapacityPoolSpec(
        instance_type=P5, availability_zone=ZONE,
        source=PoolSource(ec2_capacity_blocks=Ec2CapacityBlocksSource(region="us-east-1", **source))))


def offering(oid: str = "cbo-0123456789abcdef0", zone: str = ZONE, fee: str | None = "35000.00",
             start: datetime = START) -> dict[str, Any]:
    answer = {"CapacityBlockOfferingId": oid, "InstanceType": P5, "AvailabilityZone": zone, "InstanceCount": 8,
              "StartDate": start, "EndDate": start + timedelta(hours=48), "CapacityBlockDurationHours": 48}
    if fee is not None:
        answer.update(UpfrontFee=fee, CurrencyCode="USD")
    return answer


def plan(**spec: Any) -> dict[str, Any]:
    fields = {"instanceType": P5, "instanceCount": 8, "targetResource": "hyperpod-cluster", "duration": "48h",
              "autoPurchase": True, **spec}
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "TrainingPlan",
            "metadata": {"name": NAME, "uid": UID, "generation": 1}, "spec": fields, "status": {}}


def sources(w: World, seller: Any) -> RemoteSources:
    return RemoteSources(credentials=lambda name: None, make=lambda source, creds: seller,
                         follower=RemoteFollower(clock=lambda: (w.now - NOW).total_seconds()))


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch):
    made: list[World] = []

    def make(*offered: dict[str, Any], pool: CapacityPool | None = None, **spec: Any) -> tuple[World, FakeCapacityBlocks]:
        w = make_world(monkeypatch, NOW, SAGEMAKER, plans=[plan(**spec)], pools=[pool or blocks_pool()])
        seller = FakeCapacityBlocks(offered=list(offered))
        w.rt.remote = sources(w, seller)
        monkeypatch.setattr("kopf.warn", lambda obj, *, reason, message="": w.record_event(
            obj, type="Warning", reason=reason, message=message))
        made.append(w)
        return w, seller
    yield make
    for w in made:
        w.close()





def buys(seller: FakeCapacityBlocks) -> list[tuple]:
    return [args for op, args in seller.calls if op == "buy"]



def test_a_plan_buys_a_capacity_block_waits_for_its_payment_then_holds_the_reservation(world) -> None:
    w, seller = world(offering())
    wake = w.run(reconcile_plan, NAME)

    assert buys(seller) == [(remote_plan_name(UID, 0), "cbo-0123456789abcdef0",
                             {"hyperplan.dev/training-plan": NAME, "hyperplan.dev/training-plan-uid": UID})]
    assert status(w) == {}  # nothing written while the payment may go through at once (REMOTE_QUIET)
    assert wake is not None and wake - w.now <= timedelta(seconds=2)
    later(w, 11)
    wake = w.run(reconcile_plan, NAME)
    assert status(w)["phase"] == "Pending"
    assert condition(w, "Purchased")["reason"] == "RemotePurchasing"
    message = condition(w, "Purchased")["message"]
    assert f"capacity block {remote_plan_name(UID, 0)} at {seller.endpoint} is Pending" in message
    assert f"capacity reservation {RID} is payment-pending" in message
    assert w.reasons().count("Purchased") == 1 and lines(w) == []
    assert wake is not None and wake - w.now <= timedelta(seconds=3)  # a quarter of the wait so far

    seller.pay(UID, "scheduled")
    later(w, 2)
    w.run(reconcile_plan, NAME)

    assert status(w)["phase"] == "Scheduled"
    [rc] = status(w)["reservedCapacity"]
    assert (rc["id"], rc["capacityPool"], rc["availabilityZone"], rc["instanceCount"]) == (RID, POOL, ZONE, 8)
    assert lines(w) == [(NAME, RID, 8, f"arn:aws:ec2:us-east-1:111122223333:capacity-reservation/{RID}")]
    assert len(buys(seller)) == 1


def test_a_pass_killed_after_ec2_bought_adopts_the_tagged_reservation_and_buys_nothing(world) -> None:
    w, seller = world(offering())
    # An earlier process bought and died before it recorded anything here.
    seller.buy(remote_plan_name(UID, 0), UID, _remote_offering(), None, {"hyperplan.dev/training-plan-uid": UID})
    seller.pay(UID, "active")
    seller.calls.clear()

    w.run(reconcile_plan, NAME)

    assert [op for op, _ in seller.calls] == ["remote_plans"]  # neither a search nor a purchase
    assert status(w)["phase"] == "Scheduled"  # the block starts tomorrow: EC2's "active" is its own word
    assert [line[1] for line in lines(w)] == [RID]


def test_a_payment_that_failed_buys_again_under_the_next_name(world) -> None:
    w, seller = world(offering("cbo-a"), offering("cbo-b"))
    w.run(reconcile_plan, NAME)
    seller.pay(UID, "payment-failed")
    later(w, 2)

    w.run(reconcile_plan, NAME)

    assert [b[0] for b in buys(seller)] == [remote_plan_name(UID, 0), remote_plan_name(UID, 1)]
    seller.pay(UID, "scheduled")
    later(w, 4)
    w.run(reconcile_plan, NAME)
    assert status(w)["phase"] == "Scheduled"
    assert [line[1] for line in lines(w)] == ["cr-00000000000000001"]


@pytest.mark.parametrize("answer, why", [
    (offering(zone="us-east-1b"), "another zone than the pool's"),
    (offering(fee="50000.00"), "an upfront fee above the pool's ceiling"),
    (offering(fee=None), "no upfront fee named, with a ceiling set"),
], ids=["other-zone", "fee-above-ceiling", "fee-unknown"])
def test_offerings_the_pool_does_not_sell_are_never_bought(world, answer: dict, why: str) -> None:
    w, seller = world(answer, pool=blocks_pool(max_upfront_fee="40000"))

    w.run(reconcile_plan, NAME)

    assert buys(seller) == [], why
    assert status(w)["phase"] == "Pending"
    assert condition(w, "OfferingsAvailable")["reason"] == "NoCapacity"


def test_an_offering_sold_between_the_search_and_the_purchase_searches_again_soon(world) -> None:
    w, seller = world(offering())
    original = seller.buy

    def sold(*args: Any) -> Any:
        seller.offered.clear()  # another account bought it
        return original(*args)
    seller.buy = sold  # type: ignore[method-assign]

    wake = w.run(reconcile_plan, NAME)

    assert status(w)["phase"] == "Pending"
    assert wake is not None and wake - w.now <= timedelta(seconds=2)
    assert seller.reservations == {}


def test_ec2_down_fails_the_pass_with_its_error(world) -> None:
    w, seller = world(offering())
    seller.down = True
    with pytest.raises(RemoteError) as failed:
        w.run(reconcile_plan, NAME)
    reason, message = describe_failure(failed.value)
    assert reason == "RemoteUnavailable"
    assert "DescribeCapacityReservations at https://ec2.us-east-1.amazonaws.com failed" in message


def test_deleting_a_plan_says_the_capacity_block_stays_bought(world) -> None:
    w, seller = world(offering())
    w.run(reconcile_plan, NAME)
    seller.pay(UID, "scheduled")
    later(w, 2)
    w.run(reconcile_plan, NAME)
    obj = w.kube.objects[(PLANS_PLURAL, NAME)]
    obj["metadata"]["deletionTimestamp"] = "2027-01-04T00:00:10Z"

    import asyncio
    asyncio.run(release_plan(w.rt, obj))

    [kept] = [m for _, t, r, m in w.events if r == "RemotePlanKept"]
    assert f"capacity-reservation/{RID}" in kept and "an EC2 Capacity Block cannot be cancelled" in kept
    assert lines(w) == []


def test_deleting_a_plan_whose_block_is_being_paid_says_it_stays(world) -> None:
    w, seller = world(offering())
    w.run(reconcile_plan, NAME)  # bought, payment-pending: no line yet
    obj = w.kube.objects[(PLANS_PLURAL, NAME)]
    obj["metadata"]["deletionTimestamp"] = "2027-01-04T00:00:10Z"
    later(w, 60)

    import asyncio
    asyncio.run(release_plan(w.rt, obj))

    [kept] = [m for _, t, r, m in w.events if r == "RemotePlanKept"]
    assert f"capacity-reservation/{RID} (Pending)" in kept and "EC2 Capacity Block" in kept


def _remote_offering():
    from hyperplan.planning import capacity_blocks as cb
    from hyperplan.planning.offerings import OfferingRequest
    request = OfferingRequest(instance_type=P5, instance_count=8, ultra_server_type=None, ultra_server_count=None,
                              target="hyperpod-cluster", duration=timedelta(hours=48))
    [found] = cb.offerings_of([offering()], POOL, P5, ZONE, request)
    return found


# --------------------------------------------------------------------------- the real client, stubbed


def test_the_plan_pass_through_the_real_client_makes_exactly_these_ec2_calls(monkeypatch) -> None:
    import boto3
    from botocore.stub import Stubber
    from hyperplan.actuation.remote.capacity_blocks import CapacityBlocks

    w = make_world(monkeypatch, NOW, SAGEMAKER, plans=[plan()], pools=[blocks_pool()])
    client = boto3.session.Session(aws_access_key_id="AKIAEXAMPLE", aws_secret_access_key="secret",
                                   region_name="us-east-1").client("ec2", endpoint_url="http://127.0.0.1:9")
    seller = CapacityBlocks(Ec2CapacityBlocksSource(endpoint="http://127.0.0.1:9", region="us-east-1"), client=client,
                            clock=lambda: (w.now - NOW).total_seconds())
    w.rt.remote = sources(w, seller)
    listing = {"Filters": [{"Name": "tag-key", "Values": ["hyperplan.dev/remote-plan"]}], "MaxResults": 1000}
    rid = "cr-0123456789abcdef0"
    reservation = {"CapacityReservationId": rid, "OwnerId": "111122223333",
                   "CapacityReservationArn": f"arn:aws:ec2:us-east-1:111122223333:capacity-reservation/{rid}",
                   "InstanceType": P5, "AvailabilityZone": ZONE, "TotalInstanceCount": 8, "State": "payment-pending",
                   "StartDate": START, "EndDate": START + timedelta(hours=48), "ReservationType": "capacity-block",
                   "Tags": [{"Key": "hyperplan.dev/availability-zone", "Value": ZONE},  # as the pool names it
                            {"Key": "hyperplan.dev/remote-plan", "Value": remote_plan_name(UID, 0)},
                            {"Key": "hyperplan.dev/training-plan", "Value": NAME},
                            {"Key": "hyperplan.dev/training-plan-uid", "Value": UID}]}
    try:
        with Stubber(client) as stub:
            stub.add_response("describe_capacity_reservations", {"CapacityReservations": []}, listing)
            stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [offering()]}, {
                "InstanceType": P5, "InstanceCount": 8, "CapacityDurationHours": 48, "MaxResults": 1000})
            stub.add_response("describe_capacity_reservations", {"CapacityReservations": []}, {
                "Filters": [{"Name": "tag:hyperplan.dev/training-plan-uid", "Values": [UID]}], "MaxResults": 1000})
            stub.add_response("purchase_capacity_block", {"CapacityReservation": reservation}, {
                "CapacityBlockOfferingId": "cbo-0123456789abcdef0", "InstancePlatform": "Linux/UNIX",
                "TagSpecifications": [{"ResourceType": "capacity-reservation", "Tags": reservation["Tags"]}]})
            w.run(reconcile_plan, NAME)
            assert status(w) == {}  # bought, payment pending: nothing written yet (REMOTE_QUIET)
            stub.assert_no_pending_responses()

            later(w, 2)
            stub.add_response("describe_capacity_reservations",
                              {"CapacityReservations": [{**reservation, "State": "scheduled"}]}, listing)
            w.run(reconcile_plan, NAME)
            stub.assert_no_pending_responses()
        assert status(w)["phase"] == "Scheduled"
        assert [rc["id"] for rc in status(w)["reservedCapacity"]] == [rid]
    finally:
        w.close()


# --------------------------------------------------------------------------- extending a capacity block

BLOCK_END = START + timedelta(hours=48)


def extension_offer(oid: str = "cbeo-0123456789abcdef0", hours: int = 24, start: datetime = BLOCK_END,
                    zone: str = ZONE, count: int = 8, fee: str = "4200.00") -> dict[str, Any]:
    return {"CapacityBlockExtensionOfferingId": oid, "InstanceType": P5, "InstanceCount": count,
            "AvailabilityZone": zone, "AvailabilityZoneId": "use1-az6", "StartDate": START,
            "CapacityBlockExtensionStartDate": start, "CapacityBlockExtensionEndDate": start + timedelta(hours=hours),
            "CapacityBlockExtensionDurationHours": hours, "UpfrontFee": fee, "CurrencyCode": "USD"}


def bought_block(world, pool: CapacityPool | None = None) -> tuple[World, FakeCapacityBlocks]:
    """A plan whose capacity block is paid and recorded here."""
    w, seller = world(offering(), pool=pool)
    w.run(reconcile_plan, NAME)
    seller.pay(UID, "scheduled")
    later(w, 2)
    w.run(reconcile_plan, NAME)
    assert status(w)["phase"] == "Scheduled"
    return w, seller


def ask(w: World, *ids: str) -> None:
    w.kube.objects[(PLANS_PLURAL, NAME)]["spec"]["extensions"] = [{"offeringId": i} for i in ids]
    later(w, 1)


def extension_buys(seller: FakeCapacityBlocks) -> list[tuple]:
    return [args for op, args in seller.calls if op == "purchase_extension"]


def test_a_capacity_block_is_extended_once_and_shows_it_when_ec2_has_taken_the_payment(world) -> None:
    w, seller = bought_block(world)
    seller.extension_offered[RID] = [extension_offer(), extension_offer("cbeo-week", hours=168)]
    later(w, 61)
    w.run(reconcile_plan, NAME)

    # Each duration asked for (EC2 answers one at a time), shown under local ids, shortest first.
    assert sorted(args for op, args in seller.calls if op == "describe_extension_offerings") == [(RID, 24), (RID, 168)]
    day, week = status(w)["extensionOfferings"]
    assert (day["reservedCapacityId"], day["capacityPool"], day["durationDays"], week["durationDays"]) == (RID, POOL, 1, 7)
    assert day["id"].startswith("tpe-") and "cbeo-" not in str(status(w))

    ask(w, day["id"])
    w.run(reconcile_plan, NAME)
    assert extension_buys(seller) == [("cbeo-0123456789abcdef0", RID)]
    [entry] = status(w)["extensions"]
    assert (entry["status"], entry["reason"]) == ("Pending", "RemoteExtending"), entry

    # Payment pending: the history says so, and nothing is bought again.
    later(w, 3)
    w.run(reconcile_plan, NAME)
    assert len(extension_buys(seller)) == 1
    assert status(w)["extensions"][0]["reason"] == "RemoteExtending"

    seller.extension_paid(RID)
    later(w, 3)
    w.run(reconcile_plan, NAME)
    [entry] = status(w)["extensions"]
    assert entry["status"] == "Scheduled", entry
    assert condition(w, "Extended")["status"] == "True"
    assert [r.end_time for r in w.ledger.pool_objects[0].status.reservations] == [BLOCK_END + timedelta(hours=24)]
    assert len(extension_buys(seller)) == 1


@pytest.mark.parametrize("offer", [
    extension_offer(start=BLOCK_END + timedelta(hours=1)),
    extension_offer(zone="us-east-1b"),
    extension_offer(count=4),
    extension_offer(fee="99999.00"),
], ids=["starts-elsewhere", "other-zone", "other-count", "above-the-fee-ceiling"])
def test_capacity_block_extensions_the_pool_would_not_buy_are_neither_offered_nor_bought(world, offer) -> None:
    w, seller = bought_block(world, pool=blocks_pool(max_upfront_fee="40000"))
    seller.extension_offered[RID] = [offer]
    later(w, 61)
    w.run(reconcile_plan, NAME)
    assert status(w).get("extensionOfferings") in (None, [])

    from hyperplan.planning.blocks import Block
    from hyperplan.planning.offerings import extension_id
    block = Block(pool=POOL, availability_zone=ZONE, instance_type=P5, instance_count=8, start=START, end=BLOCK_END,
                  id=RID)
    ask(w, extension_id(UID, block, offer["CapacityBlockExtensionEndDate"]))
    w.run(reconcile_plan, NAME)

    assert extension_buys(seller) == []
    [entry] = status(w)["extensions"]
    assert (entry["status"], entry["reason"]) == ("Failed", "ExtensionNotOffered"), entry


def test_an_extension_whose_payment_failed_fails_here_and_is_not_bought_again(world) -> None:
    w, seller = bought_block(world)
    seller.extension_offered[RID] = [extension_offer()]
    later(w, 61)
    w.run(reconcile_plan, NAME)
    ask(w, status(w)["extensionOfferings"][0]["id"])
    w.run(reconcile_plan, NAME)
    seller.extension_paid(RID, "payment-failed")
    later(w, 3)
    w.run(reconcile_plan, NAME)

    [entry] = status(w)["extensions"]
    assert entry["status"] == "Failed", entry
    assert len(extension_buys(seller)) == 1
    assert [r.end_time for r in w.ledger.pool_objects[0].status.reservations] == [BLOCK_END]


def test_a_key_refused_the_extension_fails_the_entry_naming_the_ec2_right(world) -> None:
    w, seller = bought_block(world)
    seller.extension_offered[RID] = [extension_offer()]
    later(w, 61)
    w.run(reconcile_plan, NAME)

    def refused(offering_id: str, reservation: str) -> list:
        seller.calls.append(("purchase_extension", (offering_id, reservation)))
        raise RemoteError("PurchaseCapacityBlockExtension", "UnauthorizedOperation",
                          "You are not authorized to perform this operation.", seller.endpoint, refused=True)
    seller.purchase_extension = refused  # type: ignore[method-assign]
    ask(w, status(w)["extensionOfferings"][0]["id"])
    w.run(reconcile_plan, NAME)

    [entry] = status(w)["extensions"]
    assert (entry["status"], entry["reason"]) == ("Failed", "RemoteRefused"), entry
    assert "ec2:PurchaseCapacityBlockExtension" in entry["message"]


# --------------------------------------------------------------------------- an UltraServer's interconnect

GB200, X72 = "p6e-gb200.36xlarge", "ml.u-p6e-gb200x72"


def ultraserver_block(world, count: int = 1, per_ultraserver: bool = False) -> tuple[World, FakeCapacityBlocks, str]:
    """A plan of ``count`` x72 UltraServers bought as an EC2 UltraServer Capacity Block (one
    reservation, or one per UltraServer), its block running; the Capacity Block's id too."""
    pool = CapacityPool(metadata={"name": "cb-gb200"}, spec=CapacityPoolSpec(
        instance_type=GB200, availability_zone=ZONE, ultra_server_type=X72,
        source=PoolSource(ec2_capacity_blocks=Ec2CapacityBlocksSource(region="us-east-1"))))
    offer = {"CapacityBlockOfferingId": "cbo-ultra", "InstanceType": GB200, "AvailabilityZone": ZONE,
             "InstanceCount": 18 * count, "UltraserverType": "u-p6e-gb200x72", "UltraserverCount": count,
             "StartDate": START, "EndDate": START + timedelta(hours=48), "CapacityBlockDurationHours": 48,
             "UpfrontFee": f"{450000 * count}.00", "CurrencyCode": "USD"}
    w, seller = world(offer, pool=pool, ultraServerType=X72, ultraServerCount=count)
    seller.reservation_per_ultraserver = per_ultraserver
    del w.kube.objects[(PLANS_PLURAL, NAME)]["spec"]["instanceType"]
    del w.kube.objects[(PLANS_PLURAL, NAME)]["spec"]["instanceCount"]
    w.run(reconcile_plan, NAME)
    assert len(buys(seller)) == 1, seller.calls
    rid = seller.pay(UID, "active")
    w.now = START + timedelta(hours=1)
    w.run(reconcile_plan, NAME)
    later(w, 2)
    w.run(reconcile_plan, NAME)
    assert status(w)["phase"] == "Active", status(w)
    return w, seller, str(seller.reservations[rid]["CapacityBlockId"])


def ultra_health(w: World) -> dict[str, str]:
    return {u["id"]: u["healthStatus"] for u in status(w)["ultraServers"]}


def test_an_ec2_ultraserver_whose_interconnect_is_impaired_is_impaired_in_the_plans_status(world) -> None:
    w, seller, capacity_block = ultraserver_block(world)
    [ultraserver] = ultra_health(w)
    assert ultra_health(w) == {ultraserver: "ok"}
    assert [args for op, args in seller.calls if op == "interconnect"] == [capacity_block]

    seller.interconnect[capacity_block] = "impaired"
    later(w, 20)
    w.run(reconcile_plan, NAME)
    assert ultra_health(w) == {ultraserver: "ok"}  # paced: asked again after a minute

    later(w, 45)
    w.run(reconcile_plan, NAME)
    assert ultra_health(w) == {ultraserver: "impaired"}

    seller.interconnect[capacity_block] = "ok"
    later(w, 61)
    w.run(reconcile_plan, NAME)
    assert ultra_health(w) == {ultraserver: "ok"}
    assert len([op for op, _ in seller.calls if op == "interconnect"]) == 3


# --------------------------------------------------------------------------- an UltraServer block of a reservation each


def ultra_extension_offer(oid: str, count: int = 18, start: datetime = BLOCK_END) -> dict[str, Any]:
    return {**extension_offer(oid, start=start, count=count, fee="450000.00"), "InstanceType": GB200}


def ledger_ends(w: World) -> list[datetime]:
    return [r.end_time for p in w.ledger.pool_objects for r in p.status.reservations]


def offered_two_reservation_block(world) -> tuple[World, FakeCapacityBlocks, str, str, str, dict[str, Any]]:
    """A running block of two x72 UltraServers, a reservation each, and each reservation offered
    a day more: the plan, the seller, the Capacity Block, the two reservations and the offering."""
    w, seller, capacity_block = ultraserver_block(world, count=2, per_ultraserver=True)
    a, b = sorted(seller.reservations)
    seller.extension_offered = {a: [ultra_extension_offer("cbeo-a")], b: [ultra_extension_offer("cbeo-b")]}
    later(w, 61)
    w.run(reconcile_plan, NAME)
    [offer] = status(w)["extensionOfferings"]
    return w, seller, capacity_block, a, b, offer


def test_an_ultraserver_block_of_a_reservation_each_is_extended_reservation_by_reservation(world) -> None:
    w, seller, capacity_block, a, b, offer = offered_two_reservation_block(world)

    # One offering of the block (its Capacity Block's id), not one per reservation.
    assert (offer["reservedCapacityId"], offer["durationDays"]) == (capacity_block, 1)
    ask(w, offer["id"])
    w.run(reconcile_plan, NAME)
    assert extension_buys(seller) == [("cbeo-a", a), ("cbeo-b", b)]
    assert status(w)["extensions"][0]["reason"] == "RemoteExtending"

    # One reservation paid: the block still ends with the other, and nothing is bought again.
    seller.extension_paid(a)
    later(w, 3)
    w.run(reconcile_plan, NAME)
    assert status(w)["extensions"][0]["reason"] == "RemoteExtending"
    assert ledger_ends(w) == [BLOCK_END]

    seller.extension_paid(b)
    later(w, 3)
    w.run(reconcile_plan, NAME)
    [entry] = status(w)["extensions"]
    assert entry["status"] == "Scheduled", entry  # from the block's old end
    assert ledger_ends(w) == [BLOCK_END + timedelta(hours=24)]
    assert len(extension_buys(seller)) == 2


def test_a_reservation_whose_extension_was_gone_is_extended_alone_when_asked_again(world) -> None:
    w, seller, _, a, b, offer = offered_two_reservation_block(world)
    buy = seller.purchase_extension

    def sold_meanwhile(offering_id: str, reservation: str) -> list:  # between the pass's search and its purchase
        if reservation != b:
            return buy(offering_id, reservation)
        seller.calls.append(("refused_extension", (offering_id, reservation)))
        raise RemoteError("PurchaseCapacityBlockExtension", "InsufficientCapacityBlockCapacity",
                          "There is not enough capacity to fulfill your request.", seller.endpoint, refused=True)
    seller.purchase_extension = sold_meanwhile  # type: ignore[method-assign]
    ask(w, offer["id"])
    w.run(reconcile_plan, NAME)

    [entry] = status(w)["extensions"]
    assert (entry["status"], entry["reason"]) == ("Failed", "ExtensionNotOffered"), entry
    assert f"{a} extended already" in entry["message"]
    assert extension_buys(seller) == [("cbeo-a", a)]

    # Offered again: the same extension of the block, now only the reservation left to extend.
    seller.purchase_extension = buy  # type: ignore[method-assign]
    seller.extension_offered[b] = [ultra_extension_offer("cbeo-b2")]
    w.kube.objects[(PLANS_PLURAL, NAME)]["spec"]["extensions"] = []
    later(w, 61)
    w.run(reconcile_plan, NAME)
    [again] = status(w)["extensionOfferings"]
    assert again["id"] == offer["id"]
    ask(w, offer["id"])
    w.run(reconcile_plan, NAME)
    assert extension_buys(seller) == [("cbeo-a", a), ("cbeo-b2", b)]
    seller.extension_paid(a)
    seller.extension_paid(b)
    later(w, 3)
    w.run(reconcile_plan, NAME)
    assert status(w)["extensions"][0]["status"] == "Scheduled"
    assert ledger_ends(w) == [BLOCK_END + timedelta(hours=24)]
