"""The deep health checks' Jobs: made, listed and read; :mod:`hyperplan.planning.deepchecks` decides.

Each check of a node is a Job in the operator's namespace, pinned to the node the way a static
node's reboot Job is (``nodeName``, so neither its taints nor a cordon keep it off; every taint
tolerated; run once, ``backoffLimit`` 0), running the check's command from the settings (chart
values ``deepHealthChecks``). The Job's environment tells the command what to check:

* ``HYPERPLAN_CHECK``: ``InstanceStress`` or ``InstanceConnectivity``; ``HYPERPLAN_CHECK_NODE``: the
  node's name; ``HYPERPLAN_CHECK_SECONDS``: how long the check may take;
* InstanceConnectivity: ``HYPERPLAN_CHECK_SELF`` and ``HYPERPLAN_CHECK_PEERS`` (comma-separated),
  the host names of this pod and of the run's pods, and ``HYPERPLAN_CHECK_PORT``. Each pod of a
  run has its node's id as ``hostname`` and the run's headless Service as ``subdomain``, so the
  cluster's DNS names it ``<node id>.<run>`` for the others as soon as it has an address
  (``publishNotReadyAddresses``). The Service is made with the run's Jobs, owned by all of them:
  the garbage collector deletes it with the last one (``ttlSecondsAfterFinished``).

A check passes when its Job is Complete and fails when it is Failed; the output of a failed one
is its pod's termination message (``terminationMessagePolicy: FallbackToLogsOnError``: what the
command wrote to ``/dev/termination-log``, else the tail of its log), or, when no pod ended, the
Job's own reason (its deadline passed, say).

On KWOK nothing runs in a pod: KWOK's stages (src/hyperplan_dev/kwok-stages.yaml) end a check pod
Succeeded after 5 s, or at once Failed with the exit code and output a test wrote on the pod
(:data:`ANNOTATION_KWOK_CHECK_EXIT_CODE`, :data:`ANNOTATION_KWOK_CHECK_OUTPUT`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Protocol, Sequence, runtime_checkable

from kubernetes import client
from kubernetes.client.rest import ApiException

from hyperplan.actuation.kube import Kube
from hyperplan.api.vocabulary import (
    ANNOTATION_CHECK_NODE,
    ANNOTATION_CHECK_NODE_ID,
    ANNOTATION_CHECK_NODE_UID,
    INSTANCE_CONNECTIVITY,
    DEEP_CHECK_JOB_LABEL,
    DEEP_CHECK_RUN_LABEL,
    LABEL_GROUP,
)
from hyperplan.planning import deepchecks, naming
from hyperplan.settings import DEFAULT_DEEP_HEALTH_CHECK_COMMANDS, Settings

log = logging.getLogger(__name__)

CHECK_COMPONENT = "deep-health-check"  # app.kubernetes.io/component of check Jobs, their pods and Services
DEADLINE_SLACK = 60  # seconds a Job has past its check's time before it fails (a pod that never ran)


@dataclass(frozen=True)
class CheckJobSettings:
    """What every check Job runs (the settings' ``deep_health_check_*``), in ``namespace``."""

    image: str = Settings.model_fields["deep_health_check_image"].default
    commands: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_DEEP_HEALTH_CHECK_COMMANDS))
    namespace: str = "default"
    seconds: int = 60
    port: int = 7946
    ttl_seconds: int = 600

    @classmethod
    def from_settings(cls, s: Settings, namespace: str) -> CheckJobSettings:
        commands = {**DEFAULT_DEEP_HEALTH_CHECK_COMMANDS,
                    **{check: tuple(command) for check, command in s.deep_health_check_commands.items()}}
        return cls(s.deep_health_check_image, commands, namespace, s.deep_health_check_seconds,
                   s.deep_health_check_port, s.deep_health_check_ttl_seconds)


@dataclass(frozen=True)
class Target:
    """A check Job to make on the node it names (its name and uid, from the group's record)."""

    job: deepchecks.CheckJob
    node: str
    node_uid: str


def labels_of(group: str, check: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "hyperplan", "app.kubernetes.io/component": CHECK_COMPONENT,
            LABEL_GROUP: naming.label_value(group), DEEP_CHECK_JOB_LABEL: check}


def check_job_body(s: CheckJobSettings, group: str, target: Target) -> dict[str, Any]:
    """The Job of one check of one node (see the module docstring)."""
    job = target.job
    labels = labels_of(group, job.check)
    pod_labels = {**labels, **({DEEP_CHECK_RUN_LABEL: job.cohort} if job.cohort else {})}
    env = {"HYPERPLAN_CHECK": job.check, "HYPERPLAN_CHECK_NODE": target.node,
           "HYPERPLAN_CHECK_SECONDS": str(s.seconds)}
    pod: dict[str, Any] = {
        "nodeName": target.node,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "tolerations": [{"operator": "Exists"}],
        "terminationGracePeriodSeconds": 5,
    }
    container: dict[str, Any] = {"name": "check", "image": s.image, "command": list(s.commands[job.check]),
                                 "terminationMessagePolicy": "FallbackToLogsOnError"}
    if job.check == INSTANCE_CONNECTIVITY and job.cohort:
        pod.update(hostname=job.node_id, subdomain=job.cohort)
        env.update(HYPERPLAN_CHECK_SELF=f"{job.node_id}.{job.cohort}",
                   HYPERPLAN_CHECK_PEERS=",".join(f"{p}.{job.cohort}" for p in job.peers),
                   HYPERPLAN_CHECK_PORT=str(s.port))
        container["ports"] = [{"name": "check", "containerPort": s.port, "protocol": "TCP"}]
    container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    pod["containers"] = [container]
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job.name, "namespace": s.namespace, "labels": labels,
                     "annotations": {ANNOTATION_CHECK_NODE: target.node, ANNOTATION_CHECK_NODE_UID: target.node_uid,
                                     ANNOTATION_CHECK_NODE_ID: job.node_id}},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": s.seconds + DEADLINE_SLACK,
            "ttlSecondsAfterFinished": s.ttl_seconds,
            "template": {"metadata": {"labels": pod_labels}, "spec": pod},
        },
    }


