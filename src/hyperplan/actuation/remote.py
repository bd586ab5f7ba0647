"""Capacity bought from a remote source: the calls (issue 23, docs/aws.md).

A CapacityPool with ``spec.source.sageMaker`` is sold by another hyperplan's SageMaker API or by
AWS; this module makes the calls, with boto3, the maintained SDK (no signing of our own). What the
answers mean is :mod:`hyperplan.planning.remote`. A pool with ``spec.source.ec2CapacityBlocks``
is sold by EC2 Capacity Blocks (:mod:`hyperplan.actuation.capacity_blocks`). The plan pass sees
either through one protocol, :class:`CapacitySeller` (find_offerings, buy, remote_plans), made for a pool's source
by :func:`make_seller`.

**The client, set on purpose** (:func:`client_config`): boto3's ``standard`` retry mode (3
attempts on throttling, 5xx and dropped connections, with its own backoff), a connect timeout of
5 s and a read timeout of 20 s (an endpoint that hangs fails the pass, which the work queue backs
off, instead of holding a purchase thread), and a connection pool as big as the purchase threads
that may call at once. One client per pool source and credentials, made once and reused.

**Credentials**: the Secret ``credentialsSecret`` names in the operator's namespace
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``), read at most every 10 s
(:data:`CREDENTIALS_SECONDS`), and the client made again when the Secret's resourceVersion
changes; without one, boto3's own chain (IRSA, EKS Pod Identity, the environment).

**Paced reads** (:class:`RemoteFollower`): one ``ListTrainingPlans`` (paged) serves every plan of a
pool that asks within the age it accepts; a second caller waits for the first's answer instead of
listing again. A listing is made again no sooner than ten times as long as the last one took (an
endpoint of 10,000 plans is asked less often), so a plan waiting for the remote to buy, which
accepts two seconds' age, reads its own remote plan instead when the listing is older
(``remote_plan``: one DescribeTrainingPlan). Plans that hold blocks look at most at their next
boundary and at least every 5 minutes; one waiting for the remote, ever less often the longer it
waits (the wake handlers.trainingplan.reconcile_plan returns, with :meth:`RemoteSources.waiting_every`).

Every call is counted by operation and result (``hyperplan_remote_calls_total``); a failed call
raises :class:`RemoteError`, which the work queue reports on the plan as ``Reconciled=False``
with the endpoint and the error, and retries with backoff.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from hyperplan import metrics
from hyperplan.api.models import Ec2CapacityBlocksSource, RemoteSource, SageMakerSource
from hyperplan.planning.offerings import OfferingRequest
from hyperplan.planning.policy import Policy
from hyperplan.planning.blocks import Block
from hyperplan.planning.remote import (
    ExtensionRecord, PoolTerms, RemoteBlock, RemoteExtension, RemoteOffering, RemotePlan, extension_records,
    extensions_offered, offerings_of, plan_of, search_arguments, ultra_server_health_of,
)

log = logging.getLogger("hyperplan.remote")

CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 20.0
RETRY_ATTEMPTS = 3
POOL_CONNECTIONS = 64  # the purchase threads (handlers.context.Runtime.purchase_threads)
PAGE = 100  # ListTrainingPlans' MaxResults bound
_STUBBED = object()


class RemoteError(Exception):
    """A call to a remote endpoint failed: its code (the endpoint's ``__type``, or the client's
    error class for a connection that failed) and message."""

    def __init__(self, operation: str, code: str, message: str, endpoint: str, refused: bool = False) -> None:
        super().__init__(f"{operation} at {endpoint} failed: {code}: {message}")
        self.operation, self.code, self.message, self.endpoint = operation, code, message, endpoint
        # True when the endpoint answered and refused (a 4xx: no right, a bad request), False when it
        # could not be reached or failed itself (a connection, a timeout, a 5xx, throttling).
        self.refused = refused


class NotBought(Exception):
    """A purchase the remote did not make and that is no error of the pass: the offering was sold
    meanwhile, or the remote holds (or held) something under the attempt's name that the pass's
    listing did not show. The pass reads the remote again and searches again."""


class CapacitySeller(Protocol):
    """What the plan pass asks of a remote source of capacity, in planning's values, whatever the
    source: a SageMaker Training Plans endpoint (:class:`SageMakerCapacity`) or EC2 Capacity Blocks
    (:class:`hyperplan.actuation.capacity_blocks.CapacityBlocks`). :func:`make_seller` is the one
    place that tells them apart."""

    endpoint: str
    extend_right: str  # what a key refused an extension lacks, in the source's own terms (for the message)

    def find_offerings(self, request: OfferingRequest, policy: Policy,
                  pools: Sequence[PoolTerms]) -> list[RemoteOffering]:
        """One search for ``request``; the answers each of ``pools`` sells, as offerings of that pool."""
        ...

    def buy(self, name: str, plan_uid: str, offering: RemoteOffering, spares: int | None,
            tags: Mapping[str, str]) -> RemotePlan:
        """Buy ``offering`` for the local plan ``plan_uid`` under the attempt's ``name`` and answer
        what the remote holds for it then. Never buys twice for one name: a remote that already
        holds a live purchase of the plan answers that one. Raises :class:`NotBought` or
        :class:`RemoteError`."""
        ...

    def remote_plans(self) -> list[RemotePlan]:
        """Every purchase the key sees at the remote (one listing; the follower paces it)."""
        ...

    def remote_plan(self, name: str, plan_uid: str) -> RemotePlan | None:
        """The remote plan ``name`` (an attempt of the local plan ``plan_uid``) as the remote
        answers it now, in one call however many plans it holds (None: it does not show it)."""
        ...

    def find_extensions(self, remote: RemotePlan, plan_uid: str, blocks: Sequence[Block],
                        policy: Policy) -> list[RemoteExtension]:
        """The extension offerings of the remote plan now, cut as extensions of the last of the
        plan's ``blocks`` as this cluster records them (empty: the source extends nothing)."""
        ...

    def extension_history(self, remote: RemotePlan) -> list[ExtensionRecord]:
        """The extensions the remote has taken for the remote plan, bought or being bought."""
        ...

    def extend(self, remote: RemotePlan, extension: RemoteExtension) -> list[ExtensionRecord]:
        """Buy the extension; the remote's record of it. Raises :class:`NotBought` (no longer
        offered) or :class:`RemoteError`."""
        ...

    def ultra_server_health(self, block: RemoteBlock) -> dict[str, str]:
        """The remote's health of each UltraServer of an UltraServer block, by UltraServer id, in
        hyperplan's words (``ok``, ``impaired``, ``insufficient-data``); empty: it tells none."""
        ...


