"""A node's facts (hyperplan.planning.nodefacts), and every reader of node health agreeing on them.

The facts are read from the two shapes the operator holds a node in: the watch cache's plain
dict (``runtime.store.slim_node`` of the API's JSON) and the Kubernetes client's ``V1Node`` (here
deserialized from the same JSON by the client itself). The last tests put one node that only
SageMaker labels ``Unschedulable`` through each reader: Kueue's count of the nodes it may admit
work onto, ``hyperplan status``, the plan's counts and the group's health planning.
"""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client

from hyperplan_testing import invariants
from hyperplan import status
from hyperplan.actuation.groups import observe_node
from hyperplan.controllers.kueue import admission as kueue_admission
from hyperplan.runtime.store import slim_node
from hyperplan.controllers.plan.reconciler import plan_observed_node
from hyperplan.planning import counts
from hyperplan.planning import health
from hyperplan.planning import naming
from hyperplan.planning.nodefacts import NodeCondition, NodeFacts, facts_of_dict, facts_of_v1

NOW = datetime(2027, 1, 1, 12, 0, tzinfo=timezone.utc)
KEYS = naming.TopologyKeys(ultraserver_id="example.com/ultraserver")
HYPERPLAN, SAGEMAKER = naming.LABEL_HEALTH, naming.LABEL_SAGEMAKER_HEALTH
PLAN, BLOCK = "llama", "rc-a"


def node_json(name: str = "n", *, role: str | None = "active", ready: str | None = "True",
              hyperplan: str | None = None, sagemaker: str | None = None, deleting: bool = False,
              cordoned: bool = False, extra_labels: dict[str, str] | None = None,
              conditions: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """A group's node as the API server sends it."""
    labels = {naming.LABEL_GROUP: "g", naming.LABEL_PLAN: PLAN, naming.LABEL_RESERVED_CAPACITY: BLOCK,
              **(extra_labels or {})}
    for key, value in ((naming.LABEL_ROLE, role), (HYPERPLAN, hyperplan), (SAGEMAKER, sagemaker)):
        if value is not None:
            labels[key] = value
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "resourceVersion": "7",
                            "creationTimestamp": "2027-01-01T11:00:00Z", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2027-01-01T11:59:00Z"
    conds = [{"type": t, "status": s, "lastTransitionTime": "2027-01-01T11:30:00Z",
              "lastHeartbeatTime": "2027-01-01T11:59:59Z", "message": "kubelet says so"} for t, s in conditions]
    if ready is not None:
        conds.append({"type": "Ready", "status": ready, "lastTransitionTime": "2027-01-01T11:10:00Z",
                      "lastHeartbeatTime": "2027-01-01T11:59:59Z", "reason": "KubeletReady"})
    spec: dict[str, Any] = {"providerID": "kwok://n"}
    if cordoned:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec, "status": {"conditions": conds}}


def as_v1(body: dict[str, Any]) -> client.V1Node:
    """The node as the Kubernetes client reads it from the API's JSON."""
    class Response:  # what the client deserializes: an HTTP response's body in ``data``
        data = json.dumps(body)
    return client.ApiClient().deserialize(Response(), "V1Node")


# --------------------------------------------------------------------------- both shapes, one set of facts


@pytest.mark.parametrize("body", [
    pytest.param(node_json(), id="serving-active-node"),
    pytest.param(node_json(role="spare", extra_labels={naming.LABEL_SLOT: "0-3", naming.LABEL_GENERATION: "2",
                                                       naming.LABEL_REPLACES: "hp-old", KEYS.ultraserver_id: "us-1"}),
                 id="spare-with-slot-generation-ultraserver"),
    pytest.param(node_json(ready=None, role=None), id="no-ready-condition-no-role-label"),
    pytest.param(node_json(ready="Unknown", hyperplan="UnschedulablePendingReplacement", sagemaker="Unschedulable",
                           cordoned=True, deleting=True), id="marked-cordoned-deleting"),
    pytest.param(node_json(sagemaker="UnschedulablePendingReboot",
                           conditions=(("AcceleratedHardwareReady", "False"), ("GpuHealthy", "True"))),
                 id="hardware-conditions-and-sagemaker-reboot"),
])
def test_the_cache_dict_and_the_v1_node_give_the_same_facts(body: dict[str, Any]) -> None:
    from_cache = facts_of_dict(slim_node(body), KEYS, NOW)
    from_api_json = facts_of_dict(body, KEYS, NOW)
    from_client = facts_of_v1(as_v1(body), KEYS, NOW)
    assert from_cache == from_api_json == from_client
    assert (from_cache.name, from_cache.uid, from_cache.group, from_cache.plan, from_cache.block) == (
        "n", "uid-n", "g", PLAN, BLOCK)


