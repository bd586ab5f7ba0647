"""The one work queue of every kind the operator reconciles: plans, groups and Kueue's plans.

A kind registers its pass (``reconcile(name)``, which returns when to look again, None: only
when woken) with :meth:`WorkQueue.register`; anything that changes what a pass reads wakes the
object's key with :meth:`WorkQueue.wake`. Between passes an object costs only what is due:

- a timer while it has a next boundary (the wake time its last pass returned: controller-runtime's
  ``RequeueAfter``; the time a pass returns replaces the timer, whether earlier or later);
- its name in its kind's ready queue while a wake waits for a worker;
- a failure count while its passes fail (for the backoff);
- a rest timer while a paced kind rests after a long pass.

**Keys are (kind, name) in one queue, with a lane per kind.** One queue, because what every
loop needs is the same and is written once here: a key is never in two workers at once; a wake
that arrives during its pass runs it once more afterwards (the pass may have read the world
before the change); wakes of a queued key collapse into its one queued pass; failures back off
and are reported in one place. A lane per kind (its own ready queue and workers), because the
kinds' passes must not wait for each other: 10,000 plans falling due at one block boundary
must not hold the worker a group's spare promotion needs, and a group's pass may take a second
of node creates. Each lane also carries what differs by kind: the label of its metrics and logs,
the plural its failures are reported on, how a key names its object (a group's key is the label
value of its name, which its nodes carry), and its pacing.

**Pacing** (optional per kind, :class:`Pace`): a pass that took longer than ``Pace.start``
rests as long as it took, at most ``Pace.most``, before a pass that a wake asks for (the wakes
meanwhile collapse into one); a pass its own wake time asks for is never delayed, since the
rest never runs past that time. A kind keeps at most about half of the event loop that way.

**Failures.** A failing pass never stops the queue: it is retried with exponential backoff
(:func:`failure_backoff`), logged as one line (the traceback at debug level), counted in the
metrics, and, for a kind registered with a plural, reported on the object as
``Reconciled=False`` with the API server's message and a Warning Event (:func:`report_failure`).
The next successful pass writes the status that planning decides, without that condition.

**Seams.** The clock (``clock``: the time wake times are read against), the monotonic clock
that measures a pass (``monotonic``) and the timer (``timer(delay, callback)``, returning a
handle with ``cancel()``) are injected, so the semantics are unit-tested with a fake clock and
no real sleeping (tests/unit/test_workqueue.py).

**Life.** Create and use it on the event loop (kopf's). Kinds register from startup handlers;
:meth:`start` runs from inside a kopf handler, so that the workers' tasks inherit its context,
which holds kopf's queue for posting Events (``kopf.event`` fails outside one); :meth:`stop`
from a cleanup handler. Wakes before the start wait in their queue.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Awaitable, Callable, Protocol

import kopf
from kubernetes.client.rest import ApiException

from hyperplan import metrics
from hyperplan.actuation.remote.calls import RemoteError
from hyperplan.api.vocabulary import CONDITION_RECONCILED, to_rfc3339

log = logging.getLogger("hyperplan.workqueue")
WORKERS = 64  # passes of one kind in flight at once (a pass mostly waits: a purchase, a status patch)
STOP_GRACE = 10.0  # seconds running passes get to finish when the queue stops
WAKE_SLACK = 0.02  # seconds after a boundary, so that a pass at it sees the boundary passed
RETRY = timedelta(seconds=5)  # the first backoff after a failed pass
MAX_BACKOFF = timedelta(minutes=5)
FAILURE_CONDITION = CONDITION_RECONCILED

Key = tuple[str, str]  # (kind, name)
Reconcile = Callable[[str], Awaitable[datetime | None]]
# (plural, object name, reason, message, failures in a row, next try in): puts a failed pass on
# the object (sync; run on a thread).
Report = Callable[[str, str, str, str, int, timedelta], None]


class Handle(Protocol):
    def cancel(self) -> None: ...


Timer = Callable[[float, Callable[[], None]], Handle]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def loop_timer(delay: float, callback: Callable[[], None]) -> Handle:
    """``callback()`` on the running event loop after ``delay`` seconds."""
    return asyncio.get_running_loop().call_later(delay, callback)


@dataclass(frozen=True)
class Pace:
    """How long a key rests after a pass before one that a wake asks for: nothing after a pass
    shorter than ``start`` seconds, else as long as the pass took, at most ``most`` seconds."""

    start: float
    most: float

    def rest(self, seconds: float) -> float:
        return 0.0 if seconds < self.start else min(seconds, self.most)


SLOW_PASS = 2.0  # seconds: a pass longer than this logs where its time went


class PassPhases:
    """Where one pass's time went, phase by phase (``mark(name)`` ends the phase so named): logged
    at info level when the pass took longer than :data:`SLOW_PASS`, else at debug level. A slow
    pass at a block's start is what a user sees as nodes coming late; its phases say whether
    the reads, the creates or the status writes held it."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic):
        self._monotonic = monotonic
        self._start = self._last = monotonic()
        self.phases: list[tuple[str, float]] = []

    def mark(self, phase: str) -> None:
        now = self._monotonic()
        self.phases.append((phase, now - self._last))
        self._last = now

    def report(self, what: str, writes: int) -> None:
        total = self._last - self._start
        level = logging.INFO if total > SLOW_PASS else logging.DEBUG
        if log.isEnabledFor(level):
            log.log(level, "%s: pass took %.2f s with %d create(s): %s", what, total, writes,
                    ", ".join(f"{phase} {seconds:.2f}" for phase, seconds in self.phases))


