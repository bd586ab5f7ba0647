"""Placement of instance groups on UltraServers, the desired node set, and plan counts."""

from __future__ import annotations

import pytest

from hyperplan.planning.counts import ObservedNode, UltraServerReport, plan_counts, ultraserver_reports
from hyperplan.planning.naming import (
    HEALTH_PENDING_REPLACEMENT,
    LABEL_GROUP,
    LABEL_HEALTH,
    LABEL_ROLE,
    LABEL_SLOT,
    LABEL_GENERATION,
    SPARE_TAINT,
    UNHEALTHY_TAINT,
    Taint,
    TopologyKeys,
    is_dns_label,
    kueue_topology_levels,
    label_value,
    node_name,
)
from hyperplan.planning.placement import (
    GroupRequest,
    PlacementResult,
    SlotState,
    UltraServer,
    desired_nodes,
    place_groups,
    slot_states_from_labels,
    spare_owners,
    spare_ultraservers,
    ultraservers_for_block,
)

X72 = "ml.u-p6e-gb200x72"
X36 = "ml.u-p6e-gb200x36"
GB200 = "ml.p6e-gb200.36xlarge"
AZ = "us-west-2a"
RC = "rc-abc"
US0, US1, US2 = f"{RC}-us-0", f"{RC}-us-1", f"{RC}-us-2"


def two_x72(spares: int = 1) -> tuple[UltraServer, ...]:
    return ultraservers_for_block(RC, X72, 36, spares)


def two_x36(spares: int = 1) -> tuple[UltraServer, ...]:
    return ultraservers_for_block(RC, X36, 18, spares)


def outcome(results: dict[str, PlacementResult]) -> dict[str, object]:
    """group -> {ultraServerId: count} when placed, else the error reason."""
    return {g: (r.counts if r.ok else r.reason) for g, r in results.items()}


# --------------------------------------------------------------------------- UltraServers


@pytest.mark.parametrize(
    ("rc", "us_type", "count", "spares", "expected"),
    [
        pytest.param("rc-abc", X72, 36, 1, (("rc-abc-us-0", 0, 18, 1), ("rc-abc-us-1", 1, 18, 1)),
                     id="two-x72"),
        pytest.param("rc-abc", X36, 27, 2,
                     (("rc-abc-us-0", 0, 9, 2), ("rc-abc-us-1", 1, 9, 2), ("rc-abc-us-2", 2, 9, 2)),
                     id="three-x36-two-spares"),
        pytest.param("rc-abc", X72, 18, 0, (("rc-abc-us-0", 0, 18, 0),), id="no-spares"),
        pytest.param("rc-abc", None, 8, 1, (), id="not-ultraserver-none"),
        pytest.param("rc-abc", "", 8, 1, (), id="not-ultraserver-empty"),
    ],
)
def test_ultraservers_for_block(rc, us_type, count, spares, expected):
    got = ultraservers_for_block(rc, us_type, count, spares)
    assert tuple((u.id, u.index, u.instance_count, u.spare_count) for u in got) == expected
    assert all(u.usable == u.instance_count - u.spare_count for u in got)


@pytest.mark.parametrize(
    ("us_type", "count", "spares", "message"),
    [
        pytest.param("ml.u-p6e-gb200x99", 36, 1, "unknown UltraServer type", id="unknown-type"),
        pytest.param(X72, 20, 1, "not a whole number", id="partial-ultraserver"),
        pytest.param(X72, 0, 1, "not a whole number", id="zero"),
        pytest.param(X36, 9, 9, "between 0 and 8", id="all-spares"),
        pytest.param(X36, 9, -1, "between 0 and 8", id="negative-spares"),
    ],
)
def test_ultraservers_for_block_rejects_bad_input(us_type, count, spares, message):
    with pytest.raises(ValueError, match=message):
        ultraservers_for_block(RC, us_type, count, spares)


def test_ultraserver_ids_stay_valid_label_values_for_long_reservation_ids():
    long_rc = "reserved-capacity-" + "x" * 60
    ids = [u.id for u in ultraservers_for_block(long_rc, X36, 18, 1)]
    assert len(set(ids)) == 2
    assert [i[-5:] for i in ids] == ["-us-0", "-us-1"]
    assert all(len(i) <= 63 and label_value(i) == i for i in ids)