def test_facts_name_every_field_the_readers_use() -> None:
    body = node_json(role="spare", ready="False", sagemaker="Unschedulable", cordoned=True,
                     extra_labels={naming.LABEL_SLOT: "1-0", naming.LABEL_GENERATION: "3",
                                   naming.LABEL_REPLACES: "hp-x", KEYS.ultraserver_id: "us-9"},
                     conditions=(("AcceleratedHardwareReady", "False"),))
    facts = facts_of_v1(as_v1(body), KEYS, NOW)
    assert facts == NodeFacts(
        name="n", uid="uid-n", labels=body["metadata"]["labels"], group="g", plan=PLAN, block=BLOCK,
        role=naming.ROLE_SPARE, ultraserver_id="us-9", slot="1-0", generation=3, replaces="hp-x", ready="False",
        hyperplan_health=None, sagemaker_health="Unschedulable",
        conditions=(NodeCondition("AcceleratedHardwareReady", "False", datetime(2027, 1, 1, 11, 30, tzinfo=timezone.utc)),
                    NodeCondition("Ready", "False", datetime(2027, 1, 1, 11, 10, tzinfo=timezone.utc))),
        created=datetime(2027, 1, 1, 11, 0, tzinfo=timezone.utc), deleting=False, cordoned=True)
    assert facts.condition("AcceleratedHardwareReady").status == "False"


