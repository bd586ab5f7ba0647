"""`hyperplan status`: the snapshot built from API bodies, its JSON, and the view rendered at a fixed now."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from kubernetes import client
from rich.console import Console

from hyperplan import status
from hyperplan.api.models import to_rfc3339

NOW = datetime(2027, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def at(seconds: int) -> str:
    return to_rfc3339(NOW + timedelta(seconds=seconds))


def block(rid: str, start: int, end: int, count: int = 8, az: str = "us-east-1a",
          itype: str = "ml.p5.48xlarge", **extra) -> dict:
    return {"id": rid, "availabilityZone": az, "instanceType": itype, "instanceCount": count,
            "startTime": at(start), "endTime": at(end), "terminationTime": at(end - 20), **extra}


def ultraserver(uid: str, health: str, in_use: int, spares: int, unhealthy: int = 0) -> dict:
    return {"id": uid, "availabilityZone": "us-west-2b", "totalInstanceCount": 18,
            "configuredSpareInstanceCount": 1, "availableInstanceCount": 18 - in_use - unhealthy - spares,
            "inUseInstanceCount": in_use, "availableSpareInstanceCount": spares, "unhealthyInstanceCount": unhealthy, "healthStatus": health}


POOLS = [
    {"metadata": {"name": "demo-p5"},
     "spec": {"instanceType": "ml.p5.48xlarge", "availabilityZone": "us-east-1a", "instanceCount": 8,
              "unavailable": [{"start": at(-30), "end": at(30), "instanceCount": 2}]},
     "status": {"reservations": [{"trainingPlan": "demo-split", "reservedCapacityId": "rc-split-0",
                                  "startTime": at(-60), "endTime": at(0), "instanceCount": 8}]}},
    {"metadata": {"name": "demo-gb200"},
     "spec": {"instanceType": "ml.p6e-gb200.36xlarge", "availabilityZone": "us-west-2b", "instanceCount": 36,
              "ultraServerType": "ml.u-p6e-gb200x72"},
     "status": {"reservations": [{"trainingPlan": "demo-gb200", "reservedCapacityId": "rc-gb-0",
                                  "startTime": at(-40), "endTime": at(140), "instanceCount": 36}]}},
]

PLANS = [
    {"metadata": {"name": "demo-split"},
     "spec": {"instanceType": "ml.p5.48xlarge", "instanceCount": 8, "targetResource": "hyperpod-cluster",
              "duration": "2m"},
     "status": {"phase": "Scheduled", "availabilityZone": "us-east-1a", "totalInstanceCount": 8,
                "nextTransitionTime": at(30),
                "reservedCapacity": [block("rc-split-0", -60, 0, status="Expired"),
                                     block("rc-split-1", 30, 90)]}},
    {"metadata": {"name": "demo-gb200"},
     "spec": {"ultraServerType": "ml.u-p6e-gb200x72", "ultraServerCount": 2,
              "targetResource": "hyperpod-cluster", "duration": "3m"},
     "status": {"phase": "Active", "availabilityZone": "us-west-2b", "totalInstanceCount": 36,
                "inUseInstanceCount": 20, "availableSpareInstanceCount": 1, "unhealthyInstanceCount": 1,
                "nextTransitionTime": at(120),
                "reservedCapacity": [block("rc-gb-0", -40, 140, count=36, az="us-west-2b",
                                                      itype="ml.p6e-gb200.36xlarge", status="Active")],
                "ultraServers": [ultraserver("rc-gb-0-us-0", "impaired", 17, 0, unhealthy=1),
                                 ultraserver("rc-gb-0-us-1", "ok", 3, 1)]}},
    {"metadata": {"name": "not-bought"},
     "spec": {"instanceType": "ml.p5.48xlarge", "instanceCount": 64, "targetResource": "training-job",
              "duration": "1m"},
     "status": {"phase": "Failed", "conditions": [
         {"type": "Failed", "status": "True", "reason": "NoCapacity", "message": "no pool can sell 64"}]}},
]

GROUPS = [
    {"metadata": {"name": "demo-workers"},
     "spec": {"trainingPlanRef": "demo-gb200", "instanceType": "ml.p6e-gb200.36xlarge", "instanceCount": 20},
     "status": {"phase": "Ready", "availabilityZone": "us-west-2b", "desiredCount": 20, "readyCount": 20,
                "spareCount": 1, "unhealthyCount": 1}},
]


def nodes() -> list[tuple[str, status.Node]]:
    out = [("demo-workers", status.Node(f"hp-demo-workers-0-{i}", "active", status.SERVING, "rc-gb-0-us-0"))
           for i in range(16)]
    out += [("demo-workers", status.Node("hp-demo-workers-0-16", "active", status.UNHEALTHY, "rc-gb-0-us-0")),
            ("demo-workers", status.Node("hp-demo-workers-0-17-g1", "active", status.SERVING, "rc-gb-0-us-0"))]
    out += [("demo-workers", status.Node(f"hp-demo-workers-1-{i}", "active", status.SERVING, "rc-gb-0-us-1"))
            for i in range(3)]
    out += [("demo-workers", status.Node("hp-demo-workers-1-3", "spare", status.SPARE, "rc-gb-0-us-1")),
            ("other-group", status.Node("hp-other-0", "active", status.SERVING, None))]
    return out


@pytest.fixture
def snap() -> status.Snapshot:
    return status.snapshot_from_objects(POOLS, PLANS, GROUPS, nodes(), NOW)


def text_of(snap: status.Snapshot, now: datetime = NOW, width: int = 160) -> str:
    console = Console(width=width, record=True, color_system=None, force_terminal=False)
    console.print(status.render(snap, now))
    return console.export_text()


def line_with(text: str, *words: str) -> str:
    lines = [ln for ln in text.splitlines() if all(w in ln for w in words)]
    assert lines, f"no line with {words} in:\n{text}"
    return lines[0]


# ----------------------------------------------------------------------------- the snapshot


def test_snapshot_joins_plans_groups_nodes_and_pools(snap: status.Snapshot) -> None:
    assert [p.name for p in snap.plans] == ["demo-gb200", "demo-split", "not-bought"]
    gb = snap.plans[0]
    assert gb.instance_type == "ml.p6e-gb200.36xlarge"  # from the block: the spec names only the UltraServer type
    assert [u.spare_nodes for u in gb.ultra_servers] == [[], ["hp-demo-workers-1-3"]]
    (group,) = snap.groups
    assert group.nodes_by_state() == {"active": 20, "spare": 1, "provisioning": 0, "checking": 0, "draining": 0, "rebooting": 0, "unhealthy": 1}
    assert "hp-other-0" not in [n.name for n in group.nodes]
    pools = {p.name: (p.sold_now, p.unavailable_now, p.free_now) for p in snap.pools}
    assert pools == {"demo-p5": (0, 2, 6), "demo-gb200": (36, 0, 0)}  # a reservation ending at now is over
    assert snap.plans[2].message == "Failed=True: no pool can sell 64"


@pytest.mark.parametrize("start, end, expected", [
    pytest.param(-60, 0, "past", id="ended-exactly-now"),
    pytest.param(-60, 1, "active", id="ends-in-a-second"),
    pytest.param(0, 60, "active", id="starts-now"),
    pytest.param(1, 60, "next", id="starts-in-a-second"),
])
def test_block_when_is_read_from_its_times(start: int, end: int, expected: str) -> None:
    b = status.Block("rc", "az", 1, NOW + timedelta(seconds=start), NOW + timedelta(seconds=end), None, "Scheduled")
    assert b.when(NOW) == expected


ACTIVE, SPARE = {"hyperplan.dev/role": "active"}, {"hyperplan.dev/role": "spare"}
SAGEMAKER_HEALTH = "sagemaker.amazonaws.com/node-health-status"


@pytest.mark.parametrize("labels, ready, unschedulable, deleting, expected", [
    pytest.param(ACTIVE, "True", False, False, "active", id="serving"),
    pytest.param(SPARE, "True", False, False, "spare", id="spare"),
    pytest.param(ACTIVE, None, False, False, "provisioning", id="no-ready-condition-yet"),
    pytest.param(ACTIVE, "False", False, False, "unhealthy", id="not-ready"),
    pytest.param(SPARE, "Unknown", False, False, "unhealthy", id="spare-lost-contact"),
    pytest.param({**ACTIVE, "hyperplan.dev/node-health-status": "UnschedulablePendingReplacement"}, "True", True,
                 False, "unhealthy", id="marked-for-replacement"),
    pytest.param(ACTIVE, "True", True, False, "draining", id="cordoned"),
    pytest.param({**ACTIVE, SAGEMAKER_HEALTH: "Unschedulable"}, "True", False, False, "unhealthy",
                 id="only-sagemaker-says-unschedulable"),
    pytest.param({**SPARE, SAGEMAKER_HEALTH: "UnschedulablePendingReboot"}, "True", False, False, "rebooting",
                 id="spare-only-sagemaker-says-pending-reboot"),
    pytest.param({**ACTIVE, "hyperplan.dev/node-health-status": "UnschedulablePendingReboot"}, "False", False, False,
                 "rebooting", id="rebooted-by-the-ladder"),
    pytest.param({**ACTIVE, "hyperplan.dev/node-health-status": "Schedulable", SAGEMAKER_HEALTH: "Schedulable"},
                 "True", False, False, "active", id="both-labels-schedulable"),
    pytest.param(ACTIVE, "True", False, True, "draining", id="being-deleted"),
    pytest.param({**ACTIVE, "hyperplan.dev/deep-health-check-status": "InProgress"}, "True", False, False, "checking",
                 id="in-its-deep-health-checks"),
    pytest.param({**SPARE, "sagemaker.amazonaws.com/deep-health-check-status": "InProgress"}, "True", False, False,
                 "checking", id="spare-in-hyperpods-checks"),
    pytest.param({**ACTIVE, "hyperplan.dev/deep-health-check-status": "Failed"}, "True", False, False, "unhealthy",
                 id="failed-its-deep-health-checks"),
    pytest.param({**ACTIVE, "hyperplan.dev/deep-health-check-status": "Passed"}, "True", False, False, "active",
                 id="passed-its-deep-health-checks"),
    pytest.param({**ACTIVE, "hyperplan.dev/deep-health-check-status": "InProgress"}, None, False, False,
                 "provisioning", id="checks-of-a-node-not-ready-yet"),
])
def test_node_state(labels: dict, ready: str | None, unschedulable: bool, deleting: bool, expected: str) -> None:
    """A node's state in ``hyperplan status``, read from the ``V1Node`` the API returns."""
    node = client.V1Node(
        metadata=client.V1ObjectMeta(name="n", labels={"hyperplan.dev/instance-group": "g", **labels},
                                     deletion_timestamp=NOW if deleting else None),
        spec=client.V1NodeSpec(unschedulable=unschedulable or None),
        status=client.V1NodeStatus(conditions=None if ready is None else [
            client.V1NodeCondition(type="Ready", status=ready)]))
    group, seen = status.node_from_api(node, "topology.k8s.aws/ultraserver-id")
    assert (group, seen.state) == ("g", expected)


