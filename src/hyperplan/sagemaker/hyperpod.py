"""The HyperPod cluster operations, over InstanceGroups and their nodes.

This Kubernetes cluster is one HyperPod cluster, named by ``HYPERPLAN_CLUSTER_NAME``; its instance
groups are the InstanceGroups, and its instances their Nodes (from the watch cache). A node's
``InstanceId`` is ``i-`` and 17 hex digits of the SHA-256 of its name: stable for as long as the
node exists, and the same on every replica; its ``PrivateDnsHostname`` is EC2's private name of its
address (:func:`private_ip`). The cluster's ARN ends in 12 hex digits of the SHA-256 of its name,
as the model's pattern asks. Every answer keeps to botocore's model (the unit tests check each
against it: ``hyperplan_testing.botocore_shapes``).

The writes go to the API server as the key's identity (``access.Writes``):

* ``UpdateCluster`` applies what hyperplan models of the named groups (counts, Kubernetes labels
  and taints, deep checks, node recovery), adds a group for a new name, and refuses any other
  member by name before it writes (:func:`update_cluster`);
* ``BatchReplaceClusterNodes`` labels each node as HyperPod's own manual replacement does
  (``sagemaker.amazonaws.com/node-health-status=UnschedulablePendingReplacement``): the group's
  pass then replaces it with a spare, or a new node, as it replaces any failed node;
* ``BatchRebootClusterNodes`` labels each node ``UnschedulablePendingReboot``, HyperPod's manual
  reboot: the group's pass promotes the spare of an active node and reboots the node through its
  provider, whatever its reboot budget (``planning.recovery``); back Ready, the label says
  ``Schedulable`` again.

The cluster's events are the Kubernetes Events of its groups and nodes, read as the key's identity
(:func:`list_cluster_events`).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from hyperplan.api.models import API_VERSION, InstanceGroup
from kubernetes.client.exceptions import ApiException

from hyperplan.api.vocabulary import (
    CHECK_IN_PROGRESS, HEALTH_PENDING_REBOOT, HEALTH_PENDING_REPLACEMENT, LABEL_SAGEMAKER_HEALTH, LABEL_ZONE,
    ULTRASERVER_INSTANCE_TYPE, from_rfc3339,
)
from hyperplan.planning import naming
from hyperplan.planning.nodefacts import NodeFacts, facts_of_dict
from hyperplan.sagemaker.wire import (
    bounded, compact, epoch, invalid, matching, not_found, one_of, page, required, time_of,
)

CLUSTER_NAME_OR_ARN = (r"((arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:cluster/[a-z0-9]{12})|"
                       r"([a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}))")
GROUP_NAME = r"[a-zA-Z0-9](-*[a-zA-Z0-9])*"
NODE_ID = r"i-[a-f0-9]{8}(?:[a-f0-9]{9})?"
TRAINING_PLAN_ARN = r"arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:training-plan/.*"
GROUP_STATUS = {"Waiting": "Creating", "Provisioning": "Updating", "Ready": "InService", "Draining": "Deleting",
                "Failed": "Degraded"}


EKS_CLUSTER_ARN: web.AppKey[str | None] = web.AppKey("eks-cluster-arn")
"""Where the app keeps the EKS cluster ARN DescribeCluster answers as ``Orchestrator.Eks.ClusterArn``
(the setting ``eks_cluster_arn``; ``sagemaker.replica`` sets it)."""
MAX_BATCH = 25  # node ids per BatchReboot/BatchReplace call, as the model bounds them
MAX_LABELS = 50  # the model's ClusterKubernetesLabels: at most 50, keys of 1-317, values of 1-63 characters
LABEL_KEY = (r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
             r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
LABEL_VALUE = r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"


def instance_id(node_name: str) -> str:
    return "i-" + hashlib.sha256(node_name.encode()).hexdigest()[:17]


def private_ip(node_name: str, node: Mapping[str, Any] | None = None) -> str:
    """The node's private IPv4 address: its ``InternalIP`` when its status lists one, else a
    stable stand-in in 10.0.0.0/8 (a digest of its name, the same on every replica), since the
    model's ``PrivateDnsHostname`` is made of an address and a node of the watch cache may
    carry none."""
    for address in ((node or {}).get("status") or {}).get("addresses") or []:
        if isinstance(address, Mapping) and address.get("type") == "InternalIP":
            try:
                found = ipaddress.ip_address(str(address.get("address")))
            except ValueError:
                continue
            if found.version == 4:
                return str(found)
    digest = hashlib.sha256(node_name.encode()).digest()
    return f"10.{digest[0]}.{digest[1]}.{1 + digest[2] % 254}"


def private_dns_hostname(ip: str, region: str) -> str:
    """EC2's private DNS name of an address (``ip-10-1-2-3.us-west-2.compute.internal``;
    ``ec2.internal`` in us-east-1), the model's ``ClusterPrivateDnsHostname`` pattern."""
    domain = "ec2.internal" if region == "us-east-1" else f"{region}.compute.internal"
    return f"ip-{ip.replace('.', '-')}.{domain}"