# --------------------------------------------------------------------------- placement


@pytest.mark.parametrize(
    ("groups", "ultraservers", "expected"),
    [
        pytest.param([GroupRequest("a", 14)], two_x72(), {"a": {US0: 14}}, id="14-on-two-x72"),
        pytest.param([GroupRequest("a", 20)], two_x72(), {"a": {US0: 17, US1: 3}},
                     id="20-on-two-x72"),
        pytest.param([GroupRequest("a", 34)], two_x72(), {"a": {US0: 17, US1: 17}},
                     id="34-fills-both-x72"),
        pytest.param([GroupRequest("a", 35)], two_x72(), {"a": "InsufficientCapacity"},
                     id="35-spares-are-not-handed-out"),
        pytest.param([GroupRequest("a", 36)], two_x72(0), {"a": {US0: 18, US1: 18}},
                     id="no-spares-all-usable"),
        pytest.param([GroupRequest("a", 8)], two_x36(), {"a": {US0: 8}}, id="x36-8-fits-one"),
        pytest.param([GroupRequest("a", 10)], two_x36(), {"a": {US0: 8, US1: 2}},
                     id="x36-10-spills"),
        pytest.param([GroupRequest("a", 9)], two_x36(0), {"a": {US0: 9}}, id="x36-no-spares"),
        pytest.param([GroupRequest("a", 0)], two_x72(), {"a": {}}, id="empty-group"),
        pytest.param([GroupRequest("a", -1)], two_x72(), {"a": "InvalidPlacement"},
                     id="negative-count"),
        # several groups sharing a plan, in the given order
        pytest.param([GroupRequest("a", 10), GroupRequest("b", 5)], two_x72(),
                     {"a": {US0: 10}, "b": {US0: 5}}, id="shared-later-fills-leftover"),
        pytest.param([GroupRequest("a", 10), GroupRequest("b", 10)], two_x72(),
                     {"a": {US0: 10}, "b": {US1: 10}},
                     id="shared-keeps-group-in-one-nvlink-domain"),
        pytest.param([GroupRequest("a", 14), GroupRequest("b", 20)], two_x72(),
                     {"a": {US0: 14}, "b": {US0: 3, US1: 17}}, id="shared-spill-uses-fewest"),
        pytest.param([GroupRequest("b", 10), GroupRequest("a", 10)], two_x72(),
                     {"b": {US0: 10}, "a": {US1: 10}}, id="shared-order-is-the-input-order"),
        pytest.param([GroupRequest("a", 17), GroupRequest("b", 17), GroupRequest("c", 1)],
                     two_x72(), {"a": {US0: 17}, "b": {US1: 17}, "c": "InsufficientCapacity"},
                     id="shared-third-does-not-fit"),
        pytest.param([GroupRequest("a", 40), GroupRequest("b", 17)], two_x72(),
                     {"a": "InsufficientCapacity", "b": {US0: 17}},
                     id="failed-group-holds-nothing"),
        pytest.param([GroupRequest("a", 12, ((US1, 12),)), GroupRequest("b", 4)], two_x72(),
                     {"a": {US1: 12}, "b": {US1: 4}}, id="best-fit-fills-leftover-not-fresh"),
        pytest.param([GroupRequest("a", 4), GroupRequest("b", 6), GroupRequest("c", 6)],
                     ultraservers_for_block(RC, X36, 27, 1),
                     {"a": {US0: 4}, "b": {US1: 6}, "c": {US2: 6}},
                     id="three-x36-best-fit"),
        # explicit placement (InstancePlacementConfig)
        pytest.param([GroupRequest("a", 7, ((US1, 5), (US0, 2)))], two_x72(),
                     {"a": {US0: 2, US1: 5}}, id="explicit-valid"),
        pytest.param([GroupRequest("a", 17), GroupRequest("b", 5, ((US0, 5),))], two_x72(),
                     {"a": {US1: 17}, "b": {US0: 5}}, id="explicit-reserved-before-fill-first"),
        pytest.param([GroupRequest("a", 5, ((f"{RC}-us-9", 5),))], two_x72(),
                     {"a": "UnknownUltraServer"}, id="explicit-unknown-id"),
        pytest.param([GroupRequest("a", 18, ((US0, 18),))], two_x72(),
                     {"a": "PlacementExceedsCapacity"}, id="explicit-over-usable"),
        pytest.param([GroupRequest("a", 10, ((US0, 10),)), GroupRequest("b", 10, ((US0, 10),))],
                     two_x72(), {"a": {US0: 10}, "b": "PlacementExceedsCapacity"},
                     id="explicit-conflict-first-wins"),
        pytest.param([GroupRequest("a", 7, ((US0, 5),))], two_x72(),
                     {"a": "PlacementCountMismatch"}, id="explicit-count-mismatch"),
        pytest.param([GroupRequest("a", 4, ((US0, 2), (US0, 2)))], two_x72(),
                     {"a": "InvalidPlacement"}, id="explicit-duplicate-id"),
        # blocks without UltraServers
        pytest.param([GroupRequest("a", 5), GroupRequest("b", 3)], (), {"a": {}, "b": {}},
                     id="non-ultraserver"),
        pytest.param([GroupRequest("a", 1, (("us-x", 1),))], (), {"a": "UnknownUltraServer"},
                     id="non-ultraserver-explicit"),
    ],
)
def test_place_groups(groups, ultraservers, expected):
    got = place_groups(groups, ultraservers)
    assert outcome(got) == expected
    assert list(got) == [g.name for g in groups]
    for g in groups:
        assert got[g.name].instance_count == g.instance_count


