"""The capacity ledger: reservations written into CapacityPool ``status.reservations``.

A purchase re-reads the pools, re-checks the offering against them (planning's
``recheck_offering``), and writes each pool's ledger with a whole-status replace that
carries the resourceVersion it read. The API server refuses a write on a stale
resourceVersion (409), so two concurrent purchases can never both fit into the same free
capacity: the loser re-reads, re-checks, and either fits elsewhere in time or fails.

Writes are idempotent: a reservation's id is derived from the plan's uid and the block's
index, and a pool that already holds it is left alone. A plan's own reservations are
left out of the snapshots it re-checks against, so a purchase interrupted between two
pools (crash, conflict) completes on the next attempt instead of blocking itself.

With a :class:`PoolReads` (the operator's watch cache) the ledger reads the pools from memory
instead of LISTing them per purchase, and hands each write's result back to it (write-through),
so the next purchase of this process starts from the ledger as it just wrote it. The only API
read left is the GET of a pool after a 409, which optimistic concurrency needs. A refused
re-check returns the snapshots it was made against, so that the caller can search again against
the ledger as it is now (a lost race is not the end of an auto-purchase).

Purchases of one process are group-committed: those that arrive while a batch is being written
wait and go together into the next one, each re-checked against the ledger plus the purchases
accepted before it, with one status replace per pool for the whole batch.

An extension (:meth:`KubeLedger.extend`) moves the ``endTime`` of the plan's line in place, so the
block keeps its id; it is re-checked and written the same way, in its own turn.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from hyperplan.actuation.kube import Kube, is_conflict
from hyperplan.api.models import API_VERSION, CapacityPool, Reservation
from hyperplan.planning.blocks import Block, with_additions
from hyperplan.api.vocabulary import REASON_OFFERING_UNAVAILABLE, to_rfc3339
from hyperplan.planning.offerings import (
    Busy, Extension, Offering, PoolSnapshot, RuleViolation, free_intervals, recheck_offering,
)
from hyperplan.planning.policy import Policy
from hyperplan.planning.tenancy import pools_for_plan, selector_of

log = logging.getLogger(__name__)

PLURAL = "capacitypools"
MAX_ATTEMPTS = 20


def reserved_capacity_id(plan_uid: str, index: int) -> str:
    return f"rc-{plan_uid.replace('-', '')[:12]}-{index}"


@dataclass(frozen=True)
class PurchaseResult:
    blocks: tuple[Block, ...] = ()  # the plan's blocks in the ledger after the purchase, by start
    violation: RuleViolation | None = None
    # With a violation: the pools the offering was re-checked against (fresh), to search again in.
    pools: tuple[PoolSnapshot, ...] = ()

    @property
    def ok(self) -> bool:
        return self.violation is None


def pool_snapshot(pool: CapacityPool, exclude_plan_uid: str | None = None) -> PoolSnapshot:
    """What planning sees of a pool: its size minus `unavailable` windows and reservations."""
    busy = [Busy(w.start, w.end, w.instance_count) for w in pool.spec.unavailable]
    busy += [Busy(r.start_time, r.end_time, r.instance_count) for r in pool.status.reservations
             if exclude_plan_uid is None or r.training_plan_uid != exclude_plan_uid]
    return PoolSnapshot(
        name=pool.metadata["name"], instance_type=pool.spec.instance_type,
        availability_zone=pool.spec.availability_zone, instance_count=pool.spec.instance_count or 0,
        ultra_server_type=pool.spec.ultra_server_type, busy=tuple(busy),
        plan_selector=selector_of(pool.spec.training_plan_selector.wire() if pool.spec.training_plan_selector else None))


def blocks_of(pools: Sequence[CapacityPool], plan_uid: str) -> list[Block]:
    """The blocks the plan with ``plan_uid`` holds in the pools' ledgers, ordered by start."""
    found = [
        Block.from_reservation(r, p.metadata["name"], p.spec.availability_zone, p.spec.instance_type,
                               p.spec.ultra_server_type)
        for p in pools for r in p.status.reservations if r.training_plan_uid == plan_uid
    ]
    return with_additions(sorted(found, key=lambda b: (b.start, b.id)))


