"""A bought plan's schedule: phases, the block it reports, termination times, next wake-up."""

from datetime import datetime, timezone

import pytest

from hyperplan.planning.policy import get_policy
from hyperplan.planning.schedule import plan_block_schedule

UTC = timezone.utc
SAGEMAKER = get_policy("sagemaker")
DEMO = get_policy("demo")


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# Block 0: Dec 2 - Dec 3; a two-day gap; block 1: Dec 5 - Dec 6 (11:30 UTC each).
TWO_BLOCKS = [
    (ts("2026-12-02 11:30"), ts("2026-12-03 11:30")),
    (ts("2026-12-05 11:30"), ts("2026-12-06 11:30")),
]


@pytest.mark.parametrize(
    "now, phase, statuses, active, reported, usable, next_transition",
    [
        ("2026-12-01 09:00", "Scheduled", ["Scheduled", "Scheduled"], None, 0, None, "2026-12-02 11:30"),
        ("2026-12-02 11:29:59", "Scheduled", ["Scheduled", "Scheduled"], None, 0, None, "2026-12-02 11:30"),
        ("2026-12-02 11:30", "Active", ["Active", "Scheduled"], 0, 0, 0, "2026-12-03 11:00"),
        ("2026-12-03 10:59", "Active", ["Active", "Scheduled"], 0, 0, 0, "2026-12-03 11:00"),
        # terminating: still Active, but instances stop from 11:00
        ("2026-12-03 11:00", "Active", ["Active", "Scheduled"], 0, 0, None, "2026-12-03 11:30"),
        ("2026-12-03 11:30", "Scheduled", ["Expired", "Scheduled"], None, 1, None, "2026-12-05 11:30"),
        ("2026-12-04 08:00", "Scheduled", ["Expired", "Scheduled"], None, 1, None, "2026-12-05 11:30"),
        ("2026-12-05 12:00", "Active", ["Expired", "Active"], 1, 1, 1, "2026-12-06 11:00"),
        ("2026-12-06 11:15", "Active", ["Expired", "Active"], 1, 1, None, "2026-12-06 11:30"),
        ("2026-12-06 11:30", "Expired", ["Expired", "Expired"], None, None, None, None),
        ("2027-02-01 00:00", "Expired", ["Expired", "Expired"], None, None, None, None),
    ],
    ids=[
        "bought-before-first-block",
        "one-second-before-start",
        "first-block-starts",
        "first-block-running",
        "first-block-terminating",
        "gap-after-first-block",
        "inside-gap",
        "second-block-running",
        "second-block-terminating",
        "last-block-ended",
        "long-after",
    ],
)
def test_phases_through_a_plan_with_a_gap(now, phase, statuses, active, reported, usable, next_transition):
    schedule = plan_block_schedule(TWO_BLOCKS, "training-job", SAGEMAKER, ts(now))
    assert schedule.phase == phase
    assert [block.status for block in schedule.blocks] == statuses
    assert schedule.active_block == active
    assert schedule.current_or_next_block == reported
    assert schedule.usable_block == usable
    assert schedule.next_transition_time == (ts(next_transition) if next_transition else None)


@pytest.mark.parametrize(
    "policy, target, blocks, expected",
    [
        pytest.param(
            SAGEMAKER,
            "training-job",
            TWO_BLOCKS,
            ["2026-12-03 11:00", "2026-12-06 11:00"],
            id="sm-training-job-30min",
        ),
        pytest.param(
            SAGEMAKER,
            "hyperpod-cluster",
            TWO_BLOCKS,
            ["2026-12-03 10:30", "2026-12-06 10:30"],
            id="sm-hyperpod-60min",
        ),
        pytest.param(
            DEMO,
            "training-job",
            [(ts("2026-12-01 09:00:10"), ts("2026-12-01 09:02:10"))],
            ["2026-12-01 09:02:00"],
            id="demo-training-job-10s",
        ),
        pytest.param(
            DEMO,
            "hyperpod-cluster",
            [(ts("2026-12-01 09:00:10"), ts("2026-12-01 09:02:10"))],
            ["2026-12-01 09:01:50"],
            id="demo-hyperpod-20s",
        ),
    ],
)
def test_termination_time_per_target(policy, target, blocks, expected):
    schedule = plan_block_schedule(blocks, target, policy, ts("2026-12-01 09:00"))
    assert [block.termination_time for block in schedule.blocks] == [ts(moment) for moment in expected]


def test_hyperpod_wakes_up_an_hour_before_the_end():
    schedule = plan_block_schedule(TWO_BLOCKS, "hyperpod-cluster", SAGEMAKER, ts("2026-12-02 12:00"))
    assert schedule.next_transition_time == ts("2026-12-03 10:30")
    draining = plan_block_schedule(TWO_BLOCKS, "hyperpod-cluster", SAGEMAKER, ts("2026-12-03 10:45"))
    assert (draining.phase, draining.blocks[0].draining, draining.usable_block) == ("Active", True, None)


def test_demo_plan_runs_in_minutes():
    blocks = [
        (ts("2026-12-01 09:00:10"), ts("2026-12-01 09:01:10")),
        (ts("2026-12-01 09:02:00"), ts("2026-12-01 09:03:00")),
    ]
    timeline = []
    now = ts("2026-12-01 09:00:00")
    while now is not None:
        schedule = plan_block_schedule(blocks, "training-job", DEMO, now)
        timeline.append((now.strftime("%H:%M:%S"), schedule.phase, schedule.usable_block))
        now = schedule.next_transition_time
    assert timeline == [
        ("09:00:00", "Scheduled", None),
        ("09:00:10", "Active", 0),
        ("09:01:00", "Active", None),
        ("09:01:10", "Scheduled", None),
        ("09:02:00", "Active", 1),
        ("09:02:50", "Active", None),
        ("09:03:00", "Expired", None),
    ]


def test_blocks_given_out_of_order_keep_their_index():
    reversed_blocks = list(reversed(TWO_BLOCKS))
    schedule = plan_block_schedule(reversed_blocks, "training-job", SAGEMAKER, ts("2026-12-04 00:00"))
    assert schedule.phase == "Scheduled"
    assert [block.status for block in schedule.blocks] == ["Scheduled", "Expired"]
    assert schedule.current_or_next_block == 0  # index in the caller's list: Dec 5 block
    assert schedule.next_transition_time == ts("2026-12-05 11:30")


@pytest.mark.parametrize(
    "blocks, target, message",
    [
        pytest.param([], "training-job", "at least one block", id="no-blocks"),
        pytest.param(
            [(ts("2026-12-03 11:30"), ts("2026-12-02 11:30"))],
            "training-job",
            "before it starts",
            id="end-before-start",
        ),
        pytest.param(TWO_BLOCKS, "notebook", "unknown target resource", id="unknown-target"),
    ],
)
def test_bad_schedule_input(blocks, target, message):
    with pytest.raises(ValueError, match=message):
        plan_block_schedule(blocks, target, SAGEMAKER, ts("2026-12-01 09:00"))
