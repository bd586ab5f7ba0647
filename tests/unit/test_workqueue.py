"""The one work queue of every kind's passes (runtime.workqueue.WorkQueue), on a fake clock.

The queue's clock, its monotonic clock and its timer are one :class:`FakeTime`: a timer fires
only when a test advances the time, and a pass "takes" time by advancing it. Nothing sleeps:
the tests yield to the event loop (``settle``) so that the workers run.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Callable

import pytest
from prometheus_client import REGISTRY

from hyperplan.controllers.group import reconciler as instancegroup
from hyperplan.runtime import workqueue
from hyperplan.runtime.workqueue import Pace, WorkQueue
from hyperplan.planning import naming

START = datetime(2027, 1, 1, 12, tzinfo=timezone.utc)
KIND = "thing"


@dataclass
class FakeHandle:
    due: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class FakeTime:
    """The queue's clocks and timer: time moves only when a test (or a pass) moves it."""

    seconds: float = 0.0
    timers: list[FakeHandle] = field(default_factory=list)

    def now(self) -> datetime:
        return START + timedelta(seconds=self.seconds)

    def monotonic(self) -> float:
        return self.seconds

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeHandle:
        handle = FakeHandle(self.seconds + delay, callback)
        self.timers.append(handle)
        return handle

    def pending(self) -> list[FakeHandle]:
        return sorted((t for t in self.timers if not t.cancelled), key=lambda t: t.due)

    async def advance(self, seconds: float) -> None:
        """Move time on by ``seconds``, firing each timer at its time and letting the passes it
        starts run before the next one fires."""
        until = self.seconds + seconds
        while (due := [t for t in self.pending() if t.due <= until]):
            timer = due[0]
            self.timers.remove(timer)
            self.seconds = max(self.seconds, timer.due)
            timer.callback()
            await settle()
        self.seconds = until
        await settle()


async def settle() -> None:
    """Let the workers run until nothing more can happen without the time moving."""
    for _ in range(50):
        await asyncio.sleep(0)


async def until(condition: Callable[[], bool]) -> None:
    """Yield until ``condition()`` holds (a report runs on a thread: its end is not the loop's)."""
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "condition not met within 10 s"
        await asyncio.sleep(0)


class Recorder:
    """A pass that records when it ran, takes scripted time, returns a scripted wake time, can
    fail, and can be held until a test lets it go."""

    def __init__(self, clock: FakeTime) -> None:
        self.clock = clock
        self.passes: list[tuple[str, float]] = []  # (name, when it started)
        self.wake: dict[str, float | None] = {}  # name -> seconds from the pass's end to its wake time
        self.took: dict[str, float] = {}  # name -> seconds each pass takes
        self.fail: dict[str, int] = {}  # name -> how many of its next passes raise
        self.hold: asyncio.Event | None = None
        self.during: Callable[[], None] | None = None  # called in the middle of the next pass
        self.finished: list[str] = []
        self.in_flight: dict[str, int] = {}
        self.most_at_once = 0

    async def __call__(self, name: str) -> datetime | None:
        self.in_flight[name] = self.in_flight.get(name, 0) + 1
        self.most_at_once = max(self.most_at_once, self.in_flight[name])
        try:
            self.passes.append((name, self.clock.seconds))
            took, after = self.took.get(name, 0.0), self.wake.get(name)  # as scripted when it starts
            if self.hold is not None:
                await self.hold.wait()
            self.clock.seconds += took
            if self.during is not None:
                during, self.during = self.during, None
                during()
            self.finished.append(name)
            if self.fail.get(name):
                self.fail[name] -= 1
                raise RuntimeError(f"{name} is broken")
            return None if after is None else self.clock.now() + timedelta(seconds=after)
        finally:
            self.in_flight[name] -= 1

    def names(self) -> list[str]:
        return [name for name, _ in self.passes]

    def times(self, name: str) -> list[float]:
        return [round(at, 3) for n, at in self.passes if n == name]


def make(workers: int = 4, pace: Pace | None = None, report=None, **register) -> tuple[WorkQueue, Recorder, FakeTime]:
    clock = FakeTime()
    queue = WorkQueue(clock.now, timer=clock.call_later, monotonic=clock.monotonic, report=report)
    rec = Recorder(clock)
    queue.register(KIND, rec, label="Thing", pace=pace, workers=workers, **register)
    return queue, rec, clock


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=20))


# --------------------------------------------------------------------------- coalescing and running again


