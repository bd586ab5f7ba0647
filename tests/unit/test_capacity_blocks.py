"""EC2 Capacity Blocks as a remote source (actuation.remote.capacity_blocks.CapacityBlocks) under
botocore's Stubber, which checks every request against EC2's service model (names, types,
required members), and the pure reading of its answers (planning.capacity_blocks). Each call and
each error is covered; above all, a purchase (which spends money, and which EC2 cannot take
back) is never made twice for one plan."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import boto3
import pytest
from botocore.stub import ANY, Stubber

from hyperplan import metrics
from hyperplan.actuation.remote.capacity_blocks import UNCERTAIN_FOR, CapacityBlocks
from hyperplan.actuation.remote.calls import NotBought, RemoteError
from hyperplan.actuation.remote.sources import RemoteSources, make_seller
from hyperplan.api.models import Ec2CapacityBlocksSource, PoolSource, SageMakerSource
from hyperplan.planning import capacity_blocks as cb
from hyperplan.planning.offerings import OfferingRequest
from hyperplan.planning.policy import SAGEMAKER
from hyperplan.planning.remote import PoolTerms, remote_plan_name, standing_of

UTC = timezone.utc
START = datetime(2027, 1, 5, 11, 30, tzinfo=UTC)
P5, ZONE = "p5.48xlarge", "us-east-1a"
UID = "0c6f9a52-1111-4a8e-9d6e-2a41c0ffee00"
NAME = remote_plan_name(UID, 0)
TAGS = {"hyperplan.dev/training-plan": "llama", "hyperplan.dev/training-plan-uid": UID}
POOL = PoolTerms("cb-p5", P5, ZONE)
RID = "cr-0123456789abcdef0"


def ec2_client():
    return boto3.session.Session(aws_access_key_id="AKIAEXAMPLE", aws_secret_access_key="secret",
                                 region_name="us-east-1").client("ec2", endpoint_url="http://127.0.0.1:9")


@pytest.fixture
def stubbed():
    client, now = ec2_client(), [0.0]
    blocks = CapacityBlocks(Ec2CapacityBlocksSource(endpoint="http://127.0.0.1:9", region="us-east-1"),
                            client=client, clock=lambda: now[0])
    with Stubber(client) as stub:
        yield blocks, stub, now
        stub.assert_no_pending_responses()


def counted(operation: str, result: str) -> float:
    return metrics.REMOTE_CALLS.labels(operation, result)._value.get()


def request(**kw) -> OfferingRequest:
    fields = dict(instance_type=P5, instance_count=8, ultra_server_type=None, ultra_server_count=None,
                  target="hyperpod-cluster", duration=timedelta(hours=48))
    return OfferingRequest(**{**fields, **kw})


def offering(oid: str = "cbo-0123456789abcdef0", itype: str = P5, zone: str = ZONE, count: int = 8,
             fee: str | None = "35000.00", **extra) -> dict:
    answer = {"CapacityBlockOfferingId": oid, "InstanceType": itype, "AvailabilityZone": zone, "InstanceCount": count,
              "StartDate": START, "EndDate": START + timedelta(hours=48), "CapacityBlockDurationHours": 48,
              "Tenancy": "default", **extra}
    if fee is not None:
        answer.update(UpfrontFee=fee, CurrencyCode="USD")
    return answer


def reservation(rid: str = RID, state: str = "scheduled", name: str = NAME, uid: str = UID, **extra) -> dict:
    tags = [{"Key": k, "Value": v} for k, v in sorted({**TAGS, "hyperplan.dev/training-plan-uid": uid,
                                                       cb.TAG_REMOTE_PLAN: name}.items())]
    return {"CapacityReservationId": rid, "OwnerId": "111122223333",
            "CapacityReservationArn": f"arn:aws:ec2:us-east-1:111122223333:capacity-reservation/{rid}",
            "InstanceType": P5, "InstancePlatform": "Linux/UNIX", "AvailabilityZone": ZONE,
            "AvailabilityZoneId": "use1-az6", "Tenancy": "default", "TotalInstanceCount": 8,
            "AvailableInstanceCount": 8, "State": state, "StartDate": START, "EndDate": START + timedelta(hours=48),
            "EndDateType": "limited", "InstanceMatchCriteria": "targeted", "ReservationType": "capacity-block",
            "Tags": tags, **extra}


def uid_check(stub: Stubber, found: list[dict], uid: str = UID) -> None:
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": found},
                      {"Filters": [{"Name": "tag:hyperplan.dev/training-plan-uid", "Values": [uid]}], "MaxResults": 1000})


def purchase_expected(oid: str = "cbo-0123456789abcdef0", name: str = NAME) -> dict:
    return {"CapacityBlockOfferingId": oid, "InstancePlatform": "Linux/UNIX", "TagSpecifications": [{
        "ResourceType": "capacity-reservation", "Tags": [
            {"Key": "hyperplan.dev/availability-zone", "Value": ZONE},
            {"Key": "hyperplan.dev/remote-plan", "Value": name},
            {"Key": "hyperplan.dev/training-plan", "Value": "llama"},
            {"Key": "hyperplan.dev/training-plan-uid", "Value": UID}]}]}


def remote_offering(oid: str = "cbo-0123456789abcdef0"):
    [found] = cb.offerings_of([offering(oid)], POOL.name, P5, ZONE, request())
    return found


# --------------------------------------------------------------------------- the client


def test_the_purchase_goes_through_a_client_that_never_retries() -> None:
    blocks = CapacityBlocks(Ec2CapacityBlocksSource(region="us-east-1"), ("AKIAEXAMPLE", "secret"))
    assert blocks.client.meta.config.retries == {"mode": "standard", "total_max_attempts": 3}
    assert blocks.buy_client.meta.config.retries == {"mode": "standard", "total_max_attempts": 1}
    assert blocks.client.meta.service_model.service_name == "ec2"
    assert blocks.endpoint == "https://ec2.us-east-1.amazonaws.com"


def test_each_kind_of_source_is_made_its_own_seller_with_its_own_key() -> None:
    assert isinstance(make_seller(Ec2CapacityBlocksSource(region="us-east-1"), ("k", "s")), CapacityBlocks)
    made = []
    sources = RemoteSources(credentials=lambda name: None, make=lambda source, creds: made.append(source) or object())
    sources.capacity("a", SageMakerSource(region="us-east-1"))
    sources.capacity("b", Ec2CapacityBlocksSource(region="us-east-1"))
    sources.capacity("c", Ec2CapacityBlocksSource(region="us-east-1"))  # the same key: the same seller
    assert [type(s).__name__ for s in made] == ["SageMakerSource", "Ec2CapacityBlocksSource"]


@pytest.mark.parametrize("fields", [{}, {"sageMaker": {"region": "us-east-1"},
                                         "ec2CapacityBlocks": {"region": "us-east-1"}}], ids=["none", "both"])
def test_a_source_is_exactly_one_kind(fields) -> None:
    with pytest.raises(ValueError, match="exactly one of sageMaker or ec2CapacityBlocks"):
        PoolSource.model_validate(fields)
    assert PoolSource.model_validate({"ec2CapacityBlocks": {"region": "us-east-1"}}).remote.service == "ec2"


def test_missing_credentials_name_the_ec2_field() -> None:
    sources = RemoteSources(credentials=lambda name: None)
    with pytest.raises(RemoteError, match="spec.source.ec2CapacityBlocks.credentialsSecret") as e:
        sources.capacity("cb-p5", Ec2CapacityBlocksSource(region="us-east-1", credentials_secret="nope"))
    assert e.value.endpoint == "ec2.us-east-1"


# --------------------------------------------------------------------------- search


def test_search_sends_the_plans_request_pages_and_keeps_what_the_pool_sells(stubbed) -> None:
    blocks, stub, _ = stubbed
    wanted = {"InstanceType": P5, "InstanceCount": 8, "CapacityDurationHours": 48, "StartDateRange": START,
              "EndDateRange": START + timedelta(days=7), "MaxResults": 1000}
    stub.add_response("describe_capacity_block_offerings", {
        "CapacityBlockOfferings": [offering("cbo-good"), offering("cbo-far", zone="us-east-1b")],
        "NextToken": "t1"}, wanted)
    stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [
        offering("cbo-other", itype="p4d.24xlarge"), offering("cbo-ultra", UltraserverType="u-p6e-gb200x72"),
        offering("cbo-split", CapacityBlockOfferingSegments=[
            {"InstanceType": P5, "AvailabilityZoneId": "use1-az6", "InstanceCount": 8, "StartDate": START,
             "EndDate": START + timedelta(hours=24)},
            {"InstanceType": P5, "AvailabilityZone": ZONE, "InstanceCount": 8, "StartDate": START + timedelta(hours=24),
             "EndDate": START + timedelta(hours=48)}])]}, {**wanted, "NextToken": "t1"})
    before = counted("DescribeCapacityBlockOfferings", "ok")

    found = blocks.find_offerings(request(start_after=START, end_before=START + timedelta(days=7)), SAGEMAKER, [POOL])

    assert [o.remote_id for o in found] == ["cbo-good", "cbo-split"]
    assert [(b.pool, b.availability_zone, b.instance_count) for b in found[0].offering.blocks] == [("cb-p5", ZONE, 8)]
    assert len(found[1].offering.blocks) == 2  # one block per segment
    assert found[0].offering.id.startswith("tpo-20270105t113000-")  # the local id, as for any pool
    assert (found[0].upfront_fee, found[0].currency) == ("35000.00", "USD")
    assert counted("DescribeCapacityBlockOfferings", "ok") == before + 2


@pytest.mark.parametrize("code, status, refused", [
    ("RequestLimitExceeded", 503, False), ("UnauthorizedOperation", 403, True), ("InvalidParameterValue", 400, True),
    ("InternalError", 500, False),
], ids=["throttled", "no-right", "bad-request", "ec2-failed"])
def test_every_error_of_the_search_is_a_remote_error_with_its_code(stubbed, code, status, refused) -> None:
    blocks, stub, _ = stubbed
    stub.add_client_error("describe_capacity_block_offerings", service_error_code=code,
                          service_message=f"it said {code}", http_status_code=status)
    before = counted("DescribeCapacityBlockOfferings", code)

    with pytest.raises(RemoteError) as e:
        blocks.find_offerings(request(), SAGEMAKER, [POOL])
    assert (e.value.operation, e.value.code, e.value.refused) == ("DescribeCapacityBlockOfferings", code, refused)
    assert counted("DescribeCapacityBlockOfferings", code) == before + 1


# --------------------------------------------------------------------------- buy


def test_a_purchase_checks_the_plans_tag_first_then_buys_once_tagged(stubbed) -> None:
    blocks, stub, _ = stubbed
    uid_check(stub, [])
    stub.add_response("purchase_capacity_block", {"CapacityReservation": reservation(state="payment-pending")},
                      purchase_expected())

    plan = blocks.buy(NAME, UID, remote_offering(), None, TAGS)

    assert (plan.name, plan.status, plan.blocks, plan.noun) == (NAME, "Pending", (), "capacity block")
    assert f"{RID} is payment-pending" in plan.status_message  # nothing held until it is paid
    assert plan.arn.endswith(f"capacity-reservation/{RID}")


def test_a_purchase_retried_after_a_crash_finds_the_tagged_reservation_and_buys_nothing(stubbed) -> None:
    blocks, stub, _ = stubbed
    # An earlier process bought and died before this cluster recorded it; its pass had listed
    # nothing, so it asks to buy again under the same attempt's name.
    uid_check(stub, [reservation(state="scheduled")])
    before = counted("PurchaseCapacityBlock", "ok")

    plan = blocks.buy(NAME, UID, remote_offering(), None, TAGS)  # no PurchaseCapacityBlock is stubbed

    assert (plan.name, plan.status) == (NAME, "Scheduled")
    [block] = plan.blocks
    assert (block.id, block.availability_zone, block.instance_count) == (RID, ZONE, 8)  # the block is cr-...
    assert counted("PurchaseCapacityBlock", "ok") == before


def test_a_purchase_under_the_next_name_still_adopts_a_live_one(stubbed) -> None:
    blocks, stub, _ = stubbed
    uid_check(stub, [reservation(state="payment-pending")])
    assert blocks.buy(remote_plan_name(UID, 1), UID, remote_offering(), None, TAGS).name == NAME


def test_a_used_attempt_name_is_never_bought_under_again(stubbed) -> None:
    blocks, stub, _ = stubbed
    uid_check(stub, [reservation(state="payment-failed")])
    with pytest.raises(NotBought, match="was used already"):
        blocks.buy(NAME, UID, remote_offering(), None, TAGS)


@pytest.mark.parametrize("code, status", [("InsufficientInstanceCapacity", 500), ("InsufficientCapacity", 400)],
                         ids=["insufficient-instance-capacity", "insufficient-capacity"])
def test_an_offering_sold_meanwhile_is_not_bought_and_not_the_passes_error(stubbed, code, status) -> None:
    blocks, stub, _ = stubbed
    uid_check(stub, [])
    stub.add_client_error("purchase_capacity_block", service_error_code=code, service_message="no capacity",
                          http_status_code=status, expected_params=purchase_expected())
    before = counted("PurchaseCapacityBlock", code)

    with pytest.raises(NotBought, match=f"no longer sells capacity block offering .*{code}"):
        blocks.buy(NAME, UID, remote_offering(), None, TAGS)
    assert counted("PurchaseCapacityBlock", code) == before + 1
    uid_check(stub, [])  # and nothing holds the next purchase back
    stub.add_response("purchase_capacity_block", {"CapacityReservation": reservation(state="payment-pending")},
                      purchase_expected())
    assert blocks.buy(NAME, UID, remote_offering(), None, TAGS).status == "Pending"


def test_a_refused_purchase_fails_the_pass_with_its_code(stubbed) -> None:
    blocks, stub, _ = stubbed
    uid_check(stub, [])
    stub.add_client_error("purchase_capacity_block", service_error_code="UnauthorizedOperation",
                          service_message="not allowed", http_status_code=403)
    with pytest.raises(RemoteError) as e:
        blocks.buy(NAME, UID, remote_offering(), None, TAGS)
    assert (e.value.code, e.value.refused) == ("UnauthorizedOperation", True)


def test_a_purchase_without_an_answer_buys_nothing_more_until_ec2_shows_it_or_a_while_passed(stubbed) -> None:
    blocks, stub, now = stubbed
    uid_check(stub, [])
    stub.add_client_error("purchase_capacity_block", service_error_code="InternalError", http_status_code=500)
    with pytest.raises(RemoteError) as first:
        blocks.buy(NAME, UID, remote_offering(), None, TAGS)
    assert not first.value.refused  # EC2 may have bought

    now[0] = 30
    uid_check(stub, [])  # EC2's describe lags: nothing shown yet
    with pytest.raises(RemoteError) as held:
        blocks.buy(NAME, UID, remote_offering(), None, TAGS)
    assert held.value.code == "PurchaseOutcomeUnknown"

    now[0] = 40
    uid_check(stub, [reservation(state="payment-pending")])  # it had bought: adopted
    assert blocks.buy(NAME, UID, remote_offering(), None, TAGS).name == NAME

    now[0] = 50  # adopting cleared the hold; a plan that truly bought nothing buys after UNCERTAIN_FOR
    uid_check(stub, [])
    stub.add_client_error("purchase_capacity_block", service_error_code="InternalError", http_status_code=500)
    with pytest.raises(RemoteError):
        blocks.buy(NAME, UID, remote_offering(), None, TAGS)
    now[0] = 50 + UNCERTAIN_FOR
    uid_check(stub, [])
    stub.add_response("purchase_capacity_block", {"CapacityReservation": reservation(state="payment-pending")},
                      purchase_expected())
    assert blocks.buy(NAME, UID, remote_offering(), None, TAGS).status == "Pending"


def test_what_was_bought_is_followed_while_ec2s_listing_lags(stubbed) -> None:
    blocks, stub, now = stubbed
    uid_check(stub, [])
    stub.add_response("purchase_capacity_block", {"CapacityReservation": reservation(state="payment-pending")},
                      purchase_expected())
    blocks.buy(NAME, UID, remote_offering(), None, TAGS)
    listing = {"Filters": [{"Name": "tag-key", "Values": ["hyperplan.dev/remote-plan"]}], "MaxResults": 1000}

    stub.add_response("describe_capacity_reservations", {"CapacityReservations": []}, listing)
    assert [p.name for p in blocks.remote_plans()] == [NAME]  # not shown by EC2 yet, still followed
    uid_check(stub, [])
    assert blocks.buy(remote_plan_name(UID, 1), UID, remote_offering(), None, TAGS).name == NAME  # nothing bought

    now[0] = UNCERTAIN_FOR + 1
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": [reservation(state="scheduled")]},
                      listing)
    assert [p.status for p in blocks.remote_plans()] == ["Scheduled"]


# --------------------------------------------------------------------------- follow


def test_one_attempt_is_read_by_the_plans_tag_in_one_call(stubbed) -> None:
    """What a plan waiting for its block reads when the shared listing is old (controllers.plan.remote)."""
    blocks, stub, _ = stubbed
    uid_check(stub, [reservation(state="scheduled"), reservation(rid="cr-0123456789abcdef1",
                                                                 name=remote_plan_name(UID, 1), state="active")])
    plan = blocks.remote_plan(NAME, UID)
    assert plan is not None and (plan.name, plan.status) == (NAME, "Scheduled")
    assert [b.id for b in plan.blocks] == [RID]
    uid_check(stub, [])
    assert blocks.remote_plan(NAME, UID) is None


def test_the_listing_pages_and_groups_reservations_by_the_attempt_that_bought_them(stubbed) -> None:
    blocks, stub, _ = stubbed
    listing = {"Filters": [{"Name": "tag-key", "Values": ["hyperplan.dev/remote-plan"]}], "MaxResults": 1000}
    other = reservation("cr-0000000000000000b", name=remote_plan_name("another-uid", 0), uid="another-uid")
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": [
        reservation("cr-0000000000000000a", state="payment-failed")], "NextToken": "t1"}, listing)
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": [
        reservation("cr-0000000000000000c", state="active", name=remote_plan_name(UID, 1)), other]},
        {**listing, "NextToken": "t1"})

    plans = blocks.remote_plans()

    standing = standing_of(plans, UID)
    assert (standing.live.name, standing.live.status, [p.name for p in standing.failed]) == (
        remote_plan_name(UID, 1), "Active", [NAME])
    assert [b.id for b in standing.live.blocks] == ["cr-0000000000000000c"]
    assert standing.next_attempt == 2


@pytest.mark.parametrize("code, status", [("RequestLimitExceeded", 503), ("AuthFailure", 401)],
                         ids=["throttled", "bad-key"])
def test_an_error_of_the_listing_is_a_remote_error(stubbed, code, status) -> None:
    blocks, stub, _ = stubbed
    stub.add_client_error("describe_capacity_reservations", service_error_code=code, http_status_code=status)
    with pytest.raises(RemoteError) as e:
        blocks.remote_plans()
    assert (e.value.operation, e.value.code, e.value.refused) == ("DescribeCapacityReservations", code, status < 500)


@pytest.mark.parametrize("state, status, held", [
    ("payment-pending", "Pending", False), ("assessing", "Pending", False), ("scheduled", "Scheduled", True),
    ("active", "Active", True), ("expired", "Expired", True), ("payment-failed", "Failed", False),
    ("failed", "Failed", False), ("cancelled", "Failed", False), ("unavailable", "Failed", False),
    ("something-new", "Pending", False),
])
def test_a_reservations_state_is_the_remote_plans_status_and_whether_it_holds_its_block(state, status, held) -> None:
    plan = cb.plan_from(NAME, [reservation(state=state)], "us-east-1")
    assert (plan.status, bool(plan.blocks)) == (status, held)
    assert plan.live is (status in ("Pending", "Scheduled", "Active"))


def test_a_purchase_of_several_reservations_is_one_plan_and_its_segments_are_blocks() -> None:
    later = {"StartDate": START + timedelta(hours=48), "EndDate": START + timedelta(hours=72)}
    answer = {"CapacityReservation": reservation("cr-0000000000000000a"),
              "CapacityReservations": [reservation("cr-0000000000000000a"),
                                       reservation("cr-0000000000000000b", state="payment-pending", **later)]}
    plan = cb.plan_from(NAME, cb.bought(answer), "us-east-1")
    assert plan.status == "Pending" and [b.id for b in plan.blocks] == ["cr-0000000000000000a"]


def test_stubbed_requests_carry_no_retry_or_token_of_our_own(stubbed) -> None:
    """PurchaseCapacityBlock has no ClientToken member: the Stubber refuses unknown parameters, so
    the request above is exactly the model's (offering id, platform, tags)."""
    blocks, stub, _ = stubbed
    uid_check(stub, [])
    stub.add_response("purchase_capacity_block", {"CapacityReservations": [reservation(state="payment-pending")]},
                      {"CapacityBlockOfferingId": "cbo-x", "InstancePlatform": "Linux/UNIX", "TagSpecifications": ANY})
    assert blocks.buy(NAME, UID, remote_offering("cbo-x"), None, TAGS).arn.endswith(RID)


