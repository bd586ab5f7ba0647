"""Machine set-up for kind: a working Docker engine, and privileged containers that start.

This is the only code in hyperplan that changes the host. It changes something only where a
check shows it is needed, says what it changes, and records it in a host-wide state file
(``~/.cache/hyperplan/host/host.json``) so that ``hyperplan dev kind down`` can undo what makes
sense to undo:

- **No Docker engine** (``docker info`` fails): as root, install Debian's ``docker.io`` with apt
  (it stays installed) and start ``dockerd`` in the background ourselves, logging to
  ``~/.cache/hyperplan/host/dockerd.log`` (there is no systemd on the project's machines). ``down``
  stops that dockerd, by its pid, once no kind cluster is left in it. Not root: fail with what to
  do.
- **``docker run --privileged`` fails with ``unable to apply caps``** (the host's capability
  bounding set lacks CAP_SYS_RESOURCE): install the runtime wrapper of ``runc_wrapper.py`` as
  ``/usr/local/libexec/hyperplan/runc-without-sys-resource``, make it Docker's default runtime in
  ``/etc/docker/daemon.json`` (the previous file is kept and restored by ``down``) and reload
  dockerd. Machines with a normal Docker never get it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable

from hyperplan_dev import build

Log = Callable[[str], None]

DAEMON_JSON = Path("/etc/docker/daemon.json")
WRAPPER_PATH = Path("/usr/local/libexec/hyperplan/runc-without-sys-resource")
WRAPPER_RUNTIME = "hyperplan-runc"
CAPS_ERROR = "unable to apply caps"
CAP_SYS_RESOURCE_BIT = 24


class HostSetupError(RuntimeError):
    """The host cannot run kind, and we cannot fix it from here; the message says what to do."""


def host_dir() -> Path:
    return build.cache_dir() / "host"


@dataclass
class HostState:
    """What this module changed on the host; read back by ``down``."""

    dockerd_pid: int = 0
    installed_packages: list[str] = field(default_factory=list)
    wrapper_installed: bool = False
    daemon_json_before: str | None = None  # previous content of daemon.json; None: there was none

    @staticmethod
    def path() -> Path:
        return host_dir() / "host.json"

    @classmethod
    def load(cls) -> "HostState":
        p = cls.path()
        if not p.is_file():
            return cls()
        return cls(**json.loads(p.read_text()))

    def save(self) -> None:
        self.path().parent.mkdir(parents=True, exist_ok=True)
        self.path().write_text(json.dumps(asdict(self), indent=2))


def _run(cmd: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def is_root() -> bool:
    return os.geteuid() == 0


def docker_works() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return _run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def apt_install(packages: list[str], log: Log) -> None:
    """``apt-get update`` then install ``packages`` non-interactively, starting no services."""
    if not is_root():
        raise HostSetupError(f"{' '.join(packages)} missing and not root: "
                             f"run `sudo apt-get install {' '.join(packages)}` and try again")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    started = time.monotonic()
    log(f"host: apt-get install {' '.join(packages)} ...")
    # Debian's packages would start their services (docker, containerd); we start what we need.
    policy = Path("/usr/sbin/policy-rc.d")
    made_policy = not policy.exists()
    if made_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        for cmd in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]):
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                raise HostSetupError(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    finally:
        if made_policy:
            policy.unlink(missing_ok=True)
    log(f"host: installed {' '.join(packages)} in {time.monotonic() - started:.0f}s")


def _pid_is_dockerd(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"dockerd")
    except OSError:
        return False


def start_dockerd(state: HostState, log: Log) -> None:
    """Start dockerd in its own session, log to a file, and wait until ``docker info`` answers."""
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    if not Path(dockerd).exists():
        raise HostSetupError("dockerd not found after installing docker.io")
    host_dir().mkdir(parents=True, exist_ok=True)
    logfile = host_dir() / "dockerd.log"
    with open(logfile, "ab") as out:
        proc = subprocess.Popen([dockerd], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    state.dockerd_pid = proc.pid
    state.save()
    log(f"host: started dockerd (pid {proc.pid}, log {logfile})")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if docker_works():
            return
        if proc.poll() is not None:
            raise HostSetupError(f"dockerd exited with {proc.returncode}; see {logfile}")
        time.sleep(0.5)
    raise HostSetupError(f"dockerd did not answer within 60s; see {logfile}")


def ensure_docker(log: Log) -> HostState:
    """A Docker engine that answers ``docker info``; installs and starts one where needed."""
    state = HostState.load()
    if docker_works():
        return state
    if not is_root():
        raise HostSetupError(
            "no working Docker engine (`docker info` failed) and not running as root, so it cannot "
            "be installed here: install Docker (Debian: `sudo apt-get install docker.io`), start it, "
            "make sure your user may use it (`docker info` works), then run this again")
    if not (shutil.which("dockerd") or Path("/usr/sbin/dockerd").exists()):
        apt_install(["docker.io"], log)
        state.installed_packages = sorted(set(state.installed_packages) | {"docker.io"})
        state.save()
    if state.dockerd_pid and _pid_is_dockerd(state.dockerd_pid):
        raise HostSetupError(f"dockerd (pid {state.dockerd_pid}) runs but does not answer; "
                             f"see {host_dir() / 'dockerd.log'}")
    start_dockerd(state, log)
    return state


def capability_bounding_set() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            return int(line.split()[1], 16)
    return 0


def privileged_error(image: str) -> str | None:
    """None if ``docker run --privileged`` (and ``docker exec`` into it) works, else the error."""
    name = f"hyperplan-privileged-check-{os.getpid()}"
    r = _run(["docker", "run", "-d", "--rm", "--privileged", "--name", name, "--entrypoint", "sleep",
              image, "60"], timeout=60)
    if r.returncode != 0:
        return (r.stderr or r.stdout).strip()
    try:
        r = _run(["docker", "exec", name, "true"], timeout=30)
        return None if r.returncode == 0 else (r.stderr or r.stdout).strip()
    finally:
        _run(["docker", "rm", "-f", name], timeout=30)


def install_runtime_wrapper(state: HostState, log: Log) -> None:
    """Install the wrapper, make it Docker's default runtime, and reload dockerd."""
    runc = shutil.which("runc") or "/usr/sbin/runc"
    if not Path(runc).exists():
        raise HostSetupError("runc not found; install Debian's runc (docker.io depends on it)")
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else os.path.realpath(
        shutil.which("python3") or "python3")
    source = resources.files("hyperplan_dev").joinpath("runc_wrapper.py").read_text()
    WRAPPER_PATH.parent.mkdir(parents=True, exist_ok=True)
    WRAPPER_PATH.write_text(f"#!{python} -I\n" + source.replace("@REAL_RUNC@", runc))
    WRAPPER_PATH.chmod(0o755)
    log(f"host: installed {WRAPPER_PATH} (drops CAP_SYS_RESOURCE, then runs {runc})")

    before = DAEMON_JSON.read_text() if DAEMON_JSON.is_file() else None
    if not state.wrapper_installed:
        state.daemon_json_before = before
    conf = json.loads(before) if before and before.strip() else {}
    conf.setdefault("runtimes", {})[WRAPPER_RUNTIME] = {"path": str(WRAPPER_PATH)}
    conf["default-runtime"] = WRAPPER_RUNTIME
    DAEMON_JSON.parent.mkdir(parents=True, exist_ok=True)
    DAEMON_JSON.write_text(json.dumps(conf, indent=2) + "\n")
    state.wrapper_installed = True
    state.save()
    log(f"host: {DAEMON_JSON}: runtime {WRAPPER_RUNTIME!r} added and made the default "
        f"(previous file kept in {HostState.path()})")
    reload_dockerd(state, log)


