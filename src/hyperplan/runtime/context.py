"""What every handler gets: settings, policy, clients, the clock, and the work queue."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from hyperplan.actuation.deepchecks import CheckJobSettings, DeepCheckJobs, KubeDeepCheckJobs
from hyperplan.actuation.kube import Kube, api_client
from hyperplan.actuation.remote.sources import RemoteSources, secret_credentials
from hyperplan.actuation.ledger import CapacityLedger, KubeLedger
from hyperplan.actuation.pods import KubeNodePods, NodePods
from hyperplan.actuation.providers.base import NodeProvider
from hyperplan.actuation.providers.factory import providers
from hyperplan.api.models import UltraServerReplacement, UltraServerWanted
from hyperplan.runtime.store import WatchCache
from hyperplan.runtime.nodewatch import NodeStore, NodeWatch
from hyperplan.runtime.workqueue import WorkQueue, report_failure, utcnow
from hyperplan.planning.lending import OperatorIdentity
from hyperplan.planning.memory import GroupMemory
from hyperplan.planning.naming import TopologyKeys
from hyperplan.planning.policy import Policy, get_policy
from hyperplan import threads
from hyperplan.settings import Settings

Clock = Callable[[], datetime]


class ServedApi(Protocol):
    """The SageMaker API as the runtime holds it while it is served (hyperplan.sagemaker.replica):
    told when kopf's indexes are filled, stopped at cleanup."""

    def indexed(self, cache: WatchCache) -> None: ...

    async def cleanup(self) -> None: ...


class ControllerState(Protocol):
    """A controller's own memory held for it by the runtime (the Kueue controller's KueueState):
    the runtime knows nothing of it but that it checks it is written on the event loop."""

    def on_loop(self) -> None: ...


@dataclass
class Runtime:
    settings: Settings
    policy: Policy
    kube: Kube
    ledger: CapacityLedger
    providers: dict[str, NodeProvider]
    keys: TopologyKeys = field(default_factory=TopologyKeys)
    me: OperatorIdentity = field(default_factory=OperatorIdentity)  # never drained, never lent
    clock: Clock = utcnow
    # The one work queue of every kind's passes (runtime.workqueue): plans, groups, Kueue's plans.
    queue: WorkQueue | None = None
    cache: WatchCache = field(default_factory=WatchCache)  # what the watches hold: the read side of passes
    # The plans' and the groups' threads (hyperplan.threads says why each is as big as it is).
    purchase_threads: ThreadPoolExecutor = field(default_factory=lambda: threads.new_pool("purchase"))
    group_threads: ThreadPoolExecutor = field(default_factory=lambda: threads.new_pool("group"))
    # What the operator remembers of its groups between passes (first sights of health labels,
    # vanished and releasing nodes, the plan of each group): one owner, changed on the event loop.
    group_memory: GroupMemory = field(default_factory=GroupMemory)
    # What a drain does to the pods on a node (the Eviction API; a recording fake in tests).
    pods: NodePods | None = None
    # The deep health checks' Jobs (actuation.deepchecks; a recording fake in tests).
    checks: DeepCheckJobs | None = None
    # Who needs waking when something changes, so a change wakes only the passes it concerns:
    # plans not bought yet (their offerings depend on the pools).
    unbought_plans: set[str] = field(default_factory=set)
    # Each pool's metadata.generation as its last event had it (wiring.events.remote_record_only).
    pool_generations: dict[str, int | None] = field(default_factory=dict)
    # The nodes of groups, jobs and the free pool, from the operator's own node watch
    # (runtime.nodewatch; started by wiring.nodes.start_node_watch, which sets node_watch).
    node_store: NodeStore = field(default_factory=NodeStore)
    node_watch: NodeWatch | None = None
    plan_digests: dict[str, str] = field(default_factory=dict)  # see wiring.nodes.plan_digest
    # Each plan's labels as its last event had them: a relabelled plan not bought yet searches again,
    # since the pools' trainingPlanSelectors read them (controllers.plan.reconciler.plan_event).
    plan_labels: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    # Each plan's metadata.generation as its last event had it (a spec change is a new one).
    plan_generations: dict[str, int | None] = field(default_factory=dict)
    # Other controllers' callbacks for a plan's watch event (name, type, body), called by
    # wiring.events after the operator's own (the Kueue controller registers one).
    plan_listeners: list[Callable[[str, str | None, Mapping[str, Any]], None]] = field(default_factory=list)
    # The Kueue admission controller's state (controllers.kueue.state.KueueState): the AdmissionChecks it
    # serves and the plans it passes over. Set when its handlers start.
    kueue: ControllerState | None = None
    # The object name of each group by its key in the queue: the label value of its name, which
    # its nodes carry and every wake of a group names (controllers.group.reconciler).
    group_names: dict[str, str] = field(default_factory=dict)
    # Each group's generation and labels as its last event had them, by key (a change wakes it).
    group_seen: dict[str, tuple] = field(default_factory=dict)
    # hyperplan's SageMaker API while it is served (an aiohttp runner; hyperplan.sagemaker.server).
    sagemaker_api: ServedApi | None = None
    # The endpoints of pools whose capacity a SageMaker endpoint sells (actuation.remote.RemoteSources);
    # None: remote pools are not followed (unit tests that do not need them).
    remote: RemoteSources | None = None

    def __post_init__(self) -> None:
        if self.pods is None:
            self.pods = KubeNodePods(self.kube, self.me)
        if self.checks is None:  # in the operator's namespace, as the reboot Jobs
            namespace = self.me.namespace or self.settings.pod_namespace or "default"
            self.checks = KubeDeepCheckJobs(self.kube, CheckJobSettings.from_settings(self.settings, namespace))
        if self.queue is None:
            self.queue = WorkQueue(self.clock, report=functools.partial(report_failure, self.kube, self.clock))

    def wake_unbought_plans(self) -> None:
        for name in list(self.unbought_plans):
            self.queue.wake("plan", name)

    def wake_groups_of(self, plan: str) -> None:
        for group in self.group_memory.groups_of(plan):
            self.queue.wake("group", group)


