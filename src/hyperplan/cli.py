"""The ``hyperplan`` command: run the operator, show its status, manage the local control plane, write the CRDs.

``hyperplan dev ...`` runs the checkout's dev tools (:mod:`hyperplan_dev`), which the wheel and the
operator's image do not hold; it imports them only when asked, and says where to get them.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

DEV_TOOLS_MISSING = "hyperplan dev needs the checkout's dev tools: pip install -e . from the repository"


def _say(line: str) -> None:
    print(line, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from hyperplan.operator import run_operator

    try:
        return run_operator()
    except (ValidationError, SettingsError) as e:  # a bad HYPERPLAN_* variable: say which, no traceback
        print(f"error: invalid setting: {e}", file=sys.stderr)
        return 2


def cmd_kind(action: str | None) -> int:
    from hyperplan_dev.hostsetup import HostSetupError
    from hyperplan_dev.kind import KindCluster

    cluster = KindCluster(log=_say)
    try:
        if action == "up":
            cluster.up()
            _say(f"kubeconfig: {cluster.kubeconfig}")
        elif action == "build":
            cluster.prepare()
        elif action == "down":
            cluster.down()
        elif action == "status":
            rows = cluster.status()
            for name, state in rows:
                _say(f"{name:<28} {state}")
            return 0 if any(n.startswith("kind cluster") and s == "answers" for n, s in rows) else 1
        else:
            print("usage: hyperplan dev kind up|down|status|build", file=sys.stderr)
            return 2
    except (RuntimeError, HostSetupError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("hyperplan_dev") is None:
        print(f"error: {DEV_TOOLS_MISSING}", file=sys.stderr)
        return 1
    if args.action == "kind":
        if args.name is not None:
            print("error: --name is for the local control planes; the kind cluster has no name to choose",
                  file=sys.stderr)
            return 2
        return cmd_kind(args.kind_action)
    from hyperplan_dev.karpenter import Karpenter
    from hyperplan_dev.plane import Plane

    try:
        plane = Plane(log=_say, name=args.name)
    except ValueError as e:  # a bad --name
        print(f"error: {e}", file=sys.stderr)
        return 2
    karpenter = Karpenter(plane)
    try:
        if args.action == "up":
            plane.up()
            if args.karpenter:
                karpenter.start()
        elif args.action == "down":
            if karpenter.running():  # before the API server it talks to
                karpenter.stop()
            plane.down()
        elif args.action == "status":
            rows = plane.status()
            if not rows:
                _say(f"{plane.title} is not running")
                return 1
            if karpenter.state() is not None:
                st = karpenter.state()
                rows.append(("karpenter", f"running (pid {st.pid})" if karpenter.running() else "stopped",
                             f"health :{st.ports.get('health')}"))
                classes = karpenter.node_classes()
                rows.append(("karpenter node classes", f"{len(classes)} present" if classes else "none",
                             ", ".join(f"KWOKNodeClass/{c}" for c in classes) or
                             "no KWOKNodeClass: `hyperplan dev up --karpenter` creates the default"))
            for name, state, where in rows:
                _say(f"{name:<24} {state:<22} {where}")
            _say(f"kubeconfig               {plane.kubeconfig}")
            return 0 if all(r[1].startswith("running") for r in rows if r[0] != "karpenter node classes") else 1
        elif args.action == "env":
            for line in plane.env_lines():
                print(line)
            if karpenter.state() is not None:  # the offerings the operator checks a karpenter group against
                print(f"export HYPERPLAN_KARPENTER_INSTANCE_TYPES_FILE={karpenter.instance_types_file}")
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_crds(args: argparse.Namespace) -> int:
    from hyperplan.api import crds

    out = Path(args.out)
    if args.check:
        stale = [crds.file_name(k) for k in crds.KINDS
                 if not (out / crds.file_name(k)).is_file()
                 or (out / crds.file_name(k)).read_text() != crds.render(k)]
        if stale:
            print(f"out of date: {', '.join(stale)}; run `hyperplan crds`", file=sys.stderr)
            return 1
        return 0
    for path in crds.write_all(out):
        _say(f"wrote {path}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from hyperplan.status import StatusError, run_command

    if args.interval <= 0:
        print("error: --interval must be a positive number of seconds", file=sys.stderr)
        return 2
    try:
        return run_command(args.kubeconfig, args.output, args.watch, args.interval)
    except StatusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def cmd_api_key(args: argparse.Namespace) -> int:
    """Mint an access key for the SageMaker API: a Secret in the keys' namespace, mapped to a
    Kubernetes user or ServiceAccount, printed once as the two variables AWS clients read."""
    from kubernetes.client.exceptions import ApiException

    from hyperplan.actuation.kube import api_client
    from hyperplan.sagemaker.access import key_secret, new_key
    from hyperplan.settings import Settings

    if args.user.startswith("system:serviceaccount:") and len(args.user.split(":")) != 4:
        print("error: a ServiceAccount is system:serviceaccount:<namespace>:<name>", file=sys.stderr)
        return 2
    settings = Settings()
    namespace = args.namespace or settings.api_key_namespace or settings.pod_namespace or "default"
    key = new_key(args.user)
    from kubernetes import client

    try:
        client.CoreV1Api(api_client(args.kubeconfig or settings.kubeconfig)).create_namespaced_secret(
            namespace, key_secret(key, namespace))
    except ApiException as e:
        print(f"error: could not store the key in namespace {namespace}: {e.status} {e.reason}", file=sys.stderr)
        return 1
    print(f"# key for {key.user}, stored in Secret {namespace}/{key_secret(key, namespace)['metadata']['name']}",
          file=sys.stderr)
    print(f"AWS_ACCESS_KEY_ID={key.key_id}")
    print(f"AWS_SECRET_ACCESS_KEY={key.secret}")
    return 0


MAX_NODES_PER_CALL = 25  # as BatchRebootClusterNodes and BatchReplaceClusterNodes


def cmd_node(args: argparse.Namespace) -> int:
    """Ask for a reboot or a replacement of nodes, as an admin does with HyperPod's health label:
    each node gets ``hyperplan.dev/node-health-status=UnschedulablePendingReboot`` (or
    ``...Replacement``), and its group's pass carries it out (planning.recovery), promoting the
    spare first when the node is active. Every node is checked to exist before any is labelled."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from hyperplan.actuation.kube import api_client
    from hyperplan.planning import naming
    from hyperplan.settings import Settings

    if len(args.nodes) > MAX_NODES_PER_CALL:
        print(f"error: at most {MAX_NODES_PER_CALL} nodes a call (as BatchRebootClusterNodes and "
              f"BatchReplaceClusterNodes), got {len(args.nodes)}: split them into several calls", file=sys.stderr)
        return 2
    value = naming.HEALTH_PENDING_REBOOT if args.action == "reboot" else naming.HEALTH_PENDING_REPLACEMENT
    core = client.CoreV1Api(api_client(args.kubeconfig or Settings().kubeconfig))
    missing, foreign = [], []
    for name in dict.fromkeys(args.nodes):
        try:
            node = core.read_node(name)
        except ApiException as e:
            if e.status != 404:
                raise
            missing.append(name)
            continue
        if naming.LABEL_GROUP not in (node.metadata.labels or {}):
            foreign.append(name)
    if missing or foreign:
        for name in missing:
            print(f"error: node {name} does not exist", file=sys.stderr)
        for name in foreign:
            print(f"error: node {name} is not in an instance group (no {naming.LABEL_GROUP} label)", file=sys.stderr)
        print("nothing was changed", file=sys.stderr)
        return 1
    for name in dict.fromkeys(args.nodes):
        core.patch_node(name, {"metadata": {"labels": {naming.LABEL_HEALTH: value}}})
        print(f"{name}: {args.action} requested ({naming.LABEL_HEALTH}={value})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hyperplan", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the operator (settings from HYPERPLAN_* variables)")
    run.set_defaults(func=cmd_run)
    dev = sub.add_parser("dev", help="the local control plane (etcd, kube-apiserver, KWOK, ...), "
                                     "a further one with --name, "
                                     "or `dev kind up|down|status`: a kind cluster with the chart "
                                     "(from the checkout: pip install -e .)")
    dev.add_argument("action", choices=["up", "down", "status", "env", "kind"])
    dev.add_argument("kind_action", nargs="?", choices=["up", "down", "status", "build"],
                     help="with `kind`: create, delete or describe the kind cluster, or only "
                          "build (or pull) what it needs")
    dev.add_argument("--name", default=None,
                     help="a further local control plane beside the default one, e.g. capacity or "
                          "training-a (a DNS label): its own state in .state/dev/planes/NAME and its "
                          "own free ports; named planes run without Kueue. Without --name: the "
                          "default plane in .state/dev, with Kueue")
    dev.add_argument("--karpenter", action="store_true",
                     help="with `up`: also start Karpenter's kwok provider beside the plane "
                          "(docs/karpenter.md; `make binaries` builds it); `down` stops it when it runs")
    dev.set_defaults(func=cmd_dev)
    crd = sub.add_parser("crds", help="write (or --check) the CRDs generated from the API models")
    crd.add_argument("--out", default="crds")
    crd.add_argument("--check", action="store_true")
    crd.set_defaults(func=cmd_crds)
    status = sub.add_parser("status", help="plans with their blocks on a time axis, UltraServers, group nodes")
    status.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG, then in-cluster)")
    status.add_argument("-o", "--output", choices=["table", "json"], default="table")
    status.add_argument("-w", "--watch", action="store_true", help="refresh in place (JSON: one document a line)")
    status.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes with --watch")
    status.set_defaults(func=cmd_status)
    key = sub.add_parser("api-key", help="access keys of the SageMaker API (docs/sagemaker-api.md)")
    key.add_argument("action", choices=["create"])
    key.add_argument("--user", required=True,
                     help="the Kubernetes identity the key acts as: a user name or "
                          "system:serviceaccount:<namespace>:<name>")
    key.add_argument("--namespace", default=None,
                     help="where the key's Secret goes (default: HYPERPLAN_API_KEY_NAMESPACE, $POD_NAMESPACE, default)")
    key.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG, then in-cluster)")
    key.set_defaults(func=cmd_api_key)
    node = sub.add_parser("node", help="ask for a reboot or a replacement of group nodes (at most 25 a call); "
                                       "their groups carry it out, the spare promoted first")
    node.add_argument("action", choices=["reboot", "replace"])
    node.add_argument("nodes", nargs="+", metavar="NODE")
    node.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG, then in-cluster)")
    node.set_defaults(func=cmd_node)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
