"""Deep health checks through the real group pass (controllers.group.reconciler.reconcile_group) against
the recording fakes: the check Jobs are a FakeDeepCheckJobs that the test ends (tests/unit/fake_runtime.py).

The world is tests/unit/test_group_pass.py's: a group of two active nodes and the spare of their
x72 UltraServer, grace 5 s, maxUnhealthy 2, the demo policy and a fake clock.
"""

from __future__ import annotations

from datetime import timedelta

from prometheus_client import REGISTRY

from hyperplan.actuation.deepchecks import CheckJobSettings, Target, check_job_body, cohort_service_body
from hyperplan.actuation.providers.base import taints_of
from hyperplan.api.vocabulary import (
    to_rfc3339, INSTANCE_CONNECTIVITY, INSTANCE_STRESS, LABEL_DEEP_HEALTH_CHECK, LABEL_SAGEMAKER_DEEP_HEALTH_CHECK,
)
from hyperplan.planning import deepchecks, naming
from tests.unit import test_group_pass
from tests.unit.test_group_pass import (  # noqa: F401  (worlds: the fixture)
    ACTIVE, GROUP, LADDER, NOW, SPARE, T0, World, group, patches, record_of, set_ready, worlds,
)

BOTH = [INSTANCE_STRESS, INSTANCE_CONNECTIVITY]
NODES = sorted([*ACTIVE, SPARE])


def run(world: World):
    """test_group_pass's pass, the check Jobs' recorder emptied first too."""
    world.checks.calls.clear()
    return test_group_pass.run(world)


def up(world: World) -> None:
    """The group's three nodes made at the block start, Ready since then; the pass that sees them."""
    world.now = T0
    run(world)
    for node in world.provider.nodes:
        set_ready(world, node, "True", T0)
    world.now = NOW
    run(world)


def status(world: World) -> dict:
    return world.rt.cache.group(GROUP)["status"]


def labels(world: World, node: str) -> dict[str, str]:
    return world.provider.nodes[node].metadata.labels


def check_taint(world: World, node: str) -> str | None:
    return next((t.value for t in taints_of(world.provider.nodes[node]) if t.key == deepchecks.TAINT_DEEP_HEALTH_CHECK),
                None)


def finish(world: World, node: str, fail: str | None = None, check: str = INSTANCE_STRESS) -> None:
    """Every Job of ``node`` ends Complete, or ``check``'s Failed with output ``fail``."""
    for name in world.checks.of(node):
        failing = fail is not None and world.checks.made[name].job.check == check
        world.checks.finish(name, passed=not failing, output=fail or "")


def passed(world: World, *nodes: str) -> None:
    for node in nodes:
        finish(world, node)
    world.now += timedelta(seconds=2)
    run(world)


def count(result: str) -> float:
    return REGISTRY.get_sample_value("hyperplan_deep_health_checks_total", {"result": result}) or 0.0


# --------------------------------------------------------------------------- new nodes


