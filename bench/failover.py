"""Failover: how soon after the leader dies does the standby reconcile?

Two `hyperplan run` replicas share the leader Lease (defaults: lease 15 s, renew deadline 10 s,
retry 2 s). Each round stops the acting replica, with kill -9 or with SIGTERM, creates a new
TrainingPlan at once, and times from the signal to that plan's first status write, which only
a replica that leads can make. The stopped replica is then started again as the new standby.

Targets: <= lease duration + 2 s after a kill -9,
<= 3 s after a SIGTERM (the leader releases the Lease on its way out).

    .venv/bin/python bench/failover.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    API, Harness, fmt, machine, pool, print_figures, run, step, summary, verdict, wait_for,
)

LEASE = 15.0


def holder(h: Harness) -> str:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        lease = client.CoordinationV1Api(h.client).read_namespaced_lease("hyperplan-leader", "default")
    except ApiException as e:
        if e.status == 404:
            return ""
        raise
    return lease.spec.holder_identity or ""


def main(h: Harness, args: argparse.Namespace) -> int:
    replicas = {}

    def start(identity: str):
        op = h.start_operator(extra_env={"HYPERPLAN_LEADER_ELECTION_IDENTITY": identity}, replica=identity)
        replicas[identity] = op
        return op

    h.create("capacitypools", pool("failover", "ml.failover.xlarge", 64, "us-east-1a"))
    start("replica-a")
    wait_for(lambda: holder(h) == "replica-a", timeout=30, what="replica-a leading")
    start("replica-b")
    results: list[tuple[str, float]] = []
    try:
        for k in range(args.rounds * 2):
            how = signal.SIGKILL if k % 2 == 0 else signal.SIGTERM
            leader = holder(h)
            standby = next(i for i in replicas if i != leader)
            name = f"failover-{uuid.uuid4().hex[:6]}"
            op = replicas[leader]
            t0 = time.monotonic()
            os.killpg(op.pid, how) if how == signal.SIGKILL else op.proc.send_signal(how)
            h.create("trainingplans", {
                "apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": name},
                "spec": {"instanceType": "ml.failover.xlarge", "instanceCount": 1,
                         "targetResource": "training-job", "duration": "2m"}})
            wait_for(lambda: h.status("trainingplans", name).get("phase"), timeout=LEASE + 30,
                     what=f"{name} reconciled by {standby}", interval=0.05)
            took = time.monotonic() - t0
            op.proc.wait(timeout=30)
            new = holder(h)
            step(f"round {k + 1}: {leader} stopped by {signal.Signals(how).name}; {new} reconciled "
                 f"{name} {took:.2f} s later (exit code of the old leader {op.proc.returncode})")
            if new != standby:
                raise AssertionError(f"expected {standby} to lead, the lease names {new!r}")
            results.append((signal.Signals(how).name, took))
            start(leader)  # back as the standby
    finally:
        for op in replicas.values():
            if op.alive():
                op.proc.send_signal(signal.SIGTERM)
                op.proc.wait(timeout=30)
        h.operator = None

    kills = [t for how, t in results if how == "SIGKILL"]
    terms = [t for how, t in results if how == "SIGTERM"]
    sk, st = summary(kills), summary(terms)
    rows = [
        ("machine", machine(), "", ""),
        (f"kill -9 -> standby's first reconcile (max of {len(kills)})", fmt(sk["max"], 2),
         f"<= {LEASE + 2:.0f} s", verdict(sk["max"] <= LEASE + 2)),
        ("kill -9 (median)", fmt(sk["p50"], 2), "", ""),
        (f"SIGTERM -> standby's first reconcile (max of {len(terms)})", fmt(st["max"], 2), "<= 3 s",
         verdict(st["max"] <= 3)),
        ("SIGTERM (median)", fmt(st["p50"], 2), "", ""),
    ]
    print_figures("failover", rows)
    return 0 if sk["max"] <= LEASE + 2 and st["max"] <= 3 else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each kind of stop")
    args = ap.parse_args()
    run(lambda h: main(h, args), "failover", budget=120 + args.rounds * 2 * 45)
