"""Values read back from nodes are read strictly: an unreadable one is absent, and said so once."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from hyperplan.api.vocabulary import Unreadable
from hyperplan.planning import health
from hyperplan.planning import reading
from hyperplan.planning.lending import LentRecord
from hyperplan.planning.memory import GroupMemory
from hyperplan.planning.naming import Taint
from hyperplan.planning.placement import slot_states_from_labels
from hyperplan.planning.trainingjobs import job_nodes_from_labels

UTC = timezone.utc
NOON = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SIXTY_DIGITS = "1" * 60
GENERATION = "hyperplan.dev/generation"
SLOT = "hyperplan.dev/slot"
EVICTING = "hyperplan.dev/evicting-since"
HEALTH_SINCE = "hyperplan.dev/health-signal-since"
KEEP_ALIVE = "hyperplan.dev/keep-alive-until"
LENT = "hyperplan.dev/lent"
GOOD_LENT = json.dumps({"labels": {"team": "a", "gone": None}, "taintKeys": ["t"],
                        "taints": [{"key": "t", "value": None, "effect": "NoSchedule"}]})


@pytest.mark.parametrize("reader, text, expected", [
    pytest.param(reading.read_time, "2026-12-01T12:00:00Z", NOON, id="time"),
    pytest.param(reading.read_time, "2026-12-01T13:00:00+01:00", NOON, id="time-with-offset"),
    pytest.param(reading.read_generation, "0", 0, id="generation-zero"),
    pytest.param(reading.read_generation, "1000000", 1000000, id="generation-at-the-bound"),
    pytest.param(reading.read_slot, "0-17", "0-17", id="slot-on-an-ultraserver"),
    pytest.param(reading.read_slot, "4", "4", id="slot-plain"),
    pytest.param(reading.read_health_signal_record, "Unschedulable@2026-12-01T12:00:00.000000Z",
                 ("Unschedulable", NOON), id="health-record"),
    pytest.param(reading.read_lent, GOOD_LENT, json.loads(GOOD_LENT), id="lent-record"),
    pytest.param(reading.read_lent, "{}", {}, id="lent-record-empty"),
])
def test_a_valid_value_reads(reader, text, expected):
    assert reader(text) == expected


NOT_A_LENT_RECORD = "is not a lent record ({labels, taintKeys, taints})"


@pytest.mark.parametrize("reader, text, problem", [
    pytest.param(reading.read_time, "2026-12-01T12:00:00", "has no timezone", id="time-naive"),
    pytest.param(reading.read_time, "next tuesday", "is not an RFC 3339 time", id="time-garbage"),
    pytest.param(reading.read_generation, "1000001", "is out of range (0 to 1000000)", id="generation-past-the-bound"),
    pytest.param(reading.read_generation, SIXTY_DIGITS, "is out of range (0 to 1000000)", id="generation-60-digits"),
    pytest.param(reading.read_generation, "-1", "is out of range (0 to 1000000)", id="generation-negative"),
    pytest.param(reading.read_generation, "\u0663", "is not a decimal number", id="generation-arabic-indic-digit"),
    pytest.param(reading.read_generation, "1_0", "is not a decimal number", id="generation-underscore"),
    pytest.param(reading.read_generation, " 3", "is not a decimal number", id="generation-space"),
    pytest.param(reading.read_generation, "", "is not a decimal number", id="generation-empty"),
    pytest.param(reading.read_slot, "1" * 60, "is not a slot ('<n>' or '<ultraServerIndex>-<n>')", id="slot-60-digits"),
    pytest.param(reading.read_slot, "a-b", "is not a slot ('<n>' or '<ultraServerIndex>-<n>')", id="slot-garbage"),
    pytest.param(reading.read_health_signal_record, "Unschedulable@2026-12-01T12:00:00",
                 "has a time that has no timezone", id="health-record-naive"),
    pytest.param(reading.read_health_signal_record, "Unschedulable",
                 "is not '<health label value>@<RFC 3339 time>'", id="health-record-without-time"),
    pytest.param(reading.read_health_signal_record, "@2026-12-01T12:00:00Z",
                 "is not '<health label value>@<RFC 3339 time>'", id="health-record-without-value"),
    pytest.param(reading.read_lent, "{labels:", "is not JSON", id="lent-bad-json"),
    pytest.param(reading.read_lent, "[" * 100000, "is not JSON", id="lent-nested-past-the-recursion-limit"),
    pytest.param(reading.read_lent, "[]", NOT_A_LENT_RECORD, id="lent-a-list"),
    pytest.param(reading.read_lent, '{"labels": {"a": 1}}', NOT_A_LENT_RECORD, id="lent-label-value-a-number"),
    pytest.param(reading.read_lent, '{"labels": ["a"]}', NOT_A_LENT_RECORD, id="lent-labels-a-list"),
    pytest.param(reading.read_lent, '{"taintKeys": "t"}', NOT_A_LENT_RECORD, id="lent-taint-keys-a-string"),
    pytest.param(reading.read_lent, '{"taints": [{"key": "t"}]}', NOT_A_LENT_RECORD, id="lent-taint-without-effect"),
])
def test_an_unreadable_value_names_its_problem(reader, text, problem):
    with pytest.raises(Unreadable) as caught:
        reader(text)
    assert caught.value.problem == problem


@pytest.mark.parametrize("labels, generation, slot", [
    pytest.param({GENERATION: "3", SLOT: "0-1"}, 3, "0-1", id="valid"),
    pytest.param({}, 0, None, id="absent"),
    pytest.param({GENERATION: SIXTY_DIGITS, SLOT: "9" * 60}, 0, None, id="unreadable-as-absent"),
    pytest.param({GENERATION: "-2", SLOT: "0-1"}, 0, "0-1", id="negative-as-absent"),
])
def test_the_lenient_readers_take_an_unreadable_label_as_absent(labels, generation, slot):
    assert (reading.generation_of(labels), reading.slot_of(labels)) == (generation, slot)


def test_a_slot_whose_generation_is_unreadable_is_at_generation_zero():
    """Not 10**60: the name of its next node would be no DNS label, and every pass would fail."""
    states = slot_states_from_labels([{SLOT: "0-1", GENERATION: SIXTY_DIGITS}, {SLOT: "0-2", GENERATION: "2"}])
    assert {slot: s.generation for slot, s in states.items()} == {"0-1": 0, "0-2": 2}


@pytest.mark.parametrize("text, expected", [
    pytest.param("Unschedulable@2026-12-01T12:00:00.000000Z", ("Unschedulable", NOON), id="valid"),
    pytest.param("Unschedulable@2026-12-01T12:00:00", None, id="naive"),
    pytest.param("garbage", None, id="garbage"),
    pytest.param(None, None, id="absent"),
])
def test_a_health_signal_record_that_does_not_read_is_absent(text, expected):
    assert health.parse_health_signal_record(text) == expected


@pytest.mark.parametrize("text, expected", [
    pytest.param(GOOD_LENT, LentRecord({"team": "a", "gone": None}, ("t",), (Taint("t", "", "NoSchedule"),)),
                 id="valid"),
    pytest.param("{labels:", LentRecord(), id="bad-json"),
    pytest.param('{"labels": {"a": 1}}', LentRecord(), id="wrong-shape"),
    pytest.param(None, LentRecord(), id="absent"),
])
def test_a_lent_record_that_does_not_read_is_empty(text, expected):
    assert LentRecord.load(text) == expected


@pytest.mark.parametrize("until, expected", [
    pytest.param("2026-12-01T12:00:00Z", NOON, id="valid"),
    pytest.param("2026-12-01T12:00:00", None, id="naive"),
    pytest.param("soon", None, id="garbage"),
])
def test_a_keep_alive_time_that_does_not_read_is_absent(until, expected):
    [node] = job_nodes_from_labels([("n", {}, {KEEP_ALIVE: until}, False, False)])
    assert node.keep_alive_until == expected


def test_node_findings_name_the_node_the_key_and_the_problem():
    labels = {GENERATION: SIXTY_DIGITS, SLOT: "0-1", "other": "1" * 60}
    annotations = {EVICTING: "2026-12-01T12:00:00", HEALTH_SINCE: "Unschedulable@2026-12-01T12:00:00.000000Z",
                   KEEP_ALIVE: "later", LENT: "{"}
    assert [f.message for f in reading.node_findings("hp-x-1", labels, annotations)] == [
        f"node hp-x-1: label hyperplan.dev/generation: '{SIXTY_DIGITS}' is out of range (0 to 1000000); ignored",
        "node hp-x-1: annotation hyperplan.dev/evicting-since: '2026-12-01T12:00:00' has no timezone; ignored",
        "node hp-x-1: annotation hyperplan.dev/keep-alive-until: 'later' is not an RFC 3339 time; ignored",
        "node hp-x-1: annotation hyperplan.dev/lent: '{' is not JSON; ignored",
    ]


def test_a_long_value_is_cut_in_the_message():
    [finding] = reading.node_findings("n", {}, {LENT: "x" * 5000})
    assert len(finding.message) < 200 and "xxx...'" in finding.message


def test_each_unreadable_value_is_reported_once_until_it_changes():
    memory = GroupMemory()
    naive = reading.Finding("node", "n1", "annotation", EVICTING, "2026-12-01T12:00:00", "has no timezone")
    huge = reading.Finding("node", "n2", "label", GENERATION, SIXTY_DIGITS, "is out of range (0 to 1000000)")
    assert memory.note_unreadable("g", [naive, huge]) == [naive, huge]
    assert memory.note_unreadable("g", [naive, huge]) == []  # the next pass: nothing new
    other = reading.Finding("node", "n1", "annotation", EVICTING, "2026-12-01T13:00:00", "has no timezone")
    assert memory.note_unreadable("g", [other, huge]) == [other]  # another value of the same key
    assert memory.note_unreadable("g", []) == []  # repaired: forgotten
    assert memory.note_unreadable("g", [huge]) == [huge]  # and new again if it comes back
    assert memory.note_unreadable("other-group", [huge]) == [huge]
