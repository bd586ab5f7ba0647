"""Whether a Kueue workload may start on a training plan now: one pure decision per workload.

hyperplan is the controller of Kueue ``AdmissionCheck``\\s whose ``controllerName`` is
``hyperplan.dev/training-plan`` and whose parameters name a TrainingPlan. For each workload
that carries such a check (and holds quota), :func:`decide_admission` says what the check's
state should be:

* ``Ready`` only while a block of the plan is usable (active, before its termination time)
  and has room for the workload's instances: for a ``training-job`` plan the block's
  instances that other admitted workloads do not hold; for a ``hyperpod-cluster`` plan the
  Ready active nodes of its instance groups, less what other admitted workloads hold.
* ``Retry`` otherwise, with a message saying when it can be admitted ("next block ... starts
  2027-01-03T11:30:00Z") and a ``requeueAfterSeconds``: the time until that block starts, or a
  short retry when only other workloads stand in the way.
* ``Rejected`` when no block of the plan can ever hold it: too many instances for every block,
  a maximum execution time longer than every remaining block's time before its termination,
  a pod that fits on no instance of the plan's type, or a plan that failed or expired.

**Admission that knows when the block ends.** A workload that declares a maximum execution
time (Kueue's ``spec.maximumExecutionTimeSeconds``, which Kueue copies from the Job label
``kueue.x-k8s.io/max-exec-time-seconds``) is admitted into a block only if that time fits
before the block's termination time (its end minus the target's termination lead): what is
left of the block counts from ``now`` for the running block and from its start for a later
one. A workload that declares nothing is admitted; the message says it will be drained at
the termination time, because nothing else can be promised.

**Instances a workload needs** (:func:`instances_needed`): per pod set, one instance per pod,
unless the pod asks for the instance type's accelerators (``nvidia.com/gpu``,
``aws.amazon.com/neuron``) in a share that lets several pods fit on one instance: then
``instance accelerators // pod request`` pods share one. CPU and memory are not packed (an
instance of these types has far more of both than a training pod asks for); a pod that asks
for more accelerators than one instance has, or for an accelerator the type lacks, fits
nowhere and is rejected. Pod sets are not packed together.

Pure: plain values and ``now`` in, an :class:`AdmissionDecision` out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, Mapping, Sequence

from hyperplan.api.vocabulary import (  # noqa: F401
    ADMISSION_CONTROLLER_NAME, GROUP, HYPERPOD_CLUSTER, TRAINING_JOB, to_rfc3339,
)

from hyperplan.planning.policy import format_duration

CONTROLLER_NAME = ADMISSION_CONTROLLER_NAME
PARAMETERS_API_GROUP = GROUP
PARAMETERS_KIND = "TrainingPlan"

READY, RETRY, REJECTED, PENDING = "Ready", "Retry", "Rejected", "Pending"
CheckState = Literal["Ready", "Retry", "Rejected", "Pending"]

ACCELERATOR_RESOURCES = ("nvidia.com/gpu", "aws.amazon.com/neuron", "amd.com/gpu")

# Condition reasons (also the Event reasons of a state change).
REASON_ADMITTED = "BlockActive"
REASON_WAITING_FOR_BLOCK = "WaitingForBlock"
REASON_WAITING_FOR_CAPACITY = "WaitingForCapacity"
REASON_PLAN_NOT_FOUND = "PlanNotFound"
REASON_PLAN_NOT_PURCHASED = "PlanNotPurchased"
REASON_PLAN_ENDED = "PlanEnded"
REASON_PLAN_FAILED = "PlanFailed"
REASON_NO_BLOCK_FITS = "NoBlockFits"
REASON_POD_TOO_BIG = "PodFitsNoInstance"


def _span(delta: timedelta) -> str:
    return format_duration(timedelta(seconds=max(0, int(delta.total_seconds()))))


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class BlockView:
    """A reserved-capacity block as admission sees it.

    ``instance_count`` is what workloads may use: the block's instances, less the configured
    spares of its UltraServers (spares stand by for failures, they do not run jobs).
    """

    id: str
    availability_zone: str
    instance_type: str
    instance_count: int
    start: datetime
    end: datetime
    termination_time: datetime

    def usable_at(self, now: datetime) -> bool:
        return self.start <= now < self.termination_time

    def time_left(self, now: datetime) -> timedelta:
        """What a workload starting now (or at the start, for a later block) has before termination."""
        return self.termination_time - max(self.start, now)


@dataclass(frozen=True)
class AdmissionPlan:
    name: str
    target: str  # training-job | hyperpod-cluster
    phase: str | None  # Pending | Scheduled | Active | Expired | Failed | None (not reconciled yet)
    blocks: tuple[BlockView, ...] = ()
    failure: str = ""  # why, when Failed
    accelerators: tuple[str, int] | None = None  # (resource, per instance) of the plan's type


@dataclass(frozen=True)
class PodSetView:
    name: str
    count: int
    requests: Mapping[str, str] = field(default_factory=dict)  # one pod's requests (all containers)


@dataclass(frozen=True)
class WorkloadView:
    namespace: str
    name: str
    pod_sets: tuple[PodSetView, ...]
    max_execution: timedelta | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


# --------------------------------------------------------------------------- sizing


def _whole(quantity: str) -> int | None:
    """An extended-resource quantity as a whole number ("8", "8000m"); None if it is not one."""
    text = str(quantity).strip()
    try:
        if text.endswith("m"):
            milli = int(text[:-1])
            return milli // 1000 if milli % 1000 == 0 else None
        return int(text)
    except ValueError:
        return None


def pods_per_instance(requests: Mapping[str, str], accelerators: tuple[str, int] | None) -> tuple[int, str]:
    """How many such pods share one instance (see the module docstring), with a reason when 0."""
    for resource in ACCELERATOR_RESOURCES:
        if resource not in requests:
            continue
        asked = _whole(requests[resource])
        if asked is None or asked <= 0:
            continue
        if accelerators is None or accelerators[0] != resource:
            have = f"has {accelerators[1]} {accelerators[0]}" if accelerators else "has no accelerators"
            return 0, f"a pod asks for {asked} {resource}; an instance of the plan's type {have}"
        if asked > accelerators[1]:
            return 0, f"a pod asks for {asked} {resource}; an instance has {accelerators[1]}"
        return accelerators[1] // asked, ""
    return 1, ""


def instances_needed(pod_sets: Sequence[PodSetView], accelerators: tuple[str, int] | None) -> tuple[int, str]:
    """Instances the workload's pod sets take, or ``(0, why)`` when a pod fits on no instance."""
    total = 0
    for ps in pod_sets:
        per, why = pods_per_instance(ps.requests, accelerators)
        if per == 0:
            return 0, f"pod set {ps.name}: {why}"
        total += math.ceil(max(0, ps.count) / per)
    return total, ""


