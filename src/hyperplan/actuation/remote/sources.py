"""The sellers of every remote pool, made once per source and credentials (:class:`RemoteSources`,
:func:`make_seller`), their paced reads (:class:`RemoteFollower`) and the credentials Secrets
(:func:`secret_credentials`)."""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from hyperplan.actuation.remote.calls import CapacitySeller, RemoteError
from hyperplan.actuation.remote.capacity_blocks import CapacityBlocks
from hyperplan.actuation.remote.sagemaker import SageMakerCapacity
from hyperplan.api.models import Ec2CapacityBlocksSource, RemoteSource, SageMakerSource
from hyperplan.planning.remote import (
    RemoteExtension,
    RemotePlan,
)

log = logging.getLogger("hyperplan.remote")


def make_seller(source: RemoteSource, credentials: tuple[str, str] | None) -> CapacitySeller:
    """The seller of a pool's source: the one place that tells the kinds of source apart."""
    if isinstance(source, Ec2CapacityBlocksSource):

        return CapacityBlocks(source, credentials)
    assert isinstance(source, SageMakerSource), source
    return SageMakerCapacity(source, credentials)


@dataclass
class _Listing:
    plans: dict[str, RemotePlan] = field(default_factory=dict)
    at: float | None = None
    took: float = 0.0  # seconds the last listing took
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The plans this process made or described, by name, and when: kept over a listing that does
    # not show them yet (until one does, or for SEEN_KEPT), see RemoteFollower.plans.
    seen: dict[str, float] = field(default_factory=dict)
    # Live plans an earlier listing showed and the last one did not, kept over that one listing.
    carried: set[str] = field(default_factory=set)


LISTING_SHARE = 0.1  # a listing is made again no sooner than 10 times as long as the last one took


SEEN_KEPT = 300.0  # seconds a plan this process made is believed over listings that do not show it


class RemoteFollower:
    """The remote plans of each pool as its endpoint last listed them (see the module's doc)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._listings: dict[str, _Listing] = {}
        self._lock = threading.Lock()

    def _listing(self, pool: str) -> _Listing:
        with self._lock:
            return self._listings.setdefault(pool, _Listing())

    def plans(self, key: str, capacity: CapacitySeller, max_age: float) -> list[RemotePlan]:
        """The remote plans of one endpoint and key, listed at most ``max_age`` seconds ago
        (sync: a thread)."""
        listing = self._listing(key)
        asked = self.clock()
        with listing.lock:  # one list at a time per endpoint: a caller that waited sees the fresh answer
            # No sooner than the caller asks, nor than keeps the listings to a tenth of the time
            # (an endpoint with 10,000 plans takes long to page through: it is asked less often).
            if listing.at is None or asked - listing.at >= max(max_age, listing.took / LISTING_SHARE):
                at = self.clock()
                listed = {p.name: p for p in capacity.remote_plans()}
                fresh = dict(listed)
                for name, since in list(listing.seen.items()):
                    if name in fresh or at - since > SEEN_KEPT:
                        del listing.seen[name]  # the listing caught up (or never will: it is believed)
                    elif name in listing.plans:
                        log.info("the listing of %s does not show the remote plan %s it answered %.1f s ago; "
                                 "kept as it was answered", getattr(capacity, "endpoint", "?"), name, at - since)
                        fresh[name] = listing.plans[name]
                # A listing paged while the plans change can miss a live plan it showed before (a
                # plan the remote just bought moves in the order of StartTime, past the page being
                # read): its buyer then searched and bought again under its name (ResourceInUse,
                # seen in the remote bench). Such a plan is kept over one listing that lacks it; one
                # gone for good is missing from the next as well.
                for name, before in listing.plans.items():
                    if name not in fresh and before.live and name not in listing.carried:
                        fresh[name] = before
                listing.carried = {name for name in fresh if name not in listed and name not in listing.seen}
                listing.plans = fresh
                listing.at, listing.took = at, self.clock() - at
            return list(listing.plans.values())

    def saw(self, pool: str, plan: RemotePlan) -> None:
        """A plan this process just made or described (its answer is newer than the listing).

        A remote's listing may lag its own answers: AWS's reads are eventually consistent, and
        hyperplan's SageMaker API lists from a watch cache. A plan bought a moment ago and missing
        from the next listing would be searched for again (and its own purchase, which took the
        capacity, would then leave nothing to find: NoCapacity, seen in e2e). So it is kept over
        listings that do not show it, until one does or for SEEN_KEPT."""
        listing = self._listing(pool)
        with listing.lock:
            listing.plans[plan.name] = plan
            listing.seen[plan.name] = self.clock()

    def age(self, key: str) -> float | None:
        """Seconds since the endpoint's listing was made (None: never listed)."""
        listing = self._listing(key)
        return None if listing.at is None else self.clock() - listing.at

    def forget(self, pool: str) -> None:
        """The next ask lists again (an answer said the listing is behind). The plans this
        process made or described stay believed over it, as over any listing (:meth:`saw`):
        dropping them made every plan bought a moment before search and buy again under its
        name (``ResourceInUse``), and each such refusal forgot the listing again."""
        listing = self._listing(pool)
        with listing.lock:
            listing.at = None


