"""At the termination time nodes drain through the Eviction API: a PodDisruptionBudget holds a
pod until the block's end, and not a moment longer."""

from __future__ import annotations

import uuid
from datetime import timedelta

from tests.e2e.scenarios import Context, Recorder, parse_ts, scenario, ts, utcnow
from tests.kube import eventually

API = "hyperplan.dev/v1alpha1"


@scenario
def drain_respects_pdb(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    itype, plan, group = f"ml.pdb-{tag}.xlarge", f"pdb-{tag}", f"pdb-{tag}"
    k.create({"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": f"pdb-{tag}"},
              "spec": {"instanceType": itype, "availabilityZone": "us-east-1p", "instanceCount": 2}})
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": plan},
              "spec": {"instanceType": itype, "instanceCount": 2, "targetResource": "hyperpod-cluster",
                       "duration": "1m", "autoPurchase": True,
                       "startTimeAfter": ts(utcnow() + timedelta(seconds=15))}})
    k.create({"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": group},
              "spec": {"trainingPlanRef": plan, "instanceType": itype, "instanceCount": 2}})
    block = eventually(lambda: (s := k.get("trainingplan", plan).get("status") or {}).get("reservedCapacity")
                       and s["reservedCapacity"][0], timeout=60, what="plan bought")
    eventually(lambda: (k.get("instancegroup", group).get("status") or {}).get("phase") == "Ready",
               timeout=90, what="group Ready")
    # One guarded pod (its PDB allows no disruption) and one free pod, on the group's nodes.
    k.apply([
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
         "metadata": {"name": f"guard-{tag}", "namespace": "default"},
         "spec": {"minAvailable": 1, "selector": {"matchLabels": {"guard": tag}}}},
        *[{"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"{kind}-{tag}", "namespace": "default", "labels": {kind: tag}},
           "spec": {"nodeSelector": {"hyperplan.dev/instance-group": group},
                    "containers": [{"name": "c", "image": "trainer"}]}} for kind in ("guard", "free")],
    ])
    for kind in ("guard", "free"):
        eventually(lambda kind=kind: k.get("pod", f"{kind}-{tag}", "-n", "default")["status"].get("phase")
                   == "Running", timeout=60, what=f"{kind} pod Running")
    guarded_node = k.get("pod", f"guard-{tag}", "-n", "default")["spec"]["nodeName"]
    pods = Recorder(lambda: tuple(sorted(p["metadata"]["name"] for p in
                                         k.get("pods", None, "-n", "default", "-l", f"guard={tag}")["items"]
                                         + k.get("pods", None, "-n", "default", "-l", f"free={tag}")["items"]
                                         if not p["metadata"].get("deletionTimestamp"))), interval=0.25).start()
    node = Recorder(lambda: k.get_or_none("node", guarded_node) is not None, interval=0.25).start()
    end = parse_ts(block["endTime"])
    eventually(lambda: utcnow() > end + timedelta(seconds=3), timeout=120, interval=1, what="block end")
    return {"block": block, "pods": pods.stop(), "node": node.stop(), "end": end,
            "termination": parse_ts(block["terminationTime"])}


def test_a_pdb_holds_its_pod_until_the_block_ends(scenarios) -> None:
    r = scenarios["drain_respects_pdb"].result(timeout=300)
    free_gone = next(when for when, names in r["pods"] if not any(n.startswith("free-") for n in names))
    assert r["termination"] - timedelta(seconds=1) <= free_gone <= r["termination"] + timedelta(seconds=5)
    node_gone = next(when for when, present in r["node"] if not present)
    # The guarded node stays (its eviction refused) well past the termination time, and goes by the end.
    assert node_gone >= r["termination"] + timedelta(seconds=10)
    assert node_gone <= r["end"] + timedelta(seconds=2)
