"""Node health verdicts, the maxUnhealthy circuit breaker, remediation plans and the evacuation of
a failed node's pods."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hyperplan.planning.health import (
    EVICTION_RETRY,
    HEALTH_BATCH_WINDOW,
    KUEUE_MOVE_WAIT,
    Backfill,
    Evacuation,
    EvictPods,
    HealthCheck,
    MarkUnhealthy,
    NodeCondition,
    NodeObservation,
    PromoteSpare,
    RemoveNode,
    evacuate,
    evaluate_health,
    max_unhealthy_limit,
    parse_condition_spec,
    plan_remediation,
    remediation_allowed,
)
from hyperplan.planning.naming import UNHEALTHY_TAINT
from hyperplan.planning.placement import (
    GroupRequest,
    SlotState,
    desired_nodes,
    place_groups,
    slot_states_from_labels,
    spare_owners,
    spare_ultraservers,
    ultraservers_for_block,
)

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
GRACE = timedelta(seconds=30)
CHECK = HealthCheck()


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def cond(type_: str, status: str, seconds_ago: float) -> NodeCondition:
    return NodeCondition(type_, status, ago(seconds_ago))


def ready(seconds_ago: float = 600) -> NodeCondition:
    return cond("Ready", "True", seconds_ago)


def node(name: str, *conds: NodeCondition, **kw) -> NodeObservation:
    return NodeObservation(name, conditions=conds or (ready(),), **kw)


# --------------------------------------------------------------------------- signals


def _signal_node(kind: str, age: float) -> NodeObservation:
    if kind == "ready-false":
        return node("n", cond("Ready", "False", age))
    if kind == "ready-unknown":
        return node("n", cond("Ready", "Unknown", age))
    if kind == "accelerated-hardware":
        return node("n", ready(), cond("AcceleratedHardwareReady", "False", age))
    if kind == "gpu-healthy":
        return node("n", ready(), cond("GpuHealthy", "False", age))
    if kind == "label-unschedulable":
        return node("n", health_label="Unschedulable", health_label_since=ago(age))
    if kind == "label-pending-replacement":
        return node("n", health_label="UnschedulablePendingReplacement",
                    health_label_since=ago(age))
    if kind == "deleted":
        return NodeObservation("n", exists=False, deleted_since=ago(age))
    raise AssertionError(kind)


SIGNALS = [
    ("ready-false", "Ready=False"),
    ("ready-unknown", "Ready=Unknown"),
    ("accelerated-hardware", "AcceleratedHardwareReady=False"),
    ("gpu-healthy", "GpuHealthy=False"),
    ("label-unschedulable", "NodeHealthStatus=Unschedulable"),
    ("label-pending-replacement", "NodeHealthStatus=UnschedulablePendingReplacement"),
    ("deleted", "NodeDeleted"),
]


@pytest.mark.parametrize(("kind", "reason"), [pytest.param(k, r, id=k) for k, r in SIGNALS])
@pytest.mark.parametrize("age", [pytest.param(1, id="1s"), pytest.param(29.999, id="just-under")])
def test_signal_shorter_than_grace_is_pending(kind, reason, age):
    verdict = evaluate_health([_signal_node(kind, age)], CHECK, NOW)
    assert verdict.unhealthy == {}
    assert verdict.healthy == ("n",)
    assert verdict.pending == {"n": reason}
    assert verdict.next_check == ago(age) + GRACE


@pytest.mark.parametrize(("kind", "reason"), [pytest.param(k, r, id=k) for k, r in SIGNALS])
@pytest.mark.parametrize("age", [pytest.param(30, id="exactly-grace"),
                                 pytest.param(300, id="long")])
def test_signal_longer_than_grace_is_unhealthy(kind, reason, age):
    verdict = evaluate_health([_signal_node(kind, age)], CHECK, NOW)
    assert verdict.unhealthy == {"n": reason}
    assert verdict.healthy == ()
    assert verdict.pending == {}
    assert verdict.next_check is None


@pytest.mark.parametrize(
    ("observation", "grace", "expected"),
    [
        pytest.param(node("n", cond("Ready", "True", 5)), GRACE, {}, id="ready-recovered"),
        pytest.param(node("n", ready(), cond("GpuHealthy", "True", 5)), GRACE, {},
                     id="gpu-recovered"),
        pytest.param(node("n", health_label="Schedulable", health_label_since=ago(999)), GRACE,
                     {}, id="label-schedulable"),
        pytest.param(node("n", ready(), cond("SomethingElse", "False", 999)), GRACE, {},
                     id="unconfigured-condition-ignored"),
        pytest.param(node("n", created=ago(3600)), GRACE, {}, id="old-node-with-ready-is-started"),
        pytest.param(node("n", cond("Ready", "False", 45)), timedelta(seconds=60), {},
                     id="longer-grace-waits"),
        pytest.param(node("n", cond("Ready", "False", 45)), timedelta(seconds=0),
                     {"n": "Ready=False"}, id="zero-grace-immediate"),
        pytest.param(node("n", health_label="Unschedulable"), GRACE,
                     {"n": "NodeHealthStatus=Unschedulable"}, id="label-without-time-immediate"),
        pytest.param(NodeObservation("n", exists=False), GRACE, {"n": "NodeDeleted"},
                     id="deletion-without-time-immediate"),
    ],
)
def test_verdicts(observation, grace, expected):
    verdict = evaluate_health([observation], HealthCheck(grace=grace), NOW)
    assert verdict.unhealthy == expected
    assert verdict.healthy == (() if expected else ("n",))


def test_recovery_before_grace_clears_the_pending_signal():
    failing = node("n", cond("Ready", "False", 20))
    recovered = node("n", cond("Ready", "True", 0))
    assert evaluate_health([failing], CHECK, NOW).pending == {"n": "Ready=False"}
    later = evaluate_health([recovered], CHECK, NOW + timedelta(seconds=15))
    assert (later.unhealthy, later.pending, later.healthy, later.next_check) == (
        {}, {}, ("n",), None)


def test_earliest_expired_signal_is_the_reason():
    n = node("n", cond("Ready", "False", 40), cond("GpuHealthy", "False", 100),
             health_label="Unschedulable", health_label_since=ago(10))
    assert evaluate_health([n], CHECK, NOW).unhealthy == {"n": "GpuHealthy=False"}


def test_next_check_is_the_earliest_pending_deadline_across_nodes():
    nodes = [
        node("a", cond("Ready", "False", 10)),               # due in 20s
        node("b", ready(), cond("GpuHealthy", "False", 25)),  # due in 5s
        node("c", health_label="Unschedulable", health_label_since=ago(2)),  # due in 28s
        node("d", cond("Ready", "False", 31)),               # already unhealthy
        node("e"),
    ]
    verdict = evaluate_health(nodes, CHECK, NOW)
    assert verdict.next_check == NOW + timedelta(seconds=5)
    assert verdict.unhealthy == {"d": "Ready=False"}
    assert verdict.pending == {"a": "Ready=False", "b": "GpuHealthy=False",
                               "c": "NodeHealthStatus=Unschedulable"}
    assert verdict.healthy == ("a", "b", "c", "e")
    # at next_check, b turns unhealthy
    assert evaluate_health(nodes, CHECK, verdict.next_check).unhealthy == {
        "b": "GpuHealthy=False", "d": "Ready=False"}


def test_signal_from_the_future_waits_a_full_grace():
    n = node("n", cond("Ready", "False", -10))  # clock skew
    verdict = evaluate_health([n], CHECK, NOW)
    assert verdict.unhealthy == {}
    assert verdict.next_check == NOW + timedelta(seconds=40)


@pytest.mark.parametrize(
    ("created_ago", "expected_unhealthy", "expected_next"),
    [
        pytest.param(540, {}, NOW + timedelta(seconds=60), id="within-startup-timeout"),
        pytest.param(600, {"n": "NodeStartupTimeout"}, None, id="startup-timeout"),
    ],
)
def test_node_that_never_reports_ready(created_ago, expected_unhealthy, expected_next):
    n = NodeObservation("n", created=ago(created_ago))
    verdict = evaluate_health([n], CHECK, NOW)
    assert verdict.unhealthy == expected_unhealthy
    assert verdict.next_check == expected_next


def test_health_check_from_spec():
    check = HealthCheck.from_spec(10, 2, ["NetworkReady=False", "Ready=Unknown"])
    assert check == HealthCheck(timedelta(seconds=10),
                                (("NetworkReady", "False"), ("Ready", "Unknown")), 2)
    n = node("n", ready(), cond("NetworkReady", "False", 11), cond("GpuHealthy", "False", 99))
    assert evaluate_health([n], check, NOW).unhealthy == {"n": "NetworkReady=False"}
    with pytest.raises(ValueError):
        parse_condition_spec("GpuHealthy")
    with pytest.raises(ValueError):
        parse_condition_spec("GpuHealthy=Maybe")


# --------------------------------------------------------------------------- batching close deadlines

MS = timedelta(milliseconds=1)


def failing_until(name: str, deadline: datetime, **kw) -> NodeObservation:
    """A node whose Ready=False grace ends at ``deadline``."""
    return NodeObservation(name, conditions=(NodeCondition("Ready", "False", deadline - GRACE),), **kw)


def test_the_batch_window_is_half_a_second():
    assert HEALTH_BATCH_WINDOW == timedelta(milliseconds=500)


@pytest.mark.parametrize(
    ("deadlines_ms", "expected_ms"),
    [
        pytest.param([2000], 2000, id="one-deadline"),
        pytest.param([2000, 2030], 2030, id="two-30ms-apart-one-wake-at-the-later"),
        pytest.param([2030, 2000], 2030, id="two-30ms-apart-in-either-order"),
        pytest.param([2000, 4000], 2000, id="two-2s-apart-wake-at-the-first"),
        pytest.param([2000, 2500], 2500, id="exactly-the-window-apart"),
        pytest.param([2000, 2501], 2000, id="just-over-the-window-apart"),
        pytest.param([2000, 2300, 2600, 2900], 2300, id="chain-cut-at-the-window"),
        pytest.param([2000, 2100, 2200, 2400], 2400, id="three-close-ones-all-in-one-wake"),
    ],
)
def test_next_check_extends_to_the_last_deadline_within_the_window(deadlines_ms, expected_ms):
    nodes = [failing_until(f"n{i}", NOW + ms * MS) for i, ms in enumerate(deadlines_ms)]
    verdict = evaluate_health(nodes, CHECK, NOW)
    assert verdict.unhealthy == {}
    assert verdict.next_check == NOW + expected_ms * MS
    # No window: the earliest deadline, as before.
    assert evaluate_health(nodes, CHECK, NOW, batch_window=timedelta(0)).next_check == NOW + min(deadlines_ms) * MS


@pytest.mark.parametrize(
    ("a", "b_ms", "expected_unhealthy", "expected_held", "expected_next_ms"),
    [
        pytest.param(failing_until("a", NOW - 10 * MS), 20, {}, {"a": NOW - 10 * MS}, 20,
                     id="grace-ended-10ms-ago-held-for-a-deadline-20ms-ahead"),
        pytest.param(failing_until("a", NOW - 10 * MS), 2000, {"a": "Ready=False"}, {}, 2000,
                     id="next-deadline-2s-ahead-acts-now"),
        pytest.param(failing_until("a", NOW - 300 * MS), 300, {"a": "Ready=False"}, {}, 300,
                     id="held-at-most-the-window-after-its-own-grace-end"),
        pytest.param(failing_until("a", NOW - 600 * MS), 20, {"a": "Ready=False"}, {}, 20,
                     id="grace-ended-longer-than-the-window-ago"),
        pytest.param(failing_until("a", NOW - 10 * MS, health_label="UnschedulablePendingReplacement",
                                   health_label_since=ago(60)), 20,
                     {"a": "NodeHealthStatus=UnschedulablePendingReplacement"}, {}, 20,
                     id="remediation-already-started-not-held"),
        pytest.param(node("a", health_label="Unschedulable"), 20, {"a": "NodeHealthStatus=Unschedulable"}, {}, 20,
                     id="unknown-start-not-held"),
    ],
)
def test_a_fresh_failure_is_held_for_a_close_pending_deadline(a, b_ms, expected_unhealthy, expected_held,
                                                              expected_next_ms):
    verdict = evaluate_health([a, failing_until("b", NOW + b_ms * MS)], CHECK, NOW)
    assert verdict.unhealthy == expected_unhealthy
    assert verdict.held == expected_held
    assert verdict.next_check == NOW + expected_next_ms * MS
    if expected_held:  # pending, with its reason, to be judged with b
        assert verdict.pending == {"a": "Ready=False", "b": "Ready=False"}
        assert verdict.healthy == ("a", "b")
        at_b = evaluate_health([a, failing_until("b", NOW + b_ms * MS)], CHECK, verdict.next_check)
        assert at_b.unhealthy == {"a": "Ready=False", "b": "Ready=False"}
        assert at_b.held == {}


def test_a_held_spare_is_not_promoted():
    failed = node("f", cond("Ready", "False", 60), role="active", ultraserver_id="us-0", slot="0-0")
    held = failing_until("s1", NOW - 10 * MS, role="spare", ultraserver_id="us-0", slot="0-8")
    healthy = node("s2", role="spare", ultraserver_id="us-1", slot="1-8")
    soon = failing_until("x", NOW + 20 * MS, ultraserver_id="us-1", slot="1-0")
    nodes = [failed, held, healthy, soon]
    verdict = evaluate_health(nodes, CHECK, NOW)
    assert verdict.held == {"s1": NOW - 10 * MS}
    plan = plan_remediation(verdict, nodes, block_has_time_left=True, uses_spares=True, max_unhealthy=4)
    assert [a.spare for a in plan.actions if isinstance(a, PromoteSpare)] == ["s2"]


STORMS = [
    pytest.param([0, 30], id="two-30ms-apart"),
    pytest.param([0, 2000], id="two-2s-apart"),
    pytest.param([0, 300, 600, 900, 1200], id="a-chain-300ms-apart"),
    pytest.param([0, 1, 2, 499, 500, 501, 1000], id="a-dense-burst"),
    pytest.param([0, 0, 250, 250], id="equal-deadlines"),
]


def _first_unhealthy(deadlines_ms, pass_times):
    """Judge the nodes at each pass time (plus each pass's own next_check); when each first turns
    unhealthy. Asserts at every pass that no node is unhealthy before its own grace ends."""
    nodes = [failing_until(f"n{i}", NOW + ms * MS) for i, ms in enumerate(deadlines_ms)]
    deadline = {n.name: NOW + ms * MS for n, ms in zip(nodes, deadlines_ms)}
    first: dict[str, datetime] = {}
    passes = sorted(pass_times)
    while passes:
        now = passes.pop(0)
        verdict = evaluate_health(nodes, CHECK, now)
        for name in verdict.unhealthy:
            assert deadline[name] <= now, f"{name} judged unhealthy {deadline[name] - now} before its grace ends"
            first.setdefault(name, now)
        for name, ended in verdict.held.items():
            assert ended == deadline[name] and ended <= now
        if verdict.next_check is not None:
            assert verdict.next_check > now
            passes = sorted(set(passes) | {verdict.next_check})
    return deadline, first


@pytest.mark.parametrize("deadlines_ms", STORMS)
def test_no_node_is_judged_unhealthy_before_its_grace_ends_nor_more_than_the_window_after(deadlines_ms):
    # Passes at the wakes the verdicts ask for only, and also at an event every 7 ms.
    for events in ([NOW - 100 * MS], [NOW - 100 * MS + i * 7 * MS for i in range(400)]):
        deadline, first = _first_unhealthy(deadlines_ms, events)
        assert set(first) == set(deadline)
        for name, when in first.items():
            assert deadline[name] <= when <= deadline[name] + HEALTH_BATCH_WINDOW


@pytest.mark.parametrize(
    ("deadlines_ms", "expected_passes_that_act"),
    [
        pytest.param([0, 30], [[0, 30]], id="two-30ms-apart-one-pass"),
        pytest.param([0, 2000], [[0], [2000]], id="two-2s-apart-two-passes"),
        pytest.param([0, 300, 600, 900, 1200], [[0, 300], [600, 900], [1200]], id="a-chain-cut-at-the-window"),
    ],
)
def test_close_failures_turn_unhealthy_in_one_pass(deadlines_ms, expected_passes_that_act):
    deadline, first = _first_unhealthy(deadlines_ms, [NOW - 100 * MS])
    by_pass: dict[datetime, list[int]] = {}
    for name, when in first.items():
        by_pass.setdefault(when, []).append(int((deadline[name] - NOW) / MS))
    assert [sorted(v) for _, v in sorted(by_pass.items())] == expected_passes_that_act


# --------------------------------------------------------------------------- circuit breaker


@pytest.mark.parametrize(
    ("spec", "total", "limit"),
    [
        pytest.param(2, 10, 2, id="count"),
        pytest.param("3", 10, 3, id="count-string"),
        pytest.param("20%", 10, 2, id="percent-exact"),
        pytest.param("20%", 14, 2, id="percent-rounds-down"),
        pytest.param("25%", 7, 1, id="percent-1.75-down"),
        pytest.param("20%", 4, 0, id="percent-small-group-zero"),
        pytest.param("100%", 9, 9, id="percent-all"),
        pytest.param("0%", 9, 0, id="percent-none"),
    ],
)
def test_max_unhealthy_limit(spec, total, limit):
    assert max_unhealthy_limit(spec, total) == limit


@pytest.mark.parametrize("spec", ["abc", "x%", "-1", -1, True, "", 2.5])
def test_max_unhealthy_limit_rejects(spec):
    with pytest.raises(ValueError):
        max_unhealthy_limit(spec, 10)


@pytest.mark.parametrize(
    ("unhealthy", "total", "spec", "allowed", "message"),
    [
        pytest.param(2, 10, 2, True, "2 of 10 nodes are unhealthy, within maxUnhealthy 2",
                     id="count-at-bound"),
        pytest.param(3, 10, 2, False,
                     "3 of 10 nodes are unhealthy, more than maxUnhealthy 2 allows; "
                     "remediation paused", id="count-over"),
        pytest.param(2, 10, "20%", True,
                     "2 of 10 nodes are unhealthy, within maxUnhealthy 20% (2 of 10)",
                     id="percent-at-bound"),
        pytest.param(3, 10, "20%", False,
                     "3 of 10 nodes are unhealthy, more than maxUnhealthy 20% (2 of 10) allows; "
                     "remediation paused", id="percent-over"),
        pytest.param(1, 4, "20%", False,
                     "1 of 4 nodes are unhealthy, more than maxUnhealthy 20% (0 of 4) allows; "
                     "remediation paused", id="percent-small-group"),
        pytest.param(1, 4, "bogus", False,
                     "remediation paused: maxUnhealthy 'bogus' is not a count or a percentage",
                     id="invalid-spec"),
    ],
)
def test_remediation_allowed(unhealthy, total, spec, allowed, message):
    assert remediation_allowed(unhealthy, total, spec) == (allowed, message)


# --------------------------------------------------------------------------- remediation

RC = "rc-abc"
US = ultraservers_for_block(RC, "ml.u-p6e-gb200x72", 36, 1)
US0, US1 = US[0].id, US[1].id


def member(name: str, role: str = "active", us: str | None = US0, slot: str | None = None,
           **kw) -> NodeObservation:
    return NodeObservation(name, conditions=kw.pop("conditions", (ready(),)), role=role,
                           ultraserver_id=us, slot=slot or name, **kw)


def failing(name: str, role: str = "active", us: str | None = US0, **kw) -> NodeObservation:
    return member(name, role, us, conditions=(cond("Ready", "False", 60),), **kw)


def group(*nodes: NodeObservation) -> list[NodeObservation]:
    return list(nodes)


def remediate(nodes, *, time_left=True, spares=True, max_unhealthy=5):
    verdict = evaluate_health(nodes, CHECK, NOW)
    return plan_remediation(verdict, nodes, US, block_has_time_left=time_left,
                            uses_spares=spares, max_unhealthy=max_unhealthy)


@pytest.mark.parametrize(
    ("nodes", "kwargs", "expected"),
    [
        pytest.param(
            group(member("0-0"), failing("0-1"), member("0-2", "spare"),
                  member("1-0", us=US1), member("1-1", "spare", us=US1)),
            {},
            (MarkUnhealthy("0-1", "Ready=False"),
             PromoteSpare("0-2", "0-1", US0, True),
             Backfill("0-1", "0-1", 1, "spare", US0),
             RemoveNode("0-1", "Ready=False")),
            id="promotion-prefers-same-ultraserver"),
        pytest.param(
            group(member("0-0"), failing("0-1"), failing("0-2", "spare"),
                  member("1-0", us=US1), member("1-1", "spare", us=US1)),
            {},
            (MarkUnhealthy("0-1", "Ready=False"), MarkUnhealthy("0-2", "Ready=False"),
             PromoteSpare("1-1", "0-1", US1, False),
             Backfill("0-1", "0-1", 1, "spare", US0), Backfill("0-2", "0-2", 1, "spare", US0),
             RemoveNode("0-1", "Ready=False"), RemoveNode("0-2", "Ready=False")),
            id="other-ultraserver-when-same-has-none"),
        pytest.param(
            group(failing("0-0"),
                  member("0-1", "spare", conditions=(ready(), cond("GpuHealthy", "False", 5))),
                  member("0-2", "spare", conditions=(cond("Ready", "False", 5),)),
                  member("0-3", "spare", conditions=()),  # not Ready yet
                  member("0-4", "spare")),
            {},
            (MarkUnhealthy("0-0", "Ready=False"), PromoteSpare("0-4", "0-0", US0, True),
             Backfill("0-0", "0-0", 1, "spare", US0), RemoveNode("0-0", "Ready=False")),
            id="healthiest-spare-first"),
        pytest.param(
            group(failing("0-0"),
                  member("0-1", "spare", conditions=(ready(), cond("GpuHealthy", "False", 5))),
                  member("1-1", "spare", us=US1)),
            {},
            (MarkUnhealthy("0-0", "Ready=False"), PromoteSpare("0-1", "0-0", US0, True),
             Backfill("0-0", "0-0", 1, "spare", US0), RemoveNode("0-0", "Ready=False")),
            id="same-ultraserver-beats-healthier-elsewhere"),
        pytest.param(
            group(failing("0-0"), member("0-1")),
            {},
            (MarkUnhealthy("0-0", "Ready=False"), Backfill("0-0", "0-0", 1, "active", US0),
             RemoveNode("0-0", "Ready=False")),
            id="no-spare-backfill-active"),
        pytest.param(
            group(member("0-0"), failing("0-1", "spare")),
            {},
            (MarkUnhealthy("0-1", "Ready=False"), Backfill("0-1", "0-1", 1, "spare", US0),
             RemoveNode("0-1", "Ready=False")),
            id="failed-spare-is-backfilled-as-spare"),
        pytest.param(
            group(member("0-0"), failing("0-1"), member("0-2", "spare")),
            {"time_left": False},
            (MarkUnhealthy("0-1", "Ready=False"), PromoteSpare("0-2", "0-1", US0, True)),
            id="no-time-left-no-backfill-node-stays-cordoned"),
        pytest.param(
            group(member("0", us=None), failing("1", us=None), member("2", us=None)),
            {"spares": False},
            (MarkUnhealthy("1", "Ready=False"), Backfill("1", "1", 1, "active", None),
             RemoveNode("1", "Ready=False")),
            id="non-ultraserver-backfills-active"),
        pytest.param(
            group(member("0", us=None), failing("1", us=None)),
            {"spares": False, "time_left": False},
            (MarkUnhealthy("1", "Ready=False"),),
            id="non-ultraserver-no-time-left"),
        pytest.param(
            group(member("0-0"), member("0-1", exists=False, deleted_since=ago(60)),
                  member("0-2", "spare")),
            {},
            (PromoteSpare("0-2", "0-1", US0, True), Backfill("0-1", "0-1", 1, "spare", US0)),
            id="deleted-node-promote-and-backfill-only"),
        pytest.param(
            group(member("0-0"), failing("0-1", generation=2), member("0-2", "spare")),
            {},
            (MarkUnhealthy("0-1", "Ready=False"), PromoteSpare("0-2", "0-1", US0, True),
             Backfill("0-1", "0-1", 3, "spare", US0), RemoveNode("0-1", "Ready=False")),
            id="backfill-bumps-generation"),
    ],
)
def test_plan_remediation(nodes, kwargs, expected):
    plan = remediate(nodes, **kwargs)
    assert plan.allowed is True and plan.reason is None
    assert plan.actions == expected


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        pytest.param(
            group(member("0-0"),
                  failing("0-1", health_label="UnschedulablePendingReplacement",
                          health_label_since=ago(5)),
                  member("0-2", replaces="0-1")),
            (Backfill("0-1", "0-1", 1, "spare", US0), RemoveNode("0-1", "Ready=False")),
            id="after-mark-and-promote"),
        pytest.param(
            group(member("0-0"),
                  failing("0-1", health_label="UnschedulablePendingReplacement",
                          health_label_since=ago(5)),
                  member("0-2", replaces="0-1"),
                  member("0-1-g1", "spare", slot="0-1", generation=1)),
            (RemoveNode("0-1", "Ready=False"),),
            id="after-backfill"),
    ],
)
def test_plan_remediation_resumes_without_repeating(nodes, expected):
    assert remediate(nodes).actions == expected


def test_too_many_unhealthy_does_nothing():
    nodes = group(failing("0-0"), failing("0-1"), failing("0-2"), member("0-3"),
                  member("0-4", "spare"))
    plan = remediate(nodes, max_unhealthy="40%")
    assert plan.allowed is False
    assert plan.reason == "TooManyUnhealthy"
    assert plan.actions == ()
    assert plan.unhealthy_count == 3
    assert plan.message == ("3 of 5 nodes are unhealthy, more than maxUnhealthy 40% (2 of 5) "
                            "allows; remediation paused")
    assert remediate(nodes, max_unhealthy=3).allowed is True


def test_two_failures_take_two_different_spares():
    nodes = group(failing("0-0"), failing("0-1"), member("0-2", "spare"),
                  member("1-0", us=US1), member("1-1", "spare", us=US1))
    promotions = [a for a in remediate(nodes).actions if isinstance(a, PromoteSpare)]
    assert promotions == [PromoteSpare("0-2", "0-0", US0, True),
                          PromoteSpare("1-1", "0-1", US1, False)]


def test_no_unhealthy_nodes_no_actions():
    plan = remediate(group(member("0-0"), member("0-1", "spare")))
    assert (plan.allowed, plan.actions, plan.reason, plan.message) == (
        True, (), None, "no unhealthy nodes")


def test_messages_explain_skipped_steps():
    plan = remediate(group(failing("0-0"), member("0-1")), time_left=False)
    assert plan.message == (
        "1 of 2 nodes are unhealthy, within maxUnhealthy 5; no healthy spare to replace 0-0; "
        "no time left in the block to backfill 0-0; it stays cordoned")


def test_mark_unhealthy_carries_label_and_taint():
    action = remediate(group(failing("0-0"), member("0-1"))).actions[0]
    assert action == MarkUnhealthy("0-0", "Ready=False")
    assert action.health_status == "UnschedulablePendingReplacement"
    assert action.taint == UNHEALTHY_TAINT
    assert (action.taint.key, action.taint.effect) == ("hyperplan.dev/unhealthy", "NoSchedule")


def test_replacement_gets_a_new_name_and_promotion_survives_reconcile():
    """Remediation feeds desired_nodes: the backfill has a fresh name, roles stay swapped."""
    placements = place_groups([GroupRequest("train", 3)], US)
    spares = spare_ultraservers("train", spare_owners(placements))

    def desired(slots=None):
        return desired_nodes("train", "plan", RC, "ml.p6e-gb200.36xlarge", "us-west-2a",
                             placements["train"], US, spares, slots=slots)

    before = desired()
    assert [(n.slot, n.role) for n in before] == [
        ("0-0", "active"), ("0-1", "active"), ("0-2", "active"), ("0-3", "spare")]
    observations = [member(n.name, n.role, n.ultraserver_id, slot=n.slot) for n in before]
    observations[1] = failing(before[1].name, slot="0-1")
    plan = remediate(observations)
    assert plan.actions == (
        MarkUnhealthy(before[1].name, "Ready=False"),
        PromoteSpare(before[3].name, before[1].name, US0, True),
        Backfill(before[1].name, "0-1", 1, "spare", US0),
        RemoveNode(before[1].name, "Ready=False"),
    )
    # the cluster after the plan: labels as the handler writes them
    labels = [dict(n.labels) for n in before]
    labels[3]["hyperplan.dev/role"] = "active"
    del labels[1]  # removed
    states = slot_states_from_labels(labels) | plan.slot_states()
    after = desired(states)
    assert [(n.name, n.role) for n in after] == [
        (before[0].name, "active"),
        (before[1].name + "-g1", "spare"),
        (before[2].name, "active"),
        (before[3].name, "active"),
    ]
    assert plan.slot_states() == {"0-1": SlotState(1, "spare")}


# --------------------------------------------------------------------------- evacuation of a failed node

TIMEOUT = timedelta(seconds=10)
DEAD = cond("Ready", "False", 60)
SINCE = ago(4)


@pytest.mark.parametrize(
    "observation, expected",
    [
        pytest.param(node("f", pods_left=0), Evacuation(None, True), id="no-pod-left-done"),
        pytest.param(node("f", DEAD, pods_left=0, evicting_since=ago(30)), Evacuation(None, True),
                     id="dead-no-pod-left-done"),
        pytest.param(node("f"), Evacuation(EvictPods("f", "r", start=True), False, NOW + EVICTION_RETRY),
                     id="not-counted-yet-start"),
        pytest.param(node("f", pods_left=2), Evacuation(EvictPods("f", "r", start=True), False, NOW + EVICTION_RETRY),
                     id="pods-first-attempt-start"),
        pytest.param(node("f", pods_left=2, evicting_since=ago(3600)),
                     Evacuation(EvictPods("f", "r"), False, NOW + EVICTION_RETRY),
                     id="live-node-is-never-forced"),
        pytest.param(node("f", DEAD, pods_left=1, evicting_since=SINCE),
                     Evacuation(EvictPods("f", "r"), False, NOW + EVICTION_RETRY),
                     id="dead-node-inside-its-deadline-evicts"),
        pytest.param(node("f", DEAD, pods_left=1, evicting_since=ago(9.5)),
                     Evacuation(EvictPods("f", "r"), False, ago(9.5) + TIMEOUT),
                     id="dead-node-looks-again-at-its-deadline"),
        pytest.param(node("f", DEAD, pods_left=1, evicting_since=ago(10)),
                     Evacuation(EvictPods("f", "r", force=True), False, NOW + EVICTION_RETRY),
                     id="dead-node-past-its-deadline-forces"),
        pytest.param(node("f", cond("Ready", "Unknown", 60), pods_left=1, evicting_since=ago(11)),
                     Evacuation(EvictPods("f", "r", force=True), False, NOW + EVICTION_RETRY),
                     id="unknown-counts-as-dead"),
        pytest.param(node("f", cond("Ready", "False", 2), pods_left=1, evicting_since=ago(30)),
                     Evacuation(EvictPods("f", "r"), False, NOW + EVICTION_RETRY),
                     id="node-that-just-lost-ready-gets-the-whole-timeout"),
        pytest.param(NodeObservation("f", conditions=(), pods_left=1, evicting_since=ago(11)),
                     Evacuation(EvictPods("f", "r", force=True), False, NOW + EVICTION_RETRY),
                     id="no-ready-condition-counts-as-dead"),
        # A Kueue workload's topology assignment still names the node: it stays, and its pods
        # (a replacement Kueue pins there meanwhile) are swept, until Kueue moves it or time is up.
        pytest.param(node("f", pods_left=0, assigned_by=("ns/wl",)),
                     Evacuation(EvictPods("f", "r", start=True), False, NOW + EVICTION_RETRY),
                     id="kueue-assigned-no-pod-yet-starts-and-waits"),
        pytest.param(node("f", pods_left=0, evicting_since=SINCE, assigned_by=("ns/wl",)),
                     Evacuation(EvictPods("f", "r"), False, NOW + EVICTION_RETRY),
                     id="kueue-assigned-no-pod-left-waits-and-sweeps"),
        pytest.param(node("f", pods_left=0, assigned_by=("ns/wl",),
                          evicting_since=NOW - KUEUE_MOVE_WAIT + timedelta(seconds=0.5)),
                     Evacuation(EvictPods("f", "r"), False, NOW + timedelta(seconds=0.5)),
                     id="kueue-assigned-looks-again-at-the-wait-end"),
        pytest.param(node("f", pods_left=0, evicting_since=NOW - KUEUE_MOVE_WAIT, assigned_by=("ns/wl",)),
                     Evacuation(None, True), id="kueue-assigned-past-the-wait-done"),
        pytest.param(node("f", pods_left=1, evicting_since=SINCE, assigned_by=("ns/wl",)),
                     Evacuation(EvictPods("f", "r"), False, NOW + EVICTION_RETRY),
                     id="kueue-assigned-with-pods-evicts-as-before"),
    ],
)
def test_evacuate(observation, expected):
    assert evacuate(observation, "r", NOW, TIMEOUT) == expected
