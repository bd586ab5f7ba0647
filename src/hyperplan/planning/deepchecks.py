"""Deep health checks: what a node passes before it serves, as HyperPod's ``OnStartDeepHealthChecks``.

A group with ``spec.onStartDeepHealthChecks`` checks every node it makes and every node that comes
back from a reboot before the node serves. Until its checks finish the node carries the NoSchedule
taint :data:`CHECK_TAINT` and the label ``deep-health-check-status=InProgress`` (under hyperplan's
key and HyperPod's, :func:`dressed`); it is neither counted Ready nor taken as a spare. The checks
are Jobs pinned to the node (``actuation.deepchecks``):

* ``InstanceStress``: one Job on the node;
* ``InstanceConnectivity``: one Job on each of the nodes that start their checks together on one
  UltraServer (a *cohort*, at most :data:`MAX_COHORT` nodes; without UltraServers, the group's nodes
  that start together): each Job listens, and reaches the others over the pod network by their
  names under the cohort's headless Service (``hyperplan.deepcheck``). A node alone reaches itself.

The outcome, by the Jobs' ends: every Job of the node's run Complete, **Passed** (the taint goes, the
node serves); one Failed, **Failed**: the next pass judges the node unhealthy at once
(``health.NodeObservation.check_failed``, no grace) and the recovery ladder replaces it, as a
hardware fault that a reboot would not fix (``recovery.SIGNAL_DEEP_CHECK_FAILED``), with the
check's output in an Event. A Job missing from the listing of a run under way is made again.

The state of a node's checks is the operator's own: the group's record
(``status.nodes[].deepHealthCheck``, :class:`CheckState`) and the Jobs it made, found by the names
this module gives them (:func:`job_name`: the node id, the check, the run's start and cohort), never
the node's labels, which are output. Pure: states, Job results and ``now`` in, a :class:`ChecksPlan`
out.

A node that served before the group listed checks is not checked: checks run when a node starts.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from hyperplan.api.models import DeepHealthCheck, GroupNode
from hyperplan.api.vocabulary import (
    CHECK_FAILED, CHECK_IN_PROGRESS, CHECK_PASSED, INSTANCE_CONNECTIVITY, INSTANCE_STRESS,
    LABEL_DEEP_HEALTH_CHECK, TAINT_DEEP_HEALTH_CHECK, to_rfc3339,
)
from hyperplan.planning.naming import Taint
from hyperplan.planning.placement import NodeSpec

POLL = timedelta(seconds=2)
"""How often a pass looks at the Jobs while a check runs: a Job's end wakes no group (no watch)."""
MAX_COHORT = 18
"""Nodes per InstanceConnectivity run: an x72 UltraServer's 18 at most (each node reaches every
other, so a run costs its size squared in connections)."""
MAX_OUTPUT = 800  # characters of a check's output kept for its Event

# A check Job's state, as actuation reads it from the Job's conditions.
RUNNING, SUCCEEDED, FAILED = "Running", "Succeeded", "Failed"

_SHORT = {INSTANCE_STRESS: "s", INSTANCE_CONNECTIVITY: "c"}


def check_taint(status: str) -> Taint:
    """The taint a node carries while its checks have not passed (value: their state)."""
    return Taint(TAINT_DEEP_HEALTH_CHECK, status, "NoSchedule")


CHECK_TAINT = check_taint(CHECK_IN_PROGRESS)


@dataclass(frozen=True)
class CheckState:
    """A node's checks since its latest start, as the group's record keeps them
    (:class:`~hyperplan.api.models.DeepHealthCheck`)."""

    status: str
    since: datetime  # the start they answer: the node made, or back from its reboot
    checks: tuple[str, ...]
    started: datetime | None = None  # when its Jobs were made
    cohort: str | None = None  # its InstanceConnectivity run (that run's Service)
    finished: datetime | None = None

    @classmethod
    def from_record(cls, record: DeepHealthCheck) -> CheckState:
        return cls(record.status, record.since, tuple(record.checks), record.started, record.cohort, record.finished)

    def to_record(self) -> DeepHealthCheck:
        return DeepHealthCheck(status=self.status, since=self.since, checks=list(self.checks), started=self.started,
                               cohort=self.cohort, finished=self.finished)

    @property
    def serving(self) -> bool:
        """Whether the node may serve: its checks passed."""
        return self.status == CHECK_PASSED