def test_new_nodes_are_born_tainted_and_serve_only_once_their_checks_pass(worlds) -> None:
    world = worlds(group(onStartDeepHealthChecks=BOTH))
    world.now = T0
    run(world)

    # Made with the checks' label (both keys) and taint, and the run in the record from the intent on.
    for node in NODES:
        assert (labels(world, node)[LABEL_DEEP_HEALTH_CHECK], labels(world, node)[LABEL_SAGEMAKER_DEEP_HEALTH_CHECK],
                check_taint(world, node)) == ("InProgress", "InProgress", "InProgress")
    intent, _ = patches(world)
    assert {e["nodeId"]: e["deepHealthCheck"]["status"] for e in intent["nodes"]} == dict.fromkeys(NODES, "InProgress")
    assert world.checks.calls == []  # no Job before the node is there

    for node in world.provider.nodes:
        set_ready(world, node, "True", T0)
    world.now = NOW
    wake = run(world)

    # Each node: a stress Job and a connectivity Job reaching the UltraServer's other new nodes.
    for node in NODES:
        made = {world.checks.made[n].job.check: world.checks.made[n].job for n in world.checks.of(node)}
        assert sorted(made) == sorted(BOTH)
        assert made[INSTANCE_CONNECTIVITY].peers == tuple(NODES)
    [(cohort, owners)] = world.checks.services.items()
    assert len(owners) == 3 and record_of(world, ACTIVE[0])["deepHealthCheck"]["cohort"] == cohort
    assert world.reasons().count("DeepHealthCheckStarted") == 6  # on each node and the group
    s = status(world)
    assert (s["phase"], s["readyCount"], s["spareCount"]) == ("Provisioning", 0, 0)
    assert "3 node(s) in deep health checks" in s["conditions"][0]["message"]
    assert wake == NOW + deepchecks.POLL  # a Job's end wakes nothing: the pass looks

    world.now += deepchecks.POLL
    run(world)  # still running: nothing made again, nothing written
    assert [c for c in world.checks.calls if c[0] == "start"] == [] and world.provider.calls == []

    before = count("passed")
    passed(world, *NODES)
    for node in NODES:
        assert (labels(world, node)[LABEL_DEEP_HEALTH_CHECK], check_taint(world, node)) == ("Passed", None)
    assert naming.SPARE_TAINT in taints_of(world.provider.nodes[SPARE])  # its other taints stay
    s = status(world)
    assert (s["phase"], s["readyCount"], s["spareCount"]) == ("Ready", 2, 1)
    assert world.reasons().count("DeepHealthCheckPassed") == 6
    assert count("passed") - before == 3
    world.now += timedelta(seconds=5)
    assert run(world) != world.now + deepchecks.POLL  # nothing to look at any more


def test_a_group_without_checks_serves_its_nodes_at_once(worlds) -> None:
    world = worlds(group())
    up(world)
    assert world.checks.calls == [] and LABEL_DEEP_HEALTH_CHECK not in labels(world, ACTIVE[0])
    assert (status(world)["phase"], status(world)["readyCount"]) == ("Ready", 2)


def test_a_node_that_fails_its_checks_is_replaced_with_the_output_in_an_event(worlds) -> None:
    world = worlds(group(onStartDeepHealthChecks=BOTH, healthCheck=LADDER))  # a budget to reboot: none is used
    up(world)
    failed = ACTIVE[1]
    passed(world, ACTIVE[0], SPARE)
    before = count("failed")
    finish(world, failed, fail="exit code 1: core 7 computed 9f2c, the others 41ab")
    world.now += timedelta(seconds=2)

    assert run(world) == world.now  # the failure is acted on in the next pass, once labelled

    assert (labels(world, failed)[LABEL_DEEP_HEALTH_CHECK], check_taint(world, failed)) == ("Failed", "Failed")
    said = [(obj, kind, message) for obj, kind, reason, message in world.events if reason == "DeepHealthCheckFailed"]
    message = (f"{failed}: InstanceStress failed: exit code 1: core 7 computed 9f2c, the others 41ab; "
               "it does not serve")
    assert said == [(failed, "Warning", message), (GROUP, "Warning", message)]
    assert count("failed") - before == 1
    assert status(world)["readyCount"] == 1

    run(world)
    # Replaced as a failed node is: marked, its UltraServer's (checked) spare promoted, a new spare
    # made in its slot (tainted, to be checked), never rebooted.
    calls = world.provider.calls
    assert ("reboot", failed) not in calls
    assert sorted(c for c in calls if c[0] in ("mark_unhealthy", "promote_spare", "create")) == [
        ("create", failed + "-g1"), ("mark_unhealthy", failed), ("promote_spare", SPARE)]
    assert labels(world, failed)[naming.LABEL_HEALTH] == "UnschedulablePendingReplacement"
    backfill = failed + "-g1"
    assert (labels(world, backfill)[naming.LABEL_ROLE], check_taint(world, backfill)) == ("spare", "InProgress")
    assert status(world)["unhealthyCount"] == 1

    set_ready(world, backfill, "True", world.now)
    world.now += timedelta(seconds=1)
    run(world)  # its successor's checks start, alone on its UltraServer: it reaches itself
    [connectivity] = world.checks.of(backfill, INSTANCE_CONNECTIVITY)
    assert world.checks.made[connectivity].job.peers == (backfill,)
    assert (status(world)["readyCount"], status(world)["spareCount"]) == (2, 0)
    assert failed in world.provider.nodes  # its successor does not serve yet: Ready, but not checked

    passed(world, backfill)
    run(world)  # the successor serves: the failed node goes
    assert failed not in world.provider.nodes
    world.now += timedelta(seconds=1)
    run(world)
    s = status(world)
    assert (s["phase"], s["readyCount"], s["spareCount"], s["unhealthyCount"]) == ("Ready", 2, 1, 0)
    assert check_taint(world, backfill) is None


