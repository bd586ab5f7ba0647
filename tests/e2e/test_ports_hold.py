"""The operator's ports hold against a flood of connections (hyperplan.serving, the metrics server):
2,000 idle and half-sent connections opened at once against its liveness, SageMaker API and metrics
ports, and each one the operator lets go opened again, so the operator is pressed to hold 2,000 for
the whole flood. Meanwhile /healthz and a SageMaker API call signed with boto3 answer within 2 s,
a plan bought through kopf during the flood is bought, and the operator's process holds no more
sockets than its caps allow (it closes the rest, where it used to keep every one).

The flood is bounded: loopback only, at most 2,000 sockets at once, at most ``REOPENS_PER_SECOND``
opened again a second, for at most ``FLOOD_SECONDS``, all closed at the end."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import selectors
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

import pytest

from hyperplan.serving import BURST
from tests.aws.keys import grant_plan_reads, mint_key, serving
from tests.e2e.conftest import Operator
from tests.e2e.scenarios import Context, plan_body, pool_body, ts, utcnow
from tests.kube import Kubectl, eventually

FLOOD = 2000
SHARE = {"liveness": 800, "sagemaker": 800, "metrics": 400}  # of the flood, by port
FLOOD_SECONDS = 120  # the longest the flood lasts, whatever happens
REOPENS_PER_SECOND = 300  # connections the operator let go, opened again (paced)
ANSWER_SECONDS = 2.0  # what /healthz and a signed call must answer within, during the flood
PROBES = 15  # of each, a second apart, over the flood

# What a flooding connection sends, in turn: nothing; the headers cut short; whole headers and a
# body cut short.
PAYLOADS = (b"", b"POST / HTTP/1.1\r\nHost: flood\r\nX-Amz-Target: SageMaker.ListTrainingPlans\r\n",
            b"POST / HTTP/1.1\r\nHost: flood\r\nContent-Length: 4096\r\n\r\n{\"TrainingPlanName\": ")


@dataclass
class Flood:
    """``SHARE`` connections to each port, kept open from a thread of their own with one selector."""

    ports: dict[str, int]
    opened: int = 0
    closed_by_server: int = 0
    open_now: int = 0
    most_open: int = 0
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _full: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="flood", daemon=True)
        self._thread.start()
        assert self._full.wait(60), f"the flood did not reach {FLOOD} open connections: {self}"

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _open(self, sel: selectors.BaseSelector, due: list[tuple[str, int]], name: str, n: int) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex(("127.0.0.1", self.ports[name]))
        if err not in (0, errno.EINPROGRESS):
            s.close()
            self.errors += 1
            due.append((name, n))  # tried again later
            return
        sel.register(s, selectors.EVENT_WRITE, (name, n, False))
        self.opened += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        # Which connections to open (again): at first, all of them.
        due: list[tuple[str, int]] = [(name, i) for name, count in SHARE.items() for i in range(count)]
        ends = time.monotonic() + FLOOD_SECONDS
        budget, tick = 0.0, time.monotonic()
        try:
            while not self._stop.is_set() and time.monotonic() < ends:
                now = time.monotonic()
                if self.opened < FLOOD:  # the first 2,000 at once
                    first, due = due[:FLOOD - self.opened], due[FLOOD - self.opened:]
                    for name, n in first:
                        self._open(sel, due, name, n)
                else:
                    budget = min(REOPENS_PER_SECOND, budget + (now - tick) * REOPENS_PER_SECOND)
                    while due and budget >= 1:
                        self._open(sel, due, *due.pop(0))
                        budget -= 1
                tick = now
                if self.open_now >= FLOOD:
                    self._full.set()
                for key, events in sel.select(timeout=0.05):
                    s: socket.socket = key.fileobj  # type: ignore[assignment]
                    name, n, connected = key.data
                    if not connected:
                        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                            self._gone(sel, s, name, n)
                            due.append((name, n))
                            continue
                        payload = PAYLOADS[n % len(PAYLOADS)]
                        with contextlib.suppress(OSError):
                            s.send(payload)
                        sel.modify(s, selectors.EVENT_READ, (name, n, True))
                        continue
                    try:
                        s.recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        pass
                    # Closed, or answered (a 503 at the cap, a 404 of /healthz's to a POST): let go.
                    self.closed_by_server += 1
                    self._gone(sel, s, name, n)
                    due.append((name, n))
        finally:
            for key in list(sel.get_map().values()):
                with contextlib.suppress(Exception):
                    sel.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
            self.open_now = 0
            sel.close()

    def _gone(self, sel: selectors.BaseSelector, s: socket.socket, name: str, n: int) -> None:
        sel.unregister(s)
        s.close()
        self.open_now -= 1


def sockets_of(pid: int) -> int:
    """How many sockets the process holds."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                count += 1
    return count


def healthz(operator: Operator) -> tuple[int, float]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{operator.liveness_port}/healthz", timeout=10) as r:
            return r.status, time.monotonic() - started
    except urllib.error.HTTPError as e:
        raise AssertionError(f"/healthz answered {e.code}: {e.read()[:200]!r}") from None


