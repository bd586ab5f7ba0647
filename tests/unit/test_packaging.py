"""The wheel the operator's image installs holds the operator and nothing else; the checkout still
has its dev tools.

The wheel is built the way the Dockerfile builds it: from the files its builder stage copies
(``pyproject.toml``, ``README.md``, ``src/``) as the Docker build context gives them (less what
``.dockerignore`` leaves out), with ``pip wheel --no-deps``. Build isolation is off so that the
build needs no network; the venv's setuptools does it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What the Dockerfile's builder stage copies before `pip wheel ... .` (COPY pyproject.toml README.md ./,
# COPY src ./src); test_the_dockerfile_builds_the_wheel_from_these_files keeps the two in step.
WHEEL_INPUTS = ("pyproject.toml", "README.md", "src")


def _ignore_pattern(pattern: str) -> re.Pattern[str]:
    """A ``.dockerignore`` line as a regex on a context-relative path (Go's filepath.Match, where
    ``*`` stays within one path element, plus Docker's ``**`` for any number of them)."""
    out = ""
    for part in re.split(r"(\*\*/?|\*|\?)", pattern.strip("/")):
        if part.startswith("**"):
            out += "(?:.*/)?" if part.endswith("/") else ".*"
        elif part == "*":
            out += "[^/]*"
        elif part == "?":
            out += "[^/]"
        else:
            out += re.escape(part)
    return re.compile(out + "(?:/.*)?")  # a matched directory takes its contents with it


def _docker_ignored() -> list[re.Pattern[str]]:
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    assert not any(line.startswith("!") for line in lines), "exceptions (!) are not read by this test"
    return [_ignore_pattern(line) for line in lines if line and not line.startswith("#")]


def _build_context(into: Path) -> None:
    ignored = _docker_ignored()
    for top in WHEEL_INPUTS:
        paths = [ROOT / top] if (ROOT / top).is_file() else sorted((ROOT / top).rglob("*"))
        for path in paths:
            relative = path.relative_to(ROOT).as_posix()
            if path.is_file() and not any(p.fullmatch(relative) for p in ignored):
                (into / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, into / relative)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    context = tmp_path_factory.mktemp("context")
    out = tmp_path_factory.mktemp("wheels")
    _build_context(context)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--wheel-dir", str(out), str(context)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert built.returncode == 0, built.stdout + built.stderr
    (found,) = out.glob("hyperplan-*.whl")
    return found


@pytest.mark.parametrize("pattern, path, ignored", [
    ("src/hyperplan_dev", "src/hyperplan_dev/plane.py", True),
    ("src/hyperplan_dev", "src/hyperplan/cli.py", False),
    ("**/__pycache__", "src/hyperplan/__pycache__/cli.cpython-311.pyc", True),
    ("**/*.egg-info", "src/hyperplan.egg-info/SOURCES.txt", True),
    ("*.egg-info", "src/hyperplan.egg-info/SOURCES.txt", False),
    ("tests", "tests/unit/test_packaging.py", True),
    ("tests", "src/hyperplan/tests.py", False),
], ids=["dev-tools", "operator-kept", "pycache-anywhere", "egg-info-anywhere", "star-stays-in-one-folder",
        "folder-at-top", "same-name-deeper"])
def test_dockerignore_lines_are_read_the_way_docker_reads_them(pattern: str, path: str, ignored: bool) -> None:
    assert bool(_ignore_pattern(pattern).fullmatch(path)) is ignored


def test_the_dockerfile_builds_the_wheel_from_these_files() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY pyproject.toml README.md ./\n" in dockerfile
    assert "COPY src ./src\n" in dockerfile
    assert re.search(r"pip wheel --no-deps --wheel-dir /wheels \. ", dockerfile)
    # The final stage takes the venv the wheel went into, nothing from the build context.
    final = dockerfile.rsplit("\nFROM ", 1)[1]
    assert re.findall(r"^COPY .*$", final, re.M) == ["COPY --from=builder /opt/hyperplan /opt/hyperplan"]


def test_the_wheel_holds_the_operator_and_not_the_dev_tools(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"hyperplan", "hyperplan-0.1.0.dist-info"}, sorted(tops)
    assert {"hyperplan/cli.py", "hyperplan/operator.py", "hyperplan/actuation/providers/kwok.py"} <= set(names)
    dev = [n for n in names if "devcluster" in n or "demo" in n or n.startswith("hyperplan_dev")]
    assert not dev, dev
    # The recording fakes and the chaos invariants are test support (src/hyperplan_testing).
    testing = [n for n in names if n.startswith("hyperplan_testing") or "fakes" in n or "invariants" in n]
    assert not testing, testing


def test_hyperplan_dev_from_the_wheel_says_where_the_dev_tools_are(wheel: Path, tmp_path: Path) -> None:
    """The wheel's CLI, run without the venv's site-packages (so without the checkout's src/), as
    in the image: ``hyperplan dev up`` explains itself instead of a traceback."""
    zipfile.ZipFile(wheel).extractall(tmp_path)
    run = subprocess.run(
        [sys.executable, "-I", "-S", "-c",
         "import sys; sys.path.insert(0, sys.argv[1]); from hyperplan.cli import main; sys.exit(main(['dev', 'up']))",
         str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stderr == ("error: hyperplan dev needs the checkout's dev tools: "
                          "pip install -e . from the repository\n")


@pytest.mark.parametrize("data", [
    "kwok-stages.yaml", "kindimages/podnet.yaml", "kindimages/kind-node.Dockerfile", "runc_wrapper.py",
])
def test_the_checkout_imports_the_dev_tools_with_their_data(data: str) -> None:
    """The editable install puts src/ on sys.path, so `hyperplan dev`, `make demo` and the tests
    find hyperplan_dev and the files it reads through importlib.resources."""
    import hyperplan_dev

    assert Path(hyperplan_dev.__file__).resolve().parent == ROOT / "src" / "hyperplan_dev"
    assert resources.files("hyperplan_dev").joinpath(data).read_text().strip()
