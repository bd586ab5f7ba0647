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

import re
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from hyperplan.api.vocabulary import (  # noqa: F401  (re-exported: the models' callers use them with the models)
    API_VERSION, CHECK_FAILED, CHECK_IN_PROGRESS, CHECK_PASSED, DEEP_HEALTH_CHECKS, GROUP, LABEL_HOSTNAME,
    LABEL_INSTANCE_TYPE, LABEL_SAGEMAKER_DEEP_HEALTH_CHECK, LABEL_SAGEMAKER_HEALTH, LABEL_ZONE, OWN_PREFIX,
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
RESERVED_KEYS = (LABEL_INSTANCE_TYPE, LABEL_ZONE, LABEL_HOSTNAME, LABEL_SAGEMAKER_HEALTH,
                 LABEL_SAGEMAKER_DEEP_HEALTH_CHECK)
# Domains that belong to Kubernetes: a key whose prefix is one of them or a subdomain of one
# (node-role.kubernetes.io/worker, foo.k8s.io/x) steers the kubelet, the scheduler or admission, so a
# group may not put it on nodes through `labels` or `taints`, as Karpenter refuses these domains in
# NodePool templates. Only the whole prefix counts: kubernetes.io.example.com/x is example.com's.
KUBERNETES_DOMAINS = ("kubernetes.io", "k8s.io", "node-restriction.kubernetes.io")
KUBERNETES_DOMAINS_TEXT = "kubernetes.io, k8s.io, node-restriction.kubernetes.io or a subdomain of one"
MAX_GROUP_LABELS = 64
MAX_GROUP_TAINTS = 32

# Bounds of every list and string in the CRDs (maxItems, maxLength): the API server refuses a bigger
# object at apply time, and a CEL rule over a bounded field has a cost the API server can estimate.
# pydantic holds the same bounds when a handler parses a body. Strings the operator makes are short
# by construction except condition messages, which Condition cuts to MAX_MESSAGE.
MAX_NAME = 253  # an object name: a DNS subdomain
MAX_UID = 128  # a metadata.uid (the API server's are 36-character UUIDs)
MAX_ID = 253  # an id the operator makes: an offering, a reserved capacity block
MAX_LABEL_VALUE = 63
MAX_ARN = 2048  # an ARN (the model's bound for a TrainingPlanArn)
MAX_ENDPOINT = 2048
MAX_TIME = 64  # an RFC 3339 date-time
MAX_DURATION = 64  # a duration string such as 48h
MAX_INT_OR_PERCENT = 16  # maxUnhealthy as text: 20%
MAX_CONDITION_TYPE = 316  # metav1.Condition's bounds
MAX_REASON = 1024
MAX_MESSAGE = 32768
MAX_CONDITIONS = 64  # the operator writes one per type, a handful of types
MAX_OFFERINGS = 16  # planning.offerings lists at most 3, each of at most 2 blocks
MAX_BLOCKS = 16
MAX_RESERVED_CAPACITY = 64  # the blocks of the offering bought
MAX_UNAVAILABLE_WINDOWS = 1024
MAX_PLACEMENTS = 1024  # one per UltraServer of a block
MAX_UNHEALTHY_CONDITIONS = 32
MAX_EXTENSIONS = 32  # a plan's extensions (spec.extensions and status.extensions): each adds days to its last block
# An extension offering's id as planning.offerings.extension_id makes it: its start and a digest.
EXTENSION_ID_PATTERN = r"^tpe-[0-9]{8}t[0-9]{6}-[0-9a-f]{16}$"
# Lists the operator writes that grow with the fleet (a pool's ledger, a plan's UltraServers, a
# group's vanished nodes): bounded above what one object can hold under etcd's default request
# limit of 1.5 MiB, for the smallest entry the operator writes, so the bound never refuses a
# write that storage would take (tests/unit/test_crd_bounds.py checks the arithmetic).
ETCD_MAX_OBJECT_BYTES = 1536 * 1024
MAX_FLEET_ENTRIES = 20_000

# A node condition as Type=Status (spec.healthCheck.unhealthyConditions): the type as metav1.Condition
# allows it (CamelCase, optionally prefixed by a DNS subdomain and /), the status one of the three.
CONDITION_TYPE_PATTERN = (r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                          r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
UNHEALTHY_CONDITION_PATTERN = f"^{CONDITION_TYPE_PATTERN}=(True|False|Unknown)$"

Name = Annotated[str, Field(max_length=MAX_NAME)]
Identifier = Annotated[str, Field(max_length=MAX_ID)]
LabelValue = Annotated[str, Field(max_length=MAX_LABEL_VALUE)]
Time = Annotated[datetime, Field(json_schema_extra={"maxLength": MAX_TIME})]


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


def truncate(text: Any, limit: int, mark: str = " ... (truncated)") -> Any:
    """``text`` if it has at most ``limit`` characters, else its start and ``mark`` in ``limit``."""
    if not isinstance(text, str) or len(text) <= limit:
        return text
    return text[:limit - len(mark)] + mark


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def wire(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, no unset optionals."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class Condition(Model):
    """A Kubernetes API convention condition, in metav1.Condition's bounds. A longer message is cut
    to the bound (marked so) rather than refused: a status write the API server refused would
    stall the object's every pass."""

    type: str = Field(max_length=MAX_CONDITION_TYPE)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(default="", max_length=MAX_REASON)
    message: str = Field(default="", max_length=MAX_MESSAGE)
    last_transition_time: Time | None = None
    observed_generation: int | None = None

    @field_validator("message", mode="before")
    @classmethod
    def _cut_to_bound(cls, value: Any) -> Any:
        return truncate(value, MAX_MESSAGE)


# --------------------------------------------------------------------------- label selectors


MAX_SELECTOR_TERMS = 32
MAX_SELECTOR_VALUES = 64


class LabelSelectorRequirement(Model):
    """A metav1.LabelSelectorRequirement: ``key`` In/NotIn ``values``, or Exists/DoesNotExist."""

    key: str = Field(min_length=1, max_length=317, json_schema_extra={"x-kubernetes-validations": [
        cel(_cel_is_qualified_name("self"), "selector key must be a qualified name such as team or example.com/team"),
    ]})
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[LabelValue] = Field(default_factory=list, max_length=MAX_SELECTOR_VALUES)

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
            "In and NotIn need at least one value; Exists and DoesNotExist take none", fieldPath=".values"),
    ]})


