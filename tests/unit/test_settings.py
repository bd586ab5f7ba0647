"""Who the operator is, from the environment the chart gives its pod; a bad value stops `hyperplan run`
with a message naming the setting."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hyperplan.runtime.context import build_runtime
from hyperplan.settings import Settings

IDENTITY_VARS = ("POD_NAME", "POD_NAMESPACE", "NODE_NAME", "HYPERPLAN_POD_NAME", "HYPERPLAN_POD_NAMESPACE",
                 "HYPERPLAN_NODE_NAME", "HYPERPLAN_OPERATOR_POD_LABELS")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in IDENTITY_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("env, want", [
    ({}, (None, None, None, {"app.kubernetes.io/name": "hyperplan", "app.kubernetes.io/component": "operator"})),
    ({"POD_NAME": "hp-1", "POD_NAMESPACE": "ops", "NODE_NAME": "cp-0",
      "HYPERPLAN_OPERATOR_POD_LABELS": '{"app.kubernetes.io/instance": "hp"}'},
     ("hp-1", "ops", "cp-0", {"app.kubernetes.io/instance": "hp"})),
    ({"HYPERPLAN_POD_NAME": "a", "POD_NAME": "b"}, ("a", None, None, None)),
    ({"HYPERPLAN_OPERATOR_POD_LABELS": "{}"}, (None, None, None, {})),
], ids=["out-of-cluster-defaults", "downward-api-from-the-chart", "prefixed-name-wins", "no-labels-protects-only-itself"])
def test_identity_from_the_environment(monkeypatch, env, want):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = Settings()
    got = (s.pod_name, s.pod_namespace, s.node_name, s.operator_pod_labels)
    assert got[:3] == want[:3]
    if want[3] is not None:
        assert got[3] == want[3]


def test_the_runtime_carries_the_identity_to_the_static_provider(monkeypatch, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"  # a client is built, nothing is called
    kubeconfig.write_text("apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters: [{name: x, cluster: "
                          "{server: 'https://127.0.0.1:1'}}]\nusers: [{name: x, user: {}}]\n"
                          "contexts: [{name: x, context: {cluster: x, user: x}}]\n")
    monkeypatch.setenv("NODE_NAME", "cp-0")
    rt = build_runtime(Settings(kubeconfig=str(kubeconfig)))
    assert rt.me.node_name == "cp-0"
    assert rt.providers["static"].me is rt.me


@pytest.mark.parametrize("policy, lead, want", [
    ("sagemaker", None, 600), ("demo", None, 5), ("demo", "12", 12), ("sagemaker", "0", 0),
], ids=["sagemaker-10-min", "demo-5-s", "override", "zero-signals-at-the-drain"])
def test_the_checkpoint_lead_comes_from_the_profile_unless_set(monkeypatch, tmp_path, policy, lead, want):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters: [{name: x, cluster: "
                          "{server: 'https://127.0.0.1:1'}}]\nusers: [{name: x, user: {}}]\n"
                          "contexts: [{name: x, context: {cluster: x, user: x}}]\n")
    monkeypatch.setenv("HYPERPLAN_POLICY", policy)
    if lead is not None:
        monkeypatch.setenv("HYPERPLAN_CHECKPOINT_LEAD_SECONDS", lead)
    rt = build_runtime(Settings(kubeconfig=str(kubeconfig)))
    assert rt.policy.checkpoint_lead.total_seconds() == want
    assert rt.policy.name == policy


@pytest.mark.parametrize("var, value, named", [
    ("HYPERPLAN_OPERATOR_POD_LABELS", "app=hyperplan", "operator_pod_labels"),
    ("HYPERPLAN_POLICY", "aws", "policy"),
    ("HYPERPLAN_CHECKPOINT_LEAD_SECONDS", "-5", "checkpoint_lead_seconds"),
], ids=["labels-not-json", "unknown-policy", "negative-checkpoint-lead"])
def test_a_bad_setting_stops_run_with_a_message(var, value, named):
    env = {k: v for k, v in os.environ.items() if k not in IDENTITY_VARS}
    env[var] = value
    proc = subprocess.run([sys.executable, "-m", "hyperplan.cli", "run"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: invalid setting:") and named in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr



@pytest.mark.parametrize("lease, renew, retry", [
    ("15", "15", "2"), ("10", "12", "2"), ("15", "10", "10"), ("15", "10", "0"),
], ids=["renew-equals-lease", "renew-after-lease", "retry-equals-renew", "zero-retry"])
def test_lease_timings_that_allow_two_actors_are_refused(monkeypatch, lease: str, renew: str, retry: str) -> None:
    monkeypatch.setenv("HYPERPLAN_LEASE_DURATION_SECONDS", lease)
    monkeypatch.setenv("HYPERPLAN_RENEW_DEADLINE_SECONDS", renew)
    monkeypatch.setenv("HYPERPLAN_RETRY_PERIOD_SECONDS", retry)
    with pytest.raises(ValueError, match="retry_period_seconds < renew_deadline_seconds < lease_duration_seconds"):
        Settings()
