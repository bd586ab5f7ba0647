"""The reference pages generated from the code: settings, metrics and the CRD fields.

``python -m hyperplan_dev.docgen`` writes each table into its page between the markers
``<!-- BEGIN GENERATED ... -->`` and ``<!-- END GENERATED ... -->`` (the prose around them is
written by hand and kept); ``--check`` writes nothing and exits 1 when a page differs from what
the code says (``make docs`` / ``make docs-check``; ``tests/unit/test_docs.py`` runs the check).

- docs/reference/settings.md: every field of ``hyperplan.settings.Settings``: its environment
  variable(s), default and meaning (the field's description or the docstring under it).
- docs/reference/metrics.md: every ``hyperplan_*`` family the operator serves
  (``hyperplan.metrics.declared_families``): type, labels and help text.
- docs/reference/crds.md: every field of the three kinds, from the CRD schemas that
  ``hyperplan crds`` writes (``hyperplan.api.crds``), with type, constraints and description
  (the schema's; where it has none, the string under the field in ``hyperplan.api.models`` or
  the comment at the end of its line).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"

# Settings whose field has neither a description nor a docstring: what the code does with them.
SETTING_MEANINGS = {
    "ultraserver_id_label": "Node label key that carries a node's UltraServer id (read on lent nodes, "
                            "written on the nodes hyperplan makes or lends).",
    "network_layer_labels": "The three node label keys of the network layers 1 to 3 written on "
                            "UltraServer nodes (JSON list in the environment).",
    "pod_name": "Name of the operator's own pod (the chart sets it from the downward API); its pod is "
                "never evicted and its node never lent.",
    "node_name": "Node the operator's pod runs on (the chart sets it from the downward API); never lent "
                 "or drained.",
    "verbose": "Debug logging, kopf's own lines included.",
    "leader_election": "Elect one acting replica on a Lease; the others stand by and write nothing.",
    "leader_election_lease_name": "Name of the Lease the replicas elect a leader on.",
}


# --------------------------------------------------------------------------- helpers

def _cell(text: Any) -> str:
    """One Markdown table cell: one line, pipes escaped, reST's double backquotes made Markdown's."""
    return " ".join(str(text).split()).replace("``", "`").replace("|", "\\|")


def _attribute_docstrings(cls: type) -> dict[str, str]:
    """The string literal written right under each annotated attribute of ``cls``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out: dict[str, str] = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            out[node.target.id] = inspect.cleandoc(after.value.value)
    return out


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- settings

def _env_names(name: str, field: Any) -> list[str]:
    alias = field.validation_alias
    choices = getattr(alias, "choices", None)
    if choices:
        return [str(c) for c in choices]
    if isinstance(alias, str):
        return [alias]
    return [f"HYPERPLAN_{name.upper()}"]


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple)):
        return "`" + json.dumps(value) + "`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`" if value != "" else "empty"


def settings_table() -> str:
    from hyperplan.settings import Settings

    docs = _attribute_docstrings(Settings)
    rows = []
    for name, field in Settings.model_fields.items():
        meaning = field.description or docs.get(name) or SETTING_MEANINGS.get(name)
        if not meaning:
            raise SystemExit(f"setting {name} has no description, docstring or entry in SETTING_MEANINGS")
        rows.append((" or ".join(f"`{e}`" for e in _env_names(name, field)), _default(field), meaning))
    return _table(("variable", "default", "meaning"), rows)


# --------------------------------------------------------------------------- metrics

def metrics_table() -> str:
    from prometheus_client import REGISTRY

    from hyperplan import metrics

    helps: dict[str, str] = {}
    for collector in list(REGISTRY._collector_to_names):  # noqa: SLF001 - no public listing
        describe = getattr(collector, "describe", None)
        for family in (describe() if describe else []):
            helps[family.name] = family.documentation
    for name, (help_, _) in metrics.OBJECT_FAMILIES.items():
        helps[name] = help_
    rows = []
    for name, (kind, labels) in sorted(metrics.declared_families().items()):
        shown = f"{name}_total" if kind == "counter" and not name.endswith("_total") else name
        rows.append((f"`{shown}`", kind, ", ".join(f"`{label}`" for label in sorted(labels)) or "—",
                     helps.get(name, "")))
    return _table(("metric", "type", "labels", "meaning"), rows)


# --------------------------------------------------------------------------- CRDs

_CONSTRAINTS = ("enum", "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems",
                "pattern", "format", "default")


