"""The real group pass of a karpenter group whose NodeClaims cannot launch, against the recording
fakes (Karpenter played by the test: hyperplan_testing.fakes.FakeKarpenterProvider ``fail``,
``node_class_cause``): the group says why (``NodesLaunched=False`` with Karpenter's reason, one
Warning per cause, the metric), makes no claim while its node class is missing or its zone is not
offered, and makes a claim Karpenter deleted again only after the backoff. The block, times and
group are tests/unit/test_group_pass.py's (zone use1-az3, a group of 2 active nodes and a spare)."""

from __future__ import annotations

import json
from datetime import timedelta

from hyperplan import metrics
from hyperplan.api.vocabulary import (
    CONDITION_NODES_LAUNCHED, REASON_CLAIM_DELETED, REASON_NODE_CLASS_NOT_FOUND, REASON_NOT_OFFERED, ULTRASERVER_INSTANCE_TYPE,
)
from hyperplan.planning.ownership import LAUNCH_BACKOFF_FIRST, LAUNCH_RECHECK, LaunchCause
from hyperplan_dev import karpenter as plane_karpenter
from tests.unit.fake_runtime import GROUPS_PLURAL
from tests.unit.test_group_pass import GROUP, T0, group, run as one_pass, worlds  # noqa: F401 (the fixture)
from tests.unit.test_karpenter_pass import claims_by_slot, record

S = timedelta(seconds=1)
NO_CLASS = LaunchCause(REASON_NODE_CLASS_NOT_FOUND, "KWOKNodeClass default (karpenter.kwok.sh) does not exist")


def run(world):
    """One pass; the events of every pass kept in ``world.posted`` (each pass empties ``world.events``)."""
    wake = one_pass(world)
    world.__dict__.setdefault("posted", []).extend(world.events)
    return wake


def launched(world) -> dict | None:
    conditions = (world.kube.objects[(GROUPS_PLURAL, GROUP)].get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == CONDITION_NODES_LAUNCHED), None)


def counted(reason: str) -> float:
    return metrics.KARPENTER_LAUNCH_FAILURES.labels(reason)._value.get()


def warnings(world, reason: str) -> list[str]:
    return [m for _, kind, r, m in world.posted if kind == "Warning" and r == reason]


def test_a_missing_node_class_stops_every_claim_until_it_is_created(worlds) -> None:
    world = worlds(group(nodeProvider="karpenter"))
    world.karpenter.node_class_cause = NO_CLASS
    before = counted(REASON_NODE_CLASS_NOT_FOUND)
    world.now = T0
    wake = run(world)
    assert world.karpenter.claims == {} and record(world) == []  # no claim, no intent
    c = launched(world)
    assert (c["status"], c["reason"]) == ("False", REASON_NODE_CLASS_NOT_FOUND) and NO_CLASS.message in c["message"]
    assert wake == T0 + LAUNCH_RECHECK  # it looks again: no event says when a node class is made
    world.now = T0 + LAUNCH_RECHECK
    run(world)
    assert world.karpenter.claims == {}
    assert len(warnings(world, REASON_NODE_CLASS_NOT_FOUND)) == 1  # once per cause, not per look
    assert counted(REASON_NODE_CLASS_NOT_FOUND) == before + 1
    world.karpenter.node_class_cause = None  # the node class is created
    world.now = T0 + 2 * LAUNCH_RECHECK
    run(world)
    assert len(claims_by_slot(world)) == 3 and launched(world) is None


def test_a_zone_karpenter_does_not_offer_makes_no_claim(worlds, tmp_path) -> None:
    types = tmp_path / "instance-types.json"
    types.write_text(json.dumps(plane_karpenter.instance_types((ULTRASERVER_INSTANCE_TYPE,), ("us-east-1a",))))
    world = worlds(group(nodeProvider="karpenter"))
    world.rt.settings = world.rt.settings.model_copy(update={"karpenter_instance_types_file": str(types)})
    world.now = T0
    run(world)
    assert world.karpenter.claims == {}
    c = launched(world)
    assert c["reason"] == REASON_NOT_OFFERED and "only in us-east-1a, not in zone use1-az3" in c["message"]
    assert len(warnings(world, REASON_NOT_OFFERED)) == 1
    # Karpenter restarted with the zone in its file: the next look makes the claims.
    types.write_text(json.dumps(plane_karpenter.instance_types((ULTRASERVER_INSTANCE_TYPE,), ("us-east-1a", "use1-az3"))))
    import os
    os.utime(types, ns=(1, 10**18))
    world.now = T0 + LAUNCH_RECHECK
    run(world)
    assert len(claims_by_slot(world)) == 3 and launched(world) is None


def test_claims_karpenter_deletes_are_made_again_with_backoff_then_launch(worlds) -> None:
    world = worlds(group(nodeProvider="karpenter"))
    world.now = T0
    run(world)
    first = dict(world.karpenter.claims)
    before = counted(REASON_CLAIM_DELETED)
    for name in first:
        world.karpenter.fail(name, delete=True)  # as Karpenter deletes a claim it has no capacity for
    world.now = T0 + S
    wake = run(world)
    assert world.karpenter.claims == {}  # not made again at once
    assert wake == T0 + S + LAUNCH_BACKOFF_FIRST
    c = launched(world)
    assert c["reason"] == REASON_CLAIM_DELETED and "deleted before it launched" in c["message"]
    assert "(backoff 5s)" in c["message"]
    assert counted(REASON_CLAIM_DELETED) == before + 3  # each claim once
    world.now = T0 + 3 * S
    run(world)
    assert world.karpenter.claims == {}  # still backing off
    world.now = T0 + S + LAUNCH_BACKOFF_FIRST
    run(world)
    second = dict(world.karpenter.claims)
    assert len(second) == 3 and not set(second) & set(first)
    for name in second:  # deleted again: the backoff doubles, no second Warning
        world.karpenter.fail(name, delete=True)
    world.now += S
    wake = run(world)
    assert wake == world.now + 2 * LAUNCH_BACKOFF_FIRST and "(backoff 10s)" in launched(world)["message"]
    assert len(warnings(world, REASON_CLAIM_DELETED)) == 1
    world.now += 2 * LAUNCH_BACKOFF_FIRST
    run(world)
    for name in world.karpenter.claims:  # the cause fixed: they launch and register
        world.karpenter.register(name, ready_since=world.now)
    world.now += S
    run(world)
    status = world.kube.objects[(GROUPS_PLURAL, GROUP)]["status"]
    assert (status["phase"], status["readyCount"]) == ("Ready", 2) and launched(world) is None


def test_a_claim_karpenter_retries_shows_its_reason_and_keeps_its_slot(worlds) -> None:
    world = worlds(group(nodeProvider="karpenter"))
    world.now = T0
    run(world)
    name = sorted(world.karpenter.claims)[0]
    world.karpenter.fail(name, "LaunchFailed", "translating nodeclaim to node, instance type not found")
    world.now = T0 + S
    run(world)
    assert name in world.karpenter.claims and len(world.karpenter.claims) == 3  # not deleted, nothing doubled
    c = launched(world)
    assert c["reason"] == "LaunchFailed" and f"NodeClaim {name}: translating nodeclaim" in c["message"]
    world.now = T0 + 2 * S
    run(world)
    assert len(warnings(world, "LaunchFailed")) == 1
