"""The three kinds of group ``hyperplan.dev/v1alpha1`` as pydantic models.

These models are the single source of the API: the CRD YAML in ``crds/`` is generated
from them (``hyperplan crds``), and handlers parse object bodies through them. Field
names are camelCase on the wire (aliases) and snake_case in Python. Validation that the
API server can do at apply time (enums, bounds, CEL rules) is declared here with
``json_schema_extra`` so it lands in the CRD; pydantic enforces the same bounds when a
handler parses a body, and anything that depends on time or on other objects is checked
by the planners instead.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from hyperplan.api.vocabulary import (  # noqa: F401  (re-exported: the models' callers use them with the models)
    API_VERSION, GROUP, LABEL_HOSTNAME, LABEL_INSTANCE_TYPE, LABEL_SAGEMAKER_HEALTH, LABEL_ZONE, OWN_PREFIX,
    TARGET_RESOURCES, TOPOLOGY_PREFIX, ULTRASERVER_TYPES, VERSION, from_rfc3339, to_rfc3339,
)

ALLOWED_INSTANCE_COUNTS = (1, 2, 4, 8, 16, 32, 64)
DURATION_PATTERN = r"^([0-9]+[dhms])+$"

# What the API server accepts as a label value and a qualified key (label or taint key): checked here
# at apply time, because the operator writes these onto nodes and a node write that the API server
# refuses would otherwise surface only when a block starts.
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
QUALIFIED_NAME_PATTERN = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                          r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# Keys the operator owns on its nodes. A group may not set them through `labels` or `taints`:
# they would fight with (or forge) what the operator writes and what schedulers read.
RESERVED_KEY_PREFIXES = (OWN_PREFIX, TOPOLOGY_PREFIX)
RESERVED_KEYS = (LABEL_INSTANCE_TYPE, LABEL_ZONE, LABEL_HOSTNAME, LABEL_SAGEMAKER_HEALTH)
# Domains that belong to Kubernetes: a key whose prefix is one of them or a subdomain of one
# (node-role.kubernetes.io/worker, foo.k8s.io/x) steers the kubelet, the scheduler or admission, so a
# group may not put it on nodes through `labels` or `taints`, as Karpenter refuses these domains in
# NodePool templates. Only the whole prefix counts: kubernetes.io.example.com/x is example.com's.
KUBERNETES_DOMAINS = ("kubernetes.io", "k8s.io", "node-restriction.kubernetes.io")
KUBERNETES_DOMAINS_TEXT = "kubernetes.io, k8s.io, node-restriction.kubernetes.io or a subdomain of one"
MAX_GROUP_LABELS = 64
MAX_GROUP_TAINTS = 32


def cel(rule: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"rule": rule, "message": message, **extra}


def _cel_is_reserved(var: str) -> str:
    prefixes = " || ".join(f"{var}.startsWith('{p}')" for p in RESERVED_KEY_PREFIXES)
    keys = ", ".join(f"'{k}'" for k in RESERVED_KEYS)
    return f"({prefixes} || {var} in [{keys}])"


def _cel_in_kubernetes_domain(var: str) -> str:
    domains = "|".join(d.replace(".", "\\\\.") for d in KUBERNETES_DOMAINS)
    return f"{var}.matches('^([^/]*\\\\.)?({domains})/')"


def _cel_is_qualified_name(var: str) -> str:
    return f"({var}.matches('{QUALIFIED_NAME_PATTERN}') && {var}.split('/')[0].size() <= 253)"


def label_value_field(description: str, **default: Any) -> Any:
    """A string the operator copies into a node label value: checked as one at apply time."""
    return Field(**default, min_length=1, max_length=63, description=description, json_schema_extra={
        "x-kubernetes-validations": [cel(
            f"self.matches('{LABEL_VALUE_PATTERN}')",
            "must be a valid label value: at most 63 characters, alphanumerics, '-', '_' or '.', "
            "starting and ending with an alphanumeric",
            messageExpression="'must be a valid label value (at most 63 characters, alphanumerics, "
                              "\\'-\\', \\'_\\' or \\'.\\', alphanumeric at both ends): ' + self")],
    })


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def wire(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, no unset optionals."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class Condition(Model):
    """A Kubernetes API convention condition."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None
    observed_generation: int | None = None


