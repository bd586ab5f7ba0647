"""The watch cache: the operator's own writes are read back until the watch catches up, and a
deleted object leaves nothing behind (handlers.cache.WatchCache)."""

from __future__ import annotations

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
