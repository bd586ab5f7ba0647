"""``python -m hyperplan.monitoring [--check] [--root DIR]``: write (or check) the generated files."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hyperplan.monitoring.generate import generated_files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hyperplan.monitoring", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail when a committed file differs")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: here)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    stale = []
    for rel, text in generated_files().items():
        path = args.root / rel
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {rel} ({time.monotonic() - started:.1f}s)")
    if stale:
        print("out of date (run `make dashboards`): " + ", ".join(stale), file=sys.stderr)
        return 1
    if args.check:
        print(f"all generated monitoring files are up to date ({time.monotonic() - started:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
