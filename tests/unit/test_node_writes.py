"""run_together: a pass's node writes fan out to the one pool of node-write threads, bounded per pass."""

from __future__ import annotations

import threading
import time

import pytest

from hyperplan.actuation.groups import node_writes, run_together


def recorder(width_seen: list[int], running: list[int], lock: threading.Lock, value: int, fail: bool = False):
    def call() -> int:
        with lock:
            running[0] += 1
            width_seen.append(running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        if fail:
            raise RuntimeError(f"call {value} failed")
        return value
    return call


@pytest.mark.parametrize("calls, width", [
    pytest.param(1, 8, id="one-call-runs-inline"),
    pytest.param(5, 8, id="fewer-than-the-width"),
    pytest.param(30, 8, id="more-than-the-width"),
    pytest.param(12, 3, id="a-narrow-pass"),
])
def test_results_in_order_and_never_more_than_width_at_once(calls, width):
    seen, running, lock = [], [0], threading.Lock()
    assert run_together([recorder(seen, running, lock, i) for i in range(calls)], width) == list(range(calls))
    assert len(seen) == calls and max(seen) <= width


def test_every_call_runs_when_one_raises_and_the_first_error_is_raised():
    seen, running, lock = [], [0], threading.Lock()
    calls = [recorder(seen, running, lock, i, fail=i in (3, 7)) for i in range(10)]
    with pytest.raises(RuntimeError, match="call 3 failed"):
        run_together(calls, 4)
    assert len(seen) == 10


def test_one_pool_for_the_process():
    assert node_writes() is node_writes()
