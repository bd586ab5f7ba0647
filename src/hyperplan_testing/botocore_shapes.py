"""Answers of hyperplan's SageMaker API checked against botocore's own service model.

boto3 checks a request against the model before it sends it, but never an answer: a member
missing, a value outside its enum, a string that breaks its pattern or an integer out of its
range is parsed as given, and the caller's code (or another tool built on the model, such as the
HyperPod CLI) trips over it later. :func:`violations` walks an answer as it crossed the wire (the
JSON 1.1 body, timestamps as epoch seconds) through the operation's output shape:

* structures: required members present, no member the shape does not have;
* lists and maps: their length bounds, each member (and each key) checked in turn;
* strings: type, length bounds, enum, pattern (matched whole, as the service does);
* integers and longs: type and range; doubles and floats: type and range; booleans: type;
* timestamps: epoch seconds (a number), as the JSON 1.1 wire carries them.

:func:`error_violations` checks an error answer: a ``{"__type", "message"}`` body whose code is
one the model lists for the operation or one every AWS JSON service answers
(:data:`COMMON_ERRORS`), with a 4xx or 5xx status.

Each check returns readable sentences naming the path of the value (empty: it holds). botocore
is a test dependency; it is imported on first use.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any

SERVICE = "sagemaker"

# Errors any AWS JSON 1.1 service answers besides those an operation models: the signature and
# key checks, throttling, bad input and the server's own failure.
COMMON_ERRORS = frozenset({
    "AccessDeniedException", "IncompleteSignature", "InternalFailure", "InvalidSignatureException",
    "MissingAuthenticationToken", "SerializationException", "ServiceUnavailable", "SignatureDoesNotMatch",
    "ThrottlingException", "UnknownOperationException", "UnrecognizedClientException", "ValidationException",
})


@functools.lru_cache(maxsize=4)
def model(service: str = SERVICE) -> dict[str, Any]:
    """botocore's service model of ``service`` (the newest version botocore carries)."""
    from botocore.loaders import Loader

    return Loader().load_service_model(service, "service-2")


def operations(service: str = SERVICE) -> frozenset[str]:
    return frozenset(model(service)["operations"])


def output_shape(operation: str, service: str = SERVICE) -> str | None:
    op = model(service)["operations"].get(operation)
    if op is None:
        raise KeyError(f"{service} has no operation {operation}")
    return (op.get("output") or {}).get("shape")


def modeled_errors(operation: str, service: str = SERVICE) -> frozenset[str]:
    """The error codes the model lists for ``operation``."""
    op = model(service)["operations"][operation]
    return frozenset(e["shape"] for e in op.get("errors") or [])


def violations(operation: str, answer: Any, service: str = SERVICE) -> list[str]:
    """How ``answer`` (the JSON body of a 200) breaks ``operation``'s output shape."""
    shape = output_shape(operation, service)
    if shape is None:
        return [] if answer in ({}, None) else [f"{operation}: the model has no output, the answer is {answer!r}"]
    out: list[str] = []
    _check(model(service)["shapes"], shape, answer, operation, out)
    return out


def error_violations(operation: str, status: int, body: Any, service: str = SERVICE) -> list[str]:
    """How an error answer breaks the wire: its status, its body's shape, its code."""
    out = []
    if not 400 <= status <= 599:
        out.append(f"{operation}: an error answered with status {status}")
    if not isinstance(body, Mapping) or not isinstance(body.get("__type"), str) \
            or not isinstance(body.get("message"), str):
        return out + [f"{operation}: an error body must be {{'__type': str, 'message': str}}, not {body!r}"]
    code = body["__type"].rsplit("#", 1)[-1]
    known = operation in model(service)["operations"]
    if code not in COMMON_ERRORS and (not known or code not in modeled_errors(operation, service)):
        listed = sorted(modeled_errors(operation, service)) if known else []
        out.append(f"{operation}: error code {code!r} is neither one the model lists for it ({listed}) "
                   f"nor a common one")
    return out


# --------------------------------------------------------------------------- the walk


def _check(shapes: Mapping[str, Any], name: str, value: Any, path: str, out: list[str]) -> None:
    shape = shapes[name]
    kind = shape["type"]
    checker = _CHECKS.get(kind)
    if checker is None:
        out.append(f"{path}: shape {name} of type {kind} is not checked here")
        return
    checker(shapes, name, shape, value, path, out)