@pytest.mark.parametrize("wakes, passes", [
    (["a"], ["a"]),
    (["a"] * 5, ["a"]),
    (["a", "b", "a", "b"], ["a", "b"]),
], ids=["one-wake", "five-wakes-of-a-queued-key-collapse", "two-keys-one-pass-each"])
def test_wakes_of_a_queued_key_collapse_into_one_pass(wakes: list[str], passes: list[str]) -> None:
    async def go():
        queue, rec, _ = make()
        for name in wakes:
            queue.wake(KIND, name)  # before the start: they wait in the queue
        queue.start()
        await settle()
        await queue.stop()
        return rec.names()

    assert sorted(run(go())) == passes


@pytest.mark.parametrize("wakes_during, passes", [
    (0, 1),
    (1, 2),
    (4, 2),
], ids=["none-during", "one-during-runs-once-more", "many-during-run-once-more"])
def test_a_wake_during_a_pass_runs_it_once_more_afterwards_never_two_at_once(wakes_during: int, passes: int) -> None:
    async def go():
        queue, rec, _ = make(workers=8)
        rec.hold = asyncio.Event()
        queue.start()
        queue.wake(KIND, "a")
        await settle()
        for _ in range(wakes_during):  # the running pass may have read the world before this change
            queue.wake(KIND, "a")
        await settle()
        assert rec.names() == ["a"]  # not a second worker on the same key
        rec.hold.set()
        await settle()
        await queue.stop()
        return rec

    rec = run(go())
    assert rec.names() == ["a"] * passes
    assert rec.most_at_once == 1


def test_a_key_falling_due_while_it_runs_waits_for_its_pass() -> None:
    """A timer and a wake that both ask for a running key, with free workers: still one worker."""
    async def go():
        queue, rec, clock = make(workers=8)
        rec.hold = asyncio.Event()
        queue.start()
        queue.wake_at(KIND, "a", clock.now() + timedelta(seconds=1))
        queue.wake(KIND, "a")
        await settle()
        await clock.advance(2)  # the timer fires during the held pass
        queue.wake(KIND, "a")
        assert queue.holds()["running"] == 1 and queue.holds()["again"] == 1
        rec.hold.set()
        await settle()
        await queue.stop()
        return rec

    rec = run(go())
    assert rec.names() == ["a", "a"] and rec.most_at_once == 1


def test_many_keys_run_concurrently_up_to_the_workers_of_their_kind() -> None:
    async def go():
        queue, rec, _ = make(workers=3)
        rec.hold = asyncio.Event()
        queue.start()
        for i in range(10):
            queue.wake(KIND, f"p{i}")
        await settle()
        held = queue.holds()
        rec.hold.set()
        await settle()
        await queue.stop()
        return rec.names(), held

    names, held = run(go())
    assert (held["running"], held["queued"]) == (3, 7)
    assert sorted(names) == sorted(f"p{i}" for i in range(10))


def test_a_busy_kind_does_not_hold_up_another() -> None:
    """Every worker of one kind held: a key of another kind still runs at once."""
    async def go():
        queue, busy, clock = make(workers=2)
        busy.hold = asyncio.Event()
        other = Recorder(clock)
        queue.register("other", other, label="Other", workers=1)
        queue.start()
        for i in range(5):
            queue.wake(KIND, f"p{i}")
        queue.wake("other", "x")
        await settle()
        ran = other.names()
        busy.hold.set()
        await settle()
        await queue.stop()
        return ran

    assert run(go()) == ["x"]


# --------------------------------------------------------------------------- wake times


@pytest.mark.parametrize("first, second, due", [
    (3600.0, 10.0, 10.0),
    (10.0, 3600.0, 3600.0),
    (10.0, None, None),
], ids=["earlier-replaces-later", "later-replaces-earlier", "none-drops-the-timer"])
def test_the_wake_time_a_pass_returns_replaces_the_timer(first: float, second: float | None,
                                                         due: float | None) -> None:
    async def go():
        queue, rec, clock = make()
        rec.wake["a"] = first
        queue.start()
        queue.wake(KIND, "a")
        await settle()
        assert queue.due_in(KIND, "a") == pytest.approx(first + workqueue.WAKE_SLACK)
        rec.wake["a"] = second
        queue.wake(KIND, "a")  # a change: one more pass now, whose result replaces the timer
        await settle()
        due_in, timers = queue.due_in(KIND, "a"), queue.holds()["timers"]
        await queue.stop()
        return due_in, timers

    due_in, timers = run(go())
    assert due_in == (None if due is None else pytest.approx(due + workqueue.WAKE_SLACK))
    assert timers == (0 if due is None else 1)