def test_objects_that_do_not_parse_are_shown_not_fatal() -> None:
    bad = [{"metadata": {"name": "odd"}, "spec": {}, "status": {"phase": "Sideways", "reservedCapacity": "x"}}]
    snap = status.snapshot_from_objects([], bad, [{"metadata": {"name": "g"}}], [], NOW)
    assert snap.plans[0].name == "odd" and snap.plans[0].phase == "" and snap.plans[0].blocks == []
    assert "odd" in text_of(snap)


def test_json_has_stable_keys_and_rfc3339_times(snap: status.Snapshot) -> None:
    doc = json.loads(json.dumps(snap.to_dict()))
    assert list(doc) == ["time", "pools", "plans", "groups"]
    assert doc["time"] == "2027-01-01T12:00:00Z"
    split = next(p for p in doc["plans"] if p["name"] == "demo-split")
    assert set(split) >= {"name", "phase", "instanceType", "availabilityZone", "totalInstanceCount",
                          "inUseInstanceCount", "availableSpareInstanceCount", "unhealthyInstanceCount",
                          "nextTransitionTime", "blocks", "ultraServers"}
    assert [(b["id"], b["when"], b["startTime"]) for b in split["blocks"]] == [
        ("rc-split-0", "past", "2027-01-01T11:59:00Z"), ("rc-split-1", "next", "2027-01-01T12:00:30Z")]
    us = next(p for p in doc["plans"] if p["name"] == "demo-gb200")["ultraServers"]
    assert [(u["id"], u["healthStatus"], u["availableSpareInstanceCount"], u["spareNodes"]) for u in us] == [
        ("rc-gb-0-us-0", "impaired", 0, []), ("rc-gb-0-us-1", "ok", 1, ["hp-demo-workers-1-3"])]
    (group,) = doc["groups"]
    assert group["nodesByState"] == {"active": 20, "spare": 1, "provisioning": 0, "checking": 0, "draining": 0, "rebooting": 0, "unhealthy": 1}
    assert group["trainingPlan"] == "demo-gb200" and len(group["nodes"]) == 22
    assert next(p for p in doc["pools"] if p["name"] == "demo-p5")["freeNow"] == 6


