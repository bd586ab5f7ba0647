"""Test helpers that talk to the local control plane the way a user does: kubectl and the API.

Every write goes through kubectl itself. ``kubectl get ... -o json`` (the tests poll with it,
several times a second in each of dozens of scenarios at once) is answered in this process by
:class:`_Reads`, which makes the same GET or LIST with the same selectors and prints what kubectl
prints (a ``List`` of items that carry their apiVersion and kind, no managedFields). Measured on
the 2-core machine: the e2e tier started about 7 kubectl processes a second, whose CPU (about 200
CPU-seconds in its first 150 s, with the API server's share of their discovery) was more than
half the machine, and the operator under test lagged its deadlines by 5 s and more."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar


from hyperplan_dev import build

T = TypeVar("T")


@dataclass(frozen=True)
class _Resource:
    group_version: str  # "v1", "hyperplan.dev/v1alpha1"
    plural: str
    namespaced: bool
    kind: str

    def path(self, namespace: str | None, name: str | None = None) -> str:
        base = f"/api/{self.group_version}" if "/" not in self.group_version else f"/apis/{self.group_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        return f"{base}/{self.plural}" + (f"/{name}" if name else "")


class _Reads:
    """``kubectl get KIND [NAME] [-n NS | -A] [-l SEL] [--field-selector SEL] -o json`` in this
    process, over one kubeconfig's API client (discovery cached, refreshed on an unknown kind)."""

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import client, config
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        cfg.connection_pool_maxsize = 32
        self.api = client.ApiClient(cfg)
        self.resources: dict[str, _Resource] = {}
        self.lock = threading.Lock()

    def _json(self, path: str, query: list[tuple[str, str]] | None = None) -> Any:
        return self.api.call_api(path, "GET", query_params=query or [], header_params={"Accept": "application/json"},
                                 auth_settings=["BearerToken"], response_types_map={200: "object"},
                                 _return_http_data_only=True, _request_timeout=60)

    def _discover(self) -> dict[str, _Resource]:
        found: dict[str, _Resource] = {}
        versions = [("", "v1")] + [(g["name"], g["preferredVersion"]["version"])
                                   for g in self._json("/apis")["groups"]]
        for group, version in versions:  # the core group first, then the server's own order, as kubectl
            gv = f"{group}/{version}" if group else version
            try:
                listed = self._json(f"/apis/{gv}" if group else "/api/v1")
            except Exception:  # noqa: BLE001 - a group that cannot be listed (an aggregated API down)
                continue
            for r in listed.get("resources") or []:
                if "/" in r["name"]:
                    continue  # a subresource
                res = _Resource(gv, r["name"], bool(r["namespaced"]), r["kind"])
                for n in {r["name"], r.get("singularName") or r["kind"].lower(), r["kind"].lower(),
                          *(r.get("shortNames") or [])}:
                    found.setdefault(n, res)
                    if group:
                        found.setdefault(f"{n}.{group}", res)
        return found

    def resource(self, kind: str) -> _Resource | None:
        with self.lock:
            if kind not in self.resources:
                self.resources = self._discover()
            return self.resources.get(kind)

    def get(self, args: tuple[str, ...]) -> subprocess.CompletedProcess | None:
        """kubectl's answer to ``args`` (which start with "get"), or None when they ask for more
        than this knows (the caller then runs kubectl)."""
        parsed = _parse_get(args)
        if parsed is None:
            return None
        kind, name, namespace, everywhere, labels, fields = parsed
        from kubernetes.client.rest import ApiException
        res: _Resource | None = None
        try:
            res = self.resource(kind)
            if res is None:
                return _failed(args, f'error: the server doesn\'t have a resource type "{kind}"')
            ns = None if not res.namespaced else (None if everywhere and not name else namespace or "default")
            if name:
                obj = self._json(res.path(ns, name))
                return _answered(args, _as_printed(obj, res))
            query = [(k, v) for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v]
            listed = self._json(res.path(ns), query)
            items = [_as_printed(item, res) for item in listed.get("items") or []]
            return _answered(args, {"apiVersion": "v1", "items": items, "kind": "List",
                                    "metadata": {"resourceVersion": ""}})
        except ApiException as e:
            if e.status == 404 and name:
                return _failed(args, f'Error from server (NotFound): {res.plural if res else kind} "{name}" not found')
            return _failed(args, f"Error from server ({e.reason}): {e.body}")
        except Exception as e:  # noqa: BLE001 - the server down: kubectl fails too
            return _failed(args, f"error: {e}")


