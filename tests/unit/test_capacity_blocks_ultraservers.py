"""UltraServer Capacity Blocks through ``spec.source.ec2CapacityBlocks``: the search,
the cut of EC2's answer for a pool that declares an UltraServer type, the purchase and the
following of what it bought, under botocore's Stubber (which checks each request, and each stubbed
answer, against EC2's service model), and the pure reading of the answers (planning.capacity_blocks).

hyperplan names UltraServer types as SageMaker does (``ml.u-p6e-gb200x72``), EC2 without ``ml.``;
the pool names the EC2 instance type, as for any EC2 pool. A plan's UltraServer block is one block
of all its UltraServers, whatever number of capacity reservations EC2 makes for it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import boto3
import pytest
from botocore.stub import Stubber

from hyperplan.actuation.remote.capacity_blocks import CapacityBlocks
from hyperplan.actuation.remote.calls import NotBought, RemoteError
from hyperplan.api.models import Ec2CapacityBlocksSource
from hyperplan.planning import capacity_blocks as cb
from hyperplan.planning import naming
from hyperplan.planning.blocks import Block
from hyperplan.planning.offerings import OfferingRequest
from hyperplan.planning.policy import SAGEMAKER
from hyperplan.planning.remote import PoolTerms, RemoteExtension, mirror_lines, remote_plan_name, within_fee

UTC = timezone.utc
START = datetime(2027, 1, 5, 11, 30, tzinfo=UTC)
END = START + timedelta(hours=48)
X72, X36 = "ml.u-p6e-gb200x72", "ml.u-p6e-gb200x36"
GB200, ZONE = "p6e-gb200.36xlarge", "us-east-1-dfw-2a"
UID = "0c6f9a52-1111-4a8e-9d6e-2a41c0ffee00"
NAME = remote_plan_name(UID, 0)
TAGS = {"hyperplan.dev/training-plan": "gb200", "hyperplan.dev/training-plan-uid": UID}
POOL = PoolTerms("cb-gb200", GB200, ZONE, X72)
CBID = "cb-0123456789abcdef0"
LISTING = {"Filters": [{"Name": "tag-key", "Values": ["hyperplan.dev/remote-plan"]}], "MaxResults": 1000}


@pytest.fixture
def stubbed():
    client = boto3.session.Session(aws_access_key_id="AKIAEXAMPLE", aws_secret_access_key="secret",
                                   region_name="us-east-1").client("ec2", endpoint_url="http://127.0.0.1:9")
    blocks = CapacityBlocks(Ec2CapacityBlocksSource(endpoint="http://127.0.0.1:9", region="us-east-1"),
                            client=client, clock=lambda: 0.0)
    with Stubber(client) as stub:
        yield blocks, stub
        stub.assert_no_pending_responses()


def ultra_request(count: int = 2, ultra: str = X72) -> OfferingRequest:
    return OfferingRequest(instance_type=None, instance_count=None, ultra_server_type=ultra, ultra_server_count=count,
                           target="hyperpod-cluster", duration=timedelta(hours=48))


def offering(oid: str = "cbo-ultra", **fields) -> dict:
    answer = {"CapacityBlockOfferingId": oid, "InstanceType": GB200, "AvailabilityZone": ZONE, "InstanceCount": 36,
              "UltraserverType": "u-p6e-gb200x72", "UltraserverCount": 2, "StartDate": START, "EndDate": END,
              "CapacityBlockDurationHours": 48, "UpfrontFee": "900000.00", "CurrencyCode": "USD", "Tenancy": "default"}
    return {k: v for k, v in {**answer, **fields}.items() if v is not None}


def reservation(rid: str, state: str = "scheduled", count: int = 18, block: str | None = CBID, **extra) -> dict:
    tags = [{"Key": k, "Value": v} for k, v in sorted({**TAGS, cb.TAG_REMOTE_PLAN: NAME}.items())]
    answer = {"CapacityReservationId": rid, "OwnerId": "111122223333",
              "CapacityReservationArn": f"arn:aws:ec2:us-east-1:111122223333:capacity-reservation/{rid}",
              "InstanceType": GB200, "InstancePlatform": "Linux/UNIX", "AvailabilityZone": ZONE,
              "AvailabilityZoneId": "use1-dfw2-az1", "TotalInstanceCount": count, "AvailableInstanceCount": count,
              "State": state, "StartDate": START, "EndDate": END, "ReservationType": "capacity-block",
              "Tags": tags, **extra}
    if block:
        answer["CapacityBlockId"] = block
    return answer


PER_ULTRASERVER = [reservation("cr-0000000000000000a"), reservation("cr-0000000000000000b")]


# --------------------------------------------------------------------------- names and the search


@pytest.mark.parametrize("hyperplan, ec2", [
    (X72, "u-p6e-gb200x72"), (X36, "u-p6e-gb200x36"), ("ml.p6e-gb200.36xlarge", GB200), (GB200, GB200),
], ids=["x72", "x36", "instance-type", "already-ec2s"])
def test_ec2_names_types_without_the_ml_prefix(hyperplan, ec2) -> None:
    assert cb.ec2_name(hyperplan) == ec2


def test_an_ultraserver_search_asks_ec2_for_its_ultraserver_type_and_count(stubbed) -> None:
    blocks, stub = stubbed
    stub.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [offering()]}, {
        "InstanceType": GB200, "UltraserverType": "u-p6e-gb200x72", "UltraserverCount": 2,
        "CapacityDurationHours": 48, "StartDateRange": START, "MaxResults": 1000})

    request = OfferingRequest(instance_type=None, instance_count=None, ultra_server_type=X72, ultra_server_count=2,
                              target="hyperpod-cluster", duration=timedelta(hours=48), start_after=START)
    [found] = blocks.find_offerings(request, SAGEMAKER, [POOL])

    [block] = found.offering.blocks
    assert (found.remote_id, block.pool, block.instance_type, block.instance_count) == (
        "cbo-ultra", POOL.name, GB200, 36)
    assert (block.ultra_server_type, block.ultra_server_count) == (X72, 2)  # hyperplan's naming from here on
    assert found.offering.to_status().blocks[0].ultra_server_count == 2


def test_an_ultraserver_search_ec2_refuses_is_a_refused_remote_error(stubbed) -> None:
    blocks, stub = stubbed
    stub.add_client_error("describe_capacity_block_offerings", service_error_code="InvalidParameterCombination",
                          service_message="no", http_status_code=400)
    with pytest.raises(RemoteError) as e:
        blocks.find_offerings(ultra_request(), SAGEMAKER, [POOL])
    assert (e.value.operation, e.value.code, e.value.refused) == (
        "DescribeCapacityBlockOfferings", "InvalidParameterCombination", True)


# --------------------------------------------------------------------------- the cut


@pytest.mark.parametrize("entry, pool, count", [
    (offering(), POOL, 36),
    (offering(InstanceCount=None), POOL, 36),  # only the UltraServers counted: their instances
    (offering(UltraserverType="u-p6e-gb200x36", InstanceCount=18), POOL, None),
    (offering(UltraserverType=None, UltraserverCount=None), POOL, None),  # plain instances: not an UltraServer pool's
    (offering(), PoolTerms("cb-plain", GB200, ZONE), None),  # and an UltraServer offering is no plain pool's
    (offering(InstanceCount=35), POOL, None),
    (offering(InstanceCount=18), POOL, None),  # 2 UltraServers of 18 instances are 36
    (offering(AvailabilityZone="us-east-1a"), POOL, None),
    (offering(InstanceType="p5.48xlarge"), POOL, None),
    (offering(UltraserverType="u-p6e-gb200x36", InstanceCount=18, UltraserverCount=2),
     PoolTerms("cb-x36", GB200, ZONE, X36), 18),
], ids=["x72", "count-by-ultraservers", "other-ultraserver-type", "no-ultraserver-type", "plain-pool",
        "not-whole-ultraservers", "counts-disagree", "other-zone", "other-instance-type", "x36-pool"])
def test_only_offerings_of_the_pools_ultraserver_type_in_whole_ultraservers_are_cut(entry, pool, count) -> None:
    found = cb.offerings_of([entry], pool.name, pool.instance_type, pool.availability_zone, ultra_request(),
                            pool.ultra_server_type)
    assert [b.instance_count for o in found for b in o.offering.blocks] == ([count] if count else [])
    assert all(b.ultra_server_type == pool.ultra_server_type for o in found for b in o.offering.blocks)


@pytest.mark.parametrize("fee, ceiling, kept", [("900000.00", "1000000", True), ("900000.00", "500000", False),
                                                (None, "1000000", False)], ids=["within", "dearer", "no-fee"])
def test_the_pools_fee_ceiling_applies_to_an_ultraserver_offering_as_to_any(fee, ceiling, kept) -> None:
    [found] = cb.offerings_of([offering(UpfrontFee=fee)], POOL.name, GB200, ZONE, ultra_request(), X72)
    assert within_fee(found, ceiling) is kept


# --------------------------------------------------------------------------- purchase and follow


def test_an_ultraserver_purchase_answer_of_one_reservation_per_ultraserver_is_one_block(stubbed) -> None:
    blocks, stub = stubbed
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": []},
                      {"Filters": cb.uid_filter(UID), "MaxResults": 1000})
    stub.add_response("purchase_capacity_block", {
        "CapacityBlocks": [{"CapacityBlockId": CBID, "UltraserverType": "u-p6e-gb200x72", "AvailabilityZone": ZONE,
                            "CapacityReservationIds": ["cr-0000000000000000a", "cr-0000000000000000b"],
                            "StartDate": START, "EndDate": END, "State": "scheduled"}],
        "CapacityReservations": PER_ULTRASERVER}, {
        "CapacityBlockOfferingId": "cbo-ultra", "InstancePlatform": "Linux/UNIX",
        "TagSpecifications": cb.purchase_tags(NAME, TAGS, ZONE, X72)})  # the UltraServer type tagged
    [remote_offering] = cb.offerings_of([offering()], POOL.name, GB200, ZONE, ultra_request(), X72)

    plan = blocks.buy(NAME, UID, remote_offering, 1, TAGS)

    [block] = plan.blocks
    assert (plan.status, block.id, block.instance_count, block.instance_type, block.availability_zone) == (
        "Scheduled", CBID, 36, GB200, ZONE)
    assert cb.reservation_id(plan, block.id) is None  # several reservations: extended one by one
    assert [r.id for r in cb.block_reservations(plan, block.id)] == ["cr-0000000000000000a", "cr-0000000000000000b"]


@pytest.mark.parametrize("reservations, block_id, count", [
    (PER_ULTRASERVER, CBID, 36),
    ([reservation("cr-0000000000000000a", count=36)], "cr-0000000000000000a", 36),  # one for all: its own id
    ([reservation("cr-0000000000000000a", block=None), reservation("cr-0000000000000000b", block=None)],
     None, 36),  # no Capacity Block id: a digest of theirs, the same on every read
    ([reservation("cr-0000000000000000a"), reservation("cr-0000000000000000b", "payment-pending")], "", 0),
    ([reservation("cr-0000000000000000a", "active"), reservation("cr-0000000000000000b", "payment-failed")],
     CBID, 18),
], ids=["per-ultraserver", "one-for-all", "no-capacity-block-id", "one-unpaid", "one-failed"])
def test_the_listing_makes_the_reservations_of_one_window_one_block(stubbed, reservations, block_id, count) -> None:
    blocks, stub = stubbed
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": reservations}, LISTING)

    [plan] = blocks.remote_plans()

    if not count:
        assert (plan.status, plan.blocks) == ("Pending", ())  # half an UltraServer block is no block yet
        return
    [block] = plan.blocks
    assert block.instance_count == count
    if block_id is not None:
        assert block.id == block_id
    else:
        assert block.id.startswith("cr-0000000000000000a-cr-") and len(block.id) <= 63
        assert cb.plan_from(NAME, list(reversed(reservations)), "us-east-1").blocks[0].id == block.id


def test_a_followed_ultraserver_block_is_one_ledger_line_read_back_as_all_its_ultraservers() -> None:
    """The ledger's line carries no UltraServer type: the pool's is applied when it is read back."""
    plan = cb.plan_from(NAME, PER_ULTRASERVER, "us-east-1")
    [line], refused = mirror_lines(plan, "gb200", UID, GB200, ZONE)
    assert refused == [] and (line.reserved_capacity_id, line.instance_count) == (CBID, 36)
    block = Block.from_reservation(line, POOL.name, ZONE, GB200, X72)
    assert (block.ultra_server_count, block.id) == (2, CBID)


# --------------------------------------------------------------------------- extending a block of several reservations

A, B = "cr-0000000000000000a", "cr-0000000000000000b"
DAY = END + timedelta(hours=24)  # the block extended by one of the profile's days


def held_ultra_block() -> Block:
    return Block(pool=POOL.name, availability_zone=ZONE, instance_type=GB200, instance_count=36, start=START,
                 end=END, ultra_server_type=X72, id=CBID)


def ext_offering(oid: str, rid_end=END, hours: int = 24, count: int = 18, fee: str = "450000.00", **extra) -> dict:
    return {"CapacityBlockExtensionOfferingId": oid, "InstanceType": GB200, "InstanceCount": count,
            "AvailabilityZone": ZONE, "StartDate": START, "CapacityBlockExtensionStartDate": rid_end,
            "CapacityBlockExtensionEndDate": rid_end + timedelta(hours=hours), "CapacityBlockExtensionDurationHours": hours,
            "UpfrontFee": fee, "CurrencyCode": "USD", "Tenancy": "default", **extra}


def ext_entry(rid: str, oid: str, state: str = "payment-pending", until=DAY) -> dict:
    return {"CapacityReservationId": rid, "InstanceType": GB200, "InstanceCount": 18, "AvailabilityZone": ZONE,
            "CapacityBlockExtensionOfferingId": oid, "CapacityBlockExtensionDurationHours": 24,
            "CapacityBlockExtensionStatus": state, "CapacityBlockExtensionStartDate": END,
            "CapacityBlockExtensionEndDate": until}


def test_a_block_part_way_extended_stays_one_block_until_the_first_of_its_reservations_ends() -> None:
    """EC2 moves each reservation's end when its own extension is paid: the block keeps its id and
    count, and ends with the first of them, until all have moved."""
    part_way = [reservation(A, EndDate=DAY), reservation(B)]
    [block] = cb.plan_from(NAME, part_way, "us-east-1").blocks
    assert (block.id, block.instance_count, block.end) == (CBID, 36, END)
    assert [(r.id, r.end) for r in block.reservations] == [(A, DAY), (B, END)]
    [block] = cb.plan_from(NAME, [reservation(A, EndDate=DAY), reservation(B, EndDate=DAY)], "us-east-1").blocks
    assert (block.id, block.end) == (CBID, DAY)


@pytest.mark.parametrize("offered, history, parts, fee", [
    ({A: [ext_offering("cbeo-a")], B: [ext_offering("cbeo-b")]}, [],
     (("cr-0000000000000000a", "cbeo-a"), ("cr-0000000000000000b", "cbeo-b")), "900000.00"),
    ({A: [ext_offering("cbeo-a")], B: []}, [], None, None),
    ({A: [ext_offering("cbeo-a")], B: [ext_offering("cbeo-b", count=36)]}, [], None, None),
    ({A: [], B: [ext_offering("cbeo-b")]}, [ext_entry(A, "cbeo-a")], (("cr-0000000000000000b", "cbeo-b"),), "450000.00"),
    ({A: [ext_offering("cbeo-a2")], B: [ext_offering("cbeo-b")]}, [ext_entry(A, "cbeo-a", "payment-failed")],
     (("cr-0000000000000000a", "cbeo-a2"), ("cr-0000000000000000b", "cbeo-b")), "900000.00"),
    ({A: [], B: []}, [ext_entry(A, "cbeo-a"), ext_entry(B, "cbeo-b")], None, None),
], ids=["each-offered", "one-not-offered", "another-count", "one-bought-before", "one-failed-before", "both-bought"])
def test_a_block_of_several_reservations_is_extended_when_each_of_them_can_be(stubbed, offered, history, parts,
                                                                              fee) -> None:
    """Each reservation's offerings per duration, and the block's history in one call: the block's
    extension until an end is each reservation's extension until then, less those bought."""
    blocks, stub = stubbed
    plan = cb.plan_from(NAME, PER_ULTRASERVER, "us-east-1")
    for rid in (A, B):
        for hours in (24, 168):
            stub.add_response("describe_capacity_block_extension_offerings", {"CapacityBlockExtensionOfferings": [
                o for o in offered[rid] if o["CapacityBlockExtensionDurationHours"] == hours]},
                {"CapacityReservationId": rid, "CapacityBlockExtensionDurationHours": hours, "MaxResults": 1000})
    stub.add_response("describe_capacity_block_extension_history", {"CapacityBlockExtensions": history},
                      {"CapacityReservationIds": [A, B], "MaxResults": 1000})

    found = blocks.find_extensions(plan, UID, [held_ultra_block()], SAGEMAKER)

    if parts is None:
        assert found == []
        return
    [ext] = found
    assert (ext.parts, ext.upfront_fee, ext.currency, ext.extension.block.id, ext.extension.end, ext.extension.days) == (
        parts, fee, "USD", CBID, DAY, 1)


