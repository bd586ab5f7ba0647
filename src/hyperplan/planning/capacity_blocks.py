"""EC2 Capacity Blocks as a remote source of a pool: the pure half (docs/aws.md).

A CapacityPool with ``spec.source.ec2CapacityBlocks`` is sold by EC2 itself, for a cluster that
launches its instances (through Karpenter). This module turns what EC2 answers into the values
the SageMaker source yields too (:mod:`hyperplan.planning.remote`: ``RemoteOffering``,
``RemotePlan``, ``RemoteBlock``), so that the plan pass reads both alike. The calls are
:mod:`hyperplan.actuation.remote.capacity_blocks`.

**Offerings.** A ``CapacityBlockOffering`` (one block: an instance type, a count and a zone for a
window; an offering split in ``CapacityBlockOfferingSegments`` is one block per segment) becomes an
offering of the pool with the local id planning derives from its blocks, as for any pool; its
``CapacityBlockOfferingId`` is kept beside it for the purchase of the same pass only.

**UltraServers.** A pool that declares an ``ultraServerType`` sells UltraServer Capacity Blocks: it
is searched with EC2's ``UltraserverType`` and ``UltraserverCount`` (:func:`search_arguments`), and
only an answer of that UltraServer type becomes its offering, one block carrying the pool's
``ultra_server_type`` and every instance of its UltraServers (:func:`offerings_of`). hyperplan's
plans and pools name UltraServer types as SageMaker does (``ml.u-p6e-gb200x72``), EC2 without the
``ml.`` (``u-p6e-gb200x72``): :func:`ec2_name` is the one place the two namings meet, and the rest
of the operator keeps hyperplan's. The pool's ``instanceType`` is EC2's, as for any EC2 pool
(``p6e-gb200.36xlarge``, as Karpenter's nodes carry it).

**Zones by name or by id.** A pool names its zone as its nodes carry it, by name (``us-east-1a``)
or by id (``use1-az6``, the same zone in every account). An offering is in the pool's zone when
its zone's name or id is the pool's zone: a segment names both, an offering of one block only its
zone's name, whose id the seller reads once from ``DescribeAvailabilityZones`` (:func:`zone_ids_of`)
when a pool names its zone by id. A purchase tags its reservations with the zone as the buying pool
names it (:data:`TAG_ZONE`), and a reservation whose zone's name or id is that zone is read in the
pool's form (:func:`zone_as_named`), so its block is the pool's (planning.remote.pool_sells) after a
restart too; the tag never moves a reservation into another zone.

**Remote plans.** EC2 has no plan: what one purchase bought is one capacity reservation, or several
(``PurchaseCapacityBlock`` answers ``CapacityReservations``: one per segment of an offering, and an
UltraServer Capacity Block names a list of them, ``CapacityBlocks[].CapacityReservationIds``). A
purchase tags them (:func:`purchase_tags`) with the name a SageMaker plan would have had
(``hp-<uid>-<attempt>``, planning.remote.remote_plan_name) and the local plan's name and uid; the
reservations that carry one name are one :class:`RemotePlan` (:func:`plans_of`), so the standing
of a plan's attempts, the ledger lines and the pacing are the SageMaker source's. The block's id
is the capacity reservation's id (``cr-...``): the tail of its ARN, which is what
:attr:`RemoteBlock.id` takes.

**One block per window** (:func:`plan_from`). A plan's blocks never overlap (planning.schedule
orders them by start and runs one at a time; an UltraServer plan's block is all its UltraServers,
planning.blocks.Block.ultra_server_count), so the reservations of one attempt that share a window
(start, end, type and zone: those of one UltraServer Capacity Block, whether EC2 makes one
reservation for all its UltraServers or one for each) are one block of all their instances. A block
of one reservation keeps that reservation's id; a block of several takes the Capacity Block's id
(the reservations' ``CapacityBlockId``, ``cb-...``; without one, a digest of their ids), and is
held only once none of them is still being paid (a block of half its UltraServers would be placed
as a smaller one, and its id would change). Reservations of one Capacity Block are one block
whatever their ends, ending with the first of them: EC2 extends each on its own (below).

**UltraServer health** (:func:`told_capacity_block`, :func:`interconnect_health_of`): a purchase
tags its reservations with its UltraServer type (:data:`TAG_ULTRASERVER_TYPE`), so that a listed
block knows it is one; EC2's ``DescribeCapacityBlockStatus`` tells an ``InterconnectStatus`` per
Capacity Block, which is the health of the block's UltraServer when the block is one UltraServer
in one Capacity Block (planning.remote.with_remote_health takes it as SageMaker's).

**States** (:data:`STATES`): a reservation bought but not paid yet (``payment-pending``, and
``pending``/``assessing``/``delayed``) holds no block yet, so the plan waits; ``scheduled``,
``active`` and ``expired`` hold their block; ``payment-failed``, ``failed``, ``cancelled``,
``cancelling``, ``unavailable`` and ``unsupported`` hold nothing, and the next attempt may buy
again (at most planning.remote.MAX_ATTEMPTS).

**Extensions.** A block is extended as a SageMaker plan's is (planning.remote, "Extensions"), by
its capacity reservation: ``DescribeCapacityBlockExtensionOfferings`` asks for one duration at a
time, so a search asks for each of planning.offerings.EXTENSION_DAYS (:func:`extension_hours`);
an answer is cut as the extension of the plan's last block as recorded here, under the local id
(:func:`extensions_of`), and only if it runs that block on from its end with the same type and
count in its zone. ``PurchaseCapacityBlockExtension`` is paid as a purchase is:
``payment-pending``, then ``payment-succeeded`` (the reservation's ``EndDate`` moves to the
extension's end, which is when the ledger line shows it) or ``payment-failed``
(:data:`EXTENSION_STATES`, read from ``DescribeCapacityBlockExtensionHistory``).

**Extending a block of several reservations** (:func:`reservations_extensions_of`,
:func:`combined_records`, :func:`parts_to_buy`): EC2 has no extension of a Capacity Block, only of
each reservation. The block's extension until an end is offered when each of its reservations is
offered one until that end from its own end (or runs until then, or has one bought), and is bought
as its ``parts``, one purchase per reservation still to extend; its history is one record per end.
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable, Mapping, Sequence

from hyperplan.api.vocabulary import (
    TAG_REMOTE_PLAN,
    TAG_TRAINING_PLAN_UID,
    TAG_ULTRASERVER_TYPE,
    TAG_ZONE,
    ULTRASERVER_INSTANCES,
)
from hyperplan.planning import naming
from hyperplan.planning.blocks import Block
from hyperplan.planning.offerings import EXTENSION_DAYS, Extension, Offering, OfferingRequest, extension_id
from hyperplan.planning.policy import Policy
from hyperplan.planning.remote import (
    BlockReservation,
    ExtensionRecord,
    RemoteBlock,
    RemoteExtension,
    RemoteOffering,
    RemotePlan,
    _same_moment,
    _time,
    duration_hours,
)

# EC2's CapacityBlockInterconnectStatus as an UltraServer's health (planning.remote.ULTRASERVER_HEALTH's words)
INTERCONNECT_HEALTH = {"ok": "ok", "impaired": "impaired", "insufficient-data": "insufficient-data"}
PLATFORM = "Linux/UNIX"  # the nodes Karpenter launches into the block
NOUN = "capacity block"

# A reservation's State as the remote plan's status (planning.remote.RemotePlan.status), and
# whether it holds its block (an unpaid one does not, yet).
STATES: dict[str, tuple[str, bool]] = {
    "payment-pending": ("Pending", False), "pending": ("Pending", False), "assessing": ("Pending", False),
    "delayed": ("Pending", False),
    "scheduled": ("Scheduled", True), "active": ("Active", True), "expired": ("Expired", True),
    "payment-failed": ("Failed", False), "failed": ("Failed", False), "cancelled": ("Failed", False),
    "cancelling": ("Failed", False), "unavailable": ("Failed", False), "unsupported": ("Failed", False),
}
_STATUS_ORDER = ("Pending", "Active", "Scheduled", "Expired", "Failed")  # a plan's status: its first reservation's


def ec2_name(name: str) -> str:
    """hyperplan's name of an UltraServer or instance type as EC2 writes it: SageMaker's (and so
    hyperplan's plans') ``ml.u-p6e-gb200x72`` and ``ml.p6e-gb200.36xlarge`` are EC2's
    ``u-p6e-gb200x72`` and ``p6e-gb200.36xlarge``; a name without ``ml.`` is EC2's already."""
    return name[len("ml."):] if name.startswith("ml.") else name