# ----------------------------------------------------------------------------- the time axis


def axis_for(*spans: tuple[int, int], width: int = 20) -> tuple[list[status.Block], status.Axis]:
    blocks = [status.Block(f"rc-{i}", "az", 1, NOW + timedelta(seconds=a), NOW + timedelta(seconds=b), None, "")
              for i, (a, b) in enumerate(spans)]
    return blocks, status.Axis.around(blocks, NOW, width)


@pytest.mark.parametrize("spans, expected", [
    # 20 cells over [-60 s, +60 s] padded by 3 s: each cell 6.3 s; now is cell 10.
    pytest.param([(-60, 0), (30, 60)], "▒▒▒▒▒▒▒▒▒▒│····░░░░░", id="past-gap-now-next"),
    pytest.param([(-60, 60)], "██████████│█████████", id="active-around-now"),
    pytest.param([(-60, -59), (59, 60)], "▒·········│········░", id="short-blocks-keep-a-cell"),
])
def test_timeline_marks_past_active_next_and_now(spans: list, expected: str) -> None:
    blocks, axis = axis_for(*spans)
    assert status.timeline(blocks, NOW, axis).plain == expected


def test_timeline_without_blocks_still_shows_now() -> None:
    blocks, axis = axis_for()
    bar = status.timeline(blocks, NOW, axis).plain
    assert bar.count("│") == 1 and set(bar) == {"│", "·"}


