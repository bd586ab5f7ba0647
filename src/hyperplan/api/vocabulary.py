"""The domain's words, defined once: the API group and finalizers, every label, annotation, taint
and node condition key the operator reads or writes, the values they take, the condition types
and reasons that more than one module uses, the plan targets, the UltraServer sizes, and the
wire's time format.

Everything else (the models, planning, actuation, the handlers, the Kueue controller, the
invariant checks) imports them from here, so a key is one edit and a reader can find every
word the operator puts on a node in one file. Words that only one concern uses (the admission
check's reasons in ``planning.admission``, the placement reasons in ``planning.placement``) stay
with that concern, which says so.

Pure: stdlib only, so that planning may import it.
"""

from __future__ import annotations

from datetime import datetime, timezone

GROUP = "hyperplan.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
# kopf's finalizer and its annotations on our objects (wiring.events.configure_kopf).
FINALIZER = f"{GROUP}/finalizer"
# The operator's own finalizer on a TrainingPlan that may hold reservations (controllers.plan.reconciler).
# Not kopf's: kopf removes its finalizer from objects of a kind it has no deletion handler for.
PLAN_FINALIZER = f"{GROUP}/release-reservations"
# The operator's own finalizer on a group: its nodes are drained and removed before it goes.
GROUP_FINALIZER = f"{GROUP}/drain-nodes"
ANNOTATION_PREFIX = GROUP
OWN_PREFIX = f"{GROUP}/"  # every key below that starts with it is the operator's own

# --------------------------------------------------------------------------- node labels

# Well-known Kubernetes keys the operator sets on its nodes.
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_HOSTNAME = "kubernetes.io/hostname"

LABEL_GROUP = f"{GROUP}/instance-group"
LABEL_PLAN = f"{GROUP}/training-plan"
LABEL_RESERVED_CAPACITY = f"{GROUP}/reserved-capacity"
LABEL_ROLE = f"{GROUP}/role"
LABEL_HEALTH = f"{GROUP}/node-health-status"
# HyperPod's own health key: read beside hyperplan's (planning.nodefacts decides from both).
LABEL_SAGEMAKER_HEALTH = "sagemaker.amazonaws.com/node-health-status"
# A node's deep health checks (planning.deepchecks): written under both keys, HyperPod's beside
# hyperplan's, for schedulers and job templates that select by either. Output only: the operator
# reads a node's checks from its own Jobs and the group's record, never from these labels.
LABEL_DEEP_HEALTH_CHECK = f"{GROUP}/deep-health-check-status"
LABEL_SAGEMAKER_DEEP_HEALTH_CHECK = "sagemaker.amazonaws.com/deep-health-check-status"
# HyperPod's fault labels: the kind of fault a marked node has and its detail, written with the
# setting hyperpod_labels beside the health label (planning.nodefacts.hyperpod_fault). Output only.
LABEL_SAGEMAKER_FAULT_TYPES = "sagemaker.amazonaws.com/fault-types"
LABEL_SAGEMAKER_FAULT_REASONS = "sagemaker.amazonaws.com/fault-reasons"
LABEL_SLOT = f"{GROUP}/slot"
LABEL_GENERATION = f"{GROUP}/generation"
LABEL_REPLACES = f"{GROUP}/replaces"
# The UltraServer topology keys that HyperPod and Kueue users already write (the defaults of
# settings.ultraserver_id_label and settings.network_layer_labels; planning.naming.TopologyKeys).
TOPOLOGY_PREFIX = "topology.k8s.aws/"
TOPOLOGY_ULTRASERVER_ID = f"{TOPOLOGY_PREFIX}ultraserver-id"
TOPOLOGY_LAYERS = tuple(f"{TOPOLOGY_PREFIX}network-node-layer-{n}" for n in (1, 2, 3))
# Static nodes (planning.lending): the node's stable id in a group, and the free pool.
LABEL_NODE_ID = f"{GROUP}/node-id"
# Keys under node-restriction.kubernetes.io/, which the NodeRestriction admission plugin forbids a
# kubelet to set, change or remove on its own Node: only an admin (or the operator) can put a node
# into the pool, and only the operator can say which group a node serves (docs/security.md,
# "Which node labels a scheduler may trust").
NODE_RESTRICTION_PREFIX = "node-restriction.kubernetes.io/"
LABEL_POOL = f"{NODE_RESTRICTION_PREFIX}hyperplan-pool"
# The group a node serves, as LABEL_GROUP says it, on every node the operator creates or lends: the
# key a pod that must land on a group's nodes selects by.
LABEL_TRUSTED_GROUP = f"{NODE_RESTRICTION_PREFIX}hyperplan-instance-group"
POOL_FREE = "free"
POOL_HELD = "held"
# Training-job plans (planning.trainingjobs): the workload a node serves; and the same under the
# key a kubelet cannot set on its own Node, which Kueue's admission steers the workload's pods by.
LABEL_WORKLOAD = f"{GROUP}/workload"
LABEL_TRUSTED_WORKLOAD = f"{NODE_RESTRICTION_PREFIX}hyperplan-workload"
# Set by the kwok provider when it creates a node, under the key a kubelet cannot set on its own Node:
# what the chart's node policy knows the provider's nodes by (KWOK's annotation and the node-id
# label a kubelet could write on any Node).
LABEL_TRUSTED_KWOK = f"{NODE_RESTRICTION_PREFIX}hyperplan-kwok"

