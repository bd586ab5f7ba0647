"""ListClusterEvents and DescribeClusterEvent, driven by the real boto3: the Kubernetes Events of the
cluster's groups and nodes, read as the caller, as the model's cluster events."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from hyperplan.sagemaker import hyperpod
from tests.aws.clients import boto3_call, boto3_calls
from tests.unit.test_sagemaker_api import (  # noqa: F401 - model_checked: every answer here is checked
    DENIED, Endpoint, Server, group, model_checked, node, ok, plan, signed_in,
)

UIDS = ["0b1e7c7e-0000-4000-8000-00000000000%d" % i for i in range(5)]


def event(i: int, kind: str, name: str, when: str, *, warning: bool = False, reason: str = "Something") -> dict:
    return {"metadata": {"name": f"{name}.{i}", "namespace": "default", "uid": UIDS[i]},
            "involvedObject": {"kind": kind, "name": name}, "type": "Warning" if warning else "Normal",
            "reason": reason, "message": f"event {i}", "lastTimestamp": when}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server({"ultra": [plan("ultra", "Active", 2, ultra=True)]}, {"trainers": [group("trainers", "ultra", 2)]},
               {("group", "trainers"): [node("trainers-0", "trainers"), node("trainers-1", "trainers")]})
    s.writes.events = [
        event(0, "InstanceGroup", "trainers", "2027-03-01T02:00:00Z", reason="Scaled"),
        event(1, "Node", "trainers-0", "2027-03-01T02:01:00Z", warning=True, reason="NodeUnhealthy"),
        event(2, "Node", "trainers-1", "2027-03-01T02:02:00Z", reason="Ready"),
        event(3, "Node", "gone-node", "2027-03-01T02:03:00Z"),  # a node no group holds: not answered
        event(4, "TrainingPlan", "ultra", "2027-03-01T02:04:00Z"),  # not the cluster's
    ]
    yield s
    s.close()


def test_the_events_of_groups_and_nodes_are_listed_and_described(server: Server) -> None:
    endpoint = signed_in(server)
    listed, newest_first, of_a_node, described = boto3_calls(endpoint, [
        {"op": "list_cluster_events", "args": {"ClusterName": "lab"}},
        {"op": "list_cluster_events", "args": {"ClusterName": "lab", "SortOrder": "Descending", "MaxResults": 2}},
        {"op": "list_cluster_events", "args": {"ClusterName": "lab", "NodeId": hyperpod.instance_id("trainers-0")}},
        {"op": "describe_cluster_event", "args": {"ClusterName": "lab", "EventId": UIDS[1]}}])
    events = ok(listed)["Events"]
    assert [e["EventId"] for e in events] == UIDS[:3]
    assert [(e["ResourceType"], e["InstanceGroupName"], e.get("InstanceId")) for e in events] == [
        ("InstanceGroup", "trainers", None), ("Instance", "trainers", hyperpod.instance_id("trainers-0")),
        ("Instance", "trainers", hyperpod.instance_id("trainers-1"))]
    assert events[1]["EventLevel"] == "Warn" and events[1]["Description"] == "NodeUnhealthy: event 1"
    assert events[0]["EventTime"] == datetime(2027, 3, 1, 2, tzinfo=timezone.utc).timestamp()
    page = ok(newest_first)
    assert [e["EventId"] for e in page["Events"]] == [UIDS[2], UIDS[1]] and page["NextToken"]
    assert [e["EventId"] for e in ok(of_a_node)["Events"]] == [UIDS[1]]
    assert ok(described)["EventDetails"] == events[1]
    assert ("cluster_events", "alice") in server.writes.calls  # read as the caller


@pytest.mark.parametrize("args, code", [
    pytest.param({"EventId": UIDS[3]}, "ResourceNotFound", id="an-event-of-a-node-not-in-the-cluster"),
    pytest.param({"EventId": "not-an-id"}, "ValidationException", id="event-id-pattern"),
    pytest.param({"EventId": UIDS[0], "ClusterName": "elsewhere"}, "ResourceNotFound", id="another-cluster"),
])
def test_describe_cluster_event_errors(server: Server, args: dict, code: str) -> None:
    answer = boto3_call(signed_in(server), "describe_cluster_event", **{"ClusterName": "lab", **args})
    assert answer.get("error", {}).get("code") == code, answer


def test_reading_events_is_the_callers_right(server: Server) -> None:
    answer = boto3_call(Endpoint(server.url, DENIED.key_id, DENIED.secret), "list_cluster_events", ClusterName="lab")
    assert answer["error"]["code"] == "AccessDeniedException"
    assert ("mallory", "list", "events") in server.access.reviews
