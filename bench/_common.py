"""Shared plumbing of the benchmarks: a control plane, the operator as its own process, watches.

Each benchmark runs inside :class:`Harness`, which

* starts its own local control plane in ``<repo>/.state/bench`` (the binaries are cached; a plane
  left over from an interrupted run is stopped first, so every run starts from an empty etcd),
* applies the CRDs and, when asked, starts ``hyperplan run`` as its own process (demo profile,
  free metrics and liveness ports, log in ``.state/bench/<bench>-operator.log``),
* stops both by pid on the way out: normal end, exception, Ctrl-C, SIGTERM, or the overall time
  budget (SIGALRM), and then exits non-zero with a clear message when the run failed.

Watches are raw JSON streams read with urllib (no client-side deserialisation), each event
stamped with the wall time it was read: that stamp is what the benchmarks compare with the
times the operator was meant to act at.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

ROOT = Path(__file__).resolve().parent.parent
STATE = Path(os.environ.get("BENCH_STATE") or ROOT / ".state" / "bench")  # BENCH_STATE: run beside another bench
PYTHON = ROOT / ".venv" / "bin" / "python"
API = "hyperplan.dev/v1alpha1"
GROUP, VERSION = "hyperplan.dev", "v1alpha1"

if str(ROOT / "src") not in sys.path:  # the venv has hyperplan installed editable; this is a fallback
    sys.path.insert(0, str(ROOT / "src"))

from hyperplan_dev import build  # noqa: E402
from hyperplan_dev.plane import Plane, free_port, stop_process_group  # noqa: E402
from hyperplan.api.models import from_rfc3339, to_rfc3339  # noqa: E402

_T0 = time.monotonic()


class BenchError(RuntimeError):
    """The benchmark could not finish (a timeout, the operator died, an API call failed)."""


class BudgetExceeded(BenchError):
    pass


def step(msg: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {msg}", flush=True)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


ts = to_rfc3339
parse_ts = from_rfc3339


def epoch(moment: datetime) -> float:
    return moment.timestamp()


def wait_for(fn: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.2) -> Any:
    """Call ``fn`` until it returns something truthy; BenchError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


def summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": statistics.median(values), "p95": percentile(values, 95),
            "max": max(values), "min": min(values)}


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(header), line(tuple("-" * w for w in widths)), *map(line, rows)])


def print_figures(title: str, rows: list[tuple[str, ...]]) -> None:
    rows = [*rows[:1], ("operator code", CODE_AT_START, "", ""), *rows[1:]]
    print(flush=True)
    print(f"== {title}: figures ==")
    print(table(rows, ("figure", "value", "target", "verdict")), flush=True)


# --------------------------------------------------------------------------- raw API access


class RawApi:
    """GET, metrics and watches over plain HTTPS with the plane's admin client certificate."""

    def __init__(self, plane: Plane):
        self.base = plane.server
        self.ctx: ssl.SSLContext = plane.ssl_context()

    def get(self, path: str, timeout: float = 10) -> Any:
        with urllib.request.urlopen(self.base + path, context=self.ctx, timeout=timeout) as r:
            data = r.read()
        return json.loads(data) if path != "/metrics" else data.decode()

    def metrics(self) -> str:
        with urllib.request.urlopen(self.base + "/metrics", context=self.ctx, timeout=10) as r:
            return r.read().decode()