ROLE_ACTIVE = "active"
ROLE_SPARE = "spare"

# The HyperPod health values.
HEALTH_SCHEDULABLE = "Schedulable"
HEALTH_UNSCHEDULABLE = "Unschedulable"
HEALTH_PENDING_REPLACEMENT = "UnschedulablePendingReplacement"
HEALTH_PENDING_REBOOT = "UnschedulablePendingReboot"

# HyperPod's deep health checks (spec.onStartDeepHealthChecks) and their states.
INSTANCE_STRESS = "InstanceStress"
INSTANCE_CONNECTIVITY = "InstanceConnectivity"
DEEP_HEALTH_CHECKS = (INSTANCE_STRESS, INSTANCE_CONNECTIVITY)
CHECK_IN_PROGRESS = "InProgress"
CHECK_PASSED = "Passed"
CHECK_FAILED = "Failed"

# An UltraServer's health status (a plan's status.ultraServers[].healthStatus).
STATUS_OK = "ok"
STATUS_IMPAIRED = "impaired"
STATUS_INSUFFICIENT_DATA = "insufficient-data"

# --------------------------------------------------------------------------- node annotations

ANNOTATION_CORDONED = f"{GROUP}/cordoned"
"""``"true"`` while a node is cordoned because hyperplan cordoned it (for a drain)."""
ANNOTATION_HEALTH_SINCE = f"{GROUP}/health-signal-since"
"""``<health label value>@<RFC 3339>``: when the operator first saw a node's ``Unschedulable*``
health label. Labels carry no time, and the grace of that signal counts from the first sight:
kept on the node, a restarted operator neither judges the node early nor starts its grace anew."""
ANNOTATION_EVICTING_SINCE = f"{GROUP}/evicting-since"
"""RFC 3339: when the operator started to evict a failed node's pods (the deadline of a dead
node's eviction counts from it, across restarts)."""
ANNOTATION_LENT = f"{GROUP}/lent"
"""JSON: ``{"labels": {key: value before adoption or null}, "taintKeys": [...], "taints": [...]}``."""
ANNOTATION_CLAIM = f"{GROUP}/claim"
"""A nonce the operator writes on a node it creates or adopts, whose SHA-256 the group's record
holds (``status.nodes[].claim``) from just before the write: after a crash between the write and
the pass's status patch, the node is recognised as the group's by it (``planning.ownership``)."""
# Tags of a training plan bought at a remote SageMaker endpoint (controllers.plan.remote, docs/aws.md):
# which plan of this cluster bought it.
TAG_TRAINING_PLAN = f"{GROUP}/training-plan"
TAG_TRAINING_PLAN_UID = f"{GROUP}/training-plan-uid"
ANNOTATION_KEEP_ALIVE_UNTIL = f"{GROUP}/keep-alive-until"
"""RFC 3339: when an idle warm node of a training-job plan is released, unless a workload takes it."""
ANNOTATION_BLOCK_TERMINATION = f"{GROUP}/block-termination-time"
"""On a workload's pods: when the block its node belongs to reaches its termination time (RFC 3339).
From then on the node drains; readable in the pod through the downward API (docs/checkpoint.md)."""
ANNOTATION_LAST_HANDLED = f"{GROUP}/last-handled-configuration"  # kopf's diff base on groups
ANNOTATION_CREATED_BY = f"{GROUP}/created-by"
"""On a TrainingPlan the SageMaker API made: the Kubernetes user whose key made it. A key that may
create plans but not list them sees only the plans it made (sagemaker.access, "Whose plans").
The chart's ValidatingAdmissionPolicy (plan-creator) admits it only as the creating user's own
name, and never a change of it, so it is the API server's word, not the caller's."""

