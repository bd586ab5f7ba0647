"""The Helm chart (charts/hyperplan): lint, render, accepted by the real API server, installed.

There is no kubelet for real containers on the local control plane, so the operator's pod
never runs from the chart here; the tests assert on the objects Helm creates, on what the
chart's ClusterRole lets the service account do (``kubectl auth can-i`` and the operator
itself, run locally with that service account's token), and that ``helm uninstall`` removes
what ``helm install`` created.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from hyperplan.actuation.kube import Kube, api_client
from hyperplan.actuation.pods import reboot_job_body
from hyperplan.actuation.providers.base import REBOOT_REASON, write_over_read
from hyperplan.actuation.providers.factory import providers
from hyperplan.actuation.providers.kwok import KWOK_ANNOTATION, kwok_node_body, kwok_reboot_patches
from hyperplan.planning.lending import OperatorIdentity
from hyperplan.settings import DEFAULT_REBOOT_COMMAND, Settings
from hyperplan.api import vocabulary
from hyperplan.api.models import KUBERNETES_DOMAINS
from hyperplan.planning import naming, placement
from hyperplan_dev.plane import Plane, free_port
from tests.kube import Kubectl, eventually

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "hyperplan"
API = "hyperplan.dev/v1alpha1"


def render(helm, *args: str, namespace: str = "default") -> list[dict[str, Any]]:
    out = helm("template", "hp", str(CHART), "--namespace", namespace, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


USER_ROLES = "user-roles"  # app.kubernetes.io/component of the roles for people (aggregated-roles.yaml)


def component(doc: dict[str, Any]) -> str | None:
    return ((doc.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/component")


def user_roles(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The ClusterRoles for people, by name."""
    return {d["metadata"]["name"]: d for d in docs if component(d) == USER_ROLES}


ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def admission_policies(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The admission policies and their bindings, by kind and name (``Kind/name``)."""
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs if d["kind"] in ADMISSION_KINDS}


NODE_JOBS = "-node-jobs"  # the name suffix of the Role (and binding) for the Jobs of node actions


def node_jobs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The Role and RoleBinding for the Jobs of node actions (the reboot of a static node), by kind."""
    return {d["kind"]: d for d in docs if d["kind"] in ("Role", "RoleBinding")
            and d["metadata"]["name"].endswith(NODE_JOBS)}


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The operator's objects (the roles for people, the admission policies and the node-jobs Role
    left out: :func:`user_roles`, :func:`admission_policies`, :func:`node_jobs`), by kind."""
    docs = [d for d in docs if component(d) != USER_ROLES and d["kind"] not in ADMISSION_KINDS
            and not (d["kind"] in ("Role", "RoleBinding") and d["metadata"]["name"].endswith(NODE_JOBS))]
    kinds = [d["kind"] for d in docs]
    assert len(kinds) == len(set(kinds)), f"one object per kind expected, got {kinds}"
    return {d["kind"]: d for d in docs}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


# --------------------------------------------------------------------------- offline


def test_chart_lints_strictly(helm) -> None:
    proc = helm("lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def test_chart_crds_are_the_generated_ones() -> None:
    """`make crds` copies the generated CRDs into the chart; a stale copy would install old schemas."""
    generated = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert generated == sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    for name in generated:
        assert (CHART / "crds" / name).read_text() == (ROOT / "crds" / name).read_text(), \
            f"charts/hyperplan/crds/{name} is stale; run `make crds`"


def test_default_render_runs_the_operator_locked_down(helm) -> None:
    docs = render(helm, namespace="hyperplan-system")
    objs = by_kind(docs)
    assert set(objs) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "Deployment", "Role",
                         "RoleBinding", "PodDisruptionBudget", "NetworkPolicy"}
    assert sorted(admission_policies(docs)) == [f"{kind}/hp-hyperplan-{name}" for kind in ADMISSION_KINDS
                                                for name in ("owned-nodes", "pod-writes")]
    dep = objs["Deployment"]
    assert dep["metadata"]["namespace"] == "hyperplan-system"
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    c = container(dep)
    assert [*c["command"], *c["args"]] == ["hyperplan", "run"]
    assert c["image"] == "hyperplan:0.1.0"  # appVersion when no tag is set
    env = env_of(c)
    assert env["HYPERPLAN_POLICY"] == "sagemaker"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 8000, "liveness": 8081}
    assert env["HYPERPLAN_METRICS_PORT"] == "8000" and env["HYPERPLAN_LIVENESS_PORT"] == "8081"
    probe = c["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and ports[probe["port"]] == 8081
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    # The pod runs as the chart's service account, which the binding names.
    sa = objs["ServiceAccount"]["metadata"]["name"]
    assert pod["serviceAccountName"] == sa
    assert objs["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": sa, "namespace": "hyperplan-system"}]
    assert objs["ClusterRoleBinding"]["roleRef"]["name"] == objs["ClusterRole"]["metadata"]["name"]
    # The metrics Service selects the operator's pod and says where to scrape.
    svc = objs["Service"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    ann = svc["metadata"]["annotations"]
    assert (ann["prometheus.io/scrape"], ann["prometheus.io/port"], ann["prometheus.io/path"]) == \
        ("true", "8000", "/metrics")


@pytest.mark.parametrize("flags, lease", [
    ((), "hyperplan-leader"),
    (("--set", "leaderElection.leaseName=ops-leader"), "ops-leader"),
], ids=["default-name", "named"])
def test_leases_are_granted_in_the_release_namespace_only(helm, flags, lease) -> None:
    """The leader Lease is the only Lease the operator touches: the namespaced Role grants it by
    name (create cannot be limited by name, so it stands apart), the operator is told that name,
    and the ClusterRole grants no Lease anywhere (node heartbeats are not read)."""
    objs = by_kind(render(helm, *flags, namespace="hyperplan-system"))
    assert _rules_for(objs["ClusterRole"], "coordination.k8s.io") == []
    assert objs["Role"]["metadata"]["namespace"] == "hyperplan-system"
    rules = sorted((tuple(r.get("resourceNames", ())), tuple(sorted(r["verbs"]))) for r in objs["Role"]["rules"])
    assert rules == [((), ("create",)), ((lease,), ("get", "list", "update", "watch"))]
    assert env_of(container(objs["Deployment"]))["HYPERPLAN_LEADER_ELECTION_LEASE_NAME"] == lease


# Every Kubernetes API call of src/hyperplan and of kopf as the operator runs it, as
# (apiGroup, resource, verb, where). The chart's ClusterRole and Role must grant exactly these:
# a call missing here would be refused in a cluster, a grant missing here is a right nobody uses.
OPERATOR_CALLS = [
    # hyperplan's kinds: kopf lists and watches all three (kopf.index, kopf.on.event, the daemons).
    ("hyperplan.dev", "capacitypools", "list", "kopf; ledger.KubeLedger.pools without the cache"),
    ("hyperplan.dev", "capacitypools", "watch", "kopf"),
    ("hyperplan.dev", "capacitypools", "get", "ledger.KubeLedger: the pool read again after a 409"),
    ("hyperplan.dev", "capacitypools/status", "update", "ledger.KubeLedger: replace_status"),
    ("hyperplan.dev", "trainingplans", "list", "kopf"),
    ("hyperplan.dev", "trainingplans", "watch", "kopf"),
    ("hyperplan.dev", "trainingplans", "get", "workqueue.report_failure (a plan's pass failed)"),
    ("hyperplan.dev", "trainingplans", "patch", "Kube.set_finalizers; kopf drops its old finalizer"),
    ("hyperplan.dev", "trainingplans/status", "patch", "Kube.patch_status"),
    ("hyperplan.dev", "instancegroups", "list", "kopf"),
    ("hyperplan.dev", "instancegroups", "watch", "kopf"),
    ("hyperplan.dev", "instancegroups", "get", "workqueue.report_failure (a group's pass failed)"),
    ("hyperplan.dev", "instancegroups", "patch", "Kube.set_finalizers (the group's finalizer); kopf drops its old one"),
    ("hyperplan.dev", "instancegroups/status", "patch", "Kube.patch_status"),
    # Nodes.
    ("", "nodes", "list", "Kube.list_nodes; nodewatch.NodeWatch.list"),
    ("", "nodes", "watch", "nodewatch.NodeWatch (its own stream)"),
    ("", "nodes", "get", "nodes.KwokProvider/StaticProvider: read_node before a label change"),
    ("", "nodes", "create", "nodes.KwokProvider.create"),
    ("", "nodes", "patch", "labels, taints, annotations: marks, promotions, adoption, hand-back"),
    ("", "nodes", "delete", "nodes.KwokProvider.release"),
    ("", "nodes/status", "patch", "nodes.set_node_condition(s_removed): hyperplan.dev/* conditions"),
    # Pods, for drains.
    ("", "pods", "list", "nodes.pods_on_node; the operator's own pods (OperatorIdentity)"),
    ("", "pods", "patch", "nodes.KubeNodePods: the checkpoint annotation"),
    ("", "pods", "delete", "nodes.KubeNodePods: a dead node's pods after their eviction's deadline (marked first)"),
    ("", "pods/status", "patch", "nodes.KubeNodePods: marked Failed (DisruptionTarget) first; the pod policy"),
    ("", "pods/eviction", "create", "nodes.KubeNodePods: the Eviction API"),
    # Events: kopf posts them (kopf.event, kopf.info); it never patches one.
    ("", "events", "create", "kopf.event"),
    # kopf watches the CRDs so that a kind installed later (Kueue's) is served; cluster-wide,
    # it neither lists nor watches namespaces.
    ("apiextensions.k8s.io", "customresourcedefinitions", "list", "kopf's resource observer"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch", "kopf's resource observer"),
    # Kueue (kueue.enabled, the default).
    ("kueue.x-k8s.io", "admissionchecks", "list", "kopf.on.event"),
    ("kueue.x-k8s.io", "admissionchecks", "watch", "kopf.on.event"),
    ("kueue.x-k8s.io", "admissionchecks/status", "patch", "kueue.KubeKueueWrites.apply_check_active"),
    ("kueue.x-k8s.io", "workloads", "list", "kopf.index"),
    ("kueue.x-k8s.io", "workloads", "watch", "kopf.index"),
    ("kueue.x-k8s.io", "workloads/status", "patch", "kueue.KubeKueueWrites.apply_check_entry"),
    # The leader Lease (the Role, in the release's namespace).
    ("coordination.k8s.io", "leases", "get", "leadership.KubeLeaseStore.get"),
    ("coordination.k8s.io", "leases", "create", "leadership.KubeLeaseStore.create"),
    ("coordination.k8s.io", "leases", "update", "leadership.KubeLeaseStore.replace: renew, release"),
    ("coordination.k8s.io", "leases", "list", "leadership.KubeLeaseStore.wait_for_change (metadata.name=)"),
    ("coordination.k8s.io", "leases", "watch", "leadership.KubeLeaseStore.wait_for_change"),
    # Node actions as Jobs (the node-jobs Role, in the release's namespace).
    ("batch", "jobs", "create", "nodes.StaticProvider.reboot: the reboot Job"),
    ("batch", "jobs", "get", "nodes.StaticProvider.reboot: one of that name exists (409)"),
    ("batch", "jobs", "delete", "nodes.StaticProvider.reboot: a finished one before the next reboot"),
    ("batch", "jobs", "list", "deepchecks.KubeDeepCheckJobs.list: a group's check Jobs"),
    ("", "services", "create", "deepchecks.KubeDeepCheckJobs.start: an InstanceConnectivity run's Service"),
]


def _grants(*roles: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for role in roles for rule in role["rules"]
            for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}


def test_rbac_grants_exactly_what_the_operator_calls(helm) -> None:
    objs = by_kind(render(helm, namespace="hyperplan-system"))
    calls = {(group, resource, verb) for group, resource, verb, _ in OPERATOR_CALLS}
    assert len(calls) == len(OPERATOR_CALLS)
    granted = _grants(objs["ClusterRole"], objs["Role"], node_jobs(render(helm, namespace="hyperplan-system"))["Role"])
    assert sorted(granted - calls) == [], "granted but never called"
    assert sorted(calls - granted) == [], "called but not granted"
    assert not any("*" in part for grant in granted for part in grant)


def test_two_replicas_elect_a_leader_and_survive_a_drain(helm) -> None:
    """Two replicas by default: a leader Lease, a PodDisruptionBudget, spread over nodes, and a
    rolling update that starts the new pod before it stops the old one."""
    objs = by_kind(render(helm, namespace="hyperplan-system"))
    dep, pdb = objs["Deployment"], objs["PodDisruptionBudget"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate",
                                       "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (pref,) = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert pref["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert pref["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
    env = env_of(container(dep))
    assert (env["HYPERPLAN_LEADER_ELECTION"], env["HYPERPLAN_LEASE_DURATION_SECONDS"],
            env["HYPERPLAN_RENEW_DEADLINE_SECONDS"], env["HYPERPLAN_RETRY_PERIOD_SECONDS"]) == \
        ("true", "15", "10", "2")
    # One replica: no budget (it would block every drain) and nothing to spread.
    one = by_kind(render(helm, "--set", "replicas=1", "--set", "leaderElection.leaseDurationSeconds=30"))
    assert "PodDisruptionBudget" not in one
    assert "podAntiAffinity" not in one["Deployment"]["spec"]["template"]["spec"]["affinity"]
    assert env_of(container(one["Deployment"]))["HYPERPLAN_LEASE_DURATION_SECONDS"] == "30"


AVOID_LENT = [{"key": "node-restriction.kubernetes.io/hyperplan-pool", "operator": "DoesNotExist"},
              {"key": "hyperplan.dev/instance-group", "operator": "DoesNotExist"}]


def test_operator_stays_off_lent_nodes_and_knows_itself(helm) -> None:
    """The pod never schedules onto the static pool or a group's node (a drain there would evict
    it), and it gets its own name, namespace and node, and the labels of its replicas."""
    dep = by_kind(render(helm, namespace="hyperplan-system"))["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    assert pod["affinity"]["nodeAffinity"] == {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": AVOID_LENT}]}}
    env = {e["name"]: e for e in container(dep)["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # The operator recognises every pod of its Deployment by the labels the chart sets on them.
    pod_labels = json.loads(env["HYPERPLAN_OPERATOR_POD_LABELS"]["value"])
    assert pod_labels == dep["spec"]["selector"]["matchLabels"]
    assert pod_labels.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert pod_labels == {"app.kubernetes.io/name": "hyperplan", "app.kubernetes.io/instance": "hp"}


def test_users_affinity_is_kept_and_narrowed(helm, tmp_path: Path) -> None:
    mine = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["ops-1"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [
                {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}}]},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                              "labelSelector": {"matchLabels": {"app": "x"}}}}]}}
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"affinity": mine}))
    got = by_kind(render(helm, "-f", str(values)))["Deployment"]["spec"]["template"]["spec"]["affinity"]
    terms = got["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    # Terms are ORed: each of the user's terms gets our two requirements, nothing else changes.
    assert terms == [
        {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}, *AVOID_LENT]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["ops-1"]}],
         "matchExpressions": AVOID_LENT}]
    assert got["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == \
        mine["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert got["podAntiAffinity"] == mine["podAntiAffinity"]
    # Only the user's affinity, as given, when they opt out.
    plain = by_kind(render(helm, "-f", str(values), "--set", "avoidLentNodes=false"))["Deployment"]
    assert plain["spec"]["template"]["spec"]["affinity"] == mine
    none = by_kind(render(helm, "--set", "avoidLentNodes=false", "--set", "spreadReplicas=false"))["Deployment"]
    assert "affinity" not in none["spec"]["template"]["spec"]


def test_values_reach_the_operator(helm) -> None:
    objs = by_kind(render(
        helm, "--set", "policy=demo", "--set", "metricsPort=9100", "--set", "livenessPort=9101",
        "--set", "image.repository=registry.example/hyperplan", "--set", "image.tag=dev",
        "--set", "env[0].name=HYPERPLAN_WATCH_SERVER_TIMEOUT", "--set-string", "env[0].value=120",
        "--set", "nodeSelector.kubernetes\\.io/os=linux",
        "--set", "tolerations[0].key=dedicated,tolerations[0].operator=Exists",
        "--set", "serviceMonitor.enabled=true"))
    c = container(objs["Deployment"])
    env = env_of(c)
    assert env["HYPERPLAN_POLICY"] == "demo"
    assert env["HYPERPLAN_METRICS_PORT"] == "9100" and env["HYPERPLAN_LIVENESS_PORT"] == "9101"
    assert env["HYPERPLAN_WATCH_SERVER_TIMEOUT"] == "120"
    assert c["image"] == "registry.example/hyperplan:dev"
    # the reboot Job runs the operator's image unless one is given
    assert env["HYPERPLAN_REBOOT_JOB_IMAGE"] == "registry.example/hyperplan:dev"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 9100, "liveness": 9101}
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert objs["Service"]["metadata"]["annotations"]["prometheus.io/port"] == "9100"
    sm = objs["ServiceMonitor"]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["spec"]["selector"]["matchLabels"].items() <= \
        objs["Service"]["metadata"]["labels"].items()


@pytest.mark.parametrize("flags, image, command, seconds", [
    ((), "hyperplan:0.1.0", list(DEFAULT_REBOOT_COMMAND), 10.0),
    (("--set", "nodeReboot.job.image=registry.example/bmc:1", "--set", "nodeReboot.job.command={bmc,power-cycle}",
      "--set", "nodeReboot.kwokSeconds=3", "--set", "nodeReboot.job.ttlSecondsAfterFinished=60"),
     "registry.example/bmc:1", ["bmc", "power-cycle"], 3.0),
], ids=["kind-default", "admins-action"])
def test_the_reboot_settings_reach_the_providers(helm, monkeypatch, flags, image, command, seconds) -> None:
    """The chart's nodeReboot values, read by the operator as it reads its environment, make the
    providers' reboot: the Job's image and command in the release's namespace, KWOK's time."""
    objs = by_kind(render(helm, *flags, namespace="hyperplan-system"))
    for name, value in env_of(container(objs["Deployment"])).items():
        if value is not None:
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("POD_NAMESPACE", "hyperplan-system")  # the downward API's, in the cluster
    made = providers(Kube(client.ApiClient()), OperatorIdentity(namespace="hyperplan-system"), Settings())
    job = made["static"].reboot_job
    assert (job.image, list(job.command), job.namespace) == (image, command, "hyperplan-system")
    assert made["kwok"].reboot_seconds == seconds
    body = reboot_job_body(job, "worker-1", "u-1")
    assert body["spec"]["template"]["spec"]["containers"][0]["command"] == command
    assert body["spec"]["ttlSecondsAfterFinished"] == (60 if flags else 600)


@pytest.mark.parametrize("flags, hyperpod", [((), True), (("--set", "hyperPodLabels=false"), False)],
                         ids=["on-by-default", "off"])
def test_hyperpod_labels_reach_the_providers(helm, monkeypatch, flags, hyperpod) -> None:
    """The chart's hyperPodLabels, read by the operator as it reads its environment, makes every
    provider's marks write HyperPod's health label and taint (or not)."""
    objs = by_kind(render(helm, *flags))
    for name, value in env_of(container(objs["Deployment"])).items():
        if value is not None:
            monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.hyperpod_labels is hyperpod
    made = providers(Kube(client.ApiClient()), OperatorIdentity(namespace="hyperplan-system"), settings)
    assert {name: p.hyperpod_labels for name, p in made.items()} == dict.fromkeys(("kwok", "static", "karpenter"),
                                                                                  hyperpod)


@pytest.mark.parametrize("flags, image, stress, port", [
    ((), "hyperplan:0.1.0", ["python", "-m", "hyperplan.deepcheck", "InstanceStress"], 7946),
    (("--set", "deepHealthChecks.job.image=registry.example/dcgm:3",
      "--set", "deepHealthChecks.job.commands.InstanceStress={dcgmi,diag,--run,short}", "--set", "deepHealthChecks.job.port=9000"),
     "registry.example/dcgm:3", ["dcgmi", "diag", "--run", "short"], 9000),
], ids=["the-operators-image", "an-admins-check"])
def test_the_deep_health_check_values_reach_the_check_jobs(helm, monkeypatch, flags, image, stress, port) -> None:
    """The chart's deepHealthChecks values, read by the operator as it reads its environment, make
    the check Jobs, in the release's namespace; a command left out keeps its default."""
    from hyperplan.actuation.deepchecks import CheckJobSettings, Target, check_job_body
    from hyperplan.planning.deepchecks import CheckJob
    objs = by_kind(render(helm, *flags, namespace="hyperplan-system"))
    for name, value in env_of(container(objs["Deployment"])).items():
        if value is not None:
            monkeypatch.setenv(name, value)
    made = CheckJobSettings.from_settings(Settings(), "hyperplan-system")
    assert (made.image, list(made.commands["InstanceStress"]), made.port, made.namespace) == (
        image, stress, port, "hyperplan-system")
    assert list(made.commands["InstanceConnectivity"]) == ["python", "-m", "hyperplan.deepcheck", "InstanceConnectivity"]
    body = check_job_body(made, "g", Target(CheckJob("dhc-x-s-1", "x", "InstanceStress"), "worker-1", "u-1"))
    assert body["spec"]["template"]["spec"]["containers"][0]["command"] == stress


DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize("flags, image", [
    ((), "hyperplan:0.1.0"),
    (("--set", "image.repository=registry.example/hyperplan", "--set", "image.tag=dev"),
     "registry.example/hyperplan:dev"),
    (("--set", "image.repository=registry.example/hyperplan", "--set", f"image.digest={DIGEST}"),
     f"registry.example/hyperplan@{DIGEST}"),
    (("--set", "image.tag=dev", "--set", f"image.digest={DIGEST}"), f"hyperplan@{DIGEST}"),
], ids=["app-version", "tag", "digest", "digest-wins-over-tag"])
def test_the_image_is_referenced_by_digest_when_one_is_given(helm, flags: tuple[str, ...], image: str) -> None:
    """A digest pins the pod to the image's content: a re-pushed tag cannot change what runs."""
    assert container(by_kind(render(helm, *flags))["Deployment"])["image"] == image


def _rules_for(role: dict[str, Any], group: str) -> list[tuple[str, tuple[str, ...]]]:
    return sorted((r, tuple(sorted(rule["verbs"]))) for rule in role["rules"] if group in rule["apiGroups"]
                  for r in rule["resources"])


def _policy_expressions(docs: list[dict[str, Any]], name: str) -> dict[str, str]:
    policy = admission_policies(docs)[f"ValidatingAdmissionPolicy/hp-hyperplan-{name}"]["spec"]
    return {**{v["name"]: v["expression"] for v in policy["variables"]},
            **{f"validation-{i}": v["expression"] for i, v in enumerate(policy["validations"])}}


