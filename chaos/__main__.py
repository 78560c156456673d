"""``python -m chaos``: the project's soak. Exit code 0 when every invariant held, 1 on any violation,
2 when the soak itself could not run."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import signal
import sys
import traceback
from pathlib import Path

from chaos.config import FAULT_KINDS, SoakConfig


def parse_args(argv: list[str] | None = None) -> SoakConfig:
    parser = argparse.ArgumentParser(
        prog="python -m chaos",
        description="Start the real stack on loopback (embedded PostgreSQL, the Temporal dev server, an "
        "OpenSSH partner, worker.py processes, the API), drive exports through the HTTP API while "
        "injecting faults by real means, let recovery settle, and audit the invariants.",
    )
    parser.add_argument("--exports", type=int, default=300, help="exports to create (default 300)")
    parser.add_argument(
        "--recurring",
        type=int,
        default=3,
        help="recurring exports firing every minute during the load (default 3)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the plan: same seed, same schedule")
    parser.add_argument("--workers", type=int, default=3, help="worker.py processes (default 3)")
    parser.add_argument(
        "--duration", type=float, help="seconds of load and faults (default: 20 + 0.4 per export)"
    )
    parser.add_argument("--settle", type=float, default=180.0, help="bound on the wait for recovery (s)")
    parser.add_argument(
        "--faults",
        default=",".join(FAULT_KINDS),
        help=f"comma-separated fault kinds, or 'none' (default: all: {','.join(FAULT_KINDS)})",
    )
    parser.add_argument("--fault-every", type=float, default=5.0, help="mean seconds between faults")
    parser.add_argument(
        "--lease-seconds", type=float, default=6.0, help="EXPORTS_LEASE_SECONDS of the workers"
    )
    parser.add_argument("--report-json", type=Path, help="write the full report as JSON here")
    parser.add_argument("--run-dir", type=Path, help="directory for logs (default: a new one under /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the partner's files and the databases")
    parser.add_argument(
        "--temporary-files",
        choices=["keep", "remove"],
        default="keep",
        help="the partner's cleanup agreement for temporary files (default keep)",
    )
    parser.add_argument(
        "--encrypted-every",
        type=int,
        default=3,
        help="every n-th export goes to the destination that receives .csv.gz.pgp (default 3; 0: none)",
    )
    parser.add_argument(
        "--window-closed-every",
        type=int,
        default=4,
        help="the main destination's delivery window is closed one minute in every n (default 4; 0: none)",
    )
    parser.add_argument(
        "--session-limit",
        type=int,
        default=2,
        help="the partner's limit of concurrent sessions on the main destination (default 2; 0: none); the "
        "auditor checks the partner's own count against it",
    )
    args = parser.parse_args(argv)
    faults = () if args.faults == "none" else tuple(f.strip() for f in args.faults.split(",") if f.strip())
    unknown = [f for f in faults if f not in FAULT_KINDS]
    if unknown:
        parser.error(f"unknown fault kinds: {', '.join(unknown)}")
    if args.exports < 1 or args.workers < 1:
        parser.error("--exports and --workers must be at least 1")
    return SoakConfig(
        exports=args.exports,
        recurring=args.recurring,
        seed=args.seed,
        workers=args.workers,
        duration=args.duration,
        settle=args.settle,
        faults=faults,
        fault_every=args.fault_every,
        lease_seconds=args.lease_seconds,
        renew_every_seconds=max(0.5, args.lease_seconds / 3),
        report_json=args.report_json,
        run_dir=args.run_dir,
        keep=args.keep,
        temporary_files=args.temporary_files,
        encrypted_every=max(0, args.encrypted_every),
        window_closed_every=max(0, args.window_closed_every),
        session_limit=max(0, args.session_limit),
    )


def main(argv: list[str] | None = None) -> int:
    from chaos.report import render
    from chaos.soak import run_soak

    argv = sys.argv[1:] if argv is None else argv
    config = parse_args(argv)
    command = shlex.join([sys.executable, "-m", "chaos", *argv])

    async def soak() -> dict:
        main_task = asyncio.current_task()
        assert main_task is not None
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, main_task.cancel)  # tear down like Ctrl-C
        return await run_soak(config, command)

    try:
        report = asyncio.run(soak())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; everything the soak started was stopped", file=sys.stderr)
        return 2
    except Exception:  # noqa: BLE001 - the soak itself could not run: say why, exit 2 (not a violation)
        traceback.print_exc()
        print("the soak could not run; everything it started was stopped", file=sys.stderr)
        return 2
    print(render(report))
    if config.report_json is not None:
        config.report_json.write_text(json.dumps(report, indent=2, default=str))
        print(f"report: {config.report_json}")
    return 1 if report["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
