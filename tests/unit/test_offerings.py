"""Offering search, request validation and the pre-purchase recheck.

Offerings are written as strings so that each table row reads like the answer
a user would see: "pool:start→end + pool:start→end" (times UTC).
"""

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from hyperplan.planning.offerings import (
    ULTRASERVER_INSTANCE_TYPE,
    Block,
    Busy,
    Offering,
    OfferingRequest,
    PoolSnapshot,
    recheck_offering,
    search_offerings,
    validate_request,
)
from hyperplan.planning.policy import get_policy

UTC = timezone.utc
NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
SAGEMAKER = get_policy("sagemaker")
DEMO = get_policy("demo")
P5 = "ml.p5.48xlarge"
FOREVER = "2027-06-01 00:00"  # busy "until further notice": past every limit of the search


def ts(text: str | datetime) -> datetime:
    if isinstance(text, datetime):
        return text
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def pool(name, az, count=8, busy=(), instance_type=P5, ultra_server_type=None) -> PoolSnapshot:
    return PoolSnapshot(
        name=name,
        instance_type=instance_type,
        availability_zone=az,
        instance_count=count,
        ultra_server_type=ultra_server_type,
        busy=tuple(Busy(ts(start), ts(end), taken) for start, end, taken in busy),
    )


def request(
    duration="48h",
    count=8,
    target="training-job",
    instance_type=P5,
    start_after=None,
    end_before=None,
    ultra_server_type=None,
    ultra_server_count=None,
) -> OfferingRequest:
    days, unit = int(duration[:-1]), duration[-1]
    length = {"h": timedelta(hours=days), "d": timedelta(days=days), "m": timedelta(minutes=days)}[unit]
    return OfferingRequest(
        instance_type=instance_type,
        instance_count=count,
        ultra_server_type=ultra_server_type,
        ultra_server_count=ultra_server_count,
        target=target,
        duration=length,
        start_after=ts(start_after) if start_after else None,
        end_before=ts(end_before) if end_before else None,
    )


def ultra(ultra_server_type: str, ultra_server_count: int, duration: str = "1d") -> OfferingRequest:
    return request(
        duration,
        instance_type=None,
        count=None,
        ultra_server_type=ultra_server_type,
        ultra_server_count=ultra_server_count,
    )


def describe(offering: Offering, fmt: str = "%m-%d %H:%M") -> str:
    return " + ".join(
        f"{block.pool}:{block.start.strftime(fmt)}→{block.end.strftime(fmt)}" for block in offering.blocks
    )


# Pool a is taken on Dec 2, pool b on Dec 1 (AZs a and b): no pool has 48 h free before Dec 2.
FRAGMENTED = (
    pool("a", "us-east-1a", busy=[("2026-12-02 11:30", "2026-12-03 11:30", 8)]),
    pool("b", "us-east-1b", busy=[("2026-12-01 11:30", "2026-12-02 11:30", 8)]),
)
# Only a cross-AZ pair of days exists: a on Dec 1, then b on Dec 2.
CROSS_AZ_ONLY = (
    pool("a", "us-east-1a", busy=[("2026-12-02 11:30", FOREVER, 8)]),
    pool(
        "b",
        "us-east-1b",
        busy=[("2026-12-01 11:30", "2026-12-02 11:30", 8), ("2026-12-03 11:30", FOREVER, 8)],
    ),
)
# Two windows of 4 overlap on Dec 3: each alone leaves room for 4 more, together none.
OVERLAPPING = (
    pool(
        "a",
        "us-east-1a",
        busy=[("2026-12-02 11:30", "2026-12-04 11:30", 4), ("2026-12-03 11:30", "2026-12-05 11:30", 4)],
    ),
)
# Free on Dec 1 and Dec 3 only, then taken until after the 56-day limit.
GAPPY = (
    pool(
        "a",
        "us-east-1a",
        busy=[("2026-12-02 11:30", "2026-12-03 11:30", 8), ("2026-12-04 11:30", "2027-01-27 11:30", 8)],
    ),
)
# a1 is free Dec 1 and from Dec 3, b only Dec 2, c only Dec 3: many two-block offerings end Dec 4.
THREE_AZS = (
    pool("a1", "us-east-1a", busy=[("2026-12-02 11:30", "2026-12-03 11:30", 8)]),
    pool(
        "b",
        "us-east-1b",
        busy=[("2026-12-01 11:30", "2026-12-02 11:30", 8), ("2026-12-03 11:30", FOREVER, 8)],
    ),
    pool(
        "c",
        "us-east-1c",
        busy=[("2026-12-01 11:30", "2026-12-03 11:30", 8), ("2026-12-04 11:30", FOREVER, 8)],
    ),
)