class LabelSelector(Model):
    """A metav1.LabelSelector: every pair of ``matchLabels`` and every requirement of
    ``matchExpressions`` must hold; an empty selector matches every object."""

    match_labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_SELECTOR_TERMS, json_schema_extra={
        "additionalProperties": {"type": "string", "maxLength": MAX_LABEL_VALUE},
        "x-kubernetes-validations": [
            cel(f"self.all(k, {_cel_is_qualified_name('k')})",
                "matchLabels keys must be qualified names such as team or example.com/team"),
        ]})
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, max_length=MAX_SELECTOR_TERMS)


# --------------------------------------------------------------------------- CapacityPool


class UnavailableWindow(Model):
    """Capacity already sold to someone else during a window."""

    start: Time
    end: Time
    instance_count: int = Field(ge=1)

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("self.end > self.start", "end must be after start"),
    ]})


class Reservation(Model):
    """One block sold from a pool: a line of the pool's ledger."""

    training_plan: Name
    training_plan_uid: str | None = Field(default=None, max_length=MAX_UID)
    reserved_capacity_id: Identifier
    start_time: Time
    end_time: Time
    instance_count: int = Field(ge=1)
    remote_training_plan_arn: str | None = Field(default=None, max_length=MAX_ARN, description=(
        "In a pool with a remote source: the remote training plan this line mirrors (its ARN). The "
        "operator writes these lines from what the remote endpoint answers; they are its own record."))
    adds_to: Identifier | None = Field(default=None, description=(
        "An UltraServer added to the plan's block of this id for the rest of it, bought when one of "
        "the block's UltraServers failed and the block had no free one (inPlaceOf names it); not a "
        "block of its own."))
    in_place_of: LabelValue | None = Field(default=None, description=(
        "With addsTo: the failed UltraServer this one was bought for."))


# A remote endpoint is called over TLS, or in the clear only on this machine's loopback: a pool's
# author must not make the operator POST to any in-cluster service (character classes instead of
# escapes, so the same pattern reads alike in Python and in CEL).
ENDPOINT_HTTPS = "^https://[^/ ]+(/.*)?$"
ENDPOINT_LOOPBACK = "^http://(localhost|127[.][0-9]{1,3}[.][0-9]{1,3}[.][0-9]{1,3})(:[0-9]+)?(/.*)?$"
ENDPOINT_RULE = "endpoint must be an https:// URL, or http:// on a loopback address (localhost, 127.0.0.0/8)"


