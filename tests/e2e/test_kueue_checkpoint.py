"""A Kueue Job with no declared time: admitted, asked to checkpoint at the lead, drained by the block's end.

The issue's e2e scenario 2, with the real Kueue v0.17 and the operator as its own process (demo
profile: a one-minute block terminates 20 s before its end, and the checkpoint signal comes 5 s
before that). A ``hyperpod-cluster`` plan with an InstanceGroup of two nodes; the scenario's own
AdmissionCheck, ResourceFlavor, ClusterQueue and LocalQueue; a Job of two pods with a
``kueue.x-k8s.io/queue-name`` label, no ``kueue.x-k8s.io/max-exec-time-seconds``, and the
downward API volume of docs/checkpoint.md. The pods never exit on their own (KWOK keeps them
Running), so what ends them is hyperplan: what a user sees is recorded from the Job's creation
to past the block's end:

* the Workload's check goes ``Ready`` with the message that it will be drained at the block's
  termination time, and the Job's pods run on the group's nodes;
* at the lead before the termination time each pod gets ``hyperplan.dev/block-termination-time``
  (RFC 3339, the termination time) and a Warning Event, each node the condition
  ``hyperplan.dev/BlockTerminating``;
* only from the termination time are the nodes cordoned and the pods evicted; the pods and the
  nodes are gone by the block's end;
* the Workload, whose block has no successor, gets its check ``Rejected`` at the termination
  time and Kueue deactivates it (docs/admission.md, "When the block ends"): evicted
  (``DeactivatedDueToAdmissionCheck``), not requeued, the Job suspended without a failed pod,
  and no pod of it comes back.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from kubernetes import client

from tests.e2e.scenarios import Context, Recorder, events_for, parse_ts, pool_body, scenario, ts, utcnow
from tests.kube import Kubectl, eventually

API = "hyperplan.dev/v1alpha1"
KUEUE = "kueue.x-k8s.io/v1beta2"
CONTROLLER = "hyperplan.dev/training-plan"
ANNOTATION = "hyperplan.dev/block-termination-time"
CONDITION = "hyperplan.dev/BlockTerminating"
LEAD = timedelta(seconds=5)  # the demo profile's checkpoint lead
SLACK = timedelta(seconds=4)  # a change seen by a 0.2 s poll on a heavily loaded machine


def kueue_objects(k: Kubectl, tag: str, itype: str, plan: str) -> dict[str, str]:
    """This scenario's namespace and Kueue objects: a check naming the plan, a flavor of its type."""
    name = f"kqck-{tag}"
    k.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    k.create({"apiVersion": KUEUE, "kind": "AdmissionCheck", "metadata": {"name": name},
              "spec": {"controllerName": CONTROLLER,
                       "parameters": {"apiGroup": "hyperplan.dev", "kind": "TrainingPlan", "name": plan}}})
    k.create({"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": name},
              "spec": {"nodeLabels": {"node.kubernetes.io/instance-type": itype}}})
    k.create({"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": name},
              "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}},
                       "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                           {"name": name, "resources": [{"name": "cpu", "nominalQuota": 16},
                                                        {"name": "memory", "nominalQuota": "64Gi"}]}]}],
                       "admissionChecksStrategy": {"admissionChecks": [{"name": name}]}}})
    k.create({"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": name, "namespace": name},
              "spec": {"clusterQueue": name}})
    return {"ns": name, "check": name, "queue": name}


def checkpointing_job(name: str, ns: str, queue: str, pods: int) -> dict:
    """A Job as docs/checkpoint.md writes it for Kueue: a queue, no maximum execution time, and the
    termination time readable in the container through a downward API volume, and the
    ``podFailurePolicy`` of deploy/examples/kueue/60-job.yaml."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": ns, "labels": {"kueue.x-k8s.io/queue-name": queue}},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                     # The drain's evictions and Kueue's deactivation both come at the termination
                     # time, in no set order: an evicted pod must not spend the Job's retry.
                     "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [
                         {"type": "DisruptionTarget"}]}]},
                     "template": {"spec": {
                         "restartPolicy": "Never",
                         "containers": [{"name": "train", "image": "registry.example/train:1",
                                         "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                                         "volumeMounts": [{"name": "hyperplan", "mountPath": "/etc/hyperplan",
                                                           "readOnly": True}]}],
                         "volumes": [{"name": "hyperplan", "downwardAPI": {"items": [
                             {"path": "block-termination-time",
                              "fieldRef": {"fieldPath": f"metadata.annotations['{ANNOTATION}']"}}]}}]}}}}


def bought_block(k: Kubectl, plan: str) -> dict:
    """The plan's one block, once it is bought."""
    return eventually(lambda: (s := k.get("trainingplan", plan).get("status") or {}).get("phase")
                      in ("Scheduled", "Active") and (s.get("reservedCapacity") or [None])[0],
                      timeout=60, what=f"plan {plan} bought")