class RemoteCapacity(Protocol):
    """The SageMaker Training Plans calls a remote pool needs (the answers are boto3's dicts)."""

    endpoint: str

    def search(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]: ...

    def create_plan(self, name: str, offering_id: str, spares: int | None,
                    tags: Mapping[str, str]) -> str: ...

    def describe_plan(self, name: str) -> Mapping[str, Any] | None: ...

    def list_plans(self) -> list[Mapping[str, Any]]: ...

    def extend_plan(self, extension_id: str) -> list[Mapping[str, Any]]: ...

    def extension_entries(self, arn: str) -> list[Mapping[str, Any]]: ...

    def list_ultra_servers(self, arn: str) -> list[Mapping[str, Any]]: ...


def client_config(attempts: int = RETRY_ATTEMPTS) -> Any:
    from botocore.config import Config
    return Config(retries={"mode": "standard", "total_max_attempts": attempts},
                  connect_timeout=CONNECT_TIMEOUT, read_timeout=READ_TIMEOUT,
                  max_pool_connections=POOL_CONNECTIONS, user_agent_extra="hyperplan")


def make_client(source: RemoteSource, credentials: tuple[str, str] | None, attempts: int = RETRY_ATTEMPTS) -> Any:
    """A boto3 client of the source's service, region and endpoint, set as :func:`client_config` says."""
    import boto3
    session = boto3.session.Session(
        aws_access_key_id=credentials[0] if credentials else None,
        aws_secret_access_key=credentials[1] if credentials else None, region_name=source.region)
    return session.client(source.service, endpoint_url=source.endpoint, config=client_config(attempts))


