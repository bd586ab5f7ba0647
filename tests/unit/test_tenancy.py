"""Tenancy between teams: a plan's instanceGroupSelector and a pool's trainingPlanSelector.

The selector match itself (planning.tenancy), a group its plan does not let in (decide_group:
NotAllowed, no nodes, its nodes drained; peers_of: no room taken), and a plan a pool does not let
in (the real plan pass buys elsewhere; the ledger's re-check refuses the pool's blocks whatever
offering is asked for).
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from hyperplan_testing.fakes import FakeLedger
from hyperplan.actuation.ledger import KubeLedger
from hyperplan.api.models import CapacityPool, CapacityPoolSpec, InstanceGroupStatus, LabelSelector, TrainingPlan
from hyperplan.api.vocabulary import REASON_OFFERING_UNAVAILABLE
from hyperplan.controllers.group.reconciler import bound_plan, peers_of
from hyperplan.controllers.plan.reconciler import plan_event, reconcile_plan
from hyperplan.planning.groups import Peer, decide_group
from hyperplan.planning.offerings import Block, Offering
from hyperplan.planning.policy import DEMO, SAGEMAKER
from hyperplan.planning.tenancy import Requirement, Selector, allows, selector_of
from tests.unit.fake_runtime import PLANS_PLURAL, make_world
from tests.unit.test_groups import NOW, PLAN, SPEC, conds, observed, running
from tests.unit.test_ledger_batches import P5, T, FakeKube
from tests.unit.test_plan_pass import NAME, NOW as PLAN_NOW, plan as plan_object, pools as plain_pools

TEAM_A = {"team": "a"}


# --------------------------------------------------------------------------- matching


@pytest.mark.parametrize("wire, labels, allowed", [
    pytest.param(None, {}, True, id="no-selector-lets-in-an-unlabelled-object"),
    pytest.param(None, {"team": "b"}, True, id="no-selector-lets-in-anything"),
    pytest.param({}, {"team": "b"}, True, id="empty-selector-lets-in-anything"),
    pytest.param({"matchLabels": {}, "matchExpressions": []}, {}, True, id="empty-lists-let-in-anything"),
    pytest.param({"matchLabels": {"team": "a"}}, {"team": "a", "x": "y"}, True, id="match-labels-equal"),
    pytest.param({"matchLabels": {"team": "a"}}, {"team": "b"}, False, id="match-labels-other-value"),
    pytest.param({"matchLabels": {"team": "a"}}, {}, False, id="match-labels-key-absent"),
    pytest.param({"matchLabels": {"team": "a", "tier": "x"}}, {"team": "a"}, False, id="match-labels-all-must-hold"),
    pytest.param({"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]},
                 {"team": "b"}, True, id="in-one-of-the-values"),
    pytest.param({"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]},
                 {"team": "c"}, False, id="in-none-of-the-values"),
    pytest.param({"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]},
                 {}, False, id="in-key-absent"),
    pytest.param({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]},
                 {"team": "b"}, True, id="not-in-other-value"),
    pytest.param({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]},
                 {"team": "a"}, False, id="not-in-listed-value"),
    pytest.param({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]},
                 {}, True, id="not-in-key-absent"),
    pytest.param({"matchExpressions": [{"key": "team", "operator": "Exists"}]}, {"team": ""}, True,
                 id="exists-with-empty-value"),
    pytest.param({"matchExpressions": [{"key": "team", "operator": "Exists"}]}, {}, False, id="exists-absent"),
    pytest.param({"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}, {}, True,
                 id="does-not-exist-absent"),
    pytest.param({"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}, {"team": "a"}, False,
                 id="does-not-exist-present"),
    pytest.param({"matchExpressions": [{"key": "team", "operator": "Near", "values": ["a"]}]}, {"team": "a"},
                 False, id="unknown-operator-matches-nothing"),
    pytest.param({"matchLabels": {"team": "a"},
                  "matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
                 {"team": "a", "tier": "x"}, False, id="labels-and-expressions-all-must-hold"),
])
def test_selector_matching(wire: dict | None, labels: dict, allowed: bool) -> None:
    assert allows(selector_of(wire), labels) is allowed


def test_selector_from_the_model_is_the_selector_from_the_wire() -> None:
    model = LabelSelector.model_validate({"matchLabels": {"team": "a"},
                                          "matchExpressions": [{"key": "tier", "operator": "Exists"}]})
    assert selector_of(model.wire()) == Selector((("team", "a"),), (Requirement("tier", "Exists"),))
    assert selector_of(model.wire()).describe() == "team=a,tier"


# --------------------------------------------------------------------------- groups

ONLY_TEAM_A = dataclasses.replace(PLAN, group_selector=selector_of({"matchLabels": TEAM_A}))


def decide_as(labels: dict[str, str], nodes=(), plan=ONLY_TEAM_A):
    return decide_group("w", 1, SPEC, InstanceGroupStatus(), plan, [Peer("w", SPEC.instance_count)], list(nodes), DEMO, NOW, labels=labels)


@pytest.mark.parametrize("labels", [
    pytest.param({}, id="unlabelled"),
    pytest.param({"team": "b"}, id="other-team"),
])
def test_a_group_the_plan_does_not_let_in_is_not_bound_and_gets_no_nodes(labels: dict) -> None:
    d = decide_as(labels)

    message = "training plan p allows only instance groups with labels matching team=a"
    assert d.status.phase == "Failed"
    assert conds(d) == [("Ready", "False", "NotAllowed"), ("Bound", "False", "NotAllowed")]
    assert [c.message for c in d.status.conditions] == [message, message]
    assert [(e.type, e.reason, e.message) for e in d.events] == [("Warning", "NotAllowed", message)]
    assert (d.create, d.update, d.drain, d.remediation) == ([], [], [], ())


def test_a_group_the_plan_lets_in_binds_as_without_a_selector() -> None:
    allowed = decide_as(TEAM_A)
    unselective = decide_as({}, plan=PLAN)

    assert allowed.status.phase == unselective.status.phase == "Provisioning"
    assert [n.name for n in allowed.create] == [n.name for n in unselective.create] != []
    assert "Bound" not in [c.type for c in allowed.status.conditions]


def test_nodes_of_a_group_no_longer_let_in_drain_at_once() -> None:
    d = decide_as({"team": "b"}, observed(running()))

    assert d.status.phase == "Draining"
    assert d.drain and {(x.deadline, x.reason) for x in d.drain} == {(NOW, "NotAllowed")}
    assert d.create == []


def group(name: str, labels: dict[str, str], created: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels, "creationTimestamp": created},
            "spec": {"trainingPlanRef": "p", "instanceCount": 4}}


def test_a_group_the_plan_does_not_let_in_takes_no_room() -> None:
    groups = [group("intruder", {"team": "b"}, "2026-01-01T00:00:00Z"), group("mine", TEAM_A, "2026-01-02T00:00:00Z")]

    assert [p.name for p in peers_of(groups, "p", ONLY_TEAM_A.group_selector)] == ["mine"]
    assert [p.name for p in peers_of(groups, "p")] == ["intruder", "mine"]


def test_bound_plan_carries_the_plans_selector() -> None:
    body = plan_object(instanceGroupSelector={"matchExpressions": [{"key": "team", "operator": "In",
                                                                      "values": ["a"]}]})
    body["metadata"]["name"] = "p"
    selector = bound_plan(TrainingPlan.model_validate(body)).group_selector

    assert selector is not None and selector.matches(TEAM_A) and not selector.matches({"team": "b"})
    assert bound_plan(TrainingPlan.model_validate(plan_object())).group_selector is None


# --------------------------------------------------------------------------- pools


def team_pools(team: str) -> list[CapacityPool]:
    """pool-a (use1-az1, the first offered) lets in only plans of ``team``; pool-b every plan."""
    first, second = plain_pools()
    restricted = CapacityPool(metadata=first.metadata, spec=CapacityPoolSpec(
        instance_type=P5, availability_zone="use1-az1", instance_count=8,
        training_plan_selector=LabelSelector(match_labels={"team": team})))
    return [restricted, second]


@pytest.mark.parametrize("plan_labels, bought_from", [
    pytest.param({"team": "b"}, "pool-b", id="other-team-buys-from-the-open-pool"),
    pytest.param({}, "pool-b", id="unlabelled-plan-buys-from-the-open-pool"),
    pytest.param(TEAM_A, "pool-a", id="the-pools-team-buys-from-it"),
])
def test_a_plan_sees_no_offerings_from_a_pool_that_does_not_let_it_in(
        monkeypatch: pytest.MonkeyPatch, plan_labels: dict, bought_from: str) -> None:
    body = plan_object(autoPurchase=False)
    body["metadata"]["labels"] = plan_labels
    world = make_world(monkeypatch, PLAN_NOW, SAGEMAKER, plans=[body], pools=team_pools("a"))
    try:
        world.run(reconcile_plan, NAME)
        offerings = world.kube.objects[(PLANS_PLURAL, NAME)]["status"]["offerings"]
    finally:
        world.close()

    pools_offered = {b["capacityPool"] for o in offerings for b in o["blocks"]}
    assert offerings and bought_from in pools_offered
    assert ("pool-a" in pools_offered) is (bought_from == "pool-a")


def pool_body(name: str, selector: dict | None) -> dict[str, Any]:
    spec = {"instanceType": P5, "availabilityZone": "use1-az1", "instanceCount": 8}
    if selector is not None:
        spec["trainingPlanSelector"] = selector
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "CapacityPool",
            "metadata": {"name": name, "resourceVersion": "1"}, "spec": spec, "status": {"reservations": []}}


FROM_POOL_A = Offering.from_blocks([Block("pool-a", "use1-az1", P5, 1, T, T + timedelta(days=1))])


@pytest.mark.parametrize("plan_labels, ok", [
    pytest.param({"team": "b"}, False, id="other-team-refused"),
    pytest.param(None, False, id="no-labels-refused"),
    pytest.param(TEAM_A, True, id="the-pools-team-buys"),
])
def test_the_ledger_recheck_refuses_a_block_from_a_pool_that_does_not_let_the_plan_in(
        plan_labels: dict | None, ok: bool) -> None:
    kube = FakeKube()
    kube.pools["pool-a"] = pool_body("pool-a", {"matchLabels": TEAM_A})
    result = KubeLedger(kube).purchase("p", "uid-p", FROM_POOL_A, SAGEMAKER, T - timedelta(days=1), plan_labels)

    assert result.ok is ok
    if not ok:
        assert result.violation.reason == REASON_OFFERING_UNAVAILABLE
        assert "pool-a" in result.violation.message
        assert [s.name for s in result.pools] == []  # nothing to search again in
        assert kube.writes == []
    else:
        assert kube.writes == [("pool-a", 1)]


def test_the_fake_ledger_refuses_it_too() -> None:
    fake = FakeLedger(pool_objects=[CapacityPool.model_validate(pool_body("pool-a", {"matchLabels": TEAM_A}))])

    refused = fake.purchase("p", "uid-p", FROM_POOL_A, SAGEMAKER, T - timedelta(days=1), {"team": "b"})
    bought = fake.purchase("p", "uid-p", FROM_POOL_A, SAGEMAKER, T - timedelta(days=1), TEAM_A)

    assert (refused.ok, bought.ok) == (False, True)


class RecordingQueue:
    def __init__(self) -> None:
        self.woken: list[tuple[str, str]] = []

    def start(self) -> None:
        pass

    def wake(self, kind: str, name: str) -> None:
        self.woken.append((kind, name))


def plan_seen(labels: dict[str, str]) -> dict[str, Any]:
    """A plan's watch event body whose status is the last pass's (no spec change)."""
    return {"metadata": {"name": NAME, "generation": 1, "labels": labels}, "status": {"observedGeneration": 1}}


@pytest.mark.parametrize("before, after, unbought, wakes", [
    pytest.param({"team": "b"}, TEAM_A, True, True, id="unbought-relabelled-searches-again"),
    pytest.param({}, TEAM_A, True, True, id="unbought-labelled-searches-again"),
    pytest.param(TEAM_A, TEAM_A, True, False, id="unbought-same-labels-no-pass"),
    pytest.param({"team": "b"}, TEAM_A, False, False, id="bought-relabelled-no-pass"),
])
def test_a_relabelled_plan_not_bought_yet_searches_again(before: dict, after: dict, unbought: bool,
                                                         wakes: bool) -> None:
    rt = SimpleNamespace(queue=RecordingQueue(), unbought_plans={NAME} if unbought else set(), plan_labels={}, plan_generations={})
    plan_event(rt, NAME, "MODIFIED", plan_seen(before))  # the first event seen: remembered, no pass
    plan_event(rt, NAME, "MODIFIED", plan_seen(after))

    assert rt.queue.woken == ([("plan", NAME)] if wakes else [])