def free_only(name, az, day):
    """A pool of 8 with nothing free but the day from `day` 11:30 to the next 11:30."""
    start = ts(f"{day} 11:30")
    end = start + timedelta(days=1)
    return pool(name, az, busy=[("2026-11-01 00:00", start, 8), (end, FOREVER, 8)])


ULTRA = (
    # 2 UltraServers of 18; 18 instances taken until Dec 3.
    pool(
        "us-x72",
        "us-east-1-dfw-2a",
        count=36,
        instance_type=ULTRASERVER_INSTANCE_TYPE,
        ultra_server_type="ml.u-p6e-gb200x72",
        busy=[("2026-12-01 11:30", "2026-12-03 11:30", 18)],
    ),
    # 4 UltraServers of 9, all free: never offered for x72 requests.
    pool(
        "us-x36",
        "us-east-1-dfw-2a",
        count=36,
        instance_type=ULTRASERVER_INSTANCE_TYPE,
        ultra_server_type="ml.u-p6e-gb200x36",
    ),
)
ULTRA_PARTLY_TAKEN = (
    # 10 of 36 instances taken: 26 free, which holds one whole x72 UltraServer but not two.
    pool(
        "us-x72",
        "us-east-1-dfw-2a",
        count=36,
        instance_type=ULTRASERVER_INSTANCE_TYPE,
        ultra_server_type="ml.u-p6e-gb200x72",
        busy=[("2026-11-01 00:00", FOREVER, 10)],
    ),
)

