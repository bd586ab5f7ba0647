"""Lending existing nodes to instance groups (the ``static`` node provider), decided purely.

A static pool is a set of existing nodes labelled
``node-restriction.kubernetes.io/hyperplan-pool=free`` by an admin (kind's workers, say; a kubelet
cannot set that key on its own Node). While a block runs an instance group borrows some of them; when it lets go
they are handed back. This module decides, from plain observations and without I/O or a
clock:

* which free nodes may be lent at all (:func:`why_not_lendable`): not cordoned, Ready,
  no failed hardware condition or health label (``nodefacts.why_unfit``: read as every reader
  reads a node), and not running the operator itself
  (a drain of that node would evict the operator, so it is never adopted);
* which of them a new node id takes (:func:`choose_free_node`), skipping the nodes other
  adoptions of this process hold in flight;
* what adopting a node changes on it (:func:`adoption_patch`) and what a later change of
  the group changes (:func:`held_update_patch`); what the node looked like before, for the
  keys hyperplan sets, is a :class:`LentRecord` (:meth:`LentRecord.noting`) that the operator
  keeps in the group's ``status.nodes`` (``api.models.GroupNode.lent``), never on the node:
  a node may write its own annotations, so a record there would let it choose what the
  hand-back writes;
* what cordoning it for a drain writes (:func:`cordon_patch`); whether hyperplan cordoned
  it is kept in the same record (``GroupNode.cordoned``), so that hand-back undoes only
  hyperplan's own cordon;
* what handing it back restores (:func:`hand_back`), from the record: every label and taint
  the group put there goes (values found before adoption come back), the pool label says
  ``free`` again, the node is uncordoned only if hyperplan cordoned it, and no key in a
  domain that belongs to Kubernetes (:func:`in_kubernetes_domain`) is ever written;
* which pods a drain evicts and which it leaves alone (:func:`sort_pods_for_drain`): the
  operator's own pods, DaemonSet pods and static (mirror) pods stay.

``actuation.providers.static.StaticProvider`` and ``actuation.pods.evict_pods`` read the objects,
turn them into the views below and send these patches.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hyperplan.api.models import KUBERNETES_DOMAINS, GroupNode, LentState, RecordedTaint
from hyperplan.api.vocabulary import ANNOTATION_CLAIM, Unreadable
from hyperplan.planning import reading
from hyperplan.planning.health import ANNOTATION_EVICTING_SINCE, ANNOTATION_HEALTH_SINCE, DEFAULT_BAD_CONDITIONS
from hyperplan.planning.naming import (
    ANNOTATION_CORDONED,
    LABEL_GENERATION,
    LABEL_GROUP,
    LABEL_HEALTH,
    LABEL_HOSTNAME,
    LABEL_PLAN,
    LABEL_REPLACES,
    LABEL_RESERVED_CAPACITY,
    LABEL_ROLE,
    LABEL_SLOT,
    SPARE_TAINT,
    UNHEALTHY_TAINT,
    Taint,
)
from hyperplan.planning.nodefacts import NodeFacts, facts_of_statuses, is_unschedulable, why_unfit

from hyperplan.api.vocabulary import (  # noqa: F401
    ANNOTATION_LENT, LABEL_NODE_ID, LABEL_POOL, LABEL_TRUSTED_GROUP, OWN_PREFIX, POOL_FREE, POOL_HELD,
)


OWNED_LABELS = (LABEL_GROUP, LABEL_PLAN, LABEL_RESERVED_CAPACITY, LABEL_ROLE, LABEL_HEALTH, LABEL_SLOT,
                LABEL_GENERATION, LABEL_REPLACES, LABEL_NODE_ID, LABEL_TRUSTED_GROUP)


def trusted_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The group's label again under a key a kubelet cannot set on its own Node
    (:data:`LABEL_TRUSTED_GROUP`), for the nodes the operator creates or lends."""
    return {LABEL_TRUSTED_GROUP: labels[LABEL_GROUP]} if LABEL_GROUP in labels else {}
"""Labels only hyperplan writes on a lent node; they all go at hand-back."""
ALWAYS_MANAGED_TAINT_KEYS = frozenset({SPARE_TAINT.key, UNHEALTHY_TAINT.key})


