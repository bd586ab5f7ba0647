"""Lending static nodes: which free node is taken, what adoption writes, what hand-back restores,
which pods a drain leaves alone (planning.lending, pure)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import pytest

from hyperplan.planning import lending
from hyperplan.planning import naming

READY = {"Ready": "True"}
ME = lending.OperatorIdentity(pod_name="hyperplan-7d9-abc", namespace="hyperplan-system", node_name="worker-op",
                         pod_labels={"app.kubernetes.io/name": "hyperplan", "app.kubernetes.io/instance": "hp"})
GROUP_TAINT = naming.Taint("example.com/dedicated", "frontier", "NoSchedule")
ADMIN_TAINT = naming.Taint("example.com/maintenance-window", "sunday", "PreferNoSchedule")


def free(name: str, **kw) -> lending.PoolNode:
    kw.setdefault("conditions", READY)
    kw.setdefault("labels", {lending.LABEL_POOL: lending.POOL_FREE, naming.LABEL_INSTANCE_TYPE: "ml.p5.48xlarge",
                             naming.LABEL_ZONE: "us-east-1a"})
    return lending.PoolNode(name=name, resource_version="41", **kw)


# --------------------------------------------------------------------------- which free nodes may be lent


@pytest.mark.parametrize("node, operator_nodes, why", [
    (free("w1"), (), None),
    (free("w1", unschedulable=True), (), "is cordoned"),
    (free("w1", conditions={"Ready": "Unknown"}), (), "is not Ready (Unknown)"),
    (free("w1", conditions={}), (), "is not Ready (no Ready condition)"),
    (free("w1", conditions={"Ready": "True", "AcceleratedHardwareReady": "False"}), (),
     "has AcceleratedHardwareReady=False"),
    (free("w1", labels={naming.LABEL_HEALTH: "UnschedulablePendingReplacement"}), (),
     "is labelled hyperplan.dev/node-health-status=UnschedulablePendingReplacement"),
    (free("w1", labels={naming.LABEL_SAGEMAKER_HEALTH: "Unschedulable"}), (),
     "is labelled sagemaker.amazonaws.com/node-health-status=Unschedulable"),
    (free("w1", labels={naming.LABEL_HEALTH: "Schedulable"}), (), None),
    (free("w1"), ("w1",), "runs the operator"),
    (free("w1", unschedulable=True), ("w1",), "runs the operator"),
    (free("w1", deleting=True), (), "is being deleted"),
], ids=["ready-and-schedulable", "cordoned-by-an-admin", "ready-unknown", "no-ready-condition", "gpu-failed",
        "hyperplan-health-label", "sagemaker-health-label", "schedulable-health-label", "runs-the-operator",
        "operator-reason-first", "being-deleted"])
def test_why_not_lendable(node, operator_nodes, why):
    assert lending.why_not_lendable(node, operator_nodes) == why


def test_choice_skips_the_operators_node_and_says_why():
    nodes = [free("worker-op"), free("worker-a"), free("worker-b", unschedulable=True)]
    choice = lending.choose_free_node("hp-g-x-0", nodes, operator_nodes={"worker-op"})
    assert choice.node.name == "worker-a"
    assert choice.explain() == "worker-b is cordoned; worker-op runs the operator"


def test_choice_is_none_when_every_node_is_skipped():
    choice = lending.choose_free_node("hp-g-x-0", [free("worker-op")], operator_nodes={"worker-op"})
    assert choice.node is None and choice.skipped == {"worker-op": "runs the operator"}


def test_parallel_adoptions_of_one_process_never_share_a_node():
    """The creates of one pass claim their node before patching: each gets its own."""
    nodes = [free(f"w{i}") for i in range(4)]
    claimed: set[str] = set()
    for node_id in (f"hp-g-x-{i}" for i in range(4)):
        choice = lending.choose_free_node(node_id, nodes, claimed=claimed)
        claimed.add(choice.node.name)
    assert claimed == {"w0", "w1", "w2", "w3"}
    assert lending.choose_free_node("hp-g-x-4", nodes, claimed=claimed).node is None


def test_each_node_id_has_its_own_reproducible_preference():
    """Rendezvous order: the same inputs give the same node; different node ids spread out, so two
    operators reading the same free list rarely reach for the same node."""
    nodes = [free(f"w{i}") for i in range(8)]
    first = {lending.choose_free_node(f"hp-g-x-{i}", nodes).node.name for i in range(8)}
    assert len(first) > 1
    assert lending.choose_free_node("hp-g-x-0", nodes).node == lending.choose_free_node("hp-g-x-0", list(reversed(nodes))).node


# --------------------------------------------------------------------------- UltraServer membership

US_KEY = naming.TOPOLOGY_ULTRASERVER_ID
OURS_0, OURS_1 = "rc-1-us-0", "rc-1-us-1"  # hyperplan's UltraServers


def cloud_pool(**sizes: int) -> list[lending.PoolNode]:
    """Free nodes of cloud UltraServers (``us_a=3``: 3 nodes carrying cloud id us-a), and
    ``none=n`` nodes that name none."""
    nodes = []
    for cloud, n in sizes.items():
        for i in range(n):
            labels = {lending.LABEL_POOL: lending.POOL_FREE}
            if cloud != "none":
                labels[US_KEY] = cloud.replace("_", "-")
            nodes.append(free(f"{cloud.replace('_', '-')}-{i}", labels=labels))
    return nodes


def cloud_of(choice: lending.Choice) -> str | None:
    return choice.node.labels.get(US_KEY) if choice.node is not None else None


@pytest.mark.parametrize("pool, ultraserver, bound, cloud", [
    (cloud_pool(us_a=2, us_b=4), OURS_0, {}, "us-b"),
    (cloud_pool(us_a=4, us_b=4), OURS_0, {OURS_0: "us-a"}, "us-a"),
    (cloud_pool(us_a=2, us_b=4), OURS_1, {OURS_0: "us-b"}, "us-a"),
    (cloud_pool(us_a=1, us_b=4), OURS_0, {OURS_0: "us-a", OURS_1: "us-b"}, "us-a"),
    (cloud_pool(us_b=4, none=1), OURS_0, {OURS_0: "us-a", OURS_1: "us-b"}, None),
    (cloud_pool(us_b=4), OURS_0, {OURS_0: "us-a", OURS_1: "us-b"}, "us-b"),
    (cloud_pool(none=3), OURS_0, {}, None),
], ids=["a-new-ultraserver-takes-the-largest-free-cloud-one", "bound-takes-its-own", "skips-one-bound-to-another",
        "bound-takes-its-own-even-when-smaller", "then-a-node-naming-none", "last-one-bound-to-another",
        "no-cloud-ids-plain-order"])
def test_a_node_on_an_ultraserver_comes_from_the_cloud_ultraserver_behind_it(pool, ultraserver, bound, cloud):
    choice = lending.choose_free_node(f"hp-g-{ultraserver}-0", pool,
                                      membership=lending.Membership(US_KEY, ultraserver, bound))
    assert choice.node is not None and cloud_of(choice) == cloud


def test_without_cloud_ids_the_membership_keeps_the_rendezvous_order():
    nodes = [free(f"w{i}") for i in range(8)]
    for i in range(8):
        node_id = f"hp-g-x-{i}"
        assert (lending.choose_free_node(node_id, nodes, membership=lending.Membership(US_KEY, OURS_0)).node
                == lending.choose_free_node(node_id, nodes).node)


def test_the_nodes_of_one_pass_fill_one_cloud_ultraserver_each():
    """Two of hyperplan's UltraServers of 4 nodes each, chosen in turns from three cloud UltraServers
    of 4, 4 and 3 free nodes, as one process's creates do (each choice binds its UltraServer)."""
    pool = cloud_pool(us_a=4, us_b=4, us_c=3)
    claimed: set[str] = set()
    bound: dict[str, str] = {}
    got: dict[str, list[str]] = {OURS_0: [], OURS_1: []}
    for i in range(4):
        for ours in (OURS_0, OURS_1):
            choice = lending.choose_free_node(f"hp-g-{ours}-{i}", pool, claimed=claimed,
                                              membership=lending.Membership(US_KEY, ours, dict(bound)))
            claimed.add(choice.node.name)
            bound.setdefault(ours, cloud_of(choice))
            got[ours].append(cloud_of(choice))
    assert {ours: set(clouds) for ours, clouds in got.items()} == {OURS_0: {bound[OURS_0]}, OURS_1: {bound[OURS_1]}}
    assert {bound[OURS_0], bound[OURS_1]} == {"us-a", "us-b"}


