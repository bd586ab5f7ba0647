"""Object metrics built at scrape time from the observed objects, and the latency histograms."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pydantic import ValidationError

from hyperplan import metrics
from hyperplan.actuation.ledger import pool_snapshot
from hyperplan.wiring.events import observe
from hyperplan.api.models import CapacityPool, InstanceGroupStatus, to_rfc3339
from hyperplan.planning import health

T0 = datetime(2027, 1, 1, 12, 0, tzinfo=timezone.utc)


def ts(minutes: float) -> str:
    return to_rfc3339(T0 + timedelta(minutes=minutes))


def plan_body(phase: str | None, blocks=(), ultra_servers=(), **counts) -> dict:
    status = {"reservedCapacity": [
        {"id": f"rc-{i}", "availabilityZone": "us-west-2b", "instanceType": "ml.p6e-gb200.36xlarge",
         "instanceCount": 36, "startTime": ts(s), "endTime": ts(e), "terminationTime": ts(e - 1)}
        for i, (s, e) in enumerate(blocks)], "ultraServers": list(ultra_servers), **counts}
    if phase:
        status["phase"] = phase
    return {"metadata": {"name": "x"}, "spec": {}, "status": status}


def pool_body(count: int, unavailable=(), reservations=(), ultra: str | None = None) -> dict:
    spec = {"instanceType": "ml.p5.48xlarge", "availabilityZone": "us-east-1a", "instanceCount": count,
            "unavailable": [{"start": ts(s), "end": ts(e), "instanceCount": n} for s, e, n in unavailable]}
    if ultra:
        spec["ultraServerType"] = ultra
    return {"metadata": {"name": "p"}, "spec": spec, "status": {"reservations": [
        {"trainingPlan": "a", "reservedCapacityId": f"r{i}", "startTime": ts(s), "endTime": ts(e),
         "instanceCount": n} for i, (s, e, n) in enumerate(reservations)]}}


def samples(view: metrics.ObservedObjects, family: str, now: datetime = T0) -> dict[tuple, float]:
    return {tuple(sorted(labels.items())): value
            for labels, value in metrics.object_samples(view, now)[family]}


def one(view, family: str, now: datetime = T0, **labels: str) -> float | None:
    return samples(view, family, now).get(tuple(sorted(labels.items())))


# --------------------------------------------------------------------------- plans


@pytest.mark.parametrize("phase", [None, "Pending", "Scheduled", "Active", "Expired", "Failed"])
def test_plan_phase_is_one_series_per_phase_with_a_single_one(phase) -> None:
    view = metrics.ObservedObjects()
    view.put_plan("llama", plan_body(phase))
    got = {dict(k)["phase"]: v for k, v in samples(view, "hyperplan_training_plan_phase").items()}
    assert set(got) == set(metrics.PLAN_PHASES)
    assert got == {p: (1.0 if p == phase else 0.0) for p in metrics.PLAN_PHASES}


def test_plans_are_counted_by_phase() -> None:
    view = metrics.ObservedObjects()
    for name, phase in (("a", "Active"), ("b", "Active"), ("c", "Scheduled"), ("d", None)):
        view.put_plan(name, plan_body(phase))
    got = {dict(k)["phase"]: v for k, v in samples(view, "hyperplan_training_plans").items()}
    assert got == {"Pending": 0, "Scheduled": 1, "Active": 2, "Expired": 0, "Failed": 0}


def test_plan_instance_counts_come_from_its_status() -> None:
    view = metrics.ObservedObjects()
    view.put_plan("gb", plan_body("Active", totalInstanceCount=36, inUseInstanceCount=20,
                                  availableInstanceCount=14, availableSpareInstanceCount=2,
                                  unhealthyInstanceCount=1))
    got = {dict(k)["count"]: v for k, v in samples(view, "hyperplan_training_plan_instances").items()}
    assert got == {"total": 36, "in_use": 20, "available": 14, "spare": 2, "unhealthy": 1}


BLOCKS = [(-30, 60), (120, 240)]  # minutes from T0: an active block, then a gap, then the next


@pytest.mark.parametrize("now_min, termination, next_start", [
    pytest.param(-60, None, 30 * 60, id="before-the-first-block"),
    pytest.param(0, 59 * 60, 120 * 60, id="in-the-first-block"),
    pytest.param(59.5, -30, 60.5 * 60, id="past-termination-before-the-end"),
    pytest.param(90, None, 30 * 60, id="in-the-gap"),
    pytest.param(130, 109 * 60, None, id="in-the-last-block"),
    pytest.param(300, None, None, id="expired"),
])
def test_seconds_to_termination_and_next_start_follow_the_clock(now_min, termination, next_start) -> None:
    view = metrics.ObservedObjects()
    view.put_plan("p", plan_body("Active", BLOCKS))
    now = T0 + timedelta(minutes=now_min)
    assert one(view, "hyperplan_training_plan_seconds_to_termination", now, plan="p") == termination
    assert one(view, "hyperplan_training_plan_seconds_to_next_block_start", now, plan="p") == next_start


def test_ultraserver_health_and_counts() -> None:
    us = [{"id": "us-a", "availabilityZone": "z", "totalInstanceCount": 18, "configuredSpareInstanceCount": 1,
           "availableInstanceCount": 0, "inUseInstanceCount": 17, "availableSpareInstanceCount": 0,
           "unhealthyInstanceCount": 1, "healthStatus": "impaired"},
          {"id": "us-b", "availabilityZone": "z", "totalInstanceCount": 18, "healthStatus": "insufficient-data"}]
    view = metrics.ObservedObjects()
    view.put_plan("gb", plan_body("Active", ultra_servers=us))
    health_samples = samples(view, "hyperplan_ultraserver_health")
    ones = sorted((dict(k)["ultraserver"], dict(k)["status"]) for k, v in health_samples.items() if v == 1)
    assert ones == [("us-a", "impaired"), ("us-b", "insufficient-data")]
    assert len(health_samples) == 2 * len(metrics.ULTRASERVER_STATUSES)
    counts = {dict(k)["count"]: v for k, v in samples(view, "hyperplan_ultraserver_instances").items()
              if dict(k)["ultraserver"] == "us-a"}
    assert counts == {"total": 18, "in_use": 17, "available": 0, "spare": 0, "configured_spare": 1,
                      "unhealthy": 1}


# --------------------------------------------------------------------------- pools


def put_pool(view: metrics.ObservedObjects, name: str, body: dict) -> None:
    """A pool as the read side hands it to the metrics: its snapshot (none for a pool that does
    not parse, as the read side keeps none)."""
    try:
        view.put_pool_snapshot(name, pool_snapshot(CapacityPool.model_validate(body)))
    except ValidationError:
        pass


@pytest.mark.parametrize("body, sold, until_free", [
    pytest.param(pool_body(8), 0, 0, id="empty"),
    pytest.param(pool_body(8, reservations=[(-10, 50, 4)]), 4, 0, id="half-sold"),
    pytest.param(pool_body(8, unavailable=[(-10, 50, 4)], reservations=[(-5, 120, 4)]), 8, 50 * 60,
                 id="sold-out-until-the-window-ends"),
    pytest.param(pool_body(8, reservations=[(10, 50, 8)]), 0, 0, id="sold-later-free-now"),
    pytest.param(pool_body(36, reservations=[(-10, 60, 18)], unavailable=[(-10, 30, 9)],
                           ultra="ml.u-p6e-gb200x72"), 27, 30 * 60, id="ultraserver-pool-needs-a-whole-one"),
])
def test_pool_sold_and_free_now(body, sold, until_free) -> None:
    view = metrics.ObservedObjects()
    put_pool(view, "p", body)
    where = {"pool": "p", "instance_type": "ml.p5.48xlarge", "availability_zone": "us-east-1a"}
    total = body["spec"]["instanceCount"]
    assert one(view, "hyperplan_capacity_pool_instances", state="sold", **where) == sold
    assert one(view, "hyperplan_capacity_pool_instances", state="free", **where) == total - sold
    assert one(view, "hyperplan_capacity_pool_seconds_until_free", **where) == until_free


# --------------------------------------------------------------------------- groups


def test_group_nodes_from_status_and_present_nodes() -> None:
    view = metrics.ObservedObjects()
    view.put_group("workers", {"spec": {"trainingPlanRef": "gb"}, "status": {
        "phase": "Ready", "desiredCount": 20, "readyCount": 19, "spareCount": 2, "unhealthyCount": 1,
        "conditions": [{"type": "RemediationAllowed", "status": "False", "reason": "TooManyUnhealthy"}]}})
    for i in range(23):
        view.put_node(f"n{i}", "workers")
    view.put_node("n22", None)  # left the group
    got = {dict(k)["state"]: v for k, v in samples(view, "hyperplan_instance_group_nodes").items()}
    assert got == {"desired": 20, "ready": 19, "spare": 2, "unhealthy": 1, "present": 22}
    assert one(view, "hyperplan_instance_group_remediation_blocked", group="workers") == 1
    assert one(view, "hyperplan_instance_group_info", group="workers", plan="gb") == 1


def test_unreadable_status_counts_as_empty_not_a_crash() -> None:
    view = metrics.ObservedObjects()
    view.put_plan("bad", {"status": {"phase": "Sideways", "totalInstanceCount": "many"}})
    view.put_group("bad", {"spec": {}, "status": {"readyCount": "x"}})
    put_pool(view, "bad", {"spec": {"instanceCount": -1}})
    assert one(view, "hyperplan_training_plan_phase", plan="bad", phase="Active") == 0
    assert one(view, "hyperplan_instance_group_nodes", group="bad", state="ready") == 0
    assert samples(view, "hyperplan_capacity_pool_instances") == {}


# --------------------------------------------------------------------------- the collector


def scrape(registry: CollectorRegistry) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(generate_latest(registry).decode())}


def test_deleted_objects_leave_no_series() -> None:
    view = metrics.ObservedObjects()
    registry = CollectorRegistry()
    registry.register(metrics.ObjectMetrics(view, lambda: T0))
    observe(view, "trainingplans", "gb", "ADDED", plan_body("Active", BLOCKS, ultra_servers=[
        {"id": "us-a", "availabilityZone": "z", "healthStatus": "ok"}]))
    observe(view, "instancegroups", "workers", "ADDED", {"spec": {"trainingPlanRef": "gb"}, "status": {}})
    observe(view, "capacitypools", "p", None, pool_body(8), pool_snapshot(CapacityPool.model_validate(pool_body(8))))
    names = ("gb", "workers", "p", "us-a")

    def mentions(text: str) -> set[str]:
        return {n for n in names if f'"{n}"' in text}

    assert mentions(generate_latest(registry).decode()) == set(names)
    observe(view, "trainingplans", "gb", "DELETED", {})
    observe(view, "instancegroups", "workers", "DELETED", {})
    observe(view, "capacitypools", "p", "DELETED", {})
    text = generate_latest(registry).decode()
    assert mentions(text) == set()
    # The families stay declared (HELP/TYPE) and the per-phase count stays, at 0.
    assert "# TYPE hyperplan_training_plan_phase gauge" in text
    got = scrape(registry)
    assert {s.labels["phase"]: s.value for s in got["hyperplan_training_plans"]} == \
        dict.fromkeys(metrics.PLAN_PHASES, 0.0)


def test_every_declared_family_is_known_with_its_labels() -> None:
    declared = metrics.declared_families()
    for name, (_, labels) in metrics.OBJECT_FAMILIES.items():
        assert declared[name] == ("gauge", set(labels))
    assert declared["hyperplan_reconcile_duration_seconds"] == ("histogram", {"kind"})
    assert {"hyperplan_group_provisioning_seconds", "hyperplan_spare_promotion_seconds"} <= set(declared)


# --------------------------------------------------------------------------- histograms


def hist_count(h) -> float:
    return next(s.value for m in h.collect() for s in m.samples if s.name.endswith("_count"))


def test_provisioning_is_observed_once_per_group_and_block() -> None:
    before = hist_count(metrics.GROUP_PROVISIONING)
    waiting = InstanceGroupStatus(phase="Waiting")
    provisioning = InstanceGroupStatus(phase="Provisioning", reserved_capacity_id="rc-1")
    ready = InstanceGroupStatus(phase="Ready", reserved_capacity_id="rc-1")
    start = T0
    metrics.observe_group_pass("g-prov", waiting, provisioning, start, T0 + timedelta(seconds=2))
    assert hist_count(metrics.GROUP_PROVISIONING) == before
    metrics.observe_group_pass("g-prov", provisioning, ready, start, T0 + timedelta(seconds=7))
    assert hist_count(metrics.GROUP_PROVISIONING) == before + 1
    # Whole again after a failure on the same block: remediation, not provisioning.
    metrics.observe_group_pass("g-prov", provisioning, ready, start, T0 + timedelta(seconds=90))
    assert hist_count(metrics.GROUP_PROVISIONING) == before + 1
    # The next block is provisioned anew.
    ready2 = InstanceGroupStatus(phase="Ready", reserved_capacity_id="rc-2")
    metrics.observe_group_pass("g-prov", waiting, ready2, start, T0 + timedelta(seconds=4))
    assert hist_count(metrics.GROUP_PROVISIONING) == before + 2
    # A restarted operator seeing a group that was Ready already does not count it.
    metrics.forget_group("g-prov")
    metrics.observe_group_pass("g-prov", ready2, ready2, start, T0 + timedelta(seconds=400))
    assert hist_count(metrics.GROUP_PROVISIONING) == before + 2


def test_promotion_carries_when_the_grace_ended() -> None:
    failed_at = T0
    node = health.NodeObservation(name="a", conditions=(health.NodeCondition("Ready", "False", failed_at),),
                              role="active", ultraserver_id="us")
    spare = health.NodeObservation(name="s", conditions=(health.NodeCondition("Ready", "True", failed_at),),
                               role="spare", ultraserver_id="us")
    check = health.HealthCheck.from_spec(30, "50%", [])
    verdict = health.evaluate_health([node, spare], check, T0 + timedelta(seconds=45))
    assert verdict.grace_ended == {"a": T0 + timedelta(seconds=30)}
    plan = health.plan_remediation(verdict, [node, spare], block_has_time_left=True, uses_spares=True,
                               max_unhealthy="50%")
    (promote,) = [a for a in plan.actions if isinstance(a, health.PromoteSpare)]
    assert promote.grace_ended == T0 + timedelta(seconds=30)
    before = hist_count(metrics.SPARE_PROMOTION)
    metrics.observe_spare_promotion(promote.grace_ended, T0 + timedelta(seconds=31.5))
    assert hist_count(metrics.SPARE_PROMOTION) == before + 1


def test_served_text_holds_the_same_series_as_the_collector() -> None:
    """``/metrics`` renders the object metrics directly (fast at 10,000 plans); a Prometheus
    parser reads from it exactly the samples the collector path yields, escapes included."""
    view = metrics.ObservedObjects()
    view.put_plan("gb", plan_body("Active", BLOCKS, ultra_servers=[
        {"id": "us-a", "availabilityZone": "z", "healthStatus": "ok", "totalInstanceCount": 18}],
        totalInstanceCount=36, inUseInstanceCount=20))
    view.put_plan('odd"name\\x', plan_body("Scheduled", [(60, 120)]))
    put_pool(view, "p", pool_body(8, reservations=[(-10, 50, 4)]))
    view.put_group("workers", {"spec": {"trainingPlanRef": "gb"}, "status": {"desiredCount": 2}})
    view.put_node("n1", "workers")
    registry = CollectorRegistry()
    registry.register(metrics.ObjectMetrics(view, lambda: T0))

    def parsed(text: str) -> dict[str, set]:
        return {f.name: {(s.name, tuple(sorted(s.labels.items())), s.value) for s in f.samples}
                for f in text_string_to_metric_families(text)}

    served = parsed(metrics.render_object_metrics(view, T0))
    assert served == parsed(generate_latest(registry).decode())
    assert set(served) == set(metrics.OBJECT_FAMILIES)
    assert ("hyperplan_training_plan_phase", (("phase", "Scheduled"), ("plan", 'odd"name\\x')), 1.0) \
        in served["hyperplan_training_plan_phase"]


def test_the_metrics_endpoint_serves_the_registry_and_the_object_metrics() -> None:
    """What Prometheus scrapes: the event metrics, then the object metrics in chunks, parseable."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = metrics.serve(port)
    metrics.OBSERVED.put_plan("served-plan", plan_body("Active", BLOCKS, totalInstanceCount=3))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            text = r.read().decode()
    finally:
        metrics.OBSERVED.drop("plans", "served-plan")
        server.shutdown()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert "hyperplan_reconciles" in families  # a counter of the registry (its name without _total)
    assert set(metrics.OBJECT_FAMILIES) <= set(families)
    phases = {s.labels["phase"]: s.value for s in families["hyperplan_training_plan_phase"].samples
              if s.labels["plan"] == "served-plan"}
    assert phases["Active"] == 1.0 and sum(phases.values()) == 1.0


def test_the_metrics_endpoint_ends_each_body_by_itself_and_keeps_the_connection() -> None:
    """Chunked HTTP/1.1: the body's end is in the stream, not the connection's close (which does
    not reliably cross ``kubectl port-forward``), and two scrapes share one connection."""
    import http.client
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = metrics.serve(port)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        bodies = []
        for _ in range(2):
            conn.request("GET", "/metrics")
            r = conn.getresponse()
            assert r.version == 11 and r.getheader("Transfer-Encoding") == "chunked"
            bodies.append(r.read().decode())
            assert not r.will_close
        conn.close()
    finally:
        server.shutdown()
    for text in bodies:
        assert "hyperplan_reconciles_total" in text
        assert {f.name for f in text_string_to_metric_families(text)} >= set(metrics.OBJECT_FAMILIES)
