"""The watch cache: the operator's own writes are read back until the watch catches up, and a
deleted object leaves nothing behind (runtime.store.WatchCache)."""

from __future__ import annotations

import asyncio

import pytest

from hyperplan.runtime.store import GROUPS, NODES, PLANS, POOLS, WatchCache


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
    from hyperplan.runtime.store import PackedObject, slim_object
    from hyperplan.wiring.events import hp_plans

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


def pool(rv: int, lines: list[tuple[str, str, int]], zone: str = "us-east-1a") -> dict:
    """A CapacityPool at ``rv`` whose ledger holds ``(reservedCapacityId, plan uid, count)``."""
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "CapacityPool",
            "metadata": {"name": "pool-a", "resourceVersion": str(rv)},
            "spec": {"instanceType": "ml.p5.48xlarge", "availabilityZone": zone, "instanceCount": 64},
            "status": {"reservations": [
                {"trainingPlan": f"plan-{uid}", "trainingPlanUid": uid, "reservedCapacityId": rc,
                 "startTime": "2027-01-01T00:00:00Z", "endTime": "2027-01-01T01:00:00Z", "instanceCount": n}
                for rc, uid, n in lines]}}


def test_every_version_of_a_pool_shares_the_ledger_lines_it_has_in_common() -> None:
    """Each pool event brings the whole ledger parsed afresh; the cache keeps one dict, one
    Busy and one Block per line, not one per line per version (docs/benchmarks.md 5.9)."""
    cache = cache_with({})
    v1 = cache.share_ledger(pool(1, [("rc-1", "u1", 2)]))
    v2 = cache.share_ledger(pool(2, [("rc-1", "u1", 2), ("rc-2", "u2", 3)]))
    assert v2["status"]["reservations"][0] is v1["status"]["reservations"][0]
    assert v2["status"]["reservations"][1] == pool(2, [("rc-2", "u2", 3)])["status"]["reservations"][0]
    first, second = cache.pool_snapshots([v1]), cache.pool_snapshots([v2])
    assert second[0].busy[0] is first[0].busy[0]
    assert [b.instance_count for b in second[0].busy] == [2, 3]
    assert cache.blocks_of("u1", [v2])[0] is cache.blocks_of("u1", [v1])[0]
    assert [(b.id, b.instance_count, b.availability_zone) for b in cache.blocks_of("u2", [v2])] == [
        ("rc-2", 3, "us-east-1a")]


def test_a_changed_ledger_line_or_pool_is_parsed_again_not_shared() -> None:
    cache = cache_with({})
    v1 = cache.share_ledger(pool(1, [("rc-1", "u1", 2)]))
    edited = cache.share_ledger(pool(2, [("rc-1", "u1", 5)]))  # someone rewrote the line
    assert edited["status"]["reservations"][0] is not v1["status"]["reservations"][0]
    assert [b.instance_count for b in cache.blocks_of("u1", [edited])] == [5]
    moved = cache.share_ledger(pool(3, [("rc-1", "u1", 5)], zone="us-east-1b"))
    assert [b.availability_zone for b in cache.blocks_of("u1", [moved])] == ["us-east-1b"]


def test_our_ledger_write_shares_the_lines_the_watch_brought() -> None:
    watched = {"pool-a": [pool(1, [("rc-1", "u1", 2)])]}
    cache = WatchCache()
    cache.bind({PLANS: {}, POOLS: watched, GROUPS: {}, NODES: {}})
    watched["pool-a"] = [cache.share_ledger(watched["pool-a"][0])]
    cache.wrote("capacitypools", pool(2, [("rc-1", "u1", 2), ("rc-2", "u2", 1)]))
    [read] = cache.pool_objects()
    assert read["metadata"]["resourceVersion"] == "2"
    assert read["status"]["reservations"][0] is watched["pool-a"][0]["status"]["reservations"][0]


def test_a_deleted_pool_leaves_no_ledger_lines_behind() -> None:
    cache = cache_with({})
    cache.pool_snapshots([cache.share_ledger(pool(1, [("rc-1", "u1", 2), ("rc-2", "u2", 1)]))])
    assert len(cache._lines) == 2
    cache.forget("capacitypools", "pool-a")
    assert cache._lines == {} and cache._parsed_pools == {}


def test_a_pool_version_is_parsed_into_its_model_once() -> None:
    """Every pass of a plan bought remotely reads the remote pools as models: one parse per pool
    version, shared; a new version, a pool that does not parse, and a deleted pool are not."""
    cache = cache_with({})
    v1 = pool(1, [("rc-1", "u1", 2)])
    first = cache.pool_model(v1)
    assert first is not None and cache.pool_model(dict(v1)) is first
    assert [r.instance_count for r in first.status.reservations] == [2]
    v2 = pool(2, [("rc-1", "u1", 2), ("rc-2", "u2", 3)])
    second = cache.pool_model(v2)
    assert second is not first and [r.instance_count for r in second.status.reservations] == [2, 3]
    assert cache.pool_model({**pool(3, []), "spec": {"instanceCount": "many"}}) is None
    cache.forget("capacitypools", "pool-a")
    assert cache._pool_models == {}
    unversioned = {**v1, "metadata": {"name": "pool-a"}}  # no resourceVersion: parsed each time
    assert cache.pool_model(unversioned) is not cache.pool_model(unversioned)


