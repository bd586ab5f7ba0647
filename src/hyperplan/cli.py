"""The ``hyperplan`` command: run the operator, manage the local control plane, write the CRDs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


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


def cmd_dev(args: argparse.Namespace) -> int:
    from hyperplan.devcluster.plane import Plane

    plane = Plane(log=_say)
    try:
        if args.action == "up":
            plane.up()
        elif args.action == "down":
            plane.down()
        elif args.action == "status":
            rows = plane.status()
            if not rows:
                _say("control plane is not running")
                return 1
            for name, state, where in rows:
                _say(f"{name:<24} {state:<22} {where}")
            _say(f"kubeconfig               {plane.kubeconfig}")
            return 0 if all(r[1].startswith("running") for r in rows) else 1
        elif args.action == "env":
            for line in plane.env_lines():
                print(line)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hyperplan", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the operator (settings from HYPERPLAN_* variables)")
    run.set_defaults(func=cmd_run)
    dev = sub.add_parser("dev", help="the local control plane: etcd, kube-apiserver, KWOK, ...")
    dev.add_argument("action", choices=["up", "down", "status", "env"])
    dev.set_defaults(func=cmd_dev)
    crd = sub.add_parser("crds", help="write (or --check) the CRDs generated from the API models")
    crd.add_argument("--out", default="crds")
    crd.add_argument("--check", action="store_true")
    crd.set_defaults(func=cmd_crds)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
