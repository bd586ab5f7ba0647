"""Capacity bought through a SageMaker endpoint: the pure half (docs/aws.md).

A CapacityPool with ``spec.source.sageMaker`` keeps no ledger of its own: another hyperplan's
SageMaker API, or AWS, sells its capacity. This module turns what that endpoint answers into the
values the rest of planning works with, and decides what a plan does about the remote plans it
holds. The calls themselves are :mod:`hyperplan.actuation.remote`.

**Offerings.** A remote ``TrainingPlanOffering`` becomes an :class:`~hyperplan.planning.offerings.Offering`
whose blocks are in the remote pool, with the local id that :func:`~hyperplan.planning.offerings.offering_id`
derives from them and the plan's request, as for a local pool, so ``status.offerings`` reads the
same whatever sells the capacity. The remote's own ``TrainingPlanOfferingId`` is kept beside it
(:class:`RemoteOffering`) for the purchase of the same pass and is never written anywhere: a plan
that names an offering (``spec.offeringId``) buys what a search again at the remote yields under
that local id, never an id taken from status.

**Names, so that a retry never buys twice.** The remote plan's name is derived from the local
plan's uid and an attempt number (:func:`remote_plan_name`). CreateTrainingPlan has no client token
and boto3 retries on its own; the same name with the same offering answers the same plan, and before
any purchase the plan looks for the remote plans its uid named (:func:`standing_of`), so a pass
killed after the remote bought and before the local record adopts what was bought instead of
buying again. A remote plan that failed (its offering was sold meanwhile) keeps its name for
good (training plans cannot be deleted), so the next purchase takes the next attempt's name.

**Extensions.** A remote plan is extended as a local one is, by ``spec.extensions``: the remote's
``TrainingPlanExtensionOfferings`` (a search with the remote plan's ARN) are cut as extensions of
the plan's last block as this cluster records it, with the local id
:func:`~hyperplan.planning.offerings.extension_id` gives them (:func:`extensions_offered`), so a
pass that buys one finds it again under that id at the remote, and ``extension_held`` tells from
the recorded block's end that it is bought. Between ExtendTrainingPlan and the remote's block
showing the new end, the remote's extension history says it is being bought
(:func:`extensions_underway`): it is never bought again meanwhile.

**UltraServers.** The running UltraServer block's UltraServers are listed at the remote
(``ListUltraServersByReservedCapacity``, paced): an UltraServer the remote reports ``Impaired``
is impaired in the plan's ``status.ultraServers`` whatever this cluster's nodes say
(:func:`with_remote_health`), since the remote sees what the nodes cannot (AWS: the NVLink
fabric, an instance it retires). It is matched by id: hyperplan's own API names UltraServers as
this cluster does (``<reservedCapacityId>-us-<n>``); AWS's own ids match only nodes that carry
them. The counts stay this cluster's: its nodes run here, and the remote's are those of its own
nodes, which a selling cluster does not have.

**The record.** What the remote holds for a plan is written as lines of the remote pool's
``status.reservations`` (:func:`mirror_lines`), by the operator alone, so that groups, the Kueue
controller and the plan's own status read blocks from one place, whatever sold them.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable, Mapping, Sequence

from hyperplan.api.models import Reservation, UltraServerStatus
from hyperplan.planning.blocks import Block
from hyperplan.planning.offerings import Extension, Offering, OfferingRequest, extension_id
from hyperplan.planning.policy import Policy

NAME_PREFIX = "hp-"
MAX_ATTEMPTS = 8  # remote plans one local plan may name: a purchase that failed at the remote 7 times stops
LIVE = ("Pending", "Scheduled", "Active")  # a remote plan in these states holds (or may yet hold) capacity
_LABEL_SAFE = re.compile(r"[^a-z0-9.-]+")


def remote_plan_name(plan_uid: str, attempt: int) -> str:
    """``hp-<uid without dashes>-<attempt>``: within the API's ``[a-zA-Z0-9](-*[a-zA-Z0-9]){0,63}``."""
    return f"{NAME_PREFIX}{plan_uid.replace('-', '').lower()}-{attempt}"


def attempt_of(name: str, plan_uid: str) -> int | None:
    """The attempt number of a remote plan named for ``plan_uid``, or None for another's plan."""
    stem = f"{NAME_PREFIX}{plan_uid.replace('-', '').lower()}-"
    if not plan_uid or not name.startswith(stem) or not name[len(stem):].isdigit():
        return None
    return int(name[len(stem):])


