"""Status is output, on the local plane: a forged ``status.offerings`` entry buys nothing.

While the operator is stopped (SIGSTOP, for a moment well inside its Lease's renew deadline),
someone who may write ``trainingplans/status`` rewrites the plan's listed offering to 8 instances
for a plan whose spec asks for 1, and ``spec.offeringId`` names it. When the operator goes on, it
searches again from the spec and the pools, refuses, and the ledger stays empty.

Runs after the side-by-side scenarios have finished, since it pauses the shared operator.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from datetime import timedelta

from tests.e2e.scenarios import events_for, plan_body, pool_body, ts, utcnow
from tests.kube import eventually

MISMATCH = "OfferingDoesNotMatchSpec"


def test_a_forged_offering_in_status_buys_nothing(scenarios, late_scenarios, operator, crds) -> None:
    for future in [*scenarios.values(), *late_scenarios.values()]:
        future.exception(timeout=900)
    k = crds
    tag = uuid.uuid4().hex[:5]
    itype, name = f"ml.forge-{tag}.xlarge", f"forge-{tag}"
    k.create(pool_body(name, itype, 8, az="us-east-1f"))
    start = utcnow() + timedelta(seconds=40)
    k.create(plan_body(name, itype, 1, duration="2m", startTimeAfter=ts(start),
                       endTimeBefore=ts(start + timedelta(minutes=10))))
    listed = eventually(lambda: (s := k.get("trainingplan", name).get("status") or {}).get("phase") == "Pending"
                        and s.get("offerings"), timeout=30, what="Pending with offerings")
    chosen = listed[0]["id"]
    forged = json.loads(json.dumps(listed))
    for block in forged[0]["blocks"]:
        block["instanceCount"] = 8  # the whole pool, for a plan that asks for 1

    os.kill(operator.proc.pid, signal.SIGSTOP)
    try:
        k.run("patch", "trainingplan", name, "--subresource=status", "--type=merge",
              "-p", json.dumps({"status": {"offerings": forged}}))
        assert k.get("trainingplan", name)["status"]["offerings"] == forged
        k.run("patch", "trainingplan", name, "--type=merge", "-p", json.dumps({"spec": {"offeringId": chosen}}))
    finally:
        os.kill(operator.proc.pid, signal.SIGCONT)

    status = eventually(lambda: (s := k.get("trainingplan", name).get("status") or {}).get("phase") == "Failed"
                        and s, timeout=30, what="plan Failed")
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions["Failed"] == ("True", MISMATCH)
    assert conditions["Purchased"] == ("False", MISMATCH)
    assert status.get("reservedCapacity", []) == []
    assert forged[0] not in status.get("offerings", [])  # the status shows the search's offerings again
    assert (k.get("capacitypool", name).get("status") or {}).get("reservations", []) == []
    warning = eventually(lambda: next((e for e in events_for(k, name) if e["reason"] == MISMATCH), None),
                         timeout=15, what=f"a {MISMATCH} Event")
    assert warning["type"] == "Warning"
    assert chosen in warning["message"] and f"8 x {itype}" in warning["message"]
    assert "nothing was bought" in warning["message"]
