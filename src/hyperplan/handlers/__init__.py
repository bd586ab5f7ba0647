"""Thin kopf handlers: parse the body, ask planning, apply through actuation, write one status patch.

Importing this package registers every handler with kopf.
"""

from __future__ import annotations

from typing import Any

import kopf

from hyperplan.handlers import cache, capacitypool, instancegroup, nodes, observed, trainingplan  # noqa: F401  (registration)
from hyperplan.operator import configure_kopf
from hyperplan.settings import Settings

if Settings().kueue_enabled:  # off: nothing of Kueue is watched (docs/kueue.md, "Turning it off")
    from hyperplan.handlers import kueue  # noqa: F401  (registration: the Kueue AdmissionCheck controller)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    rt = memo.runtime
    configure_kopf(settings, rt.settings)
    logger.info("policy profile %s; watching capacitypools, trainingplans, instancegroups, nodes",
                rt.policy.name)


@kopf.on.cleanup()
async def stop_passes(memo: kopf.Memo, **_: Any) -> None:
    """Stop the work queue of every kind's passes (handlers.workqueue), giving running passes
    their grace."""
    await memo.runtime.queue.stop()
