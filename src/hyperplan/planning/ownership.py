"""Which nodes a group holds: from the operator's own record, never from what a node says.

A node is listed for a group by the group label (``hyperplan.dev/instance-group``), but a kubelet
may set ``hyperplan.dev/*`` labels and annotations on its own Node, so a label proves nothing. The
group's ``status.nodes`` (:class:`~hyperplan.api.models.GroupNode`, written only by the operator in
its pass's one status patch) names each node the group holds by name and uid, the way Karpenter
ties a Node to its NodeClaim. This module decides, purely:

* which listed nodes the group holds (:func:`sort_nodes`): in the record under the same name and
  uid. Every other node that carries the group's label is *unrecorded*: it is not counted,
  changed, cordoned, drained or deleted, and the group reports it (:func:`unrecorded_condition`,
  and a Warning Event per node);
* the record a pass writes (:func:`next_record`): what it held, what it created or adopted (with
  the uid the API server answered), less what it released;
* for a group from before the record existed (``status.nodes`` never written, but the group has
  a status), what its first pass records (:func:`migrated_entry`): on KWOK the nodes the provider
  makes (its annotation, and a ``node-id`` equal to the name); on the static pool the nodes held
  under the group's label, with the lent record an earlier version kept in the node's annotation
  (read once, through ``LentRecord.safe``). A brand-new group records from nothing.

The crash window between a create and the status patch is closed the way Karpenter's NodeClaim
is made before its instance: intent first. A pass that creates or adopts writes, before the
write to the node, the entries it is about to make (:func:`pending_entry`: the node id, the name
on KWOK, no uid, and ``claim``: the SHA-256 of a nonce that exists only in the operator's memory
until it is written on the node as ``hyperplan.dev/claim``). When its status patch after the
create lands, the entry has its uid and no claim. When the operator died in between, the next
pass finds the node under the group's label carrying the nonce whose digest the record holds
(:func:`claimed_by`), and holds it (its uid recorded from the node). Nobody else could have
written that nonce before the operator did, and a digest names one node: a claim that two
listed nodes answer (the nonce copied from the node to another) holds neither. What a static
node looked like before its adoption is lost with the process in that window: its hand-back
removes what the group set and leaves the rest.

A node that carries the group's label and neither a record entry nor a claim is unrecorded: the
pass reports it (Warning ``NodeNotOwned``, condition ``UnrecordedNodes``), and planning makes no
node of that name while it stands. An admin deletes such a KWOK node (the group then makes it
again) or hands such a static node back (``node-restriction.kubernetes.io/hyperplan-pool=free``,
the group's labels removed).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from hyperplan.api.models import Condition, GroupNode, NodeClaimRef, VanishedRecord
from hyperplan.api.vocabulary import (
    CONDITION_NODES_LAUNCHED,
    REASON_CLAIM_DELETED,
    REASON_NOT_OFFERED,
    to_rfc3339,
    ANNOTATION_CLAIM,
    ANNOTATION_CORDONED,
    ANNOTATION_LENT,
    KWOK_ANNOTATION,
    LABEL_NODE_ID,
    POOL_HELD,
)
from hyperplan.planning import lending
from hyperplan.planning.plans import Event, condition

CONDITION_UNRECORDED = "UnrecordedNodes"
REASON_NOT_OWNED = "NodeNotOwned"
MAX_NAMED = 20  # nodes named in the condition's message


@dataclass(frozen=True)
class ListedNode:
    """A node listed under the group's label, as ownership needs it."""

    name: str
    uid: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    provider_id: str = ""  # spec.providerID (karpenter: how a Node is tied to its NodeClaim)
    deleting: bool = False


@dataclass(frozen=True)
class Sorted:
    held: tuple[tuple[ListedNode, GroupNode], ...]  # listed and in the record, same uid
    unrecorded: tuple[ListedNode, ...]  # listed, carry the group's label, not in the record
    missing: tuple[GroupNode, ...]  # in the record, its name not listed at all

    @property
    def unaccounted(self) -> tuple[GroupNode, ...]:
        """The missing entries not recorded as vanished: made by a pass whose creates a watch
        cache may not show yet, or gone; only a listing from the API server says which."""
        return tuple(entry for entry in self.missing if entry.vanished is None)