@pytest.fixture
def enough_files() -> None:
    """The flood's sockets fit the test process's file limit (raised to the hard limit if need be)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = FLOOD + 1024
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.fail(f"RLIMIT_NOFILE's hard limit {hard} is below the flood's {need}", pytrace=False)
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_ports_hold_against_a_flood_of_idle_and_half_sent_connections(
        operator: Operator, crds: Kubectl, plane, enough_files, monkeypatch, scenarios, late_scenarios) -> None:
    import boto3
    from botocore.config import Config

    # The flood presses the one operator every scenario shares, so it is no scenario of its own: it
    # starts once they have all ended (their tests read their records whenever they run).
    for future in [*scenarios.values(), *late_scenarios.values()]:
        future.exception(timeout=900)

    k = crds
    url = f"http://127.0.0.1:{operator.sagemaker_api_port}"
    ctx = Context(kubectl=k, kube=None, operator=operator, sagemaker_api_urls=(url,),
                  kubeconfig=str(plane.kubeconfig), plane=plane)
    tag = uuid.uuid4().hex[:5]
    user = f"ports-reader-{tag}"
    key_id, secret = mint_key(ctx, user)
    grant_plan_reads(ctx, user, user)
    serving(ctx, key_id, secret)  # the API knows the key before the flood starts
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.setenv(name, "/dev/null")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    session = boto3.session.Session()

    def signed_call(plan: str) -> tuple[str, float]:
        """One call on a connection of its own, timed from its connect to its answer. No retries:
        a call that fails or is slow counts as it is. (A client's idle kept-alive connection is
        one the operator may close to make room in a flood; boto3 retries a call on such a
        connection by default, which would hide the time lost.)"""
        api = session.client(
            "sagemaker", endpoint_url=url, region_name="us-west-2", aws_access_key_id=key_id,
            aws_secret_access_key=secret,
            config=Config(retries={"total_max_attempts": 1}, connect_timeout=10, read_timeout=10))
        started = time.monotonic()
        try:
            answer = api.describe_training_plan(TrainingPlanName=plan)
            outcome = answer["Status"]
        except api.exceptions.ResourceNotFound:
            outcome = "ResourceNotFound"  # a signed answer all the same (the plan not made yet)
        finally:
            api.close()
        return outcome, time.monotonic() - started

    itype, pool, plan = f"ml.ports-{tag}.xlarge", f"ports-{tag}", f"ports-{tag}"
    baseline = sockets_of(operator.proc.pid)
    assert healthz(operator)[0] == 200 and signed_call(plan)[0] == "ResourceNotFound"

    flood = Flood({"liveness": operator.liveness_port, "sagemaker": operator.sagemaker_api_port,
                   "metrics": operator.metrics_port})
    health: list[tuple[int, float]] = []
    calls: list[tuple[str, float]] = []
    held: list[int] = []
    flooding: list[int] = []  # the flood's sockets open at each probe (those the operator let go not yet opened again)
    bought_at = None
    flood.start()
    flood_started = time.monotonic()
    try:
        flooding.append(flood.open_now)  # the first probes, right after the 2,000 were opened
        health.append(healthz(operator))
        calls.append(signed_call(plan))
        # A plan bought while the flood goes on: kopf's passes and the purchase run as ever.
        k.create(pool_body(pool, itype, 2))
        start = utcnow().replace(microsecond=0) + timedelta(minutes=10)
        k.create(plan_body(plan, itype, 1, duration="1m", autoPurchase=True, startTimeAfter=ts(start),
                           endTimeBefore=ts(start + timedelta(minutes=30))))
        for _ in range(PROBES):
            flooding.append(flood.open_now)
            health.append(healthz(operator))
            calls.append(signed_call(plan))
            held.append(sockets_of(operator.proc.pid))
            if bought_at is None and ((k.get("trainingplan", plan).get("status") or {}).get("reservedCapacity")):
                bought_at = time.monotonic() - flood_started
            time.sleep(1.0)

        def bought() -> bool:
            return bool((k.get("trainingplan", plan).get("status") or {}).get("reservedCapacity"))
        if bought_at is None:
            eventually(bought, timeout=60, interval=1, what=f"plan {plan} bought during the flood")
            bought_at = time.monotonic() - flood_started
        flooding.append(flood.open_now)
        health.append(healthz(operator))
        calls.append(signed_call(plan))
    finally:
        flood.stop()
    flood_seconds = time.monotonic() - flood_started
    print(f"[ports] flood: {flood.opened} connections opened over {flood_seconds:.0f}s ({flood.closed_by_server} "
          f"let go by the operator), at most {flood.most_open} open at once, {min(flooding)}-{max(flooding)} at the "
          f"probes; "
          f"/healthz answered in at most {max(t for _, t in health):.3f}s, the signed call in at most "
          f"{max(t for _, t in calls):.3f}s; the plan bought {bought_at:.1f}s into the flood; the operator held "
          f"{baseline} sockets before and at most {max(held)} during it", flush=True)

    assert flood.most_open >= FLOOD and flood.opened >= FLOOD + 10 * REOPENS_PER_SECOND * 0.5
    assert bought_at < flood_seconds
    assert [status for status, _ in health] == [200] * len(health)
    assert all(seconds < ANSWER_SECONDS for _, seconds in health), health
    assert calls[-1][0] == "Scheduled"  # bought, as the API reads it from kopf's index
    assert all(seconds < ANSWER_SECONDS for _, seconds in calls), calls
    # The operator held its caps' worth of flood connections (16 + 128 + 8, and at most a burst of
    # accepts past each aiohttp port's cap until its loop's next turn), not the flood.
    assert max(held) <= baseline + 16 + 128 + 8 + 2 * BURST, (baseline, held)
    assert operator.proc.poll() is None
    healthz(operator)

    k.delete("trainingplan", plan)
    k.delete("capacitypool", pool)