def cohort_service_body(s: CheckJobSettings, group: str, cohort: str, owners: Sequence[tuple[str, str]]) -> dict:
    """The headless Service of an InstanceConnectivity run: the DNS names of its pods, whether Ready
    or not; owned by the run's Jobs (name, uid), so it goes with the last of them."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": cohort, "namespace": s.namespace, "labels": labels_of(group, INSTANCE_CONNECTIVITY),
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid}
                                         for name, uid in owners]},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {DEEP_CHECK_RUN_LABEL: cohort},
                 "ports": [{"name": "check", "port": s.port, "targetPort": s.port, "protocol": "TCP"}]},
    }


def job_state(job: client.V1Job) -> tuple[str, str]:
    """(state, reason) of a Job from its conditions: Complete, Failed (with the condition's
    message), else running."""
    for c in (job.status.conditions if job.status else None) or []:
        if c.status == "True" and c.type == "Complete":
            return deepchecks.SUCCEEDED, ""
        if c.status == "True" and c.type == "Failed":
            return deepchecks.FAILED, " ".join(x for x in (c.reason, c.message) if x)
    return deepchecks.RUNNING, ""


def termination_message(pod: client.V1Pod) -> str:
    """What the pod's ended container said (its termination message), with its exit code."""
    for status in (pod.status.container_statuses if pod.status else None) or []:
        ended = status.state.terminated if status.state else None
        if ended is not None:
            said = (ended.message or "").strip()
            return f"exit code {ended.exit_code}" + (f": {said}" if said else "")
    return ""


@runtime_checkable
class DeepCheckJobs(Protocol):
    """The check Jobs of instance groups (a recording fake in tests)."""

    def list(self, group: str, awaited: Collection[str] = ()) -> dict[str, deepchecks.JobResult]:
        """The group's check Jobs by name, each with its state and, for a failed one of
        ``awaited`` (the Jobs a run waits for), its output."""
        ...

    def start(self, group: str, targets: Sequence[Target]) -> list[str]:
        """Make each target's Job (one of that name already there is this run's: no error), then
        the Service of each InstanceConnectivity run among them, owned by its Jobs; the Jobs made."""
        ...


class KubeDeepCheckJobs:
    """Check Jobs on the API server (batch/v1 Jobs and a core/v1 Service per run)."""

    def __init__(self, kube: Kube, settings: CheckJobSettings):
        self.kube = kube
        self.settings = settings

    def list(self, group: str, awaited: Collection[str] = ()) -> dict[str, deepchecks.JobResult]:
        selector = (f"app.kubernetes.io/component={CHECK_COMPONENT},"
                    f"{LABEL_GROUP}={naming.label_value(group)}")
        jobs = self.kube.batch.list_namespaced_job(self.settings.namespace, label_selector=selector).items
        out = {}
        for job in jobs:
            state, reason = job_state(job)
            output = ""
            if state == deepchecks.FAILED and job.metadata.name in awaited:  # its pods: one call
                output = self._output(job.metadata.name) or reason
            out[job.metadata.name] = deepchecks.JobResult(job.metadata.name, state, output)
        return out

    def _output(self, job: str) -> str:
        pods = self.kube.core.list_namespaced_pod(self.settings.namespace, label_selector=f"job-name={job}").items
        said = [m for p in pods if (m := termination_message(p))]
        return said[-1] if said else ""

    def start(self, group: str, targets: Sequence[Target]) -> list[str]:
        made, owners = [], {}
        for target in targets:
            body = check_job_body(self.settings, group, target)
            try:
                answer = self.kube.batch.create_namespaced_job(self.settings.namespace, body)
                made.append(target.job.name)
                uid = answer.metadata.uid
            except ApiException as e:
                if e.status != 409:
                    raise
                uid = None  # made before (a pass that did not record it, or a Job made again): its Service too
            if target.job.cohort and uid:
                owners.setdefault(target.job.cohort, []).append((target.job.name, uid))
        for cohort, jobs in owners.items():
            try:
                self.kube.core.create_namespaced_service(self.settings.namespace,
                                                         cohort_service_body(self.settings, group, cohort, jobs))
            except ApiException as e:
                if e.status != 409:
                    raise
        if made:
            log.info("group %s: deep health check Jobs made: %s", group, ", ".join(made))
        return made


_kube_checks: type[DeepCheckJobs] = KubeDeepCheckJobs
