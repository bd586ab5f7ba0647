"""NodeProvider.reboot: what each provider writes (the KWOK patches, the static node's Job), when
a second call writes nothing, and the fake's reboot that a test finishes or not."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from hyperplan_testing.fakes import FakeProvider
from hyperplan.actuation.pods import (
    ANNOTATION_REBOOT_NODE, ANNOTATION_REBOOT_NODE_UID, RebootJob, job_finished, reboot_job_body, reboot_job_name,
)
from hyperplan.actuation.providers.base import REBOOT_REASON, rebooting
from hyperplan.actuation.providers.kwok import ANNOTATION_REBOOT_UNTIL, KwokProvider, kwok_reboot_patches
from hyperplan.actuation.providers.static import StaticProvider
from hyperplan.api.vocabulary import from_rfc3339
from hyperplan.planning import naming, placement
from hyperplan.settings import DEFAULT_REBOOT_COMMAND
from hyperplan_dev.plane import kwok_stages

NOW = datetime(2026, 12, 2, 10, 0, 0, 250000, tzinfo=timezone.utc)


def node(name: str = "n", uid: str = "u-1", ready: tuple[str, str] | None = ("True", "KubeletReady")) -> client.V1Node:
    conditions = None if ready is None else [
        client.V1NodeCondition(type="MemoryPressure", status="False", reason="KubeletHasSufficientMemory"),
        client.V1NodeCondition(type="Ready", status=ready[0], reason=ready[1])]
    return client.V1Node(metadata=client.V1ObjectMeta(name=name, uid=uid, labels={"team": "a"}),
                         spec=client.V1NodeSpec(), status=client.V1NodeStatus(conditions=conditions))


# --------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize("ready, want", [
    pytest.param(("False", REBOOT_REASON), True, id="rebooting"),
    pytest.param(("True", "KubeletReady"), False, id="ready"),
    pytest.param(("False", "KubeletNotReady"), False, id="not-ready-for-another-reason"),
    pytest.param(("Unknown", REBOOT_REASON), False, id="stopped-reporting-while-rebooting"),
    pytest.param(None, False, id="no-conditions-yet"),
])
def test_rebooting_is_ready_false_with_reason_rebooting(ready, want) -> None:
    assert rebooting(node(ready=ready)) is want


def test_the_kwok_reboot_writes_when_it_is_back_then_the_rebooting_condition() -> None:
    meta, status = kwok_reboot_patches("u-1", NOW, 10)
    assert meta == {"metadata": {"uid": "u-1", "annotations": {ANNOTATION_REBOOT_UNTIL: "2026-12-02T10:00:10.250000Z"}}}
    assert from_rfc3339(meta["metadata"]["annotations"][ANNOTATION_REBOOT_UNTIL]) == NOW + timedelta(seconds=10)
    assert status == {"metadata": {"uid": "u-1"}, "status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": "Rebooting",
        "message": "rebooted by hyperplan; back at 2026-12-02T10:00:10Z",
        "lastTransitionTime": "2026-12-02T10:00:00Z", "lastHeartbeatTime": "2026-12-02T10:00:00Z"}]}}


def test_without_a_uid_the_patches_carry_none() -> None:
    meta, status = kwok_reboot_patches("", NOW, 2.5)
    assert "uid" not in meta["metadata"] and "metadata" not in status
    assert meta["metadata"]["annotations"][ANNOTATION_REBOOT_UNTIL] == "2026-12-02T10:00:02.750000Z"


def test_the_kwok_stage_waits_for_the_annotation_and_selects_only_rebooting_nodes() -> None:
    """The stage and the provider name the same annotation and reason; the heartbeat selects only
    Ready=True nodes, so it never overwrites the Rebooting condition."""
    stages = {s["metadata"]["name"]: s["spec"] for s in yaml.safe_load_all(kwok_stages())}
    reboot = stages["hyperplan-node-reboot"]
    assert reboot["delay"]["durationFrom"]["jq"]["expression"] == f'.metadata.annotations["{ANNOTATION_REBOOT_UNTIL}"]'
    selects = {e["key"]: e["values"] for e in reboot["selector"]["matchExpressions"]}
    assert selects['.status.conditions.[] | select( .type == "Ready" ) | .reason'] == [REBOOT_REASON]
    assert selects['.status.conditions.[] | select( .type == "Ready" ) | .status'] == ["False"]
    heartbeat = {e["key"]: e["values"] for e in stages["hyperplan-node-heartbeat"]["selector"]["matchExpressions"]}
    assert heartbeat['.status.conditions.[] | select( .type == "Ready" ) | .status'] == ["True"]
    assert 'status: "True"' in reboot["next"]["statusTemplate"]


@pytest.mark.parametrize("node_name, uid, want", [
    pytest.param("kind-worker2", "u-1", "reboot-kind-worker2-", id="kind-worker"),
    pytest.param("ip-10-0-1-7.ec2.internal", "u-1", "reboot-ip-10-0-1-7-ec2-internal-", id="dots-become-dashes"),
    pytest.param("n" * 253, "u-1", "reboot-" + "n" * 45 + "-", id="long-name-cut"),
])
def test_the_reboot_job_name_is_a_label_value_from_the_name_and_uid(node_name, uid, want) -> None:
    name = reboot_job_name(node_name, uid)
    assert name.startswith(want) and len(name) <= 63 and name == naming.label_value(name)
    assert reboot_job_name(node_name, uid) == name  # a retry finds it
    assert reboot_job_name(node_name, "u-2") != name  # another node of that name gets its own


def test_the_reboot_job_runs_the_admins_command_on_the_node_privileged() -> None:
    job = RebootJob(image="registry.example/bmc:1", command=("bmc", "power-cycle"), namespace="hyperplan-system",
                    ttl_seconds=60, deadline_seconds=120)
    body = reboot_job_body(job, "kind-worker2", "u-1")
    assert body["metadata"]["namespace"] == "hyperplan-system"
    assert body["metadata"]["name"] == reboot_job_name("kind-worker2", "u-1")
    assert body["metadata"]["annotations"] == {ANNOTATION_REBOOT_NODE: "kind-worker2", ANNOTATION_REBOOT_NODE_UID: "u-1"}
    spec = body["spec"]
    assert (spec["backoffLimit"], spec["ttlSecondsAfterFinished"], spec["activeDeadlineSeconds"]) == (0, 60, 120)
    pod = spec["template"]["spec"]
    assert pod["nodeName"] == "kind-worker2" and pod["hostPID"] is True and pod["restartPolicy"] == "Never"
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["automountServiceAccountToken"] is False
    (c,) = pod["containers"]
    assert (c["image"], c["command"], c["securityContext"]) == ("registry.example/bmc:1", ["bmc", "power-cycle"],
                                                                 {"privileged": True, "runAsUser": 0, "runAsGroup": 0})


def test_the_default_reboot_takes_a_kind_node_down_past_the_grace_then_restarts_its_runtime_and_kubelet() -> None:
    (c,) = reboot_job_body(RebootJob(), "kind-worker", "u")["spec"]["template"]["spec"]["containers"]
    assert c["command"] == list(DEFAULT_REBOOT_COMMAND)
    assert c["command"][:3] == ["nsenter", "--target", "1"] and c["command"][-3:-1] == ["sh", "-c"]
    assert c["command"][-1] == ("systemctl stop kubelet && sleep 60 && systemctl restart containerd "
                                "&& systemctl start kubelet")
    assert c["image"] == "hyperplan:0.1.0"


@pytest.mark.parametrize("conditions, want", [
    pytest.param([], False, id="running"),
    pytest.param([("Complete", "True")], True, id="complete"),
    pytest.param([("FailureTarget", "True"), ("Failed", "True")], True, id="failed"),
    pytest.param([("Suspended", "True")], False, id="suspended"),
])
def test_a_job_has_finished_when_complete_or_failed(conditions, want) -> None:
    job = client.V1Job(status=client.V1JobStatus(conditions=[client.V1JobCondition(type=t, status=s)
                                                             for t, s in conditions]))
    assert job_finished(job) is want


# --------------------------------------------------------------------------- KWOK provider


class NodeApi:
    """The CoreV1Api calls of KwokProvider.reboot, recorded; ``node`` None: it is gone (404)."""

    def __init__(self, current: client.V1Node | None):
        self.current = current
        self.calls: list[tuple[str, Any]] = []

    def read_node(self, name: str) -> client.V1Node:
        self.calls.append(("read", name))
        if self.current is None:
            raise ApiException(status=404, reason="NotFound")
        return self.current

    def patch_node(self, name: str, body: dict) -> None:
        self.calls.append(("patch", body))

    def patch_node_status(self, name: str, body: dict) -> None:
        self.calls.append(("patch_status", body))


@pytest.mark.parametrize("current, uid, writes", [
    pytest.param(node(), "u-1", 2, id="ready-node-rebooted"),
    pytest.param(node(), "", 2, id="no-uid-known"),
    pytest.param(node(ready=("False", REBOOT_REASON)), "u-1", 0, id="reboot-under-way"),
    pytest.param(node(uid="u-2"), "u-1", 0, id="another-node-of-that-name"),
    pytest.param(None, "u-1", 0, id="gone"),
])
def test_kwok_reboot_writes_only_a_ready_node_it_holds(current, uid, writes) -> None:
    api = NodeApi(current)
    KwokProvider(SimpleNamespace(core=api), reboot_seconds=4, clock=lambda: NOW).reboot("n", uid)
    sent = [c for c in api.calls if c[0] != "read"]
    assert len(sent) == writes
    if writes:
        meta, status = kwok_reboot_patches("u-1", NOW, 4)  # the uid read, also when the caller knew none
        assert sent == [("patch", meta), ("patch_status", status)]


@pytest.mark.parametrize("status, body", [
    pytest.param(404, "", id="deleted-meanwhile"),
    pytest.param(422, "Precondition failed: UID in precondition: u-1, UID in object meta: u-2", id="made-again-meanwhile"),
])
def test_kwok_reboot_of_a_node_that_changed_hands_between_read_and_write_is_no_error(status, body) -> None:
    api = NodeApi(node())

    def refused(name: str, patch: dict) -> None:
        e = ApiException(status=status, reason="refused")
        e.body = body
        raise e
    api.patch_node = refused
    KwokProvider(SimpleNamespace(core=api), clock=lambda: NOW).reboot("n", "u-1")


def test_kwok_reboot_raises_what_is_not_a_gone_node() -> None:
    api = NodeApi(node())

    def refused(name: str, patch: dict) -> None:
        raise ApiException(status=403, reason="Forbidden")
    api.patch_node = refused
    with pytest.raises(ApiException):
        KwokProvider(SimpleNamespace(core=api), clock=lambda: NOW).reboot("n", "u-1")


# --------------------------------------------------------------------------- static provider


class JobApi:
    """BatchV1Api's Job calls, with the API server's 409 for a name taken; records them."""

    def __init__(self, existing: client.V1Job | None = None):
        self.jobs: dict[str, Any] = {}
        if existing is not None:
            self.jobs[existing.metadata.name] = existing
        self.calls: list[str] = []

    def create_namespaced_job(self, namespace: str, body: dict) -> None:
        self.calls.append("create")
        if body["metadata"]["name"] in self.jobs:
            raise ApiException(status=409, reason="AlreadyExists")
        self.jobs[body["metadata"]["name"]] = body

    def read_namespaced_job(self, name: str, namespace: str) -> client.V1Job:
        self.calls.append("read")
        return self.jobs[name]

    def delete_namespaced_job(self, name: str, namespace: str, body: client.V1DeleteOptions) -> None:
        self.calls.append("delete")
        assert body.preconditions.uid == self.jobs[name].metadata.uid
        del self.jobs[name]


def existing_job(finished: str | None) -> client.V1Job:
    conditions = [client.V1JobCondition(type=finished, status="True")] if finished else []
    return client.V1Job(metadata=client.V1ObjectMeta(name=reboot_job_name("n", "u-1"), uid="job-uid"),
                        status=client.V1JobStatus(conditions=conditions))


@pytest.mark.parametrize("current, uid, existing, calls, made", [
    pytest.param(node(), "u-1", None, ["create"], True, id="first-call-creates"),
    pytest.param(node(), "u-1", existing_job(None), ["create", "read"], False, id="under-way-409-no-second"),
    pytest.param(node(), "u-1", existing_job("Complete"), ["create", "read", "delete", "create"], True,
                 id="past-reboot-completed-made-again"),
    pytest.param(node(), "u-1", existing_job("Failed"), ["create", "read", "delete", "create"], True,
                 id="past-reboot-failed-made-again"),
    pytest.param(node(uid="u-2"), "u-1", None, [], False, id="another-node-of-that-name"),
    pytest.param(None, "u-1", None, [], False, id="gone"),
])
def test_static_reboot_creates_one_job_per_reboot(current, uid, existing, calls, made) -> None:
    jobs = JobApi(existing)
    kube = SimpleNamespace(core=NodeApi(current), batch=jobs)
    StaticProvider(kube, reboot_job=RebootJob(namespace="ops")).reboot("n", uid)
    assert jobs.calls == calls
    made_now = [j for j in jobs.jobs.values() if isinstance(j, dict)]
    assert len(made_now) == (1 if made else 0)
    if made:
        assert made_now[0] == reboot_job_body(RebootJob(namespace="ops"), "n", "u-1")


def test_static_reboot_jobs_run_in_the_operators_namespace_by_default() -> None:
    from hyperplan.planning.lending import OperatorIdentity
    assert StaticProvider(SimpleNamespace(), OperatorIdentity(namespace="hyperplan-system")).reboot_job.namespace \
        == "hyperplan-system"
    assert StaticProvider(SimpleNamespace()).reboot_job.namespace == "default"


# --------------------------------------------------------------------------- the fake


def fake_with_node() -> FakeProvider:
    fake = FakeProvider(clock=lambda: NOW)
    fake.create(placement.NodeSpec("n", {naming.LABEL_GROUP: "g"}, (naming.SPARE_TAINT,), "spare", None,
                                   "ml.p5.48xlarge", "z"))
    return fake


def ready_of(fake: FakeProvider, name: str = "n") -> tuple[str, str, datetime]:
    (c,) = [c for c in fake.nodes[name].status.conditions if c.type == "Ready"]
    return c.status, c.reason, c.last_transition_time


def test_the_fake_reboot_leaves_the_node_rebooting_until_the_test_brings_it_back() -> None:
    fake = fake_with_node()
    fake.reboot("n", "uid-n")
    assert ready_of(fake) == ("False", REBOOT_REASON, NOW)
    fake.reboot("n", "uid-n")  # under way: recorded, nothing changes
    assert fake.calls[-2:] == [("reboot", "n"), ("reboot", "n")]
    later = NOW + timedelta(seconds=10)
    fake.finish_reboot("n", later)
    assert ready_of(fake) == ("True", "KubeletReady", later)
    assert fake.nodes["n"].metadata.labels[naming.LABEL_GROUP] == "g"
    assert [t.key for t in fake.nodes["n"].spec.taints] == [naming.SPARE_TAINT.key]
    with pytest.raises(AssertionError, match="not being rebooted"):
        fake.finish_reboot("n")


@pytest.mark.parametrize("name, uid", [
    pytest.param("gone", "", id="gone"), pytest.param("n", "uid-other", id="another-node-of-that-name")])
def test_the_fake_reboot_of_a_node_it_does_not_hold_changes_nothing(name, uid) -> None:
    fake = fake_with_node()
    fake.reboot(name, uid)
    assert fake.calls[-1] == ("reboot", name)
    assert fake.nodes["n"].status is None


def test_the_fake_reboot_honours_fail_on() -> None:
    fake = fake_with_node()
    fake.fail_on.add("reboot")
    with pytest.raises(RuntimeError, match=r"injected failure in reboot\(n\)"):
        fake.reboot("n")
    assert fake.nodes["n"].status is None
