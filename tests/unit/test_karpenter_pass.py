"""The real group pass for ``nodeProvider: karpenter`` against recording fakes: Karpenter is
played by the test (hyperplan_testing.fakes.FakeKarpenterProvider: ``launch``, ``register``). The block
and times are tests/unit/test_group_pass.py's: the demo policy, two x72 UltraServers from T0 to
T0 + 3 min, a group of 2 active nodes and their UltraServer's spare."""

from __future__ import annotations

from datetime import timedelta

import pytest

from hyperplan.controllers.group.reconciler import LAUNCH_POLL, drain_group
from tests.unit.fake_runtime import GROUPS_PLURAL
from tests.unit.test_group_pass import (  # noqa: F401 (the fixture)
    ACTIVE, GRACE, GROUP, LADDER, NOW, SPARE, T0, TERMINATION, group, patches, run, set_ready, worlds,
)

SLOTS = sorted([*ACTIVE, SPARE])


def record(world) -> list[dict]:
    return (world.kube.objects[(GROUPS_PLURAL, GROUP)].get("status") or {}).get("nodes") or []


def claims_by_slot(world) -> dict[str, str]:
    return {c["metadata"]["labels"]["hyperplan.dev/node-id"]: name for name, c in world.karpenter.claims.items()}


def registered(worlds, **spec):
    """A karpenter group whose claims Karpenter launched at the block start, its Nodes Ready since
    then, tied to their claims by the pass at NOW."""
    world = worlds(group(nodeProvider="karpenter", **spec))
    world.now = T0
    run(world)
    for name in world.karpenter.claims:
        world.karpenter.register(name, ready_since=T0)
    world.now = NOW
    run(world)
    return world


def started(worlds):
    """A karpenter group's first pass at the block start: its claims made."""
    world = worlds(group(nodeProvider="karpenter"))
    world.now = T0
    wake = run(world)
    return world, wake


def test_the_block_start_makes_one_claim_per_slot_and_no_node(worlds) -> None:
    world, wake = started(worlds)
    assert sorted(claims_by_slot(world)) == SLOTS
    assert world.provider.nodes == {}  # Karpenter makes the Nodes, not hyperplan
    entries = record(world)
    assert sorted(e["nodeId"] for e in entries) == SLOTS
    assert all(e["uid"] == "" and e["nodeClaim"]["uid"].startswith("uid-") for e in entries)
    assert wake == T0 + LAUNCH_POLL  # no event comes for a claim: it looks again
    assert world.reasons().count("NodeClaimCreated") == 3


def test_registered_nodes_are_tied_to_their_claims_and_the_group_is_ready(worlds) -> None:
    world, _ = started(worlds)
    for name in world.karpenter.claims:
        world.karpenter.register(name, ready_since=T0)
    world.now = NOW
    run(world)
    entries = {e["nodeId"]: e for e in record(world)}
    for slot, claim in claims_by_slot(world).items():
        assert (entries[slot]["name"], entries[slot]["uid"]) == (f"kwok-{claim}", f"uid-kwok-{claim}")
    status = world.kube.objects[(GROUPS_PLURAL, GROUP)]["status"]
    assert (status["phase"], status["readyCount"], status["spareCount"]) == ("Ready", 2, 1)
    assert "NodeNotOwned" not in world.reasons()
    world.karpenter.calls.clear()
    run(world)
    assert ("list_claims", GROUP) not in world.karpenter.calls  # nothing waits on a claim: none listed


def test_a_node_made_before_karpenter_wrote_the_claims_status_is_not_reported(worlds) -> None:
    world, _ = started(worlds)
    name = claims_by_slot(world)[SPARE]
    node = world.karpenter.register(name, ready_since=T0)
    del world.karpenter.claims[name]["status"]  # the Node is there; the claim's status not written yet
    world.now = T0 + timedelta(seconds=1)
    run(world)
    assert "NodeNotOwned" not in world.reasons()
    assert all(e["uid"] == "" for e in record(world))  # not held either
    assert node in world.provider.nodes


def test_a_claim_without_its_node_past_the_launch_timeout_is_made_again(worlds) -> None:
    world, _ = started(worlds)
    for slot, name in claims_by_slot(world).items():
        if slot != SPARE:
            world.karpenter.register(name, ready_since=T0)
    stuck = claims_by_slot(world)[SPARE]
    world.karpenter.launch(stuck)  # Launched, and its Node never comes (Karpenter killed mid-launch)
    world.rt.settings = world.rt.settings.model_copy(update={"karpenter_launch_timeout_seconds": 30.0})
    timeout = timedelta(seconds=30)
    world.now = T0 + timeout - timedelta(seconds=1)
    wake = run(world)
    assert stuck in world.karpenter.claims and wake <= T0 + timeout  # waits, and looks again at the timeout
    world.now = T0 + timeout
    run(world)
    assert stuck not in world.karpenter.claims  # deleted
    again = claims_by_slot(world)[SPARE]
    assert again != stuck  # the slot's new claim, under another name
    assert {e["nodeId"]: e["nodeClaim"]["name"] for e in record(world)}[SPARE] == again  # and in the record
    assert any(r == "NodeClaimDeleted" and "launch timeout" in m for _, _, r, m in world.events)