def cluster_id(cluster_name: str) -> str:
    return hashlib.sha256(cluster_name.encode()).hexdigest()[:12]


def _groups(ctx: Any) -> list[InstanceGroup]:
    found = []
    for obj in ctx.fleet.groups():
        try:
            found.append(InstanceGroup.model_validate(obj))
        except ValidationError:
            continue  # reported on the group itself by its pass
    return found


def _cluster(body: Mapping[str, Any], ctx: Any) -> None:
    """Check that the request names this cluster (by name or ARN)."""
    named = matching(body, "ClusterName", CLUSTER_NAME_OR_ARN, low=0, high=256) or required(body, "ClusterName")
    if named.startswith("arn:"):  # this cluster's ARN as handed out: this partition, region and account
        wanted = ctx.local(named, "cluster")
        found = wanted == cluster_id(ctx.cluster_name)
    else:
        found = named in (ctx.cluster_name, cluster_id(ctx.cluster_name))
    if not found:
        raise not_found(f"Cluster {named} not found.")


def _created(ctx: Any) -> datetime:
    """When the cluster began, as far as hyperplan knows: its oldest InstanceGroup (now, with none)."""
    times = []
    for group in _groups(ctx):
        try:
            times.append(from_rfc3339(group.metadata.get("creationTimestamp") or ""))
        except ValueError:
            continue
    return min(times, default=ctx.now)


def cluster_arn(ctx: Any) -> str:
    return ctx.arn("cluster", cluster_id(ctx.cluster_name))


def _nodes(ctx: Any) -> Iterator[tuple[InstanceGroup, NodeFacts, Mapping[str, Any]]]:
    for group in _groups(ctx):
        for node in ctx.fleet.group_nodes(naming.label_value(group.metadata["name"])):
            yield group, facts_of_dict(node), node


def _status(facts: NodeFacts) -> dict[str, str]:
    if facts.deleting:
        return {"Status": "ShuttingDown", "Message": "the node is being deleted"}
    if facts.is_unhealthy:
        return {"Status": "Failure", "Message": f"health: {facts.unschedulable_health}"}
    if not facts.is_ready:
        return {"Status": "Pending", "Message": f"Ready is {facts.ready_status}"}
    if facts.deep_check == CHECK_IN_PROGRESS:
        return {"Status": "DeepHealthCheckInProgress", "Message": "the node's deep health checks run"}
    return {"Status": "Running"}


def _ultra_type(ctx: Any, group: InstanceGroup) -> str | None:
    plan = ctx.fleet.plan(group.spec.training_plan_ref)
    return ((plan or {}).get("spec") or {}).get("ultraServerType")


def node_summary(ctx: Any, group: InstanceGroup, facts: NodeFacts,
                 node: Mapping[str, Any] | None = None) -> dict[str, Any]:
    ultra = {"Id": facts.ultraserver_id, "Type": _ultra_type(ctx, group)} if facts.ultraserver_id else None
    return compact({
        "InstanceGroupName": group.metadata["name"], "InstanceId": instance_id(facts.name),
        "InstanceType": group.spec.instance_type, "LaunchTime": epoch(facts.created),
        "InstanceStatus": _status(facts), "UltraServerInfo": compact(ultra) if ultra else None,
        "PrivateDnsHostname": private_dns_hostname(private_ip(facts.name, node), ctx.region),
    })


def model_labels(labels: Mapping[str, Any]) -> dict[str, str]:
    """Kubernetes labels as the model's ``ClusterKubernetesLabels`` can carry them: at most 50,
    each key and value of the model's patterns and lengths. An empty value (Kubernetes allows
    it; the model's values are 1 to 63 characters) has no place there and is left out."""
    kept = {k: v for k, v in sorted(labels.items())
            if isinstance(k, str) and isinstance(v, str) and 1 <= len(k) <= 317 and 1 <= len(v) <= 63
            and re.fullmatch(LABEL_KEY, k) and re.fullmatch(LABEL_VALUE, v)}
    return dict(list(kept.items())[:MAX_LABELS])


def model_taints(taints: Any) -> list[dict[str, str]]:
    """Kubernetes taints as the model's ``ClusterKubernetesTaint`` list (at most 50; an empty
    value left out, as the model's value is optional but at least one character)."""
    out = []
    for t in taints or []:
        if not isinstance(t, Mapping) or t.get("effect") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            continue
        out.append(compact({"Key": t.get("key"), "Value": t.get("value") or None, "Effect": t.get("effect")}))
    return out[:MAX_LABELS]