def _type(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if kind == "array":
        return f"[]{_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema and "properties" not in schema:
        return f"map[string]{_type(schema['additionalProperties'])}"
    if schema.get("x-kubernetes-int-or-string"):
        return "int-or-string"
    return kind or "any"


def _constraints(schema: dict[str, Any]) -> str:
    parts = []
    for key in _CONSTRAINTS:
        if key in schema:
            value = schema[key]
            if key == "enum":
                parts.append("one of " + ", ".join(f"`{v}`" for v in value))
            else:
                parts.append(f"{key} `{json.dumps(value) if not isinstance(value, str) else value}`")
    rules = schema.get("x-kubernetes-validations") or []
    for rule in rules:
        if rule.get("message"):
            parts.append("rule: " + rule["message"])
    return "; ".join(parts)


def _field_notes(cls: type) -> dict[str, str]:
    """What the source says of each field of ``cls`` where pydantic has no description: the string
    under the field, else the comment at the end of its line (or of its last line)."""
    import io
    import tokenize

    notes = _attribute_docstrings(cls)
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return notes
    tree = ast.parse(source)
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    for node in tree.body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id not in notes:
            for line in (node.lineno, node.end_lineno):
                text = comments.get(line or 0, "")
                if text and not text.startswith(("noqa", "type:")):
                    notes[node.target.id] = text
                    break
    return notes


def _models_in(annotation: Any) -> list[type]:
    """The pydantic model classes an annotation holds (through Optional, lists and dicts)."""
    from typing import get_args

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _notes_by_alias(cls: type | None) -> dict[str, tuple[str, type | None]]:
    """Each wire name of ``cls``'s fields: the source's note, and the model class it holds."""
    if cls is None:
        return {}
    notes = {}
    for klass in reversed(cls.__mro__):
        if hasattr(klass, "model_fields") and klass.__module__.startswith("hyperplan"):
            notes.update(_field_notes(klass))
    out = {}
    for name, field in cls.model_fields.items():  # type: ignore[attr-defined]
        inner = _models_in(field.annotation)
        out[field.alias or name] = (notes.get(name, ""), inner[0] if inner else None)
    return out


def _walk(schema: dict[str, Any], path: str, required: bool, rows: list[tuple[str, ...]],
          model: type | None = None, note: str = "") -> None:
    if path:
        rows.append((f"`{path}`", _type(schema), "yes" if required else "",
                     schema.get("description", "") or note, _constraints(schema)))
    target = schema
    suffix = ""
    while target.get("type") == "array":
        target = target.get("items", {})
        suffix += "[]"
    if target.get("type") == "object" and "additionalProperties" in target and "properties" not in target:
        target, suffix = target["additionalProperties"], suffix + "{}"
    needed = set(target.get("required", []))
    fields = _notes_by_alias(model)
    for name, sub in (target.get("properties") or {}).items():
        if not path and name in ("apiVersion", "kind", "metadata"):
            continue
        sub_note, sub_model = fields.get(name, ("", None))
        _walk(sub, f"{path}{suffix}.{name}" if path else name, name in needed, rows, sub_model, sub_note)


def crd_tables() -> str:
    from hyperplan.api import crds

    out = []
    for kind in crds.KINDS:
        body = crds.crd(kind)
        version = body["spec"]["versions"][0]
        schema = version["schema"]["openAPIV3Schema"]
        rows: list[tuple[str, ...]] = []
        _walk(schema, "", True, rows, kind.model)
        names = body["spec"]["names"]
        out.append(f"## {kind.name}\n\n`{body['spec']['group']}/{version['name']}`, "
                   f"cluster-scoped; `kubectl get {names['plural']}` (short: "
                   f"{', '.join('`' + s + '`' for s in names.get('shortNames', []))}). "
                   f"{_cell(schema.get('description', ''))}\n\n"
                   + _table(("field", "type", "required", "meaning", "constraints"), rows))
    return "\n".join(out)


# --------------------------------------------------------------------------- pages

PAGES: dict[str, tuple[str, Callable[[], str]]] = {
    "settings": ("settings.md", settings_table),
    "metrics": ("metrics.md", metrics_table),
    "crds": ("crds.md", crd_tables),
}


def begin(key: str) -> str:
    return f"<!-- BEGIN GENERATED {key}: python -m hyperplan_dev.docgen; do not edit by hand -->"


def end(key: str) -> str:
    return f"<!-- END GENERATED {key} -->"


def render_page(key: str, current: str) -> str:
    """``current`` with the text between ``key``'s markers replaced by what the code says."""
    first, last = begin(key), end(key)
    if first not in current or last not in current:
        raise SystemExit(f"docs/reference/{PAGES[key][0]}: the markers of {key} are missing")
    head, rest = current.split(first, 1)
    _, tail = rest.split(last, 1)
    return f"{head}{first}\n\n{PAGES[key][1]()}\n{last}{tail}"


def stale(directory: Path = REFERENCE) -> list[str]:
    """The pages whose generated part differs from the code (empty: all current)."""
    out = []
    for key, (file, _) in PAGES.items():
        path = directory / file
        current = path.read_text() if path.exists() else ""
        try:
            fresh = render_page(key, current) == current
        except SystemExit:
            fresh = False
        if not fresh:
            out.append(str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hyperplan_dev.docgen", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is stale")
    args = parser.parse_args(argv)
    if args.check:
        behind = stale()
        for path in behind:
            print(f"{path} is stale: run `make docs`", file=sys.stderr)
        return 1 if behind else 0
    for key, (file, _) in PAGES.items():
        path = REFERENCE / file
        new = render_page(key, path.read_text())
        if new != path.read_text():
            path.write_text(new)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
