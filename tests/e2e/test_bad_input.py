"""What the schema cannot see fails when the operator acts: it lands on the object, not in a loop.

A cluster policy of the admin's (a ValidatingAdmissionPolicy) refuses nodes that carry a label,
and one group asks for that label. The group gets ``Reconciled=False`` with the API server's own
message and a Warning Event; its retries back off (5 s, 10 s, 20 s ...) instead of every 5 s;
and a valid group on the same operator is Ready on time beside it.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from tests.e2e.scenarios import (
    Context, events_for, first_block, group_body, parse_ts, plan_body, pool_body, late_scenario, ts, utcnow,
    wait_phase,
)
from tests.kube import eventually


@late_scenario
def refused_by_cluster_policy(ctx: Context) -> dict:
    k, tag = ctx.kubectl, uuid.uuid4().hex[:5]
    policy = f"refuse-{tag}"
    k.apply([
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": policy},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                          "operations": ["CREATE"], "resources": ["nodes"]}]},
                  "validations": [{"expression": f"!has(object.metadata.labels) || "
                                                 f"!('refuse-{tag}' in object.metadata.labels)",
                                   "message": f"cluster policy {policy}: no node may carry refuse-{tag}"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": policy}, "spec": {"policyName": policy, "validationActions": ["Deny"]}},
    ])
    itype = f"ml.bad-{tag}.xlarge"
    start = utcnow() + timedelta(seconds=20)
    for name, labels in ((f"bad-{tag}", {f"refuse-{tag}": "yes"}), (f"good-{tag}", {"team": "ok"})):
        k.create(pool_body(name, itype, 2, az="us-east-1b"))
        k.create(plan_body(name, f"{itype}", 1, duration="2m", autoPurchase=True, startTimeAfter=ts(start)))
        k.create(group_body(name, name, itype, 1, labels=labels))
    good_block = first_block(k, f"good-{tag}")
    good = wait_phase(k, "instancegroup", f"good-{tag}", "Ready", timeout=120)
    good_ready_at = utcnow()

    def refused() -> dict | None:
        conds = (k.get("instancegroup", f"bad-{tag}").get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "Reconciled" and c["status"] == "False"), None)

    first = eventually(refused, timeout=60, what="the refusal on the bad group")
    failing_since = parse_ts(first["lastTransitionTime"])
    eventually(lambda: utcnow() >= failing_since + timedelta(seconds=40), timeout=60, interval=1,
               what="40 s of refusals")
    later = refused()
    events = [e for e in events_for(k, f"bad-{tag}") if e.get("reason") == "ReconcileFailed"]
    nodes = k.get("nodes", None, "-l", f"hyperplan.dev/instance-group=bad-{tag}")["items"]
    for name in (f"bad-{tag}", f"good-{tag}"):
        k.delete("instancegroup", name, "--wait=true", "--timeout=60s")
        k.delete("trainingplan", name, "--wait=true", "--timeout=60s")
        k.delete("capacitypool", name)
    k.delete("validatingadmissionpolicybinding", policy)
    k.delete("validatingadmissionpolicy", policy)
    return {"tag": tag, "good": good, "good_block": good_block, "good_ready_at": good_ready_at,
            "first": first, "later": later, "events": events, "nodes": nodes, "operator": ctx.operator}


def test_a_refused_action_lands_on_the_object_and_backs_off(late_scenarios) -> None:
    r = late_scenarios["refused_by_cluster_policy"].result(timeout=600)
    tag, later = r["tag"], r["later"]
    assert later["reason"] == "ApiError"
    assert f"cluster policy refuse-{tag}: no node may carry refuse-{tag}" in later["message"], later
    assert "the API server refused a call (422)" in later["message"] or "(403)" in later["message"], later
    # Retries back off: 5 + 10 + 20 s fit in 40 s, so at most 4 failures (a 5 s loop makes 9).
    failures = int(later["message"].split("(failed ")[1].split(" ")[0])
    assert 2 <= failures <= 4, later["message"]
    assert r["events"], "no ReconcileFailed Warning Event on the group"
    assert r["events"][0]["type"] == "Warning"
    assert f"refuse-{tag}" in r["events"][0]["message"]
    assert r["nodes"] == []
    # The valid group beside it is on time, and the operator stays healthy.
    start = parse_ts(r["good_block"]["startTime"])
    assert r["good_ready_at"] <= start + timedelta(seconds=20), r["good_ready_at"] - start
    op = r["operator"]
    op.wait_alive()
    log = op.log.read_text()
    assert "Traceback" not in "\n".join(l for l in log.splitlines() if f"bad-{tag}" in l)
