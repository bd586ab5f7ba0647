"""The demo's reboot: which node it asks to reboot, and how it follows the node back to a spare."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from hyperplan import status
from hyperplan_dev import demo


SINCE = datetime(2027, 1, 1, 12, 0, tzinfo=timezone.utc)


def node(name: str, state: str, us: str = "us-0", role: str = "active",
         rebooting_since: datetime | None = None) -> status.Node:
    return status.Node(name, role, state, us, rebooting_since)


def group(*nodes: status.Node) -> status.InstanceGroup:
    return status.InstanceGroup("demo-workers", "demo-gb200", "Ready", "az", 2, 2, 1, 0, list(nodes))


@pytest.mark.parametrize("nodes, busy, want", [
    pytest.param([node("a", status.SERVING), node("b", status.SERVING), node("s", status.SPARE, role="spare")],
                 set(), "a", id="the-first-active-node-whose-ultraserver-has-a-spare"),
    pytest.param([node("a", status.SERVING), node("b", status.SERVING), node("s", status.SPARE, role="spare")],
                 {"a"}, "b", id="not-one-running-the-jobs-pods"),
    pytest.param([node("a", status.SERVING), node("b", status.SERVING, us="us-1"),
                  node("s", status.SPARE, us="us-1", role="spare")], set(), "b",
                 id="only-where-a-spare-can-take-its-work"),
    pytest.param([node("a", status.UNHEALTHY), node("s", status.SPARE, role="spare")], set(), None,
                 id="no-serving-node-none"),
    pytest.param([node("a", status.SERVING)], set(), None, id="no-spare-none"),
])
def test_reboot_candidate(nodes, busy, want) -> None:
    assert demo.reboot_candidate(group(*nodes), busy) == want


@pytest.mark.parametrize("stage, state, since, want", [
    pytest.param(demo.ASKED, status.SERVING, None, demo.ASKED, id="not-labelled-yet"),
    pytest.param(demo.ASKED, status.REBOOTING, None, demo.ASKED, id="labelled-its-grace-runs"),
    pytest.param(demo.ASKED, status.REBOOTING, SINCE, demo.REBOOTING, id="the-ladder-reboots-it"),
    pytest.param(demo.REBOOTING, status.REBOOTING, SINCE, demo.REBOOTING, id="still-rebooting"),
    pytest.param(demo.REBOOTING, status.SPARE, None, demo.BACK, id="back-as-the-spare"),
    pytest.param(demo.ASKED, status.SPARE, None, demo.ASKED, id="a-spare-before-its-reboot-is-not-back"),
    pytest.param(demo.REBOOTING, None, None, demo.REBOOTING, id="not-in-the-view-this-round"),
])
def test_reboot_progress(stage, state, since, want) -> None:
    seen = None if state is None else node("a", state, rebooting_since=since)
    assert demo.reboot_progress(stage, seen) == want
