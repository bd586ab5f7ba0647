"""Real kubelet nodes lent for a block: the two kind workers (the free static pool of
deploy/kind-config.yaml) are adopted by an InstanceGroup `nodeProvider: static` when its plan's
block starts, run a user's pods, are drained from the termination time (a PodDisruptionBudget
honoured up to the block's end) and handed back as they were found. The chart's two operator
replicas run on the control plane all along and are never evicted."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

import pytest

from hyperplan.api.vocabulary import LABEL_POOL, LABEL_TRUSTED_GROUP
from tests.kind import lending as L
from tests.kind.conftest import KindEnv
from tests.kube import eventually

TAINT_KEY = "example.com/dedicated"


def user_pod(name: str, ns: str, group: str, app: str) -> dict:
    """A pod of the pause image that selects the group's nodes and tolerates its taint."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
            "spec": {"nodeSelector": {LABEL_TRUSTED_GROUP: group},  # a key its kubelet cannot forge
                     "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                     "terminationGracePeriodSeconds": 2,
                     "containers": [{"name": "c", "image": L.PAUSE_IMAGE, "imagePullPolicy": "IfNotPresent"}]}}


def pod_state(kind: KindEnv, name: str, ns: str) -> dict | None:
    proc = kind.kubectl.run("get", "pod", name, "-n", ns, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)


def running(pod: dict | None) -> bool:
    return bool(pod) and pod["status"].get("phase") == "Running" and "deletionTimestamp" not in pod["metadata"]


