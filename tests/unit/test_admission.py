"""Admission of Kueue workloads into a plan's blocks: the pure decision, table-driven."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hyperplan.planning import admission

UTC = timezone.utc
P5 = ("nvidia.com/gpu", 8)


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def block(bid: str, start: str, end: str, count: int = 8, az: str = "us-east-1a",
          lead: timedelta = timedelta(minutes=30)) -> admission.BlockView:
    return admission.BlockView(bid, az, "ml.p5.48xlarge", count, ts(start), ts(end), ts(end) - lead)


# Block a: Jan 1 11:30 - Jan 2 11:30 (terminates 11:00); a day's gap; block b: Jan 3 - Jan 4 in another AZ.
A = block("a", "2027-01-01 11:30", "2027-01-02 11:30")
B = block("b", "2027-01-03 11:30", "2027-01-04 11:30", az="us-east-1b")
SMALL = block("small", "2027-01-01 11:30", "2027-01-02 11:30", count=2)
BIG = block("big", "2027-01-03 11:30", "2027-01-05 11:30", count=16)


def plan(*blocks: admission.BlockView, phase: str | None = "Scheduled", target: str = admission.TRAINING_JOB,
         failure: str = "") -> admission.AdmissionPlan:
    return admission.AdmissionPlan("llama", target, phase, tuple(blocks), failure, P5)


def workload(pods: int = 4, hours: float | None = None, gpus: str | None = "8", sets: int = 1) -> admission.WorkloadView:
    requests = {"nvidia.com/gpu": gpus} if gpus is not None else {}
    pod_sets = tuple(admission.PodSetView(f"set{i}", pods, requests) for i in range(sets))
    return admission.WorkloadView("team", "train", pod_sets,
                           None if hours is None else timedelta(hours=hours))


H = timedelta(hours=1)

CASES = [
    # id, plan, workload, now, held_by_others, ready_nodes -> state, reason, block, requeue, message fragments
    ("time-left-covers-max-exec", plan(A, B), workload(hours=20), "2027-01-01 12:00", 0, None,
     "Ready", admission.REASON_ADMITTED, "a", None, ["fits in the 23h left", "termination time 2027-01-02T11:00:00Z"]),
    ("max-exec-equal-to-time-left", plan(A, B), workload(hours=23), "2027-01-01 12:00", 0, None,
     "Ready", admission.REASON_ADMITTED, "a", None, []),
    ("max-exec-longer-than-time-left-waits-for-next-block", plan(A, B), workload(hours=23, pods=4),
     "2027-01-01 12:00:01", 0, None,
     "Retry", admission.REASON_WAITING_FOR_BLOCK, None, timedelta(days=1, hours=23, minutes=29, seconds=59),
     ["next block that can hold it (b, 4 instance(s) in us-east-1b) starts 2027-01-03T11:30:00Z",
      "the running block a terminates at 2027-01-02T11:00:00Z"]),
    ("no-declared-time-is-admitted-and-told-it-drains", plan(A, B), workload(hours=None), "2027-01-02 10:59", 0,
     None, "Ready", admission.REASON_ADMITTED, "a", None,
     ["no maximum execution time declared", "drained at the block's termination time 2027-01-02T11:00:00Z"]),
    ("in-the-gap-waits-for-next-block", plan(A, B), workload(hours=2), "2027-01-02 20:00", 0, None,
     "Retry", admission.REASON_WAITING_FOR_BLOCK, None, timedelta(hours=15, minutes=30),
     ["starts 2027-01-03T11:30:00Z"]),
    ("terminating-block-is-not-usable", plan(A, B), workload(hours=None), "2027-01-02 11:10", 0, None,
     "Retry", admission.REASON_WAITING_FOR_BLOCK, None, None, ["next block that can hold it (b"]),
    ("before-first-block-waits-for-it", plan(A, B), workload(hours=2), "2027-01-01 09:00", 0, None,
     "Retry", admission.REASON_WAITING_FOR_BLOCK, None, timedelta(hours=2, minutes=30), ["(a, 4 instance(s)"]),
    ("several-blocks-first-one-too-small", plan(SMALL, BIG), workload(pods=8, hours=2), "2027-01-01 12:00", 0, None,
     "Retry", admission.REASON_WAITING_FOR_BLOCK, None, None,
     ["the running block small has 2 instance(s)", "(big, 8 instance(s)"]),
    ("several-blocks-later-one-long-enough", plan(A, BIG), workload(hours=40), "2027-01-01 12:00", 0, None,
     "Retry", admission.REASON_WAITING_FOR_BLOCK, None, None, ["(big,"]),
    ("too-big-for-any-block", plan(A, B), workload(pods=9), "2027-01-01 12:00", 0, None,
     "Rejected", admission.REASON_NO_BLOCK_FITS, None, None, ["needs 9 instance(s)", "largest remaining block", "has 8"]),
    ("too-long-for-any-block", plan(A, B), workload(hours=24), "2027-01-01 12:00", 0, None,
     "Rejected", admission.REASON_NO_BLOCK_FITS, None, None, ["maximum execution time 1d", "longest 23h30m"]),
    ("too-long-for-what-is-left", plan(A, B), workload(hours=10), "2027-01-04 03:00", 0, None,
     "Rejected", admission.REASON_NO_BLOCK_FITS, None, None, ["longest 8h"]),
    ("all-blocks-past-termination", plan(A, B, phase="Active"), workload(), "2027-01-04 11:15", 0, None,
     "Rejected", admission.REASON_NO_BLOCK_FITS, None, None, ["no block of training plan llama is left"]),
    ("plan-expired", plan(A, B, phase="Expired"), workload(), "2027-01-05 00:00", 0, None,
     "Rejected", admission.REASON_PLAN_ENDED, None, None, ["has ended"]),
    ("plan-failed", plan(phase="Failed", failure="offering gone"), workload(), "2027-01-01 00:00", 0, None,
     "Rejected", admission.REASON_PLAN_FAILED, None, None, ["failed: offering gone"]),
    ("plan-not-bought", plan(phase="Pending"), workload(), "2027-01-01 00:00", 0, None,
     "Retry", admission.REASON_PLAN_NOT_PURCHASED, None, timedelta(seconds=30), ["not bought yet (phase Pending)"]),
    ("plan-not-reconciled-yet", plan(phase=None), workload(), "2027-01-01 00:00", 0, None,
     "Retry", admission.REASON_PLAN_NOT_PURCHASED, None, timedelta(seconds=30), ["phase unknown"]),
    ("capacity-taken-by-other-workloads", plan(A, B), workload(pods=4), "2027-01-01 12:00", 5, None,
     "Retry", admission.REASON_WAITING_FOR_CAPACITY, None, timedelta(seconds=30), ["hold 5, 3 free"]),
    ("capacity-left-beside-other-workloads", plan(A, B), workload(pods=4), "2027-01-01 12:00", 4, None,
     "Ready", admission.REASON_ADMITTED, "a", None, []),
    ("hyperpod-ready-nodes-bound-the-room", plan(A, B, target=admission.HYPERPOD_CLUSTER), workload(pods=4),
     "2027-01-01 12:00", 0, 3, "Retry", admission.REASON_WAITING_FOR_CAPACITY, None, timedelta(seconds=30),
     ["3 Ready active node(s) of its instance groups"]),
    ("hyperpod-enough-ready-nodes", plan(A, B, target=admission.HYPERPOD_CLUSTER), workload(pods=4), "2027-01-01 12:00",
     2, 6, "Ready", admission.REASON_ADMITTED, "a", None, []),
    ("pods-share-an-instance-by-gpus", plan(SMALL, phase="Active"), workload(pods=8, gpus="2"), "2027-01-01 12:00",
     0, None, "Ready", admission.REASON_ADMITTED, "small", None, ["(2 instance(s)"]),
    ("pod-asks-more-gpus-than-an-instance-has", plan(A, B), workload(gpus="16"), "2027-01-01 12:00", 0, None,
     "Rejected", admission.REASON_POD_TOO_BIG, None, None, ["asks for 16 nvidia.com/gpu; an instance has 8"]),
    ("pod-sets-add-up", plan(A, B), workload(pods=5, sets=2), "2027-01-01 12:00", 0, None,
     "Rejected", admission.REASON_NO_BLOCK_FITS, None, None, ["needs 10 instance(s)"]),
    ("no-plan", None, workload(), "2027-01-01 00:00", 0, None,
     "Retry", admission.REASON_PLAN_NOT_FOUND, None, timedelta(seconds=30), ["training plan llama does not exist"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_decide_admission(case) -> None:
    _, the_plan, wl, now, held, ready, state, reason, block_id, requeue, fragments = case
    d = admission.decide_admission(the_plan, wl, ts(now), held_by_others=held, ready_nodes=ready,
                            busy_retry=timedelta(seconds=30), plan_name="llama")
    assert (d.state, d.reason) == (state, reason), d.message
    assert d.block_id == block_id
    if requeue is not None:
        assert d.requeue_after == requeue
    if state == "Retry":
        assert d.requeue_after_seconds is not None and d.requeue_after_seconds >= 1
    else:
        assert d.requeue_after is None
    for fragment in fragments:
        assert fragment in d.message, (fragment, d.message)


@pytest.mark.parametrize("requests, accelerators, per, why", [
    ({}, P5, 1, ""),
    ({"cpu": "4", "memory": "16Gi"}, P5, 1, ""),
    ({"nvidia.com/gpu": "8"}, P5, 1, ""),
    ({"nvidia.com/gpu": "3"}, P5, 2, ""),
    ({"nvidia.com/gpu": "1"}, P5, 8, ""),
    ({"nvidia.com/gpu": "2000m"}, P5, 4, ""),
    ({"nvidia.com/gpu": "9"}, P5, 0, "an instance has 8"),
    ({"aws.amazon.com/neuron": "1"}, P5, 0, "has 8 nvidia.com/gpu"),
    ({"nvidia.com/gpu": "1"}, None, 0, "has no accelerators"),
], ids=["nothing", "cpu-only", "whole-instance", "two-of-three", "eight-singles", "milli-units",
        "too-many-gpus", "wrong-accelerator", "type-without-accelerators"])
def test_pods_per_instance(requests, accelerators, per, why) -> None:
    got, reason = admission.pods_per_instance(requests, accelerators)
    assert got == per
    assert why in reason


def test_requeue_seconds_round_up_and_never_zero() -> None:
    assert admission.AdmissionDecision("Retry", "x", "", requeue_after=timedelta(seconds=2.1)).requeue_after_seconds == 3
    assert admission.AdmissionDecision("Retry", "x", "", requeue_after=timedelta(0)).requeue_after_seconds == 1
    assert admission.AdmissionDecision("Ready", "x", "").requeue_after_seconds is None


@pytest.mark.parametrize("parameters, the_plan, status, reason, fragment", [
    ({"apiGroup": "hyperplan.dev", "kind": "TrainingPlan", "name": "llama"}, plan(A), "True", "PlanFound",
     "serving training plan llama"),
    ({"apiGroup": "hyperplan.dev", "kind": "TrainingPlan", "name": "llama"}, None, "False", admission.REASON_PLAN_NOT_FOUND,
     "training plan llama does not exist"),
    (None, None, "False", "InvalidParameters", "spec.parameters is missing"),
    ({"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig", "name": "x"}, None, "False",
     "InvalidParameters", "names ProvisioningRequestConfig of apiGroup kueue.x-k8s.io"),
    ({"apiGroup": "hyperplan.dev", "kind": "TrainingPlan"}, None, "False", "InvalidParameters",
     "spec.parameters.name is empty"),
], ids=["plan-exists", "plan-missing", "no-parameters", "wrong-kind", "no-name"])
def test_check_active(parameters, the_plan, status, reason, fragment) -> None:
    active = admission.check_active(parameters, the_plan)
    assert (active.status, active.reason) == (status, reason)
    assert fragment in active.message


# --------------------------------------------------------------------------- reading Kueue's Workload


def wl_obj(**spec_extra) -> dict:
    return {"metadata": {"name": "job-train-1a2b3", "namespace": "team", "labels": {}},
            "spec": {"podSets": [
                {"name": "launcher", "count": 1, "template": {"spec": {"containers": [
                    {"name": "l", "resources": {"requests": {"cpu": "1"}}}]}}},
                {"name": "workers", "count": 4, "template": {"spec": {"containers": [
                    {"name": "w", "resources": {"limits": {"nvidia.com/gpu": "4"}}},
                    {"name": "sidecar", "resources": {"requests": {"nvidia.com/gpu": "0", "cpu": "1"}}}]}}}],
                **spec_extra}}


def test_workload_view_reads_pod_sets_and_max_exec() -> None:
    view = admission.workload_view(wl_obj(maximumExecutionTimeSeconds=3600))
    assert view.key == "team/job-train-1a2b3"
    assert [(ps.name, ps.count) for ps in view.pod_sets] == [("launcher", 1), ("workers", 4)]
    assert view.pod_sets[1].requests["nvidia.com/gpu"] == "4"  # limits stand in for requests, summed
    assert view.max_execution == timedelta(hours=1)
    assert admission.instances_needed(view.pod_sets, P5) == (1 + 2, "")


@pytest.mark.parametrize("spec, labels, expected", [
    ({}, {}, None),
    ({}, {"kueue.x-k8s.io/max-exec-time-seconds": "600"}, timedelta(minutes=10)),
    ({"maximumExecutionTimeSeconds": 60}, {"kueue.x-k8s.io/max-exec-time-seconds": "600"}, timedelta(minutes=1)),
    ({}, {"kueue.x-k8s.io/max-exec-time-seconds": "soon"}, None),
], ids=["none", "label-only", "spec-wins", "bad-label"])
def test_workload_max_exec_sources(spec, labels, expected) -> None:
    obj = wl_obj(**spec)
    obj["metadata"]["labels"] = labels
    assert admission.workload_view(obj).max_execution == expected


@pytest.mark.parametrize("conditions, state, to_decide, holds", [
    ({"QuotaReserved": "True"}, "Pending", True, False),
    ({"QuotaReserved": "False"}, "Pending", False, False),
    ({"QuotaReserved": "True"}, "Retry", False, False),
    ({"QuotaReserved": "True", "Admitted": "True"}, "Ready", False, True),
    ({"QuotaReserved": "True", "Finished": "True"}, "Ready", False, False),
    ({"QuotaReserved": "True", "Evicted": "True"}, "Ready", False, False),
    ({"QuotaReserved": "True"}, None, False, False),
], ids=["quota-pending", "no-quota", "retry-left-to-kueue", "admitted-holds", "finished", "evicted", "no-entry"])
def test_workload_progress(conditions, state, to_decide, holds) -> None:
    obj = {"status": {"conditions": [{"type": t, "status": s} for t, s in conditions.items()],
                      "admissionChecks": ([{"name": "plan-check", "state": state, "lastTransitionTime": "t"}]
                                          if state else [])}}
    progress = admission.workload_progress(obj, "plan-check")
    assert (progress.to_decide, progress.holds_capacity) == (to_decide, holds)


@pytest.mark.parametrize("the_plan, now, state, fragments, requeue", [
    (plan(A, B), "2027-01-02 11:00", "Retry",
     ["block a reached its termination time 2027-01-02T11:00:00Z", "evicted: next block that can hold it (b"],
     timedelta(days=1, minutes=30)),
    (plan(A, block("c", "2027-01-02 11:30", "2027-01-03 11:30")), "2027-01-02 11:30", "Retry",
     ["evicted to be admitted again into block c"], timedelta(seconds=1)),
    (plan(A), "2027-01-02 11:00", "Rejected", ["block a reached its termination time", "no block"], None),
    (plan(B), "2027-01-03 12:00", "Retry", ["block a is no longer part of training plan llama"], None),
], ids=["next-block-later", "next-block-now", "no-block-left", "block-gone"])
def test_decide_after_block(the_plan, now, state, fragments, requeue) -> None:
    d = admission.decide_after_block(the_plan, workload(hours=None), "a", ts(now), busy_retry=timedelta(seconds=30))
    assert d.state == state, d.message
    for fragment in fragments:
        assert fragment in d.message, (fragment, d.message)
    if requeue is not None:
        assert d.requeue_after == requeue


def test_admitted_block_reads_the_pod_label_of_the_entry() -> None:
    entry = {"podSetUpdates": [{"name": "main", "labels": {"hyperplan.dev/reserved-capacity": "rc-1"}}]}
    assert admission.admitted_block(entry, "hyperplan.dev/reserved-capacity") == "rc-1"
    assert admission.admitted_block({"podSetUpdates": [{"name": "main"}]}, "hyperplan.dev/reserved-capacity") is None
    assert admission.admitted_block(None, "x") is None


# --------------------------------------------------------------------------- one pass over a plan's workloads


def checked(name: str, state: str | None, pods: int = 4, hours: float | None = None, block: str | None = None,
            finished: bool = False) -> admission.CheckedWorkload:
    progress = admission.WorkloadProgress(state, quota_reserved=True, admitted=state == "Ready", finished=finished,
                                   evicted=False)
    view = admission.WorkloadView("team", name, (admission.PodSetView("main", pods, {"nvidia.com/gpu": "8"}),),
                           None if hours is None else timedelta(hours=hours))
    return admission.CheckedWorkload(name, view, progress, block)


@pytest.mark.parametrize("workloads, expected, held", [
    ([checked("a", "Pending"), checked("b", "Pending")], {"a": "Ready", "b": "Ready"}, 8),
    ([checked("x", "Ready", pods=2, block="a"), checked("a", "Pending"), checked("b", "Pending")],
     {"a": "Ready", "b": "Retry"}, 6),
    ([checked("x", "Ready", pods=6, block="a", finished=True), checked("a", "Pending", pods=8)], {"a": "Ready"}, 8),
    ([checked("old", "Ready", pods=4, block="gone"), checked("a", "Pending", pods=8)],
     {"old": "Retry", "a": "Ready"}, 8),
    ([checked("r", "Retry"), checked("j", "Rejected"), checked("a", "Pending", pods=9)], {"a": "Rejected"}, 0),
], ids=["two-fit", "second-waits-for-room", "finished-holds-nothing", "ended-block-requeued", "only-pending-decided"])
def test_decide_plan_admission_accounts_room_across_one_pass(workloads, expected, held) -> None:
    out = admission.decide_plan_admission(plan(A, B), workloads, "a", ts("2027-01-01 12:00"), busy_retry=timedelta(seconds=5))
    assert {w.ref: d.state for w, d in out.decisions} == expected
    assert sum(n for _, n in out.holders) == held
    for w, d in out.decisions:
        if w.ref == "old":
            assert "block gone is no longer part of training plan llama" in d.message


@pytest.mark.parametrize("outside, expected", [
    (0, "Ready"), (4, "Ready"), (5, "Retry"),
], ids=["nothing-outside", "outside-leaves-room", "outside-takes-the-room"])
def test_instances_held_outside_the_checks_count_against_the_block(outside: int, expected: str) -> None:
    """A workload admitted through a check that is gone since still holds its instances."""
    out = admission.decide_plan_admission(plan(A, B), [checked("a", "Pending")], "a", ts("2027-01-01 12:00"),
                                   busy_retry=timedelta(seconds=5), held_outside=outside)
    assert [d.state for _, d in out.decisions] == [expected]


@pytest.mark.parametrize("conditions, runs", [
    ({"QuotaReserved": "True", "Admitted": "True"}, True),
    ({"QuotaReserved": "True"}, True),  # being admitted: Kueue sets Admitted once every check is Ready
    ({"QuotaReserved": "False", "Admitted": "False"}, False),
    ({"Admitted": "True", "Finished": "True"}, False),
    ({"Admitted": "True", "Evicted": "True"}, False),
    ({}, False),
], ids=["admitted", "quota-only", "requeued", "finished", "evicted", "no-status"])
def test_workload_runs(conditions: dict, runs: bool) -> None:
    obj = {"status": {"conditions": [{"type": t, "status": s} for t, s in conditions.items()]}}
    assert admission.workload_runs(obj) is runs


ADMITTED = [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}]


def tas(*slices: dict, levels=("topology.k8s.aws/ultraserver-id", "kubernetes.io/hostname")) -> dict:
    return {"topologyAssignment": {"levels": list(levels), "slices": list(slices)}}


@pytest.mark.parametrize("conditions, assignments, expected", [
    (ADMITTED, [tas({"domainCount": 3, "podCounts": {"universal": 1}, "valuesPerLevel": [
        {"universal": "us-1"}, {"individual": {"prefix": "hp-g-0-", "roots": ["2", "3", "5"]}}]})],
     ("hp-g-0-2", "hp-g-0-3", "hp-g-0-5")),
    (ADMITTED, [tas({"domainCount": 2, "podCounts": {"individual": [1, 2]}, "valuesPerLevel": [
        {"universal": "us-1"}, {"individual": {"roots": ["a", "b"], "suffix": "-x"}}]}),
        tas({"domainCount": 1, "podCounts": {"universal": 4}, "valuesPerLevel": [
            {"universal": "us-2"}, {"universal": "c"}]})],
     ("a-x", "b-x", "c")),
    (ADMITTED, [tas({"domainCount": 1, "podCounts": {"universal": 4}, "valuesPerLevel": [{"universal": "us-1"}]},
                    levels=("topology.k8s.aws/ultraserver-id",))], ()),
    (ADMITTED, [{"flavors": {"nvidia.com/gpu": "f"}}], ()),
    ([{"type": "Admitted", "status": "True"}, {"type": "Finished", "status": "True"}],
     [tas({"domainCount": 1, "podCounts": {"universal": 1}, "valuesPerLevel": [
         {"universal": "us-1"}, {"universal": "n"}]})], ()),
], ids=["individual-with-prefix", "suffix-and-universal-slices", "no-hostname-level", "no-topology",
        "finished-holds-no-node"])
def test_assigned_hostnames(conditions: list, assignments: list, expected: tuple) -> None:
    obj = {"status": {"conditions": conditions, "admission": {"podSetAssignments": assignments}}}
    assert admission.assigned_hostnames(obj) == expected
