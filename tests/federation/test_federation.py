"""One fleet sold to two clusters through the SageMaker API (docs/aws.md), on three local
control planes: the capacity cluster's hyperplan owns the pools and serves the API; each training
cluster's hyperplan has pools whose ``spec.source.sageMaker`` is that endpoint, with a key minted
for it on the capacity cluster and RBAC that lets it buy.

- 40 plans from both training clusters race for a fleet with room for 32 of them: the fleet is
  never overbooked, every plan with room is bought (32), and each bought block is the capacity
  cluster's own line for that plan;
- the capacity cluster's operator is killed with -9 while the purchases run and stays down for a
  while: the training clusters' plans show ``Reconciled=False`` with the endpoint's error, then
  converge, and no plan was bought twice (one live remote plan per training plan);
- each training cluster's group gets nodes on its remote block and drains before it ends;
- a key whose RBAC may only read buys nothing: its plan shows the refusal.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from datetime import timedelta

from hyperplan_testing.invariants import ledger_overbooking
from tests.e2e.scenarios import group_body, plan_body, pool_body, ts, utcnow, wait_phase
from tests.aws.keys import grant_plan_reads, mint_key, serving
from tests.federation.conftest import Cluster
from tests.kube import Kubectl, eventually

ZONE = "us-east-1f"
RACERS = 20  # per training cluster
FLEET = 8  # instances; 4 one-minute slots in each racer's window: room for 32 of the 40


def _aligned(moment):
    """On the demo profile's 5-second grid, so that a 4-minute window holds exactly 4 one-minute slots."""
    seconds = int(moment.timestamp())
    return moment.replace(microsecond=0) + timedelta(seconds=(-seconds) % 5)


def _buyer(capacity: Cluster, member: Cluster, tag: str, may_buy: bool = True) -> str:
    """A key on the capacity cluster for ``member``, its RBAC, and the Secret on ``member``."""
    ctx = capacity.context()
    user = f"{member.name}-{tag}" + ("" if may_buy else "-reader")
    key_id, secret = mint_key(ctx, user)
    # A buyer may create plans and nothing else (it then sees only its own: docs/sagemaker-api.md,
    # "Whose plans"); a reader may get and list them, and not buy.
    more = [{"apiGroups": ["hyperplan.dev"], "resources": ["trainingplans"], "verbs": ["create"]}] if may_buy else []
    grant_plan_reads(ctx, user, f"buyer-{user}", *more, reads=not may_buy)
    serving(ctx, key_id, secret)
    name = f"fleet-key-{tag}" + ("" if may_buy else "-reader")
    member.kubectl.apply([{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "default"},
                           "stringData": {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret}}])
    return name


def _remote_pool(name: str, itype: str, url: str, secret: str) -> dict:
    return {"apiVersion": "hyperplan.dev/v1alpha1", "kind": "CapacityPool", "metadata": {"name": name},
            "spec": {"instanceType": itype, "availabilityZone": ZONE,
                     "source": {"sageMaker": {"endpoint": url, "region": "us-east-1", "credentialsSecret": secret}}}}


def _plans(k: Kubectl, prefix: str) -> list[dict]:
    return [p for p in k.get("trainingplans")["items"] if p["metadata"]["name"].startswith(prefix)]


def _watch_conditions(k: Kubectl, prefix: str, stop: threading.Event, seen: list) -> None:
    while not stop.is_set():
        try:
            for p in _plans(k, prefix):
                for c in (p.get("status") or {}).get("conditions") or []:
                    if c["type"] == "Reconciled" and c["status"] == "False":
                        seen.append((p["metadata"]["name"], c["reason"], c["message"]))
        except AssertionError:
            pass
        stop.wait(1)