def test_the_node_policy_allows_exactly_the_label_keys_the_operator_sets(helm) -> None:
    """The policy's list of the operator's label keys is the code's: every ``LABEL_*`` of
    api/vocabulary.py but the pool key (which has its own rule), plus the UltraServer topology
    keys (HyperPod's health key among them: hyperplan writes it beside its own, hyperPodLabels). A key the code starts writing without a
    change here would be refused in a cluster; a key here the code no longer writes is a right
    nobody uses."""
    expressions = _policy_expressions(render(helm), "owned-nodes")
    (listed,) = re.findall(r"k in (\[[^\]]*\])", expressions["refusedLabels"])
    listed = json.loads(listed)
    written = {value for name, value in vars(vocabulary).items() if name.startswith("LABEL_")} \
        - {vocabulary.LABEL_POOL}
    written |= {vocabulary.TOPOLOGY_ULTRASERVER_ID, *vocabulary.TOPOLOGY_LAYERS}
    assert len(listed) == len(set(listed)) and set(listed) == written
    assert vocabulary.LABEL_TRUSTED_GROUP in listed
    # The pool key and its two values, the kwok provider's marks, the domains groups may not use.
    assert json.dumps(vocabulary.LABEL_POOL) in expressions["oldInPool"]
    assert f"['{vocabulary.POOL_FREE}', '{vocabulary.POOL_HELD}']" in expressions["oldInPool"]
    assert f"'{KWOK_ANNOTATION}'" in expressions["newIsKwok"] and f"'{vocabulary.LABEL_NODE_ID}'" in expressions["newIsKwok"]
    for domain in KUBERNETES_DOMAINS:
        assert domain.replace(".", "\\\\.") in expressions["refusedLabels"]
    assert f"startsWith('{vocabulary.OWN_PREFIX}')" in expressions["refusedConditions"]
    assert f"'{REBOOT_REASON}'" in expressions["kwokReboot"] and "variables.oldIsKwok" in expressions["kwokReboot"]


def test_the_pod_policy_allows_exactly_the_pod_writes_of_the_code(helm) -> None:
    expressions = _policy_expressions(render(helm), "pod-writes")
    assert f"k != '{vocabulary.ANNOTATION_BLOCK_TERMINATION}'" in expressions["otherAnnotationsKept"]
    assert f"c.reason == '{vocabulary.REASON_DELETED_BY_HYPERPLAN}'" in expressions["marked"]
    assert f"reason == '{vocabulary.REASON_DELETED_BY_HYPERPLAN}'" in expressions["statusMark"]


@pytest.mark.parametrize("flags, shipped", [
    ((), True), (("--set", "nodeAdmissionPolicy.enabled=false"), False),
], ids=["default-on", "off"])
def test_both_admission_policies_follow_the_switch(helm, flags: tuple[str, ...], shipped: bool) -> None:
    policies = admission_policies(render(helm, *flags, namespace="hyperplan-system"))
    assert sorted(policies) == ([f"{kind}/hp-hyperplan-{name}" for kind in ADMISSION_KINDS
                                 for name in ("owned-nodes", "pod-writes")] if shipped else [])
    for name, doc in policies.items():
        spec = doc["spec"]
        if doc["kind"] == "ValidatingAdmissionPolicy":
            assert spec["failurePolicy"] == "Fail"
            assert spec["matchConditions"] == [{
                "name": "only-the-operator",
                "expression": 'request.userInfo.username == "system:serviceaccount:hyperplan-system:hp-hyperplan"'}]
        else:
            assert spec["validationActions"] == ["Deny"] and spec["policyName"] == name.split("/")[1]


KARPENTER_CALLS = [  # karpenter.enabled
    ("karpenter.sh", "nodeclaims", "create", "karpenter.KarpenterProvider.create"),
    ("karpenter.sh", "nodeclaims", "list", "karpenter.KarpenterProvider.list_claims"),
    ("karpenter.sh", "nodeclaims", "get", "karpenter.KarpenterProvider.read_claim: a 409, and before a release"),
    ("karpenter.sh", "nodeclaims", "delete", "karpenter.KarpenterProvider.delete_claim"),
]


@pytest.mark.parametrize("flags, enabled", [
    ((), False), (("--set", "karpenter.enabled=true"), True), (("--set", "karpenter.enabled=false"), False),
], ids=["default-off", "on", "off"])
def test_karpenter_rules_and_settings_follow_karpenter_enabled(helm, flags: tuple[str, ...], enabled: bool) -> None:
    """`karpenter.enabled` grants exactly the NodeClaim calls of actuation.providers.karpenter (no NodePools,
    no patch: Karpenter owns a claim's status and finalizers) and passes the node class, capacity
    type and launch timeout to the operator; off, neither."""
    objs = by_kind(render(helm, *flags, "--set", "karpenter.nodeClass=karpenter.k8s.aws/EC2NodeClass/gpu"))
    granted = {(g, r, v) for g, r, v in _grants(objs["ClusterRole"]) if g == "karpenter.sh"}
    assert granted == ({(g, r, v) for g, r, v, _ in KARPENTER_CALLS} if enabled else set())
    # The node class, read by name only (KarpenterProvider.node_class_problem).
    node_class = [rule for rule in objs["ClusterRole"]["rules"] if rule["apiGroups"] == ["karpenter.k8s.aws"]]
    assert node_class == ([{"apiGroups": ["karpenter.k8s.aws"], "resources": ["ec2nodeclasses"],
                            "resourceNames": ["gpu"], "verbs": ["get"]}] if enabled else [])
    env = env_of(container(objs["Deployment"]))
    assert env.get("HYPERPLAN_KARPENTER_NODE_CLASS") == ("karpenter.k8s.aws/EC2NodeClass/gpu" if enabled else None)
    if enabled:
        assert (env["HYPERPLAN_KARPENTER_CAPACITY_TYPE"], env["HYPERPLAN_KARPENTER_LAUNCH_TIMEOUT_SECONDS"],
                env["HYPERPLAN_KARPENTER_RESERVATION_LABEL"]) == ("reserved", "300", "")
    aws = env_of(container(by_kind(render(
        helm, *flags, "--set", "karpenter.reservationLabel=karpenter.k8s.aws/capacity-reservation-id"))["Deployment"]))
    assert aws.get("HYPERPLAN_KARPENTER_RESERVATION_LABEL") == (
        "karpenter.k8s.aws/capacity-reservation-id" if enabled else None)


