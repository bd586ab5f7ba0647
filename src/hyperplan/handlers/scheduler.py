"""One scheduler for the passes of every object of a kind, instead of a kopf daemon per object.

A kopf daemon per TrainingPlan cost each plan an asyncio task with its coroutine frames, kopf's
daemon record and stopper, an ``asyncio.Event`` of its own, and kopf's copy of the plan's last
raw body (``managedFields`` and annotations included) kept for the daemon's arguments; at 5,000
plans the operator held about 97 KiB per plan (docs/benchmarks.md, 5.4). A plan's pass needs
none of it: it reads the plan from the watch cache by name.

:class:`PassScheduler` keeps, per object, only what is due:

- a timer handle on the event loop while the object has a next boundary (its pass's wake time);
- its name in the ready queue while a wake-up waits for a worker;
- a failure count while its passes fail (for the backoff).

A fixed set of worker tasks takes names from the queue and runs one pass each. A wake-up of an
object whose pass is running makes one more pass after it (the pass may have read the world
before the change); wake-ups of a queued object collapse into its one queued pass. Passes of
different objects run concurrently, up to the number of workers; passes of one object never do.

A failing pass never stops the scheduler: as the daemons did (``handlers.context``), it is
retried with exponential backoff, logged as one line, and reported on the object as
``Reconciled=False`` with a Warning Event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime
from typing import Any, Awaitable, Callable

from hyperplan import metrics
from hyperplan.handlers.context import describe_failure, failure_backoff, report_failure

log = logging.getLogger("hyperplan.scheduler")
WORKERS = 64  # passes in flight at once (a pass mostly waits: a purchase, a status patch)
STOP_GRACE = 10.0  # seconds running passes get to finish when the scheduler stops
WAKE_SLACK = 0.02  # seconds after a boundary, so that a pass at it sees the boundary passed


class PassScheduler:
    """Runs ``reconcile(name)`` for the objects of one kind when they are woken or fall due.

    ``reconcile`` returns when to look again (None: only when woken). Create and use it on the
    event loop (kopf's), from a startup handler; :meth:`stop` it from a cleanup handler.
    """

    def __init__(self, label: str, reconcile: Callable[[str], Awaitable[datetime | None]],
                 clock: Callable[[], datetime], rt: Any = None, plural: str = "", workers: int = WORKERS) -> None:
        self.label = label  # the kind as metrics and logs name it (TrainingPlan)
        self._reconcile = reconcile
        self._clock = clock
        self._rt = rt  # for reporting failed passes on the object (None: log only)
        self._plural = plural
        self._workers_wanted = workers
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._running: set[str] = set()
        self._again: set[str] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._failures: dict[str, int] = {}
        self._workers: list[asyncio.Task] = []
        self._stopped = False
        self._idle = asyncio.Event()  # set while no pass runs
        self._idle.set()

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        """Start the workers (idempotent; never again once stopped)."""
        if not self._workers and not self._stopped:
            self._workers = [asyncio.create_task(self._work(), name=f"{self.label}-pass-{i}")
                             for i in range(self._workers_wanted)]

    async def stop(self, grace: float = STOP_GRACE) -> None:
        """Take no new passes; give the running ones ``grace`` seconds, then cancel them."""
        self._stopped = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._queued.clear()
        while not self._queue.empty():
            self._queue.get_nowait()
        if self._running:
            try:
                await asyncio.wait_for(self._idle.wait(), timeout=grace)
            except asyncio.TimeoutError:
                log.warning("%s passes still running after %gs: cancelled", self.label, grace)
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []

    # ------------------------------------------------------------------ wake-ups

    def wake(self, name: str) -> None:
        """Pass over ``name`` as soon as a worker is free (after its running pass, if any)."""
        if name in self._running:
            self._again.add(name)
        elif name not in self._queued:
            self._queued.add(name)
            self._queue.put_nowait(name)

    def wake_at(self, name: str, when: datetime | None) -> None:
        """Pass over ``name`` at ``when`` (replacing its earlier time; None: none)."""
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()
        if when is None:
            return
        delay = max(0.0, (when - self._clock()).total_seconds()) + WAKE_SLACK
        self._timers[name] = asyncio.get_running_loop().call_later(delay, self._due, name)

    def forget(self, name: str) -> None:
        """``name`` is gone: drop its timer and failure count (a queued pass finds it gone)."""
        self.wake_at(name, None)
        self._failures.pop(name, None)

    def _due(self, name: str) -> None:
        self._timers.pop(name, None)
        self.wake(name)

    # ------------------------------------------------------------------ what it holds (tests, diagnostics)

    def holds(self) -> dict[str, int]:
        return {"timers": len(self._timers), "queued": len(self._queued), "running": len(self._running),
                "again": len(self._again), "failing": len(self._failures)}

    def due_at(self, name: str) -> float | None:
        """Seconds until ``name``'s timer fires (None: no timer)."""
        timer = self._timers.get(name)
        return None if timer is None else timer.when() - asyncio.get_running_loop().time()

    # ------------------------------------------------------------------ passes

    async def _work(self) -> None:
        while True:
            name = await self._queue.get()
            if name not in self._queued:  # dropped by stop()
                continue
            self._queued.discard(name)
            self._running.add(name)
            self._idle.clear()
            try:
                await self._pass(name)
            finally:
                self._running.discard(name)
                if not self._running:
                    self._idle.set()
                if name in self._again:
                    self._again.discard(name)
                    self.wake(name)

    async def _pass(self, name: str) -> None:
        started = time.monotonic()
        try:
            when = await self._reconcile(name)
            metrics.RECONCILES.labels(self.label, "ok").inc()
            self._failures.pop(name, None)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a bad pass must not end the scheduler
            metrics.RECONCILES.labels(self.label, "error").inc()
            failures = self._failures[name] = self._failures.get(name, 0) + 1
            backoff = failure_backoff(failures)
            reason, message = describe_failure(e)
            log.warning("reconcile of %s %s failed (%d in a row; next try in %ss): %s",
                        self.label, name, failures, int(backoff.total_seconds()), message)
            log.debug("reconcile of %s %s failed", self.label, name, exc_info=True)
            if self._rt is not None and self._plural:
                await asyncio.to_thread(report_failure, self._rt, self._plural, name, reason, message,
                                        failures, backoff)
            when = self._clock() + backoff
        metrics.RECONCILE_DURATION.labels(self.label).observe(time.monotonic() - started)
        self.wake_at(name, when)
