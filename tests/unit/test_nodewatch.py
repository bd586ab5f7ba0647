"""The operator's node watch (runtime.nodewatch): what a node event hands on, what the store
holds under which key, and how the stream resumes and lists again."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from hyperplan.api.vocabulary import LABEL_POOL
from hyperplan.runtime.nodewatch import (
    ADDED, DELETED, MODIFIED, Expired, NodeChange, NodeStore, NodeWatch, _lines,
)

GROUP, RC, WORKLOAD, PLAN = ("hyperplan.dev/instance-group", "hyperplan.dev/reserved-capacity",
                             "hyperplan.dev/workload", "hyperplan.dev/training-plan")
POOL = LABEL_POOL


def node(name: str = "n1", rv: str = "1", ready: str = "True", heartbeat: str = "2026-01-01T00:00:00Z",
         **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv,
                         "labels": labels or {GROUP: "g1", RC: "rc-1"}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": heartbeat,
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}


def relabelled(labels: dict[str, str]) -> dict[str, Any]:
    n = node(rv="2")
    n["metadata"]["labels"] = labels
    return n


@pytest.mark.parametrize("event, expect_type, group_nodes", [
    ((MODIFIED, node(rv="2", heartbeat="2026-01-01T00:00:40Z")), None, ["n1"]),
    ((MODIFIED, node(rv="2", ready="False")), MODIFIED, ["n1"]),
    ((MODIFIED, relabelled({GROUP: "g1", RC: "rc-1", "hyperplan.dev/node-health-status": "Unschedulable"})),
     MODIFIED, ["n1"]),
    ((MODIFIED, relabelled({POOL: "free"})), MODIFIED, []),
    ((MODIFIED, relabelled({"other": "x"})), MODIFIED, []),
    ((DELETED, node(rv="3")), DELETED, []),
    ((ADDED, node("n2", **{GROUP: "g1"})), ADDED, ["n1", "n2"]),
    ((ADDED, node("untracked", **{"kubernetes.io/hostname": "x"})), None, ["n1"]),
    ((DELETED, node("untracked", **{"kubernetes.io/hostname": "x"})), None, ["n1"]),
], ids=["heartbeat-hands-on-nothing", "not-ready", "health-label", "handed-back-to-the-free-pool",
        "lost-our-labels", "deleted", "new-node", "untracked-node", "untracked-deleted"])
def test_an_event_is_handed_on_only_when_it_changes_what_the_operator_reads(event, expect_type, group_nodes) -> None:
    store = NodeStore()
    assert store.apply(ADDED, node()) == NodeChange(ADDED, "n1", {GROUP: "g1", RC: "rc-1"}, store.get(("group", "g1"))[0])
    change = store.apply(*copy.deepcopy(event))
    assert (change.type if change else None) == expect_type
    labels_after = event[1]["metadata"]["labels"]
    if change is not None and change.type == MODIFIED:  # the group it left looks again too
        assert change.left_group == (None if labels_after.get(GROUP) == "g1" else "g1")
    assert sorted(n["metadata"]["name"] for n in store.get(("group", "g1")) or []) == group_nodes
    if expect_type is None and event[0] == MODIFIED:  # the heartbeat's copy is kept all the same
        assert store.get(("group", "g1"))[0]["metadata"]["resourceVersion"] == "2"


def test_a_node_is_found_by_group_by_block_and_by_plan_and_moves_with_its_labels() -> None:
    store = NodeStore()
    store.apply(ADDED, node("a", **{GROUP: "g1", RC: "rc-1"}))
    store.apply(ADDED, node("b", **{GROUP: "g1", RC: "rc-2"}))
    store.apply(ADDED, node("j", **{WORKLOAD: "train", PLAN: "p1"}))
    store.apply(ADDED, node("warm", **{WORKLOAD: "", PLAN: "p1"}))  # a warm job node: no workload now
    store.apply(ADDED, node("f", **{POOL: "free"}))
    assert [n["metadata"]["name"] for n in store.get(("group", "g1"))] == ["a", "b"]
    assert [n["metadata"]["name"] for n in store.get(("block", "rc-2"))] == ["b"]
    assert [n["metadata"]["name"] for n in store.view("job").get("p1")] == ["j", "warm"]
    assert len(store) == 5  # the free pool's node is tracked too (its changes wake waiting groups)
    store.apply(MODIFIED, node("b", rv="2", **{GROUP: "g2", RC: "rc-2"}))
    assert [n["metadata"]["name"] for n in store.get(("group", "g1"))] == ["a"]
    assert [n["metadata"]["name"] for n in store.get(("group", "g2"))] == ["b"]
    store.apply(DELETED, node("a"))
    assert store.get(("group", "g1")) is None and store.get(("block", "rc-1")) is None


def test_the_first_listing_reports_every_node_and_a_relist_reports_what_went() -> None:
    store = NodeStore()
    first = store.replace([node("a"), node("b"), node("x", **{"other": "y"})], first=True)
    assert [(c.type, c.name) for c in first] == [(None, "a"), (None, "b")]
    again = store.replace([node("a"), node("c", ready="False")], first=False)
    assert sorted((c.type, c.name) for c in again) == [(ADDED, "c"), (DELETED, "b")]
    assert sorted(n["metadata"]["name"] for n in store.get(("group", "g1"))) == ["a", "c"]


class FakeResponse:
    def __init__(self, body: bytes, chunk: int = 7):
        self.data, self._chunk, self.closed = body, chunk, False

    def stream(self, _amt: int, decode_content: bool = True):
        for i in range(0, len(self.data), self._chunk):
            yield self.data[i:i + self._chunk]

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeCore:
    """``list_node`` answering from scripted listings and watch streams, recording the calls."""

    def __init__(self, listings: list[list[dict]], streams: list[list[dict]]):
        self.listings, self.streams, self.calls = listings, streams, []

    def list_node(self, watch: bool = False, **kw: Any) -> FakeResponse:
        self.calls.append(("watch" if watch else "list", kw.get("resource_version")))
        if watch:
            events = self.streams.pop(0)
            return FakeResponse(b"".join(json.dumps(e).encode() + b"\n" for e in events))
        items = self.listings.pop(0)
        return FakeResponse(json.dumps({"metadata": {"resourceVersion": "100"}, "items": items}).encode())


def test_lines_are_whole_json_documents_however_the_stream_is_cut() -> None:
    docs = [{"type": "ADDED", "object": {"metadata": {"name": f"n{i}"}}} for i in range(5)]
    body = b"".join(json.dumps(d).encode() + b"\n" for d in docs)
    for chunk in (1, 3, 64, len(body)):
        assert [json.loads(line) for line in _lines(FakeResponse(body, chunk))] == docs


def test_the_watch_resumes_from_its_last_version_and_lists_again_when_it_expired() -> None:
    handed: list[NodeChange] = []
    core = FakeCore(
        listings=[[node("a"), node("b")], [node("a", rv="7")]],
        streams=[
            [{"type": "MODIFIED", "object": node("a", rv="5", heartbeat="2026-01-01T00:00:40Z")},
             {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "6"}}}],
            [{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}],
            [{"type": "MODIFIED", "object": node("a", rv="8", ready="False")}],
        ])
    watch = NodeWatch(core, NodeStore(), handed.append)
    assert [c.type for c in watch.list(first=True)] == [None, None]
    watch._watch_once()  # a heartbeat (nothing handed on) and a bookmark
    assert watch.resource_version == "6" and handed == []
    with pytest.raises(Expired):
        watch._watch_once()
    # what run() does next: list again, hand on what changed meanwhile (b went), watch again
    for change in watch.list():
        handed.append(change)
    watch._watch_once()
    assert [(c.type, c.name) for c in handed] == [(DELETED, "b"), (MODIFIED, "a")]
    assert core.calls == [("list", None), ("watch", "100"), ("watch", "6"), ("list", None), ("watch", "100")]


def test_a_node_moved_to_another_group_names_the_group_it_left() -> None:
    store = NodeStore()
    store.apply(ADDED, node("b", **{GROUP: "g1"}))
    change = store.apply(MODIFIED, node("b", rv="2", **{GROUP: "g2"}))
    assert (change.type, change.labels[GROUP], change.left_group) == (MODIFIED, "g2", "g1")


def test_an_expiry_answered_as_an_http_status_lists_again() -> None:
    """The API server may refuse an expired resourceVersion with HTTP 410 instead of an ERROR
    event; resuming from the same version would then fail forever."""
    from kubernetes.client.rest import ApiException

    class Refusing(FakeCore):
        def list_node(self, watch: bool = False, **kw: Any) -> FakeResponse:
            if watch and not self.calls:
                self.calls.append(("watch", kw.get("resource_version")))
                raise ApiException(status=410, reason="Gone")
            if not watch:
                watch_.stop.set()  # the relist is the last step of this test
            return super().list_node(watch=watch, **kw)

    handed: list[NodeChange] = []
    core = Refusing(listings=[[node("a")]], streams=[[]])
    watch_ = NodeWatch(core, NodeStore(), handed.append)
    watch_.resource_version = "42"
    watch_.run()
    assert core.calls == [("watch", "42"), ("list", None), ("watch", "100")]  # resumed from the listing
    assert [(c.type, c.name) for c in handed] == [(ADDED, "a")]
