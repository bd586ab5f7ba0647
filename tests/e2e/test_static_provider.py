"""The static node provider: existing nodes lent to a group for a block, then handed back.

KWOK nodes labelled ``node-restriction.kubernetes.io/hyperplan-pool=free`` play the static pool
(kind's workers, say).
Two scenarios:

* ``static_nodes``: one free node runs a pod labelled as the operator (the labels the chart
  sets), one is cordoned by an admin, two are lendable. The group of three (with its own
  ``labels`` and ``taints``) gets exactly the two lendable ones and a ``NoFreeNode`` warning
  that says why the others were left out; when the admin uncordons the cordoned one, the group
  adopts it. While they are held, another "operator replica" lands on one node, a DaemonSet
  runs on all, an admin cordons another one, which runs a workload pod. At the termination
  time the drain evicts the workload pod only; the nodes are handed back before the block ends
  with none of the group's labels, taints or annotations; the nodes hyperplan cordoned are
  schedulable again, the one the admin cordoned is not.
* ``static_race``: two groups on one plan race at the same block start for the same four free
  nodes: each gets two distinct nodes, and the operator counts no reconcile error.
* ``static_ultraservers`` (late: it buys x36 UltraServers, as other late scenarios do): free
  nodes of three cloud UltraServers (``topology.k8s.aws/ultraserver-id`` as EKS sets it, 9 each,
  their names interleaved) and a group of 16 on a plan of two x36 UltraServers: each of the plan's
  UltraServers gets its 9 nodes (8 and a spare) from one cloud UltraServer, a different one each,
  the group's record keeps each node's cloud id, and hand-back gives it back.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta

from hyperplan.api.vocabulary import LABEL_POOL, LABEL_TRUSTED_GROUP
from tests.e2e.scenarios import (
    Context, events_for, first_block, group_body, late_scenario, parse_ts, plan_body, pool_body, scenario, ts, utcnow,
    wait_phase,
)
from tests.kube import Kubectl, eventually

# The labels the chart puts on the operator's pods (charts/hyperplan/templates/_helpers.tpl).
OPERATOR_LABELS = {"app.kubernetes.io/name": "hyperplan", "app.kubernetes.io/instance": "hyperplan",
                   "app.kubernetes.io/component": "operator", "app.kubernetes.io/managed-by": "Helm"}
GROUP_TAINT_KEY = "example.com/dedicated"


def free_node(name: str, itype: str, zone: str, labels: dict | None = None, cordoned: bool = False) -> dict:
    """A free node of the static pool, as an admin labels kind's workers; KWOK keeps it Ready."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {LABEL_POOL: "free", "node.kubernetes.io/instance-type": itype,
                                    "topology.kubernetes.io/zone": zone, **(labels or {})}},
            "spec": {"unschedulable": cordoned}}


def pod_on(name: str, ns: str, node: str, labels: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "operator"}],
                     "tolerations": [{"operator": "Exists"}]}}


