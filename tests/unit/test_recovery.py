"""The recovery ladder (planning.recovery, pure): fault and history in, one step out."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hyperplan.api.models import HealthCheckSpec, NodeRecovery
from hyperplan.planning import recovery
from hyperplan.planning.naming import HEALTH_PENDING_REBOOT, HEALTH_PENDING_REPLACEMENT, HEALTH_UNSCHEDULABLE
from hyperplan.planning.nodefacts import NodeCondition
from hyperplan.planning.recovery import LABEL_ONLY, REBOOT, RECOVERED, REPLACE, WAIT, Ladder, RecoveryState

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
LADDER = Ladder(automatic=True, reboot_budget=1, reboot_window=timedelta(hours=1), reboot_timeout=timedelta(minutes=10))


def ready(status: str, since: datetime) -> tuple[NodeCondition, ...]:
    return (NodeCondition("Ready", status, since),)


DOWN = ready("False", NOW - timedelta(minutes=1))
NEVER = RecoveryState()
REBOOTED_20M_AGO = RecoveryState(reboots=(NOW - timedelta(minutes=20),))
REBOOTED_2H_AGO = RecoveryState(reboots=(NOW - timedelta(hours=2),))
REBOOTING = RecoveryState(reboots=(NOW - timedelta(minutes=2),), rebooting_since=NOW - timedelta(minutes=2))
REBOOTING_LONG = RecoveryState(reboots=(NOW - timedelta(minutes=11),), rebooting_since=NOW - timedelta(minutes=11))


@pytest.mark.parametrize("exists, conditions, label, reason, state, ladder, covered, want", [
    # fault kind x history -> step
    pytest.param(True, DOWN, None, "Ready=False", NEVER, LADDER, True, REBOOT, id="first-fault-reboots"),
    pytest.param(True, DOWN, None, "GpuHealthy=False", NEVER, LADDER, True, REBOOT, id="hardware-condition-reboots"),
    pytest.param(True, DOWN, None, "Ready=False", REBOOTED_20M_AGO, LADDER, True, REPLACE,
                 id="fails-again-within-the-window-is-replaced"),
    pytest.param(True, DOWN, None, "Ready=False", REBOOTED_2H_AGO, LADDER, True, REBOOT,
                 id="a-reboot-out-of-the-window-no-longer-counts"),
    pytest.param(True, DOWN, None, "Ready=False", REBOOTED_20M_AGO, Ladder(reboot_budget=2), True, REBOOT,
                 id="a-budget-of-two-reboots-twice"),
    pytest.param(True, DOWN, None, "Ready=False", NEVER, recovery.REPLACE_ONLY, True, REPLACE,
                 id="budget-zero-replaces-at-once"),
    pytest.param(False, (), None, "NodeDeleted", NEVER, LADDER, True, REPLACE, id="deleted-node-is-replaced"),
    pytest.param(True, (), None, "NodeStartupTimeout", NEVER, LADDER, True, REPLACE,
                 id="never-came-up-is-replaced"),
    pytest.param(True, DOWN, None, "Ready=False", NEVER, LADDER, False, REPLACE,
                 id="active-node-no-spare-covers-is-replaced"),
    # manual actions and nodeRecovery None
    pytest.param(True, ready("True", NOW - timedelta(hours=1)), HEALTH_PENDING_REBOOT,
                 f"NodeHealthStatus={HEALTH_PENDING_REBOOT}", REBOOTED_20M_AGO, LADDER, True, REBOOT,
                 id="requested-reboot-ignores-the-budget"),
    pytest.param(True, ready("True", NOW - timedelta(hours=1)), HEALTH_PENDING_REPLACEMENT,
                 f"NodeHealthStatus={HEALTH_PENDING_REPLACEMENT}", NEVER, LADDER, True, REPLACE,
                 id="requested-replacement-replaces"),
    pytest.param(True, DOWN, None, "Ready=False", NEVER, Ladder(automatic=False), True, LABEL_ONLY,
                 id="node-recovery-none-labels-only"),
    pytest.param(True, DOWN, HEALTH_UNSCHEDULABLE, "Ready=False", NEVER, Ladder(automatic=False), True, LABEL_ONLY,
                 id="node-recovery-none-stays-labelled"),
    pytest.param(True, ready("True", NOW - timedelta(hours=1)), HEALTH_PENDING_REBOOT,
                 f"NodeHealthStatus={HEALTH_PENDING_REBOOT}", NEVER, Ladder(automatic=False), True, REBOOT,
                 id="node-recovery-none-still-carries-out-a-requested-reboot"),
    # a reboot under way
    pytest.param(True, ready("False", NOW - timedelta(minutes=1)), HEALTH_PENDING_REBOOT, "Ready=False",
                 REBOOTING, LADDER, True, WAIT, id="rebooting-waits"),
    pytest.param(True, ready("True", NOW - timedelta(minutes=5)), HEALTH_PENDING_REBOOT, None, REBOOTING, LADDER,
                 True, WAIT, id="ready-from-before-the-reboot-is-not-back"),
    pytest.param(True, ready("True", NOW - timedelta(seconds=10)), HEALTH_PENDING_REBOOT,
                 f"NodeHealthStatus={HEALTH_PENDING_REBOOT}", REBOOTING, LADDER, True, RECOVERED,
                 id="back-ready-after-the-reboot-recovers"),
    pytest.param(True, ready("True", NOW - timedelta(seconds=10)), HEALTH_PENDING_REBOOT, None, REBOOTING, LADDER,
                 True, RECOVERED, id="back-before-the-labels-grace-recovers-too"),
    pytest.param(True, ready("True", NOW - timedelta(seconds=10)), HEALTH_PENDING_REBOOT, "GpuHealthy=False",
                 REBOOTING, LADDER, True, REPLACE, id="back-but-the-fault-is-still-there-is-replaced"),
    pytest.param(True, ready("False", NOW - timedelta(minutes=10)), HEALTH_PENDING_REBOOT, "Ready=False",
                 REBOOTING_LONG, LADDER, True, REPLACE, id="not-back-within-the-timeout-is-replaced"),
    pytest.param(False, (), HEALTH_PENDING_REBOOT, "NodeDeleted", REBOOTING, LADDER, True, REPLACE,
                 id="deleted-during-its-reboot-is-replaced"),
    pytest.param(True, ready("True", NOW - timedelta(hours=1)), None, None, NEVER, LADDER, True, None,
                 id="healthy-and-no-reboot-nothing"),
])
def test_next_step(exists, conditions, label, reason, state, ladder, covered, want):
    step = recovery.next_step(exists=exists, conditions=conditions, health_label=label, reason=reason, state=state,
                              ladder=ladder, covered=covered, now=NOW)
    assert (step.kind if step else None) == want


def test_a_reboot_under_way_is_waited_for_until_its_timeout():
    step = recovery.next_step(exists=True, conditions=DOWN, health_label=HEALTH_PENDING_REBOOT, reason="Ready=False",
                              state=REBOOTING, ladder=LADDER, covered=True, now=NOW)
    assert step.until == REBOOTING.rebooting_since + LADDER.reboot_timeout


def test_the_clock_counts_reboots_in_the_window_and_survives_the_record():
    state = REBOOTED_2H_AGO.started(NOW, LADDER.reboot_window, requested=False)
    assert state.reboots == (NOW,) and state.rebooting_since == NOW  # the old reboot left the window
    again = RecoveryState.from_record(NodeRecovery.model_validate(state.to_record().wire()))
    assert again == state
    assert again.ended().rebooting_since is None and again.ended().reboots == (NOW,)
    assert RecoveryState().to_record() is None


def test_the_ladder_reads_the_groups_spec():
    spec = HealthCheckSpec.model_validate({"rebootBudget": 2, "rebootWindowSeconds": 600, "rebootTimeoutSeconds": 30})
    assert Ladder.from_spec("Automatic", spec) == Ladder(True, 2, timedelta(minutes=10), timedelta(seconds=30))
    assert Ladder.from_spec("None", spec).automatic is False


T = NOW - timedelta(minutes=5)
HOUR = timedelta(hours=1)


@pytest.mark.parametrize("faults, standing, want", [
    pytest.param((), {"Ready": T}, (("Ready", T, None),), id="a-new-fault-is-clocked-from-its-condition"),
    pytest.param((("Ready", T, None),), {"Ready": NOW - timedelta(seconds=3)}, (("Ready", T, None),),
                 id="a-flapping-condition-keeps-its-first-sight"),
    pytest.param((("Ready", T, None),), {}, (("Ready", T, NOW),), id="a-cleared-fault-is-remembered"),
    pytest.param((("Ready", T, NOW - timedelta(minutes=2)),), {"Ready": NOW}, (("Ready", T, None),),
                 id="back-within-the-memory-counts-from-its-first-sight"),
    pytest.param((("Ready", T - HOUR, NOW - HOUR - timedelta(seconds=1)),), {}, (),
                 id="cleared-longer-than-the-memory-is-forgotten"),
    pytest.param((), {"Ready": T, "GpuHealthy": NOW}, (("GpuHealthy", NOW, None), ("Ready", T, None)),
                 id="each-condition-its-own-clock"),
])
def test_clock_faults(faults, standing, want):
    assert recovery.clock_faults(RecoveryState(faults=faults), standing, NOW, HOUR).faults == want


def test_a_fault_clock_moves_the_conditions_transition_back_to_its_first_sight():
    state = RecoveryState(faults=(("Ready", T, None),))
    [c] = recovery.clocked(ready("False", NOW - timedelta(seconds=3)), state, {"Ready": NOW - timedelta(seconds=3)})
    assert c.last_transition_time == T
    assert recovery.clocked(ready("True", NOW), state, {}) == ready("True", NOW)  # not a fault now: as it is