def test_one_describe_serves_every_plan_that_asks_within_its_age(stubbed) -> None:
    from hyperplan.actuation.remote.sources import RemoteFollower
    blocks, stub, _ = stubbed
    now = [0.0]
    follower = RemoteFollower(clock=lambda: now[0])
    listing = {"Filters": [{"Name": "tag-key", "Values": ["hyperplan.dev/remote-plan"]}], "MaxResults": 1000}
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": [reservation()]}, listing)
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": [
        reservation(), reservation("cr-0000000000000000b", name=remote_plan_name("another-uid", 0), uid="another-uid")]},
        listing)

    first = follower.plans("k", blocks, max_age=5)
    now[0] = 4
    again = follower.plans("k", blocks, max_age=5)  # another plan's pass: no call (the Stubber would refuse one)
    now[0] = 6
    later = follower.plans("k", blocks, max_age=5)
    assert [p.name for p in first] == [p.name for p in again] == [NAME]
    assert len(later) == 2


# --------------------------------------------------------------------------- extensions

BLOCK_END = START + timedelta(hours=48)


def extension_offering(oid: str = "cbeo-0123456789abcdef0", hours: int = 24, **extra) -> dict:
    return {"CapacityBlockExtensionOfferingId": oid, "InstanceType": P5, "InstanceCount": 8, "AvailabilityZone": ZONE,
            "AvailabilityZoneId": "use1-az6", "StartDate": START, "CapacityBlockExtensionStartDate": BLOCK_END,
            "CapacityBlockExtensionEndDate": BLOCK_END + timedelta(hours=hours),
            "CapacityBlockExtensionDurationHours": hours, "UpfrontFee": "4200.00", "CurrencyCode": "USD",
            "Tenancy": "default", **extra}


