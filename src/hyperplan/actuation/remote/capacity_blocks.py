"""EC2 Capacity Blocks as a remote source of a pool: the calls (docs/aws.md).

:class:`CapacityBlocks` is the :class:`~hyperplan.actuation.remote.CapacitySeller` of a pool with
``spec.source.ec2CapacityBlocks``: it searches with ``DescribeCapacityBlockOfferings``, buys with
``PurchaseCapacityBlock`` and follows with ``DescribeCapacityReservations`` (UltraServer Capacity
Blocks too, for a pool that declares an UltraServer type), through boto3's EC2
client set as the SageMaker one is (actuation.remote.client_config). What the answers mean is
:mod:`hyperplan.planning.capacity_blocks`.

**A purchase spends money and EC2 has no client token for it**, so buying twice is kept out three
ways:

1. Right before ``PurchaseCapacityBlock``, a fresh ``DescribeCapacityReservations`` filtered by the
   local plan's uid tag (not the paced listing): a reservation of the plan that is live or being
   paid is answered instead of buying (a pass killed after EC2 bought and before this cluster
   recorded it adopts what was bought), and an attempt's name that was used is never used again.
2. ``PurchaseCapacityBlock`` goes through a client of its own **without boto3's retries**: a retry
   after a lost answer (a timeout, a 5xx, a dropped connection) would buy a second block.
3. EC2's describe calls are eventually consistent: what this process bought is kept for
   :data:`UNCERTAIN_FOR` and added to what the describes show until they show it (so a listing
   that lags never makes a plan buy again), and a purchase whose outcome is unknown (that same
   lost answer) holds every further purchase of the plan for as long while the uid check does not
   show a reservation: the pass fails with ``PurchaseOutcomeUnknown`` and is retried with the work
   queue's backoff. Kept in memory: after a restart, step 1 is the guard.

**Extensions** (:class:`ExtendsCapacityBlocks`): ``DescribeCapacityBlockExtensionOfferings`` per
duration, ``PurchaseCapacityBlockExtension`` through the same client without retries, and
``DescribeCapacityBlockExtensionHistory``, which the plan pass reads before it asks (the
handler's guard, controllers.plan.remote.extend, holds a plan's next extension while an answer is
unknown).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping, Sequence

from hyperplan.actuation.remote.calls import NotBought, RemoteCalls, RemoteError, make_client
from hyperplan.api.models import Ec2CapacityBlocksSource
from hyperplan.planning import capacity_blocks as cb
from hyperplan.planning.blocks import Block
from hyperplan.planning.offerings import OfferingRequest
from hyperplan.planning.policy import Policy
from hyperplan.planning.remote import (
    ExtensionRecord,
    PoolTerms,
    RemoteExtension,
    RemoteOffering,
    RemotePlan,
    standing_of,
)

PAGE = 1000  # MaxResults' bound in EC2's describe calls
UNCERTAIN_FOR = 120.0  # seconds a purchase of unknown outcome holds the plan's next one
# What PurchaseCapacityBlock answers when the offering is no longer there to buy (sold to someone
# else since the search, or expired): not the pass's error, the plan searches again.
OFFERING_GONE = ("InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientCapacityBlockCapacity",
                 "CapacityBlockOfferingNotFound", "InvalidCapacityBlockOfferingId.NotFound",
                 "InvalidCapacityBlockOfferingId", "OfferingNotFound")
# ... and PurchaseCapacityBlockExtension when the extension is no longer there to buy.
EXTENSION_GONE = OFFERING_GONE + ("InvalidCapacityBlockExtensionOfferingId.NotFound",
                                  "InvalidCapacityBlockExtensionOfferingId", "CapacityBlockExtensionOfferingNotFound")


class ExtendsCapacityBlocks:
    """The extension half of :class:`~hyperplan.actuation.remote.CapacitySeller` over EC2's three
    extension calls, shared by the real client and the unit tests' fake (hyperplan_testing.fakes), as
    SageMakerSelling is by the SageMaker ones: ``describe_extension_offerings(reservation, hours)``,
    ``extension_entries(reservations)`` and ``purchase_extension(offering, reservation)``."""

    extend_right = "ec2:PurchaseCapacityBlockExtension"
    endpoint: str
    describe_extension_offerings: Callable[[str, int], "list[Mapping[str, Any]]"]
    extension_entries: Callable[[list[str]], "list[Mapping[str, Any]]"]
    purchase_extension: Callable[[str, str], "list[Mapping[str, Any]]"]

    def find_extensions(self, remote: RemotePlan, plan_uid: str, blocks: Sequence[Block],
                        policy: Policy) -> list[RemoteExtension]:
        if not blocks:
            return []
        last = max(blocks, key=lambda b: (b.end, b.start))
        reservation = cb.reservation_id(remote, last.id)
        if reservation is not None:
            return cb.extensions_of(self._extension_offers(reservation, policy), plan_uid, last, policy)
        reservations = cb.block_reservations(remote, last.id)  # an UltraServer block: each reservation's own
        if not reservations:
            return []
        answers = {r.id: self._extension_offers(r.id, policy) for r in reservations}
        history = self.extension_entries([r.id for r in reservations])
        return cb.reservations_extensions_of(answers, history, plan_uid, last, reservations, policy)

    def _extension_offers(self, reservation: str, policy: Policy) -> list:
        """Every extension EC2 offers one reservation: a call per duration (it answers one a call)."""
        return [o for hours in cb.extension_hours(policy) for o in self.describe_extension_offerings(reservation, hours)]

    def extension_history(self, remote: RemotePlan) -> list[ExtensionRecord]:
        reservations = cb.reservation_ids(remote)
        return cb.plan_extension_records(remote, self.extension_entries(reservations)) if reservations else []

    def extend(self, remote: RemotePlan, extension: RemoteExtension) -> list[ExtensionRecord]:
        block = extension.extension.block
        if extension.parts:
            return self._extend_reservations(remote, extension)
        reservation = cb.reservation_id(remote, block.id)
        if reservation is None:
            raise NotBought(f"{remote.noun} {remote.name} no longer holds block {block.id}")
        try:
            return cb.extension_records_of(self.purchase_extension(extension.remote_id, reservation))
        except RemoteError as e:
            if e.code in EXTENSION_GONE:
                raise NotBought(f"EC2 no longer sells extension {extension.extension.id} of capacity reservation "
                                f"{reservation}: {e.code}: {e.message}") from None
            raise

    def _extend_reservations(self, remote: RemotePlan, extension: RemoteExtension) -> list[ExtensionRecord]:
        """A block of several reservations: each reservation's extension, one after another, those
        the history shows bought left out (a part bought before a lost answer or a refusal of the
        next). Not atomic, as EC2 sells them one by one: a part refused leaves the others bought,
        and the block runs until the first of its reservations' ends until that part is bought too
        (the next search offers only it) or the block ends."""
        block = extension.extension.block
        reservations = cb.block_reservations(remote, block.id)
        if not reservations or {rid for rid, _ in extension.parts} - {r.id for r in reservations}:
            raise NotBought(f"{remote.noun} {remote.name} no longer holds block {block.id} as it was offered")
        history = self.extension_entries([r.id for r in reservations])
        bought: list[Mapping[str, Any]] = []
        for reservation, offering in cb.parts_to_buy(extension, history, reservations):
            try:
                bought += self.purchase_extension(offering, reservation)
            except RemoteError as e:
                if e.code not in EXTENSION_GONE:
                    raise
                done = sorted({str(b.get("CapacityReservationId")) for b in bought})
                raise NotBought(f"EC2 no longer sells extension {extension.extension.id} of capacity reservation "
                                f"{reservation} (block {block.id}): {e.code}: {e.message}"
                                + (f"; {', '.join(done)} extended already: the block runs until the first of its "
                                   "reservations' ends until the rest is extended" if done else "")) from None
        return cb.combined_records([*history, *bought], block.end, reservations)


class CapacityBlocks(RemoteCalls, ExtendsCapacityBlocks):
    """EC2 Capacity Blocks of one region and key. ``client`` (and ``buy_client``, which defaults to
    it) are seams for botocore's Stubber in the unit tests."""

    page_size = PAGE

    def __init__(self, source: Ec2CapacityBlocksSource, credentials: tuple[str, str] | None = None,
                 client: Any = None, buy_client: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        if client is None:
            client = make_client(source, credentials)
            buy_client = make_client(source, credentials, attempts=1)  # never retried: see the module's doc
        self.client = client
        self.buy_client = buy_client if buy_client is not None else client
        self.endpoint = source.endpoint or client.meta.endpoint_url
        self.clock = clock
        self._uncertain: dict[str, float] = {}  # plan uid -> when a purchase of unknown outcome was made
        self._bought: dict[str, tuple[str, float, RemotePlan]] = {}  # attempt name -> (plan uid, when, plan)
        self._lock = threading.Lock()
        self._zone_ids: dict[str, str] | None = None  # zone id by name (DescribeAvailabilityZones), once

    # ------------------------------------------------------------------ the calls

    def describe_offerings(self, arguments: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """DescribeCapacityBlockOfferings, every page."""
        return self._pages("DescribeCapacityBlockOfferings", "describe_capacity_block_offerings",
                           "CapacityBlockOfferings", **arguments)

    def describe_reservations(self, filters: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """DescribeCapacityReservations with ``filters``, every page."""
        return self._pages("DescribeCapacityReservations", "describe_capacity_reservations", "CapacityReservations",
                           Filters=list(filters))

    def purchase(self, offering_id: str, tag_specifications: list[dict[str, Any]]) -> Mapping[str, Any]:
        """PurchaseCapacityBlock, once (its client makes no retries)."""
        return self._call("PurchaseCapacityBlock", "purchase_capacity_block", client=self.buy_client,
                          CapacityBlockOfferingId=offering_id, InstancePlatform=cb.PLATFORM,
                          TagSpecifications=tag_specifications)

    def describe_extension_offerings(self, reservation: str, hours: int) -> list[Mapping[str, Any]]:
        """DescribeCapacityBlockExtensionOfferings for one reservation and duration, every page."""
        return self._pages("DescribeCapacityBlockExtensionOfferings", "describe_capacity_block_extension_offerings",
                           "CapacityBlockExtensionOfferings", CapacityReservationId=reservation,
                           CapacityBlockExtensionDurationHours=hours)

    def extension_entries(self, reservations: list[str]) -> list[Mapping[str, Any]]:
        """DescribeCapacityBlockExtensionHistory of the reservations, every page."""
        return self._pages("DescribeCapacityBlockExtensionHistory", "describe_capacity_block_extension_history",
                           "CapacityBlockExtensions", CapacityReservationIds=list(reservations))

    def purchase_extension(self, offering_id: str, reservation: str) -> list[Mapping[str, Any]]:
        """PurchaseCapacityBlockExtension, once (the purchase's client makes no retries)."""
        answer = self._call("PurchaseCapacityBlockExtension", "purchase_capacity_block_extension",
                            client=self.buy_client, CapacityBlockExtensionOfferingId=offering_id,
                            CapacityReservationId=reservation)
        return list(answer.get("CapacityBlockExtensions") or [])

    # ------------------------------------------------------------------ CapacitySeller

    def ultra_server_health(self, block: Any) -> dict[str, str]:
        """DescribeCapacityBlockStatus of the block's Capacity Block, as its UltraServer's health
        (planning.capacity_blocks.told_capacity_block: asked for a block of one UltraServer only; a
        block bought before its reservations were tagged with their UltraServer type is not asked)."""
        told = cb.told_capacity_block(block)
        if told is None:
            return {}
        statuses = self._pages("DescribeCapacityBlockStatus", "describe_capacity_block_status",
                               "CapacityBlockStatuses", CapacityBlockIds=[told])
        return cb.interconnect_health_of(statuses, block)

    def find_offerings(self, request: OfferingRequest, policy: Policy,
                  pools: Sequence[PoolTerms]) -> list[RemoteOffering]:
        if not pools:
            return []
        answer = self.describe_offerings(cb.search_arguments(request, policy))
        zone_ids = self.zone_ids() if any(cb.is_zone_id(p.availability_zone) for p in pools) else {}
        return [o for p in pools for o in cb.offerings_of(answer, p.name, p.instance_type, p.availability_zone,
                                                          request, p.ultra_server_type, zone_ids)]

    def zone_ids(self) -> dict[str, str]:
        """Each zone's id by its name in the region, for pools that name their zone by id
        (DescribeAvailabilityZones with Local Zones, once: an account's names and ids never change)."""
        if self._zone_ids is None:
            answer = self._call("DescribeAvailabilityZones", "describe_availability_zones", AllAvailabilityZones=True)
            self._zone_ids = cb.zone_ids_of(answer.get("AvailabilityZones") or [])
        return self._zone_ids

    def _recent(self, plan_uid: str | None = None) -> list[RemotePlan]:
        """What this process bought in the last UNCERTAIN_FOR seconds (of one plan, or of all)."""
        now = self.clock()
        with self._lock:
            for name, (_, at, _plan) in list(self._bought.items()):
                if now - at >= UNCERTAIN_FOR:
                    del self._bought[name]
            return [p for uid, _, p in self._bought.values() if plan_uid is None or uid == plan_uid]

    def remote_plans(self) -> list[RemotePlan]:
        """Every reservation a hyperplan purchase tagged, by attempt, and what this process bought
        lately that EC2 does not show yet (its describe calls are eventually consistent)."""
        listed = cb.plans_of(self.describe_reservations(cb.listing_filter()), self.source.region)
        names = {p.name for p in listed}
        return listed + [p for p in self._recent() if p.name not in names]

    def remote_plan(self, name: str, plan_uid: str) -> RemotePlan | None:
        """The reservations of one attempt: DescribeCapacityReservations filtered by the plan's uid
        tag (and what this process bought lately that EC2 does not show yet)."""
        mine = cb.plans_of(self.describe_reservations(cb.uid_filter(plan_uid)), self.source.region)
        mine += [p for p in self._recent(plan_uid) if p.name not in {m.name for m in mine}]
        return next((p for p in mine if p.name == name), None)

    def buy(self, name: str, plan_uid: str, offering: RemoteOffering, spares: int | None,
            tags: Mapping[str, str]) -> RemotePlan:
        mine = cb.plans_of(self.describe_reservations(cb.uid_filter(plan_uid)), self.source.region)
        names = {p.name for p in mine}
        mine += [p for p in self._recent(plan_uid) if p.name not in names]
        standing = standing_of(mine, plan_uid)
        if standing.live is not None:  # bought before (a pass killed, an answer lost): adopt it, buy nothing
            with self._lock:
                self._uncertain.pop(plan_uid, None)
            return standing.live
        if any(p.name == name for p in mine):
            raise NotBought(f"the capacity block attempt {name} was used already; reading the reservations again")
        with self._lock:
            since = self._uncertain.get(plan_uid)
        if since is not None and self.clock() - since < UNCERTAIN_FOR:
            raise RemoteError("PurchaseCapacityBlock", "PurchaseOutcomeUnknown", (
                f"an earlier purchase for this plan got no answer; EC2 does not show its reservation yet, and "
                f"nothing is bought again for {UNCERTAIN_FOR:.0f} s"), self.endpoint)
        try:
            block = offering.offering.blocks[0]  # its zone as the pool names it, and its UltraServer type
            answer = self.purchase(offering.remote_id, cb.purchase_tags(
                name, tags, block.availability_zone, block.ultra_server_type))
        except RemoteError as e:
            if e.code in OFFERING_GONE:
                raise NotBought(f"EC2 no longer sells capacity block offering {offering.offering.id}: "
                                f"{e.code}: {e.message}") from None
            if not e.refused:  # no answer, or a failure of EC2's own: it may have bought
                with self._lock:
                    self._uncertain[plan_uid] = self.clock()
            raise
        reservations = cb.bought(answer)
        with self._lock:
            self._uncertain.pop(plan_uid, None)
            if not reservations:  # bought, but unnamed: nothing more for this plan until EC2 shows it
                self._uncertain[plan_uid] = self.clock()
        if not reservations:
            raise NotBought(f"EC2 answered the purchase of offering {offering.offering.id} without a capacity "
                            "reservation; reading the reservations again")
        plan = cb.plan_from(name, reservations, self.source.region)
        with self._lock:
            self._bought[name] = (plan_uid, self.clock(), plan)
        return plan
