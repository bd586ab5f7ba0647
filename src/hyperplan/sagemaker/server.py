"""The HTTP side of hyperplan's SageMaker API: one aiohttp application on its own port.

The port is served from a thread of its own (:func:`serve`, :mod:`hyperplan.serving`: a cap on
connections, deadlines for a request's headers and body), so no client of the port costs the
operator's event loop anything until its request is read and bounded in size. The request is then
handed to the operator's event loop, where the operation runs, so its reads of the watch cache are
reads of the indexes on the loop (kopf's on the leader, the replica's own before that:
:mod:`hyperplan.sagemaker.replica`; no copy, no API call). A request is verified (SigV4,
:mod:`hyperplan.sagemaker.signing`) before its body is parsed; then the operation runs
(:mod:`hyperplan.sagemaker.operations`) and the answer is JSON 1.1. Whatever fails inside an
operation is answered as ``InternalFailure`` (500) and logged; the server goes on.

TLS: with a certificate and key (files mounted from a Secret) it serves HTTPS; without them it
refuses any address but a loopback one (:func:`check_address`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from aiohttp import web
from kubernetes.client.exceptions import ApiException
from multidict import CIMultiDict, CIMultiDictProxy

from hyperplan import serving, threads
from hyperplan.planning.policy import DEMO, Policy
from hyperplan.sagemaker import hyperpod, operations
from hyperplan.sagemaker.access import Access, Writes, check_rights, rights_known
from hyperplan.sagemaker.assumed import FORGET_EVERY, AssumedPurchases
from hyperplan.sagemaker.signing import Caller, verify
from hyperplan.sagemaker.wire import CONTENT_TYPE, REQUEST_ID, ApiError, new_request_id, operation_of, parse_body

log = logging.getLogger("hyperplan.sagemaker")
MAX_BODY = 1 << 20  # the largest request of these operations is a few KiB
WRITE_THREADS = threads.size("sagemaker-write")  # writes in flight at once


def check_address(address: str, tls: bool) -> None:
    """Plain HTTP only on a loopback address: keys sign requests, but the answers (and a
    request's body) would cross the network readable."""
    if tls:
        return
    try:
        loopback = address == "localhost" or ipaddress.ip_address(address).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"the SageMaker API serves plain HTTP only on a loopback address, not {address!r}: "
                         "give it a TLS certificate and key (HYPERPLAN_SAGEMAKER_API_TLS_CERT/_KEY)")


def _answer(status: int, body: dict[str, Any]) -> web.Response:
    """An answer as JSON 1.1, with its own ``x-amzn-RequestId`` (boto3's ResponseMetadata.RequestId)."""
    return web.Response(status=status, body=json.dumps(body, separators=(",", ":")).encode(),
                        headers={"Content-Type": CONTENT_TYPE, REQUEST_ID: new_request_id()})


def refused(e: ApiException) -> ApiError:
    """A write the API server refused, as an AWS client reads it: RBAC or admission's 403 is
    ``AccessDeniedException``, a conflict ``ConflictException``, an invalid value
    ``ValidationException``, its throttling (429) ``ThrottlingException`` (400, as AWS answers it:
    boto3 retries it); the API server's own message goes with it. A code the operation's model
    does not list is then made one it does (``operations.modeled``)."""
    try:
        message = json.loads(e.body or "{}").get("message") or e.reason
    except ValueError:
        message = e.reason
    code = {403: "AccessDeniedException", 404: "ResourceNotFound", 409: "ConflictException",
            422: "ValidationException", 429: "ThrottlingException"}.get(e.status or 0, "InternalFailure")
    return ApiError(code, str(message)[:1000], 400 if code != "InternalFailure" else 500)


