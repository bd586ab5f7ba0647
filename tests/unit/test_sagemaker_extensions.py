"""The extension operations of hyperplan's SageMaker API, driven by the real boto3 (its own venv):
SearchTrainingPlanOfferings with TrainingPlanArn, ExtendTrainingPlan and
DescribeTrainingPlanExtensionHistory, over a plan whose block the ledger of a real watch cache
holds (the unit seam: the server of tests/unit/test_sagemaker_api.py, with the recording writes).
The demo profile: a day is a minute, so 24 hours of the API are one minute here."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from hyperplan.api.models import to_rfc3339
from tests.aws.clients import boto3_call, boto3_calls
from tests.unit.test_sagemaker_api import ACCOUNT, DENIED, Endpoint, Server, model_checked, ok, signed_in  # noqa: F401

AT = datetime.now(timezone.utc).replace(microsecond=0)
START, END = AT + timedelta(minutes=5), AT + timedelta(minutes=10)  # the bought block (demo days)
UID = "uid-long-run"
ARN = f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:training-plan/long-run"


def bought(name: str, uid: str, extensions: list[dict] | None = None, history: list[dict] | None = None) -> dict:
    block = {"id": f"rc-{name}-0", "availabilityZone": "us-west-2a", "instanceType": "ml.p5.48xlarge",
             "instanceCount": 4, "startTime": to_rfc3339(START), "endTime": to_rfc3339(END), "status": "Scheduled"}
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "TrainingPlan",
            "metadata": {"name": name, "resourceVersion": "7", "uid": uid},
            "spec": {"targetResource": "hyperpod-cluster", "duration": "5m", "instanceType": "ml.p5.48xlarge",
                     "instanceCount": 4, "offeringId": "tpo-20270101t000000-0123456789abcdef",
                     "extensions": extensions or []},
            "status": {"phase": "Scheduled", "reservedCapacity": [block], "extensions": history or []}}


def pool(*lines: tuple[str, str, datetime, datetime]) -> dict:
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "CapacityPool",
            "metadata": {"name": "p5-west", "resourceVersion": "3"},
            "spec": {"instanceType": "ml.p5.48xlarge", "availabilityZone": "us-west-2a", "instanceCount": 8},
            "status": {"reservations": [
                {"trainingPlan": plan, "trainingPlanUid": uid, "reservedCapacityId": f"rc-{plan}-0",
                 "startTime": to_rfc3339(start), "endTime": to_rfc3339(end), "instanceCount": 4}
                for plan, uid, start, end in lines]}}


HISTORY = [
    {"offeringId": "tpe-20270101t000000-00000000000000a1", "status": "Expired", "extendedAt": "2026-12-01T00:00:00Z",
     "reservedCapacityId": "rc-history-0", "availabilityZone": "us-west-2a", "startTime": "2026-12-01T01:00:00Z",
     "endTime": "2026-12-01T01:02:00Z", "durationDays": 2},
    {"offeringId": "tpe-20270101t000000-00000000000000a2", "status": "Failed", "reason": "ExtensionNotOffered",
     "message": "not offered"},
    {"offeringId": "tpe-20270101t000000-00000000000000a3", "status": "Pending", "reason": "Extending",
     "reservedCapacityId": "rc-history-0", "availabilityZone": "us-west-2a", "startTime": "2026-12-01T01:02:00Z",
     "endTime": "2026-12-01T01:03:00Z", "durationDays": 1},
]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    plans = {"long-run": [bought("long-run", UID)], "history": [bought("history", "uid-history", history=HISTORY)],
             "unbought": [{**bought("unbought", "uid-unbought"), "status": {"phase": "Pending"}}]}
    s = Server(plans, pools={"p5-west": [pool(("long-run", UID, START, END),
                                              ("history", "uid-history", START, END))]})
    yield s
    s.close()


def test_search_with_a_plan_arn_answers_the_extension_offerings_of_its_last_block(server: Server) -> None:
    some, two_days = [ok(a) for a in boto3_calls(signed_in(server), [
        {"op": "search_training_plan_offerings", "args": {"TrainingPlanArn": ARN}},
        {"op": "search_training_plan_offerings", "args": {"TrainingPlanArn": ARN, "DurationHours": 48}}])]
    assert some["TrainingPlanOfferings"] == []
    assert [(o["StartDate"], o["EndDate"] - o["StartDate"], o["DurationHours"], o["AvailabilityZone"])
            for o in some["TrainingPlanExtensionOfferings"]] == [
        (END.timestamp(), 60.0, 24, "us-west-2a"), (END.timestamp(), 7 * 60.0, 7 * 24, "us-west-2a"),
        (END.timestamp(), 182 * 60.0, 182 * 24, "us-west-2a")]
    [offer] = two_days["TrainingPlanExtensionOfferings"]
    assert (offer["EndDate"] - offer["StartDate"], offer["DurationHours"]) == (120.0, 48)
    assert offer["TrainingPlanExtensionOfferingId"].startswith("tpe-")


def extended_twice(endpoint: Endpoint) -> tuple[dict, str, dict, dict]:
    """The plan's one-day extension offering, its id, and the answers of ExtendTrainingPlan with it
    twice (the second a retry)."""
    [offer] = ok(boto3_call(endpoint, "search_training_plan_offerings", TrainingPlanArn=ARN,
                            DurationHours=24))["TrainingPlanExtensionOfferings"]
    wanted = offer["TrainingPlanExtensionOfferingId"]
    first, again = [ok(a) for a in boto3_calls(endpoint, [
        {"op": "extend_training_plan", "args": {"TrainingPlanExtensionOfferingId": wanted}},
        {"op": "extend_training_plan", "args": {"TrainingPlanExtensionOfferingId": wanted}}])]
    return offer, wanted, first, again


def test_extend_writes_the_spec_as_the_caller_and_a_retry_writes_nothing_more(server: Server) -> None:
    endpoint = signed_in(server)
    offer, wanted, first, again = extended_twice(endpoint)
    writes = [c for c in server.writes.calls if c[0] == "extend_plan"]
    assert len(writes) == 1
    [(_, user, name, extensions, version)] = writes
    hyperplans_id = wanted.rsplit("-", 1)[0]
    assert (user, name, extensions, version) == ("alice", "long-run", [{"offeringId": hyperplans_id}], "7")
    [extension] = first["TrainingPlanExtensions"]
    assert extension["TrainingPlanExtensionOfferingId"] == wanted and extension["Status"] == "Pending"
    assert (extension["StartDate"], extension["EndDate"]) == (offer["StartDate"], offer["EndDate"])
    assert "ExtendedAt" in extension and extension["AvailabilityZone"] == "us-west-2a"
    [retried] = again["TrainingPlanExtensions"]
    assert retried["TrainingPlanExtensionOfferingId"] == wanted and retried["Status"] == "Pending"


def test_a_retry_the_watch_cache_has_not_caught_up_with_is_answered_as_a_retry() -> None:
    """Seen in e2e: boto3's second ExtendTrainingPlan read the plan from a watch cache that did not
    show the first one's write yet, and its write over that resourceVersion was refused (409). The
    plan as the API server has it lists the id already: a retry, not ConflictException."""
    s = Server({"long-run": [bought("long-run", UID)]}, pools={"p5-west": [pool(("long-run", UID, START, END))]})
    try:
        s.writes.lagging = True
        endpoint = signed_in(s)
        offer, wanted, first, again = extended_twice(endpoint)
        assert [c[0] for c in s.writes.calls if c[0] in ("extend_plan", "plan_now")] == [
            "extend_plan", "extend_plan", "plan_now"]  # the second refused, then the API server asked
        assert [e["TrainingPlanExtensionOfferingId"] for e in again["TrainingPlanExtensions"]] == [wanted]
        assert first["TrainingPlanExtensions"][0]["Status"] == "Pending"
    finally:
        s.close()


def test_the_extension_history_pages_through_the_status_records(server: Server) -> None:
    [pages] = [ok(a) for a in boto3_calls(signed_in(server), [
        {"op": "describe_training_plan_extension_history", "paginate": True,
         "args": {"TrainingPlanArn": f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:training-plan/history",
                  "PaginationConfig": {"PageSize": 2}}}])]
    assert [len(p["TrainingPlanExtensions"]) for p in pages] == [2, 1]
    listed = [e for p in pages for e in p["TrainingPlanExtensions"]]
    assert [e["Status"] for e in listed] == ["Expired", "Failed", "Pending"]
    expired = listed[0]
    assert expired["TrainingPlanExtensionOfferingId"].startswith("tpe-20270101t000000-00000000000000a1-")
    assert expired["DurationHours"] == 48 and expired["AvailabilityZone"] == "us-west-2a"
    assert expired["StartDate"] == datetime(2026, 12, 1, 1, 0, tzinfo=timezone.utc).timestamp()
    assert expired["ExtendedAt"] == datetime(2026, 12, 1, tzinfo=timezone.utc).timestamp()
    assert "StartDate" not in listed[1]


def made_up(plan: str) -> str:
    from hyperplan.sagemaker.operations import api_extension_id
    return api_extension_id("tpe-20270101t000000-0123456789abcdef", plan)


@pytest.mark.parametrize("op, args, code", [
    ("extend_training_plan", {"TrainingPlanExtensionOfferingId": "tpe-nothing"}, "ResourceNotFound"),
    ("extend_training_plan", {"TrainingPlanExtensionOfferingId": made_up("long-run")}, "ResourceNotFound"),
    ("extend_training_plan", {"TrainingPlanExtensionOfferingId": made_up("nobody")}, "ResourceNotFound"),
    ("search_training_plan_offerings", {"TrainingPlanArn": ARN.replace("long-run", "nobody")}, "ValidationException"),
    ("search_training_plan_offerings", {"TrainingPlanArn": "arn:aws:sagemaker:us-west-2:1:training-plan/x" + "x" * 40},
     "ValidationException"),
    ("search_training_plan_offerings", {"TrainingPlanArn": ARN, "DurationHours": 30}, "ValidationException"),
    ("describe_training_plan_extension_history", {"TrainingPlanArn": ARN.replace("long-run", "nobody")},
     "ResourceNotFound"),
    ("describe_training_plan_extension_history", {"TrainingPlanArn": ARN, "MaxResults": 500}, "ValidationException"),
], ids=["not-an-id-of-ours", "an-id-hyperplan-did-not-cut", "an-unknown-plan", "search-unknown-plan",
        "search-arn-pattern", "search-part-of-a-day", "history-unknown-plan", "history-max-results"])
def test_extension_errors(server: Server, op: str, args: dict, code: str) -> None:
    answer = boto3_call(signed_in(server), op, **args)
    assert answer.get("error", {}).get("code") == code, answer


def test_an_unbought_plan_has_no_extension_offerings_and_rbac_decides_who_extends(server: Server) -> None:
    endpoint = signed_in(server)
    unbought = ok(boto3_call(endpoint, "search_training_plan_offerings", TrainingPlanArn=ARN.replace(
        "long-run", "unbought")))
    assert unbought["TrainingPlanExtensionOfferings"] == []
    denied = boto3_call(Endpoint(server.url, DENIED.key_id, DENIED.secret), "extend_training_plan",
                        TrainingPlanExtensionOfferingId=made_up("long-run"))
    assert denied["error"]["code"] == "AccessDeniedException"
    assert ("mallory", "patch", "trainingplans") in server.access.reviews


def test_a_plan_whose_status_changed_since_the_cache_is_written_again_over_its_new_version() -> None:
    """Seen in e2e: the operator wrote the plan's status (a block turned Active) between the watch
    cache's read and the write, which was refused (409); both of boto3's calls answered
    ConflictException and the plan was never extended. The extensions are as read: written again."""
    held = bought("long-run", UID)
    s = Server({"long-run": [held]}, pools={"p5-west": [pool(("long-run", UID, START, END))]})
    try:
        newer = str(int(held["metadata"]["resourceVersion"]) + 1)
        s.writes.fresh["long-run"] = {**held, "metadata": {**held["metadata"], "resourceVersion": newer}}
        endpoint = signed_in(s)
        [offer] = ok(boto3_call(endpoint, "search_training_plan_offerings", TrainingPlanArn=ARN,
                                DurationHours=24))["TrainingPlanExtensionOfferings"]
        answer = ok(boto3_call(endpoint, "extend_training_plan",
                               TrainingPlanExtensionOfferingId=offer["TrainingPlanExtensionOfferingId"]))
        calls = [c for c in s.writes.calls if c[0] in ("extend_plan", "plan_now")]
        assert [c[0] for c in calls] == ["extend_plan", "plan_now", "extend_plan"]
        assert [c[4] for c in calls if c[0] == "extend_plan"] == [held["metadata"]["resourceVersion"], newer]
        assert answer["TrainingPlanExtensions"][0]["Status"] == "Pending"
    finally:
        s.close()


def test_an_extension_written_meanwhile_by_someone_else_makes_the_offering_gone() -> None:
    """The offering was cut from the plan's last block before the other extension: it is gone
    (ResourceNotFound, the model's only error of ExtendTrainingPlan), and nothing is written again."""
    held = bought("long-run", UID)
    s = Server({"long-run": [held]}, pools={"p5-west": [pool(("long-run", UID, START, END))]})
    try:
        newer = str(int(held["metadata"]["resourceVersion"]) + 1)
        theirs = [*(held["spec"].get("extensions") or []), {"offeringId": "tpe-20270101t000000-00000000000000ff"}]
        s.writes.fresh["long-run"] = {**held, "metadata": {**held["metadata"], "resourceVersion": newer},
                                      "spec": {**held["spec"], "extensions": theirs}}
        endpoint = signed_in(s)
        [offer] = ok(boto3_call(endpoint, "search_training_plan_offerings", TrainingPlanArn=ARN,
                                DurationHours=24))["TrainingPlanExtensionOfferings"]
        answer = boto3_call(endpoint, "extend_training_plan",
                            TrainingPlanExtensionOfferingId=offer["TrainingPlanExtensionOfferingId"])
        assert answer["error"]["code"] == "ResourceNotFound", answer
        assert [c[0] for c in s.writes.calls if c[0] == "extend_plan"] == ["extend_plan"]
    finally:
        s.close()