def _parse_get(args: tuple[str, ...]) -> tuple | None:
    rest = list(args[1:])
    positional: list[str] = []
    namespace = labels = fields = None
    everywhere = json_out = False
    while rest:
        a = rest.pop(0)
        if a in ("-o", "--output") and rest:
            json_out = rest.pop(0) == "json"
        elif a in ("-ojson", "--output=json"):
            json_out = True
        elif a in ("-n", "--namespace") and rest:
            namespace = rest.pop(0)
        elif a.startswith("--namespace="):
            namespace = a.split("=", 1)[1]
        elif a in ("-A", "--all-namespaces"):
            everywhere = True
        elif a in ("-l", "--selector") and rest:
            labels = rest.pop(0)
        elif a.startswith(("--selector=", "-l=")):
            labels = a.split("=", 1)[1]
        elif a == "--field-selector" and rest:
            fields = rest.pop(0)
        elif a.startswith("--field-selector="):
            fields = a.split("=", 1)[1]
        elif a.startswith("-"):
            return None
        else:
            positional.append(a)
    if not json_out or not positional or len(positional) > 2 or "," in positional[0] or "/" in positional[0]:
        return None
    name = positional[1] if len(positional) == 2 else None
    if name and (labels or fields):
        return None
    return positional[0].lower(), name, namespace, everywhere, labels, fields


def _as_printed(obj: dict[str, Any], res: _Resource) -> dict[str, Any]:
    obj.setdefault("apiVersion", res.group_version)
    obj.setdefault("kind", res.kind)
    (obj.get("metadata") or {}).pop("managedFields", None)  # kubectl leaves them out
    return obj


def _answered(args: tuple[str, ...], obj: Any) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(["kubectl", *args], 0, json.dumps(obj), "")


def _failed(args: tuple[str, ...], message: str) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(["kubectl", *args], 1, "", message + "\n")


_READS: dict[tuple[str, float], _Reads] = {}
_READS_LOCK = threading.Lock()


def _reads(kubeconfig: Path) -> _Reads | None:
    """One in-process reader per kubeconfig (and per version of it: a restarted plane writes a new one)."""
    try:
        key = (str(kubeconfig), kubeconfig.stat().st_mtime)
    except OSError:
        return None
    with _READS_LOCK:
        reads = _READS.get(key)
        if reads is None:
            try:
                reads = _READS[key] = _Reads(kubeconfig)
            except Exception:  # noqa: BLE001 - an unreadable kubeconfig: kubectl says why
                return None
        return reads


@dataclass(frozen=True)
class Kubectl:
    kubeconfig: Path

    def run(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        proc = None
        if args and args[0] == "get" and input is None:
            reads = _reads(Path(self.kubeconfig))
            proc = reads.get(args) if reads is not None else None
        if proc is None:
            proc = subprocess.run(
                [str(build.binary("kubectl")), f"--kubeconfig={self.kubeconfig}", *args],
                input=input, capture_output=True, text=True, timeout=120,
            )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr}")
        return proc

    # Objects go to kubectl as JSON: a string such as "4e123" stays a string, where YAML written
    # by PyYAML (1.1) would leave it unquoted and kubectl's YAML reader would see a number.
    def apply(self, obj: dict[str, Any] | list[dict[str, Any]] | str, check: bool = True) -> subprocess.CompletedProcess:
        if isinstance(obj, list):
            obj = {"apiVersion": "v1", "kind": "List", "items": obj}
        docs = obj if isinstance(obj, str) else json.dumps(obj)
        return self.run("apply", "-f", "-", input=docs, check=check)

    def create(self, obj: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess:
        return self.run("create", "-f", "-", input=json.dumps(obj), check=check)

    def get(self, kind: str, name: str | None = None, *flags: str) -> Any:
        args = ["get", kind] + ([name] if name else []) + list(flags) + ["-o", "json"]
        return json.loads(self.run(*args).stdout)

    def get_or_none(self, kind: str, name: str) -> Any:
        proc = self.run("get", kind, name, "-o", "json", check=False)
        if proc.returncode != 0:
            if "NotFound" in proc.stderr:
                return None
            raise AssertionError(proc.stderr)
        return json.loads(proc.stdout)

    def delete(self, kind: str, name: str, *flags: str) -> None:
        self.run("delete", kind, name, "--ignore-not-found", *flags)


def eventually(fn: Callable[[], T], *, timeout: float = 60, interval: float = 0.5, what: str = "") -> T:
    """Call ``fn`` until it returns a truthy value (returned) or the timeout passes (AssertionError)."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = fn()
            if value:
                return value
        except AssertionError as e:
            last_error = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what or fn}: {last_error}")
        time.sleep(interval)
