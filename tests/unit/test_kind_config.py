"""The kind config that `dev kind up` passes to `kind create`: deploy/kind-config.yaml as written,
plus only the CNI settings a locally built node image needs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hyperplan.api.vocabulary import LABEL_POOL, POOL_FREE
from hyperplan_dev.kind import CREATE, POOL, README_STEPS, KindCluster

ROOT = Path(__file__).resolve().parents[2]
DEPLOYED = yaml.safe_load((ROOT / "deploy" / "kind-config.yaml").read_text())


@pytest.mark.parametrize("local_images,networking", [
    (False, None),
    (True, {"disableDefaultCNI": True, "podSubnet": "10.244.0.0/16"}),
], ids=["pulled-kindest-node-keeps-kindnetd", "local-node-image-uses-podnet"])
def test_generated_config(tmp_path: Path, local_images: bool, networking: dict | None) -> None:
    root = tmp_path / "checkout"
    (root / "deploy").mkdir(parents=True)
    (root / "deploy" / "kind-config.yaml").write_text((ROOT / "deploy" / "kind-config.yaml").read_text())
    written = yaml.safe_load(KindCluster(root=root).write_config(local_images).read_text())
    assert written.pop("networking", None) == networking
    assert written == DEPLOYED


def test_deploy_config_has_one_control_plane_two_workers_and_the_cgroup_v1_patch() -> None:
    assert DEPLOYED["name"] == "hyperplan"
    assert [n["role"] for n in DEPLOYED["nodes"]] == ["control-plane", "worker", "worker"]
    patches = [yaml.safe_load(p) for p in DEPLOYED["kubeadmConfigPatches"]]
    assert {"kind": "KubeletConfiguration", "failCgroupV1": False} in patches


def test_the_static_pool_is_labelled_by_the_admin_after_kind_creates_the_cluster() -> None:
    """A kubelet refuses to start with a node-restriction.kubernetes.io/ key in --node-labels (kind
    passes a node's ``labels`` that way), and the pool key is one by design: the workers are
    labelled into the pool by kubectl, right after the cluster is created."""
    worker_labels = [key for n in DEPLOYED["nodes"] for key in n.get("labels", {})]
    assert worker_labels and not [k for k in worker_labels if k.startswith("node-restriction.kubernetes.io/")]
    assert README_STEPS[POOL] == f"kubectl label nodes -l '!node-role.kubernetes.io/control-plane' {LABEL_POOL}={POOL_FREE}"
    assert POOL == CREATE + 1