def states_of(record: Sequence[GroupNode] | None) -> dict[str, CheckState]:
    """The check state of each node the record holds one for, by node id."""
    return {e.node_id: CheckState.from_record(e.deep_health_check) for e in record or () if e.deep_health_check}


def awaited(record: Sequence[GroupNode] | None) -> set[str]:
    """The names of the check Jobs whose end the record waits for (a pass lists the group's Jobs
    only while there are any, and reads the output of these only)."""
    return {job_name(e.node_id, check, state) for e in record or () if e.deep_health_check is not None
            for state in [CheckState.from_record(e.deep_health_check)]
            if state.status == CHECK_IN_PROGRESS and state.started is not None for check in state.checks}


def recorded(entries: Sequence[GroupNode], moved: Mapping[str, CheckState]) -> list[GroupNode]:
    """The group's record with the check states a pass ``moved`` (by node id)."""
    return [entry.model_copy(update={"deep_health_check": moved[entry.node_id].to_record()})
            if entry.node_id in moved else entry for entry in entries]


def dressed(spec: NodeSpec, state: CheckState | None) -> NodeSpec:
    """A desired node (``placement.NodeSpec``) with the labels and taint of its check ``state``:
    the status (HyperPod's key beside it with the setting hyperpod_labels:
    ``placement.hyperpod_dressed``), and :func:`check_taint` until it passed."""
    if state is None:
        return spec
    labels = {**spec.labels, LABEL_DEEP_HEALTH_CHECK: state.status}
    taints = tuple(t for t in spec.taints if t.key != TAINT_DEEP_HEALTH_CHECK)
    if not state.serving:
        taints += (check_taint(state.status),)
    return replace(spec, labels=labels, taints=taints)


def _digest(*parts: str, length: int = 10) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:length]


def job_name(node_id: str, check: str, state: CheckState) -> str:
    """``dhc-<node>-<s|c>-<digest>``, at most 63 characters (a Job's name is its pods' job-name
    label): the same for every pass of one run, another for the node's next start or cohort."""
    digest = _digest(node_id, check, to_rfc3339(state.since, micro=True), state.cohort or "")
    prefix = re.sub(r"[^a-z0-9-]", "-", node_id.lower())[: 63 - len("dhc--x-") - len(digest)].strip("-")
    return f"dhc-{prefix}-{_SHORT[check]}-{digest}" if prefix else f"dhc-{_SHORT[check]}-{digest}"


def cohort_name(members: Sequence[str], now: datetime) -> str:
    """The name of an InstanceConnectivity run (its headless Service: a DNS label that starts with
    a letter) of ``members`` started at ``now``."""
    return f"dhc-{_digest(*sorted(members), to_rfc3339(now, micro=True), length=16)}"


@dataclass(frozen=True)
class CheckNode:
    """One of the group's nodes as the checks see it."""

    node_id: str
    exists: bool  # listed, held and not being deleted: a Job can be pinned to it
    ultraserver_id: str | None = None


@dataclass(frozen=True)
class JobResult:
    """One check Job as listed: ``state`` (:data:`RUNNING`, :data:`SUCCEEDED`, :data:`FAILED`) and,
    for a failed one, its output (its pod's termination message, or why the Job failed)."""

    name: str
    state: str
    output: str = ""


@dataclass(frozen=True)
class CheckJob:
    """A check Job to make (or make again, when it is gone): ``check`` on node ``node_id``; for
    InstanceConnectivity the run's Service ``cohort`` and its members ``peers`` (node ids)."""

    name: str
    node_id: str
    check: str
    cohort: str | None = None
    peers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Finished:
    """A node's checks ended this pass: ``passed`` or not, and what to say (the failed checks' output)."""

    node_id: str
    passed: bool
    message: str


@dataclass
class ChecksPlan:
    """What :func:`plan_checks` decided: each node's check state after the pass (``states``), the
    ones it moved (for the record), the Jobs to make, the runs that ended and when to look again."""

    states: dict[str, CheckState] = field(default_factory=dict)
    moved: dict[str, CheckState] = field(default_factory=dict)
    start: tuple[CheckJob, ...] = ()
    began: tuple[str, ...] = ()  # nodes whose Jobs are made for the first time now
    finished: tuple[Finished, ...] = ()
    next_check: datetime | None = None

    def not_serving(self) -> set[str]:
        """The nodes whose checks have not passed (running, or failed): not counted Ready."""
        return {nid for nid, s in self.states.items() if not s.serving}