def extension_entry(oid: str = "cbeo-0123456789abcdef0", state: str = "payment-pending", hours: int = 24) -> dict:
    return {"CapacityReservationId": RID, "InstanceType": P5, "InstanceCount": 8, "AvailabilityZone": ZONE,
            "CapacityBlockExtensionOfferingId": oid, "CapacityBlockExtensionDurationHours": hours,
            "CapacityBlockExtensionStatus": state, "CapacityBlockExtensionStartDate": BLOCK_END,
            "CapacityBlockExtensionEndDate": BLOCK_END + timedelta(hours=hours)}


def held_block():
    """The plan's block as this cluster records it (the reservation's id is the block's)."""
    from hyperplan.planning.blocks import Block
    return Block(pool=POOL.name, availability_zone=ZONE, instance_type=P5, instance_count=8, start=START,
                 end=BLOCK_END, id=RID)


def test_extension_offerings_are_asked_per_duration_paged_and_cut_from_the_recorded_block(stubbed) -> None:
    blocks, stub, _ = stubbed
    remote = cb.plan_from(NAME, [reservation()], "us-east-1")
    ask = {"CapacityReservationId": RID, "MaxResults": 1000}
    stub.add_response("describe_capacity_block_extension_offerings",
                      {"CapacityBlockExtensionOfferings": [extension_offering()], "NextToken": "p2"},
                      {**ask, "CapacityBlockExtensionDurationHours": 24})
    stub.add_response("describe_capacity_block_extension_offerings",
                      {"CapacityBlockExtensionOfferings": [extension_offering("cbeo-other-type", InstanceType="p4d.24xlarge")]},
                      {**ask, "CapacityBlockExtensionDurationHours": 24, "NextToken": "p2"})
    stub.add_response("describe_capacity_block_extension_offerings",
                      {"CapacityBlockExtensionOfferings": [extension_offering("cbeo-week", hours=168,
                                                                              AvailabilityZone="us-east-1-by-id",
                                                                              AvailabilityZoneId=ZONE)]},
                      {**ask, "CapacityBlockExtensionDurationHours": 168})

    found = blocks.find_extensions(remote, UID, [held_block()], SAGEMAKER)

    assert [(e.remote_id, e.extension.days, e.extension.block.id, e.upfront_fee) for e in found] == [
        ("cbeo-0123456789abcdef0", 1, RID, "4200.00"), ("cbeo-week", 7, RID, "4200.00")]
    assert found[0].extension.end == BLOCK_END + timedelta(hours=24)


