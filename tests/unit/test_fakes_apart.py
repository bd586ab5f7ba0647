"""The recording fakes live in hyperplan_testing.fakes (outside the shipped package), and no module of
the operator imports them.

A fake that a production module imports (or defines) is code that ships in the operator's image and
can stand in for a real side effect by mistake; this reads every module of the package as source.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "hyperplan"
FAKES = "hyperplan_testing.fakes"
MODULES = sorted(PACKAGE.rglob("*.py"))
TESTING = PACKAGE.parent / "hyperplan_testing"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, path: Path) -> set[str]:
    """The modules the file imports (``from x import y`` counts as both ``x`` and ``x.y``)."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package, one level up per extra dot
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _fake_classes(tree: ast.Module) -> list[str]:
    return [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and node.name.startswith(("Fake", "Recording"))]


def test_the_fakes_module_exists_and_holds_the_fakes() -> None:
    tree = ast.parse((TESTING / "fakes.py").read_text())
    assert set(_fake_classes(tree)) >= {"FakeLedger", "FakeProvider", "FakeNodePods", "FakeLeaseStore",
                                        "RecordingKueueWrites"}


@pytest.mark.parametrize("path", MODULES, ids=_module_name)
def test_a_production_module_neither_imports_nor_defines_a_fake(path: Path) -> None:
    tree = ast.parse(path.read_text())
    module = _module_name(path)
    imported = {name for name in _imports(tree, path) if name == FAKES or name.startswith(FAKES + ".")}
    assert not imported, f"{module} imports {sorted(imported)}"
    assert not _fake_classes(tree), f"{module} defines {_fake_classes(tree)}; fakes belong in {FAKES}"