def extension_of() -> RemoteExtension:
    """The block's extension by one day, each reservation offered its own."""
    offered = {A: [ext_offering("cbeo-a")], B: [ext_offering("cbeo-b")]}
    [ext] = cb.reservations_extensions_of(offered, [], UID, held_ultra_block(),
                                          cb.plan_from(NAME, PER_ULTRASERVER, "us-east-1").blocks[0].reservations,
                                          SAGEMAKER)
    return ext


def test_each_reservations_extension_is_bought_once_through_the_client_without_retries() -> None:
    blocks = CapacityBlocks(Ec2CapacityBlocksSource(region="us-east-1"), ("AKIAEXAMPLE", "secret"))
    plan = cb.plan_from(NAME, PER_ULTRASERVER, "us-east-1")
    with Stubber(blocks.client) as retrying, Stubber(blocks.buy_client) as once:
        retrying.add_response("describe_capacity_block_extension_history", {"CapacityBlockExtensions": []},
                              {"CapacityReservationIds": [A, B], "MaxResults": 1000})
        for rid, oid in ((A, "cbeo-a"), (B, "cbeo-b")):
            once.add_response("purchase_capacity_block_extension", {"CapacityBlockExtensions": [ext_entry(rid, oid)]},
                              {"CapacityBlockExtensionOfferingId": oid, "CapacityReservationId": rid})
        [record] = blocks.extend(plan, extension_of())
        once.assert_no_pending_responses()
        retrying.assert_no_pending_responses()
    assert (record.status, record.start, record.end) == ("Pending", END, DAY)


