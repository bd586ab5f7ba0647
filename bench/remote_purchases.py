"""Purchases through a SageMaker endpoint against the same purchases from local pools, in one run.

The training cluster is the bench's plane and operator (demo profile); its local fleet is P pools
that only plans without the ``tier`` label may buy from.

1. Local: N auto-purchasing plans (1 x ml.p5.48xlarge, ``duration: 1m``, a 45-minute window from 5
   minutes ahead) buy from the fleet. Timed from the first create until a raw watch has seen every
   plan settle (Scheduled or Failed). They stay: the fleet has room for both runs.
2. Remote: N plans labelled ``tier=remote`` buy through pools whose ``spec.source.sageMaker`` is a
   capacity cluster's API: a second plane with its own operator and the same fleet (boto3, SigV4, a
   key minted there for a user whose RBAC may buy). Each goes the whole remote way: search,
   CreateTrainingPlan, the capacity side's purchase, following it, the block recorded. Timed the
   same way. ``--loopback``: the bench's own operator sells instead (one process, one GIL, serves
   the API, buys the API's plans and follows them: a harder case, docs/benchmarks.md).

Target: the remote figure within 3x the local one. Also printed: the remote calls by
operation and result, and the plans by phase.

    .venv/bin/python bench/remote_purchases.py [--plans 1000] [--pools 10] [--pool-size 64]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    API, GROUP, PYTHON, ROOT, STATE, VERSION, Harness, Plane, build, free_port, loadavg, machine, metric_sum, pool,
    print_figures, proc_cpu_seconds, run, scrape, step, stop_process_group, ts, utcnow, verdict, wait_for,
)
from purchases import AZS, ITYPE, PhaseTracker, plan_body  # noqa: E402

TARGET_RATIO = 3.0


def settle(h: Harness, tracker: PhaseTracker, names: set[str], t0: float, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    last = None
    while True:
        h.tick()
        with tracker.lock:
            settled = {n: t for n, t in tracker.settled_at.items() if n in names}
            phases = Counter(p for n, p in tracker.phase.items() if n in names)
        if phases != last:
            step(f"  settling: {dict(phases)} ({time.time() - t0:.1f} s since the first create, load {loadavg()})")
            last = phases
        if len(settled) >= len(names):
            return max(settled.values()) - t0
        if time.monotonic() > deadline:
            step(f"NOT SETTLED within {timeout} s: {dict(phases)}")
            return float("nan")
        time.sleep(1)


def writes_per_plan(tracker: PhaseTracker, names: set[str]) -> str:
    with tracker.lock:
        counts = [tracker.events[n] for n in names]
    return f"{sum(counts) / max(1, len(counts)):.1f}, {max(counts, default=0)}"


def mint_key(kubeconfig: Path, user: str) -> tuple[str, str]:
    done = subprocess.run([sys.executable, "-m", "hyperplan.cli", "api-key", "create", "--user", user,
                           "--namespace", "default"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "KUBECONFIG": str(kubeconfig)}, check=True)
    lines = dict(line.split("=", 1) for line in done.stdout.split())
    return lines["AWS_ACCESS_KEY_ID"], lines["AWS_SECRET_ACCESS_KEY"]


class CapacityCluster:
    """A second plane with its own operator that serves the SageMaker API: the cluster that sells
    the fleet, in its own processes (``--loopback``: the bench's own operator sells instead)."""

    def __init__(self, pools: int, pool_size: int) -> None:
        self.plane = Plane(root=STATE / "capacity", name="bench-capacity", log=lambda line: step(f"capacity: {line}"))
        self.pools, self.pool_size = pools, pool_size
        self.proc: subprocess.Popen | None = None
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(build.binary("kubectl")), f"--kubeconfig={self.plane.kubeconfig}", *args],
                              input=input, capture_output=True, text=True, timeout=120, check=True)

    def __enter__(self) -> "CapacityCluster":
        self.plane.down(quiet=True)
        self.plane.up()
        self.kubectl("apply", "-f", str(ROOT / "crds"))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/capacitypools.hyperplan.dev",
                     "crd/trainingplans.hyperplan.dev")
        liveness = free_port()
        env = {**os.environ, "KUBECONFIG": str(self.plane.kubeconfig), "HYPERPLAN_POLICY": "demo",
               "HYPERPLAN_METRICS_PORT": str(free_port()), "HYPERPLAN_LIVENESS_PORT": str(liveness),
               "HYPERPLAN_SAGEMAKER_API_PORT": str(self.port), "HYPERPLAN_API_KEY_NAMESPACE": "default",
               "HYPERPLAN_KUEUE_ENABLED": "false", "HYPERPLAN_CLUSTER_NAME": "bench-capacity"}
        log = open(STATE / "remote_purchases-capacity-operator.log", "wb")
        self.proc = subprocess.Popen([str(PYTHON), "-m", "hyperplan.cli", "run"], env=env, cwd=ROOT, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        step(f"capacity: operator pid {self.proc.pid}, SageMaker API {self.url}")

        def live() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{liveness}/healthz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False
        wait_for(live, timeout=60, what="the capacity cluster's operator")
        for p in range(self.pools):
            self.kubectl("create", "-f", "-", input=json.dumps(pool(f"fleet-{p:02d}", ITYPE, self.pool_size,
                                                                   AZS[p % len(AZS)])))
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    stop_process_group(self.proc.pid, timeout=5)
        finally:
            self.plane.down(quiet=True)


def main(h: Harness, args: argparse.Namespace) -> int:
    if args.loopback:
        return run_remote(h, args, None)
    with CapacityCluster(args.pools, args.pool_size) as capacity:
        return run_remote(h, args, capacity)


def run_remote(h: Harness, args: argparse.Namespace, capacity: "CapacityCluster | None") -> int:
    load_start = loadavg()
    port = free_port()
    op = h.start_operator("demo", extra_env={"HYPERPLAN_SAGEMAKER_API_PORT": str(port),
                                             "HYPERPLAN_API_KEY_NAMESPACE": "default"})
    url = capacity.url if capacity is not None else f"http://127.0.0.1:{port}"
    for p in range(args.pools):
        body = pool(f"pool-{p:02d}", ITYPE, args.pool_size, AZS[p % len(AZS)])
        body["spec"]["trainingPlanSelector"] = {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}
        h.create("capacitypools", body)
    tracker = PhaseTracker()
    h.watch(f"/apis/{GROUP}/{VERSION}/trainingplans", tracker.on_event)
    time.sleep(1)

    # 1. local
    start_after = utcnow() + timedelta(minutes=5)
    end_before = start_after + timedelta(minutes=args.window)
    step(f"local: creating {args.plans} plans over {args.pools} pools of {args.pool_size}")
    t0 = time.time()
    local = {f"local-{i:05d}" for i in range(args.plans)}
    for name in sorted(local):
        h.create("trainingplans", plan_body(name, ts(start_after), ts(end_before), label="local"))
    local_seconds = settle(h, tracker, local, t0, args.settle_timeout)
    local_phases = Counter(tracker.phase.get(n) for n in local)
    # The local plans stay (deleting 1,000 takes minutes of releases): the fleet has room for both
    # runs, and the remote run works beside 1,000 more objects than the local one did.

    # 2. remote, through the operator's own API
    seller = capacity.plane.kubeconfig if capacity is not None else h.plane.kubeconfig
    key_id, secret = mint_key(seller, "bench-buyer")
    subprocess.run([str(build.binary("kubectl")), f"--kubeconfig={seller}", "create", "clusterrolebinding",
                    "bench-buyer", "--clusterrole=cluster-admin", "--user=bench-buyer"], check=True,
                   capture_output=True, timeout=60)
    h.kubectl("create", "secret", "generic", "bench-key", "-n", "default",
              f"--from-literal=AWS_ACCESS_KEY_ID={key_id}", f"--from-literal=AWS_SECRET_ACCESS_KEY={secret}")
    for p in range(args.pools):
        h.create("capacitypools", {
            "apiVersion": API, "kind": "CapacityPool", "metadata": {"name": f"remote-{p:02d}"},
            "spec": {"instanceType": ITYPE, "availabilityZone": AZS[p % len(AZS)],
                     "source": {"sageMaker": {"endpoint": url, "region": "us-west-2", "credentialsSecret": "bench-key"}},
                     "trainingPlanSelector": {"matchLabels": {"tier": "remote"}}}})
    m0 = op.metrics()
    cpu0 = proc_cpu_seconds(op.pid)
    seller_cpu0 = proc_cpu_seconds(capacity.proc.pid) if capacity is not None and capacity.proc else None
    start_after = utcnow() + timedelta(minutes=5)
    end_before = start_after + timedelta(minutes=args.window)
    step(f"remote: creating {args.plans} plans (tier=remote) that buy through {url}")
    t0 = time.time()
    remote = {f"remote-{i:05d}" for i in range(args.plans)}
    for name in sorted(remote):
        body = plan_body(name, ts(start_after), ts(end_before), label="remote")
        body["metadata"]["labels"]["tier"] = "remote"
        h.create("trainingplans", body)
    remote_seconds = settle(h, tracker, remote, t0, args.settle_timeout)
    remote_phases = Counter(tracker.phase.get(n) for n in remote)
    m1 = op.metrics()
    calls = Counter()
    for labels, value in scrape(m1, "hyperplan_remote_calls_total"):
        before = metric_sum(m0, "hyperplan_remote_calls_total",
                            lambda l, want=labels: l.get("operation") == want.get("operation")
                            and l.get("result") == want.get("result"))
        if value - before:
            calls[f"{labels.get('operation')} {labels.get('result')}"] = value - before
    ratio = remote_seconds / local_seconds
    rows = [
        ("machine", machine(), "", ""),
        ("load average at the start / the end", f"{load_start} / {loadavg()}", "", ""),
        ("plans / pools x size", f"{args.plans} / {args.pools} x {args.pool_size} ({ITYPE})", "", ""),
        ("local: first create to the last plan settled", f"{local_seconds:.1f} s", "", ""),
        ("local plans by phase", ", ".join(f"{k} {v}" for k, v in sorted(local_phases.items())), "", ""),
        ("remote: first create to the last plan settled", f"{remote_seconds:.1f} s", "", ""),
        ("remote plans by phase", ", ".join(f"{k} {v}" for k, v in sorted(remote_phases.items())),
         f"Scheduled {args.plans}", verdict(remote_phases.get("Scheduled", 0) == args.plans)),
        ("ratio remote / local", f"{ratio:.2f}x", f"<= {TARGET_RATIO}x", verdict(ratio <= TARGET_RATIO)),
        ("remote calls (operation result: count)", ", ".join(f"{k}: {v:.0f}" for k, v in sorted(calls.items())),
         "", ""),
        ("operator CPU during the remote run", f"{proc_cpu_seconds(op.pid) - cpu0:.1f} s", "", ""),
        ("writes per plan seen by the bench's watch, local / remote (mean, max)",
         f"{writes_per_plan(tracker, local)} / {writes_per_plan(tracker, remote)}", "", ""),
    ]
    if seller_cpu0 is not None and capacity is not None and capacity.proc:
        rows.append(("the capacity cluster's operator CPU (the API) during the remote run",
                     f"{proc_cpu_seconds(capacity.proc.pid) - seller_cpu0:.1f} s", "", ""))
    print_figures("remote purchases", rows)
    return 0 if ratio <= TARGET_RATIO and remote_phases.get("Scheduled", 0) == args.plans else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plans", type=int, default=1000)
    ap.add_argument("--pools", type=int, default=10)
    ap.add_argument("--pool-size", type=int, default=64)
    ap.add_argument("--window", type=int, default=45, help="minutes of each plan's window")
    ap.add_argument("--settle-timeout", type=int, default=600)
    ap.add_argument("--loopback", action="store_true", help="the bench's own operator sells (one process "
                    "serves the API and follows its plans) instead of a capacity cluster of its own")
    args = ap.parse_args()
    run(lambda h: main(h, args), "remote_purchases", budget=300 + args.plans * 0.6 + 2 * args.settle_timeout)
