"""Test helpers that talk to the local control plane the way a user does: kubectl and the API."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar


from hyperplan_dev import build

T = TypeVar("T")


@dataclass(frozen=True)
class Kubectl:
    kubeconfig: Path

    def run(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
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
