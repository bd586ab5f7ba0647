"""hyperplan's SageMaker API, driven by the real boto3 (pinned, in a venv of its own): the wire
(JSON 1.1, errors as boto3 reads them, paging), SigV4 as the server checks it, and the read
operations over TrainingPlans held in a real watch cache.

The fleet here is a WatchCache bound to in-memory indexes (the unit seam); the e2e tier drives
the same operations against the operator on the local plane."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest
from aiohttp import web
from kubernetes.client.exceptions import ApiException

from hyperplan.runtime.store import GROUPS, NODES, PLANS, POOLS, WatchCache
from hyperplan.sagemaker import signing
from hyperplan.sagemaker.server import check_address, make_app, serve
from hyperplan.sagemaker.signing import AccessKey, canonical_request, signing_key, verify
from hyperplan.sagemaker.wire import ApiError
from hyperplan_testing import botocore_shapes
from tests.aws.clients import Endpoint, boto3_call, boto3_calls
from tests.kube import eventually

ACCOUNT = "123456789012"
KEY = AccessKey("AKIAHYPERPLANTEST001", "s3cr3t/with+chars", "alice")
DENIED = AccessKey("AKIAHYPERPLANTEST002", "other", "mallory")
BUYER = AccessKey("AKIAHYPERPLANTEST003", "bobs-secret", "bob")  # may create plans, not read them


class FakeAccess:
    """The keys and RBAC's answers, in memory: alice may get and list plans, bob only create them,
    mallory nothing;
    records every review asked for."""

    def __init__(self) -> None:
        self.keys = {k.key_id: k for k in (KEY, DENIED, BUYER)}
        self.rights = {("bob", "create", "trainingplans"), ("alice", "get", "trainingplans"), ("alice", "list", "trainingplans"),
                       ("alice", "create", "trainingplans"), ("alice", "patch", "trainingplans"),
                       ("alice", "list", "instancegroups"), ("alice", "patch", "instancegroups"),
                       ("alice", "patch", "nodes"), ("alice", "list", "events")}
        self.reviews: list[tuple[str, str, str]] = []
        self.refreshes = 0

    def key_of(self, key_id: str) -> AccessKey | None:
        return self.keys.get(key_id)

    def stale(self, unknown: bool = False) -> bool:
        return True  # listed again whenever the server may: in memory, it costs nothing

    def refresh(self, force: bool = False) -> None:
        self.refreshes += 1

    def allowed(self, key: AccessKey, verb: str, group: str, resource: str) -> bool:
        self.reviews.append((key.user, verb, resource))
        return (key.user, verb, resource) in self.rights
NOW = datetime(2027, 3, 1, 12, 0, tzinfo=timezone.utc)
T0 = datetime(2027, 3, 1, tzinfo=timezone.utc)


def plan(name: str, phase: str | None, start_hours: int, *, ultra: bool = False) -> dict:
    start = T0 + timedelta(hours=start_hours)
    block = {"id": f"rc-{name}", "availabilityZone": "us-west-2a",
             "instanceType": "ml.p6e-gb200.36xlarge" if ultra else "ml.p5.48xlarge",
             "instanceCount": 36 if ultra else 8, "startTime": start.isoformat(),
             "endTime": (start + timedelta(hours=48)).isoformat(),
             "status": {"Active": "Active", "Expired": "Expired"}.get(phase or "", "Scheduled")}
    spec = {"targetResource": "hyperpod-cluster", "duration": "48h"}
    status: dict = {"phase": phase} if phase else {}
    if ultra:
        spec.update(ultraServerType="ml.u-p6e-gb200x36", ultraServerCount=2)
        block.update(ultraServerType="ml.u-p6e-gb200x36", ultraServerCount=2)
        status["ultraServers"] = [
            {"id": "us-a", "availabilityZone": "us-west-2a", "totalInstanceCount": 18, "configuredSpareInstanceCount": 1,
             "availableInstanceCount": 17, "availableSpareInstanceCount": 1, "healthStatus": "ok"},
            {"id": "us-b", "availabilityZone": "us-west-2a", "totalInstanceCount": 18, "configuredSpareInstanceCount": 1,
             "availableInstanceCount": 16, "unhealthyInstanceCount": 1, "healthStatus": "impaired"}]
    else:
        spec.update(instanceType="ml.p5.48xlarge", instanceCount=8)
    if phase in ("Scheduled", "Active", "Expired"):
        status.update(reservedCapacity=[block], totalInstanceCount=block["instanceCount"],
                      availableInstanceCount=block["instanceCount"] - 1, inUseInstanceCount=1)
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "TrainingPlan",
            "metadata": {"name": name, "resourceVersion": "1", "uid": f"uid-{name}"}, "spec": spec, "status": status}


class RecordingWrites:
    """The writes the operations make, as whom (the API server's side is the e2e tier's)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        # lagging: the watch cache does not show this process's writes yet; the API server's copy
        # is ``fresh`` (a write over a stale resourceVersion is refused with 409, as it would be).
        self.lagging = False
        self.fresh: dict[str, dict] = {}
        self.events: list[dict] = []  # the Kubernetes Events the caller may read

    def cluster_events(self, user: str) -> list[dict]:
        self.calls.append(("cluster_events", user))
        return list(self.events)

    def patch_group(self, user: str, name: str, patch: dict) -> None:
        self.calls.append(("patch_group", user, name, patch))

    def label_node(self, user: str, name: str, labels: dict) -> None:
        self.calls.append(("label_node", user, name, labels))

    def create_group(self, user: str, body: dict) -> None:
        self.calls.append(("create_group", user, body["metadata"]["name"], body["spec"]))

    def delete_group(self, user: str, name: str) -> None:
        self.calls.append(("delete_group", user, name))

    def extend_plan(self, user: str, name: str, extensions: list, resource_version: str | None) -> None:
        self.calls.append(("extend_plan", user, name, extensions, resource_version))
        [held] = self.plans[name]
        held = self.fresh.get(name, held)
        if resource_version and resource_version != held["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        version = str(int(held["metadata"]["resourceVersion"]) + 1)
        written = {**held, "metadata": {**held["metadata"], "resourceVersion": version},
                   "spec": {**held["spec"], "extensions": extensions}}
        if self.lagging:
            self.fresh[name] = written
        else:
            self.plans[name] = [written]  # as the watch brings it

    def annotate_plan(self, user: str, name: str, annotations: dict, resource_version: str | None) -> None:
        self.calls.append(("annotate_plan", user, name, annotations, resource_version))
        [held] = self.plans[name]
        held = self.fresh.get(name, held)
        if resource_version and resource_version != held["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        kept = {**(held["metadata"].get("annotations") or {}), **annotations}
        metadata = {**held["metadata"], "resourceVersion": str(int(held["metadata"]["resourceVersion"]) + 1),
                    "annotations": {k: v for k, v in kept.items() if v is not None}}
        self.plans[name] = [{**held, "metadata": metadata}]  # as the watch brings it
        self.fresh.pop(name, None)

    def plan_now(self, name: str) -> dict | None:
        self.calls.append(("plan_now", name))
        return self.fresh.get(name) or (self.plans.get(name) or [None])[0]

    def create_plan(self, user: str, body: dict) -> dict | None:
        self.calls.append(("create_plan", user, body["metadata"]["name"], body["spec"]))
        if body["metadata"]["name"] in self.plans:
            return None
        made = {**body, "metadata": {**body["metadata"], "resourceVersion": "1", "uid": "u"}}
        self.plans[body["metadata"]["name"]] = [made]  # as the watch brings it
        return made


P5_POOL = {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "CapacityPool",
           "metadata": {"name": "p5-west", "resourceVersion": "1"},
           "spec": {"instanceType": "ml.p5.48xlarge", "availabilityZone": "us-west-2a", "instanceCount": 8}}


def group(name: str, plan_name: str, count: int) -> dict:
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "InstanceGroup",
            "metadata": {"name": name, "resourceVersion": "1", "creationTimestamp": "2027-02-01T00:00:00Z"},
            "spec": {"trainingPlanRef": plan_name, "instanceType": "ml.p6e-gb200.36xlarge", "instanceCount": count},
            "status": {"phase": "Ready"}}


def node(name: str, group_name: str, *, ready: str = "True", ultraserver: str = "us-a", health: str | None = None,
         created: str = "2027-03-01T02:00:00Z") -> dict:
    labels = {"hyperplan.dev/instance-group": group_name, "topology.k8s.aws/ultraserver-id": ultraserver,
              "topology.kubernetes.io/zone": "us-west-2a"}
    if health:
        labels["sagemaker.amazonaws.com/node-health-status"] = health
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": labels, "creationTimestamp": created},
            "spec": {}, "status": {"conditions": [{"type": "Ready", "status": ready,
                                                   "lastTransitionTime": "2027-03-01T02:00:00Z"}]}}


