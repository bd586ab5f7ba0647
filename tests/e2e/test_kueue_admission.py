"""hyperplan as Kueue's AdmissionCheck controller, end to end with the real Kueue (demo profile).

Kueue v0.17 runs with the plane; the operator is its own process. Every scenario has its own
ResourceFlavor, ClusterQueue, LocalQueue, namespace and AdmissionCheck, and an instance type no
other scenario uses (offerings come from every pool of a type). Jobs are plain ``batch/v1``
Jobs with a ``kueue.x-k8s.io/queue-name`` label, as a user writes them. KWOK runs their pods
but never ends them: a test ends a pod the way a kubelet would, by writing ``Succeeded`` into
its status.

1. ``gap``: a plan of two 1-minute blocks with a gap; a Job whose maximum execution time does
   not fit in what is left of the first block waits through it (check ``Retry``, "next block ...
   starts ...") and runs in the second.
2. ``two_azs``: a ``training-job`` plan whose blocks are in two AZs, back to back, with a
   keep-alive: the Job's nodes appear in the running block's AZ, a second Job reuses them after
   the first finishes, they go once the keep-alive has passed; a third Job with no declared time
   runs in the first block, is asked to checkpoint at the lead (pod annotation), is requeued
   through its check at the termination time, and runs again in the other AZ when the second
   block starts.
3. The AdmissionCheck is ``Active=True`` for an existing plan and ``Active=False`` with a
   reason for a missing one.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from tests.e2e.scenarios import Context, Recorder, events_for, parse_ts, pool_body, scenario, ts, utcnow
from tests.kube import Kubectl, eventually

API = "hyperplan.dev/v1alpha1"
KUEUE = "kueue.x-k8s.io/v1beta2"
CONTROLLER = "hyperplan.dev/training-plan"
TOLERANCE = timedelta(seconds=4)  # a state change seen by a poll of kubectl on a loaded machine


# ----------------------------------------------------------------------- Kueue objects as a user writes them


def kueue_setup(k: Kubectl, tag: str, itype: str, plan: str) -> dict[str, str]:
    """A namespace, AdmissionCheck, ResourceFlavor, ClusterQueue and LocalQueue of this scenario."""
    names = {"ns": f"adm-{tag}", "check": f"adm-{tag}", "flavor": f"adm-{tag}", "cq": f"adm-{tag}",
             "lq": f"adm-{tag}"}
    k.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": names["ns"]}})
    k.create({"apiVersion": KUEUE, "kind": "AdmissionCheck", "metadata": {"name": names["check"]},
              "spec": {"controllerName": CONTROLLER,
                       "parameters": {"apiGroup": "hyperplan.dev", "kind": "TrainingPlan", "name": plan}}})
    k.create({"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": names["flavor"]},
              "spec": {"nodeLabels": {"node.kubernetes.io/instance-type": itype}}})
    k.create({"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": names["cq"]},
              "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": names["ns"]}},
                       "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                           {"name": names["flavor"], "resources": [{"name": "cpu", "nominalQuota": 64},
                                                                   {"name": "memory", "nominalQuota": "256Gi"}]}]}],
                       "admissionChecksStrategy": {"admissionChecks": [{"name": names["check"]}]}}})
    k.create({"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": names["lq"], "namespace": names["ns"]},
              "spec": {"clusterQueue": names["cq"]}})
    return names


def job_body(name: str, ns: str, queue: str, pods: int, max_exec: int | None = None) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": queue}
    if max_exec is not None:
        labels["kueue.x-k8s.io/max-exec-time-seconds"] = str(max_exec)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                     # docs/admission.md: at the termination time the drain's evictions and Kueue's
                     # suspension come in no set order; a pod evicted first must spend no retry.
                     "podFailurePolicy": {"rules": [
                         {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
                     "template": {"spec": {"restartPolicy": "Never", "containers": [
                         {"name": "train", "image": "registry.example/train:1",
                          "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}}


def workload_of(k: Kubectl, ns: str, job: str) -> dict | None:
    for wl in k.get("workloads.kueue.x-k8s.io", None, "-n", ns)["items"]:
        if any(o.get("kind") == "Job" and o.get("name") == job for o in wl["metadata"].get("ownerReferences") or []):
            return wl
    return None


def check_entry(k: Kubectl, ns: str, job: str, check: str) -> tuple[str, str] | None:
    wl = workload_of(k, ns, job)
    entry = next((c for c in ((wl or {}).get("status") or {}).get("admissionChecks") or []
                  if c.get("name") == check), None)
    return (entry["state"], entry.get("message", "")) if entry else None


def job_pods(k: Kubectl, ns: str, job: str) -> list[dict]:
    return k.get("pods", None, "-n", ns, "-l", f"job-name={job}")["items"]


def running_pods(k: Kubectl, ns: str, job: str, count: int) -> list[dict] | None:
    pods = [p for p in job_pods(k, ns, job) if (p.get("status") or {}).get("phase") == "Running"
            and p["spec"].get("nodeName")]
    return pods if len(pods) == count else None


def node_labels(k: Kubectl, name: str) -> dict[str, str]:
    return k.get("node", name)["metadata"].get("labels") or {}


def finish_pods(ctx: Context, ns: str, job: str) -> None:
    """End the Job's pods successfully, as a kubelet reports a container that exited 0."""
    now = ts(utcnow())
    for pod in job_pods(ctx.kubectl, ns, job):
        ctx.kube.core.patch_namespaced_pod_status(pod["metadata"]["name"], ns, {"status": {
            "phase": "Succeeded",
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}],
            "containerStatuses": [{"name": "train", "image": "registry.example/train:1", "imageID": "",
                                   "ready": False, "restartCount": 0,
                                   "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                                            "startedAt": now, "finishedAt": now}}}]}})


def plan_nodes(k: Kubectl, plan: str) -> list[dict]:
    return k.get("nodes", None, "-l", f"hyperplan.dev/training-plan={plan},hyperplan.dev/workload")["items"]


def workload_nodes(k: Kubectl, plan: str, ns: str, job: str, count: int = 2) -> dict[str, dict[str, str]] | None:
    """The plan's nodes labelled for the Job's workload (name -> labels), once there are ``count``
    of them and the Job's ``count`` live pods all run on them."""
    wl = workload_of(k, ns, job)
    if wl is None:
        return None
    value = f"{ns}.{wl['metadata']['name']}"
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in plan_nodes(k, plan)
             if n["metadata"]["labels"].get("hyperplan.dev/workload") == value}
    pods = [p for p in job_pods(k, ns, job) if not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") in ("Pending", "Running")]
    running = {p["spec"].get("nodeName") for p in pods if p["status"].get("phase") == "Running"}
    ok = len(nodes) == count and len(pods) == count and all(p["status"].get("phase") == "Running" for p in pods)
    return nodes if ok and running <= set(nodes) else None


def active_condition(k: Kubectl, check: str) -> dict:
    obj = k.get("admissionchecks.kueue.x-k8s.io", check)
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Active"), {})


def buy(k: Kubectl, plan: str, blocks: int, timeout: float = 60) -> list[dict]:
    return eventually(lambda: (s := k.get("trainingplan", plan).get("status") or {}).get("phase")
                      in ("Scheduled", "Active") and len(s.get("reservedCapacity") or []) == blocks
                      and s["reservedCapacity"], timeout=timeout, what=f"plan {plan} bought with {blocks} blocks")


def wait_until(moment, what: str) -> None:
    eventually(lambda: utcnow() >= moment, timeout=max(5.0, (moment - utcnow()).total_seconds() + 5),
               interval=0.2, what=what)


# ----------------------------------------------------------------------- 1. waits through a gap's first block


@scenario
def kueue_gap(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    itype, plan = f"ml.kqgap-{tag}.xlarge", f"kq-gap-{tag}"
    t0 = utcnow().replace(microsecond=0)
    start = t0 + timedelta(seconds=30)
    # A busy window forces the 2-minute plan into two 1-minute blocks with a gap.
    k.create(pool_body(f"kq-gap-{tag}", itype, 2, unavailable=[
        {"start": ts(start + timedelta(seconds=70)), "end": ts(start + timedelta(seconds=100)), "instanceCount": 2}]))
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": plan},
              "spec": {"instanceType": itype, "instanceCount": 2, "targetResource": "training-job",
                       "duration": "2m", "startTimeAfter": ts(start), "autoPurchase": True,
                       "endTimeBefore": ts(t0 + timedelta(minutes=10))}})
    names = kueue_setup(k, tag, itype, plan)
    first, second = buy(k, plan, 2)
    first_term, second_start = parse_ts(first["terminationTime"]), parse_ts(second["startTime"])
    # The Job's maximum execution time (45 s) fits in a whole block (50 s before its termination),
    # but not in what is left of the first one 10 s after it started.
    wait_until(parse_ts(first["startTime"]) + timedelta(seconds=10), "10 s into the first block")
    states = Recorder(lambda: check_entry(k, names["ns"], "train", names["check"]), interval=0.2).start()
    suspended = Recorder(lambda: k.get("job", "train", "-n", names["ns"])["spec"].get("suspend"), interval=0.3)
    k.create(job_body("train", names["ns"], names["lq"], 2, max_exec=45))
    suspended.start()
    pods = eventually(lambda: running_pods(k, names["ns"], "train", 2), timeout=180, interval=1,
                      what="the Job's 2 pods Running")
    seen_running = utcnow()
    nodes = {p["spec"]["nodeName"]: node_labels(k, p["spec"]["nodeName"]) for p in pods}
    wl = workload_of(k, names["ns"], "train")
    out = {"names": names, "first": first, "second": second, "states": states.stop(),
           "suspended": suspended.stop(), "seen_running": seen_running, "nodes": nodes,
           "workload": wl, "events": [(e["reason"], e["message"]) for e in events_for(k, wl["metadata"]["name"])],
           "first_termination": first_term, "second_start": second_start,
           "active": active_condition(k, names["check"])}
    return out


def test_workload_waits_through_the_first_block_and_runs_in_the_second(scenarios) -> None:
    r = scenarios["kueue_gap"].result(timeout=600)
    second_start = r["second_start"]
    assert parse_ts(r["second"]["startTime"]) > parse_ts(r["first"]["endTime"]), "a gap between the blocks"
    states = [(when, value) for when, value in r["states"] if value]
    retries = [(when, msg) for when, (state, msg) in states if state == "Retry"]
    assert retries, f"never Retry: {states}"
    when, message = retries[0]
    assert when < r["first_termination"], "told to wait while the first block still ran"
    assert f"starts {r['second']['startTime']}" in message and r["second"]["id"] in message, message
    assert "less than the maximum execution time 45s" in message, message
    ready = [when for when, (state, _) in states if state == "Ready"]
    assert ready, f"never Ready: {states}"
    assert ready[0] >= second_start - timedelta(seconds=1), (ready[0], second_start)
    assert ready[0] - second_start <= timedelta(seconds=15), "admitted soon after the block started"
    # The Job stayed suspended until then, and its pods run on nodes of the second block.
    unsuspended = [when for when, value in r["suspended"] if value is False]
    assert unsuspended and unsuspended[0] >= second_start - timedelta(seconds=1), r["suspended"]
    for name, labels in r["nodes"].items():
        assert labels["hyperplan.dev/reserved-capacity"] == r["second"]["id"], (name, labels)
        assert labels["topology.kubernetes.io/zone"] == r["second"]["availabilityZone"]
        assert labels["hyperplan.dev/workload"] == f"{r['names']['ns']}.{r['workload']['metadata']['name']}"
        # ... and under the key a kubelet cannot set on itself, which the pods are steered by
        assert labels["node-restriction.kubernetes.io/hyperplan-workload"] == labels["hyperplan.dev/workload"]
    reasons = [reason for reason, _ in r["events"]]
    assert "AdmissionCheckRetry" in reasons and "AdmissionCheckReady" in reasons, r["events"]
    ready_message = next(m for reason, m in r["events"] if reason == "AdmissionCheckReady")
    assert "maximum execution time 45s fits" in ready_message, ready_message
    assert r["active"].get("status") == "True", r["active"]


# ----------------------------------------------------------------------- 2. blocks in two AZs, keep-alive, reuse


@scenario
def kueue_two_azs(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    itype, plan = f"ml.kqaz-{tag}.xlarge", f"kq-az-{tag}"
    az_a, az_b = f"us-east-{tag}a", f"us-east-{tag}b"
    t0 = utcnow().replace(microsecond=0)
    start = t0 + timedelta(seconds=35 - (t0.second % 5))  # on the demo profile's 5 s start grid
    far = t0 + timedelta(minutes=30)
    # Pool a is free for the first two minutes only, pool b from then on: the 4-minute plan's best
    # offering is two minutes in each AZ, back to back (the first block leaves time for three Jobs
    # even on a loaded machine).
    k.create(pool_body(f"kq-az-{tag}-a", itype, 2, az=az_a, unavailable=[
        {"start": ts(start + timedelta(seconds=120)), "end": ts(far), "instanceCount": 2}]))
    k.create(pool_body(f"kq-az-{tag}-b", itype, 2, az=az_b, unavailable=[
        {"start": ts(t0), "end": ts(start + timedelta(seconds=120)), "instanceCount": 2}]))
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": plan},
              "spec": {"instanceType": itype, "instanceCount": 2, "targetResource": "training-job",
                       "duration": "4m", "startTimeAfter": ts(start), "autoPurchase": True,
                       "endTimeBefore": ts(far), "keepAlivePeriodSeconds": 12}})
    names = kueue_setup(k, tag, itype, plan)
    missing = f"adm-missing-{tag}"
    k.create({"apiVersion": KUEUE, "kind": "AdmissionCheck", "metadata": {"name": missing},
              "spec": {"controllerName": CONTROLLER,
                       "parameters": {"apiGroup": "hyperplan.dev", "kind": "TrainingPlan", "name": f"nope-{tag}"}}})
    first, second = buy(k, plan, 2)
    ns, lq, check = names["ns"], names["lq"], names["check"]
    out: dict = {"names": names, "first": first, "second": second, "plan": plan}
    out["missing_active"] = eventually(lambda: active_condition(k, missing) or None, timeout=30,
                                       what="the missing plan's check Active condition")
    out["active"] = eventually(lambda: active_condition(k, check) or None, timeout=30, what="Active condition")

    # Job 1, created before the plan starts: admitted when the first block starts, nodes in its AZ.
    k.create(job_body("one", ns, lq, 2))
    eventually(lambda: running_pods(k, ns, "one", 2), timeout=120, interval=0.5, what="job one Running")
    out["one_running"] = utcnow()
    out["one_nodes"] = eventually(lambda: workload_nodes(k, plan, ns, "one"), timeout=10, what="job one's nodes")
    out["one_workload"] = workload_of(k, ns, "one")["metadata"]["name"]
    out["one_message"] = check_entry(k, ns, "one", check)

    # Job 1 finishes; its nodes stay warm, and job 2 runs on the same nodes.
    finish_pods(ctx, ns, "one")
    warm = eventually(lambda: (nodes := plan_nodes(k, plan)) and all(
        n["metadata"]["labels"].get("hyperplan.dev/workload") == "" for n in nodes) and nodes,
        timeout=60, what="job one's nodes kept warm")
    out["warm"] = {n["metadata"]["name"]: n["metadata"].get("annotations", {}).get("hyperplan.dev/keep-alive-until")
                   for n in warm}
    out["one_finished"] = utcnow()
    k.create(job_body("two", ns, lq, 2))
    eventually(lambda: running_pods(k, ns, "two", 2), timeout=60, interval=0.5, what="job two Running")
    out["two_nodes"] = eventually(lambda: workload_nodes(k, plan, ns, "two"), timeout=10, what="job two's nodes")
    finish_pods(ctx, ns, "two")
    out["two_finished"] = utcnow()
    # After the keep-alive the nodes go (before the block's termination time).
    eventually(lambda: not plan_nodes(k, plan), timeout=60, interval=0.5, what="warm nodes released")
    out["released"] = utcnow()

    # Job 3 declares no time: it runs in the first block until its termination time, is then
    # evicted through its check (Retry), and runs again in the second block, in the other AZ.
    states = Recorder(lambda: check_entry(k, ns, "three", check), interval=0.2).start()
    k.create(job_body("three", ns, lq, 2))
    eventually(lambda: running_pods(k, ns, "three", 2), timeout=60, interval=0.5, what="job three Running")
    out["three_first_nodes"] = eventually(lambda: workload_nodes(k, plan, ns, "three"), timeout=10,
                                          what="job three's nodes in the first block")
    # At the checkpoint lead (5 s under demo) before the termination time its pods are asked to checkpoint.
    def signalled() -> tuple | None:
        notes = [(p.get("metadata", {}).get("annotations") or {}).get("hyperplan.dev/block-termination-time")
                 for p in job_pods(k, ns, "three")]
        return (utcnow(), notes) if notes and all(notes) else None

    out["three_signal"] = eventually(signalled, timeout=180, interval=0.3, what="job three's pods signalled")
    wait_until(parse_ts(second["startTime"]), "the second block's start")
    try:
        out["three_second_nodes"] = eventually(
            lambda: (nodes := workload_nodes(k, plan, ns, "three")) and all(
                labels["hyperplan.dev/reserved-capacity"] == second["id"] for labels in nodes.values()) and nodes,
            timeout=60, interval=0.5, what="job three running on the second block's nodes")
    except AssertionError as e:
        wl = (workload_of(k, ns, "three") or {}).get("status") or {}
        raise AssertionError(f"{e}\nworkload: conditions {[(c['type'], c['status'], c.get('reason')) for c in wl.get('conditions') or []]}"
                             f" checks {wl.get('admissionChecks')} requeue {wl.get('requeueState')}\n"
                             f"check states: {states.changes[-6:]}\nplan nodes: {plan_nodes(k, plan)}") from None
    out["three_running_again"] = utcnow()
    out["three_states"] = states.stop()
    out["three_workload"] = workload_of(k, ns, "three")["metadata"]["name"]
    out["plan_events"] = [(e["reason"], e["message"]) for e in events_for(k, plan)]
    return out


def test_training_job_nodes_follow_the_active_block_az_and_are_reused_when_warm(scenarios) -> None:
    r = scenarios["kueue_two_azs"].result(timeout=600)
    first, second = r["first"], r["second"]
    assert first["availabilityZone"] != second["availabilityZone"], "the blocks are in two AZs"
    assert parse_ts(second["startTime"]) == parse_ts(first["endTime"]), "back to back"
    assert r["active"]["status"] == "True" and r["active"]["reason"] == "PlanFound", r["active"]
    assert r["missing_active"]["status"] == "False" and r["missing_active"]["reason"] == "PlanNotFound"
    assert "does not exist" in r["missing_active"]["message"]

    # Job 1: admitted into the first block, no declared time (told it drains at termination).
    assert r["one_running"] >= parse_ts(first["startTime"])
    assert r["one_message"][0] == "Ready"
    assert "will be drained at the block's termination time " + first["terminationTime"] in r["one_message"][1]
    assert len(r["one_nodes"]) == 2, "one node per pod (they ask for 1 CPU each, no accelerators)"
    for labels in r["one_nodes"].values():
        assert labels["topology.kubernetes.io/zone"] == first["availabilityZone"]
        assert labels["hyperplan.dev/reserved-capacity"] == first["id"]
        assert labels["hyperplan.dev/training-plan"] == r["plan"]
        assert labels["node.kubernetes.io/instance-type"].startswith("ml.kqaz-")
        assert labels["hyperplan.dev/workload"] == f"{r['names']['ns']}.{r['one_workload']}"

    # Kept warm for the keep-alive, then reused by job 2 (the same nodes, no new ones).
    for until in r["warm"].values():
        assert until is not None
        assert timedelta(0) < parse_ts(until) - r["one_finished"] <= timedelta(seconds=13)
    assert set(r["two_nodes"]) == set(r["one_nodes"]) == set(r["warm"])
    assert {labels["hyperplan.dev/workload"] for labels in r["two_nodes"].values()} != \
        {labels["hyperplan.dev/workload"] for labels in r["one_nodes"].values()}
    # Released once the keep-alive passed after job 2 finished, before the block's termination.
    assert timedelta(seconds=10) <= r["released"] - r["two_finished"] <= timedelta(seconds=30)
    assert r["released"] < parse_ts(first["terminationTime"])

    # Job 3: in the first block's AZ until its termination time, then requeued through its check,
    # and in the second block's AZ once that starts.
    assert len(r["three_first_nodes"]) == 2
    for labels in r["three_first_nodes"].values():
        assert labels["topology.kubernetes.io/zone"] == first["availabilityZone"]
    assert len(r["three_second_nodes"]) == 2
    for labels in r["three_second_nodes"].values():
        assert labels["topology.kubernetes.io/zone"] == second["availabilityZone"]
        assert labels["hyperplan.dev/reserved-capacity"] == second["id"]
    seen, notes = r["three_signal"]
    assert set(notes) == {first["terminationTime"]}, notes
    termination = parse_ts(first["terminationTime"])
    assert termination - timedelta(seconds=5) - TOLERANCE <= seen < termination, (seen, termination)
    states = [(when, value) for when, value in r["three_states"] if value]
    sequence = [state for _, (state, _) in states]
    assert "Retry" in sequence and sequence.index("Ready") < sequence.index("Retry"), sequence
    retry_at, retry_message = next((w, m) for w, (st, m) in states if st == "Retry")
    assert termination <= retry_at <= termination + 2 * TOLERANCE, (retry_at, termination)
    assert f"block {first['id']} reached its termination time {first['terminationTime']}" in retry_message
    assert f"starts {second['startTime']}" in retry_message, retry_message
    ready_again = [w for w, (st, _) in states if st == "Ready" and w > retry_at]
    assert ready_again and ready_again[0] >= parse_ts(second["startTime"]) - timedelta(seconds=1), states
    reasons = [reason for reason, _ in r["plan_events"]]
    for reason in ("NodeCreated", "NodeKeptWarm", "NodeReused", "NodeRemoved"):
        assert reason in reasons, (reason, r["plan_events"])


# ----------------------------------------------------------------------- 3. a hyperpod-cluster plan: room is the groups' Ready nodes


@scenario
def kueue_hyperpod(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    itype, plan, group = f"ml.kqhp-{tag}.xlarge", f"kq-hp-{tag}", f"kq-hp-{tag}"
    t0 = utcnow().replace(microsecond=0)
    k.create(pool_body(f"kq-hp-{tag}", itype, 4))
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": plan},
              "spec": {"instanceType": itype, "instanceCount": 4, "targetResource": "hyperpod-cluster",
                       "duration": "2m", "startTimeAfter": ts(t0 + timedelta(seconds=25)), "autoPurchase": True}})
    k.create({"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": group},
              "spec": {"trainingPlanRef": plan, "instanceType": itype, "instanceCount": 2}})
    names = kueue_setup(k, tag, itype, plan)
    ns, lq, check = names["ns"], names["lq"], names["check"]
    (block,) = buy(k, plan, 1)
    out: dict = {"block": block, "plan": plan, "group": group}
    k.create(job_body("wide", ns, lq, 2))
    eventually(lambda: running_pods(k, ns, "wide", 2), timeout=120, interval=0.5, what="job wide Running")
    out["wide_running"] = utcnow()
    out["wide_pod_nodes"] = {p["spec"]["nodeName"]: node_labels(k, p["spec"]["nodeName"])
                             for p in job_pods(k, ns, "wide")}
    # The group's 2 Ready nodes are held by job wide: one more pod must wait for room.
    k.create(job_body("extra", ns, lq, 1))
    out["extra_waiting"] = eventually(lambda: (e := check_entry(k, ns, "extra", check)) and e[0] == "Retry" and e,
                                      timeout=60, interval=0.3, what="job extra told to wait for room")
    finish_pods(ctx, ns, "wide")
    eventually(lambda: running_pods(k, ns, "extra", 1), timeout=90, interval=0.5, what="job extra Running")
    out["extra_pod_nodes"] = {p["spec"]["nodeName"]: node_labels(k, p["spec"]["nodeName"])
                              for p in job_pods(k, ns, "extra") if p["spec"].get("nodeName")}
    out["extra_entry"] = check_entry(k, ns, "extra", check)
    return out