SEARCH_CASES = [
    pytest.param(
        request("48h"),
        FRAGMENTED,
        NOW,
        SAGEMAKER,
        [
            # two 24 h blocks in two AZs finish first, then one contiguous 48 h block,
            # then two 24 h blocks in one AZ with a day's gap
            "a:12-01 11:30→12-02 11:30 + b:12-02 11:30→12-03 11:30",
            "b:12-02 11:30→12-04 11:30",
            "a:12-01 11:30→12-02 11:30 + a:12-03 11:30→12-04 11:30",
        ],
        id="48h-example-training-job",
    ),
    pytest.param(
        request("48h", target="hyperpod-cluster"),
        FRAGMENTED,
        NOW,
        SAGEMAKER,
        [
            "b:12-02 11:30→12-04 11:30",
            "a:12-01 11:30→12-02 11:30 + a:12-03 11:30→12-04 11:30",
            "a:12-03 11:30→12-05 11:30",
        ],
        id="48h-example-hyperpod-never-mixes-azs",
    ),
    pytest.param(
        request("48h"),
        CROSS_AZ_ONLY,
        NOW,
        SAGEMAKER,
        ["a:12-01 11:30→12-02 11:30 + b:12-02 11:30→12-03 11:30"],
        id="training-job-may-switch-az",
    ),
    pytest.param(
        request("48h", target="hyperpod-cluster"),
        CROSS_AZ_ONLY,
        NOW,
        SAGEMAKER,
        [],
        id="hyperpod-refuses-cross-az-pair",
    ),
    pytest.param(
        request("48h"),
        (pool("a", "us-east-1a"),),
        NOW,
        SAGEMAKER,
        # A free pool offers the contiguous block only: cutting it in two gives nothing more.
        ["a:12-01 11:30→12-03 11:30"],
        id="free-pool-one-contiguous-block",
    ),
    pytest.param(
        request("48h"),
        (pool("a", "us-east-1a"), pool("b", "us-east-1b")),
        NOW,
        SAGEMAKER,
        ["a:12-01 11:30→12-03 11:30", "b:12-01 11:30→12-03 11:30"],
        id="free-pools-one-offering-per-az",
    ),
    pytest.param(
        request("48h"),
        (
            pool("a1", "us-east-1a"),
            pool("a2", "us-east-1a", busy=[("2026-12-01 00:00", "2026-12-05 00:00", 1)]),
        ),
        NOW,
        SAGEMAKER,
        ["a1:12-01 11:30→12-03 11:30"],
        id="later-block-in-same-az-is-dropped",
    ),
    pytest.param(
        request("48h"),
        GAPPY,
        NOW,
        SAGEMAKER,
        ["a:12-01 11:30→12-02 11:30 + a:12-03 11:30→12-04 11:30"],
        id="fragmentation-forces-two-blocks",
    ),
    pytest.param(
        request("72h", count=4),
        OVERLAPPING,
        NOW,
        SAGEMAKER,
        [
            "a:12-01 11:30→12-03 11:30 + a:12-04 11:30→12-05 11:30",  # uneven 2 + 1 days
            "a:12-04 11:30→12-07 11:30",
        ],
        id="overlapping-busy-windows-add-up",
    ),
    pytest.param(
        request("1d", count=4),
        (
            pool(
                "a",
                "us-east-1a",
                busy=[
                    ("2026-12-01 11:30", "2026-12-02 11:30", 4),
                    ("2026-12-01 11:30", "2026-12-02 11:30", 4),
                ],
            ),
        ),
        NOW,
        SAGEMAKER,
        ["a:12-02 11:30→12-03 11:30"],
        id="busy-windows-starting-together-add-up",
    ),
    pytest.param(
        request("48h"),
        THREE_AZS,
        NOW,
        SAGEMAKER,
        [
            "a1:12-01 11:30→12-02 11:30 + b:12-02 11:30→12-03 11:30",
            # of those ending Dec 4, one AZ beats two (a1 Dec 1 + c Dec 3 and
            # b Dec 2 + a1 Dec 3 add nothing to a1 + a1 and are dropped)
            "a1:12-01 11:30→12-02 11:30 + a1:12-03 11:30→12-04 11:30",
            "b:12-02 11:30→12-03 11:30 + c:12-03 11:30→12-04 11:30",
        ],
        id="ties-prefer-fewer-azs",
    ),
    pytest.param(
        request("48h"),
        (
            free_only("p", "us-east-1a", "2026-12-01"),
            free_only("q", "us-east-1b", "2026-12-02"),
            free_only("r", "us-east-1c", "2026-12-04"),
        ),
        NOW,
        SAGEMAKER,
        [
            "p:12-01 11:30→12-02 11:30 + q:12-02 11:30→12-03 11:30",
            "q:12-02 11:30→12-03 11:30 + r:12-04 11:30→12-05 11:30",  # same finish, one day's gap
            "p:12-01 11:30→12-02 11:30 + r:12-04 11:30→12-05 11:30",  # same finish, two days' gap
        ],
        id="ties-prefer-smaller-gap",
    ),
    pytest.param(
        request("48h", end_before="2026-12-02 23:00"),
        (pool("a", "us-east-1a"),),
        NOW,
        SAGEMAKER,
        [],
        id="window-too-short",
    ),
    pytest.param(
        request("48h", end_before="2026-12-04 11:30"),
        FRAGMENTED,
        NOW,
        SAGEMAKER,
        [
            "a:12-01 11:30→12-02 11:30 + b:12-02 11:30→12-03 11:30",
            "b:12-02 11:30→12-04 11:30",
            "a:12-01 11:30→12-02 11:30 + a:12-03 11:30→12-04 11:30",
        ],
        id="end-before-met-exactly",
    ),
    pytest.param(
        request("48h", end_before="2026-12-03 11:30"),
        FRAGMENTED,
        NOW,
        SAGEMAKER,
        ["a:12-01 11:30→12-02 11:30 + b:12-02 11:30→12-03 11:30"],
        id="end-before-cuts-later-offerings",
    ),
    pytest.param(request("48h", count=16), FRAGMENTED, NOW, SAGEMAKER, [], id="count-no-pool-has"),
    pytest.param(
        request("48h", instance_type="ml.trn2.48xlarge"),
        FRAGMENTED,
        NOW,
        SAGEMAKER,
        [],
        id="type-no-pool-has",
    ),
    pytest.param(
        request("48h", count=3),
        (pool("a", "us-east-1a"),),
        NOW,
        SAGEMAKER,
        [],
        id="invalid-request-no-offerings",
    ),
    # the 11:30 UTC alignment and the 30-minute earliest start
    pytest.param(
        request("1d"),
        (pool("a", "us-east-1a"),),
        NOW,
        SAGEMAKER,
        ["a:12-01 11:30→12-02 11:30"],
        id="ends-1130-utc",
    ),
    pytest.param(
        request("1d"),
        (pool("a", "us-east-1a"),),
        ts("2026-12-01 11:00"),
        SAGEMAKER,
        ["a:12-01 11:30→12-02 11:30"],
        id="start-exactly-30min-after-search",
    ),
    pytest.param(
        request("1d"),
        (pool("a", "us-east-1a"),),
        ts("2026-12-01 11:01"),
        SAGEMAKER,
        ["a:12-02 11:30→12-03 11:30"],
        id="29min-is-too-soon-next-day",
    ),
    pytest.param(
        request("1d", start_after="2026-12-05 00:00"),
        (pool("a", "us-east-1a"),),
        NOW,
        SAGEMAKER,
        ["a:12-05 11:30→12-06 11:30"],
        id="start-after-rounds-up-to-1130",
    ),
    pytest.param(
        request("1d"),
        (pool("a", "us-east-1a", busy=[("2026-12-01 12:00", "2026-12-01 13:00", 1)]),),
        NOW,
        SAGEMAKER,
        ["a:12-02 11:30→12-03 11:30"],
        id="short-busy-window-costs-a-day",
    ),
    # the 56-day limit: now + 56 d = Jan 26 09:00, so the last start is Jan 25 11:30
    pytest.param(
        request("2d"),
        (pool("a", "us-east-1a", busy=[("2026-11-01 00:00", "2027-01-25 11:30", 8)]),),
        NOW,
        SAGEMAKER,
        ["a:01-25 11:30→01-27 11:30"],
        id="start-on-day-55",
    ),
    pytest.param(
        request("2d"),
        (pool("a", "us-east-1a", busy=[("2026-11-01 00:00", "2027-01-26 11:30", 8)]),),
        NOW,
        SAGEMAKER,
        [],
        id="start-beyond-56-days",
    ),
    pytest.param(
        request("2d"),
        (pool("a", "us-east-1a", busy=[("2026-12-02 11:30", "2027-01-25 11:30", 8)]),),
        NOW,
        SAGEMAKER,
        ["a:12-01 11:30→12-02 11:30 + a:01-25 11:30→01-26 11:30", "a:01-25 11:30→01-27 11:30"],
        id="second-block-on-day-55",
    ),
    pytest.param(
        request("2d"),
        (pool("a", "us-east-1a", busy=[("2026-12-02 11:30", "2027-01-26 11:30", 8)]),),
        NOW,
        SAGEMAKER,
        # capacity is sold at most 56 days ahead: no block, not even a plan's second one, starts later
        [],
        id="second-block-beyond-56-days",
    ),
]


