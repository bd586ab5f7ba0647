"""AddTags and DeleteTags on training plans, driven by the real boto3: the tags kept in the plan's
annotation (as CreateTrainingPlan keeps them), written as the caller with the resourceVersion
read, within the model's limits; ListTags reads them back."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from hyperplan.api.vocabulary import ANNOTATION_SAGEMAKER_TAGS
from tests.aws.clients import boto3_call, boto3_calls
from tests.unit.test_sagemaker_api import (  # noqa: F401 - model_checked: every answer here is checked
    ACCOUNT, DENIED, Endpoint, Server, model_checked, ok, plan, signed_in,
)

ARN = f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:training-plan/"


@pytest.fixture()
def server() -> Iterator[Server]:
    tagged = plan("tagged", "Active", 1)
    tagged["metadata"]["annotations"] = {ANNOTATION_SAGEMAKER_TAGS: json.dumps([{"Key": "team", "Value": "vision"},
                                                                              {"Key": "env", "Value": "prod"}])}
    s = Server({"tagged": [tagged], "bare": [plan("bare", "Active", 2)]})
    yield s
    s.close()


def held(server: Server, name: str) -> list[dict]:
    text = (server.plans[name][0]["metadata"].get("annotations") or {}).get(ANNOTATION_SAGEMAKER_TAGS)
    return json.loads(text) if text else []


def test_add_sets_values_and_appends_new_keys_and_delete_removes_them(server: Server) -> None:
    endpoint = signed_in(server)
    added, listed, deleted, after = boto3_calls(endpoint, [
        {"op": "add_tags", "args": {"ResourceArn": ARN + "tagged", "Tags": [
            {"Key": "env", "Value": "dev"}, {"Key": "cost centre", "Value": "ml/42"}]}},
        {"op": "list_tags", "args": {"ResourceArn": ARN + "tagged"}},
        {"op": "delete_tags", "args": {"ResourceArn": ARN + "tagged", "TagKeys": ["team", "not-there"]}},
        {"op": "list_tags", "args": {"ResourceArn": ARN + "tagged"}}])
    assert ok(added) == {"Tags": [{"Key": "env", "Value": "dev"}, {"Key": "cost centre", "Value": "ml/42"}]}
    assert ok(listed)["Tags"] == [{"Key": "team", "Value": "vision"}, {"Key": "env", "Value": "dev"},
                                  {"Key": "cost centre", "Value": "ml/42"}]
    assert ok(deleted) == {}
    assert ok(after)["Tags"] == held(server, "tagged") == [{"Key": "env", "Value": "dev"},
                                                           {"Key": "cost centre", "Value": "ml/42"}]
    writes = [c for c in server.writes.calls if c[0] == "annotate_plan"]
    assert [(c[1], c[2]) for c in writes] == [("alice", "tagged"), ("alice", "tagged")]
    assert writes[0][4] == "1"  # with the resourceVersion read


def test_the_last_tag_deleted_removes_the_annotation_and_nothing_to_do_writes_nothing(server: Server) -> None:
    endpoint = signed_in(server)
    ok(boto3_call(endpoint, "delete_tags", ResourceArn=ARN + "tagged", TagKeys=["team", "env"]))
    assert ANNOTATION_SAGEMAKER_TAGS not in server.plans["tagged"][0]["metadata"]["annotations"]
    server.writes.calls.clear()
    ok(boto3_call(endpoint, "delete_tags", ResourceArn=ARN + "bare", TagKeys=["team"]))
    ok(boto3_call(endpoint, "add_tags", ResourceArn=ARN + "tagged", Tags=[]))
    assert server.writes.calls == []


def test_a_plan_changed_meanwhile_is_tagged_over_its_new_version(server: Server) -> None:
    newer = {**server.plans["tagged"][0]}
    newer["metadata"] = {**newer["metadata"], "resourceVersion": "5", "annotations": {
        ANNOTATION_SAGEMAKER_TAGS: json.dumps([{"Key": "owner", "Value": "bob"}])}}
    server.writes.fresh["tagged"] = newer  # another call tagged it; the cache has not seen it yet
    ok(boto3_call(signed_in(server), "add_tags", ResourceArn=ARN + "tagged", Tags=[{"Key": "team", "Value": "x"}]))
    assert held(server, "tagged") == [{"Key": "owner", "Value": "bob"}, {"Key": "team", "Value": "x"}]


@pytest.mark.parametrize("op, args", [
    pytest.param("add_tags", {"ResourceArn": ARN + "tagged", "Tags": [{"Key": f"k{i}", "Value": "v"} for i in range(49)]},
                 id="more-than-50-in-all"),
    pytest.param("add_tags", {"ResourceArn": ARN + "tagged", "Tags": [{"Key": "aws:x", "Value": "v"}]},
                 id="aws-prefix"),
    pytest.param("add_tags", {"ResourceArn": ARN + "tagged", "Tags": [{"Key": "a;b", "Value": "v"}]}, id="key-pattern"),
    pytest.param("add_tags", {"ResourceArn": ARN + "nobody", "Tags": [{"Key": "a", "Value": "v"}]}, id="no-such-plan"),
    pytest.param("add_tags", {"ResourceArn": ARN.replace(ACCOUNT, "210987654321") + "tagged",
                              "Tags": [{"Key": "a", "Value": "v"}]}, id="another-account"),
    pytest.param("add_tags", {"ResourceArn": f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:cluster/abcdefabcdef",
                              "Tags": [{"Key": "a", "Value": "v"}]}, id="not-a-training-plan"),
    pytest.param("delete_tags", {"ResourceArn": ARN + "tagged", "TagKeys": [f"k{i}" for i in range(51)]},
                 id="more-than-50-keys"),
    pytest.param("delete_tags", {"ResourceArn": ARN + "tagged", "TagKeys": ["k" * 129]}, id="key-length"),
])
def test_tagging_is_refused_as_the_model_says_and_nothing_is_written(server: Server, op: str, args: dict) -> None:
    answer = boto3_call(signed_in(server), op, **args)
    assert answer.get("error", {}).get("code") == "ValidationException", answer
    assert [c for c in server.writes.calls if c[0] == "annotate_plan"] == []


def test_rbac_decides_who_tags(server: Server) -> None:
    answer = boto3_call(Endpoint(server.url, DENIED.key_id, DENIED.secret), "add_tags", ResourceArn=ARN + "tagged",
                        Tags=[{"Key": "a", "Value": "v"}])
    assert answer["error"]["code"] == "AccessDeniedException"
    assert ("mallory", "patch", "trainingplans") in server.access.reviews
