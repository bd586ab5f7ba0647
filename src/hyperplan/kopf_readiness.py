"""kopf's start with indexes, made linear in the number of objects.

The cause. kopf runs no resource handler before every indexed kind is listed and every listed
object is indexed: its watcher makes a toggle per object it has not seen yet in one
``ToggleSet(all)`` (``operator_indexed``), the object's worker drops that toggle once its index
handlers ran, and then waits on the set (``operator_indexed.wait_for(True)``) for the rest. Every
``make_toggle`` and ``drop_toggle`` of kopf's ``ToggleSet`` calls ``notify_all`` on the set's one
condition, whether or not the set's state changed. So while N objects are listed, the k-th
object's toggle wakes the k-1 workers already waiting, each of which takes the condition's lock
in turn, finds the set still off and waits again: about N**2 task wake-ups on the event loop
before the first handler runs (kopf 1.45.2). At 10,000 TrainingPlans that is 10**8 wake-ups, more
than 6 minutes of the event loop; at 2,500 it was 30 to 46 s (docs/benchmarks.md, "An operator
started with its fleet listed").

The fix. A waiter on a toggle set waits for the set's state (``is_on()``: ``all`` or ``any`` of
its toggles) to be one value or the other, and adding or dropping a toggle wakes nobody whose
wait could end unless that state changed. :func:`install` makes kopf's ``ToggleSet`` notify only
then; a toggle turned on or off by itself (``Toggle.turn_to``) still notifies as before. What
kopf waits for and when it proceeds are unchanged: only the wake-ups that ended in waiting again
are gone. Installed by :func:`hyperplan.operator.run_operator` before kopf starts.

It patches kopf's private class (kopf is pinned, requirements.lock): :func:`install` checks that
the class still has the shape it was written against and leaves kopf alone (with a warning)
when it does not; tests/unit/test_kopf_readiness.py fails on a kopf whose shape changed.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Iterable

log = logging.getLogger("hyperplan.kopf")
_MARK = "_hyperplan_quiet_notify"


async def _make_toggle(self: Any, __val: bool = False, *, name: str | None = None) -> Any:
    from kopf._cogs.aiokits.aiotoggles import Toggle

    toggle = Toggle(__val, name=name, condition=self._condition)
    async with self._condition:
        before = self.is_on()
        self._toggles.add(toggle)
        if self.is_on() != before:
            self._condition.notify_all()
    return toggle


async def _drop_toggle(self: Any, toggle: Any) -> None:
    async with self._condition:
        before = self.is_on()
        self._toggles.discard(toggle)
        if self.is_on() != before:
            self._condition.notify_all()


async def _drop_toggles(self: Any, toggles: Iterable[Any]) -> None:
    async with self._condition:
        before = self.is_on()
        self._toggles.difference_update(toggles)
        if self.is_on() != before:
            self._condition.notify_all()


def _shape_ok(toggle_set: type, toggle: type) -> bool:
    """kopf's ToggleSet and Toggle as this module was written against (kopf 1.45): a set of
    toggles under one condition, the toggles made with that condition."""
    try:
        import asyncio

        probe = toggle_set(all)
        params = inspect.signature(toggle).parameters
        return (isinstance(getattr(probe, "_condition", None), asyncio.Condition)
                and isinstance(getattr(probe, "_toggles", None), set)
                and "condition" in params and "name" in params
                and all(inspect.iscoroutinefunction(getattr(toggle_set, m, None))
                        for m in ("make_toggle", "drop_toggle", "drop_toggles", "wait_for")))
    except Exception:  # noqa: BLE001 - any surprise: not the shape we know
        return False


def install() -> bool:
    """Make kopf's ToggleSet notify its waiters only when its state changes (see the module
    docstring). Idempotent; False (kopf untouched) when kopf's class is not the one we know."""
    try:
        from kopf._cogs.aiokits import aiotoggles
    except ImportError:
        log.warning("kopf's aiotoggles not found: its start stays quadratic in the objects listed")
        return False
    cls = aiotoggles.ToggleSet
    if getattr(cls, _MARK, False):
        return True
    if not _shape_ok(cls, aiotoggles.Toggle):
        log.warning("kopf's ToggleSet is not the one hyperplan.kopf_readiness knows: left as it is "
                    "(its start may be quadratic in the objects listed)")
        return False
    cls.make_toggle = _make_toggle
    cls.drop_toggle = _drop_toggle
    cls.drop_toggles = _drop_toggles
    setattr(cls, _MARK, True)
    return True
