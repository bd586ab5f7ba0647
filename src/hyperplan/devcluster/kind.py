"""``hyperplan dev kind up|down|status``: a real kind cluster with the operator installed by Helm.

``up`` runs the README's "Install on a cluster (kind, with Docker)" steps, with the substitutions
a machine without a container registry needs (``docs/kind.md``):

1. machine set-up where needed (:mod:`hyperplan.devcluster.hostsetup`): a Docker engine, and the
   runtime wrapper on hosts whose capability set lacks CAP_SYS_RESOURCE;
2. kind, kubectl and Helm from the binary cache; the node image and a Python base image pulled,
   or built locally (:mod:`hyperplan.devcluster.images`);
3. ``kind create cluster --config deploy/kind-config.yaml`` (named ``hyperplan``; with a locally
   built node image also ``--image`` and ``networking.disableDefaultCNI``, and our CNI applied);
4. ``docker build -t hyperplan:0.1.0 .`` and ``kind load docker-image hyperplan:0.1.0 --name hyperplan``;
5. ``helm install hyperplan charts/hyperplan -n hyperplan-system --create-namespace --set policy=demo``.

The kubeconfig is written to ``.state/kind/kubeconfig`` in the checkout; ``~/.kube/config`` is
never read or written. ``down`` deletes the cluster and undoes the host changes ``up`` made where
that makes sense (it stops the dockerd it started).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import yaml

from hyperplan.devcluster import build, hostsetup, images
from hyperplan.devcluster.plane import project_root

Log = Callable[[str], None]

CLUSTER_NAME = "hyperplan"
OPERATOR_IMAGE = "hyperplan:0.1.0"
RELEASE = "hyperplan"
NAMESPACE = "hyperplan-system"
POD_SUBNET = "10.244.0.0/16"


class KindError(RuntimeError):
    pass


@dataclass
class KindState:
    """What ``up`` set up; written to ``.state/kind/kind.json``."""

    cluster: str = CLUSTER_NAME
    node_image: str = ""
    python_base: str = ""
    podnet_image: str = ""
    operator_image: str = OPERATOR_IMAGE
    local_images: bool = False

    @classmethod
    def load(cls, path: Path) -> "KindState | None":
        if not path.is_file():
            return None
        return cls(**json.loads(path.read_text()))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2))


class KindCluster:
    def __init__(self, root: Path | None = None, log: Log = print, name: str = CLUSTER_NAME):
        self.root = root or project_root()
        self.dir = self.root / ".state" / "kind"
        self.name = name
        self.log = log
        self._t0 = time.monotonic()

    # -- paths and tools ----------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.dir / "kind.json"

    @property
    def config_file(self) -> Path:
        return self.dir / "kind-config.yaml"

    @staticmethod
    def kind_bin() -> str:
        return str(build.binary("kind"))

    @staticmethod
    def kubectl_bin() -> str:
        return str(build.binary("kubectl"))

    @staticmethod
    def helm_bin() -> str:
        return str(build.binary("helm"))

    def step(self, msg: str) -> None:
        self.log(f"{msg} (elapsed {time.monotonic() - self._t0:.0f}s)")

    def _run(self, cmd: list[str], what: str, timeout: float = 600, env: dict | None = None,
             input: str | None = None) -> str:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=input,
                           env={**os.environ, **(env or {})}, cwd=self.root)
        if r.returncode != 0:
            raise KindError(f"{what} failed (exit {r.returncode}): {' '.join(cmd)}\n"
                            f"{(r.stdout + r.stderr)[-5000:]}")
        return r.stdout

    def kubectl(self, *args: str, timeout: float = 120, input: str | None = None) -> str:
        return self._run([self.kubectl_bin(), "--kubeconfig", str(self.kubeconfig), *args],
                         f"kubectl {args[0]}", timeout=timeout, input=input)

    # -- the cluster --------------------------------------------------------------------------
    def exists(self) -> bool:
        if not build.component("kind").is_built() or not hostsetup.docker_works():
            return False
        r = subprocess.run([self.kind_bin(), "get", "clusters"], capture_output=True, text=True,
                           timeout=60)
        return self.name in r.stdout.split()

    def node_names(self) -> list[str]:
        out = self.kubectl("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}")
        return out.split()

    def write_config(self, local_images: bool) -> Path:
        """deploy/kind-config.yaml, plus ``disableDefaultCNI`` when our CNI replaces kindnetd."""
        conf = yaml.safe_load((self.root / "deploy" / "kind-config.yaml").read_text())
        conf["name"] = self.name
        if local_images:
            net = conf.setdefault("networking", {})
            net["disableDefaultCNI"] = True
            net.setdefault("podSubnet", POD_SUBNET)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(yaml.safe_dump(conf, sort_keys=False))
        return self.config_file

    def prepare(self) -> KindState:
        """Everything ``up`` needs before ``kind create``: host set-up, binaries, images."""
        self._t0 = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.step("host: checking for a working Docker engine")
        hostsetup.ensure_docker(self.log)
        self.step("host: Docker answers")
        build.ensure_binaries(lambda s: self.log("  " + s))  # kubectl and helm
        build.ensure_binaries(lambda s: self.log("  " + s), (build.component("kind"),))
        self.step(f"kind {build.KIND_VERSION}, kubectl and helm ready")
        imgs = images.ensure_images(self.log, started=self._t0)
        hostsetup.ensure_privileged(imgs.node, self.log)
        state = KindState(cluster=self.name, node_image=imgs.node, python_base=imgs.python_base,
                          podnet_image=imgs.podnet or "", local_images=imgs.local)
        state.save(self.state_file)
        self.step("images ready")
        return state

    def up(self, install_operator: bool = True) -> KindState:
        state = self.prepare()
        if self.exists() and self._cluster_answers():
            self.step(f"kind cluster {self.name!r} exists and answers; reusing it")
        else:
            if self.exists():
                self._run([self.kind_bin(), "delete", "cluster", "--name", self.name],
                          "kind delete cluster", timeout=300)
            config = self.write_config(state.local_images)
            self.step(f"kind create cluster --name {self.name} --config {config} --image {state.node_image}")
            self._run([self.kind_bin(), "create", "cluster", "--name", self.name,
                       "--config", str(config), "--image", state.node_image,
                       "--kubeconfig", str(self.kubeconfig), "--retain"],
                      "kind create cluster", timeout=900)
            self.step("kind cluster created")
        if state.podnet_image:
            self.kubectl("apply", "-f", "-", input=images.podnet_manifest(state.podnet_image, POD_SUBNET))
            self.step("CNI (podnet) applied")
        self.kubectl("wait", "--for=condition=Ready", "nodes", "--all", "--timeout=300s", timeout=320)
        self.step(f"nodes Ready: {' '.join(self.node_names())}")
        if install_operator:
            self.install_operator(state.python_base)
        return state

    def _cluster_answers(self) -> bool:
        if not self.kubeconfig.is_file():
            return False
        r = subprocess.run([self.kubectl_bin(), "--kubeconfig", str(self.kubeconfig), "get",
                            "--raw", "/readyz"], capture_output=True, text=True, timeout=30)
        return r.returncode == 0

    def build_operator_image(self, python_base: str) -> None:
        """``docker build`` of the project's Dockerfile (layer-cached by Docker)."""
        certs = self.root / "certs"
        made = images.write_extra_certs(certs)
        try:
            cmd = ["docker", "build", "-q", "-t", OPERATOR_IMAGE]
            if python_base != images.PYTHON_IMAGE:
                cmd += ["--build-arg", f"BASE_IMAGE={python_base}"]
            self._run([*cmd, "."], "docker build (operator image)", timeout=1800)
        finally:
            for p in certs.glob("host-extra-*.crt"):
                p.unlink()
        self.step(f"operator image {OPERATOR_IMAGE} built"
                  + (f" (base {python_base}, {made} host CA certificates)" if made else ""))

    def install_operator(self, python_base: str) -> None:
        self.build_operator_image(python_base)
        self._run([self.kind_bin(), "load", "docker-image", OPERATOR_IMAGE, "--name", self.name],
                  "kind load docker-image", timeout=600)
        self.step(f"kind load docker-image {OPERATOR_IMAGE} --name {self.name}")
        self._run([self.helm_bin(), "upgrade", "--install", RELEASE, "charts/hyperplan",
                   "--namespace", NAMESPACE, "--create-namespace", "--set", "policy=demo",
                   "--kubeconfig", str(self.kubeconfig), "--wait", "--timeout", "5m"],
                  "helm install", timeout=360)
        # A reloaded image of the same tag needs new pods to take effect.
        self.kubectl("-n", NAMESPACE, "rollout", "restart", f"deployment/{RELEASE}")
        self.kubectl("-n", NAMESPACE, "rollout", "status", f"deployment/{RELEASE}", "--timeout=300s",
                     timeout=320)
        self.step(f"helm install {RELEASE} charts/hyperplan -n {NAMESPACE} --set policy=demo: Ready")

    def down(self) -> None:
        self._t0 = time.monotonic()
        if self.exists():
            self._run([self.kind_bin(), "delete", "cluster", "--name", self.name,
                       "--kubeconfig", str(self.kubeconfig)], "kind delete cluster", timeout=300)
            self.step(f"kind cluster {self.name!r} deleted")
        else:
            self.step(f"no kind cluster {self.name!r}")
        hostsetup.teardown(self.log)
        shutil.rmtree(self.dir, ignore_errors=True)

    def status(self) -> list[tuple[str, str]]:
        rows = hostsetup.describe()
        st = KindState.load(self.state_file)
        if st:
            rows.append(("node image", st.node_image))
        if not self.exists():
            rows.append((f"kind cluster {self.name}", "absent"))
            return rows
        rows.append((f"kind cluster {self.name}", "answers" if self._cluster_answers() else "not answering"))
        if self._cluster_answers():
            out = self.kubectl("get", "nodes", "-o", "jsonpath={range .items[*]}{.metadata.name}"
                               "{\" \"}{.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}")
            for line in out.splitlines():
                name, ready = (line.split() + ["?"])[:2]
                rows.append((f"node {name}", "Ready" if ready == "True" else f"Ready={ready}"))
            r = subprocess.run([self.kubectl_bin(), "--kubeconfig", str(self.kubeconfig), "-n",
                                NAMESPACE, "get", "deployment", RELEASE, "-o",
                                "jsonpath={.status.readyReplicas}/{.spec.replicas}"],
                               capture_output=True, text=True, timeout=30)
            rows.append(("operator", f"{r.stdout or '0/?'} ready" if r.returncode == 0 else "not installed"))
        rows.append(("kubeconfig", str(self.kubeconfig)))
        return rows
