"""Run with the boto3 venv's Python (tests.aws.clients.boto3_calls): calls in as JSON on stdin,
one answer per call out as JSON. The client is boto3's own, unmodified; only its endpoint comes
from AWS_ENDPOINT_URL_SAGEMAKER."""

import datetime
import json
import sys

import boto3
import botocore.exceptions


def plain(value):
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if k != "ResponseMetadata"}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def main() -> None:
    calls = json.load(sys.stdin)
    client = boto3.client("sagemaker")
    answers = []
    for call in calls:
        try:
            if call.get("paginate"):
                pages = client.get_paginator(call["op"]).paginate(**call.get("args", {}))
                answers.append({"ok": [plain(p) for p in pages]})
            else:
                answers.append({"ok": plain(getattr(client, call["op"])(**call.get("args", {})))})
        except botocore.exceptions.ClientError as e:
            answers.append({"error": {"code": e.response["Error"]["Code"], "message": e.response["Error"]["Message"],
                                      "status": e.response["ResponseMetadata"]["HTTPStatusCode"]}})
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ParamValidationError) as e:
            answers.append({"error": {"code": type(e).__name__, "message": str(e), "status": None}})
    json.dump(answers, sys.stdout)


main()
