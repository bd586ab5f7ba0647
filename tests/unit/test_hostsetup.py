"""Machine set-up decides from checks, and says what to do when it cannot act (never skips)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperplan_dev import hostsetup, images


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("HYPERPLAN_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_without_docker_and_without_root_it_fails_with_what_to_install(monkeypatch) -> None:
    monkeypatch.setattr(hostsetup, "docker_works", lambda: False)
    monkeypatch.setattr(hostsetup, "is_root", lambda: False)
    with pytest.raises(hostsetup.HostSetupError, match=r"apt-get install docker.io"):
        hostsetup.ensure_docker(print)


def test_a_working_docker_is_left_alone(monkeypatch) -> None:
    monkeypatch.setattr(hostsetup, "docker_works", lambda: True)
    monkeypatch.setattr(hostsetup, "apt_install", lambda *a: pytest.fail("installed something"))
    monkeypatch.setattr(hostsetup, "start_dockerd", lambda *a: pytest.fail("started dockerd"))
    assert hostsetup.ensure_docker(print) == hostsetup.HostState()


def test_privileged_containers_that_work_install_no_wrapper(monkeypatch) -> None:
    monkeypatch.setattr(hostsetup, "privileged_error", lambda image: None)
    monkeypatch.setattr(hostsetup, "install_runtime_wrapper", lambda *a: pytest.fail("installed the wrapper"))
    lines: list[str] = []
    hostsetup.ensure_privileged("img", lines.append)
    assert lines == ["host: docker run --privileged works"]


@pytest.mark.parametrize("error,root,bounding,message", [
    ("OCI runtime create failed: permission denied", True, 0, "docker run --privileged fails: OCI"),
    ("unable to apply caps: operation not permitted", False, 0, "as root"),
    ("unable to apply caps: operation not permitted", True, 1 << 24, "would not help"),
], ids=["another-error", "caps-error-not-root", "caps-error-with-the-capability"])
def test_privileged_failures_the_wrapper_cannot_fix_are_reported(
        monkeypatch, error: str, root: bool, bounding: int, message: str) -> None:
    monkeypatch.setattr(hostsetup, "privileged_error", lambda image: error)
    monkeypatch.setattr(hostsetup, "is_root", lambda: root)
    monkeypatch.setattr(hostsetup, "capability_bounding_set", lambda: bounding)
    monkeypatch.setattr(hostsetup, "install_runtime_wrapper", lambda *a: pytest.fail("installed the wrapper"))
    with pytest.raises(hostsetup.HostSetupError, match=message):
        hostsetup.ensure_privileged("img", print)


def test_teardown_without_a_dockerd_of_ours_changes_nothing(monkeypatch) -> None:
    monkeypatch.setattr(hostsetup.os, "kill", lambda *a: pytest.fail("signalled a process"))
    hostsetup.teardown(print)
    assert not hostsetup.HostState.path().exists()


@pytest.mark.parametrize("sources,mirror", [
    ("Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n", "http://mirror.example/debian"),
    ("deb [arch=amd64] http://m.example/debian/ bookworm main\n", "http://m.example/debian"),
    ("deb http://security.example/debian-security bookworm-security main\n", "http://deb.debian.org/debian"),
], ids=["deb822", "one-line-with-options", "security-only-falls-back"])
def test_debian_mirror_is_read_from_apt_sources(tmp_path: Path, monkeypatch, sources: str, mirror: str) -> None:
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list.d" / "debian.sources").write_text(sources)
    assert images.debian_mirror(apt) == mirror