def test_no_extension_is_searched_for_a_block_the_remote_no_longer_holds(stubbed) -> None:
    blocks, _, _ = stubbed
    remote = cb.plan_from(NAME, [reservation(rid="cr-0fffffffffffffff0")], "us-east-1")
    assert blocks.find_extensions(remote, UID, [held_block()], SAGEMAKER) == []  # no call made


def test_the_extension_history_of_every_reservation_of_the_plan_in_one_call(stubbed) -> None:
    blocks, stub, _ = stubbed
    segment = reservation(rid="cr-0fffffffffffffff0", StartDate=BLOCK_END, EndDate=BLOCK_END + timedelta(hours=24))
    remote = cb.plan_from(NAME, [reservation(), segment], "us-east-1")  # two windows: two blocks
    stub.add_response("describe_capacity_block_extension_history", {"CapacityBlockExtensions": [
        extension_entry(), extension_entry("cbeo-paid", "payment-succeeded"), extension_entry("cbeo-no", "payment-failed"),
        extension_entry("cbeo-new", "some-later-state")]},
        {"CapacityReservationIds": [RID, "cr-0fffffffffffffff0"], "MaxResults": 1000})

    records = blocks.extension_history(remote)

    assert [(r.remote_id, r.status) for r in records] == [
        ("cbeo-0123456789abcdef0", "Pending"), ("cbeo-paid", "Scheduled"), ("cbeo-no", "Failed"), ("cbeo-new", "Pending")]
    assert records[0].start == BLOCK_END and records[0].end == BLOCK_END + timedelta(hours=24)


