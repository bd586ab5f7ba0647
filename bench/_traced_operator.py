"""Run ``hyperplan run`` with memory diagnostics that start late: SIGUSR2 starts tracing, SIGUSR1
writes where the memory went since then to a file.

Used by the benchmarks when BENCH_OPERATOR_TRACEMALLOC=<file> is set (bench/_common.py). Tracing
from the first import made the operator need 90 s to start on a loaded machine (every import's
allocations traced); here the operator starts untraced, and the benchmark sends SIGUSR2 once it
is up and idle, just before it creates the objects whose memory it measures. The report then
holds only what was allocated (and is still alive) since: the top allocation sites by line and
by the innermost hyperplan or kopf frame, and the live objects by type (``gc.get_objects``) minus
those alive when tracing started, with the asyncio tasks by coroutine. Tracing costs CPU and
memory of its own (frames are kept 4 deep): take the sites and shares from a traced run, the RSS
figures from an untraced one.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path

OUT = Path(sys.argv[1])
FRAMES = 4
_types_at_start: Counter = Counter()
_started = 0.0


def _type_counts() -> Counter:
    return Counter(f"{getattr(type(o), '__module__', '?')}.{type(o).__qualname__}" for o in gc.get_objects())


def start(_signum=None, _frame=None) -> None:
    try:
        _start()
    except Exception as e:  # noqa: BLE001 - diagnostics must never end the operator
        print(f"_traced_operator: could not start tracing: {e!r}", file=sys.stderr, flush=True)


def _start() -> None:
    global _types_at_start, _started
    if tracemalloc.is_tracing():
        return
    _types_at_start = _type_counts()
    _started = time.monotonic()
    tracemalloc.start(FRAMES)
    PROBE.start()


def _short(filename: str) -> str:
    return filename.split("site-packages/")[-1].split("/src/")[-1]


def report(_signum=None, _frame=None) -> None:
    try:
        _report()
    except Exception as e:  # noqa: BLE001 - diagnostics must never end the operator
        OUT.write_text(f"the report failed: {e!r}\n")


def _report() -> None:
    lines: list[str] = []
    if tracemalloc.is_tracing():
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        stats = snap.statistics("traceback")
        total = sum(s.size for s in stats)
        owners: Counter = Counter()
        for s in stats:  # the innermost frame in our code or kopf's, else the innermost frame
            frame = next((f for f in s.traceback if "/hyperplan/" in f.filename or "/kopf/" in f.filename),
                         s.traceback[0])
            owners[f"{_short(frame.filename)}:{frame.lineno}"] += s.size
        lines += [f"traced since SIGUSR2 ({time.monotonic() - _started:.0f} s ago): {total / 2**20:.1f} MiB "
                  f"alive in {len(stats)} tracebacks", "", "top lines:"]
        lines += [f"  {s.size / 2**20:7.2f} MiB  {s.count:8d} blocks  {_short(s.traceback[0].filename)}:"
                  f"{s.traceback[0].lineno}" for s in snap.statistics("lineno")[:25]]
        lines += ["", "top sites, by the innermost hyperplan or kopf frame:"]
        lines += [f"  {size / 2**20:7.2f} MiB  {site}" for site, size in owners.most_common(30)]
    else:
        lines.append("tracemalloc was not started (send SIGUSR2 first)")
    grown = _type_counts()
    grown.subtract(_types_at_start)
    lines += ["", "live gc-tracked objects by type, minus those alive when tracing started:"]
    lines += [f"  {n:+9d}  {t}" for t, n in grown.most_common(30)]
    loop = asyncio.events._get_running_loop()  # noqa: SLF001 - the handler runs on the loop's thread
    tasks = asyncio.all_tasks(loop) if loop is not None else set()
    by_coro = Counter(getattr(t.get_coro(), "__qualname__", "?") for t in tasks)
    lines += ["", f"asyncio tasks: {len(tasks)}"] + [f"  {n:7d}  {c}" for c, n in by_coro.most_common(10)]
    lines += ["", PROBE.summary()]
    OUT.write_text("\n".join(lines) + "\n")


class GilProbe:
    """How long a thread that wakes every 10 ms waits past its wake time: the wait a thread of
    the operator (the lease renewal, say) has for the GIL and a core. Runs from start to report."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.running = False

    def start(self) -> None:
        import threading

        self.running = True
        threading.Thread(target=self._run, name="gil-probe", daemon=True).start()

    def _run(self) -> None:
        while self.running:
            t = time.monotonic()
            time.sleep(0.01)
            self.lags.append(time.monotonic() - t - 0.01)

    def summary(self) -> str:
        lags = sorted(self.lags)
        if not lags:
            return "gil probe: no samples"
        q = lambda f: lags[min(len(lags) - 1, int(f * len(lags)))]  # noqa: E731
        over = sum(1 for x in lags if x > 0.5)
        return (f"gil probe (a thread waking every 10 ms, {len(lags)} wakes): lag p50 {q(0.5) * 1000:.1f} ms, "
                f"p99 {q(0.99) * 1000:.1f} ms, max {lags[-1] * 1000:.0f} ms, {over} wakes over 0.5 s late")


PROBE = GilProbe()
signal.signal(signal.SIGUSR2, start)
signal.signal(signal.SIGUSR1, report)

from hyperplan.cli import main  # noqa: E402

sys.exit(main(["run"]))
