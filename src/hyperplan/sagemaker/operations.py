"""The SageMaker operations, each mapped onto hyperplan's objects (docs/sagemaker-api.md).

A training plan is a TrainingPlan of the same name; its reserved capacities are the blocks in its
``status.reservedCapacity``; its UltraServers are ``status.ultraServers``. Every read comes from
the operator's watch cache (:class:`Fleet`, the read side that passes use), never from the API
server. ARNs are made from the account id of the settings and the region the request was signed
for, so a client that signs for ``us-west-2`` sees ``arn:aws:sagemaker:us-west-2:...``.

Each operation is a function of the request body and a :class:`Context`; it returns the response
body or raises :class:`~hyperplan.sagemaker.wire.ApiError`.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from hyperplan.api.models import (
    API_VERSION,
    MAX_EXTENSIONS,
    ExtensionStatus,
    ReservedCapacity,
    TrainingPlan,
    TrainingPlanSpec,
)
from hyperplan.api.vocabulary import ANNOTATION_CREATED_BY, ANNOTATION_SAGEMAKER_TAGS, to_rfc3339
from hyperplan.planning.blocks import Block
from hyperplan.planning.offerings import (
    Extension,
    Offering,
    PoolSnapshot,
    find_extension,
    find_offering,
    search_extensions,
    search_offerings,
    validate_request,
)
from hyperplan.planning.placement import ultraservers_for_block
from hyperplan.planning.plans import request_of
from hyperplan.planning.policy import DEMO, Policy, format_duration, parse_duration
from hyperplan.planning.tenancy import pools_for_plan
from hyperplan.sagemaker import hyperpod
from hyperplan.sagemaker.access import Writes
from hyperplan.sagemaker.assumed import AssumedPurchases
from hyperplan.sagemaker.wire import (
    ApiError,
    Ordered,
    bounded,
    compact,
    epoch,
    invalid,
    matching,
    not_found,
    one_of,
    ordered,
    page,
    query_digest,
    required,
    time_of,
)

PLAN_NAME = r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,63}"
PLAN_NAME_OR_ARN = r"(arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:training-plan/)?" + PLAN_NAME
TRAINING_PLAN_ARN = r"arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:training-plan/.*"
RESERVED_CAPACITY_ARN = r"arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:reserved-capacity/.*"
STATUSES = ("Pending", "Active", "Scheduled", "Expired", "Failed")
HEALTH = {"ok": "OK", "impaired": "Impaired", "insufficient-data": "Insufficient-Data"}
TARGET_RESOURCES = ("training-job", "hyperpod-cluster", "endpoint", "studio-apps")
# The Tags of CreateTrainingPlan, kept on the plan it creates as JSON (docs/sagemaker-api.md,
# "Tags"): ``[{"Key": ..., "Value": ...}, ...]`` in the order given.
MAX_TAGS, MAX_TAG_KEY, MAX_TAG_VALUE = 50, 128, 256  # the model's TagList, TagKey and TagValue
TAG_PATTERN = r"([\p{L}\p{Z}\p{N}_.:/=+\-@]*)"  # the model's, as its messages quote it


class Fleet(Protocol):
    """What the operations read: the operator's watch cache (``runtime.store.WatchCache``)."""

    def plan(self, name: str) -> dict[str, Any] | None: ...

    def plan_entries(self) -> list[tuple[str, Any]]: ...

    def pool_snapshots(self) -> list[PoolSnapshot]: ...

    def groups(self) -> list[dict[str, Any]]: ...

    def group_nodes(self, group_label: str) -> list[dict[str, Any]]: ...

    def blocks_of(self, plan_uid: str) -> list[Block]:
        """The plan's blocks as the capacity ledger holds them (never its status)."""
        ...


@dataclass(frozen=True)
class Context:
    """One request's surroundings: the fleet to read, the account and region of its ARNs, this
    cluster's HyperPod name, the caller's Kubernetes identity and where its writes go."""

    fleet: Fleet
    account: str
    region: str
    now: datetime
    cluster_name: str = "hyperplan"
    user: str = ""
    writes: Writes | None = None
    views: "PlanViews | None" = None
    policy: Policy = DEMO
    # Set when the caller may see only the plans it made (a key that may create plans but not get
    # or list them: sagemaker.access.check_rights): its user name, which those plans carry in
    # ANNOTATION_CREATED_BY. None: every plan its rights let it read.
    owner: str | None = None
    # What CreateTrainingPlan sold that the cache does not show bought yet (sagemaker.assumed):
    # counted as busy in searches and creates. None: nothing is assumed (each call on its own).
    assumed: AssumedPurchases | None = None
    # The EKS cluster this cluster is, as DescribeCluster's Orchestrator.Eks.ClusterArn (the
    # setting eks_cluster_arn); None: no Orchestrator is answered.
    eks_cluster_arn: str | None = None

    @property
    def partition(self) -> str:
        return partition_of(self.region)

    def arn(self, kind: str, name: str) -> str:
        return f"arn:{self.partition}:sagemaker:{self.region}:{self.account}:{kind}/{name}"

    def local(self, arn: str, kind: str) -> str | None:
        """The name ``arn`` gives a resource of ``kind`` when it is an ARN this server hands out to
        the caller (this partition, the region the request was signed for, this account); None
        for any other ARN (another account's, region's or partition's names nothing here)."""
        parts = arn.split(":", 5)
        if len(parts) != 6 or parts[0] != "arn" or parts[2] != "sagemaker" or \
                (parts[1], parts[3], parts[4]) != (self.partition, self.region, self.account):
            return None
        found, slash, name = parts[5].partition("/")
        return name if slash and found == kind and name else None

    def sees(self, obj: Mapping[str, Any] | None) -> bool:
        """Whether the caller may see the plan ``obj`` (a plan another user made is, to a caller
        that may see only its own, as if it did not exist: ``ResourceNotFound``)."""
        return obj is not None and (self.owner is None or created_by(obj) == self.owner)

    def plan(self, name: str) -> dict[str, Any] | None:
        """The plan ``name`` from the fleet, if the caller may see it (:meth:`sees`)."""
        obj = self.fleet.plan(name)
        return obj if self.sees(obj) else None


PARTITIONS = (("cn-", "aws-cn"), ("us-gov-", "aws-us-gov"), ("us-isob-", "aws-iso-b"), ("us-isof-", "aws-iso-f"),
              ("us-iso-", "aws-iso"), ("eu-isoe-", "aws-iso-e"))


def partition_of(region: str) -> str:
    """The AWS partition of ``region`` (``aws`` but for China, GovCloud and the isolated regions)."""
    return next((partition for prefix, partition in PARTITIONS if region.startswith(prefix)), "aws")


