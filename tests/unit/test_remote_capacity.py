"""The SageMaker client of a remote pool (actuation.remote.SageMakerCapacity) under botocore's
Stubber, which checks every request against the service model (names, types, required members),
and the pure reading of its answers (planning.remote). Each call and each error the endpoint may
answer is covered; the metrics count them by operation and result."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import boto3
import pytest
from botocore.stub import Stubber

from hyperplan import metrics
from hyperplan.actuation.remote.calls import RemoteError, client_config
from hyperplan.actuation.remote.sagemaker import SageMakerCapacity
from hyperplan.actuation.remote.sources import RemoteFollower
from hyperplan.api.models import SageMakerSource
from hyperplan.planning.offerings import OfferingRequest
from hyperplan.planning.policy import DEMO, SAGEMAKER
from hyperplan.planning.remote import (
    MAX_ATTEMPTS, RemoteBlock, RemotePlan, attempt_of, duration_hours, mirror_lines, offerings_of, plan_of,
    remote_plan_name, search_arguments, standing_of, within_fee, RemoteOffering,
)

UTC = timezone.utc
START = datetime(2027, 1, 5, 11, 30, tzinfo=UTC)
P5 = "ml.p5.48xlarge"
UID = "0c6f9a52-1111-4a8e-9d6e-2a41c0ffee00"
ARN = "arn:aws:sagemaker:us-east-1:111122223333:training-plan/hp-x-0"


@pytest.fixture
def stubbed():
    client = boto3.session.Session(aws_access_key_id="AKIAEXAMPLE", aws_secret_access_key="secret",
                                   region_name="us-east-1").client(
        "sagemaker", endpoint_url="http://127.0.0.1:9", config=client_config())
    capacity = SageMakerCapacity(SageMakerSource(endpoint="http://127.0.0.1:9", region="us-east-1"), client=client)
    with Stubber(client) as stub:
        yield capacity, stub
        stub.assert_no_pending_responses()


def counted(operation: str, result: str) -> float:
    return metrics.REMOTE_CALLS.labels(operation, result)._value.get()


def request(**kw) -> OfferingRequest:
    fields = dict(instance_type=P5, instance_count=8, ultra_server_type=None, ultra_server_count=None,
                  target="hyperpod-cluster", duration=timedelta(hours=48))
    return OfferingRequest(**{**fields, **kw})


def summary(name: str, status: str = "Scheduled", **rc) -> dict:
    return {"TrainingPlanArn": f"arn:aws:sagemaker:us-east-1:111122223333:training-plan/{name}",
            "TrainingPlanName": name, "Status": status, "ReservedCapacitySummaries": [{
                "ReservedCapacityArn": "arn:aws:sagemaker:us-east-1:111122223333:reserved-capacity/rc-abc-0",
                "InstanceType": P5, "TotalInstanceCount": 8, "Status": status, "AvailabilityZone": "use1-az1",
                "StartTime": START, "EndTime": START + timedelta(hours=48), **rc}]}


# --------------------------------------------------------------------------- the calls


def test_the_client_is_set_on_purpose() -> None:
    config = client_config()
    assert config.retries == {"mode": "standard", "total_max_attempts": 3}
    assert (config.connect_timeout, config.read_timeout, config.max_pool_connections) == (5.0, 20.0, 64)


def test_search_sends_the_plans_request_as_the_model_names_it(stubbed) -> None:
    capacity, stub = stubbed
    arguments = search_arguments(request(start_after=START, end_before=START + timedelta(days=7)), SAGEMAKER)
    stub.add_response("search_training_plan_offerings", {"TrainingPlanOfferings": []}, {
        "TargetResources": ["hyperpod-cluster"], "DurationHours": 48, "InstanceType": P5, "InstanceCount": 8,
        "StartTimeAfter": START, "EndTimeBefore": START + timedelta(days=7)})
    before = counted("SearchTrainingPlanOfferings", "ok")

    assert capacity.search(arguments) == {"TrainingPlanOfferings": []}
    assert counted("SearchTrainingPlanOfferings", "ok") == before + 1


def test_an_ultraserver_search_asks_for_ultraservers() -> None:
    args = search_arguments(request(instance_type=None, instance_count=None, ultra_server_type="ml.u-p6e-gb200x72",
                                    ultra_server_count=2), SAGEMAKER)
    assert args == {"TargetResources": ["hyperpod-cluster"], "DurationHours": 48,
                    "UltraServerType": "ml.u-p6e-gb200x72", "UltraServerCount": 2}


@pytest.mark.parametrize("policy, duration, hours", [
    (SAGEMAKER, timedelta(days=2), 48),
    (DEMO, timedelta(minutes=2), 48),  # the demo's day is a minute: the remote reads hours in its days
], ids=["production-hours", "demo-days-in-minutes"])
def test_hours_are_counted_in_the_policys_days(policy, duration, hours) -> None:
    assert duration_hours(request(duration=duration), policy) == hours


def test_create_carries_the_name_offering_spares_and_tags(stubbed) -> None:
    capacity, stub = stubbed
    stub.add_response("create_training_plan", {"TrainingPlanArn": ARN}, {
        "TrainingPlanName": "hp-x-0", "TrainingPlanOfferingId": "tpo-1", "SpareInstanceCountPerUltraServer": 1,
        "Tags": [{"Key": "hyperplan.dev/training-plan", "Value": "llama"}]})

    assert capacity.create_plan("hp-x-0", "tpo-1", 1, {"hyperplan.dev/training-plan": "llama"}) == ARN


@pytest.mark.parametrize("code, status", [
    ("ResourceInUse", 400), ("ResourceNotFound", 400), ("ResourceLimitExceeded", 400),
    ("ValidationException", 400), ("ThrottlingException", 400), ("InternalFailure", 500),
], ids=lambda v: str(v))
def test_every_error_of_create_is_a_remote_error_with_its_code(stubbed, code, status) -> None:
    capacity, stub = stubbed
    stub.add_client_error("create_training_plan", service_error_code=code, service_message=f"it said {code}",
                          http_status_code=status)
    before = counted("CreateTrainingPlan", code)

    with pytest.raises(RemoteError) as e:
        capacity.create_plan("hp-x-0", "tpo-1", None, {})
    assert (e.value.operation, e.value.code, e.value.message) == ("CreateTrainingPlan", code, f"it said {code}")
    assert e.value.refused is (status < 500 and code != "ThrottlingException")  # answered no, or could not
    assert "CreateTrainingPlan at http://127.0.0.1:9 failed" in str(e.value)
    assert counted("CreateTrainingPlan", code) == before + 1


def test_describe_answers_none_for_a_plan_the_endpoint_does_not_know(stubbed) -> None:
    capacity, stub = stubbed
    stub.add_client_error("describe_training_plan", service_error_code="ResourceNotFound",
                          expected_params={"TrainingPlanName": "hp-x-0"})
    stub.add_response("describe_training_plan", summary("hp-x-1"), {"TrainingPlanName": "hp-x-1"})

    assert capacity.describe_plan("hp-x-0") is None
    assert plan_of(capacity.describe_plan("hp-x-1")).status == "Scheduled"


def test_list_pages_through_every_plan(stubbed) -> None:
    capacity, stub = stubbed
    stub.add_response("list_training_plans", {"TrainingPlanSummaries": [summary("a")], "NextToken": "t1"},
                      {"MaxResults": 100})
    stub.add_response("list_training_plans", {"TrainingPlanSummaries": [summary("b")]},
                      {"MaxResults": 100, "NextToken": "t1"})

    assert [s["TrainingPlanName"] for s in capacity.list_plans()] == ["a", "b"]


def test_one_listing_serves_every_plan_that_asks_within_its_age(stubbed) -> None:
    capacity, stub = stubbed
    now = [0.0]
    follower = RemoteFollower(clock=lambda: now[0])
    stub.add_response("list_training_plans", {"TrainingPlanSummaries": [summary("a")]}, {"MaxResults": 100})
    stub.add_response("list_training_plans", {"TrainingPlanSummaries": [summary("a"), summary("b")]},
                      {"MaxResults": 100})

    first = follower.plans("pool", capacity, max_age=5)
    now[0] = 4
    again = follower.plans("pool", capacity, max_age=5)  # no call: the Stubber would refuse a third
    now[0] = 6
    later = follower.plans("pool", capacity, max_age=5)
    assert [p.name for p in first] == [p.name for p in again] == ["a"]
    assert sorted(p.name for p in later) == ["a", "b"]


# --------------------------------------------------------------------------- reading the answers


@pytest.mark.parametrize("uid, attempt", [(UID, 0), (UID, 7)], ids=["first", "last"])
def test_remote_names_fit_the_api_and_name_their_plan(uid, attempt) -> None:
    import re
    name = remote_plan_name(uid, attempt)
    assert re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,63}", name)
    assert attempt_of(name, uid) == attempt
    assert attempt_of(name, "another-uid") is None
    assert attempt_of(f"{name}x", uid) is None


@pytest.mark.parametrize("statuses, live, next_attempt, exhausted", [
    ([], None, 0, False),
    (["Pending"], 0, 1, False),
    (["Failed"], None, 1, False),
    (["Failed", "Scheduled"], 1, 2, False),
    (["Failed"] * MAX_ATTEMPTS, None, MAX_ATTEMPTS, True),
], ids=["none", "one-pending", "one-failed", "failed-then-bought", "every-attempt-failed"])
def test_the_standing_of_a_plans_remote_attempts(statuses, live, next_attempt, exhausted) -> None:
    plans = [RemotePlan(remote_plan_name(UID, n), f"arn/{n}", s) for n, s in enumerate(statuses)]
    plans.append(RemotePlan(remote_plan_name("someone-else", 0), "arn/x", "Active"))  # never ours
    standing = standing_of(plans, UID)
    assert (standing.live.name if standing.live else None) == (remote_plan_name(UID, live) if live is not None else None)
    assert (standing.next_attempt, standing.exhausted) == (next_attempt, exhausted)


def test_offerings_keep_only_what_the_pool_sells_and_take_a_local_id() -> None:
    def entry(oid, itype=P5, zone="use1-az1", **extra):
        return {"TrainingPlanOfferingId": oid, "TargetResources": ["hyperpod-cluster"], "UpfrontFee": "10",
                "ReservedCapacityOfferings": [{"InstanceType": itype, "InstanceCount": 8, "AvailabilityZone": zone,
                                               "StartTime": START, "EndTime": START + timedelta(hours=48), **extra}]}
    answer = {"TrainingPlanOfferings": [entry("good"), entry("trn", itype="ml.trn1.32xlarge"),
                                        entry("far", zone="use1-az9"), entry("undated", StartTime=None)]}

    [found] = offerings_of(answer, "remote", P5, "use1-az1", None, request())
    assert found.remote_id == "good"
    assert found.offering.id.startswith("tpo-20270105t113000-")
    assert [(b.pool, b.instance_count) for b in found.offering.blocks] == [("remote", 8)]


@pytest.mark.parametrize("fee, ceiling, ok", [
    ("100.00", None, True), (None, None, True), ("100.00", "100", True), ("100.01", "100", False),
    (None, "100", False), ("a lot", "100", False),
], ids=["no-ceiling", "no-fee-no-ceiling", "at-ceiling", "above", "unknown-fee", "unreadable-fee"])
def test_the_fee_ceiling(fee, ceiling, ok) -> None:
    offering = RemoteOffering(offering=None, remote_id="x", upfront_fee=fee)  # type: ignore[arg-type]
    assert within_fee(offering, ceiling) is ok


@pytest.mark.parametrize("arn, block_id", [
    ("arn:aws:sagemaker:us-east-1:111122223333:reserved-capacity/rc-0c6f9a521111-0", "rc-0c6f9a521111-0"),
    ("arn:aws:sagemaker:us-east-1:111122223333:reserved-capacity/Some_ID/With Spaces", None),
    ("arn:aws:sagemaker:us-east-1:111122223333:reserved-capacity/" + "x" * 80, None),
], ids=["hyperplans-own", "not-label-safe", "too-long"])
def test_block_ids_are_label_values(arn, block_id) -> None:
    import re
    got = RemoteBlock(arn, P5, 8, "use1-az1", START, START + timedelta(hours=1), "Scheduled").id
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?", got)
    if block_id is not None:
        assert got == block_id


@pytest.mark.parametrize("status, itype, recorded", [
    ("Scheduled", P5, 1), ("Active", P5, 1), ("Pending", P5, 1), ("Failed", P5, 0), ("Expired", P5, 1),
    ("Scheduled", "ml.trn1.32xlarge", 0),
], ids=["scheduled", "active", "pending-with-blocks", "failed", "expired", "other-type"])
def test_mirror_lines_record_only_live_blocks_of_the_pools_type(status, itype, recorded) -> None:
    remote = plan_of(summary("hp-x-0", status, InstanceType=itype))
    lines, refused = mirror_lines(remote, "llama", UID, P5, "use1-az1")
    assert len(lines) == recorded
    assert bool(refused) == (itype != P5)
    for line in lines:
        assert line.remote_training_plan_arn == remote.arn and line.reserved_capacity_id == "rc-abc-0"


@pytest.mark.parametrize("waited, every", [(0, 2), (4, 2), (20, 5), (60, 15), (600, 20)],
                         ids=["just-bought", "a-few-seconds", "twenty-seconds", "a-minute", "ten-minutes"])
def test_a_plan_waiting_for_the_remote_looks_less_often_the_longer_it_waits(waited, every) -> None:
    from hyperplan.actuation.remote.sources import RemoteSources
    sources = RemoteSources(credentials=lambda name: None)
    sources.waiting_every("uid", True, 1000.0, 2, 20)
    assert sources.waiting_every("uid", True, 1000.0 + waited, 2, 20) == every
    assert sources.waiting_every("uid", False, 1000.0 + waited, 2, 20) == 2 and "uid" not in sources.waiting_since


def test_a_listing_that_takes_long_is_made_less_often() -> None:
    class Slow:
        endpoint = "http://x"
        calls = 0

        def remote_plans(self):
            Slow.calls += 1
            now[0] += 0.05  # the listing takes 0.05 s of the follower's clock
            return [plan_of(summary("a"))]
    now = [0.0]
    follower = RemoteFollower(clock=lambda: now[0])
    follower.plans("k", Slow(), max_age=0.1)
    now[0] = 0.2  # older than asked, younger than 10 x the 0.05 s the listing took
    follower.plans("k", Slow(), max_age=0.1)
    now[0] = 0.6
    follower.plans("k", Slow(), max_age=0.1)
    assert Slow.calls == 2


def test_a_forgotten_listing_is_made_again_and_keeps_the_plans_this_process_made() -> None:
    """A refused create forgets the endpoint's listing; a plan another pass bought a moment ago,
    which the remote's next listing does not show yet, stays believed (else it is bought again)."""
    class Lagging:
        endpoint = "http://x"
        calls = 0

        def remote_plans(self):
            Lagging.calls += 1
            return [plan_of(summary("a"))]  # "b" was just made: not listed yet
    now = [0.0]
    follower = RemoteFollower(clock=lambda: now[0])
    follower.plans("k", Lagging(), max_age=10)
    follower.saw("k", plan_of(summary("b")))
    now[0] = 1.0

    follower.forget("k")

    assert sorted(p.name for p in follower.plans("k", Lagging(), max_age=10)) == ["a", "b"]
    assert Lagging.calls == 2  # listed again at once, younger than max_age