def search_arguments(request: OfferingRequest, policy: Policy) -> dict[str, Any]:
    """The DescribeCapacityBlockOfferings arguments (boto3's names) for the plan's request.

    An UltraServer request asks with ``UltraserverType`` and ``UltraserverCount`` in EC2's naming,
    and with the ``InstanceType`` its UltraServers are made of but no ``InstanceCount`` (the
    UltraServer count says the size; a second count could only contradict it). What this relies on,
    from EC2's API reference for DescribeCapacityBlockOfferings and botocore's model of it
    (``ec2/2016-11-15``): ``UltraserverType`` and ``UltraserverCount`` are "the EC2 UltraServer type
    of the Capacity Block offerings" and "the number of EC2 UltraServers in the offerings";
    ``InstanceType`` and ``InstanceCount`` are optional since UltraServers were added, no page says
    that ``InstanceType`` may not go with ``UltraserverType``, and the model's
    ``InstanceTypePreferences`` says "either this or the legacy InstanceType parameter is required".
    """
    args: dict[str, Any] = {"CapacityDurationHours": duration_hours(request, policy)}
    if request.is_ultra_server:
        args.update(InstanceType=ec2_name(request.effective_instance_type or ""),
                    UltraserverType=ec2_name(request.ultra_server_type or ""),
                    UltraserverCount=request.ultra_server_count)
    else:
        args.update(InstanceType=request.instance_type, InstanceCount=request.instance_count)
    if request.start_after is not None:
        args["StartDateRange"] = request.start_after
    if request.end_before is not None:
        args["EndDateRange"] = request.end_before
    return args


