"""The C allocator's share of the operator's memory: fewer arenas, and freed memory handed back.

Python objects larger than 512 bytes (every JSON string of a watch event or an API response,
the buffers of a pool's ledger) come from the C library's ``malloc``. glibc gives each thread
that allocates an arena of its own, up to 8 per core, and keeps what is freed in them for
later. The operator runs 64 purchase threads, kopf's and asyncio's thread pools and the lease
renewal thread, so after a burst of purchases its RSS held tens of MiB of memory that Python
had already freed (docs/benchmarks.md 5.4). Two glibc knobs take that back:

- :func:`limit_arenas`: at most two arenas (``M_ARENA_MAX``, what ``MALLOC_ARENA_MAX=2`` sets),
  set at startup before the threads exist. The threads mostly wait on the network, so they
  rarely contend for an arena.
- :func:`trim_after_busy_spells`: ``malloc_trim(0)`` after an interval in which the process
  used CPU (a pass, a burst of events), and once more after the first quiet interval; never
  while the operator is idle, so an idle operator still costs no CPU.

Elsewhere than glibc (musl, macOS) both do nothing, and so they do with
``HYPERPLAN_ALLOCATOR=default`` (for measuring what they save: bench/scale.py).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import time
from functools import lru_cache
from typing import Callable

log = logging.getLogger("hyperplan.allocator")
M_ARENA_MAX = -8  # mallopt parameter (malloc.h)
ARENAS = 2
TRIM_INTERVAL = 30.0  # seconds
BUSY_CPU = 0.5  # CPU seconds in one interval that make it busy


@lru_cache(maxsize=1)
def _glibc() -> ctypes.CDLL | None:
    if os.environ.get("HYPERPLAN_ALLOCATOR") == "default":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only
        libc.mallopt, libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def limit_arenas(arenas: int = ARENAS) -> bool:
    """At most ``arenas`` malloc arenas, unless MALLOC_ARENA_MAX already says. Call it before
    threads start."""
    libc = _glibc()
    if libc is None or os.environ.get("MALLOC_ARENA_MAX"):
        return False
    return bool(libc.mallopt(M_ARENA_MAX, arenas))


def trim() -> bool:
    """Hand the free memory at the top of malloc's heaps and its free pages back to the system."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


async def trim_after_busy_spells(interval: float = TRIM_INTERVAL, busy_cpu: float = BUSY_CPU,
                                 cpu: Callable[[], float] = time.process_time) -> None:
    """Trim after every busy interval and after the first quiet one that follows (runs until
    cancelled). ``cpu``: the process's CPU seconds so far."""
    if _glibc() is None:
        return
    last, was_busy = cpu(), False
    while True:
        await asyncio.sleep(interval)
        now = cpu()
        busy = now - last >= busy_cpu
        if busy or was_busy:
            started = time.monotonic()
            await asyncio.to_thread(trim)
            log.debug("malloc_trim after a %s interval took %.3fs", "busy" if busy else "quiet",
                      time.monotonic() - started)
        last, was_busy = now, busy
