"""Values the operator reads back from objects others can write, read strictly.

A node's labels and annotations are written by the operator, but a kubelet, an admin or any
client with ``nodes/patch`` may write them too. A value that does not read cleanly (a time
without a timezone, a generation of sixty digits, a negative number, digits that are not
ASCII decimals, JSON of the wrong shape) is **unreadable**: the readers here raise
:class:`~hyperplan.api.vocabulary.Unreadable` with the reason, the lenient wrappers return
what an absent value gives, and :func:`node_findings` lists every unreadable value of a node
as a :class:`Finding`, so the group's handler can post one Warning Event per value while the
pass goes on as if it were not there. One bad node thus never stops a group's drains or
another node's remediation.

Pure: stdlib and the vocabulary only (memory, nodefacts, placement and health import it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hyperplan.api.vocabulary import (
    ANNOTATION_EVICTING_SINCE,
    ANNOTATION_HEALTH_SINCE,
    ANNOTATION_KEEP_ALIVE_UNTIL,
    ANNOTATION_LENT,
    LABEL_GENERATION,
    LABEL_SLOT,
    Unreadable,
    from_rfc3339,
)

GENERATION_MAX = 10**6
"""A slot is replaced once per failure: a million replacements is far past any real group, and
keeps ``-g<generation>`` short enough for a node name."""
_DECIMAL = re.compile(r"-?[0-9]+")
_SLOT = re.compile(r"[0-9]{1,6}(-[0-9]{1,6})?")
SHOWN_MAX = 80  # characters of a value an Event quotes


# --------------------------------------------------------------------------- the readers


def read_time(text: str) -> datetime:
    """An RFC 3339 time with its timezone (:func:`~hyperplan.api.vocabulary.from_rfc3339`)."""
    return from_rfc3339(text)


def read_generation(text: str) -> int:
    """A ``hyperplan.dev/generation`` value: ASCII decimal digits, 0 to :data:`GENERATION_MAX`."""
    if not _DECIMAL.fullmatch(text):
        raise Unreadable(text, "is not a decimal number")
    value = int(text)
    if not 0 <= value <= GENERATION_MAX:
        raise Unreadable(text, f"is out of range (0 to {GENERATION_MAX})")
    return value


def read_slot(text: str) -> str:
    """A ``hyperplan.dev/slot`` value: ``<n>`` or ``<ultraServerIndex>-<n>`` (what node names take)."""
    if not _SLOT.fullmatch(text):
        raise Unreadable(text, "is not a slot ('<n>' or '<ultraServerIndex>-<n>')")
    return text


def read_health_signal_record(text: str) -> tuple[str, datetime]:
    """A ``hyperplan.dev/health-signal-since`` value: ``<health label value>@<RFC 3339>``."""
    value, at, when = text.rpartition("@")
    if not at or not value:
        raise Unreadable(text, "is not '<health label value>@<RFC 3339 time>'")
    try:
        return value, read_time(when)
    except Unreadable as e:
        raise Unreadable(text, f"has a time that {e.problem}") from None


def read_lent(text: str) -> dict[str, Any]:
    """A ``hyperplan.dev/lent`` record: a JSON object whose ``labels`` map keys to a string or
    null, ``taintKeys`` list strings and ``taints`` list ``{key, value, effect}`` objects."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise Unreadable(_shown(text), "is not JSON") from None
    if not isinstance(data, dict):
        raise Unreadable(_shown(text), "is not a lent record ({labels, taintKeys, taints})")
    labels, keys, taints = data.get("labels", {}), data.get("taintKeys", []), data.get("taints", [])
    well_formed = (isinstance(labels, dict) and all(v is None or isinstance(v, str) for v in labels.values())
                   and isinstance(keys, list) and all(isinstance(k, str) for k in keys)
                   and isinstance(taints, list) and all(_is_taint(t) for t in taints))
    if not well_formed:
        raise Unreadable(_shown(text), "is not a lent record ({labels, taintKeys, taints})")
    return data


# --------------------------------------------------------------------------- absent when unreadable


def generation_of(labels: Mapping[str, str]) -> int:
    """The node's generation; 0 (as without the label) when it is unreadable."""
    try:
        return read_generation(labels.get(LABEL_GENERATION, "0"))
    except Unreadable:
        return 0


def slot_of(labels: Mapping[str, str]) -> str | None:
    """The node's slot; None (as without the label) when it is unreadable."""
    text = labels.get(LABEL_SLOT)
    try:
        return None if text is None else read_slot(text)
    except Unreadable:
        return None


def time_or_none(text: str | None) -> datetime | None:
    """An annotation's time; None when it is missing or unreadable."""
    try:
        return read_time(text) if text else None
    except Unreadable:
        return None


# --------------------------------------------------------------------------- findings


@dataclass(frozen=True)
class Finding:
    """One unreadable value of an object, ignored by the pass (a Warning Event says so once)."""

    kind: str  # "node"
    name: str
    place: str  # "label" or "annotation"
    key: str
    value: str
    problem: str

    @property
    def message(self) -> str:
        """``node hp-x: annotation hyperplan.dev/evicting-since: '2026-...' has no timezone; ignored``."""
        return f"{self.kind} {self.name}: {self.place} {self.key}: {_shown(self.value)!r} {self.problem}; ignored"


NODE_LABEL_READERS = {LABEL_GENERATION: read_generation, LABEL_SLOT: read_slot}
NODE_ANNOTATION_READERS = {
    ANNOTATION_HEALTH_SINCE: read_health_signal_record,
    ANNOTATION_EVICTING_SINCE: read_time,
    ANNOTATION_KEEP_ALIVE_UNTIL: read_time,
    ANNOTATION_LENT: read_lent,
}
"""Every key of a node the operator reads back as more than a word, with its strict reader."""


def node_findings(name: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> list[Finding]:
    """The unreadable values among node ``name``'s labels and annotations."""
    out = []
    for place, values, readers in (("label", labels, NODE_LABEL_READERS),
                                   ("annotation", annotations, NODE_ANNOTATION_READERS)):
        for key, reader in readers.items():
            text = values.get(key)
            if text is None:
                continue
            try:
                reader(text)
            except Unreadable as e:
                out.append(Finding("node", name, place, key, text, e.problem))
    return out


def _is_taint(taint: Any) -> bool:
    return (isinstance(taint, dict) and isinstance(taint.get("key"), str) and isinstance(taint.get("effect"), str)
            and (taint.get("value") is None or isinstance(taint.get("value"), str)))


def _shown(text: str) -> str:
    return text if len(text) <= SHOWN_MAX else text[:SHOWN_MAX] + "..."
