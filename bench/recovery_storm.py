"""A recovery storm: 20 faults over 10 UltraServer groups, half recovered by reboot and half by
replacement; how soon does each spare serve, each rebooted node come back as a spare, and each
UltraServer become whole again?

10 plans of one ml.u-p6e-gb200x36 UltraServer each (9 instances, 2 spares; demo profile) and 10
InstanceGroups of 7 active + 2 spares. The first half of the groups has ``rebootBudget`` 1 (the
ladder's first action is a reboot), the second half ``rebootBudget`` 0 (replace at once). Once
every group is whole, two active nodes of every group get HyperPod's health label
``sagemaker.amazonaws.com/node-health-status=Unschedulable`` (as HyperPod's health agent sets it),
all 20 patches sent together. A raw watch on the nodes stamps, per failed node:

* the grace end: the moment the watch delivered the label, plus the grace;
* spare serving: the spare that carries ``hyperplan.dev/replaces=<failed node>`` is active without
  the spare taint;
* reboot groups: the reboot's start (``Ready=False`` with reason ``Rebooting``, the KWOK
  provider's reboot) and the node back as a spare (Ready, ``Schedulable``, role spare, tainted
  spare) under its name;
* replace groups: the backfill (the next generation in the failed node's slot) Ready;
* the UltraServer whole again: 7 active nodes serving and 2 spares, every node Ready and
  ``Schedulable``, the failed nodes of replace groups gone.

It also watches, every 0.1 s, for an UltraServer without a spare while it had one to give: no node
labelled spare while a node of the group is Ready, ``Schedulable``, not active and not leaving.

Targets: every spare serving within 2 s of its grace end; every rebooted node back as
a spare within the KWOK reboot time + 5 s of its reboot's start; no UltraServer ever without a
spare while it had one to give. Prints p50, p95 and max of each, and the time from the fault to
the UltraServer whole again, reboot against replace, in one table.

**With real Kueue TAS** (the plane's Kueue; ``--no-jobs`` leaves it out): once every group is
whole, one Topology over the zone, the UltraServer id and the hostname, one ResourceFlavor over the
bench's zone (all ten UltraServers), and a ClusterQueue with quota for every node; then one Job per
group of 4 pods that requires one UltraServer (``kueue.x-k8s.io/podset-required-topology``), 4 GPUs
each: 7 active nodes hold one such Job, so Kueue puts one on each UltraServer. Each UltraServer's
two faults are then one node of its Job and one node without a Job's pod (Kueue replaces one failed
node of a workload in place; for a second at once it evicts the workload, docs/failover.md). A pod
watch samples every 0.1 s the UltraServers of each Job's bound, not terminating pods: the target is
that no Job's pods are ever on two UltraServers; the table also gives the retries spent (the Jobs'
``status.failed``, with ``backoffLimit: 0`` and a ``podFailurePolicy`` that ignores
``DisruptionTarget``), the workloads Kueue evicted, and from the fault to the Job's 4 pods Running
again (once one of them was not).

    .venv/bin/python bench/recovery_storm.py [--groups 10] [--grace 2] [--lead 25] [--no-jobs] [--kwok-debug]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    BenchError, Harness, has_taint, loadavg, machine, node_ready, print_figures, proc_cpu_seconds, run, step,
    summary, verdict, wait_for,
)
from storm import ACTIVE, SPARES, ultraserver_groups  # noqa: E402  (the same plans and groups)

AZ = "us-west-2d"
PER_GROUP = 2
SPARE_TAINT = "hyperplan.dev/spare"
HEALTH, HP_HEALTH = "hyperplan.dev/node-health-status", "sagemaker.amazonaws.com/node-health-status"
ROLE, GROUP_LABEL = "hyperplan.dev/role", "hyperplan.dev/instance-group"
REBOOT_SECONDS = 10.0  # the KWOK provider's reboot (settings.kwok_reboot_seconds, its default)
SPARE_TARGET, BACK_SLACK = 2.0, 5.0


def labels(node: dict) -> dict:
    return node["metadata"].get("labels") or {}


def rebooting(node: dict) -> bool:
    ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    return ready is not None and ready.get("status") == "False" and ready.get("reason") == "Rebooting"


def healthy(node: dict) -> bool:
    return node_ready(node) and labels(node).get(HEALTH) == "Schedulable" \
        and labels(node).get(HP_HEALTH, "Schedulable") == "Schedulable"


def spare_in_place(node: dict) -> bool:
    return healthy(node) and labels(node).get(ROLE) == "spare" and has_taint(node, SPARE_TAINT)


class Fleet:
    """Every group node as the watch last saw it, with the moments this bench measures."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objs: dict[str, dict] = {}
        self.labelled_at: dict[str, float] = {}
        self.serving_at: dict[str, float] = {}
        self.ready_at: dict[str, float] = {}
        self.rebooting_at: dict[str, float] = {}
        self.spare_again_at: dict[str, float] = {}  # a node that rebooted, back as a spare
        self.deleted_at: dict[str, float] = {}

    def on_event(self, kind: str, obj: dict, t: float) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                self.objs.pop(name, None)
                self.deleted_at.setdefault(name, t)
                return
            self.objs[name] = obj
            lb = labels(obj)
            if lb.get(HP_HEALTH) == "Unschedulable":
                self.labelled_at.setdefault(name, t)
            if lb.get(ROLE) == "active" and not has_taint(obj, SPARE_TAINT):
                self.serving_at.setdefault(name, t)
            if node_ready(obj):
                self.ready_at.setdefault(name, t)
            if rebooting(obj):
                self.rebooting_at.setdefault(name, t)
            if name in self.rebooting_at and spare_in_place(obj):
                self.spare_again_at.setdefault(name, t)

    def of(self, group: str) -> list[dict]:
        with self.lock:
            return [n for n in self.objs.values() if labels(n).get(GROUP_LABEL) == group]


