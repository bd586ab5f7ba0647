"""A plan's own status writes wake none of its groups; a change a group reads of its plan does."""

import copy

import pytest

from hyperplan.wiring.nodes import plan_digest, plan_wakes_groups

BLOCK = {"id": "rc-1", "availabilityZone": "use1-az3", "instanceType": "ml.p5.48xlarge", "instanceCount": 2,
         "startTime": "2026-01-01T00:00:00Z", "endTime": "2026-01-01T01:00:00Z"}
PLAN = {
    "metadata": {"name": "p", "resourceVersion": "10"},
    "spec": {"targetResource": "hyperpod-cluster", "instanceType": "ml.p5.48xlarge", "instanceCount": 2,
             "duration": "1h", "spareInstancesPerUltraServer": 1},
    "status": {"phase": "Scheduled", "reservedCapacity": [BLOCK], "availableInstanceCount": 2,
               "inUseInstanceCount": 0, "conditions": [{"type": "Ready", "status": "True"}]},
}


def changed(edit) -> dict:
    plan = copy.deepcopy(PLAN)
    edit(plan)
    return plan


@pytest.mark.parametrize("plan, wakes", [
    pytest.param(changed(lambda p: p["metadata"].update(resourceVersion="11")), False, id="resource-version-only"),
    pytest.param(changed(lambda p: p["status"].update(phase="Active", inUseInstanceCount=2, availableInstanceCount=0)),
                 False, id="status-counts-and-phase-only"),
    pytest.param(changed(lambda p: p["status"]["conditions"][0].update(status="False")), False,
                 id="status-condition-only"),
    pytest.param(changed(lambda p: p["status"]["reservedCapacity"].append(
        dict(BLOCK, id="rc-2", startTime="2026-01-01T01:00:00Z", endTime="2026-01-01T02:00:00Z"))), True,
                 id="new-block"),
    pytest.param(changed(lambda p: p["status"].update(reservedCapacity=[])), True, id="blocks-gone"),
    pytest.param(changed(lambda p: p["status"]["reservedCapacity"][0].update(instanceCount=4)), True,
                 id="block-changed"),
    pytest.param(changed(lambda p: p["spec"].update(instanceType="ml.p4d.24xlarge")), True, id="spec-instance-type"),
    pytest.param(changed(lambda p: p["spec"].update(spareInstancesPerUltraServer=2)), True, id="spec-spares"),
    pytest.param(changed(lambda p: p["spec"].update(targetResource="training-job")), True, id="spec-target"),
    pytest.param(changed(lambda p: p["spec"].update(instanceGroupSelector={"matchLabels": {"team": "a"}})), True,
                 id="spec-group-selector"),
    pytest.param(changed(lambda p: p["metadata"].update(deletionTimestamp="2026-01-01T00:30:00Z")), True,
                 id="being-deleted"),
])
def test_a_modified_plan_wakes_its_groups_only_when_what_they_read_changed(plan: dict, wakes: bool) -> None:
    digests: dict[str, str] = {}
    assert plan_wakes_groups(digests, "p", None, PLAN) is False  # the initial listing: noted, no wake
    assert plan_wakes_groups(digests, "p", "MODIFIED", plan) is wakes
    assert digests == {"p": plan_digest(plan)}
    assert plan_wakes_groups(digests, "p", "MODIFIED", plan) is False  # the same again: nothing new


def test_a_new_plan_wakes_its_groups_and_a_deleted_one_wakes_them_and_is_forgotten() -> None:
    digests: dict[str, str] = {}
    assert plan_wakes_groups(digests, "p", "ADDED", PLAN) is True
    assert plan_wakes_groups(digests, "q", "ADDED", PLAN) is True
    assert plan_wakes_groups(digests, "p", "DELETED", PLAN) is True
    assert set(digests) == {"q"}


def test_an_unknown_plan_modified_wakes_its_groups() -> None:
    # e.g. the first event after a watch restart for a plan not seen in the initial listing
    assert plan_wakes_groups({}, "p", "MODIFIED", PLAN) is True


def test_a_plan_without_spec_or_status_has_a_digest() -> None:
    assert plan_digest({"metadata": {"name": "p"}}) == plan_digest({"metadata": {"name": "p"}, "spec": {}, "status": {}})
