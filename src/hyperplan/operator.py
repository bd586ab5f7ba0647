"""Wire the operator together and run it: settings, clients, metrics, kopf.

Everything a handler needs travels in :class:`hyperplan.handlers.context.Runtime`, which is put into kopf's
operator-level memo before the operator starts; kopf hands each handler a copy of that
memo, so there are no module-level clients.
"""

from __future__ import annotations

import logging
import os
import kopf

from hyperplan.settings import Settings

def configure_kopf(settings: kopf.OperatorSettings, hp: Settings) -> None:
    """kopf's behaviour for this operator.

    Progress and the last-handled spec go into annotations, because our status schemas
    are structural (the API server would prune kopf's own ``status.kopf`` fields).
    """
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="hyperplan.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="hyperplan.dev", key="last-handled-configuration")
    settings.persistence.finalizer = "hyperplan.dev/finalizer"
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = hp.watch_server_timeout
    settings.watching.client_timeout = hp.watch_server_timeout + 30
    settings.execution.max_workers = 8
    settings.batching.error_delays = [1, 2, 5, 10, 20, 30]
    settings.networking.error_backoffs = [1, 2, 5, 10]


def run_operator() -> int:
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

    from hyperplan import handlers  # noqa: F401  (registers the handlers with kopf)
    from hyperplan.handlers.context import build_runtime

    runtime = build_runtime(hp)
    liveness = f"http://0.0.0.0:{hp.liveness_port}/healthz" if hp.liveness_port else None
    logging.getLogger("hyperplan").info(
        "hyperplan starting: policy=%s, liveness=%s, metrics port=%s",
        hp.policy, liveness, hp.metrics_port or "off")
    kopf.run(clusterwide=True, standalone=True, liveness_endpoint=liveness,
             memo=kopf.Memo(runtime=runtime))
    return 0
