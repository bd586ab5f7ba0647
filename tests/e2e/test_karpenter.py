"""A ``nodeProvider: karpenter`` group, with real Karpenter (its kwok provider) launching the nodes.

One scenario, step by step on one UltraServer block (docs/karpenter.md, "What the tests prove"):

1. the block starts: the group's slots become NodeClaims, Karpenter launches them, and the group
   is Ready with 2 active nodes and the UltraServer's spare, each Node tied to its claim (owner
   reference and providerID), with the UltraServer topology and roles, capacity type ``reserved``;
2. a NodeClaim made outside hyperplan, its Node carrying the group's label and a slot's node id:
   reported (``UnrecordedNodes``, Warning ``NodeNotOwned``), not counted, not deleted;
3. an active node fails: the spare is promoted and the failed node's NodeClaim is replaced (deleted;
   a claim for the next generation launched);
4. Karpenter killed with -9 mid-launch (a new slot's claim is Launched, its Node not made yet, the
   node class delaying registration) and started again: the claim never gets its Node, the
   operator deletes it after its launch timeout and makes the slot's claim again; no slot gets two
   Nodes, and no claim is left that the record does not hold;
5. the block ends: every node is drained at the termination time, then the NodeClaims are gone.

hyperplan itself killed with -9 while a karpenter group's claims are being made is in
test_restart.py (it kills the shared operator, after every scenario).

Then, once the first wave is done (it touches the node class every karpenter group shares), why
claims do not launch (a late scenario): a group in a zone Karpenter's instance types do not offer
says so and makes no claim; a group whose claims were made while Karpenter was down, its node
class then deleted, sees Karpenter delete them, says the node class is missing and makes no claim
while it is; the node class created as `hyperplan dev up --karpenter` creates it, the group goes
Ready without a restart of anything. The node class itself is never made by these tests: the
plane's Karpenter makes it, as `hyperplan dev up --karpenter` does.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import timedelta

from hyperplan_dev import karpenter as karpenter_plane
from tests.e2e.conftest import KARPENTER_ZONES
from tests.e2e.scenarios import Context, events_for, late_scenario, parse_ts, scenario, ts, utcnow
from tests.kube import eventually

API = "hyperplan.dev/v1alpha1"
ITYPE = "ml.p6e-gb200.36xlarge"
US_TYPE = "ml.u-p6e-gb200x72"
ZONE = "us-karp-a"
GROUP_LABEL = "hyperplan.dev/instance-group"
NODE_ID = "hyperplan.dev/node-id"
ROLE = "hyperplan.dev/role"
CLAIMS = ("nodeclaims.karpenter.sh",)


def nodes_of(k, group: str) -> dict[str, dict]:
    return {n["metadata"]["name"]: n for n in k.get("nodes", None, "-l", f"{GROUP_LABEL}={group}")["items"]}


def claims_of(k, group: str) -> dict[str, dict]:
    return {c["metadata"]["name"]: c for c in k.get(*CLAIMS, None, "-l", f"{GROUP_LABEL}={group}")["items"]}


def _ready(node: dict | None) -> dict | None:
    return next((c for c in ((node or {}).get("status") or {}).get("conditions", []) if c["type"] == "Ready"), None)


def _fail(kube, node: str) -> None:
    when = ts(utcnow())
    kube.core.patch_node_status(node, {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "HyperplanTest", "message": "set by the e2e test",
         "lastHeartbeatTime": when, "lastTransitionTime": when}]}})


def _status(k, group: str) -> dict:
    return k.get("instancegroup", group).get("status") or {}


def _ready_with(k, group: str, active: int, spares: int) -> dict | None:
    s = _status(k, group)
    return s if (s.get("phase"), s.get("readyCount"), s.get("spareCount")) == ("Ready", active, spares) else None


def _nodeclass_delay(k, delay: str) -> None:
    k.run("patch", f"kwoknodeclasses.{karpenter_plane.NODECLASS_GROUP}", "default",
          "--type=merge", "-p", json.dumps({"spec": {"nodeRegistrationDelay": delay}}))


def forged_claim(name: str, group: str, node_id: str) -> dict:
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "labels": {GROUP_LABEL: group, NODE_ID: node_id}},
            "spec": {"nodeClassRef": {"group": karpenter_plane.NODECLASS_GROUP, "kind": karpenter_plane.NODECLASS_KIND,
                                      "name": "default"},
                     "expireAfter": "Never",
                     "requirements": [
                         {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [ITYPE]},
                         {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
                         {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["reserved"]}]}}


def _claims_of_slots(k, group: str) -> Counter:
    """Node ids of the group's live Nodes: a slot with two is a duplicate."""
    return Counter(n["metadata"]["labels"].get(NODE_ID) for n in nodes_of(k, group).values()
                   if not n["metadata"].get("deletionTimestamp"))


