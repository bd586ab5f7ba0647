"""The chart's RBAC against the code: every Kubernetes API call the operator's code makes is in the
list that tests/integration/test_helm_chart.py holds the ClusterRole and Roles to (OPERATOR_CALLS,
KARPENTER_CALLS), and every entry of that list that the typed client makes has a call site.

The call sites are found in the source (an AST walk of src/hyperplan): a call, or a reference
passed to a watch, of a method of the client's API classes. A typed method names its resource
and verb (``patch_node_status``: patch ``nodes/status``); a custom-object method takes them from
its arguments, resolved through the module's constants (a plural passed in as a parameter counts
as any resource of the group). What the client does not make is left out of the reverse check:
kopf's own lists and watches, and the node watch's raw stream.

The SageMaker API (src/hyperplan/sagemaker) is left out: its calls are made as each key's
identity (impersonation), whose rights are the identity's RBAC, not the operator's. So is the CLI
(src/hyperplan/cli.py): `hyperplan api-key create`, `node reboot` and the rest run as the user who
types them.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from kubernetes import client

from tests.integration.test_helm_chart import KARPENTER_CALLS, OPERATOR_CALLS

SRC = Path(__file__).resolve().parents[2] / "src" / "hyperplan"
API_GROUPS = {client.CoreV1Api: "", client.BatchV1Api: "batch", client.PolicyV1Api: "policy",
              client.CoordinationV1Api: "coordination.k8s.io", client.CustomObjectsApi: None}
VERBS = {"read": "get", "get": "get", "list": "list", "create": "create", "patch": "patch", "replace": "update",
         "delete": "delete"}
SUBRESOURCES = ("status", "eviction")
# custom-object methods: (index of the group argument, index of the plural argument)
CUSTOM_ARGS = {"namespaced": (0, 3), "cluster": (0, 2)}
NOT_THE_CLIENTS = ("kopf", "nodewatch.NodeWatch")  # entries whose calls the typed client does not make


def _methods() -> dict[str, type]:
    out = {}
    for cls in API_GROUPS:
        for name in dir(cls):
            if name.split("_", 1)[0] in VERBS and not name.endswith("_with_http_info") and callable(getattr(cls, name)):
                out.setdefault(name, cls)
    return out


METHODS = _methods()


def typed(method: str, cls: type) -> tuple[str, str, str]:
    verb, rest = method.split("_", 1)
    rest = rest.removeprefix("namespaced_").removesuffix("_for_all_namespaces")
    kind, sub = rest, None
    for s in SUBRESOURCES:
        if rest.endswith("_" + s):
            kind, sub = rest[: -len(s) - 1], s
    resource = kind.replace("_", "") + "s" + (f"/{sub}" if sub else "")
    return API_GROUPS[cls], resource, VERBS[verb]


def _resolve(node: ast.expr, module) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and isinstance(getattr(module, node.id, None), str):
        return getattr(module, node.id)
    return None


def custom(method: str, call: ast.Call | None, module) -> tuple[str, str, str]:
    verb = VERBS[method.split("_", 1)[0]]
    scope = "namespaced" if "_namespaced_" in method else "cluster"
    g, p = CUSTOM_ARGS[scope]
    args = call.args if call is not None else []
    group = _resolve(args[g], module) if len(args) > g else None
    plural = _resolve(args[p], module) if len(args) > p else None
    sub = "/status" if method.endswith("_status") else ""
    return group or "*", (plural + sub) if plural else "*" + sub, verb


def call_sites() -> dict[tuple[str, str, str], list[str]]:
    """(group, resource, verb) -> where, for every API call of the operator's code."""
    found: dict[tuple[str, str, str], list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent)
        if rel.parts[1] == "sagemaker" or rel.name == "cli.py":
            continue
        module = importlib.import_module(".".join(rel.with_suffix("").parts))
        tree = ast.parse(path.read_text())
        calls = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
        streamed = {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr == "stream" for a in n.args}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr in METHODS):
                continue
            cls = METHODS[node.attr]
            if cls is client.CustomObjectsApi:
                key = custom(node.attr, calls.get(id(node)), module)
            else:
                key = typed(node.attr, cls)
            where = f"{rel}:{node.lineno}"
            found.setdefault(key, []).append(where)
            if id(node) in streamed:
                found.setdefault((key[0], key[1], "watch"), []).append(where)
    return found


# The Secrets of remote pools' credentials: the remote-capacity Role, by resourceNames
# (charts/hyperplan/templates/remote-capacity-rbac.yaml).
REMOTE_CAPACITY_CALLS = [("", "secrets", "get", "remote.secret_credentials: the remote-capacity Role, by name")]
LISTED = {(g, r, v): why for g, r, v, why in [*OPERATOR_CALLS, *KARPENTER_CALLS, *REMOTE_CAPACITY_CALLS]}


def _listed(key: tuple[str, str, str]) -> bool:
    group, resource, verb = key
    return any((g == group or group == "*") and (r == resource or (resource.startswith("*") and
               r.endswith(resource[1:]) and ("/" in r) == ("/" in resource))) and v == verb for g, r, v in LISTED)


def test_the_scan_finds_the_calls_it_is_meant_to() -> None:
    sites = call_sites()
    assert ("", "nodes/status", "patch") in sites and ("", "pods/eviction", "create") in sites
    assert ("karpenter.sh", "nodeclaims", "create") in sites
    assert ("coordination.k8s.io", "leases", "watch") in sites  # a reference passed to a watch
    assert ("hyperplan.dev", "*/status", "patch") in sites  # a plural passed in by the caller


@pytest.mark.parametrize("key", sorted(call_sites()), ids=lambda k: f"{k[2]}-{k[0] or 'core'}-{k[1]}")
def test_every_call_of_the_code_is_in_the_rbac_list(key) -> None:
    assert _listed(key), (f"{key} is called at {call_sites()[key]} but is not in OPERATOR_CALLS/KARPENTER_CALLS: "
                          "grant it in the chart (charts/hyperplan/templates/rbac.yaml) and list it there")


def test_every_client_call_of_the_rbac_list_has_a_call_site() -> None:
    sites = call_sites()
    unused = []
    for (group, resource, verb), why in LISTED.items():
        if why.startswith(NOT_THE_CLIENTS):
            continue
        if not any((g in (group, "*")) and (r == resource or (r.startswith("*") and resource.endswith(r[1:])
                   and ("/" in r) == ("/" in resource))) and v == verb for g, r, v in sites):
            unused.append((group, resource, verb, why))
    assert unused == [], "listed (and granted) but never called by the code"
