"""Container images for the kind tier: pulled where a registry answers, built locally where not.

Where ``kindest/node`` and ``python:3.11-slim`` can be pulled, they are used and nothing here is
built. On machines without a container registry (the project's), everything is made from Debian
packages and Go modules (``docs/kind.md`` says what and why):

- ``hyperplan-local/debian``: ``debootstrap --variant=minbase bookworm`` and ``docker import``;
- ``hyperplan-local/python``: a stand-in for ``python:3.11-slim`` (Debian's python3 3.11);
- the images ``kubeadm`` wants under ``registry.k8s.io`` (``FROM scratch`` with the static
  binaries of :mod:`hyperplan_dev.build`; kube-proxy on Debian with iptables);
- ``hyperplan-local/podnet``: the small CNI of ``podnet.sh`` (kindnetd is not on the Go proxy);
- ``hyperplan-local/kind-node``: Debian with systemd, containerd, runc and the CNI plugins,
  kind's entrypoint and ``images/base/files`` read from kind's Go module, kubelet/kubeadm/kubectl,
  crictl, and the images above imported into containerd.

Every image is tagged (or labelled ``hyperplan.recipe``) with a hash of its recipe -- the text
that builds it and the tags of what it builds on -- so a second run finds it and builds nothing,
and a changed recipe builds a new one. Each step prints a line with the elapsed time.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

from hyperplan_dev import build

Log = Callable[[str], None]

DEBIAN_SUITE = "bookworm"
KINDEST_NODE = f"kindest/node:{build.KUBERNETES_VERSION}"
PYTHON_IMAGE = "python:3.11-slim"
PAUSE_IMAGE = f"registry.k8s.io/pause:{build.PAUSE_VERSION}"
ETCD_IMAGE = f"registry.k8s.io/etcd:{build.ETCD_VERSION.lstrip('v')}-0"
COREDNS_IMAGE = f"registry.k8s.io/coredns/coredns:{build.COREDNS_VERSION}"
RECIPE_LABEL = "hyperplan.recipe"
PULL_TIMEOUT = 20.0


class ImageBuildError(RuntimeError):
    pass


def _docker(*args: str, timeout: float = 1800, input: bytes | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["docker", *args], capture_output=True, timeout=timeout, input=input)
    if check and r.returncode != 0:
        raise ImageBuildError(f"docker {' '.join(args[:3])} ... failed (exit {r.returncode}):\n"
                              f"{r.stderr.decode(errors='replace')[-4000:]}")
    return r


def image_exists(ref: str) -> bool:
    return _docker("image", "inspect", ref, check=False, timeout=60).returncode == 0


def image_label(ref: str, label: str) -> str | None:
    r = _docker("image", "inspect", "--format", f'{{{{index .Config.Labels "{label}"}}}}', ref,
                check=False, timeout=60)
    out = r.stdout.decode().strip()
    return out if r.returncode == 0 and out and out != "<no value>" else None


def drop_other_tags(tag: str, log: Log) -> None:
    """Remove the superseded builds of a ``hyperplan-local/...`` repository (old recipes)."""
    repo = tag.rsplit(":", 1)[0]
    r = _docker("images", "--format", "{{.Repository}}:{{.Tag}}", repo, check=False, timeout=60)
    for old in r.stdout.decode().split():
        if old != tag and old.startswith("hyperplan-local/"):
            if _docker("rmi", old, check=False, timeout=300).returncode == 0:
                log(f"  removed superseded image {old}")


def try_pull(ref: str, log: Log, timeout: float = PULL_TIMEOUT) -> bool:
    """Pull ``ref`` if a registry answers within ``timeout``; False (and a line why) otherwise."""
    if image_exists(ref):
        return True
    started = time.monotonic()
    try:
        r = subprocess.run(["docker", "pull", "-q", ref], capture_output=True, text=True,
                           timeout=timeout)
        ok = r.returncode == 0
        why = (r.stderr.strip().splitlines() or ["?"])[-1]
    except subprocess.TimeoutExpired:
        ok, why = False, f"no answer within {timeout:.0f}s"
    if ok:
        log(f"pulled {ref} ({time.monotonic() - started:.0f}s)")
    else:
        log(f"cannot pull {ref} ({why[:160]}); building locally instead")
    return ok


def _hash(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:12]


def _file_digest(path: Path) -> str:
    """A cheap identity of a cached binary: its size and mtime (the cache never rewrites in place)."""
    st = path.stat()
    return f"{path.name}:{st.st_size}:{int(st.st_mtime)}"


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:12]


def _data(name: str) -> str:
    return resources.files("hyperplan_dev").joinpath("kindimages", name).read_text()


def _workdir(prefix: str) -> Path:
    root = build.cache_dir() / "build"
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root))


def docker_build(context: Path, tag: str, log: Log, build_args: dict[str, str] | None = None,
                 labels: dict[str, str] | None = None) -> None:
    args = ["build", "-q", "-t", tag]
    for k, v in (build_args or {}).items():
        args += ["--build-arg", f"{k}={v}"]
    for k, v in (labels or {}).items():
        args += ["--label", f"{k}={v}"]
    r = subprocess.run(["docker", *args, str(context)], capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise ImageBuildError(f"docker build {tag} failed (exit {r.returncode}):\n"
                              f"{(r.stdout + r.stderr)[-6000:]}")


# ---------------------------------------------------------------------------------------------
# Host CA certificates (TLS-intercepting proxies)


def extra_ca_certificates() -> list[str]:
    """PEM blocks in the host's CA bundle that are not in Debian's own certificate set.

    Package traffic from containers may pass a TLS-intercepting proxy whose CA the host trusts
    (added to ``/etc/ssl/certs/ca-certificates.crt`` or ``/usr/local/share/ca-certificates``).
    Images that install packages with pip need the same CAs.
    """
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if not bundle.is_file():
        return []
    pem = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)

    def body(block: str) -> str:
        return "".join(block.split())

    known: set[str] = set()
    mozilla = Path("/usr/share/ca-certificates/mozilla")
    if mozilla.is_dir():
        for f in mozilla.glob("*.crt"):
            known.update(body(b) for b in pem.findall(f.read_text(errors="replace")))
    blocks = pem.findall(bundle.read_text(errors="replace"))
    if not known:
        return []  # no Debian set to compare with: we cannot tell which ones are extra
    return [b + "\n" for b in blocks if body(b) not in known]


def write_extra_certs(folder: Path) -> int:
    """Write the host's extra CAs as ``folder/host-extra-N.crt``; how many there were."""
    folder.mkdir(parents=True, exist_ok=True)
    certs = extra_ca_certificates()
    for i, c in enumerate(certs):
        (folder / f"host-extra-{i}.crt").write_text(c)
    return len(certs)


