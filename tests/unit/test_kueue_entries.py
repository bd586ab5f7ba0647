"""The admission-check entry hyperplan applies on a Workload: written once per change."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hyperplan.controllers.kueue import admission as kueue_admission
from hyperplan.planning import admission

NOW = datetime(2027, 1, 1, 12, 0, tzinfo=timezone.utc)
SETS = (admission.PodSetView("main", 2), admission.PodSetView("workers", 4))
SELECTOR = {"node-restriction.kubernetes.io/hyperplan-workload": "team.job-train"}


def test_ready_entry_pins_every_pod_set_to_the_workload_nodes() -> None:
    d = admission.AdmissionDecision("Ready", admission.REASON_ADMITTED, "admitted", 6, "rc-1")
    entry = kueue_admission.entry_for("plan-check", d, {"name": "plan-check", "state": "Pending", "lastTransitionTime": "x"},
                         SETS, SELECTOR, NOW)
    assert entry == {"name": "plan-check", "state": "Ready", "message": "admitted",
                     "lastTransitionTime": "2027-01-01T12:00:00Z",
                     "podSetUpdates": [{"name": "main", "nodeSelector": SELECTOR},
                                       {"name": "workers", "nodeSelector": SELECTOR}]}


def test_retry_entry_carries_requeue_and_no_pod_set_updates() -> None:
    d = admission.AdmissionDecision("Retry", admission.REASON_WAITING_FOR_BLOCK, "next block", requeue_after=timedelta(seconds=7.2))
    entry = kueue_admission.entry_for("plan-check", d, None, SETS, SELECTOR, NOW)
    assert entry["requeueAfterSeconds"] == 8 and "podSetUpdates" not in entry


def test_same_state_keeps_its_transition_time_and_is_not_rewritten() -> None:
    d = admission.AdmissionDecision("Retry", admission.REASON_WAITING_FOR_BLOCK, "next block", requeue_after=timedelta(seconds=5))
    prior = {"name": "plan-check", "state": "Retry", "message": "next block", "requeueAfterSeconds": 5,
             "lastTransitionTime": "2027-01-01T11:00:00Z", "retryCount": 2}
    entry = kueue_admission.entry_for("plan-check", d, prior, SETS, SELECTOR, NOW)
    assert entry["lastTransitionTime"] == "2027-01-01T11:00:00Z"
    assert not kueue_admission.differs(prior, entry)
    assert kueue_admission.differs({**prior, "state": "Pending"}, entry)
    assert kueue_admission.differs({**prior, "message": "other"}, entry)