class PoolReads(Protocol):
    """Where the ledger reads pools from when not from the API (the operator's watch cache)."""

    def pool_objects(self) -> list[dict[str, Any]]: ...

    def pool_snapshots(self, pools: list[dict[str, Any]]) -> list[PoolSnapshot]: ...

    def blocks_of(self, plan_uid: str, pools: list[dict[str, Any]]) -> list[Block]: ...

    def wrote(self, kind: str, obj: dict[str, Any]) -> None: ...


@runtime_checkable
class CapacityLedger(Protocol):
    def pools(self) -> list[CapacityPool]: ...

    def purchase(self, plan: str, plan_uid: str, offering: Offering, policy: Policy,
                 now: datetime, plan_labels: Mapping[str, str] | None = None) -> PurchaseResult: ...

    def release(self, plan_uid: str, now: datetime) -> int: ...

    def extend(self, plan: str, plan_uid: str, extension: Extension, policy: Policy,
               now: datetime, plan_labels: Mapping[str, str] | None = None) -> PurchaseResult: ...

    def record_remote(self, pool: str, plan: str, plan_uid: str, lines: Sequence[Reservation]) -> list[Block]: ...

    def add_ultraserver(self, plan: str, plan_uid: str, addition: Block,
                        plan_labels: Mapping[str, str] | None = None) -> PurchaseResult: ...


def addition_refusal(pool: Mapping[str, Any] | None, plan_uid: str, addition: Block,
                     plan_labels: Mapping[str, str] | None) -> tuple[RuleViolation | None, bool]:
    """Whether the pool ``pool`` (as read) lets ``addition`` (an UltraServer for the rest of block
    ``addition.adds_to``, planning.plans.ultraserver_to_buy) be written: (None, True) when its line
    is there already (bought before: nothing to write), (None, False) when the block is the plan's,
    the pool still sells to the plan, and one more UltraServer fits from the addition's start to its
    end among every line of the ledger, the plan's own among them; else why not."""
    where = f"pool {addition.pool!r}"
    if pool is None:
        return RuleViolation(REASON_OFFERING_UNAVAILABLE, f"{where} is gone"), False
    if (pool.get("spec") or {}).get("source"):
        return RuleViolation(REASON_OFFERING_UNAVAILABLE, (
            f"{where} sells through a remote endpoint: an UltraServer for the rest of a block is bought from "
            "a pool's own ledger only")), False
    lines = (pool.get("status") or {}).get("reservations") or []
    if any(r.get("reservedCapacityId") == addition.id and r.get("trainingPlanUid") == plan_uid for r in lines):
        return None, True
    if not any(r.get("reservedCapacityId") == addition.adds_to and r.get("trainingPlanUid") == plan_uid
               for r in lines):
        return RuleViolation(REASON_OFFERING_UNAVAILABLE, (
            f"block {addition.adds_to} is no longer in the ledger of {where}")), False
    snapshot = pool_snapshot(CapacityPool.model_validate(pool))
    if not pools_for_plan([snapshot], plan_labels):
        return RuleViolation(REASON_OFFERING_UNAVAILABLE, f"{where} no longer sells to this plan"), False
    if not any(s <= addition.start and (e is None or e >= addition.end)
               for s, e in free_intervals(snapshot, addition.instance_count, addition.start)):
        return RuleViolation(REASON_OFFERING_UNAVAILABLE, (
            f"{where} has no room for {addition.instance_count} more instances from "
            f"{to_rfc3339(addition.start)} to {to_rfc3339(addition.end)}")), False
    return None, False


def extension_refusal(lines: Sequence[Mapping[str, Any]], plan_uid: str,
                      extension: Extension) -> tuple[RuleViolation | None, bool]:
    """Whether the ledger ``lines`` of the extension's pool let ``extension`` be written: (None,
    True) when the plan's block already runs to the extension's end (bought before: nothing to
    write), (None, False) when the block ends where the extension starts (write it), else why not."""
    line = next((r for r in lines if r.get("reservedCapacityId") == extension.block.id
                 and r.get("trainingPlanUid") == plan_uid), None)
    if line is None:
        return RuleViolation(REASON_OFFERING_UNAVAILABLE, (
            f"extension {extension.id}: block {extension.block.id} is no longer in the ledger of pool "
            f"{extension.block.pool!r}")), False
    end = Reservation.model_validate(line).end_time
    if end >= extension.end:
        return None, True
    if end != extension.start:
        return RuleViolation(REASON_OFFERING_UNAVAILABLE, (
            f"extension {extension.id}: block {extension.block.id} now ends at {to_rfc3339(end)}, not at the "
            f"extension's start {to_rfc3339(extension.start)}")), False
    return None, False


