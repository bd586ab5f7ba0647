"""The recovery metrics: reboots by result, replacements past the reboot budget, the time to recover
per action, and nodes per health state.

Three layers, each table-driven: the ladder's steps say how a reboot ended (pure), the remediation
plan carries each fault's first sight to the actions that end a recovery (pure), and real group
passes (tests/unit/test_group_pass.py's world: two active nodes and a spare, grace 5 s, a fake
clock) move the counters and histograms by exactly what each story should.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client import REGISTRY

from hyperplan import metrics
from hyperplan.api.models import NodeRecovery, to_rfc3339
from hyperplan.planning import health, recovery
from hyperplan.planning.naming import HEALTH_PENDING_REBOOT, LABEL_HEALTH, LABEL_SAGEMAKER_HEALTH, label_value
from hyperplan.planning.nodefacts import NodeCondition
from hyperplan.planning.recovery import REBOOT_FAILED, REBOOT_RECOVERED, REBOOT_TIMEOUT, Ladder, RecoveryState
from tests.unit.test_group_pass import (  # noqa: F401  (worlds: the fixture)
    ACTIVE, GROUP, LADDER, NOW, World, group, record_of, run, running, set_ready, worlds,
)

T = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
STEP_LADDER = Ladder(reboot_budget=1, reboot_window=timedelta(hours=1), reboot_timeout=timedelta(minutes=10))
REBOOTING = RecoveryState(reboots=(T - timedelta(minutes=2),), rebooting_since=T - timedelta(minutes=2),
                          since=T - timedelta(minutes=3))


def ready(status: str, since: datetime) -> tuple[NodeCondition, ...]:
    return (NodeCondition("Ready", status, since),)


# --------------------------------------------------------------------------- the ladder says how a reboot ended


@pytest.mark.parametrize("exists, conditions, reason, state, result, over_budget", [
    pytest.param(True, ready("True", T - timedelta(seconds=10)), None, REBOOTING, REBOOT_RECOVERED, False,
                 id="back-ready-recovered"),
    pytest.param(True, ready("True", T - timedelta(seconds=10)), "GpuHealthy=False", REBOOTING, REBOOT_FAILED, False,
                 id="back-with-its-fault-failed"),
    pytest.param(False, (), "NodeDeleted", REBOOTING, REBOOT_FAILED, False, id="deleted-during-its-reboot-failed"),
    pytest.param(True, ready("False", T - timedelta(minutes=2)), "Ready=False",
                 RecoveryState(reboots=(T - timedelta(minutes=11),), rebooting_since=T - timedelta(minutes=11)),
                 REBOOT_TIMEOUT, False, id="not-back-within-its-timeout"),
    pytest.param(True, ready("False", T - timedelta(minutes=1)), "Ready=False", REBOOTING, None, False,
                 id="still-rebooting-no-result-yet"),
    pytest.param(True, ready("False", T - timedelta(minutes=1)), "Ready=False",
                 RecoveryState(reboots=(T - timedelta(minutes=20),)), None, True, id="fails-again-over-its-budget"),
    pytest.param(True, ready("False", T - timedelta(minutes=1)), "Ready=False", RecoveryState(), None, False,
                 id="a-first-fault-reboots-within-its-budget"),
])
def test_a_step_says_how_the_reboot_under_way_ended(exists, conditions, reason, state, result, over_budget) -> None:
    step = recovery.next_step(exists=exists, conditions=conditions, health_label=HEALTH_PENDING_REBOOT if exists
                              and state.rebooting_since else None, reason=reason, state=state, ladder=STEP_LADDER,
                              covered=True, now=T)
    assert (step.result, step.over_budget) == (result, over_budget)


def test_the_first_sight_of_a_recovery_survives_the_record_and_ends_with_it() -> None:
    state = RecoveryState().started(T, STEP_LADDER.reboot_window, requested=False, since=T - timedelta(seconds=30))
    assert state.since == T - timedelta(seconds=30)
    again = RecoveryState.from_record(NodeRecovery.model_validate(state.to_record().wire()))
    assert again == state
    assert again.started(T + timedelta(minutes=1), STEP_LADDER.reboot_window, False, T).since == state.since
    assert again.ended().since == state.since  # to be replaced: it counts on until the node is removed
    assert again.recovered() == RecoveryState(reboots=(T,))  # serving again: this recovery is over
    assert RecoveryState(since=T).to_record().fault_since == T


# --------------------------------------------------------------------------- the plan carries the first sight


US = "us-0"


def node(name: str, role: str = "active", ready_status: str = "True", since: datetime = T - timedelta(hours=1),
         **kw) -> health.NodeObservation:
    return health.NodeObservation(name=name, conditions=ready(ready_status, since), role=role, ultraserver_id=US,
                                  slot=kw.pop("slot", name), **kw)


def plan(nodes, clocks=None, ladder: Ladder = STEP_LADDER) -> health.RemediationPlan:
    verdict = health.evaluate_health(nodes, health.HealthCheck(grace=timedelta(seconds=5)), T)
    return health.plan_remediation(verdict, nodes, block_has_time_left=True, uses_spares=True, max_unhealthy=5,
                                   ladder=ladder, clocks=clocks or {}, now=T)


def only(actions, kind):
    (one,) = [a for a in actions if isinstance(a, kind)]
    return one


FAULT = T - timedelta(seconds=8)  # Ready=False since then; the grace (5 s) ended 3 s ago


def test_a_reboot_and_its_spare_promotion_carry_the_faults_first_sight() -> None:
    p = plan([node("a", ready_status="False", since=FAULT), node("s", role="spare")])
    assert only(p.actions, health.PromoteSpare).fault_since == FAULT
    assert p.recovery["a"].since == FAULT and p.recovery["a"].rebooting_since == T


@pytest.mark.parametrize("observation, clock", [
    pytest.param(node("a", ready_status="False", since=FAULT), None, id="the-pass-that-reboots"),
    pytest.param(node("a", ready_status="False", since=T - timedelta(minutes=2), health_label=HEALTH_PENDING_REBOOT,
                      health_label_since=T - timedelta(minutes=2)), REBOOTING, id="a-pass-while-it-reboots"),
])
def test_a_group_with_a_node_rebooting_is_looked_at_again_within_the_poll(observation, clock) -> None:
    """Its return should wake the group; the poll bounds what a lost wake costs (not the timeout)."""
    p = plan([observation, node("s", role="spare" if clock is None else "active",
                                **({} if clock is None else {"replaces": "a"}))], {"a": clock} if clock else None)
    assert p.rebooting == ("a",)
    assert p.next_check == T + health.REBOOT_POLL < T + STEP_LADDER.reboot_timeout


def test_a_node_back_from_its_reboot_carries_the_recoverys_first_sight() -> None:
    back = node("a", health_label=HEALTH_PENDING_REBOOT, health_label_since=T - timedelta(minutes=2),
                since=T - timedelta(seconds=5))
    p = plan([back, node("s", role="active", replaces="a")], {"a": REBOOTING})
    assert only(p.actions, health.RecoverNode).fault_since == REBOOTING.since
    assert p.recovery["a"] == RecoveryState(reboots=REBOOTING.reboots)


@pytest.mark.parametrize("observation, clock, ladder, result, over_budget, since", [
    pytest.param(node("a", ready_status="False", since=T - timedelta(minutes=11), health_label=HEALTH_PENDING_REBOOT,
                      health_label_since=T - timedelta(minutes=11)),
                 RecoveryState(reboots=(T - timedelta(minutes=11),), rebooting_since=T - timedelta(minutes=11),
                               since=T - timedelta(minutes=12)), STEP_LADDER, REBOOT_TIMEOUT, False,
                 T - timedelta(minutes=12), id="reboot-timed-out"),
    pytest.param(node("a", ready_status="False", since=FAULT), RecoveryState(reboots=(T - timedelta(minutes=20),)),
                 STEP_LADDER, None, True, FAULT, id="over-its-reboot-budget"),
    pytest.param(node("a", ready_status="False", since=FAULT), None, recovery.REPLACE_ONLY, None, False, FAULT,
                 id="replaced-at-once"),
])
def test_a_replacement_marks_how_the_reboot_ended_and_keeps_the_first_sight(observation, clock, ladder, result,
                                                                            over_budget, since) -> None:
    p = plan([observation, node("s", role="spare")], {"a": clock} if clock else {}, ladder)
    mark = only(p.actions, health.MarkUnhealthy)
    assert (mark.health_status, mark.reboot_result, mark.over_budget) == (
        "UnschedulablePendingReplacement", result, over_budget)
    assert p.recovery["a"].since == since and p.recovery["a"].rebooting_since is None
    assert only(p.actions, health.RemoveNode).fault_since == since


# --------------------------------------------------------------------------- real passes move the metrics


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def reading() -> dict[str, float]:
    out = {f"reboots {r}": value("hyperplan_reboots_total", result=r) for r in recovery.REBOOT_RESULTS}
    out["budget"] = value("hyperplan_reboot_budget_exhausted_total", group=GROUP)
    for action in metrics.RECOVERY_ACTIONS:
        out[f"{action} count"] = value("hyperplan_recovery_seconds_count", action=action)
        out[f"{action} seconds"] = value("hyperplan_recovery_seconds_sum", action=action)
    return out


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before[k], 3) for k in after if after[k] != before[k]}


FAILED = ACTIVE[1]


def fail(world: World) -> None:
    """The running group's second active node NotReady since NOW; the pass past its grace acts."""
    running(world)
    set_ready(world, FAILED, "False", NOW)
    world.now = NOW + timedelta(seconds=6)
    run(world)


