"""Deep health checks end to end on KWOK (demo profile): ``onStartDeepHealthChecks``.

One scenario on a plan of one x72 UltraServer (a pool of its own, in a zone of its own, selling to
this plan only) and a group of 2 active nodes and their spare, both checks on:

1. the three nodes are made under the taint ``hyperplan.dev/deep-health-check=InProgress`` and the
   label ``deep-health-check-status=InProgress`` (hyperplan's key and HyperPod's); each gets an
   InstanceStress Job and an InstanceConnectivity Job pinned to it, the latter sharing one headless
   Service, and the group counts none of them Ready meanwhile;
2. KWOK runs nothing in a pod: its stage ends a check pod Succeeded after 5 s, or Failed at once when
   the test writes ``hyperplan.dev/kwok-check-exit-code`` (and ``-output``) on it. The test does so on
   the InstanceStress pod of one active node, the victim, as soon as the pod appears;
3. the other two pass: label ``Passed``, taint gone; the victim fails: a Warning
   ``DeepHealthCheckFailed`` Event carries the check's output, it is marked for replacement (never
   rebooted), a new node is made in its slot and checked in its turn (an active one: the spare was
   still in its own checks when the victim failed, and a spare in its checks is not promoted; had
   it passed first, it would have been promoted and the new node made a spare), and the victim is
   removed once its successor serves, Ready and checked;
4. the group is Ready with 2 active nodes and its spare, every node checked, and ``/metrics`` counts
   the checks by result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from datetime import timedelta

from kubernetes import watch
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.scenarios import Context, events_for, scenario, ts, utcnow
from tests.kube import eventually

API = "hyperplan.dev/v1alpha1"
ITYPE = "ml.p6e-gb200.36xlarge"
US_TYPE = "ml.u-p6e-gb200x72"
ROLE = "hyperplan.dev/role"
CHECK_LABEL = "hyperplan.dev/deep-health-check-status"
SAGEMAKER_CHECK_LABEL = "sagemaker.amazonaws.com/deep-health-check-status"
CHECK_TAINT = "hyperplan.dev/deep-health-check"
OUTPUT = "GPU 3: 2 uncorrectable ECC errors (simulated by the e2e test)"


def _read(ctx: Context) -> dict[tuple, float]:
    """The operator's ``hyperplan_`` samples now: (name, sorted labels) -> value."""
    def read() -> dict[tuple, float] | None:
        try:
            text = ctx.metrics()
        except OSError:  # another test restarted the operator meanwhile
            return None
        return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
                if f.name.startswith("hyperplan_") for s in f.samples}
    return eventually(read, timeout=60, what="the operator's /metrics")


