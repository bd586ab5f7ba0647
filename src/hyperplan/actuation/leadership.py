"""Leader election on a ``coordination.k8s.io/v1`` Lease: one replica acts, the others wait.

The convention is controller-runtime's (and so Karpenter's and Kueue's): a Lease in the
operator's namespace whose ``holderIdentity`` names the acting replica, renewed every
``retry_period`` and taken over by a standby once ``leaseDurationSeconds`` pass without a
renewal. Cluster admins read it with ``kubectl get lease -n <ns> hyperplan-leader``.

Why our own loop rather than ``kubernetes.leaderelection``: that module runs blocking threads
that cannot be cancelled, never releases the Lease (a rolling upgrade would then wait a whole
lease duration), and writes times from the local naive clock. kopf's peering is not a Lease at
all (its own KopfPeering resource), and a frozen kopf still runs its watchers. The API calls
go through the kubernetes client's ``CoordinationV1Api``; the decisions are small and tested
against :class:`hyperplan_testing.fakes.FakeLeaseStore`.

Like client-go, expiry is judged on the local monotonic clock from the moment this replica
last saw the record change, not from the record's ``renewTime``: two machines' clocks may
disagree, but each one's sense of elapsed time holds.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Callable, Protocol

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

log = logging.getLogger("hyperplan.leadership")


@dataclass(frozen=True)
class LeaseRecord:
    """What a Lease says about its holder (``spec``), plus the version for optimistic writes."""

    holder: str
    duration_seconds: int
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    transitions: int = 0
    resource_version: str | None = None


class LeaseStore(Protocol):
    """Read and write one Lease. ``create`` and ``replace`` return the record as stored (with
    its new resourceVersion), or None when another writer got there first."""

    def get(self) -> LeaseRecord | None: ...

    def create(self, record: LeaseRecord) -> LeaseRecord | None: ...

    def replace(self, record: LeaseRecord) -> LeaseRecord | None: ...

    def wait_for_change(self, since: LeaseRecord | None, timeout: float) -> None:
        """Block until the Lease differs from ``since`` or ``timeout`` seconds pass."""


@dataclass(frozen=True)
class Timing:
    lease_duration: float = 15.0
    """Seconds a standby waits, without seeing a renewal, before it takes the Lease."""
    renew_deadline: float = 10.0
    """Seconds the leader keeps trying to renew before it gives up leading (< lease_duration)."""
    retry_period: float = 2.0
    """Seconds between attempts to acquire or renew."""


def may_take(record: LeaseRecord | None, identity: str, seen_unchanged_for: float) -> bool:
    """Whether ``identity`` may write itself into the Lease now.

    Yes when there is no Lease, when it already holds it, when the holder released it (empty
    holder), or when the record has not changed for a whole lease duration (the holder died).
    """
    if record is None or not record.holder or record.holder == identity:
        return True
    return seen_unchanged_for >= record.duration_seconds


class LeaderElector:
    """Acquire, keep and release one Lease for ``identity``."""

    def __init__(self, store: LeaseStore, identity: str, timing: Timing = Timing(),
                 wall: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store, self.identity, self.timing = store, identity, timing
        self._wall, self._monotonic = wall, monotonic
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self.is_leader = False

    def _observe(self, record: LeaseRecord | None) -> None:
        key = None if record is None else (record.holder, record.renew_time, record.transitions)
        seen = None if self._observed is None else (
            self._observed.holder, self._observed.renew_time, self._observed.transitions)
        if record is None or key != seen:
            self._observed_at = self._monotonic()
        self._observed = record

    def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this replica holds the Lease afterwards."""
        try:
            current = self.store.get()
        except Exception as e:  # the API server may be gone for a moment: not leading, for now
            log.warning("reading the lease failed: %s", e)
            return False
        self._observe(current)
        if not may_take(current, self.identity, self._monotonic() - self._observed_at):
            return False
        now = self._wall()
        duration = max(1, round(self.timing.lease_duration))
        try:
            if current is None:
                written = self.store.create(LeaseRecord(self.identity, duration, now, now, 0))
            else:
                taking_over = current.holder != self.identity
                written = self.store.replace(replace(
                    current, holder=self.identity, duration_seconds=duration, renew_time=now,
                    acquire_time=now if taking_over else current.acquire_time,
                    transitions=current.transitions + (1 if taking_over else 0)))
        except Exception as e:
            log.warning("writing the lease failed: %s", e)
            return False
        if written is not None:
            self._observe(written)
        return written is not None

    def next_attempt_in(self) -> float:
        """Seconds to the next attempt: the retry period, or less when the holder's Lease runs
        out sooner in this replica's eyes (so a dead leader is replaced on time, not up to a
        retry period late)."""
        if self._observed is None or not self._observed.holder:
            return self.timing.retry_period
        expires_in = self._observed_at + self._observed.duration_seconds - self._monotonic()
        return min(self.timing.retry_period, max(0.05, expires_in + 0.01))

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this replica holds the Lease (True) or ``stop`` is set (False)."""
        announced = False
        while not stop.is_set():
            if await asyncio.to_thread(self.try_acquire_or_renew):
                self.is_leader = True
                return True
            if not announced and self._observed is not None:
                log.info("standing by: lease held by %s", self._observed.holder)
                announced = True
            # Watch the Lease meanwhile: a leader that releases it on SIGTERM is followed at once.
            stopping = asyncio.ensure_future(stop.wait())
            changed = asyncio.ensure_future(asyncio.to_thread(
                self.store.wait_for_change, self._observed, self.next_attempt_in()))
            await asyncio.wait({stopping, changed}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if changed.done() and changed.exception() is not None:
                log.debug("watching the lease failed: %s", changed.exception())
        return False

    def renew_until_lost(self, stop: threading.Event) -> bool:
        """Renew every retry period until ``stop`` is set (True) or the Lease is lost (False).

        Runs on a thread of its own, never on the event loop or its shared thread pool: a leader
        busy starting kopf or creating hundreds of nodes must still renew on time, and the renew
        deadline is judged on this thread's clock between bounded attempts (each API call has a
        request timeout), not after a call that waited in a queue. Lost means: no successful
        renewal for the renew deadline, or another holder seen in the Lease.
        """
        last_renewed = self._monotonic()
        while not stop.wait(self.timing.retry_period):
            attempt = self._monotonic()
            renewed = self.try_acquire_or_renew()
            took = self._monotonic() - attempt
            if took > self.timing.renew_deadline / 4:  # what starves a renewal shows in the log
                log.warning("renewing the lease took %.1fs (%s; renew deadline %gs)", took,
                            "renewed" if renewed else "not renewed", self.timing.renew_deadline)
            if renewed:
                last_renewed = self._monotonic()
            elif self._monotonic() - last_renewed >= self.timing.renew_deadline or (
                    self._observed is not None and self._observed.holder not in ("", self.identity)):
                self.is_leader = False
                return False
        return True

    def release(self) -> bool:
        """Give the Lease up at once (empty holder, 1 s duration) so a standby takes over now."""
        if not self.is_leader:
            return False
        self.is_leader = False
        try:
            current = self.store.get()
            if current is None or current.holder != self.identity:
                return False
            return self.store.replace(replace(current, holder="", duration_seconds=1,
                                              renew_time=self._wall())) is not None
        except Exception as e:
            log.warning("releasing the lease failed: %s", e)
            return False


def _micro(moment: datetime | None) -> datetime | None:
    return moment.astimezone(timezone.utc) if moment else None


@dataclass
class KubeLeaseStore:
    """A :class:`LeaseStore` on a real ``coordination.k8s.io/v1`` Lease. Every call is bounded
    by ``request_timeout`` so that a hung API server cannot stall the renew-deadline check."""

    api: client.ApiClient
    namespace: str
    name: str
    request_timeout: float = 5.0

    @property
    def _coordination(self) -> client.CoordinationV1Api:
        return client.CoordinationV1Api(self.api)

    def get(self) -> LeaseRecord | None:
        try:
            lease = self._coordination.read_namespaced_lease(self.name, self.namespace,
                                                             _request_timeout=self.request_timeout)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return self._record(lease)

    @staticmethod
    def _record(lease: client.V1Lease) -> LeaseRecord:
        spec = lease.spec
        return LeaseRecord(spec.holder_identity or "", spec.lease_duration_seconds or 0,
                           spec.acquire_time, spec.renew_time, spec.lease_transitions or 0,
                           lease.metadata.resource_version)

    def _body(self, record: LeaseRecord) -> client.V1Lease:
        return client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace,
                                         resource_version=record.resource_version,
                                         labels={"app.kubernetes.io/name": "hyperplan"}),
            spec=client.V1LeaseSpec(holder_identity=record.holder or None,
                                    lease_duration_seconds=record.duration_seconds,
                                    acquire_time=_micro(record.acquire_time),
                                    renew_time=_micro(record.renew_time),
                                    lease_transitions=record.transitions))

    def create(self, record: LeaseRecord) -> LeaseRecord | None:
        try:
            return self._record(self._coordination.create_namespaced_lease(
                self.namespace, self._body(record), _request_timeout=self.request_timeout))
        except ApiException as e:
            if e.status == 409:
                return None
            raise

    def wait_for_change(self, since: LeaseRecord | None, timeout: float) -> None:
        stream = watch.Watch()
        try:
            for _ in stream.stream(self._coordination.list_namespaced_lease, self.namespace,
                                   field_selector=f"metadata.name={self.name}",
                                   resource_version=since.resource_version if since else None,
                                   timeout_seconds=max(1, int(timeout + 0.999)),
                                   _request_timeout=timeout + 5):
                return  # any event: the Lease was written (or created, or deleted)
        except ApiException as e:
            if e.status != 410:  # 410: our version is too old; the caller reads it again
                raise
        finally:
            stream.stop()

    def replace(self, record: LeaseRecord) -> LeaseRecord | None:
        try:
            return self._record(self._coordination.replace_namespaced_lease(
                self.name, self.namespace, self._body(record), _request_timeout=self.request_timeout))
        except ApiException as e:
            if e.status == 409:
                return None
            raise


_kube: type[LeaseStore] = KubeLeaseStore
