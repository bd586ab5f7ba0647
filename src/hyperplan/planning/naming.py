"""The names and labels hyperplan gives nodes: label keys, roles, health values, taints, node
names, UltraServer and network-node ids, and the topology keys a scheduler reads.

Pure: stdlib only.

Node naming (:func:`node_name`): ``hp-<group>-<hash8(reservedCapacityId)>-<slot>`` plus
``-g<generation>`` for generation > 0. ``<slot>`` is ``<ultraServerIndex>-<n>`` on
UltraServer blocks and ``<n>`` otherwise; ``<n>`` counts the group's slots on that
UltraServer. ``<group>`` is the group name when it is a short (<= 30) DNS label, else a
cleaned, truncated prefix plus a 4-hex hash of the full name. Names are lowercase DNS-1123
labels of at most 63 characters and depend only on the inputs, so a restarted operator
computes the same names and never duplicates a node. A replacement after a failure keeps
the slot and bumps the generation, so it never reuses the failed node's name.

Network topology labels (:func:`hyperplan.planning.placement.topology_labels`) follow AWS EC2 instance topology, which
``topology.k8s.aws/network-node-layer-N`` mirrors on EKS/HyperPod: the node set is listed
top-down, so **layer-1 is the top (farthest) layer and layer-3 the one closest to the
instance**. hyperplan assigns:

* layer-1: one network node per availability zone (the spine);
* layer-2: one per reserved-capacity block (the UltraServers bought together);
* layer-3: one per UltraServer, i.e. its NVLink domain (same grouping as
  ``topology.k8s.aws/ultraserver-id``).

Values look like AWS network-node ids (``nn-`` + 17 hex digits, a hash of the level's
identity). A Kueue ``Topology`` therefore lists, top to bottom:
:func:`kueue_topology_levels` = layer-1, layer-2, layer-3, ``kubernetes.io/hostname``.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

# The keys and values themselves are defined in api.vocabulary; planning reads them through this
# module, beside the names and taints built from them.
from hyperplan.api.vocabulary import (  # noqa: F401  (re-exported)
    ANNOTATION_CORDONED,
    HEALTH_PENDING_REBOOT,
    HEALTH_PENDING_REPLACEMENT,
    HEALTH_SCHEDULABLE,
    HEALTH_UNSCHEDULABLE,
    LABEL_DEEP_HEALTH_CHECK,
    LABEL_GENERATION,
    LABEL_GROUP,
    LABEL_HEALTH,
    LABEL_HOSTNAME,
    LABEL_INSTANCE_TYPE,
    LABEL_PLAN,
    LABEL_REPLACES,
    LABEL_RESERVED_CAPACITY,
    LABEL_ROLE,
    LABEL_SAGEMAKER_DEEP_HEALTH_CHECK,
    LABEL_SAGEMAKER_FAULT_REASONS,
    LABEL_SAGEMAKER_FAULT_TYPES,
    LABEL_SAGEMAKER_HEALTH,
    LABEL_SLOT,
    LABEL_ZONE,
    ROLE_ACTIVE,
    ROLE_SPARE,
    STATUS_IMPAIRED,
    STATUS_INSUFFICIENT_DATA,
    STATUS_OK,
    TAINT_SPARE,
    TAINT_UNHEALTHY,
    TOPOLOGY_LAYERS,
    TOPOLOGY_ULTRASERVER_ID,
)

# --------------------------------------------------------------------------- constants

NODE_NAME_PREFIX = "hp"
_GROUP_PART_MAX = 30
_DNS_LABEL_MAX = 63


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


SPARE_TAINT = Taint(TAINT_SPARE, "true", "NoSchedule")
UNHEALTHY_TAINT = Taint(TAINT_UNHEALTHY, "true", "NoSchedule")
# HyperPod's own taint of a node its health agent finds unfit, written beside UNHEALTHY_TAINT when
# the setting hyperpod_labels is on (planning.nodefacts.hyperpod_mirror).
SAGEMAKER_UNHEALTHY_TAINT = Taint(LABEL_SAGEMAKER_HEALTH, HEALTH_UNSCHEDULABLE, "NoSchedule")


@dataclass(frozen=True)
class TopologyKeys:
    """Label keys for UltraServer topology (configurable; defaults are the EKS/HyperPod keys)."""

    ultraserver_id: str = TOPOLOGY_ULTRASERVER_ID
    layer1: str = TOPOLOGY_LAYERS[0]
    layer2: str = TOPOLOGY_LAYERS[1]
    layer3: str = TOPOLOGY_LAYERS[2]


def kueue_topology_levels(keys: TopologyKeys = TopologyKeys()) -> list[str]:
    """Node labels for a Kueue ``Topology``'s ``levels``, top (farthest) to bottom (closest)."""
    return [keys.layer1, keys.layer2, keys.layer3, LABEL_HOSTNAME]