def make_app(fleet: operations.Fleet, access: Access, account: str, clock: Callable[[], datetime],
             cluster_name: str = "hyperplan", writes: Writes | None = None,
             policy: Policy = DEMO) -> web.Application:
    """The application: ``fleet`` is the read side, ``access`` the keys and RBAC's answers,
    ``account`` the 12-digit account id of the ARNs. The keys and the reviews are API calls, made
    on threads; the operation itself runs on the loop (it reads kopf's indexes)."""

    views = operations.PlanViews()
    assumed = AssumedPurchases(every=FORGET_EVERY)
    # The writes' own threads: asyncio's default executor has cpu_count + 4 (6 on two cores), which
    # held a burst of CreateTrainingPlan calls (each mostly waits for the API server) six at a time.
    writing = threads.new_pool("sagemaker-write")

    async def handle(request: web.Request) -> web.Response:
        operation = ""
        try:
            if request.method != "POST" or request.path != "/":
                raise ApiError("UnknownOperationException", "the SageMaker API takes POST / only", 404)
            if (request.content_length or 0) > MAX_BODY:
                raise ApiError("SerializationException", f"the body is larger than {MAX_BODY} bytes", 413)
            raw = await request.content.read(MAX_BODY + 1)
            if len(raw) > MAX_BODY:
                raise ApiError("SerializationException", f"the body is larger than {MAX_BODY} bytes", 413)

            def signed_by() -> Caller:
                return verify(request.method, request.path, request.query_string, request.headers, raw,
                              access.key_of, clock())

            if access.stale():  # the listing blocks: a thread, and only when it is due
                await asyncio.to_thread(access.refresh)
            try:
                caller = signed_by()
            except ApiError as e:
                if e.code != "UnrecognizedClientException" or not access.stale(unknown=True):
                    raise
                await asyncio.to_thread(access.refresh, True)  # a key made a moment ago
                caller = signed_by()
            operation = operation_of(request.headers.get("X-Amz-Target"))
            if rights_known(access, caller.key, operation):
                owner = check_rights(access, caller.key, operation)  # a review held: no API call, no thread
            else:
                owner = await asyncio.to_thread(check_rights, access, caller.key, operation)
            body = parse_body(raw)
            ctx = operations.Context(fleet=fleet, account=account, region=caller.region, now=clock(),
                                     cluster_name=cluster_name, user=caller.key.user, writes=writes,
                                     views=None if operation in operations.WRITES else views, policy=policy,
                                     owner=owner, assumed=assumed,
                                     eks_cluster_arn=app.get(hyperpod.EKS_CLUSTER_ARN))
            if operation in operations.BLOCKING:  # the writes, and the reads of the API server
                result = await asyncio.get_running_loop().run_in_executor(
                    writing, operations.call, operation, body, ctx)
            else:
                result = operations.call(operation, body, ctx)
            log.debug("%s by %s", operation, caller.key.user)
            return _answer(200, result)
        except ApiError as e:
            error = operations.modeled(e, operation)  # a code the model lists for the operation
            return _answer(error.status, error.body())
        except ApiException as e:  # a write the API server refused, as the caller
            error = operations.modeled(refused(e), operation)
            return _answer(error.status, error.body())
        except Exception:  # noqa: BLE001 - one bad request never stops the server
            log.exception("SageMaker API request failed")
            return _answer(500, {"__type": "InternalFailure", "message": "the request failed inside hyperplan"})

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_route("*", "/{tail:.*}", handle)
    app[HANDLE] = handle
    return app


@dataclass(frozen=True)
class Serving:
    """How the API's port holds its clients (:mod:`hyperplan.serving`), and how long an operation
    may run on the operator's loop once its request is read (``answer_seconds``)."""

    limits: serving.Limits = serving.Limits(max_connections=128, header_seconds=5.0, body_seconds=10.0)
    answer_seconds: float = 60.0


SERVING = Serving()  # the operator sets it from its settings (hyperplan.operator) before serving
HANDLE: web.AppKey[Callable[..., Awaitable[web.StreamResponse]]] = web.AppKey("handle")


class _Body:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    async def read(self, n: int = -1) -> bytes:
        return self.raw if n < 0 else self.raw[:n]


class Received(dict):
    """A request as the port's thread read it, handed to the operator's loop: what the handler
    and the app's middlewares read of an aiohttp request (method, path, query, headers, the
    declared length, the body already read and cut at ``MAX_BODY + 1``), and a mapping as a
    request is."""

    def __init__(self, method: str, path: str, query_string: str, headers: CIMultiDictProxy[str],
                 body: bytes, content_length: int | None) -> None:
        super().__init__()
        self.method, self.path, self.query_string = method, path, query_string
        self.headers = headers
        self.content = _Body(body)
        self.content_length = content_length


def _relay(app: web.Application, loop: asyncio.AbstractEventLoop, answer_seconds: float):
    """The port thread's handler: read the request (at most ``MAX_BODY + 1`` bytes of body, within
    the body deadline), then answer it with ``app``'s handler and middlewares on ``loop``."""
    handler = app[HANDLE]
    for middleware in reversed(app.middlewares):
        handler = partial(middleware, handler=handler)

    async def relay(request: web.BaseRequest) -> web.StreamResponse:
        declared = request.content_length
        try:
            # A body declared too long is not read: the handler refuses it by its length.
            raw = b"" if (declared or 0) > MAX_BODY else await serving.read_body(request, MAX_BODY + 1)
        except ConnectionError:
            return web.Response(status=408)  # closed at the body deadline: no one reads this
        serving.answering(request)
        received = Received(request.method, request.path, request.query_string,
                            CIMultiDictProxy(CIMultiDict(request.headers)), raw, declared)
        try:
            response = await serving.handled_elsewhere(loop, lambda: handler(received), answer_seconds)
        except asyncio.TimeoutError:
            log.warning("SageMaker API: %s not answered within %gs", request.headers.get("X-Amz-Target"),
                        answer_seconds)
            response = _answer(503, {"__type": "ServiceUnavailable",
                                     "message": f"the operation did not end within {answer_seconds:g}s"})
        if len(raw) > MAX_BODY or (declared or 0) > MAX_BODY:
            response.force_close()  # the rest of the body is not read
        return response

    return relay


async def serve(app: web.Application, address: str, port: int, cert: str | None = None,
                key: str | None = None, how: Serving | None = None) -> serving.HeldServer:
    """Start serving ``app`` on ``address:port`` (HTTPS with ``cert`` and ``key``) from a thread of
    its own within ``how`` (default :data:`SERVING`); its operations run on the calling loop. The
    caller keeps the server and calls ``cleanup()`` on it to stop."""
    check_address(address, tls=bool(cert and key))
    how = how or SERVING
    context = None
    if cert and key:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
    server = serving.HeldServer("sagemaker-api", _relay(app, asyncio.get_running_loop(), how.answer_seconds),
                                address, port, how.limits, context)
    return await asyncio.to_thread(server.start)