@scenario
def karpenter_group(ctx: Context) -> dict:
    k, tag = ctx.kubectl, uuid.uuid4().hex[:5]
    name = f"kp-{tag}"
    out: dict = {"group": name}
    k.create({"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": name},
              "spec": {"instanceType": ITYPE, "ultraServerType": US_TYPE, "availabilityZone": ZONE,
                       "instanceCount": 18, "trainingPlanSelector": {"matchLabels": {"e2e-scenario": name}}}})
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": name, "labels": {"e2e-scenario": name}},
              "spec": {"ultraServerType": US_TYPE, "ultraServerCount": 1, "targetResource": "hyperpod-cluster",
                       "duration": "5m", "autoPurchase": True, "startTimeAfter": ts(utcnow() + timedelta(seconds=20))}})
    k.create({"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": name},
              "spec": {"trainingPlanRef": name, "instanceType": ITYPE, "instanceCount": 2, "nodeProvider": "karpenter",
                       "healthCheck": {"graceSeconds": 3, "maxUnhealthy": 2, "rebootBudget": 0}}})

    # 1. The block starts: Ready, each Node launched by Karpenter for one of the group's claims.
    out["ready"] = eventually(lambda: _ready_with(k, name, 2, 1), timeout=180, what="karpenter group Ready")
    out["block"] = k.get("trainingplan", name)["status"]["reservedCapacity"][0]
    out["nodes"], out["claims"] = nodes_of(k, name), claims_of(k, name)

    # 2. A claim made outside hyperplan, whose Node says it is the group's and one of its slots.
    some_slot = next(iter(out["nodes"].values()))["metadata"]["labels"][NODE_ID]
    forged = f"forged-{tag}"
    k.create(forged_claim(forged, name, some_slot))
    forged_node = eventually(lambda: (c := k.get_or_none(*CLAIMS, forged)) and (c.get("status") or {}).get("nodeName"),
                             timeout=60, what="the forged claim's Node registered")
    out["forged_condition"] = eventually(
        lambda: next((c for c in _status(k, name).get("conditions", []) if c["type"] == "UnrecordedNodes"), None),
        timeout=30, what="the group reporting the forged node")
    time.sleep(3)  # a few more passes
    out["forged_status"] = _status(k, name)
    out["forged_claim_kept"] = k.get_or_none(*CLAIMS, forged) is not None
    out["forged_node"] = k.get_or_none("node", forged_node)
    out["forged_warnings"] = [e["message"] for e in events_for(k, name) if e.get("reason") == "NodeNotOwned"]
    k.delete(*CLAIMS, forged, "--wait=true", "--timeout=60s")
    out["forged_cleared"] = eventually(
        lambda: not any(c["type"] == "UnrecordedNodes" for c in _status(k, name).get("conditions", [])),
        timeout=60, what="the condition gone with the forged node")

    # 3. An active node fails: its spare is promoted, its claim replaced.
    nodes = nodes_of(k, name)
    victim = sorted(n for n, node in nodes.items() if node["metadata"]["labels"][ROLE] == "active")[0]
    spare = next(n for n, node in nodes.items() if node["metadata"]["labels"][ROLE] == "spare")
    victim_claim = next(ref["name"] for ref in nodes[victim]["metadata"]["ownerReferences"] if ref["kind"] == "NodeClaim")
    out.update(victim=victim, spare=spare, victim_claim=victim_claim,
               victim_id=nodes[victim]["metadata"]["labels"][NODE_ID])

    def failed_and_acted():
        n = k.get_or_none("node", victim)
        if n is not None and (_ready(n) or {}).get("reason") != "HyperplanTest":
            _fail(ctx.kube, victim)  # KWOK's heartbeat may write back Ready=True
        return k.get_or_none(*CLAIMS, victim_claim) is None and k.get_or_none("node", victim) is None
    _fail(ctx.kube, victim)
    eventually(failed_and_acted, timeout=90, interval=0.5, what="the failed node's claim replaced")
    out["promoted"] = k.get("node", spare)
    out["after_failure"] = eventually(lambda: _ready_with(k, name, 2, 1), timeout=90, what="Ready again with a spare")
    out["nodes_after_failure"], out["claims_after_failure"] = nodes_of(k, name), claims_of(k, name)

    # 4. Karpenter killed mid-launch: one more active node, its claim Launched, no Node yet.
    _nodeclass_delay(k, "60s")
    before = set(claims_of(k, name))
    k.run("patch", "instancegroup", name, "--type=merge", "-p", json.dumps({"spec": {"instanceCount": 3}}))
    launched = eventually(lambda: next((c for n, c in claims_of(k, name).items() if n not in before
                                        and (c.get("status") or {}).get("providerID")), None),
                          timeout=60, interval=0.2, what="the new claim Launched")
    state = karpenter_plane.Karpenter(ctx.plane).state()
    os.killpg(state.pid, signal.SIGKILL)
    out["killed_claim"] = launched["metadata"]["name"]
    _nodeclass_delay(k, "0s")
    restarted = karpenter_plane.Karpenter(ctx.plane, zones=(*karpenter_plane.ZONES, *KARPENTER_ZONES))
    eventually(lambda: not restarted.running(), timeout=10, what="karpenter gone")
    restarted.start()
    out["relaunched"] = eventually(lambda: _ready_with(k, name, 3, 1), timeout=120, what="Ready with 3 after the kill")
    out["killed_claim_after"] = k.get_or_none(*CLAIMS, out["killed_claim"])
    out["slots_after_kill"] = _claims_of_slots(k, name)
    out["claims_after_kill"] = claims_of(k, name)
    out["record_after_kill"] = _status(k, name).get("nodes") or []
    out["claim_events"] = [e["message"] for e in events_for(k, name) if e.get("reason") == "NodeClaimDeleted"]

    # 5. The block ends: drained at the termination time, then the claims go.
    block = out["block"]
    termination, end = parse_ts(block["terminationTime"]), parse_ts(block["endTime"])
    out["gone_at"] = eventually(lambda: not claims_of(k, name) and not nodes_of(k, name) and utcnow(),
                                timeout=(end - utcnow()).total_seconds() + 60, interval=0.5, what="the claims gone")
    out["termination"], out["end"] = termination, end
    out["drain_events"] = [e["reason"] for e in events_for(k, name)]
    k.delete("instancegroup", name, "--wait=true", "--timeout=60s")
    k.delete("trainingplan", name, "--wait=true", "--timeout=60s")
    k.delete("capacitypool", name)
    return out