def test_an_extension_is_bought_once_through_the_client_without_retries() -> None:
    blocks = CapacityBlocks(Ec2CapacityBlocksSource(region="us-east-1"), ("AKIAEXAMPLE", "secret"))
    remote = cb.plan_from(NAME, [reservation()], "us-east-1")
    [offer] = cb.extensions_of([extension_offering()], UID, held_block(), SAGEMAKER)
    with Stubber(blocks.client) as retrying, Stubber(blocks.buy_client) as once:
        once.add_response("purchase_capacity_block_extension", {"CapacityBlockExtensions": [extension_entry()]},
                          {"CapacityBlockExtensionOfferingId": "cbeo-0123456789abcdef0", "CapacityReservationId": RID})
        [record] = blocks.extend(remote, offer)
        once.assert_no_pending_responses()
        retrying.assert_no_pending_responses()
    assert (record.remote_id, record.status, record.end) == ("cbeo-0123456789abcdef0", "Pending",
                                                             BLOCK_END + timedelta(hours=24))


@pytest.mark.parametrize("code, status, raised", [
    ("InvalidCapacityBlockExtensionOfferingId.NotFound", 400, NotBought),
    ("InsufficientCapacityBlockCapacity", 400, NotBought),
    ("UnauthorizedOperation", 403, RemoteError),
    ("InternalError", 500, RemoteError),
], ids=["offering-gone", "capacity-sold", "refused", "ec2s-own-failure"])
def test_each_error_of_an_extension_purchase(stubbed, code, status, raised) -> None:
    blocks, stub, _ = stubbed
    remote = cb.plan_from(NAME, [reservation()], "us-east-1")
    [offer] = cb.extensions_of([extension_offering()], UID, held_block(), SAGEMAKER)
    stub.add_client_error("purchase_capacity_block_extension", code, "no", http_status_code=status)
    with pytest.raises(raised) as failed:
        blocks.extend(remote, offer)
    if raised is RemoteError:
        assert failed.value.code == code and failed.value.refused == (status < 500)


