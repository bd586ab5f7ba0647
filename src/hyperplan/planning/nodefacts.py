"""What a node is, as every part of hyperplan reads it: one set of facts and the answers built on them.

The group's pass and its slot states (placement), the plan's counts, lending's choice of a free
node, Kueue's count of the nodes that can take work, ``hyperplan status`` and the chaos
invariants must agree on what a node is (a node that one of them took
for serving and another for failed would get work that the plan counts as lost), so none of them
reads a node's labels and conditions itself: each turns the node into :class:`NodeFacts` (:func:`facts_of_dict` for the plain dicts of the watch cache and of API
JSON, :func:`facts_of_v1` for the Kubernetes client's ``V1Node``, :func:`facts_of_statuses` for a
view that holds condition statuses only) and asks it; a reader that holds only a node's labels
asks :func:`effective_health` of them.

Health
------
A node carries two health labels: hyperplan's own (:data:`~hyperplan.planning.naming.LABEL_HEALTH`,
which the operator writes when it marks a failed node) and SageMaker HyperPod's
(:data:`~hyperplan.planning.naming.LABEL_SAGEMAKER_HEALTH`, which HyperPod's health agent
writes). Either may say the node is unfit, so the **effective health** is the worse of the two:
an ``Unschedulable*`` value under either key makes the node unhealthy. When both say
``Unschedulable*``, hyperplan's value is the one kept: it is the operator's own verdict
(``UnschedulablePendingReplacement``), and the remediation and the health-signal record read
that exact value. When neither does, hyperplan's value is kept if set, else SageMaker's. The
values themselves (``UnschedulablePendingReplacement``, ``UnschedulablePendingReboot``) pass
through unchanged.

The deep health checks (planning.deepchecks) are read the same way: hyperplan's
``deep-health-check-status`` and HyperPod's, the worse of the two (``Failed``, then
``InProgress``) winning (:func:`deep_check_status`). A node in its checks or failing them takes
no work: it is tainted until it passed, and Kueue must not count it.

A node **serves** (:attr:`NodeFacts.is_serving`) when it is active, ``Ready=True``, not being
deleted, not cordoned, healthy by both labels and not in (or failing) its deep health checks: the
nodes Kueue may admit work onto, the ones ``hyperplan status`` shows serving.

Pure: stdlib only, no I/O, no clock; ``now`` is passed in where a time is needed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hyperplan.api.vocabulary import CHECK_FAILED, CHECK_IN_PROGRESS
from hyperplan.api.vocabulary import CONDITION_READY as READY
from hyperplan.planning.reading import generation_of, slot_of, time_or_none
from hyperplan.planning.naming import (
    HEALTH_PENDING_REBOOT,
    HEALTH_PENDING_REPLACEMENT,
    HEALTH_UNSCHEDULABLE,
    LABEL_DEEP_HEALTH_CHECK,
    LABEL_GROUP,
    LABEL_HEALTH,
    LABEL_PLAN,
    LABEL_REPLACES,
    LABEL_RESERVED_CAPACITY,
    LABEL_ROLE,
    LABEL_SAGEMAKER_DEEP_HEALTH_CHECK,
    LABEL_SAGEMAKER_HEALTH,
    ROLE_ACTIVE,
    ROLE_SPARE,
    TopologyKeys,
)

HEALTH_KEYS = (LABEL_HEALTH, LABEL_SAGEMAKER_HEALTH)
"""The health labels, hyperplan's first: the order in which a bad value is looked for."""

# hyperplan's label -> HyperPod's, for what hyperplan writes with the setting hyperpod_labels on.
HYPERPOD_KEYS = {LABEL_HEALTH: LABEL_SAGEMAKER_HEALTH,
                 LABEL_DEEP_HEALTH_CHECK: LABEL_SAGEMAKER_DEEP_HEALTH_CHECK}


def hyperpod_mirror(labels: Mapping[str, str | None]) -> dict[str, str | None]:
    """The HyperPod labels that go beside the hyperplan ones in ``labels`` (a value of None, a
    removal, is mirrored too): the same value under ``sagemaker.amazonaws.com/``, so that a node's
    health reads the same by either key."""
    return {HYPERPOD_KEYS[k]: v for k, v in labels.items() if k in HYPERPOD_KEYS}


@dataclass(frozen=True)
class NodeCondition:
    """A node condition as the health planning judges it: its status and since when."""

    type: str
    status: str
    last_transition_time: datetime


# --------------------------------------------------------------------------- health labels


def is_unschedulable(value: str | None) -> bool:
    """Whether a health label value says the node must take no work (any ``Unschedulable*``)."""
    return bool(value) and value.startswith(HEALTH_UNSCHEDULABLE)