def back(world: World) -> None:
    world.now += timedelta(seconds=5)
    run(world)  # still rebooting
    world.provider.finish_reboot(FAILED, world.now)
    world.now += timedelta(seconds=1)
    run(world)


def replaced_at_once(world: World) -> None:
    fail(world)
    set_ready(world, FAILED + "-g1", "True", world.now + timedelta(seconds=2))  # the new spare Ready 2 s later
    world.now += timedelta(seconds=3)
    run(world)  # the failed node goes


def rebooted_and_back(world: World) -> None:
    fail(world)
    back(world)


def not_back_in_time(world: World) -> None:
    fail(world)
    world.now += timedelta(seconds=31)  # rebootTimeoutSeconds 30
    run(world)


def back_with_its_fault(world: World) -> None:
    fail(world)
    world.provider.set_condition(FAILED, {"type": "GpuHealthy", "status": "False",
                                          "lastTransitionTime": to_rfc3339(NOW)})
    back(world)


def fails_again(world: World) -> None:
    rebooted_and_back(world)
    run(world)  # the role and taints of a spare
    set_ready(world, FAILED, "False", world.now)
    world.now += timedelta(seconds=6)
    run(world)


STORIES: list[tuple[str, dict, Callable[[World], None], dict[str, float]]] = [
    # grace 5 s: the fault at NOW, the pass at NOW + 6 s promotes the spare (6 s from the first sight)
    ("replaced-at-once", {}, replaced_at_once,
     {"promote count": 1, "promote seconds": 6, "replace count": 1, "replace seconds": 8}),
    ("rebooted-and-back", {"healthCheck": LADDER}, rebooted_and_back,
     {"promote count": 1, "promote seconds": 6, "reboots recovered": 1, "reboot count": 1, "reboot seconds": 12}),
    ("not-back-within-its-reboot-timeout", {"healthCheck": LADDER}, not_back_in_time,
     {"promote count": 1, "promote seconds": 6, "reboots timeout": 1}),
    ("back-with-its-fault-still-there", {"healthCheck": LADDER}, back_with_its_fault,
     {"promote count": 1, "promote seconds": 6, "reboots failed": 1}),
    ("fails-again-over-its-budget", {"healthCheck": LADDER}, fails_again,
     {"promote count": 1, "promote seconds": 6, "reboots recovered": 1, "reboot count": 1, "reboot seconds": 12,
      "budget": 1}),
]