@dataclass
class Watch:
    """A background watch on one collection; ``on_event(type, obj, t_read)`` per event.

    The initial list is delivered as ADDED events (t_read = time of the list). The stream is
    re-opened from the last resourceVersion when the server closes it, and re-listed on 410.
    """

    api: RawApi
    path: str  # e.g. /api/v1/nodes or /apis/hyperplan.dev/v1alpha1/trainingplans
    on_event: Callable[[str, dict, float], None]
    params: dict[str, str] = field(default_factory=dict)
    # When set, every (re-)list is handed over whole (items, t_read) instead of as ADDED events,
    # so that a consumer keeping state can drop what was deleted while the stream was down.
    on_list: Callable[[list[dict], float], None] | None = None
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _ready: threading.Event = field(default_factory=threading.Event)

    def start(self) -> "Watch":
        threading.Thread(target=self._run, daemon=True, name=f"watch {self.path}").start()
        if not self._ready.wait(15):
            raise BenchError(f"watch on {self.path} did not start: {self.errors[-1:]}")
        return self

    def stop(self) -> None:
        self._stop.set()

    def _url(self, extra: dict[str, str]) -> str:
        return f"{self.path}?{urllib.parse.urlencode({**self.params, **extra})}"

    def _run(self) -> None:
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    listing = self.api.get(self._url({}))
                    t = time.time()
                    rv = listing["metadata"]["resourceVersion"]
                    if self.on_list is not None:
                        self.on_list(listing.get("items", []), t)
                    else:
                        for item in listing.get("items", []):
                            self.on_event("ADDED", item, t)
                    self._ready.set()
                url = self.api.base + self._url({"watch": "1", "resourceVersion": rv,
                                                 "allowWatchBookmarks": "true", "timeoutSeconds": "20"})
                with urllib.request.urlopen(url, context=self.api.ctx, timeout=40) as stream:
                    for line in stream:
                        t = time.time()
                        if not line.strip():
                            continue
                        ev = json.loads(line)
                        obj = ev.get("object") or {}
                        if ev.get("type") == "ERROR":
                            if obj.get("code") == 410:
                                rv = None
                            break
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if ev.get("type") != "BOOKMARK":
                            self.on_event(ev["type"], obj, t)
                        if self._stop.is_set():
                            return
            except Exception as e:  # noqa: BLE001 - a broken stream is re-opened
                self.errors.append(f"{type(e).__name__}: {e}")
                time.sleep(0.2)


# --------------------------------------------------------------------------- node helpers


def node_ready(node: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def has_taint(node: dict, key: str) -> bool:
    return any(t.get("key") == key for t in (node.get("spec") or {}).get("taints") or [])


# --------------------------------------------------------------------------- /proc sampling


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def proc_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


LOADAVG_AT_START = Path("/proc/loadavg").read_text().split()[:3]


def code_version() -> str:
    """The commit the operator ran from, and whether src/ had uncommitted changes at the start."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" + uncommitted changes in src/" if dirty else "")


CODE_AT_START = code_version()


def machine() -> str:
    """CPU count and model, and the 1/5/15-minute load average when the benchmark started."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU")
    return f"{os.cpu_count()} cores ({model}), load at start {'/'.join(LOADAVG_AT_START)}"


# --------------------------------------------------------------------------- Prometheus text


def scrape(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Samples of metric ``name`` in Prometheus text format: (labels, value)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out.append((dict(sample.labels), float(sample.value)))
    return out


def metric_sum(text: str, name: str, where: Callable[[dict[str, str]], bool] = lambda _: True) -> float:
    return sum(v for labels, v in scrape(text, name) if where(labels))


# --------------------------------------------------------------------------- the harness


@dataclass
class Operator:
    proc: subprocess.Popen
    log: Path
    metrics_port: int
    liveness_port: int

    @property
    def pid(self) -> int:
        return self.proc.pid

    def metrics(self, timeout: float = 5) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=timeout) as r:
            return r.read().decode()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start_tracing(self) -> bool:
        """With BENCH_OPERATOR_TRACEMALLOC=<file>: start tracing allocations now (SIGUSR2, see
        bench/_traced_operator.py), so the report holds only what is allocated from here on."""
        if not os.environ.get("BENCH_OPERATOR_TRACEMALLOC"):
            return False
        self.proc.send_signal(signal.SIGUSR2)
        return True

    def tracemalloc_report(self, timeout: float = 120) -> str | None:
        """With BENCH_OPERATOR_TRACEMALLOC=<file>: ask the operator for its allocation sites
        (SIGUSR1, see bench/_traced_operator.py) and return the report; None when not traced."""
        path = os.environ.get("BENCH_OPERATOR_TRACEMALLOC")
        if not path:
            return None
        out = Path(path)
        before = out.stat().st_mtime if out.exists() else 0.0
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if out.exists() and out.stat().st_mtime > before and out.stat().st_size > 0:
                time.sleep(0.5)
                return out.read_text()
            time.sleep(0.5)
        return None

    def check(self) -> None:
        if not self.alive():
            raise BenchError(f"the operator exited with {self.proc.returncode}; last lines of {self.log}:\n"
                             + "\n".join(self.log.read_text(errors="replace").splitlines()[-30:]))

    def log_lines(self, *needles: str) -> list[str]:
        lines = self.log.read_text(errors="replace").splitlines()
        return [ln for ln in lines if all(n in ln for n in needles)]