def test_a_ledger_line_that_does_not_parse_is_kept_as_it_is_and_fails_only_the_read() -> None:
    """The pool index must not fail on a bad line (the pool would vanish from the cache); the pass
    that reads the pool reports it instead."""
    import pytest
    from pydantic import ValidationError

    cache = cache_with({})
    bad = pool(1, [("rc-1", "u1", 2)])
    bad["status"]["reservations"].append({"reservedCapacityId": "rc-x", "instanceCount": "many"})
    shared = cache.share_ledger(bad)
    assert shared["status"]["reservations"][1] == {"reservedCapacityId": "rc-x", "instanceCount": "many"}
    with pytest.raises(ValidationError):
        cache.pool_snapshots([shared])


# --------------------------------------------------------------------------- kinds added by other modules


def workload(namespace: str, name: str, rv: int, state: str) -> dict:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": str(rv)},
            "status": {"state": state}}


def slim_state(obj: dict) -> dict:
    """What the added kind keeps of a write: its identity and state (not what else came back)."""
    return {"metadata": dict(obj["metadata"]), "status": {"state": obj["status"]["state"]}}


@pytest.mark.parametrize("then, states", [
    (None, ["written"]),
    (("watched", "a", 5), ["written"]),  # an older event still on its way: keep ours
    (("watched", "a", 6), ["watched"]),
    (("forget", "a", None), ["watched"]),
    (("watched", "b", 9), ["written"]),  # the same name in another namespace is another object
], ids=["written-newer", "older-event", "event-caught-up", "deleted", "other-namespace"])
def test_an_added_namespaced_kind_has_the_same_write_through(then, states) -> None:
    index = {("check", "c"): [workload("a", "train", 5, "watched")]}
    cache = cache_with({})
    cache.add_kind("workloads", "by_check", index, slim_state)
    cache.wrote("workloads", {**workload("a", "train", 6, "written"), "spec": {"large": "x" * 100}})
    if then is not None:
        what, namespace, rv = then
        if what == "watched":
            cache.watched("workloads", f"{namespace}/train", str(rv))
        else:
            cache.forget("workloads", f"{namespace}/train")
    assert [w["status"]["state"] for w in cache.objects("by_check", "workloads", ("check", "c"))] == states
    assert all("spec" not in w for w in cache._written.values())  # slimmed by the kind's own function


class LoopOnlyIndex(dict):
    """A kopf index as kopf keeps it: changed on the event loop only. Reading it from any other
    thread is the race this catches (a dict that changes while iterated raises, or shows half an
    update), so every read records its thread."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read_on: set[str] = set()

    def get(self, key, default=None):
        import threading
        self.read_on.add(threading.current_thread().name)
        return super().get(key, default)

    def keys(self):
        import threading
        self.read_on.add(threading.current_thread().name)
        return super().keys()


def small_pool(name: str, rv: int) -> dict:
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "CapacityPool",
            "metadata": {"name": name, "resourceVersion": str(rv)},
            "spec": {"instanceType": "ml.p5.48xlarge", "availabilityZone": "z1", "instanceCount": 4}}


@pytest.mark.parametrize("read", ["pool_objects", "groups", "plan"])
def test_a_worker_thread_gets_a_copy_taken_on_the_event_loop(read: str) -> None:
    """The ledger's purchases run on worker threads and read the pools; kopf changes its indexes
    on the event loop. The thread's read is taken on the loop (and the copy handed over), while
    the loop keeps changing the index; a read on the loop itself stays direct."""
    import threading

    indexes = {PLANS: LoopOnlyIndex(p=[plan("p", 1, "Pending")]), POOLS: LoopOnlyIndex(a=[small_pool("a", 1)]),
               GROUPS: LoopOnlyIndex(g=[{"metadata": {"name": "g", "resourceVersion": "1"}, "spec": {}}])}
    calls = {"pool_objects": lambda c: c.pool_objects(), "groups": lambda c: c.groups(),
             "plan": lambda c: c.plan("p")}

    async def main() -> tuple[object, object, str]:
        cache = WatchCache()
        cache.bind({**indexes, NODES: {}})
        loop_thread = threading.current_thread().name
        stop = False

        async def churn() -> None:  # the watch, changing the indexes on the loop meanwhile
            n = 0
            while not stop:
                n += 1
                indexes[POOLS][f"b{n}"] = [small_pool(f"b{n}", n)]
                indexes[GROUPS][f"h{n}"] = [{"metadata": {"name": f"h{n}", "resourceVersion": "1"}, "spec": {}}]
                await asyncio.sleep(0)

        churning = asyncio.ensure_future(churn())
        try:
            for name in indexes:
                indexes[name].read_on.clear()
            in_thread = [await asyncio.to_thread(calls[read], cache) for _ in range(20)]
            on_loop = calls[read](cache)
        finally:
            stop = True
            await churning
        return in_thread[-1], on_loop, loop_thread

    from_thread, from_loop, loop_thread = asyncio.run(main())
    assert from_thread and from_loop
    read_on = set().union(*(i.read_on for i in indexes.values()))
    assert read_on == {loop_thread}, f"kopf's indexes were read off the loop, on {read_on - {loop_thread}}"


def test_without_a_running_loop_the_read_is_direct() -> None:
    """Bound outside a loop (as unit tests of a pass bind it), nothing else changes the indexes:
    the read needs no loop and does not wait for one."""
    cache = cache_with({"p": [plan("p", 1, "Pending")]})
    assert cache.plan("p")["status"]["phase"] == "Pending"