def migrated_entry(node: ListedNode, provider: str) -> GroupNode | None:
    """What the first pass of a group from before the record existed records for ``node``, or
    None (it stays unrecorded). KWOK: a node the provider made (its annotation, ``node-id`` equal
    to the name). Static: a node held under the group's label, with the lent record the earlier
    version kept on the node, without the keys a hand-back never writes."""
    if provider == "static":
        node_id = node.labels.get(LABEL_NODE_ID)
        if node.labels.get(lending.LABEL_POOL) != POOL_HELD or not node_id:
            return None
        record = lending.LentRecord.load(node.annotations.get(ANNOTATION_LENT)).safe()
        return GroupNode(name=node.name, uid=node.uid, node_id=node_id, lent=record.state(),
                         cordoned=node.annotations.get(ANNOTATION_CORDONED) == "true")
    if node.annotations.get(KWOK_ANNOTATION) != "fake" or node.labels.get(LABEL_NODE_ID, node.name) != node.name:
        return None
    return GroupNode(name=node.name, uid=node.uid, node_id=node.name)


def sort_nodes(record: Sequence[GroupNode] | None, listed: Sequence[ListedNode], provider: str,
               migrating: bool = False) -> Sorted:
    """The listed nodes the group holds (by name and uid in ``record``), the ones it does not,
    and the recorded ones not listed. ``record`` None with ``migrating``: the group's first pass
    since the record exists, which records per :func:`migrated_entry` (each node id once)."""
    if record is None:
        record = []
        if migrating:
            ids: set[str] = set()
            for node in sorted(listed, key=lambda n: n.name):
                entry = migrated_entry(node, provider)
                if entry is not None and entry.node_id not in ids:
                    ids.add(entry.node_id)
                    record.append(entry)
    by_name = {entry.name: entry for entry in record if entry.claim is None}
    claimed = claimed_by([entry for entry in record if entry.claim is not None], listed, provider)
    held, unrecorded, seen = [], [], set()
    for node in listed:
        entry = by_name.get(node.name)
        if entry is not None and entry.uid and entry.uid == node.uid:
            held.append((node, entry))
            seen.add(entry.name)
        elif node.name in claimed:
            pending = claimed[node.name]
            held.append((node, pending.model_copy(update={"name": node.name, "uid": node.uid, "claim": None})))
            seen.add(pending.name)
        elif not node.deleting:  # one on its way out (a NodeClaim's Node Karpenter terminates) is no stray
            unrecorded.append(node)
    # A recorded node whose name is listed with another uid is gone (that name is another node now).
    listed_names = {node.name for node in listed}
    missing = tuple(entry for entry in record if entry.name not in seen and entry.name not in listed_names)
    return Sorted(tuple(held), tuple(unrecorded), missing)


def claim_digest(nonce: str) -> str:
    """What the record holds of the nonce written on a node: its SHA-256, hex."""
    return hashlib.sha256(nonce.encode()).hexdigest()


def pending_entry(node_id: str, nonce: str) -> GroupNode:
    """The record's entry for a node about to be created (KWOK: named ``node_id``) or adopted
    (static: the name is the chosen free node's, known when the node answers the claim)."""
    return GroupNode(name=node_id, uid="", node_id=node_id, claim=claim_digest(nonce))


def claimed_by(pending: Sequence[GroupNode], listed: Sequence[ListedNode], provider: str) -> dict[str, GroupNode]:
    """The listed nodes (by name) that answer a pending entry's claim: the node carries the nonce
    whose digest the entry holds, and on KWOK it has the entry's name. A digest two nodes answer
    holds neither (the nonce was copied from one to the other)."""
    by_digest: dict[str, list[ListedNode]] = {}
    for node in listed:
        nonce = node.annotations.get(ANNOTATION_CLAIM)
        if nonce:
            by_digest.setdefault(claim_digest(nonce), []).append(node)
    out: dict[str, GroupNode] = {}
    for entry in pending:
        nodes = by_digest.get(entry.claim or "", [])
        if len(nodes) == 1 and (provider == "static" or nodes[0].name == entry.name) and nodes[0].uid:
            out[nodes[0].name] = entry
    return out


