"""The domain's words have one home (api.vocabulary), and the wire's time format one pair of helpers."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from hyperplan.api.vocabulary import from_rfc3339, to_rfc3339

SRC = Path(__file__).resolve().parents[2] / "src" / "hyperplan"
# A label, annotation, taint or condition key of the operator's, HyperPod's or the topology's,
# written out as a string literal.
KEY_LITERAL = re.compile(r"""["'](hyperplan\.dev/|sagemaker\.amazonaws\.com/|topology\.k8s\.aws/|kwok\.x-k8s\.io/)""")
# A key built from the vocabulary's prefixes (an f-string or a concatenation): a key all the same.
# f"{GROUP}/{VERSION}" is an apiVersion, not a key.
KEY_BUILT = re.compile(r"""\{(OWN_PREFIX|ANNOTATION_PREFIX|SAGEMAKER_PREFIX)\}|\{GROUP\}/(?!\{VERSION\})|"""
                       r"""\b(OWN_PREFIX|ANNOTATION_PREFIX|SAGEMAKER_PREFIX)\s*\+""")


def test_every_key_is_declared_only_in_the_vocabulary():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "vocabulary.py" or "devcluster" in path.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if KEY_LITERAL.search(line) or KEY_BUILT.search(line):
                found.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert found == []


@pytest.mark.parametrize("line, caught", [
    pytest.param('KEY = "hyperplan.dev/thing"', True, id="a-literal"),
    pytest.param('KEY = f"{OWN_PREFIX}thing"', True, id="an-f-string-over-the-prefix"),
    pytest.param('KEY = f"{GROUP}/thing"', True, id="an-f-string-over-the-group"),
    pytest.param('KEY = OWN_PREFIX + "thing"', True, id="a-concatenation"),
    pytest.param('KEY = "kwok.x-k8s.io/node"', True, id="kwoks-key"),
    pytest.param('api = f"{GROUP}/{VERSION}"', False, id="an-api-version-is-no-key"),
    pytest.param('q = f"sum(x{{{GROUP}}})"', False, id="a-promql-matcher-is-no-key"),
])
def test_the_guard_sees_keys_however_they_are_written(line: str, caught: bool) -> None:
    assert bool(KEY_LITERAL.search(line) or KEY_BUILT.search(line)) == caught


@pytest.mark.parametrize("moment, micro, text", [
    pytest.param(datetime(2026, 12, 1, 12, 0, 5, 250000, tzinfo=timezone.utc), False, "2026-12-01T12:00:05Z",
                 id="whole-seconds"),
    pytest.param(datetime(2026, 12, 1, 12, 0, 5, 250000, tzinfo=timezone.utc), True, "2026-12-01T12:00:05.250000Z",
                 id="to-the-microsecond"),
    pytest.param(datetime(2026, 12, 1, 13, 0, 5, tzinfo=timezone(timedelta(hours=1))), False, "2026-12-01T12:00:05Z",
                 id="another-zone-written-as-utc"),
])
def test_to_rfc3339(moment, micro, text):
    assert to_rfc3339(moment, micro=micro) == text


@pytest.mark.parametrize("text, expected", [
    pytest.param("2026-12-01T12:00:05Z", datetime(2026, 12, 1, 12, 0, 5, tzinfo=timezone.utc), id="z"),
    pytest.param("2026-12-01T12:00:05.250000Z", datetime(2026, 12, 1, 12, 0, 5, 250000, tzinfo=timezone.utc),
                 id="fraction"),
    pytest.param("2026-12-01T13:00:05+01:00", datetime(2026, 12, 1, 12, 0, 5, tzinfo=timezone.utc), id="offset"),
    pytest.param("2026-12-01T12:00:05", None, id="no-timezone-is-unreadable"),
    pytest.param("yesterday", None, id="not-a-time"),
])
def test_from_rfc3339_is_strict(text, expected):
    if expected is None:
        with pytest.raises(ValueError):
            from_rfc3339(text)
    else:
        assert from_rfc3339(text) == expected
