"""Build the control-plane binaries from their published Go modules, once per machine.

Every component is pinned in :data:`COMPONENTS`. A component is built into a temporary
folder inside the cache and renamed into place only when all of its binaries exist, so
an interrupted build never leaves a half-filled cache entry behind. The cache lives
outside the checkout (``~/.cache/hyperplan`` unless ``HYPERPLAN_CACHE_DIR`` says
otherwise), keyed by component and version, so a second checkout or CI reuses it.

Why wrapper modules: ``k8s.io/kubernetes`` requires its staging modules at ``v0.0.0``
and replaces them with local paths, so ``go install ...@vX`` refuses it. A tiny module
that requires the release and replaces each staging module with its published
``v0.Y.Z`` builds the real binaries. etcd's server module has relative replaces too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.8"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.22.0"
# Kueue (docs/kueue.md): the job queueing hyperplan serves as an AdmissionCheck controller.
KUEUE_VERSION = "v0.17.0"
KUEUE_MODULE = "sigs.k8s.io/kueue"
# Karpenter's kwok provider (docs/karpenter.md): Karpenter's own controllers with a cloud provider
# that makes Node objects for KWOK to run, for `nodeProvider: karpenter` against real Karpenter.
KARPENTER_VERSION = "v1.15.0"
KARPENTER_MODULE = "sigs.k8s.io/karpenter"
# v1.15.0 needs Go >= 1.26.9; the go command fetches this (approved) newer toolchain from the
# module proxy itself when GOTOOLCHAIN names it. Only this component's build sets it.
KARPENTER_TOOLCHAIN = "go1.27.3"
# The kind tier (docs/kind.md): kind itself, and what a locally built node image needs.
KIND_VERSION = "v0.33.0"
CRI_TOOLS_VERSION = "v1.37.0"
COREDNS_VERSION = "v1.14.2"   # what kubeadm v1.36 deploys
PAUSE_VERSION = "3.10.2"      # the sandbox image kubeadm v1.36 lists

Log = Callable[[str], None]


def cache_dir() -> Path:
    return Path(os.environ.get("HYPERPLAN_CACHE_DIR", Path.home() / ".cache" / "hyperplan"))


@dataclass(frozen=True)
class Component:
    name: str
    version: str
    binaries: tuple[str, ...]
    build: Callable[["Component", Path, Path, Log], None] = field(compare=False)
    # Other files the build leaves next to the binaries and that must be there at run time
    # (Kueue's CRDs and webhook manifests, copied from its module).
    files: tuple[str, ...] = ()

    @property
    def dir(self) -> Path:
        return cache_dir() / "bin" / f"{self.name}-{self.version}"

    def path(self, binary: str) -> Path:
        return self.dir / binary

    def is_built(self) -> bool:
        return all(self.path(b).is_file() for b in (*self.binaries, *self.files))


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"
    env.setdefault("GOFLAGS", "-buildvcs=false")
    env["GOTOOLCHAIN"] = env.get("GOTOOLCHAIN", "local")
    return env


def _run(cmd: list[str], cwd: Path, log: Log, step: str) -> None:
    """Run one go command, printing a heartbeat while it works and its output if it fails."""
    started = time.monotonic()
    log(f"  {step} ...")
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=_go_env(), stdout=out, stderr=subprocess.STDOUT)
        stop = threading.Event()

        def heartbeat() -> None:
            while not stop.wait(30):
                log(f"  {step}: still working ({time.monotonic() - started:.0f}s)")

        t = threading.Thread(target=heartbeat, daemon=True)
        t.start()
        rc = proc.wait()
        stop.set()
        if rc != 0:
            out.seek(0)
            tail = out.read()[-6000:]
            raise RuntimeError(f"{step} failed (exit {rc}): {' '.join(cmd)}\n{tail}")
    log(f"  {step} done in {time.monotonic() - started:.0f}s")


def _release_staging_modules(version: str, work: Path, log: Log) -> list[str]:
    """Every ``k8s.io/*`` module the release replaces with a staging path, read from its own go.mod."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
        cwd=work, env=_go_env(), capture_output=True, text=True, check=True,
    ).stdout
    gomod = Path(re.search(r'"GoMod":\s*"([^"]+)"', out).group(1)).read_text()
    mods = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/", gomod, flags=re.M)
    godebug = re.search(r"^godebug .*$", gomod, flags=re.M)
    go_line = re.search(r"^go .*$", gomod, flags=re.M)
    (work / "release.meta").write_text(
        f"{go_line.group(0) if go_line else 'go 1.26'}\n{godebug.group(0) if godebug else ''}\n"
    )
    log(f"  {len(mods)} staging modules listed by k8s.io/kubernetes {version}")
    return mods


def _build_kubernetes(c: Component, work: Path, out: Path, log: Log) -> None:
    staging = _release_staging_modules(c.version, work, log)
    go_line, godebug = (work / "release.meta").read_text().splitlines()[:2]
    minor = c.version.split(".")[1]
    staging_version = f"v0.{minor}.{c.version.split('.')[2]}"
    replaces = "\n".join(f"\t{m} => {m} {staging_version}" for m in staging)
    (work / "go.mod").write_text(
        f"module hyperplan.dev/build/kubernetes\n\n{go_line}\n\n{godebug}\n\n"
        f"require k8s.io/kubernetes {c.version}\n\nreplace (\n{replaces}\n)\n"
    )
    pkgs = [f"k8s.io/kubernetes/cmd/{b}" for b in c.binaries]
    _run(["go", "get", *(f"{p}@{c.version}" for p in pkgs)], work, log, "resolve modules")
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={c.version}",
            f"-X {pkg}.gitMajor=1",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    _run(
        ["go", "build", "-tags", "selinux,notest", "-ldflags", "-s -w " + " ".join(flags),
         "-o", str(out) + "/", *pkgs],
        work, log, f"go build {' '.join(c.binaries)} (the long step)",
    )


def _build_etcd(c: Component, work: Path, out: Path, log: Log) -> None:
    (work / "go.mod").write_text(
        "module hyperplan.dev/build/etcd\n\ngo 1.24\n\n"
        f"require go.etcd.io/etcd/server/v3 {c.version}\n"
    )
    _run(["go", "get", f"go.etcd.io/etcd/server/v3@{c.version}"], work, log, "resolve modules")
    _run(["go", "build", "-ldflags", "-s -w", "-o", str(out / "etcd"), "go.etcd.io/etcd/server/v3"],
         work, log, "go build etcd")


def _build_kueue(c: Component, work: Path, out: Path, log: Log) -> None:
    """Kueue's command through a wrapper module, plus its CRDs and webhook manifests.

    The wrapper must require the command's package (``go get .../cmd/kueue@v``): with only the
    bare module, ``go build`` finds no go.sum entries for the command's dependencies. The CRDs
    and webhook manifests come from the same module version, copied out of Go's module cache
    into the cache entry, so nothing of Kueue is kept in this repository.
    """
    (work / "go.mod").write_text("module hyperplan.dev/build/kueue\n\ngo 1.25.0\n")
    _run(["go", "get", f"{KUEUE_MODULE}/cmd/kueue@{c.version}"], work, log, "resolve modules")
    module_dir = Path(subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", KUEUE_MODULE],
        cwd=work, env=_go_env(), capture_output=True, text=True, check=True).stdout.strip())
    crd_dir = module_dir / "config" / "components" / "crd" / "bases"
    crds = sorted(crd_dir.glob("*.yaml"))
    if not crds:
        raise RuntimeError(f"no CRDs found in {crd_dir}")
    (out / "crds").mkdir()
    for f in crds:
        shutil.copyfile(f, out / "crds" / f.name)
    shutil.copyfile(module_dir / "config" / "components" / "webhook" / "manifests.yaml",
                    out / "webhook-manifests.yaml")
    log(f"  copied {len(crds)} CRDs and the webhook manifests from {module_dir}")
    _run(["go", "build", "-ldflags",
          f"-s -w -X {KUEUE_MODULE}/pkg/version.GitVersion={c.version}",
          "-o", str(out / "kueue"), f"{KUEUE_MODULE}/cmd/kueue"],
         work, log, "go build kueue (about 5 minutes on 2 cores)")


def _build_karpenter(c: Component, work: Path, out: Path, log: Log) -> None:
    """Karpenter's kwok provider (``sigs.k8s.io/karpenter/kwok``), plus its CRDs.

    Built like Kueue, through a wrapper module that requires the command's package, with
    ``GOTOOLCHAIN`` set to :data:`KARPENTER_TOOLCHAIN` on every go command (the machine's Go is
    older than the module's ``go`` line, and ``local`` would refuse it). The CRDs are the
    provider's own: NodePool, NodeClaim, NodeOverlay and CapacityBuffer from ``kwok/charts/crds``
    and KWOKNodeClass from ``kwok/apis/crds``, copied from the same module version in Go's
    module cache. The version is stamped into ``pkg/operator.Version``, which Karpenter logs
    and sends as its User-Agent (``karpenter/<version>``).
    """
    go = ["env", f"GOTOOLCHAIN={KARPENTER_TOOLCHAIN}", "go"]
    (work / "go.mod").write_text("module hyperplan.dev/build/karpenter\n\ngo 1.26\n")
    _run([*go, "get", f"{KARPENTER_MODULE}/kwok@{c.version}"], work, log,
         f"resolve modules (Go {KARPENTER_TOOLCHAIN}, fetched on first use)")
    module_dir = Path(subprocess.run(
        [*go, "list", "-m", "-f", "{{.Dir}}", KARPENTER_MODULE],
        cwd=work, env=_go_env(), capture_output=True, text=True, check=True).stdout.strip())
    crds = sorted([*(module_dir / "kwok" / "charts" / "crds").glob("*.yaml"),
                   *(module_dir / "kwok" / "apis" / "crds").glob("*.yaml")])
    if not crds:
        raise RuntimeError(f"no CRDs found under {module_dir / 'kwok'}")
    (out / "crds").mkdir()
    for f in crds:
        shutil.copyfile(f, out / "crds" / f.name)
    log(f"  copied {len(crds)} CRDs from {module_dir / 'kwok'}")
    _run([*go, "build", "-ldflags", f"-s -w -X {KARPENTER_MODULE}/pkg/operator.Version={c.version}",
          "-o", str(out / "karpenter-kwok"), f"{KARPENTER_MODULE}/kwok"],
         work, log, "go build karpenter-kwok (about 2 minutes on 2 cores)")


def _go_install(pkg: str, ldflags: str) -> Callable[[Component, Path, Path, Log], None]:
    def build(c: Component, work: Path, out: Path, log: Log) -> None:
        env_bin = ["env", f"GOBIN={out}"]
        _run([*env_bin, "go", "install", "-ldflags", ldflags, f"{pkg}@{c.version}"],
             work, log, f"go install {pkg}@{c.version}")
    return build


COMPONENTS: tuple[Component, ...] = (
    Component("etcd", ETCD_VERSION, ("etcd",), _build_etcd),
    Component("kwok", KWOK_VERSION, ("kwok",), _go_install(
        "sigs.k8s.io/kwok/cmd/kwok", f"-s -w -X sigs.k8s.io/kwok/pkg/consts.Version={KWOK_VERSION}")),
    Component("helm", HELM_VERSION, ("helm",), _go_install(
        "helm.sh/helm/v3/cmd/helm",
        f"-s -w -X helm.sh/helm/v3/internal/version.version={HELM_VERSION}"
        f" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1"
        f" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor={KUBERNETES_VERSION.split('.')[1]}")),
    Component("kubernetes", KUBERNETES_VERSION,
              ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"),
              _build_kubernetes),
    Component("kueue", KUEUE_VERSION, ("kueue",), _build_kueue,
              files=("webhook-manifests.yaml", "crds/kueue.x-k8s.io_workloads.yaml")),
    Component("karpenter", KARPENTER_VERSION, ("karpenter-kwok",), _build_karpenter,
              files=("crds/karpenter.sh_nodepools.yaml", "crds/karpenter.sh_nodeclaims.yaml",
                     "crds/karpenter.kwok.sh_kwoknodeclasses.yaml")),
)


def _build_pause(c: Component, work: Path, out: Path, log: Log) -> None:
    """The sandbox ("pause") binary from our own tiny program (``kindimages/pause.go``)."""
    from importlib import resources

    src = resources.files("hyperplan_dev").joinpath("kindimages", "pause.go").read_text()
    (work / "go.mod").write_text("module hyperplan.dev/build/pause\n\ngo 1.24\n")
    (work / "main.go").write_text(src)
    _run(["go", "build", "-ldflags", "-s -w", "-o", str(out / "pause"), "."], work, log, "go build pause")


# Built only for the kind tier (``hyperplan dev kind up``), not for the local control plane.
KIND_COMPONENTS: tuple[Component, ...] = (
    Component("kind", KIND_VERSION, ("kind",), _go_install("sigs.k8s.io/kind", "-s -w")),
    Component("kubernetes-node", KUBERNETES_VERSION, ("kubelet", "kubeadm", "kube-proxy"),
              _build_kubernetes),
    Component("crictl", CRI_TOOLS_VERSION, ("crictl",), _go_install(
        "sigs.k8s.io/cri-tools/cmd/crictl",
        f"-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version={CRI_TOOLS_VERSION}")),
    Component("coredns", COREDNS_VERSION, ("coredns",), _go_install("github.com/coredns/coredns", "-s -w")),
    Component("pause", PAUSE_VERSION, ("pause",), _build_pause),
)


def component(name: str) -> Component:
    return next(c for c in (*COMPONENTS, *KIND_COMPONENTS) if c.name == name)


def binary(name: str) -> Path:
    """Path of a cached binary, by binary name (``kubectl``, ``etcd``, ...)."""
    for c in (*COMPONENTS, *KIND_COMPONENTS):
        if name in c.binaries:
            return c.path(name)
    raise KeyError(name)


def ensure_binaries(log: Log = print, components: tuple[Component, ...] = COMPONENTS) -> None:
    """Build whatever the cache lacks; print one line per step with the elapsed time."""
    if shutil.which("go") is None:
        raise RuntimeError("the Go toolchain is needed to build the control plane; install Go 1.26+")
    started = time.monotonic()
    missing = [c for c in components if not c.is_built()]
    for i, c in enumerate(missing, 1):
        log(f"[{i}/{len(missing)}] building {c.name} {c.version} "
            f"(elapsed {time.monotonic() - started:.0f}s)")
        root = cache_dir() / "build"
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"{c.name}-", dir=root))
        out = work / "out"
        out.mkdir()
        try:
            c.build(c, work, out, log)
            c.dir.parent.mkdir(parents=True, exist_ok=True)
            if c.dir.exists():
                shutil.rmtree(c.dir)
            os.replace(out, c.dir)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log(f"[{i}/{len(missing)}] {c.name} {c.version} ready in {c.dir} "
            f"(elapsed {time.monotonic() - started:.0f}s)")
    if missing:
        log(f"all binaries built in {time.monotonic() - started:.0f}s")


if __name__ == "__main__":  # pragma: no cover - used by `python -m` during set-up
    try:
        ensure_binaries(lambda s: print(s, flush=True))
    except RuntimeError as e:
        print(e, file=sys.stderr)
        sys.exit(1)