class RemoteSource(Model):
    """What every remote source of a pool names: where to call, as whom, and how dear an offering
    it may buy (``PoolSource.remote``)."""

    # The source's field under spec.source, and what it sells (for messages and Events).
    field_name: ClassVar[str] = ""
    noun: ClassVar[str] = ""
    service: ClassVar[str] = ""  # boto3's service name

    endpoint: str | None = Field(default=None, max_length=MAX_ENDPOINT, description=(
        "URL of the endpoint (https://..., or http:// on a loopback address); unset: the real AWS "
        "endpoint of the region."), json_schema_extra={"x-kubernetes-validations": [cel(
            f"self.matches('{ENDPOINT_HTTPS}') || self.matches('{ENDPOINT_LOOPBACK}')", ENDPOINT_RULE)]})
    region: str = Field(min_length=1, max_length=MAX_LABEL_VALUE, pattern=r"^[a-z0-9-]+$",
                        description="AWS region, such as us-east-1 (signs every request).")
    credentials_secret: Name | None = Field(default=None, description=(
        "A Secret in the operator's namespace with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; "
        "unset: the operator's own AWS credential chain (IRSA, EKS Pod Identity, the environment)."))
    @field_validator("endpoint")
    @classmethod
    def _https_or_loopback(cls, value: str | None) -> str | None:
        if value is not None and not (re.match(ENDPOINT_HTTPS, value) or re.match(ENDPOINT_LOOPBACK, value)):
            raise ValueError(ENDPOINT_RULE)
        return value

    max_upfront_fee: str | None = Field(default=None, max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?$", description=(
        "Offerings whose UpfrontFee is higher (or that name none) are not bought (a purchase spends "
        "money): they are left out of the plan's offerings. Unset: no ceiling."))


class SageMakerSource(RemoteSource):
    """A SageMaker Training Plans endpoint that sells the pool's capacity: another hyperplan's
    SageMaker API or AWS itself (docs/aws.md)."""

    field_name: ClassVar[str] = "sageMaker"
    noun: ClassVar[str] = "SageMaker training plan"
    service: ClassVar[str] = "sagemaker"


class Ec2CapacityBlocksSource(RemoteSource):
    """EC2 Capacity Blocks for ML that sell the pool's capacity, for a cluster that launches the
    EC2 instances itself (Karpenter): the pool's instanceType is the EC2 name (p5.48xlarge) and its
    availabilityZone the zone's name (us-east-1a), as the nodes' labels carry them (docs/aws.md)."""

    field_name: ClassVar[str] = "ec2CapacityBlocks"
    noun: ClassVar[str] = "EC2 Capacity Block"
    service: ClassVar[str] = "ec2"


