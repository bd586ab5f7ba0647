"""Thin access to the Kubernetes API for the operator's own objects.

The official client is synchronous; handlers call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from hyperplan import __version__
from hyperplan.api.models import GROUP, VERSION


# Connections kept open to the API server. The client's default (5 per CPU: 10 on 2 cores) is
# far below the threads that call it at once (group passes, their parallel creates and health
# actions, purchases): every call beyond it opened a new TLS connection and threw it away after
# ("Connection pool is full"), a handshake each for the operator and the API server.
CONNECTIONS = 64
# What the API server's audit log and request logs name as the client (kopf's own requests say
# "kopf/<version>"), so that a write can be told from a controller's or a user's.
USER_AGENT = f"hyperplan/{__version__}"


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """An API client from the given kubeconfig, $KUBECONFIG, or the in-cluster service account;
    it says ``hyperplan/<version>`` as its User-Agent."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    configuration = client.Configuration()
    if path:
        config.load_kube_config(config_file=path, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = CONNECTIONS
    api = client.ApiClient(configuration)
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

    def patch_status(self, plural: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the status; the object as written."""
        return self.custom.patch_cluster_custom_object_status(
            GROUP, VERSION, plural, name, {"status": status})

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
