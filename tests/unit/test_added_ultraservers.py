"""An UltraServer bought from the pool for the rest of a block, when one of the block's UltraServers
failed and the block has no free one: its own ledger line folded into its block, the
plan's pure choice of what to buy from what the groups want and what the plan itself sees, the
plan's status, the ledger's write, and the invariants that check ledger against status."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hyperplan_testing import invariants
from hyperplan_testing.fakes import FakeLedger
from hyperplan.actuation.ledger import KubeLedger, blocks_of
from hyperplan.api.models import (
    CapacityPool, Reservation, TrainingPlanSpec, TrainingPlanStatus, UltraServerStatus, UltraServerWanted,
)
from hyperplan.runtime.store import GROUPS, NODES, PLANS, POOLS, WatchCache
from hyperplan.planning import placement
from hyperplan.planning.blocks import Block, with_additions
from hyperplan.planning.offerings import ULTRASERVER_INSTANCE_TYPE, RuleViolation
from hyperplan.planning.plans import (
    PlanDecision, PlanUsage, addition_refused, decide_plan, ultraserver_to_buy,
)
from hyperplan.planning.policy import DEMO
from tests.unit.test_ledger_batches import FakeKube

UTC = timezone.utc
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
END = T0 + timedelta(minutes=30)
NOW = T0 + timedelta(minutes=5, microseconds=250)
X72 = "ml.u-p6e-gb200x72"
UID = "uid-llama"
BLOCK = Block("pool-u", "use1-az3", ULTRASERVER_INSTANCE_TYPE, 18, T0, END, X72, id="rc-llama-0")
US0, US1 = (placement.ultraservers_for_block(BLOCK.id, X72, 36, 1)[i].id for i in (0, 1))
ADDED = Block("pool-u", "use1-az3", ULTRASERVER_INSTANCE_TYPE, 18, NOW.replace(microsecond=0), END, X72,
              id="rc-llama-0-r0", adds_to=BLOCK.id, in_place_of=US0)
SPEC = TrainingPlanSpec(ultra_server_type=X72, ultra_server_count=1, target_resource="hyperpod-cluster", duration="30m")


def line(block: Block, plan: str = "llama", uid: str = UID) -> dict:
    return block.to_reservation(plan, uid).wire()


def pool_obj(count: int = 36, lines: list[dict] | None = None, **spec) -> dict:
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "CapacityPool",
            "metadata": {"name": "pool-u", "resourceVersion": "1"},
            "spec": {"instanceType": ULTRASERVER_INSTANCE_TYPE, "availabilityZone": "use1-az3", "instanceCount": count,
                     "ultraServerType": X72, **spec},
            "status": {"reservations": lines if lines is not None else [line(BLOCK)]}}


# --------------------------------------------------------------------------- the ledger line, folded


def test_an_added_ultraserver_is_no_block_of_its_own_but_part_of_the_one_it_adds_to():
    stray = Block("pool-u", "use1-az3", ULTRASERVER_INSTANCE_TYPE, 18, NOW, END, X72, id="x-r0", adds_to="gone")
    [folded] = with_additions([BLOCK, ADDED, stray])
    assert folded.additions == (ADDED,) and folded.instances_with_additions == 36
    assert folded.instance_count == 18  # what was bought with the plan stays what it was

    shown = folded.to_reserved(END - timedelta(seconds=20), "Active").wire()
    assert shown["instanceCount"] == 18 and shown["ultraServerCount"] == 1
    assert shown["addedUltraServers"] == [{"id": "rc-llama-0-r0", "startTime": "2026-12-01T12:05:00Z",
                                           "instanceCount": 18, "inPlaceOf": US0}]
    assert "addedUltraServers" not in BLOCK.to_reserved(END, "Active").wire()  # none: not written at all


def test_the_ledger_and_the_watch_cache_fold_an_added_ultraserver_alike():
    raw = pool_obj(lines=[line(BLOCK), line(ADDED)])
    pools = [CapacityPool.model_validate(raw)]
    cache = WatchCache()
    cache.bind({PLANS: {}, POOLS: {"pool-u": [raw]}, GROUPS: {}, NODES: {}})
    assert blocks_of(pools, UID) == cache.blocks_of(UID) == [BlockWith(BLOCK, ADDED)]
    # The pool counts the added line as busy from its start: 36 taken at NOW, 18 before it.
    [snapshot] = cache.pool_snapshots()
    from hyperplan.planning.offerings import busy_at
    assert (busy_at(snapshot, T0 + timedelta(minutes=1)), busy_at(snapshot, NOW)) == (18, 36)


def BlockWith(block: Block, *added: Block) -> Block:  # noqa: N802 - reads as a value
    from dataclasses import replace
    return replace(block, additions=added)


# --------------------------------------------------------------------------- what the plan buys


def report(us: str, *, in_use: int = 17, health: str = "ok", replaced_by: str | None = None) -> UltraServerStatus:
    return UltraServerStatus(id=us, availability_zone="use1-az3", total_instance_count=18, in_use_instance_count=in_use,
                             health_status=health, replaced_by=replaced_by)


WANT = UltraServerWanted(reserved_capacity_id=BLOCK.id, failed=US0, since=NOW - timedelta(seconds=3))
IMPAIRED = (report(US0, health="impaired"),)


@pytest.mark.parametrize("block, reports, wanted, now, expected", [
    pytest.param(BLOCK, IMPAIRED, [WANT], NOW, ADDED, id="impaired-and-wanted-buys-one-for-the-rest-of-the-block"),
    pytest.param(BLOCK, IMPAIRED, [], NOW, None, id="no-group-wants-one"),
    pytest.param(BLOCK, (report(US0),), [WANT], NOW, None, id="the-plan-sees-it-healthy"),
    pytest.param(BLOCK, IMPAIRED, [WANT.model_copy(update={"reserved_capacity_id": "rc-other-0"})], NOW, None,
                 id="another-block"),
    pytest.param(BLOCK, IMPAIRED, [WANT.model_copy(update={"failed": "rc-llama-0-us-9"})], NOW, None,
                 id="not-an-ultraserver-of-the-block"),
    pytest.param(BLOCK, (report(US0, health="impaired", replaced_by=US1), report(US1)), [WANT], NOW, None,
                 id="replaced-already"),
    pytest.param(BlockWith(BLOCK, ADDED), (report(US0, health="impaired"), report(US1, in_use=17)), [WANT], NOW,
                 None, id="bought-for-it-before"),
    pytest.param(BLOCK, (*IMPAIRED, report(US1, in_use=0)), [WANT], NOW, None,
                 id="a-free-ultraserver-the-group-moves-to"),
    pytest.param(BLOCK, (*IMPAIRED, report(US1, in_use=0, health="impaired")), [WANT], NOW, ADDED,
                 id="an-empty-but-impaired-one-is-not-free"),
    pytest.param(BLOCK, IMPAIRED, [WANT], END - timedelta(seconds=10), None, id="past-the-termination-time"),
])
def test_what_the_plan_buys(block, reports, wanted, now, expected):
    usage = PlanUsage(ultra_servers=tuple(reports), wanted=tuple(wanted))
    bought = ultraserver_to_buy(block, END - timedelta(seconds=20), usage, now)
    assert bought == expected


def test_the_oldest_wanted_first_and_each_id_names_the_failed_ultraserver():
    two = Block("pool-u", "use1-az3", ULTRASERVER_INSTANCE_TYPE, 36, T0, END, X72, id=BLOCK.id)
    usage = PlanUsage(ultra_servers=(report(US0, health="impaired"), report(US1, health="impaired")), wanted=(
        WANT, UltraServerWanted(reserved_capacity_id=BLOCK.id, failed=US1, since=NOW - timedelta(seconds=9))))
    bought = ultraserver_to_buy(two, END - timedelta(seconds=20), usage, NOW)
    assert (bought.id, bought.in_place_of) == (f"{BLOCK.id}-r1", US1)


def test_the_plan_decides_to_buy_then_shows_the_added_ultraserver():
    usage = PlanUsage(ultra_servers=IMPAIRED, wanted=(WANT,))
    d = decide_plan(SPEC, 1, TrainingPlanStatus(), [BLOCK], [], DEMO, NOW, usage)
    assert d.add_ultraserver == ADDED
    assert "UltraServerAdded" not in [c.type for c in d.status.conditions]

    after = decide_plan(SPEC, 1, d.status, with_additions([BLOCK, ADDED]), [], DEMO, NOW, usage)
    assert after.add_ultraserver is None  # bought for US 0 already
    assert (after.status.total_instance_count, after.status.total_ultra_server_count) == (36, 2)
    # Both UltraServers keep a configured spare (the usage here counts no node in use): 36 - 2.
    assert after.status.available_instance_count == 36 - 2
    [cond] = [c for c in after.status.conditions if c.type == "UltraServerAdded"]
    assert (cond.status, cond.reason) == ("True", "UltraServerAdded")
    assert f"UltraServer {US1} bought from pool pool-u for the rest of block {BLOCK.id}" in cond.message
    assert f"in place of {US0}" in cond.message
    assert after.status.reserved_capacity[0].added_ultra_servers[0].id == ADDED.id


def test_a_refusal_is_a_condition_and_one_warning_and_stands_while_it_is_still_wanted():
    usage = PlanUsage(ultra_servers=IMPAIRED, wanted=(WANT,))
    d = decide_plan(SPEC, 1, TrainingPlanStatus(), [BLOCK], [], DEMO, NOW, usage)
    refused = addition_refused(d, 1, TrainingPlanStatus(), ADDED, RuleViolation("OfferingUnavailable", "no room"), NOW)
    [cond] = [c for c in refused.status.conditions if c.type == "UltraServerAdded"]
    assert (cond.status, cond.reason) == ("False", "NoUltraServerInPool") and "no room" in cond.message
    assert [(e.type, e.reason) for e in refused.events][-1:] == [("Warning", "NoUltraServerInPool")]

    again = addition_refused(PlanDecision(status=refused.status), 1, refused.status, ADDED,
                             RuleViolation("OfferingUnavailable", "no room"), NOW + timedelta(seconds=5))
    assert again.events == [] and again.status.conditions[-1].last_transition_time == cond.last_transition_time
    # The group found its way meanwhile (nothing wanted any more): the refusal goes.
    calm = decide_plan(SPEC, 1, refused.status, [BLOCK], [], DEMO, NOW, PlanUsage(ultra_servers=IMPAIRED))
    assert "UltraServerAdded" not in [c.type for c in calm.status.conditions]


# --------------------------------------------------------------------------- the ledger's write


def test_the_ledger_adds_the_line_once_and_rechecks_after_a_conflict():
    kube = FakeKube()
    kube.pools["pool-u"] = pool_obj()
    ledger = KubeLedger(kube)
    kube.conflicts_left = 1
    result = ledger.add_ultraserver("llama", UID, ADDED)
    assert result.ok, result.violation
    assert result.blocks == (BlockWith(BLOCK, ADDED),)
    assert [r["reservedCapacityId"] for r in kube.pools["pool-u"]["status"]["reservations"]] == [BLOCK.id, ADDED.id]
    assert Reservation.model_validate(kube.pools["pool-u"]["status"]["reservations"][1]).adds_to == BLOCK.id
    writes = len(kube.writes)
    assert ledger.add_ultraserver("llama", UID, ADDED).ok  # a retry writes nothing
    assert len(kube.writes) == writes


@pytest.mark.parametrize("pool, why", [
    pytest.param(pool_obj(count=18), "has no room for 18 more instances", id="the-pool-is-full"),
    pytest.param(pool_obj(lines=[line(BLOCK), line(Block("pool-u", "use1-az3", ULTRASERVER_INSTANCE_TYPE, 18,
                                                        END - timedelta(minutes=1), END + timedelta(minutes=5), X72,
                                                        id="rc-rival-0"), "rival", "uid-rival")]),
                 "has no room", id="sold-before-the-block-ends"),
    pytest.param(pool_obj(lines=[]), f"block {BLOCK.id} is no longer in the ledger", id="the-block-is-gone"),
    pytest.param(pool_obj(trainingPlanSelector={"matchLabels": {"team": "other"}}), "no longer sells to this plan",
                 id="the-pool-no-longer-sells-to-the-plan"),
    pytest.param({**pool_obj(), "spec": {"instanceType": ULTRASERVER_INSTANCE_TYPE, "availabilityZone": "use1-az3",
                                         "ultraServerType": X72,
                                         "source": {"sageMaker": {"region": "us-east-1"}}}},
                 "a pool's own ledger only", id="a-remote-pool"),
])
def test_the_ledger_refuses_an_ultraserver_it_cannot_add(pool, why):
    kube = FakeKube()
    kube.pools["pool-u"] = pool
    before = list(pool["status"]["reservations"])
    result = KubeLedger(kube).add_ultraserver("llama", UID, ADDED, {"team": "llama"})
    assert result.violation is not None and why in result.violation.message, result.violation
    assert kube.pools["pool-u"]["status"]["reservations"] == before and kube.writes == []


def test_the_fake_ledger_adds_as_the_real_one_does():
    fake = FakeLedger(pool_objects=[CapacityPool.model_validate(pool_obj())])
    assert fake.add_ultraserver("llama", UID, ADDED).blocks == (BlockWith(BLOCK, ADDED),)
    assert fake.add_ultraserver("llama", UID, ADDED).ok and len(fake.pool_objects[0].status.reservations) == 2
    full = FakeLedger(pool_objects=[CapacityPool.model_validate(pool_obj(count=18))])
    assert not full.add_ultraserver("llama", UID, ADDED).ok


# --------------------------------------------------------------------------- the invariants


def test_the_ledger_and_the_status_agree_with_an_added_ultraserver_and_it_is_no_second_purchase():
    folded = BlockWith(BLOCK, ADDED)
    plan = {"metadata": {"name": "llama", "uid": UID},
            "status": {"reservedCapacity": [folded.to_reserved(END - timedelta(seconds=20), "Active").wire()]}}
    pool = pool_obj(lines=[line(BLOCK), line(ADDED)])
    assert invariants.ledger_mismatches([plan], [pool], NOW) == []
    without = {"metadata": plan["metadata"],
               "status": {"reservedCapacity": [BLOCK.to_reserved(END - timedelta(seconds=20), "Active").wire()]}}
    assert invariants.ledger_mismatches([without], [pool], NOW) != []  # the status must show it

    history = invariants.PurchaseHistory()
    assert history.plan(without) == [] and history.plan(plan) == []


# --------------------------------------------------------------------------- a field a status no longer sets


@pytest.mark.parametrize("desired, current, keep, patch", [
    pytest.param({"phase": "Expired"}, {"phase": "Active", "nextTransitionTime": "t"}, (),
                 {"phase": "Expired", "nextTransitionTime": None}, id="a-dropped-field-is-nulled"),
    pytest.param({"phase": "Ready"}, {"phase": "Ready", "nodes": []}, ("nodes",), {"phase": "Ready"},
                 id="a-kept-field-is-left-alone"),
    pytest.param({"a": 1}, {}, (), {"a": 1}, id="nothing-to-clear"),
])
def test_the_status_patch_clears_what_the_status_no_longer_sets(desired, current, keep, patch):
    from hyperplan.runtime.context import status_patch
    assert status_patch(desired, current, keep) == patch


def test_a_plan_past_its_last_block_loses_its_next_transition_time_on_the_api_server(monkeypatch):
    """A merge patch leaves an absent key as it was: the pass nulls what the status no longer sets."""
    from hyperplan.controllers.plan.reconciler import reconcile_plan
    from tests.unit.fake_runtime import PLANS_PLURAL, make_world
    pool = CapacityPool.model_validate(pool_obj())
    body = {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "TrainingPlan",
            "metadata": {"name": "llama", "uid": UID, "generation": 1,
                         "finalizers": ["hyperplan.dev/release-reservations"]},
            "spec": SPEC.wire(), "status": {"phase": "Active", "nextTransitionTime": "2026-12-01T12:29:40Z",
                                            "observedGeneration": 1}}
    world = make_world(monkeypatch, END + timedelta(minutes=1), DEMO, plans=[body], pools=[pool])
    try:
        world.run(reconcile_plan, "llama")
        [patch] = world.status_patches(PLANS_PLURAL)
        assert patch["phase"] == "Expired" and patch["nextTransitionTime"] is None
        stored = world.kube.objects[(PLANS_PLURAL, "llama")]["status"]
        assert "nextTransitionTime" not in stored
    finally:
        world.close()