def test_the_cloud_ultraserver_a_held_node_had_comes_from_the_record():
    from hyperplan.api.models import GroupNode, LentState
    lent = GroupNode(name="w1", uid="u1", node_id="hp-g-0", lent=LentState(labels={US_KEY: "us-a"}))
    made = GroupNode(name="hp-g-1", uid="u2", node_id="hp-g-1")
    none = GroupNode(name="w2", uid="u3", node_id="hp-g-2", lent=LentState(absent_labels=[US_KEY]))
    assert [lending.cloud_ultraserver_before(e, US_KEY) for e in (lent, made, none, None)] == ["us-a", None, None, None]


# --------------------------------------------------------------------------- adoption, update, hand-back


def group_labels(**extra: str) -> dict[str, str]:
    return {"team": "frontier", naming.LABEL_INSTANCE_TYPE: "ml.p5.48xlarge", naming.LABEL_ZONE: "us-east-1a",
            naming.LABEL_HOSTNAME: "hp-g-x-0", naming.LABEL_GROUP: "g", naming.LABEL_PLAN: "p",
            naming.LABEL_RESERVED_CAPACITY: "rc-1", naming.LABEL_ROLE: "spare", naming.LABEL_HEALTH: "Schedulable",
            naming.LABEL_SLOT: "0", naming.LABEL_GENERATION: "0", **extra}