def test_place_groups_non_ultraserver_capacity_bound():
    got = place_groups([GroupRequest("a", 5), GroupRequest("b", 4), GroupRequest("c", 3)], (),
                       capacity=8)
    assert outcome(got) == {"a": {}, "b": "InsufficientCapacity", "c": {}}
    assert got["b"].message == "4 instances requested, 3 of 8 left in the block"


@pytest.mark.parametrize(
    ("groups", "group", "message"),
    [
        pytest.param([GroupRequest("a", 18, ((US0, 18),))], "a",
                     f"18 instances on UltraServer {US0}, which has 17 usable (18 minus 1 spare), "
                     "0 already placed, 17 left", id="over-usable"),
        pytest.param([GroupRequest("a", 35)], "a",
                     "35 instances requested, 34 of 34 usable instances left on 2 UltraServer(s)",
                     id="insufficient"),
        pytest.param([GroupRequest("a", 5, (("nope", 5),))], "a",
                     f"unknown UltraServer(s) nope; the block has {US0}, {US1}", id="unknown"),
    ],
)
def test_placement_error_messages(groups, group, message):
    assert place_groups(groups, two_x72())[group].message == message


def test_place_groups_rejects_duplicate_names():
    with pytest.raises(ValueError, match="duplicate group names"):
        place_groups([GroupRequest("a", 1), GroupRequest("a", 2)], two_x72())


# --------------------------------------------------------------------------- spares


@pytest.mark.parametrize(
    ("groups", "order", "expected"),
    [
        pytest.param([GroupRequest("a", 14), GroupRequest("b", 20)], None,
                     {US0: "a", US1: "b"}, id="first-group-on-each"),
        pytest.param([GroupRequest("a", 20)], None, {US0: "a", US1: "a"}, id="one-group-both"),
        pytest.param([GroupRequest("a", 5)], None, {US0: "a"}, id="unused-ultraserver-no-owner"),
        pytest.param([GroupRequest("a", 40), GroupRequest("b", 5)], None, {US0: "b"},
                     id="failed-group-owns-nothing"),
        pytest.param([GroupRequest("a", 5), GroupRequest("b", 5)], ["b", "a"], {US0: "b"},
                     id="explicit-order"),
        pytest.param([GroupRequest("a", 0)], None, {}, id="empty-group"),
    ],
)
def test_spare_owners(groups, order, expected):
    assert spare_owners(place_groups(groups, two_x72()), order) == expected


def test_spare_ultraservers_for_group():
    owners = {US0: "a", US1: "b", US2: "a"}
    assert spare_ultraservers("a", owners) == (US0, US2)
    assert spare_ultraservers("b", owners) == (US1,)
    assert spare_ultraservers("c", owners) == ()


# --------------------------------------------------------------------------- desired nodes