def next_record(found: Sorted, made: Iterable[GroupNode] = (), changed: Mapping[str, GroupNode] | None = None,
                released: Iterable[str] = (), listed_fresh: bool = True,
                launching: Iterable[GroupNode] = (), vanished: Mapping[str, VanishedRecord] | None = None
                ) -> list[GroupNode]:
    """The record a pass writes: the nodes it held (``changed`` by node id: the entries whose lent
    record or cordon the pass moved), the NodeClaims still ``launching`` (:func:`bind_claims`), the
    nodes it ``made`` (with the uid the API answered), less the node ids it ``released``.

    A recorded node that was not listed is kept with its ``vanished`` record (by node id: the
    group's memory says it was deleted from under the group and its slot is not replaced yet).
    Otherwise it is kept while the list came from the watch cache (it may lag behind the pass's
    own creates) and dropped when it came from the API server (``listed_fresh``): the node is gone.
    An entry that was marked vanished and is no longer is dropped either way (its slot holds a
    replacement). A held node is not vanished."""
    changed, released, vanished = changed or {}, set(released), vanished or {}
    entries = [changed.get(entry.node_id, entry).model_copy(update={"vanished": None})
               if entry.vanished is not None else changed.get(entry.node_id, entry) for _, entry in found.held]
    entries += list(launching)
    for entry in found.missing:
        if entry.node_id in vanished:
            entries.append(entry.model_copy(update={"vanished": vanished[entry.node_id]}))
        elif not listed_fresh and entry.vanished is None:
            entries.append(entry)
    entries += list(made)
    out: dict[str, GroupNode] = {}
    for entry in entries:
        if entry.node_id not in released:
            out[entry.node_id] = entry
    return [out[k] for k in sorted(out)]


def apply_pass(record: Sequence[GroupNode], made: Iterable[GroupNode] = (),
               changed: Mapping[str, GroupNode] | None = None, released: Iterable[str] = ()) -> list[GroupNode]:
    """What a pass did to the record (the nodes it ``made``, the entries it ``changed`` and the
    node ids it ``released``, as for :func:`next_record`) applied to ``record`` as another writer
    left it meanwhile: that writer's entries are kept, the pass's own moves win."""
    changed, released = changed or {}, set(released)
    out = {entry.node_id: changed.get(entry.node_id, entry) for entry in record}
    for entry in made:
        out[entry.node_id] = entry
    return [out[k] for k in sorted(out) if k not in released]


def unrecorded_condition(unrecorded: Sequence[ListedNode], group: str, generation: int,
                         prior: Sequence[Condition], now: datetime) -> Condition | None:
    """``UnrecordedNodes=True`` (reason ``NodeNotOwned``) naming the nodes that carry the group's
    label but are not in its record; None when there is none (the condition goes)."""
    if not unrecorded:
        return None
    names = sorted(n.name for n in unrecorded)
    shown = ", ".join(names[:MAX_NAMED]) + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")
    return condition(CONDITION_UNRECORDED, True, REASON_NOT_OWNED,
                     f"{len(names)} node(s) carry the label of group {group} but are not in its record "
                     f"(status.nodes): {shown}; they are left alone (not counted, changed or deleted). "
                     "To have the group make or adopt a node again in the place of one of them, delete it "
                     f"(KWOK) or hand it back (static: {lending.LABEL_POOL}={lending.POOL_FREE}, the group's labels removed)",
                     generation, prior, now)


def not_owned_message(node: ListedNode, group: str) -> str:
    """The Warning Event for one unrecorded node (posted once per node)."""
    claimed = node.labels.get(LABEL_NODE_ID)
    as_id = f" as node id {claimed}" if claimed and claimed != node.name else ""
    return (f"node {node.name} (uid {node.uid}) carries the label of group {group}{as_id} but is not in the "
            "group's record: the operator leaves it alone")


# --------------------------------------------------------------------------- Karpenter's NodeClaims


@dataclass(frozen=True)
class ListedClaim:
    """A NodeClaim listed under the group's label, as ownership needs it: what Karpenter wrote in
    its status (``providerID`` once launched, ``nodeName`` once its Node registered)."""

    name: str
    uid: str
    annotations: Mapping[str, str]
    node_id: str  # its hyperplan.dev/node-id label (a hint to match a claim of a pending entry; not proof)
    created: datetime | None
    provider_id: str = ""
    node_name: str = ""
    deleting: bool = False
    # Karpenter's ``Launched`` condition of the claim, when it says the launch failed (:func:`launch_failure`).
    launch_failure: "LaunchCause | None" = None