def group_status(group: InstanceGroup) -> str:
    return GROUP_STATUS.get(group.status.phase or "Waiting", "Creating")


def cluster_status(groups: list[InstanceGroup]) -> str:
    """The cluster's ``ClusterStatus`` from its groups: ``Updating`` while any group is being made,
    scaled or drained; ``Failed`` when every group failed; else ``InService``. A group that failed
    beside others that serve is ``Degraded`` on the group itself (the model's cluster statuses have
    no degraded one) and named in the cluster's ``FailureMessage``."""
    statuses = {group_status(g) for g in groups}
    if statuses & {"Creating", "Updating", "Deleting"}:
        return "Updating"
    return "Failed" if statuses == {"Degraded"} else "InService"


def _failure_message(groups: list[InstanceGroup]) -> str | None:
    failed = []
    for g in groups:
        if g.status.phase != "Failed":
            continue
        why = next((c.message for c in g.status.conditions if c.status == "False" and c.message), None)
        failed.append(f"{g.metadata['name']}: {why}" if why else g.metadata["name"])
    return ("instance groups failed: " + "; ".join(failed))[:1024] if failed else None


def node_recovery(groups: list[InstanceGroup]) -> str | None:
    """The cluster's ``NodeRecovery``: the groups' own when they agree (``Automatic`` with none,
    hyperplan's default). The model has one value per cluster and hyperplan one per group: groups
    that differ answer none rather than a value that is wrong for some of them."""
    values = {g.spec.node_recovery for g in groups}
    return "Automatic" if not values else values.pop() if len(values) == 1 else None


def _on_every_node(nodes: list[Mapping[str, Any]], labels: Mapping[str, str],
                   taints: list[Mapping[str, Any]]) -> tuple[dict[str, str], list[Mapping[str, Any]]]:
    """The group's labels and taints that every node of it carries (what is applied, not only asked)."""
    node_labels = [(n.get("metadata") or {}).get("labels") or {} for n in nodes]
    node_taints = [{(t.get("key"), t.get("value") or "", t.get("effect"))
                    for t in (n.get("spec") or {}).get("taints") or []} for n in nodes]
    on_labels = {k: v for k, v in labels.items() if all(held.get(k) == v for held in node_labels)}
    on_taints = [t for t in taints if all((t.get("key"), t.get("value") or "", t.get("effect")) in held
                                          for held in node_taints)]
    return on_labels, on_taints


def group_details(ctx: Any, group: InstanceGroup) -> dict[str, Any]:
    """One group as DescribeCluster's ``ClusterInstanceGroupDetails``: counts, status, its training
    plan, the Kubernetes labels and taints it puts on its nodes (desired: the spec; current: those
    every node carries now) and its deep health checks."""
    nodes = ctx.fleet.group_nodes(naming.label_value(group.metadata["name"]))
    plan = ctx.fleet.plan(group.spec.training_plan_ref)
    taints = [t.model_dump(by_alias=True) for t in group.spec.taints]
    current_labels, current_taints = _on_every_node(nodes, group.spec.labels, taints)
    config = compact({"CurrentLabels": model_labels(current_labels), "DesiredLabels": model_labels(group.spec.labels),
                      "CurrentTaints": model_taints(current_taints), "DesiredTaints": model_taints(taints)})
    return compact({
        "InstanceGroupName": group.metadata["name"], "InstanceType": group.spec.instance_type,
        "CurrentCount": len(nodes), "TargetCount": group.spec.instance_count, "Status": group_status(group),
        "TrainingPlanArn": ctx.arn("training-plan", group.spec.training_plan_ref),
        "TrainingPlanStatus": ((plan or {}).get("status") or {}).get("phase"),
        "OnStartDeepHealthChecks": list(group.spec.on_start_deep_health_checks) or None,
        "KubernetesConfig": {k: v for k, v in config.items() if v} or None,
    })


