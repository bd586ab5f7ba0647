"""requirements.lock pins every runtime dependency of pyproject, in versions pyproject accepts,
and is in sync with the venv the tests run in (the image ships what the tests tested)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from hyperplan_dev import lock

ROOT = Path(__file__).resolve().parents[2]
PINS = lock.parse((ROOT / "requirements.lock").read_text())
DEPENDENCIES = [Requirement(r) for r in
                tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]


@pytest.mark.parametrize("req", DEPENDENCIES, ids=lambda r: r.name)
def test_every_runtime_dependency_is_pinned_in_a_version_pyproject_accepts(req: Requirement) -> None:
    name = lock.canonical(req.name)
    assert name in PINS, f"{req.name} is a dependency in pyproject.toml but not in requirements.lock; run `make lock`"
    assert req.specifier.contains(PINS[name], prereleases=True), (
        f"requirements.lock pins {name}=={PINS[name]}, which pyproject's {req} rejects; run `make lock`")


def test_every_line_is_an_exact_pin() -> None:
    lines = [l for l in (ROOT / "requirements.lock").read_text().splitlines()
             if l.strip() and not l.startswith("#")]
    bad = [l for l in lines if not re.fullmatch(r"[a-z0-9-]+==[A-Za-z0-9.+!-]+", l)]
    assert not bad, f"not of the form name==version: {bad}"


def test_the_lock_is_the_runtime_closure_of_the_venv() -> None:
    closure = lock.runtime_closure()
    missing = sorted(set(closure) - set(PINS))
    extra = sorted(set(PINS) - set(closure))
    differ = sorted(f"{n}: lock {PINS[n]}, venv {closure[n]}" for n in set(PINS) & set(closure)
                    if PINS[n] != closure[n])
    assert not (missing or extra or differ), (
        f"requirements.lock is out of sync with the venv (run `make lock`): missing {missing}, "
        f"not needed {extra}, other versions {differ}")


@pytest.mark.parametrize("text,expected", [
    ("# comment\nkopf==1.45.2\n", {"kopf": "1.45.2"}),
    ("Pydantic_Core==2.0  # trailing\n\n", {"pydantic-core": "2.0"}),
], ids=["comment-skipped", "name-canonicalised"])
def test_parse(text: str, expected: dict[str, str]) -> None:
    assert lock.parse(text) == expected
