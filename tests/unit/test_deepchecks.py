"""Deep health checks (planning.deepchecks, pure): states, Job results and ``now`` in, a plan out;
and what the health verdict and the recovery ladder make of a node's checks."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from hyperplan.api.models import GroupNode
from hyperplan.api.vocabulary import (
    CHECK_FAILED, CHECK_IN_PROGRESS, CHECK_PASSED, INSTANCE_CONNECTIVITY, INSTANCE_STRESS, LABEL_DEEP_HEALTH_CHECK,
    LABEL_SAGEMAKER_DEEP_HEALTH_CHECK,
)
from hyperplan.planning import deepchecks
from hyperplan.planning.deepchecks import (
    FAILED, RUNNING, SUCCEEDED, CheckNode, CheckState, JobResult, job_name, plan_checks,
)
from hyperplan.planning.health import HealthCheck, NodeObservation, evaluate_health, plan_remediation
from hyperplan.planning.naming import SPARE_TAINT, Taint
from hyperplan.planning.nodefacts import NodeCondition
from hyperplan.planning.placement import NodeSpec, hyperpod_dressed
from hyperplan.planning import recovery

UTC = timezone.utc
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
BEFORE = NOW - timedelta(seconds=30)
BOTH = (INSTANCE_STRESS, INSTANCE_CONNECTIVITY)
STRESS = (INSTANCE_STRESS,)


def new(checks=BOTH, since=BEFORE) -> CheckState:
    """A run asked for at ``since`` whose Jobs are not made yet."""
    return CheckState(CHECK_IN_PROGRESS, since, checks)


def running(checks=BOTH, cohort="dhc-run", since=BEFORE) -> CheckState:
    return CheckState(CHECK_IN_PROGRESS, since, checks, started=since, cohort=cohort if INSTANCE_CONNECTIVITY in checks
                      else None)


def node(nid: str, us: str | None = "us-0", exists: bool = True) -> CheckNode:
    return CheckNode(nid, exists, us)


def jobs_of(nid: str, state: CheckState, **ends: str) -> dict[str, JobResult]:
    """The Jobs of ``nid``'s run, each running unless ``ends`` says (check=state[:output])."""
    out = {}
    for check in state.checks:
        end, _, output = ends.get(check, RUNNING).partition(":")
        out[job_name(nid, check, state)] = JobResult(job_name(nid, check, state), end, output)
    return out


def plan(states=None, nodes=(), created=(), recovered=(), jobs=None, checks=BOTH):
    return plan_checks(checks, states or {}, nodes, created, recovered, jobs, NOW)


# --------------------------------------------------------------------------- one pass, table-driven

RUN = running()
RUN_STRESS = running(STRESS)


