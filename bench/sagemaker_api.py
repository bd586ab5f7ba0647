"""The SageMaker API's reads at 10,000 plans, against the same reads through the Kubernetes API.

On its own plane (demo profile, the operator as its own process serving the API on a loopback
port), with ``--plans`` TrainingPlans bought and settled:

1. The fleet, bought by the operator: ``--pools`` pools of ``--pool-size``, then ``--plans``
   auto-purchasing one-instance plans (1 x ml.p5.48xlarge, ``duration: 1m``, a ``--window``-minute
   window ``--ahead`` minutes ahead, as bench/scale.py makes them), created by ``--threads``
   clients while the operator runs. The run waits until a raw watch has seen every plan
   ``Scheduled`` and the operator's reconciles have been still for 5 s: every plan then has the
   status the operator writes (its block, counts, conditions, offerings), and the pools their
   ledgers. (Before the fix of a linear start, an operator started after its plans and ledgers were written
   spent minutes in kopf's start before its first pass; that start is now bench/start.py's, see
   docs/benchmarks.md. The fleet is still bought by the operator here, as the figures below were.)
2. The API: ``--clients`` concurrent boto3 clients (each a process of its own, boto3 1.44.8 with
   retries off), for ``--seconds`` each: ``ListTrainingPlans`` paging through every plan (100 a
   page, the maximum), ``DescribeTrainingPlan`` of a random plan, ``SearchTrainingPlanOfferings``
   (4 x ml.p5.48xlarge for 24 hours, i.e. one demo day, from a minute ahead).
3. The floor: as many clients with the Kubernetes Python client (``CustomObjectsApi``, as the
   operator uses it), for as long, each making the same reads of the API server: a LIST of
   trainingplans in pages of 100 (``limit``/``continue``), a GET of a random plan, and a LIST of
   capacitypools (what a search reads: the pools and their ledgers).

Figures: p50 and p99 latency of one call, and calls per second over all clients, for each read
both ways; for the listing also a whole pass over every plan. Target: each read's p50
and p99 no slower than 1.5x the floor's, and no read of the fleet reaches the API server while the
API is measured (``apiserver_request_total`` by verb and resource, before and after the API's
phases; the API's key listing and access reviews are shown beside it).

    .venv/bin/python bench/sagemaker_api.py [--plans 10000] [--pools 20] [--clients 16] [--seconds 20]
"""

from __future__ import annotations

import json
import os
import random
import sys
import time


# --------------------------------------------------------------------------- the worker
# A worker is this file run with ``--worker``: one client, its config as JSON on stdin, its
# latencies as JSON on stdout. It imports only what its client needs (no harness, no plane).


def worker() -> None:
    cfg = json.load(sys.stdin)
    rng = random.Random(cfg["seed"])
    names, op = cfg["names"], cfg["op"]
    if cfg["client"] == "boto3":
        import boto3
        from botocore.config import Config

        sm = boto3.client("sagemaker", config=Config(retries={"max_attempts": 1, "mode": "standard"}))

        def page(token):
            args = {"MaxResults": 100, **({"NextToken": token} if token else {})}
            out = sm.list_training_plans(**args)
            return len(out["TrainingPlanSummaries"]), out.get("NextToken")

        def describe():
            sm.describe_training_plan(TrainingPlanName=rng.choice(names))

        def search():
            out = sm.search_training_plan_offerings(
                InstanceType=cfg["itype"], InstanceCount=4, DurationHours=24, StartTimeAfter=time.time() + 60,
                TargetResources=["hyperpod-cluster"])
            assert out["TrainingPlanOfferings"], out
    else:
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=cfg["kubeconfig"], client_configuration=configuration)
        custom = client.CustomObjectsApi(client.ApiClient(configuration))
        group, version = "hyperplan.dev", "v1alpha1"

        def page(token):
            out = custom.list_cluster_custom_object(group, version, "trainingplans", limit=100,
                                                    **({"_continue": token} if token else {}))
            return len(out["items"]), out["metadata"].get("continue")

        def describe():
            custom.get_cluster_custom_object(group, version, "trainingplans", rng.choice(names))

        def search():
            out = custom.list_cluster_custom_object(group, version, "capacitypools")
            assert out["items"], out

    calls: list[float] = []
    passes: list[tuple[float, int]] = []
    errors: list[str] = []
    while time.time() < cfg["start_at"]:
        time.sleep(0.005)
    end = cfg["start_at"] + cfg["seconds"]
    token, pass_start, seen = None, time.perf_counter(), 0
    cpu = time.process_time()
    while time.time() < end:
        t = time.perf_counter()
        try:
            if op == "list":
                n, token = page(token)
                seen += n
            elif op == "describe":
                describe()
            else:
                search()
        except Exception as e:  # noqa: BLE001 - counted and shown, never retried
            errors.append(f"{type(e).__name__}: {e}"[:300])
            token = None
            continue
        done = time.perf_counter()
        calls.append(done - t)
        if op == "list" and not token:
            passes.append((done - pass_start, seen))
            pass_start, seen = done, 0
    json.dump({"calls": calls, "passes": passes, "errors": errors, "cpu": time.process_time() - cpu}, sys.stdout)


