"""Named local control planes (``Plane(name=...)``, ``hyperplan dev ... --name``): which names are
taken, where each plane's state lives, and that the default plane stays exactly what it was."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from hyperplan.cli import main
from hyperplan_dev.plane import NAME_MAX, Plane, PlaneState, check_name, free_ports, state_dir


@pytest.fixture
def base(tmp_path, monkeypatch):
    """The default plane's state folder, as HYPERPLAN_STATE_DIR sets it."""
    monkeypatch.setenv("HYPERPLAN_STATE_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("name", ["capacity", "training-a", "a", "0", "b2", "x" * NAME_MAX],
                         ids=["word", "inner-dash", "one-letter", "one-digit", "letter-digit", "longest"])
def test_a_dns_label_names_a_plane(name) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "Capacity", "training_a", "-a", "a-", "a.b", "../dev", "a b",
                                  "x" * (NAME_MAX + 1)],
                         ids=["empty", "upper-case", "underscore", "leading-dash", "trailing-dash", "dot",
                              "path", "space", "too-long"])
def test_anything_else_is_refused_saying_what_a_name_may_be(name) -> None:
    with pytest.raises(ValueError) as e:
        check_name(name)
    assert repr(name) in str(e.value) and "DNS label" in str(e.value)
    with pytest.raises(ValueError):
        Plane(name=name)


def test_a_named_plane_lives_in_the_default_planes_folder_without_kueue(base) -> None:
    default, capacity, training = Plane(), Plane(name="capacity"), Plane(name="training-a")
    assert default.dir == state_dir() == base
    assert capacity.dir == state_dir("capacity") == base / "planes" / "capacity"
    assert training.kubeconfig == base / "planes" / "training-a" / "kubeconfig"
    assert "kueue" in default.processes and "kueue" not in capacity.processes
    assert "kueue" in Plane(name="capacity", with_kueue=True).processes
    assert "kueue" not in Plane(with_kueue=False).processes
    assert Plane(root=base / "elsewhere", name="capacity").dir == base / "elsewhere"
    assert state_dir("capacity", base=base / "federation") == base / "federation" / "planes" / "capacity"


def write_kubeconfig(plane: Plane, tmp_path) -> dict:
    files = {}
    for what in ("ca_cert", "admin_cert", "admin_key"):
        files[what] = tmp_path / what
        files[what].write_bytes(what.encode())
    plane.dir.mkdir(parents=True, exist_ok=True)
    plane._write_kubeconfig(PlaneState(ports={"apiserver": 6443}), SimpleNamespace(**files))
    return yaml.safe_load(plane.kubeconfig.read_text())