# --------------------------------------------------------------------------- a pool that names its zone by id

AZ6 = "use1-az6"  # ZONE's id in the tests' account
BY_ID = PoolTerms("cb-p5-az6", P5, AZ6)
ZONES = {"AvailabilityZones": [{"ZoneName": ZONE, "ZoneId": AZ6, "ZoneType": "availability-zone"},
                               {"ZoneName": "us-east-1b", "ZoneId": "use1-az1", "ZoneType": "availability-zone"},
                               {"ZoneName": "us-east-1-dfw-2a", "ZoneId": "use1-dfw2-az1", "ZoneType": "local-zone"}]}


@pytest.mark.parametrize("zone, by_id", [
    (AZ6, True), ("use1-dfw2-az1", True), ("usw2-lax1-az1", True), (ZONE, False), ("us-east-1-dfw-2a", False),
], ids=["zone-id", "local-zone-id", "other-local-zone-id", "zone-name", "local-zone-name"])
def test_a_zone_id_is_told_from_a_zone_name(zone, by_id) -> None:
    assert cb.is_zone_id(zone) is by_id


def test_a_pool_named_by_zone_id_takes_offerings_in_that_zone_by_their_names_id(stubbed) -> None:
    blocks, stub, _ = stubbed
    wanted = {"InstanceType": P5, "InstanceCount": 8, "CapacityDurationHours": 48, "MaxResults": 1000}
    answer = {"CapacityBlockOfferings": [
        offering("cbo-az6"), offering("cbo-az1", zone="us-east-1b"),
        offering("cbo-split", CapacityBlockOfferingSegments=[
            {"InstanceType": P5, "AvailabilityZone": ZONE, "AvailabilityZoneId": AZ6, "InstanceCount": 8,
             "StartDate": START, "EndDate": START + timedelta(hours=48)}])]}
    stub.add_response("describe_capacity_block_offerings", answer, wanted)
    stub.add_response("describe_availability_zones", ZONES, {"AllAvailabilityZones": True})
    stub.add_response("describe_capacity_block_offerings", answer, wanted)  # the zones are read once

    found = blocks.find_offerings(request(), SAGEMAKER, [BY_ID, POOL])
    again = blocks.find_offerings(request(), SAGEMAKER, [BY_ID])

    assert [(o.remote_id, o.offering.blocks[0].pool, o.offering.blocks[0].availability_zone) for o in found] == [
        ("cbo-az6", BY_ID.name, AZ6), ("cbo-split", BY_ID.name, AZ6), ("cbo-az6", POOL.name, ZONE),
        ("cbo-split", POOL.name, ZONE)]  # each pool's block in its zone as it names it
    assert [o.remote_id for o in again] == ["cbo-az6", "cbo-split"]


