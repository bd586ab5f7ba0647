"""What the Kueue AdmissionCheck controller writes, behind one Protocol (tests record them with
:class:`hyperplan_testing.fakes.RecordingKueueWrites`).

:mod:`hyperplan.controllers.kueue.admission` and :mod:`hyperplan.controllers.kueue.checks` read
Kueue's objects and the job nodes from the operator's watches and decide through
:mod:`hyperplan.planning`; every side effect of a pass goes through a
:class:`KueueWrites`: the check's entry on a Workload's status, an AdmissionCheck's ``Active``
condition, a job node's workload label, the Events, and the one API read a pass may make (the
plan's job nodes, listed only right after a pass that wrote to them, so that it never acts on a
view older than its own writes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, runtime_checkable

import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException

from hyperplan import metrics
from hyperplan.actuation.providers.base import gone_or_another, guarded
from hyperplan.actuation.kube import Kube
from hyperplan.planning import naming
from hyperplan.planning.trainingjobs import ANNOTATION_KEEP_ALIVE_UNTIL, LABEL_TRUSTED_WORKLOAD, LABEL_WORKLOAD

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
KUEUE_API = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
FIELD_MANAGER = "hyperplan-admission"
APPLY = "application/apply-patch+yaml"


@runtime_checkable
class KueueWrites(Protocol):
    def apply_check_entry(self, workload: Mapping[str, Any], entry: dict[str, Any]) -> dict[str, Any] | None:
        """Server-side apply of one admission-check entry on the Workload's status; the Workload
        as the API server returned it (None when not known)."""
        ...

    def apply_check_active(self, check: Mapping[str, Any], condition: dict[str, Any]) -> dict[str, Any] | None:
        """Server-side apply of the AdmissionCheck's ``Active`` condition; the check as returned."""
        ...

    def set_node_workload(self, node: str, workload: str, keep_alive_until: str | None, uid: str = "") -> None:
        """Label a job node with the workload it runs (``""`` when idle, then annotated with the
        end of its keep-alive; ``None`` removes that annotation). ``uid``: the node the plan's record
        holds; another node of that name is never written (nor one that is gone)."""
        ...

    def list_job_nodes(self, plan_label: str) -> list[client.V1Node]:
        """The plan's job nodes from the API (only after a pass that wrote to them)."""
        ...

    def write_job_record(self, plan: str, entries: list[dict[str, Any]], resource_version: str | None
                         ) -> dict[str, Any] | None:
        """The plan's record of its job nodes (``status.jobNodes``, a merge patch of the status) over
        ``resource_version`` (a 409 when the plan changed since); the plan as written."""
        ...

    def event(self, ref: Mapping[str, Any], type: str, reason: str, message: str) -> None:
        """A Kubernetes Event on ``ref`` (a Workload, a TrainingPlan, a Pod)."""
        ...


@dataclass
class KubeKueueWrites:
    """The writes on the API server (kopf posts the Events)."""

    kube: Kube

    def apply_check_entry(self, workload: Mapping[str, Any], entry: dict[str, Any]) -> dict[str, Any] | None:
        meta = workload["metadata"]
        body = {"apiVersion": KUEUE_API, "kind": "Workload",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                "status": {"admissionChecks": [entry]}}
        out = self.kube.custom.patch_namespaced_custom_object_status(
            KUEUE_GROUP, KUEUE_VERSION, meta["namespace"], "workloads", meta["name"], body,
            field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)
        metrics.STATUS_WRITES.labels("Workload").inc()
        return out if isinstance(out, dict) else None

    def apply_check_active(self, check: Mapping[str, Any], condition: dict[str, Any]) -> dict[str, Any] | None:
        name = check["metadata"]["name"]
        body = {"apiVersion": KUEUE_API, "kind": "AdmissionCheck", "metadata": {"name": name},
                "status": {"conditions": [condition]}}
        out = self.kube.custom.patch_cluster_custom_object_status(
            KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", name, body,
            field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)
        metrics.STATUS_WRITES.labels("AdmissionCheck").inc()
        return out if isinstance(out, dict) else None

    def set_node_workload(self, node: str, workload: str, keep_alive_until: str | None, uid: str = "") -> None:
        try:
            self.kube.core.patch_node(node, guarded({"metadata": {
                "labels": {LABEL_WORKLOAD: workload, LABEL_TRUSTED_WORKLOAD: workload},
                "annotations": {ANNOTATION_KEEP_ALIVE_UNTIL: keep_alive_until}}}, uid))
        except ApiException as e:
            if not (uid and gone_or_another(e)):
                raise

    def list_job_nodes(self, plan_label: str) -> list[client.V1Node]:
        return self.kube.list_nodes(f"{naming.LABEL_PLAN}={plan_label},{LABEL_WORKLOAD}")

    def write_job_record(self, plan: str, entries: list[dict[str, Any]], resource_version: str | None
                         ) -> dict[str, Any] | None:
        return self.kube.patch_status("trainingplans", plan, {"jobNodes": entries}, resource_version)

    def event(self, ref: Mapping[str, Any], type: str, reason: str, message: str) -> None:
        kopf.event(dict(ref), type=type, reason=reason, message=message)


_kube: type[KueueWrites] = KubeKueueWrites
