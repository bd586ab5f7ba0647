"""Adopting free static nodes against a real API server: the resourceVersion guard makes racing
adopters (other processes, stale reads) take distinct nodes, and a lost race is no error."""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes.client.rest import ApiException

from hyperplan.actuation.kube import Kube, api_client
from hyperplan.actuation.providers.base import AdoptionConflict, NoFreeNode
from hyperplan.actuation.providers.static import StaticProvider, pool_node
from hyperplan.planning import lending
from hyperplan.planning import naming
from hyperplan.planning import placement
from tests.kube import Kubectl, eventually


def spec(name: str, itype: str, zone: str) -> placement.NodeSpec:
    return placement.NodeSpec(name, {naming.LABEL_GROUP: "g", naming.LABEL_ROLE: "active", naming.LABEL_INSTANCE_TYPE: itype,
                              naming.LABEL_ZONE: zone}, (), "active", None, itype, zone)


@pytest.fixture
def pool(crds: Kubectl, plane):
    """``make(count)``: that many free, Ready KWOK nodes of a fresh type and zone; deleted afterwards."""
    made: list[str] = []
    tag = uuid.uuid4().hex[:5]
    itype, zone = f"ml.adopt-{tag}.xlarge", f"us-adopt-{tag}"

    def make(count: int) -> list[str]:
        names = [f"adopt-{tag}-{i}" for i in range(count)]
        crds.apply([{"apiVersion": "v1", "kind": "Node",
                     "metadata": {"name": n, "annotations": {"kwok.x-k8s.io/node": "fake"},
                                  "labels": {lending.LABEL_POOL: lending.POOL_FREE, naming.LABEL_INSTANCE_TYPE: itype,
                                             naming.LABEL_ZONE: zone}}} for n in names])
        made.extend(names)
        kube = Kube(api_client(str(plane.kubeconfig)))
        eventually(lambda: len([n for n in StaticProvider(kube).free_nodes(itype, zone)
                                if lending.why_not_lendable(n) is None]) == count, timeout=60, what="free nodes Ready")
        return names

    yield make, itype, zone
    for n in made:
        crds.delete("node", n)


def test_a_stale_adoption_is_refused_and_the_next_choice_succeeds(pool, plane) -> None:
    make, itype, zone = pool
    make(2)
    kube = Kube(api_client(str(plane.kubeconfig)))
    a, b = StaticProvider(kube), StaticProvider(kube)  # two operators: no shared claims
    stale = {n.name: n for n in a.free_nodes(itype, zone)}
    taken = b.create(spec("hp-b-0", itype, zone)).name
    # A writes on what it read before B adopted the node: the API server refuses, nothing is written.
    with pytest.raises(ApiException) as refused:
        kube.core.patch_node(taken, lending.adoption_patch(stale[taken], "hp-a-0", spec("hp-a-0", itype, zone).labels,
                                                      (), ()).patch)
    assert refused.value.status == 409
    assert kube.core.read_node(taken).metadata.labels[lending.LABEL_NODE_ID] == "hp-b-0"
    # A's own create reads again and takes the other node.
    other = a.create(spec("hp-a-0", itype, zone)).name
    assert other != taken and set(stale) == {taken, other}
    # A node labelled with that id is not taken for it (a label proves nothing; the group's record
    # says what it holds, and planning does not create a recorded node again).
    with pytest.raises(NoFreeNode, match=f"no free node of {itype} in {zone}"):
        a.create(spec("hp-a-0", itype, zone))
    with pytest.raises(NoFreeNode, match=f"no free node of {itype} in {zone}"):
        a.create(spec("hp-a-1", itype, zone))