# --------------------------------------------------------------------------- the decision


@dataclass(frozen=True)
class AdmissionDecision:
    state: CheckState
    reason: str
    message: str
    instances: int = 0  # what the workload needs (0 when unknown)
    block_id: str | None = None  # Ready: the block it is admitted into
    requeue_after: timedelta | None = None  # Retry: when Kueue should try again

    @property
    def requeue_after_seconds(self) -> int | None:
        if self.requeue_after is None:
            return None
        return max(1, math.ceil(self.requeue_after.total_seconds()))


def decide_admission(plan: AdmissionPlan | None, workload: WorkloadView, now: datetime, *,
                     held_by_others: int = 0, ready_nodes: int | None = None,
                     busy_retry: timedelta = timedelta(seconds=30), plan_name: str = "") -> AdmissionDecision:
    """The check state of ``workload`` on ``plan`` at ``now`` (see the module docstring).

    ``held_by_others``: instances of the running block that other admitted workloads hold.
    ``ready_nodes``: for a ``hyperpod-cluster`` plan, the Ready active nodes of its groups on
    the running block (None for a ``training-job`` plan, whose nodes hyperplan provisions per
    workload). ``busy_retry``: the requeue delay when only other workloads stand in the way.
    """
    if plan is None:
        return AdmissionDecision(RETRY, REASON_PLAN_NOT_FOUND,
                                 f"training plan {plan_name} does not exist", requeue_after=busy_retry)
    if plan.phase == "Failed":
        return AdmissionDecision(REJECTED, REASON_PLAN_FAILED,
                                 f"training plan {plan.name} failed" + (f": {plan.failure}" if plan.failure else ""))
    if plan.phase == "Expired":
        return AdmissionDecision(REJECTED, REASON_PLAN_ENDED, f"every block of training plan {plan.name} has ended")
    if plan.phase in (None, "Pending") or not plan.blocks:
        return AdmissionDecision(RETRY, REASON_PLAN_NOT_PURCHASED,
                                 f"training plan {plan.name} is not bought yet (phase {plan.phase or 'unknown'})",
                                 requeue_after=busy_retry)

    need, why = instances_needed(workload.pod_sets, plan.accelerators)
    if need == 0 and why:
        return AdmissionDecision(REJECTED, REASON_POD_TOO_BIG, f"{why}: it can never run on plan {plan.name}")
    limit = workload.max_execution
    remaining = sorted((b for b in plan.blocks if b.termination_time > now), key=lambda b: b.start)
    holds = [b for b in remaining if need <= b.instance_count and (limit is None or limit <= b.time_left(now))]
    if not holds:
        return AdmissionDecision(REJECTED, REASON_NO_BLOCK_FITS,
                                 _why_none_fits(plan, remaining, need, limit, now), instances=need)

    block = holds[0]
    current = next((b for b in remaining if b.usable_at(now)), None)
    if block.usable_at(now):
        room = block.instance_count if ready_nodes is None else min(block.instance_count, ready_nodes)
        free = max(0, room - held_by_others)
        if need <= free:
            return AdmissionDecision(READY, REASON_ADMITTED, _admitted(plan, block, need, limit, now),
                                     instances=need, block_id=block.id)
        what = (f"{ready_nodes} Ready active node(s) of its instance groups" if ready_nodes is not None
                else f"{block.instance_count} instance(s)")
        return AdmissionDecision(
            RETRY, REASON_WAITING_FOR_CAPACITY,
            f"needs {need} instance(s) of block {block.id}, which has {what}; other admitted workloads "
            f"hold {held_by_others}, {free} free; trying again in {_span(busy_retry)}",
            instances=need, requeue_after=busy_retry)

    why_not_now = ""
    if current is not None:
        if need > current.instance_count:
            why_not_now = f"the running block {current.id} has {current.instance_count} instance(s); "
        elif limit is not None:
            why_not_now = (f"the running block {current.id} terminates at {to_rfc3339(current.termination_time)}, "
                           f"{_span(current.time_left(now))} left, less than the maximum execution time "
                           f"{_span(limit)}; ")
    return AdmissionDecision(
        RETRY, REASON_WAITING_FOR_BLOCK,
        f"{why_not_now}next block that can hold it ({block.id}, {need} instance(s) in "
        f"{block.availability_zone}) starts {to_rfc3339(block.start)}",
        instances=need, requeue_after=block.start - now)