@pytest.mark.parametrize("flags, enabled", [
    ((), True), (("--set", "kueue.enabled=true"), True), (("--set", "kueue.enabled=false"), False),
], ids=["default-on", "on", "off"])
def test_kueue_rules_and_watches_follow_kueue_enabled(helm, flags: tuple[str, ...], enabled: bool) -> None:
    """`kueue.enabled` grants the Kueue rules and turns the operator's Kueue watches on; off, neither
    (a watch the operator may not list would hold every handler back). The pod rights stay either
    way: instance groups' drains, checkpoints and failover use them (docs/kueue.md, "RBAC")."""
    objs = by_kind(render(helm, *flags))
    kueue = _rules_for(objs["ClusterRole"], "kueue.x-k8s.io")
    assert kueue == ([("admissionchecks", ("list", "watch")), ("admissionchecks/status", ("patch",)),
                      ("workloads", ("list", "watch")), ("workloads/status", ("patch",))] if enabled else [])
    assert env_of(container(objs["Deployment"]))["HYPERPLAN_KUEUE_ENABLED"] == ("true" if enabled else "false")
    pods = dict(_rules_for(objs["ClusterRole"], ""))
    assert pods["pods/eviction"] == ("create",)
    assert pods["pods"] == ("delete", "list", "patch")
    assert pods["pods/status"] == ("patch",)


@pytest.mark.parametrize("bad", ["policy=aws", "metricsPort=0", "image.pullPolicy=Sometimes", "avoidLentNodes=maybe",
                                 "kueue.enabled=maybe", "image.digest=latest"])
def test_invalid_values_are_rejected_naming_the_field(helm, bad: str) -> None:
    proc = helm("template", "hp", str(CHART), "--set", bad, check=False)
    assert proc.returncode != 0
    assert bad.split("=")[0].split(".")[-1] in proc.stderr, proc.stderr


HYPERPLAN_KINDS = ("trainingplans", "instancegroups", "capacitypools")
READ = ("get", "list", "watch")
WRITE = ("create", "update", "patch", "delete")


@pytest.mark.parametrize("flags, shipped", [
    ((), True), (("--set", "rbac.userRoles=true"), True), (("--set", "rbac.userRoles=false"), False),
], ids=["default-on", "on", "off"])
def test_roles_for_people_aggregate_into_view_edit_and_admin(helm, flags: tuple[str, ...], shipped: bool) -> None:
    """view reads the three kinds; edit and admin write a team's plans and groups but not their
    status nor pools; the capacity admin's role (aggregated into nothing) writes pools and reads
    the rest. The operator's own ClusterRole is unchanged by the switch."""
    docs = render(helm, *flags)
    roles = user_roles(docs)
    assert by_kind(docs)["ClusterRole"]["metadata"]["name"] == "hp-hyperplan"
    if not shipped:
        assert roles == {}
        return
    assert sorted(roles) == ["hp-hyperplan-capacity-admin", "hp-hyperplan-edit", "hp-hyperplan-view"]
    assert {name: role["kind"] for name, role in roles.items()} == dict.fromkeys(roles, "ClusterRole")
    aggregation = {name: sorted(k.rsplit("/", 1)[1] for k, v in role["metadata"]["labels"].items()
                                if k.startswith("rbac.authorization.k8s.io/aggregate-to-") and v == "true")
                   for name, role in roles.items()}
    assert aggregation == {"hp-hyperplan-view": ["aggregate-to-view"],
                           "hp-hyperplan-edit": ["aggregate-to-admin", "aggregate-to-edit"],
                           "hp-hyperplan-capacity-admin": []}
    grants = {name: _grants(role) for name, role in roles.items()}
    assert grants["hp-hyperplan-view"] == {("hyperplan.dev", k, v) for k in HYPERPLAN_KINDS for v in READ}
    assert grants["hp-hyperplan-edit"] == {("hyperplan.dev", k, v) for k in ("trainingplans", "instancegroups")
                                           for v in WRITE}
    assert grants["hp-hyperplan-capacity-admin"] == (
        {("hyperplan.dev", "capacitypools", v) for v in (*READ, *WRITE, "deletecollection")}
        | {("hyperplan.dev", k, v) for k in ("trainingplans", "instancegroups") for v in READ})
    # No role for people writes a status (the operator's output) or anything outside hyperplan.dev.
    assert not any("/" in resource for g in grants.values() for _, resource, _ in g)


def test_a_service_account_not_created_must_be_named(helm) -> None:
    """Without a name the chart would bind its roles to the namespace's `default` account, which
    every pod of the namespace runs as: it refuses instead, saying what to set."""
    proc = helm("template", "hp", str(CHART), "--set", "serviceAccount.create=false", check=False)
    assert proc.returncode != 0
    assert "serviceAccount.name is required with serviceAccount.create=false" in proc.stderr, proc.stderr


def test_readiness_is_the_liveness_endpoint_for_both_roles(helm) -> None:
    c = container(by_kind(render(helm))["Deployment"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    probe = c["readinessProbe"]
    assert probe["httpGet"]["path"] == "/healthz" and ports[probe["httpGet"]["port"]] == 8081
    assert probe["periodSeconds"] == 5


def _namespace(name: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}}}


PROMETHEUS_PODS = {"podSelector": {"matchLabels": {"app": "prometheus"}}}
PROMETHEUS_ANYWHERE = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
NO_DEFAULT_METRICS_PEER = ("--set", "networkPolicy.metrics.from=null")


@pytest.mark.parametrize("flags, ingress", [
    ((), [{"from": [PROMETHEUS_ANYWHERE], "ports": [{"port": "metrics", "protocol": "TCP"}]}]),
    (NO_DEFAULT_METRICS_PEER, []),
    ((*NO_DEFAULT_METRICS_PEER, "--set", "networkPolicy.metrics.namespaces={monitoring}"),
     [{"from": [_namespace("monitoring")], "ports": [{"port": "metrics", "protocol": "TCP"}]}]),
    (("--set", "networkPolicy.metrics.namespaces={monitoring,sre}",
      "--set", "networkPolicy.metrics.from[0].podSelector.matchLabels.app=prometheus",
      "--set", "networkPolicy.liveness.namespaces={probes}"),
     [{"from": [_namespace("monitoring"), _namespace("sre"), PROMETHEUS_PODS],
       "ports": [{"port": "metrics", "protocol": "TCP"}]},
      {"from": [_namespace("probes")], "ports": [{"port": "liveness", "protocol": "TCP"}]}]),
    ((*NO_DEFAULT_METRICS_PEER, "--set", "networkPolicy.sagemakerApi.namespaces={buyers}"), []),
    ((*NO_DEFAULT_METRICS_PEER, "--set", "sagemakerApi.enabled=true", "--set", "sagemakerApi.tlsSecret=api-tls",
      "--set", "networkPolicy.sagemakerApi.namespaces={buyers}"),
     [{"from": [_namespace("buyers")], "ports": [{"port": "sagemaker-api", "protocol": "TCP"}]}]),
    ((*NO_DEFAULT_METRICS_PEER, "--set", "sagemakerApi.enabled=true", "--set", "sagemakerApi.tlsSecret=api-tls"),
     []),
], ids=["defaults-prometheus-pods-to-metrics", "nobody", "metrics-from-a-namespace", "both-ports-from-namespaces-and-pods",
        "sagemaker-api-peers-without-the-api", "sagemaker-api-from-a-namespace", "sagemaker-api-from-nobody"])
def test_network_policy_lets_in_only_the_chosen_peers(helm, flags, ingress) -> None:
    """On by default: the liveness port to no pod (the kubelet's probes come from the node), the
    metrics port to Prometheus's pods, the SageMaker API's to the peers listed for it."""
    # (with the SageMaker API there are two Services, two Roles, ...: pick by kind, not by_kind)
    objs = {d["kind"]: d for d in render(helm, *flags, namespace="hyperplan-system")}
    policy = objs["NetworkPolicy"]
    assert policy["metadata"]["namespace"] == "hyperplan-system"
    labels = objs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == ingress
    assert "NetworkPolicy" not in by_kind(render(helm, "--set", "networkPolicy.enabled=false"))  # it can be turned off


def test_service_account_can_be_brought_by_the_user(helm) -> None:
    objs = by_kind(render(helm, "--set", "serviceAccount.create=false",
                          "--set", "serviceAccount.name=ops"))
    assert "ServiceAccount" not in objs
    assert objs["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"] == "ops"
    assert objs["ClusterRoleBinding"]["subjects"][0]["name"] == "ops"


# --------------------------------------------------------------------------- against the API server


@pytest.mark.parametrize("flags", [
    (), ("--set", "networkPolicy.metrics.namespaces={monitoring}",
         "--set", "networkPolicy.liveness.from[0].podSelector.matchLabels.app=probe"),
    ("--set", "networkPolicy.enabled=false"),
], ids=["defaults", "with-network-policy-peers", "without-network-policy"])
def test_rendered_manifests_pass_server_side_dry_run(helm, crds: Kubectl, flags) -> None:
    manifests = helm("template", "hp-dry", str(CHART), "--namespace", "default", *flags).stdout
    proc = crds.run("apply", "--dry-run=server", "-f", "-", input=manifests)
    lines = proc.stdout.splitlines()
    rendered = [d for d in yaml.safe_load_all(manifests) if d]
    assert len(lines) == len(rendered) and all(l.endswith("(server dry run)") for l in lines), proc.stdout
    assert crds.get_or_none("deployment", "hp-dry-hyperplan") is None  # nothing was persisted


@pytest.fixture(scope="module")
def release(helm, plane: Plane, crds: Kubectl):
    """The chart installed into a fresh namespace that enforces the `restricted` Pod Security level."""
    ns, name = f"hp-helm-{uuid.uuid4().hex[:6]}", "hyperplan"
    crds.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": ns, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    kc = f"--kubeconfig={plane.kubeconfig}"
    # The pod must not land on a KWOK node (it would be marked Running without running).
    out = helm("install", name, str(CHART), kc, "--namespace", ns, "--set", "policy=demo",
               "--set", "nodeSelector.hyperplan\\.dev/helm-test=nowhere").stdout
    yield {"namespace": ns, "name": name, "fullname": "hyperplan", "install_output": out,
           "kubeconfig": kc}
    helm("uninstall", name, kc, "--namespace", ns, check=False)
    crds.run("delete", "namespace", ns, "--ignore-not-found", "--wait=false")


