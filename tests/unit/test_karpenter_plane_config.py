"""Karpenter's kwok provider on the plane, without running it: its build step, its instance-type
file, its environment and the KWOK stage that takes its nodes (the real thing runs in
tests/integration/test_karpenter_plane.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from hyperplan.actuation.providers.base import ACCELERATORS, node_capacity
from hyperplan_dev import build, karpenter
from hyperplan_dev.plane import Plane, kwok_stages


def _stages() -> dict[str, dict]:
    return {s["metadata"]["name"]: s["spec"] for s in yaml.safe_load_all(kwok_stages())}


def _selector(stage: dict) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {e["key"]: (e["operator"], tuple(e.get("values", ()))) for e in stage["selector"]["matchExpressions"]}


# ----------------------------------------------------------------- build


def test_karpenter_is_a_pinned_plane_component_with_its_crds() -> None:
    c = build.component("karpenter")
    assert c in build.COMPONENTS
    assert (c.version, c.binaries) == ("v1.15.0", ("karpenter-kwok",))
    assert {"crds/karpenter.sh_nodepools.yaml", "crds/karpenter.sh_nodeclaims.yaml",
            "crds/karpenter.kwok.sh_kwoknodeclasses.yaml"} <= set(c.files)
    assert c.dir == build.cache_dir() / "bin" / "karpenter-v1.15.0"
    assert build.binary("karpenter-kwok") == c.dir / "karpenter-kwok"
    # KWOK's own binary is still the one named kwok.
    assert build.binary("kwok") == build.component("kwok").path("kwok")


def test_every_go_command_of_the_karpenter_build_names_the_newer_toolchain(tmp_path: Path, monkeypatch) -> None:
    """The machine's Go is older than v1.15.0's go line: a go command without GOTOOLCHAIN fails."""
    module = tmp_path / "mod"
    for sub, name in (("charts/crds", "karpenter.sh_nodepools.yaml"), ("charts/crds", "karpenter.sh_nodeclaims.yaml"),
                      ("apis/crds", "karpenter.kwok.sh_kwoknodeclasses.yaml")):
        (module / "kwok" / sub).mkdir(parents=True, exist_ok=True)
        (module / "kwok" / sub / name).write_text(f"# {name}\n")
    commands: list[list[str]] = []

    def fake_run(cmd, cwd, log, step):
        commands.append(cmd)

    def fake_subprocess_run(cmd, **kw):
        commands.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=f"{module}\n", stderr="")

    monkeypatch.setattr(build, "_run", fake_run)
    monkeypatch.setattr(build.subprocess, "run", fake_subprocess_run)
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    c = build.component("karpenter")
    c.build(c, work, out, lambda s: None)

    assert [cmd[3] for cmd in commands] == ["get", "list", "build"]
    assert all(cmd[:3] == ["env", "GOTOOLCHAIN=go1.27.3", "go"] for cmd in commands), commands
    assert commands[0][-1] == "sigs.k8s.io/karpenter/kwok@v1.15.0"
    assert commands[2][-3:] == ["-o", str(out / "karpenter-kwok"), "sigs.k8s.io/karpenter/kwok"]
    assert "-X sigs.k8s.io/karpenter/pkg/operator.Version=v1.15.0" in commands[2][commands[2].index("-ldflags") + 1]
    assert sorted(p.name for p in (out / "crds").iterdir()) == [
        "karpenter.kwok.sh_kwoknodeclasses.yaml", "karpenter.sh_nodeclaims.yaml", "karpenter.sh_nodepools.yaml"]
    for f in c.files:  # what is_built() looks for is what the build leaves
        assert (out / f).is_file(), f


# ----------------------------------------------------------------- instance types


def test_the_instance_types_are_hyperplans_with_the_resources_of_its_kwok_nodes() -> None:
    types = {t["name"]: t for t in karpenter.instance_types()}
    assert set(types) == set(ACCELERATORS)
    assert {"ml.p5.48xlarge", "ml.p6e-gb200.36xlarge"} <= set(types)
    for name, t in types.items():
        assert t["resources"] == node_capacity(name), name
        assert (t["architecture"], t["operatingSystems"]) == ("amd64", ["linux"])
    assert types["ml.p6e-gb200.36xlarge"]["resources"]["nvidia.com/gpu"] == "4"


def _offer(offering: dict) -> tuple[str, str]:
    reqs = {r["key"]: r for r in offering["Requirements"]}
    assert all(r["operator"] == "In" and len(r["values"]) == 1 for r in reqs.values())
    return reqs["karpenter.sh/capacity-type"]["values"][0], reqs["topology.kubernetes.io/zone"]["values"][0]


@pytest.mark.parametrize("zones", [karpenter.ZONES, ("us-east-1a",), ("zone-x", "zone-y")],
                         ids=["default-zones", "one-zone", "zones-given"])
def test_each_type_is_offered_on_demand_and_reserved_in_each_zone(zones) -> None:
    for t in karpenter.instance_types(zones=zones, reserved_capacity=7):
        offers = {_offer(o): o for o in t["offerings"]}
        assert set(offers) == {(ct, z) for ct in ("on-demand", "reserved") for z in zones}, t["name"]
        for (ct, _), o in offers.items():
            assert o["Available"] is True
            # Only a reserved offering counts capacity; it is the cheaper, so it is launched first.
            assert o.get("ReservationCapacity") == (7 if ct == "reserved" else None)
        assert max(o["Price"] for (ct, _), o in offers.items() if ct == "reserved") < \
            min(o["Price"] for (ct, _), o in offers.items() if ct == "on-demand")


def test_the_default_zones_cover_the_demo_and_the_e2e_fixed_zones() -> None:
    demo = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "demo" / "10-capacitypools.yaml"
    demo_zones = {d["spec"]["availabilityZone"] for d in yaml.safe_load_all(demo.read_text()) if d}
    assert demo_zones <= set(karpenter.ZONES)
    assert "us-east-1a" in karpenter.ZONES  # pool_body's default zone in tests/e2e/scenarios.py


def test_the_instance_type_file_is_json_the_provider_reads() -> None:
    text = json.dumps(karpenter.instance_types())
    assert isinstance(json.loads(text), list)


# ----------------------------------------------------------------- environment


def test_the_environment_configures_karpenter_out_of_cluster(tmp_path: Path) -> None:
    env = karpenter.environment(tmp_path / "kubeconfig", 1111, 2222, tmp_path / "it.json",
                                base={"PATH": "/bin", "KUBECONFIG": "/elsewhere"})
    assert env == {
        "PATH": "/bin",
        "KUBECONFIG": str(tmp_path / "kubeconfig"),   # the plane's, never one from outside
        "SYSTEM_NAMESPACE": "karpenter",
        "DISABLE_LEADER_ELECTION": "true",
        "METRICS_PORT": "1111",
        "HEALTH_PROBE_PORT": "2222",
        "FEATURE_GATES": "StaticCapacity=true",
        "INSTANCE_TYPES_FILE_PATH": str(tmp_path / "it.json"),
    }


# ----------------------------------------------------------------- KWOK stages


@pytest.mark.parametrize("stage, selects", [
    ("hyperplan-node-initialize", {".status.phase": ("DoesNotExist", ())}),
    ("hyperplan-karpenter-node-initialize", {".status.phase": ("In", ("Pending",)),
                                             '.metadata.annotations["kwok.x-k8s.io/node"]': ("In", ("fake",))}),
], ids=["hyperplan-nodes-without-phase", "karpenter-nodes-pending-and-fake"])
def test_each_initialise_stage_selects_its_own_nodes(stage: str, selects: dict) -> None:
    assert _selector(_stages()[stage]) == selects


def test_both_initialise_stages_make_a_node_running_the_same_way_but_for_capacity() -> None:
    """The Karpenter stage is the plane's own, with capacity falling back to allocatable."""
    stages = _stages()
    ours = stages["hyperplan-node-initialize"]["next"]["statusTemplate"]
    theirs = stages["hyperplan-karpenter-node-initialize"]["next"]["statusTemplate"]
    assert "phase: Running" in ours and "phase: Running" in theirs
    head, tail = ours.split("capacity:\n", 1)
    assert theirs.startswith(head + "capacity:\n")
    assert theirs.endswith(tail.split("{{ end }}\n", 1)[1])
    assert "{{ with .status.allocatable }}" in theirs.split("capacity:\n", 1)[1]