def test_a_live_plan_one_listing_misses_is_kept_over_that_listing_only() -> None:
    """A listing paged while the remote's plans change may miss one it showed before (its
    StartTime order moved past the page being read); one missing twice is gone."""
    answers = [["a", "b"], ["a"], ["a"], ["a", "b"]]

    class Paging:
        endpoint = "http://x"

        def remote_plans(self):
            return [plan_of(summary(name)) for name in answers.pop(0)]
    now = [0.0]
    follower = RemoteFollower(clock=lambda: now[0])
    shown = []
    for _ in range(4):
        shown.append(sorted(p.name for p in follower.plans("k", Paging(), max_age=1)))
        now[0] += 2
    assert shown == [["a", "b"], ["a", "b"], ["a"], ["a", "b"]]


# --------------------------------------------------------------------------- extensions


def _block(end: datetime = START + timedelta(hours=48)):
    from hyperplan.planning.blocks import Block
    return Block(pool="remote-p5", availability_zone="use1-az1", instance_type=P5, instance_count=8, start=START,
                 end=end, id="rc-abc-0")


def test_extension_offerings_are_searched_with_the_remote_plans_arn(stubbed) -> None:
    capacity, stub = stubbed
    end = START + timedelta(hours=48)
    stub.add_response("search_training_plan_offerings", {"TrainingPlanOfferings": [], "TrainingPlanExtensionOfferings": [
        {"TrainingPlanExtensionOfferingId": "tpe-x", "AvailabilityZone": "use1-az1", "StartDate": end,
         "EndDate": end + timedelta(hours=72), "DurationHours": 72, "UpfrontFee": "10.00", "CurrencyCode": "USD"}]},
        {"TrainingPlanArn": ARN})

    [ext] = capacity.find_extensions(plan_of(summary("hp-x-0")), UID, [_block()], SAGEMAKER)
    assert (ext.remote_id, ext.extension.days, ext.extension.end, ext.upfront_fee) == (
        "tpe-x", 3, end + timedelta(hours=72), "10.00")
    assert ext.extension.id.startswith("tpe-") and ext.extension.id != "tpe-x"