@pytest.mark.parametrize("req, pools, now, policy, expected", SEARCH_CASES)
def test_search_offerings(req, pools, now, policy, expected):
    offerings = search_offerings(req, pools, policy, now)
    assert [describe(offering) for offering in offerings] == expected
    for offering in offerings:
        assert all(block.instance_count == req.instance_count for block in offering.blocks)
        assert offering.duration == req.duration
        if req.target == "hyperpod-cluster":
            assert len(offering.availability_zones) == 1
        # what the search offers, the pre-purchase recheck accepts
        assert recheck_offering(offering, pools, policy, now) is None


DEMO_NOW = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "req, pools, now, expected",
    [
        pytest.param(
            request("3m"),
            (pool("a", "zone-a", busy=[("2026-12-01 09:00:00", "2026-12-01 09:01:00", 8)]),),
            DEMO_NOW,
            ["a:09:01:00→09:04:00"],
            id="whole-minutes",
        ),
        pytest.param(
            request("3m"),
            (pool("a", "zone-a"),),
            ts("2026-12-01 09:00:03"),
            # 10 s after the search, rounded up to the 5 s grid; no 11:30 alignment
            ["a:09:00:15→09:03:15"],
            id="starts-seconds-after-search",
        ),
        pytest.param(
            request("2m"),
            (pool("a", "zone-a", busy=[("2026-12-01 09:01:10", "2026-12-01 09:02:00", 8)]),),
            DEMO_NOW,
            ["a:09:00:10→09:01:10 + a:09:02:00→09:03:00", "a:09:02:00→09:04:00"],
            id="two-one-minute-blocks",
        ),
        pytest.param(
            request("2m", target="hyperpod-cluster"),
            (
                pool("a", "zone-a", busy=[("2026-12-01 09:01:10", "2026-12-01 09:05:00", 8)]),
                pool("b", "zone-b", busy=[("2026-12-01 09:00:00", "2026-12-01 09:01:10", 8)]),
            ),
            DEMO_NOW,
            [
                "b:09:01:10→09:03:10",
                "a:09:00:10→09:01:10 + a:09:05:00→09:06:00",
                "a:09:05:00→09:07:00",
            ],
            id="hyperpod-one-zone",
        ),
        pytest.param(
            request("2m"),
            (
                pool("a", "zone-a", busy=[("2026-12-01 09:01:10", "2026-12-01 09:05:00", 8)]),
                pool("b", "zone-b", busy=[("2026-12-01 09:00:00", "2026-12-01 09:01:10", 8)]),
            ),
            DEMO_NOW,
            [
                "a:09:00:10→09:01:10 + b:09:01:10→09:02:10",
                "b:09:01:10→09:03:10",
                "a:09:00:10→09:01:10 + a:09:05:00→09:06:00",
            ],
            id="training-job-two-zones",
        ),
        pytest.param(
            request("2m"),
            (pool("a", "zone-a", busy=[("2026-12-01 08:00:00", "2026-12-01 09:56:00", 8)]),),
            DEMO_NOW,
            ["a:09:56:00→09:58:00"],
            id="start-at-56-minutes",
        ),
        pytest.param(
            request("2m"),
            (pool("a", "zone-a", busy=[("2026-12-01 08:00:00", "2026-12-01 09:56:05", 8)]),),
            DEMO_NOW,
            [],
            id="beyond-56-minutes",
        ),
    ],
)
def test_search_demo_profile(req, pools, now, expected):
    offerings = search_offerings(req, pools, DEMO, now)
    assert [describe(offering, "%H:%M:%S") for offering in offerings] == expected