def unschedulable_label(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """The health label that says the node must take no work, as (key, value): hyperplan's when
    both do (see "Health" in the module docstring), None when neither does."""
    return next(((k, v) for k in HEALTH_KEYS if is_unschedulable(v := labels.get(k))), None)


def unschedulable_health(labels: Mapping[str, str]) -> str | None:
    """The ``Unschedulable*`` value of the hyperplan or SageMaker health label (hyperplan's first),
    or None when neither says so."""
    found = unschedulable_label(labels)
    return found[1] if found else None


def effective_health(labels: Mapping[str, str]) -> str | None:
    """The node's one health value (see "Health" in the module docstring): the ``Unschedulable*``
    value of either label, else hyperplan's value, else SageMaker's; None when neither is set."""
    return unschedulable_health(labels) or next((v for v in (labels.get(k) for k in HEALTH_KEYS) if v), None)


def deep_check_status(labels: Mapping[str, str]) -> str | None:
    """The node's deep health check status by both keys (see the module docstring): ``Failed``
    under either, else ``InProgress`` under either, else hyperplan's value, else HyperPod's."""
    values = [labels.get(LABEL_DEEP_HEALTH_CHECK), labels.get(LABEL_SAGEMAKER_DEEP_HEALTH_CHECK)]
    for worst in (CHECK_FAILED, CHECK_IN_PROGRESS):
        if worst in values:
            return worst
    return next((v for v in values if v), None)


def marked_for_replacement(labels: Mapping[str, str]) -> bool:
    """Whether the operator marked the node for replacement (hyperplan's own label only: the mark
    is the operator's action, and it decides that the node's pods and the node may go)."""
    return labels.get(LABEL_HEALTH) == HEALTH_PENDING_REPLACEMENT


# --------------------------------------------------------------------------- the facts


@dataclass(frozen=True)
class NodeFacts:
    """One node, read once (see the module docstring).

    ``role`` is :data:`~hyperplan.planning.naming.ROLE_SPARE` when the role label says spare, else
    active (a node of a group without a role label is one of its active nodes). ``ready`` is the
    status of the ``Ready`` condition (``True``, ``False``, ``Unknown``), None while the node has
    reported none. ``conditions`` hold every condition with its transition time (the time passed
    as ``now`` to the constructor for a condition without one). ``cordoned`` is
    ``spec.unschedulable``; ``deleting`` is set once the node has a ``deletionTimestamp``.
    ``labels`` are the node's own mapping, not a copy (a group's pass reads thousands of nodes).
    """

    name: str
    uid: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    group: str | None = None
    plan: str | None = None
    block: str | None = None
    role: str = ROLE_ACTIVE
    ultraserver_id: str | None = None
    slot: str | None = None
    generation: int = 0
    replaces: str | None = None
    ready: str | None = None
    hyperplan_health: str | None = None
    sagemaker_health: str | None = None
    conditions: tuple[NodeCondition, ...] = ()
    created: datetime | None = None
    deleting: bool = False
    cordoned: bool = False

    @property
    def health(self) -> str | None:
        """The effective health value (:func:`effective_health`)."""
        return effective_health(self.labels)

    @property
    def unschedulable_health(self) -> str | None:
        """The ``Unschedulable*`` value of either health label (None: both let the node work)."""
        return unschedulable_health(self.labels)

    @property
    def is_unhealthy(self) -> bool:
        """Whether a health label (either) says the node must take no work."""
        return self.unschedulable_health is not None

    @property
    def health_verdict(self) -> bool | None:
        """The node's health as a tri-state: False when a health label (either) says it must take
        no work, else None while its ``Ready`` is unknown (or not reported yet), else True. Only
        the labels and the ``Ready`` being known count: a node ``Ready=False`` with healthy labels
        is True here (the plan's counters, ``planning.counts.ObservedNode.healthy``)."""
        if self.is_unhealthy:
            return False
        return None if self.ready_status == "Unknown" else True

    @property
    def rebooting(self) -> bool:
        """Whether its effective health is ``UnschedulablePendingReboot`` (the recovery ladder's
        reboot): by either key, unless hyperplan's label holds another ``Unschedulable*`` verdict."""
        return self.health == HEALTH_PENDING_REBOOT

    @property
    def pending_replacement(self) -> bool:
        """Whether either health label says ``UnschedulablePendingReplacement``."""
        return HEALTH_PENDING_REPLACEMENT in (self.hyperplan_health, self.sagemaker_health)

    @property
    def marked_for_replacement(self) -> bool:
        """Whether the operator marked it for replacement (:func:`marked_for_replacement`)."""
        return marked_for_replacement(self.labels)

    @property
    def ready_status(self) -> str:
        """The ``Ready`` status, ``Unknown`` while the node has reported none."""
        return self.ready or "Unknown"

    @property
    def is_ready(self) -> bool:
        return self.ready == "True"

    @property
    def is_active(self) -> bool:
        return self.role == ROLE_ACTIVE

    @property
    def is_spare(self) -> bool:
        return self.role == ROLE_SPARE

    @property
    def deep_check(self) -> str | None:
        """Its deep health check status by both keys (:func:`deep_check_status`; None: none ran)."""
        return deep_check_status(self.labels)

    @property
    def in_checks(self) -> bool:
        """Whether its deep health checks run, or it failed them: it takes no work."""
        return self.deep_check in (CHECK_IN_PROGRESS, CHECK_FAILED)

    @property
    def can_work(self) -> bool:
        """Ready, not being deleted, not cordoned, healthy by both labels and not in (or failing)
        its deep health checks, whatever its role."""
        return self.is_ready and not self.deleting and not self.cordoned and not self.is_unhealthy \
            and not self.in_checks

    @property
    def is_serving(self) -> bool:
        """An active node that can take work (see the module docstring)."""
        return self.is_active and self.can_work

    @property
    def is_available_spare(self) -> bool:
        """A spare that could take over from a failed active node now."""
        return self.is_spare and self.can_work

    def condition(self, type_: str) -> NodeCondition | None:
        return next((c for c in self.conditions if c.type == type_), None)


def why_unfit(facts: NodeFacts, bad_conditions: Iterable[tuple[str, str]]) -> str | None:
    """Why the node may take no work by its own state, as a short phrase (the first that applies:
    being deleted, cordoned, not ``Ready``, a condition of ``bad_conditions`` (``(type, status)``
    pairs) with that status, a health label of either key that says ``Unschedulable*``), or None
    when nothing does. Whether the node's deep health checks run is not read here."""
    if facts.deleting:
        return "is being deleted"
    if facts.cordoned:
        return "is cordoned"
    if not facts.is_ready:
        return f"is not Ready ({facts.ready or 'no Ready condition'})"
    for type_, bad in bad_conditions:
        condition = facts.condition(type_)
        if condition is not None and condition.status == bad:
            return f"has {type_}={bad}"
    label = unschedulable_label(facts.labels)
    if label is not None:
        return f"is labelled {label[0]}={label[1]}"
    return None


def _facts(name: str, uid: str | None, labels: Mapping[str, str], keys: TopologyKeys,
           conditions: tuple[NodeCondition, ...], created: datetime | None, deleting: bool,
           cordoned: bool) -> NodeFacts:
    return NodeFacts(
        name=name, uid=uid, labels=labels, group=labels.get(LABEL_GROUP), plan=labels.get(LABEL_PLAN),
        block=labels.get(LABEL_RESERVED_CAPACITY),
        role=ROLE_SPARE if labels.get(LABEL_ROLE) == ROLE_SPARE else ROLE_ACTIVE,
        ultraserver_id=labels.get(keys.ultraserver_id), slot=slot_of(labels),
        generation=generation_of(labels), replaces=labels.get(LABEL_REPLACES),
        ready=next((c.status for c in conditions if c.type == READY), None),
        hyperplan_health=labels.get(LABEL_HEALTH), sagemaker_health=labels.get(LABEL_SAGEMAKER_HEALTH),
        conditions=conditions, created=created, deleting=deleting, cordoned=cordoned)


def _time(value: Any) -> datetime | None:
    """A time of a node's JSON (RFC 3339 text) or of the client's model (a datetime)."""
    return value if value is None or isinstance(value, datetime) else time_or_none(str(value))


def facts_of_dict(node: Mapping[str, Any], keys: TopologyKeys = TopologyKeys(),
                  now: datetime | None = None) -> NodeFacts:
    """The facts of a node as a plain dict: the watch cache's slim node
    (:func:`hyperplan.runtime.store.slim_node`) or the API server's JSON. ``now``: the transition
    time of a condition that has none (give it when the times are read)."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    conditions = tuple(NodeCondition(c.get("type"), c.get("status"), _time(c.get("lastTransitionTime")) or now)
                       for c in status.get("conditions") or [])
    return _facts(meta.get("name", ""), meta.get("uid"), meta.get("labels") or {}, keys, conditions,
                  _time(meta.get("creationTimestamp")), bool(meta.get("deletionTimestamp")),
                  bool(spec.get("unschedulable")))


def facts_of_statuses(name: str, labels: Mapping[str, str], statuses: Mapping[str, str], *,
                      uid: str | None = None, cordoned: bool = False, deleting: bool = False,
                      keys: TopologyKeys = TopologyKeys()) -> NodeFacts:
    """The facts of a node known by its condition statuses only (``statuses``: type -> status, no
    transition times), as a view that read the node already holds it (``planning.lending.PoolNode``)."""
    conditions = tuple(NodeCondition(t, s, None) for t, s in statuses.items())  # type: ignore[arg-type]
    return _facts(name, uid, labels, keys, conditions, None, deleting, cordoned)


def facts_of_v1(node: Any, keys: TopologyKeys = TopologyKeys(), now: datetime | None = None) -> NodeFacts:
    """The facts of a ``kubernetes.client.V1Node`` (read by its attributes: planning imports no
    client). ``now`` as for :func:`facts_of_dict`."""
    meta, spec, status = node.metadata, node.spec, node.status
    conditions = tuple(NodeCondition(c.type, c.status, c.last_transition_time or now)
                       for c in (status.conditions if status is not None and status.conditions else ()))
    return _facts(meta.name or "", meta.uid, meta.labels or {}, keys, conditions, meta.creation_timestamp,
                  meta.deletion_timestamp is not None, bool(spec is not None and spec.unschedulable))