def _dockerd_pid(state: HostState) -> int:
    if state.dockerd_pid and _pid_is_dockerd(state.dockerd_pid):
        return state.dockerd_pid
    try:
        pid = int(Path("/var/run/docker.pid").read_text().strip())
        return pid if _pid_is_dockerd(pid) else 0
    except (OSError, ValueError):
        return 0


def reload_dockerd(state: HostState, log: Log) -> None:
    """SIGHUP makes dockerd re-read daemon.json (runtimes and default-runtime are reloadable)."""
    pid = _dockerd_pid(state)
    if not pid:
        raise HostSetupError(f"{DAEMON_JSON} changed, but dockerd's pid is unknown: restart Docker "
                             f"and run this again")
    os.kill(pid, signal.SIGHUP)
    time.sleep(1)
    log(f"host: dockerd (pid {pid}) reloaded its configuration")


def ensure_privileged(image: str, log: Log) -> None:
    """Privileged containers start (and can be exec'ed into); installs the wrapper only if needed."""
    err = privileged_error(image)
    if err is None:
        log("host: docker run --privileged works")
        return
    if CAPS_ERROR not in err:
        raise HostSetupError(f"docker run --privileged fails: {err}")
    if capability_bounding_set() & (1 << CAP_SYS_RESOURCE_BIT):
        raise HostSetupError(f"docker run --privileged fails with {err!r}, but CAP_SYS_RESOURCE is in "
                             "the bounding set, so the runtime wrapper would not help")
    if not is_root():
        raise HostSetupError("docker run --privileged fails because this host's capability bounding "
                             "set lacks CAP_SYS_RESOURCE; as root, `hyperplan dev kind up` installs a "
                             "runtime wrapper that drops that capability")
    log(f"host: docker run --privileged fails ({CAPS_ERROR}; CAP_SYS_RESOURCE is not in this "
        "host's capability bounding set)")
    state = HostState.load()
    install_runtime_wrapper(state, log)
    err = privileged_error(image)
    if err is not None:
        raise HostSetupError(f"docker run --privileged still fails with the runtime wrapper: {err}")
    log("host: docker run --privileged works with the runtime wrapper")