def test_extend_and_the_history_are_the_models_calls(stubbed) -> None:
    capacity, stub = stubbed
    end = START + timedelta(hours=48)
    taken = {"TrainingPlanExtensionOfferingId": "tpe-x", "StartDate": end, "EndDate": end + timedelta(hours=24),
             "Status": "Pending"}
    stub.add_response("extend_training_plan", {"TrainingPlanExtensions": [taken]},
                      {"TrainingPlanExtensionOfferingId": "tpe-x"})
    stub.add_response("describe_training_plan_extension_history",
                      {"TrainingPlanExtensions": [], "NextToken": "t1"}, {"TrainingPlanArn": ARN, "MaxResults": 100})
    stub.add_response("describe_training_plan_extension_history", {"TrainingPlanExtensions": [taken]},
                      {"TrainingPlanArn": ARN, "MaxResults": 100, "NextToken": "t1"})
    remote = plan_of(summary("hp-x-0"))
    from hyperplan.planning.remote import RemoteExtension
    from hyperplan.planning.offerings import Extension
    ext = RemoteExtension(Extension("tpe-local", _block(), end + timedelta(hours=24), 1), "tpe-x")

    [record] = capacity.extend(remote, ext)
    [again] = capacity.extension_history(remote)
    assert record == again and (record.remote_id, record.status) == ("tpe-x", "Pending")
    assert counted("ExtendTrainingPlan", "ok") >= 1