def _admitted(plan: AdmissionPlan, block: BlockView, need: int, limit: timedelta | None, now: datetime) -> str:
    head = (f"admitted into block {block.id} of plan {plan.name} ({need} instance(s) in "
            f"{block.availability_zone})")
    if limit is None:
        return (f"{head}; no maximum execution time declared: it will be drained at the block's "
                f"termination time {to_rfc3339(block.termination_time)}")
    return (f"{head}; its maximum execution time {_span(limit)} fits in the {_span(block.time_left(now))} "
            f"left before the termination time {to_rfc3339(block.termination_time)}")


def _why_none_fits(plan: AdmissionPlan, remaining: Sequence[BlockView], need: int, limit: timedelta | None,
                   now: datetime) -> str:
    if not remaining:
        return f"no block of training plan {plan.name} is left before its termination time"
    biggest = max(b.instance_count for b in remaining)
    if need > biggest:
        return (f"needs {need} instance(s); the largest remaining block of plan {plan.name} "
                f"has {biggest}: it can never be admitted")
    longest = max(b.time_left(now) for b in remaining if need <= b.instance_count)
    return (f"its maximum execution time {_span(limit or timedelta(0))} is longer than any remaining block "
            f"of plan {plan.name} lasts before its termination time (longest {_span(longest)}): "
            "it can never be admitted")