@scenario
def kueue_checkpoint_drain(ctx: Context) -> dict:
    k, core, custom, batch = ctx.kubectl, ctx.kube.core, ctx.kube.custom, client.BatchV1Api(ctx.kube.api)
    tag = uuid.uuid4().hex[:5]
    itype, plan, group = f"ml.kqck-{tag}.xlarge", f"kq-ck-{tag}", f"kq-ck-{tag}"
    t0 = utcnow().replace(microsecond=0)
    k.create(pool_body(f"kq-ck-{tag}", itype, 2, az="us-east-1d"))
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": plan},
              "spec": {"instanceType": itype, "instanceCount": 2, "targetResource": "hyperpod-cluster",
                       "duration": "1m", "startTimeAfter": ts(t0 + timedelta(seconds=25)), "autoPurchase": True}})
    k.create({"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": group},
              "spec": {"trainingPlanRef": plan, "instanceType": itype, "instanceCount": 2}})
    names = kueue_objects(k, tag, itype, plan)
    ns, check = names["ns"], names["check"]
    block = bought_block(k, plan)

    def workload() -> dict | None:
        items = custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", ns, "workloads")["items"]
        return next((w for w in items if any(o.get("kind") == "Job" and o.get("name") == "train"
                                             for o in w["metadata"].get("ownerReferences") or [])), None)

    def workload_state():
        wl = workload()
        if wl is None:
            return None
        status = wl.get("status") or {}
        entry = next((c for c in status.get("admissionChecks") or [] if c.get("name") == check), {})
        conditions = tuple(sorted((c["type"], c["status"], c.get("reason", ""))
                                  for c in status.get("conditions") or []))
        return entry.get("state"), entry.get("message", ""), wl["spec"].get("active", True), conditions

    def pods():
        return tuple(sorted(
            (p.metadata.name, p.spec.node_name, p.status.phase, (p.metadata.annotations or {}).get(ANNOTATION),
             p.metadata.deletion_timestamp is not None)
            for p in core.list_namespaced_pod(ns, label_selector="job-name=train").items))

    def nodes():
        out = []
        for n in core.list_node(label_selector=f"hyperplan.dev/instance-group={group}").items:
            c = next((c for c in n.status.conditions or [] if c.type == CONDITION), None)
            out.append((n.metadata.name, bool(n.spec.unschedulable), (c.status, c.reason) if c else None))
        return tuple(sorted(out))

    recorders = {"states": Recorder(workload_state, interval=0.2).start(),
                 "suspended": Recorder(lambda: batch.read_namespaced_job("train", ns).spec.suspend, interval=0.3),
                 "pods": Recorder(pods, interval=0.2).start(),
                 "nodes": Recorder(nodes, interval=0.2).start()}
    k.create(checkpointing_job("train", ns, names["queue"], 2))
    recorders["suspended"].start()
    end = parse_ts(block["endTime"])
    eventually(lambda: utcnow() >= end + timedelta(seconds=8), timeout=(end - utcnow()).total_seconds() + 30,
               interval=0.5, what="a few seconds past the block's end")
    out = {key: r.stop() for key, r in recorders.items()}
    wl = workload()
    job = batch.read_namespaced_job("train", ns)
    out["job_conditions"] = sorted((c.type, c.status, c.reason or "") for c in job.status.conditions or [])
    out["job_status"] = {"active": job.status.active, "failed": job.status.failed,
                         "succeeded": job.status.succeeded}
    out.update(block=block, plan=plan, group=group, names=names, workload=wl,
               group_nodes_after=[n.metadata.name for n in core.list_node(
                   label_selector=f"hyperplan.dev/instance-group={group}").items],
               workload_events=[(e["reason"], e["type"], e.get("message", "")) for e in
                                events_for(k, wl["metadata"]["name"])] if wl else [])
    pod_names = {p[0] for _, value in out["pods"] for p in value or ()}
    out["pod_events"] = {p: [(e["reason"], e["type"], e.get("message", "")) for e in events_for(k, p)]
                         for p in pod_names}
    return out


