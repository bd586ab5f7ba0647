"""A pool whose capacity a SageMaker endpoint sells (docs/aws.md), on the e2e plane: the endpoint is
the e2e operator's own SageMaker API, reached over HTTP with boto3 and a key minted for a user whose
RBAC lets it buy, so the plan goes the whole way a training cluster's plan goes to a capacity
cluster (search, CreateTrainingPlan, the remote's own purchase from its pool, following it), and
its group gets nodes on the remote's block. A second pool points at a port where nothing answers:
its plan shows the endpoint's error, then converges once the pool points at a live endpoint.

The selling pool lets only plans without the scenario's label buy (the plans the API makes carry
no labels), the remote pools only plans with it: no plan buys from the pool that buys from it."""

from __future__ import annotations

import json
import socket
import uuid
from datetime import timedelta

from tests.e2e.scenarios import Context, events_for, group_body, plan_body, pool_body, scenario, ts, utcnow, wait_phase
from tests.aws.clients import Endpoint, boto3_call
from tests.aws.keys import grant_plan_reads, mint_key, serving
from tests.kube import eventually


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def _remote_pool(name: str, itype: str, url: str, secret: str, tier: str) -> dict:
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "CapacityPool", "metadata": {"name": name},
            "spec": {"instanceType": itype, "availabilityZone": "us-east-1r",
                     "source": {"sageMaker": {"endpoint": url, "region": "us-west-2", "credentialsSecret": secret}},
                     "trainingPlanSelector": {"matchLabels": {"tier": tier}}}}