def applied(node: lending.PoolNode, patch: dict) -> lending.PoolNode:
    """``node`` after a JSON merge patch, as the API server would store it."""
    meta, spec = patch.get("metadata", {}), patch.get("spec", {})

    def merge(old, new):
        out = dict(old)
        for k, v in (new or {}).items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = v
        return out

    taints = node.taints
    if "taints" in spec:
        taints = tuple(naming.Taint(t["key"], t["value"], t["effect"]) for t in spec["taints"] or [])
    unschedulable = node.unschedulable
    if "unschedulable" in spec:
        unschedulable = bool(spec["unschedulable"])
    return lending.PoolNode(name=node.name, resource_version=str(int(node.resource_version) + 1),
                       labels=merge(node.labels, meta.get("labels")),
                       annotations=merge(node.annotations, meta.get("annotations")), taints=taints,
                       unschedulable=unschedulable, conditions=node.conditions)


def test_adoption_labels_taints_and_records_what_it_found():
    before = free("w1", labels={**free("w1").labels, "team": "infra"}, taints=(ADMIN_TAINT,))
    lent = lending.adoption_patch(before, "hp-g-x-0", group_labels(), (naming.SPARE_TAINT, GROUP_TAINT), {GROUP_TAINT.key})
    patch = lent.patch
    assert patch["metadata"]["resourceVersion"] == "41"  # a concurrent change makes the API server answer 409
    labels = patch["metadata"]["labels"]
    assert naming.LABEL_HOSTNAME not in labels  # a real node keeps its own hostname
    assert labels[lending.LABEL_POOL] == lending.POOL_HELD and labels[lending.LABEL_NODE_ID] == "hp-g-x-0"
    # the group again under a key the node's kubelet cannot set itself: what a pod may select by
    assert labels["node-restriction.kubernetes.io/hyperplan-instance-group"] == "g"
    assert labels["team"] == "frontier"
    assert patch["spec"] == {"taints": [
        {"key": ADMIN_TAINT.key, "value": "sunday", "effect": "PreferNoSchedule"},
        {"key": "hyperplan.dev/spare", "value": "true", "effect": "NoSchedule"},
        {"key": GROUP_TAINT.key, "value": "frontier", "effect": "NoSchedule"}]}
    assert "unschedulable" not in patch["spec"]  # cordoned nodes are never adopted; nothing to undo
    assert "annotations" not in patch["metadata"]  # the record is the operator's, not the node's
    assert dict(lent.record.labels) == {"team": "infra", naming.LABEL_INSTANCE_TYPE: "ml.p5.48xlarge",
                                        naming.LABEL_ZONE: "us-east-1a"}
    assert list(lent.record.taint_keys) == sorted([GROUP_TAINT.key, naming.SPARE_TAINT.key, naming.UNHEALTHY_TAINT.key])
    assert lending.LentRecord.from_state(lent.record.state()) == lent.record  # as the group's status keeps it


