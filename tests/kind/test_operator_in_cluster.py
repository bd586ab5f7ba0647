"""The chart's operator really runs in the kind cluster: the pod a user gets from `helm install`."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from hyperplan.api.vocabulary import LABEL_POOL
from hyperplan_dev import build, prometheus
from tests.kind.conftest import KindEnv
from tests.kube import eventually

ROOT = Path(__file__).resolve().parents[2]
SA_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def operator_pods(kind: KindEnv) -> list[dict]:
    return kind.kubectl.get("pods", None, "-n", kind.namespace, "-l",
                            f"app.kubernetes.io/name=hyperplan,app.kubernetes.io/instance={kind.release}")["items"]


def test_the_cluster_has_a_ready_control_plane_and_two_ready_workers(kind: KindEnv) -> None:
    nodes = {n["metadata"]["name"]: n for n in kind.kubectl.get("nodes")["items"]}
    assert len(kind.workers) == 2, f"workers: {kind.workers}"
    for name in kind.nodes:
        ready = [c for c in nodes[name]["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", f"{name} is not Ready: {ready}"
        assert nodes[name]["spec"].get("podCIDR"), f"{name} has no podCIDR"
    for name in kind.workers:
        labels = nodes[name]["metadata"]["labels"]
        assert labels.get("node.kubernetes.io/instance-type") == "ml.p5.48xlarge", labels
        assert labels.get("topology.kubernetes.io/zone") == "us-east-1a", labels


def _ready(pod: dict) -> bool:
    conds = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    return pod["status"].get("phase") == "Running" and conds.get("Ready") == "True" \
        and "deletionTimestamp" not in pod["metadata"]


def _replicas(kind: KindEnv) -> int:
    return kind.kubectl.get("deployment", kind.release, "-n", kind.namespace)["spec"]["replicas"]


def ready_operator_pods(kind: KindEnv) -> list[dict]:
    """Every replica of the chart's Deployment Running and Ready (waits up to 3 minutes)."""
    want = _replicas(kind)
    return eventually(lambda: (lambda ready: ready if len(ready) == want else None)(
        [p for p in operator_pods(kind) if _ready(p)]),
        timeout=180, interval=2, what=f"{want} Running and Ready operator pods")