class Harness:
    """Plane + CRDs (+ operator) for one benchmark; everything it starts is stopped on exit."""

    def __init__(self, name: str, budget: float = 360, **plane_options: Any):
        """``plane_options`` go to the ``Plane`` (for example ``node_status_seconds``)."""
        self.name = name
        self.budget = budget
        self.plane = Plane(root=STATE, log=lambda line: step(f"plane: {line}"), **plane_options)
        self.operator: Operator | None = None
        self.api: RawApi | None = None
        self._watches: list[Watch] = []

    # -- lifecycle

    def __enter__(self) -> "Harness":
        def on_signal(signum, _frame):
            raise KeyboardInterrupt(f"signal {signum}")

        def on_alarm(_signum, _frame):
            raise BudgetExceeded(f"{self.name} exceeded its overall budget of {self.budget:.0f}s")

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(int(self.budget))
        try:
            self._setup()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def _setup(self) -> None:
        STATE.mkdir(parents=True, exist_ok=True)
        if self.plane.state() is not None:
            step("stopping a control plane left over from an earlier run")
            self.plane.down(quiet=True)
        step(f"starting the control plane in {STATE}")
        self.plane.up()
        self.api = RawApi(self.plane)
        step("applying the CRDs")
        self.kubectl("apply", "-f", str(ROOT / "crds"))
        for plural in ("capacitypools", "trainingplans", "instancegroups"):
            self.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{plural}.hyperplan.dev")

        def listable(plural: str) -> bool:  # a fresh CRD's storage answers 429 for a moment
            try:
                self.api.get(f"/apis/{GROUP}/{VERSION}/{plural}?limit=1")
                return True
            except (urllib.error.HTTPError, OSError):
                return False

        for plural in ("capacitypools", "trainingplans", "instancegroups"):
            wait_for(lambda: listable(plural), timeout=30, what=f"{plural} to be listable")
        from hyperplan.actuation.kube import api_client
        from kubernetes import client

        self.client = api_client(str(self.plane.kubeconfig))
        self.client.user_agent = "hyperplan-bench"  # not the operator's hyperplan/ (AuditWrites)
        self.core = client.CoreV1Api(self.client)
        self.custom = client.CustomObjectsApi(self.client)

    def __exit__(self, exc_type, exc, tb) -> bool:
        signal.alarm(0)
        for w in self._watches:
            w.stop()
        try:
            if self.operator is not None:
                self.stop_operator()
        finally:
            if os.environ.get("BENCH_KEEP_LOGS") == "1" and (self.plane.dir / "logs").is_dir():
                # the plane's logs outlive it (down removes them)
                kept = STATE / f"{self.name}-plane-logs"
                shutil.copytree(self.plane.dir / "logs", kept, dirs_exist_ok=True)
                step(f"the plane's logs kept in {kept}")
            step("stopping the control plane")
            self.plane.down(quiet=True)
        if exc_type is None or (issubclass(exc_type, SystemExit) and exc.code in (0, None)):
            return False  # a bench that ends with sys.exit(0) inside the harness ended well
        if issubclass(exc_type, SystemExit):
            return False  # its own exit code, after its own message
        if issubclass(exc_type, KeyboardInterrupt):
            print(f"\n{self.name}: interrupted; operator and control plane stopped", file=sys.stderr)
            raise SystemExit(130)
        if issubclass(exc_type, BenchError):
            print(f"\n{self.name}: ERROR: {exc}", file=sys.stderr)
        else:
            print(f"\n{self.name}: ERROR: unexpected {exc_type.__name__}: {exc}", file=sys.stderr)
            traceback.print_exception(exc_type, exc, tb)
        if self.operator is not None:
            print(f"operator log: {self.operator.log}", file=sys.stderr)
        raise SystemExit(2)

    # -- the operator

    def start_operator(self, policy: str = "demo", extra_env: dict[str, str] | None = None,
                       replica: str = "operator") -> Operator:
        log = STATE / f"{self.name}-{replica}.log"
        metrics_port, liveness_port = free_port(), free_port()
        env = {**os.environ, "KUBECONFIG": str(self.plane.kubeconfig), "HYPERPLAN_POLICY": policy,
               "HYPERPLAN_METRICS_PORT": str(metrics_port), "HYPERPLAN_LIVENESS_PORT": str(liveness_port),
               **(extra_env or {})}
        env.pop("HYPERPLAN_STATE_DIR", None)
        cmd = [str(PYTHON), "-m", "hyperplan.cli", "run"]
        profile = os.environ.get("BENCH_OPERATOR_PROFILE")  # diagnostics: cProfile of the event-loop thread
        if profile:
            cmd[1:1] = ["-m", "cProfile", "-o", profile]
        traced = os.environ.get("BENCH_OPERATOR_TRACEMALLOC")  # diagnostics: where the memory goes
        if traced:
            cmd = [str(PYTHON), str(ROOT / "bench" / "_traced_operator.py"), traced]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, env=env, cwd=ROOT,
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.operator = op = Operator(proc, log, metrics_port, liveness_port)
        step(f"starting the operator (pid {proc.pid}, policy {policy}, metrics :{metrics_port}, log {log})")

        def live() -> bool:
            op.check()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{liveness_port}/healthz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(live, timeout=300 if traced else 60, what="the operator's liveness endpoint", interval=0.3)
        step("operator is live")
        return op

    def stop_operator(self) -> None:
        op = self.operator
        if op is None or not op.alive():
            return
        step(f"stopping the operator (pid {op.pid})")
        op.proc.send_signal(signal.SIGTERM)
        try:
            op.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            step("operator did not stop within 20s of SIGTERM; killing its process group")
            stop_process_group(op.pid, timeout=5)
            op.proc.wait(timeout=5)

    # -- helpers

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(build.binary("kubectl")), f"--kubeconfig={self.plane.kubeconfig}", *args],
                              input=input, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise BenchError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def watch(self, path: str, on_event: Callable[[str, dict, float], None],
              on_list: Callable[[list[dict], float], None] | None = None, **params: str) -> Watch:
        w = Watch(self.api, path, on_event, params=params, on_list=on_list).start()
        self._watches.append(w)
        return w

    def create(self, plural: str, body: dict) -> dict:
        return self.custom.create_cluster_custom_object(GROUP, VERSION, plural, body)

    def get(self, plural: str, name: str) -> dict:
        return self.custom.get_cluster_custom_object(GROUP, VERSION, plural, name)

    def status(self, plural: str, name: str) -> dict:
        return self.get(plural, name).get("status") or {}

    def tick(self) -> None:
        """Between waits: fail fast when the operator died."""
        if self.operator is not None:
            self.operator.check()