def describe_cluster(body: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
    """The cluster as its groups have it: their details, the cluster's status from theirs
    (:func:`cluster_status`), ``NodeRecovery`` as they have it, and ``Orchestrator.Eks.ClusterArn``
    when the setting names one."""
    _cluster(body, ctx)
    groups = _groups(ctx)
    orchestrator = {"Eks": {"ClusterArn": ctx.eks_cluster_arn}} if getattr(ctx, "eks_cluster_arn", None) else None
    return compact({"ClusterArn": cluster_arn(ctx), "ClusterName": ctx.cluster_name,
                    "ClusterStatus": cluster_status(groups), "FailureMessage": _failure_message(groups),
                    "CreationTime": epoch(_created(ctx)), "InstanceGroups": [group_details(ctx, g) for g in groups],
                    "Orchestrator": orchestrator, "NodeRecovery": node_recovery(groups)})


def list_clusters(body: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
    """This one cluster, if it passes the request's filters (its name, a training plan one of its
    groups is bound to, its creation time strictly between the bounds), paged as the model says
    (every member checked as the model says: a ValidationException naming it)."""
    sort_by = one_of(body, "SortBy", ("CREATION_TIME", "NAME")) or "CREATION_TIME"
    order = one_of(body, "SortOrder", ("Ascending", "Descending")) or "Ascending"
    contains = matching(body, "NameContains", r"[a-zA-Z0-9\-]+", low=0, high=63)
    plan = matching(body, "TrainingPlanArn", TRAINING_PLAN_ARN, low=50)
    after, before = time_of(body, "CreationTimeAfter"), time_of(body, "CreationTimeBefore")
    created = _created(ctx)
    groups = _groups(ctx)
    summary = {"ClusterArn": cluster_arn(ctx), "ClusterName": ctx.cluster_name,
               "ClusterStatus": cluster_status(groups), "CreationTime": epoch(created),
               "TrainingPlanArns": sorted({ctx.arn("training-plan", g.spec.training_plan_ref) for g in groups})}
    shown = (not contains or contains in ctx.cluster_name) and (not plan or plan in summary["TrainingPlanArns"]) \
        and (after is None or created > after) and (before is None or created < before)
    key = [summary["CreationTime"], ctx.cluster_name] if sort_by == "CREATION_TIME" else [ctx.cluster_name]
    listed, token = page([(key, summary)] if shown else [], body, descending=order == "Descending")
    return compact({"ClusterSummaries": listed, "NextToken": token})


def list_cluster_nodes(body: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
    _cluster(body, ctx)
    sort_by = one_of(body, "SortBy", ("CREATION_TIME", "NAME")) or "CREATION_TIME"
    order = one_of(body, "SortOrder", ("Ascending", "Descending")) or "Ascending"
    contains = matching(body, "InstanceGroupNameContains", GROUP_NAME, high=63)
    after, before = time_of(body, "CreationTimeAfter"), time_of(body, "CreationTimeBefore")
    items = []
    for group, facts, node in _nodes(ctx):
        if contains and contains not in group.metadata["name"]:
            continue
        if (after and (facts.created is None or facts.created <= after)) or \
                (before and (facts.created is None or facts.created >= before)):
            continue
        summary = node_summary(ctx, group, facts, node)
        created = summary.get("LaunchTime") or 0.0
        key = [created, facts.name] if sort_by == "CREATION_TIME" else [facts.name]
        items.append((key, summary))
    shown, token = page(items, body, descending=order == "Descending")
    return compact({"ClusterNodeSummaries": shown, "NextToken": token})


def _node_by_id(ctx: Any, node_id: str) -> tuple[InstanceGroup, NodeFacts, Mapping[str, Any]] | None:
    return next(((g, f, n) for g, f, n in _nodes(ctx) if instance_id(f.name) == node_id), None)


def describe_cluster_node(body: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
    _cluster(body, ctx)
    node_id = matching(body, "NodeId", NODE_ID, high=256)
    if node_id is None:
        raise invalid("give NodeId (hyperplan's nodes have no logical ids)")
    found = _node_by_id(ctx, node_id)
    if found is None:
        raise not_found(f"Node {node_id} not found in cluster {ctx.cluster_name}.")
    group, facts, node = found
    details = node_summary(ctx, group, facts, node)
    zone = facts.labels.get(LABEL_ZONE)
    details.update(compact({"PrivatePrimaryIp": private_ip(facts.name, node),
                            "Placement": compact({"AvailabilityZone": zone}) if zone else None,
                            "KubernetesConfig": {
                                "CurrentLabels": model_labels((node.get("metadata") or {}).get("labels") or {}),
                                "CurrentTaints": model_taints((node.get("spec") or {}).get("taints"))}}))
    return {"NodeDetails": details}


# UpdateCluster's members hyperplan applies, or takes when they say what is so already; any other
# member given is refused by name before anything is written.
CLUSTER_MEMBERS = {"ClusterName", "InstanceGroups", "InstanceGroupsToDelete", "NodeRecovery", "Orchestrator"}
GROUP_MEMBERS = {"InstanceGroupName", "InstanceCount", "ExecutionRole", "InstanceType", "TrainingPlanArn",
                 "KubernetesConfig", "OnStartDeepHealthChecks"}
SERVED_CHECKS = ("InstanceStress", "InstanceConnectivity")  # hyperplan's deep checks (of the model's three)


def _refuse_others(given: Mapping[str, Any], served: set[str], where: str) -> None:
    others = sorted(k for k, v in given.items() if k not in served and v is not None)
    if others:
        raise invalid(f"{where}{', '.join(others)}: not applied by hyperplan (it applies "
                      f"{', '.join(sorted(served - {'ClusterName', 'InstanceGroupName'}))}); nothing was changed")


def _taints_of(config: Mapping[str, Any], where: str) -> list[dict[str, str]] | None:
    taints = config.get("Taints")
    if taints is None:
        return None
    if not isinstance(taints, list) or len(taints) > MAX_LABELS:
        raise invalid(f"{where}.KubernetesConfig.Taints must list at most {MAX_LABELS} taints")
    out = []
    for i, t in enumerate(taints, 1):
        at = f"{where}.KubernetesConfig.Taints.{i}"
        if not isinstance(t, Mapping):
            raise invalid(f"{at} must be a structure of Key, Value and Effect")
        _refuse_others(t, {"Key", "Value", "Effect"}, f"{at}: ")
        key = matching(t, "Key", LABEL_KEY, high=317) or required(t, "Key")
        value = matching(t, "Value", LABEL_VALUE, high=63)
        effect = one_of(t, "Effect", ("NoSchedule", "PreferNoSchedule", "NoExecute")) or required(t, "Effect")
        out.append({"key": key, "value": value or "", "effect": effect})
    return out


def _labels_of(config: Mapping[str, Any], where: str) -> dict[str, str] | None:
    labels = config.get("Labels")
    if labels is None:
        return None
    if not isinstance(labels, Mapping) or len(labels) > MAX_LABELS:
        raise invalid(f"{where}.KubernetesConfig.Labels must map at most {MAX_LABELS} labels")
    for key, value in labels.items():
        for text, pattern, high, what in ((key, LABEL_KEY, 317, "key"), (value, LABEL_VALUE, 63, "value")):
            if not isinstance(text, str) or not 1 <= len(text) <= high or re.fullmatch(pattern, text) is None:
                raise invalid(f"{where}.KubernetesConfig.Labels[{key!r}]: the {what} {text!r} is not 1 to {high} "
                              f"characters of the pattern {pattern}")
    return dict(labels)


def _group_patch(spec: Mapping[str, Any], group: InstanceGroup, ctx: Any, where: str) -> dict[str, Any]:
    """The merge patch of the group's spec that ``spec`` (a ClusterInstanceGroupSpecification)
    asks for; a ValidationException naming a member hyperplan does not apply, or a value it
    cannot take (another instance type or training plan than the group's is a new group)."""
    _refuse_others(spec, GROUP_MEMBERS, where)
    patch: dict[str, Any] = {}
    count = bounded(spec, "InstanceCount", 0, 6758)
    if count is None:
        raise invalid(f"{where}InstanceCount is required")
    if count != group.spec.instance_count:
        patch["instanceCount"] = count
    itype = spec.get("InstanceType")
    if itype is not None and itype != group.spec.instance_type:
        raise invalid(f"{where}InstanceType {itype!r}: group {group.metadata['name']} is of "
                      f"{group.spec.instance_type}; a group's instance type does not change (nothing was changed)")
    plan_arn = matching(spec, "TrainingPlanArn", TRAINING_PLAN_ARN, low=50)
    if plan_arn is not None and ctx.local(plan_arn, "training-plan") != group.spec.training_plan_ref:
        raise invalid(f"{where}TrainingPlanArn {plan_arn}: group {group.metadata['name']} is bound to training plan "
                      f"{group.spec.training_plan_ref}; its plan does not change (nothing was changed)")
    checks = spec.get("OnStartDeepHealthChecks")
    if checks is not None:
        if not isinstance(checks, list) or not 1 <= len(checks) <= 3 or \
                any(not isinstance(c, str) for c in checks):
            raise invalid(f"{where}OnStartDeepHealthChecks must list 1 to 3 checks")
        unserved = [c for c in checks if c not in SERVED_CHECKS]
        if unserved:
            raise invalid(f"{where}OnStartDeepHealthChecks {', '.join(map(str, unserved))}: hyperplan runs "
                          f"{' and '.join(SERVED_CHECKS)} only (nothing was changed)")
        wanted_checks = list(dict.fromkeys(checks))
        if wanted_checks != list(group.spec.on_start_deep_health_checks):
            patch["onStartDeepHealthChecks"] = wanted_checks
    config = spec.get("KubernetesConfig")
    if config is not None:
        if not isinstance(config, Mapping):
            raise invalid(f"{where}KubernetesConfig must be a structure of Labels and Taints")
        _refuse_others(config, {"Labels", "Taints"}, f"{where}KubernetesConfig.")
        labels = _labels_of(config, where.rstrip(": "))
        if labels is not None and labels != group.spec.labels:  # the labels are replaced: gone ones removed
            patch["labels"] = {**{k: None for k in group.spec.labels if k not in labels}, **labels}
        taints = _taints_of(config, where.rstrip(": "))
        if taints is not None and taints != [t.model_dump(by_alias=True) for t in group.spec.taints]:
            patch["taints"] = taints
    return patch


def update_cluster(body: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
    """Apply to the named groups what hyperplan models, as the caller: ``InstanceCount``, the
    Kubernetes labels and taints of ``KubernetesConfig`` (the whole set: labels not given are
    removed), ``OnStartDeepHealthChecks``, and the cluster's ``NodeRecovery`` (on every group).
    Every member is checked first: any other member, or a value hyperplan cannot take, is a
    ValidationException naming it and nothing is written. Then the groups are patched one by one;
    if the API server refuses one, those already patched are set back as they were, so a call
    changes all its groups or none."""
    _cluster(body, ctx)
    _refuse_others(body, CLUSTER_MEMBERS, "")
    if body.get("InstanceGroupsToDelete"):
        raise invalid("InstanceGroupsToDelete: not applied by hyperplan: delete the InstanceGroup with kubectl "
                      "(nothing was changed)")
    orchestrator = body.get("Orchestrator")
    if orchestrator is not None and orchestrator != ({"Eks": {"ClusterArn": ctx.eks_cluster_arn}}
                                                     if getattr(ctx, "eks_cluster_arn", None) else None):
        raise invalid("Orchestrator: the cluster's orchestrator does not change (nothing was changed)")
    recovery = one_of(body, "NodeRecovery", ("Automatic", "None"))
    wanted = body.get("InstanceGroups")
    if wanted is None and recovery is None:
        raise invalid("give InstanceGroups or NodeRecovery")
    if wanted is not None and (not isinstance(wanted, list) or not 1 <= len(wanted) <= 100):
        raise invalid("InstanceGroups must list 1 to 100 instance groups")
    known = {g.metadata["name"]: g for g in _groups(ctx)}
    patches: dict[str, dict[str, Any]] = {}
    new: dict[str, dict[str, Any]] = {}  # groups the call adds, by name: their InstanceGroup
    for i, spec in enumerate(wanted or [], 1):
        if not isinstance(spec, Mapping):
            raise invalid(f"InstanceGroups.{i} must be a structure (ClusterInstanceGroupSpecification), not {spec!r}")
        name = matching(spec, "InstanceGroupName", GROUP_NAME, high=63) or required(spec, "InstanceGroupName")
        if name in patches:
            raise invalid(f"InstanceGroups: {name} is named more than once")
        if name not in known:
            new[name] = _new_group(spec, ctx, f"InstanceGroups.{i} ({name}): ", recovery)
            patches[name] = {}
            continue
        patches[name] = _group_patch(spec, known[name], ctx, f"InstanceGroups.{i} ({name}): ")
    if recovery is not None:
        for name, group in known.items():
            if group.spec.node_recovery != recovery:
                patches.setdefault(name, {})["nodeRecovery"] = recovery
    _apply_together(ctx, {name: patch for name, patch in patches.items() if patch and name not in new}, known, new)
    return {"ClusterArn": cluster_arn(ctx)}


def _new_group(spec: Mapping[str, Any], ctx: Any, where: str, recovery: str | None) -> dict[str, Any]:
    """The InstanceGroup a new name in ``InstanceGroups`` makes, as AWS adds a group: bound to the
    training plan its ``TrainingPlanArn`` names (required: hyperplan's groups run on a plan), of
    that plan's instance type, with the counts, labels, taints and checks asked; created as the
    caller, so the API server's RBAC and admission decide whether the caller may."""
    _refuse_others(spec, GROUP_MEMBERS, where)
    plan_arn = matching(spec, "TrainingPlanArn", TRAINING_PLAN_ARN, low=50)
    if plan_arn is None:
        raise invalid(f"{where}TrainingPlanArn is required for a new instance group: hyperplan's groups run on a "
                      "training plan's capacity")
    plan_name = ctx.local(plan_arn, "training-plan")
    plan = ctx.fleet.plan(plan_name) if plan_name is not None else None
    if plan is None:
        raise not_found(f"{where}training plan {plan_arn} not found")
    plan_spec = plan.get("spec") or {}
    plan_type = ULTRASERVER_INSTANCE_TYPE if plan_spec.get("ultraServerType") else plan_spec.get("instanceType")
    itype = spec.get("InstanceType") or plan_type
    if itype != plan_type:
        raise invalid(f"{where}InstanceType {itype!r}: training plan {plan_name} holds {plan_type} instances")
    count = bounded(spec, "InstanceCount", 0, 6758)
    if count is None:
        raise invalid(f"{where}InstanceCount is required")
    body: dict[str, Any] = {"trainingPlanRef": plan_name, "instanceType": itype, "instanceCount": count}
    if recovery is not None:
        body["nodeRecovery"] = recovery
    scratch = InstanceGroup.model_validate({"metadata": {"name": "new"}, "spec": body})
    body.update(_group_patch({**spec, "InstanceType": itype, "TrainingPlanArn": plan_arn}, scratch, ctx, where))
    body = {k: v for k, v in body.items() if v is not None}
    if isinstance(body.get("labels"), dict):
        body["labels"] = {k: v for k, v in body["labels"].items() if v is not None}
    try:
        InstanceGroup.model_validate({"metadata": {"name": "new"}, "spec": body})
    except ValidationError as e:
        raise invalid(where + "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
                                        for err in e.errors())[:900]) from None
    name = matching(spec, "InstanceGroupName", GROUP_NAME, high=63)
    return {"apiVersion": API_VERSION, "kind": "InstanceGroup", "metadata": {"name": name}, "spec": body}


def _undo(patch: Mapping[str, Any], group: InstanceGroup) -> dict[str, Any]:
    """The merge patch that sets back what ``patch`` changed of ``group``'s spec."""
    held = group.spec.model_dump(by_alias=True)
    back: dict[str, Any] = {}
    for field, value in patch.items():
        if field == "labels":
            back["labels"] = {**{k: None for k in value if k not in group.spec.labels}, **group.spec.labels}
        else:
            back[field] = held.get(field)
    return back


def _apply_together(ctx: Any, patches: Mapping[str, Mapping[str, Any]], known: Mapping[str, InstanceGroup],
                    new: Mapping[str, dict[str, Any]] | None = None) -> None:
    """Patch the groups, then create the new ones; on a refusal, undo what was done (groups set
    back, groups created deleted), newest first, and raise the refusal."""
    done: list[str] = []
    made: list[str] = []
    try:
        for name, patch in patches.items():
            ctx.writes.patch_group(ctx.user, name, {"spec": dict(patch)})
            done.append(name)
        for name, body in (new or {}).items():
            ctx.writes.create_group(ctx.user, body)
            made.append(name)
    except Exception:
        for name in reversed(made):  # best effort: the refusal is what the caller is told
            try:
                ctx.writes.delete_group(ctx.user, name)
            except Exception:  # noqa: BLE001 - the others are still undone
                continue
        for name in reversed(done):
            try:
                ctx.writes.patch_group(ctx.user, name, {"spec": _undo(patches[name], known[name])})
            except Exception:  # noqa: BLE001 - the others are still set back
                continue
        raise


def batch_replace_cluster_nodes(body: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
    """Mark each node for replacement as HyperPod does, as the caller; a node not in the cluster
    is reported in ``Failed`` (``InstanceIdNotFound``) and the others still go."""
    return _label_nodes(body, ctx, HEALTH_PENDING_REPLACEMENT)


def batch_reboot_cluster_nodes(body: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
    """Ask for a reboot of each node as HyperPod's manual reboot does, as the caller; the same
    answers as :func:`batch_replace_cluster_nodes`."""
    return _label_nodes(body, ctx, HEALTH_PENDING_REBOOT)


def node_ids(body: Mapping[str, Any], most: int = MAX_BATCH) -> list[str]:
    """The request's ``NodeIds``: 1 to ``most`` ids of the model's pattern (a ValidationException
    naming the first that is not, before anything is done), each once, in the order given."""
    if body.get("NodeLogicalIds"):
        raise invalid("hyperplan's nodes have no logical ids: give NodeIds")
    ids = required(body, "NodeIds")
    if not isinstance(ids, list) or not 1 <= len(ids) <= most:
        raise invalid(f"1 validation error detected: Value at 'nodeIds' failed to satisfy constraint: Member must "
                      f"have length between 1 and {most}")
    for i, node_id in enumerate(ids, 1):
        if not isinstance(node_id, str) or not 1 <= len(node_id) <= 256 or re.fullmatch(NODE_ID, node_id) is None:
            raise invalid(f"1 validation error detected: Value '{node_id}' at 'nodeIds.{i}.member' failed to satisfy "
                          f"constraint: Member must satisfy regular expression pattern: {NODE_ID}")
    return list(dict.fromkeys(ids))


# How a refusal of one node's write reads in a batch's ``Failed`` (the model's error codes).
REFUSAL_CODES = {404: "InstanceIdNotFound", 409: "InstanceIdInUse", 403: "InvalidInstanceStatus",
                 422: "InvalidInstanceStatus"}


def _label_nodes(body: Mapping[str, Any], ctx: Any, value: str) -> dict[str, Any]:
    """Label each node named once; a node not in the cluster, being deleted, or whose write the
    API server refuses is reported in ``Failed`` and the others are still done."""
    _cluster(body, ctx)
    ids = node_ids(body)
    nodes = {instance_id(f.name): f for _, f, _ in _nodes(ctx)}
    done, failed = [], []
    for node_id in ids:
        facts = nodes.get(node_id)
        if facts is None:
            failed.append({"NodeId": node_id, "ErrorCode": "InstanceIdNotFound",
                           "Message": f"no node {node_id} in cluster {ctx.cluster_name}"})
            continue
        if facts.deleting:
            failed.append({"NodeId": node_id, "ErrorCode": "InvalidInstanceStatus",
                           "Message": f"node {node_id} is being deleted"})
            continue
        try:
            ctx.writes.label_node(ctx.user, facts.name, {LABEL_SAGEMAKER_HEALTH: value})
        except ApiException as e:
            failed.append({"NodeId": node_id, "ErrorCode": REFUSAL_CODES.get(e.status or 0, "InternalServerError"),
                           "Message": f"node {node_id}: the API server answered {e.status} {e.reason}"[:1000]})
            continue
        done.append(node_id)
    return compact({"Successful": done or None, "Failed": failed})


# --------------------------------------------------------------------------- events

EVENT_ID = r"[a-f0-9]{8}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{12}"
EVENT_KINDS = ("Cluster", "InstanceGroup", "Instance")


def _event_id(event: Mapping[str, Any]) -> str:
    """An Event's ``EventId``: its uid (a UUID, as the model's pattern is), else a UUID made of
    its namespace and name."""
    meta = event.get("metadata") or {}
    uid = str(meta.get("uid") or "").lower()
    if re.fullmatch(EVENT_ID, uid):
        return uid
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{meta.get('namespace')}/{meta.get('name')}"))


def _event_time(event: Mapping[str, Any]) -> datetime | None:
    for text in (event.get("lastTimestamp"), event.get("eventTime"), event.get("firstTimestamp"),
                 (event.get("metadata") or {}).get("creationTimestamp")):
        if text:
            try:
                return from_rfc3339(str(text))
            except ValueError:
                continue
    return None


def _cluster_events(ctx: Any) -> list[dict[str, Any]]:
    """The Kubernetes Events of this cluster's groups and of their nodes (read as the caller), as
    the model's ClusterEventSummary: a group's ``InstanceGroup``, a node's ``Instance`` (by its
    instance id and group); ``Warning`` is ``Warn``, the rest ``Info``; the description is the
    Event's reason and message. Events of objects that are gone are not answered."""
    groups = {g.metadata["name"] for g in _groups(ctx)}
    node_groups = {f.name: g.metadata["name"] for g, f, _ in _nodes(ctx)}
    out = []
    for event in ctx.writes.cluster_events(ctx.user):
        involved = event.get("involvedObject") or {}
        kind, name = involved.get("kind"), involved.get("name")
        when = _event_time(event)
        if when is None:
            continue
        if kind == "InstanceGroup" and name in groups:
            where = {"ResourceType": "InstanceGroup", "InstanceGroupName": name}
        elif kind == "Node" and name in node_groups:
            where = {"ResourceType": "Instance", "InstanceGroupName": node_groups[name],
                     "InstanceId": instance_id(name)}
        else:
            continue
        text = ": ".join(str(v) for v in (event.get("reason"), event.get("message")) if v)
        out.append(compact({"EventId": _event_id(event), "ClusterArn": cluster_arn(ctx),
                            "ClusterName": ctx.cluster_name, **where, "EventTime": epoch(when),
                            "Description": text[:4096] or None,
                            "EventLevel": "Warn" if event.get("type") == "Warning" else "Info"}))
    return out


def list_cluster_events(body: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
    """ListClusterEvents: the cluster's events (:func:`_cluster_events`), filtered by group, node,
    resource type and time (strict bounds), sorted by time (ascending by default), paged."""
    _cluster(body, ctx)
    group = matching(body, "InstanceGroupName", GROUP_NAME, high=63)
    node = matching(body, "NodeId", NODE_ID, high=256)
    kind = one_of(body, "ResourceType", EVENT_KINDS)
    one_of(body, "SortBy", ("EventTime",))
    order = one_of(body, "SortOrder", ("Ascending", "Descending")) or "Ascending"
    matching(body, "OperationId", EVENT_ID, high=36)
    after, before = time_of(body, "EventTimeAfter"), time_of(body, "EventTimeBefore")
    items = []
    for event in _cluster_events(ctx):
        if (group and event.get("InstanceGroupName") != group) or (node and event.get("InstanceId") != node) \
                or (kind and event["ResourceType"] != kind) or body.get("OperationId") \
                or (after and event["EventTime"] <= after.timestamp()) \
                or (before and event["EventTime"] >= before.timestamp()):
            continue
        items.append(([event["EventTime"], event["EventId"]], event))
    shown, token = page(items, body, descending=order == "Descending")
    return compact({"Events": shown, "NextToken": token})


def describe_cluster_event(body: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
    _cluster(body, ctx)
    wanted = matching(body, "EventId", EVENT_ID, high=36) or required(body, "EventId")
    found = next((e for e in _cluster_events(ctx) if e["EventId"] == wanted), None)
    if found is None:
        raise not_found(f"Event {wanted} not found in cluster {ctx.cluster_name}.")
    return {"EventDetails": found}