def test_search_leaves_time_to_buy():
    """Even a policy that lets plans start right after the search offers no start
    that could not be bought in time (min_purchase_lead)."""
    eager = replace(DEMO, earliest_start_after_search=timedelta(0))
    [offering] = search_offerings(request("1m"), (pool("a", "zone-a"),), eager, ts("2026-12-01 09:00:01"))
    assert describe(offering, "%H:%M:%S") == "a:09:00:10→09:01:10"  # 09:00:06 rounded up to the 5 s grid
    assert recheck_offering(offering, (pool("a", "zone-a"),), eager, ts("2026-12-01 09:00:05")) is None


@pytest.mark.parametrize(
    "req, expected",
    [
        pytest.param(
            ultra("ml.u-p6e-gb200x72", 2),
            # 18 of 36 taken until Dec 3: two whole UltraServers (36 instances) only from Dec 3
            ("us-x72:12-03 11:30→12-04 11:30", 36),
            id="two-x72-wait-for-both",
        ),
        pytest.param(
            ultra("ml.u-p6e-gb200x72", 1),
            ("us-x72:12-01 11:30→12-02 11:30", 18),
            id="one-x72-fits-now",
        ),
        pytest.param(
            ultra("ml.u-p6e-gb200x36", 4),
            ("us-x36:12-01 11:30→12-02 11:30", 36),
            id="four-x36",
        ),
        pytest.param(
            ultra("ml.u-p6e-gb200x72", 3),
            None,
            id="three-x72-more-than-pool",
        ),
        pytest.param(
            request("1d", instance_type=ULTRASERVER_INSTANCE_TYPE, count=8),
            None,
            id="plain-instances-never-cut-from-ultraserver",
        ),
    ],
)
def test_search_ultraservers(req, expected):
    offerings = search_offerings(req, ULTRA, SAGEMAKER, NOW)
    if expected is None:
        assert offerings == []
        return
    text, instances = expected
    assert describe(offerings[0]) == text
    block = offerings[0].blocks[0]
    assert (block.instance_type, block.instance_count) == (ULTRASERVER_INSTANCE_TYPE, instances)
    assert block.ultra_server_type == req.ultra_server_type
    assert block.ultra_server_count == req.ultra_server_count