class PoolSource(Model):
    """Exactly one remote source."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("has(self.sageMaker) != has(self.ec2CapacityBlocks)",
            "a source is exactly one of sageMaker or ec2CapacityBlocks"),
    ]})

    sage_maker: SageMakerSource | None = Field(default=None, description=(
        "A SageMaker Training Plans endpoint: another hyperplan's SageMaker API or AWS."))
    ec2_capacity_blocks: Ec2CapacityBlocksSource | None = Field(default=None, description=(
        "EC2 Capacity Blocks for ML (DescribeCapacityBlockOfferings, PurchaseCapacityBlock): the "
        "block's id on the nodes is the capacity reservation's id (cr-...)."))

    @model_validator(mode="after")
    def _exactly_one(self) -> "PoolSource":
        if (self.sage_maker is None) == (self.ec2_capacity_blocks is None):
            raise ValueError("a source is exactly one of sageMaker or ec2CapacityBlocks")
        return self

    @property
    def remote(self) -> RemoteSource:
        """The one source set."""
        return self.sage_maker or self.ec2_capacity_blocks  # type: ignore[return-value]


class CapacityPoolSpec(Model):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        cel("has(self.instanceCount) != has(self.source)",
            "a pool has either instanceCount (it keeps its own ledger) or source (a remote endpoint sells "
            "its capacity), not both"),
        cel("!has(self.source) || !has(self.unavailable) || size(self.unavailable) == 0",
            "a pool with a remote source has no unavailable windows: the remote keeps its own ledger"),
    ]})

    instance_type: str = label_value_field("Instance type; becomes node.kubernetes.io/instance-type.")
    availability_zone: str = label_value_field("AZ; becomes topology.kubernetes.io/zone on nodes.")
    instance_count: int | None = Field(default=None, ge=1, description=(
        "Instances the pool holds, sold from its own ledger (status.reservations); unset with source."))
    source: PoolSource | None = Field(default=None, description=(
        "Where the capacity is bought instead of from a ledger of the pool's own: a SageMaker "
        "endpoint or EC2 Capacity Blocks. The pool's instanceType and availabilityZone filter what it offers."))
    ultra_server_type: Literal[*ULTRASERVER_TYPES] | None = None
    unavailable: list[UnavailableWindow] = Field(default_factory=list, max_length=MAX_UNAVAILABLE_WINDOWS)
    training_plan_selector: LabelSelector | None = Field(
        default=None,
        description="Which TrainingPlans may buy from this pool, by their labels; unset: every plan. "
                    "A plan that does not match sees no offerings from the pool.")


class CapacityPoolStatus(Model):
    reservations: list[Reservation] = Field(default_factory=list, max_length=MAX_FLEET_ENTRIES)
    observed_generation: int | None = None


class CapacityPool(Model):
    api_version: str = API_VERSION
    kind: str = "CapacityPool"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: CapacityPoolSpec
    status: CapacityPoolStatus = Field(default_factory=CapacityPoolStatus)

    @classmethod
    def parsed_or_none(cls, obj: Any) -> "CapacityPool | None":
        """The pool as this model, or None when it does not parse (the schema keeps such pools out)."""
        try:
            return cls.model_validate(obj)
        except ValueError:
            return None


# --------------------------------------------------------------------------- TrainingPlan


class OfferedBlock(Model):
    availability_zone: LabelValue
    instance_type: LabelValue
    instance_count: int
    start_time: Time
    end_time: Time
    capacity_pool: Name | None = None
    ultra_server_type: LabelValue | None = None
    ultra_server_count: int | None = None


class Offering(Model):
    id: Identifier
    blocks: list[OfferedBlock] = Field(default_factory=list, max_length=MAX_BLOCKS)
    duration_hours: int | None = None
    duration_minutes: int | None = None


class AddedUltraServer(Model):
    """An UltraServer added to a bought block for the rest of it (its own ledger line, ``id``), in
    place of a failed one of the block (``inPlaceOf``) when the block had no free UltraServer."""

    id: Identifier
    start_time: Time
    instance_count: int
    in_place_of: LabelValue | None = None


MAX_ADDED_ULTRASERVERS = 16


class ReservedCapacity(Model):
    id: Identifier
    availability_zone: LabelValue
    instance_type: LabelValue
    instance_count: int
    start_time: Time
    end_time: Time
    termination_time: Time | None = None
    status: Literal["Scheduled", "Active", "Expired", "Failed"] = "Scheduled"
    capacity_pool: Name | None = None
    ultra_server_type: LabelValue | None = None
    ultra_server_count: int | None = None
    # UltraServers bought for the rest of the block in place of failed ones (their UltraServer ids
    # follow the block's own: <id>-us-<ultraServerCount>, and on); not in instanceCount.
    added_ultra_servers: list[AddedUltraServer] | None = Field(default=None, max_length=MAX_ADDED_ULTRASERVERS)


class ExtensionOffering(Model):
    """An extension a bought plan may buy now (as of its last pass): its last block run on in the
    same pool from its end for ``durationDays`` of the policy. Put its ``id`` in
    ``spec.extensions`` to buy it."""

    id: Identifier
    reserved_capacity_id: Identifier  # the block it extends
    capacity_pool: Name
    availability_zone: LabelValue
    start_time: Time
    end_time: Time
    duration_days: int


class ExtensionStatus(Model):
    """One entry of ``spec.extensions`` as the operator found it: bought (the block it extends, the
    window it added and where that window stands now), being bought, or failed (and why)."""

    offering_id: Identifier
    status: Literal["Pending", "Scheduled", "Active", "Expired", "Failed"] = "Pending"
    reason: str | None = Field(default=None, max_length=MAX_REASON)
    message: str | None = Field(default=None, max_length=MAX_MESSAGE)
    extended_at: Time | None = None  # when the operator saw the ledger hold it first
    reserved_capacity_id: Identifier | None = None  # the block it extends
    availability_zone: LabelValue | None = None
    start_time: Time | None = None  # the old end of the block
    end_time: Time | None = None  # the new end
    duration_days: int | None = None  # in the policy's days

    @field_validator("message", mode="before")
    @classmethod
    def _cut_to_bound(cls, value: Any) -> Any:
        return truncate(value, MAX_MESSAGE)


class UltraServerStatus(Model):
    id: LabelValue  # the UltraServer id label of its nodes
    availability_zone: LabelValue
    total_instance_count: int = 0
    configured_spare_instance_count: int = 0
    available_instance_count: int = 0
    in_use_instance_count: int = 0
    available_spare_instance_count: int = 0
    unhealthy_instance_count: int = 0
    health_status: Literal["ok", "impaired", "insufficient-data"] = "insufficient-data"
    replaced_by: LabelValue | None = None  # the UltraServer the groups' nodes on it moved to


class PlanExtension(Model):
    """An extension of the plan's last block, by the id of an extension offering that the operator
    listed for this plan (its ``status.extensionOfferings``, or the SageMaker API's
    ``SearchTrainingPlanOfferings`` with ``TrainingPlanArn``): the same pool, zone, type and count
    from the block's end on. The operator searches again from the plan's blocks in the ledger and
    buys only what that search cuts under the id."""

    offering_id: str = Field(min_length=1, max_length=MAX_ID, json_schema_extra={"x-kubernetes-validations": [
        cel(f"self.matches('{EXTENSION_ID_PATTERN}')",
            "offeringId must be an extension offering id as hyperplan lists them (tpe-<start>-<digest>)"),
    ]})


def _cel_unchanged_except(fields: tuple[str, ...]) -> str:
    """CEL: each of ``fields`` (camelCase) is as it was (both unset, or both set and equal)."""
    return " && ".join(f"(has(self.{f}) == has(oldSelf.{f}) && (!has(self.{f}) || self.{f} == oldSelf.{f}))"
                       for f in fields)


# What a purchase fixed: every spec field but ``extensions`` (tests/unit/test_extensions.py checks the list).
PURCHASED_SPEC_FIELDS = ("instanceType", "instanceCount", "ultraServerType", "ultraServerCount", "targetResource",
                         "duration", "startTimeAfter", "endTimeBefore", "spareInstancesPerUltraServer", "offeringId",
                         "autoPurchase", "keepAlivePeriodSeconds", "instanceGroupSelector")


class TrainingPlanSpec(Model):
    instance_type: str | None = label_value_field(
        "Instance type (or implied by ultraServerType); becomes node.kubernetes.io/instance-type.",
        default=None)
    instance_count: Literal[1, 2, 4, 8, 16, 32, 64] | None = None
    ultra_server_type: Literal[*ULTRASERVER_TYPES] | None = None
    ultra_server_count: int | None = Field(default=None, ge=1)
    target_resource: Literal[*TARGET_RESOURCES]
    duration: str = Field(max_length=MAX_DURATION, json_schema_extra={"x-kubernetes-validations": [
        cel(f"self.matches('{DURATION_PATTERN}') && self.matches('[1-9]')",
            "duration must be a positive duration string such as 48h, 2d or 90m"),
    ]})
    start_time_after: Time | None = None
    end_time_before: Time | None = None
    spare_instances_per_ultra_server: int = Field(default=1, ge=0)
    offering_id: str = Field(default="", max_length=MAX_ID)
    auto_purchase: bool = False
    keep_alive_period_seconds: int | None = Field(
        default=None, ge=0, le=3600 * 24 * 7,
        description="training-job plans: how long a Kueue workload's nodes stay after it finishes or is "
                    "evicted, for the next workload to reuse (SageMaker managed warm pools); unset or 0: "
                    "released at once.")
    instance_group_selector: LabelSelector | None = Field(
        default=None,
        description="Which InstanceGroups may bind this plan, by their labels; unset: every group. A group "
                    "that does not match gets Bound=False (NotAllowed) and no nodes.")
    extensions: list[PlanExtension] = Field(
        default_factory=list, max_length=MAX_EXTENSIONS,
        description="Extensions of the plan's last block, oldest first: each names an extension offering the "
                    "operator listed for this plan; entries may be added, never changed or removed.",
        json_schema_extra={"x-kubernetes-validations": [
            cel("self.all(e, self.exists_one(f, f.offeringId == e.offeringId))",
                "each extension offering may be named once"),
            cel("self.size() >= oldSelf.size() && oldSelf.all(e, e in self)",
                "extensions may only be added: an extension bought cannot be taken back or changed"),
        ]})

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
        cel("!has(oldSelf.offeringId) || oldSelf.offeringId == '' || ("
            + _cel_unchanged_except(PURCHASED_SPEC_FIELDS) + " && (!has(oldSelf.extensions) || has(self.extensions)))",
            "spec is immutable once offeringId is set: a purchased plan cannot be modified, only extended "
            "(spec.extensions)"),
    ]})


class TrainingPlanStatus(Model):
    phase: Literal["Pending", "Scheduled", "Active", "Expired", "Failed"] | None = None
    offerings: list[Offering] = Field(default_factory=list, max_length=MAX_OFFERINGS)
    purchased_offering_id: Identifier | None = None
    reserved_capacity: list[ReservedCapacity] = Field(default_factory=list, max_length=MAX_RESERVED_CAPACITY)
    availability_zone: LabelValue | None = None
    total_instance_count: int = 0
    available_instance_count: int = 0
    in_use_instance_count: int = 0
    unhealthy_instance_count: int = 0
    available_spare_instance_count: int = 0
    total_ultra_server_count: int | None = None
    ultra_servers: list[UltraServerStatus] = Field(default_factory=list, max_length=MAX_FLEET_ENTRIES)
    next_transition_time: Time | None = None
    extension_offerings: list[ExtensionOffering] = Field(default_factory=list, max_length=MAX_OFFERINGS)
    extensions: list[ExtensionStatus] = Field(default_factory=list, max_length=MAX_EXTENSIONS)
    conditions: list[Condition] = Field(default_factory=list, max_length=MAX_CONDITIONS)
    observed_generation: int | None = None
    # A training-job plan's job nodes as the Kueue controller recorded them when it made them (name
    # and uid; a claim's digest while a create is under way), as an instance group records its
    # nodes: a node's labels prove nothing. Written only by the Kueue controller, over the
    # resourceVersion it read; the plan's own pass leaves it alone.
    job_nodes: list[GroupNode] | None = Field(default=None, max_length=MAX_FLEET_ENTRIES)


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
        "maxLength": MAX_INT_OR_PERCENT,
        "x-kubernetes-validations": [
            cel("type(self) == int ? self >= 0 : self.matches('^[0-9]+%$')",
                "maxUnhealthy must be a count (>= 0) or a percentage such as 20%"),
        ],
    })
    unhealthy_conditions: list[Annotated[str, Field(max_length=MAX_CONDITION_TYPE + len("=Unknown"))]] = Field(
        default_factory=lambda: ["AcceleratedHardwareReady=False", "GpuHealthy=False"],
        max_length=MAX_UNHEALTHY_CONDITIONS,
        description="Node conditions, as Type=Status, that make a node unhealthy after the grace.",
        json_schema_extra={"x-kubernetes-validations": [cel(
            f"self.all(c, c.matches('{UNHEALTHY_CONDITION_PATTERN}'))",
            "unhealthyConditions entries must be Type=True, Type=False or Type=Unknown, such as GpuHealthy=False",
            messageExpression=f"'unhealthy condition ' + self.filter(c, !c.matches('{UNHEALTHY_CONDITION_PATTERN}'))[0]"
                              " + ' is not Type=True, Type=False or Type=Unknown (a node condition type such as "
                              "GpuHealthy or example.com/GpuHealthy, then = and the status)'")]},
    )
    # The recovery ladder (planning.recovery): a failed node is rebooted first, at most
    # rebootBudget times within rebootWindowSeconds, and replaced when it fails again within the
    # window, or is not back Ready within rebootTimeoutSeconds. 0: replace at once, as before.
    reboot_budget: int = Field(default=1, ge=0, le=10, description=(
        "Reboots a failed node may get within rebootWindowSeconds before it is replaced (0: replace at once)."))
    reboot_window_seconds: int = Field(default=3600, ge=1, le=7 * 24 * 3600, description=(
        "The window of the reboot budget: a node that fails again within it after a reboot is replaced."))
    reboot_timeout_seconds: int = Field(default=600, ge=1, le=24 * 3600, description=(
        "How long a rebooted node has to come back Ready before it is replaced."))
    # The last rung (planning.recovery.plan_ultraserver_replacement): the group's nodes on an
    # UltraServer that can no longer hold them move to a free UltraServer of the block.
    replace_ultra_server_after_seconds: int | None = Field(default=None, ge=0, le=7 * 24 * 3600, description=(
        "Move the group's nodes off an UltraServer impaired for this long (a node of the group on it "
        "failed and has not recovered) to a free UltraServer of the block. Unset: only when its failed "
        "nodes outnumber its spares."))


class PlacementSpecification(Model):
    ultra_server_id: str = Field(min_length=1, max_length=MAX_LABEL_VALUE)  # an UltraServer id label value
    instance_count: int = Field(ge=1)


class PlacementSpec(Model):
    strategy: Literal["FillFirst"] = "FillFirst"
    placement_specifications: list[PlacementSpecification] = Field(default_factory=list, max_length=MAX_PLACEMENTS)


class InstanceGroupSpec(Model):
    training_plan_ref: str = Field(min_length=1, max_length=MAX_NAME)
    instance_type: str = label_value_field("Instance type of the group's nodes (the plan's type).")
    instance_count: int = Field(ge=0)
    node_provider: Literal["kwok", "static", "karpenter"] = Field(default="kwok", description=(
        "Where the group's nodes come from. kwok: Node objects the operator writes for KWOK. static: existing "
        "nodes of the free pool, lent while a block runs. karpenter: one Karpenter NodeClaim per slot, which "
        "Karpenter launches (docs/karpenter.md)."))
    labels: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_GROUP_LABELS,
        description="Labels the operator puts on the group's nodes (and removes when it hands them back).",
        json_schema_extra={
            "additionalProperties": {"type": "string", "maxLength": MAX_LABEL_VALUE},
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
    node_recovery: Literal["Automatic", "None"] = Field(default="Automatic", description=(
        "Automatic: failed nodes are rebooted, then replaced (healthCheck). None: faults are only labelled, "
        "tainted and reported; only manual actions (the UnschedulablePendingReboot or "
        "UnschedulablePendingReplacement health label) act."))
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    on_start_deep_health_checks: list[Literal[*DEEP_HEALTH_CHECKS]] = Field(
        default_factory=list, max_length=len(DEEP_HEALTH_CHECKS), description=(
            "HyperPod's OnStartDeepHealthChecks: the checks every new node and every node back from a reboot "
            "runs, as Jobs pinned to it, before it serves (tainted and labelled deep-health-check-status="
            "InProgress until then). InstanceStress: a stress of the node itself. InstanceConnectivity: the "
            "UltraServer's new nodes reach each other over the pod network. A node that fails is replaced."),
        json_schema_extra={"x-kubernetes-list-type": "set"})

    @field_validator("on_start_deep_health_checks")
    @classmethod
    def _checks_once(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("each deep health check may be listed once")
        return value

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        # A static group adopts nodes that already run pods: a NoExecute taint would evict them at
        # once, without regard to their PodDisruptionBudgets (a drain honours them; a taint does not).
        cel("!has(self.nodeProvider) || self.nodeProvider != 'static' || !has(self.taints) || self.taints.all(t, t.effect != 'NoExecute')",
            "a static group may not set NoExecute taints: adopting a node would evict the pods already on "
            "it without regard to their PodDisruptionBudgets (use NoSchedule)", fieldPath=".taints"),
    ]})


MAX_VANISHED_LABELS = 16  # planning.memory.VANISHED_KEYS and the four topology keys, with room


class VanishedRecord(Model):
    """A recorded node found gone from under the group (deleted, not by the operator): when, and
    what planning reads of its last labels (``planning.memory.vanished_labels``: its block, slot,
    generation, role, health and topology). Kept in the node's record entry until its slot holds
    a replacement, so that a restarted operator counts the grace from ``since`` and replaces it
    once; only an entry the record holds by name and uid can carry it."""

    since: Time
    labels: dict[str, LabelValue] = Field(default_factory=dict, max_length=MAX_VANISHED_LABELS)


MAX_RECORDED_LABELS = 256  # the group's labels, the topology keys and the operator's own, with room


class RecordedTaint(Model):
    """A taint a lent node had before adoption (its key is one the group manages)."""

    key: str = Field(max_length=317)
    value: str = Field(default="", max_length=MAX_LABEL_VALUE)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class LentState(Model):
    """What a lent (static) node looked like before the group set its keys: for each label key the
    group set, the value it had (``absentLabels``: the keys it did not have), and the taints of the
    taint keys the group manages. The hand-back restores from this, never from the node."""

    labels: dict[str, LabelValue] = Field(default_factory=dict, max_length=MAX_RECORDED_LABELS)
    absent_labels: list[Annotated[str, Field(max_length=317)]] = Field(default_factory=list,
                                                                       max_length=MAX_RECORDED_LABELS)
    taint_keys: list[Annotated[str, Field(max_length=317)]] = Field(default_factory=list,
                                                                    max_length=MAX_GROUP_TAINTS + 8)
    taints: list[RecordedTaint] = Field(default_factory=list, max_length=MAX_GROUP_TAINTS + 8)


class GroupNode(Model):
    """A node the group holds, as the operator recorded it when it created or adopted the node:
    the Node's name and uid (the proof of ownership: a label on a node proves nothing), the id
    planning gave it (the Node's name on KWOK), and for a lent static node what it looked like
    before and whether the operator cordoned it."""

    name: Name
    uid: str = Field(max_length=MAX_UID)
    node_id: Name
    lent: LentState | None = None
    cordoned: bool = False
    # Set while the create or adoption is under way: the SHA-256 (hex) of the nonce written on the
    # node (hyperplan.dev/claim); uid is "" until the API server has answered.
    claim: str | None = Field(default=None, min_length=64, max_length=64, pattern="^[0-9a-f]{64}$")
    recovery: NodeRecovery | None = None
    # karpenter: the NodeClaim made for the slot (name and uid, as the API server answered). Until
    # its Node registers, name is the node id and uid "": no Node is held yet.
    node_claim: NodeClaimRef | None = None
    # The node is gone from under the group and its slot not replaced yet (see VanishedRecord).
    vanished: VanishedRecord | None = None
    # The node's deep health checks of its latest start (planning.deepchecks): from this record and
    # the check Jobs, never from the node's labels.
    deep_health_check: DeepHealthCheck | None = None


class DeepHealthCheck(Model):
    """A node's deep health checks since it started (it was made, or came back from a reboot):
    which ran, how they stand, and the InstanceConnectivity run it shares with the other new nodes
    of its UltraServer (the name of that run's Service; every node of the run has it)."""

    status: Literal[CHECK_IN_PROGRESS, CHECK_PASSED, CHECK_FAILED]
    since: Time  # the start the checks answer
    checks: list[Literal[*DEEP_HEALTH_CHECKS]] = Field(default_factory=list, max_length=len(DEEP_HEALTH_CHECKS))
    started: Time | None = None  # when its Jobs were first made (None: not yet)
    cohort: str | None = Field(default=None, max_length=63)
    finished: Time | None = None


class NodeClaimRef(Model):
    """A Karpenter NodeClaim the operator made, by name and uid."""

    name: Name
    uid: str = Field(min_length=1, max_length=MAX_UID)


class FaultClock(Model):
    """When a fault (a node condition type in a bad status) was first seen, and when it last
    cleared (None: it stands)."""

    condition: str = Field(min_length=1, max_length=MAX_CONDITION_TYPE)
    since: Time
    cleared: Time | None = None


class NodeRecovery(Model):
    """The operator's own clocks of a node's faults and reboots (planning.recovery): kept in the
    group's record, not on the node, so that neither the node nor a condition's
    lastTransitionTime can reset them, and a restart of the operator keeps them."""

    reboots: list[Time] = Field(default_factory=list, max_length=16)  # starts, within the budget's window
    rebooting_since: Time | None = None  # a reboot under way, started then
    requested: bool = False  # the reboot under way was asked for (a health label), not the ladder's
    faults: list[FaultClock] = Field(default_factory=list, max_length=MAX_UNHEALTHY_CONDITIONS + 1)
    # The first sight of the fault the recovery under way answers, from the ladder's first action
    # until the node serves again or is removed: the time to recover counts from it.
    fault_since: Time | None = None


GroupNode.model_rebuild()


class UltraServerReplacement(Model):
    """The group's nodes on UltraServer ``failed`` of block ``reservedCapacityId`` moved to the free
    UltraServer ``replacement`` at ``since`` (planning.recovery.plan_ultraserver_replacement): its
    checkpoint signal went out then, its drain followed. Every group of the plan places on the block
    as if ``replacement`` were ``failed``."""

    reserved_capacity_id: Identifier
    failed: LabelValue
    replacement: LabelValue
    since: Time
    reason: str = Field(default="", max_length=MAX_REASON)


class UltraServerWanted(Model):
    """UltraServer ``failed`` of block ``reservedCapacityId`` can no longer hold the group's nodes and
    the block has no free UltraServer for them, since ``since``: the plan may buy one from its pool
    for the rest of the block (it checks this against its own view of the nodes first)."""

    reserved_capacity_id: Identifier
    failed: LabelValue
    since: Time


MAX_ULTRASERVER_REPLACEMENTS = 64


class InstanceGroupStatus(Model):
    phase: Literal["Waiting", "Provisioning", "Ready", "Draining", "Failed"] | None = None
    availability_zone: LabelValue | None = None
    reserved_capacity_id: Identifier | None = None
    desired_count: int = 0
    ready_count: int = 0
    spare_count: int = 0
    unhealthy_count: int = 0
    next_transition_time: Time | None = None
    conditions: list[Condition] = Field(default_factory=list, max_length=MAX_CONDITIONS)
    observed_generation: int | None = None
    # The nodes the group holds (None: never written, a group from before the record existed; see
    # planning.ownership for what its first pass records).
    nodes: list[GroupNode] | None = Field(default=None, max_length=MAX_FLEET_ENTRIES)
    # The UltraServers of the current block the group's nodes moved off, and where to.
    ultra_server_replacements: list[UltraServerReplacement] = Field(
        default_factory=list, max_length=MAX_ULTRASERVER_REPLACEMENTS)
    # The UltraServers the group's nodes must leave for which the block has no free one (yet).
    # (A list, never None: the status is merge-patched, and an absent key would not clear it.)
    ultra_servers_wanted: list[UltraServerWanted] = Field(default_factory=list, max_length=MAX_ULTRASERVER_REPLACEMENTS)


class InstanceGroup(Model):
    api_version: str = API_VERSION
    kind: str = "InstanceGroup"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: InstanceGroupSpec
    status: InstanceGroupStatus = Field(default_factory=InstanceGroupStatus)


TrainingPlanStatus.model_rebuild()  # job_nodes names GroupNode, defined after it
TrainingPlan.model_rebuild()
