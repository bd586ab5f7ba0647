"""Start, inspect and stop the local control plane.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK and Kueue run as child
processes on loopback ports, each in its own session so that ``down`` can stop exactly
the process group it started, found by the pid recorded in ``plane.json``. Kueue's part
(CRDs, webhooks on loopback, a private mount namespace) is in :mod:`.kueue`. Everything the
plane writes (certificates, etcd data, logs, the kubeconfig) lives in one state folder
inside the checkout (``.state/dev``, git-ignored); ``~/.kube/config`` is never touched.

Further planes run beside the default one under a name (``Plane(name="capacity")``, ``hyperplan
dev up --name capacity``), each with its own state folder (``.state/dev/planes/<name>``), its own
free ports and no Kueue: a capacity cluster and training clusters on one machine, for the
federation tests.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable

import yaml

from hyperplan_dev import build, certs, kueue

Log = Callable[[str], None]

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# Writes only, at Metadata level (who, what, the response code; no bodies): what a benchmark
# needs to attribute writes to their client. Logged as each write is answered (mode blocking),
# not in batches, so that a window read from the log has exact edges.
AUDIT_WRITES_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
"""
PROCESS_ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kueue")


def project_root() -> Path:
    """The checkout that holds the state folder: the nearest parent with hyperplan's pyproject."""
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        p = d / "pyproject.toml"
        if p.is_file() and 'name = "hyperplan"' in p.read_text():
            return d
    return here


NAME_PATTERN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
NAME_MAX = 40


def check_name(name: str) -> str:
    """``name`` if it may name a plane, else ValueError saying why.

    A DNS label (lower-case letters, digits and inner dashes), because the name becomes a folder,
    the kubeconfig's cluster, user and context (``hyperplan-dev-<name>``) and, in the federation
    tests, the operator's cluster name in HyperPod ARNs; at most 40 characters so that all of
    these stay within the 63 of a label.
    """
    if not NAME_PATTERN.fullmatch(name) or len(name) > NAME_MAX:
        raise ValueError(f"invalid plane name {name!r}: use 1 to {NAME_MAX} lower-case letters, digits "
                         "and dashes, starting and ending with a letter or digit (a DNS label, "
                         "such as capacity or training-a)")
    return name


def state_dir(name: str | None = None, base: Path | None = None) -> Path:
    """The default plane's state folder (``base``, else ``$HYPERPLAN_STATE_DIR``, else
    ``.state/dev``); a named plane's is inside it, in ``planes/<name>``, which the default
    plane's ``down`` leaves alone."""
    if base is None:
        env = os.environ.get("HYPERPLAN_STATE_DIR")
        base = Path(env) if env else project_root() / ".state" / "dev"
    return base if name is None else base / "planes" / check_name(name)


# Ports this process has handed out. A port is free when picked but only taken once its server
# binds it, seconds later; until then the kernel may hand it out again, to the next plane started
# beside this one (the federation tests start three) or to an operator's metrics port.
_handed_out: set[int] = set()


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports, none handed out before by this process. Each socket
    stays bound until all are picked, so the kernel cannot give the same port twice."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < n:
            s = stack.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            if port not in _handed_out:
                ports.append(port)
        _handed_out.update(ports)
        return ports


def free_port() -> int:
    return free_ports(1)[0]


@dataclass
class PlaneState:
    """What ``up`` started; written to ``plane.json`` and read by ``status`` and ``down``."""

    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    kubernetes_version: str = build.KUBERNETES_VERSION
    kueue_version: str = build.KUEUE_VERSION

    @classmethod
    def load(cls, path: Path) -> "PlaneState | None":
        if not path.is_file():
            return None
        return cls(**json.loads(path.read_text()))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))


