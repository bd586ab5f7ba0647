"""Generate the CustomResourceDefinitions from the pydantic models.

pydantic's JSON schema is close to what the API server wants but not structural:
it uses ``$ref``/``$defs``, ``anyOf`` with ``null`` for optionals, ``const`` and titles.
:func:`structural` rewrites it into an OpenAPI v3 structural schema; the CEL rules and
``x-kubernetes-*`` extensions declared on the models pass through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hyperplan.api import models

DROP = {"title", "discriminator"}


@dataclass(frozen=True)
class Kind:
    model: type[models.Model]
    plural: str
    short_names: tuple[str, ...]
    columns: tuple[tuple[str, str, str], ...]  # (name, type, jsonPath)
    description: str

    @property
    def name(self) -> str:
        return self.model.__name__

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{models.GROUP}"


KINDS: tuple[Kind, ...] = (
    Kind(models.CapacityPool, "capacitypools", ("cpool",), (
        ("Type", "string", ".spec.instanceType"),
        ("UltraServer", "string", ".spec.ultraServerType"),
        ("AZ", "string", ".spec.availabilityZone"),
        ("Count", "integer", ".spec.instanceCount"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ), "Supply of one instance type in one availability zone that offerings are cut from. "
       "status.reservations is the ledger of blocks sold from it."),
    Kind(models.TrainingPlan, "trainingplans", ("tp",), (
        ("Phase", "string", ".status.phase"),
        ("Type", "string", ".spec.instanceType"),
        ("UltraServer", "string", ".spec.ultraServerType"),
        ("Count", "integer", ".status.totalInstanceCount"),
        ("AZ", "string", ".status.availabilityZone"),
        ("In-Use", "integer", ".status.inUseInstanceCount"),
        ("Next-Transition", "string", ".status.nextTransitionTime"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ), "A purchase of reserved capacity: one or more blocks of instances in time."),
    Kind(models.InstanceGroup, "instancegroups", ("ig",), (
        ("Plan", "string", ".spec.trainingPlanRef"),
        ("Phase", "string", ".status.phase"),
        ("AZ", "string", ".status.availabilityZone"),
        ("Desired", "integer", ".status.desiredCount"),
        ("Ready", "integer", ".status.readyCount"),
        ("Spares", "integer", ".status.spareCount"),
        ("Unhealthy", "integer", ".status.unhealthyCount"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ), "A named group of nodes of one instance type, bound to a training plan."),
)


def structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Rewrite one pydantic JSON-schema node into a structural OpenAPI v3 node."""
    if "$ref" in schema:
        target = defs[schema["$ref"].split("/")[-1]]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return structural(merged, defs)
    if schema.get("x-kubernetes-int-or-string"):
        keep = {k: v for k, v in schema.items() if k not in ("anyOf", "type", *DROP)}
        return keep
    if "anyOf" in schema:
        options = [o for o in schema["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf {schema['anyOf']} structurally")
        outer = {k: v for k, v in schema.items() if k != "anyOf"}
        if outer.get("default", "x") is None:
            outer.pop("default")
        inner = structural(options[0], defs)
        inner_rules = inner.pop("x-kubernetes-validations", [])
        outer_rules = outer.pop("x-kubernetes-validations", [])
        node = {**inner, **{k: v for k, v in outer.items() if k not in DROP}}
        if inner_rules or outer_rules:
            node["x-kubernetes-validations"] = inner_rules + outer_rules
        return node
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in DROP or key == "$defs":
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out["properties"] = {k: structural(v, defs) for k, v in value.items()}
        elif key == "items":
            out["items"] = structural(value, defs)
        elif key == "additionalProperties" and isinstance(value, dict):
            out["additionalProperties"] = structural(value, defs)
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        sample = out["enum"][0]
        out["type"] = "integer" if isinstance(sample, int) else "string"
    if out.get("default") is None:
        out.pop("default", None)
    return out


def crd(kind: Kind) -> dict[str, Any]:
    full = kind.model.model_json_schema(by_alias=True, mode="serialization")
    defs = full.get("$defs", {})
    props = full["properties"]
    spec = structural(props["spec"], defs)
    status = structural(props["status"], defs)
    status.pop("default", None)
    schema = {
        "type": "object",
        "description": kind.description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": kind.crd_name},
        "spec": {
            "group": models.GROUP,
            "scope": "Cluster",
            "names": {
                "kind": kind.name,
                "listKind": f"{kind.name}List",
                "plural": kind.plural,
                "singular": kind.name.lower(),
                "shortNames": list(kind.short_names),
                "categories": ["hyperplan"],
            },
            "versions": [{
                "name": models.VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": n, "type": t, "jsonPath": p} for n, t, p in kind.columns
                ],
                "schema": {"openAPIV3Schema": schema},
            }],
        },
    }


def render(kind: Kind) -> str:
    header = "# Generated from src/hyperplan/api/models.py by `hyperplan crds`; do not edit.\n"
    return header + yaml.safe_dump(crd(kind), sort_keys=False, width=100)


def file_name(kind: Kind) -> str:
    return f"{models.GROUP}_{kind.plural}.yaml"


def write_all(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in KINDS:
        path = directory / file_name(kind)
        path.write_text(render(kind))
        written.append(path)
    return written
