"""What every handler gets: settings, policy, clients, the clock, and the wake-up board."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Awaitable, Callable, TypeVar

import kopf
from kubernetes.client.rest import ApiException
from pydantic import BaseModel, ValidationError

from hyperplan import metrics

from hyperplan.actuation.kube import Kube, api_client
from hyperplan.actuation.ledger import CapacityLedger, KubeLedger
from hyperplan.actuation.nodes import KubeNodePods, NodePods, NodeProvider, providers
from hyperplan.handlers.cache import WatchCache
from hyperplan.handlers.nodewatch import NodeStore
from hyperplan.planning.lending import OperatorIdentity
from hyperplan.planning.memory import GroupMemory
from hyperplan.planning.naming import TopologyKeys
from hyperplan.planning.policy import Policy, get_policy
from hyperplan.settings import Settings

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Wakeups:
    """Per-object wake-up events, so a daemon sleeps until its next boundary or a relevant change.

    Keys are ``(kind, name)``. Setting an event that nobody waits on yet is fine: the
    next sleep of that object returns at once, which is what level-based reconciles want.
    """

    def __init__(self) -> None:
        self._events: dict[tuple[str, str], asyncio.Event] = {}
        # Kinds whose objects are not woken through an Event each but by one scheduler
        # (plans: handlers.scheduler.PassScheduler): kind -> its wake function.
        self._routes: dict[str, Callable[[str], None]] = {}

    def _event(self, key: tuple[str, str]) -> asyncio.Event:
        return self._events.setdefault(key, asyncio.Event())

    def route(self, kind: str, wake: Callable[[str], None] | None) -> None:
        """Send the wake-ups of ``kind`` to ``wake`` (None: back to per-object Events)."""
        if wake is None:
            self._routes.pop(kind, None)
        else:
            self._routes[kind] = wake

    def wake(self, kind: str, name: str) -> None:
        routed = self._routes.get(kind)
        if routed is not None:
            routed(name)
            return
        self._event((kind, name)).set()

    def forget(self, kind: str, name: str) -> None:
        self._events.pop((kind, name), None)

    async def sleep(self, kind: str, name: str, until: datetime | None, clock: Clock,
                    stopped: "asyncio.Event | object") -> None:
        """Sleep until ``until`` (None: until woken), a wake-up, or the daemon being stopped."""
        event = self._event((kind, name))
        timeout = None if until is None else max(0.0, (until - clock()).total_seconds()) + 0.02
        waiters = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(stopped.wait())]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        event.clear()


@dataclass
class Runtime:
    settings: Settings
    policy: Policy
    kube: Kube
    ledger: CapacityLedger
    providers: dict[str, NodeProvider]
    keys: TopologyKeys = field(default_factory=TopologyKeys)
    me: OperatorIdentity = field(default_factory=OperatorIdentity)  # never drained, never lent
    clock: Clock = utcnow
    wakeups: Wakeups = field(default_factory=Wakeups)
    cache: WatchCache = field(default_factory=WatchCache)  # what the watches hold: the read side of passes
    # Threads for purchases, which mostly wait for the ledger's next group commit: on the loop's
    # default executor (6 threads on 2 cores) they would cap a batch at 6 and starve other passes.
    purchase_threads: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=64, thread_name_prefix="purchase"))
    # Threads for the groups' API calls (list, apply, status): on the default executor, 20 groups
    # failing at once queued their marks, promotions and backfills behind each other (bench/storm.py).
    group_threads: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=32, thread_name_prefix="group"))
    # What the operator remembers of its groups between passes (first sights of health labels,
    # vanished and releasing nodes, the plan of each group): one owner, changed on the event loop.
    groups: GroupMemory = field(default_factory=GroupMemory)
    # What a drain does to the pods on a node (the Eviction API; a recording fake in tests).
    pods: NodePods | None = None
    # Who needs waking when something changes, so a change wakes only the daemons it concerns:
    # plans not bought yet (their offerings depend on the pools).
    unbought_plans: set[str] = field(default_factory=set)
    # The nodes of groups, jobs and the free pool, from the operator's own node watch
    # (handlers.nodewatch; started by handlers.nodes.start_node_watch, which sets node_watch).
    node_store: NodeStore = field(default_factory=NodeStore)
    node_watch: Any = None
    plan_digests: dict[str, str] = field(default_factory=dict)  # see handlers.nodes.plan_digest
    # The Kueue admission controller's state (handlers.kueue.KueueState): the AdmissionChecks it
    # serves and the per-plan loops it runs. Set when its handlers start.
    kueue: Any = None
    # The one scheduler of every plan's passes (handlers.scheduler.PassScheduler), set while
    # kopf runs.
    plans: Any = None

    def __post_init__(self) -> None:
        if self.pods is None:
            self.pods = KubeNodePods(self.kube, self.me)

    def wake_unbought_plans(self) -> None:
        for name in list(self.unbought_plans):
            self.wakeups.wake("plan", name)

    def wake_groups_of(self, plan: str) -> None:
        for group in self.groups.groups_of(plan):
            self.wakeups.wake("group", group)


def build_runtime(settings: Settings) -> Runtime:
    kube = Kube(api_client(settings.kubeconfig))
    layers = settings.network_layer_labels
    me = OperatorIdentity(pod_name=settings.pod_name, namespace=settings.pod_namespace,
                          node_name=settings.node_name, pod_labels=dict(settings.operator_pod_labels))
    # The client imports an API's module on its first use (CoreV1Api: 1 to 2 s). Passes read from
    # the watch cache, so the first node create at a block start would pay it: pay it at startup.
    _ = kube.core, kube.policy
    cache = WatchCache()
    lead = None if settings.checkpoint_lead_seconds is None else timedelta(seconds=settings.checkpoint_lead_seconds)
    return Runtime(settings=settings, policy=get_policy(settings.policy, lead), kube=kube,
                   ledger=KubeLedger(kube, reads=cache), providers=providers(kube, me), me=me,
                   keys=TopologyKeys(settings.ultraserver_id_label, *layers), cache=cache)


RETRY = timedelta(seconds=5)
M = TypeVar("M", bound=BaseModel)


def status_of(model: type[M], obj: dict[str, Any]) -> M:
    """The object's status as ``model``; an empty one when it is missing or unreadable."""
    try:
        return model.model_validate(obj.get("status") or {})
    except ValidationError:
        return model()


