"""planning.blocks.Block, the one value for "a block": its wire forms on the plan's status and in a
pool's ledger (field for field, as the CRDs carry them), the round trips back, and the two readers of
the ledger (the ledger itself and the watch cache) reading the same blocks out of the same pools."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hyperplan_testing.fakes import FakeLedger
from hyperplan.actuation.ledger import blocks_of
from hyperplan.api.models import CapacityPool, Offering as OfferingStatus, Reservation, ReservedCapacity
from hyperplan.runtime.store import GROUPS, NODES, PLANS, POOLS, WatchCache
from hyperplan.planning.blocks import Block
from hyperplan.planning.offerings import ULTRASERVER_INSTANCE_TYPE, Offering
from hyperplan.planning.policy import SAGEMAKER

UTC = timezone.utc
T = datetime(2027, 2, 1, 11, 30, tzinfo=UTC)
P5 = "ml.p5.48xlarge"
X72 = "ml.u-p6e-gb200x72"

PLAIN = Block("pool-a", "use1-az1", P5, 8, T, T + timedelta(days=1))
ULTRA = Block("pool-u", "use1-az3", ULTRASERVER_INSTANCE_TYPE, 36, T, T + timedelta(days=2), ultra_server_type=X72)


@pytest.mark.parametrize("block, ultra_server_count", [
    pytest.param(PLAIN, None, id="plain-instances"),
    pytest.param(ULTRA, 2, id="two-x72-ultraservers"),
    pytest.param(Block("p", "az", ULTRASERVER_INSTANCE_TYPE, 9, T, T + timedelta(days=1),
                       ultra_server_type="ml.u-p6e-gb200x36"), 1, id="one-x36-ultraserver"),
    pytest.param(Block("p", "az", P5, 8, T, T + timedelta(days=1), ultra_server_type="ml.unknown"), None,
                 id="unknown-type-counts-none"),
])
def test_the_ultraserver_count_follows_from_the_instance_count(block, ultra_server_count):
    assert block.ultra_server_count == ultra_server_count


@pytest.mark.parametrize("blocks, wire", [
    pytest.param([PLAIN], {
        "id": Offering.from_blocks([PLAIN]).id, "durationHours": 24, "durationMinutes": 0,
        "blocks": [{"availabilityZone": "use1-az1", "instanceType": P5, "instanceCount": 8,
                    "startTime": "2027-02-01T11:30:00Z", "endTime": "2027-02-02T11:30:00Z",
                    "capacityPool": "pool-a"}]}, id="plain"),
    pytest.param([ULTRA], {
        "id": Offering.from_blocks([ULTRA]).id, "durationHours": 48, "durationMinutes": 0,
        "blocks": [{"availabilityZone": "use1-az3", "instanceType": ULTRASERVER_INSTANCE_TYPE, "instanceCount": 36,
                    "startTime": "2027-02-01T11:30:00Z", "endTime": "2027-02-03T11:30:00Z",
                    "capacityPool": "pool-u", "ultraServerType": X72, "ultraServerCount": 2}]}, id="ultraserver"),
])
def test_an_offering_on_the_plan_status_and_back(blocks, wire):
    offering = Offering.from_blocks(blocks)
    shown = offering.to_status()

    assert shown.wire() == wire
    # What the next pass reads back from the status (JSON through the API server) is what was shown.
    assert Offering.from_status(OfferingStatus.model_validate(wire)) == offering


def test_a_bought_block_on_the_plan_status():
    bought = Block("pool-u", "use1-az3", ULTRASERVER_INSTANCE_TYPE, 36, T, T + timedelta(days=2),
                   ultra_server_type=X72, id="rc-u-0")
    shown = bought.to_reserved(T + timedelta(days=2, hours=-1), "Scheduled")

    assert shown.wire() == {
        "id": "rc-u-0", "availabilityZone": "use1-az3", "instanceType": ULTRASERVER_INSTANCE_TYPE,
        "instanceCount": 36, "startTime": "2027-02-01T11:30:00Z", "endTime": "2027-02-03T11:30:00Z",
        "terminationTime": "2027-02-03T10:30:00Z", "status": "Scheduled", "capacityPool": "pool-u",
        "ultraServerType": X72, "ultraServerCount": 2}
    assert isinstance(shown, ReservedCapacity)


@pytest.mark.parametrize("block", [pytest.param(PLAIN, id="plain"), pytest.param(ULTRA, id="ultraserver")])
def test_a_block_in_the_ledger_and_back(block):
    bought = Block(block.pool, block.availability_zone, block.instance_type, block.instance_count, block.start,
                   block.end, block.ultra_server_type, id="rc-1234-0")
    line = bought.to_reservation("llama", "uid-1234")

    assert line.wire() == {"trainingPlan": "llama", "trainingPlanUid": "uid-1234", "reservedCapacityId": "rc-1234-0",
                           "startTime": "2027-02-01T11:30:00Z", "endTime": bought.end.strftime("%Y-%m-%dT%H:%M:%SZ"),
                           "instanceCount": block.instance_count}
    read = Block.from_reservation(Reservation.model_validate(line.wire()), block.pool, block.availability_zone,
                                  block.instance_type, block.ultra_server_type)
    assert read == bought


def test_a_block_without_its_id_is_refused_by_the_ledger():
    with pytest.raises(ValueError, match="reserved-capacity id"):
        PLAIN.to_reservation("llama", "uid-1234")


def _pool(name: str, az: str, instance_type: str, count: int, ultra_server_type: str | None = None) -> CapacityPool:
    spec = {"instanceType": instance_type, "availabilityZone": az, "instanceCount": count}
    if ultra_server_type:
        spec["ultraServerType"] = ultra_server_type
    return CapacityPool.model_validate({"metadata": {"name": name, "resourceVersion": "1"}, "spec": spec})


def test_the_ledger_and_the_watch_cache_read_the_same_blocks_of_a_plan():
    pools = [_pool("pool-a", "use1-az1", P5, 8), _pool("pool-b", "use1-az2", P5, 8),
             _pool("pool-u", "use1-az3", ULTRASERVER_INSTANCE_TYPE, 72, X72)]
    ledger = FakeLedger(pool_objects=pools)
    later = Block("pool-a", "use1-az1", P5, 8, T + timedelta(days=3), T + timedelta(days=4))
    earlier = Block("pool-b", "use1-az2", P5, 8, T, T + timedelta(days=1))
    assert ledger.purchase("llama", "uid-llama", Offering.from_blocks([later, earlier]), SAGEMAKER,
                           T - timedelta(days=1)).ok
    assert ledger.purchase("other", "uid-other", Offering.from_blocks([ULTRA]), SAGEMAKER, T - timedelta(days=1)).ok

    from_ledger = blocks_of(pools, "uid-llama")
    raw = [p.wire() | {"metadata": p.metadata} for p in pools]
    cache = WatchCache()
    cache.bind({PLANS: {}, POOLS: {p["metadata"]["name"]: [p] for p in raw}, GROUPS: {}, NODES: {}})

    # By start, each with the id the ledger gave it (block index within the offering).
    assert from_ledger == [
        Block("pool-b", "use1-az2", P5, 8, T, T + timedelta(days=1), id="rc-uidllama-0"),
        Block("pool-a", "use1-az1", P5, 8, T + timedelta(days=3), T + timedelta(days=4), id="rc-uidllama-1"),
    ]
    assert cache.blocks_of("uid-llama") == from_ledger
    us = Block("pool-u", "use1-az3", ULTRASERVER_INSTANCE_TYPE, 36, T, T + timedelta(days=2), X72, id="rc-uidother-0")
    assert blocks_of(pools, "uid-other") == cache.blocks_of("uid-other") == [us]
    assert cache.blocks_of("uid-nobody") == blocks_of(pools, "uid-nobody") == []