@pytest.mark.parametrize("code", ["ResourceNotFound", "ValidationException"])
def test_an_extension_no_longer_offered_is_not_bought_and_no_error_of_the_pass(stubbed, code) -> None:
    from hyperplan.actuation.remote.calls import NotBought
    from hyperplan.planning.remote import RemoteExtension
    from hyperplan.planning.offerings import Extension
    capacity, stub = stubbed
    stub.add_client_error("extend_training_plan", service_error_code=code, http_status_code=400,
                          expected_params={"TrainingPlanExtensionOfferingId": "tpe-x"})
    ext = RemoteExtension(Extension("tpe-local", _block(), START + timedelta(hours=72), 1), "tpe-x")
    with pytest.raises(NotBought):
        capacity.extend(plan_of(summary("hp-x-0")), ext)


def test_an_extension_is_asked_without_boto3s_retries() -> None:
    capacity = SageMakerCapacity(SageMakerSource(endpoint="http://127.0.0.1:9", region="us-east-1"),
                                 credentials=("AKIAEXAMPLE", "secret"))
    assert capacity._once().meta.config.retries["total_max_attempts"] == 1
    assert capacity.client.meta.config.retries["total_max_attempts"] == 3


@pytest.mark.parametrize("start_hours, status, underway", [
    (48, "Pending", True),  # starts at the block's end: not shown yet
    (48, "Failed", True),  # named too: the decision fails the entry
    (24, "Pending", False),  # starts within the block: the blocks already run over it, or another's
], ids=["taken-not-shown", "taken-then-failed", "already-held"])
def test_the_extensions_a_remote_took_that_the_blocks_do_not_show(start_hours, status, underway) -> None:
    from hyperplan.planning.offerings import extension_id
    from hyperplan.planning.remote import ExtensionRecord, extension_not_shown, extensions_underway
    start = START + timedelta(hours=start_hours)
    record = ExtensionRecord("tpe-x", start, start + timedelta(hours=24), status)
    found = extensions_underway([record], UID, [_block()])
    assert found == ({extension_id(UID, _block(), start + timedelta(hours=24)): status} if underway else {})
    assert extension_not_shown([record], plan_of(summary("hp-x-0"))) == (underway and status != "Failed")