def test_helm_install_creates_the_operator_objects(helm, release, crds: Kubectl) -> None:
    ns, full = release["namespace"], release["fullname"]
    assert "STATUS: deployed" in release["install_output"]
    assert "kubectl -n " + ns in release["install_output"]  # NOTES.txt rendered
    status = json.loads(helm("status", release["name"], release["kubeconfig"], "-n", ns,
                             "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"

    dep = crds.get("deployment", full, "-n", ns)
    assert env_of(container(dep))["HYPERPLAN_POLICY"] == "demo"
    sa = crds.get("serviceaccount", full, "-n", ns)
    assert sa["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    svc = crds.get("service", f"{full}-metrics", "-n", ns)
    assert svc["spec"]["ports"][0]["port"] == 8000
    role = crds.get("clusterrole", full)
    binding = crds.get("clusterrolebinding", full)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": full, "namespace": ns}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]

    # The Deployment's pod is admitted under the `restricted` Pod Security level, runs as the
    # chart's service account, and waits for a node that matches its selector.
    def pod() -> dict | None:
        items = crds.get("pods", None, "-n", ns,
                         f"-l=app.kubernetes.io/instance={release['name']}")["items"]
        return items[0] if items else None

    created = eventually(pod, timeout=60, what="the operator pod created by the ReplicaSet")
    assert created["spec"]["serviceAccountName"] == full
    assert created["spec"]["nodeSelector"] == {"hyperplan.dev/helm-test": "nowhere"}
    required = created["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"] == [{"matchExpressions": AVOID_LENT}]
    events = crds.get("events", None, "-n", ns, "--field-selector=reason=FailedCreate")["items"]
    assert events == [], [e["message"] for e in events]


CAN = [
    ("create", "nodes"), ("delete", "nodes"), ("patch", "nodes"), ("watch", "nodes"),
    ("patch", "nodes", "status"),
    ("watch", "trainingplans.hyperplan.dev"), ("patch", "trainingplans.hyperplan.dev"),
    ("patch", "trainingplans.hyperplan.dev", "status"),
    ("update", "capacitypools.hyperplan.dev", "status"),
    ("patch", "instancegroups.hyperplan.dev", "status"),
    ("list", "pods"), ("create", "pods", "eviction"), ("patch", "pods"),  # the checkpoint annotation
    # The pods of a dead failed node after their eviction's deadline: marked Failed, then deleted.
    ("patch", "pods", "status"), ("delete", "pods"),
    ("create", "events"),
    ("list", "customresourcedefinitions.apiextensions.k8s.io"),
    ("watch", "workloads.kueue.x-k8s.io"), ("patch", "workloads.kueue.x-k8s.io", "status"),
    ("watch", "admissionchecks.kueue.x-k8s.io"), ("patch", "admissionchecks.kueue.x-k8s.io", "status"),
]
CANNOT = [
    ("update", "pods"),  # pods are only annotated (a patch), never rewritten
    ("get", "secrets"),
    ("create", "trainingplans.hyperplan.dev"),  # users buy plans, the operator does not
    ("delete", "capacitypools.hyperplan.dev"),
    ("patch", "workloads.kueue.x-k8s.io"),  # only the status of Kueue's objects
    ("create", "admissionchecks.kueue.x-k8s.io"),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("create", "leases.coordination.k8s.io"),  # the leader Lease lives in the release's namespace only
    # Granted once, never called (the code and kopf were read for each):
    ("update", "nodes"), ("update", "trainingplans.hyperplan.dev"), ("update", "instancegroups.hyperplan.dev"),
    ("update", "instancegroups.hyperplan.dev", "finalizers"), ("get", "pods"), ("watch", "pods"),
    ("patch", "events"), ("create", "events.events.k8s.io"), ("watch", "namespaces"),
    ("get", "customresourcedefinitions.apiextensions.k8s.io"),
]


def can_i(kubectl: Kubectl, user: str, verb: str, resource: str, sub: str | None = None,
          *flags: str) -> bool:
    args = ["auth", "can-i", verb, resource, f"--as={user}", *flags]
    if sub:
        args.append(f"--subresource={sub}")
    proc = kubectl.run(*args, check=False)
    assert proc.stdout.strip() in ("yes", "no"), proc.stdout + proc.stderr
    return proc.stdout.strip() == "yes"


def test_cluster_role_grants_what_the_operator_needs_and_no_more(release, crds: Kubectl) -> None:
    user = f"system:serviceaccount:{release['namespace']}:{release['fullname']}"
    denied = [" ".join(a) for a in CAN if not can_i(crds, user, *a)]
    assert denied == [], f"{user} lacks: {denied}"
    allowed = [" ".join(a) for a in CANNOT if can_i(crds, user, *a)]
    assert allowed == [], f"{user} may also: {allowed}"
    # Leader election: the Lease in the release's namespace, written with optimistic concurrency.
    ns = release["namespace"]
    for verb in ("get", "list", "watch", "update"):  # that Lease, by name, and no other
        assert can_i(crds, user, verb, "leases.coordination.k8s.io/hyperplan-leader", None, "-n", ns), verb
        assert not can_i(crds, user, verb, "leases.coordination.k8s.io/another", None, "-n", ns), verb
    assert can_i(crds, user, "create", "leases.coordination.k8s.io", None, "-n", ns)
    assert not can_i(crds, user, "delete", "leases.coordination.k8s.io/hyperplan-leader", None, "-n", ns)
    # Reboot and deep health check Jobs, and the checks' Services: in the release's namespace only.
    for verb in ("create", "get", "list", "delete"):
        assert can_i(crds, user, verb, "jobs.batch", None, "-n", ns), verb
        assert not can_i(crds, user, verb, "jobs.batch", None, "-n", "default"), verb
    assert not can_i(crds, user, "watch", "jobs.batch", None, "-n", ns)
    assert can_i(crds, user, "create", "services", None, "-n", ns)
    assert not can_i(crds, user, "create", "services", None, "-n", "default")
    for verb in ("get", "delete", "patch"):
        assert not can_i(crds, user, verb, "services", None, "-n", ns), verb
    # No Lease elsewhere: node heartbeats in kube-node-lease are not read.
    for verb in ("get", "list", "watch"):
        assert not can_i(crds, user, verb, "leases.coordination.k8s.io", None, "-n", "kube-node-lease"), verb
    # The grants come from the chart's binding, not from something every account has.
    other = f"system:serviceaccount:{release['namespace']}:default"
    assert not can_i(crds, other, "create", "nodes")


def service_account_kubeconfig(release, plane: Plane, crds: Kubectl, tmp_path: Path) -> Path:
    """A kubeconfig that acts as the chart's ServiceAccount (a short-lived token)."""
    ns, sa = release["namespace"], release["fullname"]
    token = crds.run("create", "token", sa, "-n", ns, "--duration=10m").stdout.strip()
    admin = yaml.safe_load(plane.kubeconfig.read_text())
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": admin["clusters"],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": admin["clusters"][0]["name"], "user": "sa"}}],
    }))
    as_sa = Kubectl(kubeconfig)
    assert as_sa.run("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").stdout == \
        f"system:serviceaccount:{ns}:{sa}"
    return kubeconfig


@pytest.fixture(scope="module")
def as_operator(release, plane: Plane, crds: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    """kubectl as the chart's ServiceAccount, once the API server enforces the chart's policies
    (they take effect once compiled: wait for the first refusal)."""
    as_sa = Kubectl(service_account_kubeconfig(release, plane, crds, tmp_path_factory.mktemp("sa")))
    probe = f"vap-probe-{uuid.uuid4().hex[:5]}"
    crds.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": probe, "labels": {"team": "infra"}}})
    attempts = itertools.count()
    try:
        # A new value each time: kubectl sends nothing when the label already has the value asked for.
        eventually(lambda: as_sa.run("label", "node", probe, f"hijacked={next(attempts)}", "--overwrite",
                                     check=False).returncode != 0,
                   timeout=60, what="the node policy to refuse a foreign node")
    finally:
        crds.delete("node", probe, "--wait=false")
    return as_sa


POOL = "node-restriction.kubernetes.io/hyperplan-pool"
TRUSTED_GROUP = "node-restriction.kubernetes.io/hyperplan-instance-group"
KWOK = {"kwok.x-k8s.io/node": "fake"}


def _node_meta(kind: str, name: str) -> dict[str, Any]:
    """The metadata of a node of each kind the policy tells apart."""
    return {
        # what the kwok provider creates (actuation/nodes.py kwok_node_body)
        "kwok": {"annotations": KWOK, "labels": {"hyperplan.dev/node-id": name, "hyperplan.dev/instance-group": "g",
                                                 TRUSTED_GROUP: "g", vocabulary.LABEL_TRUSTED_KWOK: "true"}},
        # the kwok provider's marks that a kubelet can write on its own Node, without the key it cannot
        "kwok-forged": {"annotations": KWOK, "labels": {"hyperplan.dev/node-id": name,
                                                        "hyperplan.dev/instance-group": "g"}},
        # an admin's node in the static pool (a real one: not made by the kwok provider)
        "free": {"labels": {POOL: "free", "node-role.kubernetes.io/worker": "", "team": "infra"}},
        "held": {"labels": {POOL: "held", "hyperplan.dev/node-id": "hp-g-x-0", "hyperplan.dev/instance-group": "g",
                            TRUSTED_GROUP: "g"}},
        "foreign": {"labels": {"team": "infra"}},
        # what a kubelet can write on its own Node: the old pool key, or hyperplan.dev/ keys naming a group
        "old-pool-key": {"labels": {"hyperplan.dev/pool": "free"}},
        "forged": {"labels": {"hyperplan.dev/node-id": name, "hyperplan.dev/instance-group": "g"}},
        # a node both made by the kwok provider and in the static pool: the pool's rule decides
        "kwok-in-pool": {"annotations": KWOK, "labels": {"hyperplan.dev/node-id": name, POOL: "held",
                                                         vocabulary.LABEL_TRUSTED_KWOK: "true"}},
    }[kind]


def _node(kind: str, name: str, **extra_labels: str) -> dict[str, Any]:
    """A node of ``kind``; ``kwok-cordoned``: a kwok node that the node lifecycle controller has
    tainted node.kubernetes.io/unschedulable (with the timeAdded it stamps)."""
    meta = _node_meta("kwok" if kind == "kwok-cordoned" else kind, name)
    meta = {**meta, "name": name, "labels": {**meta["labels"], **extra_labels}}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": meta}
    if kind == "kwok-cordoned":
        node["spec"] = {"unschedulable": True, "taints": [
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "timeAdded": "2026-12-01T00:00:00Z"}]}
    return node