MAX_BACKOFF = timedelta(minutes=5)
FAILURE_CONDITION = "Reconciled"


def failure_backoff(failures: int) -> timedelta:
    """How long to wait after the ``failures``-th failed pass in a row: 5 s, 10 s, 20 s ... 5 min.
    A broken object costs the operator less and less, and never holds up the others."""
    return min(RETRY * (2 ** min(max(0, failures - 1), 16)), MAX_BACKOFF)


def describe_failure(e: BaseException) -> tuple[str, str]:
    """(reason, message) of a failed pass for a condition and an Event: the API server's own
    message when it refused a call (what ``kubectl`` would print), else the error itself."""
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
    since = same["lastTransitionTime"] if same else now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return kept + [{"type": FAILURE_CONDITION, "status": "False", "reason": reason,
                    "message": f"{message} (failed {failures} time(s) in a row; next try in "
                               f"{retry_in.total_seconds():.0f}s)",
                    "lastTransitionTime": since, "observedGeneration": generation}]


def report_failure(rt: Runtime, plural: str, name: str, reason: str, message: str, failures: int,
                   retry_in: timedelta) -> None:
    """Put a failed pass on the object: the ``Reconciled=False`` condition and a Warning Event
    (sync, thread). Best effort: the object may be gone, or the API server unreachable."""
    try:
        obj = rt.kube.get_object(plural, name)
        if obj is None:
            return
        prior = (obj.get("status") or {}).get("conditions") or []
        conditions = failure_conditions(prior, reason, message, failures, retry_in, rt.clock(),
                                        obj["metadata"].get("generation"))
        rt.kube.patch_status(plural, name, {"conditions": conditions})
        if failures == 1 or failures % 5 == 0:  # an Event at the first failure, then now and then
            kopf.event(obj, type="Warning", reason="ReconcileFailed", message=message)
    except Exception as e:  # noqa: BLE001 - reporting must not fail the daemon either
        logging.getLogger("hyperplan").debug("could not report the failure on %s %s: %s", plural, name, e)


async def reconcile_forever(rt: Runtime, kind: str, key: str, label: str,
                            reconcile: Callable[[], Awaitable[datetime | None]], stopped: Any,
                            log: logging.Logger, plural: str = "", name: str = "",
                            pace: Callable[[float], float] | None = None) -> None:
    """A daemon's life: reconcile, then sleep until the pass's wake time or a wake-up; repeat.

    A failing pass never ends the daemon. It is retried with exponential backoff
    (:func:`failure_backoff`), logged as one line (the traceback at debug level), and put on
    the object as ``Reconciled=False`` with the API server's message and a Warning Event. The
    next successful pass writes the status that planning decides, without that condition.

    ``pace(seconds the pass took)``: how long to wait before a pass that a wake-up asks for (the
    wake-ups meanwhile are coalesced); never past the pass's own wake time.
    """
    failures = 0
    while not stopped:
        started = time.monotonic()
        try:
            wake_at = await reconcile()
            metrics.RECONCILES.labels(label, "ok").inc()
            failures = 0
        except Exception as e:  # noqa: BLE001 - a bad pass must not end the daemon
            metrics.RECONCILES.labels(label, "error").inc()
            failures += 1
            backoff = failure_backoff(failures)
            reason, message = describe_failure(e)
            log.warning("reconcile of %s %s failed (%d in a row; next try in %ss): %s",
                        label, key, failures, int(backoff.total_seconds()), message)
            log.debug("reconcile of %s %s failed", label, key, exc_info=True)
            if plural and name:
                await asyncio.to_thread(report_failure, rt, plural, name, reason, message, failures, backoff)
            wake_at = rt.clock() + backoff
        elapsed = time.monotonic() - started
        metrics.RECONCILE_DURATION.labels(label).observe(elapsed)
        rest = pace(elapsed) if pace is not None else 0.0
        if rest > 0 and wake_at is not None:
            rest = min(rest, max(0.0, (wake_at - rt.clock()).total_seconds()))
        if rest > 0:
            await asyncio.sleep(rest)
        await rt.wakeups.sleep(kind, key, wake_at, rt.clock, stopped)
    rt.wakeups.forget(kind, key)
