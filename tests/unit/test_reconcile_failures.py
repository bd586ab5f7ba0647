"""A failed pass: backoff, the message a user sees, and the condition it leaves on the object."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from kubernetes.client.rest import ApiException

from hyperplan.runtime.workqueue import describe_failure, failure_backoff, failure_conditions

NOW = datetime(2027, 1, 1, 12, tzinfo=timezone.utc)


@pytest.mark.parametrize("failures, seconds", [
    (1, 5), (2, 10), (3, 20), (4, 40), (6, 160), (7, 300), (50, 300),
], ids=["first", "second", "third", "fourth", "sixth", "capped", "long-broken"])
def test_backoff_doubles_up_to_five_minutes(failures: int, seconds: float) -> None:
    assert failure_backoff(failures) == timedelta(seconds=seconds)


def api_error(status: int, message: str | None, body: str | None = None) -> ApiException:
    e = ApiException(status=status, reason="Unprocessable Entity" if status == 422 else "Forbidden")
    e.body = body if body is not None else json.dumps({"kind": "Status", "message": message, "code": status})
    return e


@pytest.mark.parametrize("error, reason, message", [
    (api_error(422, 'Node "hp-x" is invalid: metadata.labels: Invalid value: "a b"'), "ApiError",
     'the API server refused a call (422): Node "hp-x" is invalid: metadata.labels: Invalid value: "a b"'),
    (api_error(403, "nodes is forbidden: ValidatingAdmissionPolicy 'no-team' denied request"), "ApiError",
     "the API server refused a call (403): nodes is forbidden: ValidatingAdmissionPolicy 'no-team' denied request"),
    (api_error(500, None, body="<html>bad gateway</html>"), "ApiError",
     "the API server refused a call (500): Forbidden"),
    (ValueError("slot must be '<n>'"), "ReconcileError", "ValueError: slot must be '<n>'"),
], ids=["invalid-node", "admission-policy", "not-json", "bug"])
def test_the_message_is_the_api_servers(error: Exception, reason: str, message: str) -> None:
    assert describe_failure(error) == (reason, message)


def test_the_condition_keeps_the_others_and_its_first_failure_time() -> None:
    ready = {"type": "Ready", "status": "True", "reason": "NodesReady", "message": "",
             "lastTransitionTime": "2027-01-01T11:00:00Z"}
    first = failure_conditions([ready], "ApiError", "refused", 1, timedelta(seconds=5), NOW, 3)
    assert first[0] == ready
    assert first[1] == {"type": "Reconciled", "status": "False", "reason": "ApiError",
                        "message": "refused (failed 1 time(s) in a row; next try in 5s)",
                        "lastTransitionTime": "2027-01-01T12:00:00Z", "observedGeneration": 3}
    later = failure_conditions(first, "ApiError", "refused", 4, timedelta(seconds=40),
                               NOW + timedelta(minutes=2), 3)
    assert [c["type"] for c in later] == ["Ready", "Reconciled"]
    assert later[1]["lastTransitionTime"] == "2027-01-01T12:00:00Z"  # failing since the first time
    assert later[1]["message"].endswith("(failed 4 time(s) in a row; next try in 40s)")
