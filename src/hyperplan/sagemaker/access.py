"""Who may call the SageMaker API, and what they may do: access keys in Secrets, RBAC decides.

An access key is a Secret of type ``hyperplan.dev/api-key`` in the operator's namespace that an
admin created (``hyperplan api-key create --user USER``): ``access-key-id``,
``secret-access-key`` and ``user`` (a Kubernetes user name or
``system:serviceaccount:<namespace>:<name>``; a ServiceAccount's groups come with it). Only
someone who may create Secrets in the operator's namespace can mint one.

What a caller may do is what Kubernetes RBAC lets the key's identity do: every operation names
the verb and resource it stands for (:data:`RIGHTS`), and a SubjectAccessReview for that identity
decides (a grant is kept for :data:`REVIEW_SECONDS`, a refusal for :data:`REFUSAL_SECONDS` only, as the
API server's webhook authorizer keeps its refusals shorter: a caller refused, whose admin then grants
the right, is served on a retry within seconds). So a team whose Role lets it get and list
TrainingPlans may describe and list them here too, and one without may not. Reads are then served
from the watch cache, writes (in later operations) go to the API server as that identity.

**Whose plans.** A key whose identity may get and list TrainingPlans reads every plan. A key that
may only create them (a training cluster's key at a capacity cluster, say) is served the reads of
:data:`OWN_PLAN_READS` for the plans it made itself, and no other: the API writes its user into
``hyperplan.dev/created-by`` when it makes a plan, the chart's ValidatingAdmissionPolicy lets no
one write another user's name there or change it, and the plans of others are, to that key, as if
they did not exist (``ResourceNotFound``; a listing leaves them out). So teams buying from one
capacity cluster do not see one another's plans.

The keys are listed from the API server at most once every :data:`KEYS_SECONDS`; an unknown key id
lists them again at once (at most every :data:`UNKNOWN_KEY_SECONDS`), so a new key works at once
and a deleted one stops within :data:`KEYS_SECONDS`.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import string
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hyperplan.api.vocabulary import API_KEY_SECRET_TYPE, GROUP, SECRET_LABEL_API_KEY_USER, VERSION
from hyperplan.sagemaker.signing import AccessKey
from hyperplan.sagemaker.wire import ApiError

SECRET_TYPE = API_KEY_SECRET_TYPE
KEYS_SECONDS = 30.0
UNKNOWN_KEY_SECONDS = 2.0
REVIEW_SECONDS = 10.0  # a granted SubjectAccessReview is kept this long
REFUSAL_SECONDS = 2.0  # a refused one this long
ACTING_KEPT = 32  # impersonating clients kept (KubeWrites)
EVENTS_READ = 1000  # Events of each kind one ListClusterEvents reads (the newest are what a caller looks for)
log = logging.getLogger("hyperplan.sagemaker")

# What each operation stands for in RBAC: (verb, API group, resource).
RIGHTS: dict[str, tuple[str, str, str]] = {
    "DescribeTrainingPlan": ("get", GROUP, "trainingplans"),
    "ListTrainingPlans": ("list", GROUP, "trainingplans"),
    "DescribeReservedCapacity": ("get", GROUP, "trainingplans"),
    "ListUltraServersByReservedCapacity": ("get", GROUP, "trainingplans"),
    "SearchTrainingPlanOfferings": ("create", GROUP, "trainingplans"),
    "CreateTrainingPlan": ("create", GROUP, "trainingplans"),
    "ExtendTrainingPlan": ("patch", GROUP, "trainingplans"),
    "DescribeTrainingPlanExtensionHistory": ("get", GROUP, "trainingplans"),
    "ListTags": ("get", GROUP, "trainingplans"),  # of a training plan: the only tagged resource here
    "AddTags": ("patch", GROUP, "trainingplans"),
    "DeleteTags": ("patch", GROUP, "trainingplans"),
    "DescribeCluster": ("list", GROUP, "instancegroups"),
    "ListClusters": ("list", GROUP, "instancegroups"),
    "ListClusterNodes": ("list", GROUP, "instancegroups"),
    "DescribeClusterNode": ("list", GROUP, "instancegroups"),
    "UpdateCluster": ("patch", GROUP, "instancegroups"),
    "BatchReplaceClusterNodes": ("patch", "", "nodes"),
    "BatchRebootClusterNodes": ("patch", "", "nodes"),
    # The Kubernetes Events of the groups and their nodes, read as the caller.
    "ListClusterEvents": ("list", "", "events"),
    "DescribeClusterEvent": ("list", "", "events"),
}
# The reads served to a key that may create plans but not read them, for its own plans only.
OWN_PLAN_READS = frozenset({"DescribeTrainingPlan", "ListTrainingPlans", "DescribeReservedCapacity",
                            "ListUltraServersByReservedCapacity", "DescribeTrainingPlanExtensionHistory", "ListTags"})
BUYING = RIGHTS["CreateTrainingPlan"]


class Access(Protocol):
    """The keys, and RBAC's answer for an identity (the server's seam for tests)."""

    def key_of(self, key_id: str) -> AccessKey | None: ...

    def stale(self, unknown: bool = False) -> bool:
        """Whether the keys are older than allowed (``unknown``: an unknown key id signed)."""
        ...

    def refresh(self, force: bool = False) -> None: ...

    def allowed(self, key: AccessKey, verb: str, group: str, resource: str) -> bool: ...


def key_of_secret(secret: client.V1Secret) -> AccessKey | None:
    """The key a Secret holds, or None when it is not a complete key (reported, not served)."""
    data = secret.data or {}
    try:
        fields = {k: base64.b64decode(data[k]).decode() for k in ("access-key-id", "secret-access-key", "user")}
    except (KeyError, ValueError, UnicodeDecodeError):
        log.warning("Secret %s/%s of type %s is not a complete API key (access-key-id, secret-access-key, user)",
                    secret.metadata.namespace, secret.metadata.name, SECRET_TYPE)
        return None
    return AccessKey(fields["access-key-id"], fields["secret-access-key"], fields["user"])


@dataclass
class KubeAccess:
    """Keys from the Secrets of ``namespace``, rights from SubjectAccessReviews."""

    api: client.ApiClient
    namespace: str
    clock: Callable[[], float] = time.monotonic
    _keys: dict[str, AccessKey] = field(default_factory=dict)
    _listed: float | None = None
    _reviews: dict[tuple, tuple[float, bool]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def key_of(self, key_id: str) -> AccessKey | None:
        return self._keys.get(key_id)

    def stale(self, unknown: bool = False) -> bool:
        age = None if self._listed is None else self.clock() - self._listed
        return age is None or age > (UNKNOWN_KEY_SECONDS if unknown else KEYS_SECONDS)

    def refresh(self, force: bool = False) -> None:
        """List the keys again if they are older than allowed (``force``: an unknown key id)."""
        if not self.stale(unknown=force):
            return
        with self._lock:
            if not self.stale(unknown=force):
                return
            listed = client.CoreV1Api(self.api).list_namespaced_secret(
                self.namespace, field_selector=f"type={SECRET_TYPE}")
            keys = [key_of_secret(s) for s in listed.items]
            self._keys = {k.key_id: k for k in keys if k is not None}
            self._listed = self.clock()

    def known(self, key: AccessKey, verb: str, group: str, resource: str) -> bool | None:
        """RBAC's answer while a review of it is held (None: it must be asked, :meth:`allowed`)."""
        held = self._reviews.get((key.user, verb, group, resource))
        if held is not None and self.clock() - held[0] < kept_for(held[1]):
            return held[1]
        return None

    def allowed(self, key: AccessKey, verb: str, group: str, resource: str) -> bool:
        cache_key = (key.user, verb, group, resource)
        now = self.clock()
        held = self._reviews.get(cache_key)
        if held is not None and now - held[0] < kept_for(held[1]):
            return held[1]
        review = client.AuthorizationV1Api(self.api).create_subject_access_review(client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=key.user, groups=service_account_groups(key.user) or None,
                resource_attributes=client.V1ResourceAttributes(verb=verb, group=group, resource=resource))))
        allowed = bool(review.status and review.status.allowed)
        self._reviews[cache_key] = (now, allowed)
        if len(self._reviews) > 10_000:  # identities x rights is small; never let it grow without end
            self._reviews = {k: v for k, v in self._reviews.items() if now - v[0] < kept_for(v[1])}
        return allowed