def test_a_spare_still_in_its_checks_is_not_promoted_and_the_new_node_serves_once_checked(worlds) -> None:
    world = worlds(group(onStartDeepHealthChecks=BOTH))
    up(world)
    failed, backfill = ACTIVE[1], ACTIVE[1] + "-g1"
    finish(world, failed, fail="exit code 1: reached 0 of 2 peer(s)", check=INSTANCE_CONNECTIVITY)
    world.now += timedelta(seconds=1)
    run(world)
    run(world)  # replaced: no checked spare to promote, so a new active node in its slot
    assert ("promote_spare", SPARE) not in world.provider.calls
    assert labels(world, backfill)[naming.LABEL_ROLE] == "active"

    passed(world, ACTIVE[0], SPARE)  # the spare passes now: it stays the spare, the slot has its new node
    run(world)
    assert ("promote_spare", SPARE) not in world.provider.calls and failed in world.provider.nodes
    set_ready(world, backfill, "True", world.now)
    world.now += timedelta(seconds=1)
    run(world)
    passed(world, backfill)
    run(world)
    world.now += timedelta(seconds=1)
    run(world)
    assert failed not in world.provider.nodes
    assert (labels(world, backfill)[naming.LABEL_ROLE], labels(world, SPARE)[naming.LABEL_ROLE]) == ("active", "spare")
    s = status(world)
    assert (s["phase"], s["readyCount"], s["spareCount"], s["unhealthyCount"]) == ("Ready", 2, 1, 0)


def test_a_check_job_that_is_gone_is_made_again(worlds) -> None:
    world = worlds(group(onStartDeepHealthChecks=[INSTANCE_STRESS]))
    up(world)
    [job] = world.checks.of(ACTIVE[0])
    world.checks.remove(job)
    world.now += deepchecks.POLL
    run(world)
    assert ("start", job) in world.checks.calls and job in world.checks.jobs
    assert not world.checks.services  # stress only: no run to share


# --------------------------------------------------------------------------- back from a reboot


def test_a_node_back_from_its_reboot_is_checked_before_it_serves_as_the_spare(worlds) -> None:
    world = worlds(group(onStartDeepHealthChecks=[INSTANCE_STRESS], healthCheck=LADDER))
    up(world)
    passed(world, *NODES)
    node = ACTIVE[1]
    set_ready(world, node, "False", world.now)
    world.now += timedelta(seconds=6)
    run(world)
    assert ("reboot", node) in world.provider.calls

    world.provider.finish_reboot(node, world.now)
    world.now += timedelta(seconds=1)
    run(world)  # back: a new run, tainted again, not yet the spare it becomes
    assert "NodeRecovered" in world.reasons()
    assert (labels(world, node)[naming.LABEL_ROLE], labels(world, node)[LABEL_DEEP_HEALTH_CHECK],
            check_taint(world, node)) == ("spare", "InProgress", "InProgress")
    assert record_of(world, node)["deepHealthCheck"]["since"] == to_rfc3339(world.now)
    assert (status(world)["readyCount"], status(world)["spareCount"]) == (2, 0)

    world.now += timedelta(seconds=1)
    run(world)
    [old, new] = world.checks.of(node)  # the first run's Job, and this start's
    passed(world, node)
    assert check_taint(world, node) is None
    assert (status(world)["phase"], status(world)["spareCount"]) == ("Ready", 1)