def in_kubernetes_domain(key: str) -> bool:
    """Whether label or taint ``key`` is in a domain that belongs to Kubernetes (``kubernetes.io``,
    ``k8s.io``, ``node-restriction.kubernetes.io`` or a subdomain of one, such as
    ``node-role.kubernetes.io``): the kubelet, the scheduler and admission read those, so a
    hand-back never writes one, whatever a record says."""
    prefix = key.split("/", 1)[0] if "/" in key else ""
    return any(prefix == domain or prefix.endswith("." + domain) for domain in KUBERNETES_DOMAINS)


# --------------------------------------------------------------------------- observations


@dataclass(frozen=True)
class PoolNode:
    """A node of the static pool (free or held) as read from the API server."""

    name: str
    resource_version: str = ""
    uid: str | None = None  # in a patch, a precondition: the API server refuses it for another node
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    conditions: Mapping[str, str] = field(default_factory=dict)  # type -> status
    deleting: bool = False

    @property
    def facts(self) -> NodeFacts:
        """The node as every reader of a node reads it (``planning.nodefacts``)."""
        return facts_of_statuses(self.name, self.labels, self.conditions, uid=self.uid,
                                 cordoned=self.unschedulable, deleting=self.deleting)


@dataclass(frozen=True)
class OperatorIdentity:
    """Who the operator is, so that it never lends or drains the node it runs on.

    From the downward API (``POD_NAME``, ``POD_NAMESPACE``, ``NODE_NAME``) and the labels
    the chart puts on every pod of the operator's Deployment (``pod_labels``), so that a
    second replica is protected too. Out of a cluster everything but ``pod_labels`` is
    unset and pods with those labels count as the operator's in every namespace.
    """

    pod_name: str | None = None
    namespace: str | None = None
    node_name: str | None = None
    pod_labels: Mapping[str, str] = field(default_factory=dict)

    def owns(self, pod: "PodView") -> bool:
        if self.namespace and pod.namespace != self.namespace:
            return False
        if self.pod_name and pod.name == self.pod_name:
            return True
        return bool(self.pod_labels) and all(pod.labels.get(k) == v for k, v in self.pod_labels.items())

    @property
    def selector(self) -> str:
        """The label selector of the operator's pods ("" when no labels are configured)."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.pod_labels.items()))


@dataclass(frozen=True)
class PodView:
    """A pod on a node being drained."""

    name: str
    namespace: str
    node_name: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    owner_kinds: tuple[str, ...] = ()
    mirror: bool = False  # a static pod's mirror (annotation kubernetes.io/config.mirror)
    terminating: bool = False

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


# --------------------------------------------------------------------------- choosing a free node


def why_not_lendable(node: PoolNode, operator_nodes: Iterable[str] = ()) -> str | None:
    """Why ``node`` of the free pool may not be lent now (a short phrase), or None if it may."""
    facts = node.facts
    if facts.deleting:
        return "is being deleted"
    if node.name in set(operator_nodes):
        return "runs the operator"
    return why_unfit(facts, DEFAULT_BAD_CONDITIONS)  # the node's own state, read as every reader reads it


def _rank(node_id: str, node_name: str) -> str:
    return hashlib.sha256(f"{node_id}/{node_name}".encode()).hexdigest()


@dataclass(frozen=True)
class Choice:
    node: PoolNode | None
    skipped: Mapping[str, str]  # node name -> why it was not lendable

    def explain(self) -> str:
        return "; ".join(f"{n} {why}" for n, why in sorted(self.skipped.items()))


@dataclass(frozen=True)
class Membership:
    """What a node id placed on an UltraServer asks of the free node it takes: to come from the
    cloud's UltraServer behind hyperplan's (an NVLink domain is a machine, not a label).

    ``key``: the label under which a free node carries its cloud UltraServer id (on EKS and
    HyperPod ``topology.k8s.aws/ultraserver-id``, the key hyperplan itself writes while it
    lends the node); ``ultraserver``: hyperplan's UltraServer the node id is placed on;
    ``bound``: hyperplan's UltraServer id -> the cloud's, for those that hold lent nodes
    already (``placement.cloud_ultraservers`` of the group's record, and the choices this
    process made since)."""

    key: str
    ultraserver: str
    bound: Mapping[str, str] = field(default_factory=dict)

    def cloud_of(self, node: PoolNode) -> str | None:
        return node.labels.get(self.key) or None


def _membership_order(node_id: str, lendable: Sequence[PoolNode], m: Membership):
    """The sort key that keeps hyperplan's UltraServer on one cloud UltraServer: first a node of
    the one it is bound to; then, from a cloud UltraServer no other of hyperplan's is bound to,
    the one with the most free nodes (so that the whole UltraServer fits), ties broken per
    hyperplan UltraServer; then nodes that name no cloud UltraServer; last, nodes of one that
    another of hyperplan's UltraServers is bound to. Within each, the rendezvous order."""
    mine = m.bound.get(m.ultraserver)
    taken = {c for u, c in m.bound.items() if u != m.ultraserver and c != mine}
    sizes: dict[str, int] = {}
    for n in lendable:
        c = m.cloud_of(n)
        if c is not None:
            sizes[c] = sizes.get(c, 0) + 1

    def key(n: PoolNode) -> tuple[int, int, str, str]:
        c = m.cloud_of(n)
        if c is not None and c == mine:
            return (0, 0, "", _rank(node_id, n.name))
        if c is not None and c not in taken:
            return (1, -sizes[c], _rank(m.ultraserver, c), _rank(node_id, n.name))
        return (2 if c is None else 3, 0, "", _rank(node_id, n.name))
    return key