@dataclass(frozen=True)
class Holding:
    """A lent node and the operator's record of it (``GroupNode.lent`` and ``.cordoned``)."""

    node: lending.PoolNode
    record: lending.LentRecord
    cordoned: bool = False


# Each case: the free node, what happens while the group holds it, and what it must look like after.
def _held(node: lending.PoolNode, *steps) -> Holding:
    lent = lending.adoption_patch(node, "hp-g-x-0", group_labels(), (naming.SPARE_TAINT, GROUP_TAINT), {GROUP_TAINT.key})
    held = Holding(applied(node, lent.patch), lent.record)
    for step in steps:
        held = step(held)
    return held


def drained_by_hyperplan(held: Holding) -> Holding:
    patch = lending.cordon_patch(held.node)  # None when the node is cordoned already
    return held if patch is None else replace(held, node=applied(held.node, patch), cordoned=True)


def cordoned_by_admin(held: Holding) -> Holding:
    return replace(held, node=applied(held.node, {"spec": {"unschedulable": True}}))


def promoted_and_relabelled(held: Holding) -> Holding:
    """A spare promoted (hyperplan.dev/replaces set directly), then the group's labels changed."""
    node = held.node
    keep = [{"key": t.key, "value": t.value, "effect": t.effect} for t in node.taints if t != naming.SPARE_TAINT]
    node = applied(node, {"metadata": {"labels": {naming.LABEL_ROLE: "active", naming.LABEL_REPLACES: "hp-g-x-1"}},
                          "spec": {"taints": keep}})
    labels = group_labels(**{"cost-center": "42", naming.LABEL_ROLE: "active"})
    extra = naming.Taint("example.com/gpu-class", "h100", "NoExecute")
    change = lending.held_update_patch(node, "hp-g-x-0", labels, (GROUP_TAINT, extra), {GROUP_TAINT.key, extra.key},
                                       held.record)
    return replace(held, node=applied(node, change.patch), record=change.record)


def marked_unhealthy(held: Holding) -> Holding:
    node = held.node
    return replace(held, node=applied(node, {
        "metadata": {"labels": {naming.LABEL_HEALTH: "UnschedulablePendingReplacement"}},
        "spec": {"taints": [{"key": t.key, "value": t.value, "effect": t.effect}
                            for t in (*node.taints, naming.UNHEALTHY_TAINT)]}}))


@pytest.mark.parametrize("steps, unschedulable, health, says", [
    ((drained_by_hyperplan,), False, None, "uncordoned (hyperplan had cordoned it)"),
    ((cordoned_by_admin,), True, None, "left cordoned (not cordoned by hyperplan)"),
    ((cordoned_by_admin, drained_by_hyperplan), True, None, "left cordoned"),
    ((), False, None, "handed back to the free pool"),
    ((promoted_and_relabelled, drained_by_hyperplan), False, None, "uncordoned"),
    ((marked_unhealthy, drained_by_hyperplan), False, "UnschedulablePendingReplacement",
     "keeps hyperplan.dev/node-health-status=UnschedulablePendingReplacement"),
], ids=["drained-uncordoned", "admin-cordon-stays", "admin-cordon-then-drain-stays", "released-uncordoned-node",
        "labels-and-taints-changed-while-held", "failed-node-keeps-its-health-verdict"])