def pool(name: str, itype: str, count: int, az: str, ultra: str | None = None) -> dict:
    spec: dict[str, Any] = {"instanceType": itype, "availabilityZone": az, "instanceCount": count}
    if ultra:
        spec["ultraServerType"] = ultra
    return {"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": name}, "spec": spec}


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def fmt(seconds: float, digits: int = 3) -> str:
    return f"{seconds:.{digits}f} s"


def run(main: Callable[[Harness], int], name: str, budget: float, **plane_options: Any) -> None:
    """Run ``main`` (which returns 0 when every target is met, 1 when one is missed) in a Harness.

    Exit status: 2 on an error or timeout (with a message on stderr), 130 on Ctrl-C/SIGTERM,
    otherwise 0, so that ``make bench`` runs every benchmark; with BENCH_STRICT=1 a missed target
    exits 1. The overall time budget can be overridden with BENCH_BUDGET (seconds).
    """
    budget = float(os.environ.get("BENCH_BUDGET") or budget)
    step(f"{name}: overall time budget {budget:.0f} s; {machine()}; code {CODE_AT_START}; {utcnow():%Y-%m-%d %H:%M} UTC")
    with Harness(name, budget, **plane_options) as h:
        rc = main(h)
    if rc:
        print(f"{name}: at least one target was MISSED (see the table)", flush=True)
    raise SystemExit(rc if os.environ.get("BENCH_STRICT") == "1" else 0)


