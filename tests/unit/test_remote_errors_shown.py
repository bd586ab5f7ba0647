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


# ------------------------------------------------------------------- listings are bounded


class Paging:
    """A remote's list call: ``pages`` pages of ``size`` items each, then no NextToken (``None``: it
    never stops paging)."""

    def __init__(self, size: int, pages: int | None) -> None:
        self.size, self.pages, self.calls = size, pages, 0

    def list_training_plans(self, **arguments):
        self.calls += 1
        more = self.pages is None or self.calls < self.pages
        return {"TrainingPlanSummaries": [{"n": i} for i in range(self.size)],
                **({"NextToken": f"t{self.calls}"} if more else {})}


@pytest.mark.parametrize("size, pages, ok", [
    pytest.param(100, 3, True, id="three-pages"),
    pytest.param(100, None, False, id="a-remote-that-pages-for-ever"),
    pytest.param(5000, 1, False, id="a-page-larger-than-asked"),
])
def test_a_listing_is_bounded_in_pages_and_items(size: int, pages: int | None, ok: bool) -> None:
    from hyperplan.actuation.remote.calls import MAX_PAGES, RemoteCalls, RemoteError

    client = Paging(size, pages)
    calls = RemoteCalls()
    calls.client, calls.endpoint = client, "https://capacity.example.com"
    if ok:
        assert len(calls._pages("ListTrainingPlans", "list_training_plans", "TrainingPlanSummaries")) == size * pages
    else:
        with pytest.raises(RemoteError, match="ListingTooLong"):
            calls._pages("ListTrainingPlans", "list_training_plans", "TrainingPlanSummaries")
        assert client.calls <= MAX_PAGES
