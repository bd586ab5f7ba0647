"""A pool sold by a SageMaker endpoint (another hyperplan's SageMaker API, or AWS): the calls
of SearchTrainingPlanOfferings, CreateTrainingPlan, ListTrainingPlans and the extensions."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from hyperplan.actuation.remote.calls import STUBBED, NotBought, RemoteCalls, RemoteError, make_client
from hyperplan.api.models import SageMakerSource
from hyperplan.planning.blocks import Block
from hyperplan.planning.offerings import OfferingRequest
from hyperplan.planning.policy import Policy
from hyperplan.planning.remote import (
    ExtensionRecord,
    PoolTerms,
    RemoteBlock,
    RemoteExtension,
    RemoteOffering,
    RemotePlan,
    extension_records,
    extensions_offered,
    offerings_of,
    plan_of,
    search_arguments,
    ultra_server_health_of,
)


class SageMakerSelling:
    """:class:`CapacitySeller` over the SageMaker Training Plans calls (:class:`RemoteCapacity`):
    shared by the real client and the unit tests' fake endpoint (hyperplan_testing.fakes)."""

    extend_right = "sagemaker:ExtendTrainingPlan (at a hyperplan endpoint: the right to patch trainingplans)"
    endpoint: str
    search: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    create_plan: Callable[..., str]
    describe_plan: Callable[[str], "Mapping[str, Any] | None"]
    list_plans: Callable[[], "list[Mapping[str, Any]]"]

    def find_offerings(self, request: OfferingRequest, policy: Policy,
                  pools: Sequence[PoolTerms]) -> list[RemoteOffering]:
        answer = self.search(search_arguments(request, policy))
        return [o for p in pools for o in offerings_of(answer, p.name, p.instance_type, p.availability_zone,
                                                       p.ultra_server_type, request)]

    def buy(self, name: str, plan_uid: str, offering: RemoteOffering, spares: int | None,
            tags: Mapping[str, str]) -> RemotePlan:
        """CreateTrainingPlan; the plan it made is Pending until the remote has bought it. The same
        name with the same offering answers the same plan (so boto3's own retries are safe); a
        taken name is read again."""
        try:
            arn = self.create_plan(name, offering.remote_id, spares, tags)
        except RemoteError as e:
            if e.code in ("ResourceNotFound", "ValidationException"):  # sold meanwhile, or no longer offered
                raise NotBought(f"the endpoint {e.endpoint} no longer sells offering {offering.offering.id}: "
                                f"{e.message}") from None
            if e.code != "ResourceInUse":
                raise
            # The name is taken. A plan of ours the listing did not show yet is read again; one
            # this key cannot even describe was made with another key (a key rotated to another
            # user that may create plans but not read them): nothing is bought under another
            # name, which could buy the plan twice, and the pass fails saying what to do.
            if self.describe_plan(name) is not None:
                raise NotBought(f"the remote training plan {name} exists already; reading it again") from None
            raise RemoteError("CreateTrainingPlan", "ResourceInUse", (
                f"the endpoint holds a training plan named {name} (this plan's purchase) that this key "
                "cannot read: it was made with another key. Nothing is bought under another name, so "
                "the plan is never bought twice; give this key the right to read training plans, or "
                "put back the key that bought it"), e.endpoint, refused=True) from None
        # Not described at once: a remote buys after CreateTrainingPlan answers (AWS's plan is
        # Pending until paid, hyperplan's until its operator's pass), and its reads lag its writes,
        # so a describe here answered nothing new (in the remote bench, 396 of 1,060 were
        # ResourceNotFound) and cost every purchase a round trip. The plan waits and reads it.
        return RemotePlan(name=name, arn=arn, status="Pending", status_message="created; the remote buys it next")

    def remote_plans(self) -> list[RemotePlan]:
        return [plan_of(answer) for answer in self.list_plans()]

    def remote_plan(self, name: str, plan_uid: str) -> RemotePlan | None:
        answer = self.describe_plan(name)
        return plan_of(answer) if answer is not None else None

    def find_extensions(self, remote: RemotePlan, plan_uid: str, blocks: Sequence[Block],
                        policy: Policy) -> list[RemoteExtension]:
        return extensions_offered(self.search({"TrainingPlanArn": remote.arn}), plan_uid, blocks, policy)

    def extension_history(self, remote: RemotePlan) -> list[ExtensionRecord]:
        return extension_records(self.extension_entries(remote.arn))

    def ultra_server_health(self, block: RemoteBlock) -> dict[str, str]:
        return ultra_server_health_of(self.list_ultra_servers(block.arn))

    def extend(self, remote: RemotePlan, extension: RemoteExtension) -> list[ExtensionRecord]:
        try:
            return extension_records(self.extend_plan(extension.remote_id))
        except RemoteError as e:
            if e.code in ("ResourceNotFound", "ValidationException"):  # sold meanwhile, or too late now
                raise NotBought(f"the endpoint {e.endpoint} no longer sells extension {extension.extension.id} of "
                                f"{remote.noun} {remote.name}: {e.message}") from None
            raise