@pytest.mark.parametrize("seconds, expected", [
    pytest.param(0, "in 0s", id="now"),
    pytest.param(25, "in 25s", id="seconds"),
    pytest.param(3725, "in 1h 2m", id="two-units-at-most"),
    pytest.param(-90, "1m 30s ago", id="past"),
    pytest.param(2 * 86400 + 5, "in 2d 5s", id="days"),
])
def test_relative_times(seconds: int, expected: str) -> None:
    assert status.relative(NOW + timedelta(seconds=seconds), NOW) == expected


# ----------------------------------------------------------------------------- the rendered view


def test_view_shows_each_plan_with_its_phase_az_counts_and_timeline(snap: status.Snapshot) -> None:
    text = text_of(snap)
    split = line_with(text, "demo-split", "Scheduled")
    assert "us-east-1a" in split and "0/8" in split and "in 30s" in split
    assert "▒" in split and "░" in split and "│" in split and "█" not in split
    gb = line_with(text, "demo-gb200", "Active")
    assert "us-west-2b" in gb and "20/36" in gb and "in 2m" in gb and "█" in gb
    assert "past" in line_with(text, "rc-split-0") and "12:00:30–12:01:30" in line_with(text, "rc-split-1", "next")
    assert "active" in line_with(text, "rc-gb-0 ")
    assert "plan not-bought: Failed=True: no pool can sell 64" in text
    assert "█ active  ░ next  ▒ past  │ now 12:00:00" in text


def test_view_shows_ultraserver_health_and_spares(snap: status.Snapshot) -> None:
    text = text_of(snap)
    us0 = line_with(text, "rc-gb-0-us-0")
    assert "impaired" in us0 and " 0/1 " in us0 and "17" in us0
    us1 = line_with(text, "rc-gb-0-us-1")
    assert "ok" in us1 and " 1/1 " in us1 and "hp-demo-workers-1-3" in us1


def test_view_shows_group_nodes_by_state(snap: status.Snapshot) -> None:
    row = line_with(text_of(snap), "demo-workers", "Ready")
    assert "active 20" in row and "spare 1" in row and "unhealthy 1" in row and "provisioning" not in row


