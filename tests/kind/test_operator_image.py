"""The operator image that `hyperplan dev kind up` built from the Dockerfile, as a user gets it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from hyperplan_dev import lock
from tests.kind.conftest import KindEnv

ROOT = Path(__file__).resolve().parents[2]

INSPECT = r"""
import json, os, shutil, sys
from importlib import metadata, util
dist = metadata.distribution("hyperplan")
direct = dist.read_text("direct_url.json")
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(),
    "tools": {t: shutil.which(t) for t in ("gcc", "cc", "c++", "ld", "make", "git")},
    "venv_pip": os.path.exists("/opt/hyperplan/bin/pip"),
    "hyperplan_location": str(dist.locate_file("hyperplan")),
    "editable": bool(direct and '"editable": true' in direct),
    "source_trees": [p for p in ("/src", "/build", "/wheels") if os.path.exists(p)],
    "dev_tools": [m for m in ("hyperplan_dev", "hyperplan.devcluster") if util.find_spec(m)],
    "versions": {d.metadata["Name"]: d.version for d in metadata.distributions()},
}))
"""


def _inspect(image: str) -> dict:
    out = subprocess.run(["docker", "run", "--rm", "--entrypoint", "python", image, "-c", INSPECT],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(out)


def test_the_image_runs_as_uid_10001_with_the_wheel_installed_and_no_toolchain(kind: KindEnv) -> None:
    config = json.loads(subprocess.run(["docker", "image", "inspect", kind.operator_image],
                                       capture_output=True, text=True, check=True).stdout)[0]["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["hyperplan", "run"]
    seen = _inspect(kind.operator_image)
    assert (seen["uid"], seen["gid"]) == (10001, 10001)
    assert seen["tools"] == {t: None for t in seen["tools"]}, f"build tools in the final image: {seen['tools']}"
    assert not seen["venv_pip"], "the operator's venv still has pip"
    assert seen["hyperplan_location"].startswith("/opt/hyperplan/lib/"), seen["hyperplan_location"]
    assert not seen["editable"] and not seen["source_trees"], seen
    assert not seen["dev_tools"], f"the checkout's dev tools are in the image: {seen['dev_tools']}"


def test_the_image_has_exactly_the_versions_of_requirements_lock(kind: KindEnv) -> None:
    pins = lock.parse((ROOT / "requirements.lock").read_text())
    installed = {lock.canonical(n): v for n, v in _inspect(kind.operator_image)["versions"].items()}
    wrong = {n: (v, installed.get(n)) for n, v in pins.items() if installed.get(n) != v}
    assert not wrong, f"pinned vs installed: {wrong}"