def test_a_pool_named_by_zone_name_reads_no_zones(stubbed) -> None:
    blocks, stub, _ = stubbed
    stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [offering()]},
                      {"InstanceType": P5, "InstanceCount": 8, "CapacityDurationHours": 48, "MaxResults": 1000})
    assert [o.remote_id for o in blocks.find_offerings(request(), SAGEMAKER, [POOL])] == ["cbo-0123456789abcdef0"]


def test_a_purchase_for_a_pool_named_by_zone_id_tags_the_zone_as_the_pool_names_it(stubbed) -> None:
    blocks, stub, _ = stubbed
    [by_id] = cb.offerings_of([offering()], BY_ID.name, P5, AZ6, request(), zone_ids={ZONE: AZ6})
    tagged = reservation(state="scheduled", Tags=reservation()["Tags"] + [{"Key": cb.TAG_ZONE, "Value": AZ6}])
    uid_check(stub, [])
    expected = purchase_expected()
    expected["TagSpecifications"][0]["Tags"][0]["Value"] = AZ6
    stub.add_response("purchase_capacity_block", {"CapacityReservation": tagged}, expected)

    plan = blocks.buy(NAME, UID, by_id, None, TAGS)

    assert [(b.id, b.availability_zone) for b in plan.blocks] == [(RID, AZ6)]


@pytest.mark.parametrize("tag, pool_zone, zone, recorded", [
    (AZ6, AZ6, AZ6, True),  # bought by a pool named by id: read as the pool names it
    (ZONE, ZONE, ZONE, True),
    (None, ZONE, ZONE, True),  # bought before the tag: by its name, as ever
    ("use1-az1", "use1-az1", ZONE, False),  # a tag that is not the reservation's zone moves nothing
], ids=["by-id", "by-name", "untagged", "tag-of-another-zone"])
def test_a_followed_reservation_is_in_the_pools_zone_as_the_pool_names_it(tag, pool_zone, zone, recorded) -> None:
    from hyperplan.planning.remote import mirror_lines
    extra = [{"Key": cb.TAG_ZONE, "Value": tag}] if tag else []
    plan = cb.plan_from(NAME, [reservation(Tags=reservation()["Tags"] + extra)], "us-east-1")
    assert [b.availability_zone for b in plan.blocks] == [zone]
    lines, refused = mirror_lines(plan, "llama", UID, P5, pool_zone)
    assert (len(lines), len(refused)) == ((1, 0) if recorded else (0, 1))
