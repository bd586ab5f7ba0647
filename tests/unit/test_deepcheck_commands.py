"""The deep health checks' default commands (hyperplan.deepcheck), run for real on this machine: the
stress on its CPUs and memory, the connectivity among peers that listen on loopback ports."""

from __future__ import annotations

import socket
import threading

import pytest

from hyperplan import deepcheck


def test_the_stress_passes_on_a_sound_machine() -> None:
    verdict = deepcheck.stress(0.3, memory_mib=8, workers=2)
    assert verdict.passed, verdict.message
    assert verdict.message.startswith("2 CPU(s) computed") and "8 MiB of memory" in verdict.message


def test_a_cpu_that_computes_wrong_fails_the_stress(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deepcheck, "chain", iter(["a" * 64] + ["b" * 64] * 10_000).__next__)
    verdict = deepcheck.stress(0.2, memory_mib=1, workers=1)
    assert not verdict.passed and "a CPU computed bbbbbbbbbbbb where aaaaaaaaaaaa is right" in verdict.message


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_peers(names: list[str], up: list[str], seconds: float) -> dict[str, deepcheck.Verdict]:
    """Each node of ``up`` runs the check at once, reaching ``names``; the others never start."""
    ports = {n: free_port() for n in names}
    address = lambda peer: ("127.0.0.1", ports[peer])  # noqa: E731
    out: dict[str, deepcheck.Verdict] = {}

    def one(name: str) -> None:
        out[name] = deepcheck.connectivity(name, names, seconds, address, ("127.0.0.1", ports[name]), pause=0.05)
    threads = [threading.Thread(target=one, args=(n,)) for n in up]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 10)
    return out


@pytest.mark.parametrize("names, up, want", [
    (["a", "b", "c"], ["a", "b", "c"], {"a": True, "b": True, "c": True}),
    (["a"], ["a"], {"a": True}),
    (["a", "b", "c"], ["a", "b"], {"a": True, "b": True}),
    (["a", "b"], ["a"], {"a": False}),
    (["a", "b", "c", "d"], ["a"], {"a": False}),
], ids=["all-reach-each-other", "alone-reaches-itself", "one-down-the-others-pass-on-half",
        "the-one-other-down-fails", "none-reached-fails"])
def test_connectivity(names, up, want) -> None:
    got = run_peers(names, up, seconds=1 if len(up) < len(names) else 10)
    assert {n: v.passed for n, v in got.items()} == want, {n: v.message for n, v in got.items()}


def test_a_failure_names_the_peers_not_reached() -> None:
    [(_, verdict)] = run_peers(["a", "b"], ["a"], seconds=1).items()
    assert verdict.message.startswith("reached 0 of 1 peer(s)")
    assert "unreachable: b (ConnectionRefusedError" in verdict.message and "not reached by: b" in verdict.message


def test_the_command_says_its_verdict_in_one_line(monkeypatch: pytest.MonkeyPatch, capsys, tmp_path) -> None:
    monkeypatch.setattr(deepcheck, "TERMINATION_LOG", str(tmp_path / "termination-log"))
    monkeypatch.setenv("HYPERPLAN_CHECK_NODE", "node-1")
    assert deepcheck.main(["NoSuchCheck"]) == 1
    line = "NoSuchCheck failed on node-1: unknown check 'NoSuchCheck' (InstanceStress or InstanceConnectivity)"
    assert capsys.readouterr().out.strip() == line
    assert (tmp_path / "termination-log").read_text() == line