Credentials = Callable[[str], "tuple[tuple[str, str], str] | None"]


class RemoteSources:
    """One :class:`CapacitySeller` per endpoint and key (pools that name the same endpoint,
    region and credentials share one client and one listing: ten pools of one capacity cluster
    cost one ``ListTrainingPlans``), made from the pool's ``spec.source`` and the credentials
    Secret, and made again when either changes. ``credentials(secret)`` answers the Secret's two
    keys and its resourceVersion (None: no such Secret, which fails the pass with a clear error).
    ``make`` is the seam for a fake in the unit tests."""

    def __init__(self, credentials: Credentials,
                 make: Callable[[RemoteSource, "tuple[str, str] | None"], CapacitySeller] = make_seller,
                 follower: RemoteFollower | None = None) -> None:
        self.credentials = credentials
        self.make = make
        self.follower = follower or RemoteFollower()
        self._made: dict[str, CapacitySeller] = {}
        self._lock = threading.Lock()
        # Since when each plan (by uid) has been waiting for its remote plan to hold blocks: its
        # passes look less often the longer it waits (waiting_every). Kept in memory: a restart
        # starts the pacing afresh, which costs a few early looks.
        self.waiting_since: dict[str, float] = {}
        # Per plan uid: the extension offerings of its remote block as last searched (when, the
        # block they were cut from, the offerings), for the pacing of controllers.plan.remote; and
        # since when an ExtendTrainingPlan whose answer was lost holds the plan's next one. In
        # memory: a restart searches again and reads the remote's extension history first.
        self.extension_offers: dict[str, tuple[float, tuple, list[RemoteExtension]]] = {}
        self.extension_unknown: dict[str, float] = {}
        # Per plan uid: its running UltraServer block's health as the remote last listed it (when,
        # the block's ARN, health by UltraServer id), for the pacing of controllers.plan.remote.
        self.ultra_health: dict[str, tuple[float, str, dict[str, str]]] = {}
        # Per plan uid: the local id of the offering its remote purchase bought, and when
        # (controllers.plan.reconciler): the pass that bought writes no status while the remote buys (it
        # usually holds the blocks within seconds), so a later pass writes the id. In memory: after
        # a restart the id is the one of the blocks the remote holds (Offering.from_blocks).
        self.bought: dict[str, tuple[str, float]] = {}

    def _client(self, pool: str, source: RemoteSource) -> tuple[str, CapacitySeller]:
        creds, version = None, ""
        if source.credentials_secret:
            found = self.credentials(source.credentials_secret)
            if found is None:
                raise RemoteError("Credentials", "MissingSecret", (
                    f"the Secret {source.credentials_secret!r} that capacity pool {pool!r} names in "
                    f"spec.source.{source.field_name}.credentialsSecret is missing, or lacks AWS_ACCESS_KEY_ID "
                    "and AWS_SECRET_ACCESS_KEY"), source.endpoint or f"{source.service}.{source.region}")
            creds, version = found
        key = json.dumps([source.field_name, source.endpoint, source.region, source.credentials_secret, version])
        with self._lock:
            made = self._made.get(key)
            if made is None:
                made = self._made[key] = self.make(source, creds)
            return key, made

    def waiting_every(self, uid: str, waiting: bool, now: float, least: float, most: float) -> float:
        """Seconds until a plan waiting for the remote looks again: a quarter of how long it has
        waited, within [least, most] (the remote's own purchase takes a pass or two; 1,000 plans
        waiting at once must not each look every ``least`` seconds). Forgets a plan not waiting."""
        if not waiting:
            self.waiting_since.pop(uid, None)
            return least
        since = self.waiting_since.setdefault(uid, now)
        return min(most, max(least, (now - since) / 4))

    def forget_plan(self, uid: str) -> None:
        """A deleted plan: what is kept in memory for it goes."""
        for kept in (self.waiting_since, self.extension_offers, self.extension_unknown, self.ultra_health, self.bought):
            kept.pop(uid, None)

    def capacity(self, pool: str, source: RemoteSource) -> CapacitySeller:
        """The endpoint of ``pool`` (sync: reads the Secret; a thread)."""
        return self._client(pool, source)[1]

    def plans(self, pool: str, source: RemoteSource, max_age: float) -> list[RemotePlan]:
        """The remote plans the pool's endpoint and key see, listed at most ``max_age`` s ago."""
        key, capacity = self._client(pool, source)
        return self.follower.plans(key, capacity, max_age)

    def saw(self, pool: str, source: RemoteSource, plan: RemotePlan) -> None:
        self.follower.saw(self._client(pool, source)[0], plan)

    def describe(self, pool: str, source: RemoteSource, name: str, plan_uid: str,
                 older_than: float) -> RemotePlan | None:
        """One remote plan as its endpoint answers it now, if the listing of the pool's endpoint
        and key is older than ``older_than`` seconds (None: it is younger, or the endpoint does not
        show the plan). Sync: a thread. What it answers is kept over the listing, as a purchase's
        answer is (RemoteFollower.saw)."""
        key, capacity = self._client(pool, source)
        if (self.follower.age(key) or 0.0) <= older_than:
            return None
        plan = capacity.remote_plan(name, plan_uid)
        if plan is not None:
            self.follower.saw(key, plan)
        return plan

    def forget(self, pool: str, source: RemoteSource) -> None:
        self.follower.forget(self._client(pool, source)[0])