if __name__ == "__main__" and "--worker" in sys.argv:
    worker()
    raise SystemExit(0)


# --------------------------------------------------------------------------- the bench

import argparse  # noqa: E402
import subprocess  # noqa: E402
from collections import Counter  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    GROUP, PYTHON, VERSION, BenchError, Harness, api_requests, increase, loadavg, machine, metric_sum,
    percentile, pool, print_figures, proc_cpu_seconds, proc_rss_mib, run, step, ts, utcnow, verdict, wait_for,
)
from purchases import AZS, ITYPE, PhaseTracker, plan_body  # noqa: E402
from remote_purchases import mint_key  # noqa: E402
from hyperplan_dev.plane import free_port  # noqa: E402

TARGET_RATIO = 1.5
OPS = ("list", "describe", "search")
FLEET = ("hyperplan.dev/trainingplans", "hyperplan.dev/capacitypools", "hyperplan.dev/instancegroups", "core/nodes")


def write_fleet(h: Harness, args: argparse.Namespace) -> list[str]:
    """The pools, then the plans (``--threads`` clients), which the running operator buys."""
    for p in range(args.pools):
        h.create("capacitypools", pool(f"pool-{p:02d}", ITYPE, args.pool_size, AZS[p % len(AZS)]))
    start = utcnow().replace(microsecond=0) + timedelta(minutes=args.ahead)
    window = (ts(start), ts(start + timedelta(minutes=args.window)))
    names = [f"plan-{i:05d}" for i in range(args.plans)]
    step(f"creating {args.plans} auto-purchasing plans ({args.threads} clients; 1 x {ITYPE}, 1m, "
         f"a {args.window}-minute window {args.ahead} minutes ahead)")
    t0 = time.monotonic()

    def create(name: str) -> None:
        h.create("trainingplans", plan_body(name, *window, label="sagemaker-api"))

    with ThreadPoolExecutor(args.threads) as threads:
        list(threads.map(create, names))
    step(f"  {len(names)} plans created in {time.monotonic() - t0:.1f} s")
    return names