class RemoteCalls:
    """One remote endpoint's client and how its calls are made: counted by operation and result,
    timed, and every failure a :class:`RemoteError`."""

    client: Any
    endpoint: str
    page_size = PAGE

    def _call(self, operation: str, method: str, client: Any = None, **arguments: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError
        started = time.monotonic()
        try:
            answer = getattr(client or self.client, method)(**arguments)
        except ClientError as e:
            error = e.response.get("Error") or {}
            code = str(error.get("Code") or "ClientError")
            status = int((e.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
            metrics.REMOTE_CALLS.labels(operation, code).inc()
            refused = 400 <= status < 500 and "Throttl" not in code and code != "RequestLimitExceeded"
            raise RemoteError(operation, code, str(error.get("Message") or e), self.endpoint,
                              refused=refused) from None
        except BotoCoreError as e:
            code = type(e).__name__
            metrics.REMOTE_CALLS.labels(operation, code).inc()
            raise RemoteError(operation, code, str(e), self.endpoint) from None
        finally:
            metrics.REMOTE_CALL_DURATION.labels(operation).observe(time.monotonic() - started)
        metrics.REMOTE_CALLS.labels(operation, "ok").inc()
        return answer

    def _pages(self, operation: str, method: str, items: str, **arguments: Any) -> list[Mapping[str, Any]]:
        """Every page of a paged call (``NextToken``; ``MaxResults`` the API's bound,
        :attr:`page_size`): the ``items`` of each, in order."""
        out: list[Mapping[str, Any]] = []
        token: str | None = None
        while True:
            page = self._call(operation, method, **arguments, MaxResults=self.page_size,
                              **({"NextToken": token} if token else {}))
            out.extend(page.get(items) or [])
            token = page.get("NextToken") or None
            if token is None:
                return out


class SageMakerSelling:
    """:class:`CapacitySeller` over the SageMaker Training Plans calls (:class:`RemoteCapacity`):
    shared by the real client and the unit tests' fake endpoint (actuation.fakes)."""

    extend_right = "sagemaker:ExtendTrainingPlan (at a hyperplan endpoint: the right to patch trainingplans)"
    endpoint: str
    search: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    create_plan: Callable[..., str]
    describe_plan: Callable[[str], "Mapping[str, Any] | None"]
    list_plans: Callable[[], "list[Mapping[str, Any]]"]

    def find_offerings(self, request: OfferingRequest, policy: Policy,
                  pools: Sequence[PoolTerms]) -> list[RemoteOffering]:
        answer = self.search(search_arguments(request, policy))
        return [o for p in pools for o in offerings_of(answer, p.name, p.instance_type, p.availability_zone,
                                                       p.ultra_server_type, request)]

    def buy(self, name: str, plan_uid: str, offering: RemoteOffering, spares: int | None,
            tags: Mapping[str, str]) -> RemotePlan:
        """CreateTrainingPlan; the plan it made is Pending until the remote has bought it. The same
        name with the same offering answers the same plan (so boto3's own retries are safe); a
        taken name is read again."""
        try:
            arn = self.create_plan(name, offering.remote_id, spares, tags)
        except RemoteError as e:
            if e.code in ("ResourceNotFound", "ValidationException"):  # sold meanwhile, or no longer offered
                raise NotBought(f"the endpoint {e.endpoint} no longer sells offering {offering.offering.id}: "
                                f"{e.message}") from None
            if e.code != "ResourceInUse":
                raise
            # The name is taken. A plan of ours the listing did not show yet is read again; one
            # this key cannot even describe was made with another key (a key rotated to another
            # user that may create plans but not read them): nothing is bought under another
            # name, which could buy the plan twice, and the pass fails saying what to do.
            if self.describe_plan(name) is not None:
                raise NotBought(f"the remote training plan {name} exists already; reading it again") from None
            raise RemoteError("CreateTrainingPlan", "ResourceInUse", (
                f"the endpoint holds a training plan named {name} (this plan's purchase) that this key "
                "cannot read: it was made with another key. Nothing is bought under another name, so "
                "the plan is never bought twice; give this key the right to read training plans, or "
                "put back the key that bought it"), e.endpoint, refused=True) from None
        # Not described at once: a remote buys after CreateTrainingPlan answers (AWS's plan is
        # Pending until paid, hyperplan's until its operator's pass), and its reads lag its writes,
        # so a describe here answered nothing new (in the remote bench, 396 of 1,060 were
        # ResourceNotFound) and cost every purchase a round trip. The plan waits and reads it.
        return RemotePlan(name=name, arn=arn, status="Pending", status_message="created; the remote buys it next")

    def remote_plans(self) -> list[RemotePlan]:
        return [plan_of(answer) for answer in self.list_plans()]

    def remote_plan(self, name: str, plan_uid: str) -> RemotePlan | None:
        answer = self.describe_plan(name)
        return plan_of(answer) if answer is not None else None

    def find_extensions(self, remote: RemotePlan, plan_uid: str, blocks: Sequence[Block],
                        policy: Policy) -> list[RemoteExtension]:
        return extensions_offered(self.search({"TrainingPlanArn": remote.arn}), plan_uid, blocks, policy)

    def extension_history(self, remote: RemotePlan) -> list[ExtensionRecord]:
        return extension_records(self.extension_entries(remote.arn))

    def ultra_server_health(self, block: RemoteBlock) -> dict[str, str]:
        return ultra_server_health_of(self.list_ultra_servers(block.arn))

    def extend(self, remote: RemotePlan, extension: RemoteExtension) -> list[ExtensionRecord]:
        try:
            return extension_records(self.extend_plan(extension.remote_id))
        except RemoteError as e:
            if e.code in ("ResourceNotFound", "ValidationException"):  # sold meanwhile, or too late now
                raise NotBought(f"the endpoint {e.endpoint} no longer sells extension {extension.extension.id} of "
                                f"{remote.noun} {remote.name}: {e.message}") from None
            raise


class SageMakerCapacity(RemoteCalls, SageMakerSelling):
    """A remote pool's endpoint through boto3's SageMaker client. ``client`` is a seam for
    botocore's Stubber in the unit tests, which checks every request against the service model."""

    def __init__(self, source: SageMakerSource, credentials: tuple[str, str] | None = None,
                 client: Any = None) -> None:
        self.source = source
        self.client = client if client is not None else make_client(source, credentials)
        self.endpoint = source.endpoint or self.client.meta.endpoint_url
        # A client given (the Stubber's) serves every call; else the one without retries is made
        # when first needed.
        self._credentials: Any = _STUBBED if client is not None else credentials
        self._single: Any = None

    def search(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        return self._call("SearchTrainingPlanOfferings", "search_training_plan_offerings", **arguments)

    def create_plan(self, name: str, offering_id: str, spares: int | None, tags: Mapping[str, str]) -> str:
        arguments: dict[str, Any] = {"TrainingPlanName": name, "TrainingPlanOfferingId": offering_id}
        if spares:
            arguments["SpareInstanceCountPerUltraServer"] = spares
        if tags:
            arguments["Tags"] = [{"Key": k, "Value": v} for k, v in sorted(tags.items())]
        return str(self._call("CreateTrainingPlan", "create_training_plan", **arguments)["TrainingPlanArn"])

    def describe_plan(self, name: str) -> Mapping[str, Any] | None:
        try:
            return self._call("DescribeTrainingPlan", "describe_training_plan", TrainingPlanName=name)
        except RemoteError as e:
            if e.code == "ResourceNotFound":
                return None
            raise

    def list_plans(self) -> list[Mapping[str, Any]]:
        return self._pages("ListTrainingPlans", "list_training_plans", "TrainingPlanSummaries")

    def extend_plan(self, extension_id: str) -> list[Mapping[str, Any]]:
        """ExtendTrainingPlan, through a client with boto3's retries off (as EC2's purchase): the
        call spends money, and a retry after a lost answer is left to the next pass, which reads
        the extension history first."""
        answer = self._call("ExtendTrainingPlan", "extend_training_plan", client=self._once(),
                            TrainingPlanExtensionOfferingId=extension_id)
        return list(answer.get("TrainingPlanExtensions") or [])

    def extension_entries(self, arn: str) -> list[Mapping[str, Any]]:
        return self._pages("DescribeTrainingPlanExtensionHistory", "describe_training_plan_extension_history",
                           "TrainingPlanExtensions", TrainingPlanArn=arn)

    def list_ultra_servers(self, arn: str) -> list[Mapping[str, Any]]:
        return self._pages("ListUltraServersByReservedCapacity", "list_ultra_servers_by_reserved_capacity",
                           "UltraServers", ReservedCapacityArn=arn)

    def _once(self) -> Any:
        if self._single is None:
            self._single = self.client if self._credentials is _STUBBED else make_client(
                self.source, self._credentials, attempts=1)
        return self._single


def make_seller(source: RemoteSource, credentials: tuple[str, str] | None) -> CapacitySeller:
    """The seller of a pool's source: the one place that tells the kinds of source apart."""
    if isinstance(source, Ec2CapacityBlocksSource):
        from hyperplan.actuation.capacity_blocks import CapacityBlocks
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
        # block they were cut from, the offerings), for the pacing of handlers.remote_plans; and
        # since when an ExtendTrainingPlan whose answer was lost holds the plan's next one. In
        # memory: a restart searches again and reads the remote's extension history first.
        self.extension_offers: dict[str, tuple[float, tuple, list[RemoteExtension]]] = {}
        self.extension_unknown: dict[str, float] = {}
        # Per plan uid: its running UltraServer block's health as the remote last listed it (when,
        # the block's ARN, health by UltraServer id), for the pacing of handlers.remote_plans.
        self.ultra_health: dict[str, tuple[float, str, dict[str, str]]] = {}
        # Per plan uid: the local id of the offering its remote purchase bought, and when
        # (handlers.trainingplan): the pass that bought writes no status while the remote buys (it
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
