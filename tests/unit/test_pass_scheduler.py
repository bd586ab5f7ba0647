"""The one scheduler of every plan's passes (handlers.scheduler.PassScheduler): when a pass runs,
that one object never has two passes at once, what it holds per object, and failures' backoff."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from hyperplan.handlers import scheduler as sch
from hyperplan.handlers.context import Wakeups


class Recorder:
    """A reconcile that records its passes, returns a scripted wake time, and can be held."""

    def __init__(self) -> None:
        self.passes: list[str] = []
        self.wake: dict[str, timedelta | None] = {}
        self.fail: dict[str, int] = {}  # name -> how many of its next passes raise
        self.hold: asyncio.Event | None = None
        self.in_flight: dict[str, int] = {}
        self.most_at_once = 0

    async def __call__(self, name: str) -> datetime | None:
        self.in_flight[name] = self.in_flight.get(name, 0) + 1
        self.most_at_once = max(self.most_at_once, self.in_flight[name])
        try:
            self.passes.append(name)
            if self.hold is not None:
                await self.hold.wait()
            if self.fail.get(name):
                self.fail[name] -= 1
                raise RuntimeError(f"{name} is broken")
            after = self.wake.get(name)
            return None if after is None else utcnow() + after
        finally:
            self.in_flight[name] -= 1


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


async def settle(seconds: float = 0.05) -> None:
    await asyncio.sleep(seconds)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=20))


def test_a_wake_up_runs_one_pass_and_wake_ups_of_a_queued_object_collapse() -> None:
    async def go():
        rec = Recorder()
        s = sch.PassScheduler("TrainingPlan", rec, utcnow, workers=4)
        for _ in range(5):
            s.wake("a")
        s.wake("b")
        s.start()
        await settle()
        await s.stop()
        return rec.passes

    assert sorted(run(go())) == ["a", "b"]


def test_a_wake_up_during_a_pass_makes_one_more_pass_after_it_never_two_at_once() -> None:
    async def go():
        rec = Recorder()
        rec.hold = asyncio.Event()
        s = sch.PassScheduler("TrainingPlan", rec, utcnow, workers=4)
        s.start()
        s.wake("a")
        await settle()
        s.wake("a")  # the running pass may have read the world before this change
        s.wake("a")
        await settle()
        assert rec.passes == ["a"]
        rec.hold.set()
        await settle()
        await s.stop()
        return rec

    rec = run(go())
    assert rec.passes == ["a", "a"]
    assert rec.most_at_once == 1


def test_a_pass_falls_due_at_the_time_it_returned_and_holds_one_timer_until_then() -> None:
    async def go():
        rec = Recorder()
        rec.wake["a"] = timedelta(seconds=0.3)
        s = sch.PassScheduler("TrainingPlan", rec, utcnow, workers=2)
        s.start()
        s.wake("a")
        await settle(0.1)
        held = s.holds()
        assert rec.passes == ["a"]
        assert 0.05 < s.due_at("a") < 0.35
        rec.wake["a"] = None
        await settle(0.4)
        after = s.holds()
        await s.stop()
        return rec.passes, held, after

    passes, held, after = run(go())
    assert passes == ["a", "a"]
    assert held["timers"] == 1
    assert after == {"timers": 0, "queued": 0, "running": 0, "again": 0, "failing": 0}


def test_an_earlier_wake_up_replaces_the_timer_and_forget_drops_it() -> None:
    async def go():
        rec = Recorder()
        rec.wake["a"] = timedelta(hours=1)
        s = sch.PassScheduler("TrainingPlan", rec, utcnow, workers=2)
        s.start()
        s.wake("a")
        await settle()
        s.wake("a")  # a change: one more pass now, whose result replaces the hour-long timer
        await settle()
        assert s.holds()["timers"] == 1
        s.forget("a")
        held = s.holds()
        await s.stop()
        return rec.passes, held

    passes, held = run(go())
    assert passes == ["a", "a"]
    assert held["timers"] == 0


def test_a_failing_pass_backs_off_and_a_success_clears_its_count(monkeypatch) -> None:
    monkeypatch.setattr(sch, "failure_backoff", lambda failures: timedelta(seconds=0.1 * failures))

    async def go():
        rec = Recorder()
        rec.fail["bad"] = 2
        s = sch.PassScheduler("TrainingPlan", rec, utcnow, workers=2)
        s.start()
        s.wake("bad")
        s.wake("good")
        await settle(0.05)
        failing = s.holds()["failing"]
        await settle(0.6)  # 0.1 s, then 0.2 s of backoff, then a pass that succeeds
        after = s.holds()
        await s.stop()
        return rec.passes, failing, after

    passes, failing, after = run(go())
    assert passes.count("bad") == 3 and passes.count("good") == 1
    assert failing == 1
    assert after["failing"] == 0 and after["timers"] == 0


def test_many_objects_run_concurrently_up_to_the_workers() -> None:
    async def go():
        rec = Recorder()
        rec.hold = asyncio.Event()
        s = sch.PassScheduler("TrainingPlan", rec, utcnow, workers=3)
        s.start()
        for i in range(10):
            s.wake(f"p{i}")
        await settle()
        running = s.holds()
        rec.hold.set()
        await settle()
        await s.stop()
        return rec.passes, running

    passes, running = run(go())
    assert running["running"] == 3 and running["queued"] == 7
    assert sorted(passes) == sorted(f"p{i}" for i in range(10))


def test_stop_lets_a_running_pass_finish_within_its_grace() -> None:
    async def go():
        rec = Recorder()
        rec.hold = asyncio.Event()
        s = sch.PassScheduler("TrainingPlan", rec, utcnow, workers=2)
        s.start()
        s.wake("a")
        await settle()
        asyncio.get_running_loop().call_later(0.1, rec.hold.set)
        await s.stop(grace=5)
        s.start()  # a late event after the stop starts nothing
        s.wake("b")
        await settle()
        return rec.in_flight["a"], rec.passes

    in_flight, passes = run(go())
    assert in_flight == 0
    assert passes == ["a"]


@pytest.mark.parametrize("routed", [True, False], ids=["routed-to-the-scheduler", "per-object-event"])
def test_wakeups_of_a_routed_kind_go_to_the_scheduler(routed: bool) -> None:
    woken: list[str] = []
    w = Wakeups()
    if routed:
        w.route("plan", woken.append)
    w.wake("plan", "a")
    w.wake("group", "g")
    assert woken == (["a"] if routed else [])
    assert set(w._events) == ({("group", "g")} if routed else {("plan", "a"), ("group", "g")})  # noqa: SLF001
