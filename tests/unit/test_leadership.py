"""Leader election on a Lease, against the recording fake store and a fake clock."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest

from hyperplan_testing.fakes import FakeLeaseStore
from hyperplan.actuation.leadership import LeaderElector, LeaseRecord, Timing, may_take

T0 = datetime(2027, 1, 1, tzinfo=timezone.utc)
TIMING = Timing(lease_duration=15, renew_deadline=10, retry_period=2)


@dataclass
class Clock:
    """Monotonic seconds and the wall time that goes with them."""

    t: float = 100.0

    def monotonic(self) -> float:
        return self.t

    def wall(self) -> datetime:
        return T0 + timedelta(seconds=self.t)


def elector(store: FakeLeaseStore, identity: str, clock: Clock) -> LeaderElector:
    return LeaderElector(store, identity, TIMING, wall=clock.wall, monotonic=clock.monotonic)


@pytest.mark.parametrize("record, seen_for, expected", [
    (None, 0, True),
    (LeaseRecord("a", 15), 0, True),
    (LeaseRecord("", 1), 0, True),
    (LeaseRecord("b", 15), 14.9, False),
    (LeaseRecord("b", 15), 15, True),
    (LeaseRecord("b", 1), 1, True),
], ids=["no-lease", "ours", "released", "held-fresh", "held-expired", "released-short"])
def test_may_take(record: LeaseRecord | None, seen_for: float, expected: bool) -> None:
    assert may_take(record, "a", seen_for) is expected


def test_first_replica_creates_the_lease_and_the_second_waits_for_its_expiry() -> None:
    store, clock = FakeLeaseStore(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert a.try_acquire_or_renew()
    assert store.record.holder == "a" and store.record.duration_seconds == 15
    assert not b.try_acquire_or_renew()

    # a renews: b keeps seeing a changing record, so a never expires in b's eyes.
    for _ in range(10):
        clock.t += 2
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert store.record.transitions == 0

    # a dies (no more renewals): b takes over only once a whole lease duration has passed.
    clock.t += 14
    assert not b.try_acquire_or_renew()
    clock.t += 1.5
    assert b.try_acquire_or_renew()
    assert store.record.holder == "b" and store.record.transitions == 1
    assert store.record.acquire_time == clock.wall()
    # a comes back (a restarted process with a new identity would too): it is now the standby.
    assert not a.try_acquire_or_renew()


def test_release_hands_over_at_the_next_attempt() -> None:
    store, clock = FakeLeaseStore(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert a.try_acquire_or_renew()
    a.is_leader = True
    assert not b.try_acquire_or_renew()
    assert a.release()
    assert store.record.holder == "" and store.record.duration_seconds == 1
    assert b.try_acquire_or_renew()  # no waiting for the lease duration
    assert store.record.holder == "b"
    assert not a.release()  # not the leader any more: writes nothing
    assert store.writes[-1][1].holder == "b"


def test_the_same_identity_reacquires_at_once_after_a_restart() -> None:
    """A container restarted in the same pod keeps its identity (the pod name)."""
    store, clock = FakeLeaseStore(), Clock()
    assert elector(store, "pod-0", clock).try_acquire_or_renew()
    clock.t += 1
    assert elector(store, "pod-0", clock).try_acquire_or_renew()
    assert store.record.transitions == 0


def test_a_racing_write_loses_on_the_resource_version() -> None:
    store, clock = FakeLeaseStore(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b's clock for a's record starts when b first sees it
    clock.t += 20
    stale = store.record
    assert b.try_acquire_or_renew()  # b took the expired lease ...
    # ... and a write based on the version a read before that is refused.
    assert store.replace(stale) is None
    assert store.record.holder == "b"


def test_unreachable_api_server_means_not_leading_and_no_crash() -> None:
    store, clock = FakeLeaseStore(), Clock()
    a = elector(store, "a", clock)
    store.fail_reads = True
    assert not a.try_acquire_or_renew()
    assert store.writes == []


def test_leader_gives_up_after_the_renew_deadline() -> None:
    store = FakeLeaseStore()
    a = LeaderElector(store, "a", Timing(lease_duration=3, renew_deadline=0.2, retry_period=0.05))
    assert a.try_acquire_or_renew()
    a.is_leader = True
    store.fail_reads = True  # the API server goes away
    started = time.monotonic()
    assert a.renew_until_lost(threading.Event()) is False
    assert 0.2 <= time.monotonic() - started < 2
    assert not a.is_leader


class HangingStore(FakeLeaseStore):
    """Reads that take longer than the whole renew deadline (a hung API server)."""

    def get(self):
        if self.fail_reads:
            time.sleep(0.3)
            raise TimeoutError("read timed out")
        return super().get()


def test_a_hung_renewal_is_judged_by_the_deadline_not_by_the_call() -> None:
    store = HangingStore()
    a = LeaderElector(store, "a", Timing(lease_duration=10, renew_deadline=0.2, retry_period=0.05))
    assert a.try_acquire_or_renew()
    store.fail_reads = True
    started = time.monotonic()
    assert a.renew_until_lost(threading.Event()) is False
    # At most one bounded call (0.3 s) past the deadline, far from the 10 s lease; the margin is
    # for a loaded machine.
    assert time.monotonic() - started < 5.0


def test_leader_steps_down_when_another_holds_the_lease() -> None:
    store = FakeLeaseStore()
    a = LeaderElector(store, "a", Timing(lease_duration=3, renew_deadline=1, retry_period=0.05))
    assert a.try_acquire_or_renew()
    store.record = LeaseRecord("b", 3, resource_version="99")  # b took it (a was paused)
    assert a.renew_until_lost(threading.Event()) is False


def test_renewing_stops_when_asked() -> None:
    store = FakeLeaseStore()
    a = LeaderElector(store, "a", Timing(lease_duration=3, renew_deadline=1, retry_period=0.05))
    assert a.try_acquire_or_renew()
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    assert a.renew_until_lost(stop) is True
    assert store.record.holder == "a"
    assert len(store.writes) >= 3  # renewed meanwhile


def test_standby_stops_waiting_when_asked() -> None:
    store, clock = FakeLeaseStore(), Clock()
    assert elector(store, "a", clock).try_acquire_or_renew()
    b = LeaderElector(store, "b", Timing(lease_duration=30, renew_deadline=10, retry_period=0.05))
    stop = asyncio.Event()

    async def scenario() -> bool:
        asyncio.get_running_loop().call_later(0.2, stop.set)
        return await asyncio.wait_for(b.acquire(stop), timeout=5)

    assert asyncio.run(scenario()) is False
    assert store.record.holder == "a"


def test_the_standby_tries_again_when_the_lease_runs_out_not_a_retry_period_later() -> None:
    store, clock = FakeLeaseStore(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert b.next_attempt_in() == 2  # nothing seen yet: the retry period
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert b.next_attempt_in() == 2
    clock.t += 14
    assert not b.try_acquire_or_renew()
    assert b.next_attempt_in() == pytest.approx(1.01)
    clock.t += 1.01
    assert b.try_acquire_or_renew()