def test_a_part_bought_before_is_not_bought_again_and_a_part_gone_says_what_was_bought(stubbed) -> None:
    blocks, stub = stubbed
    plan = cb.plan_from(NAME, PER_ULTRASERVER, "us-east-1")
    stub.add_response("describe_capacity_block_extension_history",
                      {"CapacityBlockExtensions": [ext_entry(A, "cbeo-a")]},  # bought before its answer was lost
                      {"CapacityReservationIds": [A, B], "MaxResults": 1000})
    stub.add_response("purchase_capacity_block_extension", {"CapacityBlockExtensions": [ext_entry(B, "cbeo-b")]},
                      {"CapacityBlockExtensionOfferingId": "cbeo-b", "CapacityReservationId": B})
    [record] = blocks.extend(plan, extension_of())
    assert (record.remote_id, record.status) == ("cbeo-a+cbeo-b", "Pending")

    stub.add_response("describe_capacity_block_extension_history", {"CapacityBlockExtensions": []},
                      {"CapacityReservationIds": [A, B], "MaxResults": 1000})
    stub.add_response("purchase_capacity_block_extension", {"CapacityBlockExtensions": [ext_entry(A, "cbeo-a")]},
                      {"CapacityBlockExtensionOfferingId": "cbeo-a", "CapacityReservationId": A})
    stub.add_client_error("purchase_capacity_block_extension", "InsufficientCapacityBlockCapacity", "sold",
                          http_status_code=400)
    with pytest.raises(NotBought, match=f"{B}.*InsufficientCapacityBlockCapacity.*{A} extended already"):
        blocks.extend(plan, extension_of())


