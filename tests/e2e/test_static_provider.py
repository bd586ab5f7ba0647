"""The static node provider: existing nodes lent to a group for a block, then handed back."""

from __future__ import annotations

import uuid
from datetime import timedelta

from tests.e2e.scenarios import Context, events_for, parse_ts, scenario, ts, utcnow
from tests.kube import eventually

API = "hyperplan.dev/v1alpha1"


@scenario
def static_nodes(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    itype, zone, plan, group = f"ml.static-{tag}.xlarge", f"us-east-{tag}", f"static-{tag}", f"static-{tag}"
    names = [f"worker-{tag}-{i}" for i in range(3)]
    for n in names:  # three free workers, as kind's would be; KWOK keeps them Ready
        k.apply({"apiVersion": "v1", "kind": "Node",
                 "metadata": {"name": n, "annotations": {"kwok.x-k8s.io/node": "fake"},
                              "labels": {"hyperplan.dev/pool": "free", "node.kubernetes.io/instance-type": itype,
                                         "topology.kubernetes.io/zone": zone}},
                 "spec": {"unschedulable": True}})
    k.create({"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": f"static-{tag}"},
              "spec": {"instanceType": itype, "availabilityZone": zone, "instanceCount": 2}})
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": plan},
              "spec": {"instanceType": itype, "instanceCount": 2, "targetResource": "hyperpod-cluster",
                       "duration": "1m", "autoPurchase": True,
                       "startTimeAfter": ts(utcnow() + timedelta(seconds=20))}})
    k.create({"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": group},
              "spec": {"trainingPlanRef": plan, "instanceType": itype, "instanceCount": 2,
                       "nodeProvider": "static"}})
    block = eventually(lambda: (s := k.get("trainingplan", plan).get("status") or {}).get("reservedCapacity")
                       and s["reservedCapacity"][0], timeout=60, what="plan bought")

    def held() -> list[dict] | None:
        nodes = k.get("nodes", None, "-l", f"hyperplan.dev/instance-group={group}")["items"]
        return nodes if len(nodes) == 2 and all(not n["spec"].get("unschedulable") for n in nodes) else None

    during = eventually(held, timeout=90, what="two workers adopted")
    status = eventually(lambda: (s := k.get("instancegroup", group).get("status") or {}).get("phase") == "Ready"
                        and s, timeout=30, what="group Ready")
    end = parse_ts(block["endTime"])
    eventually(lambda: utcnow() > end + timedelta(seconds=2), timeout=120, interval=1, what="block end")
    after = {n: k.get("node", n) for n in names}
    return {"names": names, "during": during, "status": status, "after": after, "group": group,
            "events": [e["reason"] for e in events_for(k, group)]}


def test_static_nodes_are_adopted_for_the_block_and_handed_back(scenarios) -> None:
    r = scenarios["static_nodes"].result(timeout=300)
    adopted = {n["metadata"]["name"] for n in r["during"]}
    assert adopted < set(r["names"]) and len(adopted) == 2
    for n in r["during"]:
        labels = n["metadata"]["labels"]
        assert labels["hyperplan.dev/pool"] == "held"
        assert labels["hyperplan.dev/role"] == "active"
        assert labels["hyperplan.dev/node-health-status"] == "Schedulable"
    assert r["status"]["readyCount"] == 2
    for name, node in r["after"].items():  # nothing was created or deleted; all three are free again
        labels = node["metadata"]["labels"]
        assert labels["hyperplan.dev/pool"] == "free"
        assert "hyperplan.dev/instance-group" not in labels
        assert node["spec"].get("unschedulable") is True
    assert "Draining" in r["events"]