@dataclass(frozen=True)
class PoolTerms:
    """What a remote pool sells, by which its seller filters a search's answer."""

    name: str
    instance_type: str
    availability_zone: str
    ultra_server_type: str | None = None


@dataclass(frozen=True)
class RemoteOffering:
    offering: Offering  # as the local plan shows and buys it: blocks in the remote pool, local id
    remote_id: str  # the remote's TrainingPlanOfferingId, passed to CreateTrainingPlan
    upfront_fee: str | None = None
    currency: str | None = None


@dataclass(frozen=True)
class BlockReservation:
    """One of EC2's capacity reservations that make a block (planning.capacity_blocks): an
    extension is bought per reservation, so the block's extension is one per reservation."""

    id: str  # CapacityReservationId
    instance_count: int
    end: datetime  # its own end: ahead of the block's while the block is part-way extended


@dataclass(frozen=True)
class RemoteBlock:
    arn: str  # ReservedCapacityArn
    instance_type: str
    instance_count: int
    availability_zone: str
    start: datetime
    end: datetime
    status: str
    ultra_server_type: str | None = None
    # EC2's Capacity Blocks the block's reservations belong to (``cb-...``; planning.capacity_blocks):
    # what EC2's interconnect health is asked by. Empty for a SageMaker block.
    capacity_block_ids: tuple[str, ...] = ()
    # ... and the capacity reservations it is made of (what EC2 extends). Empty for a SageMaker block.
    reservations: tuple[BlockReservation, ...] = ()

    @property
    def id(self) -> str:
        """The block's id on this side (a label value on the nodes): the ARN's resource id when it
        is label-safe and short (hyperplan's own ``rc-...``), else a readable prefix and a digest."""
        tail = self.arn.rsplit("/", 1)[-1].lower()
        safe = _LABEL_SAFE.sub("-", tail).strip("-.")
        if safe and len(safe) <= 63 and safe == tail:
            return safe
        digest = hashlib.sha256(self.arn.encode()).hexdigest()[:12]
        return f"{safe[:40].strip('-.') or 'rc'}-{digest}"


@dataclass(frozen=True)
class RemotePlan:
    name: str
    arn: str
    status: str  # Pending, Scheduled, Active, Expired, Failed
    status_message: str = ""
    blocks: tuple[RemoteBlock, ...] = ()
    noun: str = "training plan"  # what the remote calls it, for messages ("capacity block" for EC2)

    @property
    def live(self) -> bool:
        return self.status in LIVE


@dataclass(frozen=True)
class RemoteStanding:
    """What the remote holds for one local plan, from every remote plan its uid named."""

    live: RemotePlan | None  # the newest attempt that did not fail (Expired included): the one to follow
    failed: tuple[RemotePlan, ...]  # earlier attempts that failed, oldest first
    next_attempt: int  # the attempt number a new purchase takes

    @property
    def exhausted(self) -> bool:
        return self.live is None and self.next_attempt >= MAX_ATTEMPTS


def standing_of(plans: Iterable[RemotePlan], plan_uid: str) -> RemoteStanding:
    mine = sorted(((attempt_of(p.name, plan_uid), p) for p in plans), key=lambda e: e[0] or 0)
    mine = [(n, p) for n, p in mine if n is not None]
    live = next((p for _, p in reversed(mine) if p.status != "Failed"), None)
    failed = tuple(p for _, p in mine if p.status == "Failed")
    return RemoteStanding(live=live, failed=failed, next_attempt=(mine[-1][0] + 1) if mine else 0)


def behind_the_clock(plan: RemotePlan, now: datetime) -> bool:
    """Whether the remote's answer for ``plan`` is behind the clock: a block whose start has passed
    that is not Active yet, or whose end has passed that is not Expired yet (the remote's own pass
    at the boundary, or the listing that answered, has not caught up)."""
    return plan.live and any((b.start <= now < b.end and b.status in ("Pending", "Scheduled"))
                             or (b.end <= now and b.status in LIVE) for b in plan.blocks)


# --------------------------------------------------------------------------- the wire, read