@pytest.mark.parametrize("history, ends, records", [
    ([], (END, END), []),
    ([ext_entry(A, "cbeo-a")], (END, END), []),  # half asked: not underway, the rest is bought next
    ([ext_entry(A, "cbeo-a"), ext_entry(B, "cbeo-b")], (END, END), [("cbeo-a+cbeo-b", "Pending")]),
    ([ext_entry(A, "cbeo-a", "payment-succeeded"), ext_entry(B, "cbeo-b")], (DAY, END), [("cbeo-a+cbeo-b", "Pending")]),
    ([ext_entry(A, "cbeo-a", "payment-succeeded"), ext_entry(B, "cbeo-b", "payment-succeeded")], (DAY, END),
     [("cbeo-a+cbeo-b", "Scheduled")]),
    ([ext_entry(A, "cbeo-a", "payment-succeeded"), ext_entry(B, "cbeo-b", "payment-failed")], (DAY, END),
     [("cbeo-a+cbeo-b", "Failed")]),
], ids=["none", "one-asked", "both-pending", "one-paid", "both-paid", "one-failed"])
def test_the_history_of_a_block_of_several_reservations_is_one_record_per_end(stubbed, history, ends, records) -> None:
    blocks, stub = stubbed
    plan = cb.plan_from(NAME, [reservation(A, EndDate=ends[0]), reservation(B, EndDate=ends[1])], "us-east-1")
    stub.add_response("describe_capacity_block_extension_history", {"CapacityBlockExtensions": history},
                      {"CapacityReservationIds": [A, B], "MaxResults": 1000})
    found = blocks.extension_history(plan)
    assert [(r.remote_id, r.status) for r in found] == records
    assert all((r.start, r.end) == (END, DAY) for r in found)