def test_the_operator_pods_are_running_and_ready(kind: KindEnv) -> None:
    pods = ready_operator_pods(kind)
    assert len(pods) == _replicas(kind) >= 1
    # Never on a node of the lent pool, whose drains would evict it (deploy/kind-values.yaml).
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in kind.kubectl.get("nodes")["items"]}
    assert all(LABEL_POOL not in nodes[p["spec"]["nodeName"]] for p in pods), \
        [p["spec"]["nodeName"] for p in pods]
    for pod in pods:
        container = pod["spec"]["containers"][0]
        assert container["image"].endswith(kind.operator_image), container["image"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        status = pod["status"]["containerStatuses"][0]
        assert status["ready"] and "running" in status["state"], status


def test_the_operator_uses_the_charts_service_account_and_in_cluster_configuration(kind: KindEnv) -> None:
    (pod, *_) = ready_operator_pods(kind)
    spec = pod["spec"]
    assert spec["serviceAccountName"] == kind.release
    sa = kind.kubectl.get("serviceaccount", kind.release, "-n", kind.namespace)
    assert sa["metadata"]["labels"]["app.kubernetes.io/instance"] == kind.release
    container = spec["containers"][0]
    env_names = {e["name"] for e in container.get("env", [])}
    assert not env_names & {"KUBECONFIG", "HYPERPLAN_KUBECONFIG"}, env_names
    mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
    assert SA_TOKEN_DIR in mounts, f"no service-account token mounted: {mounts}"
    assert all(m == SA_TOKEN_DIR or "kube" not in m for m in mounts), mounts
    # No kubeconfig anywhere the client looks, and the mounted token is the chart's account's:
    # the operator's client can only be the in-cluster one, as that account.
    probe = ("import base64, json, os; t = open('%s/token').read().split('.')[1]; "
             "claims = json.loads(base64.urlsafe_b64decode(t + '=' * (-len(t) %% 4))); "
             "print(os.environ.get('KUBECONFIG'), os.environ.get('HYPERPLAN_KUBECONFIG'), "
             "os.path.exists(os.path.expanduser('~/.kube/config')), claims['sub'])" % SA_TOKEN_DIR)
    out = kind.kubectl.run("-n", kind.namespace, "exec", pod["metadata"]["name"], "--",
                           "python", "-c", probe).stdout
    assert out.split() == ["None", "None", "False",
                           f"system:serviceaccount:{kind.namespace}:{kind.release}"], out
    # And it acts: it writes a plan's offerings through the API with that account.
    plan = {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "TrainingPlan",
            "metadata": {"name": "kind-tier-incluster"},
            "spec": {"instanceType": "ml.p5.48xlarge", "instanceCount": 1,
                     "targetResource": "training-job", "duration": "1d",
                     "startTimeAfter": "2030-01-01T00:00:00Z", "endTimeBefore": "2030-01-20T00:00:00Z"}}
    pool = {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "CapacityPool",
            "metadata": {"name": "kind-tier-incluster"},
            "spec": {"instanceType": "ml.p5.48xlarge", "availabilityZone": "us-east-1a",
                     "instanceCount": 4}}
    kind.kubectl.apply([pool, plan])
    try:
        got = eventually(lambda: (kind.kubectl.get("trainingplan", "kind-tier-incluster")
                                  .get("status") or {}).get("phase"),
                         timeout=60, what="the operator writing the plan's status")
        assert got
    finally:
        kind.kubectl.run("delete", "trainingplan,capacitypool", "kind-tier-incluster",
                         "--ignore-not-found", "--wait=true", "--timeout=60s")


def test_kubectl_logs_show_the_start_line(kind: KindEnv) -> None:
    logs = eventually(
        lambda: (lambda out: out if "hyperplan starting" in out else None)(
            kind.kubectl.run("-n", kind.namespace, "logs", f"deployment/{kind.release}").stdout),
        timeout=60, interval=2, what="the operator's start line in kubectl logs")
    assert "policy=demo" in logs, logs[:2000]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus_scrapes_the_operator_through_a_port_forward(kind: KindEnv, tmp_path: Path) -> None:
    port = _free_port()
    forward = subprocess.Popen(
        [str(build.binary("kubectl")), f"--kubeconfig={kind.kubeconfig}", "-n", kind.namespace,
         "port-forward", f"service/{kind.release}-metrics", f"{port}:8000"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        line = forward.stdout.readline()
        assert "Forwarding from" in line, line
        with prometheus.start([f"127.0.0.1:{port}"], tmp_path / "prometheus") as prom:
            prom.wait_for('up{job="hyperplan"} == 1', timeout=60)
            series = prom.wait_for('count({job="hyperplan", __name__=~"hyperplan_.+"}) > 0', timeout=60)
            assert float(series[0]["value"][1]) > 0
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def test_dev_kind_status_reports_the_nodes_and_the_operator(kind: KindEnv) -> None:
    import sys

    out = subprocess.run([str(Path(sys.executable).parent / "hyperplan"), "dev", "kind", "status"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = {l.split()[0] + " " + l.split()[1]: l for l in out.stdout.splitlines() if len(l.split()) > 2}
    for node in kind.nodes:
        assert lines.get(f"node {node}", "").endswith("Ready"), out.stdout
    assert "answers" in lines.get("kind cluster", ""), out.stdout
    replicas = _replicas(kind)
    assert any(l.startswith("operator") and f"{replicas}/{replicas} ready" in l
               for l in out.stdout.splitlines()), out.stdout


def _leader(kind: KindEnv) -> str | None:
    out = kind.kubectl.run("-n", kind.namespace, "get", "lease", f"{kind.release}-leader",
                           "-o", "jsonpath={.spec.holderIdentity}", check=False)
    return out.stdout.strip() or None


def test_killing_the_leaders_pod_hands_over_to_the_other_replica(kind: KindEnv) -> None:
    if _replicas(kind) < 2:
        pytest.fail("the chart runs one replica: nothing to hand over to")
    pods = {p["metadata"]["name"] for p in ready_operator_pods(kind)}
    leader = eventually(lambda: (lambda h: h if h in pods else None)(_leader(kind)),
                        timeout=60, what="one of the operator pods holding the Lease")
    kind.kubectl.run("-n", kind.namespace, "delete", "pod", leader, "--wait=false")
    new = eventually(lambda: (lambda h: h if h and h != leader else None)(_leader(kind)),
                     timeout=60, interval=1, what="another replica taking the Lease")
    assert new in pods, f"the Lease went to {new}, not to the standby among {pods}"
    logs = kind.kubectl.run("-n", kind.namespace, "logs", new).stdout
    assert f"leading as {new}" in logs, logs[-2000:]
    # The new leader acts: it answers a new plan.
    plan = {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "TrainingPlan",
            "metadata": {"name": "kind-tier-handover"},
            "spec": {"instanceType": "ml.p5.48xlarge", "instanceCount": 1,
                     "targetResource": "training-job", "duration": "1d",
                     "startTimeAfter": "2030-01-01T00:00:00Z", "endTimeBefore": "2030-01-20T00:00:00Z"}}
    kind.kubectl.apply(plan)
    try:
        eventually(lambda: (kind.kubectl.get("trainingplan", "kind-tier-handover").get("status") or {})
                   .get("phase"), timeout=60, what="the new leader writing the plan's status")
    finally:
        kind.kubectl.run("delete", "trainingplan", "kind-tier-handover", "--ignore-not-found",
                         "--wait=true", "--timeout=60s")
    ready_operator_pods(kind)  # and the Deployment is whole again
