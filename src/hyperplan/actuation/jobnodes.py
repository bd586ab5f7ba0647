"""The side effects on a ``training-job`` plan's job nodes: carry out a
:class:`hyperplan.planning.trainingjobs.JobNodeDecision` and say what happened.

:func:`apply_job_nodes` runs on a worker thread (its calls go to the node provider, the
Eviction API and :class:`hyperplan.actuation.kueue.KueueWrites`); it owns no state and reads
none: the nodes it acts on are handed to it, and what it did comes back as
:class:`JobNodeFacts` (the Events to post, the nodes released, the nodes signalled), which the
Kueue admission pass (:mod:`hyperplan.controllers.kueue.admission`) records on the event loop. Drains go through
:func:`hyperplan.actuation.groups.drain_node` and the checkpoint signal through
:func:`hyperplan.actuation.groups.signal_checkpoint`, as a group's do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Mapping

from kubernetes import client

from hyperplan.actuation.groups import drain_node, signal_checkpoint
from hyperplan.actuation.kueue import KueueWrites
from hyperplan.actuation.pods import NodePods
from hyperplan.actuation.providers.base import NodeProvider
from hyperplan.api.models import GroupNode
from hyperplan.api.vocabulary import to_rfc3339
from hyperplan.planning import groups
from hyperplan.planning import trainingjobs
from hyperplan.planning.plans import Event

# The reasons of the plan's Events that are Warnings (the others are Normal).
WARNING_REASONS = frozenset({"NoSlotForWorkload", groups.REASON_CHECKPOINT})


@dataclass
class JobNodeFacts:
    """What one :func:`apply_job_nodes` did.

    ``events``: (reason, message) for the plan, in the order they happened; ``pod_events``:
    (pod, Event) for the pods asked to checkpoint; ``released``: the nodes removed;
    ``signalled``: the nodes that now carry the checkpoint signal; ``wrote``: whether any job
    node was written (the next pass then lists them from the API); ``evicting``: whether pods
    are still leaving a node to release (the pass looks again shortly).
    """

    events: list[tuple[str, str]] = field(default_factory=list)
    pod_events: list[tuple[Mapping, Event]] = field(default_factory=list)
    released: set[str] = field(default_factory=set)
    signalled: list[str] = field(default_factory=list)
    made: list[GroupNode] = field(default_factory=list)  # the nodes created, as the API server answered
    wrote: bool = False
    evicting: bool = False


def apply_job_nodes(provider: NodeProvider, pods: NodePods, writes: KueueWrites,
                    decision: trainingjobs.JobNodeDecision, block: trainingjobs.JobBlock | None,
                    nodes: Mapping[str, client.V1Node], already_signalled: bool, now: datetime,
                    claims: Mapping[str, str] | None = None) -> JobNodeFacts:
    """Create, hand over, keep warm, signal, release and drain as ``decision`` says (sync, thread).

    ``nodes``: the plan's job nodes by name that its record holds, as the pass read them (every
    write names the node with its uid, so another node of that name is never touched);
    ``claims``: the nonce each new node carries (its digest is in the record already);
    ``already_signalled``: whether one of them carried the checkpoint signal before (the plan's
    Event is posted once). A node to release whose pods have not gone yet stays until they have.
    """
    claims = claims or {}
    out = JobNodeFacts(wrote=bool(decision.create or decision.assign or decision.keep_warm))

    def uid(node: str) -> str:
        held = nodes.get(node)
        return (held.metadata.uid or "") if held is not None and held.metadata else ""

    for spec in decision.create:
        made = provider.create(spec, claims.get(spec.name, ""))
        if made.uid:  # a node of that name that was there already (409) is not the plan's
            out.made.append(GroupNode(name=made.name, uid=made.uid, node_id=spec.name))
        out.events.append(("NodeCreated", f"{spec.name} in {spec.availability_zone} for workload "
                                          f"{spec.labels[trainingjobs.LABEL_WORKLOAD]}"))
    for node, workload in decision.assign:
        writes.set_node_workload(node, workload, None, uid(node))
        out.events.append(("NodeReused", f"warm node {node} now runs workload {workload}"))
    for node, until, previous in decision.keep_warm:
        writes.set_node_workload(node, "", to_rfc3339(until), uid(node))
        out.events.append(("NodeKeptWarm", f"{node} of workload {previous} kept until {to_rfc3339(until)} "
                                           "(keepAlivePeriodSeconds)"))
    if decision.checkpoint and block is not None:  # before any drain: the workloads are asked first
        out.wrote = True
        checkpoint = groups.Checkpoint(block.id, block.termination_time, tuple(decision.checkpoint))
        for node in decision.checkpoint:
            out.pod_events.extend(signal_checkpoint(provider, pods, nodes[node], checkpoint, now))
            out.signalled.append(node)
        if not already_signalled:
            out.events.append((groups.REASON_CHECKPOINT,
                               f"{checkpoint.message}; {len(checkpoint.nodes)} node(s) signalled"))
    for node, why in decision.release:
        out.wrote = True
        progress = pods.evict(node)
        if progress.pods_left:  # its pods stop with their grace period first; look again shortly
            out.evicting = True
            continue
        out.released.add(node)
        out.events.append(("NodeRemoved", f"{node} removed ({why}): {provider.release(node, uid(node))}"))
    for drain in decision.drain:
        out.wrote = True
        outcome = drain_node(provider, pods, nodes[drain.node], drain.reason, drain.deadline, now)
        out.events.extend((event.reason, event.message) for _, event in outcome.events)
        if outcome.released is not None:
            out.released.add(drain.node)
    for workload, missing in decision.short.items():
        out.events.append(("NoSlotForWorkload", f"workload {workload} is short of {missing} instance(s) on block "
                                                f"{block.id if block else '-'}"))
    return out