def _value(samples: dict[tuple, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _nodes(k, group: str) -> dict[str, dict]:
    return {n["metadata"]["name"]: n for n in
            k.get("nodes", None, "-l", f"hyperplan.dev/instance-group={group}")["items"]}


def _check_taint(node: dict) -> str | None:
    return next((t.get("value") for t in (node["spec"].get("taints") or []) if t["key"] == CHECK_TAINT), None)


def _jobs(ctx: Context, group: str) -> list:
    return ctx.kube.batch.list_job_for_all_namespaces(
        label_selector=f"app.kubernetes.io/component=deep-health-check,hyperplan.dev/instance-group={group}").items


class FailTheStressOf:
    """Watches the group's InstanceStress pods and, the moment the one on ``node`` appears, writes
    the exit code and output KWOK's stage ends it with (before KWOK's 5 s of a passing check)."""

    def __init__(self, ctx: Context, group: str, node: str):
        self.ctx, self.group, self.node = ctx, group, node
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "FailTheStressOf":
        self._thread.start()
        return self

    def _run(self) -> None:
        core = self.ctx.kube.core
        selector = (f"app.kubernetes.io/component=deep-health-check,hyperplan.dev/deep-health-check=InstanceStress,"
                    f"hyperplan.dev/instance-group={self.group}")
        while not self._stop.is_set() and not self.failed:
            w = watch.Watch()
            for event in w.stream(core.list_pod_for_all_namespaces, label_selector=selector, timeout_seconds=5):
                pod = event["object"]
                if pod.spec.node_name != self.node or event["type"] == "DELETED":
                    continue
                try:
                    core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace, {"metadata": {"annotations": {
                        "hyperplan.dev/kwok-check-exit-code": "1", "hyperplan.dev/kwok-check-output": OUTPUT}}})
                except ApiException as e:
                    if e.status != 404:
                        raise
                    continue
                self.failed.append(pod.metadata.name)
                w.stop()
                break

    def stop(self) -> None:
        self._stop.set()


@scenario
def deep_health_checks(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    plan, group = f"dh-{tag}", f"checked-{tag}"
    out: dict = {"group": group, "metrics_before": _read(ctx)}
    k.create({"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": f"dh-{tag}"},
              "spec": {"instanceType": ITYPE, "ultraServerType": US_TYPE, "availabilityZone": f"us-dh-{tag}",
                       "instanceCount": 18, "trainingPlanSelector": {"matchLabels": {"e2e-scenario": plan}}}})
    k.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": plan, "labels": {"e2e-scenario": plan}},
              "spec": {"ultraServerType": US_TYPE, "ultraServerCount": 1, "targetResource": "hyperpod-cluster",
                       "duration": "4m", "autoPurchase": True,
                       "startTimeAfter": ts(utcnow() + timedelta(seconds=20))}})
    k.create({"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": group},
              "spec": {"trainingPlanRef": plan, "instanceType": ITYPE, "instanceCount": 2,
                       "onStartDeepHealthChecks": ["InstanceStress", "InstanceConnectivity"],
                       "healthCheck": {"graceSeconds": 3, "maxUnhealthy": 2}}})
    # `hyperplan status` is read from now on in the background: the checks last seconds, and the
    # CLI (a process of its own) takes a while under load, so a look begun after the Jobs appear
    # may come after the last check passed (seen in CI).
    checking: list[dict] = []
    stop_looking = threading.Event()

    def look_at_status() -> None:
        while not stop_looking.is_set() and not checking:
            try:
                g = _status_group(ctx, group)
            except (AssertionError, subprocess.TimeoutExpired, ValueError):
                g = None
            if g and any(n["state"] == "checking" for n in g["nodes"]):
                checking.append(g)
            stop_looking.wait(0.2)
    threading.Thread(target=look_at_status, daemon=True).start()
    # The victim: the group's second active node (slot 0-1 of the UltraServer), by its deterministic
    # name, failed the moment its stress pod appears.
    nodes = eventually(lambda: len(n := _nodes(k, group)) == 3 and n, timeout=150, interval=0.3,
                       what="the group's three nodes made")
    out["born"] = nodes
    victim = next(name for name in nodes if name.endswith("-0-1"))
    out["victim"] = victim
    failing = FailTheStressOf(ctx, group, victim).start()
    try:
        out["checking_status"] = eventually(
            lambda: len(_jobs(ctx, group)) >= 6 and k.get("instancegroup", group).get("status"),
            timeout=60, interval=0.3, what="the group's six check Jobs")
        # While the checks run (a check pod ends after 5 s), `hyperplan status` shows the nodes checking.
        out["status_checking"] = eventually(lambda: checking and checking[0], timeout=30, interval=0.2,
                                            what="hyperplan status showing nodes in their checks")
        jobs = _jobs(ctx, group)
        out["jobs"] = [ctx.kube.api.sanitize_for_serialization(j) for j in jobs]
        cohort = next(j.spec.template.spec.subdomain for j in jobs if j.spec.template.spec.subdomain)
        out["service"] = ctx.kube.api.sanitize_for_serialization(
            ctx.kube.core.read_namespaced_service(cohort, jobs[0].metadata.namespace))
        out["failed_event"] = eventually(
            lambda: next((e for e in events_for(k, group) if e["reason"] == "DeepHealthCheckFailed"), None),
            timeout=60, interval=0.5, what="the victim's DeepHealthCheckFailed Event")
        out["failed_pods"] = list(failing.failed)
        eventually(lambda: k.get_or_none("node", victim) is None, timeout=90, what="the victim replaced")
        out["ready"] = eventually(
            lambda: (s := k.get("instancegroup", group)["status"]).get("phase") == "Ready"
            and (s.get("readyCount"), s.get("spareCount")) == (2, 1) and s, timeout=90, interval=0.5,
            what="the group Ready with its spare, every node checked")
    finally:
        failing.stop()
        stop_looking.set()
    out["nodes"] = _nodes(k, group)
    out["record"] = k.get("instancegroup", group)["status"]["nodes"]
    # kopf posts Events from a queue of its own after the pass's writes; under a full run's load
    # the last ones arrive after the group shows Ready (seen in CI: NodeRemoved not there yet).
    out["group_events"] = eventually(
        lambda: (ev := events_for(k, group)) and {"NodeUnhealthy", "NodeRemoved"} <= {e["reason"] for e in ev}
        and sum(e["reason"] == "DeepHealthCheckPassed" for e in ev) >= 3 and ev,
        timeout=60, interval=0.5, what="the group's Events of the failure, the removal and three passed checks")
    out["metrics_after"] = eventually(
        lambda: (m := _read(ctx)) and _value(m, "hyperplan_deep_health_checks_total", result="failed")
        > _value(out["metrics_before"], "hyperplan_deep_health_checks_total", result="failed") and m,
        timeout=20, interval=0.5, what="/metrics counting the failed check")
    return out


def _status_group(ctx: Context, group: str) -> dict | None:
    """The group in ``hyperplan status -o json``, as an admin reads it."""
    done = subprocess.run([sys.executable, "-m", "hyperplan.cli", "status", "-o", "json"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "KUBECONFIG": ctx.kubeconfig})
    assert done.returncode == 0, done.stderr
    return next((g for g in json.loads(done.stdout)["groups"] if g["name"] == group), None)


def _record(scenarios) -> dict:
    return scenarios["deep_health_checks"].result()