@pytest.mark.parametrize("spec, story, want", [s[1:] for s in STORIES], ids=[s[0] for s in STORIES])
def test_group_passes_move_the_recovery_metrics(worlds, spec, story, want) -> None:
    world = worlds(group(**spec))
    before = reading()
    story(world)
    assert moved(before, reading()) == want


def test_a_groups_budget_counter_starts_at_zero_and_goes_with_the_group(worlds) -> None:
    world = worlds(group())
    running(world)
    assert REGISTRY.get_sample_value("hyperplan_reboot_budget_exhausted_total", {"group": GROUP}) is not None
    metrics.forget_group(GROUP)
    assert REGISTRY.get_sample_value("hyperplan_reboot_budget_exhausted_total", {"group": GROUP}) is None


def test_the_replacement_counts_from_the_recorded_first_sight_to_its_successor_ready(worlds) -> None:
    world = worlds(group())
    fail(world)
    assert record_of(world, FAILED)["recovery"]["faultSince"] == to_rfc3339(NOW)


@pytest.mark.parametrize("call, want", [
    pytest.param(lambda: metrics.observe_recovery("replace", None, T), {}, id="unknown-first-sight-not-observed"),
    pytest.param(lambda: metrics.observe_recovery("replace", T, None), {}, id="unknown-serving-not-observed"),
    pytest.param(lambda: metrics.observe_recovery("replace", T, T - timedelta(seconds=1)),
                 {"replace count": 1}, id="a-clock-skew-counts-as-zero"),
    pytest.param(lambda: metrics.observe_recovered(None, T), {"reboots recovered": 1},
                 id="recovered-without-a-first-sight-still-counts-the-reboot"),
    pytest.param(lambda: metrics.observe_mark(GROUP, None, False), {}, id="a-plain-mark-is-no-reboot-result"),
    pytest.param(lambda: metrics.observe_mark(GROUP, REBOOT_TIMEOUT, False), {"reboots timeout": 1},
                 id="a-mark-that-ends-a-reboot"),
    pytest.param(lambda: metrics.observe_mark(GROUP, None, True), {"budget": 1}, id="a-mark-past-the-budget"),
    pytest.param(lambda: metrics.observe_spare_promotion(T, T + timedelta(seconds=1), T - timedelta(seconds=4)),
                 {"promote count": 1, "promote seconds": 5}, id="a-promotion-from-the-first-sight"),
])
def test_the_observers(call, want) -> None:
    before = reading()
    call()
    assert moved(before, reading()) == want