def test_a_claim_made_by_a_pass_whose_status_patch_was_lost_is_found_by_its_nonce(worlds, monkeypatch) -> None:
    world = worlds(group(nodeProvider="karpenter"))
    world.now = T0
    real = world.kube.patch_status
    written = []

    def lose_the_second(plural, name, status, rv=None):  # the intent lands, the record after the creates not
        written.append(status)
        if len(written) == 2:
            raise RuntimeError("the operator died here")
        return real(plural, name, status, rv)
    monkeypatch.setattr(world.kube, "patch_status", lose_the_second)
    with pytest.raises(RuntimeError):
        run(world)
    monkeypatch.setattr(world.kube, "patch_status", real)
    made = dict(world.karpenter.claims)
    assert all(e.get("claim") for e in record(world))  # only the intent is recorded
    world.now = T0 + timedelta(seconds=1)
    run(world)
    assert world.karpenter.claims.keys() == made.keys()  # nothing made twice
    assert sorted(e["nodeClaim"]["name"] for e in record(world)) == sorted(made)


def test_the_block_end_drains_and_deletes_every_claim_and_a_launching_one_too(worlds) -> None:
    world, _ = started(worlds)
    names = claims_by_slot(world)
    for slot, name in names.items():
        if slot != SPARE:
            world.karpenter.register(name, ready_since=T0)
    world.now = TERMINATION + timedelta(seconds=1)
    run(world)
    assert world.karpenter.claims == {} and world.provider.nodes == {}
    assert record(world) == []


def test_deleting_the_group_deletes_its_claims_launching_or_not(worlds) -> None:
    import asyncio
    world, _ = started(worlds)
    for slot, name in claims_by_slot(world).items():
        if slot != SPARE:
            world.karpenter.register(name, ready_since=T0)
    world.now = NOW
    run(world)
    obj = world.kube.objects[(GROUPS_PLURAL, GROUP)]
    for _ in range(3):
        if asyncio.run(drain_group(world.rt, GROUP, obj["spec"], obj)) is None:
            break
        world.list_nodes()
    assert world.karpenter.claims == {} and world.provider.nodes == {}


def test_the_recovery_ladder_keeps_a_karpenter_nodes_clocks_under_its_slot(worlds) -> None:
    """A Karpenter Node's name is not its slot: the reboot's clock is kept in the record under the
    slot's entry, so that the node failing again within the window is replaced, not rebooted again."""
    world = registered(worlds, healthCheck=LADDER)
    failed_slot = ACTIVE[1]
    failed = next(e["name"] for e in record(world) if e["nodeId"] == failed_slot)
    assert failed != failed_slot
    set_ready(world, failed, "False", NOW)
    world.now = NOW + GRACE + timedelta(seconds=1)
    run(world)
    assert ("reboot", failed) in world.karpenter.calls
    entry = next(e for e in record(world) if e["nodeId"] == failed_slot)
    assert entry["recovery"]["rebootingSince"] == "2026-12-01T12:00:16Z"
    assert entry["recovery"]["reboots"] == ["2026-12-01T12:00:16Z"]

    world.karpenter.finish_reboot(failed, world.now)
    world.now += timedelta(seconds=1)
    run(world)
    run(world)
    set_ready(world, failed, "False", world.now)  # the same fault again, within the window
    world.now += GRACE + timedelta(seconds=1)
    world.karpenter.calls.clear()
    run(world)
    assert ("reboot", failed) not in world.karpenter.calls  # past its budget: replaced
    assert world.provider.nodes[failed].metadata.labels["hyperplan.dev/node-health-status"] == \
        "UnschedulablePendingReplacement"


def test_a_replacement_under_way_holds_when_the_fault_clears_within_the_marks_grace(worlds) -> None:
    """Seen in e2e: the failed node's Ready came back (KWOK's heartbeat) a moment after the pass
    that marked it UnschedulablePendingReplacement and made its slot's new claim. The mark is the
    ladder's verdict on a fault first seen earlier (the record's faultSince), so its label has no
    grace of its own: the launching claim is kept, not let go and made again."""
    world = registered(worlds)
    failed = next(e["name"] for e in record(world) if e["nodeId"] == ACTIVE[0])
    set_ready(world, failed, "False", NOW)
    world.now = NOW + GRACE + timedelta(seconds=1)
    run(world)
    backfill = claims_by_slot(world)[ACTIVE[0] + "-g1"]
    set_ready(world, failed, "True", world.now)  # the fault clears within the label's grace
    world.now += timedelta(seconds=2)
    run(world)
    assert "NodeClaimDeleted" not in world.reasons()
    assert claims_by_slot(world)[ACTIVE[0] + "-g1"] == backfill