@dataclass(frozen=True)
class Binding:
    """The record of a karpenter group with each NodeClaim tied to its Node where Karpenter
    registered one (``record``: what :func:`sort_nodes` sorts), the claims still waiting for their
    Node (``launching``: kept in the record, their slots taken), and the entries to let go:
    ``expired`` (no Node within the launch timeout: the pass deletes the claim and makes the slot
    again) and ``gone`` (the claim no longer exists)."""

    record: list[GroupNode]
    launching: tuple[GroupNode, ...] = ()
    expired: tuple[GroupNode, ...] = ()
    gone: tuple[GroupNode, ...] = ()
    # The providerIDs of the launching claims: a Node with one is on its way to registration (the
    # provider makes it before Karpenter writes the claim's nodeName); it is neither held nor a stray yet.
    arriving: frozenset[str] = frozenset()
    # The node ids of launching claims whose providerID Karpenter has not written yet: the provider
    # may make the Node a moment before. A Node labelled with one is not reported as a stray in that
    # moment (it is not held either: a label proves nothing).
    unlaunched: frozenset[str] = frozenset()

    def not_arriving(self, nodes: Sequence[ListedNode]) -> list[ListedNode]:
        """``nodes`` less those on their way to a launching claim (see ``arriving``)."""
        return [n for n in nodes if not (n.provider_id and n.provider_id in self.arriving)
                and n.labels.get(LABEL_NODE_ID) not in self.unlaunched]

    def launch_deadline(self, timeout: timedelta, claims: Sequence[ListedClaim]) -> datetime | None:
        """When the first launching claim times out (None: none launching)."""
        created = {c.uid: c.created for c in claims}
        times = [t + timeout for e in self.launching if e.node_claim and (t := created.get(e.node_claim.uid))]
        return min(times) if times else None


def needs_claims(record: Sequence[GroupNode] | None) -> bool:
    """Whether a karpenter group's pass must list its NodeClaims: an entry is pending (its claim
    may exist, made by a pass that died before its record) or waits for its claim's Node."""
    return any(entry.claim is not None or (entry.node_claim is not None and not entry.uid)
               for entry in record or ())


def bind_claims(record: Sequence[GroupNode] | None, claims: Sequence[ListedClaim], nodes: Sequence[ListedNode],
                now: datetime, launch_timeout: timedelta) -> Binding:
    """Tie a karpenter group's NodeClaims to their Nodes, the way Karpenter does, from what only
    the operator and Karpenter write; never from a Node's labels:

    * a pending entry (intent written, create under way when the process died) holds the claim
      that carries the nonce of its digest and the entry's node id label (one claim only, as for
      nodes, :func:`claimed_by`);
    * an entry with a claim (by name and uid) and no Node yet holds the Node the claim's status
      names (``nodeName``) once that Node's ``providerID`` is the claim's: the entry's name and uid
      become the Node's. A Node that says it is the claim's, by labels, owner references or a name,
      is not enough;
    * a claim not listed any more is gone; one without its Node past ``launch_timeout`` from its
      creation has expired (Karpenter killed mid-launch never makes that Node)."""
    by_uid = {c.uid: c for c in claims if c.uid}
    by_digest: dict[str, list[ListedClaim]] = {}
    for c in claims:
        if nonce := c.annotations.get(ANNOTATION_CLAIM):
            by_digest.setdefault(claim_digest(nonce), []).append(c)
    nodes_by_name = {n.name: n for n in nodes}
    out: list[GroupNode] = []
    launching: list[GroupNode] = []
    expired: list[GroupNode] = []
    gone: list[GroupNode] = []
    arriving: set[str] = set()
    unlaunched: set[str] = set()
    for entry in record or ():
        if entry.claim is not None:
            answers = [c for c in by_digest.get(entry.claim, []) if c.node_id == entry.node_id and c.uid]
            if len(answers) != 1:
                out.append(entry)  # sort_nodes keeps it while the claim may still be under way
                continue
            entry = entry.model_copy(update={"claim": None, "node_claim": NodeClaimRef(
                name=answers[0].name, uid=answers[0].uid)})
        if entry.node_claim is None or entry.uid:
            out.append(entry)
            continue
        listed = by_uid.get(entry.node_claim.uid)
        if listed is None or listed.name != entry.node_claim.name:
            gone.append(entry)
            continue
        node = nodes_by_name.get(listed.node_name) if listed.node_name else None
        if node is not None and node.uid and listed.provider_id and node.provider_id == listed.provider_id:
            out.append(entry.model_copy(update={"name": node.name, "uid": node.uid}))
        elif listed.deleting:
            # Deleted before its Node came, by someone other than the pass (its let-go entries are out
            # of the record): Karpenter, giving up on a launch it cannot make. Gone: the slot's claim
            # is made again, after the launch backoff (:func:`launch_verdict`).
            gone.append(entry)
        elif listed.created is None or now < listed.created + launch_timeout:
            launching.append(entry)
            if listed.provider_id:
                arriving.add(listed.provider_id)
            else:
                unlaunched.add(entry.node_id)
        else:
            expired.append(entry)
    return Binding(out, tuple(launching), tuple(expired), tuple(gone), frozenset(arriving), frozenset(unlaunched))