# --------------------------------------------------------------------------- the AdmissionCheck itself


@dataclass(frozen=True)
class CheckActive:
    """The ``Active`` condition of an AdmissionCheck that hyperplan serves."""

    status: Literal["True", "False"]
    reason: str
    message: str
    plan: str | None = None  # the plan the parameters name, when they are well formed


def check_parameters(parameters: Mapping[str, str] | None) -> tuple[str | None, str]:
    """The plan an AdmissionCheck's ``spec.parameters`` name, or ``(None, why not)``."""
    if not parameters:
        return None, ("spec.parameters is missing: it must name a TrainingPlan "
                      f"(apiGroup: {PARAMETERS_API_GROUP}, kind: {PARAMETERS_KIND}, name: <plan>)")
    group, kind, name = parameters.get("apiGroup"), parameters.get("kind"), parameters.get("name")
    if group != PARAMETERS_API_GROUP or kind != PARAMETERS_KIND:
        return None, (f"spec.parameters names {kind or '<no kind>'} of apiGroup {group or '<none>'}; "
                      f"hyperplan serves apiGroup {PARAMETERS_API_GROUP}, kind {PARAMETERS_KIND}")
    if not name:
        return None, "spec.parameters.name is empty: it must name a TrainingPlan"
    return name, ""


def check_active(parameters: Mapping[str, str] | None, plan: AdmissionPlan | None) -> CheckActive:
    """Whether hyperplan can serve an AdmissionCheck with these parameters, given its plan."""
    name, why = check_parameters(parameters)
    if name is None:
        return CheckActive("False", "InvalidParameters", why)
    if plan is None:
        return CheckActive("False", REASON_PLAN_NOT_FOUND, f"training plan {name} does not exist", name)
    return CheckActive("True", "PlanFound",
                       f"serving training plan {name} ({plan.target})", name)


# --------------------------------------------------------------------------- reading a Workload


def _quantity_sum(a: str | None, b: str) -> str:
    """Sum of two whole quantities where both are whole numbers; else the larger text (rough)."""
    x, y = _whole(a) if a is not None else 0, _whole(b)
    if x is None or y is None:
        return b if a is None else a
    return str(x + y)


def pod_requests(pod_spec: Mapping) -> dict[str, str]:
    """One pod's requests: summed over its containers, limits standing in where requests are unset."""
    total: dict[str, str] = {}
    for c in pod_spec.get("containers") or []:
        resources = c.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for key, value in asked.items():
            total[key] = _quantity_sum(total.get(key), str(value))
    return total


def workload_view(obj: Mapping) -> WorkloadView:
    """A Kueue ``Workload`` (v1beta2) as admission sees it.

    The maximum execution time is ``spec.maximumExecutionTimeSeconds``, which Kueue copies from
    the Job's ``kueue.x-k8s.io/max-exec-time-seconds`` label; the label on the Workload itself
    is read when the field is missing.
    """
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    sets = tuple(PodSetView(ps.get("name") or "main", int(ps.get("count") or 0),
                            pod_requests(((ps.get("template") or {}).get("spec")) or {}))
                 for ps in spec.get("podSets") or [])
    seconds = spec.get("maximumExecutionTimeSeconds")
    if seconds is None:
        label = (meta.get("labels") or {}).get("kueue.x-k8s.io/max-exec-time-seconds")
        seconds = int(label) if label and label.isdigit() else None
    return WorkloadView(meta.get("namespace", ""), meta.get("name", ""), sets,
                        timedelta(seconds=int(seconds)) if seconds else None)


