"""The SageMaker API's access control on a real API server: keys are the Secrets that
``hyperplan api-key create`` stores, and RBAC (a SubjectAccessReview) says what a key's identity
may do."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from hyperplan.actuation.kube import api_client
from hyperplan.sagemaker.access import KubeAccess, check_rights
from hyperplan.sagemaker.wire import ApiError
from hyperplan_dev.plane import Plane
from tests.kube import Kubectl


def mint(plane: Plane, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hyperplan.cli", "api-key", "create", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "KUBECONFIG": str(plane.kubeconfig)})


def test_a_minted_key_is_found_and_rbac_decides_its_rights(plane: Plane, kubectl: Kubectl) -> None:
    tag = uuid.uuid4().hex[:5]
    reader, nobody = f"reader-{tag}", f"nobody-{tag}"
    kubectl.apply([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": reader},
         "rules": [{"apiGroups": ["hyperplan.dev"], "resources": ["trainingplans"], "verbs": ["list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": reader},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": reader}]}])
    made = mint(plane, "--user", reader, "--namespace", "default")
    assert made.returncode == 0, made.stderr
    lines = dict(line.split("=", 1) for line in made.stdout.split())
    assert set(lines) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert lines["AWS_ACCESS_KEY_ID"].startswith("AKIA") and len(lines["AWS_ACCESS_KEY_ID"]) == 20
    other = dict(line.split("=", 1) for line in mint(plane, "--user", nobody, "--namespace", "default").stdout.split())

    access = KubeAccess(api_client(str(plane.kubeconfig)), "default")
    access.refresh()
    key = access.key_of(lines["AWS_ACCESS_KEY_ID"])
    assert key is not None and key.user == reader and key.secret == lines["AWS_SECRET_ACCESS_KEY"]
    check_rights(access, key, "ListTrainingPlans")  # RBAC lets it list
    with pytest.raises(ApiError) as raised:
        check_rights(access, key, "DescribeTrainingPlan")  # but not get
    assert raised.value.code == "AccessDeniedException"
    stranger = access.key_of(other["AWS_ACCESS_KEY_ID"])
    with pytest.raises(ApiError):
        check_rights(access, stranger, "ListTrainingPlans")
    assert access.key_of("AKIANOSUCHKEY0000000") is None


@pytest.mark.parametrize("user", ["system:serviceaccount:only-three", "system:serviceaccount:a:b:c"])
def test_a_malformed_service_account_is_refused(plane: Plane, user: str) -> None:
    made = mint(plane, "--user", user)
    assert made.returncode == 2 and "system:serviceaccount:<namespace>:<name>" in made.stderr