def _first(changes, predicate):
    return next((when for when, value in changes if value is not None and predicate(value)), None)


def _result(scenarios) -> dict:
    return scenarios["kueue_checkpoint_drain"].result(timeout=600)


def test_a_job_with_no_declared_time_is_admitted_and_told_it_drains_at_the_termination_time(scenarios) -> None:
    r = _result(scenarios)
    block, termination = r["block"], parse_ts(r["block"]["terminationTime"])
    ready = [(when, message) for when, v in r["states"] if v and v[0] == "Ready" for message in [v[1]]]
    assert ready, f"the check never went Ready: {r['workload']}"
    ready_at, message = ready[0]
    assert parse_ts(block["startTime"]) - timedelta(seconds=1) <= ready_at < termination, (ready_at, block)
    assert f"admitted into block {block['id']} of plan {r['plan']}" in message, message
    assert ("no maximum execution time declared: it will be drained at the block's termination time "
            f"{block['terminationTime']}") in message, message
    # The Job stayed suspended until then and its pods ran on the group's nodes.
    unsuspended = _first(r["suspended"], lambda v: v is False)
    assert unsuspended is not None and unsuspended >= ready_at - timedelta(seconds=1), r["suspended"]
    group_nodes = {name for _, value in r["nodes"] for name, _, _ in value or ()}
    assert len(group_nodes) == 2, r["nodes"]
    running = [value for _, value in r["pods"]
               if value and len(value) == 2 and all(p[2] == "Running" for p in value)]
    assert running, f"the Job's 2 pods never ran together: {r['pods']}"
    assert {p[1] for p in running[0]} <= group_nodes, (running[0], group_nodes)


def test_the_pods_and_nodes_are_signalled_at_the_lead(scenarios) -> None:
    r = _result(scenarios)
    termination = parse_ts(r["block"]["terminationTime"])
    signal_at = termination - LEAD
    # Every running pod of the Job carries the annotation, equal to the termination time.
    annotated = _first(r["pods"], lambda v: len(v) == 2 and all(p[3] for p in v))
    assert annotated is not None, f"the pods were never both annotated: {r['pods']}"
    assert signal_at - timedelta(seconds=1) <= annotated <= signal_at + SLACK, (annotated, signal_at)
    values = {p[3] for _, v in r["pods"] for p in v or () if p[3]}
    assert {parse_ts(v) for v in values} == {termination}, values
    assert all(v.endswith("Z") and "T" in v for v in values), values  # RFC 3339, UTC
    # Not one of them before the lead.
    early = _first(r["pods"], lambda v: any(p[3] for p in v))
    assert early >= signal_at - timedelta(seconds=1), (early, signal_at)
    # A Warning Event on each signalled pod (a pod the Job controller creates in place of an
    # evicted one, before Kueue suspends the Job, was never signalled and stays Pending).
    signalled = {p[0] for _, v in r["pods"] for p in v or () if p[3]}
    assert len(signalled) == 2, r["pods"]
    for pod in signalled:
        events = r["pod_events"][pod]
        warnings = [(t, m) for reason, t, m in events if reason == "CheckpointRequested"]
        assert len(warnings) == 1 and warnings[0][0] == "Warning", (pod, events)
        assert r["block"]["id"] in warnings[0][1] and "checkpoint and exit" in warnings[0][1], warnings
    # The node condition on both nodes, at the lead.
    conditioned = _first(r["nodes"], lambda v: len(v) == 2 and all(c == ("True", "CheckpointRequested")
                                                                  for _, _, c in v))
    assert conditioned is not None, r["nodes"]
    assert signal_at - timedelta(seconds=1) <= conditioned <= signal_at + SLACK, (conditioned, signal_at)