# --------------------------------------------------------------------------- why NodeClaims do not launch

# A claim Karpenter deleted before it launched is made again after a backoff, doubled for each pass
# that found such claims since the group's last launch: 5 s, 10 s, 20 s ... at most 2 minutes.
LAUNCH_BACKOFF_FIRST = timedelta(seconds=5)
LAUNCH_BACKOFF_MOST = timedelta(minutes=2)
# While the group's own check (node class, offering) stops its creates, it looks again this often:
# no watch event says when a node class is created.
LAUNCH_RECHECK = timedelta(seconds=5)
AWAITING = "AwaitingReconciliation"  # the reason of a condition Karpenter has not looked at yet
COUNTED_MOST = 1000  # claim uids a group's launch memory keeps (each failed claim is counted once)


@dataclass(frozen=True)
class LaunchCause:
    """Why a karpenter group's NodeClaims do not launch: a reason and a message, Karpenter's (from a
    claim's ``Launched`` condition, or the Event it posted on a claim it deleted) or the group's own
    check before any claim (its node class, what Karpenter offers)."""

    reason: str
    message: str


def launch_failure(status: str, reason: str, message: str, provider_id: str = "") -> LaunchCause | None:
    """What a claim's ``Launched`` condition (``status``, ``reason``, ``message``) says of a launch
    that failed: ``False``, or ``Unknown`` with a reason of Karpenter's (``LaunchFailed``, a cloud
    provider's); None while it launched (a ``providerID``), has not been looked at, or is fine."""
    if provider_id or status == "True" or not reason or reason == AWAITING or status not in ("False", "Unknown"):
        return None
    return LaunchCause(reason, message or reason)


@dataclass(frozen=True)
class ClaimFailure:
    """A claim of the group that did not launch: still there (``gone`` False: Karpenter retries it
    itself, and hyperplan's launch timeout bounds it), or deleted before its Node came (the slot's
    claim is made again, after the backoff)."""

    name: str
    uid: str
    cause: LaunchCause
    gone: bool = False


@dataclass(frozen=True)
class LaunchMemory:
    """What the group's passes remember of its launches (the operator's memory; a restart starts
    from nothing, the condition on the group stays): the cause last reported, the passes in a row
    that found claims deleted before launch and when the last one did, the claims counted."""

    cause: LaunchCause | None = None
    failures: int = 0
    last_failure: datetime | None = None
    counted: frozenset[str] = frozenset()


@dataclass(frozen=True)
class LaunchFacts:
    """A karpenter group's pass's knowledge of its launches (``planning.groups.PassFacts.launch``).

    ``blocked``: the node class is missing or not ready (None: it is there, or cannot be read);
    ``offered``: the (instance type, zone) pairs Karpenter offers with ``capacity_type`` (None:
    cannot be known); ``failures``: the group's claims that did not launch, as this pass found
    them; ``launched``: a claim of the group launched (Karpenter wrote its providerID)."""

    memory: LaunchMemory = LaunchMemory()
    blocked: LaunchCause | None = None
    offered: frozenset[tuple[str, str]] | None = None
    capacity_type: str = "reserved"
    failures: tuple[ClaimFailure, ...] = ()
    launched: bool = False


@dataclass(frozen=True)
class LaunchVerdict:
    """What the launches allow: whether the pass may make claims now, the ``NodesLaunched``
    condition (None: absent), the Warning Events (one per new cause), the reasons to count
    (``hyperplan_karpenter_launch_failures_total``), when to look again, and the memory to keep."""

    memory: LaunchMemory
    creates_allowed: bool = True
    condition: Condition | None = None
    events: tuple[Event, ...] = ()
    counted: tuple[str, ...] = ()
    wake_at: datetime | None = None


def launch_backoff(failures: int) -> timedelta:
    """The wait before the claims are made again after ``failures`` passes in a row found claims
    deleted before launch."""
    if failures <= 0:
        return timedelta(0)
    return min(LAUNCH_BACKOFF_FIRST * 2 ** min(failures - 1, 16), LAUNCH_BACKOFF_MOST)


