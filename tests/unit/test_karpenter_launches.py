"""Why a karpenter group's NodeClaims do not launch, decided purely (planning.ownership.launch_verdict,
``now`` passed in): the group's own check before any claim (node class, Karpenter's offerings),
Karpenter's failures read from its claims, the backoff before a deleted claim is made again, the
Warning once per cause and the reasons counted. The pass around it: test_karpenter_launch_pass.py."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from hyperplan.actuation.providers.karpenter import listed_claim, read_offerings
from hyperplan.api.models import Condition
from hyperplan.api.vocabulary import (
    CONDITION_NODES_LAUNCHED, REASON_NODE_CLASS_NOT_FOUND, REASON_NOT_OFFERED,
)
from hyperplan.planning.ownership import (
    LAUNCH_RECHECK, ClaimFailure, LaunchCause, LaunchFacts, LaunchMemory, launch_backoff, launch_failure,
    launch_verdict, not_offered,
)
from hyperplan_dev import karpenter as plane_karpenter

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
S = timedelta(seconds=1)
ITYPE, ZONE = "ml.p5.48xlarge", "us-east-1a"
WANTED = ((ITYPE, ZONE),)
OFFERED = frozenset({(ITYPE, ZONE), (ITYPE, "us-east-1b"), ("ml.p4d.24xlarge", ZONE)})
NO_CLASS = LaunchCause(REASON_NODE_CLASS_NOT_FOUND, 'KWOKNodeClass default (karpenter.kwok.sh) does not exist')
ICE = LaunchCause("InsufficientCapacityError", "insufficient capacity, resolving node class from nodeclaim")
LAUNCH_FAILED = LaunchCause("LaunchFailed", "translating nodeclaim to node, instance type not found")


def gone(n: int = 1, cause: LaunchCause = ICE) -> ClaimFailure:
    return ClaimFailure(f"g-{n}-abc123", f"uid-{n}", cause, gone=True)


def retried(n: int = 1, cause: LaunchCause = LAUNCH_FAILED) -> ClaimFailure:
    return ClaimFailure(f"g-{n}-abc123", f"uid-{n}", cause)


def prior_condition(reason: str, message: str, status: str = "False") -> list[Condition]:
    return [Condition(type=CONDITION_NODES_LAUNCHED, status=status, reason=reason, message=message,
                      last_transition_time=NOW - 60 * S, observed_generation=1)]


# (facts, wanted, prior conditions) -> creates allowed, condition reason (None: absent), in its message,
# Warning reasons, counted reasons, wake after now (None: none), failures remembered
CASES = [
    pytest.param(LaunchFacts(), WANTED, [], True, None, "", [], [], None, 0, id="nothing-in-the-way-no-condition"),
    pytest.param(LaunchFacts(blocked=NO_CLASS), WANTED, [], False, REASON_NODE_CLASS_NOT_FOUND,
                 "no NodeClaim is made until that is fixed", [REASON_NODE_CLASS_NOT_FOUND],
                 [REASON_NODE_CLASS_NOT_FOUND], LAUNCH_RECHECK, 0, id="node-class-missing-stops-every-create"),
    pytest.param(LaunchFacts(blocked=NO_CLASS, memory=LaunchMemory(cause=NO_CLASS)), WANTED, [], False,
                 REASON_NODE_CLASS_NOT_FOUND, "does not exist", [], [], LAUNCH_RECHECK, 0,
                 id="node-class-still-missing-no-second-warning"),
    pytest.param(LaunchFacts(blocked=NO_CLASS), WANTED,
                 prior_condition(REASON_NODE_CLASS_NOT_FOUND, NO_CLASS.message + ": no NodeClaim is made"), False,
                 REASON_NODE_CLASS_NOT_FOUND, "", [], [], LAUNCH_RECHECK, 0,
                 id="after-a-restart-the-condition-says-the-warning-was-posted"),
    pytest.param(LaunchFacts(blocked=NO_CLASS), (), [], True, None, "", [], [], None, 0,
                 id="node-class-missing-but-nothing-to-make-says-nothing"),
    pytest.param(LaunchFacts(offered=OFFERED), ((ITYPE, "us-nowhere-1z"),), [], False, REASON_NOT_OFFERED,
                 "only in us-east-1a, us-east-1b, not in zone us-nowhere-1z", [REASON_NOT_OFFERED],
                 [REASON_NOT_OFFERED], LAUNCH_RECHECK, 0, id="a-zone-karpenter-does-not-offer"),
    pytest.param(LaunchFacts(offered=OFFERED), (("ml.trn2.48xlarge", ZONE),), [], False, REASON_NOT_OFFERED,
                 "instance type ml.trn2.48xlarge is not one of them", [REASON_NOT_OFFERED], [REASON_NOT_OFFERED],
                 LAUNCH_RECHECK, 0, id="an-instance-type-karpenter-does-not-offer"),
    pytest.param(LaunchFacts(offered=OFFERED), WANTED, [], True, None, "", [], [], None, 0,
                 id="an-offered-type-and-zone"),
    pytest.param(LaunchFacts(offered=None), (("ml.trn2.48xlarge", "anywhere"),), [], True, None, "", [], [], None, 0,
                 id="offerings-unknown-not-checked"),
    pytest.param(LaunchFacts(failures=(retried(),)), (), [], True, "LaunchFailed",
                 "NodeClaim g-1-abc123: translating nodeclaim to node, instance type not found; Karpenter retries it",
                 ["LaunchFailed"], ["LaunchFailed"], None, 0, id="a-claim-karpenter-retries-shows-its-reason"),
    pytest.param(LaunchFacts(failures=(retried(),), memory=LaunchMemory(cause=LAUNCH_FAILED, counted=frozenset({"uid-1"}))),
                 (), [], True, "LaunchFailed", "", [], [], None, 0, id="the-same-claim-next-pass-counted-once"),
    pytest.param(LaunchFacts(failures=(gone(1), gone(2))), WANTED, [], False, ICE.reason,
                 "1 time(s) in a row Karpenter deleted claims before they launched: the slots' claims are made again at "
                 "2026-12-01T12:00:05Z (backoff 5s)", [ICE.reason], [ICE.reason, ICE.reason], 5 * S, 1,
                 id="claims-deleted-before-launch-back-off-5s"),
    pytest.param(LaunchFacts(failures=(gone(3),), memory=LaunchMemory(ICE, 1, NOW - 5 * S, frozenset({"uid-1"}))),
                 WANTED, [], False, ICE.reason, "2 time(s) in a row", [], [ICE.reason], 10 * S, 2,
                 id="deleted-again-the-backoff-doubles-and-no-second-warning"),
    pytest.param(LaunchFacts(memory=LaunchMemory(ICE, 2, NOW - 9 * S, frozenset({"uid-1"}))), WANTED, [], False,
                 ICE.reason, "made again at 2026-12-01T12:00:01Z (backoff 10s)", [], [], 1 * S, 2,
                 id="within-the-backoff-no-claim-made"),
    pytest.param(LaunchFacts(memory=LaunchMemory(ICE, 2, NOW - 10 * S, frozenset({"uid-1"}))), WANTED, [], True,
                 ICE.reason, "made again from 2026-12-01T12:00:00Z", [], [], None, 2,
                 id="past-the-backoff-the-claims-are-made-again"),
    pytest.param(LaunchFacts(memory=LaunchMemory(ICE, 2, NOW - 20 * S, frozenset({"uid-1"})), launched=True), (), [],
                 True, None, "", [], [], None, 0, id="a-claim-launched-forgets-the-backoff-and-the-condition-goes"),
    pytest.param(LaunchFacts(failures=(gone(1, LaunchCause("LaunchFailed", "other")),),
                             memory=LaunchMemory(ICE, 1, NOW - 30 * S, frozenset({"uid-0"}))), WANTED, [], False,
                 "LaunchFailed", "NodeClaim g-1-abc123: other", ["LaunchFailed"], ["LaunchFailed"], 10 * S, 2,
                 id="a-new-cause-gets-its-own-warning"),
    pytest.param(LaunchFacts(blocked=NO_CLASS, memory=LaunchMemory(ICE, 3, NOW, frozenset({"uid-1"}))), WANTED, [],
                 False, REASON_NODE_CLASS_NOT_FOUND, "does not exist", [REASON_NODE_CLASS_NOT_FOUND],
                 [REASON_NODE_CLASS_NOT_FOUND], LAUNCH_RECHECK, 3, id="the-groups-own-check-before-the-backoff"),
]


@pytest.mark.parametrize("facts, wanted, prior, allowed, reason, in_message, warnings, counted, wake, failures", CASES)
def test_launch_verdict(facts, wanted, prior, allowed, reason, in_message, warnings, counted, wake, failures) -> None:
    v = launch_verdict(facts, wanted, 1, prior, NOW)
    assert v.creates_allowed == allowed
    if reason is None:
        assert v.condition is None
    else:
        assert (v.condition.type, v.condition.status, v.condition.reason) == (CONDITION_NODES_LAUNCHED, "False", reason)
        assert in_message in v.condition.message
    assert [e.reason for e in v.events] == warnings and all(e.type == "Warning" for e in v.events)
    assert list(v.counted) == counted
    assert v.wake_at == (None if wake is None else NOW + wake)
    assert v.memory.failures == failures


def test_the_condition_keeps_its_transition_time_across_retries() -> None:
    first = launch_verdict(LaunchFacts(blocked=NO_CLASS), WANTED, 1, [], NOW)
    later = launch_verdict(LaunchFacts(blocked=NO_CLASS, memory=first.memory), WANTED, 1, [first.condition], NOW + 30 * S)
    assert later.condition.last_transition_time == NOW


@pytest.mark.parametrize("failures, backoff", [
    pytest.param(0, 0, id="none"), pytest.param(1, 5, id="first"), pytest.param(2, 10, id="doubles"),
    pytest.param(5, 80, id="fifth"), pytest.param(6, 120, id="at-most-two-minutes"),
    pytest.param(1000, 120, id="no-overflow"),
])
def test_launch_backoff(failures, backoff) -> None:
    assert launch_backoff(failures) == backoff * S


@pytest.mark.parametrize("status, reason, provider_id, failed", [
    pytest.param("Unknown", "AwaitingReconciliation", "", False, id="not-looked-at-yet"),
    pytest.param("Unknown", "LaunchFailed", "", True, id="launch-failed-karpenter-retries"),
    pytest.param("False", "InsufficientCapacity", "", True, id="false"),
    pytest.param("True", "Launched", "kwok://x", False, id="launched"),
    pytest.param("Unknown", "LaunchFailed", "kwok://x", False, id="a-provider-id-means-launched"),
    pytest.param("", "", "", False, id="no-condition"),
])
def test_launch_failure_from_the_launched_condition(status, reason, provider_id, failed) -> None:
    assert (launch_failure(status, reason, "m", provider_id) is not None) == failed


def test_a_listed_claim_carries_karpenters_reason_and_message() -> None:
    obj = {"metadata": {"name": "g-0-abc123", "uid": "u"}, "status": {"conditions": [
        {"type": "Launched", "status": "Unknown", "reason": "LaunchFailed",
         "message": "translating nodeclaim to node, instance type not found"}]}}
    assert listed_claim(obj).launch_failure == LaunchCause("LaunchFailed",
                                                           "translating nodeclaim to node, instance type not found")


def test_not_offered_names_each_missing_pair_once() -> None:
    cause = not_offered(OFFERED, "reserved", [(ITYPE, "z"), (ITYPE, "z")])
    assert cause.message.count("not in zone z") == 1


def test_the_plane_karpenters_instance_type_file_is_read_as_offerings(tmp_path) -> None:
    path = tmp_path / "instance-types.json"
    path.write_text(json.dumps(plane_karpenter.instance_types(("ml.p5.48xlarge",), ("us-east-1a", "us-west-2b"))))
    assert read_offerings(str(path), "reserved") == {("ml.p5.48xlarge", "us-east-1a"), ("ml.p5.48xlarge", "us-west-2b")}
    assert read_offerings(str(path), "on-demand") == read_offerings(str(path), "reserved")
    path.write_text(json.dumps(plane_karpenter.instance_types(("ml.p5.48xlarge",), ("us-east-1a",))))
    import os
    os.utime(path, ns=(1, 10**18))  # another mtime: read again
    assert read_offerings(str(path), "reserved") == {("ml.p5.48xlarge", "us-east-1a")}


@pytest.mark.parametrize("content", [
    pytest.param(None, id="no-file"), pytest.param("{not json", id="not-json"),
    pytest.param('{"a": 1}', id="not-a-list"),
])
def test_offerings_that_cannot_be_read_are_unknown(tmp_path, content) -> None:
    path = tmp_path / "types.json"
    if content is not None:
        path.write_text(content)
    assert read_offerings(str(path), "reserved") is None
    assert read_offerings("", "reserved") is None


def test_hyperplan_status_shows_why_the_nodes_do_not_launch_before_the_ready_condition() -> None:
    from hyperplan.status import _message
    ready = Condition(type="Ready", status="False", reason="Provisioning", message="0/2 active nodes Ready",
                      last_transition_time=NOW, observed_generation=1)
    v = launch_verdict(LaunchFacts(blocked=NO_CLASS), WANTED, 1, [], NOW)
    assert _message([ready, v.condition]).startswith(f"NodesLaunched=False (NodeClassNotFound): {NO_CLASS.message}")
    assert _message([ready]) == "Ready=False: 0/2 active nodes Ready"


class _Served:
    """The API server as the node class read sees it: discovery of the node class's group, and the
    node classes there (by name), each with its status conditions."""

    def __init__(self, classes: dict[str, list[dict]] | None, fail: Exception | None = None) -> None:
        self.classes, self.fail, self.reads = classes, fail, 0
        self.api, self.custom = self, self

    def call_api(self, path: str, method: str, **_: object) -> dict:
        from kubernetes.client.rest import ApiException
        if self.fail is not None:
            raise self.fail
        if self.classes is None:
            raise ApiException(status=404)
        if path == "/apis/karpenter.kwok.sh":
            return {"preferredVersion": {"version": "v1alpha1"}, "versions": [{"version": "v1alpha1"}]}
        assert path == "/apis/karpenter.kwok.sh/v1alpha1"
        return {"resources": [{"name": "kwoknodeclasses", "kind": "KWOKNodeClass"},
                              {"name": "kwoknodeclasses/status", "kind": "KWOKNodeClass"}]}

    def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str) -> dict:
        from kubernetes.client.rest import ApiException
        self.reads += 1
        assert (group, version, plural) == ("karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses")
        if name not in self.classes:
            raise ApiException(status=404)
        return {"metadata": {"name": name}, "status": {"conditions": self.classes[name]}}


@pytest.mark.parametrize("served, reason", [
    pytest.param({"default": [{"type": "Ready", "status": "True"}]}, None, id="there-and-ready"),
    pytest.param({"default": []}, None, id="there-without-conditions"),
    pytest.param({}, "NodeClassNotFound", id="not-there"),
    pytest.param(None, "NodeClassNotFound", id="its-api-group-not-served"),
    pytest.param({"default": [{"type": "Ready", "status": "False", "reason": "Broken", "message": "m"}]},
                 "NodeClassNotReady", id="ready-false"),
])
def test_the_node_class_read(served, reason) -> None:
    from hyperplan.actuation.providers.karpenter import KarpenterProvider
    cause = KarpenterProvider(_Served(served)).node_class_problem()
    assert (cause.reason if cause else None) == reason


def test_a_node_class_that_cannot_be_read_is_not_checked_and_one_read_serves_a_while() -> None:
    from kubernetes.client.rest import ApiException
    from hyperplan.actuation.providers.karpenter import KarpenterProvider
    assert KarpenterProvider(_Served({}, fail=ApiException(status=403))).node_class_problem() is None
    assert KarpenterProvider(_Served({}, fail=TypeError("a client that changed"))).node_class_problem() is None
    served = _Served({"default": []})
    provider = KarpenterProvider(served)
    for _ in range(3):
        provider.node_class_problem()
    assert served.reads == 1