@pytest.mark.parametrize(
    "ultra_server_count, expected",
    [(1, ["us-x72:12-01 11:30→12-02 11:30"]), (2, [])],
    ids=["one-whole-server-free", "second-server-partly-taken"],
)
def test_ultraservers_are_counted_whole(ultra_server_count, expected):
    req = ultra("ml.u-p6e-gb200x72", ultra_server_count)
    assert [describe(o) for o in search_offerings(req, ULTRA_PARTLY_TAKEN, SAGEMAKER, NOW)] == expected


def test_offering_ids_are_deterministic_and_distinct():
    first = search_offerings(request("48h"), FRAGMENTED, SAGEMAKER, NOW)
    again = search_offerings(request("48h"), FRAGMENTED, SAGEMAKER, NOW)
    assert [o.id for o in first] == [o.id for o in again]
    assert len({o.id for o in first}) == 3
    assert all(o.id.startswith("tpo-") for o in first)
    block = first[1].blocks[0]
    moved = Offering.from_blocks([replace(block, start=block.start + timedelta(days=1))])
    assert moved.id != first[1].id


def test_offering_properties():
    block_a = Block("a", "us-east-1a", P5, 8, ts("2026-12-03 11:30"), ts("2026-12-04 11:30"))
    block_b = Block("b", "us-east-1b", P5, 8, ts("2026-12-01 11:30"), ts("2026-12-02 11:30"))
    offering = Offering.from_blocks([block_a, block_b])
    assert offering.blocks == (block_b, block_a)  # ordered by start
    assert (offering.start, offering.end) == (ts("2026-12-01 11:30"), ts("2026-12-04 11:30"))
    assert offering.duration == timedelta(days=2)  # the gap is not reserved time
    assert offering.availability_zones == ("us-east-1b", "us-east-1a")


def test_request_effective_capacity():
    servers = ultra("ml.u-p6e-gb200x72", 3, "48h")
    assert (servers.effective_instance_type, servers.effective_instance_count) == (ULTRASERVER_INSTANCE_TYPE, 54)
    plain = request(count=16)
    assert (plain.effective_instance_type, plain.effective_instance_count) == (P5, 16)


VALIDATION_CASES = [
    pytest.param(request("48h"), [], id="valid"),
    pytest.param(request("48h", count=3), ["InstanceCountNotAllowed"], id="count-3"),
    pytest.param(request("48h", count=128), ["InstanceCountNotAllowed"], id="count-128"),
    pytest.param(request("48h", instance_type=None), ["InvalidCapacityRequest"], id="no-instance-type"),
    pytest.param(request("183d"), ["DurationOutOfRange"], id="183-days"),
    pytest.param(request("0h"), ["DurationOutOfRange"], id="zero-duration"),
    pytest.param(request("36h"), ["DurationNotWholeDays"], id="36h"),
    pytest.param(request("182d"), [], id="182-days"),
    pytest.param(request("48h", target="notebook"), ["UnknownTargetResource"], id="unknown-target"),
    pytest.param(
        ultra("ml.u-p6e-gb200x144", 1, "48h"),
        ["UnknownUltraServerType"],
        id="unknown-ultraserver",
    ),
    pytest.param(
        ultra("ml.u-p6e-gb200x72", 0, "48h"),
        ["UltraServerCountNotAllowed"],
        id="zero-ultraservers",
    ),
    pytest.param(
        ultra("ml.u-p6e-gb200x72", 5, "48h"),
        [],
        id="five-ultraservers-not-bound-by-instance-counts",
    ),
    pytest.param(
        request(count=8, ultra_server_type="ml.u-p6e-gb200x72", ultra_server_count=1),
        ["InvalidCapacityRequest"],
        id="instances-and-ultraservers",
    ),
    pytest.param(request("2d", start_after="2027-01-25 11:30"), [], id="start-after-day-55"),
    pytest.param(
        request("2d", start_after="2027-01-26 10:00"), ["StartTooFarAhead"], id="start-after-day-56"
    ),
    pytest.param(
        request("2d", start_after="2026-12-02 00:00", end_before="2026-12-03 12:00"),
        ["WindowTooShort"],
        id="window-36h-for-48h",
    ),
    pytest.param(
        request("2d", start_after="2026-12-02 12:00", end_before="2026-12-04 13:00"),
        ["WindowTooShort"],
        id="window-49h-but-no-1130-to-1130-fit",
    ),
    pytest.param(request("2d", end_before="2026-12-03 09:10"), ["StartTooSoon"], id="would-start-in-10-min"),
    pytest.param(request("2d", end_before="2026-12-03 11:30"), [], id="ends-first-possible-1130"),
    pytest.param(
        request("36h", count=3, target="notebook"),
        ["UnknownTargetResource", "InstanceCountNotAllowed", "DurationNotWholeDays"],
        id="every-violation-reported",
    ),
]


