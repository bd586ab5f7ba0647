"""Reads of the store that more than one controller makes: what the operator's own records say,
never what a status others can write says. The controllers share these instead of importing each
other.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping

from hyperplan.api.models import TrainingPlan
from hyperplan.planning import admission
from hyperplan.planning.plans import FAILED, PENDING, reserved_capacity
from hyperplan.runtime.context import Runtime
from hyperplan.runtime.store import WORKLOADS, WORKLOADS_INDEX


def as_the_ledger_holds(rt: Runtime, obj: Mapping[str, Any], now: datetime) -> TrainingPlan:
    """The plan (raises ValidationError when unreadable) with its ``status.reservedCapacity`` and
    phase as the capacity ledger holds them, not as its status says: the groups and the Kueue
    controller provision and admit on these blocks, and anyone allowed to write
    ``trainingplans/status`` could write others. A plan with no line in the ledger has no
    blocks; the phase it shows is kept only while it says it is not bought (Pending, Failed)."""
    plan = TrainingPlan.model_validate(obj)
    blocks = rt.cache.blocks_of(obj["metadata"].get("uid") or "")
    if blocks:
        schedule, plan.status.reserved_capacity = reserved_capacity(blocks, plan.spec.target_resource, rt.policy, now)
        plan.status.phase = schedule.phase
    else:
        plan.status.reserved_capacity = []
        if plan.status.phase not in (None, PENDING, FAILED):
            plan.status.phase = PENDING
    return plan


def workloads_assigned_to(rt: Runtime, node_name: str) -> tuple[str, ...]:
    """The running Workloads (``namespace/name``) whose topology assignment names ``node_name``;
    none when Kueue is turned off (``kueue_enabled``: its Workloads are not watched)."""
    if not rt.cache.has_index(WORKLOADS_INDEX):
        return ()
    found = rt.cache.objects(WORKLOADS_INDEX, WORKLOADS, ("node", node_name))
    return tuple(sorted(f"{w['metadata'].get('namespace')}/{w['metadata'].get('name')}" for w in found
                        if node_name in ((w.get("status") or {}).get("assignedNodes") or ())
                        and admission.workload_runs(w)))
