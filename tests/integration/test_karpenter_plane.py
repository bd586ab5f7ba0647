"""Real Karpenter (its kwok provider, build.KARPENTER_VERSION) on the local control plane.

Karpenter runs out of cluster beside the session's plane: a static NodePool (``spec.replicas``)
gets its NodeClaims launched, the plane's KWOK makes their Nodes Ready (the provider creates them
with phase Pending, which the stage hyperplan-karpenter-node-initialize takes), the Nodes carry
the NodePool's zone, instance type and template label, and scaling the NodePool to 0 takes them
away. Karpenter is stopped by the pid it was started with, the plane keeps running.

Needs the cached binary (``make binaries`` builds it, as CI does); without it the test fails
and says so, it is never skipped.
"""

from __future__ import annotations

import os
import uuid

import pytest

from hyperplan_dev import build, karpenter
from hyperplan_dev.karpenter import Karpenter
from hyperplan_dev.plane import Plane
from tests.kube import Kubectl, eventually

pytestmark = pytest.mark.integration

ITYPE = "ml.p5.48xlarge"
ZONE = "us-east-1c"
NODEPOOL_LABEL = "karpenter.sh/nodepool"


def _condition(obj: dict, kind: str) -> str | None:
    return next((c["status"] for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def running_karpenter(plane: Plane):
    """Karpenter started on the plane; stopped again whatever the test did."""
    if not build.component("karpenter").is_built():
        pytest.fail(f"Karpenter {build.KARPENTER_VERSION} is not in the binary cache "
                    f"({build.component('karpenter').dir}); `make binaries` builds it", pytrace=False)
    k = Karpenter(plane, log=lambda line: print(f"[karpenter] {line}", flush=True))
    k.start()
    yield k
    k.stop()


def _nodeclass(name: str) -> dict:
    return {"apiVersion": f"{karpenter.NODECLASS_GROUP}/v1alpha1", "kind": karpenter.NODECLASS_KIND,
            "metadata": {"name": name}}


def _static_nodepool(name: str, nodeclass: str, replicas: int, team: str) -> dict:
    return {
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "template": {
                "metadata": {"labels": {"team": team}},
                "spec": {
                    "nodeClassRef": {"group": karpenter.NODECLASS_GROUP, "kind": karpenter.NODECLASS_KIND,
                                     "name": nodeclass},
                    "requirements": [
                        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [ITYPE]},
                        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["reserved"]},
                    ],
                    "expireAfter": "Never",
                },
            },
        },
    }


def _node_of(kubectl: Kubectl, claim: dict) -> dict:
    """The claim's Node, checked to be the one Karpenter launched for it: the same providerID, and
    an owner reference to the claim's uid (how hyperplan will tie a Node to its NodeClaim)."""
    node = kubectl.get("node", claim["status"]["nodeName"])
    assert node["spec"]["providerID"] == claim["status"]["providerID"]
    assert node["spec"]["providerID"].startswith("kwok://")
    assert [(o["kind"], o["uid"]) for o in node["metadata"]["ownerReferences"]] == \
        [("NodeClaim", claim["metadata"]["uid"])]
    return node


def test_a_static_nodepool_gets_ready_kwok_nodes_and_scales_to_zero(crds: Kubectl, plane: Plane,
                                                                      running_karpenter: Karpenter) -> None:
    kubectl = crds
    tag = uuid.uuid4().hex[:6]
    nodeclass, pool, team = f"kwok-{tag}", f"static-{tag}", f"karpenter-{tag}"
    kubectl.apply([_nodeclass(nodeclass), _static_nodepool(pool, nodeclass, 2, team)])
    try:
        def ready_claims() -> list[dict]:
            claims = kubectl.get("nodeclaims", None, "-l", f"{NODEPOOL_LABEL}={pool}")["items"]
            return claims if len(claims) == 2 and all(_condition(c, "Ready") == "True" for c in claims) else []

        claims = eventually(ready_claims, timeout=60, interval=1, what="2 NodeClaims Ready")
        for claim in claims:
            assert [(o["kind"], o["name"]) for o in claim["metadata"]["ownerReferences"]] == [("NodePool", pool)]
            node = _node_of(kubectl, claim)
            labels = node["metadata"]["labels"]
            assert _condition(node, "Ready") == "True", node["metadata"]["name"]
            assert node["status"]["phase"] == "Running"
            assert (labels["node.kubernetes.io/instance-type"], labels["topology.kubernetes.io/zone"],
                    labels["team"], labels[NODEPOOL_LABEL], labels["karpenter.sh/capacity-type"]) == \
                (ITYPE, ZONE, team, pool, "reserved")
            # The instance type's resources from the file Karpenter was given (hyperplan's shape).
            assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
            # Karpenter registered it: its unregistered taint is gone.
            assert "karpenter.sh/unregistered" not in {t["key"] for t in node["spec"].get("taints") or []}
        nodes = {c["status"]["nodeName"] for c in claims}

        kubectl.run("scale", "nodepool", pool, "--replicas=0")

        def gone() -> bool:
            left = kubectl.get("nodeclaims", None, "-l", f"{NODEPOOL_LABEL}={pool}")["items"]
            names = {n["metadata"]["name"] for n in kubectl.get("nodes")["items"]}
            return not left and not (nodes & names)

        eventually(gone, timeout=60, interval=1, what="the NodeClaims and their Nodes gone after scaling to 0")
    finally:
        # Deleted while Karpenter still runs: its finalizers on the NodeClaims and Nodes would
        # otherwise stay behind on the session's plane.
        kubectl.delete("nodepool", pool, "--wait=true", "--timeout=60s")
        kubectl.delete(f"{karpenter.NODECLASS_KIND.lower()}es.{karpenter.NODECLASS_GROUP}", nodeclass,
                       "--wait=true", "--timeout=60s")

    pid = running_karpenter.state().pid
    running_karpenter.stop()
    assert not _alive(pid) and not running_karpenter.running()
    assert running_karpenter.state() is None
    # The plane's own processes were left alone.
    st = plane.state()
    assert all(plane._is_ours(name, st.pids[name]) for name in plane.processes)