@pytest.mark.parametrize("states, nodes, created, recovered, jobs, checks, want_states, want_jobs, want_next", [
    pytest.param({}, [node("a")], ["b"], [], None, (), {}, [], None, id="no-checks-configured-no-run"),
    pytest.param({}, [node("a")], ["b"], [], None, BOTH, {"b": (CHECK_IN_PROGRESS, None)}, [], NOW + deepchecks.POLL,
                 id="a-node-made-now-starts-a-run-its-jobs-come-when-it-is-there"),
    pytest.param({"a": RUN_STRESS.__class__(CHECK_PASSED, BEFORE, STRESS, BEFORE, None, BEFORE)}, [node("a")], [],
                 ["a"], None, BOTH, {"a": (CHECK_IN_PROGRESS, None)}, [], NOW + deepchecks.POLL,
                 id="a-node-back-from-its-reboot-starts-a-new-run-though-it-passed-before"),
    pytest.param({"b": new()}, [node("a")], ["b"], [], None, BOTH, {"b": (CHECK_IN_PROGRESS, None)}, [],
                 NOW + deepchecks.POLL, id="a-create-asked-again-stays-the-same-run"),
    pytest.param({"b": new()}, [node("a")], [], [], None, BOTH, {"b": (CHECK_IN_PROGRESS, None)}, [],
                 NOW + deepchecks.POLL, id="a-node-not-there-yet-waits"),
    pytest.param({"a": new(), "b": new()}, [node("a"), node("b")], [], [], None, BOTH,
                 {"a": (CHECK_IN_PROGRESS, "started"), "b": (CHECK_IN_PROGRESS, "started")},
                 [("a", INSTANCE_STRESS, ()), ("a", INSTANCE_CONNECTIVITY, ("a", "b")),
                  ("b", INSTANCE_STRESS, ()), ("b", INSTANCE_CONNECTIVITY, ("a", "b"))], NOW + deepchecks.POLL,
                 id="the-new-nodes-of-an-ultraserver-start-together-each-reaching-the-others"),
    pytest.param({"a": new(STRESS)}, [node("a")], [], [], None, STRESS, {"a": (CHECK_IN_PROGRESS, "started")},
                 [("a", INSTANCE_STRESS, ())], NOW + deepchecks.POLL, id="stress-only-one-job-no-run-to-share"),
    pytest.param({"a": RUN}, [node("a")], [], [], jobs_of("a", RUN), BOTH, {"a": (CHECK_IN_PROGRESS, "started")}, [],
                 NOW + deepchecks.POLL, id="jobs-running-look-again-shortly"),
    pytest.param({"a": RUN}, [node("a")], [], [], None, BOTH, {"a": (CHECK_IN_PROGRESS, "started")}, [],
                 NOW + deepchecks.POLL, id="jobs-not-listed-wait"),
    pytest.param({"a": RUN}, [node("a")], [], [],
                 jobs_of("a", RUN, InstanceStress=SUCCEEDED, InstanceConnectivity=SUCCEEDED), BOTH,
                 {"a": (CHECK_PASSED, "finished")}, [], None, id="every-job-complete-passes"),
    pytest.param({"a": RUN}, [node("a")], [], [], jobs_of("a", RUN, InstanceStress=SUCCEEDED), BOTH,
                 {"a": (CHECK_IN_PROGRESS, "started")}, [], NOW + deepchecks.POLL, id="one-complete-one-running-waits"),
    pytest.param({"a": RUN}, [node("a")], [], [], jobs_of("a", RUN, InstanceStress=f"{FAILED}:exit code 1: ECC"),
                 BOTH, {"a": (CHECK_FAILED, "finished")}, [], NOW, id="one-failed-fails-and-is-acted-on-at-once"),
    pytest.param({"a": RUN}, [node("a")], [], [],
                 {k: v for k, v in jobs_of("a", RUN).items() if deepchecks._SHORT[INSTANCE_STRESS] + "-" in k}, BOTH,
                 {"a": (CHECK_IN_PROGRESS, "started")}, [("a", INSTANCE_CONNECTIVITY, ("a",))], NOW + deepchecks.POLL,
                 id="a-job-gone-is-made-again"),
    pytest.param({"a": CheckState(CHECK_PASSED, BEFORE, BOTH, BEFORE, "dhc-run", BEFORE)}, [node("a")], [], [], None,
                 BOTH, {"a": (CHECK_PASSED, "finished")}, [], None, id="passed-stays-passed"),
])
def test_plan_checks(states, nodes, created, recovered, jobs, checks, want_states, want_jobs, want_next) -> None:
    got = plan(states, nodes, created, recovered, jobs, checks)
    seen = {nid: (s.status, "finished" if s.finished else "started" if s.started else None)
            for nid, s in got.states.items()}
    assert seen == want_states
    assert [(j.node_id, j.check, j.peers) for j in got.start] == want_jobs
    assert got.next_check == want_next
    for j in got.start:  # each Job is named from its node's run
        assert j.name == job_name(j.node_id, j.check, got.states[j.node_id])