# --------------------------------------------------------------------------- the Jobs themselves


def test_a_connectivity_job_is_pinned_to_its_node_and_named_under_its_runs_service() -> None:
    s = CheckJobSettings(image="img", namespace="ops", seconds=30, port=7946, ttl_seconds=60)
    job = deepchecks.CheckJob("dhc-a-c-0123456789", "hp-a", INSTANCE_CONNECTIVITY, "dhc-run", ("hp-a", "hp-b"))
    body = check_job_body(s, "My Group", Target(job, "kind-worker", "uid-1"))
    spec = body["spec"]["template"]["spec"]
    assert (spec["nodeName"], spec["hostname"], spec["subdomain"], spec["tolerations"]) == (
        "kind-worker", "hp-a", "dhc-run", [{"operator": "Exists"}])
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    [container] = spec["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"HYPERPLAN_CHECK": INSTANCE_CONNECTIVITY, "HYPERPLAN_CHECK_NODE": "kind-worker",
                   "HYPERPLAN_CHECK_SECONDS": "30", "HYPERPLAN_CHECK_SELF": "hp-a.dhc-run",
                   "HYPERPLAN_CHECK_PEERS": "hp-a.dhc-run,hp-b.dhc-run", "HYPERPLAN_CHECK_PORT": "7946"}
    assert container["command"] == ["python", "-m", "hyperplan.deepcheck", INSTANCE_CONNECTIVITY]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert (body["spec"]["backoffLimit"], body["spec"]["activeDeadlineSeconds"],
            body["spec"]["ttlSecondsAfterFinished"]) == (0, 90, 60)
    assert body["metadata"]["labels"][naming.LABEL_GROUP] == naming.label_value("My Group")
    service = cohort_service_body(s, "My Group", "dhc-run", [("dhc-a-c-0123456789", "uid-j")])
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= body["spec"]["template"]["metadata"]["labels"].items()
    assert service["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "dhc-a-c-0123456789", "uid": "uid-j"}]


def test_kwoks_stages_end_a_check_pod_by_the_keys_the_code_names() -> None:
    """On KWOK a check pod passes after 5 s, or fails at once with the exit code and output a test
    wrote on it: the stages select by the component label and annotations the code names."""
    import yaml

    from hyperplan.actuation.deepchecks import CHECK_COMPONENT
    from hyperplan.api.vocabulary import ANNOTATION_KWOK_CHECK_EXIT_CODE as ANNOTATION_KWOK_EXIT_CODE
    from hyperplan.api.vocabulary import ANNOTATION_KWOK_CHECK_OUTPUT as ANNOTATION_KWOK_OUTPUT
    from hyperplan_dev.plane import kwok_stages
    stages = {s["metadata"]["name"]: s["spec"] for s in yaml.safe_load_all(kwok_stages())}
    passing, failing = stages["hyperplan-deep-health-check-pass"], stages["hyperplan-deep-health-check-fail"]
    for stage, operator in ((passing, "DoesNotExist"), (failing, "Exists")):
        keys = {e["key"]: e for e in stage["selector"]["matchExpressions"]}
        assert keys['.metadata.labels["app.kubernetes.io/component"]']["values"] == [CHECK_COMPONENT]
        assert keys[f'.metadata.annotations["{ANNOTATION_KWOK_EXIT_CODE}"]']["operator"] == operator
        assert keys[".status.phase"]["values"] == ["Running"]
    assert passing["delay"]["durationMilliseconds"] == 5000 and "phase: Succeeded" in passing["next"]["statusTemplate"]
    assert "delay" not in failing and "phase: Failed" in failing["next"]["statusTemplate"]
    assert f'"{ANNOTATION_KWOK_OUTPUT}"' in failing["next"]["statusTemplate"]
    assert f'"{ANNOTATION_KWOK_EXIT_CODE}"' in failing["next"]["statusTemplate"]
