"""The Helm lifecycle on the kind cluster: `helm upgrade` with a changed value rolls the operator's
Deployment and a group created before carries on; then the README's removal steps
(hyperplan_dev.kind.REMOVAL_STEPS) leave nothing of hyperplan behind.

This file runs last in the session (its name sorts last in tests/kind/): it uninstalls the
operator. The session's `hyperplan dev kind down` deletes the cluster afterwards; a reused
cluster is left without hyperplan (`hyperplan dev kind up` installs it again)."""

from __future__ import annotations

import shlex
import subprocess
import time
import uuid

from hyperplan.api.vocabulary import LABEL_POOL
from hyperplan_dev.kind import REMOVAL_STEPS
from tests.kind import lending as L
from tests.kind.conftest import ROOT, KindEnv
from tests.kube import eventually

SELECTOR = "app.kubernetes.io/name=hyperplan,app.kubernetes.io/instance="


def run_documented(kind: KindEnv, command: str, timeout: float = 300) -> str:
    """One documented command, as written, with the cached kubectl/helm on the kind kubeconfig."""
    argv = shlex.split(command)
    tool = {"kubectl": kind.cluster.kubectl_bin, "helm": kind.cluster.helm_bin}[argv[0]]()
    print(f"[lifecycle] $ {command}", flush=True)
    r = subprocess.run([tool, "--kubeconfig", str(kind.kubeconfig), *argv[1:]], cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"`{command}` failed (exit {r.returncode}): {r.stdout}{r.stderr}"
    return r.stdout


def replica_sets(kind: KindEnv) -> dict[str, int]:
    items = kind.kubectl.get("replicasets", None, "-n", kind.namespace, "-l", SELECTOR + kind.release)["items"]
    return {rs["metadata"]["name"]: rs["status"].get("readyReplicas", 0) for rs in items}


def ready_pods(kind: KindEnv) -> list[dict]:
    pods = kind.kubectl.get("pods", None, "-n", kind.namespace, "-l", SELECTOR + kind.release)["items"]
    return [p for p in pods if p["status"].get("phase") == "Running" and "deletionTimestamp" not in p["metadata"]
            and all(c.get("ready") for c in p["status"].get("containerStatuses", []))]


def test_helm_upgrade_rolls_the_deployment_and_a_group_carries_on(kind: KindEnv) -> None:
    k = kind.kubectl
    name = f"upgrade-{uuid.uuid4().hex[:5]}"
    eventually(lambda: L.in_free_pool(kind), timeout=120, what="both workers in the free pool")
    rs_before = replica_sets(kind)
    uids_before = {p["metadata"]["uid"] for p in ready_pods(kind)}
    # A plan bought before the upgrade whose block starts after it: the group's adoption of a
    # worker is a transition the upgraded operator makes.
    k.apply([L.pool(name), L.plan(name, "5m", start_in=30)])
    k.apply(L.group(name, name, 1, labels={"team": "upgrade"}))
    block = L.first_block(kind, name)
    eventually(lambda: (k.get("instancegroup", name).get("status") or {}).get("phase") == "Waiting",
               timeout=30, what="the group Waiting for its block")
    try:
        started = time.monotonic()
        run_documented(kind, f"helm upgrade {kind.release} charts/hyperplan --namespace {kind.namespace} "
                             "--reuse-values --set verbose=true --wait --timeout 3m")
        print(f"[lifecycle] helm upgrade done in {time.monotonic() - started:.0f}s", flush=True)
        upgraded_at = L.utcnow()
        deployment = k.get("deployment", kind.release, "-n", kind.namespace)
        env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["HYPERPLAN_VERBOSE"] == "true", env
        new_rs = eventually(lambda: (lambda rs: [n for n, ready in rs.items() if n not in rs_before
                                                 and ready == deployment["spec"]["replicas"]])(replica_sets(kind)),
                            timeout=120, interval=2, what="a new ReplicaSet with every replica Ready")
        pods = eventually(lambda: (lambda ps: ps if len(ps) == deployment["spec"]["replicas"]
                                   and not {p["metadata"]["uid"] for p in ps} & uids_before else None)(ready_pods(kind)),
                          timeout=120, interval=2, what="only new operator pods, all Ready")
        assert all(p["metadata"]["ownerReferences"][0]["name"] in new_rs for p in pods)
        assert upgraded_at < L.parse_ts(block["startTime"]), "the upgrade outlasted the wait for the block"
        # The group carries on: at its block's start the upgraded operator lends it a worker.
        status = eventually(lambda: (lambda s: s if s.get("phase") == "Ready" else None)(
            k.get("instancegroup", name).get("status") or {}), timeout=120, interval=1,
            what="the group Ready after the upgrade")
        assert status["readyCount"] == 1
        (node,) = L.held_nodes(kind, name)
        assert node["metadata"]["labels"]["team"] == "upgrade"
        assert ("NodeAdopted" in [r for r, _ in L.events_for(kind, name)])
        assert k.get("trainingplan", name)["status"]["phase"] == "Active"
    except BaseException:
        L.remove(kind, ("instancegroup", name), ("trainingplan", name), ("capacitypool", name))
        raise
    # On success the group keeps its worker: the removal test below deletes it the documented way.


def test_the_documented_removal_leaves_nothing_of_hyperplan(kind: KindEnv) -> None:
    k = kind.kubectl
    held = k.get("nodes", None, "-l", "hyperplan.dev/instance-group")["items"]
    for command in REMOVAL_STEPS:
        run_documented(kind, command)
    crds = [c["metadata"]["name"] for c in k.get("crds")["items"] if c["metadata"]["name"].endswith(".hyperplan.dev")]
    assert crds == []
    eventually(lambda: k.get_or_none("namespace", kind.namespace) is None, timeout=120, interval=2,
               what=f"namespace {kind.namespace} gone")
    leftovers = [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in k.get("pods", None, "-A")["items"]
                 if "hyperplan" in p["metadata"]["name"] and not p["metadata"]["name"].startswith("kube-")
                 and p["metadata"]["namespace"] != "kube-system"]
    assert leftovers == []
    for kind_name in ("clusterrole", "clusterrolebinding"):
        assert k.get_or_none(kind_name, kind.release) is None
    # A worker lent when the removal started was drained and handed back by the operator.
    for name in kind.workers:
        node = k.get("node", name)
        labels = node["metadata"]["labels"]
        assert {key for key in labels if key.startswith("hyperplan.dev/")} == set(), labels
        assert labels[LABEL_POOL] == "free" and "team" not in labels
        assert not node["spec"].get("unschedulable")
        assert [t for t in node["spec"].get("taints") or [] if t["key"].startswith("hyperplan.dev/")] == []
    print(f"[lifecycle] workers lent when the removal started: {[n['metadata']['name'] for n in held]}", flush=True)