def test_eight_adopters_racing_for_three_nodes(pool, plane, caplog) -> None:
    """Eight adoptions at once from eight separate providers (as from separate processes):
    three win distinct nodes; the others learn there is no node left, or that they lost every
    race (retried on the next pass), and never see a raw 409."""
    caplog.set_level(logging.INFO, logger="hyperplan.actuation.providers.static")
    make, itype, zone = pool
    names = make(3)
    kube = Kube(api_client(str(plane.kubeconfig)))
    start = threading.Barrier(8)

    def adopt(i: int) -> str:
        provider = StaticProvider(kube)
        start.wait()
        try:
            return provider.create(spec(f"hp-r-{i}", itype, zone)).name
        except (NoFreeNode, AdoptionConflict) as e:
            return type(e).__name__

    with ThreadPoolExecutor(8) as pool_:
        outcomes = list(pool_.map(adopt, range(8)))
    won = [o for o in outcomes if o in names]
    assert sorted(won) == sorted(names), outcomes
    assert set(outcomes) - set(names) <= {"NoFreeNode", "AdoptionConflict"}
    holders = {n: kube.core.read_node(n).metadata.labels[lending.LABEL_NODE_ID] for n in names}
    assert len(set(holders.values())) == 3
    assert all(outcomes[int(node_id.rsplit("-", 1)[1])] == n for n, node_id in holders.items())
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_one_provider_never_reaches_for_a_node_twice(pool, plane) -> None:
    """The parallel creates of one pass share a provider: its claims keep them on distinct nodes.
    (A 409 may still happen and be retried: KWOK's status heartbeats change the node's
    resourceVersion too, as a kubelet's status updates do.)"""
    make, itype, zone = pool
    names = make(4)
    kube = Kube(api_client(str(plane.kubeconfig)))
    provider = StaticProvider(kube)
    start = threading.Barrier(4)

    def adopt(i: int) -> str:
        start.wait()
        return provider.create(spec(f"hp-p-{i}", itype, zone)).name

    with ThreadPoolExecutor(4) as pool_:
        got = list(pool_.map(adopt, range(4)))
    assert sorted(got) == sorted(names)
    assert {kube.core.read_node(n).metadata.labels[lending.LABEL_NODE_ID] for n in names} == {f"hp-p-{i}" for i in range(4)}
    assert provider._claims == set()  # every claim released


def test_a_node_running_the_operator_is_not_adopted(pool, plane, crds: Kubectl) -> None:
    make, itype, zone = pool
    names = make(1)
    ns = f"adopt-op-{uuid.uuid4().hex[:5]}"
    crds.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    labels = {"app.kubernetes.io/name": "hyperplan", "app.kubernetes.io/instance": "hp"}
    crds.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "op", "namespace": ns, "labels": labels},
                "spec": {"nodeName": names[0], "containers": [{"name": "c", "image": "operator"}]}})
    kube = Kube(api_client(str(plane.kubeconfig)))
    try:
        me = lending.OperatorIdentity(namespace=ns, pod_labels=labels)
        with pytest.raises(NoFreeNode, match=f"{names[0]} runs the operator"):
            StaticProvider(kube, me).create(spec("hp-o-0", itype, zone))
        # Another namespace's lookalike is not the operator: the node is lent.
        other = lending.OperatorIdentity(namespace="hyperplan-system", pod_labels=labels)
        assert StaticProvider(kube, other).create(spec("hp-o-0", itype, zone)).name == names[0]
        # NODE_NAME alone (no labels) protects the node the operator runs on.
        back = StaticProvider(kube).release(names[0])
        assert back.startswith(f"{names[0]} handed back to the free pool")
        with pytest.raises(NoFreeNode, match="runs the operator"):
            StaticProvider(kube, lending.OperatorIdentity(node_name=names[0])).create(spec("hp-o-1", itype, zone))
    finally:
        crds.run("delete", "namespace", ns, "--wait=false")


FORGED_LENT = ('{"labels": {"node-role.kubernetes.io/control-plane": "", "node-restriction.kubernetes.io/tier": "gold", '
               '"hyperplan.dev/instance-group": "other"}, "taintKeys": [], "taints": []}')


def test_the_hand_back_restores_from_the_record_and_checks_the_uid(pool, plane) -> None:
    """A forged lent record on the node changes nothing; a release naming another uid writes nothing."""
    make, itype, zone = pool
    [name] = make(1)
    kube = Kube(api_client(str(plane.kubeconfig)))
    provider = StaticProvider(kube)
    made = provider.create(spec("hp-f-0", itype, zone))
    assert (made.name, made.uid) == (name, kube.core.read_node(name).metadata.uid)
    kube.core.patch_node(name, {"metadata": {"annotations": {lending.ANNOTATION_LENT: FORGED_LENT,
                                                             naming.ANNOTATION_CORDONED: "true"}},
                                "spec": {"unschedulable": True}})  # an admin's cordon, and a forged note
    assert provider.release(name, "00000000-0000-0000-0000-000000000000", made.lent, False) == \
        f"{name} already handed back"
    assert kube.core.read_node(name).metadata.labels[lending.LABEL_POOL] == lending.POOL_HELD  # untouched
    provider.release(name, made.uid, made.lent, False)
    after = kube.core.read_node(name)
    assert after.metadata.labels[lending.LABEL_POOL] == lending.POOL_FREE
    for key in ("node-role.kubernetes.io/control-plane", "node-restriction.kubernetes.io/tier", naming.LABEL_GROUP):
        assert key not in after.metadata.labels, key
    assert after.spec.unschedulable is True  # hyperplan did not cordon it: the cordon stays


