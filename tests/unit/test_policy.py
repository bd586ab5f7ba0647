"""Policy profiles, duration parsing and the start grid."""

from datetime import datetime, time, timedelta, timezone

import pytest

from hyperplan.planning.policy import (
    POLICIES,
    Policy,
    format_duration,
    get_policy,
    parse_duration,
)

UTC = timezone.utc


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("48h", timedelta(hours=48)),
        ("2d", timedelta(days=2)),
        ("90m", timedelta(minutes=90)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("30s", timedelta(seconds=30)),
        ("1d12h", timedelta(days=1, hours=12)),
        (" 3m ", timedelta(minutes=3)),
        ("0s", timedelta(0)),
    ],
    ids=["48h", "2d", "90m", "1h30m", "30s", "1d12h", "padded", "zero"],
)
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "48", "h", "1.5h", "-2d", "30m1h", "2d2d", "10ms", "2 d", "1w", None, 48],
    ids=repr,
)
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    "duration, text",
    [
        (timedelta(hours=36), "1d12h"),
        (timedelta(minutes=3), "3m"),
        (timedelta(0), "0s"),
        (timedelta(days=182), "182d"),
    ],
    ids=["36h", "3m", "zero", "182d"],
)
def test_format_duration_round_trips(duration, text):
    assert format_duration(duration) == text
    assert parse_duration(text) == duration


def test_get_policy_names_the_profiles():
    assert get_policy("sagemaker").end_time_of_day == time(11, 30)
    assert get_policy("demo").day == timedelta(minutes=1)
    with pytest.raises(ValueError, match="'aws'.*demo, sagemaker"):
        get_policy("aws")


def test_demo_is_sagemaker_with_a_day_read_as_a_minute():
    sagemaker, demo = POLICIES["sagemaker"], POLICIES["demo"]
    assert demo.allowed_instance_counts == sagemaker.allowed_instance_counts == (1, 2, 4, 8, 16, 32, 64)
    assert (demo.min_duration, demo.max_duration) == (timedelta(minutes=1), timedelta(minutes=182))
    assert (sagemaker.min_duration, sagemaker.max_duration) == (timedelta(days=1), timedelta(days=182))
    assert demo.max_start_ahead == timedelta(minutes=56)
    assert sagemaker.max_start_ahead == timedelta(days=56)
    assert dict(demo.termination_lead) == {
        "training-job": timedelta(seconds=10),
        "hyperpod-cluster": timedelta(seconds=20),
    }
    assert dict(sagemaker.termination_lead) == {
        "training-job": timedelta(minutes=30),
        "hyperpod-cluster": timedelta(minutes=60),
    }
    assert (sagemaker.checkpoint_lead, demo.checkpoint_lead) == (timedelta(minutes=10), timedelta(seconds=5))


@pytest.mark.parametrize(
    "policy_name, moment, expected",
    [
        ("sagemaker", "2026-12-01 09:30", "2026-12-01 11:30"),
        ("sagemaker", "2026-12-01 11:30", "2026-12-01 11:30"),
        ("sagemaker", "2026-12-01 11:30:00.000001", "2026-12-02 11:30"),
        ("sagemaker", "2026-12-01 23:59", "2026-12-02 11:30"),
        ("demo", "2026-12-01 09:00:10", "2026-12-01 09:00:10"),
        ("demo", "2026-12-01 09:00:11", "2026-12-01 09:00:15"),
        ("demo", "2026-12-01 09:00:59.5", "2026-12-01 09:01:00"),
    ],
    ids=[
        "sm-before-1130",
        "sm-at-1130",
        "sm-just-after",
        "sm-late-evening",
        "demo-on-grid",
        "demo-up-to-5s",
        "demo-fraction",
    ],
)
def test_align_up_to_start_grid(policy_name, moment, expected):
    assert get_policy(policy_name).align_up(ts(moment)) == ts(expected)


@pytest.mark.parametrize(
    "policy_name, target, end, expected",
    [
        ("sagemaker", "training-job", "2026-12-03 11:30", "2026-12-03 11:00"),
        ("sagemaker", "hyperpod-cluster", "2026-12-03 11:30", "2026-12-03 10:30"),
        ("demo", "training-job", "2026-12-01 09:05", "2026-12-01 09:04:50"),
        ("demo", "hyperpod-cluster", "2026-12-01 09:05", "2026-12-01 09:04:40"),
    ],
    ids=["sm-training-job", "sm-hyperpod", "demo-training-job", "demo-hyperpod"],
)
def test_termination_time(policy_name, target, end, expected):
    assert get_policy(policy_name).termination_time(ts(end), target) == ts(expected)


def test_termination_time_unknown_target():
    with pytest.raises(ValueError, match="unknown target resource 'notebook'"):
        get_policy("sagemaker").termination_time(ts("2026-12-03 11:30"), "notebook")


def _policy(**changes) -> Policy:
    fields = dict(vars(POLICIES["demo"]))
    fields.update(changes)
    return Policy(**fields)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"slot": timedelta(seconds=7)}, "slot must divide day"),
        ({"end_time_of_day": time(11, 30)}, "end_time_of_day needs day == slot == 1 day"),
        ({"allowed_instance_counts": ()}, "allowed_instance_counts"),
        ({"min_duration_days": 5, "max_duration_days": 2}, "min_duration_days"),
        ({"checkpoint_lead": timedelta(seconds=-1)}, "checkpoint_lead must not be negative"),
    ],
    ids=["slot-not-dividing-day", "alignment-with-minute-day", "no-counts", "min-above-max", "negative-checkpoint-lead"],
)
def test_inconsistent_policy_is_rejected(changes, message):
    with pytest.raises(ValueError, match=message):
        _policy(**changes)


def test_policy_is_hashable_and_its_leads_read_only():
    policy = POLICIES["sagemaker"]
    assert hash(policy) == hash(_policy(**vars(policy)))
    with pytest.raises(TypeError):
        policy.termination_lead["training-job"] = timedelta(0)
