"""Run ``hyperplan run`` under tracemalloc; SIGUSR1 writes where the memory is to a file.

Used by the benchmarks when BENCH_OPERATOR_TRACEMALLOC=<file> is set (bench/_common.py): the
report lists the top allocation sites by line and by the first frame inside hyperplan or kopf,
with the total traced size. Tracing costs CPU and memory of its own (frames are kept 6 deep),
so the RSS of a traced run is not a figure to compare; the sites and their shares are.
"""

from __future__ import annotations

import signal
import sys
import tracemalloc
from collections import Counter
from pathlib import Path

OUT = Path(sys.argv[1])
FRAMES = 6


def report(_signum=None, _frame=None) -> None:
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    stats = snap.statistics("traceback")
    total = sum(s.size for s in stats)
    by_line = snap.statistics("lineno")[:25]
    owners: Counter = Counter()
    for s in stats:  # the innermost frame in our code or kopf's, else the innermost frame
        frame = next((f for f in s.traceback if "/hyperplan/" in f.filename or "/kopf/" in f.filename),
                     s.traceback[0])
        owners[f"{frame.filename.split('site-packages/')[-1].split('/src/')[-1]}:{frame.lineno}"] += s.size
    lines = [f"traced total {total / 2**20:.1f} MiB in {len(stats)} tracebacks", "", "top lines:"]
    lines += [f"  {s.size / 2**20:7.2f} MiB  {s.count:8d} blocks  {s.traceback[0].filename.split('site-packages/')[-1]}:"
              f"{s.traceback[0].lineno}" for s in by_line]
    lines += ["", "top sites, by the innermost hyperplan or kopf frame:"]
    lines += [f"  {size / 2**20:7.2f} MiB  {site}" for site, size in owners.most_common(30)]
    OUT.write_text("\n".join(lines) + "\n")


tracemalloc.start(FRAMES)
signal.signal(signal.SIGUSR1, report)

from hyperplan.cli import main  # noqa: E402

sys.exit(main(["run"]))
