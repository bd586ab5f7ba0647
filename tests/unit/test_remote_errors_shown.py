"""What a remote endpoint's error may show in a plan's condition and Events, which anyone with
`view` reads: an AWS-shaped error as it is, never the body of another kind of server."""

from __future__ import annotations

import pytest

from hyperplan.actuation.remote.calls import shown_code, shown_message

NOT_SHOWN = "the endpoint's answer is not a SageMaker or EC2 error (not shown)"


@pytest.mark.parametrize("code, status, message, shown", [
    pytest.param("ValidationException", 400, "Duration must be whole days", ("ValidationException",
                 "Duration must be whole days"), id="an-aws-error-as-it-is"),
    pytest.param("InvalidCapacityBlockOfferingId.NotFound", 400, "no such offering",
                 ("InvalidCapacityBlockOfferingId.NotFound", "no such offering"), id="an-ec2-dotted-code"),
    pytest.param("502", 502, "<html><body><h1>502 Bad Gateway</h1>internal-service.ns.svc</body></html>",
                 ("HTTP502", NOT_SHOWN), id="an-error-page-of-another-server"),
    pytest.param("ServiceUnavailable", 503, "<!doctype html><title>token=abc</title>",
                 ("ServiceUnavailable", NOT_SHOWN), id="markup-behind-an-aws-code"),
    pytest.param("ThrottlingException", 400, "x" * 301, ("ThrottlingException", NOT_SHOWN), id="too-long"),
    pytest.param("Bad Code!", 400, "fine", ("HTTP400", NOT_SHOWN), id="a-code-that-is-not-a-code"),
    pytest.param("ValidationException", 400, "line one\nline two", ("ValidationException", "line one line two"),
                 id="whitespace-folded"),
])
def test_only_an_aws_shaped_error_is_shown(code: str, status: int, message: str, shown: tuple[str, str]) -> None:
    assert (shown_code(code, status), shown_message(code, message)) == shown