@pytest.mark.parametrize("req, reasons", VALIDATION_CASES)
def test_validate_request(req, reasons):
    violations = validate_request(req, SAGEMAKER, NOW)
    assert [violation.reason for violation in violations] == reasons
    assert all(violation.message for violation in violations)


def test_violation_messages_name_the_rule():
    [count] = validate_request(request(count=3), SAGEMAKER, NOW)
    assert count.message == "instanceCount 3 is not allowed; choose one of 1, 2, 4, 8, 16, 32, 64"
    [duration] = validate_request(request("183d"), SAGEMAKER, NOW)
    assert duration.message == "duration 183d is outside 1d to 182d"
    [window] = validate_request(
        request("2d", start_after="2026-12-02 12:00", end_before="2026-12-04 13:00"), SAGEMAKER, NOW
    )
    assert "2026-12-03T11:30:00Z" in window.message and "11:30 UTC" in window.message


@pytest.mark.parametrize(
    "req, reasons",
    [
        pytest.param(request("182m"), [], id="182-minutes"),
        pytest.param(request("183m"), ["DurationOutOfRange"], id="183-minutes"),
        pytest.param(request("48h"), ["DurationOutOfRange"], id="48h-is-2880-demo-days"),
        pytest.param(
            replace(request("3m"), duration=timedelta(seconds=90)),
            ["DurationNotWholeDays"],
            id="90-seconds",
        ),
        pytest.param(request("3m", start_after="2026-12-01 09:55:55"), [], id="start-after-55m55s"),
        pytest.param(
            request("3m", start_after="2026-12-01 09:57:00"), ["StartTooFarAhead"], id="start-after-57m"
        ),
    ],
)
def test_validate_request_demo(req, reasons):
    assert [violation.reason for violation in validate_request(req, DEMO, DEMO_NOW)] == reasons


# Recheck: pool a has 16 instances; the offering takes 8 of them Dec 1 11:30 - Dec 3 11:30.
RECHECK_POOL = pool("a", "us-east-1a", count=16)
OFFERED = search_offerings(request("48h"), (RECHECK_POOL,), SAGEMAKER, NOW)[0]


