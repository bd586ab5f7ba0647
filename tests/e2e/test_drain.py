"""At the termination time nodes drain through the Eviction API: a PodDisruptionBudget holds a
pod until the block's end, and not a moment longer."""

from __future__ import annotations

import uuid
from datetime import timedelta

from tests.e2e.scenarios import (
    Context, Recorder, first_block, group_body, parse_ts, plan_body, pool_body, scenario, ts, utcnow, wait_phase,
)
from tests.kube import eventually


@scenario
def drain_respects_pdb(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    itype, plan, group = f"ml.pdb-{tag}.xlarge", f"pdb-{tag}", f"pdb-{tag}"
    k.create(pool_body(f"pdb-{tag}", itype, 2, az="us-east-1p"))
    k.create(plan_body(plan, itype, 2, duration="1m", autoPurchase=True,
                       startTimeAfter=ts(utcnow() + timedelta(seconds=15))))
    k.create(group_body(group, plan, itype, 2))
    block = first_block(k, plan)
    wait_phase(k, "instancegroup", group, "Ready")
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
    # Recorded until the bound the test allows after the end (the removal is at the end; a pass on the
    # busy 2-core machine with every scenario beside it has come 7 s late).
    eventually(lambda: utcnow() > end + timedelta(seconds=11), timeout=120, interval=1, what="block end")
    return {"block": block, "pods": pods.stop(), "node": node.stop(), "end": end,
            "termination": parse_ts(block["terminationTime"])}


def test_a_pdb_holds_its_pod_until_the_block_ends(scenarios) -> None:
    r = scenarios["drain_respects_pdb"].result(timeout=300)
    free_gone = next(when for when, names in r["pods"] if not any(n.startswith("free-") for n in names))
    # The free pod goes at the termination time, not before, and well before the block's end (20 s
    # later under the demo profile), when the guarded one goes. The bound after the termination is
    # generous: the recorder polls with kubectl, which a loaded machine slows by seconds.
    assert r["termination"] - timedelta(seconds=1) <= free_gone <= r["termination"] + timedelta(seconds=15)
    assert free_gone < r["end"]
    node_gone = next(when for when, present in r["node"] if not present)
    # The guarded node stays (its eviction refused) well past the termination time, and goes by the end.
    assert node_gone >= r["termination"] + timedelta(seconds=10)
    # (+10 s: the deletion is at the end; the kubectl recorder, a process per poll, has seen it 5.6 s
    # later on a machine loaded with benches beside the suite)
    assert node_gone <= r["end"] + timedelta(seconds=10)
