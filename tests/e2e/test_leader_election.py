"""Two replicas on one Lease: the leader acts, the standby writes nothing and runs no daemons.

Failover times (kill -9 and SIGTERM of the leader) are measured by bench/failover.py on a plane
of its own, since killing the shared leader here would stall the side-by-side scenarios.
"""

from __future__ import annotations

import json
import re
import urllib.request
import uuid

from tests.e2e.conftest import LEADER, STANDBY, Operator
from tests.kube import Kubectl, eventually

API = "hyperplan.dev/v1alpha1"


def samples(text: str, family: str) -> list[float]:
    return [float(m.group(1)) for m in re.finditer(rf"^{family}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)]


def role(op: Operator) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{op.liveness_port}/healthz", timeout=5) as r:
        return json.loads(r.read())["role"]


def test_only_the_leader_acts(scenarios, operator: Operator, standby: Operator, crds: Kubectl) -> None:
    for future in scenarios.values():  # let the leader do a run's worth of work first
        future.exception(timeout=900)
    # And work of this test's own: a purchase the leader must make (and the standby must not).
    tag = uuid.uuid4().hex[:5]
    name, itype = f"leader-{tag}", f"ml.leader-{tag}.xlarge"
    crds.create({"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": name},
                 "spec": {"instanceType": itype, "availabilityZone": "us-east-1a", "instanceCount": 2}})
    crds.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": name},
                 "spec": {"instanceType": itype, "instanceCount": 2, "targetResource": "training-job",
                          "duration": "2m", "autoPurchase": True}})
    eventually(lambda: (crds.get("trainingplan", name).get("status") or {}).get("phase") == "Scheduled",
               timeout=60, what=f"plan {name} bought")
    lease = crds.get("lease", "hyperplan-leader")
    assert lease["spec"]["holderIdentity"] == LEADER
    assert lease["spec"]["leaseDurationSeconds"] == 15
    assert lease["spec"].get("leaseTransitions", 0) == 0  # nobody took it over during the run

    assert role(operator) == "leader" and role(standby) == "standby"
    leader, waiting = operator.metrics(), standby.metrics()
    assert samples(leader, "hyperplan_leader") == [1.0]
    assert samples(waiting, "hyperplan_leader") == [0.0]
    assert sum(samples(leader, "hyperplan_status_writes_total")) > 0
    assert sum(samples(leader, "hyperplan_reconciles_total")) > 0
    # The standby has reconciled nothing and written nothing the whole run.
    assert sum(samples(waiting, "hyperplan_status_writes_total")) == 0
    assert sum(samples(waiting, "hyperplan_reconciles_total")) == 0
    assert sum(samples(waiting, "hyperplan_purchases_total")) == 0
    log = standby.log.read_text()
    assert f"standing by: lease held by {LEADER}" in log, log[-2000:]
    assert "leading as" not in log
    assert f"leading as {LEADER}" in operator.log.read_text()
    assert STANDBY not in json.dumps(lease)
    crds.delete("trainingplan", name, "--wait=true", "--timeout=60s")
    crds.delete("capacitypool", name)
