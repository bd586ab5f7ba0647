"""Recovery on real kubelets: deep health checks run as real Jobs, and a real reboot.

Both kind workers are lent to a static group with ``onStartDeepHealthChecks: [InstanceStress,
InstanceConnectivity]``:

* each check is a Job on its worker, from the operator's image (``hyperplan.deepcheck``): a CPU and
  memory stress, and a TCP exchange between the two workers' check pods over the pod network. They
  Complete, each node's ``deep-health-check-status`` is ``Passed`` under both keys, the check taint
  goes, and the group is Ready 2/2;
* an admin asks for a reboot of one worker (HyperPod's label ``UnschedulablePendingReboot``):
  hyperplan runs the chart's reboot Job on it, which stops the worker's kubelet past the node
  controller's grace (the node goes NotReady), then restarts its containerd and starts the kubelet
  (its start in the worker's systemd moves); the node is back under the same name with the group's
  labels, passes its checks again, is ``Schedulable``, and the group is Ready 2/2 again.
"""

from __future__ import annotations

import subprocess
import time
import uuid

from tests.kind import lending as L
from tests.kind.conftest import KindEnv
from tests.kube import eventually

HEALTH = "hyperplan.dev/node-health-status"
SAGEMAKER_HEALTH = "sagemaker.amazonaws.com/node-health-status"
CHECK = "hyperplan.dev/deep-health-check-status"
SAGEMAKER_CHECK = "sagemaker.amazonaws.com/deep-health-check-status"
CHECK_TAINT = "hyperplan.dev/deep-health-check"


def kubelet_started(node: str) -> str:
    """When the worker's systemd last started its kubelet (monotonic microseconds, as text)."""
    out = subprocess.run(["docker", "exec", node, "systemctl", "show", "kubelet",
                          "--property=ExecMainStartTimestampMonotonic", "--value"],
                         check=True, capture_output=True, text=True, timeout=60)
    return out.stdout.strip()


def ready_status(kind: KindEnv, node: str) -> str | None:
    conditions = (kind.kubectl.get("node", node).get("status") or {}).get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == "Ready"), None)


def group_ready(kind: KindEnv, name: str, count: int) -> dict | None:
    st = kind.kubectl.get("instancegroup", name).get("status") or {}
    return st if (st.get("phase"), st.get("readyCount")) == ("Ready", count) else None


def check_jobs(kind: KindEnv, group: str, node: str) -> list[dict]:
    jobs = kind.kubectl.get("jobs", None, "-n", kind.namespace, "-l",
                            f"app.kubernetes.io/component=deep-health-check,hyperplan.dev/instance-group={group}")["items"]
    return [j for j in jobs if (j["spec"]["template"]["spec"].get("nodeName")) == node]


def group_events(kind: KindEnv, group: str, node: str) -> list[str]:
    """The reasons of the events on ``node`` about the group's node there (its node id leads the
    message): the node's events of earlier groups are not this test's."""
    return [r for r, m in L.events_for(kind, node) if m.startswith(f"hp-{group}-")]


def test_real_check_jobs_pass_and_a_real_reboot_brings_the_worker_back_checked(kind: KindEnv) -> None:
    k = kind.kubectl
    tag = uuid.uuid4().hex[:5]
    name = f"rec-{tag}"
    victim = kind.workers[-1]
    started = time.monotonic()

    def step(what: str) -> None:
        print(f"[recovery] {what} ({time.monotonic() - started:.0f}s)", flush=True)

    eventually(lambda: L.in_free_pool(kind), timeout=120, what="both workers in the free pool")
    ops_before = L.settled_operator_pods(kind)
    try:
        k.apply([L.pool(name), L.plan(name, "5m", start_in=15)])
        k.apply(L.group(name, name, 2, healthCheck={"graceSeconds": 5, "maxUnhealthy": 1, "rebootTimeoutSeconds": 240},
                        onStartDeepHealthChecks=["InstanceStress", "InstanceConnectivity"]))
        eventually(lambda: len(L.held_nodes(kind, name)) == 2, timeout=90, interval=1, what="both workers adopted")
        step("both workers adopted")
        eventually(lambda: group_ready(kind, name, 2), timeout=240, interval=2, what="the group Ready after its checks")
        step("checked and Ready")
        for node in L.held_nodes(kind, name):
            labels, taints = node["metadata"]["labels"], node["spec"].get("taints") or []
            assert (labels.get(CHECK), labels.get(SAGEMAKER_CHECK)) == ("Passed", "Passed"), labels
            assert not any(t["key"] == CHECK_TAINT for t in taints), taints
        first_jobs = check_jobs(kind, name, victim)
        assert sorted(j["metadata"]["labels"].get("hyperplan.dev/deep-health-check") for j in first_jobs) == [
            "InstanceConnectivity", "InstanceStress"], [j["metadata"]["labels"] for j in first_jobs]
        assert all((j.get("status") or {}).get("succeeded") == 1 for j in first_jobs), [j.get("status") for j in first_jobs]
        assert "DeepHealthCheckPassed" in group_events(kind, name, victim), L.events_for(kind, victim)

        before = kubelet_started(victim)
        k.run("label", "node", victim, "--overwrite", f"{SAGEMAKER_HEALTH}=UnschedulablePendingReboot")
        step(f"reboot asked for {victim}")
        eventually(lambda: "NodeRebooting" in group_events(kind, name, victim), timeout=60, interval=1,
                   what=f"hyperplan rebooting {victim}")
        eventually(lambda: ready_status(kind, victim) in ("Unknown", "False"), timeout=150, interval=2,
                   what=f"{victim} NotReady while its kubelet is down")
        step(f"{victim} NotReady")
        eventually(lambda: kubelet_started(victim) != before, timeout=180, interval=2,
                   what=f"the reboot Job starting {victim}'s kubelet again")
        step("kubelet started again")

        def back_and_checked() -> dict | None:
            reasons = group_events(kind, name, victim)
            node = k.get("node", victim)
            labels = node["metadata"]["labels"]
            return node if "NodeRecovered" in reasons and reasons.count("DeepHealthCheckPassed") >= 2 \
                and labels.get(HEALTH) == "Schedulable" and labels.get(CHECK) == "Passed" else None

        back = eventually(back_and_checked, timeout=300, interval=2,
                          what=f"{victim} back from its reboot, checked again and Schedulable")
        step("back and checked")
        assert back["metadata"]["labels"].get("hyperplan.dev/instance-group") == name
        assert back["metadata"]["labels"].get(SAGEMAKER_HEALTH) == "Schedulable"
        assert not any(t["key"] in (CHECK_TAINT, "hyperplan.dev/unhealthy") for t in back["spec"].get("taints") or [])
        eventually(lambda: group_ready(kind, name, 2), timeout=120, interval=2, what="the group Ready 2/2 again")
        assert len(check_jobs(kind, name, victim)) > len(first_jobs)  # its checks ran again after the reboot
        reboots = k.get("jobs", None, "-n", kind.namespace, "-l", "app.kubernetes.io/component=node-reboot")["items"]
        assert any(j["spec"]["template"]["spec"].get("nodeName") == victim
                   and (j.get("status") or {}).get("succeeded") == 1 for j in reboots), [j.get("status") for j in reboots]
    finally:
        L.remove(kind, ("instancegroup", name), ("trainingplan", name), ("capacitypool", name))
        eventually(lambda: L.in_free_pool(kind), timeout=180, what="both workers back in the free pool")
        step("cleaned up")
    ops_after = L.operator_pods(kind)
    assert set(ops_after) == set(ops_before) and all(p["phase"] == "Running" for p in ops_after.values())
