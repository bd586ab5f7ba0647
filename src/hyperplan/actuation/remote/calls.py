"""What every remote seller shares: the protocols (:class:`CapacitySeller`,
:class:`RemoteCapacity`), the errors, the boto3 client as it is set (:func:`client_config`) and
the counted calls (:class:`RemoteCalls`)."""

from __future__ import annotations

import re
import time
from typing import Any, Mapping, Protocol, Sequence

from hyperplan import metrics
from hyperplan.api.models import RemoteSource
from hyperplan.planning.blocks import Block
from hyperplan.planning.offerings import OfferingRequest
from hyperplan.planning.policy import Policy
from hyperplan.planning.remote import (
    ExtensionRecord,
    PoolTerms,
    RemoteBlock,
    RemoteExtension,
    RemoteOffering,
    RemotePlan,
)

CONNECT_TIMEOUT = 5.0


READ_TIMEOUT = 20.0


RETRY_ATTEMPTS = 3


POOL_CONNECTIONS = 64  # the purchase threads (runtime.context.Runtime.purchase_threads)


PAGE = 100  # ListTrainingPlans' MaxResults bound


STUBBED = object()


MAX_PAGES = 200  # pages of one listing (ListTrainingPlans at 100 a page: 20,000 plans)
MAX_ITEMS = 20_000  # items of one listing


class RemoteError(Exception):
    """A call to a remote endpoint failed: its code (the endpoint's ``__type``, or the client's
    error class for a connection that failed) and message."""

    def __init__(self, operation: str, code: str, message: str, endpoint: str, refused: bool = False) -> None:
        super().__init__(f"{operation} at {endpoint} failed: {code}: {message}")
        self.operation, self.code, self.message, self.endpoint = operation, code, message, endpoint
        # True when the endpoint answered and refused (a 4xx: no right, a bad request), False when it
        # could not be reached or failed itself (a connection, a timeout, a 5xx, throttling).
        self.refused = refused


# What an endpoint's error may show in a plan's condition and Events (which anyone with `view` reads):
# an AWS-shaped error (a code such as ValidationException, a short one-line message), never a body
# that another kind of server answered (an in-cluster service's error page, say).
ERROR_CODE = re.compile(r"^[A-Za-z][A-Za-z0-9]{1,63}(\.[A-Za-z0-9]{1,63}){0,3}$")
MESSAGE_MOST = 300


def shown_code(code: str, status: int) -> str:
    """The error's code as a condition may show it: an AWS error code, else ``HTTP <status>``."""
    if ERROR_CODE.match(code or "") and not code.isdigit():
        return code
    return f"HTTP{status}" if status else "UnknownError"


def shown_message(code: str, message: Any) -> str:
    """The error's message as a condition may show it: an AWS-shaped one as it is, else a note that
    the answer is not shown (the body of a server that is not SageMaker's or EC2's never is)."""
    text = " ".join(str(message or "").split())
    if not ERROR_CODE.match(code or "") or code.isdigit() or "<" in text or len(text) > MESSAGE_MOST \
            or not text.isprintable():
        return "the endpoint's answer is not a SageMaker or EC2 error (not shown)"
    return text


class NotBought(Exception):
    """A purchase the remote did not make and that is no error of the pass: the offering was sold
    meanwhile, or the remote holds (or held) something under the attempt's name that the pass's
    listing did not show. The pass reads the remote again and searches again."""


class CapacitySeller(Protocol):
    """What the plan pass asks of a remote source of capacity, in planning's values, whatever the
    source: a SageMaker Training Plans endpoint (:class:`SageMakerCapacity`) or EC2 Capacity Blocks
    (:class:`hyperplan.actuation.remote.capacity_blocks.CapacityBlocks`). :func:`make_seller` is the one
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
            raise RemoteError(operation, shown_code(code, status), shown_message(code, error.get("Message")),
                              self.endpoint, refused=refused) from None
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
        :attr:`page_size`): the ``items`` of each, in order. At most :data:`MAX_PAGES` pages and
        :data:`MAX_ITEMS` items: a remote that pages for ever (or answers more than it was asked
        for) fails the call (``ListingTooLong``) instead of holding a purchase thread and memory."""
        out: list[Mapping[str, Any]] = []
        token: str | None = None
        for _ in range(MAX_PAGES):
            page = self._call(operation, method, **arguments, MaxResults=self.page_size,
                              **({"NextToken": token} if token else {}))
            got = page.get(items) or []
            if len(got) > self.page_size or len(out) + len(got) > MAX_ITEMS:
                raise RemoteError(operation, "ListingTooLong", f"more than {MAX_ITEMS} items, or a page larger "
                                  f"than the {self.page_size} asked for", self.endpoint)
            out.extend(got)
            token = page.get("NextToken") or None
            if token is None:
                return out
        raise RemoteError(operation, "ListingTooLong", f"still paging after {MAX_PAGES} pages", self.endpoint)
