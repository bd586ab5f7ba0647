"""The watch cache: the operator's own writes are read back until the watch catches up, and a
deleted object leaves nothing behind (handlers.cache.WatchCache)."""

from __future__ import annotations

import asyncio

from hyperplan.handlers.cache import GROUPS, NODES, PLANS, POOLS, WatchCache


def plan(name: str, rv: int, phase: str) -> dict:
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "TrainingPlan",
            "metadata": {"name": name, "resourceVersion": str(rv)}, "spec": {}, "status": {"phase": phase}}


def cache_with(plans: dict[str, list[dict]]) -> WatchCache:
    cache = WatchCache()
    cache.bind({PLANS: plans, POOLS: {}, GROUPS: {}, NODES: {}})
    return cache


def test_our_write_is_read_until_the_watch_catches_up() -> None:
    watched = {"p": [plan("p", 1, "Pending")]}
    cache = cache_with(watched)
    cache.wrote("trainingplans", plan("p", 2, "Scheduled"))
    assert cache.plan("p")["status"]["phase"] == "Scheduled"
    watched["p"] = [plan("p", 3, "Active")]
    assert cache.plan("p")["status"]["phase"] == "Active"


def test_a_deleted_object_leaves_no_copy_behind() -> None:
    cache = cache_with({"p": [plan("p", 1, "Pending")]})
    cache.wrote("trainingplans", plan("p", 2, "Scheduled"))
    cache.forget("trainingplans", "p")
    assert cache._written == {}
    cache = cache_with({})
    cache.wrote("trainingplans", plan("gone", 2, "Scheduled"))
    cache.forget("trainingplans", "gone")
    assert cache.plan("gone") is None


def test_a_plan_is_kept_packed_and_read_back_slim() -> None:
    """Plans are the many objects: the index keeps them as compact JSON text, a read gives the
    slim object (no managedFields, no kopf bookkeeping annotation) as plain dicts."""
    from hyperplan.handlers.cache import PackedObject, hp_plans, slim_object

    body = plan("p", 7, "Scheduled")
    body["metadata"].update({
        "uid": "u-1", "generation": 2, "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        "annotations": {"hyperplan.dev/last-handled-configuration": "{...}", "hyperplan.dev/keep": "yes",
                        "other.io/drop": "x"}})
    body["status"]["offerings"] = [{"id": "o-1", "blocks": [{"start": "2027-01-01T00:00:00Z", "count": 1}]}]
    packed = asyncio.run(hp_plans(name="p", body=body))["p"]
    assert isinstance(packed, PackedObject)
    cache = cache_with({"p": [packed]})
    got = cache.plan("p")
    assert got == slim_object(body)
    assert "managedFields" not in got["metadata"]
    assert got["metadata"]["annotations"] == {"hyperplan.dev/keep": "yes"}
    assert got["status"]["offerings"][0]["blocks"][0]["count"] == 1
    got["status"]["phase"] = "changed by a reader"  # each read is its own copy
    assert cache.plan("p")["status"]["phase"] == "Scheduled"


def test_our_copy_goes_when_the_watch_delivers_its_version_not_only_on_a_read() -> None:
    """A Scheduled plan is not read again until its block starts: its write-through copy must
    not wait for that read to go."""
    cache = cache_with({"p": [plan("p", 1, "Pending")]})
    cache.wrote("trainingplans", plan("p", 5, "Scheduled"))
    cache.watched("trainingplans", "p", "4")  # an older event still on its way: keep ours
    assert set(cache._written) == {("trainingplans", "p")}
    cache.watched("trainingplans", "p", "5")
    assert cache._written == {}