@pytest.mark.parametrize(
    "pools, now, reason",
    [
        pytest.param((RECHECK_POOL,), NOW, None, id="unchanged"),
        pytest.param(
            (replace(RECHECK_POOL, busy=(Busy(ts("2026-12-01 11:30"), ts("2026-12-03 11:30"), 8),)),),
            NOW,
            None,
            id="other-plan-took-the-other-half",
        ),
        pytest.param(
            (replace(RECHECK_POOL, busy=(Busy(ts("2026-12-03 10:30"), ts("2026-12-05 11:30"), 9),)),),
            NOW,
            "OfferingUnavailable",
            id="other-plan-took-capacity-last-hour",
        ),
        pytest.param(
            (
                replace(
                    RECHECK_POOL,
                    busy=(
                        Busy(ts("2026-12-01 11:30"), ts("2026-12-02 00:00"), 4),
                        Busy(ts("2026-12-01 20:00"), ts("2026-12-02 11:30"), 5),
                    ),
                ),
            ),
            NOW,
            "OfferingUnavailable",
            id="two-overlapping-reservations",
        ),
        pytest.param(
            (
                replace(
                    RECHECK_POOL,
                    busy=(
                        Busy(ts("2026-12-01 11:30"), ts("2026-12-02 00:00"), 8),
                        Busy(ts("2026-12-02 00:00"), ts("2026-12-02 11:30"), 8),
                    ),
                ),
            ),
            NOW,
            None,
            id="back-to-back-reservations-do-not-overlap",
        ),
        pytest.param((pool("b", "us-east-1b", count=16),), NOW, "OfferingUnavailable", id="pool-gone"),
        pytest.param((RECHECK_POOL,), ts("2026-12-01 11:25"), None, id="exactly-5min-before-start"),
        pytest.param((RECHECK_POOL,), ts("2026-12-01 11:26"), "PurchaseTooLate", id="4min-before-start"),
        pytest.param((RECHECK_POOL,), ts("2026-12-01 12:00"), "PurchaseTooLate", id="after-start"),
    ],
)
def test_recheck_offering(pools, now, reason):
    assert describe(OFFERED) == "a:12-01 11:30→12-03 11:30"
    violation = recheck_offering(OFFERED, pools, SAGEMAKER, now)
    assert (violation.reason if violation else None) == reason


def test_recheck_after_another_plan_bought_the_same_offering():
    """Two plans found the same capacity; the first purchase lands in the ledger, the second fails."""
    pools = (pool("a", "us-east-1a", count=8),)
    mine = search_offerings(request("48h"), pools, SAGEMAKER, NOW)[0]
    theirs = search_offerings(request("48h"), pools, SAGEMAKER, NOW)[0]
    assert mine == theirs
    ledger = tuple(Busy(block.start, block.end, block.instance_count) for block in theirs.blocks)
    after = (replace(pools[0], busy=ledger),)
    violation = recheck_offering(mine, after, SAGEMAKER, NOW + timedelta(minutes=1))
    assert violation is not None and violation.reason == "OfferingUnavailable"
    assert "8 of 8 instances are taken" in violation.message
    # a fresh search now finds the next free days instead
    assert [describe(o) for o in search_offerings(request("48h"), after, SAGEMAKER, NOW)] == [
        "a:12-03 11:30→12-05 11:30"
    ]


def _free_by_minute(pool, count: int, since: datetime, horizon: datetime) -> list[tuple[datetime, datetime | None]]:
    """free_intervals the slow way: busy instances counted at every minute from ``since`` to ``horizon``."""
    from hyperplan.planning.offerings import busy_at

    out: list[list] = []
    t = since
    while t < horizon:
        fits = pool.instance_count - busy_at(pool, t) >= count
        if fits and (not out or out[-1][1] is not None):
            out.append([t, None])
        elif not fits and out and out[-1][1] is None:
            out[-1][1] = t
        t += timedelta(minutes=1)
    return [(a, b) for a, b in out]


@pytest.mark.parametrize("seed", range(12), ids=lambda s: f"random-ledger-{s}")
def test_free_intervals_match_counting_every_minute(seed: int) -> None:
    """The step function kept per snapshot (PoolSnapshot.usage) gives what counting the busy
    instances at every minute gives, for overlapping, touching, ended and empty windows."""
    import random

    from hyperplan.planning.offerings import Busy, PoolSnapshot, free_intervals

    rnd = random.Random(seed)
    t0 = datetime(2027, 1, 1, tzinfo=timezone.utc)
    busy = []
    for _ in range(rnd.randint(0, 40)):
        start = t0 + timedelta(minutes=rnd.randint(-30, 200))
        busy.append(Busy(start, start + timedelta(minutes=rnd.randint(0, 60)), rnd.randint(1, 4)))
    pool = PoolSnapshot("p", "ml.x", "az", 8, busy=tuple(busy))
    for since in (t0 - timedelta(minutes=40), t0, t0 + timedelta(minutes=rnd.randint(1, 150))):
        for count in (1, 3, 8, 9):
            got = free_intervals(pool, count, since)
            horizon = t0 + timedelta(minutes=300)  # after every window: the last interval is open
            want = _free_by_minute(pool, count, since, horizon)
            assert got == want, (seed, since, count)
