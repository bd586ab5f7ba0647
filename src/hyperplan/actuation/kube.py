"""Thin access to the Kubernetes API for the operator's own objects.

The official client is synchronous; handlers call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from hyperplan import __version__
from hyperplan.api.models import GROUP, VERSION
from hyperplan.settings import Settings


# Connections kept open to the API server. The client's default (5 per CPU: 10 on 2 cores) is
# far below the threads that call it at once (group passes, their parallel creates and health
# actions, purchases): every call beyond it opened a new TLS connection and threw it away after
# ("Connection pool is full"), a handshake each for the operator and the API server.
CONNECTIONS = 64
# What the API server's audit log and request logs name as the client (kopf's own requests say
# "kopf/<version>"), so that a write can be told from a controller's or a user's.
USER_AGENT = f"hyperplan/{__version__}"


class TimedApiClient(client.ApiClient):
    """An API client whose calls that set no ``_request_timeout`` of their own get
    ``default_timeout`` (seconds), so that an API server that accepts and never answers cannot
    hold a handler's thread for ever. Watch streams (``watch=true``) are left without one: they
    are meant to stay open, and the operator's set their own (runtime.nodewatch, the Lease's).

    Every generated API method ends in :meth:`request` (the client of kubernetes 36, which the lock
    pins: botocore needs a python-dateutil that kubernetes 37 refuses), so this is the one place
    that sees them all. A number bounds each wait of the call (connect, then each read), as urllib3
    takes it; urllib3 retries an idempotent call (GET, PUT, DELETE) after a read timeout up to 3 times.
    """

    def __init__(self, configuration: client.Configuration, default_timeout: float) -> None:
        super().__init__(configuration)
        self.default_timeout = default_timeout

    def request(self, method, url, query_params=None, headers=None, post_params=None,  # noqa: ANN001
                body=None, _preload_content=True, _request_timeout=None):  # the generated client's names
        if _request_timeout is None and not is_watch(url, query_params):
            _request_timeout = self.default_timeout
        return super().request(method, url, query_params=query_params, headers=headers, post_params=post_params,
                               body=body, _preload_content=_preload_content, _request_timeout=_request_timeout)


def is_watch(url: str, query_params: Any = None) -> bool:
    """Whether the request opens a watch stream (``watch=true`` in the URL or the query parameters)."""
    if any(key == "watch" and str(value).lower() == "true" for key, value in query_params or ()):
        return True
    return "true" in parse_qs(urlsplit(url).query).get("watch", ())


def api_client(kubeconfig: str | None = None, request_timeout: float | None = None) -> client.ApiClient:
    """An API client from the given kubeconfig, $KUBECONFIG, or the in-cluster service account;
    it says ``hyperplan/<version>`` as its User-Agent, and a call that sets no timeout of its own
    gets ``request_timeout`` (unset: HYPERPLAN_API_TIMEOUT_SECONDS, 30 s) (:class:`TimedApiClient`)."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    configuration = client.Configuration()
    if path:
        config.load_kube_config(config_file=path, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = CONNECTIONS
    if request_timeout is None:
        request_timeout = Settings().api_timeout_seconds
    api = TimedApiClient(configuration, request_timeout)
    api.user_agent = USER_AGENT
    return api


def is_conflict(e: Exception) -> bool:
    return isinstance(e, ApiException) and e.status == 409


@dataclass
class Kube:
    """The calls the operator makes, grouped so that providers and the ledger share one client."""

    api: client.ApiClient

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def policy(self) -> client.PolicyV1Api:
        return client.PolicyV1Api(self.api)

    @property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.api)

    # ---------------------------------------------------------------- hyperplan objects

    def list_objects(self, plural: str) -> list[dict[str, Any]]:
        return self.custom.list_cluster_custom_object(GROUP, VERSION, plural)["items"]

    def get_object(self, plural: str, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_cluster_custom_object(GROUP, VERSION, plural, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def replace_status(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        """Write a whole status, refused with 409 when ``body``'s resourceVersion is stale."""
        return self.custom.replace_cluster_custom_object_status(
            GROUP, VERSION, plural, body["metadata"]["name"], body)

    def patch_status(self, plural: str, name: str, status: dict[str, Any],
                     resource_version: str | None = None) -> dict[str, Any]:
        """Merge-patch the status; the object as written. With ``resource_version`` the patch is
        refused (409) when the object changed since: a write that replaces a list another writer
        may have changed meanwhile (an InstanceGroup's record) carries it."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return self.custom.patch_cluster_custom_object_status(GROUP, VERSION, plural, name, body)

    def set_finalizers(self, plural: str, name: str, finalizers: list[str], resource_version: str) -> dict[str, Any] | None:
        """Replace the object's finalizers, refused with 409 when it changed since
        ``resource_version`` (so that nobody else's finalizer is lost); the object as written,
        None when it is gone."""
        try:
            return self.custom.patch_cluster_custom_object(
                GROUP, VERSION, plural, name,
                {"metadata": {"finalizers": finalizers, "resourceVersion": resource_version}})
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    # ---------------------------------------------------------------- nodes and pods

    def list_nodes(self, label_selector: str) -> list[client.V1Node]:
        return self.core.list_node(label_selector=label_selector).items