def test_one_fleet_sold_to_two_clusters(capacity: Cluster, training_a: Cluster, training_b: Cluster) -> None:
    tag = uuid.uuid4().hex[:5]
    itype, jobs_type = f"ml.fed-{tag}.xlarge", f"ml.fedjob-{tag}.xlarge"
    url = capacity.sagemaker_api_url
    cap = capacity.kubectl
    cap.create(pool_body(f"fleet-{tag}", itype, FLEET, az=ZONE))
    cap.create(pool_body(f"jobs-{tag}", jobs_type, 4, az=ZONE))
    members = (training_a, training_b)
    for m in members:
        secret = _buyer(capacity, m, tag)
        m.kubectl.create(_remote_pool(f"fleet-{tag}", itype, url, secret))
        m.kubectl.create(_remote_pool(f"jobs-{tag}", jobs_type, url, secret))
    reader_secret = _buyer(capacity, training_b, tag, may_buy=False)
    reader_type = f"ml.fedro-{tag}.xlarge"
    cap.create(pool_body(f"ro-{tag}", reader_type, 2, az=ZONE))
    training_b.kubectl.create(_remote_pool(f"ro-{tag}", reader_type, url, reader_secret))

    # A plan and a group on each training cluster, on the jobs pool: nodes when the block starts.
    job_start = utcnow().replace(microsecond=0) + timedelta(seconds=75)
    for m in members:
        m.kubectl.create(plan_body(f"job-{tag}", jobs_type, 2, duration="1m", autoPurchase=True,
                                   startTimeAfter=ts(job_start), endTimeBefore=ts(job_start + timedelta(minutes=5))))
        m.kubectl.create(group_body(f"job-{tag}", f"job-{tag}", jobs_type, 2))
    training_b.kubectl.create(plan_body(f"ro-{tag}", reader_type, 1, duration="1m", autoPurchase=True,
                                        startTimeAfter=ts(job_start)))

    # 40 racers, 20 from each cluster, created side by side.
    start = _aligned(utcnow() + timedelta(seconds=150))
    window = {"startTimeAfter": ts(start), "endTimeBefore": ts(start + timedelta(minutes=4))}
    stop, seen = threading.Event(), []
    watchers = [threading.Thread(target=_watch_conditions, args=(m.kubectl, f"race-{tag}", stop, seen), daemon=True)
                for m in members]

    def create(m: Cluster) -> None:
        for i in range(RACERS):
            m.kubectl.create(plan_body(f"race-{tag}-{i:02d}", itype, 1, duration="1m", autoPurchase=True, **window))
    creators = [threading.Thread(target=create, args=(m,)) for m in members]
    for t in creators + watchers:
        t.start()
    time.sleep(4)
    # The capacity cluster's operator dies mid-purchases and its endpoint is gone for a while.
    op = capacity.operator
    os.killpg(op.proc.pid, signal.SIGKILL)
    op.proc.wait()
    for t in creators:
        t.join()
    eventually(lambda: any(r == "RemoteUnavailable" for _, r, _ in seen), timeout=60, interval=1,
               what="a training plan showing the endpoint down")
    time.sleep(10)
    op.start()
    op.wait_alive()

    def settled() -> list[dict] | None:
        plans = [p for m in members for p in _plans(m.kubectl, f"race-{tag}")]
        bought = [p for p in plans if (p.get("status") or {}).get("phase") == "Scheduled"]
        return plans if len(plans) == 2 * RACERS and len(bought) == FLEET * 4 else None
    plans = eventually(settled, timeout=300, interval=2, what="32 of the 40 racers bought")
    stop.set()
    fleet = cap.get("capacitypool", f"fleet-{tag}")
    remote_plans = [p for p in cap.get("trainingplans")["items"] if p["metadata"]["name"].startswith("hp-")]
    # Each remote plan names the buyer whose key made it; a buyer's key (create only) is served its
    # own plans and no other's, and its cluster's plans converged on that alone.
    made_by = {(p["metadata"].get("annotations") or {}).get("hyperplan.dev/created-by") for p in remote_plans}
    assert made_by <= {f"{m.name}-{tag}" for m in members} and len(made_by) == 2, made_by

    # Never overbooked, and each bought block is the capacity cluster's own line for it.
    assert ledger_overbooking(fleet) == []
    lines = {r["reservedCapacityId"]: r for r in fleet["status"]["reservations"]}
    assert len(lines) == FLEET * 4
    for p in plans:
        st = p.get("status") or {}
        if st.get("phase") != "Scheduled":
            assert st.get("phase") == "Pending", st  # no room in its window: not bought, not failed
            continue
        [block] = st["reservedCapacity"]
        assert block["id"] in lines, block
        line = lines[block["id"]]
        assert (line["startTime"], line["endTime"]) == (block["startTime"], block["endTime"])
    # Nothing bought twice: one live remote plan per training plan, whatever the kill interrupted.
    live = [p for p in remote_plans if (p.get("status") or {}).get("phase") in ("Pending", "Scheduled", "Active")
            and p["spec"]["instanceType"] == itype]
    by_uid = {}
    for p in live:
        uid = p["metadata"]["name"].rsplit("-", 1)[0]
        by_uid.setdefault(uid, []).append(p["metadata"]["name"])
    assert all(len(v) == 1 for v in by_uid.values()), by_uid
    assert len([p for p in live if (p.get("status") or {}).get("phase") == "Scheduled"]) == FLEET * 4
    assert any(r == "RemoteUnavailable" and url in m for _, r, m in seen)

    # Each training cluster's group: nodes on the remote block, gone before its end.
    for m in members:
        block = wait_phase(m.kubectl, "trainingplan", f"job-{tag}", "Active", timeout=120)["reservedCapacity"][0]
        ready = wait_phase(m.kubectl, "instancegroup", f"job-{tag}", "Ready", timeout=120)
        nodes = m.kubectl.get("nodes", None, "-l", f"hyperplan.dev/instance-group=job-{tag}")["items"]
        assert len(nodes) == 2 and ready["readyCount"] == 2
        assert {n["metadata"]["labels"]["hyperplan.dev/reserved-capacity"] for n in nodes} == {block["id"]}
    for m in members:
        eventually(lambda m=m: not m.kubectl.get("nodes", None, "-l", f"hyperplan.dev/instance-group=job-{tag}")["items"],
                   timeout=180, interval=2, what=f"{m.name}'s job nodes drained at the block's end")

    # A key that may only read buys nothing.
    refused = eventually(lambda: next((c for c in (training_b.kubectl.get("trainingplan", f"ro-{tag}").get("status") or {})
                                       .get("conditions") or [] if c["type"] == "Reconciled" and c["status"] == "False"),
                                      None), timeout=60, what="the reader's plan refused")
    assert refused["reason"] == "RemoteRefused" and "AccessDenied" in refused["message"], refused
    assert not [p for p in cap.get("trainingplans")["items"] if p["spec"].get("instanceType") == reader_type]
    print(json.dumps({"bought": FLEET * 4, "remote_plans": len(remote_plans), "down_seen": len(seen)}))