def build_runtime(settings: Settings) -> Runtime:
    kube = Kube(api_client(settings.kubeconfig))
    layers = settings.network_layer_labels
    me = OperatorIdentity(pod_name=settings.pod_name, namespace=settings.pod_namespace,
                          node_name=settings.node_name, pod_labels=dict(settings.operator_pod_labels))
    # The client imports an API's module on its first use (CoreV1Api: 1 to 2 s). Passes read from
    # the watch cache, so the first node create at a block start would pay it: pay it at startup.
    _ = kube.core, kube.policy
    cache = WatchCache()
    lead = None if settings.checkpoint_lead_seconds is None else timedelta(seconds=settings.checkpoint_lead_seconds)
    remote = RemoteSources(secret_credentials(kube.core, settings.pod_namespace or "default"))
    return Runtime(settings=settings, policy=get_policy(settings.policy, lead), kube=kube,
                   ledger=KubeLedger(kube, reads=cache), providers=providers(kube, me, settings), me=me,
                   keys=TopologyKeys(settings.ultraserver_id_label, *layers), cache=cache, remote=remote)


M = TypeVar("M", bound=BaseModel)


def status_of(model: type[M], obj: dict[str, Any]) -> M:
    """The object's status as ``model``; an empty one when it is missing or unreadable."""
    try:
        return model.model_validate(obj.get("status") or {})
    except ValidationError:
        return model()


def status_patch(desired: Mapping[str, Any], current: Mapping[str, Any], keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """The merge patch that makes a status ``current`` into ``desired`` (both as ``wire()`` writes
    them, without unset fields): ``desired`` with a null for each field it no longer sets, since a
    merge patch leaves an absent key as it was (a ``nextTransitionTime`` past the plan's last block
    stayed). ``keep``: fields the patch leaves alone when absent."""
    return {**{k: None for k in current if k not in desired and k not in keep}, **desired}


def _entries(group: Mapping[str, Any], field: str, model: type[M]) -> tuple[M, ...]:
    out = []
    for entry in (group.get("status") or {}).get(field) or ():
        try:
            out.append(model.model_validate(entry))
        except ValidationError:
            continue
    return tuple(out)


def ultraserver_replacements(group: Mapping[str, Any]) -> tuple[UltraServerReplacement, ...]:
    """The UltraServer replacements a group's status records; an entry that does not read as one is
    left out (planning checks the rest: recovery.block_replacements)."""
    return _entries(group, "ultraServerReplacements", UltraServerReplacement)


def ultraservers_wanted(group: Mapping[str, Any]) -> tuple[UltraServerWanted, ...]:
    """The UltraServers a group's status says it must leave with none free to go to; an entry that
    does not read as one is left out (the plan checks the rest: planning.plans.ultraserver_to_buy)."""
    return _entries(group, "ultraServersWanted", UltraServerWanted)