def running(k: Kubectl, name: str, ns: str) -> dict | None:
    """The pod, once it is Running."""
    proc = k.run("get", "pod", name, "-n", ns, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    pod = json.loads(proc.stdout)
    return pod if pod["status"].get("phase") == "Running" else None


@scenario
def static_nodes(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    itype, zone, plan, group, ns = (f"ml.static-{tag}.xlarge", f"us-east-{tag}", f"static-{tag}", f"static-{tag}",
                                    f"static-{tag}")
    w_op, w_late, w_team, w_plain = (f"worker-{tag}-{s}" for s in ("op", "late", "team", "plain"))
    k.apply([free_node(w_op, itype, zone), free_node(w_late, itype, zone, cordoned=True),
             free_node(w_team, itype, zone, labels={"team": "platform"}), free_node(w_plain, itype, zone)])
    k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    # The operator runs on one free worker (as if scheduled there before the pool was labelled).
    k.apply(pod_on("hyperplan-op", ns, w_op, OPERATOR_LABELS))
    eventually(lambda: running(k, "hyperplan-op", ns), timeout=60, what="operator pod Running on its node")
    before = {n: k.get("node", n) for n in (w_op, w_late, w_team, w_plain)}

    k.create(pool_body(f"static-{tag}", itype, 4, az=zone))
    k.create(plan_body(plan, itype, 4, duration="2m", autoPurchase=True,
                       startTimeAfter=ts(utcnow() + timedelta(seconds=20))))
    k.create(group_body(group, plan, itype, 3, nodeProvider="static", labels={"team": f"g-{tag}"},
                        taints=[{"key": GROUP_TAINT_KEY, "value": tag, "effect": "NoSchedule"}]))
    block = first_block(k, plan)

    def held(count: int):
        def check() -> list[dict] | None:
            nodes = k.get("nodes", None, "-l", f"hyperplan.dev/instance-group={group}")["items"]
            return nodes if len(nodes) == count else None
        return check

    during = eventually(held(2), timeout=90, what="the two lendable workers adopted")
    short = eventually(lambda: next((e["message"] for e in events_for(k, group) if e["reason"] == "NoFreeNode"),
                                    None), timeout=30, what="a NoFreeNode warning")
    k.run("uncordon", w_late)  # the admin is done with it: the group, woken by the change, takes it
    late = eventually(held(3), timeout=20, what="the uncordoned worker adopted")
    status = wait_phase(k, "instancegroup", group, "Ready", timeout=30)

    # While held: a second operator replica lands on one lent node (no affinity outside the
    # chart), a DaemonSet runs on all, an admin cordons another one, which runs a workload pod.
    k.apply(pod_on("hyperplan-replica", ns, w_team, OPERATOR_LABELS))
    k.apply(pod_on("trainer", ns, w_plain, {"app": "trainer"}))
    k.apply({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent", "namespace": ns},
             "spec": {"selector": {"matchLabels": {"app": f"agent-{tag}"}},
                      "template": {"metadata": {"labels": {"app": f"agent-{tag}"}},
                                   "spec": {"nodeSelector": {"node.kubernetes.io/instance-type": itype},
                                            "tolerations": [{"operator": "Exists"}],
                                            "containers": [{"name": "c", "image": "agent"}]}}}})
    k.run("cordon", w_plain)

    def agents() -> dict[str, str] | None:
        pods = k.get("pods", None, "-n", ns, "-l", f"app=agent-{tag}")["items"]
        on = {p["spec"].get("nodeName"): p["metadata"]["uid"] for p in pods
              if p["status"].get("phase") == "Running"}
        return on if {w_team, w_plain} <= set(on) else None

    agents_before = eventually(agents, timeout=60, what="DaemonSet pods Running on the lent nodes")
    replica = eventually(lambda: running(k, "hyperplan-replica", ns), timeout=60, what="replica Running")
    eventually(lambda: running(k, "trainer", ns), timeout=60, what="trainer Running")
    during_cordoned = k.get("node", w_plain)

    def signalled() -> dict | None:  # the checkpoint signal comes before the drain (docs/checkpoint.md)
        node = k.get("node", w_team)
        return node if any(c["type"] == "hyperplan.dev/BlockTerminating" for c in node["status"]["conditions"]) \
            else None

    during_signal = eventually(signalled, timeout=120, interval=0.25, what="the checkpoint signal on a lent node")

    def handed_back() -> bool:
        return all(k.get("node", n)["metadata"]["labels"].get(LABEL_POOL) == "free"
                   and "hyperplan.dev/instance-group" not in k.get("node", n)["metadata"]["labels"]
                   for n in (w_late, w_team, w_plain))

    eventually(handed_back, timeout=120, interval=0.5, what="the lent nodes handed back")
    back_at = utcnow()
    end = parse_ts(block["endTime"])
    eventually(lambda: utcnow() > end + timedelta(seconds=2), timeout=120, interval=1, what="block end")
    after = {n: k.get("node", n) for n in (w_op, w_late, w_team, w_plain)}
    pods = {p["metadata"]["name"]: p for p in k.get("pods", None, "-n", ns)["items"]}
    result = {"nodes": (w_op, w_late, w_team, w_plain), "before": before, "during": during, "status": status,
              "short": short, "late": late,
              "during_cordoned": during_cordoned, "during_signal": during_signal, "after": after, "group": group, "tag": tag,
              "block": block, "back_at": back_at, "replica": replica, "pods": pods,
              "agents_before": agents_before, "agents_after": agents(),
              "events": [(e["reason"], e["message"]) for e in events_for(k, group)],
              "node_events": {n: [(e["reason"], e["message"]) for e in events_for(k, n)]
                              for n in (w_late, w_team, w_plain)}}
    k.run("delete", "namespace", ns, "--wait=false")
    return result


def hyperplan_keys(d: dict) -> set[str]:
    return {key for key in d if key.startswith("hyperplan.dev/")}


def test_static_nodes_are_adopted_for_the_block_and_handed_back(scenarios) -> None:
    r = scenarios["static_nodes"].result(timeout=400)
    w_op, w_late, w_team, w_plain = r["nodes"]
    # The node running the operator and the cordoned one are left out; the two lendable ones are
    # lent, and the warning names the others and why.
    assert {n["metadata"]["name"] for n in r["during"]} == {w_team, w_plain}
    assert re.search(rf"no free node of .*: {w_late} is cordoned; {w_op} runs the operator$", r["short"]), r["short"]
    # Once uncordoned, the third worker is lent too; the operator's node never.
    assert {n["metadata"]["name"] for n in r["late"]} == {w_late, w_team, w_plain}
    for n in r["late"]:
        labels = n["metadata"]["labels"]
        assert labels[LABEL_POOL] == "held"
        assert labels[LABEL_TRUSTED_GROUP] == labels["hyperplan.dev/instance-group"]  # what pods may select by
        assert labels["hyperplan.dev/role"] == "active"
        assert labels["hyperplan.dev/node-health-status"] == "Schedulable"
        assert labels["team"] == f"g-{r['tag']}"
        assert (GROUP_TAINT_KEY, r["tag"], "NoSchedule") in {
            (t["key"], t.get("value"), t["effect"]) for t in n["spec"].get("taints", [])}
        assert "hyperplan.dev/lent" not in n["metadata"]["annotations"]  # the record is the group's, not the node's
        assert not n["spec"].get("unschedulable")
    assert r["status"]["readyCount"] == 3
    # The group's record: each lent node by name and uid, with what it looked like before.
    record = {e["name"]: e for e in r["status"]["nodes"]}
    assert {name: e["uid"] for name, e in record.items()} == {n["metadata"]["name"]: n["metadata"]["uid"]
                                                              for n in r["late"]}
    assert record[w_team]["lent"]["labels"]["team"] == "platform"
    assert "team" in record[w_plain]["lent"]["absentLabels"]
    assert [reason for reason, _ in r["events"]].count("NodeAdopted") == 3
    assert r["after"][w_op]["metadata"]["labels"] == r["before"][w_op]["metadata"]["labels"]
    assert not r["after"][w_op]["spec"].get("unschedulable")


def test_handed_back_nodes_carry_nothing_of_the_group(scenarios) -> None:
    r = scenarios["static_nodes"].result(timeout=400)
    _, w_late, w_team, w_plain = r["nodes"]
    for name in (w_late, w_team, w_plain):
        before, after = r["before"][name], r["after"][name]
        labels = after["metadata"]["labels"]
        assert hyperplan_keys(labels) == set() and labels[LABEL_POOL] == "free"
        assert LABEL_TRUSTED_GROUP not in labels
        # The group's own label is gone; the value an admin had set before adoption is back.
        assert labels.get("team") == before["metadata"]["labels"].get("team")
        assert {k: v for k, v in labels.items() if k != "kubernetes.io/hostname"} == \
            {k: v for k, v in before["metadata"]["labels"].items() if k != "kubernetes.io/hostname"}
        taints = after["spec"].get("taints") or []
        assert [t for t in taints if t["key"] == GROUP_TAINT_KEY or t["key"].startswith("hyperplan.dev/")] == []
        assert hyperplan_keys(after["metadata"].get("annotations") or {}) == set()
        # The checkpoint signal's node condition goes with the group.
        assert [c for c in after["status"]["conditions"] if c["type"].startswith("hyperplan.dev/")] == []
    assert any(c["type"] == "hyperplan.dev/BlockTerminating" and c["status"] == "True"
               for c in r["during_signal"]["status"]["conditions"])
    for name in (w_team, w_late):
        assert r["after"][name]["spec"].get("unschedulable") in (None, False), "hyperplan's cordon was not undone"
    assert r["during_cordoned"]["spec"]["unschedulable"] is True
    assert r["after"][w_plain]["spec"]["unschedulable"] is True, "the admin's cordon was undone"
    removed = {m.split(" drained")[0]: m for reason, m in r["events"] if reason == "NodeRemoved"}
    assert len(removed) == 3
    assert any(w_team in m and "uncordoned (hyperplan had cordoned it)" in m for m in removed.values())
    assert any(w_plain in m and "left cordoned (not cordoned by hyperplan)" in m for m in removed.values())
    for name in (w_late, w_team, w_plain):  # the node itself tells its story too
        assert [reason for reason, _ in r["node_events"][name]].count("NodeAdopted") == 1
        assert any(reason == "NodeRemoved" and "handed back to the free pool" in m
                   for reason, m in r["node_events"][name])


def test_the_drain_never_evicts_the_operator_and_waits_for_no_daemonset(scenarios) -> None:
    r = scenarios["static_nodes"].result(timeout=400)
    _, _, w_team, w_plain = r["nodes"]
    replica = r["pods"]["hyperplan-replica"]
    assert replica["metadata"]["uid"] == r["replica"]["metadata"]["uid"]
    assert not replica["metadata"].get("deletionTimestamp") and replica["status"]["phase"] == "Running"
    assert r["pods"]["hyperplan-op"]["status"]["phase"] == "Running"
    trainer = r["pods"].get("trainer")
    assert trainer is None or trainer["metadata"].get("deletionTimestamp"), "the workload pod was not evicted"
    # DaemonSet pods were left where they were, and did not hold the nodes until the block's end.
    assert r["agents_after"] is not None and r["agents_after"][w_team] == r["agents_before"][w_team]
    assert r["agents_after"][w_plain] == r["agents_before"][w_plain]
    assert r["back_at"] < parse_ts(r["block"]["endTime"])
    messages = " ".join(m for reason, m in r["events"] if reason == "NodeRemoved")
    assert re.search(r"left running: .*hyperplan-replica \(the operator's own pod\)", messages), messages


# --------------------------------------------------------------------------- racing groups


def reconcile_errors(metrics_text: str) -> float:
    m = re.search(r'^hyperplan_reconciles_total\{kind="InstanceGroup",result="error"\} (\S+)$', metrics_text,
                  flags=re.M)
    return float(m.group(1)) if m else 0.0


@scenario
def static_race(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    itype, zone, plan = f"ml.race-{tag}.xlarge", f"us-race-{tag}", f"race-{tag}"
    groups = [f"race-{tag}-a", f"race-{tag}-b"]
    names = [f"worker-{tag}-{i}" for i in range(4)]
    k.apply([free_node(n, itype, zone) for n in names])
    k.create(pool_body(f"race-{tag}", itype, 4, az=zone))
    k.create(plan_body(plan, itype, 4, duration="1m", autoPurchase=True,
                       startTimeAfter=ts(utcnow() + timedelta(seconds=20))))
    errors_before = reconcile_errors(ctx.operator.metrics())
    # Both groups exist before the block starts, so both reach for the free nodes at its start.
    k.apply([group_body(g, plan, itype, 2, nodeProvider="static") for g in groups])
    block = first_block(k, plan)
    statuses = {g: wait_phase(k, "instancegroup", g, "Ready", timeout=120) for g in groups}
    held = {g: sorted(n["metadata"]["name"] for n in
                      k.get("nodes", None, "-l", f"hyperplan.dev/instance-group={g}")["items"]) for g in groups}
    errors_after = reconcile_errors(ctx.operator.metrics())
    log = ctx.operator.log.read_text()
    end = parse_ts(block["endTime"])
    eventually(lambda: utcnow() > end + timedelta(seconds=2), timeout=120, interval=1, what="block end")
    after = {n: k.get("node", n)["metadata"]["labels"] for n in names}
    return {"names": names, "held": held, "statuses": statuses, "errors": (errors_before, errors_after),
            "log": [line for line in log.splitlines() if any(g in line for g in groups)], "after": after,
            "events": {g: [(e["reason"], e["message"]) for e in events_for(k, g)] for g in groups}}


def test_groups_racing_for_free_nodes_get_distinct_nodes_without_errors(scenarios) -> None:
    r = scenarios["static_race"].result(timeout=400)
    a, b = r["held"].values()
    assert len(a) == 2 and len(b) == 2 and not set(a) & set(b), r["held"]
    assert sorted(a + b) == sorted(r["names"])
    for status in r["statuses"].values():
        assert status["readyCount"] == 2
    before, after = r["errors"]
    assert after == before, f"reconcile errors went from {before} to {after}"
    loud = [line for line in r["log"] if " ERROR " in line or " WARNING " in line]
    assert loud == [], "\n".join(loud)
    for events in r["events"].values():
        assert [reason for reason, _ in events].count("NodeAdopted") == 2
        assert "NoFreeNode" not in [reason for reason, _ in events]
    for labels in r["after"].values():
        assert labels[LABEL_POOL] == "free" and "hyperplan.dev/instance-group" not in labels


# --------------------------------------------------------------------------- cloud UltraServers

GB200, X36, US_KEY = "ml.p6e-gb200.36xlarge", "ml.u-p6e-gb200x36", "topology.k8s.aws/ultraserver-id"


@late_scenario
def static_ultraservers(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    plan = group = f"sus-{tag}"
    k.create(pool_body(f"sus-{tag}", GB200, 18, az=f"us-sus-{tag}", ultraServerType=X36))
    k.create({"apiVersion": "hyperplan.dev/v1alpha1", "kind": "TrainingPlan", "metadata": {"name": plan},
              "spec": {"ultraServerType": X36, "ultraServerCount": 2, "targetResource": "hyperpod-cluster",
                       "duration": "2m", "autoPurchase": True,
                       "startTimeAfter": ts(utcnow() + timedelta(seconds=40))}})
    block = first_block(k, plan)
    # The free nodes, in the zone the plan was sold (another x36 pool's, perhaps), before the block starts.
    clouds = {f"sus-{tag}-{i:02d}": f"i-us-{tag}-{'abc'[i % 3]}" for i in range(27)}
    k.apply([free_node(n, GB200, block["availabilityZone"], labels={US_KEY: c}) for n, c in clouds.items()])
    k.create(group_body(group, plan, GB200, 16, nodeProvider="static"))
    status = wait_phase(k, "instancegroup", group, "Ready", timeout=150)
    held = {n["metadata"]["name"]: n["metadata"]["labels"]
            for n in k.get("nodes", None, "-l", f"hyperplan.dev/instance-group={group}")["items"]}

    def handed_back() -> dict | None:
        nodes = {n: k.get("node", n)["metadata"]["labels"] for n in held}
        return nodes if all(labels.get(LABEL_POOL) == "free" for labels in nodes.values()) else None

    after = eventually(handed_back, timeout=180, interval=0.5, what="the lent nodes handed back")
    for n in clouds:
        k.run("delete", "node", n, "--wait=false", check=False)
    return {"clouds": clouds, "held": held, "status": status, "after": after}


def test_each_ultraserver_of_a_static_group_is_one_cloud_ultraserver(late_scenarios) -> None:
    r = late_scenarios["static_ultraservers"].result(timeout=600)
    clouds, held = r["clouds"], r["held"]
    assert len(held) == 18, sorted(held)  # 8 active and a spare on each of the two
    came_from: dict[str, set[str]] = {}
    for name, labels in held.items():
        came_from.setdefault(labels[US_KEY], set()).add(clouds[name])  # hyperplan's id while lent
    assert len(came_from) == 2 and all(len(c) == 1 for c in came_from.values()), came_from
    assert len(set.union(*came_from.values())) == 2, came_from
    # The group's record keeps what each node carried, and hand-back gives it back.
    record = {e["name"]: e for e in r["status"]["nodes"]}
    assert {n: record[n]["lent"]["labels"][US_KEY] for n in held} == {n: clouds[n] for n in held}
    assert {n: labels[US_KEY] for n, labels in r["after"].items()} == {n: clouds[n] for n in held}