def test_view_shows_pools_sold_and_free(snap: status.Snapshot) -> None:
    row = line_with(text_of(snap), "demo-p5", "ml.p5.48xlarge")
    assert row.split()[-4:] == ["8", "0", "2", "6"]


def test_view_of_an_empty_cluster_says_so() -> None:
    text = text_of(status.Snapshot(time=NOW))
    for what in ("no training plans", "no UltraServers", "no instance groups", "no capacity pools"):
        assert what in text


def test_the_same_snapshot_later_moves_the_now_marker(snap: status.Snapshot) -> None:
    later = NOW + timedelta(seconds=45)
    text = text_of(snap, later)
    assert "active" in line_with(text, "rc-split-1")  # 12:00:30–12:01:30 holds 12:00:45
    assert "(read 45s ago)" in text
    assert "now 12:00:45" in text


def test_watch_shows_each_read_and_reports_failures_without_ending() -> None:
    reads = iter([status.Snapshot(time=NOW), status.StatusError("API down"), status.Snapshot(time=NOW)])
    shown, errors = [], []

    def read() -> status.Snapshot:
        r = next(reads)
        if isinstance(r, Exception):
            raise r
        return r

    status.watch(read, shown.append, 0, stop=lambda: len(shown) + len(errors) >= 3, on_error=errors.append)
    assert len(shown) == 2 and [str(e) for e in errors] == ["API down"]


@pytest.mark.parametrize("argv, code, message", [
    pytest.param(["status", "--kubeconfig", "/nonexistent/kubeconfig"], 1,
                 "error: the kubeconfig /nonexistent/kubeconfig does not exist", id="missing-kubeconfig"),
    pytest.param(["status", "--interval", "0", "--watch"], 2,
                 "error: --interval must be a positive number of seconds", id="zero-interval"),
])
def test_cli_bad_input_is_a_clear_error(argv: list[str], code: int, message: str,
                                        capsys: pytest.CaptureFixture) -> None:
    from hyperplan.cli import main
    assert main(argv) == code
    assert capsys.readouterr().err.strip() == message


@pytest.mark.parametrize("width, dropped", [
    pytest.param(170, [], id="wide-all-columns"),
    pytest.param(120, ["type"], id="type-goes-first"),
    pytest.param(90, ["type", "spares", "unhealthy"], id="narrow"),
])
def test_a_narrow_console_drops_columns_but_keeps_the_whole_time_axis(snap: status.Snapshot, width: int,
                                                                      dropped: list[str]) -> None:
    text = text_of(snap, width=width)
    header = line_with(text, "plan / block")
    for column in status.OPTIONAL_PLAN_COLUMNS:
        assert (column in header) == (column not in dropped), header
    bar = line_with(text, "demo-split", "Scheduled").split()[-1]
    assert len(bar) >= 16 and bar.count("│") == 1 and "…" not in bar
    assert all(len(line) <= width for line in text.splitlines())


# ----------------------------------------------------------------------------- rebooting nodes

REBOOTING_GROUP = {
    "metadata": {"name": "demo-workers"},
    "spec": {"trainingPlanRef": "demo-gb200", "instanceType": "ml.p6e-gb200.36xlarge", "instanceCount": 20,
             "healthCheck": {"rebootTimeoutSeconds": 60}},
    "status": {"phase": "Ready", "desiredCount": 20, "readyCount": 19, "spareCount": 0, "unhealthyCount": 2,
               "nodes": [{"name": "hp-demo-workers-0-16", "uid": "u16", "nodeId": "hp-demo-workers-0-16",
                          "recovery": {"reboots": [at(-12)], "rebootingSince": at(-12)}},
                         {"name": "hp-demo-workers-0-15", "uid": "u15", "nodeId": "hp-demo-workers-0-15",
                          "recovery": {"reboots": [at(-3600)]}}]}}


def rebooting_nodes() -> list[tuple[str, status.Node]]:
    out = [(g, n) for g, n in nodes() if n.name not in ("hp-demo-workers-0-16", "hp-demo-workers-0-15")]
    return out + [("demo-workers", status.Node("hp-demo-workers-0-16", "active", status.REBOOTING, "rc-gb-0-us-0")),
                  ("demo-workers", status.Node("hp-demo-workers-0-15", "active", status.REBOOTING, "rc-gb-0-us-0"))]