def test_a_key_falls_due_at_its_wake_time_and_not_before() -> None:
    async def go():
        queue, rec, clock = make()
        rec.wake["a"] = 30.0
        queue.start()
        queue.wake(KIND, "a")
        await settle()
        rec.wake["a"] = None
        await clock.advance(29.9)
        before = rec.names()
        await clock.advance(0.2)
        held = queue.holds()
        await queue.stop()
        return before, rec.times("a"), held

    before, times, held = run(go())
    assert before == ["a"]
    assert times == [0.0, pytest.approx(30.0 + workqueue.WAKE_SLACK)]
    assert held == {"timers": 0, "queued": 0, "running": 0, "again": 0, "resting": 0, "failing": 0}


def test_wake_at_from_outside_a_pass_replaces_the_timer() -> None:
    async def go():
        queue, rec, clock = make()
        queue.start()
        queue.wake_at(KIND, "a", clock.now() + timedelta(seconds=60))
        queue.wake_at(KIND, "a", clock.now() + timedelta(seconds=5))
        await clock.advance(10)
        after_five = rec.times("a")
        await clock.advance(60)
        await queue.stop()
        return after_five, rec.times("a")

    after_five, later = run(go())
    assert after_five == [pytest.approx(5 + workqueue.WAKE_SLACK)]
    assert later == after_five  # the minute-long timer was replaced, not kept beside it


# --------------------------------------------------------------------------- pacing


PACE = Pace(start=0.05, most=0.5)


@pytest.mark.parametrize("pace, took, own_wake, second_at", [
    (PACE, 0.01, None, 0.01),
    (PACE, 0.3, None, 0.6),
    (PACE, 2.0, None, 2.5),
    (PACE, 0.3, 0.1, 0.4),
    (None, 2.0, None, 2.0),
], ids=["short-pass-no-rest", "rests-as-long-as-it-took", "rests-at-most-pace-max",
        "never-past-its-own-wake-time", "unpaced-kind-runs-at-once"])
def test_a_long_pass_rests_before_a_woken_one(pace: Pace | None, took: float, own_wake: float | None,
                                              second_at: float) -> None:
    """A pass starts at 0 and takes ``took`` seconds; a wake arrives during it. The next pass
    starts when its rest ends (or at the pass's own wake time, if sooner)."""
    async def go():
        queue, rec, clock = make(pace=pace)
        rec.took["a"] = took
        rec.wake["a"] = own_wake

        def during() -> None:
            queue.wake(KIND, "a")
            rec.took["a"], rec.wake["a"] = 0.0, None  # the next passes are quick and ask for nothing

        rec.during = during
        queue.start()
        queue.wake(KIND, "a")
        await settle()
        await clock.advance(5)
        await queue.stop()
        return rec.times("a")

    first, *rest = run(go())
    assert first == 0.0
    assert rest == [pytest.approx(second_at, abs=workqueue.WAKE_SLACK + 1e-6)]


def test_wakes_during_a_rest_collapse_into_one_pass_when_it_ends() -> None:
    async def go():
        queue, rec, clock = make(pace=PACE)
        rec.took["a"] = 0.4
        queue.start()
        queue.wake(KIND, "a")
        await settle()
        rec.took["a"] = 0.0
        for _ in range(3):
            queue.wake(KIND, "a")
            await clock.advance(0.1)
        resting = queue.holds()["resting"]
        await clock.advance(5)
        await queue.stop()
        return resting, rec.times("a")

    resting, times = run(go())
    assert resting == 1
    assert times == [0.0, pytest.approx(0.8)]  # the pass ended at 0.4 and rested 0.4