def test_a_condition_without_a_transition_time_counts_from_now() -> None:
    body = {"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    assert facts_of_dict(body, now=NOW).conditions == (NodeCondition("Ready", "False", NOW),)
    assert facts_of_v1(as_v1(body), now=NOW).conditions == (NodeCondition("Ready", "False", NOW),)


# --------------------------------------------------------------------------- effective health

# (hyperplan's value, SageMaker's value) -> (effective health, unhealthy)
HEALTH = [
    pytest.param(None, None, None, False, id="no-labels"),
    pytest.param("Schedulable", None, "Schedulable", False, id="hp-schedulable"),
    pytest.param(None, "Schedulable", "Schedulable", False, id="sm-schedulable"),
    pytest.param("Schedulable", "Schedulable", "Schedulable", False, id="both-schedulable"),
    pytest.param(None, "Unschedulable", "Unschedulable", True, id="only-sm-unschedulable"),
    pytest.param("Schedulable", "Unschedulable", "Unschedulable", True, id="hp-schedulable-sm-unschedulable"),
    pytest.param("Unschedulable", "Schedulable", "Unschedulable", True, id="hp-unschedulable-sm-schedulable"),
    pytest.param("Schedulable", "UnschedulablePendingReboot", "UnschedulablePendingReboot", True,
                 id="sm-pending-reboot-kept"),
    pytest.param("UnschedulablePendingReplacement", None, "UnschedulablePendingReplacement", True,
                 id="hp-pending-replacement-kept"),
    pytest.param("UnschedulablePendingReplacement", "Unschedulable", "UnschedulablePendingReplacement", True,
                 id="both-bad-hyperplans-verdict-kept"),
    pytest.param("UnschedulablePendingReplacement", "UnschedulablePendingReboot", "UnschedulablePendingReplacement",
                 True, id="both-pending-hyperplans-kept"),
    pytest.param("Unschedulable", "UnschedulablePendingReboot", "Unschedulable", True, id="both-bad-hp-first"),
    pytest.param(None, "UnschedulablePendingReplacement", "UnschedulablePendingReplacement", True,
                 id="sm-pending-replacement"),
]


@pytest.mark.parametrize("hyperplan, sagemaker, effective, unhealthy", HEALTH)
def test_the_worse_health_label_wins(hyperplan: str | None, sagemaker: str | None, effective: str | None,
                                     unhealthy: bool) -> None:
    facts = facts_of_dict(node_json(hyperplan=hyperplan, sagemaker=sagemaker))
    assert (facts.health, facts.is_unhealthy) == (effective, unhealthy)
    assert facts.unschedulable_health == (effective if unhealthy else None)
    assert facts.pending_replacement == ("UnschedulablePendingReplacement" in (hyperplan, sagemaker))
    # Only the operator's own label is its mark: its pods and the node then leave by remediation.
    assert facts.marked_for_replacement == (hyperplan == "UnschedulablePendingReplacement")


def _serving_cases() -> list[Any]:
    cases = []
    for (health_case, ready, deleting, cordoned) in itertools.product(
            HEALTH, ("True", "False", "Unknown", None), (False, True), (False, True)):
        hyperplan, sagemaker, _, unhealthy = health_case.values
        serves = not unhealthy and ready == "True" and not deleting and not cordoned
        words = [health_case.id, f"ready-{ready or 'none'}"] + ["deleting"] * deleting + ["cordoned"] * cordoned
        cases.append(pytest.param(hyperplan, sagemaker, ready, deleting, cordoned, serves, id=",".join(words)))
    return cases


@pytest.mark.parametrize("hyperplan, sagemaker, ready, deleting, cordoned, serves", _serving_cases())
def test_a_node_serves_only_when_active_ready_healthy_by_both_labels_and_not_leaving(
        hyperplan: str | None, sagemaker: str | None, ready: str | None, deleting: bool, cordoned: bool,
        serves: bool) -> None:
    for role in ("active", "spare"):
        body = node_json(role=role, ready=ready, hyperplan=hyperplan, sagemaker=sagemaker, deleting=deleting,
                         cordoned=cordoned)
        for facts in (facts_of_dict(slim_node(body)), facts_of_v1(as_v1(body))):
            assert (facts.is_serving, facts.is_available_spare) == (
                (serves, False) if role == "active" else (False, serves)), role


DEEP, SAGEMAKER_DEEP = "hyperplan.dev/deep-health-check-status", "sagemaker.amazonaws.com/deep-health-check-status"


@pytest.mark.parametrize("hyperplan, sagemaker, status, serves", [
    pytest.param(None, None, None, True, id="never-checked"),
    pytest.param("Passed", None, "Passed", True, id="passed"),
    pytest.param("InProgress", None, "InProgress", False, id="in-its-checks"),
    pytest.param("Failed", None, "Failed", False, id="failed-them"),
    pytest.param(None, "InProgress", "InProgress", False, id="hyperpods-checks-run"),
    pytest.param("Passed", "InProgress", "InProgress", False, id="passed-ours-hyperpods-run"),
    pytest.param("InProgress", "Failed", "Failed", False, id="failed-by-hyperpods-wins"),
    pytest.param(None, "Passed", "Passed", True, id="passed-hyperpods"),
])
def test_a_node_in_or_failing_its_deep_health_checks_by_either_key_does_not_serve(
        hyperplan: str | None, sagemaker: str | None, status: str | None, serves: bool) -> None:
    """Kueue counts only the nodes that serve: a node tainted for its checks must not be one."""
    extra = {k: v for k, v in ((DEEP, hyperplan), (SAGEMAKER_DEEP, sagemaker)) if v is not None}
    for role in ("active", "spare"):
        body = node_json(role=role, extra_labels=extra)
        for facts in (facts_of_dict(slim_node(body)), facts_of_v1(as_v1(body))):
            assert facts.deep_check == status
            assert (facts.is_serving, facts.is_available_spare) == ((serves, False) if role == "active"
                                                                    else (False, serves))


@pytest.mark.parametrize("ready, status_text", [
    pytest.param("True", "True", id="ready"),
    pytest.param("False", "False", id="not-ready"),
    pytest.param("Unknown", "Unknown", id="lost-contact"),
    pytest.param(None, "Unknown", id="no-ready-condition-yet"),
])
def test_ready_status_is_unknown_until_the_node_reports(ready: str | None, status_text: str) -> None:
    facts = facts_of_dict(node_json(ready=ready))
    assert (facts.ready, facts.ready_status, facts.is_ready) == (ready, status_text, ready == "True")


@pytest.mark.parametrize("label, role", [
    pytest.param("active", naming.ROLE_ACTIVE, id="active"),
    pytest.param("spare", naming.ROLE_SPARE, id="spare"),
    pytest.param(None, naming.ROLE_ACTIVE, id="no-role-label-is-active"),
])
def test_role(label: str | None, role: str) -> None:
    assert facts_of_dict(node_json(role=label)).role == role


# --------------------------------------------------------------------------- every reader agrees

def recorded_by_a_group(*nodes: dict) -> dict:
    """A group of the plan whose record holds ``nodes`` (Kueue counts only recorded nodes)."""
    return {"metadata": {"name": "g"}, "spec": {"trainingPlanRef": PLAN},
            "status": {"nodes": [{"name": n["metadata"]["name"], "uid": n["metadata"]["uid"],
                                  "nodeId": n["metadata"]["name"]} for n in nodes]}}


HEALTHY = node_json("hp-healthy")
ONLY_SAGEMAKER_UNSCHEDULABLE = node_json("hp-sagemaker-bad", sagemaker="Unschedulable")


def test_kueue_admits_onto_no_node_that_only_sagemaker_labels_unschedulable() -> None:
    cache = SimpleNamespace(block_nodes=lambda label: [slim_node(HEALTHY), slim_node(ONLY_SAGEMAKER_UNSCHEDULABLE)]
                            if label == naming.label_value(BLOCK) else [],
                            groups=lambda: [recorded_by_a_group(HEALTHY, ONLY_SAGEMAKER_UNSCHEDULABLE)])
    rt = SimpleNamespace(cache=cache, keys=KEYS)
    assert kueue_admission.ready_group_nodes(rt, PLAN, BLOCK) == 1  # the healthy node only


def test_hyperplan_status_shows_no_node_that_only_sagemaker_labels_unschedulable_serving() -> None:
    states = {node.name: node.state for _, node in (status.node_from_api(as_v1(n), KEYS.ultraserver_id)
                                                    for n in (HEALTHY, ONLY_SAGEMAKER_UNSCHEDULABLE))}
    assert states == {"hp-healthy": status.SERVING, "hp-sagemaker-bad": status.UNHEALTHY}


def test_the_plan_counts_a_node_that_only_sagemaker_labels_unschedulable_unhealthy() -> None:
    seen = [plan_observed_node(slim_node(n), KEYS) for n in (HEALTHY, ONLY_SAGEMAKER_UNSCHEDULABLE)]
    got = counts.plan_counts(total=4, configured_spares=0, nodes=seen)
    assert (got.in_use, got.unhealthy, got.available) == (1, 1, 2)


def test_the_group_judges_a_node_that_only_sagemaker_labels_unschedulable() -> None:
    check = health.HealthCheck(grace=timedelta(seconds=30))
    seen = [observe_node(as_v1(n), NOW, KEYS, lambda node, value: NOW) for n in (HEALTHY, ONLY_SAGEMAKER_UNSCHEDULABLE)]
    assert [(s.name, s.health.health_label, s.health.health_label_since) for s in seen] == [
        ("hp-healthy", None, None), ("hp-sagemaker-bad", "Unschedulable", NOW)]
    within_grace = health.evaluate_health([s.health for s in seen], check, NOW + timedelta(seconds=10))
    assert within_grace.pending == {"hp-sagemaker-bad": "NodeHealthStatus=Unschedulable"}
    after_grace = health.evaluate_health([s.health for s in seen], check, NOW + timedelta(seconds=30))
    assert (dict(after_grace.unhealthy), after_grace.healthy) == (
        {"hp-sagemaker-bad": "NodeHealthStatus=Unschedulable"}, ("hp-healthy",))


def test_the_invariants_do_not_count_a_node_that_only_sagemaker_labels_unschedulable_live() -> None:
    assert [invariants.live(n) for n in (HEALTHY, ONLY_SAGEMAKER_UNSCHEDULABLE)] == [True, False]


def test_all_readers_agree_on_one_node_that_only_sagemaker_labels_unschedulable() -> None:
    """Where the readers once disagreed, as one table: no reader lets the node serve."""
    body = ONLY_SAGEMAKER_UNSCHEDULABLE
    cache = SimpleNamespace(block_nodes=lambda label: [slim_node(body)], groups=lambda: [recorded_by_a_group(body)])
    verdicts = {
        "kueue ready nodes": kueue_admission.ready_group_nodes(SimpleNamespace(cache=cache, keys=KEYS), PLAN, BLOCK),
        "hyperplan status": status.node_from_api(as_v1(body), KEYS.ultraserver_id)[1].state,
        "plan counts": counts.plan_counts(1, 0, [plan_observed_node(slim_node(body), KEYS)]).unhealthy,
        "group health label": observe_node(as_v1(body), NOW, KEYS, lambda node, value: NOW).health.health_label,
    }
    assert verdicts == {"kueue ready nodes": 0, "hyperplan status": "unhealthy", "plan counts": 1,
                        "group health label": "Unschedulable"}