def whole(fleet: Fleet, group: str) -> bool:
    nodes = fleet.of(group)
    serving = [n for n in nodes if healthy(n) and labels(n).get(ROLE) == "active" and not has_taint(n, SPARE_TAINT)
               and not n["metadata"].get("deletionTimestamp")]
    spares = [n for n in nodes if spare_in_place(n)]
    return len(nodes) == ACTIVE + SPARES and len(serving) == ACTIVE and len(spares) == SPARES


class Sampler:
    """Calls ``sample(dt, now)`` every 0.1 s on a thread of its own, from ``start`` to ``stop``."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        last = time.time()
        while not self._stop.wait(0.1):
            now = time.time()
            try:
                self.sample(now - last, now)
            except Exception as e:  # noqa: BLE001 - a sampler that dies would leave its figures unset
                step(f"{type(self).__name__}: a sample failed: {type(e).__name__}: {e}")
            last = now

    def sample(self, dt: float, now: float) -> None:
        raise NotImplementedError


class SpareWatch(Sampler):
    """Samples each group every 0.1 s: how long it went without a spare while a node of it could
    have been one (Ready, Schedulable, not active, not being deleted)."""

    def __init__(self, fleet: Fleet, groups: list[str]) -> None:
        super().__init__()
        self.fleet, self.groups = fleet, groups
        self.withheld: dict[str, float] = {g: 0.0 for g in groups}  # seconds, summed
        self.without: dict[str, float] = {g: 0.0 for g in groups}  # seconds with no spare at all

    def sample(self, dt: float, now: float) -> None:
        for g in self.groups:
            nodes = self.fleet.of(g)
            if any(spare_in_place(n) for n in nodes):
                continue
            self.without[g] += dt
            if any(healthy(n) and labels(n).get(ROLE) != "active" and not n["metadata"].get("deletionTimestamp")
                   for n in nodes):
                self.withheld[g] += dt


# --------------------------------------------------------------------------- real Kueue TAS jobs

KUEUE = "kueue.x-k8s.io/v1beta2"
NS = "rstorm"
US_KEY = "topology.k8s.aws/ultraserver-id"
GPUS = 4  # per ml.p6e-gb200.36xlarge node
JOB_PODS = 4


def kueue_objects(nodes: int) -> list[dict]:
    """One Topology and ResourceFlavor over every UltraServer of the bench's zone, and quota for
    ``nodes`` nodes (the spares included: docs/failover.md, "Sizing the ClusterQueue quota")."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {"apiVersion": KUEUE, "kind": "Topology", "metadata": {"name": NS}, "spec": {"levels": [
            {"nodeLabel": "topology.kubernetes.io/zone"}, {"nodeLabel": US_KEY}, {"nodeLabel": "kubernetes.io/hostname"}]}},
        {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": NS},
         "spec": {"nodeLabels": {"topology.kubernetes.io/zone": AZ}, "topologyName": NS}},
        {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": NS},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
                  "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [
                      {"name": NS, "resources": [{"name": "cpu", "nominalQuota": nodes},
                                                 {"name": "memory", "nominalQuota": f"{nodes}Gi"},
                                                 {"name": "nvidia.com/gpu", "nominalQuota": nodes * GPUS}]}]}]}},
        {"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": "train", "namespace": NS},
         "spec": {"clusterQueue": NS}},
    ]


