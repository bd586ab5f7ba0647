"""Thin kopf handlers: parse the body, ask planning, apply through actuation, write one status patch.

Importing this package registers every handler with kopf.
"""

from __future__ import annotations

from typing import Any

import kopf

from hyperplan.handlers import cache, capacitypool, instancegroup, nodes, observed, trainingplan  # noqa: F401  (registration)
from hyperplan.handlers import kueue  # noqa: F401  (registration: the Kueue AdmissionCheck controller)
from hyperplan.operator import configure_kopf


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    rt = memo.runtime
    configure_kopf(settings, rt.settings)
    logger.info("policy profile %s; watching capacitypools, trainingplans, instancegroups, nodes",
                rt.policy.name)
