"""Kueue on the local control plane: its configuration, webhooks and launch command.

Kueue (``build.KUEUE_VERSION``, built from its Go module with its CRDs and webhook manifests
copied next to the binary) runs outside the cluster like the other plane processes. What
that takes, and why (docs/kueue.md):

- **Webhooks on loopback.** Kueue serves its admission webhooks on ``127.0.0.1:<port>`` with
  a certificate for that IP signed by the plane's CA. Its own webhook manifests are rewritten
  to ``clientConfig.url`` with that CA as the bundle, keeping only the webhooks of Kueue's own
  kinds and of the enabled integrations: a webhook whose path nobody serves, with
  ``failurePolicy: Fail``, would block every create of its kind.
- **No internal cert management.** Kueue's cert rotator makes a certificate for the Service
  name ``<service>.<namespace>.svc``, which the API server cannot reach on loopback.
- **The metrics certificate path.** With internal cert management off, Kueue's ``main.go``
  reads ``/etc/kueue/metrics/certs/tls.{crt,key}`` unconditionally (even with metrics off) and
  exits when they are missing. The host's ``/etc`` is left alone: Kueue starts in a private
  mount namespace (``unshare --mount``) where a tmpfs-backed overlay on ``/etc`` holds the
  files; the overlay disappears with the process.
- **Webhook configurations are removed before Kueue stops** (:func:`delete_webhook_configurations`):
  the Job webhook has ``failurePolicy: Fail``, so a stopped Kueue would make every Job create fail.
"""

from __future__ import annotations

import base64
import copy
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any, Iterable

import yaml

from hyperplan_dev import build

NAMESPACE = "kueue-system"
GROUP = "kueue.x-k8s.io"
# Integrations Kueue manages on the plane (Kueue's `integrations.frameworks`), with the
# (API group, resource) whose webhooks they need. Pods are left out: a pod webhook would put
# Kueue in the path of every pod the tests and the operator create.
FRAMEWORKS: dict[str, tuple[str, str]] = {"batch/job": ("batch", "jobs")}
# Label on the webhook configurations the plane creates, so that they are found and deleted
# by it and never confused with anyone else's.
OWNER_LABEL = "hyperplan.dev/dev-plane"
OWNER_VALUE = "kueue"
WEBHOOK_CONFIGURATION_NAMES = {
    "MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
    "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration",
}
# A create of this object, dry-run on the server, goes through Kueue's mutating and
# validating ResourceFlavor webhooks: it succeeds only once they answer.
PROBE_OBJECT = {"apiVersion": f"{GROUP}/v1beta2", "kind": "ResourceFlavor",
                "metadata": {"name": "hyperplan-dev-plane-probe"}}


def crd_dir() -> Path:
    return build.component("kueue").dir / "crds"


def webhook_manifests() -> Path:
    return build.component("kueue").dir / "webhook-manifests.yaml"


def configuration(webhook_port: int, health_port: int, metrics_port: int, cert_dir: Path) -> dict[str, Any]:
    """Kueue's ``Configuration`` (config.kueue.x-k8s.io/v1beta2) for a loopback run."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "internalCertManagement": {"enable": False},
        "leaderElection": {"leaderElect": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "integrations": {"frameworks": list(FRAMEWORKS)},
        # The visibility API server wants certificates in /visibility; it is not needed here.
        "featureGates": {"VisibilityOnDemand": False},
    }


def _rule_targets(webhook: dict[str, Any]) -> set[tuple[str, str]]:
    return {(g, r.split("/")[0]) for rule in webhook.get("rules", [])
            for g in rule.get("apiGroups", []) for r in rule.get("resources", [])}


def webhook_configurations(manifests: str, port: int, ca_bundle: bytes,
                           frameworks: Iterable[str] = tuple(FRAMEWORKS)) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, pointed at ``https://127.0.0.1:<port>``.

    Kept: the webhooks whose every rule targets Kueue's own group or a resource of an
    enabled framework. Each ``clientConfig.service`` becomes a ``url`` with the same path,
    and ``caBundle`` is the plane's CA (PEM, base64-encoded as the API wants it).
    """
    allowed = {FRAMEWORKS[f] for f in frameworks}
    bundle = base64.b64encode(ca_bundle).decode()
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc or doc.get("kind") not in WEBHOOK_CONFIGURATION_NAMES:
            continue
        kept = []
        for hook in doc.get("webhooks", []):
            targets = _rule_targets(hook)
            if not targets or not all(g == GROUP or (g, r) in allowed for g, r in targets):
                continue
            hook = copy.deepcopy(hook)
            path = hook["clientConfig"].get("service", {}).get("path", "/")
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
            kept.append(hook)
        if not kept:
            continue
        out.append({
            "apiVersion": doc["apiVersion"], "kind": doc["kind"],
            "metadata": {"name": WEBHOOK_CONFIGURATION_NAMES[doc["kind"]],
                         "labels": {OWNER_LABEL: OWNER_VALUE}},
            "webhooks": kept,
        })
    return out


def launch_command(kueue: Path, config: Path, kubeconfig: Path, cert_dir: Path, overlay: Path) -> list[str]:
    """Run ``kueue`` in a private mount namespace whose ``/etc`` has the metrics certificate.

    ``overlay`` is an empty folder: inside the namespace a tmpfs is mounted on it, holding the
    overlay's upper and work folders, and ``/etc`` becomes an overlay of the host's ``/etc``
    plus ``kueue/metrics/certs/tls.{crt,key}``. Nothing is written to the host's ``/etc``,
    and the mounts vanish with the process. The shell ``exec``s Kueue, so the pid that
    ``unshare`` got is Kueue's own. Not root: ``--map-root-user`` makes an unprivileged
    user namespace for the mounts (Linux 5.11+ allows overlays there).
    """
    q = shlex.quote
    upper = overlay / "upper"
    script = "\n".join([
        "set -e",
        f"mount -t tmpfs -o mode=0700 hyperplan-kueue-etc {q(str(overlay))}",
        f"mkdir -p {q(str(upper / 'kueue' / 'metrics' / 'certs'))} {q(str(overlay / 'work'))}",
        f"cp {q(str(cert_dir / 'tls.crt'))} {q(str(cert_dir / 'tls.key'))} "
        f"{q(str(upper / 'kueue' / 'metrics' / 'certs'))}/",
        f"mount -t overlay hyperplan-kueue-etc -o lowerdir=/etc,upperdir={upper},workdir={overlay / 'work'} /etc",
        f"exec {q(str(kueue))} --config={q(str(config))} --kubeconfig={q(str(kubeconfig))}",
    ])
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare.append("--map-root-user")
    return [*unshare, "/bin/sh", "-c", script]


def delete_webhook_configurations(kubectl: Path, kubeconfig: Path, timeout: float = 20) -> str:
    """Delete the webhook configurations the plane made for Kueue; kubectl's output.

    Found by :data:`OWNER_LABEL`, so only the plane's own are touched. Raises
    ``RuntimeError`` with kubectl's message when the API server refuses or does not answer.
    """
    proc = subprocess.run(
        [str(kubectl), f"--kubeconfig={kubeconfig}", f"--request-timeout={int(timeout)}s",
         "delete", "mutatingwebhookconfigurations,validatingwebhookconfigurations",
         "-l", f"{OWNER_LABEL}={OWNER_VALUE}", "--ignore-not-found", "--wait=true"],
        capture_output=True, text=True, timeout=timeout + 10)
    if proc.returncode != 0:
        raise RuntimeError(f"deleting Kueue's webhook configurations failed: {proc.stderr.strip()}")
    return proc.stdout