def nodes_for(group: str, groups: list[GroupRequest], ultraservers=None, **kwargs):
    ultraservers = two_x72() if ultraservers is None else ultraservers
    placements = place_groups(groups, ultraservers)
    owners = spare_owners(placements)
    return desired_nodes(group, "plan-1", RC, GB200, AZ, placements[group], ultraservers,
                         spare_ultraservers(group, owners), **kwargs)


def layout(nodes) -> list[tuple[str, str, str | None]]:
    return [(n.slot, n.role, n.ultraserver_id) for n in nodes]


@pytest.mark.parametrize(
    ("group", "groups", "expected"),
    [
        pytest.param("a", [GroupRequest("a", 3)],
                     [("0-0", "active", US0), ("0-1", "active", US0), ("0-2", "active", US0),
                      ("0-3", "spare", US0)], id="spare-beside-active"),
        pytest.param("a", [GroupRequest("a", 19)],
                     [(f"0-{j}", "active", US0) for j in range(17)] + [("0-17", "spare", US0)]
                     + [("1-0", "active", US1), ("1-1", "active", US1), ("1-2", "spare", US1)],
                     id="spares-on-both-ultraservers"),
        pytest.param("b", [GroupRequest("a", 5), GroupRequest("b", 2)],
                     [("0-0", "active", US0), ("0-1", "active", US0)],
                     id="second-group-has-no-spares"),
        pytest.param("b", [GroupRequest("a", 10), GroupRequest("b", 10)],
                     [(f"1-{j}", "active", US1) for j in range(10)] + [("1-10", "spare", US1)],
                     id="second-group-owns-its-own-ultraserver"),
        pytest.param("a", [GroupRequest("a", 0)], [], id="empty"),
    ],
)
def test_desired_nodes_layout(group, groups, expected):
    assert layout(nodes_for(group, groups)) == expected


def test_desired_nodes_non_ultraserver():
    placements = place_groups([GroupRequest("g", 3)], ())
    nodes = desired_nodes("g", "plan-1", "rc-plain", "ml.p5.48xlarge", AZ, placements["g"], (),
                          spare_ultraservers=(US0,))
    assert [(n.name, n.role, n.ultraserver_id, n.slot) for n in nodes] == [
        ("hp-g-17f54eb8-0", "active", None, "0"),
        ("hp-g-17f54eb8-1", "active", None, "1"),
        ("hp-g-17f54eb8-2", "active", None, "2"),
    ]
    assert nodes[0].labels == {
        "node.kubernetes.io/instance-type": "ml.p5.48xlarge",
        "topology.kubernetes.io/zone": AZ,
        "kubernetes.io/hostname": "hp-g-17f54eb8-0",
        "hyperplan.dev/instance-group": "g",
        "hyperplan.dev/training-plan": "plan-1",
        "hyperplan.dev/reserved-capacity": "rc-plain",
        "hyperplan.dev/role": "active",
        "hyperplan.dev/node-health-status": "Schedulable",
        "hyperplan.dev/slot": "0",
        "hyperplan.dev/generation": "0",
    }
    assert all(n.taints == () for n in nodes)


def test_desired_nodes_labels_and_taints_of_ultraserver_nodes():
    user_taint = Taint("nvidia.com/gpu", "present", "NoSchedule")
    nodes = nodes_for("a", [GroupRequest("a", 2)],
                      extra_labels={"team": "ml", LABEL_GROUP: "spoofed"},
                      extra_taints=[user_taint, Taint("hyperplan.dev/spare", "no", "NoSchedule")])
    active, spare = nodes[0], nodes[2]
    assert active.name == "hp-a-c2fa068a-0-0"
    assert active.labels == {
        "team": "ml",
        "node.kubernetes.io/instance-type": GB200,
        "topology.kubernetes.io/zone": AZ,
        "kubernetes.io/hostname": "hp-a-c2fa068a-0-0",
        "hyperplan.dev/instance-group": "a",
        "hyperplan.dev/training-plan": "plan-1",
        "hyperplan.dev/reserved-capacity": RC,
        "hyperplan.dev/role": "active",
        "hyperplan.dev/node-health-status": "Schedulable",
        "hyperplan.dev/slot": "0-0",
        "hyperplan.dev/generation": "0",
        "topology.k8s.aws/ultraserver-id": US0,
        "topology.k8s.aws/network-node-layer-1": "nn-b4b3de07dec5a0b84",
        "topology.k8s.aws/network-node-layer-2": "nn-c4767083ad2a7b6c4",
        "topology.k8s.aws/network-node-layer-3": "nn-642c02050a143f5bb",
    }
    assert active.taints == (user_taint, Taint("hyperplan.dev/spare", "no", "NoSchedule"))
    assert (active.instance_type, active.availability_zone) == (GB200, AZ)
    assert spare.name == "hp-a-c2fa068a-0-2"
    assert spare.role == "spare" and spare.labels[LABEL_ROLE] == "spare"
    # the operator's spare taint replaces a user taint with the same key and effect
    assert spare.taints == (user_taint, SPARE_TAINT)
    assert SPARE_TAINT == Taint("hyperplan.dev/spare", "true", "NoSchedule")


