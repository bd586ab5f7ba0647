"""Real Kueue on the local control plane: started by `dev up`, its CRDs and webhooks, a Job it admits
onto a KWOK node, hyperplan's Kueue examples, and its webhooks gone once it stops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from hyperplan_dev import build, kueue
from hyperplan_dev.plane import Plane
from tests.kube import Kubectl, eventually

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "deploy" / "examples" / "kueue"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def _uid() -> str:
    return uuid.uuid4().hex[:6]


def _condition(obj: dict, kind: str) -> dict | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def _job(name: str, namespace: str, labels: dict[str, str], cpu: str = "1") -> dict:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}]}}},
    }


def _our_webhook_configurations(kubectl: Kubectl) -> list[str]:
    out = kubectl.run("get", "mutatingwebhookconfigurations,validatingwebhookconfigurations",
                      "-l", f"{kueue.OWNER_LABEL}={kueue.OWNER_VALUE}", "-o", "name").stdout
    return sorted(out.split())


def _webhook_names(kubectl: Kubectl) -> set[str]:
    configs = kubectl.get("mutatingwebhookconfigurations,validatingwebhookconfigurations",
                          None, "-l", f"{kueue.OWNER_LABEL}={kueue.OWNER_VALUE}")["items"]
    return {h["name"] for c in configs for h in c["webhooks"]}


def test_kueue_runs_with_the_plane_at_the_pinned_version(plane: Plane, kubectl: Kubectl) -> None:
    env = {**os.environ, "HYPERPLAN_STATE_DIR": str(plane.dir)}
    status = subprocess.run([sys.executable, "-m", "hyperplan.cli", "dev", "status"], env=env,
                            capture_output=True, text=True, timeout=60)
    line = next(l for l in status.stdout.splitlines() if l.startswith("kueue "))
    assert "running (pid" in line and f"https://127.0.0.1:{plane.state().ports['kueue-webhook']}" in line
    # Kueue logs the version it was built as; the pin is build.KUEUE_VERSION.
    assert f'"gitVersion":"{build.KUEUE_VERSION}"' in (plane.logs / "kueue.log").read_text()
    # Kueue's certificate files live in a private mount namespace, never in the host's /etc.
    assert not Path("/etc/kueue").exists()


def test_kueue_crds_are_established(kubectl: Kubectl) -> None:
    shipped = {yaml.safe_load(f.read_text())["metadata"]["name"] for f in kueue.crd_dir().glob("*.yaml")}
    served = {c["metadata"]["name"]: c for c in kubectl.get("crd")["items"]
              if c["spec"]["group"] == kueue.GROUP}
    assert "workloads.kueue.x-k8s.io" in shipped and "topologies.kueue.x-k8s.io" in shipped
    assert set(served) == shipped
    for name, crd in served.items():
        assert (_condition(crd, "Established") or {}).get("status") == "True", name


def test_only_webhooks_for_kueue_kinds_and_jobs_are_registered(kubectl: Kubectl) -> None:
    names = _webhook_names(kubectl)
    assert {"mjob.kb.io", "vjob.kb.io", "mresourceflavor.kb.io", "vclusterqueue.kb.io",
            "vworkload.kb.io"} <= names
    # Integrations that are not enabled (their paths are not served) and pods are left out.
    assert not names & {"mpod.kb.io", "vpod.kb.io", "mdeployment.kb.io", "mjobset.kb.io", "mrayjob.kb.io"}


@pytest.fixture
def kwok_pool(kubectl: Kubectl):
    """A KWOK node with 8 CPUs under a label of its own, and a namespace; deleted afterwards."""
    uid = _uid()
    node, ns = f"kueue-node-{uid}", f"kueue-{uid}"
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    kubectl.apply({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {"kubernetes.io/hostname": node, "hyperplan.dev/test-pool": uid}},
        "status": {"capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                   "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}},
    })
    yield uid, node, ns
    kubectl.run("delete", "namespace", ns, "--wait=true", "--timeout=60s")
    kubectl.delete("node", node)


def test_a_queued_job_is_created_suspended_then_admitted_and_runs_on_a_kwok_node(kubectl: Kubectl, kwok_pool) -> None:
    uid, node, ns = kwok_pool
    flavor, cq = f"pool-{uid}", f"cq-{uid}"
    kubectl.apply([
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": flavor},
         "spec": {"nodeLabels": {"hyperplan.dev/test-pool": uid}}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
         "spec": {"namespaceSelector": {}, "resourceGroups": [{
             "coveredResources": ["cpu"],
             "flavors": [{"name": flavor, "resources": [{"name": "cpu", "nominalQuota": "4"}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": "training", "namespace": ns}, "spec": {"clusterQueue": cq}},
    ])
    try:
        eventually(lambda: (_condition(kubectl.get("clusterqueue", cq), "Active") or {}).get("status") == "True",
                   timeout=30, what=f"ClusterQueue {cq} Active")
        # What the API stored at create time: Kueue's Job webhook suspended it.
        created = json.loads(kubectl.run("create", "-o", "json", "-f", "-", input=json.dumps(
            _job("train", ns, {QUEUE_LABEL: "training"}))).stdout)
        assert created["spec"]["suspend"] is True

        def admitted_workload() -> dict | None:
            items = kubectl.get("workloads", None, "-n", ns)["items"]
            return next((w for w in items if (_condition(w, "Admitted") or {}).get("status") == "True"), None)

        workload = eventually(admitted_workload, timeout=60, what="the Job's Workload Admitted")
        assert workload["status"]["admission"]["clusterQueue"] == cq
        assert workload["status"]["admission"]["podSetAssignments"][0]["flavors"] == {"cpu": flavor}
        eventually(lambda: kubectl.get("job", "train", "-n", ns)["spec"].get("suspend") is False,
                   timeout=30, what="the Job unsuspended")

        def running_pod() -> dict | None:
            pods = kubectl.get("pods", None, "-n", ns, "-l", "job-name=train")["items"]
            return next((p for p in pods if p["status"].get("phase") == "Running"), None)

        pod = eventually(running_pod, timeout=60, what="the Job's pod Running")
        assert pod["spec"]["nodeName"] == node
        # The flavor's node labels reached the pod as a node selector.
        assert pod["spec"]["nodeSelector"] == {"hyperplan.dev/test-pool": uid}
    finally:
        kubectl.run("delete", "job", "train", "-n", ns, "--ignore-not-found", "--wait=true",
                    "--cascade=foreground", "--timeout=60s", check=False)
        kubectl.run("delete", "localqueue", "training", "-n", ns, "--ignore-not-found", "--wait=true",
                    "--timeout=60s", check=False)
        kubectl.run("delete", "clusterqueue", cq, "--ignore-not-found", "--wait=true", "--timeout=60s", check=False)
        kubectl.run("delete", "resourceflavor", flavor, "--ignore-not-found", "--wait=true", "--timeout=60s",
                    check=False)


def test_a_job_without_a_queue_name_is_left_alone(kubectl: Kubectl, kwok_pool) -> None:
    _, _, ns = kwok_pool
    created = json.loads(kubectl.run("create", "-o", "json", "-f", "-",
                                     input=json.dumps(_job("plain", ns, {}))).stdout)
    assert not created["spec"].get("suspend")
    assert kubectl.get("workloads", None, "-n", ns)["items"] == []


def _example_docs() -> list[tuple[str, dict]]:
    return [(f.name, d) for f in sorted(EXAMPLES.glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text()) if d]


def test_the_examples_hold_every_kueue_kind_hyperplan_documents() -> None:
    kinds = {d["kind"]: d for _, d in _example_docs()}
    assert set(kinds) == {"Topology", "ResourceFlavor", "AdmissionCheck", "ClusterQueue", "LocalQueue", "Job"}
    check = kinds["AdmissionCheck"]["spec"]
    assert check["controllerName"] == "hyperplan.dev/training-plan"
    assert check["parameters"]["apiGroup"] == "hyperplan.dev" and check["parameters"]["kind"] == "TrainingPlan"
    levels = [lv["nodeLabel"] for lv in kinds["Topology"]["spec"]["levels"]]
    assert levels == ["topology.kubernetes.io/zone", "topology.k8s.aws/network-node-layer-1",
                      "topology.k8s.aws/network-node-layer-2", "topology.k8s.aws/network-node-layer-3",
                      "topology.k8s.aws/ultraserver-id", "kubernetes.io/hostname"]
    job = kinds["Job"]
    assert job["spec"]["parallelism"] == 4
    assert (job["spec"]["template"]["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"]
            == "topology.k8s.aws/ultraserver-id")
    assert int(job["metadata"]["labels"]["kueue.x-k8s.io/max-exec-time-seconds"]) > 0
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in \
        job["spec"]["podFailurePolicy"]["rules"]


def test_every_kueue_example_applies_against_real_kueue(kubectl: Kubectl) -> None:
    """The examples go through Kueue's own validation; the Job by a server-side dry run."""
    applied = []
    try:
        for name, doc in _example_docs():
            if doc["kind"] == "Job":
                out = json.loads(kubectl.run("create", "--dry-run=server", "-o", "json", "-f", "-",
                                             input=json.dumps(doc)).stdout)
                assert out["spec"]["suspend"] is True, f"{name}: Kueue's Job webhook did not run"
                continue
            kubectl.apply(doc)
            applied.append(doc)
        flavor = kubectl.get("resourceflavor", "gb200-frontier")
        assert flavor["spec"]["topologyName"] == "gb200-ultraserver"
        topology = kubectl.get("topology", "gb200-ultraserver")
        assert topology["spec"]["levels"][-2] == {"nodeLabel": "topology.k8s.aws/ultraserver-id"}
        # No controller serves hyperplan.dev/training-plan here: the queue waits for its check.
        cq = eventually(lambda: (c := kubectl.get("clusterqueue", "frontier")).get("status", {}).get("conditions") and c,
                        timeout=30, what="ClusterQueue frontier status")
        assert _condition(cq, "Active")["status"] == "False"
        assert "gb200-frontier-plan" in _condition(cq, "Active")["message"]
    finally:
        for doc in reversed(applied):
            ns = ["-n", doc["metadata"]["namespace"]] if "namespace" in doc["metadata"] else []
            kubectl.run("delete", doc["kind"].lower(), doc["metadata"]["name"], *ns, "--ignore-not-found",
                        "--wait=true", "--timeout=60s", check=False)


