"""The demo's line about its Kueue job, from the Workload and pods as Kueue and hyperplan leave them."""

from __future__ import annotations

import pytest

from hyperplan_dev.demo import describe_job


def wl(*conditions: tuple[str, str, str], checks: list[dict] | None = None) -> dict:
    return {"metadata": {"name": "job-demo-train-1a2b3"}, "status": {
        "conditions": [{"type": t, "status": s, "reason": "R", "message": m} for t, s, m in conditions],
        "admissionChecks": checks or []}}


def pod(phase: str, node: str | None = None) -> dict:
    return {"spec": {"nodeName": node} if node else {}, "status": {"phase": phase}}


RETRY = {"name": "demo-gb200-plan", "state": "Retry",
         "message": "no active block of plan demo-gb200; next block tp-1 starts 2026-11-30T10:00:30Z"}


@pytest.mark.parametrize("workload, pods, expected", [
    pytest.param(None, [], "submitted; Kueue has not made its Workload yet", id="no-workload-yet"),
    pytest.param(wl(("QuotaReserved", "False", "ClusterQueue demo is inactive")), [],
                 "waiting in Kueue's queue: ClusterQueue demo is inactive", id="waiting-in-kueue"),
    pytest.param(wl(("QuotaReserved", "True", "Quota reserved"), checks=[RETRY]), [],
                 "quota reserved; check demo-gb200-plan: Retry: no active block of plan demo-gb200; "
                 "next block tp-1 starts 2026-11-30T10:00:30Z", id="held-at-retry-with-the-message"),
    pytest.param(wl(("QuotaReserved", "True", "Quota reserved"),
                    checks=[{"name": "demo-gb200-plan", "state": "Pending"}]), [],
                 "quota reserved; check demo-gb200-plan: Pending", id="check-pending"),
    pytest.param(wl(("QuotaReserved", "True", ""), ("Admitted", "True", "")),
                 [pod("Running", "n-2"), pod("Running", "n-1"), pod("Pending")],
                 "admitted; pods: 1 Pending; 2 Running (on n-1, n-2)", id="admitted-pods-by-phase"),
    pytest.param(wl(("Admitted", "True", "")), [], "admitted; pods: none yet", id="admitted-no-pods-yet"),
    pytest.param(wl(("Evicted", "True", "the block ended")), [], "evicted (R): the block ended", id="evicted"),
    pytest.param(wl(("Admitted", "True", ""), ("Finished", "True", "Job finished successfully")), [],
                 "finished: Job finished successfully", id="finished-wins"),
])
def test_the_job_line_says_where_the_job_is(workload, pods, expected) -> None:
    assert describe_job(workload, pods) == expected