@pytest.fixture(scope="module")
def lent(kind: KindEnv) -> dict:
    k = kind.kubectl
    tag = uuid.uuid4().hex[:5]
    name, ns = f"lend-{tag}", f"lend-{tag}"
    started = time.monotonic()

    def step(what: str) -> None:
        print(f"[lend] {what} ({time.monotonic() - started:.0f}s)", flush=True)

    eventually(lambda: L.in_free_pool(kind), timeout=120, what="both workers in the free pool")
    ops_before = L.settled_operator_pods(kind)
    before = {n: k.get("node", n) for n in kind.workers}
    k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        k.apply([L.pool(name), L.plan(name, "1m", start_in=25)])
        k.apply(L.group(name, name, 2, labels={"team": f"t-{tag}"},
                        taints=[{"key": TAINT_KEY, "value": tag, "effect": "NoSchedule"}]))
        # The user's work waits (Pending) for the group's nodes; the guarded pod's PDB allows no disruption.
        k.apply([{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                  "metadata": {"name": "guarded", "namespace": ns},
                  "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}},
                 user_pod("trainer", ns, name, "trainer"), user_pod("guarded", ns, name, "guarded")])
        block = L.first_block(kind, name)
        start, end = L.parse_ts(block["startTime"]), L.parse_ts(block["endTime"])
        termination = L.parse_ts(block["terminationTime"])
        step(f"bought: block {block['startTime']} .. {block['endTime']}, termination {block['terminationTime']}")

        during = eventually(lambda: (lambda ns_: ns_ if len(ns_) == 2 else None)(L.held_nodes(kind, name)),
                            timeout=90, interval=1, what="both workers adopted")
        adopted_at = L.utcnow()
        step("both workers adopted")
        # Both entries made (with the adopted node's uid), not the intent the pass writes before it
        # adopts (named by slot, holding the claim's digest), which a read between the two shows.
        records = eventually(lambda: (lambda rs: rs if len(rs) == 2 and all(r.get("uid") for r in rs) else None)(
            (k.get("instancegroup", name).get("status") or {}).get("nodes") or []),
            timeout=30, interval=1, what="both workers in the group's record")
        pods_running = eventually(
            lambda: (lambda ps: ps if all(running(p) for p in ps.values()) else None)(
                {p: pod_state(kind, p, ns) for p in ("trainer", "guarded")}),
            timeout=60, interval=1, what="the user's pods Running on the group's nodes")
        running_at = L.utcnow()
        step("user pods Running")

        evicted = eventually(lambda: (lambda p: L.utcnow() if not running(p) else None)(pod_state(kind, "trainer", ns)),
                             timeout=(termination - L.utcnow()).total_seconds() + 45, interval=0.5,
                             what="the trainer pod evicted")
        step("trainer evicted")
        # The PDB holds the guarded pod (and so its node) past the termination time.
        eventually(lambda: L.utcnow() > termination + timedelta(seconds=10), timeout=60, interval=0.5)
        guarded_late = pod_state(kind, "guarded", ns)
        guarded_node_late = k.get("node", guarded_late["spec"]["nodeName"])
        handed_back = eventually(lambda: L.utcnow() if L.in_free_pool(kind) else None,
                                 timeout=(end - L.utcnow()).total_seconds() + 30, interval=0.5,
                                 what="both workers handed back")
        step("both workers handed back")
        eventually(lambda: L.utcnow() > end + timedelta(seconds=2), timeout=60, interval=0.5)
        after = {n: k.get("node", n) for n in kind.workers}
        ops_after = L.operator_pods(kind)
        return {"records": records, "tag": tag, "name": name, "block": block, "start": start, "end": end,
                "termination": termination,
                "before": before, "during": during, "adopted_at": adopted_at, "pods_running": pods_running,
                "running_at": running_at, "evicted_at": evicted, "guarded_late": guarded_late,
                "guarded_node_late": guarded_node_late, "handed_back_at": handed_back, "after": after,
                "ops_before": ops_before, "ops_after": ops_after,
                "group_events": L.events_for(kind, name),
                "node_events": {n: L.events_for(kind, n) for n in kind.workers}}
    finally:
        k.run("delete", "namespace", ns, "--wait=false", check=False)
        L.remove(kind, ("instancegroup", name), ("trainingplan", name), ("capacitypool", name))
        eventually(lambda: L.in_free_pool(kind), timeout=120, what="both workers back in the free pool")
        step("cleaned up")


def test_both_workers_carry_the_groups_labels_and_run_the_users_pod(lent: dict, kind: KindEnv) -> None:
    assert sorted(n["metadata"]["name"] for n in lent["during"]) == sorted(kind.workers)
    assert lent["adopted_at"] >= lent["start"] - timedelta(seconds=1)
    for node in lent["during"]:
        labels = node["metadata"]["labels"]
        assert labels["team"] == f"t-{lent['tag']}"
        assert labels[LABEL_POOL] == "held"
        assert labels["hyperplan.dev/instance-group"] == lent["name"]
        assert labels[LABEL_TRUSTED_GROUP] == lent["name"]
        assert (TAINT_KEY, lent["tag"], "NoSchedule") in {
            (t["key"], t.get("value"), t["effect"]) for t in node["spec"].get("taints", [])}
        # what the node looked like is the operator's record (the group's status), not the node's
        assert "hyperplan.dev/lent" not in (node["metadata"].get("annotations") or {})
        assert not node["spec"].get("unschedulable")
    by_name = {r["name"]: r for r in lent["records"]}
    assert sorted(by_name) == sorted(kind.workers)
    for node in lent["during"]:
        assert by_name[node["metadata"]["name"]]["uid"] == node["metadata"]["uid"]
    for pod in lent["pods_running"].values():
        assert pod["spec"]["nodeName"] in kind.workers
        assert pod["status"]["containerStatuses"][0]["ready"] is True
    assert [r for r, _ in lent["group_events"]].count("NodeAdopted") == 2, lent["group_events"]


def test_the_drain_evicts_at_the_termination_time_and_honours_the_pdb_until_the_block_end(lent: dict) -> None:
    # The trainer ran until the termination time and was evicted then (not before, not long after).
    assert lent["running_at"] < lent["termination"]
    assert lent["termination"] - timedelta(seconds=2) <= lent["evicted_at"] <= lent["termination"] \
        + timedelta(seconds=20), (lent["evicted_at"], lent["termination"])
    # The guarded pod was still Running 10 s past it, on a node cordoned and still held.
    assert running(lent["guarded_late"]), lent["guarded_late"]["status"]
    node = lent["guarded_node_late"]
    assert node["spec"].get("unschedulable") is True
    assert node["metadata"]["labels"].get("hyperplan.dev/instance-group") == lent["name"]
    # And the nodes were handed back by the block's end (a second of slack for the last patch).
    assert lent["handed_back_at"] <= lent["end"] + timedelta(seconds=3), (lent["handed_back_at"], lent["end"])
    reasons = [r for r, _ in lent["group_events"]]
    assert "Draining" in reasons and reasons.count("NodeRemoved") == 2, lent["group_events"]


def test_after_the_block_the_workers_carry_nothing_of_the_group(lent: dict, kind: KindEnv) -> None:
    for name in kind.workers:
        before, after = lent["before"][name], lent["after"][name]
        labels = after["metadata"]["labels"]
        assert {k for k in labels if k.startswith("hyperplan.dev/")} == set()
        assert labels[LABEL_POOL] == "free" and LABEL_TRUSTED_GROUP not in labels
        assert labels == before["metadata"]["labels"]
        assert "team" not in labels
        assert [t for t in after["spec"].get("taints") or []
                if t["key"] == TAINT_KEY or t["key"].startswith("hyperplan.dev/")] == []
        assert {k for k in after["metadata"].get("annotations") or {} if k.startswith("hyperplan.dev/")} == set()
        assert not after["spec"].get("unschedulable")
        assert any(r == "NodeRemoved" and "handed back to the free pool" in m
                   for r, m in lent["node_events"][name]), lent["node_events"][name]


def test_the_operator_pods_were_never_evicted(lent: dict, kind: KindEnv) -> None:
    before, after = lent["ops_before"], lent["ops_after"]
    assert len(before) >= 2, before
    assert set(after) == set(before), (before, after)
    for uid, pod in after.items():
        assert pod["phase"] == "Running" and not pod["deleting"], pod
        assert pod["restarts"] == before[uid]["restarts"], (before[uid], pod)
        assert pod["node"] not in kind.workers, pod
