"""Every list and string of the three CRDs is bounded (maxItems, maxLength), and the bounds of the
lists the operator grows with the fleet sit above what one object can hold, so that the API
server never refuses the operator's own status writes for their length."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Iterator

import pytest

from hyperplan.api import crds, models

# The API server owns these (apiVersion, kind, metadata) and bounds them itself.
SERVER_OWNED = {"apiVersion", "kind", "metadata"}
# Every map is bounded (a vanished node's record keeps a bounded few of its labels:
# planning.memory.vanished_labels).
UNBOUNDED_MAPS: dict[str, set[str]] = {}


def _nodes(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from _nodes(child, f"{path}.{name}")
    if "items" in schema:
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def unbounded(kind: crds.Kind) -> list[str]:
    root = crds.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    found = []
    for name, top in root["properties"].items():
        if name in SERVER_OWNED:
            continue
        for path, node in _nodes(top, f".{name}"):
            if node.get("type") == "array" and "maxItems" not in node:
                found.append(f"{path}: list without maxItems")
            is_text = node.get("type") == "string" or node.get("x-kubernetes-int-or-string")
            if is_text and "enum" not in node and "maxLength" not in node:
                found.append(f"{path}: string without maxLength")
            if (isinstance(node.get("additionalProperties"), dict) and "maxProperties" not in node
                    and path not in UNBOUNDED_MAPS.get(kind.name, set())):
                found.append(f"{path}: map without maxProperties")
    return found


@pytest.mark.parametrize("kind", crds.KINDS, ids=lambda k: k.name)
def test_every_list_and_string_is_bounded(kind: crds.Kind) -> None:
    assert unbounded(kind) == []


def test_the_walk_finds_an_unbounded_field() -> None:
    """The check above would see a missing bound (it is not vacuous)."""
    class Loose(models.Model):
        words: list[str] = []

    class LooseKind(models.Model):
        spec: Loose
        status: Loose = Loose()

    kind = crds.Kind(LooseKind, "looses", (), (), "")
    assert unbounded(kind) == [".spec.words: list without maxItems", ".spec.words[]: string without maxLength",
                               ".status.words: list without maxItems", ".status.words[]: string without maxLength"]


T = datetime(2027, 1, 1, tzinfo=timezone.utc)


def _smallest_entries() -> list[tuple[str, models.Model, int]]:
    """(list, the smallest entry the operator writes to it, the list's maxItems)."""
    return [
        ("CapacityPool status.reservations",
         models.Reservation(training_plan="p", reserved_capacity_id="rc-0", start_time=T, end_time=T,
                            instance_count=1),
         models.CapacityPoolStatus.model_fields["reservations"].metadata[0].max_length),
        ("TrainingPlan status.ultraServers",
         models.UltraServerStatus(id="u", availability_zone="a"),
         models.TrainingPlanStatus.model_fields["ultra_servers"].metadata[0].max_length),
    ]


@pytest.mark.parametrize("field, entry, max_items", _smallest_entries(), ids=lambda v: v if isinstance(v, str) else "")
def test_fleet_lists_are_bounded_above_what_one_object_holds(field: str, entry: models.Model, max_items: int) -> None:
    """At its bound the list would be bigger than etcd stores in one object: the bound never binds first."""
    entry_bytes = len(json.dumps(entry.wire(), separators=(",", ":"))) + 1  # and a comma
    assert max_items * entry_bytes > models.ETCD_MAX_OBJECT_BYTES, (
        f"{field}: {max_items} entries of {entry_bytes} bytes fit in one object")


def test_the_operator_lists_fewer_offerings_than_the_bound() -> None:
    from hyperplan.planning import offerings
    assert offerings.MAX_OFFERINGS <= models.MAX_OFFERINGS


@pytest.mark.parametrize("length", [0, 100, models.MAX_MESSAGE, models.MAX_MESSAGE + 1, 10 * models.MAX_MESSAGE],
                         ids=["empty", "short", "at-bound", "one-over", "ten-times"])
def test_a_condition_message_is_cut_to_the_bound_not_refused(length: int) -> None:
    text = "x" * length
    message = models.Condition(type="Ready", status="True", message=text).message
    assert len(message) <= models.MAX_MESSAGE
    if length <= models.MAX_MESSAGE:
        assert message == text
    else:
        assert message.endswith(" ... (truncated)") and message.startswith("x" * 1000)