# --------------------------------------------------------------------------- nodes per health state


def health_samples(view: metrics.ObservedObjects) -> dict[str, float]:
    return {labels["state"]: v for labels, v in metrics.object_samples(view, T)["hyperplan_instance_group_node_health"]
            if labels["group"] == "workers"}


REBOOTING_ENTRY = {"name": "n3", "uid": "u3", "nodeId": "n3",
                   "recovery": {"reboots": [to_rfc3339(T)], "rebootingSince": to_rfc3339(T)}}


@pytest.mark.parametrize("nodes, record, want", [
    pytest.param([], [], {}, id="no-nodes-all-zero"),
    pytest.param([("n1", None), ("n2", "Schedulable")], [], {"Schedulable": 2}, id="no-label-is-schedulable"),
    pytest.param([("n1", "Unschedulable"), ("n2", "UnschedulablePendingReplacement"),
                  ("n3", "UnschedulablePendingReboot")], [REBOOTING_ENTRY],
                 {"Unschedulable": 1, "UnschedulablePendingReplacement": 1, "UnschedulablePendingReboot": 1,
                  "rebooting": 1}, id="each-state-and-the-reboot-under-way-from-the-record"),
    pytest.param([("n1", "UnschedulableSomethingNew")], [], {"Unschedulable": 1}, id="an-unknown-unschedulable-value"),
    pytest.param([("n1", "UnschedulablePendingReboot")], [{"name": "n1", "uid": "u1", "nodeId": "n1"}],
                 {"UnschedulablePendingReboot": 1}, id="asked-for-not-rebooting-yet"),
    # The two watches disagree for a moment: the node's label is back, its record not yet (CI).
    pytest.param([("n1", "Schedulable"), ("n2", "Schedulable"), ("n3", "Schedulable")], [REBOOTING_ENTRY],
                 {"Schedulable": 3}, id="back-by-its-label-the-record-not-yet-is-not-rebooting"),
])
def test_nodes_per_health_state(nodes, record, want) -> None:
    view = metrics.ObservedObjects()
    view.put_group("workers", {"spec": {"trainingPlanRef": "gb"}, "status": {"nodes": record}})
    for name, label in nodes:
        view.put_node(name, "workers", label)
    view.put_node("other", "elsewhere", "Unschedulable")
    assert health_samples(view) == {s: want.get(s, 0) for s in metrics.NODE_HEALTH_STATES}


@pytest.mark.parametrize("labels, want", [
    pytest.param({}, "Schedulable", id="as-made"),
    pytest.param({LABEL_SAGEMAKER_HEALTH: "UnschedulablePendingReboot"}, "UnschedulablePendingReboot",
                 id="hyperpods-key-beside-ours"),
    pytest.param({LABEL_HEALTH: "UnschedulablePendingReplacement"}, "UnschedulablePendingReplacement", id="our-key"),
])
def test_the_node_watch_feeds_each_nodes_health_from_either_key(worlds, labels, want) -> None:
    world = worlds(group())
    running(world)
    world.provider.nodes[ACTIVE[0]].metadata.labels.update(labels)
    world.list_nodes()
    assert metrics.OBSERVED.nodes[ACTIVE[0]] == (label_value(GROUP), want)