@pytest.mark.parametrize("labels, lent", [
    ({"hyperplan.dev/pool": "free"}, False),
    ({"node-restriction.kubernetes.io/hyperplan-pool": "free"}, True),
    ({"node-restriction.kubernetes.io/hyperplan-pool": "held"}, False),
    ({"hyperplan.dev/pool": "free", "node-restriction.kubernetes.io/hyperplan-pool": "held"}, False),
], ids=["old-key-only", "pool-key-free", "pool-key-held", "old-key-free-pool-key-held"])
def test_only_the_node_restriction_pool_key_lends_a_node(labels, lent, plane, crds: Kubectl) -> None:
    """A kubelet may set ``hyperplan.dev/*`` on its own Node, so that key no longer puts a node
    into the pool; ``node-restriction.kubernetes.io/hyperplan-pool=free``, which only an admin can
    set, does."""
    tag = uuid.uuid4().hex[:5]
    itype, zone, name = f"ml.key-{tag}.xlarge", f"us-key-{tag}", f"key-{tag}"
    crds.apply({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                             "labels": {**labels, naming.LABEL_INSTANCE_TYPE: itype, naming.LABEL_ZONE: zone}}})
    kube = Kube(api_client(str(plane.kubeconfig)))
    try:
        eventually(lambda: lending.why_not_lendable(pool_node(kube.core.read_node(name))) is None, timeout=60,
                   what="the node Ready")
        provider = StaticProvider(kube)
        if lent:
            assert provider.create(spec(f"hp-k-{tag}", itype, zone)).name == name
            held = kube.core.read_node(name).metadata.labels
            assert held[lending.LABEL_POOL] == lending.POOL_HELD
            assert held[lending.LABEL_TRUSTED_GROUP] == "g"
        else:
            with pytest.raises(NoFreeNode, match=f"no free node of {itype} in {zone}"):
                provider.create(spec(f"hp-k-{tag}", itype, zone))
            assert lending.LABEL_NODE_ID not in kube.core.read_node(name).metadata.labels
    finally:
        crds.delete("node", name)


def apply_cloud_nodes(crds: Kubectl, clouds: dict[str, str], itype: str, zone: str) -> None:
    """Free KWOK nodes of ``itype`` in ``zone``, each naming its cloud UltraServer (node -> id)."""
    crds.apply([{"apiVersion": "v1", "kind": "Node",
                 "metadata": {"name": n, "annotations": {"kwok.x-k8s.io/node": "fake"},
                              "labels": {lending.LABEL_POOL: lending.POOL_FREE, naming.LABEL_INSTANCE_TYPE: itype,
                                         naming.LABEL_ZONE: zone, naming.TOPOLOGY_ULTRASERVER_ID: c}}}
                for n, c in clouds.items()])