@pytest.fixture
def rebooting_snap() -> status.Snapshot:
    return status.snapshot_from_objects(POOLS, PLANS, [REBOOTING_GROUP], rebooting_nodes(), NOW)


def test_a_reboot_under_way_is_read_from_the_groups_record(rebooting_snap: status.Snapshot) -> None:
    (group,) = rebooting_snap.groups
    assert group.reboot_timeout_seconds == 60
    assert {n.name: n.rebooting_since for n in group.rebooting()} == {
        "hp-demo-workers-0-15": None,  # an old reboot is no reboot under way: the label asks for one
        "hp-demo-workers-0-16": NOW - timedelta(seconds=12)}
    assert group.nodes_by_state()["rebooting"] == 2
    assert status.snapshot_from_objects(POOLS, PLANS, GROUPS, nodes(), NOW).groups[0].reboot_timeout_seconds == 600


@pytest.mark.parametrize("node, words", [
    pytest.param("hp-demo-workers-0-16", ["demo-workers", "active", "rc-gb-0-us-0", "started 12s ago", "in 48s"],
                 id="rebooting-since-and-its-timeout"),
    pytest.param("hp-demo-workers-0-15", ["demo-workers", "asked (health label), not started", " - "],
                 id="asked-not-started"),
])
def test_view_shows_the_rebooting_nodes_of_each_group(rebooting_snap: status.Snapshot, node: str,
                                                       words: list[str]) -> None:
    text = text_of(rebooting_snap, width=170)
    assert "Rebooting nodes" in text
    row = line_with(text, node, "demo-workers")
    assert all(w in row for w in words), row
    assert "rebooting 2" in line_with(text, "demo-workers", "Ready", "demo-gb200")


def test_no_rebooting_table_without_a_rebooting_node(snap: status.Snapshot) -> None:
    assert "Rebooting nodes" not in text_of(snap)
    assert "Nodes in deep health checks" not in text_of(snap)


CHECKING_GROUP = {**REBOOTING_GROUP, "status": {**REBOOTING_GROUP["status"], "nodes": [
    {"name": "hp-demo-workers-0-16", "uid": "u16", "nodeId": "hp-demo-workers-0-16",
     "deepHealthCheck": {"status": "InProgress", "since": at(-20), "checks": ["InstanceStress", "InstanceConnectivity"],
                         "started": at(-18)}}]}}


def test_view_shows_the_nodes_in_their_deep_health_checks() -> None:
    members = [(g, n) for g, n in nodes() if n.name != "hp-demo-workers-0-16"] + [
        ("demo-workers", status.Node("hp-demo-workers-0-16", "spare", status.CHECKING, "rc-gb-0-us-0"))]
    snap = status.snapshot_from_objects(POOLS, PLANS, [CHECKING_GROUP], members, NOW)
    (group,) = snap.groups
    [checking] = group.checking()
    assert (checking.checks, checking.checking_since) == (("InstanceStress", "InstanceConnectivity"),
                                                          NOW - timedelta(seconds=20))
    assert group.nodes_by_state()["checking"] == 1
    text = text_of(snap, width=170)
    assert "Nodes in deep health checks" in text
    row = line_with(text, "hp-demo-workers-0-16", "demo-workers")
    assert all(w in row for w in ("spare", "rc-gb-0-us-0", "InstanceStress, InstanceConnectivity", "20s ago")), row
    (as_json,) = json.loads(json.dumps(snap.to_dict()))["groups"]
    node = next(n for n in as_json["nodes"] if n["name"] == "hp-demo-workers-0-16")
    assert (node["state"], node["checks"]) == ("checking", ["InstanceStress", "InstanceConnectivity"])


def test_json_says_when_each_reboot_started_and_the_groups_timeout(rebooting_snap: status.Snapshot) -> None:
    (group,) = json.loads(json.dumps(rebooting_snap.to_dict()))["groups"]
    assert group["rebootTimeoutSeconds"] == 60
    since = {n["name"]: n["rebootingSince"] for n in group["nodes"] if n["state"] == "rebooting"}
    assert since == {"hp-demo-workers-0-15": None, "hp-demo-workers-0-16": "2027-01-01T11:59:48Z"}