def test_the_drain_starts_after_the_lead_and_is_done_by_the_blocks_end(scenarios) -> None:
    r = _result(scenarios)
    termination, end = parse_ts(r["block"]["terminationTime"]), parse_ts(r["block"]["endTime"])
    annotated = _first(r["pods"], lambda v: any(p[3] for p in v))
    cordoned = _first(r["nodes"], lambda v: any(cordon for _, cordon, _ in v))
    assert cordoned is not None, f"the nodes were never drained: {r['nodes']}"
    assert cordoned >= termination - timedelta(seconds=1), ("cordoned before the termination time", cordoned)
    assert cordoned >= annotated + timedelta(seconds=3), ("the drain did not wait for the lead", cordoned, annotated)
    # The pods were Running until the termination time, and none was being deleted before it.
    leaving = _first(r["pods"], lambda v: any(p[4] or p[2] not in ("Running",) for p in v)
                     and any(p[3] for p in v))
    assert leaving is not None and leaving >= termination - timedelta(seconds=1), (leaving, termination)
    # Gone by the block's end: no pod of the Job, no node of the group.
    gone_pods = next((when for when, v in r["pods"] if v == () and when > termination - timedelta(seconds=1)), None)
    assert gone_pods is not None and gone_pods <= end + timedelta(seconds=2), (gone_pods, end, r["pods"][-3:])
    gone_nodes = next((when for when, v in r["nodes"] if v == () and when > termination), None)
    assert gone_nodes is not None and gone_nodes <= end + timedelta(seconds=2), (gone_nodes, end, r["nodes"][-3:])
    assert r["group_nodes_after"] == [], r["group_nodes_after"]
    assert r["pods"][-1][1] == (), f"a pod of the Job came back: {r['pods'][-1]}"


def test_the_workload_is_rejected_and_deactivated_when_its_block_terminates(scenarios) -> None:
    """docs/admission.md, "When the block ends": no later block can hold it, so the check goes
    ``Rejected`` at the termination time and Kueue deactivates the Workload and suspends the Job."""
    r = _result(scenarios)
    block, termination = r["block"], parse_ts(r["block"]["terminationTime"])
    # Kueue resets the entry to Pending within milliseconds of deactivating the workload, so the
    # poll may see only the reset, which names the state it replaced.
    rejected = [(when, v) for when, v in r["states"]
                if v and (v[0] == "Rejected" or v[1].endswith("Previously: Rejected"))]
    assert rejected, f"the check was never Rejected: {r['states'][-3:]}"
    rejected_at, (state, message, _, _) = rejected[0]
    assert termination - timedelta(seconds=1) <= rejected_at <= termination + SLACK, (rejected_at, termination)
    if state != "Rejected":  # only Kueue's reset was seen: hyperplan's message is on its Event
        message = next((m for reason, _, m in r["workload_events"] if reason == "AdmissionCheckRejected"
                        and "reached its termination time" in m), message)
    assert f"block {block['id']} reached its termination time {block['terminationTime']}" in message, message
    # Kueue deactivates it: evicted, no quota, not requeued, and it resets the check to Pending
    # (hyperplan decides only for a workload that holds quota, so it stays there).
    _, _, active, conditions = r["states"][-1][1]
    by_type = {t: (status, reason) for t, status, reason in conditions}
    assert active is False, r["states"][-1]
    assert by_type.get("Evicted") == ("True", "DeactivatedDueToAdmissionCheck"), conditions
    assert by_type.get("Requeued", ("False",))[0] == "False", conditions
    assert by_type.get("QuotaReserved", ("False",))[0] == "False", conditions
    assert by_type.get("Admitted", ("False",))[0] == "False", conditions
    assert by_type.get("Finished", ("False",))[0] != "True", "stopped, not completed"
    assert not [when for when, v in r["states"] if v and v[0] == "Ready" and when > rejected_at], r["states"]
    # The Job is suspended, not failed: evicted pods spent no retry of its backoffLimit 0.
    assert ("Suspended", "True", "JobSuspended") in r["job_conditions"], r["job_conditions"]
    assert not any(t in ("Failed", "FailureTarget") and st == "True" for t, st, _ in r["job_conditions"]), \
        r["job_conditions"]
    reasons = [(reason, t) for reason, t, _ in r["workload_events"]]
    assert ("AdmissionCheckReady", "Normal") in reasons and ("AdmissionCheckRejected", "Warning") in reasons, reasons
