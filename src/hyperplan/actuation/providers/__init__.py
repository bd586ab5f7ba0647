"""Node providers: where an instance group's nodes come from, behind one Protocol
(:class:`~hyperplan.actuation.providers.base.NodeProvider`; :func:`~hyperplan.actuation.providers.factory.providers`
makes one of each).

* :class:`~.kwok.KwokProvider` creates Node objects annotated ``kwok.x-k8s.io/node=fake`` with
  capacity that fits the instance type; KWOK keeps them Ready and runs their pods.
* :class:`~.static.StaticProvider` adopts existing nodes labelled ``node-restriction.kubernetes.io/hyperplan-pool=free`` of the
  right instance type and zone (kind's workers, say) and labels and taints them while the
  group holds them; when it lets go it hands them back as it found them (see
  :mod:`hyperplan.planning.lending`). It never creates or deletes a node.
* :class:`~.karpenter.KarpenterProvider` asks Karpenter for each node with a NodeClaim.
* ``hyperplan_testing.fakes.FakeProvider`` (outside the shipped package) keeps nodes in memory and
  records every call, for unit tests.

Besides creating, changing and releasing nodes, a provider carries out the health actions
of remediation on them (:meth:`~.base.NodeProvider.mark_unhealthy`, :meth:`~.base.NodeProvider.promote_spare`,
:meth:`~.base.NodeProvider.reboot`) and keeps the operator's notes on a node
(:meth:`~.base.NodeProvider.annotate`), so that everything the operator writes on a group's nodes goes
through one seam. What happens to the pods on a
node (eviction for a drain) goes through :class:`hyperplan.actuation.pods.NodePods` (the API server, or a recording fake).

Every node a provider hands out carries the label ``hyperplan.dev/node-id`` with the
deterministic name planning chose (:class:`~hyperplan.planning.placement.NodeSpec`);
for KWOK it is also the node's name. Nodes are listed by the group label, but a label is
never proof of anything: ``create`` returns the Node's name and uid (:class:`~.base.MadeNode`), the
group keeps them in its status (``planning.ownership``), and every other call names the node
by that name and, with ``uid``, refuses to touch another node of the same name (a uid in a
patch and a uid precondition on a delete; the API server refuses either for another node).
"""