# --------------------------------------------------------------------------- CapacityPool


class UnavailableWindow(Model):
    """Capacity already sold to someone else during a window."""

    start: datetime
    end: datetime
    instance_count: int = Field(ge=1)

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("self.end > self.start", "end must be after start"),
    ]})


class Reservation(Model):
    """One block sold from a pool: a line of the pool's ledger."""

    training_plan: str
    training_plan_uid: str | None = None
    reserved_capacity_id: str
    start_time: datetime
    end_time: datetime
    instance_count: int = Field(ge=1)


class CapacityPoolSpec(Model):
    instance_type: str = label_value_field("Instance type; becomes node.kubernetes.io/instance-type.")
    availability_zone: str = label_value_field("AZ; becomes topology.kubernetes.io/zone on nodes.")
    instance_count: int = Field(ge=1)
    ultra_server_type: Literal[*ULTRASERVER_TYPES] | None = None
    unavailable: list[UnavailableWindow] = Field(default_factory=list)


class CapacityPoolStatus(Model):
    reservations: list[Reservation] = Field(default_factory=list)
    observed_generation: int | None = None


class CapacityPool(Model):
    api_version: str = API_VERSION
    kind: str = "CapacityPool"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: CapacityPoolSpec
    status: CapacityPoolStatus = Field(default_factory=CapacityPoolStatus)


# --------------------------------------------------------------------------- TrainingPlan


class OfferedBlock(Model):
    availability_zone: str
    instance_type: str
    instance_count: int
    start_time: datetime
    end_time: datetime
    capacity_pool: str | None = None
    ultra_server_type: str | None = None
    ultra_server_count: int | None = None


class Offering(Model):
    id: str
    blocks: list[OfferedBlock] = Field(default_factory=list)
    duration_hours: int | None = None
    duration_minutes: int | None = None


class ReservedCapacity(Model):
    id: str
    availability_zone: str
    instance_type: str
    instance_count: int
    start_time: datetime
    end_time: datetime
    termination_time: datetime | None = None
    status: Literal["Scheduled", "Active", "Expired", "Failed"] = "Scheduled"
    capacity_pool: str | None = None
    ultra_server_type: str | None = None
    ultra_server_count: int | None = None


class UltraServerStatus(Model):
    id: str
    availability_zone: str
    total_instance_count: int = 0
    configured_spare_instance_count: int = 0
    available_instance_count: int = 0
    in_use_instance_count: int = 0
    available_spare_instance_count: int = 0
    unhealthy_instance_count: int = 0
    health_status: Literal["ok", "impaired", "insufficient-data"] = "insufficient-data"


class TrainingPlanSpec(Model):
    instance_type: str | None = label_value_field(
        "Instance type (or implied by ultraServerType); becomes node.kubernetes.io/instance-type.",
        default=None)
    instance_count: Literal[1, 2, 4, 8, 16, 32, 64] | None = None
    ultra_server_type: Literal[*ULTRASERVER_TYPES] | None = None
    ultra_server_count: int | None = Field(default=None, ge=1)
    target_resource: Literal[*TARGET_RESOURCES]
    duration: str = Field(json_schema_extra={"x-kubernetes-validations": [
        cel(f"self.matches('{DURATION_PATTERN}') && self.matches('[1-9]')",
            "duration must be a positive duration string such as 48h, 2d or 90m"),
    ]})
    start_time_after: datetime | None = None
    end_time_before: datetime | None = None
    spare_instances_per_ultra_server: int = Field(default=1, ge=0)
    offering_id: str = ""
    auto_purchase: bool = False
    keep_alive_period_seconds: int | None = Field(
        default=None, ge=0, le=3600 * 24 * 7,
        description="training-job plans: how long a Kueue workload's nodes stay after it finishes or is "
                    "evicted, for the next workload to reuse (SageMaker managed warm pools); unset or 0: "
                    "released at once.")

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("!has(self.startTimeAfter) || !has(self.endTimeBefore) || self.endTimeBefore > self.startTimeAfter",
            "endTimeBefore must be after startTimeAfter", fieldPath=".endTimeBefore"),
        cel("has(self.instanceCount) != has(self.ultraServerType)",
            "set either instanceCount (with instanceType) or ultraServerType with ultraServerCount"),
        cel("has(self.ultraServerType) == has(self.ultraServerCount)",
            "ultraServerType and ultraServerCount go together", fieldPath=".ultraServerCount"),
        cel("has(self.ultraServerType) || has(self.instanceType)",
            "instanceType is required unless ultraServerType is set", fieldPath=".instanceType"),
        cel("!has(self.ultraServerType) || self.spareInstancesPerUltraServer < "
            "(self.ultraServerType == 'ml.u-p6e-gb200x72' ? 18 : 9)",
            "spareInstancesPerUltraServer must leave at least one usable instance per UltraServer "
            "(at most 17 for ml.u-p6e-gb200x72, 8 for ml.u-p6e-gb200x36)",
            fieldPath=".spareInstancesPerUltraServer"),
        cel("!has(oldSelf.offeringId) || oldSelf.offeringId == '' || self == oldSelf",
            "spec is immutable once offeringId is set: a purchased plan cannot be modified"),
    ]})


