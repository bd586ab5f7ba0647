"""``hyperplan dev kind up|down|status``: a real kind cluster with the operator installed by Helm.

``up`` runs the README's "Install on a cluster (kind, with Docker)" steps, with the substitutions
a machine without a container registry needs (``docs/kind.md``):

1. machine set-up where needed (:mod:`hyperplan_dev.hostsetup`): a Docker engine, and the
   runtime wrapper on hosts whose capability set lacks CAP_SYS_RESOURCE;
2. kind, kubectl and Helm from the binary cache; the node image and a Python base image pulled,
   or built locally (:mod:`hyperplan_dev.images`);
3. ``kind create cluster --config deploy/kind-config.yaml`` (named ``hyperplan``; with a locally
   built node image also ``--image`` and ``networking.disableDefaultCNI``, and our CNI applied),
   then the workers labelled into the static pool
   (``node-restriction.kubernetes.io/hyperplan-pool=free``: an admin's label, which a kubelet
   cannot set on itself, so kind's per-node ``labels`` cannot carry it);
4. ``docker build -t hyperplan:0.1.0 .`` and ``kind load docker-image hyperplan:0.1.0 --name hyperplan``;
5. ``helm install hyperplan charts/hyperplan -n hyperplan-system --create-namespace -f deploy/kind-values.yaml``
   (the demo profile, and the operator on the control plane: both workers are the lent pool).

The kubeconfig is written to ``.state/kind/kubeconfig`` in the checkout; ``~/.kube/config`` is
never read or written. ``down`` deletes the cluster and undoes the host changes ``up`` made where
that makes sense (it stops the dockerd it started).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import yaml

from hyperplan_dev import build, hostsetup, images
from hyperplan_dev.plane import project_root

Log = Callable[[str], None]

CLUSTER_NAME = "hyperplan"
OPERATOR_IMAGE = "hyperplan:0.1.0"
RELEASE = "hyperplan"
NAMESPACE = "hyperplan-system"
POD_SUBNET = "10.244.0.0/16"

# The README's "Install on a cluster (kind, with Docker)" commands, in order; docs/install-on-kind.md
# shows the same. `up` runs the first six exactly like this (adding only what this machine needs:
# --image and --kubeconfig for kind, BASE_IMAGE for docker build, --kubeconfig for helm and
# kubectl); the kind tier runs the last one. tests/unit/test_kind_readme.py checks the README.
README_STEPS = (
    "kind create cluster --config deploy/kind-config.yaml",
    "kubectl label nodes -l '!node-role.kubernetes.io/control-plane' node-restriction.kubernetes.io/hyperplan-pool=free",
    "docker build -t hyperplan:0.1.0 .",
    "kind load docker-image hyperplan:0.1.0 --name hyperplan",
    "helm install hyperplan charts/hyperplan --namespace hyperplan-system --create-namespace -f deploy/kind-values.yaml",
    "kubectl -n hyperplan-system rollout status deployment/hyperplan",
    "kubectl apply -f deploy/examples/",
)
CREATE, POOL, BUILD, LOAD, INSTALL, ROLLOUT, EXAMPLES = range(len(README_STEPS))

# The README's "Remove everything" commands, in order (docs/install-on-kind.md shows the same).
# hyperplan's objects go first, while the operator still runs to remove their finalizers (a
# group's nodes are drained and handed back, a plan's capacity released); Helm never deletes
# CRDs, so they are deleted by hand. The kind tier runs exactly these as its last test
# (tests/kind/test_zz_helm_lifecycle.py); tests/unit/test_kind_readme.py checks the README.
REMOVAL_STEPS = (
    "kubectl delete instancegroups --all --wait=true",
    "kubectl delete trainingplans --all --wait=true",
    "kubectl delete capacitypools --all --wait=true",
    "helm uninstall hyperplan --namespace hyperplan-system --wait",
    "kubectl delete -f charts/hyperplan/crds/",
    "kubectl delete namespace hyperplan-system",
)


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

    def readme_step(self, index: int, extra: list[str] = (), timeout: float = 600,
                    replace: dict[str, str] | None = None) -> str:
        """Run README_STEPS[index] with the cached binaries, plus ``extra`` arguments."""
        argv = shlex.split(README_STEPS[index])
        for old, new in (replace or {}).items():
            argv = [new if a == old else a for a in argv]
        tools = {"kind": self.kind_bin, "kubectl": self.kubectl_bin, "helm": self.helm_bin}
        if argv[0] in tools:
            argv[0] = tools[argv[0]]()
        if argv[0].endswith(("kubectl", "helm")):
            extra = ["--kubeconfig", str(self.kubeconfig), *extra]
        shown = shlex.split(README_STEPS[index])
        for old, new in (replace or {}).items():
            if old in {"install"}:  # a word of the command, not a path this machine substitutes
                shown = [new if a == old else a for a in shown]
        self.log(f"$ {shlex.join(shown)}" + (f"  [+ {' '.join(extra)}]" if extra else ""))
        return self._run([*argv, *extra], README_STEPS[index], timeout=timeout)

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
                self._run([self.kind_bin(), "delete", "cluster", "--name", self.name,
                           "--kubeconfig", str(self.kubeconfig)], "kind delete cluster", timeout=300)
            config = self.write_config(state.local_images)
            # Our config file is deploy/kind-config.yaml plus the CNI setting of a local node image.
            self.readme_step(CREATE, ["--image", state.node_image, "--kubeconfig", str(self.kubeconfig),
                                      "--retain"], timeout=900,
                             replace={"deploy/kind-config.yaml": str(config)})
            self.step("kind cluster created")
        if state.podnet_image:
            self.kubectl("apply", "-f", "-", input=images.podnet_manifest(state.podnet_image, POD_SUBNET))
            self.step("CNI (podnet) applied")
        self.kubectl("wait", "--for=condition=Ready", "nodes", "--all", "--timeout=300s", timeout=320)
        self.step(f"nodes Ready: {' '.join(self.node_names())}")
        self.readme_step(POOL)  # again on a reused cluster: the same value changes nothing
        self.step("workers labelled into the static pool")
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
            extra = [] if python_base == images.PYTHON_IMAGE else ["--build-arg", f"BASE_IMAGE={python_base}"]
            self.readme_step(BUILD, ["-q", *extra], timeout=1800)
        finally:
            for p in certs.glob("host-extra-*.crt"):
                p.unlink()
        self.step(f"operator image {OPERATOR_IMAGE} built"
                  + (f" (with {made} extra CA certificates of this host)" if made else ""))

    def install_operator(self, python_base: str) -> None:
        self.build_operator_image(python_base)
        self.readme_step(LOAD)
        self.step(f"operator image loaded into the nodes of {self.name!r}")
        installed = subprocess.run([self.helm_bin(), "--kubeconfig", str(self.kubeconfig), "status",
                                    RELEASE, "-n", NAMESPACE], capture_output=True).returncode == 0
        # A second `up` on the same cluster upgrades the release (same arguments) and restarts the
        # pods, which then run the image just loaded under the same tag.
        self.readme_step(INSTALL, ["--wait", "--timeout", "5m"], timeout=360,
                         replace={"install": "upgrade"} if installed else None)
        if installed:
            self.kubectl("-n", NAMESPACE, "rollout", "restart", f"deployment/{RELEASE}")
        self.readme_step(ROLLOUT, ["--timeout=300s"], timeout=320)
        self.step(f"chart installed as {RELEASE!r} in {NAMESPACE} (deploy/kind-values.yaml); the operator is Ready")

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