def test_network_layers_group_nodes_top_down():
    nodes = nodes_for("a", [GroupRequest("a", 20)])
    keys = TopologyKeys()
    by_us = {n.ultraserver_id: n.labels for n in nodes}
    assert by_us[US0][keys.layer1] == by_us[US1][keys.layer1]  # same AZ spine
    assert by_us[US0][keys.layer2] == by_us[US1][keys.layer2]  # same block
    assert by_us[US0][keys.layer3] != by_us[US1][keys.layer3]  # one NVLink domain each
    assert len({n.labels[keys.layer3] for n in nodes if n.ultraserver_id == US0}) == 1
    other_block = desired_nodes("a", "plan-1", "rc-other", GB200, AZ,
                                PlacementResult("a", 1, (("rc-other-us-0", 1),)),
                                ultraservers_for_block("rc-other", X72, 18, 1))
    assert other_block[0].labels[keys.layer1] == by_us[US0][keys.layer1]
    assert other_block[0].labels[keys.layer2] != by_us[US0][keys.layer2]
    assert kueue_topology_levels() == [
        "topology.k8s.aws/network-node-layer-1", "topology.k8s.aws/network-node-layer-2",
        "topology.k8s.aws/network-node-layer-3", "kubernetes.io/hostname"]


def test_topology_keys_are_configurable():
    keys = TopologyKeys("example.com/us", "example.com/l1", "example.com/l2", "example.com/l3")
    node = nodes_for("a", [GroupRequest("a", 1)], keys=keys)[0]
    assert node.labels["example.com/us"] == US0
    assert {"example.com/l1", "example.com/l2", "example.com/l3"} <= set(node.labels)
    assert not any(k.startswith("topology.k8s.aws/") for k in node.labels)
    assert kueue_topology_levels(keys) == ["example.com/l1", "example.com/l2", "example.com/l3",
                                           "kubernetes.io/hostname"]


def test_desired_nodes_refuses_a_failed_placement():
    failed = place_groups([GroupRequest("a", 99)], two_x72())["a"]
    with pytest.raises(ValueError, match="InsufficientCapacity"):
        desired_nodes("a", "plan-1", RC, GB200, AZ, failed, two_x72())


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(("a", "rc-1", "0-0", 0), "hp-a-af7b9ce1-0-0", id="first-slot"),
        pytest.param(("a", "rc-1", "1-3", 2), "hp-a-af7b9ce1-1-3-g2", id="replacement"),
        pytest.param(("train", "rc-2", "5", 0), "hp-train-3b60ca9e-5", id="non-ultraserver"),
        pytest.param(("Team.Alpha", "rc-1", "0", 0), "hp-team-alpha-05a0-af7b9ce1-0",
                     id="uppercase-dots-hashed"),
        pytest.param(("a" * 40, "rc-1", "0-0", 1),
                     "hp-aaaaaaaaaaaaaaaaaaaaaaaaa-e33c-af7b9ce1-0-0-g1", id="long-truncated"),
    ],
)
def test_node_name_golden(args, expected):
    # Golden values: a change here renames every node after an upgrade (duplicates).
    assert node_name(*args) == expected
    assert is_dns_label(expected)


