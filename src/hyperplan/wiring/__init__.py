"""Every kopf registration of the operator, in one place: the controllers and the runtime register
nothing themselves.

Importing this package registers: :mod:`.events` (startup and cleanup, the read side's indexes,
one event handler per kind, a group's spec change and its deletion), :mod:`.nodes` (the node
watch's wakes) and, when Kueue is on, :mod:`.kueue` (the Kueue AdmissionCheck controller).
"""

from __future__ import annotations

from hyperplan.settings import Settings
from hyperplan.wiring import events  # noqa: F401  (registration)

if Settings().kueue_enabled:  # off: nothing of Kueue is watched (docs/kueue.md, "Turning it off")
    from hyperplan.wiring import kueue  # noqa: F401  (registration: the Kueue AdmissionCheck controller)
