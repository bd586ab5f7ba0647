"""The operator's aiohttp ports (``/healthz``, the SageMaker API), each held to a few bounds so that
no client of the port can make it cost the operator much.

Each server runs on a thread of its own with an event loop of its own (:class:`HeldServer`), so a
flood of connections costs that thread, never kopf's event loop, and what it holds is bounded:

- **A cap on connections** (``max_connections``). Past it, the connections that have waited
  longest for their request (their headers, or their body) are closed to make room, so idle and
  half-sent connections cannot keep a client that sends its request at once from being answered.
  The room is made on the loop's next turn, not at the accept: a burst of accepts runs before any
  of them is read, and a connection with bytes not yet read (a request that has just come) is
  never chosen, so a flood's newcomers cannot close a client whose whole request is waiting to be
  read. One burst (``BURST`` accepts) may pass the cap until then; past that the connection that
  has waited longest is closed at once to hold the new one, and only when none may be closed does
  the new one get a 503. At most ``max_connections`` requests are answered at once: one more gets a 503.
- **A deadline for the headers** (``header_seconds``): from the accept (and the TLS handshake,
  which runs within it), or from the previous answer on a kept-alive connection, to the request's
  last header. A client silent or trickling past it is closed.
- **A deadline for the body** (``body_seconds``): from the last header to the body's last byte
  (:func:`read_body`). What the request then costs to answer is the handler's to bound.

The handler runs on the server's loop: what must run on kopf's loop is handed there by the handler
(``asyncio.run_coroutine_threadsafe``), once the request is read and bounded in size.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ssl
import struct
import termios
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

# What a connection past the cap and a burst gets (see the module docstring).
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
        b"Connection: close\r\nRetry-After: 1\r\n\r\nbusy\n")

WAITING, BODY, ANSWERING = "waiting", "body", "answering"  # a connection's phases
BURST = 128  # accepts that may pass the cap until the loop's next turn (the listen backlog too)
TRIM_AGAIN_SECONDS = 0.05  # when room could not all be made (requests unread or being answered)


@dataclass(frozen=True)
class Limits:
    """What one port holds: connections at once, and how long a client may take to send its
    request's headers and its body (see the module docstring)."""

    max_connections: int
    header_seconds: float
    body_seconds: float


