"""A real Prometheus on loopback that scrapes given targets every second, for tests and demos.

It runs Debian's ``/usr/bin/prometheus`` (package ``prometheus``; another binary can be named
with ``HYPERPLAN_PROMETHEUS``) in its own session, with a generated configuration and its TSDB
in a folder the caller owns, and is stopped by the process group of the pid it started::

    with prometheus.start(["127.0.0.1:8000"], tmp_path) as prom:
        prom.wait_for('up{job="hyperplan"} == 1')
        prom.query("hyperplan_reconciles_total")
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from hyperplan_dev.plane import free_port, stop_process_group

DEFAULT_BINARY = "/usr/bin/prometheus"


def binary() -> Path:
    """The prometheus binary: ``$HYPERPLAN_PROMETHEUS``, else Debian's, else the one on PATH."""
    env = os.environ.get("HYPERPLAN_PROMETHEUS")
    if env:
        return Path(env)
    if Path(DEFAULT_BINARY).is_file():
        return Path(DEFAULT_BINARY)
    found = shutil.which("prometheus")
    if found is None:
        raise RuntimeError("prometheus is not installed (Debian: apt-get install prometheus)")
    return Path(found)


def config(targets: Sequence[str], job: str = "hyperplan", interval: str = "1s",
           rule_files: Sequence[Path] = ()) -> dict[str, Any]:
    """A Prometheus configuration that scrapes ``targets`` (``host:port``) as ``job``."""
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval,
                   "evaluation_interval": interval},
        "rule_files": [str(Path(f).resolve()) for f in rule_files],
        "scrape_configs": [{"job_name": job, "metrics_path": "/metrics",
                            "static_configs": [{"targets": list(targets)}]}],
    }


class PrometheusError(RuntimeError):
    pass


@dataclass
class Prometheus:
    proc: subprocess.Popen
    port: int
    folder: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.folder / "prometheus.log"

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data``; raises PrometheusError on an error."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # 400/422 carry the error as JSON
            body = json.loads(e.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant PromQL query; returns the result list (vector: ``{metric, value}`` items)."""
        data = self.api("query", query=expr)
        result = data["result"]
        return result if isinstance(result, list) else [{"metric": {}, "value": result}]

    def wait_for(self, expr: str, timeout: float = 30, interval: float = 0.5) -> list[dict[str, Any]]:
        """Query ``expr`` until it returns something (returned) or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            result = self.query(expr)
            if result:
                return result
            if time.monotonic() > deadline:
                raise PrometheusError(f"timed out after {timeout:.0f}s waiting for {expr!r}")
            time.sleep(interval)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        """Stop the process group that :func:`start` created (SIGTERM, then SIGKILL)."""
        if self.proc.poll() is None:
            stop_process_group(self.proc.pid)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - stop_process_group killed it
            pass

    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text()[-3000:] if self.log.is_file() else ""
            raise PrometheusError(f"prometheus exited with {self.proc.returncode}:\n{tail}")

    def __enter__(self) -> "Prometheus":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(targets: Sequence[str], folder: Path, *, job: str = "hyperplan", interval: str = "1s",
          rule_files: Sequence[Path] = (), timeout: float = 30) -> Prometheus:
    """Start Prometheus scraping ``targets`` every ``interval``; return once it is ready.

    ``folder`` receives ``prometheus.yml``, the TSDB (``tsdb/``) and ``prometheus.log``.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = folder / "prometheus.yml"
    cfg.write_text(yaml.safe_dump(config(targets, job, interval, rule_files), sort_keys=False))
    port = free_port()
    cmd = [str(binary()), f"--config.file={cfg}", f"--storage.tsdb.path={folder / 'tsdb'}",
           "--storage.tsdb.retention.time=1h", f"--web.listen-address=127.0.0.1:{port}",
           "--log.level=warn"]
    with open(folder / "prometheus.log", "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=folder)
    prom = Prometheus(proc, port, folder)
    deadline = time.monotonic() + timeout
    try:
        while not prom.ready():
            prom._check_alive()
            if time.monotonic() > deadline:
                raise PrometheusError(f"prometheus not ready after {timeout:.0f}s; see {prom.log}")
            time.sleep(0.2)
    except BaseException:
        prom.stop()
        raise
    return prom