def test_an_ultraserver_offering_sold_meanwhile_is_not_bought(stubbed) -> None:
    blocks, stub = stubbed
    stub.add_response("describe_capacity_reservations", {"CapacityReservations": []},
                      {"Filters": cb.uid_filter(UID), "MaxResults": 1000})
    stub.add_client_error("purchase_capacity_block", service_error_code="InsufficientCapacity",
                          service_message="no UltraServer left", http_status_code=400)
    [remote_offering] = cb.offerings_of([offering()], POOL.name, GB200, ZONE, ultra_request(), X72)
    with pytest.raises(NotBought, match="InsufficientCapacity"):
        blocks.buy(NAME, UID, remote_offering, 1, TAGS)



# --------------------------------------------------------------------------- interconnect health


def tagged(*reservations: dict, ultra: str | None = X72) -> list[dict]:
    """The reservations as a purchase tags them with its UltraServer type (none: bought before)."""
    if ultra is None:
        return list(reservations)
    return [{**r, "Tags": r["Tags"] + [{"Key": cb.TAG_ULTRASERVER_TYPE, "Value": ultra}]} for r in reservations]


ONE_ULTRASERVER = tagged(reservation("cr-0000000000000000a"))
US0 = naming.ultraserver_id("cr-0000000000000000a", 0)


