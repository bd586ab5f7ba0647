"""A node failure on a real node: while a static group holds both kind workers, one worker's
container is frozen (`docker pause`), so its kubelet stops posting status. The cluster's own
node-lifecycle controller sets Ready=Unknown after its node-monitor grace period; after the group's
`healthCheck.graceSeconds` hyperplan marks the node `UnschedulablePendingReplacement`, taints it
`hyperplan.dev/unhealthy`, and says so in a `NodeUnhealthy` event on the node. A static pool has
no free node left to replace it with, so the group says `NoFreeNode`, and the failed node is kept
(make before break) until the group lets it go; it keeps its health label after the hand-back so
that it is not lent again until someone who repaired it removes the label (docs/kind.md)."""

from __future__ import annotations

import subprocess
import time
import uuid
from typing import Callable

from tests.kind import lending as L
from tests.kind.conftest import KindEnv
from tests.kube import Kubectl, eventually

HEALTH = "hyperplan.dev/node-health-status"


def ready_status(kind: KindEnv, node: str) -> str | None:
    conds = kind.kubectl.get("node", node)["status"].get("conditions", [])
    return next((c["status"] for c in conds if c["type"] == "Ready"), None)


def test_a_frozen_worker_is_marked_for_replacement_and_the_user_sees_why(kind: KindEnv) -> None:
    k = kind.kubectl
    tag = uuid.uuid4().hex[:5]
    name = f"fail-{tag}"
    victim, other = kind.workers[-1], kind.workers[0]
    started = time.monotonic()

    def step(what: str) -> None:
        print(f"[failure] {what} ({time.monotonic() - started:.0f}s)", flush=True)

    eventually(lambda: L.in_free_pool(kind), timeout=120, what="both workers in the free pool")
    ops_before = L.settled_operator_pods(kind)
    try:
        _lend_freeze_and_check(kind, k, name, tag, victim, other, step)
    finally:
        L.remove(kind, ("instancegroup", name), ("trainingplan", name), ("capacitypool", name))
        # Handed back, the failed node keeps its verdict; the admin who repaired it removes it.
        eventually(lambda: "hyperplan.dev/instance-group" not in k.get("node", victim)["metadata"]["labels"],
                   timeout=60, what=f"{victim} handed back")
        kept = k.get("node", victim)["metadata"]["labels"].get(HEALTH)
        k.run("label", "node", victim, f"{HEALTH}-")
        eventually(lambda: L.in_free_pool(kind), timeout=120, what="both workers back in the free pool")
        step("cleaned up")
    assert kept == "UnschedulablePendingReplacement", kept
    ops_after = L.operator_pods(kind)
    assert set(ops_after) == set(ops_before) and all(p["phase"] == "Running" for p in ops_after.values())


def _lend_freeze_and_check(kind: KindEnv, k: Kubectl, name: str, tag: str, victim: str, other: str,
                           step: Callable[[str], None]) -> None:
    """Lend both workers, freeze ``victim``, check what the user sees, unfreeze (always)."""
    paused = False
    try:
        k.apply([L.pool(name), L.plan(name, "4m", start_in=15)])
        k.apply(L.group(name, name, 2, labels={"team": f"t-{tag}"},
                        healthCheck={"graceSeconds": 5, "maxUnhealthy": 1, "rebootBudget": 0}))
        eventually(lambda: len(L.held_nodes(kind, name)) == 2, timeout=90, interval=1, what="both workers adopted")
        step("both workers adopted")
        subprocess.run(["docker", "pause", victim], check=True, capture_output=True, timeout=60)
        paused = True
        step(f"docker pause {victim}")
        eventually(lambda: ready_status(kind, victim) == "Unknown", timeout=150, interval=2,
                   what=f"the node-lifecycle controller setting {victim} Ready=Unknown")
        step(f"{victim} Ready=Unknown")
        marked = eventually(
            lambda: (lambda n: n if n["metadata"]["labels"].get(HEALTH) == "UnschedulablePendingReplacement" else None)(
                k.get("node", victim)), timeout=60, interval=1, what=f"{victim} marked for replacement")
        step(f"{victim} marked")
        unhealthy = eventually(lambda: [m for r, m in L.events_for(kind, victim) if r == "NodeUnhealthy"],
                               timeout=30, interval=1, what="a NodeUnhealthy event on the node")
        group_events = eventually(lambda: (lambda ev: ev if any(r == "NoFreeNode" for r, _ in ev) else None)(
            L.events_for(kind, name)), timeout=30, interval=1, what="a NoFreeNode warning on the group")
        status = k.get("instancegroup", name)["status"]
        healthy_peer = k.get("node", other)
    finally:
        if paused:
            subprocess.run(["docker", "unpause", victim], capture_output=True, timeout=60)
            step(f"docker unpause {victim}")
    # What a user sees while the worker is down.
    taints = {(t["key"], t.get("value"), t["effect"]) for t in marked["spec"].get("taints", [])}
    assert ("hyperplan.dev/unhealthy", "true", "NoSchedule") in taints, taints
    assert marked["metadata"]["labels"]["hyperplan.dev/instance-group"] == name
    assert any("Ready=Unknown" in m and "UnschedulablePendingReplacement" in m for m in unhealthy), unhealthy
    assert status["unhealthyCount"] == 1, status
    no_free = [m for r, m in group_events if r == "NoFreeNode"]
    assert no_free, group_events
    # The healthy worker is untouched: still lent, schedulable, no verdict.
    assert healthy_peer["metadata"]["labels"].get(HEALTH) in (None, "Schedulable")
    assert not healthy_peer["spec"].get("unschedulable")
    eventually(lambda: ready_status(kind, victim) == "True", timeout=90, interval=2,
               what=f"{victim} Ready again after docker unpause")
    step(f"{victim} Ready again")