def test_a_credentials_secret_is_read_at_most_every_ten_seconds() -> None:
    """Every remote call of a pass asks for its pool's credentials: the Secret is read from the
    API server once per interval, and a rotated key is used after it."""
    import base64
    from types import SimpleNamespace
    from hyperplan.actuation.remote.sources import CREDENTIALS_SECONDS, secret_credentials
    key = ["AKIAONE"]
    reads: list[str] = []

    class Core:
        def read_namespaced_secret(self, name: str, namespace: str):
            reads.append(name)
            data = {"AWS_ACCESS_KEY_ID": base64.b64encode(key[0].encode()).decode(),
                    "AWS_SECRET_ACCESS_KEY": base64.b64encode(b"s").decode()}
            return SimpleNamespace(data=data, metadata=SimpleNamespace(resource_version=str(len(reads))))
    now = [0.0]
    read = secret_credentials(Core(), "hyperplan", clock=lambda: now[0])
    assert read("k") == (("AKIAONE", "s"), "1")
    key[0] = "AKIATWO"
    now[0] = CREDENTIALS_SECONDS - 0.5
    assert [read("k") for _ in range(100)][-1] == (("AKIAONE", "s"), "1") and reads == ["k"]
    now[0] = CREDENTIALS_SECONDS + 0.5
    assert read("k") == (("AKIATWO", "s"), "2") and reads == ["k", "k"]


