"""Which nodes a group holds, from the operator's own record (planning.ownership, pure): a label or
an annotation on a node proves nothing; name and uid in the group's status do."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from hyperplan.api.models import GroupNode, LentState
from hyperplan.api.vocabulary import ANNOTATION_CLAIM, ANNOTATION_CORDONED, ANNOTATION_LENT, LABEL_NODE_ID, LABEL_POOL, POOL_HELD
from hyperplan.planning import naming
from hyperplan.planning import ownership
from hyperplan.planning.ownership import ListedNode

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
KWOK = {ownership.KWOK_ANNOTATION: "fake"}


def listed(name: str, uid: str | None = None, annotations: dict | None = None, **labels: str) -> ListedNode:
    return ListedNode(name, uid or f"uid-{name}", {naming.LABEL_GROUP: "g", **labels}, annotations or {})


def entry(name: str, uid: str | None = None, node_id: str | None = None) -> GroupNode:
    return GroupNode(name=name, uid=uid or f"uid-{name}", node_id=node_id or name)


RECORD = [entry("hp-g-a"), entry("hp-g-b")]


@pytest.mark.parametrize("record, nodes, provider, migrating, held, unrecorded", [
    pytest.param(RECORD, [listed("hp-g-a"), listed("hp-g-b")], "kwok", False, ["hp-g-a", "hp-g-b"], [],
                 id="recorded-nodes-are-held"),
    pytest.param(RECORD, [listed("hp-g-a"), listed("forged", annotations=KWOK, **{LABEL_NODE_ID: "hp-g-b"})], "kwok",
                 False, ["hp-g-a"], ["forged"], id="forged-node-id-names-a-bystander"),
    pytest.param(RECORD, [listed("hp-g-a"), listed("stranger")], "kwok", False, ["hp-g-a"], ["stranger"],
                 id="forged-group-label"),
    pytest.param(RECORD, [listed("hp-g-a", uid="uid-other"), listed("hp-g-b")], "kwok", False, ["hp-g-b"], ["hp-g-a"],
                 id="uid-mismatch-same-name"),
    pytest.param([], [listed("hp-g-a", annotations=KWOK)], "kwok", True, [], ["hp-g-a"],
                 id="an-empty-record-is-a-record"),
    pytest.param(None, [listed("hp-g-a", annotations=KWOK)], "kwok", False, [], ["hp-g-a"],
                 id="a-new-group-records-from-nothing"),
    pytest.param(None, [listed("hp-g-a", annotations=KWOK), listed("hp-g-b", annotations=KWOK,
                                                                   **{LABEL_NODE_ID: "hp-g-b"})],
                 "kwok", True, ["hp-g-a", "hp-g-b"], [], id="migration-records-the-providers-kwok-nodes"),
    pytest.param(None, [listed("forged", annotations=KWOK, **{LABEL_NODE_ID: "hp-g-b"}), listed("plain")],
                 "kwok", True, [], ["forged", "plain"], id="migration-skips-a-node-id-not-its-name-and-non-kwok"),
    pytest.param(None, [listed("w1", **{LABEL_POOL: POOL_HELD, LABEL_NODE_ID: "hp-g-a"}),
                        listed("w2", **{LABEL_NODE_ID: "hp-g-b"})],
                 "static", True, ["w1"], ["w2"], id="migration-records-held-static-nodes"),
    pytest.param(None, [listed("w1", **{LABEL_POOL: POOL_HELD, LABEL_NODE_ID: "hp-g-a"}),
                        listed("w2", **{LABEL_POOL: POOL_HELD, LABEL_NODE_ID: "hp-g-a"})],
                 "static", True, ["w1"], ["w2"], id="migration-takes-each-node-id-once"),
])
def test_sort_nodes(record, nodes, provider, migrating, held, unrecorded):
    found = ownership.sort_nodes(record, nodes, provider, migrating)
    assert [node.name for node, _ in found.held] == held
    assert [node.name for node in found.unrecorded] == unrecorded


def test_a_held_node_is_named_by_the_record_not_its_label():
    """A static node adopted as hp-g-a stays hp-g-a whatever node-id label it later carries."""
    found = ownership.sort_nodes([entry("w1", node_id="hp-g-a")], [listed("w1", **{LABEL_NODE_ID: "hp-g-z"})], "static")
    [(node, record)] = found.held
    assert (node.name, record.node_id) == ("w1", "hp-g-a")


def test_static_migration_reads_the_old_annotation_once_and_only_what_a_hand_back_may_write():
    lent = json.dumps({"labels": {"team": "infra", "node-role.kubernetes.io/control-plane": "",
                                  naming.LABEL_GROUP: "other"}, "taintKeys": [], "taints": []})
    node = listed("w1", annotations={ANNOTATION_LENT: lent, ANNOTATION_CORDONED: "true"},
                  **{LABEL_POOL: POOL_HELD, LABEL_NODE_ID: "hp-g-a"})
    made = ownership.migrated_entry(node, "static")
    assert made.lent == LentState(labels={"team": "infra"})
    assert made.cordoned is True


@pytest.mark.parametrize("fresh, made, released, want", [
    pytest.param(True, [], set(), ["hp-g-a"], id="a-recorded-node-gone-from-a-fresh-list-is-dropped"),
    pytest.param(False, [], set(), ["hp-g-a", "hp-g-b"], id="kept-while-the-cache-may-lag"),
    pytest.param(True, [entry("hp-g-c")], set(), ["hp-g-a", "hp-g-c"], id="a-node-made-now-is-recorded"),
    pytest.param(False, [], {"hp-g-a", "hp-g-b"}, [], id="released-nodes-leave-the-record"),
])
def test_next_record(fresh, made, released, want):
    found = ownership.sort_nodes(RECORD, [listed("hp-g-a")], "kwok")
    record = ownership.next_record(found, made, released=released, listed_fresh=fresh)
    assert [e.node_id for e in record] == want


def test_next_record_keeps_what_the_pass_changed():
    found = ownership.sort_nodes(RECORD, [listed("hp-g-a"), listed("hp-g-b")], "kwok")
    changed = {"hp-g-a": entry("hp-g-a").model_copy(update={"cordoned": True})}
    record = ownership.next_record(found, changed=changed)
    assert [(e.node_id, e.cordoned) for e in record] == [("hp-g-a", True), ("hp-g-b", False)]


def test_the_condition_names_the_unrecorded_nodes_and_goes_when_there_are_none():
    many = [listed(f"n{i:02}") for i in range(25)]
    cond = ownership.unrecorded_condition(many, "g", 3, [], NOW)
    assert (cond.type, cond.status, cond.reason, cond.observed_generation) == (
        "UnrecordedNodes", "True", "NodeNotOwned", 3)
    assert "25 node(s)" in cond.message and "n00" in cond.message and "and 5 more" in cond.message
    assert ownership.unrecorded_condition([], "g", 3, [cond], NOW) is None


NONCE, OTHER_NONCE = "n" * 32, "m" * 32
CLAIMED = {ANNOTATION_CLAIM: NONCE}


@pytest.mark.parametrize("provider, pending_id, nodes, held, unrecorded", [
    pytest.param("kwok", "hp-g-c", [listed("hp-g-c", annotations={**KWOK, **CLAIMED})], ["hp-g-c"], [],
                 id="kwok-node-made-before-the-crash-is-held-by-its-claim"),
    pytest.param("static", "hp-g-c", [listed("w7", annotations=CLAIMED)], ["w7"], [],
                 id="static-node-adopted-before-the-crash-is-held-by-its-claim"),
    pytest.param("kwok", "hp-g-c", [listed("hp-g-x", annotations={**KWOK, **CLAIMED})], [], ["hp-g-x"],
                 id="kwok-claim-on-another-name-holds-nothing"),
    pytest.param("kwok", "hp-g-c", [listed("hp-g-c", annotations={**KWOK, ANNOTATION_CLAIM: OTHER_NONCE})], [],
                 ["hp-g-c"], id="a-made-up-nonce-holds-nothing"),
    pytest.param("static", "hp-g-c", [listed("w7", annotations=CLAIMED), listed("w8", annotations=CLAIMED)], [],
                 ["w7", "w8"], id="a-nonce-copied-to-a-second-node-holds-neither"),
    pytest.param("kwok", "hp-g-c", [listed("hp-g-c", annotations=KWOK)], [], ["hp-g-c"],
                 id="the-right-name-without-the-nonce-holds-nothing"),
])
def test_a_pending_claim_holds_the_one_node_that_answers_it(provider, pending_id, nodes, held, unrecorded):
    record = [*RECORD, ownership.pending_entry(pending_id, NONCE)]
    found = ownership.sort_nodes(record, [listed("hp-g-a"), listed("hp-g-b"), *nodes], provider)
    assert [node.name for node, _ in found.held] == ["hp-g-a", "hp-g-b", *held]
    assert [node.name for node in found.unrecorded] == unrecorded
    for node, kept in found.held:
        if node.name in held:  # recorded now as any other: its name and uid, no claim
            assert (kept.name, kept.uid, kept.node_id, kept.claim) == (node.name, node.uid, pending_id, None)


def test_the_record_holds_the_digest_not_the_nonce():
    pending = ownership.pending_entry("hp-g-c", NONCE)
    assert pending.claim != NONCE and pending.claim == ownership.claim_digest(NONCE) and pending.uid == ""


@pytest.mark.parametrize("fresh, kept", [
    pytest.param(False, ["hp-g-a", "hp-g-b", "hp-g-c"], id="unanswered-claim-kept-while-the-list-may-lag"),
    pytest.param(True, ["hp-g-a", "hp-g-b"], id="unanswered-claim-dropped-when-the-api-server-listed"),
])
def test_an_unanswered_claim(fresh, kept):
    found = ownership.sort_nodes([*RECORD, ownership.pending_entry("hp-g-c", NONCE)],
                                 [listed("hp-g-a"), listed("hp-g-b")], "kwok")
    assert [e.node_id for e in ownership.next_record(found, listed_fresh=fresh)] == kept


def test_a_pass_is_applied_to_the_record_another_writer_left():
    now = [entry("hp-g-a").model_copy(update={"cordoned": True}), entry("hp-g-b"), entry("hp-g-c")]
    out = ownership.apply_pass(now, made=[entry("hp-g-d")], changed={"hp-g-b": entry("hp-g-b", uid="uid-b2")},
                               released=["hp-g-c"])
    assert [(e.node_id, e.uid, e.cordoned) for e in out] == [
        ("hp-g-a", "uid-hp-g-a", True), ("hp-g-b", "uid-b2", False), ("hp-g-d", "uid-hp-g-d", False)]