CREDENTIALS_SECONDS = 10.0  # a credentials Secret is read again at most this often (a rotated key: used within it)


def secret_credentials(core_api: Any, namespace: str, clock: Callable[[], float] = time.monotonic,
                       every: float = CREDENTIALS_SECONDS) -> Credentials:
    """Read ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY`` from a Secret in ``namespace``, at
    most once every ``every`` seconds per Secret: every remote call of a pass asks for its pool's
    credentials, and 1,000 plans buying at once read the same Secret thousands of times a minute
    (a GET each, before this). A Secret that is missing or incomplete is remembered as long."""
    from kubernetes.client.rest import ApiException
    kept: dict[str, tuple[float, "tuple[tuple[str, str], str] | None"]] = {}

    def fetch(name: str) -> tuple[tuple[str, str], str] | None:
        try:
            secret = core_api.read_namespaced_secret(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        data = secret.data or {}
        try:
            key_id = base64.b64decode(data["AWS_ACCESS_KEY_ID"]).decode().strip()
            key = base64.b64decode(data["AWS_SECRET_ACCESS_KEY"]).decode().strip()
        except (KeyError, ValueError):
            return None
        return (key_id, key), str(secret.metadata.resource_version or "")

    def read(name: str) -> tuple[tuple[str, str], str] | None:
        now = clock()
        hit = kept.get(name)
        if hit is not None and now - hit[0] < every:
            return hit[1]
        found = fetch(name)
        kept[name] = (now, found)
        return found
    return read
