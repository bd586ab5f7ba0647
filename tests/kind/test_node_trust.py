"""Who may say what about a real node, on the kind cluster, with each party's own credentials.

- A kind worker's kubelet (its own client certificate, out of the node container): NodeRestriction
  lets it write ``hyperplan.dev/*`` labels on its own Node, which is why no such label is proof of
  anything (docs/security.md), and refuses it the static pool's key
  ``node-restriction.kubernetes.io/hyperplan-pool``: a kubelet cannot volunteer its node for lending.
- The chart's ServiceAccount (a short-lived token of the installed release): RBAC lets it write
  every node and pod, and the chart's admission policies refuse what the operator never does on
  the cluster's real kubelet nodes and pods.

Every write is ``--dry-run=server`` (or ``dryRun=All``): authorization and admission run in full,
and nothing changes on the cluster that the other kind tests use.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from hyperplan.api.vocabulary import LABEL_POOL, LABEL_TRUSTED_GROUP
from hyperplan.actuation.kube import api_client
from tests.kind.conftest import KindEnv
from tests.kube import Kubectl, eventually

DELETE_ONLY = "hyperplan may only delete nodes its kwok provider made; node {node} is not one"
NEITHER = "hyperplan may only change nodes its kwok provider made or nodes in its static pool"
LABELS = "hyperplan may not set or remove these labels on node {node}: "
CREATE_ONLY = "hyperplan may only create the nodes its kwok provider makes"
POD_ONLY = "hyperplan may only set the annotation hyperplan.dev/block-termination-time on a pod"
NOT_MARKED = "hyperplan may only delete a pod it marked first"


def kubeconfig_with(kind: KindEnv, path: Path, user: dict) -> Kubectl:
    """A kubeconfig for the kind API server (its address and CA from the admin's) as ``user``."""
    admin = yaml.safe_load(kind.kubeconfig.read_text())
    cluster = admin["clusters"][0]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "as",
        "clusters": [cluster], "users": [{"name": "as", "user": user}],
        "contexts": [{"name": "as", "context": {"cluster": cluster["name"], "user": "as"}}]}))
    return Kubectl(path)


@pytest.fixture(scope="module")
def as_kubelet(kind: KindEnv, tmp_path_factory: pytest.TempPathFactory) -> tuple[Kubectl, str]:
    """kubectl with the client certificate of the first worker's kubelet (``system:node:<worker>``)."""
    worker = kind.workers[0]
    pem = subprocess.run(["docker", "exec", worker, "cat", "/var/lib/kubelet/pki/kubelet-client-current.pem"],
                         capture_output=True, check=True, timeout=60).stdout
    data = base64.b64encode(pem).decode()  # one PEM with the certificate and its key: both fields read it
    k = kubeconfig_with(kind, tmp_path_factory.mktemp("kubelet") / "kubeconfig",
                        {"client-certificate-data": data, "client-key-data": data})
    assert k.run("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").stdout == f"system:node:{worker}"
    return k, worker


