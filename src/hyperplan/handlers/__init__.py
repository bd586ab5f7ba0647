"""Thin kopf handlers: parse the body, ask planning, apply through actuation, write one status patch.

Importing this package registers every handler with kopf.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from hyperplan.api.vocabulary import ANNOTATION_PREFIX, FINALIZER
from hyperplan.handlers import cache, capacitypool, instancegroup, nodes, observed, trainingplan  # noqa: F401  (registration)
from hyperplan.settings import Settings

if Settings().kueue_enabled:  # off: nothing of Kueue is watched (docs/kueue.md, "Turning it off")
    from hyperplan.handlers import kueue  # noqa: F401  (registration: the Kueue AdmissionCheck controller)


def configure_kopf(settings: kopf.OperatorSettings, hp: Settings) -> None:
    """kopf's behaviour for this operator.

    Progress and the last-handled spec go into annotations, because our status schemas
    are structural (the API server would prune kopf's own ``status.kopf`` fields).
    """
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration")
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = hp.watch_server_timeout
    settings.watching.client_timeout = hp.watch_server_timeout + 30
    settings.execution.max_workers = 8
    settings.batching.error_delays = [1, 2, 5, 10, 20, 30]
    settings.networking.error_backoffs = [1, 2, 5, 10]


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