# --------------------------------------------------------------------------- taints and node conditions

TAINT_SPARE = f"{GROUP}/spare"  # value "true", NoSchedule (planning.naming.SPARE_TAINT)
TAINT_UNHEALTHY = f"{GROUP}/unhealthy"  # value "true", NoSchedule (planning.naming.UNHEALTHY_TAINT)
# Value the check state (InProgress, Failed), NoSchedule, until a node passes its deep health checks.
TAINT_DEEP_HEALTH_CHECK = f"{GROUP}/deep-health-check"
CONDITION_BLOCK_TERMINATING = f"{GROUP}/BlockTerminating"
"""Node condition, ``True`` from the checkpoint signal on: the node's block is about to terminate."""
# Taints the node lifecycle controller sets (they follow a condition or the cordon).
KUBE_NODE_TAINT_PREFIX = "node.kubernetes.io/"

# --------------------------------------------------------------------------- conditions and reasons shared by modules

CONDITION_READY = "Ready"
CONDITION_RECONCILED = "Reconciled"  # False while an object's passes fail (runtime.workqueue)
REASON_OFFERING_UNAVAILABLE = "OfferingUnavailable"
"""The ledger's re-check refused an offering: its capacity was sold meanwhile, or its pool changed
(made by planning.offerings, matched by the purchase's search-again in controllers.plan.reconciler)."""
REASON_OFFERING_NOT_FOUND = "OfferingNotFound"
"""``spec.offeringId`` names no offering: not one the plan's status lists, nor one a search again
from the spec finds (planning.plans)."""
REASON_OFFERING_MISMATCH = "OfferingDoesNotMatchSpec"
"""``spec.offeringId`` names an entry of ``status.offerings`` whose id is not the digest of its
blocks and the spec: the entry was written by someone other than the operator's search, and
nothing is bought (planning.plans)."""
REASON_OFFERING_NO_LONGER_OFFERED = "OfferingNoLongerOffered"
"""``spec.offeringId`` names an offering the operator did list, but a search again from the spec
and the pools at the purchase no longer finds it (sold, its pool changed, or too late to buy)."""
REASON_EXTENSION_NOT_OFFERED = "ExtensionNotOffered"
"""An entry of ``spec.extensions`` names no extension a search again from the plan's blocks in the
ledger and the pools cuts now (another plan's or block's id, its room sold, or too late to buy):
nothing is bought (planning.plans)."""
REASON_REMOTE_EXTENDING = "RemoteExtending"
"""An entry of ``spec.extensions`` of a remote block: the remote endpoint took the extension
(ExtendTrainingPlan answered, or its extension history names it) and the block as recorded here
does not show the new end yet; it is never bought again meanwhile (planning.plans)."""
REASON_REMOTE_EXTENSION_FAILED = "RemoteExtensionFailed"
"""The remote endpoint took an extension and its history then says it failed: nothing was extended."""
CONDITION_NODES_LAUNCHED = "NodesLaunched"
"""A karpenter group's condition, ``False`` while its NodeClaims cannot launch: its node class is
missing or not ready, Karpenter does not offer its instance type or zone, or Karpenter failed its
claims (its reason and message); absent while nothing stands in the way (planning.ownership)."""
REASON_NODE_CLASS_NOT_FOUND = "NodeClassNotFound"
REASON_NODE_CLASS_NOT_READY = "NodeClassNotReady"
REASON_NOT_OFFERED = "NotOffered"  # Karpenter's instance types have no such type, zone and capacity type
REASON_CLAIM_DELETED = "NodeClaimDeletedBeforeLaunch"  # Karpenter (or someone) deleted a claim it had not launched
REASON_CHECKPOINT = "CheckpointRequested"
REASON_UNREADABLE = "UnreadableValue"  # a label or annotation of a node that a pass read as absent
REASON_DELETED_BY_HYPERPLAN = "DeletionByHyperplan"
"""Reason of the ``DisruptionTarget`` pod condition hyperplan sets on a pod it deletes from a dead
node (the Eviction API sets ``EvictionByEvictionAPI`` itself)."""

# --------------------------------------------------------------------------- plans

# What a training plan's capacity serves: a plan serves one, not both.
TRAINING_JOB = "training-job"
HYPERPOD_CLUSTER = "hyperpod-cluster"
TARGET_RESOURCES = (TRAINING_JOB, HYPERPOD_CLUSTER)
# A hyperpod-cluster plan's blocks all lie in one AZ; a training-job plan's blocks may not.
SINGLE_AZ_TARGETS = frozenset({HYPERPOD_CLUSTER})