_ZONE_ID = re.compile(r"^[a-z]{2,4}[0-9]+(-[a-z]+[0-9]+)?-az[0-9]+$")  # use1-az6, use1-dfw2-az1


def is_zone_id(zone: str) -> bool:
    """Whether a pool names its zone by id (``use1-az6``, a Local Zone's ``use1-dfw2-az1``), not by
    name (``us-east-1a``, ``us-east-1-dfw-2a``)."""
    return bool(_ZONE_ID.match(zone))


def zone_ids_of(zones: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """DescribeAvailabilityZones' AvailabilityZones as each zone's id by its name."""
    return {str(z["ZoneName"]): str(z["ZoneId"]) for z in zones if z.get("ZoneName") and z.get("ZoneId")}


def _in_zone(name: str | None, zone_id: str | None, pool_zone: str) -> bool:
    """Whether a zone EC2 names (by name, id or both; neither: the pool's) is the pool's zone, which
    the pool names either way."""
    return pool_zone in (name, zone_id) or (not name and not zone_id)


def zone_as_named(reservation: Mapping[str, Any]) -> str:
    """The reservation's zone as the pool that bought it names it (its :data:`TAG_ZONE`) when that
    is its zone's name or id; else its zone's name."""
    name, zone_id = reservation.get("AvailabilityZone"), reservation.get("AvailabilityZoneId")
    tagged = tags_of(reservation).get(TAG_ZONE)
    return tagged if tagged and tagged in (name, zone_id) else str(name or "")


def _blocks_of(entry: Mapping[str, Any], pool: str, instance_type: str, availability_zone: str,
               ultra_server_type: str | None, zone_ids: Mapping[str, str]) -> list[Block]:
    """The blocks of one offering, all of the pool's type in its zone (and of its UltraServer type,
    in whole UltraServers, for a pool that declares one), or none."""
    if (entry.get("UltraserverType") or None) != (ec2_name(ultra_server_type) if ultra_server_type else None):
        return []
    per_server = ULTRASERVER_INSTANCES.get(ultra_server_type or "")
    if ultra_server_type and per_server is None:
        return []  # an UltraServer type hyperplan does not know the size of
    parts = entry.get("CapacityBlockOfferingSegments") or [entry]
    servers = entry.get("UltraserverCount")
    blocks = []
    for part in parts:
        start, end = _time(part.get("StartDate")), _time(part.get("EndDate"))
        count = part.get("InstanceCount")
        if per_server and not count and servers and part is entry:
            count = per_server * int(servers)  # an UltraServer offering may name only its UltraServers
        itype = part.get("InstanceType") or entry.get("InstanceType")
        zone = part.get("AvailabilityZone") or entry.get("AvailabilityZone")
        if start is None or end is None or not count or end <= start:
            return []
        whole = not per_server or (int(count) % per_server == 0
                                   and not (servers and part is entry and int(count) != per_server * int(servers)))
        if not whole:
            return []  # not whole UltraServers, or two counts that disagree: not believed
        in_zone = _in_zone(zone, part.get("AvailabilityZoneId") or zone_ids.get(zone or ""), availability_zone)
        if itype != instance_type or not in_zone:
            return []
        blocks.append(Block(pool=pool, availability_zone=availability_zone, instance_type=instance_type,
                            instance_count=int(count), start=start, end=end, ultra_server_type=ultra_server_type))
    return blocks


def offerings_of(answer: Iterable[Mapping[str, Any]], pool: str, instance_type: str, availability_zone: str,
                 request: OfferingRequest, ultra_server_type: str | None = None,
                 zone_ids: Mapping[str, str] | None = None) -> list[RemoteOffering]:
    """The offerings among ``answer`` (CapacityBlockOfferings, every page) that the pool sells: of
    its instance type in its zone (by name or by id: a segment names its zone's id, ``zone_ids``
    gives it by name for an offering that does not), each cut for ``request``; an offering without
    an id, dates or a count is skipped. A pool that declares an UltraServer type
    (``ultra_server_type``, hyperplan's naming) sells only offerings of that UltraServer type (EC2's
    ``UltraserverType``), as one block of all their instances; any other pool, none."""
    out = []
    for entry in answer:
        if not entry.get("CapacityBlockOfferingId"):
            continue
        blocks = _blocks_of(entry, pool, instance_type, availability_zone, ultra_server_type, zone_ids or {})
        if not blocks:
            continue
        out.append(RemoteOffering(Offering.from_blocks(blocks, request), str(entry["CapacityBlockOfferingId"]),
                                  entry.get("UpfrontFee"), entry.get("CurrencyCode")))
    return out


def purchase_tags(remote_name: str, tags: Mapping[str, str], zone: str | None = None,
                  ultra_server_type: str | None = None) -> list[dict[str, Any]]:
    """PurchaseCapacityBlock's TagSpecifications: the reservations carry the attempt's name and the
    local plan's name and uid, which is how a pass finds them again (:func:`plans_of`), the zone
    as the buying pool names it (:func:`zone_as_named`), and an UltraServer purchase's type (a
    reservation does not say it; :func:`interconnect_health_of` needs it)."""
    pairs = {**tags, TAG_REMOTE_PLAN: remote_name, **({TAG_ZONE: zone} if zone else {}),
             **({TAG_ULTRASERVER_TYPE: ultra_server_type} if ultra_server_type else {})}
    return [{"ResourceType": "capacity-reservation",
             "Tags": [{"Key": k, "Value": v} for k, v in sorted(pairs.items())]}]


def uid_filter(plan_uid: str) -> list[dict[str, Any]]:
    """DescribeCapacityReservations' Filters for the reservations one local plan's purchases tagged."""
    return [{"Name": f"tag:{TAG_TRAINING_PLAN_UID}", "Values": [plan_uid]}]


def listing_filter() -> list[dict[str, Any]]:
    """DescribeCapacityReservations' Filters for every reservation a hyperplan purchase tagged."""
    return [{"Name": "tag-key", "Values": [TAG_REMOTE_PLAN]}]


def tags_of(reservation: Mapping[str, Any]) -> dict[str, str]:
    return {str(t.get("Key")): str(t.get("Value")) for t in reservation.get("Tags") or [] if t.get("Key")}


def arn_of(reservation: Mapping[str, Any], region: str) -> str:
    """The reservation's ARN (its tail is the id, ``cr-...``, which becomes the block's id)."""
    arn = reservation.get("CapacityReservationArn")
    if arn:
        return str(arn)
    owner = reservation.get("OwnerId") or ""
    return f"arn:aws:ec2:{region}:{owner}:capacity-reservation/{reservation.get('CapacityReservationId')}"


def _window(reservation: Mapping[str, Any]) -> tuple:
    """What makes reservations of one attempt one block: the same start, type and zone, and the
    same Capacity Block (an UltraServer Capacity Block's reservations), or without one the same
    end. Not the end within a Capacity Block: EC2 extends each reservation on its own, so one
    extended before the others ends later for a while, and the block stays one (ending with the
    first of them: :func:`plan_from`)."""
    capacity_block = str(reservation.get("CapacityBlockId") or "")
    return (_time(reservation.get("StartDate")), str(reservation.get("InstanceType") or ""),
            zone_as_named(reservation), capacity_block or _time(reservation.get("EndDate")))


def _block_arn(reservations: list[Mapping[str, Any]], region: str) -> str:
    """The ARN a block is known by (its tail is the block's id, :attr:`RemoteBlock.id`): its
    reservation's, or for several, the Capacity Block's id they share (a digest of their ids when
    they name none). Not an ARN EC2 answers for the latter: a name in ARN form, whose type
    ``capacity-block`` tells it from a reservation's (:func:`reservation_id`)."""
    if len(reservations) == 1:
        return arn_of(reservations[0], region)
    owner = reservations[0].get("OwnerId") or ""
    shared = {str(r.get("CapacityBlockId") or "") for r in reservations}
    if len(shared) == 1 and "" not in shared:
        return f"arn:aws:ec2:{region}:{owner}:capacity-block/{shared.pop()}"
    ids = "+".join(sorted(str(r.get("CapacityReservationId")) for r in reservations))
    return f"arn:aws:ec2:{region}:{owner}:capacity-block/{ids}"  # RemoteBlock.id digests what is not label-safe


def plan_from(name: str, reservations: Iterable[Mapping[str, Any]], region: str) -> RemotePlan:
    """The reservations one attempt bought, as one remote plan: its status the most pressing of
    theirs (one unpaid: Pending; else Active, Scheduled, Expired; all gone: Failed), its blocks
    those that hold theirs, one per window (the module's doc, "One block per window")."""
    statuses, messages = [], []
    windows: dict[tuple, list[tuple[Mapping[str, Any], str, bool]]] = defaultdict(list)
    ordered = sorted(reservations, key=lambda r: str(r.get("CapacityReservationId") or ""))
    for r in ordered:
        state = str(r.get("State") or "")
        status, holds = STATES.get(state, ("Pending", False))  # a state EC2 adds later: wait, hold nothing
        statuses.append(status)
        if state not in ("scheduled", "active"):
            messages.append(f"capacity reservation {r.get('CapacityReservationId')} is {state or 'unknown'}")
        windows[_window(r)].append((r, status, holds))
    blocks = []
    for (start, itype, zone, _), members in windows.items():
        held = [r for r, _, holds in members if holds]
        ends = [_time(r.get("EndDate")) for r in held]
        if start is None or not held or None in ends or any(status == "Pending" for _, status, _ in members) \
                or not all(r.get("TotalInstanceCount") for r in held):
            continue
        end = min(e for e in ends if e is not None)
        block_status = next(s for s in _STATUS_ORDER if s in {status for _, status, holds in members if holds})
        ultra = {tags_of(r).get(TAG_ULTRASERVER_TYPE) or None for r, _, _ in members}
        blocks.append(RemoteBlock(arn=_block_arn([r for r, _, _ in members], region), instance_type=itype,
                                  instance_count=sum(int(r["TotalInstanceCount"]) for r in held),
                                  availability_zone=zone, start=start, end=end, status=block_status,
                                  ultra_server_type=ultra.pop() if len(ultra) == 1 else None,
                                  capacity_block_ids=tuple(sorted({str(r["CapacityBlockId"]) for r, _, _ in members
                                                                   if r.get("CapacityBlockId")})),
                                  reservations=tuple(BlockReservation(str(r["CapacityReservationId"]),
                                                                      int(r["TotalInstanceCount"]), e)
                                                     for r, e in zip(held, ends) if e is not None)))
    status = next((s for s in _STATUS_ORDER if s in statuses), "Pending")
    return RemotePlan(name=name, arn=arn_of(ordered[0], region) if ordered else "", status=status,
                      status_message="; ".join(messages), blocks=tuple(sorted(blocks, key=lambda b: (b.start, b.arn))),
                      noun=NOUN)


def plans_of(reservations: Iterable[Mapping[str, Any]], region: str) -> list[RemotePlan]:
    """DescribeCapacityReservations' reservations, grouped by the attempt that bought them (its
    tag); reservations without the tag are not hyperplan's and are left out."""
    by_name: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in reservations:
        name = tags_of(r).get(TAG_REMOTE_PLAN)
        if name:
            by_name[name].append(r)
    return [plan_from(name, rs, region) for name, rs in sorted(by_name.items())]


def told_capacity_block(block: RemoteBlock) -> str | None:
    """The Capacity Block whose interconnect health is the health of the block's UltraServer, or
    None. EC2 tells one ``InterconnectStatus`` per Capacity Block, and which of a block's
    UltraServers is which machine is not known here (AWS's own UltraServer ids are not mapped to
    nodes: docs/aws.md), so only a block of one UltraServer in one Capacity Block is told: its
    UltraServer is the Capacity Block. Any other block, none (its nodes alone say)."""
    per_server = ULTRASERVER_INSTANCES.get(block.ultra_server_type or "")
    if not per_server or block.instance_count != per_server or len(block.capacity_block_ids) != 1:
        return None
    return block.capacity_block_ids[0]


def interconnect_health_of(statuses: Iterable[Mapping[str, Any]], block: RemoteBlock) -> dict[str, str]:
    """DescribeCapacityBlockStatus's answer as the health of the block's UltraServer, by its id
    here (planning.naming.ultraserver_id; :func:`told_capacity_block` says which blocks are told).
    A status EC2 adds later is taken as insufficient data."""
    wanted = told_capacity_block(block)
    for status in statuses if wanted else ():
        if status.get("CapacityBlockId") == wanted and status.get("InterconnectStatus"):
            return {naming.ultraserver_id(block.id, 0):
                    INTERCONNECT_HEALTH.get(str(status["InterconnectStatus"]), "insufficient-data")}
    return {}


def bought(answer: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The reservations a PurchaseCapacityBlock answer names (one, or several for an UltraServer)."""
    found = {str(r.get("CapacityReservationId")): r for r in answer.get("CapacityReservations") or []}
    one = answer.get("CapacityReservation")
    if one and one.get("CapacityReservationId") and str(one["CapacityReservationId"]) not in found:
        found[str(one["CapacityReservationId"])] = one
    return list(found.values())



# --------------------------------------------------------------------------- extensions

# A CapacityBlockExtensionStatus as an extension record's status (planning.remote.ExtensionRecord):
# paid, the extension holds its window (the reservation's end moves when EC2 applies it).
EXTENSION_STATES = {"payment-pending": "Pending", "payment-succeeded": "Scheduled", "payment-failed": "Failed"}


def reservation_id(remote: RemotePlan, block_id: str) -> str | None:
    """The CapacityReservationId of the remote block recorded here as ``block_id`` when that block
    is one reservation (None: the remote plan holds no such block now, or it is several:
    :func:`block_reservations`)."""
    return next((b.arn.rsplit("/", 1)[-1] for b in remote.blocks if b.id == block_id and _one_reservation(b)), None)


def block_reservations(remote: RemotePlan, block_id: str) -> tuple[BlockReservation, ...]:
    """The capacity reservations of the remote block recorded here as ``block_id`` that hold it
    (none: the remote plan holds no such block now)."""
    return next((b.reservations for b in remote.blocks if b.id == block_id), ())


def reservation_ids(remote: RemotePlan) -> list[str]:
    """The CapacityReservationIds of the remote plan's blocks, every reservation of each."""
    return sorted({r.id for b in remote.blocks for r in b.reservations}
                  | {b.arn.rsplit("/", 1)[-1] for b in remote.blocks if _one_reservation(b)})


def _one_reservation(block: RemoteBlock) -> bool:
    return ":capacity-reservation/" in block.arn


def extension_hours(policy: Policy) -> list[int]:
    """The durations a search for extension offerings asks for, in the API's hours (24 hours are
    one of the policy's days, as :func:`~hyperplan.planning.remote.duration_hours` counts them)."""
    return [days * 24 for days in EXTENSION_DAYS if policy.min_duration_days <= days <= policy.max_duration_days]


def _offered_ends(answer: Iterable[Mapping[str, Any]], start: datetime, instance_type: str, count: int,
                  zone: str) -> dict[datetime, Mapping[str, Any]]:
    """The CapacityBlockExtensionOfferings that run a reservation of ``count`` x ``instance_type`` in
    ``zone`` (by name or by zone id) on from ``start``, by their end; one that starts elsewhere,
    ends no later, or names another type, count or zone is not believed."""
    out: dict[datetime, Mapping[str, Any]] = {}
    for entry in answer:
        begin, end = _time(entry.get("CapacityBlockExtensionStartDate")), _time(entry.get("CapacityBlockExtensionEndDate"))
        if not entry.get("CapacityBlockExtensionOfferingId") or end is None or not _same_moment(begin, start) \
                or end <= start:
            continue
        if entry.get("InstanceType", instance_type) != instance_type \
                or int(entry.get("InstanceCount") or count) != count:
            continue
        found_zone, zone_id = entry.get("AvailabilityZone"), entry.get("AvailabilityZoneId")
        if found_zone not in (None, "", zone) and zone_id != zone:
            continue
        out.setdefault(end, entry)
    return out


def _extension(plan_uid: str, last: Block, end: datetime, policy: Policy) -> Extension:
    days = max(1, round((end - last.end) / policy.day))
    return Extension(extension_id(plan_uid, last, end), last, end, days)


def extensions_of(answer: Iterable[Mapping[str, Any]], plan_uid: str, last: Block,
                  policy: Policy) -> list[RemoteExtension]:
    """The CapacityBlockExtensionOfferings (every duration's, every page) of ``last`` (the plan's
    last block as recorded here) when it is one reservation: those that run it on from its end with
    its type and count in its zone, each as that block's extension under the local id. Shortest
    first."""
    ends = _offered_ends(answer, last.end, last.instance_type, last.instance_count, last.availability_zone)
    return [RemoteExtension(_extension(plan_uid, last, end, policy), str(entry["CapacityBlockExtensionOfferingId"]),
                            entry.get("UpfrontFee"), entry.get("CurrencyCode"))
            for end, entry in sorted(ends.items())]


def _taken(entries: Iterable[Mapping[str, Any]]) -> dict[tuple[str, datetime], str]:
    """The extension history as the latest status per (reservation, end): one that failed and was
    bought again counts as bought."""
    out: dict[tuple[str, datetime], str] = {}
    for e in entries:
        end = _time(e.get("CapacityBlockExtensionEndDate"))
        if end is None or not e.get("CapacityReservationId"):
            continue
        status = EXTENSION_STATES.get(str(e.get("CapacityBlockExtensionStatus") or ""), "Pending")
        key = (str(e["CapacityReservationId"]), end)
        if out.get(key) in (None, "Failed"):
            out[key] = status
    return out


def _part_status(reservation: BlockReservation, end: datetime, taken: Mapping[tuple[str, datetime], str]) -> str | None:
    """Where one reservation of a block stands for the block's extension until ``end``: Scheduled
    (it runs until then already), its history's status, or None (nothing asked yet)."""
    if reservation.end >= end:
        return "Scheduled"
    return next((status for (rid, until), status in taken.items() if rid == reservation.id and _same_moment(until, end)),
                None)


def reservations_extensions_of(answers: Mapping[str, Iterable[Mapping[str, Any]]], history: Iterable[Mapping[str, Any]],
                               plan_uid: str, last: Block, reservations: Sequence[BlockReservation],
                               policy: Policy) -> list[RemoteExtension]:
    """The extensions of ``last``, a block of several capacity reservations (``reservations``,
    as the remote plan answers them), from each reservation's own offerings (``answers``, by
    reservation id) and the extension history of all of them: an extension of the block until an
    end is offered when each reservation either runs until then already, has an extension until
    then bought and not failed, or is offered one from its own end until then; what it costs is
    those offerings' fees. Its ``parts`` are the reservations still to extend, each with its
    offering; none left to buy, nothing is offered (the history shows it: :func:`combined_records`)."""
    taken = _taken(history)
    offered = {r.id: _offered_ends(answers.get(r.id, ()), r.end, last.instance_type, r.instance_count,
                                   last.availability_zone) for r in reservations}
    ends = sorted({end for by_end in offered.values() for end in by_end if end > last.end})
    out = []
    for end in ends:
        parts, fees, currencies = [], Decimal(0), set()
        for r in reservations:
            if _part_status(r, end, taken) not in (None, "Failed"):
                continue
            entry = next((e for until, e in offered[r.id].items() if _same_moment(until, end)), None)
            if entry is None:
                break
            parts.append((r.id, str(entry["CapacityBlockExtensionOfferingId"])))
            fee = _fee(entry.get("UpfrontFee"))
            fees = fees + fee if fees is not None and fee is not None else None
            currencies.add(entry.get("CurrencyCode"))
        else:
            if parts:
                out.append(RemoteExtension(_extension(plan_uid, last, end, policy), "+".join(o for _, o in parts),
                                           str(fees) if fees is not None else None,
                                           currencies.pop() if len(currencies) == 1 else None, tuple(parts)))
    return out


def _fee(value: Any) -> Decimal | None:
    try:
        return Decimal(str(value)) if value is not None else None
    except InvalidOperation:
        return None


def combined_records(history: Iterable[Mapping[str, Any]], start: datetime,
                     reservations: Sequence[BlockReservation]) -> list[ExtensionRecord]:
    """The extension history of a block of several capacity reservations (it ends at ``start``),
    one record per end that every reservation has reached or been asked for: Failed when one of
    them failed, Pending while one is being paid, else Scheduled (each reservation's end moves when
    EC2 applies its extension; the block runs until the first of them). An end that only some
    were asked for has no record: that extension is not underway, and buying it again buys only
    the rest (:func:`parts_to_buy`)."""
    ids = {r.id for r in reservations}
    mine = [e for e in history if str(e.get("CapacityReservationId") or "") in ids]
    taken = _taken(mine)
    out = []
    for end in sorted({until for _, until in taken}):
        statuses = [_part_status(r, end, taken) for r in reservations]
        if None in statuses and "Failed" not in statuses:
            continue
        status = "Failed" if "Failed" in statuses else "Pending" if "Pending" in statuses else "Scheduled"
        offerings = sorted({str(e.get("CapacityBlockExtensionOfferingId") or "") for e in mine
                            if _same_moment(_time(e.get("CapacityBlockExtensionEndDate")), end)})
        out.append(ExtensionRecord("+".join(offerings), start, end, status))
    return out


def parts_to_buy(extension: RemoteExtension, history: Iterable[Mapping[str, Any]],
                 reservations: Sequence[BlockReservation]) -> list[tuple[str, str]]:
    """The parts of ``extension`` (reservation, offering) that the history does not show bought
    and not failed, of the reservations the block still holds: a part bought by an earlier attempt
    whose answer was lost, or before a later part's offering was gone, is not bought again."""
    taken = _taken(history)
    held = {r.id: r for r in reservations}
    return [(rid, offering) for rid, offering in extension.parts
            if rid in held and _part_status(held[rid], extension.extension.end, taken) in (None, "Failed")]


def plan_extension_records(remote: RemotePlan, history: Iterable[Mapping[str, Any]]) -> list[ExtensionRecord]:
    """DescribeCapacityBlockExtensionHistory's entries of the remote plan's reservations as the
    records planning.remote reads: a block of one reservation's entries as they are, a block of
    several as one record per end (:func:`combined_records`)."""
    entries = list(history)
    single = {b.arn.rsplit("/", 1)[-1] for b in remote.blocks if _one_reservation(b)}
    records = extension_records_of(e for e in entries if str(e.get("CapacityReservationId") or "") in single)
    for block in remote.blocks:
        if not _one_reservation(block) and block.reservations:
            records += combined_records(entries, block.end, block.reservations)
    return records


def extension_records_of(entries: Iterable[Mapping[str, Any]]) -> list[ExtensionRecord]:
    """CapacityBlockExtensions (a history page, or PurchaseCapacityBlockExtension's answer) as the
    records planning.remote reads; a status EC2 adds later counts as pending (nothing is bought
    again while it stands)."""
    return [ExtensionRecord(str(e.get("CapacityBlockExtensionOfferingId") or ""),
                            _time(e.get("CapacityBlockExtensionStartDate")), _time(e.get("CapacityBlockExtensionEndDate")),
                            EXTENSION_STATES.get(str(e.get("CapacityBlockExtensionStatus") or ""), "Pending"))
            for e in entries]
