"""Wire the operator together and run it: settings, clients, metrics, leader election, kopf.

Everything a handler needs travels in :class:`hyperplan.runtime.context.Runtime`, which is put into kopf's
operator-level memo before the operator starts; kopf hands each handler a copy of that
memo, so there are no module-level clients.

With leader election on (the default), kopf starts only once this replica holds the Lease:
a standby serves ``/healthz``, ``/metrics`` and the SageMaker API (from a read-only watch of its
own, :mod:`hyperplan.sagemaker.replica`) and does nothing else. On SIGTERM the leader stops
kopf and releases the Lease, so a rolling upgrade hands over at the standby's next attempt;
when it cannot renew the Lease it stops acting and exits 1 (the kubelet restarts it as a
standby), as controller-runtime managers do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time

import kopf
from aiohttp import web

from hyperplan import allocator, kopf_readiness, metrics
from hyperplan.serving import HeldServer, Limits
from hyperplan.actuation.kube import api_client
from hyperplan.actuation.leadership import KubeLeaseStore, LeaderElector, Timing
from hyperplan.settings import Settings


class Liveness:
    """``/healthz`` for both roles, answered from a thread of its own (``hyperplan.serving``) so
    that no client of the port costs kopf's event loop anything; it still proves that loop alive:
    a task on the loop beats every second, and ``/healthz`` answers 503 once the last beat is
    older than ``stall_seconds`` (the kubelet then restarts the container, as it did when the
    answer itself came from a stuck loop)."""

    BEAT_SECONDS = 1.0

    def __init__(self, server: HeldServer, stall_seconds: float) -> None:
        self.server = server
        self.stall_seconds = stall_seconds
        self.beat = time.monotonic()
        self._beating: asyncio.Task | None = None

    async def _beat(self) -> None:
        while True:
            self.beat = time.monotonic()
            await asyncio.sleep(self.BEAT_SECONDS)

    def start_beating(self) -> None:
        self._beating = asyncio.create_task(self._beat(), name="liveness-heartbeat")

    async def cleanup(self) -> None:
        if self._beating is not None:
            self._beating.cancel()
        await self.server.cleanup()


async def serve_liveness(port: int, elector: LeaderElector | None, address: str = "0.0.0.0", *,
                         limits: Limits = Limits(16, 5.0, 10.0), stall_seconds: float = 5.0) -> Liveness | None:
    """``/healthz`` for both roles: 200 while the event loop runs (leader or standby), 503 once it
    has stalled for ``stall_seconds`` (:class:`Liveness`)."""
    if not port:
        return None

    async def healthz(request: web.BaseRequest) -> web.Response:
        if request.path != "/healthz" or request.method not in ("GET", "HEAD"):
            return web.Response(status=404)
        stalled = time.monotonic() - liveness.beat
        if stalled > stall_seconds:
            return web.json_response({"status": "stalled", "seconds": round(stalled, 1)}, status=503)
        role = "leader" if elector is None or elector.is_leader else "standby"
        return web.json_response({"status": "ok", "role": role})

    server = HeldServer("liveness", healthz, address, port, limits)
    liveness = Liveness(server, stall_seconds)
    liveness.start_beating()  # before kopf starts: kopf cancels the tasks made after its start
    try:
        await asyncio.to_thread(server.start)
    except BaseException:
        await liveness.cleanup()
        raise
    return liveness


def build_elector(hp: Settings, api) -> LeaderElector:
    namespace = hp.leader_election_namespace or hp.pod_namespace or "default"
    identity = hp.leader_election_identity or hp.pod_name or f"{socket.gethostname()}-{os.getpid()}"
    timing = Timing(hp.lease_duration_seconds, hp.renew_deadline_seconds, hp.retry_period_seconds)
    # Each Lease call is bounded so that the renew deadline is judged on time (3 tries fit in it).
    store = KubeLeaseStore(api, namespace, hp.leader_election_lease_name,
                           request_timeout=max(1.0, min(5.0, hp.renew_deadline_seconds / 3)))
    return LeaderElector(store, identity, timing)


async def run_elected(hp: Settings, runtime) -> int:
    """Stand by until this replica leads (if elections are on), then run kopf until a signal."""
    log = logging.getLogger("hyperplan")
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # The Lease has a client of its own: its renewals never share a connection pool with the
    # handlers' many threads (a pool that 64 purchase threads churn costs a renewal a fresh TLS
    # handshake, under the GIL, at the worst moment).
    elector = build_elector(hp, api_client(hp.kubeconfig)) if hp.leader_election else None
    liveness = await serve_liveness(
        hp.liveness_port, elector, hp.liveness_address, stall_seconds=hp.liveness_stall_seconds,
        limits=Limits(hp.liveness_max_connections, hp.header_timeout_seconds, hp.body_timeout_seconds))
    trimming = asyncio.create_task(allocator.trim_after_busy_spells())  # before kopf: it would cancel it
    # The SageMaker API is served in both roles, from before the election (hyperplan.sagemaker.replica).
    from hyperplan.sagemaker.replica import ReplicaApi  # imports the handlers, as run_operator does
    from hyperplan.sagemaker import server as sagemaker_server
    # How the API's port holds its clients: ReplicaApi serves with these (sagemaker.server.serve).
    sagemaker_server.SERVING = sagemaker_server.Serving(
        Limits(hp.sagemaker_api_max_connections, hp.header_timeout_seconds, hp.body_timeout_seconds),
        hp.sagemaker_api_answer_seconds)
    sagemaker_api = runtime.sagemaker_api = ReplicaApi.of(hp, runtime)
    if sagemaker_api is not None:
        sagemaker_api.start()  # a task made before kopf's start
    try:
        if elector is not None:
            store = elector.store
            log.info("leader election on lease %s/%s as %s (lease %gs, renew deadline %gs, retry %gs)",
                     store.namespace, store.name, elector.identity, hp.lease_duration_seconds,
                     hp.renew_deadline_seconds, hp.retry_period_seconds)
            waited = time.monotonic()
            if not await elector.acquire(stop):
                log.info("stopped while standing by")
                return 0
            log.info("leading as %s after %.1fs", elector.identity, time.monotonic() - waited)
        metrics.LEADER.set(1)
        # Renewals run on a thread of their own (see LeaderElector.renew_until_lost). When the
        # Lease is lost the process exits at once, as a controller-runtime manager does: handler
        # threads may be in the middle of API calls, and only the exit stops them all before the
        # standby acts. The kubelet restarts the container, which then stands by.
        renew_stop = threading.Event()
        renewer = None
        if elector is not None:
            def renew() -> None:
                if not elector.renew_until_lost(renew_stop):
                    log.error("lost the lease %s (not renewed for %gs, or another holder): exiting so "
                              "that only the new leader acts", elector.store.name,
                              hp.renew_deadline_seconds)
                    logging.shutdown()
                    os._exit(1)
            renewer = threading.Thread(target=renew, name="leader-election", daemon=True)
            renewer.start()
        # Our task exists before kopf starts: kopf cancels every task created after its start.
        stopping = asyncio.create_task(stop.wait())
        # No stop_flag: kopf takes SIGTERM itself once it runs (its own signal handlers replace
        # ours), and a stop flag it never sees set would hold its shutdown up for 5 s.
        operator = asyncio.create_task(kopf.operator(
            clusterwide=True, standalone=True, memo=kopf.Memo(runtime=runtime)))
        await asyncio.wait({operator, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not operator.done():
            operator.cancel()
        with contextlib.suppress(BaseException):  # kopf logs its own errors; cancelled above
            await asyncio.wait_for(operator, timeout=20)
        stopping.cancel()
        metrics.LEADER.set(0)
        renew_stop.set()
        if renewer is not None:
            await asyncio.to_thread(renewer.join, hp.retry_period_seconds + 6)
        if elector is not None and await asyncio.to_thread(elector.release):
            log.info("released the lease for a standby")
        return 0
    finally:
        trimming.cancel()
        if sagemaker_api is not None:
            await sagemaker_api.cleanup()
        if liveness is not None:
            await liveness.cleanup()


def run_operator() -> int:
    allocator.limit_arenas()  # before any thread exists (see hyperplan.allocator)
    hp = Settings()
    if hp.kubeconfig:
        os.environ["KUBECONFIG"] = hp.kubeconfig
    logging.basicConfig(
        level=logging.DEBUG if hp.verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    for noisy in ("kubernetes.client.rest", "urllib3", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not hp.verbose:  # one line per handler call drowns what the operator does; keep our own lines
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)

    from hyperplan import wiring  # noqa: F401  (registers every kopf handler)
    # kopf's index readiness woke every listed object's worker on every object listed: a start with
    # 10,000 plans made no pass for minutes (hyperplan.kopf_readiness).
    kopf_readiness.install()
    from hyperplan.runtime.context import build_runtime

    runtime = build_runtime(hp)
    liveness = f"http://{hp.liveness_address}:{hp.liveness_port}/healthz" if hp.liveness_port else None
    served = f"http://{hp.metrics_address}:{hp.metrics_port}/metrics" if hp.metrics_port else "off"
    logging.getLogger("hyperplan").info(
        "hyperplan starting: policy=%s, liveness=%s, metrics=%s", hp.policy, liveness, served)
    metrics.serve(hp.metrics_port, hp.metrics_address, timeout_seconds=hp.metrics_timeout_seconds,
                  max_connections=hp.metrics_max_connections, cache_seconds=hp.metrics_cache_seconds,
                  header_seconds=hp.header_timeout_seconds)
    return asyncio.run(run_elected(hp, runtime))