def test_a_run_starts_per_ultraserver_in_runs_of_at_most_eighteen() -> None:
    ids = [f"n{i:02}" for i in range(20)]
    nodes = [node(i, "us-0") for i in ids] + [node("m", "us-1")]
    got = plan({n.node_id: new() for n in nodes}, nodes)
    cohorts = {}
    for nid, state in got.states.items():
        cohorts.setdefault(state.cohort, []).append(nid)
    assert sorted(map(len, cohorts.values())) == [1, 2, 18]
    assert sorted(cohorts.values(), key=len)[0] == ["m"]  # alone on its UltraServer: it reaches itself
    peers = {j.peers for j in got.start if j.check == INSTANCE_CONNECTIVITY and j.node_id == "n00"}
    assert peers == {tuple(ids[:18])}
    assert got.began == tuple(sorted(n.node_id for n in nodes))
    assert all(len(c) <= 63 and c[0].isalpha() for c in cohorts)


def test_a_failure_says_each_failed_checks_output() -> None:
    jobs = jobs_of("a", RUN, InstanceStress=f"{FAILED}:exit code 1: core 7 disagrees",
                   InstanceConnectivity=f"{FAILED}:  exit code 1:\nreached 0 of 2 peers  ")
    [end] = plan({"a": RUN}, [node("a")], jobs=jobs).finished
    assert (end.node_id, end.passed) == ("a", False)
    assert end.message == ("InstanceStress failed: exit code 1: core 7 disagrees; "
                           "InstanceConnectivity failed: exit code 1: reached 0 of 2 peers")


def test_a_long_output_is_cut_for_its_event() -> None:
    [end] = plan({"a": RUN_STRESS}, [node("a")], jobs=jobs_of("a", RUN_STRESS, InstanceStress=f"{FAILED}:" + "x" * 5000),
                 checks=STRESS).finished
    assert len(end.message) < deepchecks.MAX_OUTPUT + 50 and end.message.endswith("(truncated)")


def test_the_job_names_follow_the_node_its_run_and_the_check() -> None:
    long_id = "hp-" + "g" * 30 + "-c64f9691-12-17-g3"
    state = running()
    names = {job_name(long_id, c, s) for c in BOTH for s in (state, replace(state, since=NOW),
                                                              replace(state, cohort="dhc-other"))}
    assert len(names) == 6 and all(len(n) <= 63 for n in names)
    assert job_name(long_id, INSTANCE_STRESS, state) == job_name(long_id, INSTANCE_STRESS, running())


@pytest.mark.parametrize("state, labels, taints", [
    (None, {}, (SPARE_TAINT,)),
    (new(), {LABEL_DEEP_HEALTH_CHECK: CHECK_IN_PROGRESS, LABEL_SAGEMAKER_DEEP_HEALTH_CHECK: CHECK_IN_PROGRESS},
     (SPARE_TAINT, deepchecks.CHECK_TAINT)),
    (replace(RUN, status=CHECK_FAILED), {LABEL_DEEP_HEALTH_CHECK: CHECK_FAILED,
                                         LABEL_SAGEMAKER_DEEP_HEALTH_CHECK: CHECK_FAILED},
     (SPARE_TAINT, Taint(deepchecks.TAINT_DEEP_HEALTH_CHECK, CHECK_FAILED, "NoSchedule"))),
    (replace(RUN, status=CHECK_PASSED), {LABEL_DEEP_HEALTH_CHECK: CHECK_PASSED,
                                         LABEL_SAGEMAKER_DEEP_HEALTH_CHECK: CHECK_PASSED}, (SPARE_TAINT,)),
], ids=["no-checks-nothing", "in-progress-labelled-and-tainted", "failed-stays-tainted", "passed-untainted"])
def test_a_node_wears_its_checks(state, labels, taints) -> None:
    spec = NodeSpec("a", {"team": "x"}, (SPARE_TAINT, deepchecks.CHECK_TAINT) if state and state.serving
                    else (SPARE_TAINT,), "spare", "us-0", "t", "z")
    got = hyperpod_dressed(deepchecks.dressed(spec, state))  # HyperPod's key beside ours (the default)
    assert dict(got.labels) == {"team": "x", **labels}
    assert dict(deepchecks.dressed(spec, state).labels) == {  # without it, hyperplan's key only
        "team": "x", **{k: v for k, v in labels.items() if k != LABEL_SAGEMAKER_DEEP_HEALTH_CHECK}}
    assert got.taints == taints