def test_one_ultraservers_nodes_come_from_one_cloud_ultraserver(plane, crds: Kubectl) -> None:
    """Free nodes of three cloud UltraServers (5, 5 and 3 free nodes, named so that the plain
    rendezvous order would mix them), and the creates of one pass for two of hyperplan's
    UltraServers of 4 nodes each, all at once through one provider: each of hyperplan's takes
    its nodes from one cloud UltraServer, not the other's. A restarted provider (no memory of
    its choices) adds a node where the group's record says the UltraServer's nodes came from."""
    tag = uuid.uuid4().hex[:5]
    itype, zone = f"ml.us-{tag}.xlarge", f"us-us-{tag}"
    clouds = {f"adopt-{tag}-{i}": f"cloud-{tag}-{c}" for i, c in enumerate("abcabcabcabab")}
    apply_cloud_nodes(crds, clouds, itype, zone)
    try:
        kube = Kube(api_client(str(plane.kubeconfig)))
        eventually(lambda: len([n for n in StaticProvider(kube).free_nodes(itype, zone)
                                if lending.why_not_lendable(n) is None]) == len(clouds), timeout=60,
                   what="free nodes Ready")

        def on(ours: str, i: int, bound: dict | None = None) -> placement.NodeSpec:
            base = spec(f"hp-{ours}-{i}", itype, zone)
            return placement.NodeSpec(base.name, {**base.labels, naming.TOPOLOGY_ULTRASERVER_ID: ours}, (), "active",
                                      ours, itype, zone, cloud_ultraservers=bound or {})

        provider = StaticProvider(kube)
        specs = [on(ours, i) for i in range(4) for ours in ("us-0", "us-1")]
        with ThreadPoolExecutor(8) as pool_:
            made = list(pool_.map(provider.create, specs))
        came_from: dict[str, set[str]] = {}
        for s, m in zip(specs, made):
            came_from.setdefault(s.ultraserver_id, set()).add(clouds[m.name])
            assert m.lent.labels[naming.TOPOLOGY_ULTRASERVER_ID] == clouds[m.name]  # the group's record keeps it
            # while lent, the node carries hyperplan's UltraServer id
            assert kube.core.read_node(m.name).metadata.labels[naming.TOPOLOGY_ULTRASERVER_ID] == s.ultraserver_id
        assert all(len(c) == 1 for c in came_from.values()), came_from
        bound = {ours: next(iter(c)) for ours, c in came_from.items()}
        assert set(bound.values()) == {f"cloud-{tag}-a", f"cloud-{tag}-b"}, bound  # the two with room for 4

        # Left free: one node of each of those two, three of the third. A new process knows only
        # the record: us-1's fifth node comes from us-1's cloud UltraServer, not from the third
        # (which a new UltraServer would take: it has the most free nodes).
        fifth = StaticProvider(kube).create(on("us-1", 4, bound))
        assert clouds[fifth.name] == bound["us-1"]
        assert clouds[StaticProvider(kube).create(on("us-2", 0, bound)).name] == f"cloud-{tag}-c"
    finally:
        for n in clouds:
            crds.delete("node", n)


def test_a_cloud_ultraserver_an_ended_block_used_is_free_for_the_next(plane, crds: Kubectl) -> None:
    """One provider (one process) lends two of hyperplan's UltraServers of block 1 from two cloud
    UltraServers of 4 free nodes each, hands every node back, then lends blocks 2 and 3 the same way
    from the same nodes: each UltraServer again from one cloud UltraServer (what an ended block
    chose does not count as taken for the next)."""
    tag = uuid.uuid4().hex[:5]
    itype, zone = f"ml.next-{tag}.xlarge", f"us-next-{tag}"
    clouds = {f"next-{tag}-{i}": f"cloud-{tag}-{'ab'[i % 2]}" for i in range(8)}
    apply_cloud_nodes(crds, clouds, itype, zone)
    try:
        kube = Kube(api_client(str(plane.kubeconfig)))
        provider = StaticProvider(kube)

        def free_count() -> int:
            return len([n for n in provider.free_nodes(itype, zone) if lending.why_not_lendable(n) is None])

        def lend_block(block: str) -> dict[str, set[str]]:
            eventually(lambda: free_count() == len(clouds), timeout=60, what="free nodes Ready")
            specs = []
            for i in range(4):
                for us in (f"{block}-us-0", f"{block}-us-1"):
                    base = spec(f"hp-{us}-{i}", itype, zone)
                    specs.append(placement.NodeSpec(
                        base.name, {**base.labels, naming.LABEL_RESERVED_CAPACITY: block,
                                    naming.TOPOLOGY_ULTRASERVER_ID: us}, (), "active", us, itype, zone))
            with ThreadPoolExecutor(8) as pool_:
                made = list(pool_.map(provider.create, specs))
            came_from: dict[str, set[str]] = {}
            for s, m in zip(specs, made):
                came_from.setdefault(s.ultraserver_id, set()).add(clouds[m.name])
            for m in made:
                provider.release(m.name, m.uid, m.lent)
            return came_from

        for block in (f"rc1-{tag}", f"rc2-{tag}", f"rc3-{tag}"):
            came_from = lend_block(block)
            assert all(len(c) == 1 for c in came_from.values()), (block, came_from)
            assert set.union(*came_from.values()) == {f"cloud-{tag}-a", f"cloud-{tag}-b"}, (block, came_from)
    finally:
        for n in clouds:
            crds.delete("node", n)