def test_a_listed_ultraserver_block_knows_its_type_and_capacity_block_from_its_reservations() -> None:
    [block] = cb.plan_from(NAME, tagged(*PER_ULTRASERVER), "us-east-1").blocks
    assert (block.ultra_server_type, block.capacity_block_ids, block.id) == (X72, (CBID,), CBID)
    [untagged] = cb.plan_from(NAME, PER_ULTRASERVER, "us-east-1").blocks
    assert (untagged.ultra_server_type, untagged.capacity_block_ids) == (None, (CBID,))


@pytest.mark.parametrize("reservations, interconnect, health", [
    (ONE_ULTRASERVER, "impaired", {US0: "impaired"}),
    (ONE_ULTRASERVER, "ok", {US0: "ok"}),
    (ONE_ULTRASERVER, "insufficient-data", {US0: "insufficient-data"}),
    (ONE_ULTRASERVER, "degraded", {US0: "insufficient-data"}),  # a status EC2 adds later
    (ONE_ULTRASERVER, None, {}),  # EC2 answers about another Capacity Block only
], ids=["impaired", "ok", "insufficient-data", "a-new-status", "not-in-the-answer"])
def test_ec2s_interconnect_status_is_the_health_of_a_one_ultraserver_blocks_ultraserver(
        stubbed, reservations, interconnect, health) -> None:
    blocks, stub = stubbed
    [block] = cb.plan_from(NAME, reservations, "us-east-1").blocks
    status = {"CapacityBlockId": CBID if interconnect else "cb-0ther00000000000", "TotalCapacity": 18,
              "InterconnectStatus": interconnect or "ok"}
    stub.add_response("describe_capacity_block_status", {"CapacityBlockStatuses": [status]},
                      {"CapacityBlockIds": [CBID], "MaxResults": 1000})
    assert blocks.ultra_server_health(block) == health


