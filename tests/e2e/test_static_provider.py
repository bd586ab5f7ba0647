"""The static node provider: existing nodes lent to a group for a block, then handed back."""

from __future__ import annotations

import uuid
from datetime import timedelta

from tests.e2e.scenarios import (
    Context, events_for, first_block, group_body, parse_ts, plan_body, pool_body, scenario, ts, utcnow, wait_phase,
)
from tests.kube import eventually


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
    k.create(pool_body(f"static-{tag}", itype, 2, az=zone))
    k.create(plan_body(plan, itype, 2, duration="1m", autoPurchase=True,
                       startTimeAfter=ts(utcnow() + timedelta(seconds=20))))
    k.create(group_body(group, plan, itype, 2, nodeProvider="static"))
    block = first_block(k, plan)

    def held() -> list[dict] | None:
        nodes = k.get("nodes", None, "-l", f"hyperplan.dev/instance-group={group}")["items"]
        return nodes if len(nodes) == 2 and all(not n["spec"].get("unschedulable") for n in nodes) else None

    during = eventually(held, timeout=90, what="two workers adopted")
    status = wait_phase(k, "instancegroup", group, "Ready", timeout=30)
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
