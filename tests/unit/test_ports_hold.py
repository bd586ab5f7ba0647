"""The operator's aiohttp ports hold against their clients (hyperplan.serving): a request's headers
and body within their deadlines, a cap on connections that makes room by closing the connection
that has waited longest, a thread and a loop of their own; /healthz proves kopf's loop alive by its
heartbeat, and the SageMaker API runs its operations on the caller's loop. Real sockets on
127.0.0.1."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from hyperplan import serving
from hyperplan.operator import serve_liveness
from hyperplan.sagemaker import server as api_server

HEADERS, BODY = 0.5, 0.5  # the deadlines in these tests


def closed_after(sock: socket.socket, limit: float) -> float | None:
    """Seconds until the server closed ``sock`` (reading and dropping what it sends), None if
    it was still open after ``limit``."""
    sock.settimeout(0.05)
    started = time.monotonic()
    while time.monotonic() - started < limit:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except socket.timeout:
            continue
        except (ConnectionResetError, ssl.SSLError):
            return time.monotonic() - started
    return None


async def echo(request: web.BaseRequest) -> web.Response:
    """Reads the body as the SageMaker API does, answers its length."""
    body = await serving.read_body(request, 1 << 20)
    return web.Response(text=str(len(body)))


@pytest.fixture
def held() -> Iterator:
    servers: list[serving.HeldServer] = []

    def start(handler=echo, max_connections: int = 8, ssl_context: ssl.SSLContext | None = None) -> serving.HeldServer:
        server = serving.HeldServer("test-port", handler, "127.0.0.1", 0,
                                    serving.Limits(max_connections, HEADERS, BODY), ssl_context)
        servers.append(server.start())
        return server

    yield start
    for server in servers:
        server.stop()


def get(port: int, path: str = "/", body: bytes | None = None, timeout: float = 5) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST" if body is not None else "GET", path, body=body)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def silent(sock: socket.socket) -> None:
    """Connects and sends nothing."""


def half_the_headers(sock: socket.socket) -> None:
    sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\n")


def trickle(sock: socket.socket, first: bytes, seconds: float) -> None:
    """``first``, then one byte each 0.1 s for ``seconds`` (until the server closes)."""
    sock.sendall(first)
    for _ in range(int(seconds / 0.1)):
        try:
            sock.sendall(b"x")
        except OSError:
            return
        time.sleep(0.1)


def trickled_headers(sock: socket.socket) -> None:
    """One header byte each 0.1 s, never ending the headers."""
    trickle(sock, b"POST / HTTP/1.1\r\nX-Slow: ", 4 * HEADERS)


def half_the_body(sock: socket.socket) -> None:
    sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"half\":")


def trickled_body(sock: socket.socket) -> None:
    trickle(sock, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n", 4 * BODY)


@pytest.mark.parametrize("client_does, deadline", [
    (silent, HEADERS), (half_the_headers, HEADERS), (trickled_headers, HEADERS),
    (half_the_body, BODY), (trickled_body, BODY),
], ids=["silent", "half-the-headers", "trickled-headers", "half-the-body", "trickled-body"])
def test_a_half_sent_request_is_closed_at_its_deadline(held, client_does, deadline) -> None:
    server = held()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sender = threading.Thread(target=client_does, args=(sock,), daemon=True)
        sender.start()
        after = closed_after(sock, 6 * deadline)
    assert after is not None, "the server still held the connection"
    assert after < deadline + 0.5
    assert server.connections == 0 and server.expired == 1


def test_a_kept_alive_connection_gets_the_header_deadline_again_after_each_answer(held) -> None:
    server = held()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("POST", "/", body=b"abc")
    assert conn.getresponse().read() == b"3"
    conn.request("POST", "/", body=b"abcd")  # the same connection, within the deadline
    assert conn.getresponse().read() == b"4"
    assert closed_after(conn.sock, 6 * HEADERS) is not None  # idle past it: closed
    conn.close()


def test_past_the_cap_the_connection_that_waited_longest_makes_room(held) -> None:
    """The cap full of idle and half-sent connections: a whole request is answered at once, and
    each new connection closes the oldest waiting one, so the port never holds more than the cap."""
    server = held(max_connections=4)
    flood = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
    for sock, send in zip(flood, (silent, half_the_headers, half_the_body, trickled_body)):
        threading.Thread(target=send, args=(sock,), daemon=True).start()
    time.sleep(0.1)
    more = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
    started = time.monotonic()
    assert get(server.port, body=b"{}") == (200, b"2")
    assert time.monotonic() - started < 1.0
    time.sleep(0.2)  # the loop's next turns make room
    assert server.connections <= 4 and server.evicted >= 20
    assert closed_after(flood[0], 0.5) is not None  # the oldest went first
    for sock in flood + more:
        sock.close()


def test_a_whole_request_followed_by_a_burst_of_newcomers_is_still_answered(held) -> None:
    """Newcomers accepted in the same burst as a client whose request waits to be read do not
    close it: room is made on the loop's next turn, never from a connection with bytes unread."""
    for _ in range(5):
        server = held(max_connections=4)
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
        time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", server.port)) as client:
            client.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            burst = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(60)]
            client.settimeout(2)
            assert client.recv(4096).startswith(b"HTTP/1.1 200")
        for sock in idle + burst:
            sock.close()