def _sold_through_the_api(ctx: Context, prefix: str, tag: str, user: str, itype: str, tier: str, size: int,
                          verbs: list[str]) -> Endpoint:
    """A key for ``user`` with ``verbs`` on trainingplans (no reads: it is served the plans it made
    only), its Secret, the fleet the API sells (to plans without a tier: the API's own) and the pool
    ``<prefix>-remote-<tag>`` that buys through the API for plans of ``tier``."""
    k = ctx.kubectl
    key_id, secret = mint_key(ctx, user)
    grant_plan_reads(ctx, user, f"{prefix}-buyer-{tag}",
                     {"apiGroups": ["hyperplan.dev"], "resources": ["trainingplans"], "verbs": verbs}, reads=False)
    endpoint = serving(ctx, key_id, secret)
    k.apply([{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{prefix}-key-{tag}", "namespace": "default"},
              "stringData": {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret}}])
    k.create(pool_body(f"{prefix}-fleet-{tag}", itype, size, az="us-east-1r", trainingPlanSelector={
        "matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}))
    k.create(_remote_pool(f"{prefix}-remote-{tag}", itype, endpoint.url, f"{prefix}-key-{tag}", tier))
    return endpoint


def _reconciled(k, name: str) -> dict | None:
    return next((c for c in (k.get("trainingplan", name).get("status") or {}).get("conditions") or []
                 if c["type"] == "Reconciled"), None)


@scenario
def remote_capacity(ctx: Context) -> dict:
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    itype, tier, user = f"ml.rc-{tag}.xlarge", f"training-{tag}", f"rc-buyer-{tag}"
    # Another team's key, with a buyer's rights only (create): it is served only the plans it made.
    other_team = f"rc-other-{tag}"
    other_id, other_secret = mint_key(ctx, other_team)
    grant_plan_reads(ctx, other_team, other_team,
                     {"apiGroups": ["hyperplan.dev"], "resources": ["trainingplans"], "verbs": ["create"]}, reads=False)
    # The buyer's key may create plans and not read them: it is served the plans it made only.
    endpoint = _sold_through_the_api(ctx, "rc", tag, user, itype, tier, 4, ["create"])
    dead_url = f"http://127.0.0.1:{_dead_port()}"
    k.create(_remote_pool(f"rc-dead-{tag}", itype, dead_url, f"rc-key-{tag}", f"dead-{tag}"))

    start = utcnow().replace(microsecond=0) + timedelta(seconds=75)
    window = {"startTimeAfter": ts(start), "endTimeBefore": ts(start + timedelta(minutes=10))}
    plan = plan_body(f"rc-{tag}", itype, 2, duration="1m", autoPurchase=True, **window)
    plan["metadata"]["labels"] = {"tier": tier}
    k.create(plan)
    k.create(group_body(f"rc-{tag}", f"rc-{tag}", itype, 2))
    ahead = plan_body(f"rc-ahead-{tag}", itype, 1, duration="1m", autoPurchase=True,
                      startTimeAfter=ts(start + timedelta(minutes=20)))
    ahead["metadata"]["labels"] = {"tier": tier}
    k.create(ahead)
    stuck = plan_body(f"rc-stuck-{tag}", itype, 1, duration="1m", autoPurchase=True, **window)
    stuck["metadata"]["labels"] = {"tier": f"dead-{tag}"}
    k.create(stuck)

    scheduled = wait_phase(k, "trainingplan", f"rc-{tag}", "Scheduled", timeout=60)
    remote_name = "hp-" + k.get("trainingplan", f"rc-{tag}")["metadata"]["uid"].replace("-", "") + "-0"
    remote_plan = k.get("trainingplan", remote_name)
    fleet = k.get("capacitypool", f"rc-fleet-{tag}")
    mirror = k.get("capacitypool", f"rc-remote-{tag}")
    down = eventually(lambda: (c := _reconciled(k, f"rc-stuck-{tag}")) and c["status"] == "False" and c,
                      timeout=60, what="the plan on a dead endpoint Reconciled=False")
    # The endpoint comes back: the pool points at a live one.
    k.run("patch", "capacitypool", f"rc-dead-{tag}", "--type=merge", "-p",
          json.dumps({"spec": {"source": {"sageMaker": {"endpoint": endpoint.url}}}}))
    recovered = wait_phase(k, "trainingplan", f"rc-stuck-{tag}", "Scheduled", timeout=120)

    ready = wait_phase(k, "instancegroup", f"rc-{tag}", "Ready", timeout=150)
    nodes = k.get("nodes", None, "-l", f"hyperplan.dev/instance-group=rc-{tag}")["items"]
    expired = wait_phase(k, "trainingplan", f"rc-{tag}", "Expired", timeout=180)
    gone = eventually(lambda: not k.get("nodes", None, "-l", f"hyperplan.dev/instance-group=rc-{tag}")["items"],
                      timeout=120, what="the group's nodes gone after the remote block")
    # A plan bought remotely and deleted before its block: the remote plan stays (it cannot be cancelled).
    wait_phase(k, "trainingplan", f"rc-ahead-{tag}", "Scheduled", timeout=60)
    ahead_uid = k.get("trainingplan", f"rc-ahead-{tag}")["metadata"]["uid"]
    k.delete("trainingplan", f"rc-ahead-{tag}")
    eventually(lambda: k.get_or_none("trainingplan", f"rc-ahead-{tag}") is None, timeout=60, what="plan deleted")
    after_delete = k.get("capacitypool", f"rc-remote-{tag}")
    kept_events = eventually(lambda: [e for e in events_for(k, f"rc-ahead-{tag}") if e["reason"] == "RemotePlanKept"],
                             timeout=30, what="the RemotePlanKept Event")
    ahead_remote = k.get_or_none("trainingplan", "hp-" + ahead_uid.replace("-", "") + "-0")
    # What the other team's key is served: none of this buyer's plans (it made none), while the
    # buyer's key describes its remote plan and lists the plans it made, and no other.
    other_key = Endpoint(endpoint.url, other_id, other_secret)
    listed = boto3_call(other_key, "list_training_plans", MaxResults=100)
    others = boto3_call(other_key, "describe_training_plan", TrainingPlanName=remote_name)
    own = boto3_call(endpoint, "describe_training_plan", TrainingPlanName=remote_name)
    own_listed = boto3_call(endpoint, "list_training_plans", MaxResults=100)
    local_plan = boto3_call(endpoint, "describe_training_plan", TrainingPlanName=f"rc-{tag}")
    return {"tag": tag, "scheduled": scheduled, "remote_name": remote_name, "remote_plan": remote_plan,
            "fleet": fleet, "mirror": mirror, "down": down, "dead_url": dead_url,
            "recovered": recovered, "ready": ready, "nodes": nodes, "expired": expired, "gone": gone,
            "after_delete": after_delete, "ahead_uid": ahead_uid, "kept_events": kept_events,
            "ahead_remote": ahead_remote, "listed": listed, "others": others, "own": own,
            "own_listed": own_listed, "local_plan": local_plan,
            "buyer": user, "stuck_remote": k.get_or_none(
                "trainingplan", "hp-" + k.get("trainingplan", f"rc-stuck-{tag}")["metadata"]["uid"].replace("-", "")
                + "-0")}


@scenario
def remote_extension(ctx: Context) -> dict:
    """A plan bought through the endpoint is extended there: its status offers the remote's
    extension under a local id, the user names it in ``spec.extensions``, and the plan's block and
    the remote's run on together."""
    k = ctx.kubectl
    tag = uuid.uuid4().hex[:5]
    itype, tier, user = f"ml.rx-{tag}.xlarge", f"extending-{tag}", f"rx-buyer-{tag}"
    # A buyer that may also extend its plans (ExtendTrainingPlan is a patch of the plan).
    _sold_through_the_api(ctx, "rx", tag, user, itype, tier, 2, ["create", "patch"])
    start = utcnow().replace(microsecond=0) + timedelta(seconds=60)
    plan = plan_body(f"rx-{tag}", itype, 2, duration="1m", autoPurchase=True, startTimeAfter=ts(start),
                     endTimeBefore=ts(start + timedelta(minutes=3)))
    plan["metadata"]["labels"] = {"tier": tier}
    k.create(plan)
    scheduled = wait_phase(k, "trainingplan", f"rx-{tag}", "Scheduled", timeout=60)
    remote_name = "hp-" + scheduled_uid(k, f"rx-{tag}") + "-0"

    def offered() -> dict | None:
        st = k.get("trainingplan", f"rx-{tag}").get("status") or {}
        return next(iter(st.get("extensionOfferings") or []), None)
    # Searched on the plan's passes once it holds the block (at the latest at the block's start).
    offer = eventually(offered, timeout=120, interval=1, what="the remote's extension offered on the plan")
    k.run("patch", "trainingplan", f"rx-{tag}", "--type=merge", "-p",
          json.dumps({"spec": {"extensions": [{"offeringId": offer["id"]}]}}))

    def extended() -> dict | None:
        st = k.get("trainingplan", f"rx-{tag}").get("status") or {}
        ok = next((c for c in st.get("conditions") or [] if c["type"] == "Extended" and c["status"] == "True"), None)
        return st if ok else None
    after = eventually(extended, timeout=60, interval=1, what="the plan Extended=True")
    return {"tag": tag, "scheduled": scheduled, "offer": offer, "after": after, "remote_name": remote_name,
            "remote": k.get("trainingplan", remote_name), "fleet": k.get("capacitypool", f"rx-fleet-{tag}"),
            "events": events_for(k, f"rx-{tag}")}


def scheduled_uid(k, name: str) -> str:
    return k.get("trainingplan", name)["metadata"]["uid"].replace("-", "")


def test_a_plan_bought_through_the_endpoint_is_extended_there(scenarios) -> None:
    record = scenarios["remote_extension"].result(timeout=900)
    tag, offer = record["tag"], record["offer"]
    [block] = record["scheduled"]["reservedCapacity"]
    # Offered under a local id (the remote's own id, which names the remote plan, stays unshown),
    # as an extension of the block as recorded here.
    assert offer["capacityPool"] == f"rx-remote-{tag}" and offer["reservedCapacityId"] == block["id"]
    assert offer["startTime"] == block["endTime"] and offer["id"].count("-") == 2, offer
    # The plan's block runs on to the extension's end, and so does the remote's own block.
    [now] = record["after"]["reservedCapacity"]
    assert (now["id"], now["endTime"]) == (block["id"], offer["endTime"])
    [entry] = record["after"]["extensions"]
    assert entry["status"] in ("Scheduled", "Active") and entry["offeringId"] == offer["id"], entry
    [line] = [r for r in record["fleet"]["status"]["reservations"] if r["trainingPlan"] == record["remote_name"]]
    assert line["endTime"] == offer["endTime"]
    assert [e["status"] for e in record["remote"]["status"]["extensions"]] in (["Scheduled"], ["Active"])
    assert "Extended" in [e["reason"] for e in record["events"]]


def test_a_plan_buys_through_the_endpoint_and_holds_the_remotes_block(scenarios) -> None:
    record = scenarios["remote_capacity"].result(timeout=900)
    # The remote plan was made through the API (as the key's user) and bought from the fleet.
    remote = record["remote_plan"]
    assert remote["spec"]["offeringId"].startswith("tpo-")
    [sold] = [r for r in record["fleet"]["status"]["reservations"] if r["trainingPlan"] == record["remote_name"]]
    # The plan's block is the remote's block: same id, same dates, recorded in the remote pool.
    [block] = record["scheduled"]["reservedCapacity"]
    assert block["id"] == sold["reservedCapacityId"]
    assert (block["startTime"], block["endTime"], block["instanceCount"]) == (sold["startTime"], sold["endTime"], 2)
    assert block["capacityPool"] == f"rc-remote-{record['tag']}"
    [line] = [r for r in record["mirror"]["status"]["reservations"] if r["trainingPlan"] == f"rc-{record['tag']}"]
    assert line["remoteTrainingPlanArn"].endswith(f":training-plan/{record['remote_name']}")


def test_the_group_gets_nodes_on_the_remote_block_and_they_go_when_it_ends(scenarios) -> None:
    record = scenarios["remote_capacity"].result(timeout=900)
    block = record["scheduled"]["reservedCapacity"][0]["id"]
    assert record["ready"]["phase"] == "Ready"
    assert len(record["nodes"]) == 2
    assert {n["metadata"]["labels"]["hyperplan.dev/reserved-capacity"] for n in record["nodes"]} == {block}
    assert record["expired"]["phase"] == "Expired" and record["gone"]


def test_an_endpoint_that_is_down_shows_its_error_then_converges(scenarios) -> None:
    record = scenarios["remote_capacity"].result(timeout=900)
    down = record["down"]
    assert down["reason"] == "RemoteUnavailable"
    assert record["dead_url"] in down["message"] and "EndpointConnectionError" in down["message"]
    assert record["recovered"]["phase"] == "Scheduled"
    assert record["stuck_remote"] is not None  # bought through the endpoint once it answered


def test_deleting_a_plan_removes_only_this_sides_record_and_says_so(scenarios) -> None:
    record = scenarios["remote_capacity"].result(timeout=900)
    assert not [r for r in (record["after_delete"].get("status") or {}).get("reservations") or []
                if r.get("trainingPlanUid") == record["ahead_uid"]]
    [event] = record["kept_events"]
    assert event["type"] == "Warning" and "cannot be cancelled" in event["message"]
    assert record["ahead_remote"] is not None and record["ahead_remote"]["status"]["phase"] == "Scheduled"
    assert record["ahead_remote"]["metadata"]["name"] in event["message"]


def test_a_key_that_may_only_buy_sees_no_other_teams_plans(scenarios) -> None:
    """The buyer's key and another team's may create plans and not read them: the endpoint serves
    each only the plans it made. The other team's sees none of the buyer's; the buyer's describes
    and lists its remote plans, and not the plan rc-<tag> made with kubectl on the same cluster;
    the plan names the buyer in hyperplan.dev/created-by."""
    record = scenarios["remote_capacity"].result(timeout=900)
    assert record["listed"]["ok"].get("TrainingPlanSummaries", []) == []
    assert record["others"]["error"]["code"] == "ResourceNotFound"
    assert record["own"]["ok"]["TrainingPlanName"] == record["remote_name"]
    names = {p["TrainingPlanName"] for p in record["own_listed"]["ok"]["TrainingPlanSummaries"]}
    assert record["remote_name"] in names and all(n.startswith("hp-") for n in names), names
    assert record["local_plan"]["error"]["code"] == "ResourceNotFound"
    assert record["remote_plan"]["metadata"]["annotations"]["hyperplan.dev/created-by"] == record["buyer"]
