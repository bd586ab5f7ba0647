"""Nodes launched by Karpenter: one NodeClaim per slot (``nodeProvider: karpenter``).

hyperplan decides which slots exist (planning, as for KWOK); for each new slot it creates a
NodeClaim that names the instance type, the block's zone and the capacity type (``reserved``), with
the slot's labels and taints, and Karpenter launches it through its cloud provider (on the local
plane: Karpenter's kwok provider, whose Nodes the plane's KWOK runs). Why one NodeClaim per slot
and not a static NodePool: docs/design-decisions.md, "Karpenter: a NodeClaim per slot".

What is whose (see ``planning.ownership.bind_claims``):

* the group's record holds each claim by name and uid (:class:`~hyperplan.api.models.NodeClaimRef`),
  from the answer to the create;
* a claim's Node is the one Karpenter names in the claim's status (``nodeName``) whose
  ``providerID`` is the claim's; once tied, the record holds the Node's name and uid, and every
  Node write goes, as for KWOK, to that name with that uid;
* releasing a node deletes its NodeClaim (the one the Node's owner reference names, checked
  against the claim's ``providerID``, with the claim's uid as precondition): Karpenter drains and
  terminates it. hyperplan has drained it before (after the checkpoint signal), at its own
  termination time, not at Karpenter's 40 minutes before a capacity block's end.

Karpenter's own disruption is kept off: the claims name no NodePool (consolidation, drift and
repair act on NodePool claims only), ``expireAfter: Never``, and ``karpenter.sh/do-not-disrupt``.

Node-level writes (labels, taints, cordon, conditions, annotations) are the KWOK provider's, on the
Node; a reboot is KWOK's on a KWOK node, else the admin's reboot Job, as for static nodes.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kubernetes.client.rest import ApiException

from hyperplan.actuation.kube import Kube
from hyperplan.actuation.pods import RebootJob
from hyperplan.actuation.providers.base import (
    MadeNode,
    NodeProvider,
    delete_guarded,
    read_node_or_none,
    uid_of,
)
from hyperplan.actuation.providers.kwok import DEFAULT_KWOK_REBOOT_SECONDS, KWOK_ANNOTATION, KwokProvider
from hyperplan.actuation.providers.static import StaticProvider
from hyperplan.api.models import NodeClaimRef
from hyperplan.api.vocabulary import (
    ANNOTATION_CLAIM,
    LABEL_NODE_ID,
    LABEL_RESERVED_CAPACITY,
    REASON_NODE_CLASS_NOT_FOUND,
    REASON_NODE_CLASS_NOT_READY,
)
from hyperplan.planning import lending, naming, ownership, placement
from hyperplan.planning.reading import time_or_none

log = logging.getLogger(__name__)

KARPENTER_GROUP = "karpenter.sh"
KARPENTER_VERSION = "v1"
NODECLAIMS = "nodeclaims"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
CAPACITY_TYPE = "karpenter.sh/capacity-type"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
ZONE = "topology.kubernetes.io/zone"
HOSTNAME = "kubernetes.io/hostname"
NAME_SUFFIX = 6  # hex characters of the claim's nonce in its name
LAUNCHED = "Launched"  # the NodeClaim condition Karpenter sets once the cloud provider launched it
NODE_CLASS_TTL = 4.0  # seconds a read of the node class serves the passes of every karpenter group
RESERVATION_PREFIX = "cr-"  # an EC2 capacity reservation's id: the block id of an EC2 Capacity Block


def claim_name(node_id: str, nonce: str) -> str:
    """The NodeClaim's name for slot ``node_id``: the id and the first characters of the create's
    nonce. A retry of one create names the same claim; the slot's next claim (after one expired, or
    while the last one terminates) another, so that it never waits for a name."""
    return f"{node_id}-{nonce[:NAME_SUFFIX]}" if nonce else node_id


def node_class_ref(setting: str) -> dict[str, str]:
    """``group/Kind/name`` (the setting ``karpenter_node_class``) as a NodeClaim's ``nodeClassRef``."""
    group, kind, name = setting.split("/")
    return {"group": group, "kind": kind, "name": name}


