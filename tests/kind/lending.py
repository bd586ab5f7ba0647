"""Helpers of the kind tier's lending scenarios: hyperplan objects for the two kind workers (the
static pool of deploy/kind-config.yaml), what a user reads back (nodes, events, operator pods),
and a clean-up that leaves the workers in the free pool again."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hyperplan.api.vocabulary import LABEL_POOL
from tests.kind.conftest import KindEnv
from tests.kube import eventually

API = "hyperplan.dev/v1alpha1"
ITYPE, ZONE = "ml.p5.48xlarge", "us-east-1a"  # the workers' labels in deploy/kind-config.yaml
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"  # the sandbox image: already in every node's containerd


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_ts(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


def pool(name: str) -> dict:
    return {"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": name},
            "spec": {"instanceType": ITYPE, "availabilityZone": ZONE, "instanceCount": 2}}


def plan(name: str, duration: str, start_in: float) -> dict:
    return {"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": name},
            "spec": {"instanceType": ITYPE, "instanceCount": 2, "targetResource": "hyperpod-cluster",
                     "duration": duration, "autoPurchase": True,
                     "startTimeAfter": ts(utcnow() + timedelta(seconds=start_in))}}


def group(name: str, plan_name: str, count: int, **spec) -> dict:
    return {"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": name},
            "spec": {"trainingPlanRef": plan_name, "instanceType": ITYPE, "instanceCount": count,
                     "nodeProvider": "static", **spec}}


def first_block(kind: KindEnv, plan_name: str, timeout: float = 60) -> dict:
    return eventually(lambda: ((kind.kubectl.get("trainingplan", plan_name).get("status") or {})
                               .get("reservedCapacity") or [None])[0],
                      timeout=timeout, what=f"plan {plan_name} bought")


def held_nodes(kind: KindEnv, group_name: str) -> list[dict]:
    return kind.kubectl.get("nodes", None, "-l", f"hyperplan.dev/instance-group={group_name}")["items"]


def events_for(kind: KindEnv, name: str) -> list[tuple[str, str]]:
    items = kind.kubectl.get("events", None, "-A", f"--field-selector=involvedObject.name={name}")["items"]
    items.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return [(e["reason"], e.get("message", "")) for e in items]


def operator_pods(kind: KindEnv) -> dict[str, dict]:
    """The chart's pods by UID: (name, node, phase, restart count)."""
    pods = kind.kubectl.get("pods", None, "-n", kind.namespace, "-l",
                            f"app.kubernetes.io/name=hyperplan,app.kubernetes.io/instance={kind.release}")["items"]
    return {p["metadata"]["uid"]: {"name": p["metadata"]["name"], "node": p["spec"].get("nodeName"),
                                   "phase": p["status"].get("phase"),
                                   "deleting": "deletionTimestamp" in p["metadata"],
                                   "restarts": sum(c.get("restartCount", 0)
                                                   for c in p["status"].get("containerStatuses", []))}
            for p in pods}


def in_free_pool(kind: KindEnv) -> bool:
    """Both workers labelled node-restriction.kubernetes.io/hyperplan-pool=free, held by no group,
    schedulable."""
    for name in kind.workers:
        node = kind.kubectl.get("node", name)
        labels = node["metadata"]["labels"]
        if labels.get(LABEL_POOL) != "free" or "hyperplan.dev/instance-group" in labels \
                or node["spec"].get("unschedulable"):
            return False
    return True


def remove(kind: KindEnv, *objects: tuple[str, str]) -> None:
    """Delete (kind, name) pairs in order, waiting for each (the operator removes the finalizers:
    a group's nodes are drained and handed back first)."""
    for kind_name, name in objects:
        kind.kubectl.run("delete", kind_name, name, "--ignore-not-found", "--wait=true", "--timeout=120s")


def settled_operator_pods(kind: KindEnv) -> dict[str, dict]:
    """The chart's pods once exactly the Deployment's replicas exist, all Running (a rollout or a
    killed leader's replacement finished)."""
    want = kind.kubectl.get("deployment", kind.release, "-n", kind.namespace)["spec"]["replicas"]
    return eventually(lambda: (lambda ps: ps if len(ps) == want and all(
        p["phase"] == "Running" and not p["deleting"] for p in ps.values()) else None)(operator_pods(kind)),
        timeout=120, interval=2, what=f"{want} operator pods Running and no other")
