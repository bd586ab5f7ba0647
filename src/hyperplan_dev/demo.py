"""`make demo`: the whole product on the local control plane, in about five minutes.

1. brings the local control plane up (building it the first time) and applies the CRDs;
2. applies the objects of ``deploy/examples/demo/`` with their times filled in relative to now;
3. runs the operator (``hyperplan run``, demo profile), its log in ``.state/demo/operator.log``
   and echoed here, and a real Prometheus scraping it every second (its address is printed, so
   the graphs can be opened while the demo runs);
4. shows the ``hyperplan status`` view: refreshed in place on a terminal, printed every 15 s
   otherwise (a CI log, a pipe);
5. follows a training job queued through Kueue (``40-kueue.yaml``) before its block exists:
   one line each time its Workload changes, held at ``Retry`` by hyperplan's admission check
   with the check's message until the GB200 block is active and its group Ready, then admitted
   and its pods Running on the group's nodes; after 30 s the demo ends its pods with exit code 0,
   as a kubelet reports a finished container (KWOK runs pods but never ends them), and Kueue
   marks the Workload Finished;
6. once the GB200 group is Ready, fails one of its nodes (Ready=False, as an agent would) so
   that a spare takes over;
7. once the group is whole again, asks for a reboot of one of its active nodes the way an admin
   does (``hyperplan node reboot NODE``): after the label's grace the node's UltraServer spare is
   promoted, the node reboots (KWOK keeps it NotReady for 10 s) and comes back as that
   UltraServer's spare, which the demo says and marks in the picture;
8. stops when both plans have expired (Ctrl-C stops earlier), then writes a picture of the run
   from Prometheus's data (``.state/demo/overview-<time>.png``, see :mod:`hyperplan_dev.demo_report`)
   and prints its path. Everything it started (the operator, Prometheus, and the plane if it was
   not already running) is stopped again, by pid.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.text import Text

from hyperplan import status
from hyperplan.actuation.kube import Kube, api_client
from hyperplan.api.vocabulary import LABEL_GROUP, LABEL_ROLE, ROLE_ACTIVE, to_rfc3339
from hyperplan_dev import build, demo_report, prometheus
from hyperplan_dev.plane import Plane, free_port, project_root

EXAMPLES = Path("deploy") / "examples" / "demo"
ALERTS = Path("deploy") / "prometheus" / "alerts.yml"
PLACEHOLDER = re.compile(r"\$\{NOW\+(\d+)([smh])\}")
UNITS = {"s": "seconds", "m": "minutes", "h": "hours"}
GROUP = "demo-workers"
JOB_NAMESPACE, JOB = "default", "demo-train"  # queued through Kueue by 40-kueue.yaml
JOB_RUNS_FOR = 30.0  # seconds the job's pods run before the demo reports them finished
REBOOT_AFTER = 5.0  # seconds the group is seen whole again after the failure before the demo asks for a reboot
ASKED, REBOOTING, BACK = "asked", "rebooting", "back"  # the demo's reboot, as the status view shows it
PRINT_EVERY = 15.0  # seconds between printed views when the output is not a terminal
REFRESH_EVERY = 2.0  # seconds between reads of the API for the view

# Not a terminal (make demo | tee, CI): rich would fall back to 80 columns, too narrow for the view.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)


def say(line: str) -> None:
    console.print(Text.assemble((f"[demo {datetime.now().strftime('%H:%M:%S')}]", "bold"), " ", line),
                  soft_wrap=True)  # long lines (URLs) stay whole


def _condition(obj: dict, kind: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


def describe_job(workload: dict | None, pods: list[dict]) -> str:
    """One line on where the demo's job is on its way through Kueue and hyperplan's check.

    From its Workload (``None``: Kueue has not made one yet) and its pods: finished, evicted,
    admitted (with its pods' phases and nodes), held by an admission check (its state and
    message, e.g. hyperplan's ``Retry`` "next block ... starts ..."), or waiting in Kueue's
    queue (Kueue's own message).
    """
    if workload is None:
        return "submitted; Kueue has not made its Workload yet"
    finished = _condition(workload, "Finished")
    if finished.get("status") == "True":
        return f"finished: {finished.get('message') or finished.get('reason')}"
    evicted = _condition(workload, "Evicted")
    if evicted.get("status") == "True":
        return f"evicted ({evicted.get('reason')}): {evicted.get('message', '')}"
    if _condition(workload, "Admitted").get("status") == "True":
        phases: dict[str, list[str]] = {}
        for pod in pods:
            phase = (pod.get("status") or {}).get("phase", "Pending")
            phases.setdefault(phase, []).append((pod.get("spec") or {}).get("nodeName") or "-")
        parts = [f"{len(nodes)} {phase} (on {', '.join(sorted(nodes))})" if phase == "Running"
                 else f"{len(nodes)} {phase}" for phase, nodes in sorted(phases.items())]
        return "admitted; pods: " + ("; ".join(parts) if parts else "none yet")
    checks = (workload.get("status") or {}).get("admissionChecks") or []
    if _condition(workload, "QuotaReserved").get("status") == "True" and checks:
        return "quota reserved; " + "; ".join(
            f"check {c.get('name')}: {c.get('state')}" + (f": {c['message']}" if c.get("message") else "")
            for c in checks)
    reserved = _condition(workload, "QuotaReserved")
    return f"waiting in Kueue's queue: {reserved.get('message') or 'no quota reserved yet'}"


def reboot_candidate(group: status.InstanceGroup, busy: set[str]) -> str | None:
    """The node the demo asks to reboot: an active node serving on an UltraServer that has a spare
    to take its work (so the job keeps its NVLink domain), running none of the job's pods (``busy``:
    their nodes); the first by name, None when there is none."""
    spared = {n.ultra_server for n in group.nodes if n.state == status.SPARE}
    return next((n.name for n in sorted(group.nodes, key=lambda n: n.name)
                 if n.state == status.SERVING and n.ultra_server in spared and n.name not in busy), None)


def reboot_progress(stage: str, node: status.Node | None) -> str:
    """Where the demo's reboot is, from the node in the status view: asked (labelled, its grace
    running), rebooting (the group's record has a reboot under way: its spare promoted, the node
    NotReady), back (serving as its UltraServer's spare again)."""
    if node is None:
        return stage
    if stage == ASKED and node.state == status.REBOOTING and node.rebooting_since is not None:
        return REBOOTING
    if stage == REBOOTING and node.state == status.SPARE:
        return BACK
    return stage


def render(text: str, now: datetime) -> str:
    """Fill ``${NOW+90s}`` placeholders with RFC 3339 times relative to ``now``."""
    def repl(m: re.Match) -> str:
        moment = now + timedelta(**{UNITS[m.group(2)]: int(m.group(1))})
        return to_rfc3339(moment)
    return PLACEHOLDER.sub(repl, text)


class Demo:
    def __init__(self, root: Path):
        self.root = root
        self.dir = root / ".state" / "demo"
        self.plane = Plane(log=lambda line: say(f"plane: {line}"))
        self.operator: subprocess.Popen | None = None
        self.prom: prometheus.Prometheus | None = None
        self.kube: Kube | None = None
        self.started_plane = False
        self.stop = threading.Event()
        self.started_at: datetime | None = None
        self.moments: list[demo_report.Moment] = []
        self.live: Live | None = None
        self.snapshot: status.Snapshot | None = None
        self.victim = ""
        self.spares = 0  # the group's spares when the failure was injected: whole again with as many
        self.failed_at = datetime.now(timezone.utc)
        self.job_line = ""
        self.job_running_since: float | None = None
        self.job_nodes: set[str] = set()
        self.rebooted = ""  # the node the demo asked to reboot
        self.reboot_stage = ""
        self.whole_since: float | None = None

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        try:
            proc = subprocess.run([str(build.binary("kubectl")), f"--kubeconfig={self.plane.kubeconfig}", *args],
                                  input=input, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"kubectl {' '.join(args)}: no answer within 60 s (is the control plane up?)") from None
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    # ------------------------------------------------------------------------ the run

    def run(self) -> int:
        st = self.plane.state()
        self.started_plane = not (st and self.plane._all_alive(st) and self.plane._ready(st))
        self.plane.up()
        self.kube = Kube(api_client(str(self.plane.kubeconfig)))
        say("applying the CRDs")
        self.kubectl("apply", "-f", str(self.root / "crds"))
        for plural in ("capacitypools", "trainingplans", "instancegroups"):
            self.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{plural}.hyperplan.dev")
        shutil.rmtree(self.dir, ignore_errors=True)  # last run's log and TSDB; pictures are kept below
        self.dir.mkdir(parents=True, exist_ok=True)
        # An earlier run's objects of the demo's own (by name, from its examples; nothing else on the
        # plane is touched) are deleted, and the operator runs before anything waits on them: their
        # finalizers are the operator's (a group's nodes drain, a plan's capacity goes back).
        leftovers = self.delete_earlier_run()
        metrics_port = free_port()
        self.start_operator(metrics_port)
        self.wait_gone(leftovers)
        now = datetime.now(timezone.utc).replace(microsecond=0)
        self.started_at = now
        for path in sorted((self.root / EXAMPLES).glob("*.yaml")):
            say(f"applying {path.relative_to(self.root)}")
            console.print(self.kubectl("apply", "-f", "-", input=render(path.read_text(), now)).rstrip(),
                          markup=False)
        self.start_prometheus(metrics_port)
        say("the status view below is `hyperplan status --watch`; from another shell: "
            "eval \"$(.venv/bin/hyperplan dev env)\"; .venv/bin/hyperplan status --watch")
        if console.is_terminal:
            with Live(console=console, auto_refresh=False) as self.live:
                return self.narrate()
        return self.narrate()

    def delete_earlier_run(self) -> list[str]:
        """Delete the objects the demo's examples name that an earlier run left (Kueue's first: its Job
        and Workload go with them), without waiting; the ones there were, as ``kind/name``."""
        now = datetime.now(timezone.utc).replace(microsecond=0)
        found: list[str] = []
        paths = sorted((self.root / EXAMPLES).glob("*.yaml"), key=lambda p: "kueue.x-k8s.io" not in p.read_text())
        for path in paths:
            text = render(path.read_text(), now)
            names = self.kubectl("get", "-f", "-", "--ignore-not-found", "-o", "name", input=text, check=False).split()
            if names:
                found += names
                self.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", input=text, check=False)
        if found:
            say(f"deleting {len(found)} object(s) of an earlier demo run: {', '.join(found)}")
        return found

    def wait_gone(self, names: list[str], timeout: float = 300.0) -> None:
        """Wait, saying so every 10 s, until ``names`` are gone (their finalizers done by the operator)."""
        deadline, said = time.monotonic() + timeout, 0.0
        while names:
            names = [n for n in names if self.kubectl("get", n, "--ignore-not-found", "-o", "name", check=False).strip()]
            if not names:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"objects of an earlier run are still being deleted after {timeout:.0f} s: "
                                   f"{', '.join(names)} (see {self.dir / 'operator.log'})")
            if time.monotonic() - said >= 10:
                say(f"waiting for the operator to finish deleting {', '.join(names)} (a group's nodes drain, "
                    "a plan's capacity goes back to its pool)")
                said = time.monotonic()
            time.sleep(1)

    def start_operator(self, metrics_port: int) -> None:
        log = self.dir / "operator.log"
        env = {**os.environ, "KUBECONFIG": str(self.plane.kubeconfig), "HYPERPLAN_POLICY": "demo",
               "HYPERPLAN_METRICS_PORT": str(metrics_port), "HYPERPLAN_LIVENESS_PORT": str(free_port()),
               # One replica: nothing to elect, and no wait for a Lease left by an operator killed
               # in an earlier run, which would shift the demo's time-relative blocks.
               "HYPERPLAN_LEADER_ELECTION": "false",
               "HYPERPLAN_SAGEMAKER_API_PORT": str(api_port := free_port()), "HYPERPLAN_API_KEY_NAMESPACE": "default"}
        say(f"starting the operator (demo profile); metrics on :{metrics_port}/metrics, log {log}")
        self.offer_sagemaker_api(api_port)
        with open(log, "ab") as out:
            self.operator = subprocess.Popen([sys.executable, "-m", "hyperplan.cli", "run"], env=env,
                                             stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
        threading.Thread(target=self.echo_log, args=(log,), daemon=True).start()

    def offer_sagemaker_api(self, port: int) -> None:
        """A key for the operator's SageMaker API (docs/sagemaker-api.md), whose user may read the
        plans and groups, and the line to paste into another shell."""
        from hyperplan.sagemaker.access import key_secret, new_key

        key = new_key("hyperplan-demo")
        reader = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                  "metadata": {"name": "hyperplan-demo-api"},
                  "rules": [{"apiGroups": ["hyperplan.dev"], "resources": ["trainingplans", "instancegroups"],
                             "verbs": ["get", "list"]}]}
        binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": "hyperplan-demo-api"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                               "name": "hyperplan-demo-api"},
                   "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": key.user}]}
        items = {"apiVersion": "v1", "kind": "List", "items": [key_secret(key, "default"), reader, binding]}
        self.kubectl("apply", "-f", "-", input=json.dumps(items))
        say(f"the SageMaker API is on http://127.0.0.1:{port}; with the AWS CLI (or boto3) installed, paste into "
            f"another shell: AWS_ACCESS_KEY_ID={key.key_id} AWS_SECRET_ACCESS_KEY={key.secret} "
            f"AWS_DEFAULT_REGION=us-west-2 aws sagemaker list-training-plans --endpoint-url http://127.0.0.1:{port}")

    def echo_log(self, log: Path) -> None:
        """Print the operator's log lines as they come (above the live view on a terminal)."""
        with open(log, errors="replace") as f:
            while not self.stop.is_set():
                line = f.readline()
                if not line:
                    time.sleep(0.3)
                    continue
                console.print(Text("operator | " + line.rstrip(), style="grey58"), soft_wrap=True)

    def start_prometheus(self, metrics_port: int) -> None:
        rules = [self.root / ALERTS] if (self.root / ALERTS).is_file() else []
        try:
            self.prom = prometheus.start([f"127.0.0.1:{metrics_port}"], self.dir / "prometheus", rule_files=rules)
        except (RuntimeError, OSError) as e:  # PrometheusError is a RuntimeError
            say(f"Prometheus did not start ({e}); the demo goes on without graphs and without its picture")
            return
        say(f"Prometheus (pid {self.prom.pid}) scrapes the operator every second: open {self.prom.url}/graph"
            f"?g0.expr=hyperplan_instance_group_nodes&g0.tab=0&g0.range_input=5m")

    def narrate(self) -> int:
        """The status view, the injected failure, and the end of the demo."""
        failed = False
        ready_since: float | None = None
        last_print = 0.0
        while not self.stop.is_set():
            if self.operator.poll() is not None:
                say(f"the operator exited with {self.operator.returncode}; see {self.dir / 'operator.log'}")
                return 1
            try:
                self.snapshot = status.gather(self.kube)
            except Exception as e:  # noqa: BLE001 - a failed read must not end the demo
                say(f"(status unavailable: {e})")
                time.sleep(REFRESH_EVERY)
                continue
            if self.live is not None:
                self.live.update(status.render(self.snapshot, status.utcnow()), refresh=True)
            elif time.monotonic() - last_print >= PRINT_EVERY:
                last_print = time.monotonic()
                console.print(status.render(self.snapshot, status.utcnow()))
            self.follow_job()
            group = next((g for g in self.snapshot.groups if g.name == GROUP), None)
            if group is not None and group.phase == "Ready" and ready_since is None:
                ready_since = time.monotonic()
            if not failed and ready_since is not None and time.monotonic() - ready_since > 10:
                failed = True  # let the Ready group be seen for a moment first
                self.spares = group.spare_count
                self.inject_failure()
            elif failed:
                self.keep_failing(self.snapshot)
                if group is not None:
                    self.follow_reboot(group)
            plans = self.snapshot.plans
            if plans and all(p.phase in ("Expired", "Failed") for p in plans):
                say("both plans have expired: the demo is over")
                if self.live is None:
                    console.print(status.render(self.snapshot, status.utcnow()))
                time.sleep(3)  # a few more scrapes, so the picture shows the end
                return 0
            time.sleep(REFRESH_EVERY)
        return 0

    def follow_job(self) -> None:
        """Say where the Kueue job is whenever that changes (and mark its admission in the picture)."""
        try:
            workloads = self.kube.custom.list_namespaced_custom_object(
                "kueue.x-k8s.io", "v1beta2", JOB_NAMESPACE, "workloads")["items"]
            pods = self.kube.api.sanitize_for_serialization(self.kube.core.list_namespaced_pod(
                JOB_NAMESPACE, label_selector=f"job-name={JOB}").items)
        except Exception:  # noqa: BLE001 - a failed read must not end the demo; next round
            return
        workload = next((w for w in workloads if any(
            o.get("kind") == "Job" and o.get("name") == JOB
            for o in w["metadata"].get("ownerReferences") or [])), None)
        line = describe_job(workload, pods)
        self.job_nodes = {(p.get("spec") or {}).get("nodeName") for p in pods} - {None}
        running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        if line.startswith("admitted") and running and len(running) == len(pods):
            if self.job_running_since is None:
                self.job_running_since = time.monotonic()
            elif time.monotonic() - self.job_running_since > JOB_RUNS_FOR:
                say(f"Kueue job {JOB_NAMESPACE}/{JOB}: its training run is done; the demo reports its "
                    f"{len(running)} containers exited 0, as a kubelet would")
                self.finish_pods(running)
                self.job_running_since = float("inf")  # once
        if line != self.job_line:
            if line.startswith("admitted") and not self.job_line.startswith("admitted"):
                self.moments.append(demo_report.Moment(datetime.now(timezone.utc), f"job {JOB} admitted"))
            self.job_line = line
            say(f"Kueue job {JOB_NAMESPACE}/{JOB}: {line}")

    def follow_reboot(self, group: status.InstanceGroup) -> None:
        """Once the group is whole again after the failure (its failed node gone, no unhealthy node,
        its spares back) for a few seconds, ask for a reboot of an active node through the CLI, as
        an admin does; then say when the ladder has it rebooting and when it is back as a spare."""
        if not self.rebooted:
            whole = (group.phase == "Ready" and group.unhealthy_count == 0 and group.spare_count >= self.spares
                     and all(n.name != self.victim for n in group.nodes))
            self.whole_since = (self.whole_since or time.monotonic()) if whole else None
            if self.whole_since is not None and time.monotonic() - self.whole_since > REBOOT_AFTER:
                node = reboot_candidate(group, self.job_nodes)
                if node is not None:
                    self.ask_reboot(node)
            return
        stage = reboot_progress(self.reboot_stage, next((n for n in group.nodes if n.name == self.rebooted), None))
        if stage == self.reboot_stage:
            return
        self.reboot_stage = stage
        if stage == REBOOTING:
            say(f"{self.rebooted} is rebooting: its UltraServer's spare serves in its place")
        elif stage == BACK:
            self.moments.append(demo_report.Moment(datetime.now(timezone.utc), f"{self.rebooted} back as a spare"))
            say(f"{self.rebooted} is back from its reboot and is its UltraServer's spare: no new node was needed")

    def ask_reboot(self, node: str) -> None:
        """``hyperplan node reboot NODE``, the admin's way (it labels the node UnschedulablePendingReboot)."""
        proc = subprocess.run([sys.executable, "-m", "hyperplan.cli", "node", "reboot", node,
                               "--kubeconfig", str(self.plane.kubeconfig)], capture_output=True, text=True, timeout=60)
        self.rebooted, self.reboot_stage = node, ASKED
        if proc.returncode != 0:
            say(f"hyperplan node reboot {node} failed: {(proc.stderr or proc.stdout).strip()}")
            self.reboot_stage = BACK  # nothing more to follow
            return
        self.moments.append(demo_report.Moment(datetime.now(timezone.utc), f"reboot asked: {node}"))
        say(f"$ hyperplan node reboot {node}\n{proc.stdout.strip()}\nafter the label's grace its UltraServer's "
            "spare is promoted and the node rebooted; it comes back as the spare")

    def finish_pods(self, pods: list[dict]) -> None:
        now = to_rfc3339(datetime.now(timezone.utc))
        for pod in pods:
            container = pod["spec"]["containers"][0]
            try:
                self.kube.core.patch_namespaced_pod_status(pod["metadata"]["name"], JOB_NAMESPACE, {"status": {
                    "phase": "Succeeded",
                    "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted",
                                    "lastTransitionTime": now}],
                    "containerStatuses": [{"name": container["name"], "image": container["image"], "imageID": "",
                                           "ready": False, "restartCount": 0,
                                           "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                                                    "startedAt": now, "finishedAt": now}}}]}})
            except Exception as e:  # noqa: BLE001 - the demo goes on; the job then ends with its block
                say(f"could not report {pod['metadata']['name']} finished: {e}")

    def inject_failure(self) -> None:
        nodes = self.get("nodes", "-l", f"{LABEL_GROUP}={GROUP},{LABEL_ROLE}={ROLE_ACTIVE}")
        self.victim = sorted(n["metadata"]["name"] for n in nodes["items"])[-1]
        self.failed_at = datetime.now(timezone.utc)
        self.report_failure()
        grace = int(((self.get("instancegroup", GROUP).get("spec") or {}).get("healthCheck") or {})
                    .get("graceSeconds", 30))
        self.moments.append(demo_report.Moment(self.failed_at, f"failure injected: {self.victim}"))
        self.moments.append(demo_report.Moment(self.failed_at + timedelta(seconds=grace),
                                               f"its {grace} s grace ends"))
        say(f"injected a failure: {self.victim} is NotReady; after the {grace} s grace a spare takes over")

    def report_failure(self) -> None:
        """Ready=False on the victim, as a node agent reports it (the failure keeps its first time)."""
        self.kube.core.patch_node_status(self.victim, {"status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "DemoFailure",
             "message": "GPU fell off the bus (injected by the demo)",
             "lastHeartbeatTime": to_rfc3339(datetime.now(timezone.utc)),
             "lastTransitionTime": to_rfc3339(self.failed_at)}]}})

    def keep_failing(self, snap: status.Snapshot) -> None:
        """Say it again while the victim is neither NotReady nor marked.

        KWOK's heartbeat can write back a Ready=True it rendered just before the patch; an agent
        whose node is still broken reports it again, so the operator sees a steady failure.
        """
        group = next((g for g in snap.groups if g.name == GROUP), None)
        node = next((n for n in (group.nodes if group else []) if n.name == self.victim), None)
        if node is not None and node.state != status.UNHEALTHY:
            self.report_failure()

    # ------------------------------------------------------------------------ the end

    def write_picture(self) -> None:
        """The run's overview from Prometheus's data (nothing when Prometheus or the run never started)."""
        if self.prom is None or self.started_at is None or self.prom.proc.poll() is not None:
            return
        end = datetime.now(timezone.utc)
        path = self.root / ".state" / f"demo-overview-{self.started_at:%Y%m%d-%H%M%S}.png"
        try:
            data = demo_report.collect(self.prom, self.started_at, end, step=1.0)
            demo_report.write_overview(data, path, self.moments)
        except Exception as e:  # noqa: BLE001 - the picture must not hide how the demo ended
            say(f"could not write the picture: {e}")
            return
        say(f"the picture of this run: {path}")

    def shutdown(self) -> None:
        self.stop.set()
        if self.live is not None:
            self.live.stop()
        self.write_picture()
        if self.operator and self.operator.poll() is None:
            say(f"stopping the operator (pid {self.operator.pid})")
            self.operator.send_signal(signal.SIGTERM)
            try:
                self.operator.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.operator.pid, signal.SIGKILL)
        if self.prom is not None:
            say(f"stopping Prometheus (pid {self.prom.pid})")
            self.prom.stop()
        if self.started_plane:
            self.plane.down()
        else:
            say("the control plane was already running; leaving it up (`make plane-down` stops it)")


def main() -> int:
    demo = Demo(project_root())
    signal.signal(signal.SIGTERM, lambda *_: demo.stop.set())
    try:
        return demo.run()
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except RuntimeError as e:
        say(f"error: {e}")
        return 1
    finally:
        demo.shutdown()


if __name__ == "__main__":
    sys.exit(main())
