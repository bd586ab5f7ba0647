"""Keep the operator's copy of its objects for the object metrics (hyperplan.metrics.OBSERVED).

Each watch event puts the object as the API server sent it (status included); a deletion
drops it, so its series leave ``/metrics`` with it. These handlers only copy: they share
kopf's one watch stream per kind with the reconciling handlers and wake nobody.
"""

from __future__ import annotations

from typing import Any

import kopf

from hyperplan import metrics
from hyperplan.api.models import GROUP, VERSION
from hyperplan.handlers.cache import slim_object

KINDS = {"trainingplans": "plans", "instancegroups": "groups", "capacitypools": "pools"}


def observe(observed: metrics.ObservedObjects, plural: str, name: str, type_: str | None,
            body: dict[str, Any]) -> None:
    """Put or drop one object of ``plural`` in ``observed``."""
    kind = KINDS[plural]
    if type_ == "DELETED":
        observed.drop(kind, name)
        if kind == "groups":
            metrics.forget_group(name)
        return
    getattr(observed, f"put_{kind[:-1]}")(name, body)


@kopf.on.event(GROUP, VERSION, "trainingplans")
async def plan_seen(name: str, type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    observe(metrics.OBSERVED, "trainingplans", name, type, dict(body))
    _caught_up(memo, "trainingplans", name, type, body)


@kopf.on.event(GROUP, VERSION, "instancegroups")
async def group_seen(name: str, type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    observe(metrics.OBSERVED, "instancegroups", name, type, dict(body))
    _caught_up(memo, "instancegroups", name, type, body)


def _caught_up(memo: kopf.Memo, plural: str, name: str, type_: str | None, body: kopf.Body) -> None:
    """The watch cache drops its write-through copy once the watch delivers that version."""
    if type_ == "DELETED":
        memo.runtime.cache.forget(plural, name)
    else:
        memo.runtime.cache.watched(plural, name, body.get("metadata", {}).get("resourceVersion"))


@kopf.on.event(GROUP, VERSION, "capacitypools")
async def pool_seen(name: str, type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The pool's snapshot comes from the watch cache, which parses each ledger line once: a
    pool's ledger grows with every purchase, and parsing all of it on every event would cost
    the square of the purchases."""
    if type == "DELETED":
        observe(metrics.OBSERVED, "capacitypools", name, type, {})
        memo.runtime.cache.forget("capacitypools", name)
        return
    memo.runtime.cache.watched("capacitypools", name, body.get("metadata", {}).get("resourceVersion"))
    metrics.OBSERVED.put_pool_snapshot(name, memo.runtime.cache.pool_snapshots([slim_object(body)])[0])