def _launched(k, group: str) -> dict | None:
    return next((c for c in _status(k, group).get("conditions", []) if c["type"] == "NodesLaunched"), None)


def _objects(k, name: str, itype: str, zone: str, count: int) -> None:
    k.create({"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": name},
              "spec": {"instanceType": itype, "availabilityZone": zone, "instanceCount": count,
                       "trainingPlanSelector": {"matchLabels": {"e2e-scenario": name}}}})
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": name, "labels": {"e2e-scenario": name}},
              "spec": {"instanceType": itype, "instanceCount": count, "targetResource": "hyperpod-cluster",
                       "duration": "3m", "autoPurchase": True, "startTimeAfter": ts(utcnow() + timedelta(seconds=10))}})
    k.create({"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": name},
              "spec": {"trainingPlanRef": name, "instanceType": itype, "instanceCount": count,
                       "nodeProvider": "karpenter"}})


def _remove(k, name: str) -> None:
    k.delete("instancegroup", name, "--wait=true", "--timeout=90s")
    k.delete("trainingplan", name, "--wait=true", "--timeout=60s")
    k.delete("capacitypool", name)


def _status_message(kubeconfig, group: str) -> str:
    """The group's line of `hyperplan status -o json` (what the user sees of it)."""
    proc = subprocess.run([sys.executable, "-m", "hyperplan.cli", "status", "-o", "json"],
                          env={**os.environ, "KUBECONFIG": str(kubeconfig)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return next((g.get("message", "") for g in json.loads(proc.stdout)["groups"] if g["name"] == group), "")


def _failures(metrics: str, reason: str) -> float:
    m = re.search(rf'^hyperplan_karpenter_launch_failures_total{{reason="{reason}"}} (\S+)$', metrics, re.M)
    return float(m.group(1)) if m else 0.0


@late_scenario
def karpenter_launch_failures(ctx: Context) -> dict:
    k, tag = ctx.kubectl, uuid.uuid4().hex[:5]
    itype, out = "ml.p5.48xlarge", {}
    node_classes = f"kwoknodeclasses.{karpenter_plane.NODECLASS_GROUP}"
    out["node_class_at_start"] = k.get_or_none(node_classes, karpenter_plane.NODE_CLASS)  # the plane's Karpenter made it

    # 1. A zone Karpenter's instance types do not offer: said before any claim is made.
    far = f"kpzone-{tag}"
    _objects(k, far, itype, f"us-nowhere-{tag}", 2)
    out["zone_condition"] = eventually(lambda: (c := _launched(k, far)) and c["reason"] == "NotOffered" and c,
                                       timeout=90, what="NodesLaunched=False NotOffered")
    time.sleep(12)  # a few more looks (every 5 s)
    out["zone_claims"] = claims_of(k, far)
    out["zone_warnings"] = [e for e in events_for(k, far) if e.get("reason") == "NotOffered"]
    out["zone_status_message"] = _status_message(ctx.plane.kubeconfig, far)
    _remove(k, far)

    # 2. Claims made while Karpenter is down, the node class then deleted, Karpenter back: it
    #    deletes the claims it cannot launch; the group says why and makes none while the cause stands.
    name = f"kpclass-{tag}"
    zones = (*karpenter_plane.ZONES, *KARPENTER_ZONES)
    karpenter = karpenter_plane.Karpenter(ctx.plane, zones=zones)
    deleted_before = _failures(ctx.metrics(), "NodeClaimDeletedBeforeLaunch")
    karpenter.stop()
    try:
        _objects(k, name, itype, "us-karp-b", 2)
        made = eventually(lambda: len(c := claims_of(k, name)) == 2 and c, timeout=90, interval=0.2,
                          what="the group's claims made while Karpenter is down")
        out["made_while_down"] = sorted(made)
        k.delete(node_classes, karpenter_plane.NODE_CLASS, "--wait=true", "--timeout=30s")
        karpenter.start(node_class=False)
        reasons: set[str] = set()

        def said_and_gone():
            c = _launched(k, name)
            if c:
                reasons.add(c["reason"])
            left = set(out["made_while_down"]) & set(claims_of(k, name))
            return not left and c is not None and c["reason"] == "NodeClassNotFound" and c
        out["class_condition"] = eventually(said_and_gone, timeout=60, interval=0.2,
                                            what="Karpenter's deletes seen, NodesLaunched=False NodeClassNotFound")
        out["reasons_seen"] = reasons
        time.sleep(12)  # more looks: no claim while the node class is missing
        out["class_claims"] = claims_of(k, name)
        out["class_warnings"] = [e for e in events_for(k, name) if e.get("reason") == "NodeClassNotFound"]
        out["class_status_message"] = _status_message(ctx.plane.kubeconfig, name)
        metrics = ctx.metrics()
        out["deleted_counted"] = _failures(metrics, "NodeClaimDeletedBeforeLaunch") - deleted_before
        out["class_counted"] = _failures(metrics, "NodeClassNotFound")
        out["karpenter_log"] = karpenter.log_file.read_text(errors="replace")

        # 3. The cause fixed as `hyperplan dev up --karpenter` fixes it: Ready, nothing restarted.
        operator_pid = ctx.operator.proc.pid
        karpenter_pid = karpenter.state().pid
        karpenter.ensure_node_class()
        out["ready"] = eventually(lambda: _ready_with(k, name, 2, 0), timeout=90, what="Ready once the node class exists")
        out["condition_after"] = _launched(k, name)
        out["restarted"] = (ctx.operator.proc.pid, karpenter.state().pid) != (operator_pid, karpenter_pid)
    finally:
        karpenter.start()  # running, with its node class, for the scenarios after this one
    _remove(k, name)
    eventually(lambda: not claims_of(k, name), timeout=60, what="the claims gone")
    return out


def _record(scenarios) -> dict:
    return scenarios["karpenter_group"].result(timeout=900)


def test_a_block_start_makes_a_ready_karpenter_group_with_ultraserver_labels_and_a_spare(scenarios) -> None:
    r = _record(scenarios)
    nodes, claims = r["nodes"], r["claims"]
    assert len(nodes) == 3 and len(claims) == 3
    roles = Counter(n["metadata"]["labels"][ROLE] for n in nodes.values())
    assert roles == {"active": 2, "spare": 1}
    by_uid = {c["metadata"]["uid"]: c for c in claims.values()}
    record = {e["name"]: e for e in r["ready"]["nodes"]}
    for name, node in nodes.items():
        labels = node["metadata"]["labels"]
        (owner,) = [ref for ref in node["metadata"]["ownerReferences"] if ref["kind"] == "NodeClaim"]
        claim = by_uid[owner["uid"]]
        assert claim["status"]["providerID"] == node["spec"]["providerID"] and claim["status"]["nodeName"] == name
        assert "karpenter.sh/nodepool" not in claim["metadata"].get("labels", {})  # no NodePool to disrupt it
        assert claim["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
        assert claim["spec"]["expireAfter"] == "Never"
        assert record[name]["uid"] == node["metadata"]["uid"]  # the record holds the Node ...
        assert record[name]["nodeClaim"] == {"name": claim["metadata"]["name"], "uid": owner["uid"]}  # ... and its claim
        assert labels["karpenter.sh/capacity-type"] == "reserved"
        assert labels.get("kubernetes.io/hostname") != labels["hyperplan.dev/node-id"]  # its own, not the slot's
        assert (labels["topology.kubernetes.io/zone"], labels["node.kubernetes.io/instance-type"]) == (ZONE, ITYPE)
        assert labels["topology.k8s.aws/ultraserver-id"] and labels["hyperplan.dev/reserved-capacity"] == r["block"]["id"]
        spare_taint = {"key": "hyperplan.dev/spare", "value": "true", "effect": "NoSchedule"}
        assert (spare_taint in (node["spec"].get("taints") or [])) == (labels[ROLE] == "spare")
        assert (_ready(node) or {}).get("status") == "True"


def test_a_node_karpenter_launched_outside_hyperplan_is_reported_and_not_adopted(scenarios) -> None:
    r = _record(scenarios)
    condition = r["forged_condition"]
    assert (condition["status"], condition["reason"]) == ("True", "NodeNotOwned")
    assert (r["forged_status"]["readyCount"], r["forged_status"]["spareCount"]) == (2, 1)
    assert len(r["forged_status"]["nodes"]) == 3  # the record did not take it
    assert r["forged_claim_kept"] and r["forged_node"] is not None
    assert not r["forged_node"]["spec"].get("unschedulable")  # left alone
    assert len(r["forged_warnings"]) == 1
    assert r["forged_cleared"]


def test_a_failed_node_has_its_spare_promoted_and_its_nodeclaim_replaced(scenarios) -> None:
    r = _record(scenarios)
    promoted = r["promoted"]["metadata"]["labels"]
    assert (promoted[ROLE], promoted["hyperplan.dev/replaces"]) == ("active", r["victim_id"])  # by node id
    assert r["victim"] not in r["nodes_after_failure"] and r["victim_claim"] not in r["claims_after_failure"]
    assert len(r["nodes_after_failure"]) == 3 and len(r["claims_after_failure"]) == 3
    made = [n for n in r["nodes_after_failure"].values() if n["metadata"]["labels"]["hyperplan.dev/generation"] == "1"]
    assert len(made) == 1 and made[0]["metadata"]["labels"][ROLE] == "spare"  # the backfill is the new spare


def test_karpenter_killed_mid_launch_converges_with_no_duplicate_and_no_orphan(scenarios) -> None:
    r = _record(scenarios)
    assert r["killed_claim_after"] is None, "the claim whose Node never came is still there"
    assert any(r["killed_claim"].startswith(m.split(":")[0]) or "launch timeout" in m for m in r["claim_events"])
    assert all(count == 1 for count in r["slots_after_kill"].values()), r["slots_after_kill"]
    assert sum(r["slots_after_kill"].values()) == 4
    recorded = {e["nodeClaim"]["name"] for e in r["record_after_kill"]}
    live = {n for n, c in r["claims_after_kill"].items() if not c["metadata"].get("deletionTimestamp")}
    assert live == recorded  # every live claim of the group is the record's, and each entry's claim lives


def test_the_block_end_drains_then_the_nodeclaims_are_gone(scenarios) -> None:
    r = _record(scenarios)
    assert r["termination"] <= r["gone_at"] <= r["end"] + timedelta(seconds=5), (r["termination"], r["gone_at"], r["end"])
    assert "Draining" in r["drain_events"] and "NodeRemoved" in r["drain_events"]


def test_hyperplan_killed_while_its_nodeclaims_are_made_converges(scenarios, late_scenarios, operator, crds,
                                                                  karpenter) -> None:
    """kill -9 of the operator at the block start, while a karpenter group's 8 claims are being
    made, then a restart: every slot gets exactly one claim and one Node, and no claim is left
    that the record does not hold (a claim made before the kill, whose answer was never recorded,
    is found again by its nonce). Runs after every scenario: it kills the shared operator."""
    for future in [*scenarios.values(), *late_scenarios.values()]:
        future.exception(timeout=900)
    k, tag = crds, uuid.uuid4().hex[:5]
    name, itype, zone = f"kpkill-{tag}", "ml.p5.48xlarge", "us-karp-b"
    k.create({"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": name},
              "spec": {"instanceType": itype, "availabilityZone": zone, "instanceCount": 8,
                       "trainingPlanSelector": {"matchLabels": {"e2e-scenario": name}}}})
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": name, "labels": {"e2e-scenario": name}},
              "spec": {"instanceType": itype, "instanceCount": 8, "targetResource": "hyperpod-cluster", "duration": "2m",
                       "autoPurchase": True, "startTimeAfter": ts(utcnow() + timedelta(seconds=15))}})
    k.create({"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": name},
              "spec": {"trainingPlanRef": name, "instanceType": itype, "instanceCount": 8, "nodeProvider": "karpenter"}})
    block = eventually(lambda: ((k.get("trainingplan", name).get("status") or {}).get("reservedCapacity") or [None])[0],
                       timeout=60, what="plan bought")
    start = parse_ts(block["startTime"])
    eventually(lambda: utcnow() >= start or claims_of(k, name), timeout=90, interval=0.02, what="block start")
    eventually(lambda: claims_of(k, name), timeout=30, interval=0.02, what="the first claims")
    operator.kill_and_restart()  # while the claims are being made
    status = eventually(lambda: _ready_with(k, name, 8, 0), timeout=120, what="Ready after the restart")
    slots = _claims_of_slots(k, name)
    assert len(slots) == 8 and all(c == 1 for c in slots.values()), slots
    live = {n for n, c in claims_of(k, name).items() if not c["metadata"].get("deletionTimestamp")}
    assert live == {e["nodeClaim"]["name"] for e in status["nodes"]}
    assert len(live) == 8
    k.delete("instancegroup", name, "--wait=true", "--timeout=90s")
    # The group goes once its claims are deleted; Karpenter's finalizers hold them a moment longer.
    eventually(lambda: not claims_of(k, name) and not nodes_of(k, name), timeout=60, what="the claims and Nodes gone")
    k.delete("trainingplan", name, "--wait=true", "--timeout=60s")
    k.delete("capacitypool", name)


