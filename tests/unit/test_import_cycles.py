"""No module of the operator imports, through any chain, a module that imports it back.

Every import counts: at the top of a module, inside a function (a "lazy" import that only hides a
cycle until the function runs) and under ``if TYPE_CHECKING:``. ``from a.b import c`` is an
import of the module ``a.b.c`` when that is a module, else of ``a.b``. A package's ``__init__``
that Python runs before one of its modules is not counted as imported by that module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "hyperplan"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p): p for p in sorted(root.rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that the file imports, anywhere in it."""
    own = module_name(path)
    package = own.split(".") if path.name == "__init__.py" else own.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in known and name != own)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    found = modules(root)
    return {name: imports_of(path, set(found)) for name, path in found.items()}


def test_the_operator_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


@pytest.mark.parametrize("files, expected", [
    pytest.param({"a.py": "import p.b\n", "b.py": "x = 1\n"}, [], id="one-way"),
    pytest.param({"a.py": "from p import b\n", "b.py": "from p.a import x\n"}, [["p.a", "p.b"]], id="top-level-cycle"),
    pytest.param({"a.py": "def f():\n    from p.b import y\n", "b.py": "from p.a import f\n"}, [["p.a", "p.b"]],
                 id="lazy-import-counts"),
    pytest.param({"a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.b import Y\n",
                  "b.py": "from p.a import x\n"}, [["p.a", "p.b"]], id="type-checking-import-counts"),
    pytest.param({"a.py": "from . import b\n", "b.py": "from .a import x\n"}, [["p.a", "p.b"]], id="relative-imports"),
    pytest.param({"a.py": "from p.c.d import x\n", "c/__init__.py": "", "c/d.py": "from p import a\n"},
                 [["p.a", "p.c.d"]], id="through-a-subpackage"),
])
def test_the_walk_finds_every_kind_of_cycle(tmp_path: Path, files: dict[str, str], expected) -> None:
    global SRC
    root = tmp_path / "p"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    saved, SRC = SRC, tmp_path
    try:
        assert cycles(import_graph(root)) == expected
    finally:
        SRC = saved


# Which floor may import which: (importer's package, a package it must not import, why).
FLOORS = [
    ("hyperplan.planning", "hyperplan.actuation", "planning is pure: it decides, actuation acts"),
    ("hyperplan.planning", "hyperplan.runtime", "planning is pure: its inputs are passed in"),
    ("hyperplan.planning", "hyperplan.controllers", "planning is pure"),
    ("hyperplan.actuation", "hyperplan.runtime", "actuation is called by the controllers, not the other way"),
    ("hyperplan.actuation", "hyperplan.controllers", "actuation is called by the controllers"),
    ("hyperplan.runtime", "hyperplan.controllers", "the runtime is under every controller"),
    ("hyperplan.runtime", "hyperplan.wiring", "the runtime is under the kopf wiring"),
    ("hyperplan.controllers", "hyperplan.wiring", "the kopf wiring calls the controllers"),
    ("hyperplan.sagemaker", "hyperplan.controllers", "the SageMaker API reads the runtime's store only"),
    ("hyperplan.sagemaker", "hyperplan.wiring", "the SageMaker API never reaches the kopf layer"),
]
CONTROLLERS = ("plan", "group", "kueue")


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_each_floor_imports_only_the_floors_under_it() -> None:
    graph = import_graph()
    found = sorted(f"{importer} imports {imported} ({why})"
                   for importer, imports in graph.items() for imported in imports
                   for low, high, why in FLOORS if _within(importer, low) and _within(imported, high))
    assert found == []


def test_no_controller_imports_another() -> None:
    graph = import_graph()
    found = sorted(f"{importer} imports {imported}" for importer, imports in graph.items() for imported in imports
                   for a in CONTROLLERS for b in CONTROLLERS
                   if a != b and _within(importer, f"hyperplan.controllers.{a}")
                   and _within(imported, f"hyperplan.controllers.{b}"))
    assert found == []
