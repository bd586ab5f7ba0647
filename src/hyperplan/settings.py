"""Operator settings, in one typed place, read from the environment (prefix ``HYPERPLAN_``)."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from hyperplan import __version__
from hyperplan.api.vocabulary import TOPOLOGY_LAYERS, TOPOLOGY_ULTRASERVER_ID

# A kind node's reboot, in PID 1's namespaces with the host's systemctl: the kubelet stops for longer
# than the node controller's grace (50 s), so the node goes NotReady (Unknown) as a rebooting machine
# does, then the container runtime and the kubelet start again and it is Ready under the same name.
# (A kubelet only restarted may never report NotReady: the ladder would not see the node come back.)
KIND_REBOOT_DOWN_SECONDS = 60
DEFAULT_REBOOT_COMMAND = ("nsenter", "--target", "1", "--mount", "--uts", "--ipc", "--net", "--pid", "--",
                          "sh", "-c", f"systemctl stop kubelet && sleep {KIND_REBOOT_DOWN_SECONDS} "
                          "&& systemctl restart containerd && systemctl start kubelet")


# The deep health checks' default commands: hyperplan.deepcheck in the operator's image.
DEFAULT_DEEP_HEALTH_CHECK_COMMANDS = {
    "InstanceStress": ("python", "-m", "hyperplan.deepcheck", "InstanceStress"),
    "InstanceConnectivity": ("python", "-m", "hyperplan.deepcheck", "InstanceConnectivity"),
}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HYPERPLAN_", extra="ignore")

    policy: Literal["sagemaker", "demo"] = "sagemaker"
    """Policy profile: the rules of SageMaker training plans, or the same read in minutes."""

    kubeconfig: str | None = None
    """Kubeconfig to use; unset means $KUBECONFIG, then in-cluster configuration."""

    liveness_port: int = 8081
    """Port of the liveness endpoint (/healthz); 0 disables it."""
    liveness_address: str = "0.0.0.0"
    """Address the liveness endpoint binds (0.0.0.0: every interface, as the kubelet's probe needs)."""
    liveness_max_connections: int = Field(16, ge=1)
    """Liveness connections held at once; past it the one that has waited longest for its request
    is closed to make room (a 503 at once when every one is being answered)."""
    liveness_stall_seconds: float = Field(5.0, gt=0)
    """/healthz answers 503 once the operator's event loop has not run for this long (it is
    answered from a thread of its own, and reads the loop's heartbeat)."""
    header_timeout_seconds: float = Field(5.0, gt=0)
    """Every port (liveness, metrics, SageMaker API): a client's request headers must arrive
    within this long of its connection (its TLS handshake included) or of its previous answer;
    it is closed otherwise."""
    body_timeout_seconds: float = Field(10.0, gt=0)
    """The SageMaker API: a request's body must arrive within this long of its headers; the
    connection is closed otherwise."""

    metrics_port: int = 8000
    """Port of the Prometheus endpoint (/metrics); 0 disables it."""
    metrics_address: str = "0.0.0.0"
    """Address the Prometheus endpoint binds (127.0.0.1 keeps it to the pod, for a sidecar)."""
    metrics_timeout_seconds: float = Field(10.0, gt=0)
    """Longest a metrics request may take, from the wait for its first byte to its response's
    last; a slower client (or an idle keep-alive connection) is cut there."""
    metrics_max_connections: int = Field(8, ge=1)
    """Metrics connections served at once; one more gets a 503 at once and is closed."""
    metrics_cache_seconds: float = Field(1.0, ge=0)
    """Seconds one render of the metrics serves every scrape (0: a render per scrape, yet still
    one for scrapes that arrive together)."""

    api_timeout_seconds: float = Field(30.0, gt=0)
    """Default timeout of each Kubernetes API call of the operator's client that sets none of its
    own (watch streams excepted: they set theirs)."""

    checkpoint_lead_seconds: float | None = Field(None, ge=0)
    """Seconds before a block's termination time that workloads are asked to checkpoint;
    unset: the policy profile's (10 min under sagemaker, 5 s under demo). docs/checkpoint.md."""

    hyperpod_labels: bool = True
    """Write SageMaker HyperPod's node labels and taint beside hyperplan's own
    (``sagemaker.amazonaws.com/node-health-status`` and ``.../deep-health-check-status``, and the
    taint ``sagemaker.amazonaws.com/node-health-status=Unschedulable:NoSchedule`` while a node is
    marked), so that job templates and Kueue TAS written for HyperPod select and tolerate by them
    unchanged. Either key is read whatever this says (planning.nodefacts). The chart's
    ``hyperPodLabels``."""

    kueue_enabled: bool = True
    """Serve Kueue AdmissionChecks (docs/admission.md). False: Kueue's kinds are not watched at
    all, for a cluster where the operator may not read them (the chart's ``kueue.enabled``)."""

    watch_server_timeout: int = 300
    """Seconds after which the API server closes a watch and kopf opens a new one."""

    ultraserver_id_label: str = TOPOLOGY_ULTRASERVER_ID
    network_layer_labels: tuple[str, str, str] = TOPOLOGY_LAYERS

    # Who the operator is, so that it never lends or drains the node it runs on. The chart sets
    # POD_NAME, POD_NAMESPACE and NODE_NAME from the downward API, and HYPERPLAN_OPERATOR_POD_LABELS
    # to the labels of its Deployment's pods (so another replica is protected too).
    pod_name: str | None = Field(None, validation_alias=AliasChoices("HYPERPLAN_POD_NAME", "POD_NAME"))
    pod_namespace: str | None = Field(
        None, validation_alias=AliasChoices("HYPERPLAN_POD_NAMESPACE", "POD_NAMESPACE"))
    """Namespace of the operator's pods; unset (out of a cluster): pods with the labels below
    count as the operator's in every namespace."""
    node_name: str | None = Field(None, validation_alias=AliasChoices("HYPERPLAN_NODE_NAME", "NODE_NAME"))
    operator_pod_labels: dict[str, str] = {
        "app.kubernetes.io/name": "hyperplan", "app.kubernetes.io/component": "operator"}
    """Labels that mark the operator's pods (JSON in the environment); {} protects only this pod."""

    verbose: bool = False

    # Reboots through the node provider (actuation/providers, NodeProvider.reboot).
    kwok_reboot_seconds: float = Field(10.0, gt=0)
    """Seconds a KWOK node stays NotReady (Ready=False, reason Rebooting) when it is rebooted
    before KWOK's stage brings it back Ready (src/hyperplan_dev/kwok-stages.yaml)."""
    karpenter_node_class: str = Field("karpenter.kwok.sh/KWOKNodeClass/default",
                                      pattern=r"^[a-z0-9.-]+/[A-Za-z0-9]+/[a-z0-9.-]+$")
    """The node class every NodeClaim of a ``nodeProvider: karpenter`` group names, as
    ``group/Kind/name`` (on AWS: ``karpenter.k8s.aws/EC2NodeClass/<name>``)."""
    karpenter_capacity_type: Literal["reserved", "on-demand"] = "reserved"
    """The ``karpenter.sh/capacity-type`` a karpenter group's NodeClaims require."""
    karpenter_reservation_label: str = Field("", pattern=r"^(([a-z0-9.-]+/)?[A-Za-z0-9][A-Za-z0-9._-]*)?$")
    """The label key by which the cluster's Karpenter provider names a capacity reservation (on AWS
    ``karpenter.k8s.aws/capacity-reservation-id``). Set, the NodeClaim of a slot whose block is
    an EC2 Capacity Block (its id a capacity reservation's, ``cr-...``) requires that reservation,
    so the instance launches into the block hyperplan bought. Empty (the default; Karpenter's kwok
    provider has no reservation ids): no such requirement."""
    karpenter_instance_types_file: str = ""
    """The instance-type file of the cluster's Karpenter kwok provider (its ``INSTANCE_TYPES_FILE_PATH``;
    ``hyperplan dev env`` prints the local plane's). Set, a karpenter group whose instance type or
    zone it does not offer with ``karpenter_capacity_type`` makes no NodeClaim and says so
    (``NodesLaunched=False``); empty, or a file that cannot be read: the offering is not checked."""
    karpenter_launch_timeout_seconds: float = Field(300.0, gt=0)
    """How long a NodeClaim may stay without a registered Node before the operator deletes it and
    makes the slot's claim again (Karpenter's own liveness timeout is a fixed 15 minutes)."""
    reboot_job_image: str = f"hyperplan:{__version__}"
    """Image of the Job that reboots a static node (the chart: the operator's own image); it
    needs ``nsenter`` for the default command."""
    reboot_job_command: list[str] = Field(default_factory=lambda: list(DEFAULT_REBOOT_COMMAND), min_length=1)
    """Command of that Job (JSON in the environment). The default reboots a kind node: it enters the
    host's namespaces (the pod has hostPID and is privileged), stops the kubelet for 60 s (the node
    goes NotReady), then restarts the container runtime and starts the kubelet. On a real fleet an
    admin puts a BMC or cloud call here."""
    reboot_job_ttl_seconds: int = Field(600, ge=0)
    """A finished reboot Job is deleted after this long (``ttlSecondsAfterFinished``)."""
    reboot_job_deadline_seconds: int = Field(600, gt=0)
    """A reboot Job that has not finished by then fails (``activeDeadlineSeconds``): a node that
    never runs its pod does not keep the reboot under way for ever."""

    # Deep health checks (spec.onStartDeepHealthChecks; actuation/deepchecks.py): Jobs pinned to the node.
    deep_health_check_image: str = f"hyperplan:{__version__}"
    """Image of the check Jobs (the chart: the operator's own image, whose ``hyperplan.deepcheck``
    the default commands run)."""
    deep_health_check_commands: dict[Literal["InstanceStress", "InstanceConnectivity"], list[str]] = Field(
        default_factory=lambda: {check: list(command) for check, command in DEFAULT_DEEP_HEALTH_CHECK_COMMANDS.items()})
    """Command of each check's Job (JSON in the environment; a check left out keeps its default). The
    defaults: a CPU and memory stress of the node, and a TCP exchange with the other nodes of the
    run over the pod network. On GPUs an admin puts DCGM's diagnostic (``dcgmi diag -r 2``) or an
    NCCL test here; the Job's environment says the check, the node and the run's peers."""
    deep_health_check_seconds: int = Field(60, gt=0)
    """How long a check may take before it fails (the Job's command reads it as
    ``HYPERPLAN_CHECK_SECONDS``: the stress's length is a sixth of it, the connectivity's wait for
    its peers all of it); the Job fails 60 s past it (``activeDeadlineSeconds``) if its pod never ran."""
    deep_health_check_port: int = Field(7946, ge=1024, le=65535)
    """TCP port the InstanceConnectivity check listens on in its pod."""
    deep_health_check_ttl_seconds: int = Field(600, ge=0)
    """A finished check Job is deleted after this long (``ttlSecondsAfterFinished``); its run's
    Service goes with the last of its Jobs (owner references)."""

    # Leader election on a coordination.k8s.io/v1 Lease (actuation/leadership.py): with several
    # replicas one acts and the others stand by, writing nothing and running no daemons.
    leader_election: bool = True
    leader_election_namespace: str | None = None
    """Namespace of the Lease; unset: $POD_NAMESPACE (the chart's), else `default`."""
    leader_election_lease_name: str = "hyperplan-leader"
    leader_election_identity: str | None = None
    """This replica's name in the Lease; unset: $POD_NAME, else `<hostname>-<pid>`."""
    lease_duration_seconds: float = 15.0
    """A standby takes over once the Lease has not been renewed for this long (a kill -9)."""
    renew_deadline_seconds: float = 10.0
    """The leader stops acting when it could not renew for this long."""
    retry_period_seconds: float = 2.0
    """Seconds between attempts to acquire or renew the Lease."""

    # hyperplan's SageMaker API (hyperplan.sagemaker; docs/sagemaker-api.md): boto3 and the AWS CLI
    # talk to it with --endpoint-url. Off unless a port is given.
    sagemaker_api_port: int | None = Field(None, ge=1, le=65535)
    """Port of the SageMaker API; unset: not served."""
    sagemaker_api_address: str = "127.0.0.1"
    """Address it binds; plain HTTP is served only on a loopback address, any other needs TLS."""
    sagemaker_api_tls_cert: str | None = None
    """PEM certificate (chain) file for HTTPS (the chart mounts it from a Secret)."""
    sagemaker_api_tls_key: str | None = None
    """PEM private key file for HTTPS."""
    sagemaker_api_max_connections: int = Field(128, ge=1)
    """SageMaker API connections held at once; past it the one that has waited longest for its
    request is closed to make room (a 503 at once when every one is being answered)."""
    sagemaker_api_answer_seconds: float = Field(60.0, gt=0)
    """Longest an API operation may run once its request is read (it runs on the operator's event
    loop); past it the caller gets a 503 ServiceUnavailable."""
    aws_account_id: str = Field("000000000000", pattern=r"^[0-9]{12}$")
    """The 12-digit account id in the ARNs the API hands out."""
    cluster_name: str = Field("hyperplan", pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
    """This Kubernetes cluster's name as one HyperPod cluster (DescribeCluster, ListClusterNodes)."""
    eks_cluster_arn: str | None = Field(None, pattern=(r"^arn:aws[a-z\-]*:eks:[a-z0-9\-]*:[0-9]{12}:cluster/"
                                                        r"[0-9A-Za-z][A-Za-z0-9\-_]{0,99}$"))
    """The EKS cluster ARN DescribeCluster answers as ``Orchestrator.Eks.ClusterArn`` (the HyperPod
    CLI reads it to find the cluster's Kubernetes API); unset: no ``Orchestrator`` is answered."""
    api_key_namespace: str | None = None
    """Namespace of the API's access-key Secrets; unset: $POD_NAMESPACE, else `default`."""

    @model_validator(mode="after")
    def _leases_make_one_actor(self) -> "Settings":
        """The leader must give up (renew deadline) before a standby may take over (lease duration),
        and try more than once before it gives up; otherwise two replicas could act at once."""
        if not 0 < self.retry_period_seconds < self.renew_deadline_seconds < self.lease_duration_seconds:
            raise ValueError(
                "leader election needs 0 < retry_period_seconds < renew_deadline_seconds < "
                f"lease_duration_seconds, got {self.retry_period_seconds:g} < {self.renew_deadline_seconds:g} "
                f"< {self.lease_duration_seconds:g}")
        return self