@pytest.mark.parametrize(
    "group",
    ["a", "x" * 253, "Team.Alpha", "a.b", "a-b", "-lead-", "under_score", "9" * 64],
)
def test_node_names_are_valid_dns_labels(group):
    for slot, gen in (("0-0", 0), ("17-17", 0), ("63", 12345)):
        name = node_name(group, "rc-" + "z" * 80, slot, gen)
        assert is_dns_label(name), name
        assert len(name) <= 63


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("plan-1", "plan-1", id="valid-kept"),
        pytest.param("My_Plan.v2", "My_Plan.v2", id="valid-mixed-case-kept"),
        pytest.param("p" * 63, "p" * 63, id="63-kept"),
        pytest.param("p" * 64, "p" * 54 + "-153ac90a", id="64-hashed"),
        pytest.param("a/b c", "a-b-c-0af99a60", id="invalid-chars-hashed"),
        pytest.param("-x-", "x-c6cf95e5", id="bad-ends-hashed"),
    ],
)
def test_label_value(text, expected):
    # hashed values are sha256(text)[:8]: stable, so selectors keep matching after upgrades
    assert label_value(text) == expected
    assert len(expected) <= 63 and label_value(expected) == expected


def test_long_group_and_plan_names_become_valid_label_values():
    long_group, long_plan = "g" * 100, "plan." + "p" * 100
    placement = place_groups([GroupRequest(long_group, 1)], ())[long_group]
    node = desired_nodes(long_group, long_plan, RC, GB200, AZ, placement)[0]
    assert node.labels[LABEL_GROUP] == label_value(long_group)
    assert node.labels["hyperplan.dev/training-plan"] == label_value(long_plan)
    assert len(node.labels[LABEL_GROUP]) <= 63
    assert len(node.labels["hyperplan.dev/training-plan"]) <= 63
    assert is_dns_label(node.name)


def test_node_names_distinct_for_groups_that_clean_alike():
    assert node_name("a.b", RC, "0") != node_name("a-b", RC, "0")
    assert node_name("x" * 40 + "1", RC, "0") != node_name("x" * 40 + "2", RC, "0")


def test_desired_nodes_deterministic_and_unique():
    groups = [GroupRequest("alpha", 20), GroupRequest("beta", 10)]
    first = nodes_for("alpha", groups) + nodes_for("beta", groups)
    second = nodes_for("alpha", groups) + nodes_for("beta", groups)
    assert first == second
    names = [n.name for n in first]
    assert len(set(names)) == len(names) == 20 + 2 + 10
    assert all(is_dns_label(n) for n in names)
    other_block = desired_nodes("alpha", "plan-1", "rc-next", GB200, AZ,
                                PlacementResult("alpha", 1, (("rc-next-us-0", 1),)),
                                ultraservers_for_block("rc-next", X72, 18, 1))
    assert other_block[0].name not in names


@pytest.mark.parametrize(
    ("slot", "generation", "bad"),
    [pytest.param("a-1", 0, "slot", id="bad-slot"),
     pytest.param("0-0", -1, "generation", id="negative-generation")],
)
def test_node_name_rejects_bad_input(slot, generation, bad):
    with pytest.raises(ValueError, match=bad):
        node_name("a", RC, slot, generation)


# --------------------------------------------------------------------------- slot states


def test_slot_states_from_labels_highest_generation_wins():
    labels = [
        {LABEL_SLOT: "0-1", LABEL_GENERATION: "0", LABEL_ROLE: "active",
         LABEL_HEALTH: HEALTH_PENDING_REPLACEMENT},
        {LABEL_SLOT: "0-1", LABEL_GENERATION: "1", LABEL_ROLE: "spare"},
        {LABEL_SLOT: "0-3", LABEL_GENERATION: "0", LABEL_ROLE: "active"},
        {LABEL_ROLE: "active"},  # not ours: no slot
        {LABEL_SLOT: "0-2", LABEL_GENERATION: "junk", LABEL_ROLE: "weird"},
    ]
    assert slot_states_from_labels(labels) == {
        "0-1": SlotState(1, "spare"),
        "0-3": SlotState(0, "active"),
        "0-2": SlotState(0, None),
    }


