"""The README's last kind step, `kubectl apply -f deploy/examples/`, works on the kind cluster,
the operator answers every example, and `kubectl delete -f deploy/examples/` completes (the
operator removes its finalizers)."""

from __future__ import annotations

from pathlib import Path

import yaml

from hyperplan_dev.kind import EXAMPLES
from tests.kind.conftest import KindEnv
from tests.kube import eventually

ROOT = Path(__file__).resolve().parents[2]


def _example_names(kind: str) -> list[str]:
    return [d["metadata"]["name"] for f in sorted((ROOT / "deploy" / "examples").glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text()) if d and d["kind"] == kind]


def test_the_examples_apply_are_answered_and_delete_cleanly(kind: KindEnv) -> None:
    out = kind.cluster.readme_step(EXAMPLES)
    plans = _example_names("TrainingPlan")
    assert plans and all(f"trainingplan.hyperplan.dev/{p}" in out for p in plans), out
    try:
        for plan in plans:
            phase = eventually(
                lambda plan=plan: (kind.kubectl.get("trainingplan", plan).get("status") or {}).get("phase"),
                timeout=90, interval=1, what=f"the operator setting a phase on {plan}")
            assert phase in {"Pending", "Scheduled", "Active", "Expired", "Failed"}, phase
    finally:
        kind.kubectl.run("delete", "-f", str(ROOT / "deploy" / "examples") + "/", "--wait=true",
                         "--timeout=120s")
    for plan in plans:
        assert kind.kubectl.get_or_none("trainingplan", plan) is None