def _launch_record(late_scenarios) -> dict:
    return late_scenarios["karpenter_launch_failures"].result(timeout=900)


def test_the_plane_karpenter_makes_the_default_node_class(late_scenarios) -> None:
    assert _launch_record(late_scenarios)["node_class_at_start"] is not None


def test_a_zone_karpenter_does_not_offer_is_said_before_any_claim(late_scenarios) -> None:
    r = _launch_record(late_scenarios)
    c = r["zone_condition"]
    assert c["status"] == "False" and "not in zone us-nowhere-" in c["message"], c
    assert r["zone_claims"] == {}
    assert len(r["zone_warnings"]) == 1 and r["zone_warnings"][0]["type"] == "Warning"  # once, not per look
    assert "NotOffered" in r["zone_status_message"]


def test_a_missing_node_class_is_said_and_stops_the_claims_until_it_is_created(late_scenarios) -> None:
    r = _launch_record(late_scenarios)
    c = r["class_condition"]
    assert c["status"] == "False" and "KWOKNodeClass default" in c["message"] and "does not exist" in c["message"]
    assert r["deleted_counted"] == 2, r["karpenter_log"][-3000:]  # Karpenter deleted both claims before launch
    assert "failed launching nodeclaim" in r["karpenter_log"]
    assert r["class_claims"] == {}  # none made again while the node class is missing
    assert len(r["class_warnings"]) == 1
    assert r["class_counted"] >= 1
    assert "NodeClassNotFound" in r["class_status_message"]


def test_a_group_whose_claims_failed_goes_ready_once_the_node_class_exists(late_scenarios) -> None:
    r = _launch_record(late_scenarios)
    assert r["ready"]["phase"] == "Ready" and r["ready"]["readyCount"] == 2
    assert r["condition_after"] is None
    assert not r["restarted"]