def test_hyperpod_cluster_plan_admits_up_to_its_groups_ready_nodes(scenarios) -> None:
    r = scenarios["kueue_hyperpod"].result(timeout=600)
    assert r["wide_running"] >= parse_ts(r["block"]["startTime"])
    for labels in list(r["wide_pod_nodes"].values()) + list(r["extra_pod_nodes"].values()):
        assert labels["hyperplan.dev/instance-group"] == r["group"], "pods run on the plan's group nodes"
        assert labels["hyperplan.dev/training-plan"] == r["plan"]
    state, message = r["extra_waiting"]
    assert "2 Ready active node(s) of its instance groups" in message and "hold 2, 0 free" in message, message
    assert r["extra_entry"][0] == "Ready", r["extra_entry"]


# ----------------------------------------------------------------------- 4. a node forged as a warm job node


@scenario
def kueue_forged_warm_node(ctx: Context) -> dict:
    """A node an admin (or a kubelet) labels and annotates as a warm job node of a training-job
    plan, on the plan's own slot name: the plan's record does not hold it, so no workload goes to
    it and the operator never writes it; the workload gets a node hyperplan makes."""
    from hyperplan.planning import naming

    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    itype, plan = f"ml.kqfw-{tag}.xlarge", f"kq-fw-{tag}"
    t0 = utcnow().replace(microsecond=0)
    start = t0 + timedelta(seconds=25 - (t0.second % 5))
    k.create(pool_body(f"kq-fw-{tag}", itype, 2, az="us-east-1a"))
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": plan},
              "spec": {"instanceType": itype, "instanceCount": 2, "targetResource": "training-job",
                       "duration": "2m", "startTimeAfter": ts(start), "autoPurchase": True,
                       "endTimeBefore": ts(t0 + timedelta(minutes=30)), "keepAlivePeriodSeconds": 300}})
    names = kueue_setup(k, tag, itype, plan)
    (block,) = buy(k, plan, 1)
    forged = naming.node_name(plan, block["id"], "0")
    labels = {"hyperplan.dev/training-plan": naming.label_value(plan),
              "hyperplan.dev/reserved-capacity": naming.label_value(block["id"]),
              "hyperplan.dev/slot": "0", "hyperplan.dev/role": "active", "hyperplan.dev/workload": "",
              "node.kubernetes.io/instance-type": itype, "topology.kubernetes.io/zone": "us-east-1a"}
    annotations = {"kwok.x-k8s.io/node": "fake", "hyperplan.dev/keep-alive-until": ts(t0 + timedelta(hours=1))}
    k.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": forged, "labels": labels,
                                                              "annotations": annotations}})
    try:
        wait_until(parse_ts(block["startTime"]), "the block's start")
        ns, lq = names["ns"], names["lq"]
        k.create(job_body("one", ns, lq, 1))
        pods = eventually(lambda: running_pods(k, ns, "one", 1), timeout=120, interval=0.5, what="job one Running")
        after = k.get("node", forged)["metadata"]
        return {"forged": forged, "pod_node": pods[0]["spec"]["nodeName"],
                "labels_before": labels, "labels_after": after.get("labels") or {},
                "annotations_before": annotations, "annotations_after": after.get("annotations") or {},
                "plan_events": [(e["reason"], e["message"]) for e in events_for(k, plan)],
                "record": [e["name"] for e in (k.get("trainingplan", plan).get("status") or {}).get("jobNodes") or []]}
    finally:
        k.run("delete", "node", forged, "--wait=false", "--ignore-not-found")


def test_a_node_forged_as_a_warm_job_node_gets_no_workload_and_no_write(scenarios) -> None:
    r = scenarios["kueue_forged_warm_node"].result(timeout=300)
    assert r["pod_node"] != r["forged"]
    assert r["record"] == [r["pod_node"]]  # the node hyperplan made, recorded by name (and uid)
    for key, value in r["labels_before"].items():
        assert r["labels_after"].get(key) == value, key
    for key, value in r["annotations_before"].items():
        assert r["annotations_after"].get(key) == value, key
    not_owned = [m for reason, m in r["plan_events"] if reason == "NodeNotOwned"]
    assert any(r["forged"] in m for m in not_owned), r["plan_events"]
