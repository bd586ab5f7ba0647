"""Capacity bought from a remote source: the calls (docs/aws.md).

A CapacityPool with ``spec.source.sageMaker`` is sold by another hyperplan's SageMaker API or by
AWS; this package makes the calls, with boto3, the maintained SDK (no signing of our own). What the
answers mean is :mod:`hyperplan.planning.remote`. A pool with ``spec.source.ec2CapacityBlocks``
is sold by EC2 Capacity Blocks (:mod:`hyperplan.actuation.remote.capacity_blocks`). The plan pass sees
either through one protocol, :class:`CapacitySeller` (find_offerings, buy, remote_plans), made for a pool's source
by :func:`~hyperplan.actuation.remote.sources.make_seller`.

Its modules: :mod:`.calls` (the protocols, errors and the client), :mod:`.sagemaker` (a SageMaker
endpoint), :mod:`.capacity_blocks` (EC2 Capacity Blocks), :mod:`.sources` (one seller per source,
the paced listings, the credentials).

**The client, set on purpose** (:func:`client_config`): boto3's ``standard`` retry mode (3
attempts on throttling, 5xx and dropped connections, with its own backoff), a connect timeout of
5 s and a read timeout of 20 s (an endpoint that hangs fails the pass, which the work queue backs
off, instead of holding a purchase thread), and a connection pool as big as the purchase threads
that may call at once. One client per pool source and credentials, made once and reused.

**Credentials**: the Secret ``credentialsSecret`` names in the operator's namespace
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``), read at most every 10 s
(:data:`CREDENTIALS_SECONDS`), and the client made again when the Secret's resourceVersion
changes; without one, boto3's own chain (IRSA, EKS Pod Identity, the environment).

**Paced reads** (:class:`RemoteFollower`): one ``ListTrainingPlans`` (paged) serves every plan of a
pool that asks within the age it accepts; a second caller waits for the first's answer instead of
listing again. A listing is made again no sooner than ten times as long as the last one took (an
endpoint of 10,000 plans is asked less often), so a plan waiting for the remote to buy, which
accepts two seconds' age, reads its own remote plan instead when the listing is older
(``remote_plan``: one DescribeTrainingPlan). Plans that hold blocks look at most at their next
boundary and at least every 5 minutes; one waiting for the remote, ever less often the longer it
waits (the wake controllers.plan.reconciler.reconcile_plan returns, with :meth:`RemoteSources.waiting_every`).

Every call is counted by operation and result (``hyperplan_remote_calls_total``); a failed call
raises :class:`RemoteError`, which the work queue reports on the plan as ``Reconciled=False``
with the endpoint and the error, and retries with backoff.
"""
