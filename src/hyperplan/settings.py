"""Operator settings, in one typed place, read from the environment (prefix ``HYPERPLAN_``)."""

from __future__ import annotations

from typing import Literal

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HYPERPLAN_", extra="ignore")

    policy: Literal["sagemaker", "demo"] = "sagemaker"
    """Policy profile: the rules of SageMaker training plans, or the same read in minutes."""

    kubeconfig: str | None = None
    """Kubeconfig to use; unset means $KUBECONFIG, then in-cluster configuration."""

    liveness_port: int = 8081
    """Port of the liveness endpoint (/healthz) on 0.0.0.0; 0 disables it."""

    metrics_port: int = 8000
    """Port of the Prometheus endpoint (/metrics); 0 disables it."""

    watch_server_timeout: int = 300
    """Seconds after which the API server closes a watch and kopf opens a new one."""

    ultraserver_id_label: str = "topology.k8s.aws/ultraserver-id"
    network_layer_labels: tuple[str, str, str] = (
        "topology.k8s.aws/network-node-layer-1",
        "topology.k8s.aws/network-node-layer-2",
        "topology.k8s.aws/network-node-layer-3",
    )

    verbose: bool = False