def node_class_label(setting: str) -> dict[str, str]:
    """The label Karpenter puts on every claim of a node class (``<group>/<kind, lower case>:
    <name>``, e.g. ``karpenter.kwok.sh/kwoknodeclass: default``; on AWS
    ``karpenter.k8s.aws/ec2nodeclass: <name>``), as its own NodePool claims carry it from their
    create. A claim made without it is patched by Karpenter's hydration controller right after its
    create, which races the lifecycle controller's finalizer patch: the loser's 409 requeues the
    claim through a rate limiter (at least 1 s, then ten a second past a burst of 100), so 288
    claims launched over 17 to 23 s instead of 1 to 7 (Karpenter v1.15.0:
    ``nodeclaim/hydration``, ``nodeclaim/lifecycle`` ``Register``; docs/benchmarks.md)."""
    ref = node_class_ref(setting)
    return {f"{ref['group']}/{ref['kind'].lower()}": ref["name"]}


def nodeclaim_body(spec: placement.NodeSpec, nonce: str, node_class: str, capacity_type: str,
                   reservation_label: str = "") -> dict[str, Any]:
    """The NodeClaim for ``spec``: Karpenter launches one instance of the type in the zone with the
    capacity type, and registers its Node with the claim's labels (the slot's, its node id, the
    group under the label a kubelet cannot set, and the node class's, :func:`node_class_label`),
    taints and annotations (do-not-disrupt, the nonce whose digest the group's record holds until
    the create's answer is recorded).

    With ``reservation_label`` (the setting ``karpenter_reservation_label``), a slot of an EC2
    Capacity Block also requires the block's capacity reservation by that label: the block id is
    the reservation's id (planning.capacity_blocks), taken from the slot's own labels, which
    planning wrote from the plan's block, not from anything on a Node."""
    labels = {**spec.labels, LABEL_NODE_ID: spec.name, **lending.trusted_labels(spec.labels),
              **node_class_label(node_class)}
    for key in (INSTANCE_TYPE, ZONE, HOSTNAME):  # the requirements say the first two, and a Node's
        labels.pop(key, None)                    # hostname is its own
    annotations = {DO_NOT_DISRUPT: "true", **({ANNOTATION_CLAIM: nonce} if nonce else {})}
    return {
        "apiVersion": f"{KARPENTER_GROUP}/{KARPENTER_VERSION}", "kind": "NodeClaim",
        "metadata": {"name": claim_name(spec.name, nonce), "labels": labels, "annotations": annotations},
        "spec": {
            "nodeClassRef": node_class_ref(node_class),
            "expireAfter": "Never",
            "requirements": [
                {"key": INSTANCE_TYPE, "operator": "In", "values": [spec.instance_type]},
                {"key": ZONE, "operator": "In", "values": [spec.availability_zone]},
                {"key": CAPACITY_TYPE, "operator": "In", "values": [capacity_type]},
                *reservation_requirement(spec, reservation_label),
            ],
            "taints": [{"key": t.key, "value": t.value, "effect": t.effect} if t.value
                       else {"key": t.key, "effect": t.effect} for t in spec.taints],
        },
    }


def reservation_requirement(spec: placement.NodeSpec, label: str) -> list[dict[str, Any]]:
    """``label In [cr-...]`` for a slot whose block is an EC2 capacity reservation, when the
    provider names reservations by ``label``; nothing otherwise."""
    block = spec.labels.get(LABEL_RESERVED_CAPACITY, "")
    if not label or not block.startswith(RESERVATION_PREFIX):
        return []
    return [{"key": label, "operator": "In", "values": [block]}]


def listed_claim(obj: dict[str, Any]) -> ownership.ListedClaim:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    launched = next((c for c in status.get("conditions") or [] if c.get("type") == LAUNCHED), None) or {}
    return ownership.ListedClaim(
        launch_failure=ownership.launch_failure(launched.get("status", ""), launched.get("reason", ""),
                                                launched.get("message", ""), status.get("providerID") or ""),
        name=meta.get("name", ""), uid=meta.get("uid", ""), annotations=dict(meta.get("annotations") or {}),
        node_id=(meta.get("labels") or {}).get(LABEL_NODE_ID, ""),
        created=time_or_none(meta.get("creationTimestamp")),
        provider_id=status.get("providerID") or "", node_name=status.get("nodeName") or "",
        deleting=bool(meta.get("deletionTimestamp")))