def _structure(shapes, name, shape, value, path, out) -> None:
    if not isinstance(value, Mapping):
        out.append(f"{path}: {name} must be a structure, not {value!r}")
        return
    members = shape.get("members") or {}
    for member in shape.get("required") or []:
        if value.get(member) is None:
            out.append(f"{path}.{member}: required by {name}, missing")
    for member, item in value.items():
        if member not in members:
            out.append(f"{path}.{member}: {name} has no member {member}")
        elif item is not None:
            _check(shapes, members[member]["shape"], item, f"{path}.{member}", out)


def _list(shapes, name, shape, value, path, out) -> None:
    if not isinstance(value, list):
        out.append(f"{path}: {name} must be a list, not {value!r}")
        return
    _length(name, shape, len(value), path, out, "items")
    for i, item in enumerate(value):
        _check(shapes, shape["member"]["shape"], item, f"{path}[{i}]", out)


def _map(shapes, name, shape, value, path, out) -> None:
    if not isinstance(value, Mapping):
        out.append(f"{path}: {name} must be a map, not {value!r}")
        return
    _length(name, shape, len(value), path, out, "entries")
    for key, item in value.items():
        _check(shapes, shape["key"]["shape"], key, f"{path} key {key!r}", out)
        _check(shapes, shape["value"]["shape"], item, f"{path}[{key!r}]", out)


def _string(shapes, name, shape, value, path, out) -> None:
    if not isinstance(value, str):
        out.append(f"{path}: {name} must be a string, not {value!r}")
        return
    _length(name, shape, len(value), path, out, "characters")
    if "enum" in shape and value not in shape["enum"]:
        out.append(f"{path}: {value!r} is not in {name}'s enum {shape['enum']}")
    pattern = shape.get("pattern")
    if pattern is not None and not _matcher(pattern)(value):
        out.append(f"{path}: {value!r} breaks {name}'s pattern {pattern}")


def _number(shapes, name, shape, value, path, out) -> None:
    integral = shape["type"] in ("integer", "long")
    if isinstance(value, bool) or not isinstance(value, int if integral else (int, float)):
        out.append(f"{path}: {name} must be {'an integer' if integral else 'a number'}, not {value!r}")
        return
    low, high = shape.get("min"), shape.get("max")
    if (low is not None and value < low) or (high is not None and value > high):
        out.append(f"{path}: {value} is outside {name}'s range {low}..{high}")


def _boolean(shapes, name, shape, value, path, out) -> None:
    if not isinstance(value, bool):
        out.append(f"{path}: {name} must be a boolean, not {value!r}")


def _timestamp(shapes, name, shape, value, path, out) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        out.append(f"{path}: {name} must be a timestamp in epoch seconds, not {value!r}")


def _length(name, shape, n, path, out, unit) -> None:
    low, high = shape.get("min"), shape.get("max")
    if (low is not None and n < low) or (high is not None and n > high):
        out.append(f"{path}: {n} {unit}, outside {name}'s bounds {low}..{high}")


_CHECKS: dict[str, Callable[..., None]] = {
    "structure": _structure, "list": _list, "map": _map, "string": _string, "integer": _number,
    "long": _number, "double": _number, "float": _number, "boolean": _boolean, "timestamp": _timestamp,
}

# The model's patterns are Java regular expressions; Python's re reads them but for the Unicode
# categories (``\p{L}``), which only the tag patterns use, inside one character class.
_UNICODE_CLASS = re.compile(r"\(?\[((?:\\p\{[A-Z]\}|\\.|[^\]\\])*)\]\*\)?")


@functools.lru_cache(maxsize=256)
def _matcher(pattern: str) -> Callable[[str], bool]:
    if "\\p{" not in pattern:
        compiled = re.compile(pattern)
        return lambda text: compiled.fullmatch(text) is not None
    whole = _UNICODE_CLASS.fullmatch(pattern)
    if whole is None:
        raise ValueError(f"a pattern with Unicode categories this checker cannot read: {pattern}")
    inside = whole.group(1)
    categories = set(re.findall(r"\\p\{([A-Z])\}", inside))
    literal = re.sub(r"\\p\{[A-Z]\}", "", inside)
    chars = set(re.sub(r"\\(.)", r"\1", literal))
    return lambda text: all(unicodedata.category(c)[0] in categories or c in chars for c in text)
