"""The AWS JSON 1.1 protocol as SageMaker speaks it (../shared/SAGEMAKER-API.md).

* Every call is ``POST /`` with ``X-Amz-Target: SageMaker.<Operation>`` and a JSON body (``{}``
  for an operation without input); the answer is ``application/x-amz-json-1.1``.
* An error is a 4xx/5xx status with ``{"__type": "<Code>", "message": "..."}``: botocore reads the
  code from ``__type`` only.
* Timestamps are epoch seconds both ways (a request may send a float).
* Paging: ``MaxResults`` (bounded per operation) and ``NextToken``. A token here is opaque to the
  client and names the last item of the page by its sort key, not by its position, so pages stay
  stable while objects are added or removed between calls (nothing is skipped or repeated but
  what changed); it also carries a digest of the query, so a token is refused by another query.
* boto3 checks required members, types and minimums itself, but not maximums, enums or patterns:
  :func:`bounded`, :func:`one_of` and :func:`matching` make those checks here and answer
  ``ValidationException`` (400) naming the member.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

CONTENT_TYPE = "application/x-amz-json-1.1"
TARGET_PREFIX = "SageMaker."


@dataclass
class ApiError(Exception):
    """An error as the client will see it: its code (``__type``), message and HTTP status."""

    code: str
    message: str
    status: int = 400

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def body(self) -> dict[str, str]:
        return {"__type": self.code, "message": self.message}


def not_found(message: str) -> ApiError:
    return ApiError("ResourceNotFound", message, 400)


def invalid(message: str) -> ApiError:
    return ApiError("ValidationException", message, 400)


def operation_of(target: str | None) -> str:
    """The operation a request names in ``X-Amz-Target``."""
    if not target or not target.startswith(TARGET_PREFIX) or len(target) == len(TARGET_PREFIX):
        raise ApiError("UnknownOperationException", f"X-Amz-Target must be {TARGET_PREFIX}<Operation>, "
                       f"not {target!r}", 400)
    return target[len(TARGET_PREFIX):]


MAX_DEPTH = 32
"""How deeply a request's JSON may nest: the deepest input of the served operations is a few
levels (a group's taints in UpdateCluster); anything deeper is refused before an operation walks it."""
REQUEST_ID = "x-amzn-RequestId"


def new_request_id() -> str:
    """An answer's request id (``x-amzn-RequestId``; boto3's ``ResponseMetadata.RequestId``)."""
    return str(uuid.uuid4())


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request's JSON object; anything else (not JSON, not an object, nested deeper than
    :data:`MAX_DEPTH`) is a ``SerializationException`` (400)."""
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ApiError("SerializationException", f"the body is not JSON: {str(e)[:200]}", 400) from None
    if not isinstance(body, dict):
        raise ApiError("SerializationException", "the body must be a JSON object", 400)
    if _depth(body) > MAX_DEPTH:
        raise ApiError("SerializationException", f"the body nests deeper than {MAX_DEPTH} levels", 400)
    return body


def _depth(value: Any) -> int:
    """How deeply ``value`` nests (a scalar 0, ``{}`` 1), walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_DEPTH:  # no deeper than needed to know it is too deep
            stack.extend((child, level + 1) for child in children)
    return deepest


# --------------------------------------------------------------------------- values


def epoch(moment: datetime | None) -> float | None:
    """A timestamp as the wire carries it (epoch seconds)."""
    return None if moment is None else moment.timestamp()


