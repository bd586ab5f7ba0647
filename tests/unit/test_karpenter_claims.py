"""A karpenter group's NodeClaims (actuation.providers.karpenter, planning.ownership.bind_claims): the claim
the operator makes for a slot, and how a claim is tied to its Node, from what only the operator
and Karpenter write (the record's claim uid, the claim's status), never from a Node's labels."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

from hyperplan.actuation.providers.karpenter import DO_NOT_DISRUPT, claim_name, listed_claim, nodeclaim_body
from hyperplan.api.models import GroupNode, NodeClaimRef
from hyperplan.api.vocabulary import ANNOTATION_CLAIM, LABEL_NODE_ID
from hyperplan.planning import naming, ownership
from hyperplan.planning.ownership import ListedClaim, ListedNode
from hyperplan.planning.placement import NodeSpec

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
TIMEOUT = timedelta(seconds=60)
NONCE = "ab12cd" + "0" * 26


def claim(name: str = "g-0-ab12cd", uid: str = "claim-uid", *, node: str = "", pid: str = "",
          node_id: str = "g-0", age: float = 5, nonce: str | None = None, deleting: bool = False) -> ListedClaim:
    return ListedClaim(name=name, uid=uid, annotations={ANNOTATION_CLAIM: nonce} if nonce else {},
                       node_id=node_id, created=NOW - timedelta(seconds=age), provider_id=pid, node_name=node,
                       deleting=deleting)


def node(name: str = "kwok-g-0-ab12cd-x1", uid: str = "node-uid", pid: str = "kwok://kwok-g-0-ab12cd-x1",
         **labels: str) -> ListedNode:
    return ListedNode(name, uid, {naming.LABEL_GROUP: "g", **labels}, {}, pid)


WAITING = GroupNode(name="g-0", uid="", node_id="g-0", node_claim=NodeClaimRef(name="g-0-ab12cd", uid="claim-uid"))
PENDING = ownership.pending_entry("g-0", NONCE)
PID = "kwok://kwok-g-0-ab12cd-x1"


@pytest.mark.parametrize("entry, claims, nodes, bound, launching, expired, gone", [
    pytest.param(WAITING, [claim(node="kwok-g-0-ab12cd-x1", pid=PID)], [node()], ("kwok-g-0-ab12cd-x1", "node-uid"),
                 0, 0, 0, id="registered-node-with-the-claims-provider-id-is-bound"),
    pytest.param(WAITING, [claim(pid=PID)], [node()], None, 1, 0, 0,
                 id="no-node-name-in-the-claims-status-yet-launching"),
    pytest.param(WAITING, [claim(node="kwok-g-0-ab12cd-x1", pid=PID)], [node(pid="kwok://someone-else")], None, 1, 0, 0,
                 id="a-node-of-that-name-with-another-provider-id-is-not-the-claims"),
    pytest.param(WAITING, [claim()], [node(name="forged", **{LABEL_NODE_ID: "g-0"})], None, 1, 0, 0,
                 id="a-node-labelled-with-the-slot-is-not-bound"),
    pytest.param(WAITING, [claim(age=61, pid=PID)], [], None, 0, 1, 0, id="no-node-past-the-launch-timeout-expired"),
    pytest.param(WAITING, [claim(deleting=True)], [], None, 0, 0, 1,
                 id="a-claim-deleted-by-karpenter-before-its-node-is-gone"),
    pytest.param(WAITING, [], [node()], None, 0, 0, 1, id="claim-gone"),
    pytest.param(WAITING, [claim(uid="another-uid")], [], None, 0, 0, 1, id="a-claim-of-that-name-with-another-uid-is-gone"),
    pytest.param(PENDING, [claim(nonce=NONCE)], [], None, 1, 0, 0,
                 id="a-pending-entry-holds-the-claim-with-its-nonce"),
    pytest.param(PENDING, [claim(nonce=NONCE, node="kwok-g-0-ab12cd-x1", pid=PID)], [node()],
                 ("kwok-g-0-ab12cd-x1", "node-uid"), 0, 0, 0, id="a-pending-entry-whose-claim-registered-is-bound"),
    pytest.param(PENDING, [claim(nonce=NONCE, node_id="g-9")], [], None, 0, 0, 0,
                 id="the-nonce-on-a-claim-of-another-slot-holds-nothing"),
    pytest.param(PENDING, [claim(nonce=NONCE), claim(name="copy", uid="u2", nonce=NONCE)], [], None, 0, 0, 0,
                 id="a-nonce-two-claims-carry-holds-neither"),
    pytest.param(PENDING, [claim(nonce="f" * 32)], [], None, 0, 0, 0, id="another-nonce-holds-nothing"),
])
def test_bind_claims(entry, claims, nodes, bound, launching, expired, gone):
    b = ownership.bind_claims([entry], claims, nodes, NOW, TIMEOUT)
    assert (len(b.launching), len(b.expired), len(b.gone)) == (launching, expired, gone)
    held = [e for e in b.record if e.uid]
    assert [(e.name, e.uid) for e in held] == ([bound] if bound else [])
    if bound:
        assert held[0].node_id == "g-0" and held[0].node_claim is not None and held[0].claim is None


def test_a_bound_node_is_held_by_sort_nodes_and_a_forged_one_is_unrecorded():
    b = ownership.bind_claims([WAITING], [claim(node="kwok-g-0-ab12cd-x1", pid=PID)],
                              [node(), node(name="forged", uid="f", pid=PID, **{LABEL_NODE_ID: "g-0"})], NOW, TIMEOUT)
    found = ownership.sort_nodes(b.record, [node(), node(name="forged", uid="f", pid=PID)], "karpenter")
    assert [n.name for n, _ in found.held] == ["kwok-g-0-ab12cd-x1"]
    assert [n.name for n in found.unrecorded] == ["forged"]


def test_a_node_on_its_way_to_a_launching_claim_is_neither_held_nor_a_stray():
    arriving = node(name="kwok-g-0-ab12cd-x1")  # made by the provider; the claim's nodeName not written yet
    b = ownership.bind_claims([WAITING], [claim(pid=PID)], [arriving], NOW, TIMEOUT)
    assert len(b.launching) == 1 and b.arriving == {PID}
    found = ownership.sort_nodes(b.record, b.not_arriving([arriving, node(name="other", uid="o", pid="kwok://o")]),
                                 "karpenter")
    assert found.held == () and [n.name for n in found.unrecorded] == ["other"]


def test_a_deleting_node_outside_the_record_is_no_stray():
    going = ListedNode("kwok-old", "u", {naming.LABEL_GROUP: "g"}, {}, "kwok://kwok-old", deleting=True)
    assert ownership.sort_nodes([], [going], "karpenter").unrecorded == ()


def test_launching_entries_stay_in_the_record_and_the_deadline_is_the_first_timeout():
    other = GroupNode(name="g-1", uid="", node_id="g-1", node_claim=NodeClaimRef(name="g-1-ffffff", uid="u1"))
    claims = [claim(age=10), claim(name="g-1-ffffff", uid="u1", node_id="g-1", age=30)]
    b = ownership.bind_claims([WAITING, other], claims, [], NOW, TIMEOUT)
    assert b.launch_deadline(TIMEOUT, claims) == NOW + timedelta(seconds=30)
    found = ownership.sort_nodes(b.record, [], "karpenter")
    assert [e.node_id for e in ownership.next_record(found, launching=b.launching)] == ["g-0", "g-1"]


@pytest.mark.parametrize("record, needed", [
    pytest.param([], False, id="empty"),
    pytest.param([GroupNode(name="n", uid="u", node_id="n")], False, id="a-bound-node"),
    pytest.param([WAITING], True, id="a-claim-waiting-for-its-node"),
    pytest.param([PENDING], True, id="a-pending-create"),
])
def test_claims_are_listed_only_while_the_record_waits_on_one(record, needed):
    assert ownership.needs_claims(record) is needed


SPEC = NodeSpec(name="hp-g-us1-0", labels={naming.LABEL_GROUP: "g", naming.LABEL_ROLE: "spare",
                                           "node.kubernetes.io/instance-type": "ml.p6e-gb200.36xlarge",
                                           "topology.kubernetes.io/zone": "us-east-1c", "team": "a",
                                           "kubernetes.io/hostname": "hp-g-us1-0"},
                taints=(naming.SPARE_TAINT,), role="spare", ultraserver_id="us1",
                instance_type="ml.p6e-gb200.36xlarge", availability_zone="us-east-1c")


def test_the_nodeclaim_asks_for_the_slot_and_keeps_karpenters_disruption_off():
    body = nodeclaim_body(SPEC, NONCE, "karpenter.kwok.sh/KWOKNodeClass/default", "reserved")
    meta, spec = body["metadata"], body["spec"]
    assert (body["apiVersion"], body["kind"]) == ("karpenter.sh/v1", "NodeClaim")
    assert meta["name"] == claim_name(SPEC.name, NONCE) == "hp-g-us1-0-ab12cd"
    assert meta["labels"][LABEL_NODE_ID] == SPEC.name and meta["labels"]["team"] == "a"
    assert "karpenter.sh/nodepool" not in meta["labels"]  # no NodePool: consolidation, drift, repair pass it by
    assert "node.kubernetes.io/instance-type" not in meta["labels"]  # the requirement says it
    assert "kubernetes.io/hostname" not in meta["labels"]  # a Node's hostname is its own
    # the node class's label, as Karpenter's own claims carry it (no hydration patch racing the launch)
    assert meta["labels"]["karpenter.kwok.sh/kwoknodeclass"] == "default"
    assert nodeclaim_body(SPEC, NONCE, "karpenter.k8s.aws/EC2NodeClass/gpu", "reserved")["metadata"]["labels"][
        "karpenter.k8s.aws/ec2nodeclass"] == "gpu"
    assert meta["annotations"] == {DO_NOT_DISRUPT: "true", ANNOTATION_CLAIM: NONCE}
    assert spec["expireAfter"] == "Never"
    assert spec["nodeClassRef"] == {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"}
    assert {r["key"]: r["values"] for r in spec["requirements"]} == {
        "node.kubernetes.io/instance-type": ["ml.p6e-gb200.36xlarge"], "topology.kubernetes.io/zone": ["us-east-1c"],
        "karpenter.sh/capacity-type": ["reserved"]}
    assert spec["taints"] == [{"key": naming.SPARE_TAINT.key, "value": naming.SPARE_TAINT.value,
                               "effect": naming.SPARE_TAINT.effect}]


@pytest.mark.parametrize("block, label, required", [
    ("cr-0123456789abcdef0", "karpenter.k8s.aws/capacity-reservation-id", ["cr-0123456789abcdef0"]),
    ("cr-0123456789abcdef0", "", None),  # the provider names no reservations (kwok): not asked
    ("rc-4f2a", "karpenter.k8s.aws/capacity-reservation-id", None),  # a hyperplan block: no EC2 reservation
    ("", "karpenter.k8s.aws/capacity-reservation-id", None),
], ids=["ec2-block-on-aws", "no-reservation-label", "hyperplan-block", "no-block"])
def test_a_slot_of_an_ec2_capacity_block_requires_its_reservation(block, label, required):
    labels = {**SPEC.labels, **({naming.LABEL_RESERVED_CAPACITY: block} if block else {})}
    spec = dataclasses.replace(SPEC, labels=labels)
    body = nodeclaim_body(spec, NONCE, "karpenter.k8s.aws/EC2NodeClass/gpu", "reserved", label)
    found = {r["key"]: r["values"] for r in body["spec"]["requirements"]}
    assert found.get("karpenter.k8s.aws/capacity-reservation-id") == required
    assert found["karpenter.sh/capacity-type"] == ["reserved"]


def test_a_listed_claim_reads_karpenters_status():
    seen = listed_claim({"metadata": {"name": "c", "uid": "u", "creationTimestamp": "2026-12-02T12:00:00Z",
                                      "labels": {LABEL_NODE_ID: "g-0"}, "deletionTimestamp": "2026-12-02T12:01:00Z"},
                         "status": {"providerID": "kwok://n", "nodeName": "n"}})
    assert (seen.name, seen.uid, seen.node_id, seen.provider_id, seen.node_name, seen.deleting) == (
        "c", "u", "g-0", "kwok://n", "n", True)
    assert seen.created == NOW
    assert listed_claim({"metadata": {"name": "c", "uid": "u", "creationTimestamp": "not a time"}}).created is None


def test_a_node_made_before_its_claim_has_a_provider_id_is_not_reported_in_that_moment():
    early = node(name="kwok-g-0-ab12cd-x1", **{LABEL_NODE_ID: "g-0"})
    b = ownership.bind_claims([WAITING], [claim()], [early], NOW, TIMEOUT)  # no providerID in the claim yet
    assert b.unlaunched == {"g-0"} and b.not_arriving([early]) == []
    assert b.not_arriving([node(name="stray", uid="s", pid="kwok://s", **{LABEL_NODE_ID: "g-7"})]) != []