class WatchedPlans(dict):
    """The plans' index as the watch fills it: each change is also a plan event, which moves the
    cache's ``plans_version`` (wiring.events.plan_event), so listings see it."""

    cache: WatchCache | None = None

    def _moved(self) -> None:
        if self.cache is not None:
            self.cache.plans_version += 1

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self._moved()

    def __delitem__(self, key) -> None:
        super().__delitem__(key)
        self._moved()

    def pop(self, *args):
        out = super().pop(*args)
        self._moved()
        return out


@dataclass(frozen=True)
class Answer:
    """One answer a test server gave: the operation, its status, headers and JSON body."""

    operation: str
    status: int
    headers: dict[str, str]
    body: object


ANSWERS: list[Answer] = []  # every answer of every test server, in order (model_checked empties it)


@web.middleware
async def record_answers(request: web.Request, handler) -> web.StreamResponse:
    response = await handler(request)
    target = request.headers.get("X-Amz-Target") or ""
    try:
        body = json.loads(response.body or b"null")
    except (TypeError, ValueError):
        body = response.body
    ANSWERS.append(Answer(target.removeprefix("SageMaker."), response.status, dict(response.headers), body))
    return response


def model_violations(answers: list[Answer]) -> list[str]:
    """How the answers break botocore's model (their shapes, their error codes)."""
    found: list[str] = []
    for answer in answers:
        if not any(k.lower() == "x-amzn-requestid" and v for k, v in answer.headers.items()):
            found.append(f"{answer.operation}: answered {answer.status} without x-amzn-RequestId")
        served = answer.operation in botocore_shapes.operations()
        if answer.status == 200 and served:
            found += botocore_shapes.violations(answer.operation, answer.body)
        elif answer.status != 200:
            found += botocore_shapes.error_violations(answer.operation or "(no operation)", answer.status,
                                                      answer.body)
    return found


@pytest.fixture(autouse=True)
def model_checked() -> Iterator[list[Answer]]:
    """Every answer a test's servers give is checked against botocore's model after the test."""
    ANSWERS.clear()
    yield ANSWERS
    answers = list(ANSWERS)
    ANSWERS.clear()
    assert model_violations(answers) == []