def test_new_nodes_are_tainted_and_labelled_until_their_checks_pass(scenarios) -> None:
    r = _record(scenarios)
    for name, node in r["born"].items():
        labels = node["metadata"]["labels"]
        assert (labels.get(CHECK_LABEL), labels.get(SAGEMAKER_CHECK_LABEL)) in (
            ("InProgress", "InProgress"), ("Passed", "Passed"), ("Failed", "Failed")), name
        # Born under the taint (at the latest, read just now, Passed ones shed it)
        assert _check_taint(node) in ("InProgress", "Failed") or labels[CHECK_LABEL] == "Passed", name
    status = r["checking_status"]
    assert status.get("readyCount", 0) == 0 and status.get("phase") == "Provisioning"


def test_each_node_gets_a_stress_job_and_a_connectivity_job_of_one_run(scenarios) -> None:
    r = _record(scenarios)
    first = [j for j in r["jobs"] if j["metadata"]["annotations"]["hyperplan.dev/check-node"] in r["born"]]
    by_node: dict[str, set[str]] = {}
    for job in first:
        spec = job["spec"]["template"]["spec"]
        assert spec["nodeName"] == job["metadata"]["annotations"]["hyperplan.dev/check-node"]
        assert spec["tolerations"] == [{"operator": "Exists"}] and job["spec"]["backoffLimit"] == 0
        by_node.setdefault(spec["nodeName"], set()).add(job["metadata"]["labels"]["hyperplan.dev/deep-health-check"])
        if "subdomain" in spec:  # InstanceConnectivity: the three nodes reach each other
            env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
            assert sorted(p.split(".")[0] for p in env["HYPERPLAN_CHECK_PEERS"].split(",")) == sorted(r["born"])
    assert by_node == {n: {"InstanceStress", "InstanceConnectivity"} for n in r["born"]}
    service = r["service"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert {o["kind"] for o in service["metadata"]["ownerReferences"]} == {"Job"}
    assert len(service["metadata"]["ownerReferences"]) == 3


def test_a_node_that_fails_its_check_is_replaced_with_the_output_in_an_event(scenarios) -> None:
    r = _record(scenarios)
    assert r["failed_pods"], "the victim's stress pod was never seen"
    event = r["failed_event"]
    assert event["type"] == "Warning"
    assert event["message"].startswith(f"{r['victim']}: InstanceStress failed: exit code 1: {OUTPUT}")
    assert r["victim"] not in r["nodes"]
    reasons = [e["reason"] for e in r["group_events"]]
    assert "NodeUnhealthy" in reasons and "NodeRemoved" in reasons and "NodeRebooting" not in reasons
    backfill = [n for n in r["nodes"].values() if n["metadata"]["labels"]["hyperplan.dev/generation"] == "1"]
    assert len(backfill) == 1 and backfill[0]["metadata"]["name"] == r["victim"] + "-g1"
    # The spare, in its checks when the victim failed (KWOK's 5 s), is not promoted, then or once it
    # passed: the new node is active and serves once checked; the spare stays the spare.
    assert "SparePromoted" not in reasons
    assert backfill[0]["metadata"]["labels"][ROLE] == "active"
    removed = next(e for e in r["group_events"] if e["reason"] == "NodeRemoved")
    passed = [e for e in r["group_events"] if e["reason"] == "DeepHealthCheckPassed"
              and e["message"].startswith(backfill[0]["metadata"]["name"])]
    assert passed and (passed[0].get("lastTimestamp") or "") <= (removed.get("lastTimestamp") or "")


def test_the_group_counts_only_checked_nodes_and_ends_ready_with_every_node_passed(scenarios) -> None:
    r = _record(scenarios)
    assert (r["ready"]["readyCount"], r["ready"]["spareCount"]) == (2, 1)
    for name, node in r["nodes"].items():
        labels = node["metadata"]["labels"]
        assert (labels[CHECK_LABEL], labels[SAGEMAKER_CHECK_LABEL], _check_taint(node)) == ("Passed", "Passed", None), name
    assert {e["deepHealthCheck"]["status"] for e in r["record"]} == {"Passed"}
    reasons = [e["reason"] for e in r["group_events"]]
    assert reasons.count("DeepHealthCheckPassed") >= 3


def test_hyperplan_status_shows_the_nodes_in_their_checks_not_serving(scenarios) -> None:
    g = _record(scenarios)["status_checking"]
    checking = [n for n in g["nodes"] if n["state"] == "checking"]
    assert checking and all(n["checks"] == ["InstanceStress", "InstanceConnectivity"] and n["checkingSince"]
                            for n in checking), checking
    assert g["nodesByState"]["checking"] == len(checking)
    assert g["nodesByState"]["active"] + len(checking) <= 3  # a node in its checks is never shown serving


def test_the_checks_are_counted_by_result(scenarios) -> None:
    r = _record(scenarios)
    moved = {result: _value(r["metrics_after"], "hyperplan_deep_health_checks_total", result=result)
             - _value(r["metrics_before"], "hyperplan_deep_health_checks_total", result=result)
             for result in ("passed", "failed")}
    assert moved["failed"] >= 1 and moved["passed"] >= 3, moved