def read_offerings(path: str, capacity_type: str) -> frozenset[tuple[str, str]] | None:
    """The (instance type, zone) pairs the kwok provider's instance-type file (its
    ``INSTANCE_TYPES_FILE_PATH``, the setting ``karpenter_instance_types_file``) offers with
    ``capacity_type``: an offering whose requirements say that capacity type and one zone (``In``).
    None when there is no file to read or it cannot be read: what Karpenter offers is then unknown.
    The file is read again only when it changed (its mtime)."""
    if not path:
        return None
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        return None
    with _offerings_lock:
        cached = _offerings.get((path, capacity_type))
        if cached is not None and cached[0] == mtime:
            return cached[1]
    try:
        with open(path) as f:
            types = json.load(f)
        out = set()
        for it in types:
            for offering in it.get("offerings") or ():
                req = {r.get("key"): r.get("values") or [] for r in offering.get("Requirements") or ()
                       if r.get("operator") == "In"}
                if capacity_type in req.get(CAPACITY_TYPE, ()) and offering.get("Available", True) is not False:
                    out.update((it["name"], zone) for zone in req.get(ZONE, ()))
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        log.warning("karpenter: cannot read the instance types in %s (%s): offerings not checked", path, e)
        return None
    offered = frozenset(out)
    with _offerings_lock:
        _offerings[(path, capacity_type)] = (mtime, offered)
    return offered


_offerings: dict[tuple[str, str], tuple[int, frozenset[tuple[str, str]]]] = {}
_offerings_lock = threading.Lock()


