"""The SageMaker API's wire under requests no AWS client sends and answers the API server gives:
malformed bodies are 400s (never a 500), each answer carries ``x-amzn-RequestId``, the API
server's throttling is ``ThrottlingException``; and every member of every served operation's
input, given a value of the wrong type, is refused as a client error."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from kubernetes.client.exceptions import ApiException

from hyperplan.runtime.store import GROUPS, NODES, PLANS, POOLS, WatchCache
from hyperplan.sagemaker import operations
from hyperplan.sagemaker.wire import ApiError
from hyperplan_testing import botocore_shapes
from tests.aws.clients import boto3_call
from tests.unit.test_sagemaker_api import (  # noqa: F401 - model_checked: every answer here is checked
    ACCOUNT, KEY, P5_POOL, RecordingWrites, Server, group, model_checked, node, one_ultraserver_cluster, plan,
    signed_in,
)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = one_ultraserver_cluster()
    yield s
    s.close()


def raw_call(server: Server, operation: str, body: bytes) -> tuple[int, dict[str, str], dict]:
    """``body`` as it is, signed for ``operation`` by botocore's own SigV4 (as boto3 signs)."""
    request = AWSRequest(method="POST", url=server.url + "/", data=body, headers={
        "Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": f"SageMaker.{operation}"})
    SigV4Auth(Credentials(KEY.key_id, KEY.secret), "sagemaker", "us-west-2").add_auth(request)
    prepared = urllib.request.Request(server.url + "/", data=body, method="POST", headers=dict(request.headers))
    try:
        with urllib.request.urlopen(prepared, timeout=20) as answer:
            return answer.status, dict(answer.headers), json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def nested(depth: int) -> bytes:
    return ('{"MaxResults": ' + "[" * depth + "]" * depth + "}").encode()


@pytest.mark.parametrize("operation, body, code", [
    pytest.param("ListTrainingPlans", b"{not json", "SerializationException", id="not-json"),
    pytest.param("ListTrainingPlans", b"\xff\xfe{}", "SerializationException", id="not-utf8"),
    pytest.param("ListTrainingPlans", b"[1, 2]", "SerializationException", id="json-not-an-object"),
    pytest.param("ListTrainingPlans", b'"text"', "SerializationException", id="json-a-string"),
    pytest.param("ListTrainingPlans", nested(40), "SerializationException", id="nested-40-deep"),
    pytest.param("ListTrainingPlans", nested(100_000), "SerializationException", id="nested-100000-deep"),
    pytest.param("ListClusters", b'{"NameContains": 5}', "ValidationException", id="name-contains-a-number"),
    pytest.param("UpdateCluster", b'{"ClusterName": "lab", "InstanceGroups": [5]}', "ValidationException",
                 id="a-group-not-a-structure"),
    pytest.param("BatchRebootClusterNodes", b'{"ClusterName": "lab", "NodeIds": [{"id": 1}]}', "ValidationException",
                 id="a-node-id-not-a-string"),
    pytest.param("ListTrainingPlans", b'{"MaxResults": "ten"}', "ValidationException", id="max-results-a-string"),
])
def test_a_malformed_request_is_a_client_error_with_a_request_id(server: Server, operation: str, body: bytes,
                                                                 code: str) -> None:
    status, headers, answer = raw_call(server, operation, body)
    assert (status, answer["__type"]) == (400, code), answer
    assert headers.get("x-amzn-RequestId")


def test_every_answer_has_its_own_request_id(server: Server) -> None:
    ids = set()
    for body in (b"{}", b"{}", b"[1]"):
        status, headers, _ = raw_call(server, "ListTrainingPlans", body)
        ids.add(headers["x-amzn-RequestId"])
    assert len(ids) == 3


