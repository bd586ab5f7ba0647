"""requirements.lock pins every runtime dependency of pyproject, in versions pyproject accepts,
with the hashes of the wheels the image may install, and is in sync with the venv the tests run
in (the image ships what the tests tested)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from hyperplan_dev import lock

ROOT = Path(__file__).resolve().parents[2]
LOCK = (ROOT / "requirements.lock").read_text()
PINS = lock.parse(LOCK)
DEPENDENCIES = [Requirement(r) for r in
                tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]


@pytest.mark.parametrize("req", DEPENDENCIES, ids=lambda r: r.name)
def test_every_runtime_dependency_is_pinned_in_a_version_pyproject_accepts(req: Requirement) -> None:
    name = lock.canonical(req.name)
    assert name in PINS, f"{req.name} is a dependency in pyproject.toml but not in requirements.lock; run `make lock`"
    assert req.specifier.contains(PINS[name], prereleases=True), (
        f"requirements.lock pins {name}=={PINS[name]}, which pyproject's {req} rejects; run `make lock`")


def test_every_requirement_is_an_exact_pin_with_sha256_hashes() -> None:
    requirements = [r.strip() for r in re.sub(r"\\\n", " ", LOCK).splitlines()
                    if r.strip() and not r.startswith("#")]
    pin_with_hashes = r"[a-z0-9-]+==[A-Za-z0-9.+!-]+( +--hash=sha256:[0-9a-f]{64})+"
    bad = [r for r in requirements if not re.fullmatch(pin_with_hashes, r)]
    assert not bad, f"not of the form name==version --hash=sha256:... (run `make lock`): {bad}"
    assert len(requirements) == len(PINS)


def test_the_parsed_lock_has_a_hash_for_every_pin() -> None:
    entries = lock.entries(LOCK)
    assert set(entries) == set(PINS)
    assert {name for name, (_, hashes) in entries.items() if not hashes} == set()


def test_the_venv_constraints_are_the_pins_without_hashes(tmp_path: Path) -> None:
    """`make venv` constrains pip with the lock less its hashes (with them, pip would demand a hash
    for the editable project too): same pins, no hash, no continuation."""
    out = tmp_path / "constraints.txt"
    subprocess.run(["make", "-s", "-B", f"CONSTRAINTS={out}", str(out)], cwd=ROOT, check=True,
                   capture_output=True)
    text = out.read_text()
    assert lock.parse(text) == PINS
    assert "--hash" not in text and "\\" not in text


def test_the_image_installs_the_lock_in_hash_checking_mode_and_wheels_only() -> None:
    """The Dockerfile's pip must refuse a file whose hash is not in the lock, and build no sdist."""
    installs = [line for line in (ROOT / "Dockerfile").read_text().splitlines()
                if "pip install" in line and "requirements.lock" in line]
    assert installs, "the Dockerfile no longer installs requirements.lock"
    for line in installs:
        assert "--require-hashes" in line and "--only-binary=:all:" in line, line
        assert "-c requirements.lock" not in line, line


def test_the_base_image_is_a_build_argument() -> None:
    """`--build-arg BASE_IMAGE=python:3.11-slim@sha256:...` pins both stages to a digest."""
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    assert "ARG BASE_IMAGE=python:3.11-slim" in lines
    froms = [line for line in lines if line.startswith("FROM ")]
    assert froms and all(line.split()[1] == "${BASE_IMAGE}" for line in froms), froms


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
    (f"kopf==1.45.2 \\\n    --hash=sha256:{'a' * 64} \\\n    --hash=sha256:{'b' * 64}\nidna==3.20\n",
     {"kopf": "1.45.2", "idna": "3.20"}),
], ids=["comment-skipped", "name-canonicalised", "hash-continuations"])
def test_parse(text: str, expected: dict[str, str]) -> None:
    assert lock.parse(text) == expected


def test_render_then_entries_round_trip() -> None:
    pins = {"kopf": "1.45.2", "idna": "3.20"}
    hashes = {"kopf": ["a" * 64, "b" * 64], "idna": ["c" * 64]}
    assert lock.entries(lock.render(pins, hashes)) == {n: (pins[n], hashes[n]) for n in pins}


@pytest.mark.parametrize("filename, expected", [
    ("pydantic_core-2.50.5-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", True),
    ("pydantic_core-2.50.5-cp311-abi3-manylinux_2_34_x86_64.whl", True),
    ("pydantic_core-2.50.5-cp38-abi3-manylinux_2_28_x86_64.whl", True),
    ("pydantic_core-2.50.5-cp311-cp311-manylinux1_x86_64.whl", True),
    ("pydantic_core-2.50.5-py3-none-any.whl", True),
    ("pydantic-2.50.5-py3-none-any.whl", False),
    ("pydantic_core-2.50.4-py3-none-any.whl", False),
    ("pydantic_core-2.50.5.tar.gz", False),
    ("pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.whl", False),
    ("pydantic_core-2.50.5-cp311-cp311-musllinux_1_1_x86_64.whl", False),
    ("pydantic_core-2.50.5-cp311-cp311-manylinux_2_17_aarch64.whl", False),
    ("pydantic_core-2.50.5-cp311-cp311-macosx_11_0_arm64.whl", False),
    ("pydantic_core-2.50.5-cp311-cp311-win_amd64.whl", False),
    ("pydantic_core-2.50.5-pp311-pypy311_pp73-manylinux_2_17_x86_64.whl", False),
], ids=["cp311-manylinux2014", "abi3-manylinux_2_34", "abi3-older-python", "manylinux1", "pure-python",
        "other-project", "other-version", "sdist", "cp312", "musllinux", "aarch64", "macos", "windows", "pypy"])
def test_which_files_of_a_pin_the_image_may_install(filename: str, expected: bool) -> None:
    """The wheels CPython 3.11 on Linux x86_64 accepts, of the pinned project and version only."""
    assert lock.installable_in_image(filename, "pydantic-core", "2.50.5") is expected


def test_a_pin_without_any_wheel_for_the_image_is_refused() -> None:
    files = [lock.IndexFile("kopf-1.45.2.tar.gz", "a" * 64),
             lock.IndexFile("kopf-1.45.2-cp312-cp312-win_amd64.whl", "b" * 64)]
    with pytest.raises(ValueError, match="no wheel for CPython 3.11 on Linux x86_64"):
        lock.pin_hashes("kopf", "1.45.2", files)
    files.append(lock.IndexFile("kopf-1.45.2-py3-none-any.whl", "c" * 64))
    assert lock.pin_hashes("kopf", "1.45.2", files) == ["c" * 64]
