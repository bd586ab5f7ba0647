"""A block of reserved capacity: the one domain value for "a block" (docs/design-decisions.md).

The same value travels the whole purchase path: the offering search cuts blocks out of pools,
an offering is a tuple of them, the ledger writes each as a line of its pool and reads the
plan's lines back as blocks (now carrying their reserved-capacity ``id``), and the plan's
decision derives its status from them.

The pydantic models of ``api.models`` are the wire format of the CRDs only. Each is converted
to or from a block here, in one place each way:

* ``OfferedBlock`` (a plan's ``status.offerings[].blocks``): :meth:`Block.to_offered` and
  :meth:`Block.from_offered`.
* ``ReservedCapacity`` (a plan's ``status.reservedCapacity``): :meth:`Block.to_reserved`. Instance
  groups, the Kueue controller and the CLI read another object's status, and read it as it is.
* ``Reservation`` (a line of a pool's ``status.reservations``, the ledger):
  :meth:`Block.to_reservation` and :meth:`Block.from_reservation`; an UltraServer bought for the
  rest of a block is a line of its own, folded into its block by :func:`with_additions`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Sequence

from hyperplan.api.models import AddedUltraServer, OfferedBlock, Reservation, ReservedCapacity
from hyperplan.api.vocabulary import ULTRASERVER_INSTANCES


@dataclass(frozen=True, slots=True)
class Block:
    """``instance_count`` instances of ``instance_type`` in one pool (one AZ) from ``start`` to ``end``.

    ``id`` is the reserved-capacity id once the block is bought (the ledger line's
    ``reservedCapacityId``, the status' ``reservedCapacity[].id``); empty in an offering. An
    UltraServer block also names its ``ultra_server_type``; its UltraServer count follows from
    the instance count.
    """

    pool: str
    availability_zone: str
    instance_type: str
    instance_count: int
    start: datetime
    end: datetime
    ultra_server_type: str | None = None
    id: str = ""
    # An UltraServer bought for the rest of another block (its ledger line names it): folded into
    # that block's ``additions`` by :func:`with_additions`, never a block of its own.
    adds_to: str = ""
    in_place_of: str = ""  # the failed UltraServer it was bought for
    additions: tuple[Block, ...] = ()  # the UltraServers added to this block, in the order bought

    @property
    def instances_with_additions(self) -> int:
        """The block's instances with those of its added UltraServers: what its UltraServers hold
        (``planning.placement.ultraservers_for_block``)."""
        return self.instance_count + sum(a.instance_count for a in self.additions)

    @property
    def duration(self) -> timedelta:
        return self.end - self.start

    @property
    def ultra_server_count(self) -> int | None:
        """Whole UltraServers in the block; None for a block of plain instances (or an unknown type)."""
        per_server = ULTRASERVER_INSTANCES.get(self.ultra_server_type or "")
        return None if per_server is None else self.instance_count // per_server

    # ------------------------------------------------------------------ plan status: offerings

    def to_offered(self) -> OfferedBlock:
        return OfferedBlock(
            availability_zone=self.availability_zone, instance_type=self.instance_type,
            instance_count=self.instance_count, start_time=self.start, end_time=self.end,
            capacity_pool=self.pool, ultra_server_type=self.ultra_server_type,
            ultra_server_count=self.ultra_server_count)

    @classmethod
    def from_offered(cls, offered: OfferedBlock) -> Block:
        return cls(pool=offered.capacity_pool or "", availability_zone=offered.availability_zone,
                   instance_type=offered.instance_type, instance_count=offered.instance_count,
                   start=offered.start_time, end=offered.end_time,
                   ultra_server_type=offered.ultra_server_type)

    # ------------------------------------------------------------------ plan status: reserved capacity

    def to_reserved(self, termination_time: datetime, status: str) -> ReservedCapacity:
        """The bought block as the plan's status shows it, with its state at the decision's ``now``."""
        return ReservedCapacity(
            id=self.id, availability_zone=self.availability_zone, instance_type=self.instance_type,
            instance_count=self.instance_count, start_time=self.start, end_time=self.end,
            termination_time=termination_time, status=status, capacity_pool=self.pool,
            ultra_server_type=self.ultra_server_type, ultra_server_count=self.ultra_server_count,
            added_ultra_servers=[AddedUltraServer(id=a.id, start_time=a.start, instance_count=a.instance_count,
                                                  in_place_of=a.in_place_of or None) for a in self.additions]
            or None)

    # ------------------------------------------------------------------ pool status: the ledger

    def to_reservation(self, plan: str, plan_uid: str) -> Reservation:
        """The block as a line of its pool's ledger, sold to the plan ``plan`` (uid ``plan_uid``)."""
        if not self.id:
            raise ValueError("a block needs its reserved-capacity id before it goes into the ledger")
        return Reservation(training_plan=plan, training_plan_uid=plan_uid, reserved_capacity_id=self.id,
                           start_time=self.start, end_time=self.end, instance_count=self.instance_count,
                           adds_to=self.adds_to or None, in_place_of=self.in_place_of or None)

    @classmethod
    def from_reservation(cls, line: Reservation, pool: str, availability_zone: str, instance_type: str,
                         ultra_server_type: str | None) -> Block:
        """A line of the ledger of ``pool`` (whose spec gives the AZ and the types) as a block."""
        return cls(pool=pool, availability_zone=availability_zone, instance_type=instance_type,
                   instance_count=line.instance_count, start=line.start_time, end=line.end_time,
                   ultra_server_type=ultra_server_type, id=line.reserved_capacity_id,
                   adds_to=line.adds_to or "", in_place_of=line.in_place_of or "")


def with_additions(blocks: Sequence[Block]) -> list[Block]:
    """The plan's blocks (ledger lines read back) with each added UltraServer folded into the block
    it adds to (:attr:`Block.additions`, by start), in the order given. An addition whose block is
    not among them (or is itself an addition) is dropped: it is no block of its own."""
    added: dict[str, list[Block]] = {}
    for b in blocks:
        if b.adds_to:
            added.setdefault(b.adds_to, []).append(b)
    return [replace(b, additions=tuple(sorted(added.get(b.id, ()), key=lambda a: (a.start, a.id))))
            if b.id in added else b for b in blocks if not b.adds_to]