class TrainingPlanStatus(Model):
    phase: Literal["Pending", "Scheduled", "Active", "Expired", "Failed"] | None = None
    offerings: list[Offering] = Field(default_factory=list)
    purchased_offering_id: str | None = None
    reserved_capacity: list[ReservedCapacity] = Field(default_factory=list)
    availability_zone: str | None = None
    total_instance_count: int = 0
    available_instance_count: int = 0
    in_use_instance_count: int = 0
    unhealthy_instance_count: int = 0
    available_spare_instance_count: int = 0
    total_ultra_server_count: int | None = None
    ultra_servers: list[UltraServerStatus] = Field(default_factory=list)
    next_transition_time: datetime | None = None
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None


class TrainingPlan(Model):
    api_version: str = API_VERSION
    kind: str = "TrainingPlan"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: TrainingPlanSpec
    status: TrainingPlanStatus = Field(default_factory=TrainingPlanStatus)


# --------------------------------------------------------------------------- InstanceGroup


class Taint(Model):
    key: str = Field(min_length=1, max_length=317, json_schema_extra={"x-kubernetes-validations": [
        cel(_cel_is_qualified_name("self"),
            "taint key must be a qualified name such as gpu or example.com/gpu"),
        cel(f"!{_cel_is_reserved('self')}",
            "taint key is owned by hyperplan (hyperplan.dev/* and the topology keys)"),
        cel(f"!{_cel_in_kubernetes_domain('self')}",
            f"taint key is in a domain that belongs to Kubernetes ({KUBERNETES_DOMAINS_TEXT}): a group may "
            "not put it on nodes (Karpenter refuses these domains in NodePool templates too)"),
    ]})
    value: str = Field(default="", max_length=63, json_schema_extra={"x-kubernetes-validations": [
        cel(f"self.matches('{LABEL_VALUE_PATTERN}')",
            "taint value must be at most 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends"),
    ]})
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class HealthCheckSpec(Model):
    grace_seconds: int = Field(default=30, ge=0)
    max_unhealthy: int | str = Field(default="20%", json_schema_extra={
        "x-kubernetes-int-or-string": True,
        "x-kubernetes-validations": [
            cel("type(self) == int ? self >= 0 : self.matches('^[0-9]+%$')",
                "maxUnhealthy must be a count (>= 0) or a percentage such as 20%"),
        ],
    })
    unhealthy_conditions: list[str] = Field(
        default_factory=lambda: ["AcceleratedHardwareReady=False", "GpuHealthy=False"],
        description="Node conditions, as Type=Status, that make a node unhealthy after the grace.",
    )


class PlacementSpecification(Model):
    ultra_server_id: str = Field(min_length=1)
    instance_count: int = Field(ge=1)


class PlacementSpec(Model):
    strategy: Literal["FillFirst"] = "FillFirst"
    placement_specifications: list[PlacementSpecification] = Field(default_factory=list)


