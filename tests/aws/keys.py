"""Keys and rights for hyperplan's SageMaker API in the tests: a key minted with the CLI as an admin
does, RBAC for its user, and the endpoint of the replica that serves the API. Shared by the e2e and
federation tiers; kept out of any test module, so that importing them registers no scenario."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.aws.clients import Endpoint, boto3_call
from tests.e2e.scenarios import Context
from tests.kube import eventually


def mint_key(ctx: Context, user: str) -> tuple[str, str]:
    """``hyperplan api-key create --user USER``: the two lines it prints, as an AWS client reads them."""
    done = subprocess.run([sys.executable, "-m", "hyperplan.cli", "api-key", "create", "--user", user,
                           "--namespace", "default"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "KUBECONFIG": ctx.kubeconfig})
    assert done.returncode == 0, done.stderr
    lines = dict(line.split("=", 1) for line in done.stdout.split())
    return lines["AWS_ACCESS_KEY_ID"], lines["AWS_SECRET_ACCESS_KEY"]


def grant_plan_reads(ctx: Context, user: str, name: str, *more: dict, reads: bool = True) -> None:
    """A ClusterRole for ``user``: get and list TrainingPlans (without ``reads``: none), and ``more``;
    returned once the API server's authorizer grants every one of them. Its RBAC cache follows a
    watch, and a refusal read before it caught up is what the SageMaker API would then hold for a
    while (sagemaker.access.REFUSAL_SECONDS)."""
    rules = [{"apiGroups": ["hyperplan.dev"], "resources": ["trainingplans"], "verbs": ["get", "list"]}] if reads else []
    ctx.kubectl.apply([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": [*rules, *more]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}])
    for rule in [*rules, *more]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    what = f"{resource}.{group}" if group else resource
                    eventually(lambda: ctx.kubectl.run("auth", "can-i", verb, what, "--as", user,
                                                       check=False).stdout.strip() == "yes",
                               timeout=60, interval=0.5, what=f"{user} may {verb} {what}")


NOT_YET = ("EndpointConnectionError", "ConnectionClosedError",
           # A key minted a moment ago: the replica lists the keys again at most every
           # sagemaker.access.UNKNOWN_KEY_SECONDS (in CI its next call was refused too).
           "UnrecognizedClientException")


def serving(ctx: Context, key_id: str, secret: str) -> Endpoint:
    """The endpoint of the first replica that answers and knows the key (both serve the API: the
    leader's first; while a replica restarts, the other)."""
    def answering() -> Endpoint | None:
        for url in ctx.sagemaker_api_urls:
            endpoint = Endpoint(url, key_id, secret)
            answer = boto3_call(endpoint, "list_training_plans", MaxResults=1)
            if "ok" in answer or answer["error"]["code"] not in NOT_YET:
                return endpoint
        return None
    return eventually(answering, timeout=120, interval=1, what="a replica serving the SageMaker API")
