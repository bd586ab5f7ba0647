"""AWS Signature Version 4, as the server checks it: every request is signed by an access key
that an admin created, and the signature is computed again here from the request as received.

What a request must carry (what boto3 and the AWS CLI send for a JSON 1.1 service):
``Authorization: AWS4-HMAC-SHA256 Credential=<key id>/<yyyymmdd>/<region>/sagemaker/aws4_request,
SignedHeaders=<names;...>, Signature=<hex>`` and ``X-Amz-Date: <yyyymmddThhmmssZ>``; the signed
headers must include ``host``. The region is taken from the credential scope (the ARNs the server
hands out name it). The clock may be off by at most :data:`MAX_SKEW` either way, as on AWS.

Which error, for what (the codes an AWS client knows; the CLI prints them as ``An error occurred
(<code>)``; none is retried by botocore):

* no ``Authorization`` header, another algorithm, a malformed credential or scope, a scope for
  another service, a date outside the skew, ``host`` unsigned: ``InvalidSignatureException``;
* an access key id no Secret holds: ``UnrecognizedClientException``;
* a signature that does not match the one computed with the key's secret:
  ``SignatureDoesNotMatch``.

The comparison is constant-time (:func:`hmac.compare_digest`). Pure: ``now`` is passed in.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from hyperplan.sagemaker.wire import ApiError

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "sagemaker"
MAX_SKEW = timedelta(minutes=5)
_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256\s+Credential=(?P<credential>[^,\s]+),\s*SignedHeaders=(?P<signed>[^,\s]+),"
    r"\s*Signature=(?P<signature>[0-9a-f]{64})$")
_DATE = "%Y%m%dT%H%M%SZ"


@dataclass(frozen=True)
class AccessKey:
    """A key an admin created (``hyperplan api-key create``): its id, its secret, and the
    Kubernetes identity the server acts as for requests signed with it."""

    key_id: str
    secret: str
    user: str


@dataclass(frozen=True)
class Caller:
    """Who signed a request, and where: the key's identity and the region of the scope."""

    key: AccessKey
    region: str


def _sign(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signing_key(secret: str, day: str, region: str, service: str = SERVICE) -> bytes:
    """The key derived for one day, region and service (the HMAC chain of SigV4)."""
    return _sign(_sign(_sign(_sign(f"AWS4{secret}".encode(), day), region), service), "aws4_request")


def canonical_request(method: str, path: str, query: str, headers: Mapping[str, str], signed: list[str],
                      body: bytes) -> str:
    """The canonical form of a request that SigV4 signs: method, path, sorted query, the signed
    headers lower-cased with their values trimmed and inner runs of spaces collapsed, and the
    SHA-256 of the body."""
    pairs = sorted(urllib.parse.parse_qsl(query, keep_blank_values=True))
    canonical_query = "&".join(f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
                               for k, v in pairs)
    lower = {k.lower(): v for k, v in headers.items()}
    lines = "".join(f"{name}:{' '.join(str(lower.get(name, '')).split())}\n" for name in signed)
    return "\n".join([method.upper(), urllib.parse.quote(path or "/", safe="/~"), canonical_query, lines,
                      ";".join(signed), hashlib.sha256(body).hexdigest()])


def verify(method: str, path: str, query: str, headers: Mapping[str, str], body: bytes,
           key_of: Callable[[str], AccessKey | None], now: datetime) -> Caller:
    """The caller of a signed request, or :class:`ApiError` saying why it is refused."""
    lower = {k.lower(): v for k, v in headers.items()}
    auth = lower.get("authorization")
    if not auth:
        raise ApiError("InvalidSignatureException", "the request is not signed (no Authorization header); "
                       "sign it with AWS Signature Version 4", 403)
    found = _AUTH.match(auth.strip())
    if found is None:
        raise ApiError("InvalidSignatureException",
                       f"the Authorization header is not {ALGORITHM} with Credential, SignedHeaders and Signature", 403)
    parts = found["credential"].split("/")
    if len(parts) != 5 or parts[4] != "aws4_request":
        raise ApiError("InvalidSignatureException",
                       "the credential must be <access key id>/<date>/<region>/sagemaker/aws4_request", 403)
    key_id, day, region, service, _ = parts
    if service != SERVICE:
        raise ApiError("InvalidSignatureException", f"the credential is scoped to service {service!r}, "
                       f"not {SERVICE!r}", 403)
    stamp = lower.get("x-amz-date", "")
    try:
        signed_at = datetime.strptime(stamp, _DATE).replace(tzinfo=timezone.utc)
    except ValueError:
        raise ApiError("InvalidSignatureException", "X-Amz-Date is missing or not yyyymmddThhmmssZ", 403) from None
    if stamp[:8] != day:
        raise ApiError("InvalidSignatureException", f"the credential's date {day} is not the date of X-Amz-Date", 403)
    if abs(now - signed_at) > MAX_SKEW:
        raise ApiError("InvalidSignatureException",
                       f"Signature expired: {stamp} is more than {int(MAX_SKEW.total_seconds() // 60)} minutes "
                       f"from the server's time {now.strftime(_DATE)}", 403)
    signed = found["signed"].split(";")
    if "host" not in signed or signed != sorted(signed):
        raise ApiError("InvalidSignatureException", "SignedHeaders must be sorted and include host", 403)
    key = key_of(key_id)
    if key is None:
        raise ApiError("UnrecognizedClientException", "The security token included in the request is invalid.", 403)
    scope = f"{day}/{region}/{SERVICE}/aws4_request"
    request = canonical_request(method, path, query, headers, signed, body)
    to_sign = "\n".join([ALGORITHM, stamp, scope, hashlib.sha256(request.encode()).hexdigest()])
    expected = hmac.new(signing_key(key.secret, day, region), to_sign.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, found["signature"]):
        raise ApiError("SignatureDoesNotMatch", "The request signature we calculated does not match the signature "
                       "you provided. Check your AWS Secret Access Key and signing method.", 403)
    return Caller(key, region)