@dataclass
class Lane:
    """One kind's pass, its ready queue and its workers."""

    kind: str
    reconcile: Reconcile | None = None  # None until the kind registers (its wakes wait)
    label: str = ""  # the kind as metrics and logs name it (TrainingPlan)
    plural: str = ""  # where failures are reported ("": logged only)
    name_of: Callable[[str], str | None] = lambda name: name  # the object a key names (None: unknown)
    pace: Pace | None = None
    workers: int = WORKERS
    ready: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    tasks: list[asyncio.Task] = field(default_factory=list)


@dataclass
class _Timer:
    handle: Handle
    due: float  # on the monotonic clock


class WorkQueue:
    """Runs the passes of every registered kind when their keys are woken or fall due."""

    def __init__(self, clock: Callable[[], datetime] = utcnow, *, timer: Timer = loop_timer,
                 monotonic: Callable[[], float] = time.monotonic, report: Report | None = None) -> None:
        self._clock = clock
        self._timer = timer
        self._monotonic = monotonic
        self._report = report
        self._lanes: dict[str, Lane] = {}
        self._queued: set[Key] = set()  # in a ready queue
        self._running: set[Key] = set()
        self._again: set[Key] = set()  # woken during its pass: once more after it
        self._deferred: set[Key] = set()  # woken while resting: once more when the rest ends
        self._resting: dict[Key, Handle] = {}
        self._timers: dict[Key, _Timer] = {}
        self._failures: dict[Key, int] = {}
        self._quiet: dict[Key, list[asyncio.Future]] = {}
        self._started = False
        self._stopped = False
        self._idle = asyncio.Event()  # set while no pass runs
        self._idle.set()

    # ------------------------------------------------------------------ life

    def register(self, kind: str, reconcile: Reconcile, *, label: str, plural: str = "",
                 name_of: Callable[[str], str | None] | None = None, pace: Pace | None = None,
                 workers: int = WORKERS) -> None:
        """Pass over the keys of ``kind`` with ``reconcile``. Wakes that came before wait in its
        queue; once the queue has started, the kind's workers start at once."""
        lane = self._lane(kind)
        lane.reconcile, lane.label, lane.plural, lane.pace, lane.workers = reconcile, label, plural, pace, workers
        if name_of is not None:
            lane.name_of = name_of
        if self._started:
            self._start_lane(lane)

    def start(self) -> None:
        """Start the workers of every registered kind (idempotent; never again once stopped)."""
        if self._started or self._stopped:
            return
        self._started = True
        for lane in self._lanes.values():
            self._start_lane(lane)

    def _start_lane(self, lane: Lane) -> None:
        if lane.reconcile is not None and not lane.tasks and not self._stopped:
            lane.tasks = [asyncio.create_task(self._work(lane), name=f"{lane.label}-pass-{i}")
                          for i in range(lane.workers)]

    async def stop(self, grace: float = STOP_GRACE) -> None:
        """Take no new passes; give the running ones ``grace`` seconds, then cancel them."""
        self._stopped = True
        for timer in self._timers.values():
            timer.handle.cancel()
        for handle in self._resting.values():
            handle.cancel()
        self._timers.clear()
        self._resting.clear()
        self._queued.clear()
        self._again.clear()
        self._deferred.clear()
        for lane in self._lanes.values():
            while not lane.ready.empty():
                lane.ready.get_nowait()
        if self._running:
            expired = asyncio.Event()
            handle = self._timer(grace, expired.set)
            idle, timeout = asyncio.ensure_future(self._idle.wait()), asyncio.ensure_future(expired.wait())
            await asyncio.wait({idle, timeout}, return_when=asyncio.FIRST_COMPLETED)
            handle.cancel()
            idle.cancel()
            timeout.cancel()
            if self._running:
                log.warning("%d pass(es) still running after %gs: cancelled", len(self._running), grace)
        tasks = [task for lane in self._lanes.values() for task in lane.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for lane in self._lanes.values():
            lane.tasks = []
        for key in list(self._quiet):
            self._release_quiet(key)

    # ------------------------------------------------------------------ wakes

    def wake(self, kind: str, name: str) -> None:
        """Pass over ``name`` as soon as a worker of ``kind`` is free (after its running pass,
        or after its rest, if any)."""
        if self._stopped:
            return
        key = (kind, name)
        if key in self._running:
            self._again.add(key)
        elif key in self._resting:
            self._deferred.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._lane(kind).ready.put_nowait(name)

    def wake_at(self, kind: str, name: str, when: datetime | None) -> None:
        """Pass over ``name`` at ``when``, replacing its timer (None: no timer)."""
        key = (kind, name)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.handle.cancel()
        if when is None or self._stopped:
            return
        delay = max(0.0, (when - self._clock()).total_seconds()) + WAKE_SLACK
        self._timers[key] = _Timer(self._timer(delay, lambda: self._due(key)), self._monotonic() + delay)

    def forget(self, kind: str, name: str) -> None:
        """The object is gone: drop its timer, its rest and its failure count (a pass already
        queued or asked for finds it gone)."""
        key = (kind, name)
        self.wake_at(kind, name, None)
        self._failures.pop(key, None)
        rest = self._resting.pop(key, None)
        if rest is not None:
            rest.cancel()
        self._deferred.discard(key)

    async def quiet(self, kind: str, name: str) -> None:
        """Return once no pass of ``name`` runs (at once when none does)."""
        key = (kind, name)
        if key not in self._running:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._quiet.setdefault(key, []).append(waiter)
        await waiter

    def _due(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.wake(*key)

    def _rested(self, key: Key) -> None:
        self._resting.pop(key, None)
        if key in self._deferred:
            self._deferred.discard(key)
            self.wake(*key)

    def _lane(self, kind: str) -> Lane:
        lane = self._lanes.get(kind)
        if lane is None:
            lane = self._lanes[kind] = Lane(kind)
        return lane

    # ------------------------------------------------------------------ what it holds (tests, diagnostics)

    def holds(self) -> dict[str, int]:
        return {"timers": len(self._timers), "queued": len(self._queued), "running": len(self._running),
                "again": len(self._again), "resting": len(self._resting), "failing": len(self._failures)}

    def due_in(self, kind: str, name: str) -> float | None:
        """Seconds until the timer of ``name`` fires (None: no timer)."""
        timer = self._timers.get((kind, name))
        return None if timer is None else timer.due - self._monotonic()

    def woken(self, kind: str, name: str) -> bool:
        """Whether a pass of ``name`` waits: queued, asked for during its pass, or after its rest."""
        key = (kind, name)
        return key in self._queued or key in self._again or key in self._deferred

    # ------------------------------------------------------------------ passes

    async def _work(self, lane: Lane) -> None:
        while True:
            name = await lane.ready.get()
            key = (lane.kind, name)
            if key not in self._queued:  # dropped by stop()
                continue
            self._queued.discard(key)
            self._running.add(key)
            self._idle.clear()
            try:
                when, seconds = await self._pass(lane, name)
            finally:
                self._running.discard(key)
                if not self._running:
                    self._idle.set()
                self._release_quiet(key)
            self._after(lane, name, when, seconds)

    async def _pass(self, lane: Lane, name: str) -> tuple[datetime | None, float]:
        """One pass, its metrics, and on failure its backoff and report: (wake time, seconds)."""
        key = (lane.kind, name)
        started = self._monotonic()
        try:
            when = await lane.reconcile(name)
            metrics.RECONCILES.labels(lane.label, "ok").inc()
            self._failures.pop(key, None)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a bad pass must not end the queue
            metrics.RECONCILES.labels(lane.label, "error").inc()
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            backoff = failure_backoff(failures)
            reason, message = describe_failure(e)
            log.warning("reconcile of %s %s failed (%d in a row; next try in %ss): %s",
                        lane.label, name, failures, int(backoff.total_seconds()), message)
            log.debug("reconcile of %s %s failed", lane.label, name, exc_info=True)
            target = lane.name_of(name) if lane.plural else None
            if self._report is not None and target:
                await asyncio.to_thread(self._report, lane.plural, target, reason, message, failures, backoff)
            when = self._clock() + backoff
        seconds = self._monotonic() - started
        metrics.RECONCILE_DURATION.labels(lane.label).observe(seconds)
        return when, seconds

    def _after(self, lane: Lane, name: str, when: datetime | None, seconds: float) -> None:
        """Set the key's timer; then run it again at once, or after its rest, if it was woken."""
        key = (lane.kind, name)
        self.wake_at(lane.kind, name, when)
        again = key in self._again
        self._again.discard(key)
        rest = lane.pace.rest(seconds) if lane.pace is not None else 0.0
        if rest > 0 and when is not None:  # never past the pass's own wake time
            rest = min(rest, max(0.0, (when - self._clock()).total_seconds()))
        if rest > 0 and not self._stopped:
            self._resting[key] = self._timer(rest, lambda: self._rested(key))
            if again:
                self._deferred.add(key)
        elif again:
            self.wake(lane.kind, name)

    def _release_quiet(self, key: Key) -> None:
        for waiter in self._quiet.pop(key, []):
            if not waiter.done():
                waiter.set_result(None)


# --------------------------------------------------------------------------- failures


def failure_backoff(failures: int) -> timedelta:
    """How long to wait after the ``failures``-th failed pass in a row: 5 s, 10 s, 20 s ... 5 min.
    A broken object costs the operator less and less, and never holds up the others."""
    return min(RETRY * (2 ** min(max(0, failures - 1), 16)), MAX_BACKOFF)


def describe_failure(e: BaseException) -> tuple[str, str]:
    """(reason, message) of a failed pass for a condition and an Event: the API server's own
    message when it refused a call (what ``kubectl`` would print), a remote SageMaker endpoint's
    (actuation.remote.RemoteError: which endpoint, which call, its error code), else the error itself."""
    if isinstance(e, RemoteError):
        return ("RemoteRefused" if e.refused else "RemoteUnavailable"), str(e)[:1000]
    if isinstance(e, ApiException):
        try:
            message = json.loads(e.body or "{}").get("message") or e.reason
        except (ValueError, AttributeError):
            message = e.reason
        return "ApiError", f"the API server refused a call ({e.status}): {message}"[:1000]
    return "ReconcileError", f"{type(e).__name__}: {e}"[:1000]


def failure_conditions(prior: list[dict[str, Any]], reason: str, message: str, failures: int,
                       retry_in: timedelta, now: datetime, generation: int | None) -> list[dict[str, Any]]:
    """The object's conditions with ``Reconciled=False`` set (the others kept as they are)."""
    kept = [c for c in prior if c.get("type") != FAILURE_CONDITION]
    same = next((c for c in prior if c.get("type") == FAILURE_CONDITION and c.get("status") == "False"), None)
    since = same["lastTransitionTime"] if same else to_rfc3339(now)
    return kept + [{"type": FAILURE_CONDITION, "status": "False", "reason": reason,
                    "message": f"{message} (failed {failures} time(s) in a row; next try in "
                               f"{retry_in.total_seconds():.0f}s)",
                    "lastTransitionTime": since, "observedGeneration": generation}]


def report_failure(kube: Any, clock: Callable[[], datetime], plural: str, name: str, reason: str, message: str,
                   failures: int, retry_in: timedelta) -> None:
    """Put a failed pass on the object: the ``Reconciled=False`` condition and a Warning Event
    (sync, thread). Best effort: the object may be gone, or the API server unreachable.
    ``kube``: the operator's :class:`~hyperplan.actuation.kube.Kube` (the runtime injects it)."""
    try:
        obj = kube.get_object(plural, name)
        if obj is None:
            return
        prior = (obj.get("status") or {}).get("conditions") or []
        conditions = failure_conditions(prior, reason, message, failures, retry_in, clock(),
                                        obj["metadata"].get("generation"))
        kube.patch_status(plural, name, {"conditions": conditions})
        if failures == 1 or failures % 5 == 0:  # an Event at the first failure, then now and then
            kopf.event(obj, type="Warning", reason="ReconcileFailed", message=message)
    except Exception as e:  # noqa: BLE001 - reporting must not fail the queue either
        log.debug("could not report the failure on %s %s: %s", plural, name, e)
