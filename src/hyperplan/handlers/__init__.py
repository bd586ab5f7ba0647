"""Thin kopf handlers: parse the body, ask planning, apply through actuation, write one status patch.

Importing this package registers every handler with kopf: ``events`` (startup, cleanup and one
event handler per kind), ``cache`` (the kopf indexes of the read side), ``instancegroup`` (a
group's spec change and its deletion) and, when Kueue is on, ``kueue``.
"""

from __future__ import annotations

from hyperplan.handlers import cache, events, instancegroup  # noqa: F401  (registration)
from hyperplan.settings import Settings

if Settings().kueue_enabled:  # off: nothing of Kueue is watched (docs/kueue.md, "Turning it off")
    from hyperplan.handlers import kueue  # noqa: F401  (registration: the Kueue AdmissionCheck controller)