def test_past_the_cap_a_connection_is_refused_at_once_while_every_one_is_answered(held) -> None:
    release = threading.Event()

    async def slow(request: web.BaseRequest) -> web.Response:
        await serving.read_body(request, 1024)
        await asyncio.to_thread(release.wait, 10)
        return web.Response(text="done")

    server = held(slow, max_connections=2)
    answered: list[tuple[int, bytes]] = []
    clients = [threading.Thread(target=lambda: answered.append(get(server.port, body=b"x"))) for _ in range(2)]
    for t in clients:
        t.start()
    time.sleep(0.3)  # both read and being answered: neither may be closed to make room
    started = time.monotonic()
    try:
        status = get(server.port, body=b"x")[0]
    except (ConnectionError, http.client.RemoteDisconnected):
        status = None  # closed before the 503 was read: refused all the same
    assert status in (503, None) and time.monotonic() - started < 1.0
    assert server.refused == 1 and server.evicted == 0
    release.set()
    for t in clients:
        t.join()
    assert answered == [(200, b"done")] * 2


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "tls.crt", d / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def test_over_tls_the_handshake_is_within_the_header_deadline_and_counts_against_the_cap(held, certificate) -> None:
    cert, key = certificate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = held(max_connections=2, ssl_context=context)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:  # never says hello
        after = closed_after(sock, 6 * HEADERS)
    assert after is not None and after < HEADERS + 0.5
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
    time.sleep(0.1)
    client = ssl.create_default_context(cafile=str(cert))
    conn = http.client.HTTPSConnection("localhost", server.port, context=client, timeout=5)
    conn.request("POST", "/", body=b"hello")
    assert conn.getresponse().read() == b"5"
    conn.close()
    assert server.evicted >= 1
    for sock in idle:
        sock.close()


def test_metrics_closes_a_client_without_its_headers_at_the_header_deadline() -> None:
    """/metrics' header deadline is shorter than its request's: a client that never finishes its
    headers is shut down at the first, one that does gets the whole request deadline."""
    from hyperplan import metrics
    server = metrics.serve(free_port(), "127.0.0.1", timeout_seconds=5.0, max_connections=4, cache_seconds=1.0,
                           render=lambda: [b"# nothing\n"], header_seconds=HEADERS)
    try:
        port = server.server_address[1]
        for send in (silent, half_the_headers, trickled_headers):
            with socket.create_connection(("127.0.0.1", port)) as sock:
                threading.Thread(target=send, args=(sock,), daemon=True).start()
                after = closed_after(sock, 5.0)
            assert after is not None and after < HEADERS + 0.5, send.__name__
        assert get(port, "/metrics") == (200, b"# nothing\n")
    finally:
        server.shutdown()
        server.server_close()


class MainLoop:
    """An event loop on a thread, standing in for kopf's."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="main-loop", daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 10):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def block(self, seconds: float) -> None:
        """The loop stuck (a handler that blocks) for ``seconds``."""
        self.loop.call_soon_threadsafe(time.sleep, seconds)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def main_loop() -> Iterator[MainLoop]:
    loop = MainLoop()
    yield loop
    loop.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_healthz_answers_from_its_own_thread_and_says_when_the_loop_stalls(main_loop) -> None:
    port = free_port()
    liveness = main_loop.run(serve_liveness(port, None, "127.0.0.1", stall_seconds=1.0,
                                            limits=serving.Limits(4, HEADERS, BODY)))
    try:
        status, body = get(port, "/healthz")
        assert status == 200 and json.loads(body) == {"status": "ok", "role": "leader"}
        main_loop.block(3.0)
        time.sleep(1.6)  # the last beat is older than the stall allows
        started = time.monotonic()
        status, body = get(port, "/healthz")
        assert time.monotonic() - started < 0.5  # answered while the loop is stuck
        assert status == 503 and json.loads(body)["status"] == "stalled"
        time.sleep(2.0)  # the loop runs again and beats
        assert get(port, "/healthz")[0] == 200
        assert get(port, "/elsewhere")[0] == 404
    finally:
        main_loop.run(liveness.cleanup())


def test_the_sagemaker_api_reads_on_its_thread_and_operates_on_the_callers_loop(main_loop) -> None:
    seen: list[str] = []

    async def operation(request) -> web.Response:
        seen.append(threading.current_thread().name)
        body = await request.content.read(api_server.MAX_BODY + 1)
        return web.json_response({"read": len(body), "target": request.headers.get("X-Amz-Target")})

    @web.middleware
    async def marked(request, handler):
        response = await handler(request)
        response.headers["X-Marked"] = "yes"
        return response

    app = web.Application()
    app[api_server.HANDLE] = operation
    app.middlewares.append(marked)
    how = api_server.Serving(serving.Limits(4, HEADERS, BODY), answer_seconds=0.5)
    port = free_port()
    server = main_loop.run(api_server.serve(app, "127.0.0.1", port, how=how))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("POST", "/", body=b"x" * 70000, headers={"X-Amz-Target": "SageMaker.ListTrainingPlans"})
        r = conn.getresponse()
        assert (r.status, json.loads(r.read()), r.getheader("X-Marked")) == (
            200, {"read": 70000, "target": "SageMaker.ListTrainingPlans"}, "yes")
        conn.close()
        assert seen == ["main-loop"]

        main_loop.block(2.0)  # the operation cannot run: the caller hears so within answer_seconds
        started = time.monotonic()
        status, body = get(port, body=b"{}")
        assert time.monotonic() - started < 1.5
        assert status == 503 and json.loads(body)["__type"] == "ServiceUnavailable"
    finally:
        main_loop.run(server.cleanup())