def time_of(body: Mapping[str, Any], member: str) -> datetime | None:
    """A request's timestamp member (epoch seconds, as boto3 and the CLI send them)."""
    value = body.get(member)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(f"{member} must be a timestamp in epoch seconds, not {value!r}")
    try:
        return datetime.fromtimestamp(value, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        raise invalid(f"{member} {value!r} is out of range") from None


def bounded(body: Mapping[str, Any], member: str, low: int, high: int) -> int | None:
    value = body.get(member)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{member} must be an integer, not {value!r}")
    if not low <= value <= high:
        raise invalid(f"1 validation error detected: Value '{value}' at '{_camel(member)}' failed to satisfy "
                      f"constraint: Member must have value between {low} and {high}")
    return value


def one_of(body: Mapping[str, Any], member: str, allowed: Sequence[str]) -> str | None:
    value = body.get(member)
    if value is None:
        return None
    if value not in allowed:
        raise invalid(f"1 validation error detected: Value '{value}' at '{_camel(member)}' failed to satisfy "
                      f"constraint: Member must satisfy enum value set: [{', '.join(allowed)}]")
    return value


def matching(body: Mapping[str, Any], member: str, pattern: str, low: int = 1, high: int = 2048) -> str | None:
    value = body.get(member)
    if value is None:
        return None
    if not isinstance(value, str) or not low <= len(value) <= high or re.fullmatch(pattern, value) is None:
        raise invalid(f"1 validation error detected: Value '{value}' at '{_camel(member)}' failed to satisfy "
                      f"constraint: Member must satisfy regular expression pattern: {pattern}")
    return value


def required(body: Mapping[str, Any], member: str) -> Any:
    if body.get(member) is None:
        raise invalid(f"1 validation error detected: Value null at '{_camel(member)}' failed to satisfy "
                      f"constraint: Member must not be null")
    return body[member]


def _camel(member: str) -> str:
    return member[:1].lower() + member[1:]


def compact(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A response structure without its absent members (the wire leaves them out)."""
    return {k: v for k, v in fields.items() if v is not None}


# --------------------------------------------------------------------------- paging


def query_digest(body: Mapping[str, Any]) -> str:
    """What a page token is tied to: the request without its paging members."""
    rest = {k: v for k, v in body.items() if k not in ("NextToken", "MaxResults")}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Ordered:
    """Items sorted by their keys, ascending (:func:`ordered`), to take many pages of: a reader
    that keeps one while its items do not change pages through 10,000 plans with a bisection a
    page, not a sort of all of them (``operations.PlanViews``)."""

    keys: list[tuple]  # each item's key as a comparable tuple, ascending
    raw: list[Any]  # the keys as given (what a token carries)
    items: list[dict[str, Any]]


def ordered(items: Iterable[tuple[Any, dict[str, Any]]]) -> Ordered:
    """``items`` (pairs of a sort key, JSON-comparable and unique, and the item), sorted by key."""
    keyed = sorted(((_tuple(key), key, item) for key, item in items), key=lambda entry: entry[0])
    return Ordered([e[0] for e in keyed], [e[1] for e in keyed], [e[2] for e in keyed])


def page(items: Iterable[tuple[Any, dict[str, Any]]] | Ordered, body: Mapping[str, Any], *, most: int = 100,
         default: int = 100, descending: bool = False) -> tuple[list[dict[str, Any]], str | None]:
    """One page of ``items`` (pairs of a sort key, JSON-comparable and unique, and the item, or
    an :class:`Ordered` of them) and the token of the next page (None on the last one)."""
    order = items if isinstance(items, Ordered) else ordered(items)
    size = bounded(body, "MaxResults", 1, most) or default
    digest = query_digest(body)
    after = _read_token(body.get("NextToken"), digest)
    n = len(order.keys)
    if not descending:  # the page starts after the key the token names (keys are unique)
        begin = 0 if after is None else bisect.bisect_right(order.keys, _tuple(after))
        end = min(n, begin + size)
        shown, more = range(begin, end), end < n
    else:  # from the largest key below the token's, down
        stop = n if after is None else bisect.bisect_left(order.keys, _tuple(after))
        begin = max(0, stop - size)
        shown, more = range(stop - 1, begin - 1, -1), begin > 0
    token = _make_token(order.raw[shown[-1]], digest) if more and len(shown) else None
    return [order.items[i] for i in shown], token


def _tuple(key: Any) -> tuple:
    return tuple(_tuple(k) if isinstance(k, list) else k for k in key) if isinstance(key, (list, tuple)) else (key,)


def _make_token(key: Any, digest: str) -> str:
    raw = json.dumps({"after": key, "query": digest}, separators=(",", ":"), default=str).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _read_token(token: Any, digest: str) -> Any:
    if token in (None, ""):
        return None
    try:
        text = base64.urlsafe_b64decode(str(token) + "=" * (-len(str(token)) % 4))
        data = json.loads(text)
        after, made_for = data["after"], data["query"]
    except (ValueError, KeyError, TypeError):
        raise invalid("NextToken is not a token this server gave out") from None
    if made_for != digest:
        raise invalid("NextToken was given out for another query; repeat that query's members with it")
    return after