def test_the_kubeconfigs_of_several_planes_merge_without_one_hiding_another(base, tmp_path) -> None:
    """The default plane's kubeconfig keeps its names; a named plane's cluster, user and context
    carry its name, so that KUBECONFIG=a:b:c shows every plane."""
    default = write_kubeconfig(Plane(), tmp_path)
    assert default["current-context"] == "hyperplan-dev"
    assert [c["name"] for c in default["clusters"]] == ["hyperplan-dev"]
    assert [u["name"] for u in default["users"]] == ["hyperplan-admin"]
    named = write_kubeconfig(Plane(name="capacity"), tmp_path)
    assert named["current-context"] == "hyperplan-dev-capacity"
    assert named["contexts"] == [{"name": "hyperplan-dev-capacity", "context": {
        "cluster": "hyperplan-dev-capacity", "user": "hyperplan-dev-capacity-admin"}}]
    assert named["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"


def test_down_of_one_plane_leaves_the_others_state(base) -> None:
    """The default plane's ``down`` removes its own files, not ``planes/``; a named plane's removes
    its folder. (No process runs here: the pids recorded are none.)"""
    for plane in (Plane(), Plane(name="capacity"), Plane(name="training-a")):
        plane.dir.mkdir(parents=True, exist_ok=True)
        plane.kubeconfig.write_text("{}")
        PlaneState(ports={"apiserver": 1}).save(plane.state_file)
    lines: list[str] = []
    Plane(log=lines.append).down()
    assert not (base / "plane.json").exists() and not (base / "kubeconfig").exists()
    assert (base / "planes" / "capacity" / "plane.json").is_file()
    Plane(name="capacity", log=lines.append).down()
    assert not (base / "planes" / "capacity").exists()
    assert (base / "planes" / "training-a" / "plane.json").is_file()
    assert lines[-1] == "control plane 'capacity' stopped and its state removed"
    assert lines[0] == "control plane stopped and its state removed"


class KernelSocket:
    """A socket whose bind(0) gets the next port of ``KernelSocket.ports``, as the kernel may hand
    out a port again once the socket that held it is closed."""

    ports: list[int] = []

    def __enter__(self): return self
    def __exit__(self, *exc): return None
    def bind(self, address): self.port = KernelSocket.ports.pop(0)
    def getsockname(self): return ("127.0.0.1", self.port)


def test_a_port_handed_out_once_is_not_handed_out_again(monkeypatch) -> None:
    """Two planes picked before either binds its ports: the second never gets one of the first's,
    though the kernel offers it again (here 7001, released after the first pick)."""
    from hyperplan_dev import plane

    monkeypatch.setattr(plane, "_handed_out", set())
    monkeypatch.setattr(plane, "socket", SimpleNamespace(socket=KernelSocket))
    KernelSocket.ports = [7001, 7002, 7001, 7003, 7002, 7004]
    assert free_ports(2) == [7001, 7002]
    assert free_ports(2) == [7003, 7004]


def test_the_real_ports_of_three_planes_are_distinct() -> None:
    picked = [p for _ in range(3) for p in free_ports(9)]
    assert len(set(picked)) == len(picked) == 27


@pytest.mark.parametrize("argv, code, err", [
    (["dev", "up", "--name", "Training_A"], 2, "invalid plane name 'Training_A'"),
    (["dev", "down", "--name=-x"], 2, "invalid plane name '-x'"),
    (["dev", "kind", "up", "--name", "capacity"], 2, "--name is for the local control planes"),
], ids=["bad-name", "leading-dash", "kind-has-no-name"])
def test_the_cli_refuses_a_bad_name_before_doing_anything(argv, code, err, base, capsys) -> None:
    assert main(argv) == code
    assert err in capsys.readouterr().err
    assert list(base.iterdir()) == []


@pytest.mark.parametrize("argv, kubeconfig", [
    (["dev", "env"], "kubeconfig"),
    (["dev", "env", "--name", "capacity"], "planes/capacity/kubeconfig"),
    (["dev", "env", "--name", "training-b"], "planes/training-b/kubeconfig"),
], ids=["default", "capacity", "training-b"])
def test_dev_env_names_each_planes_kubeconfig(argv, kubeconfig, base, capsys) -> None:
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"export KUBECONFIG={base / kubeconfig}"


@pytest.mark.parametrize("argv, says", [
    (["dev", "status"], "control plane is not running"),
    (["dev", "status", "--name", "capacity"], "control plane 'capacity' is not running"),
], ids=["default", "named"])
def test_dev_status_of_a_plane_that_is_not_up(argv, says, base, capsys) -> None:
    assert main(argv) == 1
    assert capsys.readouterr().out.strip() == says


def test_dev_status_of_a_named_plane_reads_its_own_state(base, capsys) -> None:
    """Another plane's state is not read: only capacity's plane.json names a process here."""
    Plane().dir.mkdir(parents=True, exist_ok=True)
    PlaneState(ports={"apiserver": 1}, pids={}).save(Plane().state_file)
    capacity = Plane(name="capacity")
    capacity.dir.mkdir(parents=True)
    (capacity.state_file).write_text(json.dumps({
        "ports": {"etcd": 2, "apiserver": 3, "controller-manager": 4, "scheduler": 5, "kwok": 6},
        "pids": {"etcd": 999999999}}))
    assert main(["dev", "status", "--name", "capacity"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["etcd", "not", "running", "http://127.0.0.1:2"]
    assert out[1].split() == ["kubeconfig", str(capacity.kubeconfig)]