def _status(*conditions: dict[str, str]) -> dict[str, Any]:
    return {"status": {"conditions": list(conditions)}}


def as_kubectl_would(call) -> subprocess.CompletedProcess:
    """A call of the API client, answered as kubectl answers: its exit code and the server's
    message. The ServiceAccount may not ``get`` pods or a status, which kubectl reads before it
    patches one, so those writes go through the client."""
    try:
        call()
    except ApiException as e:
        return subprocess.CompletedProcess([], 1, "", json.loads(e.body).get("message", e.body))
    return subprocess.CompletedProcess([], 0, "", "")


def core_api(kubectl: Kubectl) -> client.CoreV1Api:
    return client.CoreV1Api(api_client(str(kubectl.kubeconfig)))


OWN_CONDITION = {"type": "hyperplan.dev/BlockTerminating", "status": "True", "reason": "BlockEnding", "message": "m"}
# What KwokProvider.reboot writes (nodes.kwok_reboot_patches).
REBOOTING = kwok_reboot_patches("", datetime(2026, 12, 2, tzinfo=timezone.utc), 10)[1]["status"]["conditions"][0]
CREATE_ONLY = "hyperplan may only create the nodes its kwok provider makes"
NEITHER = "hyperplan may only change nodes its kwok provider made or nodes in its static pool"
LABELS = "hyperplan may not set or remove these labels on node {node}: "
DELETE_ONLY = "hyperplan may only delete nodes its kwok provider made; node {node} is not one"
NEVER_POOL = "hyperplan never deletes a node of its static pool"

# (node kind made by the admin first, or None; what the ServiceAccount does; a part of the refusal,
# or None when it is allowed). {node} is the node's name.
NODE_CASES = [
    # CREATE
    (None, ("create", _node("forged", "{node}")), CREATE_ONLY),
    (None, ("create", {**_node("kwok", "{node}"), "metadata": {**_node("kwok", "{node}")["metadata"],
                                                               "labels": {"hyperplan.dev/node-id": "another"}}}),
     CREATE_ONLY),
    (None, ("create", _node("kwok", "{node}", **{"node-role.kubernetes.io/control-plane": ""})),
     LABELS + "node-role.kubernetes.io/control-plane"),
    (None, ("create", _node("kwok", "{node}", **{POOL: "free"})), LABELS + POOL),
    (None, ("create", _node("kwok", "{node}", **{"hyperplan.dev/pool": "free"})), LABELS + "hyperplan.dev/pool"),
    (None, ("create", _node("kwok", "{node}", team="frontier")), None),
    (None, ("create", kwok_node_body(placement.NodeSpec(
        "{node}", {vocabulary.LABEL_INSTANCE_TYPE: "ml.p6e-gb200.36xlarge", vocabulary.LABEL_ZONE: "us-east-1a",
                   vocabulary.LABEL_HOSTNAME: "{node}", vocabulary.LABEL_GROUP: "g", vocabulary.LABEL_PLAN: "p",
                   vocabulary.LABEL_RESERVED_CAPACITY: "rc-1", vocabulary.LABEL_ROLE: "spare",
                   vocabulary.LABEL_SLOT: "0-1", vocabulary.LABEL_GENERATION: "0",
                   vocabulary.TOPOLOGY_ULTRASERVER_ID: "us-1", **dict.fromkeys(vocabulary.TOPOLOGY_LAYERS, "nn-1"),
                   "team": "frontier"},
        (naming.SPARE_TAINT, naming.Taint("example.com/dedicated", "frontier", "NoExecute")), "spare", "us-1",
        "ml.p6e-gb200.36xlarge", "us-east-1a"))), None),
    # UPDATE: whose node
    ("foreign", ("label", "node", "{node}", "hijacked=true"), NEITHER),
    ("kwok-forged", ("label", "node", "{node}", "hyperplan.dev/role=spare"), NEITHER),
    ("old-pool-key", ("label", "node", "{node}", "hyperplan.dev/pool=held", "--overwrite"), NEITHER),
    ("forged", ("label", "node", "{node}", "hyperplan.dev/role=spare"), NEITHER),
    # UPDATE: which keys
    ("kwok", ("label", "node", "{node}", "node-role.kubernetes.io/control-plane="),
     LABELS + "node-role.kubernetes.io/control-plane"),
    ("kwok", ("label", "node", "{node}", "node-restriction.kubernetes.io/tier=gold"),
     LABELS + "node-restriction.kubernetes.io/tier"),
    ("kwok", ("label", "node", "{node}", "hyperplan.dev/anything=x"), LABELS + "hyperplan.dev/anything"),
    ("kwok", ("label", "node", "{node}", f"{POOL}=free"), LABELS + POOL),
    ("free", ("label", "node", "{node}", "node-role.kubernetes.io/worker-"), LABELS + "node-role.kubernetes.io/worker"),
    ("free", ("label", "node", "{node}", f"{POOL}-"), LABELS + POOL),
    ("free", ("label", "node", "{node}", f"{POOL}=mine", "--overwrite"), LABELS + POOL),
    ("kwok", ("taint", "node", "{node}", "node-role.kubernetes.io/control-plane=:NoSchedule"),
     "taints in a domain that belongs to Kubernetes on node {node}: node-role.kubernetes.io/control-plane"),
    ("kwok", ("annotate", "node", "{node}", "example.com/owner=me"),
     "hyperplan may only write hyperplan.dev/* annotations on node {node}: example.com/owner"),
    ("kwok", ("status", _status({"type": "Ready", "status": "False", "reason": "Forged", "message": "m"})),
     "hyperplan may only write its own hyperplan.dev/* conditions in the status of node {node}: Ready"),
    ("held", ("status", _status(REBOOTING)),
     "hyperplan may only write its own hyperplan.dev/* conditions in the status of node {node}: Ready"),
    ("kwok", ("status", {"status": {"allocatable": {"nvidia.com/gpu": "64"}}}),
     "not its capacity, allocatable or addresses"),
    # UPDATE: what the operator does
    ("kwok", ("label", "node", "{node}", "hyperplan.dev/role=spare", "team=frontier"), None),
    ("kwok", ("taint", "node", "{node}", "hyperplan.dev/spare=true:NoSchedule"), None),
    ("kwok", ("annotate", "node", "{node}", "hyperplan.dev/cordoned=true"), None),
    ("kwok", ("cordon", "{node}"), None),
    ("kwok", ("status", _status(OWN_CONDITION)), None),
    ("kwok", ("status", _status(REBOOTING)), None),
    # the whole taint list written back, the lifecycle controller's taint without its timeAdded
    ("kwok-cordoned", ("taints-back", [{"key": "hyperplan.dev/spare", "value": "true", "effect": "NoSchedule"}]), None),
    ("kwok-cordoned", ("taints", [{"key": "hyperplan.dev/spare", "value": "true", "effect": "NoSchedule"}]),
     "taints in a domain that belongs to Kubernetes on node {node}: node.kubernetes.io/unschedulable"),
    ("free", ("label", "node", "{node}", f"{POOL}=held", "hyperplan.dev/node-id=hp-g-x-0",
              "hyperplan.dev/instance-group=g", f"{TRUSTED_GROUP}=g", "team=frontier", "--overwrite"), None),
    ("held", ("label", "node", "{node}", f"{POOL}=free", "hyperplan.dev/node-id-", "hyperplan.dev/instance-group-",
              f"{TRUSTED_GROUP}-", "--overwrite"), None),
    # DELETE
    ("foreign", ("delete", "node", "{node}", "--wait=false"), DELETE_ONLY),
    ("kwok-forged", ("delete", "node", "{node}", "--wait=false"), DELETE_ONLY),
    ("forged", ("delete", "node", "{node}", "--wait=false"), DELETE_ONLY),
    ("free", ("delete", "node", "{node}", "--wait=false"), DELETE_ONLY),
    ("held", ("delete", "node", "{node}", "--wait=false"), DELETE_ONLY),
    ("kwok-in-pool", ("delete", "node", "{node}", "--wait=false"), NEVER_POOL),
    ("kwok", ("delete", "node", "{node}", "--wait=false"), None),
]
NODE_CASE_IDS = [
    "create-forged-without-kwok-annotation", "create-node-id-not-the-name", "create-with-node-role",
    "create-with-pool-key", "create-with-unknown-hyperplan-key", "create-kwok-node", "create-the-kwok-providers-body",
    "update-foreign-node", "update-node-with-kwoks-marks-but-not-the-kubelet-proof-key",
    "update-node-with-only-the-old-pool-key", "update-node-with-forged-node-id",
    "update-add-node-role", "update-add-node-restriction-key", "update-add-unknown-hyperplan-key",
    "update-pool-key-on-kwok-node", "update-remove-admins-node-role", "update-remove-pool-key",
    "update-pool-key-to-another-value", "update-taint-node-role", "update-foreign-annotation",
    "status-foreign-condition", "status-rebooting-static-node", "status-allocatable",
    "update-own-labels", "update-own-taint", "update-own-annotation", "update-cordon", "status-own-condition",
    "status-rebooting-kwok-node",
    "taints-written-back-without-time-added", "taints-written-back-without-the-controllers",
    "adopt-free-node", "hand-back-held-node",
    "delete-foreign-node", "delete-node-with-kwoks-marks-but-not-the-kubelet-proof-key", "delete-forged-node", "delete-free-static-node", "delete-held-static-node",
    "delete-kwok-node-in-static-pool", "delete-kwok-node",
]


