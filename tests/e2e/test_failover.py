"""A failed node's pods leave before the node does (demo profile, late wave: x36 UltraServers).

A group of 4 on one x36 UltraServer (4 active + 1 spare) runs a Job of 4 pods, one per node
(4 GPUs each), whose ``podFailurePolicy`` ignores ``DisruptionTarget`` and whose backoffLimit is
0, so a single counted failure would fail it. A guarded pod (a PodDisruptionBudget refuses its
eviction) also runs on one of the Job's nodes. That node stops answering (Ready=False):

* after the grace the spare is promoted; then the Job's pod on the failed node is evicted
  through the Eviction API (``DisruptionTarget``, ``EvictionByEvictionAPI``);
* the guarded pod, whose eviction is refused, is marked Failed with hyperplan's
  ``DisruptionTarget`` (``DeletionByHyperplan``) and deleted once the dead node's eviction
  deadline (3 s) has passed;
* only when no pod is left on it is the failed node removed: no pod is ever bound to a node
  that no longer exists;
* the Job is back to 4 Running pods on the group's active nodes within grace + 10 s, and its
  ``status.failed`` stays 0.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from kubernetes import client

from tests.e2e.scenarios import Context, PodWatch, Recorder, events_for, late_scenario, ts, utcnow
from tests.kube import eventually

API = "hyperplan.dev/v1alpha1"
ITYPE = "ml.p6e-gb200.36xlarge"
US_TYPE = "ml.u-p6e-gb200x36"
GRACE = 5
NS = "default"


def _set_ready(kube, node: str, status: str, since: datetime) -> None:
    when = ts(since)
    kube.core.patch_node_status(node, {"status": {"conditions": [
        {"type": "Ready", "status": status, "reason": "HyperplanTest", "message": "set by the e2e test",
         "lastHeartbeatTime": when, "lastTransitionTime": when}]}})


def _nodes(kube, group: str) -> list:
    return kube.core.list_node(label_selector=f"hyperplan.dev/instance-group={group}").items


@late_scenario
def failed_node_evacuated(ctx: Context) -> dict:
    k, kube = ctx.kubectl, ctx.kube
    tag = uuid.uuid4().hex[:5]
    plan, group, job = f"fo-{tag}", f"fo-{tag}", f"fo-{tag}"
    k.create({"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": f"fo-{tag}"},
              "spec": {"instanceType": ITYPE, "ultraServerType": US_TYPE, "availabilityZone": f"us-fo-{tag}",
                       "instanceCount": 18}})
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": plan},
              "spec": {"ultraServerType": US_TYPE, "ultraServerCount": 1, "targetResource": "hyperpod-cluster",
                       "duration": "3m", "autoPurchase": True,
                       "startTimeAfter": ts(utcnow() + timedelta(seconds=15))}})
    k.create({"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": group},
              "spec": {"trainingPlanRef": plan, "instanceType": ITYPE, "instanceCount": 4,
                       "healthCheck": {"graceSeconds": GRACE, "maxUnhealthy": 1, "rebootBudget": 0}}})
    eventually(lambda: (k.get("instancegroup", group).get("status") or {}).get("phase") == "Ready",
               timeout=120, what="group Ready")
    k.apply({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job, "namespace": NS},
             "spec": {"parallelism": 4, "completions": 4, "backoffLimit": 0,
                      "podFailurePolicy": {"rules": [
                          {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
                      "template": {"metadata": {"labels": {"fo": tag}},
                                   "spec": {"restartPolicy": "Never",
                                            "nodeSelector": {"hyperplan.dev/instance-group": group},
                                            "containers": [{"name": "train", "image": "trainer", "resources": {
                                                "limits": {"nvidia.com/gpu": "4"}}}]}}}})

    def running() -> list[dict] | None:
        pods = [p for p in k.get("pods", None, "-n", NS, "-l", f"fo={tag}")["items"]
                if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
        return pods if len(pods) == 4 else None

    before = eventually(running, timeout=60, what="4 Job pods Running")
    roles = {n.metadata.name: n.metadata.labels["hyperplan.dev/role"] for n in _nodes(kube, group)}
    victim = sorted(p["spec"]["nodeName"] for p in before)[0]
    victim_pod = next(p["metadata"]["name"] for p in before if p["spec"]["nodeName"] == victim)
    # A pod whose eviction a PodDisruptionBudget refuses, on the same node.
    k.apply([
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": f"fo-{tag}", "namespace": NS},
         "spec": {"minAvailable": 1, "selector": {"matchLabels": {"guard": tag}}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"guarded-{tag}", "namespace": NS,
                                                         "labels": {"guard": tag}},
         "spec": {"nodeName": victim, "containers": [{"name": "c", "image": "sidecar"}]}},
    ])
    eventually(lambda: k.get("pod", f"guarded-{tag}", "-n", NS)["status"].get("phase") == "Running",
               timeout=60, what="guarded pod Running")
    eventually(lambda: (k.get("pdb", f"fo-{tag}", "-n", NS).get("status") or {}).get("currentHealthy") == 1,
               timeout=30, what="the PDB sees its pod")

    watches = [PodWatch(kube, f"fo={tag}").start(), PodWatch(kube, f"guard={tag}").start()]
    node_there = Recorder(lambda: any(n.metadata.name == victim for n in _nodes(kube, group)), interval=0.1).start()
    on_victim = Recorder(lambda: sorted(p.metadata.name for p in kube.core.list_namespaced_pod(
        NS, field_selector=f"spec.nodeName={victim}").items), interval=0.1).start()
    batch = client.BatchV1Api(kube.api)
    failed_job = Recorder(lambda: batch.read_namespaced_job_status(job, NS).status.failed or 0, interval=0.2).start()

    failed_at = utcnow()
    _set_ready(kube, victim, "False", failed_at)

    misses: list[datetime] = []  # when each look that found no spare yet began

    def promoted() -> datetime | None:
        began = utcnow()
        nodes = _nodes(kube, group)
        me = next((n for n in nodes if n.metadata.name == victim), None)
        if me is not None and "hyperplan.dev/replaces" not in str(me.metadata.labels) and any(
                c.type == "Ready" and c.status == "True" for c in me.status.conditions or []):
            _set_ready(kube, victim, "False", failed_at)  # KWOK's heartbeat may have written Ready back
        spare = next((n for n in nodes if (n.metadata.labels or {}).get("hyperplan.dev/replaces") == victim), None)
        if spare is None:
            misses.append(began)
            return None
        return utcnow()

    promoted_at = eventually(promoted, timeout=30, interval=0.1, what="spare promoted")
    # Promoted after the last look that missed it began (under load a look takes a while, so the
    # moment it was seen is later than the promotion by up to a look's time).
    promoted_after = misses[-1] if misses else failed_at

    def recovered() -> list[dict] | None:
        pods = running()
        return pods if pods and victim not in {p["spec"]["nodeName"] for p in pods} else None

    after = eventually(recovered, timeout=60, interval=0.2, what="4 Job pods Running again")
    recovered_at = utcnow()
    eventually(lambda: not any(n.metadata.name == victim for n in _nodes(kube, group)), timeout=30,
               what="failed node removed")
    eventually(lambda: utcnow() > recovered_at + timedelta(seconds=5), timeout=10, what="a few seconds more")
    out = {"victim": victim, "victim_pod": victim_pod, "guarded": f"guarded-{tag}", "roles": roles,
           "failed_at": failed_at, "promoted_at": promoted_at, "promoted_after": promoted_after, "recovered_at": recovered_at,
           "after": after, "nodes_after": {n.metadata.name: dict(n.metadata.labels) for n in _nodes(kube, group)},
           "job_pods": watches[0].stop(), "guarded_pods": watches[1].stop(),
           "node_there": node_there.stop(), "on_victim": on_victim.stop(), "job_failed": failed_job.stop(),
           "job_status": k.get("job", job, "-n", NS)["status"],
           "group_events": [(e["reason"], e.get("message", "")) for e in events_for(k, group)]}
    k.run("delete", "job", job, "-n", NS, "--wait=false")
    return out


def _record(late_scenarios) -> dict:
    return late_scenarios["failed_node_evacuated"].result(timeout=900)


def _first(seen, name: str, predicate) -> datetime | None:
    return next((when for when, _, pod in seen if pod["metadata"]["name"] == name and predicate(pod)), None)


def _disruption(pod: dict) -> dict | None:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == "DisruptionTarget"),
                None)


def test_the_failed_nodes_pods_leave_after_the_promotion_and_before_the_node(late_scenarios) -> None:
    r = _record(late_scenarios)
    node_gone = next(when for when, there in r["node_there"] if not there)
    # The Job's pod: evicted through the Eviction API once the spare serves.
    evicted = _first(r["job_pods"], r["victim_pod"], lambda p: p["metadata"].get("deletionTimestamp")
                     or _disruption(p))
    assert evicted is not None, "the Job's pod on the failed node was never evicted"
    reason = next(_disruption(p)["reason"] for _, _, p in r["job_pods"]
                  if p["metadata"]["name"] == r["victim_pod"] and _disruption(p))
    assert reason == "EvictionByEvictionAPI"
    # Seen evicted no earlier than the promotion could have happened (both are seen by polling).
    assert r["promoted_after"] - timedelta(seconds=1) <= evicted, (evicted, r["promoted_after"], r["promoted_at"])
    assert evicted < node_gone
    # The guarded pod: its eviction refused, forced out after the dead node's deadline (3 s).
    forced = [p for _, _, p in r["guarded_pods"] if _disruption(p)
              and _disruption(p)["reason"] == "DeletionByHyperplan"]
    assert forced, [(_disruption(p), p["status"].get("phase")) for _, _, p in r["guarded_pods"]]
    assert forced[-1]["status"]["phase"] == "Failed"
    forced_at = _first(r["guarded_pods"], r["guarded"], lambda p: _disruption(p) is not None)
    assert forced_at >= evicted + timedelta(seconds=2), (forced_at, evicted)
    assert forced_at < node_gone
    t0 = r["failed_at"]
    print(f"[failover] after the failure: promoted {(r['promoted_at'] - t0).total_seconds():.1f} s, pod evicted "
          f"{(evicted - t0).total_seconds():.1f} s, guarded pod forced out {(forced_at - t0).total_seconds():.1f} s, "
          f"node removed {(node_gone - t0).total_seconds():.1f} s")
    assert any(reason == "PodsEvicted" for reason, _ in r["group_events"])
    assert any(reason == "PodsDeleted" and r["guarded"] in message for reason, message in r["group_events"])


def test_no_pod_is_ever_bound_to_a_node_that_no_longer_exists(late_scenarios) -> None:
    r = _record(late_scenarios)
    node_gone = next(when for when, there in r["node_there"] if not there)
    pods_gone = next(when for when, pods in r["on_victim"] if not pods)
    # Two recorders poll apart (every 0.1 s each): the node now goes in the pass right after its pods
    # (no second grace for a marked node), so their first sights may cross by up to a poll.
    assert pods_gone <= node_gone + timedelta(seconds=0.3)
    assert r["on_victim"][-1][1] == []
    assert all(not pods for when, pods in r["on_victim"] if when >= node_gone)


def test_the_job_is_whole_again_within_the_grace_plus_10_s_and_spends_no_retry(late_scenarios) -> None:
    r = _record(late_scenarios)
    took = (r["recovered_at"] - r["failed_at"]).total_seconds()
    print(f"[failover] the Job back to 4 Running {took:.1f} s after the failure (bound: {GRACE + 10} s)")
    assert took <= GRACE + 10, f"4 Running again {took:.1f} s after the failure"
    assert {r["nodes_after"][p["spec"]["nodeName"]]["hyperplan.dev/role"] for p in r["after"]} == {"active"}
    assert max(failed for _, failed in r["job_failed"]) == 0
    assert r["job_status"].get("failed", 0) == 0
    assert not any(c["type"] == "Failed" and c["status"] == "True" for c in r["job_status"].get("conditions", []))
