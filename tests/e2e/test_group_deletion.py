"""Deleting an instance group drains and removes its nodes before the group goes (finalizer)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from tests.e2e.scenarios import Context, scenario, ts, utcnow
from tests.kube import eventually

API = "hyperplan.dev/v1alpha1"


@scenario
def group_deleted(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    itype, plan, group = f"ml.del-{tag}.xlarge", f"del-{tag}", f"del-{tag}"
    k.create({"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": f"del-{tag}"},
              "spec": {"instanceType": itype, "availabilityZone": "us-east-1d", "instanceCount": 4}})
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": plan},
              "spec": {"instanceType": itype, "instanceCount": 4, "targetResource": "hyperpod-cluster",
                       "duration": "3m", "autoPurchase": True,
                       "startTimeAfter": ts(utcnow() + timedelta(seconds=15))}})
    k.create({"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": group},
              "spec": {"trainingPlanRef": plan, "instanceType": itype, "instanceCount": 4}})
    eventually(lambda: (k.get("instancegroup", group).get("status") or {}).get("phase") == "Ready",
               timeout=90, what="group Ready")
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
    assert "hyperplan.dev/finalizer" in r["finalizers"]
    assert r["gone"] == "gone"
    assert r["left"] == []
    assert r["pod_after"] is None  # evicted through the Eviction API, then gone with its node