def job_body(name: str) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NS, "labels": {"kueue.x-k8s.io/queue-name": "train"}},
            "spec": {"parallelism": JOB_PODS, "completions": JOB_PODS, "completionMode": "Indexed", "backoffLimit": 0,
                     "podFailurePolicy": {"rules": [
                         {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                         {"action": "Ignore", "onPodConditions": [{"type": "TerminatedByKueue"}]}]},
                     "template": {"metadata": {"annotations": {"kueue.x-k8s.io/podset-required-topology": US_KEY}},
                                  "spec": {"restartPolicy": "Never", "containers": [
                                      {"name": "train", "image": "trainer", "resources": {
                                          "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(GPUS)},
                                          "limits": {"nvidia.com/gpu": str(GPUS)}}}]}}}}


class Jobs(Sampler):
    """The Jobs' pods as a watch last saw them, sampled every 0.1 s against the nodes' UltraServer
    labels: how long, and how often, a Job had pods on more than one UltraServer."""

    def __init__(self, fleet: Fleet, jobs: list[str]) -> None:
        super().__init__()
        self.fleet, self.jobs = fleet, jobs
        self.lock = threading.Lock()
        self.pods: dict[str, dict] = {}
        self.split: dict[str, float] = {j: 0.0 for j in jobs}  # seconds with pods on two UltraServers
        self.split_seen: dict[str, list[set]] = {j: [] for j in jobs}
        self.whole_again_at: dict[str, float] = {}
        self.faulted_at: dict[str, float] = {}  # the job's first pod node labelled
        self.disturbed_at: dict[str, float] = {}  # first seen with fewer than its pods Running

    def on_event(self, kind: str, obj: dict, t: float) -> None:
        with self.lock:
            if kind == "DELETED":
                self.pods.pop(obj["metadata"]["name"], None)
            else:
                self.pods[obj["metadata"]["name"]] = obj

    def placed(self, job: str, running_only: bool = False) -> list[tuple[str, str]]:
        """(pod, node) of the Job's bound pods that are not terminating (Running ones only)."""
        with self.lock:
            return [(p["metadata"]["name"], p["spec"]["nodeName"]) for p in self.pods.values()
                    if (p["metadata"].get("labels") or {}).get("job-name") == job and p["spec"].get("nodeName")
                    and not p["metadata"].get("deletionTimestamp")
                    and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
                    and (not running_only or p.get("status", {}).get("phase") == "Running")]

    def ultraservers(self, job: str) -> set[str]:
        with self.fleet.lock:
            nodes = dict(self.fleet.objs)
        return {labels(nodes[node]).get(US_KEY, "?") if node in nodes else "gone" for _, node in self.placed(job)}

    def sample(self, dt: float, now: float) -> None:
        for j in self.jobs:
            used = self.ultraservers(j) - {"gone"}
            if len(used) > 1:
                self.split[j] += dt
                self.split_seen[j].append(used)
            if j not in self.faulted_at or j in self.whole_again_at:
                continue
            running = len(self.placed(j, running_only=True))
            if running < JOB_PODS:  # a pod evicted (terminating) or its replacement not Running yet
                self.disturbed_at.setdefault(j, now)
            elif j in self.disturbed_at:  # whole again only once it was not
                self.whole_again_at[j] = now