class SageMakerCapacity(RemoteCalls, SageMakerSelling):
    """A remote pool's endpoint through boto3's SageMaker client. ``client`` is a seam for
    botocore's Stubber in the unit tests, which checks every request against the service model."""

    def __init__(self, source: SageMakerSource, credentials: tuple[str, str] | None = None,
                 client: Any = None) -> None:
        self.source = source
        self.client = client if client is not None else make_client(source, credentials)
        self.endpoint = source.endpoint or self.client.meta.endpoint_url
        # A client given (the Stubber's) serves every call; else the one without retries is made
        # when first needed.
        self._credentials: Any = STUBBED if client is not None else credentials
        self._single: Any = None

    def search(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        return self._call("SearchTrainingPlanOfferings", "search_training_plan_offerings", **arguments)

    def create_plan(self, name: str, offering_id: str, spares: int | None, tags: Mapping[str, str]) -> str:
        arguments: dict[str, Any] = {"TrainingPlanName": name, "TrainingPlanOfferingId": offering_id}
        if spares:
            arguments["SpareInstanceCountPerUltraServer"] = spares
        if tags:
            arguments["Tags"] = [{"Key": k, "Value": v} for k, v in sorted(tags.items())]
        return str(self._call("CreateTrainingPlan", "create_training_plan", **arguments)["TrainingPlanArn"])

    def describe_plan(self, name: str) -> Mapping[str, Any] | None:
        try:
            return self._call("DescribeTrainingPlan", "describe_training_plan", TrainingPlanName=name)
        except RemoteError as e:
            if e.code == "ResourceNotFound":
                return None
            raise

    def list_plans(self) -> list[Mapping[str, Any]]:
        return self._pages("ListTrainingPlans", "list_training_plans", "TrainingPlanSummaries")

    def extend_plan(self, extension_id: str) -> list[Mapping[str, Any]]:
        """ExtendTrainingPlan, through a client with boto3's retries off (as EC2's purchase): the
        call spends money, and a retry after a lost answer is left to the next pass, which reads
        the extension history first."""
        answer = self._call("ExtendTrainingPlan", "extend_training_plan", client=self._once(),
                            TrainingPlanExtensionOfferingId=extension_id)
        return list(answer.get("TrainingPlanExtensions") or [])

    def extension_entries(self, arn: str) -> list[Mapping[str, Any]]:
        return self._pages("DescribeTrainingPlanExtensionHistory", "describe_training_plan_extension_history",
                           "TrainingPlanExtensions", TrainingPlanArn=arn)

    def list_ultra_servers(self, arn: str) -> list[Mapping[str, Any]]:
        return self._pages("ListUltraServersByReservedCapacity", "list_ultra_servers_by_reserved_capacity",
                           "UltraServers", ReservedCapacityArn=arn)

    def _once(self) -> Any:
        if self._single is None:
            self._single = self.client if self._credentials is STUBBED else make_client(
                self.source, self._credentials, attempts=1)
        return self._single