# Instances per UltraServer, by UltraServer type, and the instance type UltraServers are made of.
ULTRASERVER_INSTANCES = {"ml.u-p6e-gb200x72": 18, "ml.u-p6e-gb200x36": 9}
ULTRASERVER_TYPES = tuple(ULTRASERVER_INSTANCES)
ULTRASERVER_INSTANCE_TYPE = "ml.p6e-gb200.36xlarge"

# The Kueue AdmissionCheck controller's name (docs/admission.md).
ADMISSION_CONTROLLER_NAME = f"{GROUP}/training-plan"

# --------------------------------------------------------------------------- the wire's time format


def to_rfc3339(moment: datetime, *, micro: bool = False) -> str:
    """A time as the API's date-time fields and the operator's annotations carry it: UTC, ``Z``,
    whole seconds (``micro``: to the microsecond, for records a grace is counted from)."""
    fmt = "%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ"
    return moment.astimezone(timezone.utc).strftime(fmt)


class Unreadable(ValueError):
    """A value read back from an object that cannot be read. ``problem`` says why, in words that
    follow the value in a message (``'2026-12-01T12:00:00' has no timezone``)."""

    def __init__(self, text: object, problem: str) -> None:
        super().__init__(f"{text!r} {problem}")
        self.problem = problem


NO_TIMEZONE = "has no timezone"
NOT_A_TIME = "is not an RFC 3339 time"


def from_rfc3339(text: str) -> datetime:
    """The inverse of :func:`to_rfc3339` (fractional seconds too). Strict: a time without a
    timezone raises :class:`Unreadable` (a ValueError), as unreadable text does, since comparing
    it with the operator's aware times would fail later, far from the value that caused it."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise Unreadable(text, NOT_A_TIME) from None
    if moment.tzinfo is None:
        raise Unreadable(text, NO_TIMEZONE)
    return moment

# The SageMaker API's access keys (hyperplan.sagemaker.access): the type of the Secrets that hold
# them, and the label naming whose key a Secret is.
API_KEY_SECRET_TYPE = f"{GROUP}/api-key"
SECRET_LABEL_API_KEY_USER = f"{GROUP}/api-key-user"


# Keys of the operator's Jobs, pods, plans and EC2 reservations, and KWOK's node annotation.
ANNOTATION_SAGEMAKER_TAGS = f"{OWN_PREFIX}sagemaker-tags"  # a plan's tags as the SageMaker API took them
# When a rebooted KWOK node is back: the stage hyperplan-node-reboot of
# src/hyperplan_dev/kwok-stages.yaml waits until then (an absolute time, so that the node's other
# changes meanwhile, each of which makes KWOK match its stages again, do not restart the wait).
ANNOTATION_REBOOT_UNTIL = f"{OWN_PREFIX}reboot-until"
ANNOTATION_REBOOT_NODE = f"{OWN_PREFIX}reboot-node"  # the node a reboot Job runs on
ANNOTATION_REBOOT_NODE_UID = f"{OWN_PREFIX}reboot-node-uid"
DEEP_CHECK_JOB_LABEL = f"{OWN_PREFIX}deep-health-check"  # the check a deep-check Job runs
DEEP_CHECK_RUN_LABEL = f"{OWN_PREFIX}deep-health-check-run"  # the InstanceConnectivity run of a pod
ANNOTATION_CHECK_NODE = f"{OWN_PREFIX}check-node"
ANNOTATION_CHECK_NODE_UID = f"{OWN_PREFIX}check-node-uid"
ANNOTATION_CHECK_NODE_ID = f"{OWN_PREFIX}check-node-id"
# On KWOK: a test ends a check pod Failed with this exit code and output (the stage
# hyperplan-deep-health-check-fail).
ANNOTATION_KWOK_CHECK_EXIT_CODE = f"{OWN_PREFIX}kwok-check-exit-code"
ANNOTATION_KWOK_CHECK_OUTPUT = f"{OWN_PREFIX}kwok-check-output"
TAG_REMOTE_PLAN = f"{GROUP}/remote-plan"  # EC2 tag: the attempt that bought the reservation
TAG_ZONE = f"{GROUP}/availability-zone"  # EC2 tag: the zone as the buying pool names it
TAG_ULTRASERVER_TYPE = f"{GROUP}/ultraserver-type"  # EC2 tag: an UltraServer purchase's type
KWOK_ANNOTATION = "kwok.x-k8s.io/node"  # KWOK runs a node that carries it (=fake)
