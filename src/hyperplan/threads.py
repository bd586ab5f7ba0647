"""Every thread pool the operator runs, in one table: its name, its size and why.

The passes run on kopf's event loop; what blocks (an API call, a remote purchase) runs on a pool.
Each pool is declared here and made only through :func:`new_pool` (or :func:`shared_pool` for the
one the whole process shares), so that the table below is the whole story; docs/architecture.md
shows it, and a unit test checks that the page and the table agree.

Threads that are not pools (one each): the node watch (``node-watch``), the leader's Lease
renewal (``leader-election``), the /metrics server (``metrics``, with a thread per connection it
holds, at most ``HYPERPLAN_METRICS_MAX_CONNECTIONS``), the /healthz server (``liveness``) and the
SageMaker API's server (``sagemaker-api``), each with an event loop of its own
(:mod:`hyperplan.serving`), and on a standby the SageMaker API's own watches. kopf's own executor for sync handlers has ``kopf`` workers (every hyperplan
handler is async, so it stays idle), and asyncio's default executor (cpu count + 4) serves only
``asyncio.to_thread`` calls outside the passes.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass


@dataclass(frozen=True)
class Pool:
    name: str  # the threads' name prefix (as a thread dump shows them)
    size: int
    why: str


POOLS: dict[str, Pool] = {p.name: p for p in (
    Pool("purchase", 64, "plan passes' purchases, extensions and remote calls, which mostly wait for the ledger's "
                         "next group commit or a remote endpoint; on the default executor (6 threads on 2 cores) "
                         "a batch of purchases went 6 at a time and starved other passes"),
    Pool("group", 32, "group passes' API calls (list, the steps that act, status writes): on the default executor, "
                      "20 groups failing at once queued their marks, promotions and backfills behind each other"),
    Pool("node-write", 64, "the node writes one group pass fans out (creates, marks, promotions; at most 32 of one "
                           "pass at once), shared by every group so that nothing unbounded grows across groups; only "
                           "group threads submit to it and its calls never submit again (no deadlock)"),
    Pool("kueue-admission", 2, "the Kueue controller's writes (Workload check states, job-node keys): few and rare"),
    Pool("sagemaker-write", 32, "the SageMaker API's writes (CreateTrainingPlan, ExtendTrainingPlan, the HyperPod "
                                "calls), each mostly waiting for the API server"),
    Pool("kopf", 8, "kopf's executor for sync handlers (kopf's settings.execution.max_workers); hyperplan's "
                    "handlers are async, so it stays idle"),
)}

_shared: dict[str, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def size(name: str) -> int:
    return POOLS[name].size


def new_pool(name: str) -> ThreadPoolExecutor:
    """A new pool of the declared size, its threads named ``name``."""
    return ThreadPoolExecutor(max_workers=POOLS[name].size, thread_name_prefix=name)


def shared_pool(name: str) -> ThreadPoolExecutor:
    """The process's one pool of that name, made on first use."""
    with _lock:
        if name not in _shared:
            _shared[name] = new_pool(name)
        return _shared[name]