def test_hand_back_restores_the_node_as_it_was_lent(steps, unschedulable, health, says):
    before = free("w1", labels={**free("w1").labels, "team": "infra", "kubernetes.io/hostname": "w1"},
                  taints=(ADMIN_TAINT,), annotations={"node.alpha.kubernetes.io/ttl": "0"})
    held = _held(before, *steps)
    assert held.node.labels[naming.LABEL_GROUP] == "g"  # it was really lent
    assert held.node.labels[lending.LABEL_TRUSTED_GROUP] == "g"  # and goes at hand-back (want_labels lacks it)
    back = lending.hand_back(held.node, held.record, held.cordoned)
    after = applied(held.node, back.patch)
    want_labels = dict(before.labels)
    if health:
        want_labels[naming.LABEL_HEALTH] = health
    assert after.labels == want_labels
    assert after.taints == (ADMIN_TAINT,)
    assert after.annotations == before.annotations
    assert after.unschedulable is unschedulable
    assert says in back.message and back.message.startswith("w1 handed back to the free pool")


def test_hand_back_without_a_record_still_removes_what_hyperplan_owns():
    """A node held without a record (a group from before the record): its own labels and taints go."""
    held = free("w1", labels={lending.LABEL_POOL: lending.POOL_HELD, naming.LABEL_GROUP: "g", naming.LABEL_ROLE: "spare",
                               lending.LABEL_NODE_ID: "hp-g-x-0", "keep": "me"},
                taints=(naming.SPARE_TAINT, naming.Taint("hyperplan.dev/other", "x", "NoSchedule"), ADMIN_TAINT),
                unschedulable=True)
    after = applied(held, lending.hand_back(held, None, False).patch)
    assert after.labels == {lending.LABEL_POOL: lending.POOL_FREE, "keep": "me"}
    assert after.taints == (ADMIN_TAINT,)
    assert after.unschedulable is True  # nobody recorded that hyperplan cordoned it


FORGED_LENT = json.dumps({"labels": {"node-role.kubernetes.io/control-plane": "", "node-restriction.kubernetes.io/tier":
                                     "gold", naming.LABEL_GROUP: "other-group", "team": "forged"},
                          "taintKeys": ["node.kubernetes.io/not-ready"],
                          "taints": [{"key": "node.kubernetes.io/not-ready", "value": "", "effect": "NoExecute"}]})
KUBERNETES_KEYS = ("node-role.kubernetes.io/control-plane", "node-restriction.kubernetes.io/tier",
                   "node.kubernetes.io/not-ready")


@pytest.mark.parametrize("annotations, unschedulable, record, cordoned, team, left_cordoned", [
    pytest.param({lending.ANNOTATION_LENT: FORGED_LENT}, False, lending.LentRecord(labels={"team": None}), False, None,
                 False, id="forged-lent-annotation"),
    pytest.param({lending.ANNOTATION_CORDONED: "true"}, True, lending.LentRecord(), False, "frontier", True,
                 id="forged-cordoned-annotation-keeps-an-admin-cordon"),
    pytest.param({}, True, lending.LentRecord(), True, "frontier", False, id="the-record-says-hyperplan-cordoned-it"),
    pytest.param({}, False, lending.LentRecord.load(FORGED_LENT), False, "forged", False,
                 id="a-record-with-kubernetes-keys-writes-none-of-them"),
])
def test_hand_back_writes_only_what_the_operators_record_says(annotations, unschedulable, record, cordoned, team,
                                                             left_cordoned):
    """What the node says about itself changes nothing; a Kubernetes-domain key is never written."""
    held = free("w1", labels={lending.LABEL_POOL: lending.POOL_HELD, naming.LABEL_GROUP: "g", "team": "frontier"},
                annotations=annotations, unschedulable=unschedulable)
    back = lending.hand_back(held, record, cordoned)
    written = set(back.patch["metadata"]["labels"])
    assert not written & set(KUBERNETES_KEYS)
    assert all(not t["key"].startswith("node.kubernetes.io/") for t in back.patch["spec"]["taints"] or [])
    after = applied(held, back.patch)
    assert after.labels.get(naming.LABEL_GROUP) is None  # never another group's label
    assert after.labels.get("team") == team  # a key the group set, as the record has it
    assert after.unschedulable is left_cordoned
    assert lending.ANNOTATION_LENT not in after.annotations and lending.ANNOTATION_CORDONED not in after.annotations