def _filled(value: Any, name: str) -> Any:
    return json.loads(json.dumps(value).replace("{node}", name)) if not isinstance(value, str) else \
        value.replace("{node}", name)


@pytest.mark.parametrize("kind, action, refusal", NODE_CASES, ids=NODE_CASE_IDS)
def test_service_account_may_change_only_nodes_hyperplan_owns(as_operator: Kubectl, crds: Kubectl, kind, action,
                                                              refusal) -> None:
    """The chart's node policy, acted out with the ServiceAccount's own token: RBAC lets it write
    every node; the policy lets through exactly what the operator does to the nodes it owns."""
    name = f"vap-{kind or 'new'}-{uuid.uuid4().hex[:6]}"
    if kind:
        crds.create(_node(kind, name))
    try:
        verb, *args = action
        if verb == "create":
            proc = as_operator.create(_filled(args[0], name), check=False)
        elif verb == "status":
            proc = as_kubectl_would(lambda: core_api(as_operator).patch_node_status(name, args[0]))
        elif verb in ("taints-back", "taints"):
            # As the operator writes a taint list (write_over_read): built from the node as read and
            # sent over its resourceVersion, so a taint the node lifecycle controller adds or removes
            # meanwhile is a conflict and a new read, never part of what the policy judges.
            # "taints-back": every taint kept, ours added; "taints": the kubelet-domain
            # node.kubernetes.io/unschedulable left out, which the policy refuses.
            dropped = () if verb == "taints-back" else ("node.kubernetes.io/unschedulable",)

            def written(node: client.V1Node) -> dict:
                kept = [{k: v for k, v in (("key", t.key), ("value", t.value), ("effect", t.effect)) if v}
                        for t in node.spec.taints or [] if t.key not in dropped]
                return {"spec": {"taints": kept + args[0]}}
            proc = as_kubectl_would(lambda: write_over_read(Kube(api_client(str(as_operator.kubeconfig))), name,
                                                            written))
        else:
            proc = as_operator.run(verb, *(_filled(a, name) for a in args), check=False)
        if refusal is None:
            assert proc.returncode == 0, proc.stderr
        else:
            assert proc.returncode != 0, f"allowed: {proc.stdout}"
            assert _filled(refusal, name) in proc.stderr, proc.stderr
            if kind:  # nothing changed
                after = crds.get("node", name)
                assert after["metadata"].get("labels") == _node(kind, name)["metadata"]["labels"]
    finally:
        crds.run("delete", "node", name, "--wait=false", "--ignore-not-found")


CREATED_BY = vocabulary.ANNOTATION_CREATED_BY
NOT_THE_CREATOR = "hyperplan.dev/created-by may name only the user who creates the plan"
NEVER_CHANGES = "hyperplan.dev/created-by never changes once a plan is made"


@pytest.fixture(scope="module")
def plan_creator_policy(helm, crds: Kubectl):
    """The chart's plan-creator policy (with the SageMaker API on) on the plane, enforced (wait for
    the first refusal); removed afterwards."""
    docs = [d for d in render(helm, *SAGEMAKER_API)
            if d["kind"] in ADMISSION_KINDS and d["metadata"]["name"].endswith("-plan-creator")]
    assert len(docs) == 2, docs
    rights = [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "vap-alice"},
               "rules": [{"apiGroups": ["hyperplan.dev"], "resources": ["trainingplans"], "verbs": ["create"]}]},
              {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "vap-alice"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "vap-alice"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}]
    crds.apply(rights + docs)
    probe = _plan(f"vap-probe-{uuid.uuid4().hex[:5]}", "someone-else")
    eventually(lambda: NOT_THE_CREATOR in crds.run("create", "--dry-run=server", "--as=alice", "-f", "-",
                                                   input=json.dumps(probe), check=False).stderr,
               timeout=60, what="the plan-creator policy to refuse")
    yield
    for d in docs + rights:
        crds.run("delete", d["kind"].lower(), d["metadata"]["name"], "--ignore-not-found")


def _plan(name: str, created_by: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if created_by is not None:
        meta["annotations"] = {CREATED_BY: created_by}
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "TrainingPlan", "metadata": meta,
            "spec": {"instanceType": "ml.p5.48xlarge", "instanceCount": 1, "targetResource": "hyperpod-cluster",
                     "duration": "1h", "startTimeAfter": "2030-01-01T00:00:00Z"}}


@pytest.mark.parametrize("created_by, refusal", [
    ("alice", None), (None, None), ("bob", NOT_THE_CREATOR), ("", None),
], ids=["its-own-name", "none", "another-users-name", "empty"])
def test_a_plan_names_only_its_creator_as_created_by(plan_creator_policy, crds: Kubectl, created_by, refusal) -> None:
    """The annotation the SageMaker API's tenancy reads is the API server's word: a user may make
    a plan that names itself (what the API does, as the key's user) or no one, never another user."""
    body = _plan(f"vap-plan-{uuid.uuid4().hex[:6]}", created_by)
    proc = crds.run("create", "--dry-run=server", "--as=alice", "-f", "-", input=json.dumps(body), check=False)
    if refusal is None:
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode != 0 and refusal in proc.stderr, proc.stderr


@pytest.mark.parametrize("patch, refusal", [
    ({CREATED_BY: "mallory"}, NEVER_CHANGES), ({CREATED_BY: None}, NEVER_CHANGES),
    ({"example.com/note": "kept"}, None),
], ids=["changed", "removed", "another-annotation"])
def test_created_by_never_changes(plan_creator_policy, crds: Kubectl, patch, refusal) -> None:
    name = f"vap-plan-{uuid.uuid4().hex[:6]}"
    crds.run("create", "--as=alice", "-f", "-", input=json.dumps(_plan(name, "alice")))
    try:
        proc = crds.run("patch", "trainingplan", name, "--type=merge", "-p",
                        json.dumps({"metadata": {"annotations": patch}}), check=False)
        if refusal is None:
            assert proc.returncode == 0, proc.stderr
        else:
            assert proc.returncode != 0 and refusal in proc.stderr, proc.stderr
            assert crds.get("trainingplan", name)["metadata"]["annotations"][CREATED_BY] == "alice"
    finally:
        crds.run("delete", "trainingplan", name, "--wait=false", "--ignore-not-found")


def test_admins_are_not_matched_by_the_node_policy(as_operator: Kubectl, crds: Kubectl) -> None:
    name = f"vap-admin-{uuid.uuid4().hex[:6]}"
    crds.create(_node("foreign", name))
    try:
        crds.run("label", "node", name, "node-role.kubernetes.io/worker=", f"{POOL}=free")
        crds.run("delete", "node", name)
    finally:
        crds.run("delete", "node", name, "--wait=false", "--ignore-not-found")


CHECKPOINT = "hyperplan.dev/block-termination-time"
MARK = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByHyperplan", "message": "dead node"}
POD_ONLY = "hyperplan may only set the annotation hyperplan.dev/block-termination-time on a pod"
STATUS_ONLY = "hyperplan may only mark a pod Failed with the condition DisruptionTarget"
NOT_MARKED = "hyperplan may only delete a pod it marked first"


# (whether the pod is marked first by the admin; what the ServiceAccount does: a patch of the pod,
# of its status, or a delete; a part of the refusal or None)
POD_CASES = [
    (False, ("patch", {"metadata": {"labels": {"app": "hijacked"}}}), POD_ONLY),
    (False, ("patch", {"metadata": {"annotations": {"example.com/owner": "me"}}}), POD_ONLY),
    (False, ("patch", {"spec": {"activeDeadlineSeconds": 1}}), POD_ONLY),
    (False, ("status", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}), STATUS_ONLY),
    (False, ("status", {"status": {"podIP": "10.9.9.9", "podIPs": [{"ip": "10.9.9.9"}]}}), STATUS_ONLY),
    (False, ("status", {"status": {"phase": "Failed", "conditions": [{**MARK, "reason": "EvictionByEvictionAPI"}]}}),
     STATUS_ONLY),
    (False, ("delete", None), NOT_MARKED),
    (False, ("patch", {"metadata": {"annotations": {CHECKPOINT: "2026-12-01T12:00:00Z"}}}), None),
    (False, ("status", {"status": {"phase": "Failed", "conditions": [MARK]}}), None),
    (True, ("delete", None), None),
]
POD_CASE_IDS = ["label", "another-annotation", "spec", "status-ready-condition", "status-pod-ip",
                "status-another-disruption-reason", "delete-unmarked", "checkpoint-annotation", "status-mark",
                "delete-marked"]


def _pending_pod(crds: Kubectl, namespace: str) -> str:
    name = f"p-{uuid.uuid4().hex[:6]}"
    crds.create({"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": name, "namespace": namespace, "labels": {"app": "train"}},
                 # never scheduled: no kubelet changes it while the test looks
                 "spec": {"nodeSelector": {"hyperplan.dev/helm-test": "nowhere"},
                          "containers": [{"name": "c", "image": "trainer"}]}})
    # ... once the scheduler has said so (PodScheduled=False), its one write to the pod.
    eventually(lambda: any(c.get("type") == "PodScheduled" for c in (crds.get("pod", name, "-n", namespace).get(
        "status") or {}).get("conditions") or []), timeout=60, interval=0.2, what=f"the scheduler's word on {name}")
    return name


@pytest.fixture(scope="module")
def pod_namespace(crds: Kubectl, as_operator: Kubectl):
    """A namespace for the pods, once the API server enforces the pod policy."""
    ns = f"vap-pods-{uuid.uuid4().hex[:5]}"
    crds.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    probe, api, attempts = _pending_pod(crds, ns), core_api(as_operator), itertools.count()
    eventually(lambda: as_kubectl_would(lambda: api.patch_namespaced_pod(
        probe, ns, {"metadata": {"labels": {"probe": str(next(attempts))}}})).returncode != 0,
               timeout=60, what="the pod policy to refuse a label")
    yield ns
    crds.run("delete", "namespace", ns, "--wait=false")


