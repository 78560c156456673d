"""``python -m bench obs``: what observability costs, side by side in one run.

1. **Overhead** (``overhead``): the same batch of exports through the real stack (``POST /exports`` on the
   API, the outbox, the dispatcher, ``worker.run_worker`` on the Temporal dev server, the local SFTP
   partner, the terminal write) with metrics and tracing on (spans to an in-process exporter) against the
   same run with both off (JSON log lines at INFO on both sides), rounds in on/off pairs, wall time and
   this process's CPU time per batch; the median of the pairs' ratios is printed (target at most 1.03x).
   One stack serves both sides and is switched between rounds (``switched``, ``SwitchedTracing``,
   ``switched_app``: the production interceptor and the instrumented app, or past them): two stacks
   built alike differed by 2-3 % either way with everything off, as much as the target.
   The calibration (``--on "" --spin-us 1000``) puts a known amount of work on the event loop per export
   instead. 1 ms measured 1.026x wall, 1.016x CPU on 200-contact exports (86 ms of CPU each here: 1.012x
   expected) and 1.018x wall, 1.020x CPU on the seeds' (196 ms: 1.005x expected), the loop's thread
   +1.3 and +1.9 ms: work on the loop counts two to four times what it costs in a hot loop, here.
   The spans go to ``NamingExporter``, which counts and drops them as an OTLP exporter drops what it
   sent; the 95 % bootstrap interval of the median ratio is printed with it.
   What tracing and metrics add is a fixed cost per export (its spans, statements and transitions; no
   row is instrumented), printed in milliseconds of CPU, so the ratio depends on the export's size. The
   default run measures two: 8 exports of 48,112 contacts a batch, the export of the seeds' story
   (``make demo`` seeds 50,000), where the target is held, and 40 of 200 contacts, where the same fixed
   cost weighs most (3-4 ms of 61-73 here: 1.04-1.06x). It also prints an estimate from the
   instrumentation's unit costs measured in the same process (spans and counted transitions per export
   times their CPU cost, over the CPU an export costs with both off) and the CPU of each side by thread.
2. **Parts** (``parts``, ``bench/obs/parts.py``): what each part costs in one run. Every round runs the
   batch with everything off, everything on, and everything on but one part, in a shuffled order; a
   part's cost is what turning it off saves, in milliseconds of CPU per export, with its interval.
3. **Scrape** (``scrape``): a scrape of a worker's ``/metrics`` over HTTP with one million rows in
   export_jobs, uncached (every scrape runs the gauges query), under 50 ms; the plan of the gauges query
   (``read_database_gauges``) is printed and must read no table sequentially.

The million rows are loaded as the superuser with ``generate_series``, with the triggers of 0002 off for the
load (``session_replication_role = replica``: the insert guard admits only new Queued jobs, and this
loads a history). The data stays consistent: every job has its deliveries row, every claimed job its
Claimed event, every OutcomeUnknown its Finished event. The mix is a production-like history: 97 % Completed, the rest spread over the other
statuses, a few thousand live jobs, 10 % of leases expired, a million outbox rows of which 1,000 are
unpublished. ``VACUUM ANALYZE`` afterwards, as autovacuum would have done. Loading takes 60-90 s here,
which is why this is a benchmark and not a test; ``tests/observability/test_gauges_plan.py`` checks the
plan on a few thousand rows of the same mix.

    python -m bench obs                      # both
    python -m bench.obs overhead --on ""     # the control: the same stack, nothing switched on either side
    python -m bench.obs overhead --on "" --spin-us 1000   # the calibration: 1 ms of loop work per export
    python -m bench.obs overhead [--exports 40] [--contacts 200] [--rounds 20]
    python -m bench.obs overhead --exports 8 --contacts 48112   # the seeds' export
    python -m bench.obs parts [--rounds 24]   # each part's cost: off, all, all but each part
    python -m bench.obs overhead --partner sshd   # the partner in processes of its own (OpenSSH; root)
    python -m bench.obs overhead --gc-thresholds 700,10000   # rounds take the collector's thresholds in turn
    python -m bench.obs scrape

The package: ``overhead`` (the stack, its batches and rounds, the report), ``parts``, ``switching`` (what "on" and "off"
mean: ``switched``, ``SwitchedTracing``, ``switched_app``, ``NoMetrics``), ``measures`` (thread CPU, the
collector's clock, ``NamingExporter``, the bootstrap interval, the unit costs), ``scrape`` and the command
line in ``__main__``.
"""

from __future__ import annotations

import asyncio

from bench.obs.overhead import (
    CONTACTS,
    EXPORTS,
    OVERHEAD_TARGET,
    ROUNDS,
    SEED_CONTACTS,
    SEED_EXPORTS,
    overhead,
)
from bench.obs.scrape import explain, load, scrape

__all__ = ["explain", "load", "overhead", "run_with_defaults", "scrape"]


def run_with_defaults() -> None:
    """``python -m bench obs``: both parts, the default configuration (the overhead at both sizes)."""
    small = asyncio.run(overhead(exports=EXPORTS, contacts=CONTACTS, rounds=ROUNDS))
    seed = asyncio.run(overhead(exports=SEED_EXPORTS, contacts=SEED_CONTACTS, rounds=ROUNDS))
    for contacts, result in ((CONTACTS, small), (SEED_CONTACTS, seed)):
        said = (
            f"target at most {OVERHEAD_TARGET}x, held at this size"
            if contacts == SEED_CONTACTS
            else "the same fixed cost over a small export"
        )
        print(
            f"exports of {contacts:,} contacts: {result['ratio']:.3f}x wall "
            f"({result['ratio_low']:.3f}-{result['ratio_high']:.3f}), {result['cpu_ratio']:.3f}x CPU "
            f"({result['cpu_ratio_low']:.3f}-{result['cpu_ratio_high']:.3f}), "
            f"{result['cpu_per_export_s'] * 1e3:+.1f} ms of CPU an export ({said})"
        )
    asyncio.run(scrape())
