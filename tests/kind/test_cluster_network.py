"""The kind cluster's pod network works across nodes (the CNI of a locally built node image is our
own `podnet`, see docs/kind.md): pod to pod on another node, pod to Service by DNS name, pod to
the API server's Service."""

from __future__ import annotations

import pytest

from tests.kind.conftest import KindEnv
from tests.kube import eventually

NS = "kind-tier-net"
FETCH = ("import sys, ssl, urllib.request; ctx = ssl._create_unverified_context(); "
         "print(urllib.request.urlopen(sys.argv[1], timeout=5, context=ctx).read().decode()[:200])")


def _pod(name: str, node: str, image: str, command: list[str], labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                     "command": command}]}}


@pytest.fixture(scope="module")
def pods(kind: KindEnv):
    k = kind.kubectl
    k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    server, client = kind.workers[0], kind.workers[1]
    k.apply([
        _pod("web", server, kind.operator_image, ["python", "-m", "http.server", "8080"], {"app": "web"}),
        _pod("client", client, kind.operator_image, ["python", "-c", "import time; time.sleep(3600)"]),
        _pod("client-cp", kind.control_plane, kind.operator_image,
             ["python", "-c", "import time; time.sleep(3600)"]),
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": NS},
         "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}},
    ])
    k.run("-n", NS, "wait", "--for=condition=Ready", "pod/web", "pod/client", "pod/client-cp",
          "--timeout=120s")
    yield {p: k.get("pod", p, "-n", NS) for p in ("web", "client", "client-cp")}
    k.run("delete", "namespace", NS, "--wait=false")


def _fetch(kind: KindEnv, pod: str, url: str) -> str:
    def once() -> str | None:
        r = kind.kubectl.run("-n", NS, "exec", pod, "--", "python", "-c", FETCH, url, check=False)
        return r.stdout if r.returncode == 0 else None
    return eventually(once, timeout=60, interval=2, what=f"{pod} fetching {url}")


@pytest.mark.parametrize("client", ["client", "client-cp"], ids=["from-other-worker", "from-control-plane"])
def test_a_pod_reaches_a_pod_on_another_node_by_its_ip(kind: KindEnv, pods: dict, client: str) -> None:
    web = pods["web"]
    assert web["spec"]["nodeName"] != pods[client]["spec"]["nodeName"]
    assert "Directory listing" in _fetch(kind, client, f"http://{web['status']['podIP']}:8080/")


def test_a_pod_reaches_a_service_on_another_node_by_its_dns_name(kind: KindEnv, pods: dict) -> None:
    assert "Directory listing" in _fetch(kind, "client", f"http://web.{NS}.svc.cluster.local/")


def test_a_pod_reaches_the_api_server_through_the_kubernetes_service(kind: KindEnv, pods: dict) -> None:
    assert _fetch(kind, "client", "https://kubernetes.default.svc/livez").strip() == "ok"