def kept_for(allowed: bool) -> float:
    """How long RBAC's answer is held: a grant :data:`REVIEW_SECONDS`, a refusal :data:`REFUSAL_SECONDS`."""
    return REVIEW_SECONDS if allowed else REFUSAL_SECONDS


def rights_known(access: Access, key: AccessKey, operation: str) -> bool:
    """Whether :func:`check_rights` can answer without an API call (a review held, or an
    operation that stands for no right): the server then checks on the event loop, with no hop
    to a thread, which costs a read up to a GIL switch interval (5 ms) when the loop is busy."""
    right = RIGHTS.get(operation)
    if right is None:
        return True
    known = getattr(access, "known", None)
    if known is None:
        return False
    answer = known(key, *right)
    return answer is True or (answer is False and (operation not in OWN_PLAN_READS or known(key, *BUYING) is not None))


def check_rights(access: Access, key: AccessKey, operation: str) -> str | None:
    """Refuse ``operation`` unless RBAC lets the key's identity do what it stands for. Returns
    None, or the key's user when the key may read only the plans it made (see "Whose plans")."""
    right = RIGHTS.get(operation)
    if right is None:
        return None  # not served: the operation's own lookup answers UnknownOperationException
    verb, group, resource = right
    if access.allowed(key, verb, group, resource):
        return None
    if operation in OWN_PLAN_READS and access.allowed(key, *BUYING):
        return key.user
    raise ApiError("AccessDeniedException", f"User {key.user} is not authorized to perform {operation}: "
                   f"Kubernetes RBAC does not let it {verb} {resource}.{group}", 400)


