"""The AdmissionCheck controller: one small pass per check, the only writer of its ``Active``.

A check that hyperplan serves (``spec.controllerName: hyperplan.dev/training-plan``) is a key of
the work queue (kind :data:`~hyperplan.controllers.kueue.state.CHECK_KIND`, by check name). Its
pass reads the check as its last watch event (or our last write) showed it and the plan its
parameters name, both from the operator's watch cache, and applies ``Active`` when it differs from
what the check says: ``True`` while the plan exists, else ``False`` with the reason
(``PlanNotFound``, ``InvalidParameters``). Anything that changes either wakes the key: an event of
the check or of its plan (:mod:`hyperplan.wiring.kueue`). An unreadable plan fails the pass (it
is retried with backoff) and leaves the condition as it is, as the admission pass leaves the
workloads.

The condition is a server-side apply of that one condition on the ``status`` subresource with
the field manager ``hyperplan-admission`` (:class:`hyperplan.actuation.kueue.KueueWrites`), made
on the controller's threads; what it returned is kept by the watch cache's write-through, on
the event loop, until the watch brings it.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Mapping

from hyperplan.api.vocabulary import to_rfc3339
from hyperplan.runtime.context import Runtime
from hyperplan.controllers.kueue.admission import admission_plan, plan_object
from hyperplan.controllers.kueue.state import CHECK_KIND, CHECKS, check_object, state_of
from hyperplan.planning import admission

log = logging.getLogger("hyperplan.kueue")


def active_condition(check: Mapping[str, Any], active: admission.CheckActive, now: datetime) -> dict[str, Any] | None:
    """The ``Active`` condition to apply, or None when the check already says it."""
    prior = next((c for c in (check.get("status") or {}).get("conditions") or [] if c.get("type") == "Active"), None)
    if prior and (prior.get("status"), prior.get("reason"), prior.get("message")) == \
            (active.status, active.reason, active.message):
        return None
    since = prior["lastTransitionTime"] if prior and prior.get("status") == active.status else to_rfc3339(now)
    return {"type": "Active", "status": active.status, "reason": active.reason, "message": active.message,
            "lastTransitionTime": since, "observedGeneration": check["metadata"].get("generation", 1)}


async def reconcile_check(rt: Runtime, name: str) -> datetime | None:
    """One pass over an AdmissionCheck: write its ``Active`` condition if it changed. Never due
    by time: only a change of the check or its plan changes the condition."""
    state = state_of(rt)
    check = check_object(rt, name)
    if check is None or name not in state.checks:  # gone, or not ours (any more)
        return None
    now = rt.clock()
    plan = state.checks[name]
    view = admission_plan(rt, plan_object(rt, plan), now)[0] if plan is not None else None
    active = admission.check_active((check.get("spec") or {}).get("parameters"), view)
    condition = active_condition(check, active, now)
    if condition is None:
        return None
    returned = await state.call(state.writes.apply_check_active, check, condition)
    if returned and name in state.checks:  # not dropped while the write was on its way
        rt.cache.wrote(CHECKS, returned)
    log.info("admission check %s: Active=%s (%s) %s", name, active.status, active.reason, active.message)
    return None


def register(rt: Runtime) -> None:
    rt.queue.register(CHECK_KIND, lambda name: reconcile_check(rt, name), label="KueueAdmissionCheck")
