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


def one(client, call):
    try:
        return {"ok": plain(getattr(client, call["op"])(**call.get("args", {})))}
    except botocore.exceptions.ClientError as e:
        return {"error": {"code": e.response["Error"]["Code"], "message": e.response["Error"]["Message"],
                          "status": e.response["ResponseMetadata"]["HTTPStatusCode"]}}


def at_once(call):
    """``call["each"]``: one list of calls per client, every client on a thread of its own, all
    started together (a barrier); the answers, a list per client."""
    import threading
    runs = call["each"]
    clients = [boto3.client("sagemaker") for _ in runs]
    answers = [None] * len(runs)
    barrier = threading.Barrier(len(runs))

    def run(i):
        barrier.wait()
        answers[i] = [one(clients[i], c) for c in runs[i]]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(runs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"ok": answers}


def main() -> None:
    calls = json.load(sys.stdin)
    client = boto3.client("sagemaker")
    answers = []
    for call in calls:
        if "each" in call:
            answers.append(at_once(call))
            continue
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