# --------------------------------------------------------------------------- failures


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_failures_back_off_report_on_the_object_and_a_success_resets_the_count() -> None:
    reports: list[tuple] = []

    async def go():
        queue, rec, clock = make(report=lambda *args: reports.append(args), plural="things",
                                name_of=lambda key: f"object-{key}")
        rec.fail["bad"] = 3
        queue.start()
        queue.wake(KIND, "bad")
        queue.wake(KIND, "good")
        await until(lambda: len(reports) == 1 and not queue.holds()["running"])
        failing = queue.holds()["failing"]
        delays = [queue.due_in(KIND, "bad")]
        for _ in range(3):  # 5 s, 10 s, 20 s; then a pass that succeeds
            await clock.advance(queue.due_in(KIND, "bad"))
            await until(lambda: not queue.holds()["running"])
            delays.append(queue.due_in(KIND, "bad"))
        after_success = queue.holds()["failing"]
        rec.fail["bad"] = 1
        queue.wake(KIND, "bad")
        await until(lambda: len(reports) == 4 and not queue.holds()["running"])
        again = queue.due_in(KIND, "bad")
        await queue.stop()
        return rec, failing, delays, after_success, again

    errors = sample("hyperplan_reconciles_total", kind="Thing", result="error")
    oks = sample("hyperplan_reconciles_total", kind="Thing", result="ok")
    rec, failing, delays, after_success, again = run(go())
    assert rec.names().count("bad") == 5 and rec.names().count("good") == 1
    assert failing == 1
    assert [None if d is None else round(d - workqueue.WAKE_SLACK) for d in delays] == [5, 10, 20, None]
    assert after_success == 0
    assert round(again - workqueue.WAKE_SLACK) == 5  # the count started again from one
    assert [(plural, name, reason, failures, backoff.total_seconds())
            for plural, name, reason, _, failures, backoff in reports] == [
        ("things", "object-bad", "ReconcileError", 1, 5), ("things", "object-bad", "ReconcileError", 2, 10),
        ("things", "object-bad", "ReconcileError", 3, 20), ("things", "object-bad", "ReconcileError", 1, 5)]
    assert reports[0][3] == "RuntimeError: bad is broken"
    assert sample("hyperplan_reconciles_total", kind="Thing", result="error") - errors == 4
    assert sample("hyperplan_reconciles_total", kind="Thing", result="ok") - oks == 2


def test_a_kind_without_a_plural_logs_its_failures_only() -> None:
    reports: list[tuple] = []

    async def go():
        queue, rec, _ = make(report=lambda *args: reports.append(args))
        rec.fail["bad"] = 1
        queue.start()
        queue.wake(KIND, "bad")
        await settle()
        due = queue.due_in(KIND, "bad")
        await queue.stop()
        return due

    assert round(run(go()) - workqueue.WAKE_SLACK) == 5
    assert reports == []


# --------------------------------------------------------------------------- forget


def test_forget_drops_the_timer_the_rest_and_the_failure_count() -> None:
    async def go():
        queue, rec, clock = make(pace=PACE)
        rec.fail["a"] = 1
        rec.took["a"] = 0.3
        queue.start()
        queue.wake(KIND, "a")
        await settle()
        queue.wake(KIND, "a")  # deferred by the rest
        held = queue.holds()
        queue.forget(KIND, "a")
        forgotten = queue.holds()
        await clock.advance(3600)
        await queue.stop()
        return held, forgotten, rec.names()

    held, forgotten, names = run(go())
    assert (held["timers"], held["resting"], held["failing"]) == (1, 1, 1)
    assert forgotten == {"timers": 0, "queued": 0, "running": 0, "again": 0, "resting": 0, "failing": 0}
    assert names == ["a"]  # neither the backoff's retry nor the deferred wake ran


# --------------------------------------------------------------------------- stop


@pytest.mark.parametrize("finishes_after, grace, completed", [
    (1.0, 5.0, True),
    (10.0, 5.0, False),
], ids=["finishes-within-its-grace", "cancelled-after-its-grace"])
def test_stop_gives_running_passes_their_grace_then_cancels_them(finishes_after: float, grace: float,
                                                                 completed: bool) -> None:
    async def go():
        queue, rec, clock = make()
        rec.hold = asyncio.Event()
        clock.call_later(finishes_after, rec.hold.set)
        queue.start()
        queue.wake(KIND, "a")
        queue.wake_at(KIND, "b", clock.now() + timedelta(seconds=2))
        await settle()
        stopping = asyncio.ensure_future(queue.stop(grace=grace))
        await clock.advance(30)
        await stopping
        queue.start()  # a late event after the stop starts nothing
        queue.wake(KIND, "c")
        await settle()
        return rec, queue.holds()

    rec, held = run(go())
    assert rec.names() == ["a"]  # neither b's timer nor the late wake ran
    assert rec.finished == (["a"] if completed else [])
    assert rec.in_flight["a"] == 0
    assert held == {"timers": 0, "queued": 0, "running": 0, "again": 0, "resting": 0, "failing": 0}


def test_quiet_returns_once_the_running_pass_ends() -> None:
    async def go():
        queue, rec, _ = make()
        rec.hold = asyncio.Event()
        queue.start()
        await queue.quiet(KIND, "a")  # nothing runs: at once
        queue.wake(KIND, "a")
        await settle()
        waiting = asyncio.ensure_future(queue.quiet(KIND, "a"))
        await settle()
        blocked = not waiting.done()
        rec.hold.set()
        await settle()
        done = waiting.done()
        await queue.stop()
        return blocked, done

    assert run(go()) == (True, True)


# --------------------------------------------------------------------------- the kinds on the queue


