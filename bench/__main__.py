"""Run benchmarks: ``python -m bench`` (``make bench``) runs every module of this package in turn,
``python -m bench NAME ...`` only the named ones. Options after the names go to each named module, e.g.
``python -m bench claims --jobs 500`` or ``python -m bench builder --rows 100000``.

Each module is run exactly as ``python -m bench.NAME`` would run it: its ``__main__`` block parses its own
options (with its own defaults) and prints its side-by-side figures; a non-zero exit status is reported.
"""

from __future__ import annotations

import pkgutil
import runpy
import sys
from pathlib import Path


def available() -> list[str]:
    """Every benchmark module in this package, by name."""
    return sorted(
        m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if not m.name.startswith("_")
    )


def run(name: str, options: list[str]) -> int:
    """Run ``bench.NAME`` as ``__main__`` with ``options``; its exit status (0 when it returns normally)."""
    saved = sys.argv
    sys.argv = [f"python -m bench.{name}", *options]
    try:
        runpy.run_module(f"bench.{name}", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    finally:
        sys.argv = saved
    return 0


def main(argv: list[str]) -> int:
    split = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))
    names, options = argv[:split], argv[split:]
    unknown = sorted(set(names) - set(available()))
    if unknown:
        print(f"no such benchmark: {', '.join(unknown)} (have: {', '.join(available())})", file=sys.stderr)
        return 2
    failed = []
    for name in names or available():
        print(f"== bench {name} ==", flush=True)
        if run(name, options) != 0:
            failed.append(name)
        print(flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