@pytest.mark.parametrize(
    ("count", "states", "expected"),
    [
        pytest.param(3, {"0-1": SlotState(1, "spare"), "0-3": SlotState(0, "active")},
                     [("hp-a-c2fa068a-0-0", "active"), ("hp-a-c2fa068a-0-1-g1", "spare"),
                      ("hp-a-c2fa068a-0-2", "active"), ("hp-a-c2fa068a-0-3", "active")],
                     id="promotion-survives-reconcile"),
        pytest.param(2, {"0-1": SlotState(1, "spare"), "0-3": SlotState(0, "active")},
                     [("hp-a-c2fa068a-0-0", "active"), ("hp-a-c2fa068a-0-1-g1", "spare"),
                      ("hp-a-c2fa068a-0-2", "active")],
                     id="scale-down-drops-highest-slot"),
        pytest.param(3, {"0-0": SlotState(0, "spare"), "0-1": SlotState(0, "spare")},
                     [("hp-a-c2fa068a-0-0", "spare"), ("hp-a-c2fa068a-0-1", "active"),
                      ("hp-a-c2fa068a-0-2", "active"), ("hp-a-c2fa068a-0-3", "active")],
                     id="over-quota-spare-becomes-active"),
    ],
)
def test_desired_nodes_honour_slot_states(count, states, expected):
    nodes = nodes_for("a", [GroupRequest("a", count)], slots=states)
    assert [(n.name, n.role) for n in nodes] == expected
    assert [n.taints for n in nodes if n.role == "spare"] == [(SPARE_TAINT,)]


def test_unhealthy_slot_keeps_its_mark_and_takes_the_leftover_role():
    # slot 0-1 failed (still present, cordoned); the spare in 0-3 was promoted.
    states = {"0-1": SlotState(0, "active", HEALTH_PENDING_REPLACEMENT),
              "0-0": SlotState(0, "active"), "0-2": SlotState(0, "active"),
              "0-3": SlotState(0, "active")}
    nodes = nodes_for("a", [GroupRequest("a", 3)], slots=states)
    assert [(n.slot, n.role, n.labels[LABEL_HEALTH]) for n in nodes] == [
        ("0-0", "active", "Schedulable"), ("0-1", "spare", HEALTH_PENDING_REPLACEMENT),
        ("0-2", "active", "Schedulable"), ("0-3", "active", "Schedulable")]
    assert nodes[1].taints == (SPARE_TAINT, UNHEALTHY_TAINT)


def test_failed_slot_yields_its_active_role_to_a_new_slot():
    # slot 0-0 failed and nothing else is known yet: the three healthy slots are active
    states = {"0-0": SlotState(0, "active", HEALTH_PENDING_REPLACEMENT)}
    nodes = nodes_for("a", [GroupRequest("a", 3)], slots=states)
    assert [(n.slot, n.role) for n in nodes] == [
        ("0-0", "spare"), ("0-1", "active"), ("0-2", "active"), ("0-3", "active")]


# --------------------------------------------------------------------------- counts


def obs(name, role="active", us=US0, healthy=True, ready=True, pending=False, group="a"):
    return ObservedNode(name, group, role, us, healthy, ready, pending)


@pytest.mark.parametrize(
    ("total", "spares", "nodes", "expected"),
    [
        pytest.param(36, 2, [obs(f"n{i}") for i in range(20)] + [obs("s0", "spare"),
                                                                  obs("s1", "spare", US1)],
                     (36, 20, 14, 2, 0), id="all-healthy"),
        pytest.param(36, 2, [obs(f"n{i}") for i in range(19)] + [obs("bad", healthy=False)]
                     + [obs("s0", "spare")], (36, 19, 14, 1, 1), id="one-active-unhealthy"),
        pytest.param(36, 2, [obs("n0"), obs("n1", healthy=None)], (36, 2, 32, 0, 0),
                     id="unknown-health-counts-in-use"),
        pytest.param(18, 1, [obs(f"n{i}") for i in range(10)] + [obs("s", "spare", healthy=False)],
                     (18, 10, 7, 0, 1), id="unhealthy-spare-counted-once"),
        pytest.param(18, 1, [obs("s", "spare", ready=False)], (18, 0, 17, 0, 0),
                     id="spare-not-ready-not-available"),
        pytest.param(18, 1, [obs("s", "spare", healthy=None)], (18, 0, 17, 0, 0),
                     id="spare-unknown-not-available"),
        pytest.param(18, 1, [obs(f"n{i}") for i in range(17)] + [obs("x", healthy=False)],
                     (18, 17, 0, 0, 1), id="never-negative"),
        pytest.param(8, 0, [obs(f"n{i}", us=None) for i in range(5)], (8, 5, 3, 0, 0),
                     id="non-ultraserver"),
        pytest.param(8, 0, [], (8, 0, 8, 0, 0), id="no-nodes"),
    ],
)
def test_plan_counts(total, spares, nodes, expected):
    c = plan_counts(total, spares, nodes)
    assert (c.total, c.in_use, c.available, c.available_spares, c.unhealthy) == expected


