"""KubeLedger's group commit, against a recording fake of the API calls it makes.

Purchases that arrive while a batch is being written go together into the next one: one status
replace per pool for the whole batch, each purchase re-checked against the ledger plus those
accepted before it (so a batch never overbooks a pool), and a 409 makes the batch re-read and
try again.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from kubernetes.client.rest import ApiException

from hyperplan.actuation.ledger import KubeLedger
from hyperplan.planning.offerings import Block, Offering
from hyperplan.planning.policy import SAGEMAKER

UTC = timezone.utc
T = datetime(2027, 2, 1, 11, 30, tzinfo=UTC)
P5 = "ml.p5.48xlarge"


@dataclass
class FakeKube:
    """The pools as the API server would keep them, with resourceVersion checks."""

    pools: dict[str, dict[str, Any]] = field(default_factory=dict)
    writes: list[tuple[str, int]] = field(default_factory=list)  # (pool, reservations written)
    conflicts_left: int = 0
    hold_first_write: threading.Event | None = None
    first_write_started: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_pool(self, name: str, count: int) -> None:
        self.pools[name] = {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "CapacityPool",
                            "metadata": {"name": name, "resourceVersion": "1"},
                            "spec": {"instanceType": P5, "availabilityZone": "use1-az1", "instanceCount": count},
                            "status": {"reservations": []}}

    def list_objects(self, plural: str) -> list[dict[str, Any]]:
        with self.lock:
            return copy.deepcopy(list(self.pools.values()))

    def get_object(self, plural: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            return copy.deepcopy(self.pools.get(name))

    def replace_status(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.hold_first_write is not None and not self.first_write_started.is_set():
            self.first_write_started.set()
            self.hold_first_write.wait(5)
        with self.lock:
            name = body["metadata"]["name"]
            stored = self.pools[name]
            if self.conflicts_left or body["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]:
                self.conflicts_left = max(0, self.conflicts_left - 1)
                stored["metadata"]["resourceVersion"] = str(int(stored["metadata"]["resourceVersion"]) + 1)
                raise ApiException(status=409, reason="Conflict")
            self.writes.append((name, len(body["status"]["reservations"])
                                - len(stored["status"]["reservations"])))
            stored["status"] = copy.deepcopy(body["status"])
            stored["metadata"]["resourceVersion"] = str(int(stored["metadata"]["resourceVersion"]) + 1)
            return copy.deepcopy(stored)


def offering(pool: str = "pool-a", count: int = 1) -> Offering:
    return Offering.from_blocks([Block(pool, "use1-az1", P5, count, T, T + timedelta(days=1))])


def buy_at_once(ledger: KubeLedger, plans: list[str], offer: Offering) -> dict[str, Any]:
    results: dict[str, Any] = {}

    def buy(name: str) -> None:
        results[name] = ledger.purchase(name, f"uid-{name}", offer, SAGEMAKER, T - timedelta(days=1))

    threads = [threading.Thread(target=buy, args=(p,)) for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return results


def test_purchases_that_wait_for_a_write_go_together_into_the_next_one():
    kube = FakeKube(hold_first_write=threading.Event())
    kube.add_pool("pool-a", 8)
    ledger = KubeLedger(kube)  # type: ignore[arg-type]
    first: dict[str, Any] = {}
    t = threading.Thread(target=lambda: first.update(
        one=ledger.purchase("one", "uid-one", offering(), SAGEMAKER, T - timedelta(days=1))))
    t.start()
    assert kube.first_write_started.wait(5)
    waiting = [threading.Thread(target=lambda n=n: first.update({n: ledger.purchase(
        n, f"uid-{n}", offering(), SAGEMAKER, T - timedelta(days=1))})) for n in ("two", "three", "four", "five")]
    for w in waiting:
        w.start()
    while len(ledger._purchases.waiting) < 4:  # all four queued behind the held write
        threading.Event().wait(0.01)
    kube.hold_first_write.set()
    for w in [t, *waiting]:
        w.join(10)

    assert all(r.ok for r in first.values()) and len(first) == 5
    assert kube.writes == [("pool-a", 1), ("pool-a", 4)]  # two writes for five purchases
    assert sorted(r["trainingPlan"] for r in kube.pools["pool-a"]["status"]["reservations"]) == [
        "five", "four", "one", "three", "two"]


def test_a_batch_never_overbooks_a_pool():
    kube = FakeKube()
    kube.add_pool("pool-a", 3)
    ledger = KubeLedger(kube)  # type: ignore[arg-type]
    results = buy_at_once(ledger, [f"p{i}" for i in range(6)], offering())

    won = sorted(n for n, r in results.items() if r.ok)
    lost = {n: r.violation.reason for n, r in results.items() if not r.ok}
    assert len(won) == 3
    assert set(lost.values()) == {"OfferingUnavailable"}
    assert len(kube.pools["pool-a"]["status"]["reservations"]) == 3
    # A loser is told what the ledger looked like when it lost: the pool full in that block.
    some_loser = results[next(iter(lost))]
    busy = [b for s in some_loser.pools if s.name == "pool-a" for b in s.busy]
    assert sum(b.instance_count for b in busy) == 3


def test_a_conflict_makes_the_batch_read_again_and_write_once_more():
    kube = FakeKube(conflicts_left=2)
    kube.add_pool("pool-a", 8)
    ledger = KubeLedger(kube)  # type: ignore[arg-type]
    result = ledger.purchase("one", "uid-one", offering(count=2), SAGEMAKER, T - timedelta(days=1))

    assert result.ok
    assert [b.instance_count for b in result.blocks] == [2]
    assert kube.writes == [("pool-a", 1)]


def test_remote_records_that_wait_for_a_write_go_together_into_the_next_one():
    """Lines of remote plans (controllers.plan.remote) are group-committed as purchases are: one
    status replace per pool for those that queued behind a write, each plan's lines exactly as
    recorded, another plan's lines kept."""
    from hyperplan.api.models import Reservation
    kube = FakeKube(hold_first_write=threading.Event())
    kube.add_pool("remote-a", 8)
    kube.add_pool("remote-b", 8)
    kube.pools["remote-a"]["status"]["reservations"] = [
        Reservation(training_plan="kept", training_plan_uid="uid-kept", reserved_capacity_id="rc-kept",
                    start_time=T, end_time=T + timedelta(days=1), instance_count=1).wire()]
    ledger = KubeLedger(kube)  # type: ignore[arg-type]

    def line(name: str, hours: int = 24) -> Reservation:
        return Reservation(training_plan=name, training_plan_uid=f"uid-{name}", reserved_capacity_id=f"rc-{name}",
                           start_time=T, end_time=T + timedelta(hours=hours), instance_count=1,
                           remote_training_plan_arn=f"arn:aws:sagemaker:us-east-1:1:training-plan/hp-{name}")
    results: dict[str, Any] = {}

    def record(pool: str, name: str, hours: int = 24) -> None:
        results[(pool, name, hours)] = ledger.record_remote(pool, name, f"uid-{name}", [line(name, hours)])
    first = threading.Thread(target=record, args=("remote-a", "one"))
    first.start()
    assert kube.first_write_started.wait(5)
    queued = [threading.Thread(target=record, args=a) for a in
              [("remote-a", "two"), ("remote-a", "three"), ("remote-b", "four"), ("remote-a", "one", 48)]]
    for q in queued:
        q.start()
    while len(ledger._records.waiting) < 4:
        threading.Event().wait(0.01)
    kube.hold_first_write.set()
    for t in [first, *queued]:
        t.join(10)

    assert [w[0] for w in kube.writes] == ["remote-a", "remote-a", "remote-b"]  # 5 records, 3 writes
    lines = {r["trainingPlan"]: r for r in kube.pools["remote-a"]["status"]["reservations"]}
    assert sorted(lines) == ["kept", "one", "three", "two"]
    assert lines["one"]["endTime"] == line("one", 48).wire()["endTime"]  # the later record of a plan wins
    assert [b.id for b in results[("remote-b", "four", 24)]] == ["rc-four"]