class Plane:
    def __init__(self, root: Path | None = None, log: Log = print, with_kueue: bool | None = None,
                 node_status_seconds: int | None = None, audit_writes: bool = False,
                 name: str | None = None, kwok_log_level: str = "INFO"):
        """``name``: a further plane beside the default one (see :func:`check_name`), its state
        in ``root`` or else ``state_dir(name)``; None: the default plane, as it always was.

        ``with_kueue=False``: a plane without Kueue (for benchmarks that measure the rest).
        Unset: the default plane starts Kueue, a named one does not. The federation's clusters
        trade capacity through the SageMaker API and need no admission checks, and each Kueue
        costs its CRDs (1.4 MB of schema to take in) and a busy controller on a 2-core machine.

        ``node_status_seconds``: how often KWOK's fake kubelets report an unchanged node status.
        By default every 20 to 25 s, so that tests see a node that stops reporting soon. A fleet
        benchmark sets what a kubelet does when nothing changes (``nodeStatusReportFrequency``,
        300 s): thousands of fake kubelets on two cores can then report at a kubelet's own rate,
        with their Leases renewed every ``node_status_seconds`` and the node lifecycle
        controller's grace periods raised to match (both only matter to the plane: the operator
        watches neither Leases nor heartbeat times). The startup grace too: KWOK on two cores
        took more than the default minute to bring up some of 5,000 new nodes, and the
        controller then set them Ready=Unknown, which the groups rightly replaced.

        ``audit_writes``: the API server logs every write (create, update, patch, delete) at the
        audit level ``Metadata`` to :attr:`audit_log`, one JSON line each with its User-Agent, so
        that a benchmark can tell the operator's writes from the controllers' and KWOK's
        (``apiserver_request_total`` has no label for the client).

        ``kwok_log_level``: KWOK's ``-v`` (``DEBUG`` logs each stage it schedules and plays, with
        its delay: what a benchmark keeps to find out why a node did not move on)."""
        self.kwok_log_level = kwok_log_level
        self.name = None if name is None else check_name(name)
        self.dir = root or state_dir(self.name)
        self.log = log
        self.with_kueue = self.name is None if with_kueue is None else with_kueue
        self.node_status_seconds = node_status_seconds
        self.audit_writes = audit_writes
        self._children: dict[str, subprocess.Popen] = {}

    @property
    def title(self) -> str:
        """How messages name this plane: "control plane", or "control plane 'capacity'"."""
        return "control plane" if self.name is None else f"control plane {self.name!r}"

    @property
    def up_command(self) -> str:
        return "hyperplan dev up" if self.name is None else f"hyperplan dev up --name {self.name}"

    @property
    def kubeconfig_name(self) -> str:
        """The kubeconfig's cluster and context name; distinct per plane, so that the kubeconfigs
        of several planes can be merged (``KUBECONFIG=a:b:c``) without one hiding another."""
        return "hyperplan-dev" if self.name is None else f"hyperplan-dev-{self.name}"

    @property
    def processes(self) -> tuple[str, ...]:
        """What ``up`` starts, in order."""
        return PROCESS_ORDER if self.with_kueue else tuple(n for n in PROCESS_ORDER if n != "kueue")

    # ----------------------------------------------------------------- paths

    @property
    def state_file(self) -> Path: return self.dir / "plane.json"
    @property
    def kubeconfig(self) -> Path: return self.dir / "kubeconfig"
    @property
    def logs(self) -> Path: return self.dir / "logs"
    @property
    def audit_log(self) -> Path: return self.logs / "audit.log"
    @property
    def pki(self) -> certs.Pki: return certs.Pki(self.dir / "pki")
    @property
    def kueue_dir(self) -> Path: return self.dir / "kueue"

    def state(self) -> PlaneState | None:
        return PlaneState.load(self.state_file)

    @property
    def server(self) -> str:
        st = self.state()
        if st is None:
            raise RuntimeError(f"the local {self.title} is not up; run `{self.up_command}`")
        return f"https://127.0.0.1:{st.ports['apiserver']}"

    # ----------------------------------------------------------------- lifecycle

    def up(self) -> PlaneState:
        started = time.monotonic()
        st = self.state()
        if st and self._all_alive(st) and self._ready(st):
            self.log(f"{self.title} already running at https://127.0.0.1:{st.ports['apiserver']}")
            return st
        if st:
            self.log(f"found a stale {self.title}; stopping what is left of it")
            self.down(quiet=True)
        build.ensure_binaries(self.log)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self.log("generating certificates")
        pki = certs.generate(self.dir / "pki")
        keys = ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok",
                "kueue-webhook", "kueue-health", "kueue-metrics")
        st = PlaneState(ports=dict(zip(keys, free_ports(len(keys)))))
        st.save(self.state_file)
        self._write_kubeconfig(st, pki)
        for name in self.processes:
            if name == "kueue":
                self._prepare_kueue(st, pki, started)
            self.log(f"starting {name} (elapsed {time.monotonic() - started:.1f}s)")
            kueue_started = time.monotonic()
            st.pids[name] = self._spawn(name, self._command(name, st, pki))
            st.save(self.state_file)
            if name == "etcd":
                self._wait(lambda: self._port_open(st.ports["etcd"]), "etcd", st)
            elif name == "kube-apiserver":
                self._wait(lambda: self._ready(st), "kube-apiserver /readyz", st)
            elif name == "kueue":
                self._await_kueue(st, pki, started)
                self.log(f"kueue {build.KUEUE_VERSION} ready in {time.monotonic() - kueue_started:.1f}s "
                         f"(webhooks on https://127.0.0.1:{st.ports['kueue-webhook']})")
        self._wait(lambda: self._default_service_account(st), "the default service account", st)
        self.log(f"{self.title} ready at https://127.0.0.1:{st.ports['apiserver']} "
                 f"in {time.monotonic() - started:.1f}s; kubeconfig {self.kubeconfig}")
        return st

    def down(self, quiet: bool = False) -> None:
        st = self.state()
        if st is None:
            if not quiet:
                self.log(f"{self.title} is not running")
            return
        self._delete_kueue_webhooks(st, quiet)
        for name in reversed(PROCESS_ORDER):
            pid = st.pids.get(name)
            if pid and self._is_ours(name, pid):
                if not quiet:
                    self.log(f"stopping {name} (pid {pid})")
                stop_process_group(pid)
        for sub in ("etcd", "pki", "logs", "kueue"):
            _rmtree(self.dir / sub)
        for f in (self.state_file, self.kubeconfig, self.dir / "kwok-stages.yaml", self.dir / "audit-policy.yaml"):
            f.unlink(missing_ok=True)
        if self.name is not None:  # its folder too, once empty (so planes/ lists the named planes up)
            with contextlib.suppress(OSError):
                self.dir.rmdir()
        if not quiet:
            self.log(f"{self.title} stopped and its state removed")

    def restart(self, name: str, how: signal.Signals = signal.SIGTERM, timeout: float = 120) -> float:
        """Stop one process of the running plane and start it again; the seconds that took.

        The process group recorded in ``plane.json`` gets ``how`` (SIGTERM: a clean stop, as
        an upgrade does; SIGKILL: a crash), and once it is gone the same command runs again:
        the same ports, the existing certificates and kubeconfig, and for etcd the same data
        directory, so the cluster keeps every object. Returns once the process serves again:
        etcd's client port answers and the API server is ready again behind it, the API
        server's ``/readyz`` says ok, Kueue's webhooks answer, the others are alive for a
        second. For chaos tests. Kueue's webhook configurations stay while it restarts
        (creates of Jobs fail meanwhile, as with an in-cluster Kueue that restarts).
        """
        if name not in PROCESS_ORDER:
            raise ValueError(f"unknown plane process {name!r}; expected one of {', '.join(PROCESS_ORDER)}")
        st = self.state()
        if st is None:
            raise RuntimeError(f"the local {self.title} is not up; nothing to restart")
        started = time.monotonic()
        pid = st.pids.get(name)
        if pid and self._is_ours(name, pid):
            if how == signal.SIGKILL:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            stop_process_group(pid)
            child = self._children.pop(name, None)
            if child is not None:
                child.wait(timeout=10)
        self.logs.mkdir(parents=True, exist_ok=True)
        st.pids[name] = self._spawn(name, self._command(name, st, self.pki))
        st.save(self.state_file)
        if name == "etcd":
            self._wait(lambda: self._port_open(st.ports["etcd"]), "etcd", st, timeout)
            self._wait(lambda: self._ready(st), "kube-apiserver /readyz after etcd came back", st, timeout)
        elif name == "kube-apiserver":
            self._wait(lambda: self._ready(st), "kube-apiserver /readyz", st, timeout)
        elif name == "kueue":
            self._await_kueue(st, self.pki, started, timeout)
        else:
            time.sleep(1)
            self._wait(lambda: self._is_ours(name, st.pids[name]), name, st, timeout)
        return time.monotonic() - started

    def status(self) -> list[tuple[str, str, str]]:
        st = self.state()
        if st is None:
            return []
        rows = []
        where = {"etcd": f"http://127.0.0.1:{st.ports['etcd']}",
                 "kube-apiserver": f"https://127.0.0.1:{st.ports['apiserver']}",
                 "kube-controller-manager": f"https://127.0.0.1:{st.ports['controller-manager']}",
                 "kube-scheduler": f"https://127.0.0.1:{st.ports['scheduler']}",
                 "kwok": f"http://127.0.0.1:{st.ports['kwok']}",
                 "kueue": f"https://127.0.0.1:{st.ports.get('kueue-webhook')} (webhooks), "
                          f"http://127.0.0.1:{st.ports.get('kueue-health')}/readyz"}
        for name in (n for n in PROCESS_ORDER if n in st.pids):
            pid = st.pids.get(name)
            alive = bool(pid) and self._is_ours(name, pid)
            rows.append((name, f"running (pid {pid})" if alive else "not running", where[name]))
        return rows

    def env_lines(self) -> list[str]:
        bins = sorted({str(build.binary("kubectl").parent), str(build.binary("helm").parent)})
        return [
            f"export KUBECONFIG={self.kubeconfig}",
            f"export PATH={':'.join(bins)}:$PATH",
        ]

    # ----------------------------------------------------------------- internals

    def _audit_flags(self) -> list[str]:
        if not self.audit_writes:
            return []
        policy = self.dir / "audit-policy.yaml"
        policy.write_text(AUDIT_WRITES_POLICY)
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json", "--audit-log-mode=blocking", "--audit-log-maxsize=0"]

    def _command(self, name: str, st: PlaneState, pki: certs.Pki) -> list[str]:
        p = st.ports
        if name == "etcd":
            peer = f"http://127.0.0.1:{p['etcd-peer']}"
            client = f"http://127.0.0.1:{p['etcd']}"
            return [str(build.binary("etcd")), "--name=node0", f"--data-dir={self.dir / 'etcd'}",
                    f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=node0={peer}", "--unsafe-no-fsync=true",
                    "--log-level=warn"]
        if name == "kube-apiserver":
            return [str(build.binary("kube-apiserver")),
                    f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
                    "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                    f"--secure-port={p['apiserver']}",
                    f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
                    f"--client-ca-file={pki.ca_cert}",
                    f"--service-account-key-file={pki.sa_pub}",
                    f"--service-account-signing-key-file={pki.sa_key}",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    "--authorization-mode=Node,RBAC", "--allow-privileged=true",
                    "--service-cluster-ip-range=10.0.0.0/24", "--profiling=false",
                    *self._audit_flags(), "--v=1"]
        common = [f"--kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
                  f"--authorization-kubeconfig={self.kubeconfig}", "--bind-address=127.0.0.1",
                  "--leader-elect=false", "--v=1"]
        if name == "kube-controller-manager":
            return [str(build.binary("kube-controller-manager")), *common,
                    f"--secure-port={p['controller-manager']}",
                    f"--root-ca-file={pki.ca_cert}",
                    f"--service-account-private-key-file={pki.sa_key}",
                    "--use-service-account-credentials=false",
                    "--controllers=*,-bootstrapsigner,-tokencleaner",
                    *([f"--node-monitor-grace-period={2 * self.node_status_seconds}s",
                       f"--node-startup-grace-period={2 * self.node_status_seconds}s"]
                      if self.node_status_seconds else [])]
        if name == "kube-scheduler":
            return [str(build.binary("kube-scheduler")), *common, f"--secure-port={p['scheduler']}"]
        if name == "kwok":
            stages = self.dir / "kwok-stages.yaml"
            stages.write_text(kwok_stages(self.node_status_seconds))
            return [str(build.binary("kwok")), f"--kubeconfig={self.kubeconfig}",
                    "--manage-all-nodes=false",
                    f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                    "--cidr=10.0.0.0/16", "--node-ip=10.0.0.1",
                    f"--node-lease-duration-seconds={lease_seconds(self.node_status_seconds)}",
                    f"--server-address=127.0.0.1:{p['kwok']}", f"--config={stages}",
                    f"-v={self.kwok_log_level}"]
        if name == "kueue":
            d = self.kueue_dir
            return kueue.launch_command(build.binary("kueue"), d / "config.yaml", self.kubeconfig,
                                        d / "certs", d / "etc-overlay")
        raise KeyError(name)

    # ----------------------------------------------------------------- Kueue

    def _apply(self, st: PlaneState, path: str, obj: dict, timeout: float = 120) -> None:
        """Server-side apply of one object at its API ``path`` (as ``kubectl apply --server-side``).

        The timeout is generous: on a busy 2-core machine the API server took over 20 s to take
        in Kueue's Workload CRD (1.4 MB of schema).
        """
        status, body = self._request(st, "PATCH", f"{path}?fieldManager=hyperplan-dev-plane&force=true",
                                     json.dumps(obj).encode(), "application/apply-patch+yaml", timeout)
        if status not in (200, 201):
            raise RuntimeError(f"applying {path} failed ({status or 'no answer'}): {body.decode()[:500]}")

    def _create_or_apply(self, st: PlaneState, collection: str, obj: dict) -> None:
        """Create ``obj`` in ``collection``; server-side apply it where it already exists.

        A create is much cheaper than an apply for a fresh object: the API server took 3 s to
        create Kueue's Workload CRD and over 10 s to server-side apply it (managed fields over
        1.4 MB of schema) on a busy 2-core machine. The apply only runs on a restart, where
        the CRDs are already there.
        """
        status, body = self._request(st, "POST", f"{collection}?fieldManager=hyperplan-dev-plane",
                                     json.dumps(obj).encode(), timeout=120)
        if status == 409:
            self._apply(st, f"{collection}/{obj['metadata']['name']}", obj)
        elif status != 201:
            raise RuntimeError(f"creating {collection}/{obj['metadata']['name']} failed "
                               f"({status or 'no answer'}): {body.decode()[:500]}")

    def _kueue_crds_established(self, st: PlaneState, names: set[str]) -> bool:
        status, body = self._get(st, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
        if status != 200:
            return False
        established = {c["metadata"]["name"] for c in json.loads(body)["items"]
                       if any(x["type"] == "Established" and x["status"] == "True"
                              for x in (c.get("status") or {}).get("conditions") or [])}
        return names <= established

    def _prepare_kueue(self, st: PlaneState, pki: certs.Pki, started: float) -> None:
        """Kueue's CRDs applied and Established; its configuration and serving certificate written."""
        self.log(f"applying Kueue's CRDs (elapsed {time.monotonic() - started:.1f}s)")
        d = self.kueue_dir
        d.mkdir(parents=True, exist_ok=True)
        (d / "etc-overlay").mkdir(exist_ok=True)
        # libyaml's loader where PyYAML has it: the Workload CRD alone is 1.4 MB of YAML, which
        # the pure-Python loader takes seconds to read. The API server gets JSON, which it
        # decodes much faster than YAML.
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        crds = [yaml.load(f.read_text(), Loader=loader) for f in sorted(kueue.crd_dir().glob("*.yaml"))]
        names = {c["metadata"]["name"] for c in crds}
        for crd in crds:
            self._create_or_apply(st, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        self._create_or_apply(st, "/api/v1/namespaces",
                              {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": kueue.NAMESPACE}})
        self._wait(lambda: self._kueue_crds_established(st, names), "Kueue's CRDs Established", st)
        self.log(f"Kueue's {len(names)} CRDs Established (elapsed {time.monotonic() - started:.1f}s)")
        certs.issue_serving_cert(pki, "kueue-webhook", ("127.0.0.1",), d / "certs")
        config = kueue.configuration(st.ports["kueue-webhook"], st.ports["kueue-health"],
                                     st.ports["kueue-metrics"], d / "certs")
        (d / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    def _kueue_healthy(self, st: PlaneState) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{st.ports['kueue-health']}/readyz", timeout=2) as r:
                return r.status == 200
        except (OSError, urllib.error.HTTPError):
            return False

    def _kueue_webhooks_answer(self, st: PlaneState) -> bool:
        status, _ = self._request(st, "POST", f"/apis/{kueue.GROUP}/v1beta2/resourceflavors?dryRun=All",
                                  json.dumps(kueue.PROBE_OBJECT).encode())
        return status == 201

    def _await_kueue(self, st: PlaneState, pki: certs.Pki, started: float, timeout: float = 120) -> None:
        """Wait for Kueue's readiness, point its webhook configurations at it, wait until they answer."""
        self._wait(lambda: self._kueue_healthy(st), "kueue /readyz", st, timeout)
        configs = kueue.webhook_configurations(kueue.webhook_manifests().read_text(),
                                               st.ports["kueue-webhook"], pki.ca_cert.read_bytes())
        for c in configs:
            self._apply(st, f"/apis/admissionregistration.k8s.io/v1/{c['kind'].lower()}s/{c['metadata']['name']}", c)
        hooks = sum(len(c["webhooks"]) for c in configs)
        self.log(f"kueue healthy; {hooks} webhooks registered at https://127.0.0.1:{st.ports['kueue-webhook']} "
                 f"(elapsed {time.monotonic() - started:.1f}s)")
        self._wait(lambda: self._kueue_webhooks_answer(st), "Kueue's webhooks (a dry-run ResourceFlavor)", st, timeout)

    def _delete_kueue_webhooks(self, st: PlaneState, quiet: bool) -> None:
        """Before Kueue stops: remove its webhook configurations while the API server still runs."""
        pid = st.pids.get("kueue")
        if not pid or not self._ready(st):
            return
        try:
            kueue.delete_webhook_configurations(build.binary("kubectl"), self.kubeconfig)
            if not quiet:
                self.log("deleted Kueue's webhook configurations")
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            self.log(f"warning: {e}")

    def stop_kueue(self) -> None:
        """Stop Kueue alone, its webhook configurations deleted first; the rest keeps running."""
        st = self.state()
        if st is None:
            raise RuntimeError("the local control plane is not up")
        kueue.delete_webhook_configurations(build.binary("kubectl"), self.kubeconfig)
        pid = st.pids.get("kueue")
        if pid and self._is_ours("kueue", pid):
            stop_process_group(pid)
        child = self._children.pop("kueue", None)
        if child is not None:
            child.wait(timeout=10)

    def start_kueue(self) -> float:
        """Start Kueue on the running plane (after :meth:`stop_kueue`); the seconds it took."""
        st = self.state()
        if st is None:
            raise RuntimeError("the local control plane is not up")
        started = time.monotonic()
        pki = self.pki
        self._prepare_kueue(st, pki, started)
        st.pids["kueue"] = self._spawn("kueue", self._command("kueue", st, pki))
        st.save(self.state_file)
        self._await_kueue(st, pki, started)
        return time.monotonic() - started

    def _spawn(self, name: str, cmd: list[str]) -> int:
        with open(self.logs / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self._children[name] = proc
        return proc.pid

    def _is_ours(self, name: str, pid: int) -> bool:
        """True when ``pid`` is alive and still runs the binary we started (pids get reused)."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":
            return False
        return Path(cmdline).name == name

    def _all_alive(self, st: PlaneState) -> bool:
        return all(self._is_ours(n, st.pids.get(n, 0)) for n in self.processes)

    def _port_open(self, port: int) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", port)) == 0

    def ssl_context(self) -> ssl.SSLContext:
        pki = self.pki
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        ctx.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        return ctx

    def _get(self, st: PlaneState, path: str) -> tuple[int, bytes]:
        url = f"https://127.0.0.1:{st.ports['apiserver']}{path}"
        try:
            with urllib.request.urlopen(url, context=self.ssl_context(), timeout=3) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, b""
        except (OSError, ssl.SSLError):
            return 0, b""

    def _request(self, st: PlaneState, method: str, path: str, body: bytes,
                 content_type: str = "application/json", timeout: float = 30) -> tuple[int, bytes]:
        """One API call with the admin certificate; (status, body), status 0 when nothing answered."""
        req = urllib.request.Request(f"https://127.0.0.1:{st.ports['apiserver']}{path}", data=body,
                                     method=method, headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (OSError, ssl.SSLError) as e:
            return 0, str(e).encode()

    def _ready(self, st: PlaneState) -> bool:
        return self._get(st, "/readyz")[0] == 200

    def _default_service_account(self, st: PlaneState) -> bool:
        return self._get(st, "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200

    def _wait(self, check: Callable[[], bool], what: str, st: PlaneState, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            # Children started by this call are asked directly: right after fork, /proc still
            # shows the Python parent's command line until exec.
            dead = [n for n, proc in self._children.items() if proc.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}; "
                                   f"see {self.logs}/{dead[0]}.log")
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}; logs in {self.logs}")

    def _write_kubeconfig(self, st: PlaneState, pki: certs.Pki) -> None:
        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        config = kubeconfig_document(self.kubeconfig_name, "hyperplan-admin" if self.name is None
                                     else f"{self.kubeconfig_name}-admin",
                                     f"https://127.0.0.1:{st.ports['apiserver']}", b64(pki.ca_cert),
                                     b64(pki.admin_cert), b64(pki.admin_key))
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.kubeconfig.chmod(0o600)


def kubeconfig_document(name: str, user: str, server: str, ca: str, cert: str, key: str) -> dict:
    """A kubeconfig with one cluster and one context called ``name``, the admin as ``user``
    (certificates base64-encoded)."""
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": user, "user": {"client-certificate-data": cert, "client-key-data": key}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
    }


def kwok_stages(node_status_seconds: int | None = None) -> str:
    """The plane's KWOK stages (``kwok-stages.yaml``), with the node heartbeat's interval set to
    ``node_status_seconds`` (up to a fifth more, at random) when given."""
    text = resources.files("hyperplan_dev").joinpath("kwok-stages.yaml").read_text()
    if node_status_seconds is None:
        return text
    default = "    durationMilliseconds: 20000\n    jitterDurationMilliseconds: 25000\n"
    if text.count(default) != 1:
        raise RuntimeError("kwok-stages.yaml: the node heartbeat's delay is not where it was expected")
    ms = node_status_seconds * 1000
    return text.replace(default, f"    durationMilliseconds: {ms}\n    jitterDurationMilliseconds: {ms * 6 // 5}\n")


def lease_seconds(node_status_seconds: int | None = None) -> int:
    """KWOK's node Lease duration: a kubelet's 40 s, or four heartbeat intervals for a fleet
    (a Lease is renewed every quarter of its duration)."""
    return 40 if node_status_seconds is None else 4 * node_status_seconds


def stop_process_group(pid: int, timeout: float = 10) -> None:
    """SIGTERM the process group led by ``pid``, then SIGKILL it if it lingers."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:  # reap it if it is our child
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