class InstanceGroupSpec(Model):
    training_plan_ref: str = Field(min_length=1)
    instance_type: str = label_value_field("Instance type of the group's nodes (the plan's type).")
    instance_count: int = Field(ge=0)
    node_provider: Literal["kwok", "static"] = "kwok"
    labels: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_GROUP_LABELS,
        description="Labels the operator puts on the group's nodes (and removes when it hands them back).",
        json_schema_extra={
            "additionalProperties": {"type": "string", "maxLength": 63},
            "x-kubernetes-validations": [
                cel(f"self.all(k, {_cel_is_qualified_name('k')})",
                    "label keys must be qualified names such as team or example.com/team",
                    messageExpression=f"'label key ' + self.filter(k, !{_cel_is_qualified_name('k')})[0] + "
                                      "' is not a qualified name (an optional DNS subdomain prefix and /, "
                                      "then at most 63 alphanumerics, \\'-\\', \\'_\\' or \\'.\\')'"),
                cel(f"self.all(k, self[k].matches('{LABEL_VALUE_PATTERN}'))",
                    "label values must be at most 63 alphanumerics, '-', '_' or '.', "
                    "alphanumeric at both ends",
                    messageExpression=f"'value of label ' + self.filter(k, !self[k].matches("
                                      f"'{LABEL_VALUE_PATTERN}'))[0] + ' is not a valid label value "
                                      "(at most 63 alphanumerics, \\'-\\', \\'_\\' or \\'.\\', "
                                      "alphanumeric at both ends)'"),
                cel(f"self.all(k, !{_cel_is_reserved('k')})",
                    "labels may not set keys the operator owns (hyperplan.dev/*, topology.k8s.aws/*, "
                    "the zone, instance-type, hostname and health labels)",
                    messageExpression=f"'label ' + self.filter(k, {_cel_is_reserved('k')})[0] + "
                                      "' is owned by hyperplan: it sets it on every node it manages'"),
                cel(f"self.all(k, !{_cel_in_kubernetes_domain('k')})",
                    f"label keys may not be in a domain that belongs to Kubernetes ({KUBERNETES_DOMAINS_TEXT})",
                    messageExpression=f"'label ' + self.filter(k, {_cel_in_kubernetes_domain('k')})[0] + "
                                      f"' is in a domain that belongs to Kubernetes ({KUBERNETES_DOMAINS_TEXT}): "
                                      "a group may not put it on nodes (Karpenter refuses these domains in "
                                      "NodePool templates too)'"),
            ],
        })
    taints: list[Taint] = Field(default_factory=list, max_length=MAX_GROUP_TAINTS, json_schema_extra={
        "x-kubernetes-validations": [cel(
            "self.all(t, self.exists_one(u, u.key == t.key && u.effect == t.effect))",
            "taints must be unique by key and effect (a node refuses two taints with the same pair)")]})
    health_check: HealthCheckSpec = Field(default_factory=HealthCheckSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        # A static group adopts nodes that already run pods: a NoExecute taint would evict them at
        # once, without regard to their PodDisruptionBudgets (a drain honours them; a taint does not).
        cel("!has(self.nodeProvider) || self.nodeProvider != 'static' || !has(self.taints) || self.taints.all(t, t.effect != 'NoExecute')",
            "a static group may not set NoExecute taints: adopting a node would evict the pods already on "
            "it without regard to their PodDisruptionBudgets (use NoSchedule)", fieldPath=".taints"),
    ]})


class VanishedNode(Model):
    """A node of the group deleted from under it (not by the operator), kept in the status until
    its slot is replaced, so that a restarted operator still counts the grace from ``since``."""

    name: str
    since: datetime
    labels: dict[str, str] = Field(default_factory=dict)


class InstanceGroupStatus(Model):
    phase: Literal["Waiting", "Provisioning", "Ready", "Draining", "Failed"] | None = None
    availability_zone: str | None = None
    reserved_capacity_id: str | None = None
    desired_count: int = 0
    ready_count: int = 0
    spare_count: int = 0
    unhealthy_count: int = 0
    next_transition_time: datetime | None = None
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    vanished_nodes: list[VanishedNode] = Field(default_factory=list)


class InstanceGroup(Model):
    api_version: str = API_VERSION
    kind: str = "InstanceGroup"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: InstanceGroupSpec
    status: InstanceGroupStatus = Field(default_factory=InstanceGroupStatus)
