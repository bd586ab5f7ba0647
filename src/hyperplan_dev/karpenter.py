"""Karpenter's kwok provider on the local control plane (docs/karpenter.md).

Karpenter (``build.KARPENTER_VERSION``, its kwok provider built from ``sigs.k8s.io/karpenter/kwok``
with its CRDs copied next to the binary) runs outside the cluster like the plane's other
processes: its controllers are Karpenter's own, and its cloud provider "launches" a NodeClaim by
creating a Node object (``providerID: kwok://<name>``, annotation ``kwok.x-k8s.io/node: fake``),
which the plane's KWOK then runs (the ``hyperplan-karpenter-node-initialize`` stage of
kwok-stages.yaml makes it Ready). What that takes, and why:

- **Configuration from the environment.** The binary takes no ``--kubeconfig`` flag (an unknown
  flag makes it panic); controller-runtime reads ``KUBECONFIG``. ``SYSTEM_NAMESPACE`` must name
  an existing namespace, leader election is off (one replica, out of cluster), and the metrics
  and health ports are ports free at start (Karpenter binds them on all interfaces, ``:<port>``
  in pkg/operator/operator.go; the health port's ``/readyz`` says when it serves).
- **StaticCapacity on.** NodePools with ``spec.replicas`` (what hyperplan asks for) do nothing
  unless the ``StaticCapacity`` feature gate is on; it is alpha and off by default in v1.15.0.
  The other gates keep Karpenter's defaults (``ReservedCapacity`` on, ``NodeRepair`` off).
- **hyperplan's instance types.** The provider's embedded list (``c-4x-amd64-linux``... in
  ``test-zone-a``...) is replaced by a file (``INSTANCE_TYPES_FILE_PATH``) written here from
  hyperplan's own vocabulary: the instance types of actuation/nodes.py, with the resources its
  KWOK nodes get, each offered ``on-demand`` and ``reserved`` in each zone. The file is read once
  at start: a zone or instance type added later needs a restart.
- **The node class the settings default to.** Every NodeClaim names a node class
  (``karpenter_node_class``, by default ``karpenter.kwok.sh/KWOKNodeClass/default``), and the kwok
  provider will not launch a claim whose class does not exist (it deletes the claim as
  "insufficient capacity"). :meth:`Karpenter.start` creates that class (:data:`NODE_CLASS`) when it
  is not there, so a group with no other setting launches on a fresh plane; ``hyperplan dev
  status`` lists the node classes (:meth:`Karpenter.node_classes`).
- **Stopped by pid.** The process runs in its own session; its pid is recorded in
  ``karpenter.json`` under the plane's state folder, and :meth:`Karpenter.stop` stops exactly
  that process group (``plane.stop_process_group``) once it checked the pid still runs the
  binary it started.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from hyperplan.actuation.providers.base import ACCELERATORS, node_capacity
from hyperplan_dev import build
from hyperplan_dev.plane import Plane, free_port, stop_process_group

Log = Callable[[str], None]

BINARY = "karpenter-kwok"
NAMESPACE = "karpenter"
NODECLASS_GROUP = "karpenter.kwok.sh"
NODECLASS_KIND = "KWOKNodeClass"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
# Karpenter's defaults stay as they are; StaticCapacity is what a NodePool with replicas needs.
FEATURE_GATES = "StaticCapacity=true"
NODECLASS_VERSION = "v1alpha1"
NODECLASS_PLURAL = "kwoknodeclasses"
# The node class the operator's setting ``karpenter_node_class`` names by default (its name part).
NODE_CLASS = "default"
# hyperplan's instance types (the accelerated ones its KWOK nodes know, actuation/nodes.py).
INSTANCE_TYPES: tuple[str, ...] = tuple(ACCELERATORS)
# The zones of the demo (deploy/examples/demo) and of the e2e scenarios that name a fixed zone
# (tests/e2e: pool_body's default us-east-1a and the az= of the others). The e2e tests that make
# a zone per run (us-west-<tag>) are not here: Karpenter reads its instance types once.
ZONES: tuple[str, ...] = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e",
                          "us-east-1f", "us-east-1k", "us-east-1m", "us-east-1p", "us-west-2b")
# How many nodes each reserved offering (one instance type in one zone) has room for: the
# provider's ``ReservationCapacity``. Karpenter's scheduler counts it for dynamic NodePools only;
# static NodePools and NodeClaims launch past it (docs/karpenter.md).
RESERVED_CAPACITY = 512
# Made-up hourly prices: the provider launches the cheapest compatible offering, so a NodePool
# that allows both capacity types gets the reserved one (as Karpenter prefers reservations).
ON_DEMAND_PRICE_PER_ACCELERATOR = 10.0
RESERVED_PRICE = 0.001


def crd_dir() -> Path:
    return build.component("karpenter").dir / "crds"


def binary() -> Path:
    return build.binary(BINARY)


def instance_types(types: Iterable[str] = INSTANCE_TYPES, zones: Iterable[str] = ZONES,
                   reserved_capacity: int = RESERVED_CAPACITY) -> list[dict[str, Any]]:
    """The instance-type file's content: the provider's format (kwok/cloudprovider/helpers.go
    ``InstanceTypeOptions``), one entry per type with an on-demand and a reserved offering per zone.

    An offering is Karpenter's ``cloudprovider.Offering`` as JSON (``Price``, ``Available``,
    ``ReservationCapacity``) with ``Requirements`` as node-selector requirements; each
    requirement with one ``In`` value becomes a label of the Node launched into it. The file
    has no place for a reservation id (see docs/karpenter.md).
    """
    zones = tuple(zones)
    out = []
    for name in types:
        accelerators = ACCELERATORS.get(name, ("", 0))[1]
        on_demand = ON_DEMAND_PRICE_PER_ACCELERATOR * max(accelerators, 1)
        offerings = []
        for zone in zones:
            for capacity_type, price in (("on-demand", on_demand), ("reserved", RESERVED_PRICE)):
                offering: dict[str, Any] = {
                    "Price": price, "Available": True,
                    "Requirements": [
                        {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": [capacity_type]},
                        {"key": ZONE_LABEL, "operator": "In", "values": [zone]}]}
                if capacity_type == "reserved":
                    offering["ReservationCapacity"] = reserved_capacity
                offerings.append(offering)
        out.append({"name": name, "architecture": "amd64", "operatingSystems": ["linux"],
                    "resources": node_capacity(name), "offerings": offerings})
    return out


def environment(kubeconfig: Path, metrics_port: int, health_port: int, instance_types_file: Path,
                feature_gates: str = FEATURE_GATES, base: dict[str, str] | None = None) -> dict[str, str]:
    """The process environment Karpenter is configured by (it reads each flag's variable)."""
    env = dict(os.environ if base is None else base)
    env.update({
        "KUBECONFIG": str(kubeconfig),
        "SYSTEM_NAMESPACE": NAMESPACE,
        "DISABLE_LEADER_ELECTION": "true",
        "METRICS_PORT": str(metrics_port),
        "HEALTH_PROBE_PORT": str(health_port),
        "FEATURE_GATES": feature_gates,
        "INSTANCE_TYPES_FILE_PATH": str(instance_types_file),
    })
    return env


@dataclass
class KarpenterState:
    """What :meth:`Karpenter.start` started; ``karpenter.json`` in the plane's state folder."""

    pid: int = 0
    ports: dict[str, int] = field(default_factory=dict)
    version: str = build.KARPENTER_VERSION

    @classmethod
    def load(cls, path: Path) -> "KarpenterState | None":
        if not path.is_file():
            return None
        return cls(**json.loads(path.read_text()))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))


