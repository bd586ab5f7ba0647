"""HYPERPLAN_KUEUE_ENABLED (the chart's kueue.enabled): off, the operator registers nothing of Kueue.

A watch on a kind the operator may not list would hold every kopf handler back (the Workload
index waits for its first listing), so with the chart's Kueue rules dropped the handlers must
not be there at all. Each case imports the handlers in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, kopf
import hyperplan.wiring
registry = kopf.get_default_registry()
handlers = [h for r in (registry._indexing, registry._watching) for h in r.get_all_handlers()]
print(json.dumps(sorted({h.selector.any_name or '' for h in handlers})))
"""


@pytest.mark.parametrize("value, served", [
    (None, True), ("true", True), ("false", False),
], ids=["unset-serves-kueue", "true", "false"])
def test_kueue_handlers_follow_the_setting(value: str | None, served: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HYPERPLAN_KUEUE_ENABLED"}
    if value is not None:
        env["HYPERPLAN_KUEUE_ENABLED"] = value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    plurals = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert {"trainingplans", "instancegroups"} <= plurals  # the rest of the operator is there either way
    assert "nodes" not in plurals  # the operator's own node watch (runtime.nodewatch), not kopf's
    assert ({"workloads", "admissionchecks"} <= plurals) is served
    assert not ({"workloads", "admissionchecks"} & plurals) or served


def test_a_bad_value_is_a_clear_error() -> None:
    env = {**os.environ, "HYPERPLAN_KUEUE_ENABLED": "maybe"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "kueue_enabled" in out.stderr
