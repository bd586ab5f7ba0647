"""Install and run the real AWS clients against hyperplan's SageMaker API.

Each client lives in its own venv under ``~/.cache/hyperplan/clients/<requirement>``, made on
first use (a line per step) and reused by later runs; a file lock keeps parallel test workers
from making it twice. boto3 is driven through :mod:`tests.aws.boto3_driver` (run by the venv's
Python: calls in on stdin as JSON, answers out), the CLI through its own ``aws`` command.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BOTO3 = "boto3==1.44.8"
AWSCLI = "awscli==1.46.3"
CACHE = Path(os.environ.get("HYPERPLAN_CACHE") or Path.home() / ".cache" / "hyperplan") / "clients"
DRIVER = Path(__file__).resolve().parent / "boto3_driver.py"


def client_venv(requirement: str) -> Path:
    """The venv holding ``requirement`` (made once, then reused)."""
    home = CACHE / requirement.replace("==", "-")
    done = home / ".installed"
    if done.exists():
        return home
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            print(f"[aws] making a venv for {requirement} in {home}", flush=True)
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(home)], check=True)
            print(f"[aws] pip install {requirement}", flush=True)
            subprocess.run([str(home / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                            requirement], check=True, timeout=600)
            done.touch()
            print(f"[aws] {requirement} ready", flush=True)
    return home


@dataclass(frozen=True)
class Endpoint:
    """Where a client talks to, and as whom."""

    url: str
    key_id: str
    secret: str
    region: str = "us-west-2"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({"AWS_ACCESS_KEY_ID": self.key_id, "AWS_SECRET_ACCESS_KEY": self.secret,
                    "AWS_DEFAULT_REGION": self.region, "AWS_ENDPOINT_URL_SAGEMAKER": self.url,
                    "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
                    "AWS_EC2_METADATA_DISABLED": "true"})
        return env


def boto3_calls(endpoint: Endpoint, calls: list[dict[str, Any]], timeout: float = 120) -> list[dict[str, Any]]:
    """Run ``calls`` (each ``{"op": "list_training_plans", "args": {...}}``, or with
    ``"paginate": true``) with boto3; each answer is ``{"ok": response}`` or ``{"error": {"code",
    "message", "status"}}``, timestamps as epoch seconds."""
    python = client_venv(BOTO3) / "bin" / "python"
    done = subprocess.run([str(python), str(DRIVER)], input=json.dumps(calls), capture_output=True, text=True,
                          env=endpoint.env(), timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"the boto3 driver failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout)


def boto3_call(endpoint: Endpoint, op: str, **args: Any) -> dict[str, Any]:
    return boto3_calls(endpoint, [{"op": op, "args": args}])[0]


def aws_cli(endpoint: Endpoint, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``aws <args>`` (the CLI finds the endpoint in AWS_ENDPOINT_URL_SAGEMAKER)."""
    aws = client_venv(AWSCLI) / "bin" / "aws"
    return subprocess.run([str(aws), *args], capture_output=True, text=True, env=endpoint.env(), timeout=timeout)