def _cohorts(starting: Sequence[CheckNode]) -> list[list[str]]:
    """The InstanceConnectivity runs of the nodes starting their checks together: by UltraServer,
    in runs of at most :data:`MAX_COHORT` (node id order)."""
    by_us: dict[str, list[str]] = {}
    for n in starting:
        by_us.setdefault(n.ultraserver_id or "", []).append(n.node_id)
    runs = []
    for us in sorted(by_us):
        ids = sorted(by_us[us])
        runs += [ids[i:i + MAX_COHORT] for i in range(0, len(ids), MAX_COHORT)]
    return runs


def _jobs_of(node_id: str, state: CheckState, members: Sequence[str]) -> list[CheckJob]:
    return [CheckJob(job_name(node_id, c, state), node_id, c,
                     state.cohort if c == INSTANCE_CONNECTIVITY else None,
                     tuple(members) if c == INSTANCE_CONNECTIVITY else ())
            for c in state.checks]


def _failure(check: str, result: JobResult) -> str:
    output = " ".join(result.output.split()) or "no output"
    if len(output) > MAX_OUTPUT:
        output = output[:MAX_OUTPUT - 16] + " ... (truncated)"
    return f"{check} failed: {output}"


def plan_checks(checks: Sequence[str], states: Mapping[str, CheckState], nodes: Iterable[CheckNode],
                created: Iterable[str], recovered: Iterable[str], jobs: Mapping[str, JobResult] | None,
                now: datetime) -> ChecksPlan:
    """One pass over the group's checks (see the module docstring).

    ``checks``: the group's ``onStartDeepHealthChecks``; ``states``: the record's, by node id;
    ``nodes``: the group's nodes on the block; ``created``: the node ids this pass makes;
    ``recovered``: the ones back from a reboot now; ``jobs``: the group's check Jobs by name (None:
    not listed this pass, as no check had started).
    """
    created, recovered = set(created), set(recovered)
    out = dict(states)
    moved: dict[str, CheckState] = {}
    checks = tuple(c for c in (INSTANCE_STRESS, INSTANCE_CONNECTIVITY) if c in checks)
    if checks:
        for nid in sorted(created | recovered):
            prior = states.get(nid)
            if nid in created and prior is not None and prior.status == CHECK_IN_PROGRESS and prior.started is None:
                continue  # its create is still to come: the same run
            out[nid] = moved[nid] = CheckState(CHECK_IN_PROGRESS, now, checks)
    fresh = set(moved)
    present = {n.node_id: n for n in nodes if n.exists}
    starting: list[CheckNode] = []
    start: list[CheckJob] = []
    finished: list[Finished] = []
    for nid in sorted(out):
        state = out[nid]
        if state.status != CHECK_IN_PROGRESS:
            continue
        if nid in fresh or nid not in present:
            continue  # made this pass, or not there (yet): its Jobs come when it is
        if state.started is None:
            starting.append(present[nid])
            continue
        if jobs is None:
            continue
        results = {c: jobs.get(job_name(nid, c, state)) for c in state.checks}
        failed = [_failure(c, r) for c, r in results.items() if r is not None and r.state == FAILED]
        if failed:
            out[nid] = moved[nid] = replace(state, status=CHECK_FAILED, finished=now)
            finished.append(Finished(nid, False, "; ".join(failed)))
        elif all(r is not None and r.state == SUCCEEDED for r in results.values()):
            out[nid] = moved[nid] = replace(state, status=CHECK_PASSED, finished=now)
            finished.append(Finished(nid, True, f"{', '.join(state.checks)} passed"))
        else:  # running; a Job that is gone is made again
            members = sorted(m for m, s in out.items() if s.cohort is not None and s.cohort == state.cohort)
            start += [j for j in _jobs_of(nid, state, members) if results[j.check] is None]
    for members in _cohorts(starting):
        connecting = [m for m in members if INSTANCE_CONNECTIVITY in out[m].checks]
        cohort = cohort_name(connecting, now) if connecting else None
        for nid in members:
            state = replace(out[nid], started=now, cohort=cohort if INSTANCE_CONNECTIVITY in out[nid].checks else None)
            out[nid] = moved[nid] = state
            start += _jobs_of(nid, state, connecting)
    began = tuple(sorted(n.node_id for n in starting))
    # A failure is acted on in the next pass, once the node's label says so: at once.
    waiting = any(s.status == CHECK_IN_PROGRESS for s in out.values())
    next_check = now if any(not f.passed for f in finished) else (now + POLL if waiting else None)
    return ChecksPlan(out, moved, tuple(start), began, tuple(finished), next_check)