class KarpenterProvider(KwokProvider):
    """A group's nodes as NodeClaims that Karpenter launches (module docstring).

    ``node_class``: ``group/Kind/name`` of the node class every claim names; ``capacity_type``: the
    ``karpenter.sh/capacity-type`` they require; ``reboot_job``: the admin's reboot action for
    nodes that are not KWOK's; ``reservation_label``: see :func:`nodeclaim_body`."""

    def __init__(self, kube: Kube, node_class: str = "karpenter.kwok.sh/KWOKNodeClass/default",
                 capacity_type: str = "reserved", reboot_seconds: float = DEFAULT_KWOK_REBOOT_SECONDS,
                 reboot_job: RebootJob | None = None, clock: Callable[[], datetime] | None = None,
                 hyperpod_labels: bool = False, reservation_label: str = ""):
        super().__init__(kube, reboot_seconds, **({"clock": clock} if clock else {}), hyperpod_labels=hyperpod_labels)
        self.node_class = node_class
        self.capacity_type = capacity_type
        self.reservation_label = reservation_label
        self._jobs = StaticProvider(kube, reboot_job=reboot_job)
        # What each group's passes remember of its launches, by group key (planning.ownership.launch_verdict).
        self.launch_memory: dict[str, ownership.LaunchMemory] = {}
        self._node_class: tuple[float, ownership.LaunchCause | None] | None = None
        self._node_class_api: tuple[str, str] | None = None  # (version, plural), once discovered
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ launches

    def node_class_problem(self) -> ownership.LaunchCause | None:
        """Why the node class every claim names cannot launch one: it does not exist
        (``NodeClassNotFound``: Karpenter's kwok provider deletes such a claim as "insufficient
        capacity") or its ``Ready`` condition is False (``NodeClassNotReady``, with its message);
        None when it is there, or cannot be read (no right to, the API failed): then nothing is
        said. One read serves :data:`NODE_CLASS_TTL` seconds. Sync (thread)."""
        with self._lock:
            if self._node_class is not None and time.monotonic() - self._node_class[0] < NODE_CLASS_TTL:
                return self._node_class[1]
        try:
            problem = self._read_node_class()
        except Exception as e:  # noqa: BLE001 (a check that cannot be made is not made; the pass goes on)
            log.info("karpenter: cannot read node class %s (%r): not checked", self.node_class, e)
            problem = None
        with self._lock:
            self._node_class = (time.monotonic(), problem)
        return problem

    def _read_node_class(self) -> ownership.LaunchCause | None:
        ref = node_class_ref(self.node_class)
        group, kind, name = ref["group"], ref["kind"], ref["name"]
        missing = ownership.LaunchCause(REASON_NODE_CLASS_NOT_FOUND, f"{kind} {name} ({group}), the node class every "
                                        "NodeClaim names (setting karpenter_node_class), does not exist")
        if self._node_class_api is None:
            try:
                served = self._get(f"/apis/{group}")
            except ApiException as e:
                if e.status == 404:
                    return ownership.LaunchCause(missing.reason, f"{missing.message} (no {group} API is served)")
                raise
            version = (served.get("preferredVersion") or {}).get("version") or served["versions"][0]["version"]
            resources = self._get(f"/apis/{group}/{version}").get("resources") or []
            plural = next((r["name"] for r in resources if r.get("kind") == kind and "/" not in r["name"]), None)
            if plural is None:
                return ownership.LaunchCause(missing.reason, f"{missing.message} (no kind {kind} in {group}/{version})")
            self._node_class_api = (version, plural)
        version, plural = self._node_class_api
        try:
            obj = self.kube.custom.get_cluster_custom_object(group, version, plural, name)
        except ApiException as e:
            if e.status == 404:
                return missing
            raise
        ready = next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
        if ready is not None and ready.get("status") == "False":
            return ownership.LaunchCause(REASON_NODE_CLASS_NOT_READY, f"{kind} {name} is not ready: "
                                         f"{ready.get('reason') or ''} {ready.get('message') or ''}".strip())
        return None

    def _get(self, path: str) -> dict[str, Any]:
        return self.kube.api.call_api(path, "GET", response_types_map={200: "object"}, auth_settings=["BearerToken"],
                                      _return_http_data_only=True)

    # ------------------------------------------------------------------ claims

    def create(self, spec: placement.NodeSpec, claim: str = "") -> MadeNode:
        """Create the slot's NodeClaim; the node id as the name (no Node yet) and the claim's ref.
        A claim of that name that exists already (409) is this create's when it carries the same
        nonce (a retry after the answer was lost), else not the group's (no ref)."""
        body = nodeclaim_body(spec, claim, self.node_class, self.capacity_type, self.reservation_label)
        name = body["metadata"]["name"]
        try:
            made = self.kube.custom.create_cluster_custom_object(KARPENTER_GROUP, KARPENTER_VERSION, NODECLAIMS, body)
        except ApiException as e:
            if e.status != 409:
                raise
            made = self.read_claim(name)
            if made is None or not claim or (made["metadata"].get("annotations") or {}).get(ANNOTATION_CLAIM) != claim:
                return MadeNode(spec.name, "")
        return MadeNode(spec.name, "", node_claim=NodeClaimRef(name=name, uid=made["metadata"]["uid"]))

    def read_claim(self, name: str) -> dict[str, Any] | None:
        try:
            return self.kube.custom.get_cluster_custom_object(KARPENTER_GROUP, KARPENTER_VERSION, NODECLAIMS, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list_claims(self, group: str) -> list[ownership.ListedClaim]:
        """The NodeClaims under the group's label (the record decides which are the group's)."""
        answer = self.kube.custom.list_cluster_custom_object(
            KARPENTER_GROUP, KARPENTER_VERSION, NODECLAIMS,
            label_selector=f"{naming.LABEL_GROUP}={naming.label_value(group)}")
        return [listed_claim(obj) for obj in answer.get("items") or []]

    def delete_claim(self, name: str, uid: str) -> str:
        """Delete the NodeClaim of that name if its uid is ``uid``; what became of it, in words."""
        done = delete_guarded(lambda options: self.kube.custom.delete_cluster_custom_object(
            KARPENTER_GROUP, KARPENTER_VERSION, NODECLAIMS, name, body=options), uid)
        if done == "gone":
            return f"NodeClaim {name} gone already"
        if done == "another":
            return f"NodeClaim {name} is another claim now (its uid is not {uid}): left alone"
        return f"NodeClaim {name} deleted (Karpenter terminates its node)"

    # ------------------------------------------------------------------ nodes

    def release(self, node: str, uid: str = "", lent: lending.LentRecord | None = None,
                cordoned: bool = False) -> str:
        """Delete the NodeClaim of the Node (the one its owner reference names, if that claim's
        status has the Node's providerID). A Node that is gone is released; one that no claim of
        ours stands behind is left alone."""
        current = read_node_or_none(self.kube, node)
        if current is None:
            return f"{node} is gone already"
        if uid and uid_of(current) != uid:
            return f"{node} is another node now (its uid is not {uid}): left alone"
        provider_id = (current.spec.provider_id if current.spec else None) or ""
        for ref in current.metadata.owner_references or []:
            if ref.kind != "NodeClaim" or not ref.api_version.startswith(f"{KARPENTER_GROUP}/"):
                continue
            claim = self.read_claim(ref.name)
            if claim is None or claim["metadata"].get("uid") != ref.uid:
                continue
            if provider_id and (claim.get("status") or {}).get("providerID") == provider_id:
                return f"{node}: " + self.delete_claim(ref.name, ref.uid)
        return f"{node}: no NodeClaim with its providerID owns it: left alone"

    def reboot(self, node: str, uid: str = "") -> None:
        """KWOK's reboot on a node KWOK runs (Karpenter's kwok provider), else the reboot Job."""
        current = read_node_or_none(self.kube, node)
        if current is None:
            return
        if (current.metadata.annotations or {}).get(KWOK_ANNOTATION) == "fake":
            super().reboot(node, uid)
        else:
            self._jobs.reboot(node, uid)


_karpenter: type[NodeProvider] = KarpenterProvider  # it satisfies the Protocol (see actuation.providers.base)
