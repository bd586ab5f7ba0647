"""The federation's harness: three named local control planes side by side, each its own cluster.

Each has its own API server (and etcd: what is made on one is on no other), its own operator
holding its own leader Lease, and only the capacity cluster's operator serves the SageMaker API,
as its own HyperPod cluster. ``hyperplan dev env|status --name`` point a user at each, and ``dev
up|down --name`` of a further plane leave the three running."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import uuid

from tests.aws.clients import boto3_call
from tests.aws.keys import grant_plan_reads, mint_key, serving
from tests.federation.conftest import FEDERATION_STATE, Cluster, dev, federation_plane
from tests.kube import Kubectl


def test_three_planes_run_side_by_side_each_its_own_cluster(capacity: Cluster, training_a: Cluster,
                                                            training_b: Cluster) -> None:
    members = (capacity, training_a, training_b)
    assert len({m.plane.server for m in members}) == 3
    ports = [set(m.plane.state().ports.values()) for m in members]
    assert not (ports[0] & ports[1] or ports[0] & ports[2] or ports[1] & ports[2]), ports
    assert {m.plane.dir for m in members} == {FEDERATION_STATE / "planes" / n
                                              for n in ("capacity", "training-a", "training-b")}

    name = f"made-on-training-a-{uuid.uuid4().hex[:6]}"
    training_a.kubectl.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                               "data": {"cluster": "training-a"}})
    assert training_a.kubectl.get("configmap", name)["data"] == {"cluster": "training-a"}
    assert capacity.kubectl.get_or_none("configmap", name) is None
    assert training_b.kubectl.get_or_none("configmap", name) is None

    for m in members:  # each operator leads on its own plane, none on another's
        lease = m.kubectl.get("lease", "hyperplan-leader")
        assert lease["spec"]["holderIdentity"] == f"{m.name}-replica-0"
        assert m.kubectl.get("crd", "trainingplans.hyperplan.dev")["metadata"]["name"]
        assert m.kubectl.get_or_none("crd", "workloads.kueue.x-k8s.io") is None  # named planes: no Kueue


def test_only_the_capacity_cluster_serves_the_sagemaker_api_as_itself(capacity: Cluster, training_a: Cluster,
                                                                       training_b: Cluster) -> None:
    ctx = capacity.context()
    user = f"federation-{uuid.uuid4().hex[:6]}"
    key_id, secret = mint_key(ctx, user)
    grant_plan_reads(ctx, user, f"sm-{user}",
                     {"apiGroups": ["hyperplan.dev"], "resources": ["instancegroups"], "verbs": ["list"]})
    endpoint = serving(ctx, key_id, secret)
    assert endpoint.url == capacity.sagemaker_api_url
    listed = boto3_call(endpoint, "list_clusters")
    assert "ok" in listed, listed
    assert [c["ClusterName"] for c in listed["ok"]["ClusterSummaries"]] == ["capacity"], listed
    assert listed["ok"]["ClusterSummaries"][0]["ClusterArn"].startswith("arn:aws:sagemaker:")
    for m in (training_a, training_b):
        assert m.sagemaker_api_url is None and "HYPERPLAN_SAGEMAKER_API_PORT" not in m.operator.env
        assert m.context().sagemaker_api_urls == ()


def in_dev_env(name: str, script: str) -> subprocess.CompletedProcess:
    """``script`` in a shell after ``eval "$(hyperplan dev env --name NAME)"``, as the README has it,
    from a PATH without the built kubectl and no KUBECONFIG: both come from what dev env prints."""
    hyperplan = shlex.join([sys.executable, "-m", "hyperplan.cli"])
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update(PATH="/usr/bin:/bin", HYPERPLAN_STATE_DIR=str(FEDERATION_STATE))
    return subprocess.run(["bash", "-c", f'eval "$({hyperplan} dev env --name {name})" && {script}'],
                          capture_output=True, text=True, timeout=120, env=env)


def test_dev_env_and_status_name_each_plane(capacity: Cluster, training_a: Cluster, training_b: Cluster) -> None:
    name = f"seen-by-env-{uuid.uuid4().hex[:6]}"
    training_b.kubectl.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})
    for m in (capacity, training_a, training_b):
        env = dev("env", "--name", m.name)
        assert env.returncode == 0, env.stderr
        assert f"export KUBECONFIG={m.kubeconfig}" in env.stdout.splitlines()
        # kubectl from the printed PATH, at the printed KUBECONFIG: this plane's API server
        shown = in_dev_env(m.name, f"kubectl get configmap {name} --ignore-not-found -o name && "
                                   "echo server=$(kubectl config view --minify -o "
                                   "jsonpath='{.clusters[0].cluster.server}')")
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[-1] == f"server={m.plane.server}"
        assert lines[:-1] == ([f"configmap/{name}"] if m is training_b else [])

        status = dev("status", "--name", m.name)
        assert status.returncode == 0, status.stdout + status.stderr
        rows = {line.split()[0]: line for line in status.stdout.splitlines()}
        assert "kueue" not in rows
        assert rows["kube-apiserver"].split()[-1] == m.plane.server
        assert rows["kubeconfig"].split()[-1] == str(m.kubeconfig)


def test_dev_down_of_one_plane_leaves_the_others_running(capacity: Cluster, training_a: Cluster,
                                                         training_b: Cluster) -> None:
    scratch = federation_plane("scratch")
    scratch.down(quiet=True)  # what a killed earlier run left
    try:
        up = dev("up", "--name", "scratch")
        assert up.returncode == 0, up.stdout + up.stderr
        assert "control plane 'scratch' ready at" in up.stdout
        pids = dict(scratch.state().pids)
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}
        assert Kubectl(scratch.kubeconfig).run("get", "namespace", "default").returncode == 0

        down = dev("down", "--name", "scratch")
        assert down.returncode == 0, down.stdout + down.stderr
        assert "control plane 'scratch' stopped and its state removed" in down.stdout
        for name, pid in pids.items():
            assert not _alive(pid), f"{name} (pid {pid}) still runs after dev down --name scratch"
        assert not scratch.dir.exists()
        gone = dev("status", "--name", "scratch")
        assert gone.returncode == 1 and gone.stdout.strip() == "control plane 'scratch' is not running"
    finally:
        scratch.down(quiet=True)

    for m in (capacity, training_a, training_b):
        status = dev("status", "--name", m.name)
        assert status.returncode == 0, f"{m.name} after scratch's down:\n{status.stdout}"
        assert m.kubectl.run("get", "namespace", "default").returncode == 0
        assert m.operator.proc.poll() is None, f"{m.name}'s operator exited"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for every purpose here
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False
