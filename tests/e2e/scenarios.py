"""End-to-end scenarios run side by side on one operator.

A scenario is a function that drives the cluster like a user (kubectl) and returns what
it observed; the session fixture ``scenarios`` starts every registered scenario at once
in its own thread, and each test asserts on the record of its scenario.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from hyperplan.api.models import from_rfc3339, to_rfc3339
from tests.kube import Kubectl

REGISTRY: dict[str, Callable[["Context"], Any]] = {}


def scenario(fn: Callable[["Context"], Any]) -> Callable[["Context"], Any]:
    REGISTRY[fn.__name__] = fn
    return fn


# Scenarios that start only once the first wave has finished: they would compete with it for the
# same UltraServer capacity (offerings come from every pool of a type), or they make reconcile
# errors on purpose, which other scenarios count.
LATE_REGISTRY: dict[str, Callable[["Context"], Any]] = {}


def late_scenario(fn: Callable[["Context"], Any]) -> Callable[["Context"], Any]:
    LATE_REGISTRY[fn.__name__] = fn
    return fn


@dataclass
class Context:
    kubectl: Kubectl
    kube: Any  # hyperplan.actuation.kube.Kube
    operator: Any = None  # tests.e2e.conftest.Operator: its log and /metrics
    metrics: Callable[[], str] | None = None  # the operator's /metrics text, read now
    # hyperplan's SageMaker API on each replica (the one that leads serves it), and the plane's kubeconfig
    sagemaker_api_urls: tuple[str, ...] = ()
    kubeconfig: str = ""
    plane: Any = None  # hyperplan_dev.plane.Plane (a scenario that restarts a plane component needs it)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


ts = to_rfc3339
parse_ts = from_rfc3339


@dataclass
class Recorder:
    """Polls a value every ``interval`` seconds and keeps each change with the wall time it was seen."""

    read: Callable[[], Any]
    interval: float = 0.2
    changes: list[tuple[datetime, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _last: Any = field(default_factory=object)

    def start(self) -> "Recorder":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        try:
            value = self.read()
        except Exception:  # noqa: BLE001 - a failed read is not a change
            return
        if value != self._last:
            self.changes.append((utcnow(), value))
            self._last = value

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.interval)

    def stop(self) -> list[tuple[datetime, Any]]:
        """Stop polling, then read once more: the caller usually stops right after it saw the value
        it waited for, which a poll slowed by load may not have recorded yet."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self._sample()
        return self.changes


def events_for(kubectl: Kubectl, name: str) -> list[dict]:
    items = kubectl.get("events", None, "-A", f"--field-selector=involvedObject.name={name}")["items"]
    return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")


@dataclass
class WatchRecorder:
    """Keeps ``read(object)`` for every version of one hyperplan object the API server sends."""

    kube: Any
    plural: str
    name: str
    read: Callable[[dict], Any]
    changes: list[tuple[datetime, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> "WatchRecorder":
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(10)
        return self

    def _run(self, ready: threading.Event) -> None:
        from kubernetes import watch
        while not self._stop.is_set():
            w = watch.Watch()
            stream = w.stream(self.kube.custom.list_cluster_custom_object, "hyperplan.dev", "v1alpha1",
                              self.plural, field_selector=f"metadata.name={self.name}", timeout_seconds=5)
            for event in stream:
                value = self.read(event["object"])
                if not self.changes or self.changes[-1][1] != value:
                    self.changes.append((utcnow(), value))
                ready.set()  # the first event is the object as it is now: recording has begun
                if self._stop.is_set():
                    w.stop()

    def stop(self) -> list[tuple[datetime, Any]]:
        self._stop.set()
        return self.changes


# ----------------------------------------------------------------------- objects as a user writes them

API = "hyperplan.dev/v1alpha1"


def pool_body(name: str, itype: str, count: int, az: str = "us-east-1a", unavailable=(), **spec) -> dict:
    return {"apiVersion": API, "kind": "CapacityPool", "metadata": {"name": name},
            "spec": {"instanceType": itype, "availabilityZone": az, "instanceCount": count,
                     "unavailable": list(unavailable), **spec}}


def plan_body(name: str, itype: str, count: int, **spec) -> dict:
    return {"apiVersion": API, "kind": "TrainingPlan", "metadata": {"name": name},
            "spec": {"instanceType": itype, "instanceCount": count, "targetResource": "hyperpod-cluster",
                     **spec}}


def group_body(name: str, plan: str, itype: str, count: int, **spec) -> dict:
    return {"apiVersion": API, "kind": "InstanceGroup", "metadata": {"name": name},
            "spec": {"trainingPlanRef": plan, "instanceType": itype, "instanceCount": count, **spec}}


def first_block(k: Kubectl, plan: str, timeout: float = 60) -> dict:
    """The plan's first reserved-capacity block, once it is bought."""
    from tests.kube import eventually
    return eventually(lambda: ((k.get("trainingplan", plan).get("status") or {}).get("reservedCapacity")
                               or [None])[0], timeout=timeout, what=f"plan {plan} bought")


def wait_phase(k: Kubectl, kind: str, name: str, phase: str, timeout: float = 90) -> dict:
    """The object's status once its phase is ``phase``."""
    from tests.kube import eventually
    return eventually(lambda: (s := k.get(kind, name).get("status") or {}).get("phase") == phase and s,
                      timeout=timeout, what=f"{kind} {name} {phase}")


@dataclass
class PodWatch:
    """Every version of the pods matching ``selector`` the API server sends, with the time seen."""

    kube: object
    selector: str
    namespace: str = "default"
    seen: list[tuple[datetime, str, dict]] = field(default_factory=list)  # (when, event type, pod)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> "PodWatch":
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(10)
        return self

    def _run(self, ready: threading.Event) -> None:
        """List once, then watch from that resourceVersion, each new stream going on from the last
        one's: no version of a pod is missed between two streams (a pod evicted and gone within
        such a gap would leave no trace)."""
        from kubernetes import watch
        from kubernetes.client.rest import ApiException
        version = None
        while not self._stop.is_set():
            if version is None:
                listed = self.kube.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
                for pod in listed.items:
                    self.seen.append((utcnow(), "ADDED", self.kube.api.sanitize_for_serialization(pod)))
                version = listed.metadata.resource_version
                ready.set()
            w = watch.Watch()
            try:
                for event in w.stream(self.kube.core.list_namespaced_pod, self.namespace,
                                      label_selector=self.selector, resource_version=version, timeout_seconds=5):
                    self.seen.append((utcnow(), event["type"],
                                      self.kube.api.sanitize_for_serialization(event["object"])))
                    version = w.resource_version or version
                    if self._stop.is_set():
                        w.stop()
            except ApiException as e:
                if e.status != 410:
                    raise
                version = None  # expired: list again

    def stop(self) -> list[tuple[datetime, str, dict]]:
        self._stop.set()
        return self.seen
