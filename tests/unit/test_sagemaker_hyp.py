"""A smoke test of the HyperPod CLI (`hyp`, sagemaker-hyperpod, unmodified, in a venv of its own
like boto3's) against hyperplan's SageMaker API: `hyp describe cluster` reads the cluster and its
groups, `hyp update cluster` sets a group's count and the node recovery as the caller. (`hyp
list-cluster` and `hyp set-cluster-context` go on to STS and EKS, which hyperplan does not serve:
docs/sagemaker-api.md, "The HyperPod CLI".) The CLI also tries to post telemetry to an AWS host of
its own; where that is unreachable it prints the failure and goes on."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from tests.aws.clients import client_venv
from tests.unit.test_sagemaker_api import (  # noqa: F401 - model_checked: every answer here is checked
    Server, model_checked, one_ultraserver_cluster, signed_in,
)

HYP = "sagemaker-hyperpod==3.12.0"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = one_ultraserver_cluster()
    yield s
    s.close()


def hyp(server: Server, *args: str) -> subprocess.CompletedProcess:
    command = client_venv(HYP) / "bin" / "hyp"
    return subprocess.run([str(command), *args, "--region", "us-west-2"], env=signed_in(server).env(),
                          capture_output=True, text=True, timeout=300)


def test_hyp_describes_the_cluster(server: Server) -> None:
    done = hyp(server, "describe", "cluster", "lab")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "ClusterStatus" in done.stdout and "InService" in done.stdout
    assert '"InstanceGroupName": "trainers"' in done.stdout and "training-plan/ultra" in done.stdout


def test_hyp_updates_the_cluster_as_the_caller(server: Server) -> None:
    server.writes.calls.clear()
    recovery = hyp(server, "update", "cluster", "--cluster-name", "lab", "--node-recovery", "None")
    counts = hyp(server, "update", "cluster", "--cluster-name", "lab", "--instance-groups", json.dumps(
        [{"instance_group_name": "trainers", "instance_count": 4, "execution_role": "arn:aws:iam::111122223333:role/hp"}]))
    assert recovery.returncode == 0 and counts.returncode == 0, (recovery.stdout[-1500:], counts.stdout[-1500:])
    assert server.writes.calls == [("patch_group", "alice", "trainers", {"spec": {"nodeRecovery": "None"}}),
                                   ("patch_group", "alice", "trainers", {"spec": {"instanceCount": 4}})]