@pytest.mark.parametrize("reservations", [
    tagged(*PER_ULTRASERVER),  # two UltraServers share one status: which one is impaired is not known
    tagged(reservation("cr-0000000000000000a"), ultra=None),  # bought before the type was tagged
    tagged(reservation("cr-0000000000000000a", block=None)),  # no Capacity Block named
    tagged(reservation("cr-0000000000000000a", count=36)),  # one reservation of two UltraServers
], ids=["two-ultraservers", "untagged", "no-capacity-block", "one-reservation-of-two"])
def test_ec2_is_not_asked_about_a_block_whose_ultraserver_it_cannot_name(stubbed, reservations) -> None:
    blocks, _ = stubbed
    [block] = cb.plan_from(NAME, reservations, "us-east-1").blocks
    assert blocks.ultra_server_health(block) == {}  # no call: the Stubber would refuse one


def test_a_refused_interconnect_status_call_is_a_refused_remote_error(stubbed) -> None:
    blocks, stub = stubbed
    [block] = cb.plan_from(NAME, ONE_ULTRASERVER, "us-east-1").blocks
    stub.add_client_error("describe_capacity_block_status", service_error_code="UnauthorizedOperation",
                          service_message="not allowed", http_status_code=403)
    with pytest.raises(RemoteError) as e:
        blocks.ultra_server_health(block)
    assert (e.value.operation, e.value.code, e.value.refused) == ("DescribeCapacityBlockStatus",
                                                                  "UnauthorizedOperation", True)
