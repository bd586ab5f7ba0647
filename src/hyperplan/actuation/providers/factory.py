"""The providers of one operator, by the name a group's ``spec.nodeProvider`` gives."""

from __future__ import annotations

from hyperplan.actuation.kube import Kube
from hyperplan.actuation.pods import RebootJob
from hyperplan.actuation.providers.base import NodeProvider
from hyperplan.actuation.providers.karpenter import KarpenterProvider
from hyperplan.actuation.providers.kwok import KwokProvider
from hyperplan.actuation.providers.static import StaticProvider
from hyperplan.planning import lending
from hyperplan.settings import Settings


def providers(kube: Kube, me: lending.OperatorIdentity | None = None,
              settings: Settings | None = None) -> dict[str, NodeProvider]:
    """The providers by name, with their reboot settings from ``settings`` (unset: read from the
    environment, ``HYPERPLAN_KWOK_REBOOT_SECONDS`` and ``HYPERPLAN_REBOOT_JOB_*``, which the
    chart sets). Reboot Jobs run in the operator's namespace (``me``), else ``default``."""
    s = settings or Settings()
    job = RebootJob(image=s.reboot_job_image, command=tuple(s.reboot_job_command),
                    namespace=(me.namespace if me else None) or s.pod_namespace or "default",
                    ttl_seconds=s.reboot_job_ttl_seconds, deadline_seconds=s.reboot_job_deadline_seconds)
    hyperpod = s.hyperpod_labels
    return {"kwok": KwokProvider(kube, s.kwok_reboot_seconds, hyperpod_labels=hyperpod),
            "static": StaticProvider(kube, me, job, hyperpod_labels=hyperpod, ultraserver_key=s.ultraserver_id_label),
            "karpenter": KarpenterProvider(kube, s.karpenter_node_class, s.karpenter_capacity_type,
                                           s.kwok_reboot_seconds, job, hyperpod_labels=hyperpod,
                                           reservation_label=s.karpenter_reservation_label)}
