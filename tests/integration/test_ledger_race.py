"""Concurrent purchases against a real API server never overbook a pool."""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

from hyperplan.actuation.kube import Kube, api_client
from hyperplan.actuation.ledger import KubeLedger, pool_snapshot
from hyperplan.api.models import from_rfc3339
from hyperplan.planning.offerings import OfferingRequest, search_offerings
from hyperplan.planning.policy import DEMO
from tests.kube import Kubectl


def _peak(reservations: list[dict], start: datetime, end: datetime) -> int:
    """Largest total count reserved at any instant of [start, end)."""
    points = sorted({start} | {from_rfc3339(r["startTime"]) for r in reservations})
    peak = 0
    for t in points:
        if not start <= t < end:
            continue
        used = sum(r["instanceCount"] for r in reservations
                   if from_rfc3339(r["startTime"]) <= t
                   < from_rfc3339(r["endTime"]))
        peak = max(peak, used)
    return peak


def test_twelve_racing_purchases_never_overbook(crds: Kubectl, plane, caplog) -> None:
    caplog.set_level(logging.INFO, logger="hyperplan.actuation.ledger")
    itype = f"ml.race-{uuid.uuid4().hex[:4]}.xlarge"
    pool_name = f"race-{uuid.uuid4().hex[:6]}"
    crds.create({"apiVersion": "hyperplan.dev/v1alpha1", "kind": "CapacityPool",
                 "metadata": {"name": pool_name},
                 "spec": {"instanceType": itype, "availabilityZone": "us-east-1a", "instanceCount": 16}})
    ledger = KubeLedger(Kube(api_client(str(plane.kubeconfig))))
    now = datetime.now(timezone.utc)
    request = OfferingRequest(instance_type=itype, instance_count=4, ultra_server_type=None,
                              ultra_server_count=None, target="training-job",
                              duration=timedelta(minutes=2), start_after=now + timedelta(minutes=5))
    pools = [pool_snapshot(p) for p in ledger.pools() if p.metadata["name"] == pool_name]
    offering = search_offerings(request, pools, DEMO, now)[0]  # every racer wants the same block

    seen_versions: list[list[dict]] = []
    stop = threading.Event()

    def observe() -> None:  # every ledger state the API server ever held during the race
        from kubernetes import watch
        w = watch.Watch()
        for ev in w.stream(ledger.kube.custom.list_cluster_custom_object, "hyperplan.dev", "v1alpha1",
                           "capacitypools", field_selector=f"metadata.name={pool_name}", timeout_seconds=30):
            seen_versions.append(ev["object"].get("status", {}).get("reservations", []))
            if stop.is_set():
                w.stop()

    watcher = threading.Thread(target=observe, daemon=True)
    watcher.start()
    plans = [(f"racer-{i}", str(uuid.uuid4())) for i in range(12)]
    # One ledger (client) per racer, as separate operator replicas would be: a ledger serialises its
    # own purchases, so only the API server's resourceVersion check stands between these twelve.
    racers = [KubeLedger(Kube(api_client(str(plane.kubeconfig)))) for _ in plans]
    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(lambda pr: pr[1].purchase(pr[0][0], pr[0][1], offering, DEMO,
                                                           datetime.now(timezone.utc)),
                                zip(plans, racers)))
    stop.set()
    crds.run("annotate", "capacitypool", pool_name, "race=done")  # one more event to end the watch
    watcher.join(timeout=35)

    # The race was real: some writes were refused on a stale resourceVersion and retried.
    assert any("ledger conflict" in rec.getMessage() for rec in caplog.records)
    winners = [r for r in results if r.ok]
    losers = [r for r in results if not r.ok]
    assert len(winners) == 4  # 16 instances / 4 per plan
    assert all(r.violation.reason == "OfferingUnavailable" for r in losers), [r.violation for r in losers]
    final = crds.get("capacitypool", pool_name)["status"]["reservations"]
    assert len(final) == 4
    assert _peak(final, offering.start, offering.end) == 16
    assert seen_versions, "the watch saw no ledger versions"
    for version in seen_versions:
        assert _peak(version, offering.start, offering.end) <= 16
    # Releasing one plan frees exactly its block.
    won_uid = next(uid for (_, uid), r in zip(plans, results) if r.ok)
    assert ledger.release(won_uid, now=None) == 1
    assert len(crds.get("capacitypool", pool_name)["status"]["reservations"]) == 3
    crds.delete("capacitypool", pool_name)