# --------------------------------------------------------------------------- names and values


def _hash(text: str, length: int) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def is_dns_label(name: str) -> bool:
    """True for a DNS-1123 label: lowercase alphanumerics and '-', alnum at both ends, <= 63."""
    return len(name) <= _DNS_LABEL_MAX and bool(_DNS_LABEL_RE.match(name))


def label_value(text: str) -> str:
    """``text`` if it is a valid Kubernetes label value, else a valid, unique stand-in.

    The stand-in is a cleaned prefix plus ``-`` and 8 hex digits of a hash of ``text``, at
    most 63 characters. Use the same function to build selectors for such labels.
    """
    if len(text) <= _DNS_LABEL_MAX and _LABEL_VALUE_RE.match(text):
        return text
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[: _DNS_LABEL_MAX - 9]
    cleaned = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", cleaned)
    digest = _hash(text, 8)
    return f"{cleaned}-{digest}" if cleaned else digest


def _group_part(group: str) -> str:
    if len(group) <= _GROUP_PART_MAX and _DNS_LABEL_RE.match(group):
        return group
    cleaned = re.sub(r"[^a-z0-9-]", "-", group.lower())[: _GROUP_PART_MAX - 5].strip("-")
    digest = _hash(group, 4)
    return f"{cleaned}-{digest}" if cleaned else digest


def node_name(group: str, reserved_capacity_id: str, slot: str, generation: int = 0) -> str:
    """The deterministic node name of a group's slot on a block (see the module docstring).

    ``slot`` is ``"<ultraServerIndex>-<n>"`` or ``"<n>"``; ``generation`` > 0 appends
    ``-g<generation>`` so that a replacement never reuses a failed node's name.
    """
    if generation < 0:
        raise ValueError(f"generation must be >= 0, got {generation}")
    if not re.fullmatch(r"[0-9]+(-[0-9]+)?", slot):
        raise ValueError(f"slot must be '<n>' or '<ultraServerIndex>-<n>', got {slot!r}")
    name = f"{NODE_NAME_PREFIX}-{_group_part(group)}-{_hash(reserved_capacity_id, 8)}-{slot}"
    if generation:
        name = f"{name}-g{generation}"
    if not is_dns_label(name):  # only with absurd slot or generation numbers
        raise ValueError(f"node name {name!r} is not a valid DNS-1123 label")
    return name


def ultraserver_id(reserved_capacity_id: str, index: int) -> str:
    """``<reservedCapacityId>-us-<index>``, kept a valid label value (hashed when too long)."""
    suffix = f"-us-{index}"
    candidate = f"{reserved_capacity_id}{suffix}"
    if len(candidate) <= _DNS_LABEL_MAX and _LABEL_VALUE_RE.match(candidate):
        return candidate
    base = label_value(reserved_capacity_id)
    if len(base) + len(suffix) > _DNS_LABEL_MAX:
        keep = _DNS_LABEL_MAX - len(suffix) - 9
        base = f"{base[:keep].rstrip('-_.')}-{_hash(reserved_capacity_id, 8)}"
    return f"{base}{suffix}"


def network_node_id(level: str, identity: str) -> str:
    """An AWS-style network-node id (``nn-`` + 17 hex) for a topology level's identity."""
    return "nn-" + _hash(f"{level}/{identity}", 17)