@pytest.mark.parametrize("refusal, code, status", [
    pytest.param(429, "ThrottlingException", 400, id="throttled"),
    pytest.param(409, "ConflictException", 400, id="conflict"),
    pytest.param(403, "AccessDeniedException", 400, id="admission"),
    pytest.param(500, "InternalFailure", 500, id="api-server-failed"),
])
def test_the_api_servers_refusals_are_the_codes_aws_answers(server: Server, monkeypatch, refusal: int, code: str,
                                                            status: int) -> None:
    def refuse(*args) -> None:
        raise ApiException(status=refusal, reason="refused")

    monkeypatch.setattr(server.writes, "patch_group", refuse)
    got = raw_call(server, "UpdateCluster", json.dumps({"ClusterName": "lab", "InstanceGroups": [
        {"InstanceGroupName": "trainers", "InstanceCount": 2, "ExecutionRole": "arn:aws:iam::111122223333:role/hp"}]
    }).encode())
    assert (got[0], got[2]["__type"]) == (status, code), got


def test_boto3_reads_throttling_as_throttling(server: Server, monkeypatch) -> None:
    """boto3 retries a ThrottlingException by itself (3 attempts), then raises it by its code."""
    calls = []

    def refuse(*args) -> None:
        calls.append(args)
        raise ApiException(status=429, reason="Too Many Requests")

    monkeypatch.setattr(server.writes, "label_node", refuse)
    monkeypatch.setattr(server.writes, "patch_group", refuse)
    answer = boto3_call(signed_in(server), "update_cluster", ClusterName="lab", InstanceGroups=[
        {"InstanceGroupName": "trainers", "InstanceCount": 2, "ExecutionRole": "arn:aws:iam::111122223333:role/hp"}])
    assert answer["error"]["code"] == "ThrottlingException" and len(calls) == 3


# --------------------------------------------------------------------------- every member, mistyped


WRONG = [5, 1.5, True, "x", "", [], [5], ["x"], [{}], [[{}]], {}, {"a": 1}, -1, 10 ** 30]
VALID = {"ClusterName": "lab", "TrainingPlanName": "ultra",
         "ReservedCapacityArn": f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:reserved-capacity/rc-ultra",
         "ResourceArn": f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:training-plan/ultra",
         "TrainingPlanArn": f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:training-plan/ultra",
         "NodeIds": ["i-00000000000000000"], "InstanceType": "ml.p5.48xlarge", "InstanceCount": 2,
         "DurationHours": 48, "InstanceGroups": [{"InstanceGroupName": "trainers", "InstanceCount": 3}]}


def mistyped(operation: str) -> Iterator[dict]:
    """Bodies of ``operation``: valid but for one member (or one member of a list's structure)
    of a value of the wrong type or shape."""
    shapes = botocore_shapes.model()["shapes"]
    request = shapes[botocore_shapes.model()["operations"][operation]["input"]["shape"]]
    members = request["members"]
    base = {k: v for k, v in VALID.items() if k in members}
    for member, ref in members.items():
        shape = shapes[ref["shape"]]
        inner = shapes[shape["member"]["shape"]] if shape["type"] == "list" else None
        for wrong in WRONG:
            yield {**base, member: wrong}
            if inner is not None and inner["type"] == "structure":
                for field in inner["members"]:
                    example = dict((VALID.get(member) or [{}])[0]) if isinstance(VALID.get(member), list) else {}
                    yield {**base, member: [{**example, field: wrong}]}


@pytest.mark.parametrize("operation", sorted(operations.OPERATIONS))
def test_a_member_of_the_wrong_type_is_a_client_error(operation: str) -> None:
    cache = WatchCache()
    plans = {"ultra": [plan("ultra", "Active", 2, ultra=True)]}
    cache.bind({PLANS: plans, POOLS: {"p5-west": [P5_POOL]}, GROUPS: {"trainers": [group("trainers", "ultra", 3)]},
                NODES: {("group", "trainers"): [node("trainers-0", "trainers")]}})
    writes = RecordingWrites()
    writes.plans = plans
    ctx = operations.Context(fleet=cache, account=ACCOUNT, region="us-west-2", now=datetime.now(timezone.utc),
                             cluster_name="lab", user="alice", writes=writes)
    failures = []
    for body in mistyped(operation):
        try:
            operations.call(operation, body, ctx)
        except ApiError as e:
            assert e.status < 500, (body, e)
        except Exception as e:  # noqa: BLE001 - what the server would answer as InternalFailure
            failures.append(f"{json.dumps(body, default=str)[:200]}: {type(e).__name__}: {e}")
    assert failures == []