def created_by(obj: Mapping[str, Any]) -> str | None:
    """The user whose key made the plan through this API (:data:`ANNOTATION_CREATED_BY`)."""
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_CREATED_BY)


Operation = Callable[[Mapping[str, Any], Context], dict[str, Any]]


# --------------------------------------------------------------------------- reading plans


def _plan_model(obj: Mapping[str, Any]) -> TrainingPlan | None:
    try:
        return TrainingPlan.model_validate(obj)
    except ValidationError:
        return None  # a plan the operator reports as invalid on the object itself; not served




def _duration(start: datetime | None, end: datetime | None) -> tuple[int | None, int | None]:
    if start is None or end is None:
        return None, None
    minutes = max(0, int((end - start).total_seconds() // 60))
    return minutes // 60, minutes % 60


def _status_message(plan: TrainingPlan) -> str | None:
    for condition in plan.status.conditions:
        if condition.status == "False" and condition.message:
            return condition.message[:1024]
    return None


def reserved_capacity_summary(block: ReservedCapacity, plan: TrainingPlan, ctx: Context) -> dict[str, Any]:
    hours, minutes = _duration(block.start_time, block.end_time)
    ultra = block.ultra_server_type is not None
    return compact({
        "ReservedCapacityArn": ctx.arn("reserved-capacity", block.id),
        "ReservedCapacityType": "UltraServer" if ultra else "Instance",
        "UltraServerType": block.ultra_server_type, "UltraServerCount": block.ultra_server_count,
        "InstanceType": block.instance_type, "TotalInstanceCount": block.instance_count,
        "Status": block.status, "AvailabilityZone": block.availability_zone,
        "DurationHours": hours, "DurationMinutes": minutes,
        "StartTime": epoch(block.start_time), "EndTime": epoch(block.end_time),
    })


def plan_summary(plan: TrainingPlan, ctx: Context, *, detail: bool) -> dict[str, Any]:
    """A plan as DescribeTrainingPlan (``detail``) or a ListTrainingPlans summary shows it."""
    blocks = sorted(plan.status.reserved_capacity, key=lambda b: b.start_time)
    start = blocks[0].start_time if blocks else None
    end = blocks[-1].end_time if blocks else None
    hours, minutes = _duration(start, end)
    status = plan.status
    fields = {
        "TrainingPlanArn": ctx.arn("training-plan", plan.metadata["name"]),
        "TrainingPlanName": plan.metadata["name"],
        "Status": status.phase or "Pending",
        "StatusMessage": _status_message(plan),
        "DurationHours": hours, "DurationMinutes": minutes,
        "StartTime": epoch(start), "EndTime": epoch(end),
        "TotalInstanceCount": status.total_instance_count,
        "AvailableInstanceCount": status.available_instance_count,
        "InUseInstanceCount": status.in_use_instance_count,
        "TotalUltraServerCount": status.total_ultra_server_count,
        "TargetResources": [plan.spec.target_resource],
        "ReservedCapacitySummaries": [reserved_capacity_summary(b, plan, ctx) for b in blocks[-5:]],
    }
    if detail:
        fields["UnhealthyInstanceCount"] = status.unhealthy_instance_count
        fields["AvailableSpareInstanceCount"] = status.available_spare_instance_count
    return compact(fields)


def _plan_named(body: Mapping[str, Any], ctx: Context) -> TrainingPlan:
    given = matching(body, "TrainingPlanName", PLAN_NAME_OR_ARN) or required(body, "TrainingPlanName")
    name = ctx.local(given, "training-plan") if given.startswith("arn:") else given
    if name is None:
        raise not_found(f"Training plan {given} not found.")
    obj = ctx.plan(name)
    plan = _plan_model(obj) if obj is not None else None
    if plan is None:
        raise not_found(f"Training plan {name} not found.")
    return plan


def describe_training_plan(body: Mapping[str, Any], ctx: Context) -> dict[str, Any]:
    return plan_summary(_plan_named(body, ctx), ctx, detail=True)


@dataclass(frozen=True)
class PlanView:
    """What the listings read of one version of a plan: its summary (ListTrainingPlans' shape)
    and the ids of its blocks (to find the plan of a reserved capacity)."""

    summary: dict[str, Any]
    block_ids: tuple[str, ...]
    owner: str | None = None  # who made it through this API (created_by)


class PlanViews:
    """Each plan's :class:`PlanView`, kept per version of the plan (the watch cache's packed copy
    is the key) and per region (the ARNs name it): a listing of 10,000 plans unpacks and
    validates only the plans that changed since the last one, not all of them on every page.
    Each listing keeps only the versions it saw, so a changed or deleted plan's view goes with
    the next listing. Used on the event loop only (the read operations run there)."""

    def __init__(self) -> None:
        self._held: dict[tuple[Any, str], PlanView | None] = {}
        self._last: tuple[Any, str, list[PlanView]] | None = None
        self._orders: dict[str, Ordered] = {}
        self._orders_of: tuple[Any, str] | None = None

    def views(self, ctx: "Context") -> list[PlanView]:
        """Every plan's view. A fleet that counts its plans' changes (``plans_version``: the watch
        cache) gets the last walk's views while nothing changed: the pages of one listing of
        3,000 plans would otherwise walk all of them 30 times (docs/benchmarks.md, remote
        purchases)."""
        version = getattr(ctx.fleet, "plans_version", None)
        if version is not None and self._last is not None and self._last[:2] == (version, ctx.region):
            return self._last[2]
        out = self._walk(ctx)
        if version is not None:
            self._last = (version, ctx.region, out)
        return out

    def ordered(self, ctx: "Context", query: str, make: Callable[[], Ordered]) -> Ordered:
        """The listing ``query`` (its digest: filters, bounds and sort) in order, made once per
        change of the plans (``plans_version``) and kept for the next pages: each page of a
        listing of 10,000 plans is then a bisection, where sorting them all took 70 ms a page
        (docs/benchmarks.md, "The SageMaker API's reads"). Without a version, made every time."""
        version = getattr(ctx.fleet, "plans_version", None)
        if version is None:
            return make()
        if self._orders_of != (version, ctx.region) or len(self._orders) >= 64:
            self._orders, self._orders_of = {}, (version, ctx.region)
        found = self._orders.get(query)
        if found is None:
            found = self._orders[query] = make()
        return found

    def _walk(self, ctx: "Context") -> list[PlanView]:
        held, kept, out = self._held, {}, []
        for name, entry in ctx.fleet.plan_entries():
            version = (name, (entry.get("metadata") or {}).get("resourceVersion")) if isinstance(entry, dict) else entry
            key = (version, ctx.region)
            view = held[key] if key in held else self._view(entry, ctx)
            kept[key] = view
            if view is not None:
                out.append(view)
        self._held = kept
        return out

    @staticmethod
    def _view(entry: Any, ctx: "Context") -> PlanView | None:
        raw = entry if isinstance(entry, dict) else entry.unpack()
        plan = _plan_model(raw)
        if plan is None:
            return None
        return PlanView(plan_summary(plan, ctx, detail=False), tuple(b.id for b in plan.status.reserved_capacity),
                        created_by(raw))


def _views(ctx: "Context") -> list[PlanView]:
    """The views of the plans the caller may see (its own only, with ``ctx.owner``)."""
    views = (ctx.views or PlanViews()).views(ctx)
    return views if ctx.owner is None else [v for v in views if v.owner == ctx.owner]


SORT_KEYS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "TrainingPlanName": lambda s: [s["TrainingPlanName"]],
    "StartTime": lambda s: [s.get("StartTime") or 0.0, s["TrainingPlanName"]],
    "Status": lambda s: [s["Status"], s["TrainingPlanName"]],
}


def list_training_plans(body: Mapping[str, Any], ctx: Context) -> dict[str, Any]:
    """ListTrainingPlans: filters (``Status``), start-time bounds, sort and paging (at most 100 a
    page). The default order is the newest start first, as on AWS (``StartTime``, descending)."""
    sort_by = one_of(body, "SortBy", tuple(SORT_KEYS)) or "StartTime"
    order = one_of(body, "SortOrder", ("Ascending", "Descending")) or ("Descending" if sort_by == "StartTime"
                                                                        else "Ascending")
    after, before = time_of(body, "StartTimeAfter"), time_of(body, "StartTimeBefore")
    filters = body.get("Filters") or []
    if not isinstance(filters, list) or len(filters) > 5:
        raise invalid("Filters must be a list of at most 5 filters")
    wanted: set[str] = set()
    for f in filters:
        if not isinstance(f, dict) or f.get("Name") != "Status":
            raise invalid("the only filter name is Status")
        one_of(f, "Value", STATUSES)
        wanted.add(f["Value"])

    def make() -> Ordered:
        summaries = []
        for view in _views(ctx):
            summary = view.summary
            if wanted and summary["Status"] not in wanted:
                continue
            start = summary.get("StartTime")
            if after is not None and (start is None or start <= after.timestamp()):
                continue
            if before is not None and (start is None or start >= before.timestamp()):
                continue
            summaries.append((SORT_KEYS[sort_by](summary), summary))
        return ordered(summaries)

    # One caller's own plans are never another's listing: the kept order is per owner too.
    query = query_digest(body) + (f"|{ctx.owner}" if ctx.owner is not None else "")
    listing = ctx.views.ordered(ctx, query, make) if ctx.views is not None else make()
    shown, token = page(listing, body, descending=order == "Descending")
    return compact({"TrainingPlanSummaries": shown, "NextToken": token})


# --------------------------------------------------------------------------- reserved capacity


def _reserved_capacity(body: Mapping[str, Any], ctx: Context) -> tuple[ReservedCapacity, TrainingPlan]:
    arn = matching(body, "ReservedCapacityArn", RESERVED_CAPACITY_ARN, low=50) or required(body, "ReservedCapacityArn")
    block_id = ctx.local(arn, "reserved-capacity")
    if block_id is None:
        raise not_found(f"Reserved capacity {arn} not found.")
    for view in _views(ctx):
        if block_id in view.block_ids:
            obj = ctx.plan(view.summary["TrainingPlanName"])
            plan = _plan_model(obj) if obj is not None else None
            for block in plan.status.reserved_capacity if plan is not None else ():
                if block.id == block_id:
                    return block, plan
    raise not_found(f"Reserved capacity {arn} not found.")


def describe_reserved_capacity(body: Mapping[str, Any], ctx: Context) -> dict[str, Any]:
    block, plan = _reserved_capacity(body, ctx)
    summary = reserved_capacity_summary(block, plan, ctx)
    current = block.status == "Active"
    status = plan.status
    out = {k: summary.get(k) for k in ("ReservedCapacityArn", "ReservedCapacityType", "Status", "AvailabilityZone",
                                       "DurationHours", "DurationMinutes", "StartTime", "EndTime", "InstanceType",
                                       "TotalInstanceCount")}
    out["AvailableInstanceCount"] = status.available_instance_count if current else None
    out["InUseInstanceCount"] = status.in_use_instance_count if current else None
    if block.ultra_server_type is not None:
        out["UltraServerSummary"] = compact({
            "UltraServerType": block.ultra_server_type, "InstanceType": block.instance_type,
            "UltraServerCount": block.ultra_server_count,
            "AvailableSpareInstanceCount": status.available_spare_instance_count if current else None,
            "UnhealthyInstanceCount": status.unhealthy_instance_count if current else None})
    return compact(out)


def _bought_ultra_servers(block: ReservedCapacity, plan: TrainingPlan) -> list[dict[str, Any]]:
    """The UltraServers a scheduled block holds, as its purchase made them (``<block id>-us-<n>``,
    the ids its nodes will carry): their size and the spares the plan asks for; their health is
    not known before they run (``Insufficient-Data``)."""
    try:
        servers = ultraservers_for_block(block.id, block.ultra_server_type, block.instance_count,
                                         plan.spec.spare_instances_per_ultra_server)
    except ValueError:
        return []
    return [{"UltraServerId": u.id, "UltraServerType": block.ultra_server_type or "",
             "AvailabilityZone": block.availability_zone, "InstanceType": block.instance_type,
             "TotalInstanceCount": u.instance_count, "ConfiguredSpareInstanceCount": u.spare_count,
             "HealthStatus": "Insufficient-Data"} for u in servers]


def list_ultra_servers_by_reserved_capacity(body: Mapping[str, Any], ctx: Context) -> dict[str, Any]:
    """The UltraServers of a reserved capacity, with their health (``OK``, ``Impaired``,
    ``Insufficient-Data``), from the plan's ``status.ultraServers`` while the block runs (the plan
    counts the nodes of its current block); a block bought and not running yet lists the
    UltraServers its purchase holds (:func:`_bought_ultra_servers`), so a user plans jobs on them
    before it starts; an expired or failed block lists none."""
    block, plan = _reserved_capacity(body, ctx)
    if block.status == "Scheduled":
        shown, token = page([([u["UltraServerId"]], u) for u in _bought_ultra_servers(block, plan)], body)
        return compact({"UltraServers": shown, "NextToken": token})
    servers = plan.status.ultra_servers if block.status == "Active" else []
    items = [([u.id], compact({
        "UltraServerId": u.id, "UltraServerType": block.ultra_server_type or "",
        "AvailabilityZone": u.availability_zone, "InstanceType": block.instance_type,
        "TotalInstanceCount": u.total_instance_count, "ConfiguredSpareInstanceCount": u.configured_spare_instance_count,
        "AvailableInstanceCount": u.available_instance_count, "InUseInstanceCount": u.in_use_instance_count,
        "AvailableSpareInstanceCount": u.available_spare_instance_count,
        "UnhealthyInstanceCount": u.unhealthy_instance_count, "HealthStatus": HEALTH[u.health_status]}))
        for u in servers]
    shown, token = page(items, body)
    return compact({"UltraServers": shown, "NextToken": token})


# --------------------------------------------------------------------------- buying


def _b32(data: bytes) -> str:
    return base64.b32encode(data).decode().rstrip("=").lower()


def _unb32(text: str) -> bytes:
    return base64.b32decode(text.upper() + "=" * (-len(text) % 8))


_TARGETS = {"training-job": "j", "hyperpod-cluster": "h"}


def api_offering_id(offering: Offering, spec: TrainingPlanSpec) -> str:
    """The ``TrainingPlanOfferingId`` of an offering: hyperplan's own id (its first block's start
    and the digest of its blocks and the spec), then the spec it was cut for in base 32 (the
    model's pattern is ``[a-z0-9-]+``, at most 256 characters). CreateTrainingPlan makes a
    TrainingPlan of exactly that spec with ``offeringId`` set to hyperplan's id; the operator then
    searches again from the spec and buys only what that search cuts under the id (docs/security.md,
    "status is output"), so an id a client made up can buy nothing that a kubectl user with the
    same rights could not ask for."""
    def epoch_of(moment: datetime | None) -> str:
        return "" if moment is None else str(int(moment.timestamp()))
    fields = [spec.instance_type or "", str(spec.instance_count or ""), spec.ultra_server_type or "",
              str(spec.ultra_server_count or ""), _TARGETS[spec.target_resource], spec.duration,
              epoch_of(spec.start_time_after), epoch_of(spec.end_time_before)]
    return f"{offering.id}-{_b32('|'.join(fields).encode())}"


def _spec_of_offering_id(value: str) -> tuple[str, dict[str, Any]] | None:
    """hyperplan's offering id and the spec an API offering id carries (None: not one of ours)."""
    parts = value.split("-")
    if len(parts) != 4:
        return None
    try:
        fields = _unb32(parts[3]).decode().split("|")
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    if len(fields) != 8:
        return None
    itype, count, ultra, ultra_count, target, duration, after, before = fields
    targets = {code: name for name, code in _TARGETS.items()}
    try:
        spec: dict[str, Any] = {"targetResource": targets[target], "duration": duration}
        if ultra:
            spec.update(ultraServerType=ultra, ultraServerCount=int(ultra_count))
        else:
            spec.update(instanceType=itype, instanceCount=int(count))
        for field, text in (("startTimeAfter", after), ("endTimeBefore", before)):
            if text:
                spec[field] = to_rfc3339(datetime.fromtimestamp(int(text), tz=timezone.utc))
    except (KeyError, ValueError, OverflowError, OSError):
        return None
    return "-".join(parts[:3]), spec


def _requested_spec(body: Mapping[str, Any], ctx: "Context") -> TrainingPlanSpec:
    """The TrainingPlan spec a search asks for. The API counts hours; the policy counts days (a
    demo day is a minute), so hours are read in the policy's days: 24 hours are one of its days."""
    targets = body.get("TargetResources") or ["hyperpod-cluster"]
    if not isinstance(targets, list) or len(targets) != 1 or targets[0] not in TARGET_RESOURCES:
        raise invalid("TargetResources must name one of training-job, hyperpod-cluster")
    if targets[0] not in ("training-job", "hyperpod-cluster"):
        raise invalid(f"TargetResources {targets[0]} is not served by hyperplan (training-job, hyperpod-cluster)")
    hours = bounded(body, "DurationHours", 1, 87600)
    if hours is None:
        raise invalid("DurationHours is required")
    policy = ctx.policy
    if hours % 24:
        raise invalid(f"DurationNotWholeDays: DurationHours {hours} is not a whole number of days (a multiple of 24)")
    if not policy.min_duration_days <= hours // 24 <= policy.max_duration_days:
        raise invalid(f"DurationOutOfRange: DurationHours {hours} is outside {policy.min_duration_days * 24} to "
                      f"{policy.max_duration_days * 24} ({policy.min_duration_days} to {policy.max_duration_days} "
                      "days)")
    duration = ctx.policy.day * hours / 24
    spec: dict[str, Any] = {"targetResource": targets[0], "duration": format_duration(duration)}
    ultra = body.get("UltraServerType")
    if ultra is not None:
        spec.update(ultraServerType=ultra, ultraServerCount=bounded(body, "UltraServerCount", 1, 256) or 1)
    else:
        spec.update(instanceType=matching(body, "InstanceType", r"[a-z0-9.\-]+", high=63)
                    or required(body, "InstanceType"),
                    instanceCount=bounded(body, "InstanceCount", 1, 256) or required(body, "InstanceCount"))
    for member, field in (("StartTimeAfter", "startTimeAfter"), ("EndTimeBefore", "endTimeBefore")):
        moment = time_of(body, member)
        if moment is not None:
            spec[field] = to_rfc3339(moment.replace(microsecond=0))
    try:
        return TrainingPlanSpec.model_validate(spec)
    except ValidationError as e:
        raise invalid("; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())[:900]) \
            from None


def _offering_shape(offering: Offering, spec: TrainingPlanSpec) -> dict[str, Any]:
    hours, minutes = _duration(offering.start, offering.end)
    blocks = []
    for b in offering.blocks:
        h, m = _duration(b.start, b.end)
        blocks.append(compact({
            "ReservedCapacityType": "UltraServer" if b.ultra_server_type else "Instance",
            "UltraServerType": b.ultra_server_type, "UltraServerCount": b.ultra_server_count,
            "InstanceType": b.instance_type, "InstanceCount": b.instance_count,
            "AvailabilityZone": b.availability_zone, "DurationHours": h, "DurationMinutes": m,
            "StartTime": epoch(b.start), "EndTime": epoch(b.end)}))
    return compact({"TrainingPlanOfferingId": api_offering_id(offering, spec),
                    "TargetResources": [spec.target_resource],
                    "RequestedStartTimeAfter": epoch(spec.start_time_after),
                    "RequestedEndTimeBefore": epoch(spec.end_time_before),
                    "DurationHours": hours, "DurationMinutes": minutes, "ReservedCapacityOfferings": blocks[:5]})


def _pools(ctx: "Context") -> list:
    """The pools a plan made through the API may buy from (it carries no labels), with what the
    API sold a moment ago counted as busy (:mod:`hyperplan.sagemaker.assumed`)."""
    if ctx.assumed is None:
        return pools_for_plan(ctx.fleet.pool_snapshots(), {})
    # Forgotten first, then the pools read: a line the ledger gains in between is counted twice
    # for one search (it looks taken), never not at all.
    ctx.assumed.forget_settled(ctx.fleet.plan, ctx.fleet.blocks_of)
    return pools_for_plan(ctx.assumed.apply(ctx.fleet.pool_snapshots()), {})


def search_training_plan_offerings(body: Mapping[str, Any], ctx: "Context") -> dict[str, Any]:
    """The offering search of a TrainingPlan with the spec the request describes, over the pools
    of the watch cache (at most 3, best first). A request outside the policy's rules (its
    duration, count, lead and how far ahead it may start) is a ValidationException naming the
    rule it breaks, never an empty list: the list is empty only when capacity is short."""
    if body.get("TrainingPlanArn") is not None:
        return _search_extensions(body, ctx)
    spec = _requested_spec(body, ctx)
    request = request_of(spec, parse_duration(spec.duration))
    broken = validate_request(request, ctx.policy, ctx.now)
    if broken:  # outside the policy's rules: no search could offer anything, and the caller is told why
        raise invalid("; ".join(f"{v.reason}: {v.message}" for v in broken)[:1000])
    found = search_offerings(request, _pools(ctx), ctx.policy, ctx.now)
    return {"TrainingPlanOfferings": [_offering_shape(o, spec) for o in found]}


def _a_retry(existing: Mapping[str, Any], offering_id: str, ctx: "Context") -> bool:
    """Whether the plan of the name asked for is this caller's earlier call: the same offering,
    made by the same user (another user's plan of that name is ``ResourceInUse``, even for the
    same offering: it is not the caller's to be answered with)."""
    return (existing.get("spec") or {}).get("offeringId") == offering_id and created_by(existing) == ctx.user


def create_training_plan(body: Mapping[str, Any], ctx: "Context") -> dict[str, Any]:
    """A TrainingPlan of the offering's spec, with ``offeringId`` set, created as the caller,
    with the request's ``Tags`` in the annotation :data:`ANNOTATION_SAGEMAKER_TAGS`. Safe to retry (boto3
    retries by itself and the call has no client token): the same name with the same offering
    answers the same ARN (and keeps the tags the first call wrote); a name taken otherwise is
    ``ResourceInUse``."""
    name = matching(body, "TrainingPlanName", PLAN_NAME, high=64) or required(body, "TrainingPlanName")
    offering_arg = matching(body, "TrainingPlanOfferingId", r"[a-z0-9\-]+", high=256) \
        or required(body, "TrainingPlanOfferingId")
    decoded = _spec_of_offering_id(offering_arg)
    if decoded is None:
        raise not_found(f"Training plan offering {offering_arg} not found.")
    offering_id, wire = decoded
    try:
        spec = TrainingPlanSpec.model_validate(wire)
    except ValidationError:
        raise not_found(f"Training plan offering {offering_arg} not found.") from None
    spares = bounded(body, "SpareInstanceCountPerUltraServer", 0, 17)
    tags = tags_of(body)
    if spares is not None:
        wire = {**wire, "spareInstancesPerUltraServer": spares}
    wire = {**wire, "offeringId": offering_id}
    arn = ctx.arn("training-plan", name)
    existing = ctx.fleet.plan(name)
    if existing is not None:
        if _a_retry(existing, offering_id, ctx):
            return {"TrainingPlanArn": arn}
        raise ApiError("ResourceInUse", f"Training plan {name} already exists.", 400)
    request = request_of(spec, parse_duration(spec.duration))
    assumed = ctx.assumed
    sold = _sell(ctx, name, request, offering_id)
    if not sold and not (assumed is not None and assumed.holds(name, offering_id, ctx.user)):
        raise not_found(f"Training plan offering {offering_arg} not found (its capacity is sold, or it starts "
                        "too soon to buy): search again.")
    metadata: dict[str, Any] = {"name": name, "annotations": {ANNOTATION_CREATED_BY: ctx.user}}
    if tags:
        metadata["annotations"][ANNOTATION_SAGEMAKER_TAGS] = json.dumps(tags, ensure_ascii=False, separators=(",", ":"))
    try:
        created = ctx.writes.create_plan(ctx.user, {"apiVersion": API_VERSION, "kind": "TrainingPlan",
                                                    "metadata": metadata, "spec": wire})
    except Exception:
        if sold and assumed is not None:
            assumed.drop(name)  # not made: nothing sold
        raise
    if created is None:  # made meanwhile (a retry of ours, or another caller)
        again = ctx.fleet.plan(name)
        if again is not None and _a_retry(again, offering_id, ctx):
            return {"TrainingPlanArn": arn}
        if sold and assumed is not None and again is not None:
            assumed.drop(name)  # another caller's plan of that name: this call sold nothing
        raise ApiError("ResourceInUse", f"Training plan {name} already exists.", 400)
    if assumed is not None:
        assumed.created(name, str((created.get("metadata") or {}).get("uid") or ""))
    return {"TrainingPlanArn": arn}


def _sell(ctx: "Context", name: str, request: Any, offering_id: str) -> bool:
    """Whether the offering is there to sell now, counting what the API sold a moment ago; if so,
    it is assumed sold under ``name`` in the same step (sagemaker.assumed), so that a create racing
    for it finds it taken. The cache is read before the step: it is a hop to the loop."""
    assumed = ctx.assumed
    if assumed is None:
        return find_offering(request, _pools(ctx), ctx.policy, ctx.now, offering_id) is not None
    assumed.forget_settled(ctx.fleet.plan, ctx.fleet.blocks_of)  # first, as in _pools
    snapshots = ctx.fleet.pool_snapshots()
    with assumed.lock:
        if assumed.holds(name, offering_id, ctx.user):
            return False  # a retry of a create that sold it: not sold twice
        found = find_offering(request, pools_for_plan(assumed.apply(snapshots), {}), ctx.policy, ctx.now,
                              offering_id)
        if found is None:
            return False
        assumed.assume(name, offering_id, ctx.user, found.blocks)
        return True


# --------------------------------------------------------------------------- tags


def _tag_text(text: str) -> bool:
    """Whether ``text`` matches the model's tag pattern: letters, separators (spaces), numbers
    (Unicode's L, Z and N categories, as ``\\p{L}\\p{Z}\\p{N}``) and ``_.:/=+-@``."""
    return all(unicodedata.category(c)[0] in "LZN" or c in "_.:/=+-@" for c in text)


def tags_of(body: Mapping[str, Any]) -> list[dict[str, str]]:
    """The request's ``Tags``, checked as the model says (at most 50; a key of 1 to 128
    characters and a value of at most 256, both of the tag pattern) and as AWS does (keys unique
    in a request; ``aws:`` is AWS's own prefix): a ``ValidationException`` naming the member."""
    tags = body.get("Tags")
    if tags is None:
        return []
    if not isinstance(tags, list) or len(tags) > MAX_TAGS:
        raise invalid(f"1 validation error detected: Value at 'tags' failed to satisfy constraint: Member must have "
                      f"length less than or equal to {MAX_TAGS}")
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    for i, tag in enumerate(tags, 1):
        if not isinstance(tag, dict):
            raise invalid(f"Tags.{i} must be a structure of Key and Value")
        key, value = tag.get("Key"), tag.get("Value")
        for member, text, low, high in (("key", key, 1, MAX_TAG_KEY), ("value", value, 0, MAX_TAG_VALUE)):
            where = f"tags.{i}.member.{member}"
            if not isinstance(text, str):
                raise invalid(f"1 validation error detected: Value null at '{where}' failed to satisfy constraint: "
                              "Member must not be null")
            if not low <= len(text) <= high:
                raise invalid(f"1 validation error detected: Value '{text[:300]}' at '{where}' failed to satisfy "
                              f"constraint: Member must have length between {low} and {high}")
            if not _tag_text(text):
                raise invalid(f"1 validation error detected: Value '{text[:300]}' at '{where}' failed to satisfy "
                              f"constraint: Member must satisfy regular expression pattern: {TAG_PATTERN}")
        if key.lower().startswith("aws:"):
            raise invalid(f"Tag key {key!r}: the aws: prefix is reserved for AWS's own tags")
        if key in seen:
            raise invalid(f"Tag key {key!r} is given more than once; tag keys must be unique per resource")
        seen.add(key)
        out.append({"Key": key, "Value": value})
    return out


def held_tags(obj: Mapping[str, Any]) -> list[dict[str, str]]:
    """The tags a plan holds (:data:`ANNOTATION_SAGEMAKER_TAGS`); none when the annotation is absent or not
    a list of string keys and values (a kubectl user may write anything there)."""
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SAGEMAKER_TAGS)
    try:
        tags = json.loads(text) if text else []
    except (TypeError, ValueError):
        return []
    if not isinstance(tags, list):
        return []
    return [{"Key": t["Key"], "Value": t["Value"]} for t in tags
            if isinstance(t, dict) and isinstance(t.get("Key"), str) and isinstance(t.get("Value"), str)]


RESOURCE_ARN = r"arn:aws[a-z-]*:sagemaker:[a-z0-9-]*:[0-9]{12}:.+"


def _tagged_plan(body: Mapping[str, Any], ctx: "Context") -> tuple[str, dict[str, Any]]:
    """The training plan a tagging call's ``ResourceArn`` names, and its object. Only training
    plans are tagged here: another kind of ARN, or a plan that is not there (the model lists no
    ResourceNotFound for the tag operations: AWS answers a ValidationException), is refused."""
    arn = matching(body, "ResourceArn", RESOURCE_ARN, low=0, high=256) or required(body, "ResourceArn")
    kind = arn.split(":", 5)[-1].partition("/")[0]
    if kind != "training-plan":
        raise invalid(f"hyperplan keeps the tags of training plans only, not of {kind!r} resources")
    name = ctx.local(arn, "training-plan")
    obj = ctx.plan(name) if name is not None and re.fullmatch(PLAN_NAME, name) else None
    if name is None or obj is None:
        raise invalid(f"Training plan {arn} does not exist.")
    return name, obj


def _retag(ctx: "Context", name: str, obj: Mapping[str, Any],
           change: Callable[[list[dict[str, str]]], list[dict[str, str]]]) -> None:
    """Write the plan's tags as ``change`` makes them of the ones it holds, as the caller, with the
    resourceVersion read; a plan changed meanwhile is read again from the API server and the
    change made again over it (tags of another call written meanwhile are kept)."""
    for attempt in range(WRITE_ATTEMPTS):
        held = held_tags(obj)
        tags = change(held)
        if tags == held:
            return
        text = json.dumps(tags, ensure_ascii=False, separators=(",", ":")) if tags else None
        try:
            ctx.writes.annotate_plan(ctx.user, name, {ANNOTATION_SAGEMAKER_TAGS: text},
                                     (obj.get("metadata") or {}).get("resourceVersion"))
            return
        except ApiException as e:
            now = ctx.writes.plan_now(name) if e.status == 409 and attempt < WRITE_ATTEMPTS - 1 else None
            if now is None:
                raise
            obj = now


def add_tags(body: Mapping[str, Any], ctx: "Context") -> dict[str, Any]:
    """AddTags to a training plan: each tag's key set to its value (a new key after the ones the
    plan holds), checked as CreateTrainingPlan's tags are; at most 50 tags a plan (more is a
    ValidationException, nothing written). Answers the tags given."""
    name, obj = _tagged_plan(body, ctx)
    required(body, "Tags")
    given = tags_of(body)

    def change(held: list[dict[str, str]]) -> list[dict[str, str]]:
        values = {t["Key"]: t["Value"] for t in given}
        merged = [{"Key": t["Key"], "Value": values.pop(t["Key"], t["Value"])} for t in held]
        merged += [{"Key": k, "Value": v} for k, v in values.items()]
        if len(merged) > MAX_TAGS:
            raise invalid(f"training plan {name} would have {len(merged)} tags; a resource has at most {MAX_TAGS}")
        return merged

    _retag(ctx, name, obj, change)
    return {"Tags": given}


def delete_tags(body: Mapping[str, Any], ctx: "Context") -> dict[str, Any]:
    """DeleteTags of a training plan: the tags of the keys given removed (a key it has not is no
    error, as on AWS); 1 to 50 keys, each of the model's length and pattern."""
    name, obj = _tagged_plan(body, ctx)
    keys = required(body, "TagKeys")
    if not isinstance(keys, list) or not 1 <= len(keys) <= MAX_TAGS:
        raise invalid(f"1 validation error detected: Value at 'tagKeys' failed to satisfy constraint: Member must "
                      f"have length between 1 and {MAX_TAGS}")
    for i, key in enumerate(keys, 1):
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_TAG_KEY or not _tag_text(key):
            raise invalid(f"1 validation error detected: Value '{str(key)[:300]}' at 'tagKeys.{i}.member' failed to "
                          f"satisfy constraint: Member must satisfy regular expression pattern: {TAG_PATTERN} and "
                          f"have length between 1 and {MAX_TAG_KEY}")
    gone = set(keys)
    _retag(ctx, name, obj, lambda held: [t for t in held if t["Key"] not in gone])
    return {}


def list_tags(body: Mapping[str, Any], ctx: "Context") -> dict[str, Any]:
    """ListTags of a training plan's ARN: the tags CreateTrainingPlan and AddTags kept, in their
    order, paged (``MaxResults`` at least 50, as the model says: one page holds every tag a plan
    may have). Only training plans are tagged here; another kind of ARN is a ``ValidationException``."""
    _, obj = _tagged_plan(body, ctx)
    items = [([i], tag) for i, tag in enumerate(held_tags(obj))]
    shown, token = page(items, body, most=1 << 31, default=MAX_TAGS)
    return compact({"Tags": shown, "NextToken": token})


# --------------------------------------------------------------------------- extending


def _plan_of_arn(body: Mapping[str, Any], ctx: "Context") -> tuple[dict[str, Any], TrainingPlan]:
    arn = matching(body, "TrainingPlanArn", TRAINING_PLAN_ARN, low=50) or required(body, "TrainingPlanArn")
    name = ctx.local(arn, "training-plan")
    obj = ctx.plan(name) if name is not None else None
    plan = _plan_model(obj) if obj is not None else None
    if obj is None or plan is None:
        raise not_found(f"Training plan {arn} not found.")
    return obj, plan


def _extension_ground(obj: Mapping[str, Any], ctx: "Context") -> tuple[str, list[Block], list[PoolSnapshot]]:
    """What an extension is cut from: the plan's uid, its blocks in the ledger and the pools that
    let it buy (by its labels), all from the watch cache; never the plan's status."""
    meta = obj.get("metadata") or {}
    uid = meta.get("uid") or ""
    return uid, ctx.fleet.blocks_of(uid), pools_for_plan(ctx.fleet.pool_snapshots(), meta.get("labels") or {})


def api_extension_id(extension_id: str, plan: str) -> str:
    """The ``TrainingPlanExtensionOfferingId`` of an extension: hyperplan's own id (the digest of
    the plan's uid, its block and the new end) and the plan's name in base 32, since
    ExtendTrainingPlan names nothing but this id. The operator buys only what a search again
    from the plan's ledger blocks cuts under hyperplan's id, so a made-up id extends nothing."""
    return f"{extension_id}-{_b32(plan.encode())}"


def _extension_of_id(value: str) -> tuple[str, str] | None:
    """hyperplan's extension id and the plan's name an API extension offering id carries."""
    parts = value.split("-")
    if len(parts) != 4 or parts[0] != "tpe":
        return None
    try:
        plan = _unb32(parts[3]).decode()
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    if re.fullmatch(PLAN_NAME, plan) is None:
        return None
    return "-".join(parts[:3]), plan


def _hours(days: int | None) -> int | None:
    """Policy days as the API's hours (24 to a day, as a search reads ``DurationHours``)."""
    return None if days is None else days * 24


def _extension_shape(ext: Extension, plan: str, ctx: "Context") -> dict[str, Any]:
    return compact({"TrainingPlanExtensionOfferingId": api_extension_id(ext.id, plan),
                    "AvailabilityZone": ext.block.availability_zone, "StartDate": epoch(ext.start),
                    "EndDate": epoch(ext.end), "DurationHours": _hours(ext.days)})


def _history_shape(entry: ExtensionStatus, plan: str, ctx: "Context") -> dict[str, Any]:
    return compact({"TrainingPlanExtensionOfferingId": api_extension_id(entry.offering_id, plan),
                    "ExtendedAt": epoch(entry.extended_at), "StartDate": epoch(entry.start_time),
                    "EndDate": epoch(entry.end_time), "Status": entry.status,
                    "AvailabilityZone": entry.availability_zone, "DurationHours": _hours(entry.duration_days)})


def _search_extensions(body: Mapping[str, Any], ctx: "Context") -> dict[str, Any]:
    """SearchTrainingPlanOfferings with ``TrainingPlanArn``: the extension offerings of that plan's
    last block (``planning.offerings.search_extensions``), for ``DurationHours`` when given (whole
    days: 24 hours are one of the policy's days), else for a few durations, shortest first."""
    try:
        obj, plan = _plan_of_arn(body, ctx)
    except ApiError as e:  # the model lists no ResourceNotFound for SearchTrainingPlanOfferings
        raise invalid(e.message) if e.code == "ResourceNotFound" else e from None
    hours = bounded(body, "DurationHours", 1, 87600)
    if hours is not None and hours % 24:
        raise invalid(f"DurationHours {hours} of an extension must be whole days (a multiple of 24)")
    uid, blocks, pools = _extension_ground(obj, ctx)
    found = search_extensions(uid, blocks, pools, ctx.policy, ctx.now, None if hours is None else hours // 24)
    return {"TrainingPlanOfferings": [],
            "TrainingPlanExtensionOfferings": [_extension_shape(e, plan.metadata["name"], ctx) for e in found]}


WRITE_ATTEMPTS = 3
"""Writes of ``spec.extensions`` tried over a plan whose other fields changed meanwhile."""


def extend_training_plan(body: Mapping[str, Any], ctx: "Context") -> dict[str, Any]:
    """ExtendTrainingPlan: the extension offering's id appended to the plan's ``spec.extensions``,
    written as the caller (with the resourceVersion read: another extension written meanwhile
    makes this offering ``ResourceNotFound``); the operator then buys it. Safe to retry: an id the spec already lists
    answers its extension again. An id hyperplan did not cut for the plan now is ``ResourceNotFound``."""
    arg = required(body, "TrainingPlanExtensionOfferingId")
    if not isinstance(arg, str) or len(arg) > 2048:
        raise invalid("TrainingPlanExtensionOfferingId must be a string of at most 2048 characters")
    decoded = _extension_of_id(arg)
    missing = not_found(f"Training plan extension offering {arg} not found.")
    if decoded is None:
        raise missing
    wanted, name = decoded
    obj = ctx.plan(name)
    plan = _plan_model(obj) if obj is not None else None
    if obj is None or plan is None:
        raise missing
    listed = [e.offering_id for e in plan.spec.extensions]
    if wanted in listed:  # a retry: answer what the operator made of it
        entry = next((e for e in plan.status.extensions if e.offering_id == wanted),
                     ExtensionStatus(offering_id=wanted))
        return {"TrainingPlanExtensions": [_history_shape(entry, name, ctx)]}
    uid, blocks, pools = _extension_ground(obj, ctx)
    found = find_extension(uid, blocks, pools, ctx.policy, ctx.now, wanted)
    if found is None:
        raise not_found(f"Training plan extension offering {arg} not found (its room is sold, or it starts too "
                        "soon to buy): search again.")
    if len(listed) >= MAX_EXTENSIONS:
        raise invalid(f"training plan {name} has {len(listed)} extensions, the most it may have")
    entries = [e.wire() for e in plan.spec.extensions] + [{"offeringId": wanted}]
    version = (obj.get("metadata") or {}).get("resourceVersion")
    for attempt in range(WRITE_ATTEMPTS):
        try:
            ctx.writes.extend_plan(ctx.user, name, entries, version)
            break
        except ApiException as e:
            # The plan changed since it was read. A retry whose first call landed after the cache
            # was read finds its id in the plan as the API server has it: answered as a retry. A
            # change elsewhere (the operator writes the plan's status on every transition) leaves
            # the extensions as read: written again over the new version. A change of the
            # extensions themselves is another extension: this offering is gone (below).
            now = ctx.writes.plan_now(name) if e.status == 409 else None
            fresh = _plan_model(now) if now is not None else None
            if fresh is None:
                raise
            if wanted in [x.offering_id for x in fresh.spec.extensions]:
                entry = next((x for x in fresh.status.extensions if x.offering_id == wanted),
                             ExtensionStatus(offering_id=wanted))
                return {"TrainingPlanExtensions": [_history_shape(entry, name, ctx)]}
            if [x.wire() for x in fresh.spec.extensions] != entries[:-1]:
                # Extended meanwhile by another call: this offering was cut from the block that
                # was last before, so it is gone (the model's only error here is ResourceNotFound).
                raise not_found(f"Training plan extension offering {arg} not found: training plan {name} was "
                                "extended meanwhile; search again.") from None
            if attempt == WRITE_ATTEMPTS - 1:
                raise
            version = (now.get("metadata") or {}).get("resourceVersion")
    return {"TrainingPlanExtensions": [compact({**_extension_shape(found, name, ctx), "ExtendedAt": epoch(ctx.now),
                                                "Status": "Pending"})]}


def describe_training_plan_extension_history(body: Mapping[str, Any], ctx: "Context") -> dict[str, Any]:
    """The plan's extensions as ``status.extensions`` records them (bought, being bought or
    failed), oldest first, paged (at most 100 a page)."""
    _, plan = _plan_of_arn(body, ctx)
    name = plan.metadata["name"]
    items = [([i], _history_shape(e, name, ctx)) for i, e in enumerate(plan.status.extensions)]
    shown, token = page(items, body)
    return compact({"TrainingPlanExtensions": shown, "NextToken": token})


OPERATIONS: dict[str, Operation] = {
    "SearchTrainingPlanOfferings": search_training_plan_offerings,
    "CreateTrainingPlan": create_training_plan,
    "ExtendTrainingPlan": extend_training_plan,
    "DescribeTrainingPlanExtensionHistory": describe_training_plan_extension_history,
    "DescribeTrainingPlan": describe_training_plan,
    "ListTrainingPlans": list_training_plans,
    "DescribeReservedCapacity": describe_reserved_capacity,
    "ListUltraServersByReservedCapacity": list_ultra_servers_by_reserved_capacity,
    "ListTags": list_tags,
    "AddTags": add_tags,
    "DeleteTags": delete_tags,
    "DescribeCluster": hyperpod.describe_cluster,
    "ListClusters": hyperpod.list_clusters,
    "ListClusterNodes": hyperpod.list_cluster_nodes,
    "DescribeClusterNode": hyperpod.describe_cluster_node,
    "UpdateCluster": hyperpod.update_cluster,
    "BatchReplaceClusterNodes": hyperpod.batch_replace_cluster_nodes,
    "BatchRebootClusterNodes": hyperpod.batch_reboot_cluster_nodes,
    "ListClusterEvents": hyperpod.list_cluster_events,
    "DescribeClusterEvent": hyperpod.describe_cluster_event,
}
WRITES = frozenset({"UpdateCluster", "BatchReplaceClusterNodes", "BatchRebootClusterNodes", "CreateTrainingPlan",
                    "ExtendTrainingPlan", "AddTags", "DeleteTags"})
"""The operations that write: they run on a thread (their API calls block), reading the watch
cache through the loop (``WatchCache._on_loop``)."""
BLOCKING = WRITES | {"ListClusterEvents", "DescribeClusterEvent"}
"""The operations that run on a thread: the writes, and the reads of Events (the watch cache holds
none: they are read from the API server, as the caller)."""


MODELED_ERRORS: dict[str, frozenset[str]] = {
    "SearchTrainingPlanOfferings": frozenset({"ResourceLimitExceeded"}),
    "CreateTrainingPlan": frozenset({"ResourceNotFound", "ResourceInUse", "ResourceLimitExceeded"}),
    "ExtendTrainingPlan": frozenset({"ResourceNotFound"}),
    "DescribeTrainingPlanExtensionHistory": frozenset({"ResourceNotFound"}),
    "DescribeTrainingPlan": frozenset({"ResourceNotFound"}),
    "ListTrainingPlans": frozenset(),
    "DescribeReservedCapacity": frozenset({"ResourceNotFound"}),
    "ListUltraServersByReservedCapacity": frozenset({"ResourceNotFound"}),
    "ListTags": frozenset(),
    "AddTags": frozenset(),
    "DeleteTags": frozenset(),
    "DescribeCluster": frozenset({"ResourceNotFound"}),
    "ListClusters": frozenset(),
    "ListClusterNodes": frozenset({"ResourceNotFound"}),
    "DescribeClusterNode": frozenset({"ResourceNotFound"}),
    "UpdateCluster": frozenset({"ConflictException", "ResourceNotFound", "ResourceLimitExceeded"}),
    "BatchReplaceClusterNodes": frozenset({"ResourceNotFound"}),
    "BatchRebootClusterNodes": frozenset({"ResourceNotFound"}),
    "ListClusterEvents": frozenset({"ResourceNotFound"}),
    "DescribeClusterEvent": frozenset({"ResourceNotFound"}),
}
"""The errors botocore's model lists for each served operation (checked against the model by the
unit tests). Every operation may also answer the errors of any AWS JSON service: ValidationException,
AccessDeniedException, ThrottlingException, the signature's, InternalFailure."""
SPECIFIC_ERRORS = frozenset({"ResourceNotFound", "ResourceInUse", "ResourceLimitExceeded", "ConflictException"})


def modeled(error: ApiError, operation: str) -> ApiError:
    """``error`` as ``operation`` may answer it: a specific code the model does not list for the
    operation (a conflict or a missing object the API server reported on a write) is a
    ``ValidationException`` with the same message, since a client that reads the model expects
    no other."""
    if error.code in SPECIFIC_ERRORS and error.code not in MODELED_ERRORS.get(operation, frozenset()):
        return ApiError("ValidationException", error.message, 400)
    return error


def call(operation: str, body: Mapping[str, Any], ctx: Context) -> dict[str, Any]:
    """Run ``operation``; an operation this server does not serve (yet) is refused by name."""
    served = OPERATIONS.get(operation)
    if served is None:
        if re.fullmatch(r"[A-Z][A-Za-z]+", operation or ""):
            raise ApiError("UnknownOperationException",
                           f"{operation} is not served by hyperplan's SageMaker API; served: "
                           f"{', '.join(sorted(OPERATIONS))}", 400)
        raise ApiError("UnknownOperationException", "no such operation", 400)
    return served(body, ctx)

