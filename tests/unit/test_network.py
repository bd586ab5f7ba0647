"""What a client on the network can make the operator spend: the metrics server's deadline, its cap
on connections and its shared render, and the Kubernetes API client's default timeout, each
against real sockets on 127.0.0.1."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from hyperplan import metrics
from hyperplan.actuation.kube import api_client, is_watch

TIMEOUT = 0.5  # the metrics server's deadline in these tests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CountingRender:
    """A render that counts its calls and takes ``seconds``, of ``size`` bytes in 64 KiB chunks."""

    def __init__(self, seconds: float = 0.0, size: int = 100) -> None:
        self.seconds, self.size, self.calls = seconds, size, 0
        self._lock = threading.Lock()

    def __call__(self) -> list[bytes]:
        with self._lock:
            self.calls += 1
        time.sleep(self.seconds)
        chunk = 64 * 1024
        return [b"#" * min(chunk, self.size - i) for i in range(0, self.size, chunk)]


@pytest.fixture
def serve():
    servers = []

    def start(render=None, **limits) -> int:
        port = free_port()
        limits = {"timeout_seconds": TIMEOUT, "max_connections": 4, "cache_seconds": 1.0, **limits}
        servers.append(metrics.serve(port, "127.0.0.1", render=render or CountingRender(), **limits))
        return port

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def scrape(port: int) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


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
        except ConnectionResetError:
            return time.monotonic() - started
    return None


def silent(sock: socket.socket) -> None:
    """Connects and sends nothing."""


def half_a_request(sock: socket.socket) -> None:
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")


def trickle(sock: socket.socket) -> None:
    """One header byte each 0.1 s, each within the per-read timeout, never ending the headers."""
    sock.sendall(b"GET /metrics HTTP/1.1\r\n")
    for _ in range(int(3 * TIMEOUT / 0.1)):
        try:
            sock.sendall(b"X")
        except OSError:
            return
        time.sleep(0.1)


@pytest.mark.parametrize("client_does", [silent, half_a_request, trickle],
                         ids=["silent", "half-a-request", "trickles-its-headers"])
def test_a_slow_client_is_cut_at_the_deadline(serve, client_does) -> None:
    port = serve()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sender = threading.Thread(target=client_does, args=(sock,), daemon=True)
        sender.start()
        after = closed_after(sock, 5 * TIMEOUT)
    assert after is not None, "the server still held the connection"
    assert after < TIMEOUT + 0.5


def test_a_client_that_does_not_read_the_body_frees_its_slot(serve) -> None:
    """A 64 MiB body to a client that reads nothing: the write blocks, the deadline cuts it, and
    the one slot serves the next scraper."""
    port = serve(CountingRender(size=64 * 1024 * 1024), max_connections=1)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(TIMEOUT / 2)
        assert scrape(port)[0] == 503  # the slot is held while the body is stuck
        time.sleep(TIMEOUT)
        # The deadline has passed: the slot comes free (polled, generously: a loaded machine may
        # take a while to cut the stuck write and to render 64 MiB for the next scraper).
        deadline = time.monotonic() + 20
        status, body = scrape(port)
        while status == 503 and time.monotonic() < deadline:
            time.sleep(0.2)
            status, body = scrape(port)
    assert status == 200 and len(body) == 64 * 1024 * 1024


def test_connections_past_the_cap_make_room_or_are_refused_at_once(serve) -> None:
    """Past the cap, the connection that has waited longest for its headers is shut down and the
    new one is answered; while every connection is being answered, a new one gets a 503 at once."""
    port = serve(max_connections=2, timeout_seconds=5)
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    try:
        time.sleep(0.2)  # both accepted and waiting for their requests
        started = time.monotonic()
        assert scrape(port)[0] == 200
        assert time.monotonic() - started < 1.0
        assert closed_after(held[0], 1.0) is not None  # the oldest made room
    finally:
        for sock in held:
            sock.close()

    busy = serve(CountingRender(seconds=1.5), max_connections=2, timeout_seconds=5, cache_seconds=0)
    scrapers = [threading.Thread(target=scrape, args=(busy,)) for _ in range(2)]
    for t in scrapers:
        t.start()
    time.sleep(0.3)  # both past their headers, waiting for the render
    started = time.monotonic()
    try:
        status = scrape(busy)[0]
    except (ConnectionResetError, http.client.RemoteDisconnected):
        status = None  # closed before the 503 was read: refused all the same
    assert status in (503, None)
    assert time.monotonic() - started < 1.0
    for t in scrapers:
        t.join()
    time.sleep(0.2)  # their threads see the scrapers close and free the slots
    assert scrape(busy)[0] == 200


def test_concurrent_scrapes_share_one_render(serve) -> None:
    render = CountingRender(seconds=0.3)
    port = serve(render, max_connections=16)
    start = threading.Barrier(12)
    results = []

    def scraper() -> None:
        start.wait()
        results.append(scrape(port))

    threads = [threading.Thread(target=scraper) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert [status for status, _ in results] == [200] * 12
    assert render.calls == 1
    time.sleep(1.1)  # the cached render is too old now
    assert scrape(port)[0] == 200
    assert render.calls == 2


def test_scrapes_that_wait_for_a_render_use_it_even_with_no_cache(serve) -> None:
    render = CountingRender(seconds=0.3)
    port = serve(render, cache_seconds=0, max_connections=16)
    first = threading.Thread(target=scrape, args=(port,))
    first.start()
    time.sleep(0.1)  # the first render is under way
    others = [threading.Thread(target=scrape, args=(port,)) for _ in range(5)]
    for t in others:
        t.start()
    for t in [first, *others]:
        t.join(10)
    assert render.calls == 1  # the five that arrived during the first render were given it
    scrape(port)
    assert render.calls == 2  # a scrape after it renders again


# --------------------------------------------------------------------------- the API client

@pytest.fixture
def mute_server() -> Iterator[int]:
    """A server on 127.0.0.1 that accepts every connection and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except socket.timeout:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(2)
    for s in held:
        s.close()
    server.close()