def test_a_nodeclaim_without_a_nodepool_is_launched_and_goes_when_deleted(crds: Kubectl,
                                                                          running_karpenter: Karpenter) -> None:
    """What `nodeProvider: karpenter` could do per slot (docs/karpenter.md): the kwok provider
    launches a NodeClaim that no NodePool made, as long as it names its instance type."""
    kubectl = crds
    tag = uuid.uuid4().hex[:6]
    nodeclass, name = f"kwok-{tag}", f"alone-{tag}"
    kubectl.apply(_nodeclass(nodeclass))
    kubectl.apply({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {"name": name, "labels": {"team": f"karpenter-{tag}"}},
        "spec": {"nodeClassRef": {"group": karpenter.NODECLASS_GROUP, "kind": karpenter.NODECLASS_KIND,
                                  "name": nodeclass},
                 "expireAfter": "Never",
                 "requirements": [
                     {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["ml.p6e-gb200.36xlarge"]},
                     {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2b"]},
                     {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["reserved"]}]},
    })
    try:
        claim = eventually(lambda: (c := kubectl.get("nodeclaim", name)) and _condition(c, "Ready") == "True" and c,
                           timeout=60, interval=1, what="the NodeClaim Ready")
        node = _node_of(kubectl, claim)
        labels = node["metadata"]["labels"]
        assert _condition(node, "Ready") == "True"
        assert NODEPOOL_LABEL not in labels
        assert (labels["node.kubernetes.io/instance-type"], labels["topology.kubernetes.io/zone"],
                labels["karpenter.sh/capacity-type"], labels["team"]) == \
            ("ml.p6e-gb200.36xlarge", "us-west-2b", "reserved", f"karpenter-{tag}")
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"

        kubectl.delete("nodeclaim", name, "--wait=true", "--timeout=60s")
        eventually(lambda: kubectl.get_or_none("node", node["metadata"]["name"]) is None, timeout=60, interval=1,
                   what="its Node gone with it")
        # Nothing replaces it: no NodePool holds a count of it.
        assert not [c for c in kubectl.get("nodeclaims")["items"] if c["metadata"]["labels"].get("team") == f"karpenter-{tag}"]
    finally:
        kubectl.delete("nodeclaim", name, "--wait=true", "--timeout=60s")
        kubectl.delete(f"{karpenter.NODECLASS_KIND.lower()}es.{karpenter.NODECLASS_GROUP}", nodeclass,
                       "--wait=true", "--timeout=60s")


def test_dev_up_with_karpenter_starts_it_beside_a_named_plane_and_down_stops_it(tmp_path) -> None:
    """``hyperplan dev up --name NAME --karpenter`` as a user runs it: Karpenter in ``dev status``,
    its process gone after ``dev down --name NAME``."""
    import subprocess
    import sys
    env = {**os.environ, "HYPERPLAN_STATE_DIR": str(tmp_path / "state")}

    def dev(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hyperplan.cli", "dev", *args], capture_output=True, text=True,
                              timeout=300, env=env)
    name = f"kp-{uuid.uuid4().hex[:4]}"
    try:
        up = dev("up", "--name", name, "--karpenter")
        assert up.returncode == 0, up.stderr + up.stdout
        assert "karpenter ready" in up.stdout
        status = dev("status", "--name", name)
        [row] = [line for line in status.stdout.splitlines() if line.startswith("karpenter") and "pid " in line]
        pid = int(row.split("pid ")[1].split(")")[0])
        assert "running" in row and _alive(pid)
        # the node class the settings default to, made by dev up (karpenter.kwok.sh/KWOKNodeClass/default)
        [classes] = [line for line in status.stdout.splitlines() if line.startswith("karpenter node classes")]
        assert "1 present" in classes and "default" in classes, classes
    finally:
        down = dev("down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert "stopping karpenter" in down.stdout
    eventually(lambda: not _alive(pid), timeout=30, what="karpenter stopped by dev down")
