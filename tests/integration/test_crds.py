"""The CRDs on a real API server: valid objects are accepted, bad ones rejected with a message."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.kube import Kubectl

API = "hyperplan.dev/v1alpha1"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def pool(**spec) -> dict:
    return {"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": _name("pool")},
            "spec": {"instanceType": "ml.p5.48xlarge", "availabilityZone": "us-east-1a",
                     "instanceCount": 16, **spec}}


def remote_pool(unavailable=None, instanceCount=None, **source) -> dict:
    """A pool sold by a SageMaker endpoint (``source``); ``None`` leaves a field out."""
    sage_maker = {k: v for k, v in {"endpoint": "https://capacity.example.com:9443", "region": "us-east-1",
                                     "credentialsSecret": "fleet-key", **source}.items() if v is not None}
    body = pool(source={"sageMaker": sage_maker})
    del body["spec"]["instanceCount"]
    if instanceCount is not None:
        body["spec"]["instanceCount"] = instanceCount
    if unavailable is not None:
        body["spec"]["unavailable"] = unavailable
    return body


def blocks_pool(**source) -> dict:
    """A pool sold by EC2 Capacity Blocks; ``source`` adds to (or, as ``sageMaker``, beside) it."""
    body = pool(instanceType="p5.48xlarge", source={"ec2CapacityBlocks": {"region": "us-east-1",
                                                                          "maxUpfrontFee": "40000"}, **source})
    del body["spec"]["instanceCount"]
    return body


def plan(**spec) -> dict:
    base = {"instanceType": "ml.p5.48xlarge", "instanceCount": 8, "targetResource": "hyperpod-cluster",
            "duration": "48h", "startTimeAfter": "2027-01-01T00:00:00Z",
            "endTimeBefore": "2027-01-10T00:00:00Z"}
    base.update(spec)
    for k in [k for k, v in base.items() if v is None]:
        del base[k]
    return {"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": _name("plan")}, "spec": base}


def group(**spec) -> dict:
    base = {"trainingPlanRef": "some-plan", "instanceType": "ml.p5.48xlarge", "instanceCount": 4}
    base.update(spec)
    for k in [k for k, v in base.items() if v is None]:
        del base[k]
    return {"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": _name("group")}, "spec": base}


@pytest.mark.parametrize("obj", [
    pool(),
    pool(ultraServerType="ml.u-p6e-gb200x72", instanceType="ml.p6e-gb200.36xlarge",
         unavailable=[{"start": "2027-01-01T00:00:00Z", "end": "2027-01-02T00:00:00Z", "instanceCount": 4}]),
    plan(),
    plan(instanceType=None, instanceCount=None, ultraServerType="ml.u-p6e-gb200x72", ultraServerCount=2,
         spareInstancesPerUltraServer=2),
    plan(targetResource="training-job", duration="2d", autoPurchase=True),
    group(),
    group(instanceCount=0, nodeProvider="static",
          labels={"team": "a", "example.com/cost-center": "A_1.b", "empty": ""},
          taints=[{"key": "gpu", "value": "true", "effect": "NoSchedule"}],
          healthCheck={"graceSeconds": 10, "maxUnhealthy": 2},
          placement={"placementSpecifications": [{"ultraServerId": "us-0", "instanceCount": 3}]}),
    # Keys outside the Kubernetes domains, however close: only the whole prefix (or its tail after a
    # dot) counts, and a key without a prefix has no domain.
    group(labels={"example.com/role": "a", "kubernetes.io.example.com/x": "a", "notkubernetes.io/x": "a",
                  "k8s.io-tools.example/y": "a", "kubernetes.io": "a"},
          taints=[{"key": "kubernetes.io.example.com/gpu", "value": "", "effect": "NoSchedule"},
                  {"key": "notk8s.io/gpu", "value": "", "effect": "NoSchedule"}]),
    # NoExecute is refused for static groups only: a kwok group's nodes are new and empty.
    group(taints=[{"key": "example.com/dedicated", "value": "training", "effect": "NoExecute"}]),
    # Every field at its bound.
    group(trainingPlanRef="p" * 253,
          taints=[{"key": f"t{i}", "value": "", "effect": "NoSchedule"} for i in range(32)],
          healthCheck={"unhealthyConditions": ["GpuHealthy=False", "Ready=Unknown", "KernelDeadlock=True",
                                               "example.com/Gpu_Healthy.v2=False"] + [f"C{i}=True" for i in range(28)],
                       "maxUnhealthy": "1" * 15 + "%"},
          placement={"placementSpecifications": [{"ultraServerId": "u" * 63, "instanceCount": 1}]}),
    plan(duration="1h" * 32, offeringId="tpo-" + "a" * 249),
    pool(unavailable=[{"start": "2027-01-01T00:00:00Z", "end": "2027-01-02T00:00:00Z", "instanceCount": 1}] * 1024),
    remote_pool(),
    remote_pool(endpoint=None, credentialsSecret=None, maxUpfrontFee="250000.50"),
    remote_pool(endpoint="http://127.0.0.1:9443"),
    blocks_pool(),
], ids=["pool", "pool-ultraserver", "plan", "plan-ultraserver", "plan-training-job", "group",
        "group-full", "group-keys-near-kubernetes-domains", "group-kwok-no-execute", "group-at-bounds",
        "plan-at-bounds", "pool-at-bounds", "pool-remote", "pool-remote-aws", "pool-remote-http-on-loopback",
        "pool-ec2-capacity-blocks"])
def test_valid_objects_are_accepted(crds: Kubectl, obj: dict) -> None:
    crds.create(obj)
    stored = crds.get(obj["kind"].lower(), obj["metadata"]["name"])
    for key, value in obj["spec"].items():
        if isinstance(value, dict):  # the API server may add defaults inside
            assert stored["spec"][key] == {**stored["spec"][key], **value}
        else:
            assert stored["spec"][key] == value
    crds.delete(obj["kind"].lower(), obj["metadata"]["name"], "--wait=false")


@pytest.mark.parametrize("obj, message", [
    (remote_pool(instanceCount=4), "a pool has either instanceCount (it keeps its own ledger) or source"),
    ({**pool(), "spec": {k: v for k, v in pool()["spec"].items() if k != "instanceCount"}},
     "a pool has either instanceCount (it keeps its own ledger) or source"),
    (remote_pool(unavailable=[{"start": "2027-01-01T00:00:00Z", "end": "2027-01-02T00:00:00Z", "instanceCount": 1}]),
     "a pool with a remote source has no unavailable windows"),
    (remote_pool(endpoint="capacity.example.com"), "endpoint must be an https:// URL"),
    (remote_pool(endpoint="http://metadata.kube-system.svc:80/"), "or http:// on a loopback address"),
    (remote_pool(endpoint="http://10.0.0.7:8080"), "or http:// on a loopback address"),
    (blocks_pool(sageMaker={"region": "us-east-1"}), "a source is exactly one of sageMaker or ec2CapacityBlocks"),
    ({**blocks_pool(), "spec": {**blocks_pool()["spec"], "source": {}}},
     "a source is exactly one of sageMaker or ec2CapacityBlocks"),
    (remote_pool(region="US East"), "spec.source.sageMaker.region: Invalid value"),
    (remote_pool(maxUpfrontFee="$100"), "spec.source.sageMaker.maxUpfrontFee: Invalid value"),
    (plan(instanceCount=3), 'spec.instanceCount: Unsupported value: 3'),
    (plan(instanceCount=128), 'spec.instanceCount: Unsupported value: 128'),
    (plan(targetResource="inference"), 'spec.targetResource: Unsupported value: "inference"'),
    (plan(duration="forever"), 'spec.duration: Invalid value: "forever": duration must be a positive duration string'),
    (plan(duration="0h"), 'spec.duration: Invalid value: "0h": duration must be a positive duration string'),
    (plan(duration="-48h"), 'spec.duration: Invalid value: "-48h": duration must be a positive duration string'),
    (plan(startTimeAfter="2027-01-10T00:00:00Z", endTimeBefore="2027-01-01T00:00:00Z"),
     "spec.endTimeBefore: Invalid value: endTimeBefore must be after startTimeAfter"),
    (plan(startTimeAfter="2027-01-10T00:00:00Z", endTimeBefore="2027-01-10T00:00:00Z"),
     "endTimeBefore must be after startTimeAfter"),
    (plan(ultraServerType="ml.u-p6e-gb200x72", ultraServerCount=1),
     "set either instanceCount (with instanceType) or ultraServerType with ultraServerCount"),
    (plan(instanceType=None), "spec.instanceType: Invalid value: instanceType is required unless ultraServerType is set"),
    (plan(spareInstancesPerUltraServer=-1), "spec.spareInstancesPerUltraServer: Invalid value: -1"),
    (plan(instanceType=None, instanceCount=None, ultraServerType="ml.u-p6e-gb200x36", ultraServerCount=1,
          spareInstancesPerUltraServer=9),
     "spec.spareInstancesPerUltraServer: Invalid value: spareInstancesPerUltraServer must leave at least one"),
    (group(trainingPlanRef=None), 'spec.trainingPlanRef: Required value'),
    (group(trainingPlanRef=""), 'spec.trainingPlanRef: Invalid value: ""'),
    (group(instanceCount=-1), "spec.instanceCount: Invalid value: -1: spec.instanceCount in body should be greater than or equal to 0"),
    (group(nodeProvider="ec2"), 'spec.nodeProvider: Unsupported value: "ec2"'),
    (group(healthCheck={"maxUnhealthy": "lots"}), "maxUnhealthy must be a count (>= 0) or a percentage"),
    (pool(instanceCount=0), "spec.instanceCount: Invalid value: 0"),
    # What the operator writes onto nodes must be what the API server accepts on a node.
    (pool(availabilityZone="us east 1a"), "spec.availabilityZone: Invalid value: \"us east 1a\": must be a valid "
                                          "label value (at most 63 characters, alphanumerics, '-', '_' or '.', "
                                          "alphanumeric at both ends): us east 1a"),
    (pool(instanceType="ml.p5/48xlarge"), "spec.instanceType: Invalid value: \"ml.p5/48xlarge\": must be a valid label value"),
    (plan(instanceType="ml." + "p5" * 40), "spec.instanceType: Too long: may not be more than 63"),
    (group(instanceType="-ml.p5"), "spec.instanceType: Invalid value: \"-ml.p5\": must be a valid label value"),
    (group(labels={"bad key": "a"}), "spec.labels: Invalid value: label key bad key is not a qualified name"),
    (group(labels={"example.com/" + "a" * 64: "a"}), "is not a qualified name"),
    (group(labels={"Example.COM/team": "a"}), "label key Example.COM/team is not a qualified name"),
    (group(labels={"team": "a b"}), "spec.labels: Invalid value: value of label team is not a valid label value"),
    (group(labels={"team": "x" * 64}), "spec.labels.team: Too long: may not be more than 63"),
    (group(labels={"hyperplan.dev/role": "active"}),
     "label hyperplan.dev/role is owned by hyperplan: it sets it on every node it manages"),
    (group(labels={"topology.kubernetes.io/zone": "us-east-1b"}), "label topology.kubernetes.io/zone is owned by hyperplan"),
    (group(labels={"node.kubernetes.io/instance-type": "ml.p4d.24xlarge"}),
     "label node.kubernetes.io/instance-type is owned by hyperplan"),
    (group(labels={"topology.k8s.aws/ultraserver-id": "us-0"}), "label topology.k8s.aws/ultraserver-id is owned by hyperplan"),
    (group(labels={"sagemaker.amazonaws.com/node-health-status": "Schedulable"}),
     "label sagemaker.amazonaws.com/node-health-status is owned by hyperplan"),
    (group(labels={f"l{i}": "a" for i in range(65)}), "spec.labels: Too many: 65: must have at most 64 items"),
    (group(taints=[{"key": "bad key", "effect": "NoSchedule"}]),
     "spec.taints[0].key: Invalid value: \"bad key\": taint key must be a qualified name"),
    (group(taints=[{"key": "hyperplan.dev/spare", "value": "true", "effect": "NoSchedule"}]),
     "spec.taints[0].key: Invalid value: \"hyperplan.dev/spare\": taint key is owned by hyperplan"),
    (group(taints=[{"key": "gpu", "value": "yes please", "effect": "NoSchedule"}]),
     "spec.taints[0].value: Invalid value: \"yes please\": taint value must be at most 63 alphanumerics"),
    (group(taints=[{"key": "gpu", "effect": "NoExecuteNow"}]), 'spec.taints[0].effect: Unsupported value: "NoExecuteNow"'),
    (group(taints=[{"key": "gpu", "value": "a", "effect": "NoSchedule"}, {"key": "gpu", "value": "b", "effect": "NoSchedule"}]),
     "spec.taints: Invalid value: taints must be unique by key and effect"),
    # The domains that belong to Kubernetes, and their subdomains (as Karpenter refuses them).
    (group(labels={"kubernetes.io/role": "gpu"}),
     "spec.labels: Invalid value: label kubernetes.io/role is in a domain that belongs to Kubernetes "
     "(kubernetes.io, k8s.io, node-restriction.kubernetes.io or a subdomain of one): a group may not put it "
     "on nodes (Karpenter refuses these domains in NodePool templates too)"),
    (group(labels={"node-role.kubernetes.io/control-plane": ""}),
     "label node-role.kubernetes.io/control-plane is in a domain that belongs to Kubernetes"),
    (group(labels={"node-restriction.kubernetes.io/tier": "trusted"}),
     "label node-restriction.kubernetes.io/tier is in a domain that belongs to Kubernetes"),
    (group(labels={"k8s.io/team": "a"}), "label k8s.io/team is in a domain that belongs to Kubernetes"),
    (group(labels={"foo.k8s.io/team": "a"}), "label foo.k8s.io/team is in a domain that belongs to Kubernetes"),
    (group(labels={"kubernetes.io/hostname": "other-node"}),
     "label kubernetes.io/hostname is in a domain that belongs to Kubernetes"),
    (group(taints=[{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]),
     "spec.taints[0].key: Invalid value: \"node-role.kubernetes.io/control-plane\": taint key is in a domain "
     "that belongs to Kubernetes"),
    (group(taints=[{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]),
     "spec.taints[0].key: Invalid value: \"node.kubernetes.io/unschedulable\": taint key is in a domain "
     "that belongs to Kubernetes"),
    (group(taints=[{"key": "gpu", "effect": "NoSchedule"}, {"key": "foo.k8s.io/y", "effect": "NoSchedule"}]),
     "spec.taints[1].key: Invalid value: \"foo.k8s.io/y\": taint key is in a domain that belongs to Kubernetes"),
    (group(taints=[{"key": "node-restriction.kubernetes.io/tier", "effect": "NoSchedule"}]),
     "taint key is in a domain that belongs to Kubernetes"),
    # A static group adopts nodes that run pods: NoExecute would evict them past their PDBs.
    (group(nodeProvider="static", taints=[{"key": "gpu", "effect": "NoSchedule"},
                                          {"key": "dedicated", "value": "training", "effect": "NoExecute"}]),
     "spec.taints: Invalid value: a static group may not set NoExecute taints: adopting a node "
     "would evict the pods already on it without regard to their PodDisruptionBudgets (use NoSchedule)"),
    # Node conditions as Type=Status, the way the health check reads them.
    (group(healthCheck={"unhealthyConditions": ["GpuHealthy=False", "GpuHealthy"]}),
     "spec.healthCheck.unhealthyConditions: Invalid value: unhealthy condition GpuHealthy is not Type=True, "
     "Type=False or Type=Unknown (a node condition type such as GpuHealthy or example.com/GpuHealthy, then = "
     "and the status)"),
    (group(healthCheck={"unhealthyConditions": ["GpuHealthy=Maybe"]}),
     "unhealthy condition GpuHealthy=Maybe is not Type=True, Type=False or Type=Unknown"),
    (group(healthCheck={"unhealthyConditions": ["=False"]}), "unhealthy condition =False is not Type=True"),
    (group(healthCheck={"unhealthyConditions": ["GpuHealthy = False"]}),
     "unhealthy condition GpuHealthy = False is not Type=True"),
    (group(healthCheck={"unhealthyConditions": ["GpuHealthy=false"]}),
     "unhealthy condition GpuHealthy=false is not Type=True"),
    (group(healthCheck={"unhealthyConditions": [f"C{i}=True" for i in range(33)]}),
     "spec.healthCheck.unhealthyConditions: Too many: 33: must have at most 32 items"),
    (group(healthCheck={"unhealthyConditions": ["G" * 319 + "=False"]}),
     "spec.healthCheck.unhealthyConditions[0]: Too long: may not be more than 324"),
    # Bounds.
    (group(trainingPlanRef="p" * 254), "spec.trainingPlanRef: Too long: may not be more than 253"),
    (group(taints=[{"key": f"t{i}", "effect": "NoSchedule"} for i in range(33)]),
     "spec.taints: Too many: 33: must have at most 32 items"),
    (group(healthCheck={"maxUnhealthy": "1" * 16 + "%"}), "spec.healthCheck.maxUnhealthy: Too long: may not be more than 16"),
    (group(placement={"placementSpecifications": [{"ultraServerId": "u" * 64, "instanceCount": 1}]}),
     "spec.placement.placementSpecifications[0].ultraServerId: Too long: may not be more than 63"),
    (group(placement={"placementSpecifications": [{"ultraServerId": f"u{i}", "instanceCount": 1}
                                                  for i in range(1025)]}),
     "spec.placement.placementSpecifications: Too many: 1025: must have at most 1024 items"),
    (plan(duration="1h" * 33), "spec.duration: Too long: may not be more than 64"),
    (plan(offeringId="tpo-" + "a" * 250), "spec.offeringId: Too long: may not be more than 253"),
    (pool(unavailable=[{"start": "2027-01-01T00:00:00Z", "end": "2027-01-02T00:00:00Z", "instanceCount": 1}] * 1025),
     "spec.unavailable: Too many: 1025: must have at most 1024 items"),
], ids=["pool-remote-with-count", "pool-neither-count-nor-source", "pool-remote-with-unavailable",
        "pool-remote-endpoint-not-a-url", "pool-remote-endpoint-http-to-a-service",
        "pool-remote-endpoint-http-to-a-private-address", "pool-source-both-kinds", "pool-source-no-kind", "pool-remote-region",
        "pool-remote-fee",
        "plan-count-3", "plan-count-128", "plan-target", "plan-duration-word", "plan-duration-zero",
        "plan-duration-negative", "plan-window-reversed", "plan-window-empty", "plan-count-and-ultraserver",
        "plan-no-type", "plan-negative-spares", "plan-spares-fill-ultraserver", "group-no-plan", "group-empty-plan", "group-negative-count",
        "group-provider", "group-max-unhealthy", "pool-zero",
        "pool-zone-not-a-label-value", "pool-type-with-slash", "plan-type-too-long", "group-type-leading-dash",
        "group-label-key-space", "group-label-key-name-too-long", "group-label-key-uppercase-prefix",
        "group-label-value-space", "group-label-value-too-long", "group-label-hyperplan-key",
        "group-label-zone-key", "group-label-instance-type-key", "group-label-ultraserver-key",
        "group-label-health-key", "group-too-many-labels", "group-taint-key-space", "group-taint-spare-key",
        "group-taint-value-space", "group-taint-effect", "group-taint-duplicate",
        "group-label-kubernetes-io", "group-label-node-role", "group-label-node-restriction", "group-label-k8s-io",
        "group-label-k8s-io-subdomain", "group-label-hostname-domain", "group-taint-node-role",
        "group-taint-node-kubernetes-io", "group-taint-k8s-io-subdomain", "group-taint-node-restriction",
        "group-static-no-execute", "group-unhealthy-condition-no-status", "group-unhealthy-condition-bad-status",
        "group-unhealthy-condition-no-type", "group-unhealthy-condition-spaces", "group-unhealthy-condition-lowercase",
        "group-too-many-unhealthy-conditions", "group-unhealthy-condition-too-long", "group-plan-ref-too-long",
        "group-too-many-taints", "group-max-unhealthy-too-long", "group-ultraserver-id-too-long",
        "group-too-many-placements", "plan-duration-too-long", "plan-offering-id-too-long",
        "pool-too-many-windows"])
def test_bad_objects_are_rejected_with_a_message(crds: Kubectl, obj: dict, message: str) -> None:
    proc = crds.create(obj, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert crds.get_or_none(obj["kind"].lower(), obj["metadata"]["name"]) is None


def _conditions(count: int, message: str = "") -> list[dict]:
    return [{"type": f"T{i}", "status": "True", "reason": "R", "message": message,
             "lastTransitionTime": "2027-01-01T00:00:00Z"} for i in range(count)]


@pytest.mark.parametrize("status, refusal", [
    ({"conditions": _conditions(63) + [{**_conditions(1, "m" * 32768)[0], "type": "Long"}]}, None),
    ({"conditions": _conditions(65)}, "status.conditions: Too many: 65: must have at most 64 items"),
    ({"conditions": _conditions(1, "m" * 32769)}, "status.conditions[0].message: Too long: may not be more than 32768"),
    ({"nodes": [{"name": "n", "uid": "u", "nodeId": "n", "vanished": {
        "since": "2027-01-01T00:00:00Z", "labels": {f"k{i}": "v" for i in range(17)}}}]},
     "status.nodes[0].vanished.labels: Too many: 17: must have at most 16 items"),
], ids=["at-bounds", "too-many-conditions", "message-too-long", "vanished-labels-too-many"])
def test_status_writes_are_bounded(crds: Kubectl, status: dict, refusal: str | None) -> None:
    """The status subresource holds the same bounds (the operator's own writes stay under them:
    tests/unit/test_crd_bounds.py)."""
    obj = group()
    crds.create(obj)
    name = obj["metadata"]["name"]
    proc = crds.run("patch", "instancegroup", name, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": status}), check=False)
    if refusal is None:
        assert proc.returncode == 0, proc.stderr
        assert len(crds.get("instancegroup", name)["status"]["conditions"]) == 64
    else:
        assert proc.returncode != 0 and refusal in proc.stderr, proc.stderr
    crds.delete("instancegroup", name, "--wait=false")


def test_a_purchased_plan_cannot_be_modified(crds: Kubectl) -> None:
    obj = plan()
    crds.create(obj)
    name = obj["metadata"]["name"]
    # Before purchase, the spec may change.
    crds.run("patch", "trainingplan", name, "--type=merge", "-p", '{"spec":{"duration":"72h"}}')
    crds.run("patch", "trainingplan", name, "--type=merge", "-p", '{"spec":{"offeringId":"tpo-123"}}')
    proc = crds.run("patch", "trainingplan", name, "--type=merge", "-p", '{"spec":{"duration":"96h"}}',
                    check=False)
    assert proc.returncode != 0
    assert "spec is immutable once offeringId is set" in proc.stderr, proc.stderr
    proc = crds.run("patch", "trainingplan", name, "--type=merge", "-p", '{"spec":{"offeringId":"tpo-456"}}',
                    check=False)
    assert "spec is immutable once offeringId is set" in proc.stderr, proc.stderr
    assert crds.get("trainingplan", name)["spec"]["duration"] == "72h"
    crds.delete("trainingplan", name, "--wait=false")


EXT_A, EXT_B = "tpe-20270101t113000-0123456789abcdef", "tpe-20270102t113000-fedcba9876543210"


@pytest.mark.parametrize("patch, refusal", [
    ({"spec": {"extensions": [{"offeringId": EXT_A}, {"offeringId": EXT_B}]}}, None),
    ({"spec": {"extensions": [{"offeringId": EXT_A}], "duration": "96h"}}, "spec is immutable once offeringId is set"),
    ({"spec": {"extensions": []}}, "extensions may only be added"),
    ({"spec": {"extensions": [{"offeringId": EXT_B}]}}, "extensions may only be added"),
    ({"spec": {"extensions": None}}, "only extended (spec.extensions)"),
    ({"spec": {"extensions": [{"offeringId": EXT_A}, {"offeringId": EXT_A}]}}, "each extension offering may be named once"),
    ({"spec": {"extensions": [{"offeringId": EXT_A}, {"offeringId": "tpo-20270101t113000-0123456789abcdef"}]}},
     "extension offering id as hyperplan lists them"),
], ids=["another-extension", "extension-and-another-change", "all-removed", "one-replaced", "field-dropped",
        "named-twice", "not-an-extension-id"])
def test_a_purchased_plan_may_only_be_extended(crds: Kubectl, patch: dict, refusal: str | None) -> None:
    """Once bought (offeringId set), the spec may change in one way only: extensions added to
    spec.extensions; none may be changed or removed."""
    obj = plan(offeringId="tpo-123", extensions=[{"offeringId": EXT_A}])
    crds.create(obj)
    name = obj["metadata"]["name"]
    proc = crds.run("patch", "trainingplan", name, "--type=merge", "-p", json.dumps(patch), check=False)
    if refusal is None:
        assert proc.returncode == 0, proc.stderr
        assert crds.get("trainingplan", name)["spec"]["extensions"] == patch["spec"]["extensions"]
    else:
        assert proc.returncode != 0 and refusal in proc.stderr, proc.stderr
        assert crds.get("trainingplan", name)["spec"]["extensions"] == [{"offeringId": EXT_A}]
    crds.delete("trainingplan", name, "--wait=false")


def test_printer_columns(crds: Kubectl) -> None:
    p, g = plan(), group()
    crds.create(p)
    crds.create(g)
    tp_header = crds.run("get", "trainingplans", p["metadata"]["name"]).stdout.splitlines()[0].split()
    assert tp_header[:7] == ["NAME", "PHASE", "TYPE", "ULTRASERVER", "COUNT", "AZ", "IN-USE"]
    assert "NEXT-TRANSITION" in tp_header
    ig_header = crds.run("get", "instancegroups", g["metadata"]["name"]).stdout.splitlines()[0].split()
    assert ig_header[:8] == ["NAME", "PLAN", "PHASE", "AZ", "DESIRED", "READY", "SPARES", "UNHEALTHY"]
    crds.delete("trainingplan", p["metadata"]["name"], "--wait=false")
    crds.delete("instancegroup", g["metadata"]["name"], "--wait=false")


@pytest.mark.parametrize("status, field", [
    ({"nodes": [{"name": "n", "uid": "u", "nodeId": "n", "vanished": {"since": "2027-01-01T00:00:00"}}]},
     "status.nodes[0].vanished.since"),
    ({"conditions": [{**_conditions(1)[0], "lastTransitionTime": "2027-01-01T00:00:00"}]},
     "status.conditions[0].lastTransitionTime"),
    ({"nextTransitionTime": "2027-01-01T00:00:00"}, "status.nextTransitionTime"),
    ({"nextTransitionTime": "soon"}, "status.nextTransitionTime"),
], ids=["vanished-since-naive", "condition-time-naive", "next-transition-naive", "next-transition-garbage"])
def test_status_times_without_a_timezone_are_refused(crds: Kubectl, status: dict, field: str) -> None:
    """The operator reads these times back (a vanished node's grace counts from ``since``) and
    compares them with its own aware times: the API server's ``date-time`` format keeps a time
    without a timezone out, so no reader meets one (docs/security.md, "Strict reading")."""
    obj = group()
    crds.create(obj)
    name = obj["metadata"]["name"]
    proc = crds.run("patch", "instancegroup", name, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": status}), check=False)
    assert proc.returncode != 0 and field in proc.stderr and "date-time" in proc.stderr, proc.stderr
    crds.delete("instancegroup", name, "--wait=false")


# --------------------------------------------------------------------------- tenancy selectors

EVERY_OPERATOR = {"matchLabels": {"team": "a", "example.com/cost-center": "c1"},
                  "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold", "silver"]},
                                       {"key": "tier", "operator": "NotIn", "values": ["bronze"]},
                                       {"key": "example.com/approved", "operator": "Exists"},
                                       {"key": "frozen", "operator": "DoesNotExist", "values": []}]}


@pytest.mark.parametrize("obj", [
    pytest.param(plan(instanceGroupSelector=EVERY_OPERATOR), id="plan-every-operator"),
    pytest.param(plan(instanceGroupSelector={}), id="plan-empty-selector"),
    pytest.param(pool(trainingPlanSelector=EVERY_OPERATOR), id="pool-every-operator"),
    pytest.param(pool(trainingPlanSelector={"matchLabels": {"team": "a"}}), id="pool-match-labels"),
])
def test_selectors_are_accepted(crds: Kubectl, obj: dict) -> None:
    crds.create(obj)
    stored = crds.get(obj["kind"].lower(), obj["metadata"]["name"])
    field = "instanceGroupSelector" if obj["kind"] == "TrainingPlan" else "trainingPlanSelector"
    assert stored["spec"][field] == obj["spec"][field]
    crds.delete(obj["kind"].lower(), obj["metadata"]["name"], "--wait=false")


def _expression(**requirement) -> dict:
    return {"matchExpressions": [requirement]}


@pytest.mark.parametrize("obj, message", [
    pytest.param(plan(instanceGroupSelector=_expression(key="team", operator="Equals", values=["a"])),
                 'spec.instanceGroupSelector.matchExpressions[0].operator: Unsupported value: "Equals"',
                 id="plan-unknown-operator"),
    pytest.param(pool(trainingPlanSelector=_expression(key="team", operator="Gt", values=["1"])),
                 'spec.trainingPlanSelector.matchExpressions[0].operator: Unsupported value: "Gt"',
                 id="pool-unknown-operator"),
    pytest.param(plan(instanceGroupSelector=_expression(key="team", operator="In")),
                 "In and NotIn need at least one value", id="plan-in-without-values"),
    pytest.param(pool(trainingPlanSelector=_expression(key="team", operator="NotIn", values=[])),
                 "In and NotIn need at least one value", id="pool-not-in-empty-values"),
    pytest.param(plan(instanceGroupSelector=_expression(key="team", operator="Exists", values=["a"])),
                 "Exists and DoesNotExist take none", id="plan-exists-with-values"),
    pytest.param(pool(trainingPlanSelector=_expression(key="bad key", operator="Exists")),
                 "selector key must be a qualified name", id="pool-key-with-space"),
    pytest.param(plan(instanceGroupSelector={"matchLabels": {"Bad Key": "a"}}),
                 "matchLabels keys must be qualified names", id="plan-match-labels-bad-key"),
    pytest.param(plan(instanceGroupSelector=_expression(key="team", operator="In", values=["a" * 64])),
                 "spec.instanceGroupSelector.matchExpressions[0].values[0]: Too long", id="plan-value-too-long"),
])
def test_bad_selectors_are_refused_at_apply(crds: Kubectl, obj: dict, message: str) -> None:
    proc = crds.create(obj, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert crds.get_or_none(obj["kind"].lower(), obj["metadata"]["name"]) is None