def kubeconfig(tmp_path: Path, port: int) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    return str(path)


API_TIMEOUT = 0.4


@pytest.mark.parametrize("call, tries", [
    (lambda core: core.patch_node("n", {"metadata": {"labels": {"a": "b"}}}), 1),
    (lambda core: core.create_namespaced_event("default", client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="e"), involved_object=client.V1ObjectReference())), 1),
    (lambda core: core.list_node(label_selector="a=b"), 4),
], ids=["patch-once", "create-once", "get-tried-4-times-by-urllib3"])
def test_the_api_client_gives_up_on_a_server_that_never_answers(tmp_path, mute_server, call, tries) -> None:
    core = client.CoreV1Api(api_client(kubeconfig(tmp_path, mute_server), request_timeout=API_TIMEOUT))
    started = time.monotonic()
    with pytest.raises(Exception, match="[Rr]ead timed out|ReadTimeoutError"):
        call(core)
    elapsed = time.monotonic() - started
    assert tries * API_TIMEOUT <= elapsed < tries * API_TIMEOUT + 1.5


def test_the_default_timeout_comes_from_the_settings(tmp_path, mute_server, monkeypatch) -> None:
    monkeypatch.setenv("HYPERPLAN_API_TIMEOUT_SECONDS", str(API_TIMEOUT))
    core = client.CoreV1Api(api_client(kubeconfig(tmp_path, mute_server)))
    started = time.monotonic()
    with pytest.raises(Exception, match="[Rr]ead timed out"):
        core.patch_node("n", {})
    assert time.monotonic() - started < API_TIMEOUT + 1.5


@pytest.mark.parametrize("call, want", [
    (lambda core: core.read_node("n"), 30.0),
    (lambda core: core.read_node("n", _request_timeout=(2, 7)), (2, 7)),
    (lambda core: core.list_node(watch=True, _preload_content=False), None),
    (lambda core: core.list_node(watch=True, _preload_content=False, _request_timeout=(10, 150)), (10, 150)),
    (lambda core: core.list_node(watch=False), 30.0),
], ids=["default", "its-own-kept", "watch-without", "watch-its-own-kept", "watch-false-is-a-list"])
def test_which_calls_get_the_default_timeout(tmp_path, call, want) -> None:
    api = api_client(kubeconfig(tmp_path, free_port()), request_timeout=30.0)
    seen = []

    class Answer:
        status, reason, data, response = 200, "OK", b"{}", None

        def read(self):
            return self.data

        def getheaders(self):
            return {"content-type": "application/json"}

        def getheader(self, name, default=None):
            return self.getheaders().get(name.lower(), default)

    def request(method, url, query_params=None, headers=None, body=None, post_params=None, _preload_content=True,
                _request_timeout=None):  # urllib3's RESTClientObject.request, as kubernetes 36 calls it
        seen.append(_request_timeout)
        return Answer()

    api.rest_client.request = request
    try:
        call(client.CoreV1Api(api))
    except Exception:  # noqa: BLE001 - the body is not a Node; only the timeout sent matters
        pass
    assert seen == [want]


@pytest.mark.parametrize("url, want", [
    ("https://h/api/v1/nodes?watch=true&resourceVersion=5", True),
    ("https://h/api/v1/nodes?labelSelector=watch%3Dtrue", False),
    ("https://h/api/v1/nodes?watch=false", False),
    ("https://h/api/v1/watch/nodes", False),
], ids=["watch", "watch-in-a-selector", "watch-false", "path-only"])
def test_is_watch(url, want) -> None:
    assert is_watch(url) is want