__all__: Iterable[str] = [n for n in dir() if not n.startswith("_")]


def loadavg() -> str:
    """The machine's 1/5/15-minute load averages, as the figures are printed beside them."""
    return "/".join(Path("/proc/loadavg").read_text().split()[:3])


def api_requests(text: str) -> Counter:
    """The API server's apiserver_request_total by (verb, group/resource[/subresource])."""
    out: Counter = Counter()
    for labels, value in scrape(text, "apiserver_request_total"):
        res = "/".join(x for x in (labels.get("group") or "core", labels.get("resource", "?"),
                                   labels.get("subresource", "")) if x)
        out[(labels.get("verb", "?"), res)] += value
    return out


WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION"})


def api_writes(text: str) -> Counter:
    """apiserver_request_total of write verbs, by (group/resource[/subresource], verb)."""
    return Counter({(res, verb): n for (verb, res), n in api_requests(text).items() if verb in WRITE_VERBS})


OPERATOR_AGENTS = ("hyperplan/", "kopf/")  # the operator's two clients (actuation.kube, kopf)


class AuditWrites:
    """The writes in the API server's audit log (``Plane(audit_writes=True)``), by client.

    ``mark()`` remembers where the log ends; ``since_mark()`` counts the writes after it by
    (client, group/resource[/subresource], verb), the client being the User-Agent's product
    (``hyperplan``, ``kopf``, ``kube-controller-manager``, ``kwok``...). Unlike
    ``apiserver_request_total``, this tells the operator's node PATCHes from the node lifecycle
    controller's."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0

    def mark(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def since_mark(self) -> Counter:
        out: Counter = Counter()
        if not self.path.exists():
            return out
        with self.path.open("rb") as f:
            f.seek(self.offset)
            for line in f:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue  # a line the API server is still writing
                ref = ev.get("objectRef") or {}
                res = "/".join(x for x in (ref.get("apiGroup") or "core", ref.get("resource", "?"),
                                           ref.get("subresource", "")) if x)
                agent = (ev.get("userAgent") or "?").split("/", 1)[0]
                out[(agent, res, ev.get("verb", "?"))] += 1
        return out

    @staticmethod
    def operators(writes: Counter) -> Counter:
        return Counter({k: n for k, n in writes.items() if any(k[0] + "/" == a for a in OPERATOR_AGENTS)})


def increase(after: Counter, before: Counter) -> Counter:
    """What each counter grew by between two scrapes (keys that did not grow are left out)."""
    return Counter({k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0) > 0})