def teardown(log: Log) -> None:
    """Undo what makes sense: stop the dockerd we started (if it holds no kind cluster any more),
    then remove the runtime wrapper and restore daemon.json. Installed packages stay."""
    state = HostState.load()
    if state.dockerd_pid and _pid_is_dockerd(state.dockerd_pid):
        r = _run(["docker", "ps", "-aq", "--filter", "label=io.x-k8s.kind.cluster"], timeout=30)
        if r.returncode == 0 and r.stdout.strip():
            log(f"host: dockerd (pid {state.dockerd_pid}) still holds kind nodes; left running")
            return
        os.kill(state.dockerd_pid, signal.SIGTERM)
        for _ in range(60):
            if not _pid_is_dockerd(state.dockerd_pid):
                break
            time.sleep(0.5)
        else:
            os.kill(state.dockerd_pid, signal.SIGKILL)
        log(f"host: stopped dockerd (pid {state.dockerd_pid}) that `up` started")
    elif state.dockerd_pid:
        log(f"host: dockerd (pid {state.dockerd_pid}) is not running any more")
    else:
        return  # a Docker we did not start: leave its configuration alone while it runs
    state.dockerd_pid = 0
    if state.wrapper_installed:
        if state.daemon_json_before is None:
            DAEMON_JSON.unlink(missing_ok=True)
        else:
            DAEMON_JSON.write_text(state.daemon_json_before)
        WRAPPER_PATH.unlink(missing_ok=True)
        log(f"host: removed {WRAPPER_PATH} and restored {DAEMON_JSON}")
        state.wrapper_installed = False
        state.daemon_json_before = None
    state.save()


def describe() -> list[tuple[str, str]]:
    """Rows for ``status``: the host changes in force."""
    state = HostState.load()
    rows = [("docker", "answers" if docker_works() else "not answering")]
    if state.dockerd_pid:
        alive = _pid_is_dockerd(state.dockerd_pid)
        rows.append(("dockerd (ours)", f"pid {state.dockerd_pid} {'running' if alive else 'gone'}"))
    if state.wrapper_installed:
        rows.append(("runtime wrapper", f"{WRAPPER_PATH} (default runtime)"))
    if state.installed_packages:
        rows.append(("installed packages", " ".join(state.installed_packages)))
    return rows


def ensure_system_packages(log: Log) -> None:
    """What the test suite needs from the system: promtool (Debian's prometheus) and Docker."""
    if shutil.which("promtool") is None:
        apt_install(["prometheus"], log)
        state = HostState.load()
        state.installed_packages = sorted(set(state.installed_packages) | {"prometheus"})
        state.save()
    ensure_docker(log)
    log("system packages: promtool and a Docker engine are there")


def main() -> int:  # pragma: no cover - `make system-deps`
    import sys

    try:
        ensure_system_packages(lambda s: print(s, flush=True))
    except HostSetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