class _Connection(asyncio.Protocol):
    """One accepted connection: aiohttp's protocol behind it, the deadline of its current phase.

    It stands between the transport and aiohttp's :class:`RequestHandler` so that the server can
    close it whatever aiohttp is doing, and starts TLS itself (``loop.start_tls``) so that a
    connection is held, timed and closable from its accept, its handshake included."""

    def __init__(self, server: "HeldServer", handler: RequestHandler) -> None:
        self.server = server
        self.handler = handler
        self.phase = WAITING
        self.raw: asyncio.BaseTransport | None = None  # the TCP connection
        self.transport: asyncio.BaseTransport | None = None  # what aiohttp writes to (TLS over raw, or raw)
        self.timer: asyncio.TimerHandle | None = None
        self.made = False  # aiohttp's handler has its transport
        self.dropped = False  # closed by the server before its transport came
        self.early: list[bytes] = []  # what TLS decrypted before start_tls returned
        self.whole = False  # its request's headers all came in this phase (its handler is due)
        self._tail = b""  # the last bytes of this phase, to see the headers' end across reads

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport
        if self.dropped:
            transport.abort()  # type: ignore[attr-defined]
            return
        self.server._phase(self, WAITING, self.server.limits.header_seconds)
        self.server._over()
        if self.server.ssl_context is None:
            self._hand_over(transport)
            return
        transport.pause_reading()  # the ClientHello waits in the kernel for start_tls
        self.server.loop.create_task(self._start_tls(transport))

    async def _start_tls(self, raw: asyncio.BaseTransport) -> None:
        try:
            tls = await self.server.loop.start_tls(
                raw, self, self.server.ssl_context, server_side=True,
                ssl_handshake_timeout=self.server.limits.header_seconds)
        except Exception:  # noqa: BLE001 - a failed or timed-out handshake, a close meanwhile
            self.server._drop(self)
            return
        if tls is None or self.server._conns.get(self.handler) is not self:  # closed meanwhile
            if tls is not None:
                tls.abort()
            return
        self._hand_over(tls)

    def _hand_over(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.made = True
        self.handler.connection_made(transport)
        early, self.early = self.early, []
        for data in early:
            self.handler.data_received(data)

    def data_received(self, data: bytes) -> None:
        if self.phase == WAITING and not self.whole:
            seen = self._tail + data
            self.whole = b"\r\n\r\n" in seen
            self._tail = seen[-3:]
        if self.made:
            self.handler.data_received(data)
        else:
            self.early.append(data)  # bounded: the handshake's deadline, the socket's buffer

    def eof_received(self) -> bool | None:
        return self.handler.eof_received() if self.made else None

    def pause_writing(self) -> None:
        if self.made:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.made:
            self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._forget(self)
        if self.made:
            self.made = False
            self.handler.connection_lost(exc)

    def abort(self) -> None:
        self.dropped = True
        for transport in (self.transport, self.raw):
            if transport is not None:
                with contextlib.suppress(Exception):
                    transport.abort()  # type: ignore[attr-defined]


class _Busy(asyncio.Protocol):
    """A connection past the cap and a burst: a 503 (in plain HTTP; a TLS port just closes) and
    the close, without a handler."""

    def __init__(self, tls: bool) -> None:
        self.tls = tls

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self.tls:
            with contextlib.suppress(Exception):
                transport.write(BUSY)  # type: ignore[attr-defined]
            transport.close()
        else:
            transport.abort()  # type: ignore[attr-defined]


class HeldServer:
    """One aiohttp request handler served on ``address:port`` from a thread named ``name`` with
    an event loop of its own, within ``limits`` (see the module docstring).

    :meth:`start` returns once the port listens (or raises why it could not); :meth:`stop` closes
    the port and every connection and ends the thread. Both may be called from any thread."""

    def __init__(self, name: str, handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
                 address: str, port: int, limits: Limits, ssl_context: ssl.SSLContext | None = None) -> None:
        self.name = name
        self.handler = handler
        self.address, self.port = address, port
        self.limits = limits
        self.ssl_context = ssl_context
        self.loop = asyncio.new_event_loop()
        self._conns: dict[RequestHandler, _Connection] = {}  # oldest phase first (see _phase)
        self._trimming: asyncio.Handle | None = None
        self._thread: threading.Thread | None = None
        self._listening: asyncio.AbstractServer | None = None
        self._aiohttp: web.Server | None = None
        self.refused = 0  # connections and requests answered 503 at the cap
        self.evicted = 0  # connections closed at the cap to make room
        self.expired = 0  # connections closed at a deadline

    # ---------------------------------------------------------------- life

    def start(self) -> "HeldServer":
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            try:
                self.loop.run_until_complete(self._listen())
            except BaseException as e:  # noqa: BLE001 - handed to start()'s caller
                failed.append(e)
                ready.set()
                self.loop.close()
                return
            ready.set()
            try:
                self.loop.run_forever()
            finally:
                self.loop.close()

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            raise failed[0]
        return self

    async def _listen(self) -> None:
        h = self.limits.header_seconds
        # aiohttp's own idle timer and lingering read are the same bounds again; an unread body
        # (a GET's) is not drained after the answer: the connection is closed.
        self._aiohttp = web.Server(self._handle, keepalive_timeout=h, lingering_time=0,
                                   max_line_size=8190, max_field_size=8190, max_headers=64)
        self._listening = await self.loop.create_server(
            self._connection, self.address, self.port, backlog=BURST,
            reuse_address=True)
        self.port = self._listening.sockets[0].getsockname()[1]

    def stop(self, timeout: float = 10.0) -> None:
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        done = asyncio.run_coroutine_threadsafe(self._close(), self.loop)
        with contextlib.suppress(Exception):
            done.result(timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        thread.join(timeout)

    async def cleanup(self) -> None:
        """:meth:`stop` from an event loop (a runner's name for it, as ``web.AppRunner`` has)."""
        await asyncio.to_thread(self.stop)

    async def _close(self) -> None:
        if self._listening is not None:
            self._listening.close()
        for conn in list(self._conns.values()):
            self._drop(conn)
        if self._listening is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._listening.wait_closed(), 2)
        tasks = [t for t in asyncio.all_tasks(self.loop) if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---------------------------------------------------------------- connections

    @property
    def connections(self) -> int:
        return len(self._conns)

    def _connection(self) -> asyncio.Protocol:
        """The protocol of a connection just accepted: held (the cap is made good on the loop's
        next turn, :meth:`_trim`), or busy past the cap and a burst."""
        if len(self._conns) >= self.limits.max_connections + BURST and not self._evict_one():
            self.refused += 1
            return _Busy(self.ssl_context is not None)
        assert self._aiohttp is not None
        handler = self._aiohttp()
        conn = _Connection(self, handler)
        self._conns[handler] = conn
        return conn

    def _over(self) -> None:
        """A connection came: past the cap, room is made on the loop's next turn."""
        if len(self._conns) > self.limits.max_connections and self._trimming is None:
            self._trimming = self.loop.call_soon(self._trim)

    def _evictable(self, conn: _Connection) -> bool:
        """Whether ``conn`` may be closed to make room: it waits for its request (headers or body),
        and the server has read all that came (:func:`unread`; not one whose headers are all in)."""
        return conn.phase != ANSWERING and not conn.whole and conn.raw is not None and not unread(conn.raw)

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest for its request, now, so that one just
        accepted is held instead of refused (a flood reopening faster than the loop trims must not
        keep a probe out); False when none may be closed."""
        for conn in list(self._conns.values()):
            if self._evictable(conn):
                self.evicted += 1
                self._drop(conn)
                return True
        return False

    def _trim(self) -> None:
        """Close the connections that have waited longest for their request (headers or body), of
        those the server has read all that came (:func:`unread`; and not one whose headers are all
        in, its handler due), down to the cap; what cannot be closed yet is looked at again
        shortly."""
        self._trimming = None
        excess = len(self._conns) - self.limits.max_connections
        for conn in list(self._conns.values()):
            if excess <= 0:
                return
            if self._evictable(conn):
                self.evicted += 1
                self._drop(conn)
                excess -= 1
        if excess > 0:
            self._trimming = self.loop.call_later(TRIM_AGAIN_SECONDS, self._trim)

    def _phase(self, conn: _Connection, phase: str, seconds: float | None) -> None:
        """``conn`` enters ``phase``, to end within ``seconds`` (None: no deadline here). It moves
        to the end of the order, so the first held is the one longest in its phase."""
        conn.phase = phase
        conn.whole, conn._tail = False, b""
        if conn.timer is not None:
            conn.timer.cancel()
        conn.timer = None if seconds is None else self.loop.call_later(seconds, self._expire, conn, phase)
        if self._conns.pop(conn.handler, None) is not None:
            self._conns[conn.handler] = conn

    def _expire(self, conn: _Connection, phase: str) -> None:
        if conn.phase == phase and self._conns.get(conn.handler) is conn:
            self.expired += 1
            self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        self._forget(conn)
        conn.abort()

    def _forget(self, conn: _Connection) -> None:
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        if self._conns.get(conn.handler) is conn:
            del self._conns[conn.handler]

    # ---------------------------------------------------------------- requests

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        conn = self._conns.get(request.protocol)  # type: ignore[arg-type]
        if conn is None:  # closed at a deadline or the cap as its headers were parsed: no one reads this
            return web.Response(status=503)
        busy = sum(1 for c in self._conns.values() if c.phase == ANSWERING)
        if busy >= self.limits.max_connections:  # as many requests as the cap are being answered
            self.refused += 1
            response = web.Response(status=503, text="busy\n", headers={"Retry-After": "1"})
            response.force_close()
            return response
        self._phase(conn, BODY, self.limits.body_seconds)
        request[_CONNECTION] = conn
        try:
            return await self.handler(request)
        finally:
            if self._conns.get(conn.handler) is conn:
                # The answer is written next, and the next request's headers are due within
                # the header deadline of it.
                self._phase(conn, WAITING, self.limits.header_seconds)


def unread(transport: asyncio.BaseTransport) -> bool:
    """Whether bytes wait in the connection's socket that the server has not read yet. A burst of
    accepts runs before any of them is read: without this, the newcomers of one burst would close
    a client that sent its whole request at once before it was read."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    return pending_bytes(sock.fileno()) > 0


def pending_bytes(fd: int) -> int:
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


_CONNECTION: web.RequestKey[_Connection] = web.RequestKey("hyperplan.serving.connection", _Connection)


def answering(request: web.BaseRequest) -> None:
    """``request`` has been read: it is being answered, so its connection is neither timed by the
    server nor closed to make room (the handler bounds what the answer costs)."""
    conn: _Connection | None = request.get(_CONNECTION)
    if conn is not None and conn.server._conns.get(conn.handler) is conn:
        conn.server._phase(conn, ANSWERING, None)


async def read_body(request: web.BaseRequest, limit: int) -> bytes:
    """The request's body, at most ``limit`` bytes of it (a longer one is cut there: the caller
    compares), within the server's body deadline; then :func:`answering`. A body cut at its
    deadline closes the connection, and this raises ``ConnectionResetError``."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await request.content.read(limit - size)  # what has come, up to that much
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    answering(request)
    return b"".join(chunks)


def handled_elsewhere(loop: asyncio.AbstractEventLoop, make: Callable[[], Awaitable[Any]],
                      seconds: float) -> Awaitable[Any]:
    """Run the coroutine ``make()`` makes on ``loop`` (kopf's), from the server's loop; cancelled
    there if it has not ended within ``seconds`` (``asyncio.TimeoutError`` here)."""
    async def on_loop() -> Any:
        return await make()

    future = asyncio.run_coroutine_threadsafe(on_loop(), loop)
    return asyncio.wait_for(asyncio.wrap_future(future), seconds)