@dataclass(frozen=True)
class WorkloadProgress:
    """Where a Workload stands in Kueue, for one of its admission checks."""

    check_state: str | None  # the check's entry state, None when it has no entry
    quota_reserved: bool
    admitted: bool
    finished: bool
    evicted: bool
    since: str = ""  # the entry's lastTransitionTime, for ordering

    @property
    def to_decide(self) -> bool:
        """Kueue waits for this controller: quota is reserved and the check is Pending."""
        return self.check_state == PENDING and self.quota_reserved and not self.finished and not self.evicted

    @property
    def holds_capacity(self) -> bool:
        """Admitted (or about to be) into a block: its instances are taken."""
        return self.check_state == READY and self.quota_reserved and not self.finished and not self.evicted


def workload_progress(obj: Mapping, check: str) -> WorkloadProgress:
    status = obj.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    entry = next((c for c in status.get("admissionChecks") or [] if c.get("name") == check), None)
    return WorkloadProgress(
        check_state=entry.get("state") if entry else None,
        quota_reserved=conditions.get("QuotaReserved") == "True",
        admitted=conditions.get("Admitted") == "True",
        finished=conditions.get("Finished") == "True",
        evicted=conditions.get("Evicted") == "True",
        since=(entry or {}).get("lastTransitionTime") or "")


def workload_runs(obj: Mapping) -> bool:
    """Kueue has the Workload admitted (or holds its quota while admitting it) and it has neither
    finished nor been evicted: its pods run, or are about to, whatever its checks say now."""
    conditions = {c.get("type"): c.get("status") for c in (obj.get("status") or {}).get("conditions") or []}
    holds = conditions.get("Admitted") == "True" or conditions.get("QuotaReserved") == "True"
    return holds and conditions.get("Finished") != "True" and conditions.get("Evicted") != "True"


def assigned_hostnames(obj: Mapping, hostname_level: str = "kubernetes.io/hostname") -> tuple[str, ...]:
    """The nodes (by hostname) that the topology assignments of a running Workload (see
    :func:`workload_runs`) name, sorted; () for one that does not run or has no TAS assignment at
    the hostname level. Reads Kueue v1beta2's compact form: per slice, each level's values are
    either one ``universal`` value or ``individual`` roots between a prefix and a suffix."""
    if not workload_runs(obj):
        return ()
    names: set[str] = set()
    admission = (obj.get("status") or {}).get("admission") or {}
    for assignment in admission.get("podSetAssignments") or []:
        topology = assignment.get("topologyAssignment") or {}
        levels = topology.get("levels") or []
        if hostname_level not in levels:
            continue
        at = levels.index(hostname_level)
        for piece in topology.get("slices") or []:
            values = piece.get("valuesPerLevel") or []
            if at >= len(values):
                continue
            value = values[at] or {}
            if value.get("universal") is not None:
                names.add(str(value["universal"]))
            individual = value.get("individual") or {}
            prefix, suffix = individual.get("prefix") or "", individual.get("suffix") or ""
            names.update(f"{prefix}{root}{suffix}" for root in individual.get("roots") or [])
    return tuple(sorted(names))


def admitted_block(entry: Mapping | None, label: str) -> str | None:
    """The block (label value) a Ready entry admitted the workload into, from its podSetUpdates."""
    for update in (entry or {}).get("podSetUpdates") or []:
        value = (update.get("labels") or {}).get(label)
        if value:
            return value
    return None