# ---------------------------------------------------------------------------------------------
# Base images


def debian_mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror the host's apt uses (debootstrap fetches from it)."""
    files = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*"))]
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        for m in re.finditer(r"^(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text, re.M):
            uri = m.group(1)
            if "security" not in uri and uri.startswith(("http://", "https://")):
                return uri.rstrip("/")
    return "http://deb.debian.org/debian"


def debian_base(log: Log) -> str:
    """``hyperplan-local/debian:bookworm-<hash>`` from debootstrap, built once per recipe."""
    mirror = debian_mirror()
    tag = f"hyperplan-local/debian:{DEBIAN_SUITE}-{_hash('debootstrap minbase, PATH, no apt lists', DEBIAN_SUITE, mirror)}"
    if image_exists(tag):
        return tag
    if shutil.which("debootstrap") is None:
        from hyperplan_dev import hostsetup
        hostsetup.apt_install(["debootstrap"], log)
    work = _workdir("debian-")
    root = work / "rootfs"
    try:
        r = subprocess.run(["debootstrap", "--variant=minbase", DEBIAN_SUITE, str(root), mirror],
                           capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise ImageBuildError(f"debootstrap failed (exit {r.returncode}):\n{r.stdout[-3000:]}"
                                  f"\n{r.stderr[-3000:]}")
        # Images install their packages with apt; keep the mirror debootstrap used.
        (root / "etc/apt/sources.list").write_text(
            f"deb {mirror} {DEBIAN_SUITE} main\ndeb {mirror} {DEBIAN_SUITE}-updates main\n")
        # What apt downloaded: images run `apt-get update` before they install anything.
        for d in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(root / d, ignore_errors=True)
            (root / d / "partial").mkdir(parents=True, exist_ok=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."],
                               stdout=subprocess.PIPE)
        imp = subprocess.run(["docker", "import", "--change", 'CMD ["/bin/bash"]', "--change",
                              "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                              "-", tag],
                             stdin=tar.stdout, capture_output=True, text=True, timeout=600)
        tar.stdout.close()
        tar.wait()
        if imp.returncode != 0 or tar.returncode != 0:
            raise ImageBuildError(f"docker import failed: {imp.stderr[-2000:]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    drop_other_tags(tag, log)
    return tag


def python_base(debian: str, log: Log) -> str:
    """A stand-in for ``python:3.11-slim`` on the local Debian base, with the host's extra CAs."""
    dockerfile = _data("python.Dockerfile")
    certs = extra_ca_certificates()
    tag = f"hyperplan-local/python:3.11-{DEBIAN_SUITE}-{_hash(dockerfile, debian, *certs)}"
    if image_exists(tag):
        return tag
    work = _workdir("python-")
    try:
        (work / "Dockerfile").write_text(dockerfile)
        write_extra_certs(work / "certs")
        docker_build(work, tag, log, build_args={"BASE": debian})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    drop_other_tags(tag, log)
    return tag


# ---------------------------------------------------------------------------------------------
# The images kubeadm wants, the CNI image, and the node image


@dataclass(frozen=True)
class ScratchImage:
    """An image of one static binary on ``scratch``, under the name kubeadm pulls."""

    ref: str
    binary: str
    path_in_image: str

    def dockerfile(self) -> str:
        return (f"FROM scratch\nCOPY {self.binary} {self.path_in_image}\n"
                "ENV PATH=/usr/local/bin:/usr/bin:/bin\n"
                f'ENTRYPOINT ["{self.path_in_image}"]\n')


def scratch_images() -> list[ScratchImage]:
    v = build.KUBERNETES_VERSION
    return [
        ScratchImage(f"registry.k8s.io/kube-apiserver:{v}", "kube-apiserver", "/usr/local/bin/kube-apiserver"),
        ScratchImage(f"registry.k8s.io/kube-controller-manager:{v}", "kube-controller-manager",
                     "/usr/local/bin/kube-controller-manager"),
        ScratchImage(f"registry.k8s.io/kube-scheduler:{v}", "kube-scheduler", "/usr/local/bin/kube-scheduler"),
        ScratchImage(ETCD_IMAGE, "etcd", "/usr/local/bin/etcd"),
        ScratchImage(COREDNS_IMAGE, "coredns", "/coredns"),
        ScratchImage(PAUSE_IMAGE, "pause", "/pause"),
    ]


def _build_if_changed(ref: str, recipe: str, make_context: Callable[[Path], None], log: Log,
                      build_args: dict[str, str] | None = None) -> bool:
    """Build ``ref`` unless an image of that name carries this recipe's hash; True if built."""
    h = _hash(recipe)
    if image_label(ref, RECIPE_LABEL) == h:
        return False
    work = _workdir("img-")
    try:
        make_context(work)
        docker_build(work, ref, log, build_args=build_args, labels={RECIPE_LABEL: h})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return True


def kubeadm_images() -> set[str]:
    """What the built kubeadm pulls for this Kubernetes version."""
    r = subprocess.run([str(build.binary("kubeadm")), "config", "images", "list",
                        "--kubernetes-version", build.KUBERNETES_VERSION],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise ImageBuildError(f"kubeadm config images list failed: {r.stderr[-2000:]}")
    return set(r.stdout.split())


def control_plane_images(debian: str, log: Log) -> list[str]:
    """The images of ``kubeadm config images list`` (with our pause), built where missing."""
    ours = {img.ref for img in scratch_images()} | {f"registry.k8s.io/kube-proxy:{build.KUBERNETES_VERSION}"}
    wanted = kubeadm_images()
    if wanted != ours:
        raise ImageBuildError(
            f"kubeadm {build.KUBERNETES_VERSION} wants {sorted(wanted - ours)}, which this build does "
            f"not make (it makes {sorted(ours - wanted)} instead): update the versions in "
            "hyperplan_dev/build.py (COREDNS_VERSION, PAUSE_VERSION, ETCD_VERSION)")
    refs = []
    for img in scratch_images():
        src = build.binary(img.binary)
        recipe = img.dockerfile() + _file_digest(src)

        def ctx(work: Path, img: ScratchImage = img, src: Path = src) -> None:
            (work / "Dockerfile").write_text(img.dockerfile())
            shutil.copy2(src, work / img.binary)

        if _build_if_changed(img.ref, recipe, ctx, log):
            log(f"  built {img.ref}")
        refs.append(img.ref)
    proxy_ref = f"registry.k8s.io/kube-proxy:{build.KUBERNETES_VERSION}"
    proxy_src = build.binary("kube-proxy")
    dockerfile = _data("kube-proxy.Dockerfile")

    def proxy_ctx(work: Path) -> None:
        (work / "Dockerfile").write_text(dockerfile)
        shutil.copy2(proxy_src, work / "kube-proxy")

    if _build_if_changed(proxy_ref, dockerfile + debian + _file_digest(proxy_src), proxy_ctx, log,
                         build_args={"BASE": debian}):
        log(f"  built {proxy_ref}")
    refs.append(proxy_ref)
    return refs


def podnet_image(debian: str, log: Log) -> str:
    """The image of the small CNI daemon (``podnet.sh``)."""
    dockerfile = _data("podnet.Dockerfile")
    script = _data("podnet.sh")
    kubectl = build.binary("kubectl")
    tag = f"hyperplan-local/podnet:{_hash(dockerfile, script, debian, _file_digest(kubectl))}"
    if image_exists(tag):
        return tag
    work = _workdir("podnet-")
    try:
        (work / "Dockerfile").write_text(dockerfile)
        (work / "podnet.sh").write_text(script)
        shutil.copy2(kubectl, work / "kubectl")
        docker_build(work, tag, log, build_args={"BASE": debian})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    drop_other_tags(tag, log)
    return tag


def podnet_manifest(image: str, pod_subnet: str = "10.244.0.0/16") -> str:
    return _data("podnet.yaml").replace("@IMAGE@", image).replace("@POD_SUBNET@", pod_subnet)


def kind_module_dir() -> Path:
    """kind's Go module in the module cache (downloaded if missing): its entrypoint and base files."""
    r = subprocess.run(["go", "mod", "download", "-json", f"sigs.k8s.io/kind@{build.KIND_VERSION}"],
                       capture_output=True, text=True, timeout=600, cwd=build.cache_dir())
    if r.returncode != 0:
        raise ImageBuildError(f"go mod download sigs.k8s.io/kind failed: {r.stderr[-2000:]}")
    return Path(json.loads(r.stdout)["Dir"])


def node_image(debian: str, extra_images: list[str], log: Log) -> str:
    """``hyperplan-local/kind-node:<k8s version>-<hash>``: kind's node, from Debian packages."""
    kind_dir = kind_module_dir()
    base_files = kind_dir / "images" / "base" / "files"
    dockerfile = _data("kind-node.Dockerfile")
    node_bins = ["kubelet", "kubeadm", "kubectl", "crictl"]
    image_ids = [_docker("image", "inspect", "--format", "{{.Id}}", ref).stdout.decode().strip()
                 for ref in extra_images]
    recipe = _hash(dockerfile, _data("import-images.sh"), inspect.getsource(node_image), debian,
                   build.KIND_VERSION, _tree_digest(base_files),
                   *(_file_digest(build.binary(b)) for b in node_bins), *extra_images, *image_ids)
    tag = f"hyperplan-local/kind-node:{build.KUBERNETES_VERSION}-{recipe}"
    if image_exists(tag):
        return tag
    work = _workdir("node-")
    container = f"hyperplan-node-build-{os.getpid()}"
    stage = f"hyperplan-local/kind-node-stage:{recipe}"
    try:
        shutil.copytree(base_files, work / "files", symlinks=True)
        # The module cache is read-only; kind's Dockerfile gives these modes (COPY --chmod).
        executable = ("usr/local/bin", "kind/bin")
        for p in (work / "files").rglob("*"):
            rel = p.relative_to(work / "files").as_posix()
            p.chmod(0o755 if p.is_dir() or rel.startswith(executable) else 0o644)
        (work / "bin").mkdir()
        for b in node_bins:
            shutil.copy2(build.binary(b), work / "bin" / b)
        (work / "Dockerfile").write_text(dockerfile)
        started = time.monotonic()
        docker_build(work, stage, log, build_args={
            "BASE": debian, "KUBERNETES_VERSION": build.KUBERNETES_VERSION,
            "PAUSE_IMAGE": PAUSE_IMAGE})
        log(f"  node filesystem built ({time.monotonic() - started:.0f}s)")
        # Import the images the way kind's own node-image build does: containerd running in a
        # plain container of the new image, `ctr import --no-unpack`, then `docker commit`.
        tar = work / "images.tar"
        _docker("save", "-o", str(tar), *extra_images)
        _docker("run", "-d", "--name", container, "--entrypoint", "sleep",
                "--security-opt", "seccomp=unconfined", stage, "infinity")
        _docker("cp", str(tar), f"{container}:/kind/images.tar")
        _docker("exec", container, "bash", "-c", _data("import-images.sh"))
        _docker("commit",
                "--change", 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]',
                "--change", "CMD []",
                container, tag)
        log(f"  {len(extra_images)} images imported into the node's containerd "
            f"({time.monotonic() - started:.0f}s)")
    finally:
        _docker("rm", "-f", container, check=False)
        _docker("rmi", stage, check=False)
        shutil.rmtree(work, ignore_errors=True)
    drop_other_tags(tag, log)
    return tag


@dataclass
class KindImages:
    node: str
    python_base: str
    podnet: str | None  # None: the standard node image brings kindnetd
    local: bool


def ensure_images(log: Log, started: float | None = None) -> KindImages:
    """The node image and the Python base: pulled if possible, else built (and cached)."""
    t0 = started if started is not None else time.monotonic()

    def step(msg: str) -> None:
        log(f"{msg} (elapsed {time.monotonic() - t0:.0f}s)")

    pulled_node = try_pull(KINDEST_NODE, log)
    pulled_python = try_pull(PYTHON_IMAGE, log)
    if pulled_node and pulled_python:
        return KindImages(node=KINDEST_NODE, python_base=PYTHON_IMAGE, podnet=None, local=False)
    # The Go builds (CPU) run while debootstrap and apt (network and disk) make the base images.
    failed: list[BaseException] = []

    def node_binaries() -> None:
        try:
            build.ensure_binaries(lambda s: log("  " + s), build.KIND_COMPONENTS)
        except BaseException as e:  # re-raised below, in the caller's thread
            failed.append(e)

    binaries = threading.Thread(target=node_binaries, name="kind-binaries")
    if not pulled_node:
        binaries.start()
    try:
        debian = debian_base(log)
        step(f"debian base {debian}")
        python = PYTHON_IMAGE if pulled_python else python_base(debian, log)
        step(f"python base {python}")
    finally:
        if binaries.is_alive():
            binaries.join()
    if pulled_node:
        return KindImages(node=KINDEST_NODE, python_base=python, podnet=None, local=False)
    if failed:
        raise failed[0]
    step("kind node binaries (kubelet, kubeadm, kube-proxy, crictl, coredns, pause, kind)")
    refs = control_plane_images(debian, log)
    step(f"control-plane images ({len(refs)})")
    podnet = podnet_image(debian, log)
    step(f"CNI image {podnet}")
    node = node_image(debian, [*refs, podnet], log)
    step(f"node image {node}")
    return KindImages(node=node, python_base=python, podnet=podnet, local=True)
