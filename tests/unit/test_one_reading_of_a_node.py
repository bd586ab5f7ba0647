"""One reading of a node: every reader takes a node's health from planning.nodefacts.

A node carries two health labels, hyperplan's and SageMaker HyperPod's; the worse of the two is
the node's health. The table below puts each combination on an otherwise serving node (active,
``Ready=True``, not cordoned, no deep checks) and asks every reader of a node what it makes of
it: placement's slot states, lending's choice of a free node, the plan's counts, Kueue's count of
serving nodes, ``hyperplan status`` and the group pass's observation. They must all agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from kubernetes import client

from hyperplan import status
from hyperplan.actuation.groups import observe_node
from hyperplan.controllers.kueue.admission import ready_group_nodes
from hyperplan.controllers.plan.reconciler import plan_observed_node
from hyperplan.planning import lending, naming, nodefacts
from hyperplan.planning.health import HealthCheck, evaluate_health
from hyperplan.planning.placement import slot_states_from_labels

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)
LONG_AGO = NOW - timedelta(hours=1)  # every grace has passed
KEYS = naming.TopologyKeys()
HP, SM = naming.LABEL_HEALTH, naming.LABEL_SAGEMAKER_HEALTH
OK = naming.HEALTH_SCHEDULABLE
BAD = naming.HEALTH_UNSCHEDULABLE
REPLACE = naming.HEALTH_PENDING_REPLACEMENT
REBOOT = naming.HEALTH_PENDING_REBOOT
PLAN, BLOCK, SLOT = "p", "cr-1", "0"


@dataclass(frozen=True)
class Case:
    health: dict[str, str]  # the node's health labels
    effective: str | None  # the health every reader must see (None: neither label is set)
    state: str  # what hyperplan status shows

    @property
    def unhealthy(self) -> bool:
        return nodefacts.is_unschedulable(self.effective)


CASES = {
    "neither-label": Case({}, None, status.SERVING),
    "only-hyperplan-schedulable": Case({HP: OK}, OK, status.SERVING),
    "only-sagemaker-schedulable": Case({SM: OK}, OK, status.SERVING),
    "both-schedulable": Case({HP: OK, SM: OK}, OK, status.SERVING),
    "only-sagemaker-unschedulable": Case({SM: BAD}, BAD, status.UNHEALTHY),
    "only-hyperplan-unschedulable": Case({HP: BAD}, BAD, status.UNHEALTHY),
    "only-sagemaker-pending-replacement": Case({SM: REPLACE}, REPLACE, status.UNHEALTHY),
    "only-hyperplan-pending-replacement": Case({HP: REPLACE}, REPLACE, status.UNHEALTHY),
    "only-sagemaker-pending-reboot": Case({SM: REBOOT}, REBOOT, status.REBOOTING),
    "only-hyperplan-pending-reboot": Case({HP: REBOOT}, REBOOT, status.REBOOTING),
    "hyperplan-schedulable-sagemaker-unschedulable": Case({HP: OK, SM: BAD}, BAD, status.UNHEALTHY),
    "sagemaker-schedulable-hyperplan-unschedulable": Case({HP: BAD, SM: OK}, BAD, status.UNHEALTHY),
    "hyperplan-schedulable-sagemaker-pending-reboot": Case({HP: OK, SM: REBOOT}, REBOOT, status.REBOOTING),
    # Both say Unschedulable*: hyperplan's verdict is kept, by every reader (the group pass replaces).
    "hyperplan-pending-replacement-sagemaker-pending-reboot": Case({HP: REPLACE, SM: REBOOT}, REPLACE,
                                                                   status.UNHEALTHY),
    "hyperplan-pending-reboot-sagemaker-pending-replacement": Case({HP: REBOOT, SM: REPLACE}, REBOOT,
                                                                   status.REBOOTING),
}


def labels_of(case: Case) -> dict[str, str]:
    return {naming.LABEL_GROUP: "g", naming.LABEL_PLAN: PLAN, naming.LABEL_RESERVED_CAPACITY: BLOCK,
            naming.LABEL_ROLE: naming.ROLE_ACTIVE, naming.LABEL_SLOT: SLOT, naming.LABEL_GENERATION: "0",
            **case.health}


def as_dict(case: Case) -> dict:
    """The node as the watch cache and the API's JSON hold it."""
    return {"metadata": {"name": "n", "uid": "u-n", "labels": labels_of(case),
                         "creationTimestamp": "2026-12-07T10:00:00Z"},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True",
                                       "lastTransitionTime": "2026-12-07T10:00:00Z"}]}}