def not_offered(offered: frozenset[tuple[str, str]] | None, capacity_type: str,
                wanted: Iterable[tuple[str, str]]) -> LaunchCause | None:
    """``NotOffered`` when a wanted (instance type, zone) is not among Karpenter's offerings of
    ``capacity_type``; None when all are, or the offerings are unknown."""
    if offered is None:
        return None
    missing = sorted({w for w in wanted if w not in offered})
    if not missing:
        return None
    parts = []
    for itype, zone in missing:
        zones = sorted(z for t, z in offered if t == itype)
        parts.append(f"instance type {itype} is not one of them" if not zones else
                     f"{itype} is offered {capacity_type} only in {', '.join(zones)}, not in zone {zone}")
    return LaunchCause(REASON_NOT_OFFERED, "Karpenter's instance types cannot launch the group's nodes: "
                       + "; ".join(parts))


def launch_verdict(facts: LaunchFacts, wanted: Sequence[tuple[str, str]], generation: int,
                   prior: Sequence[Condition], now: datetime) -> LaunchVerdict:
    """Whether a karpenter group may make its ``wanted`` claims now (their (instance type, zone)
    pairs), and what the group says about its launches.

    * The group's own check first: a missing or unready node class, or an instance type or zone
      Karpenter does not offer, stops every create while it stands (looked at again every
      :data:`LAUNCH_RECHECK`): ``NodesLaunched=False`` with that reason, before any claim is made.
    * Claims Karpenter failed: ``NodesLaunched=False`` with the reason and message of the latest.
      A pass that finds claims deleted before launch doubles the backoff (:func:`launch_backoff`);
      no claim is made before it is over, and the message says until when. A claim Karpenter still
      retries itself keeps its slot (and the condition) until it launches or times out.
    * A claim launched: the backoff and the cause are forgotten; the condition goes.

    A Warning Event once per cause (not per retry: after a restart, the condition's reason and
    message say it was posted), and each failed claim counted once by its reason."""
    memory = facts.memory
    fresh = [f for f in facts.failures if f.uid not in memory.counted]
    counted = memory.counted | {f.uid for f in fresh}
    if len(counted) > COUNTED_MOST:
        counted = frozenset(f.uid for f in facts.failures)
    failures, last = memory.failures, memory.last_failure
    if any(f.gone for f in fresh):
        failures, last = failures + 1, now
    elif facts.launched and not facts.failures:
        failures, last = 0, None
    blocked = facts.blocked or not_offered(facts.offered, facts.capacity_type, wanted) if wanted else None
    allowed, wake, cause, message = True, None, None, ""
    if blocked is not None:
        cause, allowed, wake = blocked, False, now + LAUNCH_RECHECK
        message = f"{blocked.message}: no NodeClaim is made until that is fixed (looked at again every " \
                  f"{int(LAUNCH_RECHECK.total_seconds())}s)"
    elif facts.failures or failures:
        latest = facts.failures[-1] if facts.failures else None
        cause = latest.cause if latest is not None else memory.cause
        if cause is None:
            cause = LaunchCause(REASON_CLAIM_DELETED, "a NodeClaim was deleted before it launched")
        message = f"NodeClaim {latest.name}: {cause.message}" if latest is not None else cause.message
        if failures and last is not None:
            retry = last + launch_backoff(failures)
            allowed = now >= retry
            when = "from" if allowed else "at"
            message += (f"; {failures} time(s) in a row Karpenter deleted claims before they launched: the "
                        f"slots' claims are made again {when} {to_rfc3339(retry)} (backoff "
                        f"{int(launch_backoff(failures).total_seconds())}s)")
            if not allowed:
                wake = retry
        else:
            message += "; Karpenter retries it"
    if cause is None:
        return LaunchVerdict(LaunchMemory(counted=counted if facts.failures else frozenset()))
    before = next((c for c in prior if c.type == CONDITION_NODES_LAUNCHED), None)
    known = memory.cause == cause or (memory.cause is None and before is not None and before.status == "False"
                                      and before.reason == cause.reason and cause.message in before.message)
    events = () if known else (Event("Warning", cause.reason, message),)
    reasons = tuple(f.cause.reason for f in fresh) + ((cause.reason,) if blocked is not None and not known else ())
    return LaunchVerdict(
        LaunchMemory(cause, failures, last, counted), allowed,
        condition(CONDITION_NODES_LAUNCHED, False, cause.reason, message, generation, prior, now),
        events, reasons, wake)