def test_a_blocks_ultraservers_are_listed_every_page_as_health_by_id(stubbed) -> None:
    from hyperplan.planning.remote import RemoteBlock
    capacity, stub = stubbed
    arn = "arn:aws:sagemaker:us-east-1:111122223333:reserved-capacity/rc-abc-0"
    block = RemoteBlock(arn=arn, instance_type="ml.p6e-gb200.36xlarge", instance_count=18, availability_zone="use1-az1",
                        start=START, end=START + timedelta(hours=48), status="Active", ultra_server_type="ml.u-p6e-gb200x36")

    def ultraserver(uid: str, health: str) -> dict:
        return {"UltraServerId": uid, "UltraServerType": "ml.u-p6e-gb200x36", "AvailabilityZone": "use1-az1",
                "InstanceType": "ml.p6e-gb200.36xlarge", "TotalInstanceCount": 9, "HealthStatus": health}
    stub.add_response("list_ultra_servers_by_reserved_capacity",
                      {"UltraServers": [ultraserver("rc-abc-0-us-0", "OK")], "NextToken": "t1"},
                      {"ReservedCapacityArn": arn, "MaxResults": 100})
    stub.add_response("list_ultra_servers_by_reserved_capacity",
                      {"UltraServers": [ultraserver("rc-abc-0-us-1", "Impaired")]},
                      {"ReservedCapacityArn": arn, "MaxResults": 100, "NextToken": "t1"})

    assert capacity.ultra_server_health(block) == {"rc-abc-0-us-0": "ok", "rc-abc-0-us-1": "impaired"}