def service_account_groups(user: str) -> list[str]:
    """The groups the API server gives a ServiceAccount's token (and an impersonation of it), so
    that a review asks about the same identity that a write made as it would be."""
    parts = user.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        return ["system:serviceaccounts", f"system:serviceaccounts:{parts[2]}", "system:authenticated"]
    return ["system:authenticated"]


class Writes(Protocol):
    """The writes of the API's operations, made as the key's identity (tests: a recording fake)."""

    def patch_group(self, user: str, name: str, patch: dict[str, Any]) -> None: ...

    def create_group(self, user: str, body: dict[str, Any]) -> None: ...

    def cluster_events(self, user: str) -> list[dict[str, Any]]:
        """The Kubernetes Events of InstanceGroups and Nodes, read as ``user`` (not written: the
        one read of the API server an operation makes, since the watch cache holds no Events)."""
        ...

    def delete_group(self, user: str, name: str) -> None: ...

    def label_node(self, user: str, name: str, labels: dict[str, str]) -> None: ...

    def create_plan(self, user: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The TrainingPlan created, or None when one of that name exists already."""
        ...

    def extend_plan(self, user: str, name: str, extensions: list[dict[str, Any]], resource_version: str | None) -> None:
        """Set the plan's ``spec.extensions`` to ``extensions``, if it is still at ``resource_version``."""
        ...

    def plan_now(self, name: str) -> dict[str, Any] | None:
        """The plan as the API server has it now (not the watch cache), read by the operator; None
        when it is gone."""
        ...

    def annotate_plan(self, user: str, name: str, annotations: dict[str, str | None],
                      resource_version: str | None) -> None:
        """Set (None: remove) the plan's ``annotations``, if it is still at ``resource_version``."""
        ...


@dataclass
class KubeWrites:
    """Writes made by impersonating the key's identity (``Impersonate-User``), so that the API
    server's RBAC and admission judge them as if that identity had made them itself."""

    api: client.ApiClient
    # One client per identity, kept: a client made per write opened a connection pool (a TLS
    # handshake) for each CreateTrainingPlan of a purchase burst. At most ACTING_KEPT identities.
    _acting: dict[str, client.ApiClient] = field(default_factory=dict)
    _acting_lock: threading.Lock = field(default_factory=threading.Lock)

    @contextmanager
    def _as(self, user: str) -> Iterator[client.ApiClient]:
        with self._acting_lock:
            acting = self._acting.pop(user, None)
            if acting is None:
                acting = client.ApiClient(self.api.configuration)
                acting.set_default_header("Impersonate-User", user)
            self._acting[user] = acting  # the most recent last
            while len(self._acting) > ACTING_KEPT:  # not closed: a write of another thread may be using it
                self._acting.pop(next(iter(self._acting)))
        yield acting

    def patch_group(self, user: str, name: str, patch: dict[str, Any]) -> None:
        with self._as(user) as api:
            client.CustomObjectsApi(api).patch_cluster_custom_object(GROUP, VERSION, "instancegroups", name, patch)

    def create_group(self, user: str, body: dict[str, Any]) -> None:
        with self._as(user) as api:
            client.CustomObjectsApi(api).create_cluster_custom_object(GROUP, VERSION, "instancegroups", body)

    def cluster_events(self, user: str) -> list[dict[str, Any]]:
        """Events about InstanceGroups and Nodes, cluster-scoped objects whose Events are posted in
        ``default`` (kopf's namespace for them, and the kubelet's for its node), at most
        EVENTS_READ of each kind."""
        found: list[dict[str, Any]] = []
        with self._as(user) as api:
            for kind in ("InstanceGroup", "Node"):
                listed = client.CoreV1Api(api).list_namespaced_event(
                    "default", field_selector=f"involvedObject.kind={kind}", limit=EVENTS_READ,
                    _preload_content=False)
                found += json.loads(listed.data).get("items") or []
        return found

    def delete_group(self, user: str, name: str) -> None:
        with self._as(user) as api:
            client.CustomObjectsApi(api).delete_cluster_custom_object(GROUP, VERSION, "instancegroups", name)

    def label_node(self, user: str, name: str, labels: dict[str, str]) -> None:
        with self._as(user) as api:
            client.CoreV1Api(api).patch_node(name, {"metadata": {"labels": labels}})

    def extend_plan(self, user: str, name: str, extensions: list[dict[str, Any]], resource_version: str | None) -> None:
        """A merge patch of the whole list (a merge patch replaces lists) with the resourceVersion
        read: the API server refuses it with 409 if the plan changed since, so an extension written
        meanwhile by someone else is never lost."""
        patch: dict[str, Any] = {"spec": {"extensions": extensions}}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        with self._as(user) as api:
            client.CustomObjectsApi(api).patch_cluster_custom_object(GROUP, VERSION, "trainingplans", name, patch)

    def plan_now(self, name: str) -> dict[str, Any] | None:
        try:
            return client.CustomObjectsApi(self.api).get_cluster_custom_object(GROUP, VERSION, "trainingplans", name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def annotate_plan(self, user: str, name: str, annotations: dict[str, str | None],
                      resource_version: str | None) -> None:
        """A merge patch of the annotations with the resourceVersion read (409 if the plan changed)."""
        metadata: dict[str, Any] = {"annotations": annotations}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        with self._as(user) as api:
            client.CustomObjectsApi(api).patch_cluster_custom_object(GROUP, VERSION, "trainingplans", name,
                                                                     {"metadata": metadata})

    def create_plan(self, user: str, body: dict[str, Any]) -> dict[str, Any] | None:
        with self._as(user) as api:
            try:
                return client.CustomObjectsApi(api).create_cluster_custom_object(GROUP, VERSION, "trainingplans", body)
            except ApiException as e:
                if e.status == 409:
                    return None
                raise


# --------------------------------------------------------------------------- making keys

_KEY_ALPHABET = string.ascii_uppercase + string.digits


def new_key(user: str) -> AccessKey:
    """A fresh key for ``user``: an id in AWS's form (``AKIA`` and 16 characters) and a 40-character
    secret, both from :mod:`secrets`."""
    key_id = "AKIA" + "".join(secrets.choice(_KEY_ALPHABET) for _ in range(16))
    secret = secrets.token_urlsafe(30)[:40]
    return AccessKey(key_id, secret, user)


def key_secret(key: AccessKey, namespace: str) -> dict[str, Any]:
    """The Secret that stores ``key``."""
    data = {"access-key-id": key.key_id, "secret-access-key": key.secret, "user": key.user}
    return {"apiVersion": "v1", "kind": "Secret", "type": SECRET_TYPE,
            "metadata": {"name": f"hyperplan-api-key-{key.key_id.lower()}", "namespace": namespace,
                         "labels": {SECRET_LABEL_API_KEY_USER: _label(key.user)}},
            "stringData": data}


def _label(user: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "-_." else "." for c in user)[-63:].strip("-_.")
    return cleaned or "user"
