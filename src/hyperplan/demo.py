"""`make demo`: the whole product on the local control plane, in about five minutes.

1. brings the local control plane up (building it the first time) and applies the CRDs;
2. applies the objects of ``deploy/examples/demo/`` with their times filled in relative to now;
3. runs the operator (``hyperplan run``, demo profile) in the foreground, its log on stdout,
   with a status table every 15 s;
4. once the GB200 group is Ready, fails one of its nodes (Ready=False, as an agent would) so
   that a spare takes over;
5. stops when both plans have expired; Ctrl-C stops earlier. Everything it started (the
   operator, and the plane if it was not already running) is stopped again, by pid.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from hyperplan.api.models import to_rfc3339
from hyperplan.devcluster import build
from hyperplan.devcluster.plane import Plane, free_port, project_root

EXAMPLES = Path("deploy") / "examples" / "demo"
PLACEHOLDER = re.compile(r"\$\{NOW\+(\d+)([smh])\}")
UNITS = {"s": "seconds", "m": "minutes", "h": "hours"}


def say(line: str) -> None:
    print(f"\033[1m[demo {datetime.now().strftime('%H:%M:%S')}]\033[0m {line}", flush=True)


def render(text: str, now: datetime) -> str:
    """Fill ``${NOW+90s}`` placeholders with RFC 3339 times relative to ``now``."""
    def repl(m: re.Match) -> str:
        moment = now + timedelta(**{UNITS[m.group(2)]: int(m.group(1))})
        return to_rfc3339(moment)
    return PLACEHOLDER.sub(repl, text)


class Demo:
    def __init__(self, root: Path):
        self.root = root
        self.plane = Plane(log=lambda line: say(f"plane: {line}"))
        self.operator: subprocess.Popen | None = None
        self.started_plane = False
        self.stop = threading.Event()

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        proc = subprocess.run([str(build.binary("kubectl")), f"--kubeconfig={self.plane.kubeconfig}", *args],
                              input=input, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def run(self) -> int:
        st = self.plane.state()
        self.started_plane = not (st and self.plane._all_alive(st) and self.plane._ready(st))
        self.plane.up()
        say("applying the CRDs")
        self.kubectl("apply", "-f", str(self.root / "crds"))
        for plural in ("capacitypools", "trainingplans", "instancegroups"):
            self.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{plural}.hyperplan.dev")
        self.kubectl("delete", "instancegroups,trainingplans,capacitypools", "--all", "--wait=true",
                     "--timeout=60s", check=False)
        now = datetime.now(timezone.utc).replace(microsecond=0)
        for path in sorted((self.root / EXAMPLES).glob("*.yaml")):
            say(f"applying {path.relative_to(self.root)}")
            print(self.kubectl("apply", "-f", "-", input=render(path.read_text(), now)).rstrip(), flush=True)
        env = {**os.environ, "KUBECONFIG": str(self.plane.kubeconfig), "HYPERPLAN_POLICY": "demo",
               "HYPERPLAN_METRICS_PORT": str(free_port()), "HYPERPLAN_LIVENESS_PORT": str(free_port())}
        say(f"starting the operator (demo profile); metrics on :{env['HYPERPLAN_METRICS_PORT']}/metrics")
        self.operator = subprocess.Popen([sys.executable, "-m", "hyperplan.cli", "run"], env=env,
                                         start_new_session=True)
        threading.Thread(target=self.narrate, daemon=True).start()
        while not self.stop.wait(1):
            if self.operator.poll() is not None:
                say(f"the operator exited with {self.operator.returncode}")
                return 1
        return 0

    def narrate(self) -> None:
        """Status tables, the injected failure, and the end of the demo."""
        failed = False
        ready_since: float | None = None
        last_table = 0.0
        while not self.stop.is_set():
            try:
                if time.monotonic() - last_table > 15:
                    last_table = time.monotonic()
                    table = self.kubectl("get", "trainingplans,instancegroups")
                    roles = {}
                    for n in self.get("nodes", "-l", "hyperplan.dev/instance-group")["items"]:
                        role = n["metadata"]["labels"].get("hyperplan.dev/role", "?")
                        roles[role] = roles.get(role, 0) + 1
                    say("status\n" + table.rstrip() + f"\nnodes by role: {roles or 'none'}")
                group = self.get("instancegroup", "demo-workers").get("status") or {}
                if group.get("phase") == "Ready" and ready_since is None:
                    ready_since = time.monotonic()
                if not failed and ready_since is not None and time.monotonic() - ready_since > 10:
                    failed = True  # let the Ready group be seen for a moment first
                    self.inject_failure()
                plans = self.get("trainingplans")["items"]
                if plans and all((p.get("status") or {}).get("phase") in ("Expired", "Failed") for p in plans):
                    say("both plans have expired: the demo is over")
                    self.stop.set()
            except Exception as e:  # noqa: BLE001 - narration must not end the demo
                say(f"(status unavailable: {e})")
            time.sleep(2)

    def inject_failure(self) -> None:
        nodes = self.get("nodes", "-l", "hyperplan.dev/instance-group=demo-workers,hyperplan.dev/role=active")
        victim = sorted(n["metadata"]["name"] for n in nodes["items"])[-1]
        when = to_rfc3339(datetime.now(timezone.utc))
        patch = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "DemoFailure",
                                            "message": "GPU fell off the bus (injected by the demo)",
                                            "lastHeartbeatTime": when, "lastTransitionTime": when}]}}
        self.kubectl("patch", "node", victim, "--subresource=status", "--type=strategic", "-p", json.dumps(patch))
        say(f"injected a failure: {victim} is NotReady; after the 10 s grace a spare takes over")

    def shutdown(self) -> None:
        self.stop.set()
        if self.operator and self.operator.poll() is None:
            say("stopping the operator")
            self.operator.send_signal(signal.SIGTERM)
            try:
                self.operator.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.operator.pid, signal.SIGKILL)
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
