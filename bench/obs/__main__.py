"""``python -m bench.obs [overhead|parts|scrape|both] [options]``: the command line of the package."""

from __future__ import annotations

import argparse
import asyncio
import sys

from bench.obs import __doc__ as overview
from bench.obs.overhead import COMPARED_GC, CONTACTS, EXPORTS, ROUNDS, overhead
from bench.obs.parts import parts
from bench.obs.scrape import scrape
from bench.obs.switching import ALL_PARTS, PARTS, SPIN, parse_parts


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.obs", description=(overview or "").splitlines()[0])
    parser.add_argument("part", nargs="?", choices=["overhead", "parts", "scrape", "both"], default="both")
    parser.add_argument("--exports", type=int, default=EXPORTS)
    parser.add_argument("--contacts", type=int, default=CONTACTS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument(
        "--on",
        default=",".join(ALL_PARTS),
        help=f"what 'on' turns on, of temporal (its three sides), {', '.join(ALL_PARTS)} (all)",
    )
    parser.add_argument(
        "--partner",
        choices=["asyncssh", "sshd", "auto"],
        default="asyncssh",
        help="the SFTP partner: the asyncssh server on this process's loop (the default), or OpenSSH's "
        "sshd in processes of its own (as root; auto: sshd where it can run)",
    )
    parser.add_argument(
        "--spin-us",
        type=float,
        default=0.0,
        help="the calibration: each POST /exports of an 'on' round also busies the event loop this long "
        "(with --on '' nothing else differs)",
    )
    parser.add_argument(
        "--gc-thresholds",
        default="",
        help="young-generation thresholds the rounds take in turn (700,10000), each reported apart",
    )
    options = parser.parse_args()
    SPIN["seconds"] = options.spin_us / 1e6
    COMPARED_GC.extend(int(t) for t in options.gc_thresholds.split(",") if t)
    try:
        chosen = parse_parts(options.on)
    except ValueError as exc:
        parser.error(str(exc))
    PARTS.clear()
    PARTS.update(chosen)
    if options.part in ("overhead", "both"):
        asyncio.run(overhead(options.exports, options.contacts, options.rounds, options.partner))
    if options.part == "parts":
        asyncio.run(parts(options.exports, options.contacts, options.rounds, options.partner))
    if options.part in ("scrape", "both"):
        asyncio.run(scrape())
    sys.exit(0)


if __name__ == "__main__":
    main()
