"""Nodes of training-job plans: per workload, in the usable block's AZ, kept warm, drained."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from hyperplan.planning import naming
from hyperplan.planning import trainingjobs

UTC = timezone.utc
NOW = datetime(2027, 1, 3, 12, 0, tzinfo=UTC)
PLAIN = trainingjobs.JobBlock("rc-b", "us-east-1b", "ml.p5.48xlarge", 4, NOW + timedelta(hours=23), NOW + timedelta(hours=23, minutes=30))
ULTRA = trainingjobs.JobBlock("rc-u", "us-west-2b", "ml.p6e-gb200.36xlarge", 36, NOW + timedelta(hours=5),
                    NOW + timedelta(hours=5, minutes=30), "ml.u-p6e-gb200x72", 1)


def node(block: trainingjobs.JobBlock, slot: str, workload: str = "", until: datetime | None = None) -> trainingjobs.JobNode:
    return trainingjobs.JobNode(naming.node_name("llama", block.id, slot), block.id, slot, workload, until)


def names(specs) -> list[str]:
    return [s.name for s in specs]


def test_new_workload_gets_nodes_in_the_blocks_az_with_its_label() -> None:
    d = trainingjobs.decide_job_nodes("llama", PLAIN, [trainingjobs.Holder("team.a", 2)], [], None, NOW)
    assert [s.slot for s in d.create] == ["0", "1"]
    for spec in d.create:
        assert spec.availability_zone == "us-east-1b"
        assert spec.labels[naming.LABEL_ZONE] == "us-east-1b"
        assert spec.labels[trainingjobs.LABEL_WORKLOAD] == "team.a"
        assert spec.labels[naming.LABEL_PLAN] == "llama"
        assert spec.labels[naming.LABEL_RESERVED_CAPACITY] == "rc-b"
        assert spec.labels[naming.LABEL_HOSTNAME] == spec.name
        assert naming.LABEL_GROUP not in spec.labels  # not an instance group's node
    assert d.wake_at == PLAIN.termination_time
    assert not (d.release or d.drain or d.assign)


def test_nodes_of_a_running_workload_are_kept_and_a_second_takes_free_slots() -> None:
    existing = [node(PLAIN, "0", "team.a"), node(PLAIN, "1", "team.a")]
    d = trainingjobs.decide_job_nodes("llama", PLAIN, [trainingjobs.Holder("team.a", 2), trainingjobs.Holder("team.b", 2)], existing, None, NOW)
    assert [s.slot for s in d.create] == ["2", "3"]
    assert {s.labels[trainingjobs.LABEL_WORKLOAD] for s in d.create} == {"team.b"}
    assert not d.release


@pytest.mark.parametrize("keep_alive, released, warm", [
    (None, ["0", "1"], []),
    (timedelta(0), ["0", "1"], []),
    (timedelta(minutes=10), [], ["0", "1"]),
], ids=["no-keep-alive", "zero-keep-alive", "keep-alive"])
def test_finished_workload_releases_or_keeps_warm(keep_alive, released, warm) -> None:
    existing = [node(PLAIN, "0", "team.a"), node(PLAIN, "1", "team.a")]
    d = trainingjobs.decide_job_nodes("llama", PLAIN, [], existing, keep_alive, NOW)
    assert sorted(n.rsplit("-", 1)[1] for n, _ in d.release) == released
    assert sorted(n.rsplit("-", 1)[1] for n, _, _ in d.keep_warm) == warm
    for _, until, previous in d.keep_warm:
        assert until == NOW + keep_alive and previous == "team.a"
    if warm:
        assert d.wake_at == NOW + keep_alive


def test_second_workload_reuses_warm_nodes_before_creating() -> None:
    until = NOW + timedelta(minutes=5)
    existing = [node(PLAIN, "0", "", until), node(PLAIN, "1", "", until)]
    d = trainingjobs.decide_job_nodes("llama", PLAIN, [trainingjobs.Holder("team.b", 3)], existing, timedelta(minutes=10), NOW)
    assert sorted(w for _, w in d.assign) == ["team.b", "team.b"]
    assert sorted(n for n, _ in d.assign) == sorted(n.name for n in existing)
    assert [s.slot for s in d.create] == ["2"]


def test_warm_nodes_go_when_their_keep_alive_ends() -> None:
    existing = [node(PLAIN, "0", "", NOW - timedelta(seconds=1)), node(PLAIN, "1", "", NOW + timedelta(minutes=1))]
    d = trainingjobs.decide_job_nodes("llama", PLAIN, [], existing, timedelta(minutes=10), NOW)
    assert [n for n, _ in d.release] == [existing[0].name]
    assert d.wake_at == NOW + timedelta(minutes=1)


def test_block_past_termination_drains_until_its_end() -> None:
    existing = [node(PLAIN, "0", "team.a")]
    later = PLAIN.termination_time + timedelta(seconds=1)
    d = trainingjobs.decide_job_nodes("llama", PLAIN, [trainingjobs.Holder("team.a", 1)], existing, None, later)
    assert [(x.node, x.deadline) for x in d.drain] == [(existing[0].name, PLAIN.end)]
    assert "termination time" in d.drain[0].reason
    assert not d.create and d.wake_at == PLAIN.end


def test_nodes_of_another_block_drain_now_and_the_workload_moves_to_the_active_block() -> None:
    other = trainingjobs.JobBlock("rc-a", "us-east-1a", "ml.p5.48xlarge", 4, NOW - timedelta(hours=20), NOW - timedelta(hours=19))
    existing = [node(other, "0", "team.a")]
    d = trainingjobs.decide_job_nodes("llama", PLAIN, [trainingjobs.Holder("team.a", 1)], existing, None, NOW)
    assert [(x.node, x.deadline) for x in d.drain] == [(existing[0].name, NOW)]
    assert [s.availability_zone for s in d.create] == ["us-east-1b"]


def test_no_active_block_drains_everything() -> None:
    existing = [node(PLAIN, "0", "team.a")]
    d = trainingjobs.decide_job_nodes("llama", None, [trainingjobs.Holder("team.a", 1)], existing, None, NOW)
    assert [x.node for x in d.drain] == [existing[0].name] and not d.create


def test_short_of_slots_is_reported() -> None:
    d = trainingjobs.decide_job_nodes("llama", PLAIN, [trainingjobs.Holder("team.a", 3), trainingjobs.Holder("team.b", 3)], [], None, NOW)
    assert len(d.create) == 4 and d.short == {"team.b": 2}


def test_ultraserver_jobs_share_one_nvlink_domain_and_skip_spares() -> None:
    d = trainingjobs.decide_job_nodes("llama", ULTRA, [trainingjobs.Holder("team.a", 4), trainingjobs.Holder("team.b", 4)], [], None, NOW)
    us = {s.labels["topology.k8s.aws/ultraserver-id"] for s in d.create}
    assert us == {naming.ultraserver_id("rc-u", 0)}, "both fit on the first UltraServer"
    assert sorted(s.slot for s in d.create) == [f"0-{j}" for j in range(8)]
    for s in d.create:
        assert s.labels["topology.k8s.aws/network-node-layer-3"] == naming.network_node_id("layer-3", naming.ultraserver_id("rc-u", 0))


def test_ultraserver_job_takes_the_best_fitting_domain() -> None:
    # UltraServer 0 has 15 of its 17 usable slots taken: a 4-instance job goes to UltraServer 1,
    # a 2-instance job fills UltraServer 0.
    existing = [node(ULTRA, f"0-{j}", "team.x") for j in range(15)]
    holders = [trainingjobs.Holder("team.x", 15), trainingjobs.Holder("team.a", 4), trainingjobs.Holder("team.b", 2)]
    d = trainingjobs.decide_job_nodes("llama", ULTRA, holders, existing, None, NOW)
    by = {}
    for s in d.create:
        by.setdefault(s.labels[trainingjobs.LABEL_WORKLOAD], set()).add(s.slot.split("-")[0])
    assert by == {"team.a": {"1"}, "team.b": {"0"}}


def test_ultraserver_job_larger_than_a_domain_uses_the_fewest() -> None:
    d = trainingjobs.decide_job_nodes("llama", ULTRA, [trainingjobs.Holder("team.a", 20)], [], None, NOW)
    per = {}
    for s in d.create:
        per[s.slot.split("-")[0]] = per.get(s.slot.split("-")[0], 0) + 1
    assert per == {"0": 17, "1": 3}


def test_node_names_are_stable() -> None:
    a = trainingjobs.decide_job_nodes("llama", PLAIN, [trainingjobs.Holder("team.a", 2)], [], None, NOW)
    b = trainingjobs.decide_job_nodes("llama", PLAIN, [trainingjobs.Holder("team.a", 2)], [], None, NOW + timedelta(seconds=5))
    assert names(a.create) == names(b.create)


def test_job_nodes_from_labels_reads_keep_alive() -> None:
    labels = {naming.LABEL_RESERVED_CAPACITY: "rc-b", naming.LABEL_SLOT: "2", trainingjobs.LABEL_WORKLOAD: ""}
    got = trainingjobs.job_nodes_from_labels([("n", labels, {trainingjobs.ANNOTATION_KEEP_ALIVE_UNTIL: "2027-01-03T12:05:00Z"}, False, False),
                                    ("m", labels, {trainingjobs.ANNOTATION_KEEP_ALIVE_UNTIL: "soon"}, True, True)])
    assert got[0].keep_alive_until == NOW + timedelta(minutes=5) and got[0].slot == "2"
    assert got[1].keep_alive_until is None and got[1].cordoned and got[1].signalled and not got[0].signalled


LEAD = timedelta(minutes=10)


@pytest.mark.parametrize("before_termination, signalled, expected, wake", [
    (timedelta(minutes=11), False, [], timedelta(minutes=1)),
    (timedelta(minutes=10), False, ["0", "1"], None),
    (timedelta(minutes=3), True, ["1"], None),
    (timedelta(seconds=-5), False, ["0", "1"], None),
], ids=["before-the-lead", "at-the-lead", "one-already-signalled", "operator-was-down-through-the-lead"])
def test_checkpoint_signal_at_the_lead_before_termination(before_termination, signalled, expected, wake) -> None:
    now = PLAIN.termination_time - before_termination
    existing = [trainingjobs.JobNode(node(PLAIN, "0", "team.a").name, "rc-b", "0", "team.a", signalled=signalled),
                node(PLAIN, "1", "team.a")]
    d = trainingjobs.decide_job_nodes("llama", PLAIN, [trainingjobs.Holder("team.a", 2)], existing, None, now, checkpoint_lead=LEAD)
    assert [n.rsplit("-", 1)[1] for n in d.checkpoint] == expected
    if wake is not None:
        assert d.wake_at == now + wake
    if before_termination > timedelta(0):
        assert not d.drain, "the drain waits for the termination time"
    else:
        assert len(d.drain) == 2


@pytest.mark.parametrize("on_nodes, known, running, expected", [
    (["team.a", "team.a"], set(), {"team.a"}, [("team.a", 2)]),
    (["team.a", "team.a"], {"team.a"}, {"team.a"}, []),
    (["team.a", "team.b", ""], set(), {"team.b"}, [("team.b", 1)]),
    (["team.a"], set(), set(), []),
], ids=["check-gone-still-running", "decided-by-a-check", "idle-and-finished-skipped", "not-running"])
def test_still_running_holders_keep_the_nodes_they_have(on_nodes, known, running, expected) -> None:
    nodes = [trainingjobs.JobNode(f"n{i}", "rc-b", str(i), w) for i, w in enumerate(on_nodes)]
    assert [(h.workload, h.instances) for h in trainingjobs.still_running_holders(nodes, known, running)] == expected