@pytest.fixture(scope="module")
def as_operator(kind: KindEnv, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    """kubectl as the installed chart's ServiceAccount."""
    token = kind.kubectl.run("create", "token", kind.release, "-n", kind.namespace, "--duration=10m").stdout.strip()
    k = kubeconfig_with(kind, tmp_path_factory.mktemp("sa") / "kubeconfig", {"token": token})
    assert k.run("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").stdout == \
        f"system:serviceaccount:{kind.namespace}:{kind.release}"
    return k


@pytest.mark.parametrize("label, refused", [
    (f"{LABEL_POOL}=held", f"is not allowed to modify labels: {LABEL_POOL}"),
    (f"{LABEL_TRUSTED_GROUP}=g", f"is not allowed to modify labels: {LABEL_TRUSTED_GROUP}"),
    ("node-role.kubernetes.io/gpu=", "is not allowed to modify labels: node-role.kubernetes.io/gpu"),
    ("hyperplan.dev/pool=free", None),
    ("hyperplan.dev/instance-group=g", None),
], ids=["static-pool-key", "trusted-group-key", "node-role", "old-pool-key-allowed", "group-label-allowed"])
def test_a_kubelet_cannot_grant_its_own_node_the_keys_hyperplan_trusts(as_kubelet, label, refused) -> None:
    k, worker = as_kubelet
    proc = k.run("label", "node", worker, label, "--overwrite", "--dry-run=server", check=False)
    if refused is None:  # anything under hyperplan.dev/ is the kubelet's to write: never proof
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode != 0 and refused in proc.stderr, proc.stderr


def test_a_kubelet_cannot_label_another_node(as_kubelet, kind: KindEnv) -> None:
    k, worker = as_kubelet
    other = next(w for w in kind.workers if w != worker)
    proc = k.run("label", "node", other, "hyperplan.dev/node-id=x", "--dry-run=server", check=False)
    assert proc.returncode != 0 and "forbidden" in proc.stderr.lower(), proc.stderr


def test_the_service_account_is_refused_on_the_clusters_real_nodes(as_operator: Kubectl, kind: KindEnv) -> None:
    """The chart's node policy, on kubelet nodes: the free static workers and the control plane."""
    worker, control = kind.workers[0], kind.control_plane
    # The policies take effect once compiled; the release is installed well before, but make sure.
    eventually(lambda: as_operator.run("label", "node", control, f"hijacked={uuid.uuid4().hex[:4]}",
                                       "--dry-run=server", check=False).returncode != 0,
               timeout=60, what="the node policy to refuse a foreign node")
    cases = [
        (("delete", "node", worker, "--dry-run=server"), DELETE_ONLY.format(node=worker)),
        (("delete", "node", control, "--dry-run=server"), DELETE_ONLY.format(node=control)),
        (("label", "node", control, "hijacked=true", "--dry-run=server"), NEITHER),
        (("label", "node", worker, "node-role.kubernetes.io/gpu=", "--dry-run=server"),
         LABELS.format(node=worker) + "node-role.kubernetes.io/gpu"),
        (("label", "node", worker, f"{LABEL_POOL}-", "--dry-run=server"), LABELS.format(node=worker) + LABEL_POOL),
        (("annotate", "node", worker, "example.com/owner=me", "--dry-run=server"),
         f"hyperplan may only write hyperplan.dev/* annotations on node {worker}: example.com/owner"),
    ]
    for args, refusal in cases:
        proc = as_operator.run(*args, check=False)
        assert proc.returncode != 0, f"allowed: {' '.join(args)}"
        assert refusal in proc.stderr, (args, proc.stderr)
    forged = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"forged-{uuid.uuid4().hex[:5]}"}}
    proc = as_operator.run("create", "--dry-run=server", "-f", "-", input=json.dumps(forged), check=False)
    assert proc.returncode != 0 and CREATE_ONLY in proc.stderr, proc.stderr
    # What the operator does to a free static node passes: the adoption's labels.
    proc = as_operator.run("label", "node", worker, f"{LABEL_POOL}=held", "hyperplan.dev/node-id=hp-g-x-0",
                           "hyperplan.dev/instance-group=g", f"{LABEL_TRUSTED_GROUP}=g", "--overwrite",
                           "--dry-run=server", check=False)
    assert proc.returncode == 0, proc.stderr


def test_the_service_account_is_refused_on_the_clusters_real_pods(as_operator: Kubectl, kind: KindEnv) -> None:
    """The chart's pod policy, on a pod the cluster runs (CoreDNS): RBAC lets the account patch
    and delete any pod; the policy lets through only the operator's own writes."""
    pods = kind.kubectl.get("pods", None, "-n", "kube-system", "-l", "k8s-app=kube-dns")["items"]
    assert pods, "no CoreDNS pod"
    name = pods[0]["metadata"]["name"]
    api = client.CoreV1Api(api_client(str(as_operator.kubeconfig)))

    def refusal(call) -> str:
        try:
            call()
        except ApiException as e:
            return json.loads(e.body).get("message", e.body)
        return ""

    assert POD_ONLY in refusal(lambda: api.patch_namespaced_pod(
        name, "kube-system", {"metadata": {"labels": {"app": "hijacked"}}}, dry_run="All"))
    assert NOT_MARKED in refusal(lambda: api.delete_namespaced_pod(name, "kube-system", dry_run="All"))
    assert refusal(lambda: api.patch_namespaced_pod(
        name, "kube-system", {"metadata": {"annotations": {"hyperplan.dev/block-termination-time":
                                                           "2030-01-01T00:00:00Z"}}}, dry_run="All")) == ""