class Server:
    """The API's aiohttp app on a loopback port, on a loop in a thread of its own."""

    def __init__(self, plans: dict[str, list[dict]], groups: dict[str, list[dict]] | None = None,
                 nodes: dict[tuple, list[dict]] | None = None, pools: dict[str, list[dict]] | None = None,
                 eks_cluster_arn: str | None = None):
        plans = plans if isinstance(plans, WatchedPlans) else WatchedPlans(plans)
        self.plans = plans
        self.cache = WatchCache()
        plans.cache = self.cache
        self.cache.bind({PLANS: plans, POOLS: pools or {"p5-west": [P5_POOL]}, GROUPS: groups or {},
                         NODES: nodes or {}})
        self.writes = RecordingWrites()
        self.writes.plans = plans
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.access = FakeAccess()
        app = make_app(self.cache, self.access, ACCOUNT, lambda: datetime.now(timezone.utc), "lab", self.writes)
        app.middlewares.append(record_answers)
        if eks_cluster_arn:  # as sagemaker.replica sets it from the settings
            from hyperplan.sagemaker.hyperpod import EKS_CLUSTER_ARN
            app[EKS_CLUSTER_ARN] = eks_cluster_arn
        self.runner = asyncio.run_coroutine_threadsafe(serve(app, "127.0.0.1", self.port), self.loop).result(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    plans = {f"plan-{i:03d}": [plan(f"plan-{i:03d}", ["Pending", "Scheduled", "Active", "Expired"][i % 4], i)]
             for i in range(230)}
    plans["ultra"] = [plan("ultra", "Active", 2, ultra=True)]
    groups = {"trainers": [group("trainers", "ultra", 3)]}
    nodes = {("group", "trainers"): [
        node("trainers-0", "trainers", created="2027-03-01T02:00:00Z"),
        node("trainers-1", "trainers", ready="False", created="2027-03-01T02:00:01Z"),
        node("trainers-2", "trainers", ultraserver="us-b", health="UnschedulablePendingReplacement",
             created="2027-03-01T02:00:02Z")]}
    s = Server(plans, groups, nodes)
    yield s
    s.close()


def one_ultraserver_cluster() -> Server:
    """A server of one UltraServer plan (ultra) and one group on it (trainers) with one node."""
    return Server({"ultra": [plan("ultra", "Active", 2, ultra=True)]}, {"trainers": [group("trainers", "ultra", 3)]},
                  {("group", "trainers"): [node("trainers-0", "trainers")]})


def signed_in(server: Server, secret: str = KEY.secret, key_id: str = KEY.key_id) -> Endpoint:
    return Endpoint(server.url, key_id, secret)


def ok(answer: dict) -> dict:
    assert "ok" in answer, answer
    return answer["ok"]


def test_describe_a_training_plan_by_name_and_by_arn(server: Server) -> None:
    endpoint = signed_in(server)
    by_name, by_arn = [ok(a) for a in boto3_calls(endpoint, [
        {"op": "describe_training_plan", "args": {"TrainingPlanName": "plan-002"}},
        {"op": "describe_training_plan",
         "args": {"TrainingPlanName": f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:training-plan/plan-002"}}])]
    assert by_name == by_arn
    assert by_name["TrainingPlanArn"] == f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:training-plan/plan-002"
    assert by_name["Status"] == "Active"
    assert by_name["TotalInstanceCount"] == 8 and by_name["InUseInstanceCount"] == 1
    assert by_name["StartTime"] == (T0 + timedelta(hours=2)).timestamp()
    assert (by_name["DurationHours"], by_name["DurationMinutes"]) == (48, 0)
    [summary] = by_name["ReservedCapacitySummaries"]
    assert summary["ReservedCapacityArn"] == f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:reserved-capacity/rc-plan-002"
    assert summary["InstanceType"] == "ml.p5.48xlarge" and summary["ReservedCapacityType"] == "Instance"


def test_the_arns_name_the_region_the_request_was_signed_for(server: Server) -> None:
    endpoint = Endpoint(server.url, KEY.key_id, KEY.secret, region="eu-central-1")
    got = ok(boto3_call(endpoint, "describe_training_plan", TrainingPlanName="plan-001"))
    assert got["TrainingPlanArn"].startswith(f"arn:aws:sagemaker:eu-central-1:{ACCOUNT}:")


def test_list_pages_through_every_plan_once_in_order(server: Server) -> None:
    [pages] = [ok(a) for a in boto3_calls(signed_in(server), [
        {"op": "list_training_plans", "paginate": True,
         "args": {"SortBy": "TrainingPlanName", "SortOrder": "Ascending", "PaginationConfig": {"PageSize": 100}}}])]
    names = [s["TrainingPlanName"] for p in pages for s in p["TrainingPlanSummaries"]]
    assert len(pages) == 3 and names == sorted(server.plans)
    assert "UnhealthyInstanceCount" not in pages[0]["TrainingPlanSummaries"][0]  # not in a summary's shape


def test_pages_stay_stable_while_plans_come_and_go(server: Server) -> None:
    """A token names the last plan shown, not a position: plans added before it or removed do not
    make the next page skip or repeat one."""
    endpoint = signed_in(server)
    args = {"SortBy": "TrainingPlanName", "SortOrder": "Ascending", "MaxResults": 50}
    first = ok(boto3_call(endpoint, "list_training_plans", **args))
    shown = [s["TrainingPlanName"] for s in first["TrainingPlanSummaries"]]
    server.plans["plan-000a"] = [plan("plan-000a", "Pending", 1)]  # sorts into the page already shown
    removed = server.plans.pop("plan-060")
    try:
        second = ok(boto3_call(endpoint, "list_training_plans", NextToken=first["NextToken"], **args))
    finally:
        del server.plans["plan-000a"]
        server.plans["plan-060"] = removed
    after = [s["TrainingPlanName"] for s in second["TrainingPlanSummaries"]]
    assert after[0] == "plan-050" and "plan-060" not in after and not set(after) & set(shown)


@pytest.mark.parametrize("args, expect", [
    pytest.param({"Filters": [{"Name": "Status", "Value": "Expired"}]}, lambda s: {x["Status"] for x in s} == {"Expired"},
                 id="filter-by-status"),
    pytest.param({"StartTimeAfter": T0 + timedelta(hours=200)},
                 lambda s: s and all(x["StartTime"] > (T0 + timedelta(hours=200)).timestamp() for x in s),
                 id="start-time-after"),
    pytest.param({"SortBy": "StartTime", "SortOrder": "Descending"},
                 lambda s: [x["StartTime"] for x in s] == sorted((x["StartTime"] for x in s), reverse=True),
                 id="newest-start-first"),
])
def test_list_filters_and_sorts(server: Server, args: dict, expect) -> None:
    args = {k: (v.timestamp() if isinstance(v, datetime) else v) for k, v in args.items()}
    summaries = ok(boto3_call(signed_in(server), "list_training_plans", MaxResults=100, **args))["TrainingPlanSummaries"]
    assert expect(summaries), summaries[:3]


def test_ultraservers_of_a_reserved_capacity_carry_their_health(server: Server) -> None:
    arn = f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:reserved-capacity/rc-ultra"
    described, listed = [ok(a) for a in boto3_calls(signed_in(server), [
        {"op": "describe_reserved_capacity", "args": {"ReservedCapacityArn": arn}},
        {"op": "list_ultra_servers_by_reserved_capacity", "args": {"ReservedCapacityArn": arn}}])]
    assert described["ReservedCapacityType"] == "UltraServer"
    assert described["UltraServerSummary"]["UltraServerType"] == "ml.u-p6e-gb200x36"
    assert {u["UltraServerId"]: u["HealthStatus"] for u in listed["UltraServers"]} == {"us-a": "OK", "us-b": "Impaired"}
    assert listed["UltraServers"][1]["UnhealthyInstanceCount"] == 1


@pytest.mark.parametrize("op, args, code, status", [
    pytest.param("describe_training_plan", {"TrainingPlanName": "nope"}, "ResourceNotFound", 400, id="unknown-plan"),
    pytest.param("describe_training_plan", {"TrainingPlanName": "bad_name"}, "ValidationException", 400,
                 id="name-pattern"),
    pytest.param("list_training_plans", {"MaxResults": 101}, "ValidationException", 400, id="max-results-maximum"),
    pytest.param("list_training_plans", {"SortBy": "Size"}, "ValidationException", 400, id="sort-by-enum"),
    pytest.param("list_training_plans", {"Filters": [{"Name": "Status", "Value": "Bought"}]}, "ValidationException",
                 400, id="filter-value-enum"),
    pytest.param("list_training_plans", {"NextToken": "not-a-token"}, "ValidationException", 400, id="forged-token"),
    pytest.param("describe_reserved_capacity",
                 {"ReservedCapacityArn": f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:reserved-capacity/none"},
                 "ResourceNotFound", 400, id="unknown-reserved-capacity"),
])
def test_errors_are_the_modeled_codes(server: Server, op: str, args: dict, code: str, status: int) -> None:
    answer = boto3_call(signed_in(server), op, **args)
    assert answer.get("error", {}).get("code") == code, answer
    assert answer["error"]["status"] == status


def test_a_token_from_another_query_is_refused(server: Server) -> None:
    endpoint = signed_in(server)
    first = ok(boto3_call(endpoint, "list_training_plans", MaxResults=10, SortBy="TrainingPlanName"))
    answer = boto3_call(endpoint, "list_training_plans", MaxResults=10, SortBy="Status", NextToken=first["NextToken"])
    assert answer["error"]["code"] == "ValidationException"


@pytest.mark.parametrize("endpoint_of, code", [
    pytest.param(lambda s: signed_in(s, secret="wrong"), "SignatureDoesNotMatch", id="wrong-secret"),
    pytest.param(lambda s: signed_in(s, key_id="AKIANOBODY"), "UnrecognizedClientException", id="unknown-key"),
])
def test_a_request_not_signed_by_a_known_key_is_refused(server: Server, endpoint_of, code: str) -> None:
    answer = boto3_call(endpoint_of(server), "list_training_plans")
    assert answer["error"] == {"code": code, "message": answer["error"]["message"], "status": 403}


def test_rbac_decides_what_a_key_may_do(server: Server) -> None:
    """A key whose identity RBAC does not let list TrainingPlans gets AccessDeniedException; the
    review asked is the identity's, for the operation's verb and resource."""
    answer = boto3_call(Endpoint(server.url, DENIED.key_id, DENIED.secret), "list_training_plans")
    assert answer["error"]["code"] == "AccessDeniedException" and "mallory" in answer["error"]["message"]
    assert ("mallory", "list", "trainingplans") in server.access.reviews
    assert ("alice", "get", "trainingplans") in server.access.reviews


def test_a_key_that_may_only_buy_sees_only_the_plans_it_made(server: Server) -> None:
    """Tenancy between the teams that buy from one capacity cluster: bob's key may create plans
    but not get or list them; it is served the reads of the plans it made (the API wrote bob into
    hyperplan.dev/created-by), and the others' plans are to it as if they did not exist."""
    bob = Endpoint(server.url, BUYER.key_id, BUYER.secret)
    offering = ok(boto3_call(bob, "search_training_plan_offerings", **search_args()))["TrainingPlanOfferings"][0]
    tags = [{"Key": "team", "Value": "bob"}]
    ok(boto3_call(bob, "create_training_plan", TrainingPlanName="bobs-plan",
                  TrainingPlanOfferingId=offering["TrainingPlanOfferingId"], Tags=tags))
    try:
        [made] = server.plans["bobs-plan"]
        assert made["metadata"]["annotations"]["hyperplan.dev/created-by"] == "bob"
        listed = ok(boto3_call(bob, "list_training_plans"))["TrainingPlanSummaries"]
        assert [p["TrainingPlanName"] for p in listed] == ["bobs-plan"]
        assert ok(boto3_call(bob, "describe_training_plan", TrainingPlanName="bobs-plan"))["TrainingPlanName"] == \
            "bobs-plan"
        assert ok(boto3_call(bob, "list_tags", ResourceArn=PLAN_ARN + "bobs-plan"))["Tags"] == tags
        for op, args, code in (("describe_training_plan", {"TrainingPlanName": "plan-001"}, "ResourceNotFound"),
                               ("list_tags", {"ResourceArn": PLAN_ARN + "plan-001"}, "ValidationException"),
                               ("describe_training_plan_extension_history", {"TrainingPlanArn": PLAN_ARN + "plan-001"},
                                "ResourceNotFound")):
            assert boto3_call(bob, op, **args)["error"]["code"] == code, op
        ultra_block = server.plans["ultra"][0]["status"]["reservedCapacity"][0]["id"]
        assert boto3_call(bob, "describe_reserved_capacity", ReservedCapacityArn=(
            f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:reserved-capacity/{ultra_block}"))["error"]["code"] == \
            "ResourceNotFound"
        # A key that may read plans reads them all, bob's among them; one that may not buy gets nothing.
        everyone = ok(boto3_call(signed_in(server), "list_training_plans", MaxResults=100,
                                 SortBy="TrainingPlanName", SortOrder="Ascending"))["TrainingPlanSummaries"]
        assert "bobs-plan" in [p["TrainingPlanName"] for p in everyone] and len(everyone) == 100
        refused = boto3_call(Endpoint(server.url, DENIED.key_id, DENIED.secret), "describe_training_plan",
                             TrainingPlanName="bobs-plan")
        assert refused["error"]["code"] == "AccessDeniedException"
        # bob's retry is answered with its plan; the same call by another user is not a retry of it.
        again = [boto3_call(e, "create_training_plan", TrainingPlanName="bobs-plan",
                            TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]) for e in (bob, signed_in(server))]
        assert again[0] == {"ok": {"TrainingPlanArn": PLAN_ARN + "bobs-plan"}}
        assert again[1]["error"]["code"] == "ResourceInUse"
    finally:
        del server.plans["bobs-plan"]


def test_an_unsigned_request_is_refused_as_an_aws_client_expects(server: Server) -> None:
    request = urllib.request.Request(server.url + "/", data=b"{}", method="POST", headers={
        "Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": "SageMaker.ListTrainingPlans"})
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=10)
    assert raised.value.code == 403
    assert raised.value.headers["Content-Type"] == "application/x-amz-json-1.1"
    assert json.loads(raised.value.read())["__type"] == "InvalidSignatureException"


# --------------------------------------------------------------------------- buying


def search_args(**more) -> dict:
    start = datetime.now(timezone.utc) + timedelta(minutes=2)
    return {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 4, "DurationHours": 48,
            "StartTimeAfter": start.timestamp(), "TargetResources": ["hyperpod-cluster"], **more}


def test_search_offers_capacity_of_the_pools_and_create_buys_it_as_the_caller(server: Server) -> None:
    """Under the demo profile a day is a minute, so 48 hours are 2 minutes. The offering's id
    carries the spec; CreateTrainingPlan makes a TrainingPlan of that spec with the offering's own
    id, as the caller; a retry answers the same ARN, another offering under the name is refused."""
    endpoint = signed_in(server)
    found = ok(boto3_call(endpoint, "search_training_plan_offerings", **search_args()))["TrainingPlanOfferings"]
    assert 1 <= len(found) <= 3
    best = found[0]
    assert re.fullmatch(r"[a-z0-9\-]+", best["TrainingPlanOfferingId"]) and len(best["TrainingPlanOfferingId"]) <= 256
    [block] = best["ReservedCapacityOfferings"]
    assert (block["InstanceType"], block["InstanceCount"], block["AvailabilityZone"]) == \
        ("ml.p5.48xlarge", 4, "us-west-2a")
    assert block["EndTime"] - block["StartTime"] == 120
    server.writes.calls.clear()
    made, again = [ok(a) for a in boto3_calls(endpoint, [
        {"op": "create_training_plan", "args": {"TrainingPlanName": "bought-here",
                                                "TrainingPlanOfferingId": best["TrainingPlanOfferingId"]}},
        {"op": "create_training_plan", "args": {"TrainingPlanName": "bought-here",
                                                "TrainingPlanOfferingId": best["TrainingPlanOfferingId"]}}])]
    assert made == again == {"TrainingPlanArn": f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:training-plan/bought-here"}
    [(verb, user, name, spec)] = server.writes.calls
    assert (verb, user, name) == ("create_plan", "alice", "bought-here")
    assert (spec["instanceType"], spec["instanceCount"], spec["duration"], spec["targetResource"]) == \
        ("ml.p5.48xlarge", 4, "2m", "hyperpod-cluster")
    assert best["TrainingPlanOfferingId"].startswith(spec["offeringId"] + "-")
    other = ok(boto3_call(endpoint, "search_training_plan_offerings", **search_args(InstanceCount=2)))
    taken = boto3_call(endpoint, "create_training_plan", TrainingPlanName="bought-here",
                       TrainingPlanOfferingId=other["TrainingPlanOfferings"][0]["TrainingPlanOfferingId"])
    assert taken["error"]["code"] == "ResourceInUse"
    del server.plans["bought-here"]


PLAN_ARN = f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:training-plan/"


def test_the_tags_of_a_purchase_are_kept_on_the_plan_and_listed_by_its_arn(server: Server) -> None:
    """CreateTrainingPlan's Tags go into the plan's annotation as JSON, in their order; ListTags on
    the plan's ARN reads them from the watch cache (the slim copy keeps the annotation); a retry
    answers the same ARN and writes nothing more."""
    from hyperplan.wiring.events import hp_plans
    from hyperplan.api.vocabulary import ANNOTATION_SAGEMAKER_TAGS as ANNOTATION_TAGS

    endpoint = signed_in(server)
    best = ok(boto3_call(endpoint, "search_training_plan_offerings", **search_args()))["TrainingPlanOfferings"][0]
    tags = [{"Key": "team", "Value": "vision"}, {"Key": "cost centre", "Value": "ml/42 = über+@"},
            {"Key": "empty", "Value": ""}]
    server.writes.calls.clear()
    create = {"TrainingPlanName": "tagged", "TrainingPlanOfferingId": best["TrainingPlanOfferingId"], "Tags": tags}
    made, again, listed = [ok(a) for a in boto3_calls(endpoint, [
        {"op": "create_training_plan", "args": create}, {"op": "create_training_plan", "args": create},
        {"op": "list_tags", "args": {"ResourceArn": PLAN_ARN + "tagged"}}])]
    try:
        assert made == again == {"TrainingPlanArn": PLAN_ARN + "tagged"}
        assert [c[0] for c in server.writes.calls] == ["create_plan"]  # the retry found it made
        [held] = server.plans["tagged"]
        assert json.loads(held["metadata"]["annotations"][ANNOTATION_TAGS]) == tags
        assert listed == {"Tags": tags}
        slim = asyncio.run(hp_plans(name="tagged", body=held))["tagged"].unpack()
        assert json.loads(slim["metadata"]["annotations"][ANNOTATION_TAGS]) == tags
        untagged = ok(boto3_call(endpoint, "list_tags", ResourceArn=PLAN_ARN + "plan-001"))
        assert untagged.get("Tags", []) == []
    finally:
        del server.plans["tagged"]


def tag_list(n: int, **tag: str) -> list[dict]:
    return [{"Key": f"k{i}", "Value": "v", **tag} for i in range(n)]


@pytest.mark.parametrize("tags", [
    pytest.param(tag_list(51), id="more-than-50"),
    pytest.param(tag_list(1, Key="k" * 129), id="key-longer-than-128"),
    pytest.param(tag_list(1, Value="v" * 257), id="value-longer-than-256"),
    pytest.param(tag_list(1, Key="team#1"), id="key-pattern"),
    pytest.param(tag_list(1, Value="a;b"), id="value-pattern"),
    pytest.param(tag_list(1, Key="aws:created-by"), id="aws-prefix-reserved"),
    pytest.param([{"Key": "team", "Value": "a"}, {"Key": "team", "Value": "b"}], id="key-twice"),
])
def test_tags_are_checked_as_the_model_says_and_nothing_is_created(server: Server, tags: list) -> None:
    endpoint = signed_in(server)
    best = ok(boto3_call(endpoint, "search_training_plan_offerings", **search_args()))["TrainingPlanOfferings"][0]
    server.writes.calls.clear()
    answer = boto3_call(endpoint, "create_training_plan", TrainingPlanName="badly-tagged",
                        TrainingPlanOfferingId=best["TrainingPlanOfferingId"], Tags=tags)
    assert answer.get("error", {}).get("code") == "ValidationException", answer
    assert server.writes.calls == [] and "badly-tagged" not in server.plans


def test_fifty_tags_of_the_longest_are_kept() -> None:
    from hyperplan.sagemaker.operations import tags_of

    tags = [{"Key": f"{i:02d}" + "k" * 126, "Value": "é" * 256} for i in range(50)]
    assert tags_of({"Tags": tags}) == tags


@pytest.mark.parametrize("arn, code", [
    pytest.param(PLAN_ARN + "nope", "ValidationException", id="unknown-plan"),  # the model lists no other
    pytest.param(f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:cluster/abcdefabcdef", "ValidationException",
                 id="not-a-training-plan"),
    pytest.param("arn:aws:s3:::bucket", "ValidationException", id="arn-pattern"),
])
def test_list_tags_errors(server: Server, arn: str, code: str) -> None:
    answer = boto3_call(signed_in(server), "list_tags", ResourceArn=arn)
    assert answer.get("error", {}).get("code") == code, answer


@pytest.mark.parametrize("annotation, expect", [
    pytest.param('[{"Key": "a", "Value": "b"}]', [{"Key": "a", "Value": "b"}], id="as-written"),
    pytest.param("not json", [], id="unreadable"),
    pytest.param('{"Key": "a"}', [], id="not-a-list"),
    pytest.param('[{"Key": "a", "Value": 1}, {"Key": "b", "Value": "c"}]', [{"Key": "b", "Value": "c"}],
                 id="a-value-not-a-string"),
])
def test_the_tags_a_plan_holds_are_read_defensively(annotation: str, expect: list) -> None:
    from hyperplan.api.vocabulary import ANNOTATION_SAGEMAKER_TAGS as ANNOTATION_TAGS
    from hyperplan.sagemaker.operations import held_tags

    assert held_tags({"metadata": {"annotations": {ANNOTATION_TAGS: annotation}}}) == expect


def forged(offering_id: str, field: int, value: str) -> str:
    """The offering id with one field of the spec it carries changed (the digest left as it was):
    0 type, 1 count, 2 UltraServer type, 3 their count, 4 target, 5 duration, 6 and 7 the window."""
    import base64
    head, tail = offering_id.rsplit("-", 1)
    fields = base64.b32decode(tail.upper() + "=" * (-len(tail) % 8)).decode().split("|")
    fields[field] = value
    return f"{head}-{base64.b32encode('|'.join(fields).encode()).decode().rstrip('=').lower()}"


@pytest.mark.parametrize("make_id", [
    pytest.param(lambda real: "tpo-20270101t000000-0123456789abcdef", id="no-spec-in-the-id"),
    pytest.param(lambda real: "made-up", id="not-an-offering-id"),
    pytest.param(lambda real: forged(real, 1, "8"), id="count-in-the-id-changed"),
    pytest.param(lambda real: forged(real, 5, "10m"), id="longer-than-offered"),
    pytest.param(lambda real: forged(real, 0, "ml.p5e.48xlarge"), id="another-type"),
])
def test_an_offering_hyperplan_did_not_cut_buys_nothing(server: Server, make_id) -> None:
    endpoint = signed_in(server)
    real = ok(boto3_call(endpoint, "search_training_plan_offerings", **search_args()))["TrainingPlanOfferings"][0]
    server.writes.calls.clear()
    answer = boto3_call(endpoint, "create_training_plan", TrainingPlanName="forged",
                        TrainingPlanOfferingId=make_id(real["TrainingPlanOfferingId"]))
    assert answer["error"]["code"] == "ResourceNotFound", answer
    assert server.writes.calls == [] and "forged" not in server.plans


@pytest.mark.parametrize("args, code", [
    pytest.param(search_args(InstanceCount=300), "ValidationException", id="count-maximum"),
    pytest.param(search_args(TargetResources=["endpoint"]), "ValidationException", id="target-not-served"),
    pytest.param(search_args(DurationHours=100000), "ValidationException", id="duration-maximum"),
])
def test_search_errors(server: Server, args: dict, code: str) -> None:
    answer = boto3_call(signed_in(server), "search_training_plan_offerings", **args)
    assert answer.get("error", {}).get("code") == code, answer


# --------------------------------------------------------------------------- HyperPod


def test_the_cluster_and_its_instance_groups(server: Server) -> None:
    described, listed = [ok(a) for a in boto3_calls(signed_in(server), [
        {"op": "describe_cluster", "args": {"ClusterName": "lab"}}, {"op": "list_clusters", "args": {}}])]
    [summary] = listed["ClusterSummaries"]
    assert described["ClusterArn"] == summary["ClusterArn"]
    assert re.fullmatch(rf"arn:aws:sagemaker:us-west-2:{ACCOUNT}:cluster/[a-z0-9]{{12}}", summary["ClusterArn"])
    [trainers] = described["InstanceGroups"]
    assert (trainers["InstanceGroupName"], trainers["CurrentCount"], trainers["TargetCount"], trainers["Status"]) == \
        ("trainers", 3, 3, "InService")
    assert trainers["TrainingPlanArn"].endswith(":training-plan/ultra") and trainers["TrainingPlanStatus"] == "Active"
    by_arn = ok(boto3_call(signed_in(server), "describe_cluster", ClusterName=summary["ClusterArn"]))
    assert by_arn["ClusterName"] == "lab"


def test_cluster_nodes_have_stable_instance_ids_status_and_ultraserver(server: Server) -> None:
    endpoint = signed_in(server)
    first, again = [ok(a) for a in boto3_calls(endpoint, [
        {"op": "list_cluster_nodes", "args": {"ClusterName": "lab"}},
        {"op": "list_cluster_nodes", "args": {"ClusterName": "lab"}}])]
    nodes = first["ClusterNodeSummaries"]
    assert nodes == again["ClusterNodeSummaries"]
    assert all(re.fullmatch(r"i-[a-f0-9]{17}", n["InstanceId"]) for n in nodes)
    assert [n["InstanceStatus"]["Status"] for n in nodes] == ["Running", "Pending", "Failure"]
    hostnames = [n["PrivateDnsHostname"] for n in nodes]
    assert all(re.fullmatch(r"ip-10-\d+-\d+-\d+\.us-west-2\.compute\.internal", h) for h in hostnames), hostnames
    assert len(set(hostnames)) == 3
    assert nodes[2]["UltraServerInfo"] == {"Id": "us-b", "Type": "ml.u-p6e-gb200x36"}
    detail = ok(boto3_call(endpoint, "describe_cluster_node", ClusterName="lab", NodeId=nodes[0]["InstanceId"]))
    assert detail["NodeDetails"]["PrivateDnsHostname"] == hostnames[0]
    assert hostnames[0] == "ip-" + detail["NodeDetails"]["PrivatePrimaryIp"].replace(".", "-") + \
        ".us-west-2.compute.internal"
    assert detail["NodeDetails"]["Placement"] == {"AvailabilityZone": "us-west-2a"}


@pytest.mark.parametrize("op, args, code", [
    pytest.param("describe_cluster", {"ClusterName": "elsewhere"}, "ResourceNotFound", id="another-cluster"),
    pytest.param("describe_cluster_node", {"ClusterName": "lab", "NodeId": "i-0123456789abcdef0"},
                 "ResourceNotFound", id="unknown-node"),
    pytest.param("describe_cluster_node", {"ClusterName": "lab", "NodeId": "node-0"}, "ValidationException",
                 id="node-id-pattern"),
    pytest.param("update_cluster", {"ClusterName": "lab", "InstanceGroups": [
        {"InstanceGroupName": "nobody", "InstanceCount": 2, "ExecutionRole": "arn:aws:iam::111122223333:role/hp"}]},
        "ValidationException", id="a-new-group-without-a-plan"),
    pytest.param("update_cluster", {"ClusterName": "lab", "InstanceGroups": [
        {"InstanceGroupName": "nobody", "InstanceCount": 2, "ExecutionRole": "arn:aws:iam::111122223333:role/hp",
         "TrainingPlanArn": f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:training-plan/no-such-plan"}]},
        "ResourceNotFound", id="a-new-group-of-an-unknown-plan"),
    pytest.param("update_cluster", {"ClusterName": "lab", "InstanceGroups": [
        {"InstanceGroupName": "trainers", "InstanceCount": 7000, "ExecutionRole": "arn:aws:iam::111122223333:role/hp"}]}, "ValidationException",
        id="count-maximum"),
    pytest.param("batch_reboot_cluster_nodes", {"ClusterName": "lab", "NodeIds": ["i-0123456789abcdef0"] * 26},
                 "ValidationException", id="reboot-at-most-25"),
    pytest.param("batch_reboot_cluster_nodes", {"ClusterName": "elsewhere", "NodeIds": ["i-0123456789abcdef0"]},
                 "ResourceNotFound", id="reboot-another-cluster"),
])
def test_hyperpod_errors(server: Server, op: str, args: dict, code: str) -> None:
    answer = boto3_call(signed_in(server), op, **args)
    assert answer.get("error", {}).get("code") == code, answer


def test_update_cluster_sets_a_groups_count_as_the_caller(server: Server) -> None:
    server.writes.calls.clear()
    answer = ok(boto3_call(signed_in(server), "update_cluster", ClusterName="lab", InstanceGroups=[
        {"InstanceGroupName": "trainers", "InstanceCount": 5, "ExecutionRole": "arn:aws:iam::111122223333:role/hp"}]))
    assert answer["ClusterArn"].startswith("arn:aws:sagemaker:")
    assert server.writes.calls == [("patch_group", "alice", "trainers", {"spec": {"instanceCount": 5}})]


@pytest.mark.parametrize("op, value", [
    ("batch_replace_cluster_nodes", "UnschedulablePendingReplacement"),
    ("batch_reboot_cluster_nodes", "UnschedulablePendingReboot"),
], ids=["replace", "reboot"])
def test_batch_replace_and_reboot_mark_nodes_as_hyperpod_does_and_report_unknown_ones(server: Server, op: str,
                                                                                       value: str) -> None:
    server.writes.calls.clear()
    nodes = ok(boto3_call(signed_in(server), "list_cluster_nodes", ClusterName="lab"))["ClusterNodeSummaries"]
    wanted = nodes[0]["InstanceId"]
    answer = ok(boto3_call(signed_in(server), op, ClusterName="lab", NodeIds=[wanted, "i-00000000000000000"]))
    assert answer["Successful"] == [wanted]
    assert answer["Failed"] == [{"NodeId": "i-00000000000000000", "ErrorCode": "InstanceIdNotFound",
                                 "Message": "no node i-00000000000000000 in cluster lab"}]
    assert server.writes.calls == [("label_node", "alice", "trainers-0",
                                    {"sagemaker.amazonaws.com/node-health-status": value})]


# --------------------------------------------------------------------------- SigV4, pure


def test_signing_matches_the_aws_documentation_example() -> None:
    """The worked example of AWS's SigV4 documentation (IAM ListUsers, 2015-08-30): the same
    canonical request and signature, computed by the server's own functions."""
    headers = {"Host": "iam.amazonaws.com", "Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
               "X-Amz-Date": "20150830T123600Z"}
    request = canonical_request("GET", "/", "Action=ListUsers&Version=2010-05-08", headers,
                                ["content-type", "host", "x-amz-date"], b"")
    assert hashlib.sha256(request.encode()).hexdigest() == \
        "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", "20150830T123600Z", "20150830/us-east-1/iam/aws4_request",
                         hashlib.sha256(request.encode()).hexdigest()])
    import hmac
    key = signing_key("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20150830", "us-east-1", "iam")
    assert hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest() == \
        "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"


def signed_headers(at: datetime, *, service: str = "sagemaker", body: bytes = b"{}") -> dict[str, str]:
    import hmac
    stamp, day = at.strftime("%Y%m%dT%H%M%SZ"), at.strftime("%Y%m%d")
    headers = {"Host": "127.0.0.1:1", "X-Amz-Date": stamp, "X-Amz-Target": "SageMaker.ListTrainingPlans"}
    names = ["host", "x-amz-date", "x-amz-target"]
    request = canonical_request("POST", "/", "", headers, names, body)
    scope = f"{day}/us-west-2/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(request.encode()).hexdigest()])
    signature = hmac.new(signing_key(KEY.secret, day, "us-west-2", service), to_sign.encode(),
                         hashlib.sha256).hexdigest()
    headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={KEY.key_id}/{scope}, "
                                f"SignedHeaders={';'.join(names)}, Signature={signature}")
    return headers


@pytest.mark.parametrize("signed_at, service, body, code", [
    pytest.param(NOW, "sagemaker", b"{}", None, id="fresh-and-right"),
    pytest.param(NOW - timedelta(minutes=4), "sagemaker", b"{}", None, id="within-the-skew"),
    pytest.param(NOW - timedelta(minutes=6), "sagemaker", b"{}", "InvalidSignatureException", id="too-old"),
    pytest.param(NOW + timedelta(minutes=6), "sagemaker", b"{}", "InvalidSignatureException", id="from-the-future"),
    pytest.param(NOW, "ec2", b"{}", "InvalidSignatureException", id="another-service"),
    pytest.param(NOW, "sagemaker", b'{"MaxResults": 1}', "SignatureDoesNotMatch", id="body-changed-after-signing"),
])
def test_verify(signed_at: datetime, service: str, body: bytes, code: str | None) -> None:
    headers = signed_headers(signed_at, service=service)
    if code is None:
        caller = verify("POST", "/", "", headers, body, {KEY.key_id: KEY}.get, NOW)
        assert caller.key.user == "alice" and caller.region == "us-west-2"
        return
    with pytest.raises(ApiError) as raised:
        verify("POST", "/", "", headers, body, {KEY.key_id: KEY}.get, NOW)
    assert raised.value.code == code and raised.value.status == 403


@pytest.mark.parametrize("address, tls, allowed", [
    ("127.0.0.1", False, True), ("::1", False, True), ("localhost", False, True),
    ("0.0.0.0", False, False), ("10.0.0.5", False, False), ("0.0.0.0", True, True),
])
def test_plain_http_only_on_loopback(address: str, tls: bool, allowed: bool) -> None:
    if allowed:
        check_address(address, tls)
    else:
        with pytest.raises(ValueError, match="loopback"):
            check_address(address, tls)


def test_the_skew_is_five_minutes() -> None:
    assert signing.MAX_SKEW == timedelta(minutes=5)


def test_a_listing_derives_only_the_plans_that_changed(monkeypatch) -> None:
    """10,000 plans must not be unpacked and validated on every page: a plan's view is kept per
    version of it, and only a new version (or a plan not seen before) is derived again."""
    from hyperplan.wiring.events import hp_plans
    from hyperplan.sagemaker import operations

    packed = {f"p{i}": [asyncio.run(hp_plans(name=f"p{i}", body=plan(f"p{i}", "Active", i)))[f"p{i}"]]
              for i in range(5)}
    cache = WatchCache()
    cache.bind({PLANS: packed, POOLS: {}, GROUPS: {}, NODES: {}})
    derived: list[str] = []
    real = operations.plan_summary
    monkeypatch.setattr(operations, "plan_summary",
                        lambda plan, ctx, detail: derived.append(plan.metadata["name"]) or real(plan, ctx, detail=detail))
    views = operations.PlanViews()
    ctx = operations.Context(fleet=cache, account=ACCOUNT, region="us-west-2", now=NOW, views=views)
    first = operations.list_training_plans({}, ctx)
    assert sorted(derived) == [f"p{i}" for i in range(5)]
    derived.clear()
    walks = []
    real_entries = cache.plan_entries
    monkeypatch.setattr(cache, "plan_entries", lambda: walks.append(1) or real_entries())
    again = operations.list_training_plans({}, ctx)
    assert derived == [] and again == first
    assert walks == []  # nothing changed since the last listing: not even a walk over the plans
    changed = plan("p3", "Expired", 3)
    changed["metadata"]["resourceVersion"] = "2"
    packed["p3"] = [asyncio.run(hp_plans(name="p3", body=changed))["p3"]]
    cache.plans_version += 1  # the watch's event of the change (wiring.events.plan_event)
    listed = operations.list_training_plans({}, ctx)
    assert derived == ["p3"]
    assert {s["TrainingPlanName"]: s["Status"] for s in listed["TrainingPlanSummaries"]}["p3"] == "Expired"


# --------------------------------------------------------------------------- both replicas serve


class FakeResponse:
    """A raw response of the Kubernetes client: a listing's body, or a watch stream that yields
    the events put on ``events`` until it is closed (as ``NodeWatch.close`` closes it)."""

    def __init__(self, data: bytes = b"", events=None) -> None:
        self.data, self.events, self.closed = data, events, threading.Event()

    def stream(self, amt, decode_content=True):
        import queue
        while not self.closed.is_set():
            try:
                yield (json.dumps(self.events.get(timeout=0.02)) + "\n").encode()
            except queue.Empty:
                continue

    def shutdown(self) -> None:
        self.closed.set()

    def close(self) -> None:
        self.closed.set()

    def release_conn(self) -> None:
        pass


class FakeKind:
    """One kind as a NodeWatch lists and watches it (``list_node``), with the calls counted."""

    def __init__(self, items: list[dict]) -> None:
        import queue
        self.items, self.events, self.lists, self.watches = items, queue.Queue(), 0, 0

    def list_node(self, watch: bool = False, **_) -> FakeResponse:
        if watch:
            self.watches += 1
            return FakeResponse(events=self.events)
        self.lists += 1
        return FakeResponse(json.dumps({"metadata": {"resourceVersion": "5"}, "items": self.items}).encode())


class ReplicaServer:
    """A ReplicaApi (the API as a standby serves it) on a loopback port, on a loop of its own,
    over fake listings of each kind."""

    def __init__(self, kinds: dict[str, FakeKind]) -> None:
        from hyperplan.planning.policy import DEMO
        from hyperplan.sagemaker.replica import ReplicaApi, ReplicaCache
        from hyperplan.settings import Settings

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.kinds = kinds
        self.writes = RecordingWrites()
        self.writes.plans = {}
        settings = Settings(sagemaker_api_port=self.port, aws_account_id=ACCOUNT, cluster_name="lab")
        self.own = ReplicaCache(None, lister_of=kinds.__getitem__)
        self.api = ReplicaApi(settings, None, lambda: datetime.now(timezone.utc), DEMO, own=self.own,
                              access=FakeAccess(), writes=self.writes)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.task = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        asyncio.run_coroutine_threadsafe(asyncio.wait_for(asyncio.shield(self.task), 10), self.loop).result(15)

    async def _start(self):
        return self.api.start()

    def on_loop(self, fn):
        async def run():
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.api.cleanup(), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_a_standby_serves_from_a_read_only_watch_of_its_own_until_kopf_has_listed() -> None:
    """The API of a replica without kopf: its own listing of every kind, then the watch's events
    (a plan modified, a plan deleted) are what boto3 reads; a write goes through the writes as the
    caller; nothing is handed on to reconcile. Once kopf has listed (``indexed``), the API reads
    kopf's cache and its own watches stop."""
    from hyperplan.wiring.events import hp_plans

    kinds = {"trainingplans": FakeKind([plan("seen", "Scheduled", 1), plan("going", "Active", 2)]),
             "capacitypools": FakeKind([P5_POOL]),
             "instancegroups": FakeKind([group("trainers", "seen", 1)]),
             "nodes": FakeKind([node("trainers-0", "trainers")])}
    server = ReplicaServer(kinds)
    try:
        endpoint = Endpoint(f"http://127.0.0.1:{server.port}", KEY.key_id, KEY.secret)
        listed, described, nodes = [ok(a) for a in boto3_calls(endpoint, [
            {"op": "list_training_plans", "args": {"SortBy": "TrainingPlanName"}},
            {"op": "describe_training_plan", "args": {"TrainingPlanName": "seen"}},
            {"op": "list_cluster_nodes", "args": {"ClusterName": "lab"}}])]
        assert [s["TrainingPlanName"] for s in listed["TrainingPlanSummaries"]] == ["going", "seen"]
        assert described["Status"] == "Scheduled"
        assert [n["InstanceGroupName"] for n in nodes["ClusterNodeSummaries"]] == ["trainers"]

        active = plan("seen", "Active", 1)
        active["metadata"]["resourceVersion"] = "6"
        kinds["trainingplans"].events.put({"type": "MODIFIED", "object": active})
        kinds["trainingplans"].events.put({"type": "DELETED", "object": plan("going", "Active", 2)})

        def caught_up() -> bool:
            names = [s["TrainingPlanName"] for s in ok(boto3_call(endpoint, "list_training_plans"))["TrainingPlanSummaries"]]
            return names == ["seen"]
        eventually(caught_up, timeout=20, interval=0.2, what="the standby's watch caught up")
        assert ok(boto3_call(endpoint, "describe_training_plan", TrainingPlanName="seen"))["Status"] == "Active"

        best = ok(boto3_call(endpoint, "search_training_plan_offerings", **search_args()))["TrainingPlanOfferings"][0]
        made = ok(boto3_call(endpoint, "create_training_plan", TrainingPlanName="bought-on-the-standby",
                             TrainingPlanOfferingId=best["TrainingPlanOfferingId"]))
        assert made["TrainingPlanArn"].endswith(":training-plan/bought-on-the-standby")
        assert [c[:3] for c in server.writes.calls] == [("create_plan", "alice", "bought-on-the-standby")]
        assert all((k.lists, k.watches) == (1, 1) for k in kinds.values()), {p: (k.lists, k.watches)
                                                                              for p, k in kinds.items()}

        kopfs = WatchCache()  # kopf's indexes, once listed on this replica (it leads now)
        kopfs.bind({PLANS: {"from-kopf": [asyncio.run(hp_plans(name="from-kopf", body=plan("from-kopf", "Active", 3)))
                                          ["from-kopf"]]}, POOLS: {}, GROUPS: {}, NODES: {}})
        server.on_loop(lambda: server.api.indexed(kopfs))
        server.on_loop(lambda: server.api.indexed(kopfs))  # every later event: nothing more
        after = ok(boto3_call(endpoint, "list_training_plans"))["TrainingPlanSummaries"]
        assert [s["TrainingPlanName"] for s in after] == ["from-kopf"]  # not a view of the own cache's listing
        eventually(lambda: all(not w._thread.is_alive() for w in server.own.watches), timeout=20,
                   what="the own watches stopped")
    finally:
        server.close()


def test_the_standbys_indexes_hold_what_kopfs_hold() -> None:
    """The own watch's index of each kind holds exactly what kopf's index handler makes of an
    object (plans packed, pools and groups slim), so every operation reads the same shapes."""
    from hyperplan.wiring.events import hp_groups, hp_plans
    from hyperplan.sagemaker.replica import KindStore

    posted: list = []
    cache = WatchCache()
    stores = {p: KindStore(p, cache, posted.append) for p in ("trainingplans", "capacitypools", "instancegroups")}
    body = plan("p", "Active", 1)
    body["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    stores["trainingplans"].replace([body], True)
    stores["instancegroups"].apply("ADDED", group("g", "p", 1))
    stores["capacitypools"].apply("ADDED", P5_POOL)
    assert all(s.index == {} for s in stores.values())  # nothing changes until the loop runs it
    before = cache.plans_version
    for change in posted:
        change()
    assert stores["trainingplans"].index["p"][0].unpack() == asyncio.run(hp_plans(name="p", body=body))["p"].unpack()
    assert stores["instancegroups"].index["g"] == [asyncio.run(hp_groups(name="g", body=group("g", "p", 1)))["g"]]
    assert stores["capacitypools"].index["p5-west"][0]["spec"] == P5_POOL["spec"]
    assert cache.plans_version == before + 1
    posted.clear()
    stores["trainingplans"].apply("DELETED", body)
    stores["capacitypools"].replace([], False)  # a relisting without the pool: it went meanwhile
    for change in posted:
        change()
    assert stores["trainingplans"].index == {} and stores["capacitypools"].index == {}



def test_the_pages_of_a_listing_are_cut_from_one_order_per_change_of_the_plans(monkeypatch) -> None:
    """Paging through every plan sorts them once, not once a page; a change of the plans (the
    watch's event) sorts them again, and the next page still follows the token."""
    from hyperplan.sagemaker import operations

    plans = {f"p{i:03d}": [plan(f"p{i:03d}", "Active", i)] for i in range(250)}
    cache = WatchCache()
    cache.bind({PLANS: plans, POOLS: {}, GROUPS: {}, NODES: {}})
    sorts: list[int] = []
    real = operations.ordered
    monkeypatch.setattr(operations, "ordered", lambda items: sorts.append(1) or real(items))
    ctx = operations.Context(fleet=cache, account=ACCOUNT, region="us-west-2", now=NOW, views=operations.PlanViews())
    for order in ("Ascending", "Descending"):
        sorts.clear()
        body, names = {"SortBy": "TrainingPlanName", "SortOrder": order, "MaxResults": 40}, []
        while True:
            out = operations.list_training_plans(body, ctx)
            names += [s["TrainingPlanName"] for s in out["TrainingPlanSummaries"]]
            if "NextToken" not in out:
                break
            if len(names) == 120:  # a plan changes mid-listing: sorted again, and the pages go on
                plans["p000"] = [plan("p000", "Expired", 0)]
                cache.plans_version += 1
            body = {**body, "NextToken": out["NextToken"]}
        assert names == sorted(plans, reverse=order == "Descending")
        assert len(sorts) == 2, sorts


def test_a_held_review_is_answered_on_the_loop_and_an_old_one_is_asked_again() -> None:
    """While RBAC's answer for the key's identity is held, the server checks on the event loop
    (no API call, no thread); once it is older than REVIEW_SECONDS it is asked again."""
    from hyperplan.sagemaker.access import REVIEW_SECONDS, KubeAccess, check_rights, rights_known

    now = [100.0]
    access = KubeAccess(api=None, namespace="default", clock=lambda: now[0])  # no API: any call would fail
    assert not rights_known(access, KEY, "ListTrainingPlans")
    access._reviews[("alice", "list", "hyperplan.dev", "trainingplans")] = (100.0, True)
    access._reviews[("alice", "get", "hyperplan.dev", "trainingplans")] = (100.0, False)
    # A refused read may still be served for the key's own plans: that asks whether it may buy.
    assert rights_known(access, KEY, "ListTrainingPlans") and not rights_known(access, KEY, "DescribeTrainingPlan")
    access._reviews[("alice", "create", "hyperplan.dev", "trainingplans")] = (100.0, False)
    assert rights_known(access, KEY, "DescribeTrainingPlan")
    assert check_rights(access, KEY, "ListTrainingPlans") is None  # every plan
    with pytest.raises(ApiError) as refused:
        check_rights(access, KEY, "DescribeTrainingPlan")
    assert refused.value.code == "AccessDeniedException"
    access._reviews[("alice", "create", "hyperplan.dev", "trainingplans")] = (100.0, True)
    assert check_rights(access, KEY, "DescribeTrainingPlan") == "alice"  # its own plans only
    now[0] += REVIEW_SECONDS + 1
    assert not rights_known(access, KEY, "ListTrainingPlans")
    assert rights_known(access, KEY, "NoSuchOperation")  # stands for no right: answered by name


def test_a_refusal_is_held_for_less_time_than_a_grant() -> None:
    """An admin who grants a refused caller its right sees the caller's retry served within
    REFUSAL_SECONDS, while a grant stays held for REVIEW_SECONDS."""
    from hyperplan.sagemaker.access import REFUSAL_SECONDS, REVIEW_SECONDS, KubeAccess

    assert REFUSAL_SECONDS < REVIEW_SECONDS
    now = [100.0]
    access = KubeAccess(api=None, namespace="default", clock=lambda: now[0])
    access._reviews[("alice", "list", "hyperplan.dev", "trainingplans")] = (100.0, True)
    access._reviews[("alice", "get", "hyperplan.dev", "trainingplans")] = (100.0, False)
    now[0] += REFUSAL_SECONDS / 2
    assert access.known(KEY, "get", "hyperplan.dev", "trainingplans") is False
    now[0] = 100.0 + REFUSAL_SECONDS + 0.1
    assert access.known(KEY, "get", "hyperplan.dev", "trainingplans") is None  # asked again
    assert access.known(KEY, "list", "hyperplan.dev", "trainingplans") is True  # still held
    now[0] = 100.0 + REVIEW_SECONDS + 0.1
    assert access.known(KEY, "list", "hyperplan.dev", "trainingplans") is None
