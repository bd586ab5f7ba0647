"""CapacityPool handlers: a change to a pool (spec or ledger) may change what plans can buy."""

from __future__ import annotations

from typing import Any

import kopf

from hyperplan.api.models import GROUP, VERSION


@kopf.on.event(GROUP, VERSION, "capacitypools")
async def pool_changed(memo: kopf.Memo, type: str | None, **_: Any) -> None:
    """Plans not bought yet search again; bought plans do not depend on the pools and sleep on."""
    if type is not None:  # None is the initial listing; daemons reconcile on start anyway
        memo.runtime.wake_unbought_plans()