def readers(h: Harness, args: argparse.Namespace, client: str, op: str, names: list[str], env: dict) -> dict:
    """``args.clients`` worker processes making ``op`` for ``args.seconds``, started together."""
    procs = []
    start_at = time.time() + 3 + args.clients * 0.3  # every process imported its client and is waiting
    for c in range(args.clients):
        cfg = {"client": client, "op": op, "names": names, "seed": c, "start_at": start_at, "seconds": args.seconds,
               "itype": ITYPE, "kubeconfig": str(h.plane.kubeconfig)}
        proc = subprocess.Popen([str(PYTHON), __file__, "--worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, text=True)
        proc.stdin.write(json.dumps(cfg))
        proc.stdin.flush()
        proc.stdin.close()
        proc.stdin = None  # communicate() must not touch it again
        procs.append(proc)
    out = {"calls": [], "passes": [], "errors": [], "cpu": 0.0}
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=args.seconds + 120)
        if proc.returncode != 0:
            raise BenchError(f"a {client} {op} worker failed: {stderr[-2000:]}")
        got = json.loads(stdout)
        for k in out:
            out[k] += got[k]
    out["seconds"] = time.time() - start_at
    calls = out["calls"]
    out["p50"] = percentile(calls, 50) if calls else float("nan")
    out["p99"] = percentile(calls, 99) if calls else float("nan")
    out["rate"] = len(calls) / args.seconds
    out["cpu_per_call"] = out["cpu"] / max(1, len(calls))
    shown = (f"{len(calls)} calls, p50 {out['p50'] * 1000:.1f} ms, p99 {out['p99'] * 1000:.1f} ms, {out['rate']:.1f}/s, "
             f"client CPU {out['cpu_per_call'] * 1000:.2f} ms a call")
    if op == "list":
        full = [t for t, n in out["passes"]]
        out["pass_p50"] = percentile(full, 50) if full else float("nan")
        shown += f", {len(full)} whole listings (p50 {out['pass_p50']:.2f} s, plans seen {set(n for _, n in out['passes'])})"
    if out["errors"]:
        shown += f", {len(out['errors'])} ERRORS (first: {out['errors'][0]})"
    step(f"  {client} {op}: {shown}; load {loadavg()}")
    return out


def main(h: Harness, args: argparse.Namespace) -> int:
    load_start = loadavg()
    port = free_port()
    tracker = PhaseTracker()
    watch = h.watch(f"/apis/{GROUP}/{VERSION}/trainingplans", tracker.on_event)
    # The operator first, then the plans it buys (the fleet as the recorded figures had it). An
    # operator started on 10,000 listed plans spent minutes in kopf before its first pass until
    # hyperplan.kopf_readiness (docs/benchmarks.md, "An operator started with its fleet listed").
    op = h.start_operator("demo", extra_env={"HYPERPLAN_SAGEMAKER_API_PORT": str(port),
                                             "HYPERPLAN_API_KEY_NAMESPACE": "default",
                                             "HYPERPLAN_KUEUE_ENABLED": "false"})
    t0 = time.monotonic()
    names = write_fleet(h, args)

    def settled() -> bool:
        h.tick()
        counts = tracker.counts()
        step(f"  settling: {dict(counts)} (operator CPU {proc_cpu_seconds(op.pid):.0f} s, "
             f"RSS {proc_rss_mib(op.pid):.0f} MiB, load {loadavg()})")
        return counts.get("Scheduled", 0) >= args.plans

    wait_for(settled, timeout=args.settle_timeout, what=f"{args.plans} plans Scheduled", interval=10)
    settle_seconds = time.monotonic() - t0

    def still(seconds: float) -> None:
        last, since = None, time.monotonic()
        while time.monotonic() - since < seconds:
            now = metric_sum(op.metrics(), "hyperplan_reconciles_total")
            if now != last:
                last, since = now, time.monotonic()
            time.sleep(0.5)

    still(5)
    watch.stop()  # its re-list on a 410 would be a LIST of plans in the API's window
    step(f"{args.plans} plans Scheduled {settle_seconds:.0f} s after the first create; operator idle")
    key_id, secret = mint_key(h.plane.kubeconfig, "bench-reader")
    h.kubectl("create", "clusterrolebinding", "bench-reader", "--clusterrole=cluster-admin", "--user=bench-reader")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    api_env = {**env, "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": "us-west-2",
               "AWS_ENDPOINT_URL_SAGEMAKER": f"http://127.0.0.1:{port}", "AWS_CONFIG_FILE": "/dev/null",
               "AWS_SHARED_CREDENTIALS_FILE": "/dev/null", "AWS_EC2_METADATA_DISABLED": "true"}
    wait_for(lambda: subprocess.run([str(PYTHON), "-c", "import boto3; boto3.client('sagemaker')"
                                     ".list_training_plans(MaxResults=1)"], env=api_env, capture_output=True,
                                    timeout=60).returncode == 0, timeout=60, what="the API answering the key")
    switched = bool(op.log_lines("SageMaker API: reading kopf's indexes now"))

    # Each read the API's way, then the floor's, so that the machine's load drifts alike for both;
    # the API server's requests are counted over the API's phases only.
    step(f"each read: {args.clients} boto3 clients, then {args.clients} Kubernetes clients, {args.seconds} s each")
    api, floor, during, cpu = {}, {}, Counter(), 0.0
    for o in OPS:
        a0, cpu0 = api_requests(h.api.metrics()), proc_cpu_seconds(op.pid)
        api[o] = readers(h, args, "boto3", o, names, api_env)
        during += increase(api_requests(h.api.metrics()), a0)
        cpu += proc_cpu_seconds(op.pid) - cpu0
        floor[o] = readers(h, args, "kube", o, names, env)

    fleet_reads = Counter({k: v for k, v in during.items() if k[0] in ("GET", "LIST") and k[1] in FLEET})
    other = Counter({k: v for k, v in during.items() if k[0] not in ("WATCH",) and k[1] not in FLEET})
    step("API server requests during the API's phases: " +
         (", ".join(f"{v} {r} {n:.0f}" for (v, r), n in sorted(during.items())) or "none"))
    names_of = {"list": "ListTrainingPlans, a page of 100", "describe": "DescribeTrainingPlan",
                "search": "SearchTrainingPlanOfferings"}
    floors = {"list": "LIST trainingplans, limit 100", "describe": "GET trainingplan",
              "search": "LIST capacitypools"}
    ok = not fleet_reads and all(not api[o]["errors"] for o in OPS)
    rows = [("machine", machine(), "", ""),
            ("load average at the start / the end", f"{load_start} / {loadavg()}", "", ""),
            ("plans / pools / clients / seconds per read", f"{args.plans} / {args.pools} / {args.clients} / "
                                                           f"{args.seconds}", "", ""),
            ("all plans bought (Scheduled), from the first create", f"{settle_seconds:.0f} s", "", ""),
            ("the API reads kopf's indexes (switched)", "yes" if switched else "NO", "yes", verdict(switched))]
    for o in OPS:
        a, f = api[o], floor[o]
        for q in ("p50", "p99"):
            ratio = a[q] / f[q] if f[q] else float("inf")
            good = ratio <= TARGET_RATIO
            ok = ok and good
            rows.append((f"{names_of[o]} {q} (floor: {floors[o]})",
                         f"{a[q] * 1000:.1f} ms vs {f[q] * 1000:.1f} ms = {ratio:.2f}x", f"<= {TARGET_RATIO}x",
                         verdict(good)))
        rows.append((f"{names_of[o]} calls/s, API vs floor", f"{a['rate']:.1f} vs {f['rate']:.1f}"
                     + (f" (errors {len(a['errors'])} / {len(f['errors'])})" if a["errors"] or f["errors"] else ""),
                     "", ""))
        rows.append(("  the client's own CPU a call: boto3 vs the Kubernetes client",
                     f"{a['cpu_per_call'] * 1000:.2f} ms vs {f['cpu_per_call'] * 1000:.2f} ms", "", ""))
        if o == "list":
            whole = lambda r: "none done" if r["pass_p50"] != r["pass_p50"] else f"{r['pass_p50']:.2f} s"  # noqa: E731
            rows.append((f"  a whole listing of {args.plans} plans, p50 (in {args.seconds:.0f} s)",
                         f"{whole(a)} vs {whole(f)}", "", ""))
    rows += [("reads of the fleet reaching the API server during the API's phases",
              ", ".join(f"{v} {r} {n:.0f}" for (v, r), n in sorted(fleet_reads.items())) or "0", "0",
              verdict(not fleet_reads)),
             ("  other requests then (keys, reviews, the plane's own)",
              ", ".join(f"{v} {r} {n:.0f}" for (v, r), n in sorted(other.items())) or "none", "", ""),
             ("operator CPU during the API's phases", f"{cpu:.1f} s of {3 * args.seconds:.0f} s "
              f"({cpu / max(1, sum(len(api[o]['calls']) for o in OPS)) * 1000:.2f} ms a call)", "", ""),
             ("operator RSS at the end", f"{proc_rss_mib(op.pid):.0f} MiB", "", "")]
    print_figures("sagemaker_api", rows)
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plans", type=int, default=10000)
    ap.add_argument("--pools", type=int, default=20)
    ap.add_argument("--pool-size", type=int, default=64)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--threads", type=int, default=4, help="clients creating the plans")
    ap.add_argument("--ahead", type=int, default=45, help="minutes from now to the plans' window (the demo "
                    "profile sells at most 56 minutes ahead; the run must end before the blocks start)")
    ap.add_argument("--window", type=int, default=10, help="minutes of the plans' window")
    ap.add_argument("--settle-timeout", type=float, default=1200)
    args = ap.parse_args()
    run(lambda h: main(h, args), "sagemaker_api", budget=600 + args.settle_timeout + 6 * (args.seconds + 60))