def test_the_record_keeps_a_run_and_gives_it_back() -> None:
    state = CheckState(CHECK_FAILED, BEFORE, BOTH, BEFORE, "dhc-run", NOW)
    entries = [GroupNode(name="a", uid="u", node_id="a"), GroupNode(name="kind-worker", uid="v", node_id="b")]
    record = deepchecks.recorded(entries, {"b": state})  # by node id, which a lent node's name is not
    assert record[0].deep_health_check is None
    assert deepchecks.states_of(record) == {"b": state}
    assert GroupNode.model_validate(record[1].wire()).deep_health_check == state.to_record()
    assert deepchecks.awaited(record) == set()  # failed: nothing to wait for
    assert deepchecks.awaited(deepchecks.recorded(entries, {"a": running()})) == {
        job_name("a", c, running()) for c in BOTH}
    assert deepchecks.awaited(deepchecks.recorded(entries, {"a": new()})) == set()  # no Job made yet


# --------------------------------------------------------------------------- health and the ladder


def ready_node(name: str, **kw) -> NodeObservation:
    return NodeObservation(name, conditions=(NodeCondition("Ready", "True", NOW - timedelta(hours=1)),), **kw)


def test_a_failed_check_is_judged_at_once_without_grace() -> None:
    verdict = evaluate_health([ready_node("a", check_failed=NOW), ready_node("b", checking=True)],
                              HealthCheck(grace=timedelta(minutes=5)), NOW)
    assert dict(verdict.unhealthy) == {"a": recovery.SIGNAL_DEEP_CHECK_FAILED}
    assert "b" in verdict.healthy


@pytest.mark.parametrize("ladder, step", [
    (recovery.Ladder(), recovery.REPLACE), (recovery.Ladder(automatic=False), recovery.LABEL_ONLY),
], ids=["automatic-replaces-no-reboot", "node-recovery-none-labels-only"])
def test_the_ladder_replaces_a_node_that_failed_its_checks(ladder, step) -> None:
    got = recovery.next_step(exists=True, conditions=(), health_label=None, reason=recovery.SIGNAL_DEEP_CHECK_FAILED,
                             state=recovery.RecoveryState(), ladder=ladder, covered=True, now=NOW)
    assert got.kind == step


@pytest.mark.parametrize("spare_checking, backfilled, promoted", [
    (False, False, True), (True, False, False), (False, True, False),
], ids=["a-checked-spare-is-promoted", "a-spare-still-in-its-checks-is-not",
        "nor-one-checked-later-for-a-slot-that-has-its-new-node"])
def test_a_spare_serves_only_once_checked(spare_checking, backfilled, promoted) -> None:
    failed = NodeObservation("a", conditions=(NodeCondition("Ready", "False", NOW - timedelta(minutes=5)),),
                             ultraserver_id="us-0", slot="0-0")
    spare = ready_node("s", role="spare", ultraserver_id="us-0", slot="0-1", checking=spare_checking)
    nodes = [failed, spare] + ([ready_node("a-g1", ultraserver_id="us-0", slot="0-0", generation=1, checking=True)]
                               if backfilled else [])
    verdict = evaluate_health(nodes, HealthCheck(), NOW)
    remedy = plan_remediation(verdict, nodes, block_has_time_left=True, uses_spares=True, max_unhealthy=1,
                              ladder=recovery.REPLACE_ONLY, now=NOW)
    assert any(type(a).__name__ == "PromoteSpare" for a in remedy.actions) == promoted