def choose_free_node(node_id: str, free: Sequence[PoolNode], operator_nodes: Iterable[str] = (),
                     claimed: Iterable[str] = (), membership: Membership | None = None) -> Choice:
    """The free node that ``node_id`` should take, and why the others were left out.

    Nodes in ``claimed`` (taken by adoptions still in flight in this process) are skipped
    quietly. Among the rest, the order is a hash of (node id, node name): each node id has
    its own preference (rendezvous hashing), so two writers that see the same free list for
    different node ids rarely reach for the same node, and the choice is reproducible. A node
    id placed on an UltraServer (``membership``) first prefers nodes of the cloud UltraServer
    behind it (:func:`_membership_order`); free nodes that name none keep the plain order.
    """
    operator_nodes, claimed = set(operator_nodes), set(claimed)
    skipped = {}
    lendable = []
    for n in free:
        why = why_not_lendable(n, operator_nodes)
        if why:
            skipped[n.name] = why
        elif n.name not in claimed:
            lendable.append(n)
    if membership is not None:
        lendable.sort(key=_membership_order(node_id, lendable, membership))
    else:
        lendable.sort(key=lambda n: _rank(node_id, n.name))
    return Choice(lendable[0] if lendable else None, skipped)


def cloud_ultraserver_before(entry: GroupNode | None, key: str) -> str | None:
    """The cloud UltraServer id (under ``key``) a node the group holds carried before the group
    labelled it, from the group's record (None: a node hyperplan made, or one that had none)."""
    lent = entry.lent if entry is not None else None
    return (lent.labels.get(key) or None) if lent is not None else None


# --------------------------------------------------------------------------- what lending records


