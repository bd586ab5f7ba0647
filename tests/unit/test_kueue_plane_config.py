"""How the local plane configures Kueue: which webhooks it registers, and where they point."""

from __future__ import annotations

import base64

import pytest
import yaml

from hyperplan_dev import kueue


def _hook(name: str, path: str, rules: list[tuple[list[str], list[str]]]) -> dict:
    return {
        "name": name, "failurePolicy": "Fail", "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": path}},
        "rules": [{"apiGroups": g, "apiVersions": ["v1"], "operations": ["CREATE"], "resources": r}
                  for g, r in rules],
    }


# The shape of Kueue's config/components/webhook/manifests.yaml, reduced to one webhook per case.
MANIFESTS = yaml.safe_dump_all([
    {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
     "metadata": {"name": "mutating-webhook-configuration"},
     "webhooks": [
         _hook("mclusterqueue.kb.io", "/mutate-kueue-x-k8s-io-v1beta2-clusterqueue",
               [(["kueue.x-k8s.io"], ["clusterqueues"])]),
         _hook("mjob.kb.io", "/mutate-batch-v1-job", [(["batch"], ["jobs"])]),
         _hook("mpod.kb.io", "/mutate--v1-pod", [([""], ["pods"])]),
         _hook("mdeployment.kb.io", "/mutate-apps-v1-deployment", [(["apps"], ["deployments"])]),
     ]},
    {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
     "metadata": {"name": "validating-webhook-configuration"},
     "webhooks": [
         _hook("vjob.kb.io", "/validate-batch-v1-job", [(["batch"], ["jobs"])]),
         _hook("vworkload.kb.io", "/validate-kueue-x-k8s-io-v1beta2-workload",
               [(["kueue.x-k8s.io"], ["workloads", "workloads/status"])]),
         _hook("vmixed.kb.io", "/validate-mixed", [(["kueue.x-k8s.io"], ["workloads"]), (["apps"], ["deployments"])]),
         _hook("vjobset.kb.io", "/validate-jobset", [(["jobset.x-k8s.io"], ["jobsets"])]),
     ]},
])


def _kept(frameworks: tuple[str, ...]) -> dict[str, list[str]]:
    configs = kueue.webhook_configurations(MANIFESTS, 9443, b"PEM", frameworks)
    return {c["kind"]: [h["name"] for h in c["webhooks"]] for c in configs}


@pytest.mark.parametrize("frameworks, expected", [
    pytest.param(("batch/job",), {
        "MutatingWebhookConfiguration": ["mclusterqueue.kb.io", "mjob.kb.io"],
        "ValidatingWebhookConfiguration": ["vjob.kb.io", "vworkload.kb.io"],
    }, id="kueue-kinds-and-jobs-only"),
    pytest.param((), {
        "MutatingWebhookConfiguration": ["mclusterqueue.kb.io"],
        "ValidatingWebhookConfiguration": ["vworkload.kb.io"],
    }, id="no-framework-keeps-kueue-kinds"),
])
def test_only_webhooks_of_kueue_kinds_and_enabled_frameworks_are_registered(frameworks, expected) -> None:
    assert _kept(frameworks) == expected


def test_webhooks_point_at_loopback_with_the_plane_ca() -> None:
    configs = kueue.webhook_configurations(MANIFESTS, 40123, b"-----BEGIN CERTIFICATE-----\n")
    job = next(h for c in configs for h in c["webhooks"] if h["name"] == "mjob.kb.io")
    assert job["clientConfig"] == {
        "url": "https://127.0.0.1:40123/mutate-batch-v1-job",
        "caBundle": base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode(),
    }
    assert job["failurePolicy"] == "Fail"  # the rest of the webhook is Kueue's own
    for c in configs:
        assert c["metadata"]["labels"] == {kueue.OWNER_LABEL: kueue.OWNER_VALUE}
        assert c["metadata"]["name"] == kueue.WEBHOOK_CONFIGURATION_NAMES[c["kind"]]


def test_configuration_runs_kueue_on_loopback_without_cert_management(tmp_path) -> None:
    cfg = kueue.configuration(40001, 40002, 40003, tmp_path)
    assert cfg["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 40001, "certDir": str(tmp_path)}
    assert cfg["health"]["healthProbeBindAddress"] == "127.0.0.1:40002"
    assert cfg["metrics"]["bindAddress"] == "127.0.0.1:40003"
    assert cfg["internalCertManagement"] == {"enable": False}
    assert cfg["leaderElection"] == {"leaderElect": False}
    assert cfg["integrations"]["frameworks"] == ["batch/job"]
    assert cfg["featureGates"] == {"VisibilityOnDemand": False}
