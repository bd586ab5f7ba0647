"""The runtime wrapper for hosts without CAP_SYS_RESOURCE: which file it edits for which runc
call, and that it removes that one capability from every set and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyperplan_dev import runc_wrapper as w

ALL = ["CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_SYS_RESOURCE", "CAP_NET_ADMIN"]


@pytest.mark.parametrize("args,expected", [
    (["create", "--bundle", "/b", "id"], ("create", 0)),
    (["--root", "/run/runc", "--log", "/l", "--log-format", "json", "create", "-b", "/b", "id"], ("create", 6)),
    (["--debug", "--systemd-cgroup", "exec", "--process", "/p", "id"], ("exec", 2)),
    (["--version"], (None, -1)),
], ids=["plain", "global-flags-with-values", "boolean-global-flags", "no-subcommand"])
def test_split_command(args: list[str], expected: tuple) -> None:
    assert w.split_command(args) == expected


@pytest.mark.parametrize("args,value", [
    (["--bundle", "/a", "id"], "/a"),
    (["--bundle=/a", "id"], "/a"),
    (["-b", "/a", "id"], "/a"),
    (["--pid-file", "/p", "id"], None),
], ids=["long", "long-equals", "short", "absent"])
def test_flag_value(args: list[str], value: str | None) -> None:
    assert w.flag_value(args, ("--bundle", "-b")) == value


def _caps() -> dict:
    return {k: list(ALL) for k in ("bounding", "effective", "inheritable", "permitted", "ambient")}


def test_create_drops_the_capability_from_every_set_of_the_bundle_config(tmp_path: Path, monkeypatch) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"ociVersion": "1.0.2", "process": {"args": ["sh"], "capabilities": _caps()}}))
    ran = []
    monkeypatch.setattr(w.os, "execv", lambda path, argv: ran.append(argv))
    w.main(["runc", "--root", "/r", "create", "--bundle", str(tmp_path), "c1"])
    spec = json.loads(config.read_text())
    assert spec["process"]["capabilities"] == {k: ["CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_NET_ADMIN"]
                                               for k in _caps()}
    assert spec["process"]["args"] == ["sh"] and spec["ociVersion"] == "1.0.2"
    assert ran == [[w.REAL_RUNC, "--root", "/r", "create", "--bundle", str(tmp_path), "c1"]]


def test_exec_drops_the_capability_from_the_process_file(tmp_path: Path, monkeypatch) -> None:
    process = tmp_path / "process.json"
    process.write_text(json.dumps({"args": ["true"], "capabilities": _caps()}))
    monkeypatch.setattr(w.os, "execv", lambda path, argv: None)
    w.main(["runc", "exec", "--process", str(process), "c1"])
    assert all("CAP_SYS_RESOURCE" not in v for v in json.loads(process.read_text())["capabilities"].values())


@pytest.mark.parametrize("command", ["start", "delete", "state", "kill"])
def test_other_commands_touch_no_file(tmp_path: Path, monkeypatch, command: str) -> None:
    config = tmp_path / "config.json"
    original = json.dumps({"process": {"capabilities": _caps()}})
    config.write_text(original)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(w.os, "execv", lambda path, argv: None)
    w.main(["runc", command, "c1"])
    assert config.read_text() == original


def test_a_missing_or_broken_file_is_left_for_runc_to_report(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "config.json").write_text("{not json")
    ran = []
    monkeypatch.setattr(w.os, "execv", lambda path, argv: ran.append(argv))
    w.main(["runc", "create", "--bundle", str(tmp_path), "c1"])
    w.main(["runc", "exec", "--process", str(tmp_path / "absent.json"), "c1"])
    assert len(ran) == 2 and (tmp_path / "config.json").read_text() == "{not json"