def _pod_state(pod: dict[str, Any]) -> tuple:
    return (pod["metadata"].get("labels"), pod["metadata"].get("annotations"), pod["spec"], pod.get("status"))


@pytest.mark.parametrize("marked, action, refusal", POD_CASES, ids=POD_CASE_IDS)
def test_service_account_writes_only_the_checkpoint_annotation_and_the_dead_nodes_mark_on_pods(
        as_operator: Kubectl, crds: Kubectl, pod_namespace: str, marked, action, refusal) -> None:
    """The chart's pod policy, with the ServiceAccount's own token: of the pod rights RBAC grants
    it on every pod (patch, status patch, delete), only the operator's three writes pass."""
    name = _pending_pod(crds, pod_namespace)
    if marked:
        crds.run("patch", "pod", name, "-n", pod_namespace, "--subresource=status", "--type=strategic",
                 "-p", json.dumps({"status": {"phase": "Failed", "conditions": [MARK]}}))
    before = crds.get("pod", name, "-n", pod_namespace)
    try:
        verb, body = action
        api = core_api(as_operator)
        proc = as_kubectl_would({
            "patch": lambda: api.patch_namespaced_pod(name, pod_namespace, body),
            "status": lambda: api.patch_namespaced_pod_status(name, pod_namespace, body),
            "delete": lambda: api.delete_namespaced_pod(name, pod_namespace,
                                                        body=client.V1DeleteOptions(grace_period_seconds=0)),
        }[verb])
        after = json.loads(crds.run("get", "pod", name, "-n", pod_namespace, "-o", "json",
                                    "--ignore-not-found").stdout or "null")
        if refusal is None:
            assert proc.returncode == 0, proc.stderr
            assert after is None if verb == "delete" else _pod_state(after) != _pod_state(before)  # it landed
        else:
            assert proc.returncode != 0, "allowed"
            assert refusal in proc.stderr and f"{pod_namespace}/{name}" in proc.stderr, proc.stderr
            assert _pod_state(after) == _pod_state(before)
    finally:
        crds.run("delete", "pod", name, "-n", pod_namespace, "--grace-period=0", "--force", "--ignore-not-found",
                 "--wait=false")


def test_operator_runs_with_the_service_accounts_token(release, plane: Plane, crds: Kubectl,
                                                       tmp_path: Path) -> None:
    """`hyperplan run` as the chart's service account: it starts, watches, reconciles a plan,
    and is never refused by the API server."""
    kubeconfig = service_account_kubeconfig(release, plane, crds, tmp_path)

    log = tmp_path / "operator.log"
    liveness = free_port()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HYPERPLAN_POLICY": "demo",
           "HYPERPLAN_METRICS_PORT": str(free_port()), "HYPERPLAN_LIVENESS_PORT": str(liveness),
           "POD_NAMESPACE": release["namespace"]}  # as the chart sets it: the Lease goes there
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "hyperplan.cli", "run"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    tag = uuid.uuid4().hex[:5]
    pool, plan = f"helm-rbac-{tag}", f"helm-rbac-{tag}"
    try:
        def healthy() -> bool:
            assert proc.poll() is None, f"operator exited:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{liveness}/healthz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        eventually(healthy, timeout=60, what="operator liveness")
        crds.create({"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": pool},
                     "spec": {"instanceType": f"ml.rbac-{tag}.xlarge",
                              "availabilityZone": "us-east-1a", "instanceCount": 4}})
        crds.create({"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": plan},
                     "spec": {"instanceType": f"ml.rbac-{tag}.xlarge", "instanceCount": 2,
                              "targetResource": "training-job", "duration": "2m",
                              "autoPurchase": True}})
        def bought() -> bool:
            status = crds.get("trainingplan", plan).get("status") or {}
            assert status.get("phase") in (None, "Pending", "Scheduled", "Active"), status
            return status.get("phase") in ("Scheduled", "Active")

        eventually(bought, timeout=60, what=f"plan {plan} bought by the operator")
        # It acted as the elected leader, on the Lease the chart's Role lets it write.
        lease = crds.get("lease", "hyperplan-leader", "-n", release["namespace"])
        assert lease["spec"]["holderIdentity"], lease
        # The purchase wrote the ledger (CapacityPool status) and posted an Event.
        reservations = crds.get("capacitypool", pool).get("status", {}).get("reservations", [])
        assert [r["trainingPlan"] for r in reservations] == [plan]
        eventually(lambda: crds.get("events", None, "-A",
                                    f"--field-selector=involvedObject.name={plan}")["items"],
                   timeout=30, what=f"an Event about {plan}")
        # Deletion finishes only once the operator has released the capacity and removed
        # its finalizer from the plan.
        crds.delete("trainingplan", plan, "--wait=true", "--timeout=60s")
        assert crds.get("capacitypool", pool).get("status", {}).get("reservations", []) == []
    finally:
        crds.delete("trainingplan", plan, "--wait=true", "--timeout=60s")
        crds.delete("capacitypool", pool)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    refused = [l for l in text.splitlines() if re.search(r"[Ff]orbidden", l)]
    assert refused == [], "\n".join(refused[:10])


def test_helm_uninstall_removes_what_install_created(helm, release, crds: Kubectl) -> None:
    ns, full = release["namespace"], release["fullname"]
    helm("uninstall", release["name"], release["kubeconfig"], "--namespace", ns, "--wait",
         "--timeout=60s")
    for kind, name, scope in (("deployment", full, ns), ("serviceaccount", full, ns),
                              ("service", f"{full}-metrics", ns), ("clusterrole", full, None),
                              ("clusterrolebinding", full, None),
                              ("validatingadmissionpolicy", f"{full}-owned-nodes", None),
                              ("validatingadmissionpolicy", f"{full}-pod-writes", None),
                              ("role", f"{full}-leader-election", ns),
                              ("rolebinding", f"{full}-leader-election", ns),
                              ("validatingadmissionpolicybinding", f"{full}-owned-nodes", None),
                              ("validatingadmissionpolicybinding", f"{full}-pod-writes", None)):
        args = (kind, name, "-n", scope) if scope else (kind, name)
        proc = crds.run("get", *args, check=False)
        assert "NotFound" in proc.stderr, f"{kind}/{name} survived helm uninstall"
    # Helm never deletes CRDs (and with them every user's plans): they stay.
    for plural in ("capacitypools", "trainingplans", "instancegroups"):
        assert crds.get_or_none("crd", f"{plural}.hyperplan.dev") is not None
    assert json.loads(helm("list", release["kubeconfig"], "-n", ns, "-o", "json").stdout) == []


SAGEMAKER_API = ("--set", "sagemakerApi.enabled=true", "--set", "sagemakerApi.tlsSecret=api-tls",
                 "--set", "sagemakerApi.identities.users={alice,bob}",
                 "--set", "sagemakerApi.identities.serviceAccounts[0].namespace=team-a",
                 "--set", "sagemakerApi.identities.serviceAccounts[0].name=ci")


def test_the_sagemaker_api_gets_exactly_its_rights_its_port_and_its_certificate(helm) -> None:
    """sagemakerApi.enabled adds what hyperplan.sagemaker calls and nothing more: access reviews
    (access.KubeAccess.allowed), the keys' Secrets listed in the release's namespace
    (KubeAccess.refresh), and impersonation of exactly the identities listed (access.KubeWrites),
    a ServiceAccount only in its own namespace; off, none of it is there."""
    docs = render(helm, *SAGEMAKER_API, namespace="hyperplan-system")
    plain = render(helm, namespace="hyperplan-system")
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole" and component(d) != USER_ROLES)
    base = next(d for d in plain if d["kind"] == "ClusterRole" and component(d) != USER_ROLES)
    added = [r for r in cluster_role["rules"] if r not in base["rules"]]
    assert added == [{"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
                     {"apiGroups": [""], "resources": ["users"], "resourceNames": ["alice", "bob"],
                      "verbs": ["impersonate"]}]
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]): d["rules"] for d in docs if d["kind"] == "Role"}
    assert roles[("hyperplan-system", "hp-hyperplan-sagemaker-api-keys")] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}]
    assert roles[("team-a", "hp-hyperplan-impersonate-ci")] == [
        {"apiGroups": [""], "resources": ["serviceaccounts"], "resourceNames": ["ci"], "verbs": ["impersonate"]}]
    bindings = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs if d["kind"] == "RoleBinding"}
    assert {("hyperplan-system", "hp-hyperplan-sagemaker-api-keys"), ("team-a", "hp-hyperplan-impersonate-ci")} <= bindings
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-sagemaker-api"))
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "sagemaker-api", "protocol": "TCP"}]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in container(deployment)["env"]}
    assert env["HYPERPLAN_SAGEMAKER_API_PORT"] == "9443" and env["HYPERPLAN_SAGEMAKER_API_ADDRESS"] == "0.0.0.0"
    assert env["HYPERPLAN_SAGEMAKER_API_TLS_CERT"].startswith("/etc/hyperplan/sagemaker-api-tls/")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["sagemaker-api-tls"]["secret"]["secretName"] == "api-tls"
    assert not any("sagemaker" in (d["metadata"]["name"]) for d in plain)
    # The policy that makes hyperplan.dev/created-by (the API's tenancy) the API server's word.
    assert sorted(n for n in admission_policies(docs) if n.endswith("-plan-creator")) == [
        f"{kind}/hp-hyperplan-plan-creator" for kind in ADMISSION_KINDS]
    assert not any(n.endswith("-plan-creator") for n in admission_policies(plain))
    assert "HYPERPLAN_SAGEMAKER_API_PORT" not in {e["name"] for e in container(by_kind(plain)["Deployment"])["env"]}


def test_the_sagemaker_api_needs_a_certificate(helm) -> None:
    done = helm("template", "hp", str(CHART), "--set", "sagemakerApi.enabled=true", check=False)
    assert done.returncode != 0 and "tlsSecret" in done.stderr