def extended_lines(lines: Sequence[Mapping[str, Any]], plan_uid: str, extension: Extension) -> list[dict[str, Any]]:
    """The ledger ``lines`` with the extended block's line running to the extension's end."""
    out = []
    for r in lines:
        if r.get("reservedCapacityId") == extension.block.id and r.get("trainingPlanUid") == plan_uid:
            line = Reservation.model_validate(r)
            line.end_time = extension.end
            out.append(line.wire())
        else:
            out.append(dict(r))
    return out


class KubeLedger:
    """The ledger kept in CapacityPool status on the API server."""

    def __init__(self, kube: Kube, reads: PoolReads | None = None):
        self.kube = kube
        self.reads = reads
        # Ledger writes from this process take turns, so they never conflict with each other; the
        # resourceVersion check still guards against every other writer (another replica, a user).
        self._turn = threading.Lock()
        self._purchases = _GroupCommit(self._turn, self._commit)
        self._records = _GroupCommit(self._turn, self._commit_records)

    def pools(self) -> list[CapacityPool]:
        return [CapacityPool.model_validate(o) for o in self._pool_objects().values()]

    def _pool_objects(self) -> dict[str, dict[str, Any]]:
        objects = self.reads.pool_objects() if self.reads is not None else self.kube.list_objects(PLURAL)
        return {o["metadata"]["name"]: o for o in objects}

    def _snapshots(self, raw: dict[str, dict[str, Any]], plan_uid: str) -> list[PoolSnapshot]:
        """The pools as a re-check sees them: without this plan's own reservations."""
        if self.reads is None:
            return [pool_snapshot(CapacityPool.model_validate(o), exclude_plan_uid=plan_uid) for o in raw.values()]
        mine = {b.pool for b in self.reads.blocks_of(plan_uid, list(raw.values()))}
        cached = {s.name: s for s in self.reads.pool_snapshots([o for n, o in raw.items() if n not in mine])}
        return [cached[n] if n in cached else pool_snapshot(CapacityPool.model_validate(o), exclude_plan_uid=plan_uid)
                for n, o in raw.items()]

    def purchase(self, plan: str, plan_uid: str, offering: Offering, policy: Policy,
                 now: datetime, plan_labels: Mapping[str, str] | None = None) -> PurchaseResult:
        """Buy ``offering`` for the plan (whose labels are ``plan_labels``), or say why not.

        The re-check sees only the pools whose ``trainingPlanSelector`` lets the plan buy, so an
        offering with a block from any other pool is refused whatever its id says.

        Group commit: purchases that arrive while another batch is being written wait, and are
        then re-checked and written together, one status replace per pool for the whole batch
        (each re-checked against the ledger plus the purchases accepted before it in the batch).
        A thousand purchases at once cost tens of ledger writes, not a thousand."""
        return self._purchases.submit(_Ticket(plan, plan_uid, offering, policy, now, dict(plan_labels or {})))

    def _commit(self, batch: list["_Ticket"]) -> None:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            raw = self._pool_objects()
            added: dict[str, list[dict[str, Any]]] = {}
            also_busy: dict[str, list[Busy]] = {}
            accepted: list[_Ticket] = []
            for t in batch:
                t.result = None
                snapshots = [replace(s, busy=s.busy + tuple(also_busy[s.name])) if s.name in also_busy else s
                             for s in pools_for_plan(self._snapshots(raw, t.plan_uid), t.plan_labels)]
                violation = recheck_offering(t.offering, snapshots, t.policy, t.now)
                if violation:
                    if any(r.get("trainingPlanUid") == t.plan_uid for o in raw.values()
                           for r in (o.get("status") or {}).get("reservations") or []):
                        self._release(t.plan_uid, now=None)  # a purchase interrupted between two pools
                    t.result = PurchaseResult(violation=violation, pools=tuple(snapshots))
                    continue
                for pool_name, wanted in reservations_by_pool(t.plan, t.plan_uid, t.offering).items():
                    have = {r.get("reservedCapacityId") for r in
                            (raw[pool_name].get("status") or {}).get("reservations") or []}
                    new = [r for r in wanted if r.reserved_capacity_id not in have]
                    added.setdefault(pool_name, []).extend(r.wire() for r in new)
                    also_busy.setdefault(pool_name, []).extend(
                        Busy(r.start_time, r.end_time, r.instance_count) for r in new)
                accepted.append(t)
            written: dict[str, dict[str, Any]] = {}
            try:
                for pool_name in sorted(added):
                    written[pool_name] = self._add(raw[pool_name], added[pool_name])
            except Exception as e:  # noqa: BLE001 - only conflicts are retried
                if not is_conflict(e):
                    raise
                log.info("ledger conflict for a batch of %d purchase(s) (attempt %d); re-reading",
                         len(batch), attempt)
                self._reread(sorted(added))
                continue
            after = list({**raw, **written}.values())
            for t in accepted:
                t.result = PurchaseResult(blocks=tuple(self._blocks(t.plan_uid, after)))
            return
        for t in batch:
            self._release(t.plan_uid, now=None)
            t.result = PurchaseResult(violation=RuleViolation(
                "LedgerContention", f"the capacity ledger changed under {MAX_ATTEMPTS} attempts to buy"))

    def _blocks(self, plan_uid: str, pools: list[dict[str, Any]]) -> list[Block]:
        if self.reads is not None:
            return self.reads.blocks_of(plan_uid, pools)
        return blocks_of([CapacityPool.model_validate(o) for o in pools], plan_uid)

    def _reread(self, names: list[str]) -> None:
        """After a 409: GET the pools written, so the next attempt sees what the other writer wrote."""
        if self.reads is None:
            return  # the next attempt LISTs anyway
        for name in names:
            fresh = self.kube.get_object(PLURAL, name)
            if fresh is not None:
                self.reads.wrote(PLURAL, fresh)

    def extend(self, plan: str, plan_uid: str, extension: Extension, policy: Policy,
               now: datetime, plan_labels: Mapping[str, str] | None = None) -> PurchaseResult:
        """Run the plan's block on to the extension's end, in place: the block keeps its id (and the
        groups their nodes); its ledger line's ``endTime`` moves. Re-checked as a purchase is (the
        added window as a block of the same pool, against the ledger without the plan's own lines,
        only the pools that let the plan buy), written with the resourceVersion read, re-read and
        re-checked after a 409. Idempotent: a line that already runs to the end is left alone."""
        with self._turn:
            for attempt in range(1, MAX_ATTEMPTS + 1):
                raw = self._pool_objects()
                obj = raw.get(extension.block.pool)
                lines = ((obj or {}).get("status") or {}).get("reservations") or []
                violation, done = extension_refusal(lines, plan_uid, extension)
                if done:
                    return PurchaseResult(blocks=tuple(self._blocks(plan_uid, list(raw.values()))))
                snapshots = pools_for_plan(self._snapshots(raw, plan_uid), plan_labels)
                violation = violation or recheck_offering(extension.as_offering, snapshots, policy, now)
                if violation is not None:
                    return PurchaseResult(violation=violation, pools=tuple(snapshots))
                assert obj is not None  # extension_refusal found the line in it
                try:
                    written = self._write_lines(obj, extended_lines(lines, plan_uid, extension))
                except Exception as e:  # noqa: BLE001 - only conflicts are retried
                    if not is_conflict(e):
                        raise
                    log.info("ledger conflict extending plan %s (attempt %d); re-reading", plan, attempt)
                    self._reread([extension.block.pool])
                    continue
                after = list({**raw, extension.block.pool: written}.values())
                return PurchaseResult(blocks=tuple(self._blocks(plan_uid, after)))
        return PurchaseResult(violation=RuleViolation(
            "LedgerContention", f"the capacity ledger changed under {MAX_ATTEMPTS} attempts to extend"))

    def add_ultraserver(self, plan: str, plan_uid: str, addition: Block,
                        plan_labels: Mapping[str, str] | None = None) -> PurchaseResult:
        """Append ``addition``'s line to its pool's ledger (:func:`addition_refusal` first), written
        with the resourceVersion read, re-read and re-checked after a 409. Idempotent: its id is one
        per failed UltraServer, and a line already there is left alone."""
        with self._turn:
            for attempt in range(1, MAX_ATTEMPTS + 1):
                raw = self._pool_objects()
                obj = raw.get(addition.pool)
                violation, done = addition_refusal(obj, plan_uid, addition, plan_labels)
                if done:
                    return PurchaseResult(blocks=tuple(self._blocks(plan_uid, list(raw.values()))))
                if violation is not None:
                    return PurchaseResult(violation=violation)
                assert obj is not None
                try:
                    written = self._add(obj, [addition.to_reservation(plan, plan_uid).wire()])
                except Exception as e:  # noqa: BLE001 - only conflicts are retried
                    if not is_conflict(e):
                        raise
                    log.info("ledger conflict adding an UltraServer to plan %s (attempt %d); re-reading", plan, attempt)
                    self._reread([addition.pool])
                    continue
                return PurchaseResult(blocks=tuple(self._blocks(plan_uid, list({**raw, addition.pool: written}.values()))))
        return PurchaseResult(violation=RuleViolation(
            "LedgerContention", f"the capacity ledger changed under {MAX_ATTEMPTS} attempts to add an UltraServer"))

    def record_remote(self, pool: str, plan: str, plan_uid: str, lines: Sequence[Reservation]) -> list[Block]:
        """Make the plan's lines in the remote ``pool`` exactly ``lines`` (what the remote endpoint
        holds for it, :func:`hyperplan.planning.remote.mirror_lines`). Group commit, as purchases:
        records that arrive while another batch is written go together into one status replace
        per pool (over the resourceVersion read, again after a 409); 1,000 plans bought remotely at
        once took turns writing one line each before, a second of ledger writes per 15 plans.
        The plan's blocks in every pool afterwards."""
        return self._records.submit(_Record(pool, plan, plan_uid, [r.wire() for r in lines]))

    def _commit_records(self, batch: list["_Record"]) -> None:
        by_pool: dict[str, list[_Record]] = {}
        for r in batch:
            by_pool.setdefault(r.pool, []).append(r)
        for attempt in range(1, MAX_ATTEMPTS + 1):
            raw = self._pool_objects()
            written: dict[str, dict[str, Any]] = {}
            try:
                for pool in sorted(by_pool):
                    obj = raw.get(pool)
                    if obj is None:
                        for r in by_pool[pool]:
                            r.error = LookupError(f"capacity pool {pool!r} is gone")
                        continue
                    wanted = {r.plan_uid: r.lines for r in by_pool[pool]}  # a later record of a plan wins
                    have = list((obj.get("status") or {}).get("reservations") or [])
                    kept = [line for line in have if line.get("trainingPlanUid") not in wanted]
                    lines = kept + [line for uid in wanted for line in wanted[uid]]
                    if sorted(map(repr, have)) != sorted(map(repr, lines)):
                        written[pool] = self._write_lines(obj, lines)
            except Exception as e:  # noqa: BLE001 - only conflicts are retried
                if not is_conflict(e):
                    raise
                log.info("ledger conflict recording %d remote plan(s) (attempt %d); re-reading", len(batch), attempt)
                self._reread(sorted(by_pool))
                continue
            after = list({**raw, **written}.values())
            for r in batch:
                if r.error is None:
                    r.result = self._blocks(r.plan_uid, after)
            return
        for r in batch:
            r.error = RuntimeError(f"could not record the remote plan of {r.plan} in pool {r.pool}: ledger contention")

    def release(self, plan_uid: str, now: datetime | None) -> int:
        """Remove the plan's reservations that have not ended by ``now`` (all when None)."""
        with self._turn:
            return self._release(plan_uid, now)

    def _release(self, plan_uid: str, now: datetime | None) -> int:
        released = 0
        for _ in range(MAX_ATTEMPTS):
            try:
                released = 0
                for obj in self.kube.list_objects(PLURAL):
                    keep, drop = [], []
                    for r in obj.get("status", {}).get("reservations", []):
                        mine = r.get("trainingPlanUid") == plan_uid
                        ended = now is not None and Reservation.model_validate(r).end_time <= now
                        (drop if mine and not ended else keep).append(r)
                    if drop:
                        obj.setdefault("status", {})["reservations"] = keep
                        self.kube.replace_status(PLURAL, obj)
                        released += len(drop)
                return released
            except Exception as e:  # noqa: BLE001
                if not is_conflict(e):
                    raise
        raise RuntimeError(f"could not release reservations of plan uid {plan_uid}: ledger contention")

    def _add(self, obj: dict[str, Any], new: list[dict[str, Any]]) -> dict[str, Any]:
        """Append ``new`` (reservations on the wire) to the pool's ledger in one status replace;
        the pool as written."""
        if not new:
            return obj
        return self._write_lines(obj, list((obj.get("status") or {}).get("reservations", [])) + new)

    def _write_lines(self, obj: dict[str, Any], lines: list[dict[str, Any]]) -> dict[str, Any]:
        """The pool's ledger replaced by ``lines`` in one status replace carrying the resourceVersion
        read (a 409 when another writer came first); the pool as written."""
        status = dict(obj.get("status") or {})
        status["reservations"] = lines
        body = {"apiVersion": obj.get("apiVersion") or API_VERSION, "kind": "CapacityPool",
                "metadata": {"name": obj["metadata"]["name"], "resourceVersion": obj["metadata"]["resourceVersion"]},
                "spec": obj.get("spec") or {}, "status": status}
        updated = self.kube.replace_status(PLURAL, body)
        if self.reads is not None:
            self.reads.wrote(PLURAL, updated)
        return updated