def test_plan_counts_status_field_names():
    c = plan_counts(18, 1, [obs("n0"), obs("s", "spare")])
    assert c.as_status() == {
        "totalInstanceCount": 18, "inUseInstanceCount": 1, "availableInstanceCount": 16,
        "availableSpareInstanceCount": 1, "unhealthyInstanceCount": 0}


@pytest.mark.parametrize(
    ("nodes_us0", "expected_status"),
    [
        pytest.param([obs("n0"), obs("s0", "spare")], "ok", id="ok"),
        pytest.param([obs("n0", healthy=False), obs("s0", "spare")], "impaired",
                     id="unhealthy-impaired"),
        pytest.param([obs("n0", pending=True)], "impaired", id="pending-replacement-impaired"),
        pytest.param([obs("n0", healthy=None), obs("s0", "spare")], "insufficient-data",
                     id="unknown-insufficient-data"),
        pytest.param([obs("n0", healthy=None), obs("s0", "spare", healthy=False)], "impaired",
                     id="impaired-beats-unknown"),
        pytest.param([obs("s0", "spare", healthy=False)], "impaired", id="unhealthy-spare"),
    ],
)
def test_ultraserver_health_status(nodes_us0, expected_status):
    reports = ultraserver_reports(two_x72(), AZ, nodes_us0 + [obs("m0", us=US1)])
    assert [r.health_status for r in reports] == [expected_status, "ok"]


def test_ultraserver_reports_counts():
    nodes = ([obs(f"a{i}") for i in range(14)] + [obs("a-bad", healthy=False), obs("as", "spare")]
             + [obs("b0", us=US1, healthy=None)])
    reports = ultraserver_reports(ultraservers_for_block(RC, X72, 54, 1), AZ, nodes)
    assert reports == [
        UltraServerReport(US0, AZ, 18, 1, 2, 14, 1, 1, "impaired"),
        UltraServerReport(US1, AZ, 18, 1, 16, 1, 0, 0, "insufficient-data"),
        UltraServerReport(US2, AZ, 18, 1, 17, 0, 0, 0, "ok"),
    ]
    assert reports[0].as_status() == {
        "id": US0, "availabilityZone": AZ, "totalInstanceCount": 18,
        "configuredSpareInstanceCount": 1, "availableInstanceCount": 2,
        "inUseInstanceCount": 14, "availableSpareInstanceCount": 1,
        "unhealthyInstanceCount": 1, "healthStatus": "impaired"}


# --------------------------------------------------------------------------- the cloud's UltraServers


@pytest.mark.parametrize("members, paired", [
    ([("us-0", "aws-a"), ("us-0", "aws-a"), ("us-1", "aws-b")], {"us-0": "aws-a", "us-1": "aws-b"}),
    ([("us-0", "aws-a"), ("us-0", "aws-b")], {}),
    ([("us-0", "aws-a"), ("us-0", None)], {}),
    ([("us-0", "aws-a"), ("us-1", "aws-a"), ("us-2", "aws-c")], {"us-2": "aws-c"}),
    ([("us-0", "aws-a"), ("us-1", "aws-a"), ("us-1", "aws-b")], {}),
    ([("us-0", None), (None, "aws-a")], {}),
    ([], {}),
], ids=["each-from-one-of-its-own", "mixed-pairs-nothing", "a-node-of-unknown-membership-pairs-nothing",
        "one-cloud-ultraserver-behind-two-pairs-neither", "a-mixed-one-still-claims-its-clouds",
        "nodes-without-ids", "no-nodes"])
def test_cloud_ultraservers_pair_by_membership_never_by_guess(members, paired):
    from hyperplan.planning.placement import cloud_ultraservers
    assert cloud_ultraservers(members) == paired