class Karpenter:
    """Karpenter's kwok provider beside a running :class:`~hyperplan_dev.plane.Plane`."""

    def __init__(self, plane: Plane, log: Log | None = None, types: Iterable[str] = INSTANCE_TYPES,
                 zones: Iterable[str] = ZONES, feature_gates: str = FEATURE_GATES):
        self.plane = plane
        self.log = log or plane.log
        self.types = tuple(types)
        self.zones = tuple(zones)
        self.feature_gates = feature_gates
        self._child: subprocess.Popen | None = None

    # ----------------------------------------------------------------- paths

    @property
    def dir(self) -> Path: return self.plane.dir / "karpenter"
    @property
    def state_file(self) -> Path: return self.dir / "karpenter.json"
    @property
    def instance_types_file(self) -> Path: return self.dir / "instance-types.json"
    @property
    def log_file(self) -> Path: return self.plane.logs / "karpenter.log"

    def state(self) -> KarpenterState | None:
        return KarpenterState.load(self.state_file)

    # ----------------------------------------------------------------- lifecycle

    def running(self) -> bool:
        st = self.state()
        return bool(st and st.pid and self.plane._is_ours(BINARY, st.pid))

    def start(self, timeout: float = 90, node_class: bool = True) -> float:
        """CRDs applied and Established, instance types written, Karpenter started and ready, the
        default node class made (:meth:`ensure_node_class`; not with ``node_class=False``, for a
        test of its absence); the seconds it took. A Karpenter of this plane that already runs is
        left as it is."""
        started = time.monotonic()
        if self.running():
            self.log(f"karpenter already running (pid {self.state().pid})")
            if node_class:
                self.ensure_node_class()
            return 0.0
        if not build.component("karpenter").is_built():
            raise RuntimeError(f"Karpenter {build.KARPENTER_VERSION} is not built; run `make binaries`")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.plane.logs.mkdir(parents=True, exist_ok=True)
        self.apply_crds()
        self._kubectl("apply", "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))
        self.instance_types_file.write_text(json.dumps(instance_types(self.types, self.zones), indent=1))
        st = KarpenterState(ports={"metrics": free_port(), "health": free_port()})
        env = environment(self.plane.kubeconfig, st.ports["metrics"], st.ports["health"],
                          self.instance_types_file, self.feature_gates)
        self.log(f"starting karpenter {build.KARPENTER_VERSION} (kwok provider; "
                 f"{len(self.types)} instance types in {len(self.zones)} zones)")
        with open(self.log_file, "ab") as out:
            self._child = subprocess.Popen([str(binary())], env=env, stdout=out, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True)
        st.pid = self._child.pid
        st.save(self.state_file)
        self._wait_ready(st, timeout)
        if node_class:
            self.ensure_node_class()
        seconds = time.monotonic() - started
        self.log(f"karpenter ready in {seconds:.1f}s (pid {st.pid}, "
                 f"http://127.0.0.1:{st.ports['health']}/readyz)")
        return seconds

    def stop(self) -> None:
        """Stop the Karpenter this plane started (its process group, by the recorded pid), and
        remove its state folder. A recorded pid that no longer runs ``karpenter-kwok`` (pids get
        reused) is left alone."""
        st = self.state()
        if st and st.pid and self.plane._is_ours(BINARY, st.pid):
            self.log(f"stopping karpenter (pid {st.pid})")
            stop_process_group(st.pid)
        if self._child is not None:
            self._child.wait(timeout=10)
            self._child = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def apply_crds(self) -> None:
        """Karpenter's CRDs (server-side apply, as a restart finds them there) and Established."""
        self._kubectl("apply", "--server-side", "--force-conflicts",
                      "--field-manager=hyperplan-dev-plane", "-f", str(crd_dir()))
        names = [f"crd/{yaml.safe_load(f.read_text())['metadata']['name']}" for f in sorted(crd_dir().glob("*.yaml"))]
        self._kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)

    def node_class_body(self, name: str = NODE_CLASS) -> dict[str, Any]:
        return {"apiVersion": f"{NODECLASS_GROUP}/{NODECLASS_VERSION}", "kind": NODECLASS_KIND,
                "metadata": {"name": name}}

    def ensure_node_class(self, name: str = NODE_CLASS) -> None:
        """The KWOKNodeClass ``name`` (the one the operator's NodeClaims name by default), created
        when it does not exist; one that exists is left as it is (its ``nodeRegistrationDelay``)."""
        if name in self.node_classes():
            return
        self._kubectl("create", "-f", "-", input=json.dumps(self.node_class_body(name)))
        self.log(f"created {NODECLASS_KIND} {name} (the operator's default karpenter.nodeClass)")

    def node_classes(self) -> list[str]:
        """The names of the plane's KWOKNodeClasses (none while the CRD is not there)."""
        try:
            out = self._kubectl("get", f"{NODECLASS_PLURAL}.{NODECLASS_GROUP}", "-o", "json", timeout=20)
        except (RuntimeError, subprocess.TimeoutExpired, OSError):
            return []
        return sorted(item["metadata"]["name"] for item in json.loads(out).get("items") or [])

    # ----------------------------------------------------------------- internals

    def ready(self) -> bool:
        st = self.state()
        if st is None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{st.ports['health']}/readyz", timeout=2) as r:
                return r.status == 200
        except (OSError, urllib.error.HTTPError):
            return False

    def _wait_ready(self, st: KarpenterState, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return
            if self._child is not None and self._child.poll() is not None:
                code, self._child = self._child.returncode, None
                self.state_file.unlink(missing_ok=True)
                raise RuntimeError(f"karpenter exited ({code}) before it was ready; "
                                   f"see {self.log_file}:\n{self._log_tail()}")
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"timed out after {timeout:.0f}s waiting for karpenter /readyz; "
                           f"see {self.log_file}:\n{self._log_tail()}")

    def _log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _kubectl(self, *args: str, input: str | None = None, timeout: float = 120) -> str:
        proc = subprocess.run([str(build.binary("kubectl")), f"--kubeconfig={self.plane.kubeconfig}", *args],
                              input=input, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout
