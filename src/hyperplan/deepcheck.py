"""The deep health checks' default commands, run in a check Job's pod (actuation.deepchecks):
``python -m hyperplan.deepcheck InstanceStress`` or ``... InstanceConnectivity``.

Stdlib only, small on purpose: a real fleet puts its own commands in the chart's values (DCGM's
diagnostic, an NCCL or EFA test); these are what a node of any kind can do.

* **InstanceStress**: every CPU the pod may use computes the same SHA-256 chain over and over, for a
  sixth of ``HYPERPLAN_CHECK_SECONDS``, and must get the reference's result each time (a core that
  computes wrong, or a worker that dies, fails the node); then ``HYPERPLAN_CHECK_MEMORY_MIB`` MiB
  (default 256) are written with a pattern and read back.
* **InstanceConnectivity**: the pod listens on ``HYPERPLAN_CHECK_PORT`` and reaches each peer of its
  run (``HYPERPLAN_CHECK_PEERS``: host names under the run's headless Service, itself among them)
  over TCP: it says its name, the peer answers with its own. It keeps listening until every peer
  has reached it too, or the time (``HYPERPLAN_CHECK_SECONDS``) is up, so that a late peer still
  finds it. It passes when it reached at least half of the others (each of them, when there is
  one; itself, when alone): a node whose network is down reaches none and fails, while the others,
  each missing only that one, pass.

The verdict is the exit code (0 passed, 1 failed) and one line, also written to
``/dev/termination-log``: the output the operator puts in its Event.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

STRESS_ROUNDS = 20_000  # SHA-256 steps of one chain (a few milliseconds)
SEED = b"hyperplan deep health check"
TERMINATION_LOG = "/dev/termination-log"


@dataclass(frozen=True)
class Verdict:
    passed: bool
    message: str


# --------------------------------------------------------------------------- InstanceStress


def chain(rounds: int = STRESS_ROUNDS) -> str:
    digest = SEED
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()


def _worker(seconds: float, expected: str, out: multiprocessing.Queue) -> None:  # pragma: no cover (a child)
    deadline, done = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        got = chain()
        if got != expected:
            out.put((os.getpid(), done, got))
            return
        done += 1
    out.put((os.getpid(), done, None))


def stress(seconds: float, memory_mib: int = 256, workers: int | None = None) -> Verdict:
    """The CPUs and memory of this node (see the module docstring)."""
    workers = workers or len(os.sched_getaffinity(0))
    expected = chain()
    out: multiprocessing.Queue = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_worker, args=(seconds, expected, out), daemon=True) for _ in range(workers)]
    for p in procs:
        p.start()
    results = []
    for _ in procs:
        try:
            results.append(out.get(timeout=seconds + 30))
        except Exception:  # noqa: BLE001 - a worker that never answers is a failure
            break
    for p in procs:
        p.join(timeout=5)
    wrong = [r for r in results if r[2] is not None]
    if wrong:
        pid, done, got = wrong[0]
        return Verdict(False, f"a CPU computed {got[:12]} where {expected[:12]} is right (worker {pid}, after {done} "
                              "good rounds)")
    if len(results) < workers:
        return Verdict(False, f"{workers - len(results)} of {workers} CPU workers did not finish")
    rounds = sum(r[1] for r in results)
    size = memory_mib * 1024 * 1024
    block = bytes(range(256)) * 4096  # 1 MiB
    memory = bytearray(size)
    for offset in range(0, size, len(block)):
        memory[offset:offset + len(block)] = block
    for offset in range(0, size, len(block)):
        if memory[offset:offset + len(block)] != block:
            return Verdict(False, f"memory read back wrong at {offset // len(block)} MiB of {memory_mib} MiB")
    return Verdict(True, f"{workers} CPU(s) computed {rounds} SHA-256 chains alike in {seconds:g}s; "
                         f"{memory_mib} MiB of memory written and read back")


# --------------------------------------------------------------------------- InstanceConnectivity

Address = Callable[[str], tuple[str, int]]


class Listener:
    """Answers each peer that says its name with ours, and remembers who did."""

    def __init__(self, me: str, bind: tuple[str, int]):
        self.me = me
        self.heard: set[str] = set()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(bind)
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    line = conn.makefile("r").readline().strip()
                    if line.startswith("hello "):
                        self.heard.add(line[len("hello "):])
                        conn.sendall(f"ok {self.me}\n".encode())
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(timeout=2)


def reach(me: str, peer: str, address: Address, timeout: float = 2.0) -> str | None:
    """Say our name to ``peer``; None when it answered with its own, else what went wrong."""
    try:
        host, port = address(peer)
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            conn.sendall(f"hello {me}\n".encode())
            answer = conn.makefile("r").readline().strip()
    except OSError as e:
        return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return None if answer == f"ok {peer}" else f"answered {answer!r}"


def dns_address(port: int) -> Address:
    def address(peer: str) -> tuple[str, int]:
        return socket.getaddrinfo(peer, port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0], port
    return address


def connectivity(me: str, peers: Sequence[str], seconds: float, address: Address,
                 bind: tuple[str, int], pause: float = 0.5) -> Verdict:
    """Reach the other ``peers`` of the run and be reached by them (see the module docstring)."""
    others = [p for p in peers if p != me] or [me]
    listener = Listener(me, bind)
    deadline = time.monotonic() + seconds
    reached: set[str] = set()
    errors: dict[str, str] = {}
    try:
        while time.monotonic() < deadline and len(reached) < len(others):
            for peer in others:
                if peer in reached:
                    continue
                error = reach(me, peer, address, timeout=min(2.0, max(0.1, deadline - time.monotonic())))
                if error is None:
                    reached.add(peer)
                    errors.pop(peer, None)
                else:
                    errors[peer] = error
            if len(reached) < len(others):
                time.sleep(pause)
        waiting_for = set(others) - {me}
        while time.monotonic() < deadline and not waiting_for <= listener.heard:
            time.sleep(0.1)  # a late peer still reaches us
    finally:
        listener.close()
    missed = [p for p in others if p not in reached]
    passed = bool(reached) and 2 * len(reached) >= len(others)
    message = f"reached {len(reached)} of {len(others)} peer(s) over the pod network in {seconds:g}s or less"
    if missed:
        message += "; unreachable: " + ", ".join(f"{p} ({errors.get(p, 'not tried')})" for p in missed)
    silent = sorted(set(others) - {me} - listener.heard)
    if silent:
        message += "; not reached by: " + ", ".join(silent)
    return Verdict(passed, message)


# --------------------------------------------------------------------------- the command


def run(check: str, env: dict[str, str]) -> Verdict:
    seconds = float(env.get("HYPERPLAN_CHECK_SECONDS", "60"))
    if check == "InstanceStress":
        return stress(max(1.0, seconds / 6), int(env.get("HYPERPLAN_CHECK_MEMORY_MIB", "256")))
    if check == "InstanceConnectivity":
        port = int(env.get("HYPERPLAN_CHECK_PORT", "7946"))
        me = env["HYPERPLAN_CHECK_SELF"]
        peers = [p for p in env.get("HYPERPLAN_CHECK_PEERS", "").split(",") if p]
        return connectivity(me, peers, seconds, dns_address(port), ("0.0.0.0", port))
    return Verdict(False, f"unknown check {check!r} (InstanceStress or InstanceConnectivity)")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = args[0] if args else os.environ.get("HYPERPLAN_CHECK", "")
    verdict = run(check, dict(os.environ))
    line = f"{check} {'passed' if verdict.passed else 'failed'} on {os.environ.get('HYPERPLAN_CHECK_NODE', '?')}: " \
           f"{verdict.message}"
    print(line, flush=True)
    try:
        with open(TERMINATION_LOG, "w") as f:
            f.write(line)
    except OSError:
        pass  # not in a pod
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