def main(h: Harness, args: argparse.Namespace) -> int:
    names = [f"rstorm-{i:02d}" for i in range(args.groups)]
    reboot_groups = set(names[:args.groups // 2])
    op = h.start_operator("demo")
    fleet = Fleet()
    h.watch("/api/v1/nodes", fleet.on_event, labelSelector=GROUP_LABEL)
    termination, start = ultraserver_groups(h, "rstorm-gb200", AZ, names, args.lead, lambda name: {
        "graceSeconds": args.grace, "maxUnhealthy": 3, "rebootBudget": 1 if name in reboot_groups else 0,
        "rebootTimeoutSeconds": 60})
    step(f"{len(reboot_groups)} groups reboot first, {args.groups - len(reboot_groups)} replace")
    wait_for(lambda: h.tick() or all(whole(fleet, n) for n in names), timeout=max(0, start - time.time()) + 180,
             what="every group whole", interval=0.5)
    step(f"every group whole: {sum(len(fleet.of(n)) for n in names)} nodes")
    jobs: Jobs | None = None
    if args.jobs:
        jobs = Jobs(fleet, [f"train-{i:02d}" for i in range(args.groups)])
        h.watch(f"/api/v1/namespaces/{NS}/pods", jobs.on_event)
        h.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                        "items": kueue_objects(len(names) * (ACTIVE + SPARES))}))
        for job in jobs.jobs:
            h.kubectl("create", "-f", "-", input=json.dumps(job_body(job)))
        wait_for(lambda: h.tick() or all(len(jobs.placed(j, running_only=True)) == JOB_PODS for j in jobs.jobs),
                 timeout=120, what=f"every Job's {JOB_PODS} pods Running (admitted by Kueue's TAS)", interval=0.5)
        step(f"{len(jobs.jobs)} Jobs of {JOB_PODS} pods Running, each on one UltraServer: "
             f"{sorted(len(jobs.ultraservers(j)) for j in jobs.jobs)}")
    time.sleep(2)

    job_of = {node: j for j in (jobs.jobs if jobs else ()) for _, node in jobs.placed(j)}
    victims: list[dict] = []
    for name in names:
        # One node of each Job first: its pod must move within its UltraServer. Then nodes without
        # a Job's pod, and only then a second node of one Job: Kueue replaces one failed node of a
        # workload in place and evicts the workload for a second at once (docs/failover.md).
        actives = sorted((labels(n)["hyperplan.dev/slot"], n["metadata"]["name"], labels(n)) for n in fleet.of(name)
                         if labels(n).get(ROLE) == "active")
        hit: set[str] = set()
        firsts, others, seconds = [], [], []
        for slot, node, lb in actives:
            job = job_of.get(node)
            (firsts if job is not None and job not in hit else others if job is None else seconds).append(
                (slot, node, lb))
            if job is not None:
                hit.add(job)
        for slot, node, lb in (firsts + others + seconds)[:PER_GROUP]:
            victims.append({"group": name, "node": node, "slot": slot, "reboot": name in reboot_groups,
                            "generation": int(lb.get("hyperplan.dev/generation", "0"))})
    if time.time() > termination - 90:
        raise BenchError("the blocks are about to end; raise the plans' duration")

    load = loadavg()
    op_cpu0 = proc_cpu_seconds(op.pid)
    spares = SpareWatch(fleet, names).start()

    def fail(v: dict) -> None:
        v["sent"] = time.time()
        h.core.patch_node(v["node"], {"metadata": {"labels": {HP_HEALTH: "Unschedulable"}}})

    if jobs is not None:
        jobs.start()
    with ThreadPoolExecutor(len(victims)) as workers:
        list(workers.map(fail, victims))
    if jobs is not None:
        by_node = {node: j for j in jobs.jobs for _, node in jobs.placed(j)}
        for v in victims:
            if v["node"] in by_node:
                jobs.faulted_at.setdefault(by_node[v["node"]], v["sent"])
    step(f"{len(victims)} nodes labelled {HP_HEALTH}=Unschedulable across {args.groups} groups (load {load})")

    def recovered(v: dict) -> bool:
        with fleet.lock:
            spare = next((n["metadata"]["name"] for n in fleet.objs.values()
                          if labels(n).get("hyperplan.dev/replaces") == v["node"]), None)
            if spare is None or spare not in fleet.serving_at:
                return False
            v["spare"], v["served"] = spare, fleet.serving_at[spare]
            if v["reboot"]:
                if v["node"] not in fleet.spare_again_at:
                    return False
                v["rebooted"], v["back"] = fleet.rebooting_at[v["node"]], fleet.spare_again_at[v["node"]]
                return True
            backfill = next((n["metadata"]["name"] for n in fleet.objs.values()
                             if labels(n).get(GROUP_LABEL) == v["group"] and labels(n).get("hyperplan.dev/slot") == v["slot"]
                             and labels(n).get("hyperplan.dev/generation") == str(v["generation"] + 1)), None)
            if backfill is None or backfill not in fleet.ready_at:
                return False
            v["backfill"], v["back"] = backfill, fleet.ready_at[backfill]
            return True

    try:
        wait_for(lambda: h.tick() or all(recovered(v) for v in victims), timeout=args.grace + REBOOT_SECONDS + 120,
                 what="every spare serving, every rebooted node back and every backfill Ready", interval=0.05)
    except BenchError:
        for v in victims:
            if not recovered(v):
                with fleet.lock:
                    obj = fleet.objs.get(v["node"])
                step(f"not recovered: {v['node']} (reboot {v['reboot']}): spare {v.get('spare')}, rebooting "
                     f"{v['node'] in fleet.rebooting_at}, labels {labels(obj) if obj else 'gone'}, taints "
                     f"{[t.get('key') for t in (obj or {}).get('spec', {}).get('taints') or []]}")
        raise
    whole_at: dict[str, float] = {}

    def all_whole() -> bool:
        h.tick()
        for name in names:
            if name not in whole_at and whole(fleet, name) and all(
                    v["reboot"] or v["node"] in fleet.deleted_at for v in victims if v["group"] == name):
                whole_at[name] = time.time()
        return len(whole_at) == len(names)

    wait_for(all_whole, timeout=180, what="every UltraServer whole again", interval=0.1)
    job_rows: list[tuple[str, str, str, str]] = []
    split = 0.0
    if jobs is not None:
        try:
            wait_for(lambda: h.tick() or all(j in jobs.whole_again_at for j in jobs.faulted_at), timeout=120,
                     what=f"every faulted Job's {JOB_PODS} pods Running again", interval=0.2)
        except BenchError:
            for j in sorted(set(jobs.faulted_at) - set(jobs.whole_again_at)):
                step(f"not whole again: {j}: disturbed {j in jobs.disturbed_at}, Running "
                     f"{jobs.placed(j, running_only=True)}, bound {jobs.placed(j)}")
            raise
        jobs.stop()
        batch = h.kubectl("get", "jobs", "-n", NS, "-o", "json")
        retries = sum((j.get("status") or {}).get("failed") or 0 for j in json.loads(batch.stdout)["items"])
        workloads = json.loads(h.kubectl("get", "workloads.kueue.x-k8s.io", "-n", NS, "-o", "json").stdout)["items"]
        evicted = sum(1 for wl in workloads for c in (wl.get("status") or {}).get("conditions") or []
                      if c["type"] == "Evicted" and c["status"] == "True")
        split = max(jobs.split.values())
        back = summary([jobs.whole_again_at[j] - jobs.faulted_at[j] for j in jobs.faulted_at])
        for j in jobs.jobs:
            if jobs.split_seen[j]:
                step(f"{j}: pods on {sorted(jobs.split_seen[j][0])} for {jobs.split[j]:.1f} s")
        job_rows = [
            ("Kueue TAS: Jobs (4 pods, one UltraServer required) whose nodes failed",
             f"{len(jobs.faulted_at)} of {len(jobs.jobs)}", "", ""),
            ("Kueue TAS: longest a Job had pods on two UltraServers", f"{split:.1f} s", "0 s", verdict(split == 0)),
            ("Kueue TAS: retries spent (Jobs' status.failed) / workloads evicted", f"{retries} / {evicted}", "0 / 0",
             verdict(retries == 0 and evicted == 0)),
            ("Kueue TAS: fault to the Job's 4 pods Running again: p50 / max",
             f"{back['p50']:.1f} / {back['max']:.1f} s", "", ""),
        ]
        split = split + retries + evicted  # any of them misses the target
    spares.stop()
    op_cpu = proc_cpu_seconds(op.pid) - op_cpu0

    for v in victims:
        with fleet.lock:
            v["seen"] = fleet.labelled_at[v["node"]]
        v["spare_lag"] = v["served"] - (v["seen"] + args.grace)
        if v["reboot"]:
            v["back_after_reboot"] = v["back"] - v["rebooted"]
        v["whole_after"] = whole_at[v["group"]] - v["seen"]
    for v in sorted(victims, key=lambda v: v["node"]):
        how = (f"rebooted {v['rebooted'] - v['seen']:.2f} s after the label, back as a spare "
               f"{v['back_after_reboot']:.2f} s after its reboot began") if v["reboot"] else \
            f"backfill {v['backfill']} Ready {v['back'] - v['seen']:.2f} s after the label"
        step(f"{v['node']}: spare {v['spare']} serving {v['spare_lag']:+.3f} s after the grace end; {how}")

    spare_s = summary([v["spare_lag"] for v in victims])
    back_s = summary([v["back_after_reboot"] for v in victims if v["reboot"]])
    whole_reboot = summary([v["whole_after"] for v in victims if v["reboot"]])
    whole_replace = summary([v["whole_after"] for v in victims if not v["reboot"]])
    withheld = max(spares.withheld.values())
    errors = op.log_lines("ERROR") + op.log_lines("Traceback")
    if errors:
        step(f"operator log has {len(errors)} ERROR/Traceback lines, first: {errors[0][:200]}")
    back_target = REBOOT_SECONDS + BACK_SLACK
    rows = [
        ("machine", machine(), "", ""),
        ("load average when the nodes failed / at the end", f"{load} / {loadavg()}", "", ""),
        ("faults (groups x per group), grace", f"{len(victims)} ({args.groups} x {PER_GROUP}), {args.grace} s", "", ""),
        ("grace end to spare serving: p50 / p95 / max",
         f"{spare_s['p50']:.3f} / {spare_s['p95']:.3f} / {spare_s['max']:.3f} s", f"max <= {SPARE_TARGET:.0f} s",
         verdict(spare_s["max"] <= SPARE_TARGET)),
        ("reboot's start to the node back as a spare: p50 / p95 / max",
         f"{back_s['p50']:.3f} / {back_s['p95']:.3f} / {back_s['max']:.3f} s",
         f"max <= {REBOOT_SECONDS:.0f} + {BACK_SLACK:.0f} s", verdict(back_s["max"] <= back_target)),
        ("longest an UltraServer went without a spare while it had one to give", f"{withheld:.1f} s", "0 s",
         verdict(withheld < 0.2)),  # one 0.1 s sample: the watch's own view may lag a write by that much
        ("longest an UltraServer went without any spare (both promoted, none back yet)",
         f"{max(spares.without.values()):.1f} s", "", ""),
        ("fault to UltraServer whole again, reboot: p50 / max",
         f"{whole_reboot['p50']:.1f} / {whole_reboot['max']:.1f} s", "", ""),
        ("fault to UltraServer whole again, replace: p50 / max",
         f"{whole_replace['p50']:.1f} / {whole_replace['max']:.1f} s", "", ""),
        ("operator CPU s, from the faults to every UltraServer whole", f"{op_cpu:.2f}", "", ""),
        *job_rows,
    ]
    print_figures("recovery storm", rows)
    ok = spare_s["max"] <= SPARE_TARGET and back_s["max"] <= back_target and withheld < 0.2 and split == 0
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=10)
    ap.add_argument("--grace", type=int, default=2, help="healthCheck.graceSeconds of every group")
    ap.add_argument("--lead", type=int, default=25, help="seconds from now to the plans' startTimeAfter")
    ap.add_argument("--no-jobs", dest="jobs", action="store_false",
                    help="without the real Kueue TAS Jobs (one per UltraServer)")
    ap.add_argument("--kwok-debug", action="store_true",
                    help="KWOK logs at DEBUG and the API server audits every write (kept in the plane's logs/)")
    args = ap.parse_args()
    if args.groups < 2:
        ap.error("--groups must be at least 2 (half reboot, half replace)")
    if args.kwok_debug:
        os.environ["BENCH_KEEP_LOGS"] = "1"
    run(lambda h: main(h, args), "recovery-storm", budget=args.lead + 600,
        **({"kwok_log_level": "DEBUG", "audit_writes": True} if args.kwok_debug else {}))
