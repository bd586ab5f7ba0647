"""Node events: a change to a group's node wakes that group and its plan (no polling)."""

from __future__ import annotations

from typing import Any

import kopf

from hyperplan.planning.placement import LABEL_GROUP, LABEL_PLAN


@kopf.on.event("", "v1", "nodes", labels={LABEL_GROUP: kopf.PRESENT})
async def group_node_changed(labels: kopf.Labels, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    if type is None:  # the initial listing: daemons reconcile on start anyway
        return
    memo.runtime.wakeups.wake("group", labels[LABEL_GROUP])
    if labels.get(LABEL_PLAN):
        memo.runtime.wakeups.wake("plan", labels[LABEL_PLAN])


@kopf.on.event("hyperplan.dev", "v1alpha1", "trainingplans")
async def plan_changed(body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A plan's blocks or phase changed: its groups look again (they compute block times themselves)."""
    if type is not None:
        memo.runtime.wakeups.wake_kind("group")
