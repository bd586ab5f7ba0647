"""EC2 Capacity Blocks as a remote source of a pool: the pure half (issue 23, docs/aws.md).

A CapacityPool with ``spec.source.ec2CapacityBlocks`` is sold by EC2 itself, for a cluster that
launches its instances (through Karpenter). This module turns what EC2 answers into the values
the SageMaker source yields too (:mod:`hyperplan.planning.remote`: ``RemoteOffering``,
``RemotePlan``, ``RemoteBlock``), so that the plan pass reads both alike. The calls are
:mod:`hyperplan.actuation.capacity_blocks`.

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
as a smaller one, and its id would change). Such a block is not extended here (an extension is
bought per reservation: :func:`reservation_id`).

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
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any, Iterable, Mapping

from hyperplan.api.vocabulary import GROUP, TAG_TRAINING_PLAN_UID, ULTRASERVER_INSTANCES
from hyperplan.planning import naming
from hyperplan.planning.blocks import Block
from hyperplan.planning.offerings import EXTENSION_DAYS, Extension, Offering, OfferingRequest, extension_id
from hyperplan.planning.policy import Policy
from hyperplan.planning.remote import (ExtensionRecord, RemoteBlock, RemoteExtension, RemoteOffering, RemotePlan,
                                       _same_moment, _time, duration_hours)

TAG_REMOTE_PLAN = f"{GROUP}/remote-plan"  # the name of the attempt that bought the reservation
TAG_ZONE = f"{GROUP}/availability-zone"  # the zone as the buying pool names it (a name or an id)
TAG_ULTRASERVER_TYPE = f"{GROUP}/ultraserver-type"  # an UltraServer purchase's type, in hyperplan's naming
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
    """What makes reservations of one attempt one block: the same window, type and zone."""
    return (_time(reservation.get("StartDate")), _time(reservation.get("EndDate")),
            str(reservation.get("InstanceType") or ""), zone_as_named(reservation))


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
    for (start, end, itype, zone), members in windows.items():
        held = [r for r, _, holds in members if holds]
        if start is None or end is None or not held or any(status == "Pending" for _, status, _ in members) \
                or not all(r.get("TotalInstanceCount") for r in held):
            continue
        block_status = next(s for s in _STATUS_ORDER if s in {status for _, status, holds in members if holds})
        ultra = {tags_of(r).get(TAG_ULTRASERVER_TYPE) or None for r, _, _ in members}
        blocks.append(RemoteBlock(arn=_block_arn([r for r, _, _ in members], region), instance_type=itype,
                                  instance_count=sum(int(r["TotalInstanceCount"]) for r in held),
                                  availability_zone=zone, start=start, end=end, status=block_status,
                                  ultra_server_type=ultra.pop() if len(ultra) == 1 else None,
                                  capacity_block_ids=tuple(sorted({str(r["CapacityBlockId"]) for r, _, _ in members
                                                                   if r.get("CapacityBlockId")}))))
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
    """The CapacityReservationId of the remote block recorded here as ``block_id`` (None: the
    remote plan holds no such block now, or the block is several reservations, which are not
    extended here: the module's doc, "One block per window")."""
    return next((b.arn.rsplit("/", 1)[-1] for b in remote.blocks if b.id == block_id and _one_reservation(b)), None)


def reservation_ids(remote: RemotePlan) -> list[str]:
    """The CapacityReservationIds of the remote plan's blocks that are one reservation each."""
    return sorted({b.arn.rsplit("/", 1)[-1] for b in remote.blocks if _one_reservation(b)})


def _one_reservation(block: RemoteBlock) -> bool:
    return ":capacity-reservation/" in block.arn


def extension_hours(policy: Policy) -> list[int]:
    """The durations a search for extension offerings asks for, in the API's hours (24 hours are
    one of the policy's days, as :func:`~hyperplan.planning.remote.duration_hours` counts them)."""
    return [days * 24 for days in EXTENSION_DAYS if policy.min_duration_days <= days <= policy.max_duration_days]


def extensions_of(answer: Iterable[Mapping[str, Any]], plan_uid: str, last: Block,
                  policy: Policy) -> list[RemoteExtension]:
    """The CapacityBlockExtensionOfferings (every duration's, every page) that run ``last`` (the
    plan's last block as recorded here) on from its end with its type and count in its zone (by
    name or by zone id), each as that block's extension under the local id; one that starts
    elsewhere, ends no later, or names another type, count or zone is not believed. Shortest first."""
    out: dict[str, RemoteExtension] = {}
    for entry in answer:
        remote_id = entry.get("CapacityBlockExtensionOfferingId")
        start, end = _time(entry.get("CapacityBlockExtensionStartDate")), _time(entry.get("CapacityBlockExtensionEndDate"))
        if not remote_id or end is None or not _same_moment(start, last.end) or end <= last.end:
            continue
        if entry.get("InstanceType", last.instance_type) != last.instance_type \
                or int(entry.get("InstanceCount") or last.instance_count) != last.instance_count:
            continue
        zone, zone_id = entry.get("AvailabilityZone"), entry.get("AvailabilityZoneId")
        if zone not in (None, "", last.availability_zone) and zone_id != last.availability_zone:
            continue
        days = max(1, round((end - last.end) / policy.day))
        ext = Extension(extension_id(plan_uid, last, end), last, end, days)
        out.setdefault(ext.id, RemoteExtension(ext, str(remote_id), entry.get("UpfrontFee"), entry.get("CurrencyCode")))
    return sorted(out.values(), key=lambda e: e.extension.end)


def extension_records_of(entries: Iterable[Mapping[str, Any]]) -> list[ExtensionRecord]:
    """CapacityBlockExtensions (a history page, or PurchaseCapacityBlockExtension's answer) as the
    records planning.remote reads; a status EC2 adds later counts as pending (nothing is bought
    again while it stands)."""
    return [ExtensionRecord(str(e.get("CapacityBlockExtensionOfferingId") or ""),
                            _time(e.get("CapacityBlockExtensionStartDate")), _time(e.get("CapacityBlockExtensionEndDate")),
                            EXTENSION_STATES.get(str(e.get("CapacityBlockExtensionStatus") or ""), "Pending"))
            for e in entries]