# ----------------------------------------------------------------- stop


def test_stop_leaves_a_recorded_pid_alone_that_no_longer_runs_karpenter(tmp_path: Path) -> None:
    """A pid in karpenter.json that another program now has (pids get reused) is not signalled."""
    k = karpenter.Karpenter(Plane(root=tmp_path, log=lambda s: None))
    k.dir.mkdir(parents=True)
    karpenter.KarpenterState(pid=os.getpid(), ports={"metrics": 1, "health": 2}).save(k.state_file)
    assert not k.running()
    k.stop()  # this test process is still here to see the next line
    assert k.state() is None and not k.dir.exists()


# ----------------------------------------------------------------- the default node class


class _RecordingKubectl:
    """kubectl as the node class calls see it: the KWOKNodeClasses there, creates recorded."""

    def __init__(self, names: list[str]) -> None:
        self.names, self.created = list(names), []

    def __call__(self, *args: str, input: str | None = None, timeout: float = 120) -> str:
        if args[0] == "get":
            return json.dumps({"items": [{"metadata": {"name": n}} for n in self.names]})
        assert args[:3] == ("create", "-f", "-"), args
        body = json.loads(input)
        self.created.append(body)
        self.names.append(body["metadata"]["name"])
        return ""


@pytest.mark.parametrize("there, created", [
    pytest.param([], ["default"], id="a-fresh-plane-gets-the-default"),
    pytest.param(["default"], [], id="one-there-is-left-as-it-is"),
    pytest.param(["other"], ["default"], id="another-class-is-not-the-default"),
])
def test_the_plane_makes_the_node_class_the_settings_default_to(tmp_path: Path, monkeypatch, there, created) -> None:
    from hyperplan.settings import Settings
    k = karpenter.Karpenter(Plane(root=tmp_path, log=lambda s: None))
    kubectl = _RecordingKubectl(there)
    monkeypatch.setattr(k, "_kubectl", kubectl)
    k.ensure_node_class()
    assert [b["metadata"]["name"] for b in kubectl.created] == created
    group, kind, name = Settings.model_fields["karpenter_node_class"].default.split("/")
    for body in kubectl.created:
        assert (body["apiVersion"].split("/")[0], body["kind"], body["metadata"]["name"]) == (group, kind, name)
    assert "default" in k.node_classes()


def test_node_classes_are_none_when_kubectl_cannot_list_them(tmp_path: Path, monkeypatch) -> None:
    k = karpenter.Karpenter(Plane(root=tmp_path, log=lambda s: None))

    def refused(*args, **kwargs):
        raise RuntimeError("the server doesn't have a resource type")
    monkeypatch.setattr(k, "_kubectl", refused)
    assert k.node_classes() == []
