"""The recording fakes that unit tests and benchmarks put in place of the operator's side effects.

One module for all of them, like Karpenter's ``cloudprovider/fake``: the production modules never
import it, so a fake cannot reach the operator by accident
(``tests/unit/test_fakes_apart.py`` checks that). Each fake implements the Protocol of the real
thing and is checked against it at the bottom of this module and, parameter by parameter, in
``tests/unit/test_protocols.py``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Callable, Collection, Mapping, Sequence

from kubernetes import client
from kubernetes.client.rest import ApiException

from hyperplan.actuation.deepchecks import DeepCheckJobs, Target
from hyperplan.actuation.kueue import KueueWrites
from hyperplan.actuation.leadership import LeaseRecord, LeaseStore
from hyperplan.actuation.ledger import (
    CapacityLedger, PurchaseResult, addition_refusal, blocks_of, extended_lines, extension_refusal, pool_snapshot,
    reservations_by_pool,
)
from hyperplan.actuation.pods import DrainProgress, NodePods
from hyperplan.actuation.providers.base import (
    LABEL_NODE_ID, REBOOT_REASON, AdoptionConflict, MadeNode, NodeProvider, mark_healthy_patch, mark_unhealthy_patch, merged_taints, rebooting,
)
from hyperplan.planning.lending import LentRecord
from hyperplan.actuation.remote.capacity_blocks import ExtendsCapacityBlocks
from hyperplan.actuation.remote.calls import CapacitySeller, NotBought
from hyperplan.actuation.remote.sagemaker import SageMakerSelling
from hyperplan.api.models import CapacityPool, Reservation
from hyperplan.api.vocabulary import ANNOTATION_CLAIM, from_rfc3339, to_rfc3339
from hyperplan.planning import deepchecks
from hyperplan.planning import naming
from hyperplan.planning import placement
from hyperplan.planning.offerings import Extension, Offering, RuleViolation, recheck_offering
from hyperplan.planning.policy import Policy
from hyperplan.planning.tenancy import pools_for_plan


# --------------------------------------------------------------------------- capacity ledger


@dataclass
class FakeLedger:
    """In-memory ledger for unit tests: records every call, can be told to fail a purchase."""

    pool_objects: list[CapacityPool] = field(default_factory=list)
    fail_with: RuleViolation | None = None
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def pools(self) -> list[CapacityPool]:
        return list(self.pool_objects)

    def purchase(self, plan: str, plan_uid: str, offering: Offering, policy: Policy,
                 now: datetime, plan_labels: Mapping[str, str] | None = None) -> PurchaseResult:
        self.calls.append(("purchase", (plan, offering.id)))
        snapshots = pools_for_plan([pool_snapshot(p, plan_uid) for p in self.pool_objects], plan_labels)
        violation = self.fail_with or recheck_offering(offering, snapshots, policy, now)
        if violation:
            return PurchaseResult(violation=violation, pools=tuple(snapshots))
        by_name = {p.metadata["name"]: p for p in self.pool_objects}
        for pool_name, wanted in reservations_by_pool(plan, plan_uid, offering).items():
            have = {r.reserved_capacity_id for r in by_name[pool_name].status.reservations}
            by_name[pool_name].status.reservations.extend(r for r in wanted if r.reserved_capacity_id not in have)
        return PurchaseResult(blocks=tuple(blocks_of(self.pool_objects, plan_uid)))

    def extend(self, plan: str, plan_uid: str, extension: Extension, policy: Policy,
               now: datetime, plan_labels: Mapping[str, str] | None = None) -> PurchaseResult:
        self.calls.append(("extend", (plan, extension.id)))
        by_name = {p.metadata["name"]: p for p in self.pool_objects}
        pool = by_name.get(extension.block.pool)
        lines = [r.wire() for r in pool.status.reservations] if pool is not None else []
        violation, done = extension_refusal(lines, plan_uid, extension)
        snapshots = pools_for_plan([pool_snapshot(p, plan_uid) for p in self.pool_objects], plan_labels)
        if not done:
            violation = self.fail_with or violation or recheck_offering(extension.as_offering, snapshots, policy, now)
            if violation:
                return PurchaseResult(violation=violation, pools=tuple(snapshots))
            assert pool is not None
            pool.status.reservations = [Reservation.model_validate(r)
                                        for r in extended_lines(lines, plan_uid, extension)]
        return PurchaseResult(blocks=tuple(blocks_of(self.pool_objects, plan_uid)))

    def add_ultraserver(self, plan: str, plan_uid: str, addition, plan_labels=None) -> PurchaseResult:
        self.calls.append(("add_ultraserver", (plan, addition.id)))
        pool = next((p for p in self.pool_objects if p.metadata["name"] == addition.pool), None)
        raw = None if pool is None else {"metadata": pool.metadata, **pool.model_dump(by_alias=True, mode="json",
                                                                                      include={"spec", "status"},
                                                                                      exclude_none=True)}
        violation, done = addition_refusal(raw, plan_uid, addition, plan_labels)
        violation = None if done else self.fail_with or violation
        if violation:
            return PurchaseResult(violation=violation)
        if not done:
            assert pool is not None
            pool.status.reservations.append(addition.to_reservation(plan, plan_uid))
        return PurchaseResult(blocks=tuple(blocks_of(self.pool_objects, plan_uid)))

    def record_remote(self, pool: str, plan: str, plan_uid: str, lines) -> list:
        self.calls.append(("record_remote", (pool, plan, len(lines))))
        target = next(p for p in self.pool_objects if p.metadata["name"] == pool)
        target.status.reservations = [r for r in target.status.reservations if r.training_plan_uid != plan_uid] \
            + list(lines)
        return blocks_of(self.pool_objects, plan_uid)

    def release(self, plan_uid: str, now: datetime | None) -> int:
        self.calls.append(("release", plan_uid))
        released = 0
        for p in self.pool_objects:
            before = len(p.status.reservations)
            p.status.reservations = [r for r in p.status.reservations if r.training_plan_uid != plan_uid
                                     or (now is not None and r.end_time <= now)]
            released += before - len(p.status.reservations)
        return released


# --------------------------------------------------------------------------- node providers


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class FakeProvider:
    """Nodes in memory; records calls; ``fail_on`` makes a named operation raise.

    ``clock`` stamps the creation time of new nodes (tests pass a fixed one). Each of the next
    ``adoption_conflicts`` creates loses the race for a free node, as a static provider's does
    when another writer adopts the node first (it raises :class:`AdoptionConflict`, creating nothing).

    :meth:`reboot` sets the node Ready=False reason ``Rebooting`` and leaves it so: a test brings
    it back with :meth:`finish_reboot` (a node that comes back) or never (one that does not)."""

    nodes: dict[str, client.V1Node] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    fail_on: set[str] = field(default_factory=set)
    clock: Callable[[], datetime] = _utcnow
    adoption_conflicts: int = 0
    hyperpod_labels: bool = True  # as the setting's default: the marks write HyperPod's label and taint too
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)  # creates run in threads

    def _maybe_fail(self, op: str, name: str) -> None:
        self.calls.append((op, name))
        if op in self.fail_on:
            raise RuntimeError(f"injected failure in {op}({name})")

    def create(self, spec: placement.NodeSpec, claim: str = "") -> MadeNode:
        self._maybe_fail("create", spec.name)
        with self._lock:
            lost = self.adoption_conflicts > 0
            self.adoption_conflicts -= lost
        if lost:
            raise AdoptionConflict(f"{spec.name}: the free node chosen was adopted by another writer")
        self.nodes.setdefault(spec.name, client.V1Node(
            metadata=client.V1ObjectMeta(name=spec.name, labels={**spec.labels, LABEL_NODE_ID: spec.name},
                                         annotations={ANNOTATION_CLAIM: claim} if claim else None,
                                         creation_timestamp=self.clock(), uid=f"uid-{spec.name}"),
            spec=client.V1NodeSpec(taints=[client.V1Taint(key=t.key, value=t.value, effect=t.effect)
                                           for t in spec.taints])))
        return MadeNode(spec.name, self.nodes[spec.name].metadata.uid or "")

    def update(self, node: str, spec: placement.NodeSpec, managed_keys: set[str], uid: str = "",
               lent: LentRecord | None = None) -> LentRecord | None:
        self._maybe_fail("update", node)
        n = self.nodes[node]
        n.metadata.labels.update(spec.labels)
        n.spec.taints = [client.V1Taint(key=t.key, value=t.value, effect=t.effect)
                         for t in merged_taints(n, spec.taints, managed_keys)]
        return None

    def cordon(self, node: str, uid: str = "") -> bool:
        self._maybe_fail("cordon", node)
        self.nodes[node].spec.unschedulable = True
        return True

    def release(self, node: str, uid: str = "", lent: LentRecord | None = None, cordoned: bool = False) -> str:
        self._maybe_fail("release", node)
        self.nodes.pop(node, None)
        return f"{node} deleted"

    def list(self, group: str) -> list[client.V1Node]:
        return [n for n in self.nodes.values() if n.metadata.labels.get(naming.LABEL_GROUP) == naming.label_value(group)]

    def mark_unhealthy(self, node: str, health_status: str, taint: naming.Taint,
                       last_seen: client.V1Node | None = None, fault: str | None = None) -> None:
        self._maybe_fail("mark_unhealthy", node)
        n = self.nodes[node]
        patch = mark_unhealthy_patch(n, health_status, taint, self.hyperpod_labels, fault)
        n.metadata.labels.update(patch["metadata"]["labels"])
        n.spec.taints = [client.V1Taint(**t) for t in patch["spec"]["taints"]]

    def promote_spare(self, node: str, replacing: str, last_seen: client.V1Node | None = None) -> None:
        self._maybe_fail("promote_spare", node)
        n = self.nodes[node]
        n.metadata.labels.update({naming.LABEL_ROLE: naming.ROLE_ACTIVE, naming.LABEL_REPLACES: replacing})
        n.spec.taints = [t for t in (n.spec.taints or []) if t.key != naming.SPARE_TAINT.key]

    def mark_healthy(self, node: str, last_seen: client.V1Node | None = None) -> None:
        self._maybe_fail("mark_healthy", node)
        n = self.nodes[node]
        patch = mark_healthy_patch(n, self.hyperpod_labels)
        for key, value in patch["metadata"]["labels"].items():
            if value is None:
                n.metadata.labels.pop(key, None)
            else:
                n.metadata.labels[key] = value
        for key in patch["metadata"]["annotations"]:
            (n.metadata.annotations or {}).pop(key, None)
        n.spec.taints = [client.V1Taint(**t) for t in patch["spec"]["taints"] or []]

    def annotate(self, node: str, annotations: dict[str, str | None], uid: str = "") -> None:
        self._maybe_fail("annotate", node)
        n = self.nodes.get(node)
        if n is None:
            return
        current = dict(n.metadata.annotations or {})
        for key, value in annotations.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value
        n.metadata.annotations = current

    def set_condition(self, node: str, condition: dict[str, str], uid: str = "") -> None:
        self._maybe_fail("set_condition", node)
        n = self.nodes.get(node)
        if n is None:
            return
        when = condition.get("lastTransitionTime")
        made = client.V1NodeCondition(
            type=condition["type"], status=condition["status"], reason=condition.get("reason"),
            message=condition.get("message"),
            last_transition_time=from_rfc3339(when) if when else self.clock())
        others = [c for c in ((n.status.conditions if n.status else None) or []) if c.type != made.type]
        if n.status is None:
            n.status = client.V1NodeStatus()
        n.status.conditions = others + [made]

    def reboot(self, node: str, uid: str = "") -> None:
        """Recorded as ``("reboot", node)`` each call; a node that is gone, another node (``uid``)
        or one being rebooted already is left as it is."""
        self._maybe_fail("reboot", node)
        n = self.nodes.get(node)
        if n is None or (uid and n.metadata.uid != uid) or rebooting(n):
            return
        self._set_ready(n, "False", REBOOT_REASON, "rebooted by hyperplan", self.clock())

    def finish_reboot(self, node: str, at: datetime | None = None) -> None:
        """The rebooted node is back: Ready=True (reason KubeletReady) since ``at`` (default: the
        clock), as KWOK's stage or a real kubelet report it. Not a Protocol method: the test's hand."""
        n = self.nodes[node]
        if not rebooting(n):
            raise AssertionError(f"{node} is not being rebooted")
        self._set_ready(n, "True", "KubeletReady", "kubelet is posting ready status", at or self.clock())

    @staticmethod
    def _set_ready(n: client.V1Node, status: str, reason: str, message: str, at: datetime) -> None:
        made = client.V1NodeCondition(type="Ready", status=status, reason=reason, message=message,
                                      last_transition_time=at, last_heartbeat_time=at)
        if n.status is None:
            n.status = client.V1NodeStatus()
        n.status.conditions = [c for c in (n.status.conditions or []) if c.type != "Ready"] + [made]


@dataclass
class FakeKarpenterProvider(FakeProvider):
    """NodeClaims in memory, Karpenter played by the test (:meth:`launch`, :meth:`register`):
    ``create`` records a claim (no Node yet) as :class:`~hyperplan.actuation.providers.karpenter.KarpenterProvider`
    does; ``release`` deletes the claim standing behind the Node, and its Node; the Node-level
    calls are :class:`FakeProvider`'s, on the Nodes ``register`` made (give it the kwok fake's
    ``nodes`` to share one node store)."""

    claims: dict[str, dict[str, Any]] = field(default_factory=dict)  # by claim name
    # What the real provider reads besides the claims: why its node class cannot launch (None: it
    # can); and the group passes' memory of launches it keeps.
    node_class_cause: Any = None
    launch_memory: dict[str, Any] = field(default_factory=dict)

    def node_class_problem(self) -> Any:
        self.calls.append(("node_class_problem",))
        return self.node_class_cause

    def create(self, spec: placement.NodeSpec, claim: str = "") -> MadeNode:
        from hyperplan.actuation.providers.karpenter import claim_name, nodeclaim_body
        from hyperplan.api.models import NodeClaimRef
        self._maybe_fail("create", spec.name)
        body = nodeclaim_body(spec, claim, "karpenter.kwok.sh/KWOKNodeClass/default", "reserved")
        name = body["metadata"]["name"]
        with self._lock:
            if name not in self.claims:
                body["metadata"].update(uid=f"uid-{name}", creationTimestamp=to_rfc3339(self.clock()))
                self.claims[name] = body
        return MadeNode(spec.name, "", node_claim=NodeClaimRef(name=name, uid=self.claims[name]["metadata"]["uid"]))

    def list_claims(self, group: str) -> list:
        from hyperplan.actuation.providers.karpenter import listed_claim
        self.calls.append(("list_claims", group))
        return [listed_claim(c) for c in self.claims.values()
                if c["metadata"]["labels"].get(naming.LABEL_GROUP) == naming.label_value(group)]

    def delete_claim(self, name: str, uid: str) -> str:
        self._maybe_fail("delete_claim", name)
        claim = self.claims.get(name)
        if claim is None or claim["metadata"]["uid"] != uid:
            return f"NodeClaim {name} gone already"
        del self.claims[name]
        node = claim.get("status", {}).get("nodeName")
        if node:
            self.nodes.pop(node, None)  # Karpenter terminates it
        return f"NodeClaim {name} deleted (Karpenter terminates its node)"

    def release(self, node: str, uid: str = "", lent: LentRecord | None = None, cordoned: bool = False) -> str:
        self._maybe_fail("release", node)
        for name, claim in list(self.claims.items()):
            if claim.get("status", {}).get("nodeName") == node:
                return f"{node}: " + self.delete_claim(name, claim["metadata"]["uid"])
        return f"{node}: no NodeClaim with its providerID owns it: left alone"

    # Karpenter, played by the test.

    def launch(self, name: str) -> str:
        """The claim is Launched: its providerID written; the providerID."""
        provider_id = f"kwok://kwok-{name}"
        self.claims[name].setdefault("status", {})["providerID"] = provider_id
        return provider_id

    def fail(self, name: str, reason: str = "LaunchFailed", message: str = "", delete: bool = False) -> None:
        """Karpenter fails the claim's launch: ``Launched=Unknown`` with ``reason`` and ``message``
        (it retries it), or with ``delete`` it deletes the claim (as it does one it cannot launch
        for insufficient capacity: its reason only in an Event and its log)."""
        if delete:
            del self.claims[name]
            return
        self.claims[name].setdefault("status", {})["conditions"] = [
            {"type": "Launched", "status": "Unknown", "reason": reason, "message": message}]

    def register(self, name: str, ready_since: datetime | None = None) -> str:
        """The claim's Node made and registered (the claim's labels and taints, its providerID, the
        claim's ``nodeName``), Ready since ``ready_since`` (None: no conditions); the Node's name."""
        claim = self.claims[name]
        provider_id = claim.get("status", {}).get("providerID") or self.launch(name)
        node = f"kwok-{name}"
        self.nodes[node] = client.V1Node(
            metadata=client.V1ObjectMeta(name=node, uid=f"uid-{node}", labels=dict(claim["metadata"]["labels"]),
                                         annotations=dict(claim["metadata"]["annotations"]),
                                         creation_timestamp=self.clock()),
            spec=client.V1NodeSpec(provider_id=provider_id, taints=[
                client.V1Taint(key=t["key"], value=t.get("value"), effect=t["effect"]) for t in claim["spec"]["taints"]]
                or None),
            status=client.V1NodeStatus(conditions=[client.V1NodeCondition(
                type="Ready", status="True", last_transition_time=ready_since)] if ready_since else None))
        claim["status"]["nodeName"] = node
        return node


# --------------------------------------------------------------------------- pods on nodes


@dataclass
class FakeNodePods:
    """Pods in memory, by node name, as ``namespace/name``; records calls.

    ``guarded`` pods refuse eviction (a PodDisruptionBudget); other evicted pods go at once.
    """

    pods: dict[str, list[str]] = field(default_factory=dict)
    guarded: set[str] = field(default_factory=set)
    calls: list[tuple[str, str]] = field(default_factory=list)

    annotations: dict[str, dict[str, str]] = field(default_factory=dict)  # by pod
    conditions: dict[str, list[dict[str, str]]] = field(default_factory=dict)  # by pod, set before a force delete

    def evict(self, node_name: str) -> DrainProgress:
        self.calls.append(("evict", node_name))
        left = [p for p in self.pods.get(node_name, []) if p in self.guarded]
        self.pods[node_name] = left
        return DrainProgress(pods_left=len(left), blocked=len(left))

    def annotate(self, node_name: str, annotations: dict[str, str]) -> list[dict[str, Any]]:
        self.calls.append(("annotate", node_name))
        done = []
        for pod in self.pods.get(node_name, []):
            have = self.annotations.setdefault(pod, {})
            if any(have.get(k) != v for k, v in annotations.items()):
                have.update(annotations)
                namespace, _, name = pod.partition("/")
                done.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}})
        return done

    def count(self, node_name: str) -> int:
        self.calls.append(("count", node_name))
        return len(self.pods.get(node_name, []))

    def force_delete(self, node_name: str, condition: dict[str, str]) -> list[str]:
        self.calls.append(("force_delete", node_name))
        gone = list(self.pods.get(node_name, []))
        for pod in gone:
            self.conditions.setdefault(pod, []).append(dict(condition))
        self.pods[node_name] = []
        return gone


# --------------------------------------------------------------------------- deep health check Jobs


@dataclass
class FakeDeepCheckJobs:
    """Check Jobs in memory: ``start`` records each Job as running (a name made again is no new
    Job, as the API server's 409) and a run's Service once; the test ends a Job with :meth:`finish`.
    Records calls as ``(verb, name)``."""

    jobs: dict[str, deepchecks.JobResult] = field(default_factory=dict)
    made: dict[str, Target] = field(default_factory=dict)  # by Job name
    groups: dict[str, str] = field(default_factory=dict)  # the group of each Job
    services: dict[str, list[str]] = field(default_factory=dict)  # a run's Service: its owner Jobs
    calls: list[tuple[str, str]] = field(default_factory=list)

    def list(self, group: str, awaited: Collection[str] = ()) -> dict[str, deepchecks.JobResult]:
        self.calls.append(("list", group))
        return {name: r if name in awaited else replace(r, output="")
                for name, r in self.jobs.items() if self.groups[name] == group}

    def start(self, group: str, targets: Sequence[Target]) -> list[str]:
        made = []
        for t in targets:
            self.calls.append(("start", t.job.name))
            if t.job.name in self.jobs:
                continue
            self.jobs[t.job.name] = deepchecks.JobResult(t.job.name, deepchecks.RUNNING)
            self.made[t.job.name], self.groups[t.job.name] = t, group
            made.append(t.job.name)
            if t.job.cohort:
                self.services.setdefault(t.job.cohort, []).append(t.job.name)
        return made

    def of(self, node: str, check: str | None = None) -> list[str]:
        """The Jobs made on ``node`` (its name), of ``check`` when given, in the order made."""
        return [n for n, t in self.made.items() if t.node == node and (check is None or t.job.check == check)]

    def finish(self, name: str, passed: bool = True, output: str = "") -> None:
        """The Job ended: Complete, or Failed with ``output`` (its pod's termination message)."""
        self.jobs[name] = deepchecks.JobResult(name, deepchecks.SUCCEEDED if passed else deepchecks.FAILED,
                                               "" if passed else output)

    def remove(self, name: str) -> None:
        """The Job is gone (deleted by someone, or its TTL)."""
        self.jobs.pop(name, None)


# --------------------------------------------------------------------------- leases


@dataclass
class FakeLeaseStore:
    """An in-memory Lease with the API server's optimistic concurrency; records every write."""

    record: LeaseRecord | None = None
    writes: list[tuple[str, LeaseRecord]] | None = None
    fail_reads: bool = False

    def __post_init__(self) -> None:
        self.writes = []
        self._version = 0
        self._changed = threading.Condition()

    def wait_for_change(self, since: LeaseRecord | None, timeout: float) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self.record != since, timeout=timeout)

    def get(self) -> LeaseRecord | None:
        if self.fail_reads:
            raise ConnectionError("API server unreachable")
        return self.record

    def create(self, record: LeaseRecord) -> LeaseRecord | None:
        if self.record is not None:
            return None
        return self._store("create", record)

    def replace(self, record: LeaseRecord) -> LeaseRecord | None:
        if self.record is None or record.resource_version != self.record.resource_version:
            return None
        return self._store("replace", record)

    def _store(self, verb: str, record: LeaseRecord) -> LeaseRecord:
        self._version += 1
        self.record = replace(record, resource_version=str(self._version))
        self.writes.append((verb, self.record))
        with self._changed:
            self._changed.notify_all()
        return self.record


# --------------------------------------------------------------------------- the API server


def _merged(into: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``into`` with the JSON merge patch ``patch`` applied (RFC 7386: None removes a key)."""
    out = dict(into)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


@dataclass
class FakeKube:
    """The operator's own objects in memory, by plural and name, with the API server's
    resourceVersions and its 409 on a stale finalizer write; records every call as
    ``(verb, plural, name, argument)`` in order. The methods are those of
    :class:`hyperplan.actuation.kube.Kube` that passes call on hyperplan objects."""

    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str, str, Any]] = field(default_factory=list)
    _version: int = 100

    def put(self, plural: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store ``obj`` as the test's starting state (not recorded), at a new resourceVersion."""
        return self._store(plural, dict(obj))

    def _store(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        obj = {**obj, "metadata": {**obj.get("metadata", {}), "resourceVersion": str(self._version)}}
        self.objects[(plural, obj["metadata"]["name"])] = obj
        return obj

    def get_object(self, plural: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get_object", plural, name, None))
        return self.objects.get((plural, name))

    def patch_status(self, plural: str, name: str, status: dict[str, Any],
                     resource_version: str | None = None) -> dict[str, Any]:
        self.calls.append(("patch_status", plural, name, status))
        held = self.objects.get((plural, name))
        if held is None:
            raise ApiException(status=404, reason="NotFound")
        if resource_version and resource_version != held["metadata"].get("resourceVersion"):
            raise ApiException(status=409, reason="Conflict")
        return self._store(plural, {**held, "status": _merged(held.get("status") or {}, status)})

    def set_finalizers(self, plural: str, name: str, finalizers: list[str],
                       resource_version: str) -> dict[str, Any] | None:
        self.calls.append(("set_finalizers", plural, name, list(finalizers)))
        held = self.objects.get((plural, name))
        if held is None:
            return None
        if resource_version != held["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        return self._store(plural, {**held, "metadata": {**held["metadata"], "finalizers": list(finalizers)}})


# --------------------------------------------------------------------------- Kueue writes


@dataclass
class RecordingKueueWrites:
    """Records every write; ``refuse`` maps a Workload (``namespace/name``) to the HTTP status its
    entry write fails with; ``nodes`` is what :meth:`list_job_nodes` returns."""

    refuse: dict[str, int] = field(default_factory=dict)
    nodes: list[client.V1Node] = field(default_factory=list)
    entries: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (namespace/name, entry)
    actives: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (check, condition)
    node_workloads: list[tuple[str, str, str | None]] = field(default_factory=list)
    workload_uids: list[tuple[str, str]] = field(default_factory=list)  # (node, the uid the write was guarded by)
    job_records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # plan -> status.jobNodes written
    record_conflicts: int = 0  # the next writes of a record that answer 409
    plans: dict[str, dict[str, Any]] = field(default_factory=dict)  # the plans as the API server holds them
    record_writes: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)  # in order
    listed: list[str] = field(default_factory=list)
    events: list[tuple[str, str, str, str]] = field(default_factory=list)  # (object, type, reason, message)

    def apply_check_entry(self, workload: Mapping[str, Any], entry: dict[str, Any]) -> dict[str, Any] | None:
        meta = workload["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        if key in self.refuse:
            raise ApiException(status=self.refuse[key], reason="refused by the test")
        self.entries.append((key, entry))
        return None

    def apply_check_active(self, check: Mapping[str, Any], condition: dict[str, Any]) -> dict[str, Any] | None:
        """The check as the API server returns it: the condition applied, a newer resourceVersion."""
        self.actives.append((check["metadata"]["name"], condition))
        meta = dict(check["metadata"])
        meta["resourceVersion"] = str(int(meta.get("resourceVersion") or 0) + 1)
        others = [c for c in (check.get("status") or {}).get("conditions") or [] if c.get("type") != "Active"]
        return {**check, "metadata": meta, "status": {"conditions": [*others, condition]}}

    def set_node_workload(self, node: str, workload: str, keep_alive_until: str | None, uid: str = "") -> None:
        self.node_workloads.append((node, workload, keep_alive_until))
        self.workload_uids.append((node, uid))

    def write_job_record(self, plan: str, entries: list[dict[str, Any]], resource_version: str | None
                         ) -> dict[str, Any] | None:
        if self.record_conflicts:
            self.record_conflicts -= 1
            raise ApiException(status=409, reason="Conflict")
        self.job_records[plan] = list(entries)
        self.record_writes.append((plan, list(entries)))
        body = self.plans.get(plan)
        if body is None:
            return None
        meta = {**body["metadata"], "resourceVersion": str(int(body["metadata"].get("resourceVersion") or 0) + 1)}
        self.plans[plan] = {**body, "metadata": meta, "status": {**(body.get("status") or {}), "jobNodes": list(entries)}}
        return self.plans[plan]

    def list_job_nodes(self, plan_label: str) -> list[client.V1Node]:
        self.listed.append(plan_label)
        return [n for n in self.nodes if (n.metadata.labels or {}).get(naming.LABEL_PLAN) == plan_label]

    def event(self, ref: Mapping[str, Any], type: str, reason: str, message: str) -> None:
        meta = ref.get("metadata") or {}
        name = f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta.get("name", "")
        self.events.append((name, type, reason, message))


# Each fake satisfies its Protocol, stated the way Go's `var _ NodeProvider = FakeProvider{}` is:
# a type checker rejects these lines if a method goes missing or changes its signature.
_ledger: type[CapacityLedger] = FakeLedger
_provider: type[NodeProvider] = FakeProvider
_pods: type[NodePods] = FakeNodePods
_lease: type[LeaseStore] = FakeLeaseStore
_kueue: type[KueueWrites] = RecordingKueueWrites
_checks: type[DeepCheckJobs] = FakeDeepCheckJobs


# --------------------------------------------------------------------------- a remote SageMaker endpoint


class _FakeEndpoint:
    """What the fake remote endpoints share: with ``down`` set, each call fails as a refused
    connection does (their dataclasses declare ``endpoint`` and ``down``)."""

    endpoint: str
    down: bool

    def _up(self, operation: str) -> None:
        from hyperplan.actuation.remote.calls import RemoteError
        if self.down:
            raise RemoteError(operation, "EndpointConnectionError",
                              f'Could not connect to the endpoint URL: "{self.endpoint}/"', self.endpoint)


@dataclass
class FakeRemoteCapacity(_FakeEndpoint, SageMakerSelling):
    """A remote SageMaker endpoint for unit tests, answering as boto3 would (dicts of the service
    model's shapes): it offers what ``offerings`` holds, makes a Pending plan on CreateTrainingPlan
    (same name and offering again: the same plan; another offering: ResourceInUse), and holds a
    plan's blocks once the test says its own purchase ran (:meth:`sell`) or failed (:meth:`fail`).
    Every call is recorded; ``down`` makes every call fail as a refused connection does."""

    endpoint: str = "http://127.0.0.1:1"
    offerings: list[dict[str, Any]] = field(default_factory=list)
    plans: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    down: bool = False
    account: str = "111122223333"
    # Plans the endpoint made but does not describe or list yet (its reads lag its writes, as
    # AWS's eventually consistent reads and a watch cache do): a test takes a name out to end it.
    hidden: set[str] = field(default_factory=set)
    # Extension offerings by remote plan ARN (``TrainingPlanExtensionOffering`` shapes), and what
    # ExtendTrainingPlan took, by plan ARN: the plan's block runs on only when the test says the
    # remote's own purchase of it ran (:meth:`extended`).
    extension_offerings: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    history: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # ListUltraServersByReservedCapacity's UltraServers by ReservedCapacityArn.
    ultra_servers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def list_ultra_servers(self, arn: str) -> list[Mapping[str, Any]]:
        self.calls.append(("list_ultra_servers", arn))
        self._up("ListUltraServersByReservedCapacity")
        return [dict(u) for u in self.ultra_servers.get(arn, [])]

    def search(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        self.calls.append(("search", dict(arguments)))
        self._up("SearchTrainingPlanOfferings")
        if "TrainingPlanArn" in arguments:
            return {"TrainingPlanOfferings": [],
                    "TrainingPlanExtensionOfferings": list(self.extension_offerings.get(arguments["TrainingPlanArn"], []))}
        return {"TrainingPlanOfferings": list(self.offerings)}

    def extend_plan(self, extension_id: str) -> list[Mapping[str, Any]]:
        from hyperplan.actuation.remote.calls import RemoteError
        self.calls.append(("extend_plan", extension_id))
        self._up("ExtendTrainingPlan")
        for arn, offered in self.extension_offerings.items():
            found = next((o for o in offered if o["TrainingPlanExtensionOfferingId"] == extension_id), None)
            if found is not None:
                offered.remove(found)
                entry = {**found, "Status": "Pending"}
                self.history.setdefault(arn, []).append(entry)
                return [dict(entry)]
        raise RemoteError("ExtendTrainingPlan", "ResourceNotFound",
                          f"Training plan extension offering {extension_id} not found.", self.endpoint, refused=True)

    def extension_entries(self, arn: str) -> list[Mapping[str, Any]]:
        self.calls.append(("extension_entries", arn))
        self._up("DescribeTrainingPlanExtensionHistory")
        return [dict(e) for e in self.history.get(arn, [])]

    def extended(self, name: str, status: str = "Scheduled") -> None:
        """The remote's own purchase of the plan's extensions ran: each block ends where its
        extension ends, and the history says so."""
        held = self.plans[name]
        arn = held["answer"]["TrainingPlanArn"]
        for entry in self.history.get(arn, []):
            if entry["Status"] != "Pending":
                continue
            entry["Status"] = status
            for rc in held["answer"].get("ReservedCapacitySummaries") or []:
                if rc["EndTime"] == entry["StartDate"]:
                    rc["EndTime"] = entry["EndDate"]

    def create_plan(self, name: str, offering_id: str, spares: int | None, tags: Mapping[str, str]) -> str:
        from hyperplan.actuation.remote.calls import RemoteError
        self.calls.append(("create_plan", (name, offering_id, spares, dict(tags))))
        self._up("CreateTrainingPlan")
        arn = f"arn:aws:sagemaker:us-east-1:{self.account}:training-plan/{name}"
        held = self.plans.get(name)
        if held is not None:
            if held["offering"] == offering_id:
                return arn
            raise RemoteError("CreateTrainingPlan", "ResourceInUse", f"Training plan {name} already exists.",
                              self.endpoint, refused=True)
        offered = next((o for o in self.offerings if o["TrainingPlanOfferingId"] == offering_id), None)
        if offered is None:
            raise RemoteError("CreateTrainingPlan", "ResourceNotFound",
                              f"Training plan offering {offering_id} not found.", self.endpoint, refused=True)
        self.plans[name] = {"offering": offering_id, "offered": offered, "answer": {
            "TrainingPlanArn": arn, "TrainingPlanName": name, "Status": "Pending"}}
        return arn

    def sell(self, name: str, status: str = "Scheduled", **block: Any) -> None:
        """The remote's own purchase ran: the plan holds the offering's blocks (``block`` overrides)."""
        held = self.plans[name]
        summaries = []
        for index, rc in enumerate(held["offered"]["ReservedCapacityOfferings"]):
            summaries.append({
                "ReservedCapacityArn": f"arn:aws:sagemaker:us-east-1:{self.account}:reserved-capacity/"
                                       f"rc-{name[3:15]}-{index}",
                "InstanceType": rc["InstanceType"], "TotalInstanceCount": rc["InstanceCount"],
                "Status": status, "AvailabilityZone": rc.get("AvailabilityZone"), "StartTime": rc["StartTime"],
                "EndTime": rc["EndTime"], **block})
        held["answer"] = {**held["answer"], "Status": status, "ReservedCapacitySummaries": summaries}

    def fail(self, name: str, message: str = "the offering's capacity was sold") -> None:
        held = self.plans[name]
        held["answer"] = {**held["answer"], "Status": "Failed", "StatusMessage": message}

    def describe_plan(self, name: str) -> Mapping[str, Any] | None:
        self.calls.append(("describe_plan", name))
        self._up("DescribeTrainingPlan")
        held = self.plans.get(name)
        return None if held is None or name in self.hidden else dict(held["answer"])

    def list_plans(self) -> list[Mapping[str, Any]]:
        self.calls.append(("list_plans", None))
        self._up("ListTrainingPlans")
        return [dict(p["answer"]) for name, p in self.plans.items() if name not in self.hidden]


# --------------------------------------------------------------------------- EC2 Capacity Blocks


@dataclass
class FakeCapacityBlocks(_FakeEndpoint, ExtendsCapacityBlocks):
    """EC2 Capacity Blocks behind the :class:`~hyperplan.actuation.remote.CapacitySeller` protocol,
    for the plan pass's unit tests: it offers the ``CapacityBlockOffering`` dicts of ``offered``,
    and a purchase makes a ``payment-pending`` capacity reservation (``CapacityReservation`` dicts,
    tagged as the real purchase tags them) and takes the offering off sale; :meth:`pay` moves a
    reservation on (scheduled, active, payment-failed ...). Like EC2 behind the real seller, a
    purchase for a plan that holds a live reservation answers that one and buys nothing. Every call
    of the protocol is recorded; ``down`` makes each fail as a refused connection does.

    Extensions are EC2's three calls under the real seller's own half (ExtendsCapacityBlocks):
    ``extension_offered`` holds ``CapacityBlockExtensionOffering`` dicts by reservation id; a
    purchase takes one off sale as ``payment-pending`` in ``extension_log``, and
    :meth:`extension_paid` settles it (paid: the reservation ends where the extension does).

    An UltraServer offering (``UltraserverType``) is bought as one reservation in a Capacity Block
    of its own (``cb-...``), tagged with its type, or with ``reservation_per_ultraserver`` as one
    reservation per UltraServer in that Capacity Block (EC2 answers either); ``interconnect`` holds
    each Capacity Block's ``InterconnectStatus``."""

    endpoint: str = "https://ec2.us-east-1.amazonaws.com"
    region: str = "us-east-1"
    offered: list[dict[str, Any]] = field(default_factory=list)
    reservations: dict[str, dict[str, Any]] = field(default_factory=dict)  # by CapacityReservationId
    calls: list[tuple[str, Any]] = field(default_factory=list)
    down: bool = False
    account: str = "111122223333"
    extension_offered: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # by CapacityReservationId
    extension_log: list[dict[str, Any]] = field(default_factory=list)  # CapacityBlockExtension dicts
    interconnect: dict[str, str] = field(default_factory=dict)  # InterconnectStatus by CapacityBlockId
    reservation_per_ultraserver: bool = False

    def describe_extension_offerings(self, reservation: str, hours: int) -> list[Mapping[str, Any]]:
        self.calls.append(("describe_extension_offerings", (reservation, hours)))
        self._up("DescribeCapacityBlockExtensionOfferings")
        return [dict(o) for o in self.extension_offered.get(reservation, [])
                if o.get("CapacityBlockExtensionDurationHours") == hours]

    def extension_entries(self, reservations: list[str]) -> list[Mapping[str, Any]]:
        self.calls.append(("extension_entries", list(reservations)))
        self._up("DescribeCapacityBlockExtensionHistory")
        return [dict(e) for e in self.extension_log if e["CapacityReservationId"] in reservations]

    def purchase_extension(self, offering_id: str, reservation: str) -> list[Mapping[str, Any]]:
        from hyperplan.actuation.remote.calls import RemoteError
        self.calls.append(("purchase_extension", (offering_id, reservation)))
        self._up("PurchaseCapacityBlockExtension")
        offered = self.extension_offered.get(reservation, [])
        found = next((o for o in offered if o["CapacityBlockExtensionOfferingId"] == offering_id), None)
        if found is None:
            raise RemoteError("PurchaseCapacityBlockExtension", "InvalidCapacityBlockExtensionOfferingId.NotFound",
                              f"The capacity block extension offering ID '{offering_id}' does not exist",
                              self.endpoint, refused=True)
        offered.remove(found)
        entry = {key: found[key] for key in ("InstanceType", "InstanceCount", "AvailabilityZone",
                                              "CapacityBlockExtensionOfferingId", "CapacityBlockExtensionDurationHours",
                                              "CapacityBlockExtensionStartDate", "CapacityBlockExtensionEndDate",
                                              "UpfrontFee", "CurrencyCode") if key in found}
        entry.update(CapacityReservationId=reservation, CapacityBlockExtensionStatus="payment-pending")
        self.extension_log.append(entry)
        return [dict(entry)]

    def extension_paid(self, reservation: str, status: str = "payment-succeeded") -> None:
        """EC2 settled the reservation's pending extensions: paid, the reservation ends where each ends."""
        for entry in self.extension_log:
            if entry["CapacityReservationId"] == reservation and entry["CapacityBlockExtensionStatus"] == "payment-pending":
                entry["CapacityBlockExtensionStatus"] = status
                if status == "payment-succeeded":
                    self.reservations[reservation]["EndDate"] = entry["CapacityBlockExtensionEndDate"]

    def find_offerings(self, request: Any, policy: Any, pools: Any) -> list[Any]:
        from hyperplan.planning import capacity_blocks as cb
        self.calls.append(("find_offerings", [p.name for p in pools]))
        self._up("DescribeCapacityBlockOfferings")
        return [o for p in pools for o in cb.offerings_of(self.offered, p.name, p.instance_type,
                                                          p.availability_zone, request, p.ultra_server_type)]

    def _mine(self, plan_uid: str) -> list[dict[str, Any]]:
        from hyperplan.planning import capacity_blocks as cb
        return [r for r in self.reservations.values() if cb.tags_of(r).get(cb.TAG_TRAINING_PLAN_UID) == plan_uid]

    def buy(self, name: str, plan_uid: str, offering: Any, spares: int | None, tags: Mapping[str, str]) -> Any:
        from hyperplan.planning import capacity_blocks as cb
        from hyperplan.planning.remote import standing_of
        self.calls.append(("buy", (name, offering.remote_id, dict(tags))))
        self._up("PurchaseCapacityBlock")
        live = standing_of(cb.plans_of(self._mine(plan_uid), self.region), plan_uid).live
        if live is not None:
            return live
        entry = next((o for o in self.offered if o["CapacityBlockOfferingId"] == offering.remote_id), None)
        if entry is None:
            raise NotBought(f"EC2 no longer sells capacity block offering {offering.offering.id}: "
                            "InsufficientInstanceCapacity")
        self.offered.remove(entry)
        [spec] = cb.purchase_tags(name, tags, None, offering.offering.blocks[0].ultra_server_type)
        ultra = {"CapacityBlockId": f"cb-{len(self.reservations):017x}"} if entry.get("UltraserverType") else {}
        parts = int(entry.get("UltraserverCount") or 1) if ultra and self.reservation_per_ultraserver else 1
        made = []
        for _ in range(parts):
            rid = f"cr-{len(self.reservations):017x}"
            count = int(entry["InstanceCount"]) // parts
            self.reservations[rid] = {**ultra,
                "CapacityReservationId": rid, "OwnerId": self.account,
                "CapacityReservationArn": f"arn:aws:ec2:{self.region}:{self.account}:capacity-reservation/{rid}",
                "InstanceType": entry["InstanceType"], "AvailabilityZone": entry["AvailabilityZone"],
                "TotalInstanceCount": count, "AvailableInstanceCount": count,
                "StartDate": entry["StartDate"], "EndDate": entry["EndDate"], "State": "payment-pending",
                "ReservationType": "capacity-block", "Tags": spec["Tags"]}
            made.append(self.reservations[rid])
        return cb.plan_from(name, made, self.region)

    def pay(self, plan_uid: str, state: str = "scheduled") -> str:
        """Moves the reservations of the plan's newest purchase to ``state``; answers the newest's id."""
        from hyperplan.planning import capacity_blocks as cb
        mine = sorted(self._mine(plan_uid), key=lambda r: r["CapacityReservationId"])
        newest = cb.tags_of(mine[-1]).get(cb.TAG_REMOTE_PLAN)
        for r in mine:
            if cb.tags_of(r).get(cb.TAG_REMOTE_PLAN) == newest:
                r["State"] = state
        return str(mine[-1]["CapacityReservationId"])

    def ultra_server_health(self, block: Any) -> dict[str, str]:
        """The real seller's rule (planning.capacity_blocks.told_capacity_block) over
        ``interconnect`` (InterconnectStatus by CapacityBlockId)."""
        from hyperplan.planning import capacity_blocks as cb
        told = cb.told_capacity_block(block)
        if told is None:
            return {}
        self.calls.append(("interconnect", told))
        self._up("DescribeCapacityBlockStatus")
        return cb.interconnect_health_of([{"CapacityBlockId": told, "InterconnectStatus": self.interconnect[told]}]
                                         if told in self.interconnect else [], block)

    def remote_plans(self) -> list[Any]:
        from hyperplan.planning import capacity_blocks as cb
        self.calls.append(("remote_plans", None))
        self._up("DescribeCapacityReservations")
        return cb.plans_of(self.reservations.values(), self.region)

    def remote_plan(self, name: str, plan_uid: str) -> Any:
        from hyperplan.planning import capacity_blocks as cb
        self.calls.append(("remote_plan", name))
        self._up("DescribeCapacityReservations")
        return next((p for p in cb.plans_of(self._mine(plan_uid), self.region) if p.name == name), None)


_seller: type[CapacitySeller] = FakeCapacityBlocks
_sagemaker_seller: type[CapacitySeller] = FakeRemoteCapacity
