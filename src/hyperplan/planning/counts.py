"""What a plan's nodes count as: in use, unhealthy, available spares and instances, and each
UltraServer's health, from the nodes as observed (one formula each; the plan's status and the
metrics read them from here).

Pure: plain values in, plain values out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hyperplan.planning.naming import (
    ROLE_ACTIVE,
    ROLE_SPARE,
    STATUS_IMPAIRED,
    STATUS_INSUFFICIENT_DATA,
    STATUS_OK,
)
from hyperplan.planning.placement import UltraServer


@dataclass(frozen=True)
class ObservedNode:
    """A node as the plan's counters see it.

    ``healthy`` is ``None`` when health is unknown (insufficient data).
    ``pending_replacement`` is set for nodes labelled ``UnschedulablePendingReplacement``.
    """

    name: str
    group: str
    role: str
    ultraserver_id: str | None
    healthy: bool | None
    ready: bool
    pending_replacement: bool = False


@dataclass(frozen=True)
class Counts:
    total: int
    in_use: int
    available: int
    available_spares: int
    unhealthy: int
    configured_spares: int = 0

    def as_status(self) -> dict[str, int]:
        """The TrainingPlan status fields (camelCase)."""
        return {
            "totalInstanceCount": self.total,
            "inUseInstanceCount": self.in_use,
            "availableInstanceCount": self.available,
            "availableSpareInstanceCount": self.available_spares,
            "unhealthyInstanceCount": self.unhealthy,
        }


def plan_counts(total: int, configured_spares: int, nodes: Sequence[ObservedNode]) -> Counts:
    """Counts of a block, as SageMaker reports them.

    * ``in_use``: active nodes that are not unhealthy (unknown health counts as in use);
    * ``unhealthy``: nodes judged unhealthy, active or spare;
    * ``available_spares``: spare nodes that are Ready and healthy;
    * ``available``: ``total - in_use - unhealthy - configured spares``, at least 0. An
      unhealthy spare is counted once: it is taken off the configured spares it stands in
      for, not subtracted twice.
    """
    unhealthy = sum(1 for n in nodes if n.healthy is False)
    unhealthy_spares = sum(1 for n in nodes if n.healthy is False and n.role == ROLE_SPARE)
    in_use = sum(1 for n in nodes if n.role == ROLE_ACTIVE and n.healthy is not False)
    available_spares = sum(1 for n in nodes
                           if n.role == ROLE_SPARE and n.healthy is True and n.ready)
    available = available_instances(total, in_use, unhealthy, configured_spares, unhealthy_spares)
    return Counts(total, in_use, available, available_spares, unhealthy, configured_spares)


def available_instances(total: int, in_use: int, unhealthy: int, configured_spares: int,
                        unhealthy_spares: int) -> int:
    """What is left of a block for a new group: the one formula of ``availableInstanceCount``.

    ``total - in_use - unhealthy - configured spares``, at least 0, where an unhealthy spare is
    counted once: it is taken off the configured spares it stands in for, not subtracted twice.
    """
    return max(total - in_use - unhealthy - max(configured_spares - unhealthy_spares, 0), 0)


@dataclass(frozen=True)
class UltraServerReport:
    id: str
    availability_zone: str
    total: int
    configured_spares: int
    available: int
    in_use: int
    available_spares: int
    unhealthy: int
    health_status: str

    def as_status(self) -> dict[str, object]:
        """An entry of ``TrainingPlan.status.ultraServers`` (camelCase)."""
        return {
            "id": self.id,
            "availabilityZone": self.availability_zone,
            "totalInstanceCount": self.total,
            "configuredSpareInstanceCount": self.configured_spares,
            "availableInstanceCount": self.available,
            "inUseInstanceCount": self.in_use,
            "availableSpareInstanceCount": self.available_spares,
            "unhealthyInstanceCount": self.unhealthy,
            "healthStatus": self.health_status,
        }


def ultraserver_reports(
    ultraservers: Sequence[UltraServer], availability_zone: str, nodes: Sequence[ObservedNode]
) -> list[UltraServerReport]:
    """Per-UltraServer counts and health, in index order.

    ``health_status`` is ``impaired`` if any of its nodes is unhealthy or pending
    replacement, else ``insufficient-data`` if any node's health is unknown, else ``ok``
    (also for an UltraServer no group uses: nothing on it is known to be wrong).
    """
    reports = []
    by_ultraserver: dict[str | None, list[ObservedNode]] = {}
    for n in nodes:  # one pass over the nodes, not one per UltraServer: linear in the block's size
        by_ultraserver.setdefault(n.ultraserver_id, []).append(n)
    for u in sorted(ultraservers, key=lambda u: u.index):
        mine = by_ultraserver.get(u.id, [])
        c = plan_counts(u.instance_count, u.spare_count, mine)
        if any(n.healthy is False or n.pending_replacement for n in mine):
            status = STATUS_IMPAIRED
        elif any(n.healthy is None for n in mine):
            status = STATUS_INSUFFICIENT_DATA
        else:
            status = STATUS_OK
        reports.append(UltraServerReport(u.id, availability_zone, u.instance_count,
                                         u.spare_count, c.available, c.in_use,
                                         c.available_spares, c.unhealthy, status))
    return reports

