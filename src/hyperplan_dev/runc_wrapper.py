"""An OCI runtime wrapper for hosts whose capability bounding set lacks CAP_SYS_RESOURCE.

``docker run --privileged`` asks runc for every capability; on such a host runc fails with
``unable to apply caps: operation not permitted`` (and so does ``docker exec`` into a privileged
container). kind needs both. This wrapper removes CAP_SYS_RESOURCE from every capability set of
the container's process -- in the bundle's ``config.json`` on ``create``/``run`` and in the
``--process`` JSON on ``exec`` -- and then execs the real runc with the arguments unchanged.

``hyperplan dev kind up`` installs it (with the real runc's path filled in) only after it has seen
``--privileged`` fail that way, and registers it in ``/etc/docker/daemon.json``; see
``hostsetup.py``. It must stay dependency-free: it runs on every container start.
"""

import json
import os
import sys

REAL_RUNC = "@REAL_RUNC@"
DROP = "CAP_SYS_RESOURCE"
# runc's global flags that take a value (those before the subcommand).
GLOBAL_VALUE_FLAGS = {"--log", "--log-format", "--root", "--criu", "--rootless"}


def split_command(args):
    """(subcommand, index of the subcommand) in runc's argument list; (None, -1) if there is none."""
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-"):
            return a, i
        if a in GLOBAL_VALUE_FLAGS:
            i += 1
        i += 1
    return None, -1


def flag_value(args, names):
    """The value of the first of ``names`` (``--x v``, ``--x=v``, ``-x v``) in ``args``, or None."""
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(n + "="):
                return a[len(n) + 1:]
    return None


def drop_capability(process):
    """Remove DROP from every capability list of an OCI process object; True if anything changed."""
    caps = process.get("capabilities") if isinstance(process, dict) else None
    changed = False
    if isinstance(caps, dict):
        for key, values in caps.items():
            if isinstance(values, list) and DROP in values:
                caps[key] = [v for v in values if v != DROP]
                changed = True
    return changed


def rewrite(path, nested):
    """Drop the capability in a JSON file: the bundle's config.json (nested) or a process file."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return  # let runc report whatever is wrong with the file
    process = doc.get("process") if nested else doc
    if drop_capability(process):
        tmp = path + ".hyperplan-tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)


def main(argv):
    args = argv[1:]
    command, at = split_command(args)
    rest = args[at + 1:] if at >= 0 else []
    if command in ("create", "run"):
        bundle = flag_value(rest, ("--bundle", "-b")) or os.getcwd()
        rewrite(os.path.join(bundle, "config.json"), nested=True)
    elif command == "exec":
        process = flag_value(rest, ("--process", "-p"))
        if process:
            rewrite(process, nested=False)
    os.execv(REAL_RUNC, [REAL_RUNC, *args])


if __name__ == "__main__":
    main(sys.argv)