def _time(value: Any) -> datetime | None:
    """boto3 parses timestamps into aware datetimes; a stub or a raw answer may carry epochs."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return datetime.fromtimestamp(float(value), tz=timezone.utc)


def duration_hours(request: OfferingRequest, policy: Policy) -> int:
    """The request's duration in the API's hours, counted in the policy's days (24 hours are one
    of its days), as hyperplan's own SageMaker API reads them: under the demo profile, whose day is
    a minute, 24 hours ask for a minute of capacity. With the production profile they are hours."""
    return max(1, round(request.duration / policy.day * 24))


def search_arguments(request: OfferingRequest, policy: Policy) -> dict[str, Any]:
    """The SearchTrainingPlanOfferings arguments (boto3's names) for the plan's request."""
    args: dict[str, Any] = {"TargetResources": [request.target], "DurationHours": duration_hours(request, policy)}
    if request.is_ultra_server:
        args.update(UltraServerType=request.ultra_server_type, UltraServerCount=request.ultra_server_count)
    else:
        args.update(InstanceType=request.instance_type, InstanceCount=request.instance_count)
    if request.start_after is not None:
        args["StartTimeAfter"] = request.start_after
    if request.end_before is not None:
        args["EndTimeBefore"] = request.end_before
    return args


def offerings_of(response: Mapping[str, Any], pool: str, instance_type: str, availability_zone: str,
                 ultra_server_type: str | None, request: OfferingRequest) -> list[RemoteOffering]:
    """The offerings of a SearchTrainingPlanOfferings answer that the pool sells: every block of
    the pool's instance type in its zone (a remote that answers others is filtered, not trusted),
    each as a block of the pool, cut for ``request``. An offering with a block the answer leaves
    without dates or counts is skipped."""
    out: list[RemoteOffering] = []
    for entry in response.get("TrainingPlanOfferings") or []:
        blocks = []
        for rc in entry.get("ReservedCapacityOfferings") or []:
            start, end = _time(rc.get("StartTime")), _time(rc.get("EndTime"))
            count = rc.get("InstanceCount")
            if start is None or end is None or not count or end <= start:
                blocks = []
                break
            if rc.get("InstanceType") != instance_type or rc.get("AvailabilityZone", availability_zone) \
                    != availability_zone or (rc.get("UltraServerType") or None) != ultra_server_type:
                blocks = []
                break
            blocks.append(Block(pool=pool, availability_zone=availability_zone, instance_type=instance_type,
                                instance_count=int(count), start=start, end=end, ultra_server_type=ultra_server_type))
        if not blocks or not entry.get("TrainingPlanOfferingId"):
            continue
        out.append(RemoteOffering(Offering.from_blocks(blocks, request), str(entry["TrainingPlanOfferingId"]),
                                  entry.get("UpfrontFee"), entry.get("CurrencyCode")))
    return out


def plan_of(answer: Mapping[str, Any]) -> RemotePlan:
    """A DescribeTrainingPlan answer, or one TrainingPlanSummary of ListTrainingPlans."""
    blocks = []
    for rc in answer.get("ReservedCapacitySummaries") or []:
        start, end = _time(rc.get("StartTime")), _time(rc.get("EndTime"))
        if start is None or end is None or not rc.get("TotalInstanceCount"):
            continue
        blocks.append(RemoteBlock(arn=str(rc["ReservedCapacityArn"]), instance_type=str(rc["InstanceType"]),
                                  instance_count=int(rc["TotalInstanceCount"]),
                                  availability_zone=str(rc.get("AvailabilityZone") or ""), start=start, end=end,
                                  status=str(rc.get("Status") or ""), ultra_server_type=rc.get("UltraServerType")))
    return RemotePlan(name=str(answer["TrainingPlanName"]), arn=str(answer["TrainingPlanArn"]),
                      status=str(answer.get("Status") or ""), status_message=str(answer.get("StatusMessage") or ""),
                      blocks=tuple(sorted(blocks, key=lambda b: (b.start, b.arn))))


@dataclass(frozen=True)
class RemoteExtension:
    extension: Extension  # as the local plan shows and buys it: its last block as recorded here, local id
    remote_id: str  # the remote's TrainingPlanExtensionOfferingId, passed to ExtendTrainingPlan
    upfront_fee: str | None = None
    currency: str | None = None
    # EC2, a block of several capacity reservations: (reservation, extension offering) for each
    # reservation still to extend, bought one after another (planning.capacity_blocks).
    parts: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ExtensionRecord:
    """One entry of DescribeTrainingPlanExtensionHistory (or of ExtendTrainingPlan's answer)."""

    remote_id: str
    start: datetime | None
    end: datetime | None
    status: str  # Pending, Scheduled, Active, Expired, Failed (as the remote writes it)


def _same_moment(a: datetime | None, b: datetime) -> bool:
    return a is not None and abs((a - b).total_seconds()) < 1  # the wire carries whole seconds or less


def extensions_offered(response: Mapping[str, Any], plan_uid: str, blocks: Sequence[Block],
                       policy: Policy) -> list[RemoteExtension]:
    """The extension offerings of a SearchTrainingPlanOfferings answer (``TrainingPlanArn`` asked)
    that run the plan's last block (``blocks``, as this cluster records them) on from its end in
    its zone, each cut as that block's extension with the local id; an offering that starts
    elsewhere, in another zone or without dates is not believed."""
    if not blocks:
        return []
    last = max(blocks, key=lambda b: (b.end, b.start))
    out: list[RemoteExtension] = []
    for entry in response.get("TrainingPlanExtensionOfferings") or []:
        start, end, remote_id = _time(entry.get("StartDate")), _time(entry.get("EndDate")), entry.get(
            "TrainingPlanExtensionOfferingId")
        if not remote_id or end is None or not _same_moment(start, last.end) or end <= last.end:
            continue
        if entry.get("AvailabilityZone", last.availability_zone) not in ("", last.availability_zone):
            continue
        days = max(1, round((end - last.end) / policy.day))
        ext = Extension(extension_id(plan_uid, last, end), last, end, days)
        out.append(RemoteExtension(ext, str(remote_id), entry.get("UpfrontFee"), entry.get("CurrencyCode")))
    return out


def extension_records(entries: Iterable[Mapping[str, Any]]) -> list[ExtensionRecord]:
    """TrainingPlanExtension entries (a history page, or ExtendTrainingPlan's answer)."""
    return [ExtensionRecord(str(e.get("TrainingPlanExtensionOfferingId") or ""), _time(e.get("StartDate")),
                            _time(e.get("EndDate")), str(e.get("Status") or "Pending")) for e in entries]


def extensions_underway(records: Iterable[ExtensionRecord], plan_uid: str,
                        blocks: Sequence[Block]) -> dict[str, str]:
    """The extensions the remote has taken (its history names them) that the plan's blocks as
    recorded here do not show yet, by local id, with the remote's status: those start at the end
    of one of ``blocks``. ``Failed`` among them: the remote refused it after it was asked. One the
    blocks already run over is left to ``extension_held``."""
    out: dict[str, str] = {}
    for record in records:
        if record.end is None:
            continue
        for block in blocks:
            if _same_moment(record.start, block.end) and record.end > block.end:
                out[extension_id(plan_uid, block, record.end)] = record.status
    return out


def extension_not_shown(records: Iterable[ExtensionRecord], remote: RemotePlan) -> bool:
    """Whether the remote took an extension (not failed) that the remote plan as answered does
    not show yet: a record starting at the end of one of its blocks and ending after it."""
    return any(r.status != "Failed" and r.end is not None and _same_moment(r.start, b.end) and r.end > b.end
               for r in records for b in remote.blocks)


# The API's UltraServer HealthStatus in hyperplan's words (api.models.UltraServerStatus).
ULTRASERVER_HEALTH = {"OK": "ok", "Impaired": "impaired", "Insufficient-Data": "insufficient-data"}


def ultra_server_health_of(entries: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """ListUltraServersByReservedCapacity's UltraServers (every page) as health by UltraServer id;
    a status the API adds later is taken as insufficient data."""
    return {str(u["UltraServerId"]): ULTRASERVER_HEALTH.get(str(u.get("HealthStatus")), "insufficient-data")
            for u in entries if u.get("UltraServerId")}


def with_remote_health(ultra_servers: Sequence[UltraServerStatus], remote_health: Mapping[str, str],
                       cloud_ultraservers: Mapping[str, str] | None = None) -> tuple[UltraServerStatus, ...]:
    """The plan's UltraServers with the remote's word added: one the remote reports ``impaired``
    is impaired here too. The remote's ``ok`` or lack of data changes nothing (this cluster's
    nodes know better what they run); its counts are not taken (see the module's doc).

    The remote names an UltraServer by this cluster's id (another hyperplan names them as the
    buying cluster does) or by its own (AWS): then ``cloud_ultraservers`` (this cluster's id ->
    the remote's, paired by the membership of the groups' lent nodes,
    ``placement.cloud_ultraservers``) says which of this cluster's it is."""
    pairs = cloud_ultraservers or {}

    def impaired(u: UltraServerStatus) -> bool:
        return remote_health.get(u.id) == "impaired" or (u.id in pairs and remote_health.get(pairs[u.id]) == "impaired")
    return tuple(u.model_copy(update={"health_status": "impaired"}) if impaired(u) and u.health_status != "impaired"
                 else u for u in ultra_servers)


# --------------------------------------------------------------------------- decisions


def within_fee(offering: RemoteOffering, ceiling: str | None) -> bool:
    """Whether the offering's upfront fee is at most the pool's ceiling (none: always). A fee the
    remote leaves out or writes unreadably is taken to be over a ceiling: money is not guessed."""
    if ceiling is None:
        return True
    try:
        return offering.upfront_fee is not None and Decimal(offering.upfront_fee) <= Decimal(ceiling)
    except InvalidOperation:
        return False


def pool_sells(block: RemoteBlock, instance_type: str, availability_zone: str) -> bool:
    """Whether a remote block is of the pool's instance type in its zone (a block the remote names
    no zone for counts as the pool's): the only blocks recorded (a remote that sells anything else
    is not believed)."""
    return block.instance_type == instance_type and block.availability_zone in ("", availability_zone)


def mirror_lines(remote: RemotePlan, plan: str, plan_uid: str, instance_type: str,
                 availability_zone: str) -> tuple[list[Reservation], list[str]]:
    """The lines of the remote pool's ledger that record what ``remote`` holds for the local plan,
    and why any block was left out: only blocks the pool sells (:func:`pool_sells`), and none of a
    plan that failed."""
    if remote.status == "Failed":
        return [], []  # an Expired plan keeps its lines: the blocks were held, and the dates say they ended
    lines, refused = [], []
    for b in remote.blocks:
        if not pool_sells(b, instance_type, availability_zone):
            refused.append(f"block {b.arn} is {b.instance_count} x {b.instance_type} in "
                           f"{b.availability_zone or '?'}, not what the pool sells")
            continue
        if b.status == "Failed":
            continue
        lines.append(Reservation(training_plan=plan, training_plan_uid=plan_uid, reserved_capacity_id=b.id,
                                 start_time=b.start, end_time=b.end, instance_count=b.instance_count,
                                 remote_training_plan_arn=remote.arn))
    return lines, refused


def same_lines(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    def key(line: Mapping[str, Any]) -> tuple:
        return tuple(sorted((k, str(v)) for k, v in line.items()))
    return sorted(map(key, a)) == sorted(map(key, b))


def waiting_for_remote(decision_status: Any, prior: Any, generation: int, remote: RemotePlan, endpoint: str,
                       now: datetime) -> Any:
    """The status of a plan whose remote plan is bought but holds no block yet (the remote's own
    purchase runs after CreateTrainingPlan answers): Pending, ``Purchased=False`` with reason
    ``RemotePurchasing``, and the offerings the pass found kept. A waiting pass does not search
    (its purchase took the capacity), so ``OfferingsAvailable`` stays as the last search left it.
    The offering it bought stays named (``purchasedOfferingId`` of ``prior``): the decision's
    status is a search's, which does not carry it."""
    from hyperplan.planning.plans import condition  # plans imports nothing of this module
    status = decision_status.model_copy(deep=True)
    status.phase = "Pending"
    status.purchased_offering_id = prior.purchased_offering_id
    status.observed_generation = generation
    message = (f"{remote.noun} {remote.name} at {endpoint} is {remote.status or 'unknown'}"
               + (f": {remote.status_message}" if remote.status_message else "")
               + "; waiting for the remote to hold its blocks")
    searched = [c for c in prior.conditions if c.type == "OfferingsAvailable"]
    status.conditions = [c for c in status.conditions if c.type not in ("Purchased", "OfferingsAvailable")
                         or (c.type == "OfferingsAvailable" and not searched)] + searched + [
        condition("Purchased", False, "RemotePurchasing", message, generation, prior.conditions, now)]
    return status