@dataclass
class _Ticket:
    """One purchase waiting for (or in) a group commit."""

    plan: str
    plan_uid: str
    offering: Offering
    policy: Policy
    now: datetime
    plan_labels: Mapping[str, str] = field(default_factory=dict)
    result: PurchaseResult | None = None
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


@dataclass
class _Record:
    """One remote plan's lines waiting for (or in) a group commit of records."""

    pool: str
    plan: str
    plan_uid: str
    lines: list[dict[str, Any]]
    result: list[Block] | None = None
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None


class _GroupCommit:
    """Callers that arrive while a batch is being written wait, and are then written together by
    one ``commit`` (taking the ledger's turn), which sets each ticket's ``result`` or ``error``."""

    def __init__(self, turn: threading.Lock, commit: Callable[[list[Any]], None]) -> None:
        self.turn, self.commit = turn, commit
        self.cond = threading.Condition()
        self.waiting: list[Any] = []
        self.committing = False

    def submit(self, ticket: Any) -> Any:
        with self.cond:
            self.waiting.append(ticket)
            while not ticket.done:
                if self.committing:
                    self.cond.wait()
                    continue
                batch, self.waiting = self.waiting, []
                self.committing = True
                self.cond.release()
                try:
                    with self.turn:
                        self.commit(batch)
                except BaseException as e:  # noqa: BLE001 - every waiter of the batch sees it
                    for t in batch:
                        if not t.done:
                            t.error = e
                finally:
                    self.cond.acquire()
                    self.committing = False
                    self.cond.notify_all()
        if ticket.error is not None:
            raise ticket.error
        assert ticket.result is not None
        return ticket.result


def reservations_by_pool(plan: str, plan_uid: str, offering: Offering) -> dict[str, list[Reservation]]:
    """The ledger lines of the offering, by pool: each block with its reserved-capacity id."""
    out: dict[str, list[Reservation]] = {}
    for index, block in enumerate(offering.blocks):
        bought = replace(block, id=reserved_capacity_id(plan_uid, index))
        out.setdefault(block.pool, []).append(bought.to_reservation(plan, plan_uid))
    return dict(sorted(out.items()))


_: type[CapacityLedger] = KubeLedger  # satisfies the Protocol (checked by mypy-style assignment)
