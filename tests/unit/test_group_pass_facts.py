"""The group's decision is final: what bounds its creates besides the group and its nodes
(``planning.groups.PassFacts``) goes into ``decide_group``, and the controller applies the result as
it is. A table over ``bounded_by``, and one pass through ``decide_group`` itself."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hyperplan.api.models import Condition, GroupNode, InstanceGroupStatus
from hyperplan.planning.groups import (
    FINALIZER_WAIT, REASON_LAUNCH_TIMEOUT, REASON_SLOT_NOT_WANTED, GroupDecision, PassFacts, bounded_by,
)
from hyperplan.planning.placement import NodeSpec

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)
LATER = NOW + timedelta(minutes=5)


def spec(name: str, ultraserver: str | None = None) -> NodeSpec:
    return NodeSpec(name, {}, (), "active", ultraserver, "ml.p5.48xlarge", "us-east-1a")


def entry(node_id: str) -> GroupNode:
    return GroupNode(name=node_id, uid="", node_id=node_id)


UNRECORDED = Condition(type="UnrecordedNodes", status="True", reason="NodeNotOwned", message="stray-0")


def wanted(*names: str, ultraserver: str | None = None) -> GroupDecision:
    return GroupDecision(status=InstanceGroupStatus(phase="Provisioning", conditions=[]),
                         create=[spec(n, ultraserver) for n in names], wake_at=LATER)


@pytest.mark.parametrize("facts, creates, wake, launching, let_go", [
    pytest.param(PassFacts(), ["g-0", "g-1"], LATER, [], [], id="nothing-bounds-it"),
    pytest.param(PassFacts(finalizer_held=False), [], NOW + FINALIZER_WAIT, [], [],
                 id="no-finalizer-no-create-look-again-in-a-second"),
    pytest.param(PassFacts(names_taken=frozenset({"g-1"})), ["g-0"], LATER, [], [], id="a-name-taken-is-not-made"),
    pytest.param(PassFacts(launching=(entry("g-1"),)), ["g-0"], LATER, ["g-1"], [],
                 id="a-launching-claim-keeps-its-slot"),
    pytest.param(PassFacts(launching=(entry("g-7"),)), ["g-0", "g-1"], LATER, [],
                 [("g-7", REASON_SLOT_NOT_WANTED)], id="a-claim-of-a-slot-not-wanted-is-let-go"),
    pytest.param(PassFacts(expired=(entry("g-1"),)), ["g-0", "g-1"], LATER, [],
                 [("g-1", REASON_LAUNCH_TIMEOUT)], id="an-expired-claim-is-let-go-and-its-slot-made-again"),
    pytest.param(PassFacts(finalizer_held=False, launching=(entry("g-1"),)), [], NOW + FINALIZER_WAIT, [],
                 [("g-1", REASON_SLOT_NOT_WANTED)], id="no-finalizer-wants-no-slot"),
])
def test_pass_facts_bound_the_creates(facts, creates, wake, launching, let_go) -> None:
    decided = bounded_by(wanted("g-0", "g-1"), facts, NOW)
    assert [s.name for s in decided.create] == creates
    assert decided.wake_at == wake
    assert [e.node_id for e in decided.launching] == launching
    assert [(e.node_id, why) for e, why in decided.let_go] == let_go


@pytest.mark.parametrize("bound, expected", [
    pytest.param(None, [{}, {}], id="not-a-static-group"),
    pytest.param({"us-0": "cloud-a"}, [{"us-0": "cloud-a"}, {"us-0": "cloud-a"}], id="static-lends-from-its-cloud"),
])
def test_a_static_groups_creates_carry_their_cloud_ultraservers(bound, expected) -> None:
    decided = bounded_by(wanted("g-0", "g-1", ultraserver="us-0"), PassFacts(cloud_ultraservers=bound), NOW)
    assert [dict(s.cloud_ultraservers) for s in decided.create] == expected


def test_the_unrecorded_condition_joins_the_status_and_the_decision_given_is_untouched() -> None:
    given = wanted("g-0")
    decided = bounded_by(given, PassFacts(unrecorded=UNRECORDED, names_taken=frozenset({"g-0"})), NOW)
    assert decided.status.conditions == [UNRECORDED]
    assert decided.create == []
    assert given.status.conditions == [] and [s.name for s in given.create] == ["g-0"]