@dataclass(frozen=True)
class LentRecord:
    """What the node looked like, for every label and taint key hyperplan set on it."""

    labels: Mapping[str, str | None] = field(default_factory=dict)
    taint_keys: tuple[str, ...] = ()
    taints: tuple[Taint, ...] = ()  # taints with those keys that were there before

    @classmethod
    def load(cls, text: str | None) -> "LentRecord":
        """The record in the annotation an earlier version kept on the node; an empty one when it
        is missing or unreadable (:func:`hyperplan.planning.reading.read_lent`). Read only once,
        when a group from before ``status.nodes`` is first recorded (``planning.ownership``), and
        then through :meth:`safe`."""
        try:
            data = reading.read_lent(text) if text else {}
        except Unreadable:
            return cls()
        return cls(labels={str(k): v for k, v in data.get("labels", {}).items()},
                   taint_keys=tuple(sorted(data.get("taintKeys", []))),
                   taints=tuple(Taint(t["key"], t.get("value") or "", t["effect"]) for t in data.get("taints", [])))

    @classmethod
    def from_state(cls, state: LentState) -> "LentRecord":
        """The record the operator kept in the group's status."""
        labels: dict[str, str | None] = {k: None for k in state.absent_labels}
        labels.update(state.labels)
        return cls(labels=labels, taint_keys=tuple(sorted(state.taint_keys)),
                   taints=tuple(Taint(t.key, t.value, t.effect) for t in state.taints))

    def state(self) -> LentState:
        """The record as the group's status keeps it."""
        return LentState(labels={k: v for k, v in sorted(self.labels.items()) if v is not None},
                         absent_labels=sorted(k for k, v in self.labels.items() if v is None),
                         taint_keys=list(self.taint_keys),
                         taints=[RecordedTaint(key=t.key, value=t.value, effect=t.effect) for t in self.taints])

    def safe(self) -> "LentRecord":
        """The record without the keys a hand-back never writes: the operator's own labels (they
        always go) and every key in a domain that belongs to Kubernetes."""
        own = set(OWNED_LABELS) | {LABEL_POOL}
        return LentRecord(
            labels={k: v for k, v in self.labels.items() if k not in own and not in_kubernetes_domain(k)},
            taint_keys=tuple(k for k in self.taint_keys if not in_kubernetes_domain(k)),
            taints=tuple(t for t in self.taints if not in_kubernetes_domain(t.key)))

    def dump(self) -> str:
        return json.dumps({"labels": dict(sorted(self.labels.items())), "taintKeys": list(self.taint_keys),
                           "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in self.taints]},
                          separators=(",", ":"))

    def noting(self, node: PoolNode, label_keys: Iterable[str], taint_keys: Iterable[str]) -> "LentRecord":
        """This record plus the current state of keys hyperplan is about to set for the first time."""
        labels = dict(self.labels)
        for key in label_keys:
            if key not in labels and key not in OWNED_LABELS and key != LABEL_POOL:
                labels[key] = node.labels.get(key)
        new_keys = set(taint_keys) - set(self.taint_keys)
        taints = self.taints + tuple(t for t in node.taints if t.key in new_keys)
        return LentRecord(labels, tuple(sorted(set(self.taint_keys) | new_keys)), taints)


def _taint_body(taints: Iterable[Taint]) -> list[dict[str, str]] | None:
    body = [{"key": t.key, "value": t.value, "effect": t.effect} for t in taints]
    return body or None  # None clears the list in a merge patch


def _guarded(node: PoolNode, **metadata: object) -> dict:
    """A patch's ``metadata``, with the node's uid when it is known: the API server refuses the
    patch if the node of that name is another one (deleted and made again since it was read)."""
    return {**metadata, "uid": node.uid} if node.uid else dict(metadata)


def _group_labels(labels: Mapping[str, str], node_id: str) -> dict[str, str]:
    """The labels a lent node carries: the group's, without the hostname (a real node keeps its own)."""
    want = {k: v for k, v in labels.items() if k != LABEL_HOSTNAME}
    want.update({LABEL_NODE_ID: node_id, LABEL_POOL: POOL_HELD, **trusted_labels(labels)})
    return want


@dataclass(frozen=True)
class Lending:
    """A patch for a lent node, and the record of what the node looked like before (to keep in
    the group's status, ``GroupNode.lent``)."""

    patch: dict
    record: LentRecord


def _lending(node: PoolNode, node_id: str, labels: Mapping[str, str], taints: Sequence[Taint],
             managed_taint_keys: Iterable[str], record: LentRecord) -> Lending:
    managed = set(managed_taint_keys) | ALWAYS_MANAGED_TAINT_KEYS
    want = _group_labels(labels, node_id)
    kept = [t for t in node.taints if t.key not in managed]
    return Lending({"metadata": _guarded(node, labels=want),
                    "spec": {"taints": _taint_body([*kept, *taints])}}, record.noting(node, want, managed))


def adoption_patch(node: PoolNode, node_id: str, labels: Mapping[str, str], taints: Sequence[Taint],
                   managed_taint_keys: Iterable[str]) -> Lending:
    """The merge patch that lends free ``node`` as ``node_id``, and the record of what it
    looked like before, for the keys the patch sets.

    It carries the node's resourceVersion: if anyone changed the node since it was read
    (another group adopting it, an admin cordoning it), the API server answers 409 and
    nothing is written. An annotation on the node (an earlier version kept its record
    there) is not read: the record starts empty.
    """
    made = _lending(node, node_id, labels, taints, managed_taint_keys, LentRecord())
    made.patch["metadata"]["resourceVersion"] = node.resource_version
    return made


def held_update_patch(node: PoolNode, node_id: str, labels: Mapping[str, str], taints: Sequence[Taint],
                      managed_taint_keys: Iterable[str], record: LentRecord | None = None) -> Lending:
    """The merge patch that brings a held node to the group's current labels and taints, and
    ``record`` (the group's record of the node) with any key set for the first time added."""
    return _lending(node, node_id, labels, taints, managed_taint_keys, record or LentRecord())


def cordon_patch(node: PoolNode) -> dict | None:
    """The patch that cordons a held node for its drain (the caller records that hyperplan did).

    None when the node is cordoned already: then someone else cordoned it, and it stays
    cordoned after hand-back. The resourceVersion makes a concurrent cordon by an admin
    win (409, read again, see it cordoned, do nothing).
    """
    if node.unschedulable:
        return None
    return {"metadata": _guarded(node, resourceVersion=node.resource_version), "spec": {"unschedulable": True}}


@dataclass(frozen=True)
class HandBack:
    patch: dict
    message: str


def hand_back(node: PoolNode, record: LentRecord | None, cordoned: bool) -> HandBack:
    """The merge patch that returns a held node to the free pool, and what it did, in words.

    ``record`` and ``cordoned`` are the operator's own record of the node (the group's
    ``status.nodes``); nothing the node says about itself decides what is written.

    Labels: every label hyperplan owns goes, and every other key it set gets the value it
    had before adoption back (or goes, if it had none): the group's ``spec.labels``, the
    topology keys. A key in a domain that belongs to Kubernetes (the instance type and zone
    among them) is never written. Taints: the spare and unhealthy taints, the group's
    ``spec.taints`` keys (and, for a node held without a record, any ``hyperplan.dev/`` taint)
    go; the taints those keys had before come back. The node is uncordoned only if
    ``cordoned`` (hyperplan cordoned it); a cordon by anyone else stays. A node whose health
    label says ``Unschedulable*`` keeps that label, so it is not lent again until someone who
    repaired it removes the label.
    """
    no_record = record is None
    record = (record or LentRecord()).safe()
    labels: dict[str, str | None] = {k: None for k in OWNED_LABELS if k in node.labels}
    labels.update({k: v for k, v in record.labels.items() if node.labels.get(k) != v})
    health = node.labels.get(LABEL_HEALTH, "")
    kept_health = is_unschedulable(health)
    if kept_health:
        labels.pop(LABEL_HEALTH, None)
    labels[LABEL_POOL] = POOL_FREE
    drop = set(record.taint_keys) | ALWAYS_MANAGED_TAINT_KEYS
    kept = [t for t in node.taints if t.key not in drop and not (no_record and t.key.startswith(OWN_PREFIX))]
    restored = kept + [t for t in record.taints if t not in kept]
    spec: dict = {"taints": _taint_body(restored)}
    ours = cordoned
    if ours:
        spec["unschedulable"] = None
    annotations = {k: None for k in (ANNOTATION_LENT, ANNOTATION_CORDONED, ANNOTATION_HEALTH_SINCE,
                                      ANNOTATION_EVICTING_SINCE, ANNOTATION_CLAIM) if k in node.annotations}
    metadata: dict = _guarded(node, labels=labels)
    if annotations:
        metadata["annotations"] = annotations
    words = [f"{node.name} handed back to the free pool"]
    if ours:
        words.append("uncordoned (hyperplan had cordoned it)")
    elif node.unschedulable:
        words.append("left cordoned (not cordoned by hyperplan)")
    if kept_health:
        words.append(f"keeps {LABEL_HEALTH}={health}, so it is not lent again until that label is removed")
    return HandBack({"metadata": metadata, "spec": spec}, ", ".join(words))


# --------------------------------------------------------------------------- draining


@dataclass(frozen=True)
class DrainSort:
    evict: tuple[PodView, ...]
    terminating: tuple[PodView, ...]
    left_alone: Mapping[str, str]  # namespace/name -> why

    @property
    def waiting_for(self) -> int:
        """Pods the drain waits for: the ones it evicts and the ones already going."""
        return len(self.evict) + len(self.terminating)


def sort_pods_for_drain(pods: Sequence[PodView], me: OperatorIdentity) -> DrainSort:
    """Which pods of a draining node to evict, which are already going, which to leave alone.

    Left alone, as ``kubectl drain --ignore-daemonsets`` does and more: the operator's own
    pods (evicting them would stop the drain halfway and, on a lent node, lose the
    operator), DaemonSet pods (their controller puts them straight back, so waiting for
    them would never end) and mirror pods of static pods (the kubelet owns them).
    """
    evict, going, alone = [], [], {}
    for p in pods:
        if me.owns(p):
            alone[p.ref] = "the operator's own pod"
        elif p.mirror:
            alone[p.ref] = "a static pod"
        elif "DaemonSet" in p.owner_kinds:
            alone[p.ref] = "a DaemonSet pod"
        elif p.terminating:
            going.append(p)
        else:
            evict.append(p)
    return DrainSort(tuple(evict), tuple(going), alone)