def as_v1(case: Case) -> client.V1Node:
    """The node as the Kubernetes client reads it."""
    return client.V1Node(
        metadata=client.V1ObjectMeta(name="n", uid="u-n", labels=labels_of(case), creation_timestamp=LONG_AGO),
        spec=client.V1NodeSpec(),
        status=client.V1NodeStatus(conditions=[
            client.V1NodeCondition(type="Ready", status="True", last_transition_time=LONG_AGO)]))


def as_pool_node(case: Case) -> lending.PoolNode:
    """The node as a free node of a static pool."""
    return lending.PoolNode(name="n", uid="u-n", labels={lending.LABEL_POOL: lending.POOL_FREE, **case.health},
                            conditions={"Ready": "True"})


def recorded_by_a_group(*nodes: dict) -> dict:
    """A group of the plan whose record holds ``nodes`` (Kueue counts only recorded nodes)."""
    return {"metadata": {"name": "g"}, "spec": {"trainingPlanRef": PLAN},
            "status": {"nodes": [{"name": n["metadata"]["name"], "uid": n["metadata"]["uid"],
                                  "nodeId": n["metadata"]["name"]} for n in nodes]}}


# Each reader of a node: whether it takes the node for unhealthy (unfit for work).
READERS = {
    "placement slot state": lambda case: slot_states_from_labels([labels_of(case)])[SLOT].unhealthy,
    "lending": lambda case: lending.why_not_lendable(as_pool_node(case)) is not None,
    "plan counts": lambda case: plan_observed_node(as_dict(case), KEYS).healthy is False,
    "kueue serving count": lambda case: ready_group_nodes(
        SimpleNamespace(keys=KEYS, cache=SimpleNamespace(block_nodes=lambda block: [as_dict(case)],
                                                         groups=lambda: [recorded_by_a_group(as_dict(case))])),
        PLAN, BLOCK) == 0,
    "status": lambda case: status.node_from_api(as_v1(case), KEYS.ultraserver_id)[1].state != status.SERVING,
    "group observation": lambda case: "n" in evaluate_health(
        [observe_node(as_v1(case), NOW, KEYS, lambda node, value: LONG_AGO).health], HealthCheck(), NOW).unhealthy,
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_every_reader_reads_the_worse_health_label(case: Case) -> None:
    assert {reader: read(case) for reader, read in READERS.items()} == {reader: case.unhealthy for reader in READERS}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_every_reader_keeps_the_same_health_value(case: Case) -> None:
    """Not only whether the node is unhealthy: which ``Unschedulable*`` value each reader acts on."""
    slot = slot_states_from_labels([labels_of(case)])[SLOT]
    seen = observe_node(as_v1(case), NOW, KEYS, lambda node, value: LONG_AGO)
    assert {
        "facts of a dict": nodefacts.facts_of_dict(as_dict(case), KEYS).health,
        "facts of a V1Node": nodefacts.facts_of_v1(as_v1(case), KEYS).health,
        "facts of a pool node": as_pool_node(case).facts.health,
        "placement slot state": slot.health,
        "group observation": seen.health.health_label,
    } == {
        "facts of a dict": case.effective,
        "facts of a V1Node": case.effective,
        "facts of a pool node": case.effective,
        "placement slot state": case.effective or naming.HEALTH_SCHEDULABLE,
        "group observation": case.effective,
    }


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_status_view_shows_the_effective_health(case: Case) -> None:
    assert status.node_from_api(as_v1(case), KEYS.ultraserver_id)[1].state == case.state


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_lending_names_the_label_that_says_unschedulable(case: Case) -> None:
    label = nodefacts.unschedulable_label(case.health)
    expected = None if label is None else f"is labelled {label[0]}={label[1]}"
    assert lending.why_not_lendable(as_pool_node(case)) == expected
    assert label is None or label[1] == case.effective


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_plan_counts_a_node_once_by_its_effective_health(case: Case) -> None:
    seen = plan_observed_node(as_dict(case), KEYS)
    assert (seen.healthy, seen.ready) == (not case.unhealthy, True)


@pytest.mark.parametrize("ready, verdict", [
    pytest.param("True", True, id="ready"),
    pytest.param("False", True, id="not-ready-with-healthy-labels-is-known-healthy"),
    pytest.param("Unknown", None, id="ready-unknown"),
    pytest.param(None, None, id="no-ready-condition"),
])
def test_the_health_verdict_is_unknown_while_ready_is(ready: str | None, verdict: bool | None) -> None:
    node = as_dict(CASES["neither-label"])
    node["status"]["conditions"] = [] if ready is None else [{"type": "Ready", "status": ready}]
    assert nodefacts.facts_of_dict(node, KEYS).health_verdict is verdict
    node["metadata"]["labels"][SM] = BAD
    assert nodefacts.facts_of_dict(node, KEYS).health_verdict is False
