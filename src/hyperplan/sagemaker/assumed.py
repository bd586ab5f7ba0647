"""Offerings the API has sold that the watch cache does not show bought yet (Kueue's "assumed" workloads).

CreateTrainingPlan makes a TrainingPlan that names the offering it was asked for; the operator buys
it in that plan's pass, and only then does the ledger (and every search, which reads the ledger
from the watch cache) show the capacity taken. Until then every other caller's search answers the
same best offering and every other create for it is accepted: many callers racing for one offering
all bought it, one purchase won at the ledger and the others' plans failed, each costing its
buyer a failed remote plan, a search and a create more (docs/benchmarks.md, "Purchases through a
SageMaker endpoint": 263 of 1,000 remote plans failed so, and 291 creates were refused).

So a create that is accepted *assumes* its offering's blocks: the searches and creates that follow
count them as busy in their pools until the watch cache shows the plan's own lines in the ledger
(then the ledger counts them), the plan failed, or :data:`ASSUMED_FOR` has passed (a plan the
cache never shows). A racing caller is thus answered the next offering, as it would be a moment
later anyway. The ledger still decides who holds what (the operator's purchase re-checks it); an
assumption only keeps the API from selling one offering to many callers at once. It is in memory:
a restarted operator assumes nothing, and the ledger's re-check stays the guard.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from hyperplan.planning.blocks import Block
from hyperplan.planning.offerings import Busy, PoolSnapshot

ASSUMED_FOR = 60.0  # seconds an accepted create's blocks count as busy if the cache never shows them bought
# The API's searches and creates look for settled assumptions at most this often: each look reads
# every assumed plan from the watch cache (a hop to the event loop and an unpack each), and at a
# burst's rate that was a tenth of the capacity operator's time (docs/benchmarks.md). Between looks
# a settled purchase is counted twice (in the ledger and assumed): it looks taken, never free.
FORGET_EVERY = 0.25


@dataclass(frozen=True)
class _Assumed:
    at: float
    offering_id: str
    user: str
    blocks: tuple[Block, ...]
    uid: str = ""  # the plan's uid, once the create answered it
    seen: bool = False  # the cache has shown the plan: gone from it again, it was deleted


class AssumedPurchases:
    """The assumed purchases of one SageMaker API (its server holds one). ``lock`` makes a
    create's check of its offering and its assumption one step: two creates racing for one
    offering cannot both find it free."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, hold: float = ASSUMED_FOR,
                 every: float = 0.0) -> None:
        self.clock, self.hold, self.every = clock, hold, every
        self.lock = threading.RLock()
        self._held: dict[str, _Assumed] = {}
        self._looked: float | None = None  # when forget_settled last looked

    def assume(self, name: str, offering_id: str, user: str, blocks: Sequence[Block]) -> None:
        with self.lock:
            self._held[name] = _Assumed(self.clock(), offering_id, user, tuple(blocks))

    def created(self, name: str, uid: str) -> None:
        with self.lock:
            held = self._held.get(name)
            if held is not None:
                self._held[name] = replace(held, uid=uid)

    def drop(self, name: str) -> None:
        with self.lock:
            self._held.pop(name, None)

    def holds(self, name: str, offering_id: str, user: str) -> bool:
        """Whether ``user`` was sold ``offering_id`` under ``name`` a moment ago (a retry)."""
        with self.lock:
            held = self._held.get(name)
            return held is not None and (held.offering_id, held.user) == (offering_id, user)

    def __len__(self) -> int:
        return len(self._held)

    def forget_settled(self, plan: Callable[[str], "Mapping[str, Any] | None"],
                       blocks_of: Callable[[str], Sequence[Block]]) -> None:
        """Forget what the cache now shows (``plan``: a plan of the fleet by name; ``blocks_of``:
        its lines by uid) and what is older than the hold. The cache is read outside the lock:
        from a write's thread each read is a hop to the event loop, which may itself wait for the
        lock in :meth:`apply`. At most every ``every`` seconds (the server's :data:`FORGET_EVERY`)."""
        now = self.clock()
        with self.lock:
            if self.every and self._looked is not None and now - self._looked < self.every:
                return
            self._looked = now
            held = list(self._held.items())
        done, seen = [], []
        for name, h in held:
            obj = plan(name)
            if now - h.at > self.hold or _settled(h, obj, blocks_of):
                done.append(name)
            elif obj is not None and not h.seen:
                seen.append(name)
        with self.lock:
            before = dict(held)
            for name in done:
                if self._held.get(name) is before[name]:
                    del self._held[name]
            for name in seen:
                if self._held.get(name) is before[name]:
                    self._held[name] = replace(before[name], seen=True)

    def apply(self, snapshots: Sequence[PoolSnapshot]) -> list[PoolSnapshot]:
        """``snapshots`` with the assumed blocks counted as busy (pure: no read of the cache)."""
        with self.lock:
            extra: dict[str, list[Busy]] = {}
            for held in self._held.values():
                for b in held.blocks:
                    extra.setdefault(b.pool, []).append(Busy(b.start, b.end, b.instance_count))
        return [with_busy(s, extra[s.name]) if s.name in extra else s for s in snapshots]


def _settled(held: _Assumed, obj: Mapping[str, Any] | None, blocks_of: Callable[[str], Sequence[Block]]) -> bool:
    """Whether the cache shows the assumed plan bought (its lines are in the ledger: counted there)
    or failed (it holds nothing)."""
    if obj is None:
        return held.seen  # not in the cache yet, or deleted since it was
    uid = (obj.get("metadata") or {}).get("uid") or held.uid
    if uid and blocks_of(uid):
        return True
    return ((obj.get("status") or {}).get("phase")) == "Failed"


def with_busy(snapshot: PoolSnapshot, extra: Iterable[Busy]) -> PoolSnapshot:
    """The snapshot with ``extra`` busy too; its step function merged from the one it has (a
    ledger of 1,000 lines is not sorted again for each search)."""
    extra = tuple(extra)
    out = replace(snapshot, busy=snapshot.busy + extra)
    moments, levels = snapshot.usage
    deltas: dict[Any, int] = {}
    for b in extra:
        if b.end > b.start:
            deltas[b.start] = deltas.get(b.start, 0) + b.instance_count
            deltas[b.end] = deltas.get(b.end, 0) - b.instance_count
    merged_moments = sorted(set(moments) | set(deltas))
    base = dict(zip(moments, levels))
    merged_levels, level_before, added = [], 0, 0
    for moment in merged_moments:
        level_before = base.get(moment, level_before)
        added += deltas.get(moment, 0)
        merged_levels.append(level_before + added)
    out.__dict__["usage"] = (tuple(merged_moments), tuple(merged_levels))
    return out
