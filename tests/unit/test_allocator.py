"""The C allocator's knobs: trimmed after busy intervals and the first quiet one, never while idle."""

from __future__ import annotations

import asyncio

import pytest

from hyperplan import allocator


def test_trim_runs_on_glibc_and_is_a_no_op_elsewhere() -> None:
    assert allocator.trim() in (True, False)  # glibc: whether memory went back; elsewhere False


@pytest.mark.parametrize("cpu_per_interval, trims", [
    pytest.param([0, 0, 0, 0], 0, id="idle-never-trims"),
    pytest.param([1, 0, 0, 0], 2, id="busy-then-the-first-quiet-one"),
    pytest.param([1, 1, 0, 0], 3, id="every-busy-interval-then-one-quiet"),
    pytest.param([0, 1, 0, 1], 3, id="two-spells"),
])
def test_trims_follow_busy_intervals(monkeypatch, cpu_per_interval: list[float], trims: int) -> None:
    assert allocator._glibc() is not None, "the operator's image and CI run on glibc"  # noqa: SLF001
    done: list[int] = []
    monkeypatch.setattr(allocator, "trim", lambda: done.append(1) or True)
    readings = iter([0.0] + [sum(cpu_per_interval[:i + 1]) for i in range(len(cpu_per_interval))])

    def cpu() -> float:
        value = next(readings, None)
        if value is None:  # every interval read: stop the loop
            raise asyncio.CancelledError
        return value

    async def go() -> None:
        try:
            await allocator.trim_after_busy_spells(interval=0.01, busy_cpu=0.5, cpu=cpu)
        except asyncio.CancelledError:
            pass

    asyncio.run(go())
    assert len(done) == trims