def test_a_malformed_kueue_object_is_refused_by_kueues_webhook(kubectl: Kubectl) -> None:
    """The validating webhooks are Kueue's own: a ClusterQueue with a negative quota is refused."""
    bad = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": f"bad-{_uid()}"},
           "spec": {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
               {"name": "x", "resources": [{"name": "cpu", "nominalQuota": "-1"}]}]}]}}
    proc = kubectl.run("create", "--dry-run=server", "-f", "-", input=json.dumps(bad), check=False)
    assert proc.returncode != 0
    assert "nominalQuota" in proc.stderr


def test_restarting_kueue_serves_its_webhooks_again(plane: Plane, kubectl: Kubectl) -> None:
    before = plane.state().pids["kueue"]
    took = plane.restart("kueue")
    assert plane.state().pids["kueue"] != before
    assert 0 < took < 120
    probe = kubectl.run("create", "--dry-run=server", "-o", "json", "-f", "-",
                        input=json.dumps(_job("probe", "default", {QUEUE_LABEL: "none"})))
    assert json.loads(probe.stdout)["spec"]["suspend"] is True


def test_stopping_kueue_removes_its_webhooks_so_jobs_can_still_be_created(plane: Plane, kubectl: Kubectl) -> None:
    assert _our_webhook_configurations(kubectl) == [
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/kueue-mutating-webhook-configuration",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/kueue-validating-webhook-configuration",
    ]
    job = _job(f"after-kueue-{_uid()}", "default", {QUEUE_LABEL: "none"})
    plane.stop_kueue()
    try:
        assert not any(r[1].startswith("running") for r in plane.status() if r[0] == "kueue")
        assert _our_webhook_configurations(kubectl) == []
        # Nothing answers on Kueue's port any more, yet a Job is created (and not suspended).
        created = json.loads(kubectl.run("create", "-o", "json", "-f", "-", input=json.dumps(job)).stdout)
        assert not created["spec"].get("suspend")
    finally:
        kubectl.delete("job", job["metadata"]["name"], "-n", "default", "--cascade=foreground")
        took = plane.start_kueue()
    assert 0 < took < 120
    assert len(_our_webhook_configurations(kubectl)) == 2
    again = json.loads(kubectl.run("create", "--dry-run=server", "-o", "json", "-f", "-",
                                   input=json.dumps(job)).stdout)
    assert again["spec"]["suspend"] is True