@pytest.mark.parametrize("key, kubernetes", [
    ("node-role.kubernetes.io/control-plane", True), ("kubernetes.io/hostname", True),
    ("node-restriction.kubernetes.io/tier", True), ("foo.k8s.io/x", True), ("k8s.io/x", True),
    ("kubernetes.io.example.com/x", False), ("example.com/kubernetes.io", False), ("team", False),
    ("hyperplan.dev/pool", False),
], ids=lambda v: str(v))
def test_kubernetes_domains_are_the_whole_prefix(key, kubernetes):
    assert lending.in_kubernetes_domain(key) is kubernetes


def test_unreadable_record_counts_as_none():
    assert lending.LentRecord.load("{not json") == lending.LentRecord()
    assert lending.LentRecord.load('{"labels": [1]}') == lending.LentRecord()


def test_cordon_patch_writes_nothing_of_its_own_and_leaves_an_existing_cordon_alone():
    patch = lending.cordon_patch(free("w1"))
    assert patch == {"metadata": {"resourceVersion": "41"}, "spec": {"unschedulable": True}}
    assert lending.cordon_patch(free("w1", unschedulable=True)) is None


# --------------------------------------------------------------------------- draining


def pod(name: str, ns: str = "default", **kw) -> lending.PodView:
    return lending.PodView(name=name, namespace=ns, node_name="w1", **kw)


OPERATOR_LABELS = {"app.kubernetes.io/name": "hyperplan", "app.kubernetes.io/instance": "hp"}


@pytest.mark.parametrize("p, me, outcome", [
    (pod("train-0"), ME, "evict"),
    (pod("train-0", terminating=True), ME, "terminating"),
    (pod("hyperplan-7d9-abc", "hyperplan-system"), ME, "the operator's own pod"),
    (pod("hyperplan-7d9-xyz", "hyperplan-system", labels=OPERATOR_LABELS), ME, "the operator's own pod"),
    (pod("lookalike", "team-a", labels=OPERATOR_LABELS), ME, "evict"),
    (pod("hyperplan-7d9-abc", "team-a"), ME, "evict"),
    (pod("op", "anywhere", labels=OPERATOR_LABELS), lending.OperatorIdentity(pod_labels=OPERATOR_LABELS),
     "the operator's own pod"),
    (pod("op", "anywhere", labels=OPERATOR_LABELS), lending.OperatorIdentity(), "evict"),
    (pod("kube-proxy-x", "kube-system", owner_kinds=("DaemonSet",)), ME, "a DaemonSet pod"),
    (pod("etcd-w1", "kube-system", mirror=True), ME, "a static pod"),
    (pod("train-1", owner_kinds=("ReplicaSet",)), ME, "evict"),
], ids=["workload", "already-terminating", "this-pod-by-name", "other-replica-by-labels",
        "lookalike-in-another-namespace", "same-name-other-namespace", "out-of-cluster-labels-any-namespace",
        "no-identity-protects-nothing", "daemonset", "static-pod", "replicaset"])
def test_sort_pods_for_drain(p, me, outcome):
    sort = lending.sort_pods_for_drain([p], me)
    got = ("evict" if sort.evict else "terminating" if sort.terminating else sort.left_alone[p.ref])
    assert got == outcome
    assert sort.waiting_for == (1 if outcome in ("evict", "terminating") else 0)


def test_operator_selector_is_the_pod_labels():
    assert ME.selector == "app.kubernetes.io/instance=hp,app.kubernetes.io/name=hyperplan"
    assert lending.OperatorIdentity().selector == ""