def decide_after_block(plan: AdmissionPlan | None, workload: WorkloadView, block_id: str, now: datetime, *,
                       busy_retry: timedelta = timedelta(seconds=30), plan_name: str = "") -> AdmissionDecision:
    """The check state of a workload admitted into a block that is no longer usable.

    From the block's termination time its nodes drain. Rather than leave Kueue believing the
    workload still runs, the check goes to ``Retry`` (Kueue evicts it, suspending the Job so
    that its pods stop gracefully, and queues it again) with the block it may run in next, or
    to ``Rejected`` when no block can ever hold it.
    """
    ended = next((b for b in (plan.blocks if plan else ()) if b.id == block_id), None)
    head = (f"block {block_id} reached its termination time {to_rfc3339(ended.termination_time)}" if ended
            else f"block {block_id} is no longer part of training plan {plan.name if plan else plan_name}")
    later = decide_admission(plan, workload, now, busy_retry=busy_retry, plan_name=plan_name)
    if later.state == REJECTED:
        return AdmissionDecision(REJECTED, later.reason, f"{head}; {later.message}", later.instances)
    if later.state == READY:  # another block is usable right now: be queued again for it at once
        return AdmissionDecision(RETRY, REASON_WAITING_FOR_BLOCK,
                                 f"{head}; evicted to be admitted again into block {later.block_id}",
                                 later.instances, requeue_after=timedelta(seconds=1))
    return AdmissionDecision(RETRY, later.reason, f"{head}; evicted: {later.message}", later.instances,
                             requeue_after=later.requeue_after)


@dataclass(frozen=True)
class CheckedWorkload:
    """A workload carrying one of the plan's checks, as one pass of the plan sees it."""

    ref: object  # the caller's handle (the Workload body and the check's name)
    view: WorkloadView
    progress: WorkloadProgress
    admitted_block: str | None = None  # label value of the block a Ready entry admitted it into


@dataclass
class PlanAdmission:
    """What one pass decides for the workloads of a plan."""

    holders: list[tuple[CheckedWorkload, int]] = field(default_factory=list)  # on the usable block, instances
    decisions: list[tuple[CheckedWorkload, AdmissionDecision]] = field(default_factory=list)  # entries to write


def decide_plan_admission(plan: AdmissionPlan | None, workloads: Sequence[CheckedWorkload], usable_block: str | None,
                          now: datetime, *, ready_nodes: int | None = None,
                          busy_retry: timedelta = timedelta(seconds=30), plan_name: str = "",
                          held_outside: int = 0) -> PlanAdmission:
    """Every check decision of one pass over a plan, in the order given (admission order).

    ``held_outside``: instances of the usable block that workloads hold without one of the
    plan's checks deciding for them (admitted through a check that is gone since; see
    :func:`hyperplan.planning.trainingjobs.still_running_holders`).

    Workloads admitted into the usable block (``usable_block``, a label value) hold their
    instances; one admitted into another block (it ended) is requeued or rejected
    (:func:`decide_after_block`); each Pending workload is decided with what the holders and
    the workloads admitted before it in this pass hold, so one pass never admits more than
    the block has room for.
    """
    out = PlanAdmission()
    for w in workloads:
        if not w.progress.holds_capacity:
            continue
        if w.admitted_block is not None and w.admitted_block != usable_block:
            out.decisions.append((w, decide_after_block(plan, w.view, w.admitted_block, now, busy_retry=busy_retry,
                                                        plan_name=plan_name)))
        else:
            out.holders.append((w, instances_needed(w.view.pod_sets, plan.accelerators if plan else None)[0]))
    held = sum(n for _, n in out.holders) + held_outside
    for w in workloads:
        if not w.progress.to_decide:
            continue
        decision = decide_admission(plan, w.view, now, held_by_others=held, ready_nodes=ready_nodes,
                                    busy_retry=busy_retry, plan_name=plan_name)
        if decision.state == READY:
            held += decision.instances
            out.holders.append((w, decision.instances))
        out.decisions.append((w, decision))
    return out