LONG = "a-group-whose-name-is-longer-than-a-label-value-may-be.team-with-a-long-name.example"


@pytest.mark.parametrize("event_type, woken, known", [
    (None, True, True),
    ("ADDED", True, True),
    ("MODIFIED", False, True),
    ("DELETED", False, False),
], ids=["listed-at-start-gets-a-pass", "created-gets-a-pass", "own-status-write-none", "deleted-forgotten"])
def test_a_group_seen_at_start_or_created_gets_a_pass_under_its_label_value(event_type, woken, known,
                                                                            monkeypatch) -> None:
    """A group's key is the label value of its name (what its nodes carry, and every wake of a
    group names); its pass finds the object's name again."""
    key = naming.label_value(LONG)
    assert key != LONG  # the case where the mapping matters
    reached: list[str] = []

    async def reconcile_group(_rt, name):
        reached.append(name)

    monkeypatch.setattr(instancegroup, "reconcile_group", reconcile_group)

    async def go():
        rt = SimpleNamespace(queue=WorkQueue(), group_names={}, group_seen={}, providers={})
        body = {"metadata": {"name": LONG, "generation": 1}}
        if event_type in ("MODIFIED", "DELETED"):
            instancegroup.group_event(rt, LONG, body, "ADDED")
            rt.queue = WorkQueue()  # a fresh queue: only the event under test counts
        instancegroup.group_event(rt, LONG, body, event_type)
        was_woken = rt.queue.woken(instancegroup.KIND, key)
        await instancegroup.group_pass(rt, key)
        await rt.queue.stop()
        return was_woken, rt.group_names

    was_woken, names = run(go())
    assert was_woken is woken
    assert names == ({key: LONG} if known else {})
    assert reached == ([LONG] if known else [])  # an unknown key's pass does nothing


@pytest.mark.parametrize("durations, level", [
    pytest.param([0.1, 0.3, 0.2], None, id="a-quick-pass-logs-at-debug-only"),
    pytest.param([0.0, 6.4, 0.8], "INFO", id="a-slow-pass-says-which-phase-held-it"),
])
def test_a_pass_reports_where_its_time_went(durations: list[float], level: str | None, caplog) -> None:
    ticks = iter([0.0] + [sum(durations[:i + 1]) for i in range(len(durations))])
    phases = workqueue.PassPhases(monotonic=lambda: next(ticks))
    for name in ("read", "apply", "status"):
        phases.mark(name)
    with caplog.at_level("INFO", logger="hyperplan.workqueue"):
        phases.report("group g", 288)
    assert [name for name, _ in phases.phases] == ["read", "apply", "status"]
    lines = [r for r in caplog.records if r.name == "hyperplan.workqueue"]
    if level is None:
        assert not lines
    else:
        assert [r.levelname for r in lines] == [level]
        assert lines[0].getMessage() == ("group g: pass took 7.20 s with 288 create(s): "
                                         "read 0.00, apply 6.40, status 0.80")


@pytest.mark.parametrize("change, woken, peers_woken", [
    ({}, False, False),
    ({"generation": 2}, True, True),
    ({"labels": {"team": "b"}}, True, True),
    ({"deletionTimestamp": "2026-12-01T12:00:00Z"}, True, False),
], ids=["own-status-write-none", "spec-changed-wakes-it-and-its-plans-groups", "relabelled-wakes-it-and-its-plans-groups",
        "being-deleted-gets-a-pass"])
def test_a_group_looks_again_when_its_generation_or_labels_change(change, woken, peers_woken) -> None:
    """Groups, like plans, are woken from their watch events: no kopf change handler."""
    key = naming.label_value(LONG)
    peers: list[str] = []

    async def go():
        rt = SimpleNamespace(queue=WorkQueue(), group_names={}, group_seen={}, providers={}, wake_groups_of=peers.append)
        meta = {"name": LONG, "generation": 1, "labels": {"team": "a"}}
        instancegroup.group_event(rt, LONG, {"metadata": meta, "spec": {"trainingPlanRef": "p"}}, "ADDED")
        rt.queue = WorkQueue()
        labels = change.get("labels", meta["labels"])
        changed = {**meta, **{k: v for k, v in change.items() if k != "labels"}, "labels": labels}
        instancegroup.group_event(rt, LONG, {"metadata": changed, "spec": {"trainingPlanRef": "p"}}, "MODIFIED")
        was_woken = rt.queue.woken(instancegroup.KIND, key)
        await rt.queue.stop()
        return was_woken

    assert run(go()) is woken
    assert peers == (["p"] if peers_woken else [])

