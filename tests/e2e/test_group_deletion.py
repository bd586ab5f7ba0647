"""Deleting an instance group drains and removes its nodes before the group goes (finalizer)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from tests.e2e.scenarios import Context, group_body, plan_body, pool_body, scenario, ts, utcnow, wait_phase
from tests.kube import eventually


@scenario
def group_deleted(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    itype, plan, group = f"ml.del-{tag}.xlarge", f"del-{tag}", f"del-{tag}"
    k.create(pool_body(f"del-{tag}", itype, 4, az="us-east-1d"))
    k.create(plan_body(plan, itype, 4, duration="3m", autoPurchase=True,
                       startTimeAfter=ts(utcnow() + timedelta(seconds=15))))
    k.create(group_body(group, plan, itype, 4))
    wait_phase(k, "instancegroup", group, "Ready")
    nodes = [n["metadata"]["name"] for n in k.get("nodes", None, "-l", f"hyperplan.dev/instance-group={group}")["items"]]
    pod = f"job-{tag}"
    k.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": "default"},
             "spec": {"nodeSelector": {"hyperplan.dev/instance-group": group},
                      "containers": [{"name": "c", "image": "trainer"}]}})
    eventually(lambda: k.get("pod", pod, "-n", "default")["status"].get("phase") == "Running",
               timeout=60, what="pod Running")
    finalizers = k.get("instancegroup", group)["metadata"].get("finalizers", [])
    k.run("delete", "instancegroup", group, "--wait=false")
    gone = eventually(lambda: k.get_or_none("instancegroup", group) is None and "gone", timeout=60,
                      what="group deleted")
    left = k.get("nodes", None, "-l", f"hyperplan.dev/instance-group={group}")["items"]
    pod_after = k.get_or_none("pod", pod)
    return {"nodes": nodes, "finalizers": finalizers, "gone": gone, "left": left,
            "pod_after": pod_after}


def test_deleting_a_group_drains_and_removes_its_nodes(scenarios) -> None:
    r = scenarios["group_deleted"].result(timeout=300)
    assert len(r["nodes"]) == 4
    assert "hyperplan.dev/drain-nodes" in r["finalizers"]  # the operator's own, put on by its first pass
    assert r["gone"] == "gone"
    assert r["left"] == []
    assert r["pod_after"] is None  # evicted through the Eviction API, then gone with its node
