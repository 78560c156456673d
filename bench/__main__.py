"""``make bench`` / ``python -m bench [NAME ...]``: side-by-side comparisons, each printing its ratio.

Names: ``builder`` (the builder against ``psql \\copy``), ``upload`` (``deliver()`` against OpenSSH
``sftp``), ``claims`` (claims against cancellations on one set of jobs; its options:
``python -m bench.claims -h``), ``e2e`` (fenced exports end to end on the Temporal dev server against
the same workflow without its database writes, and stop-request latency; ``python -m bench.e2e -h``),
``notify`` (the terminal write with the outcome-notification trigger on against off, and the webhook
dispatcher's statements per event; ``python -m bench.notify -h``),
``bulk_cancel`` (10,000 queued exports cancelled in one batch against as many single-row UPDATEs on one
connection; ``python -m bench.bulk_cancel -h``),
``dispatch`` (the outbox dispatcher publishing 10,000 queued wake-ups against the SDK's own
``start_workflow`` at the same concurrency; ``python -m bench.dispatch -h``),
``obs`` (exports through the real stack with metrics and tracing on against off, and the scrape of
``/metrics`` with a million jobs; ``python -m bench.obs -h``),
``scale_workers`` (the same 200 exports through the soak's real stack with 1, 2 and 4 ``worker.py``
processes: exports/s, latency p50/p95, the ratio to one worker; ``python -m bench.scale workers -h``),
``scale_db`` (the claim, cutoff 2, recovery's scan, the sweep and the list page on a database of 1,000,000
finished and 100,000 queued exports against an empty one, with their plans; ``python -m bench.scale db -h``),
``pgp`` (an encrypted, gzipped, fenced delivery of 1M contacts to OpenSSH sshd against ``psql \\copy | gzip |
gpg --encrypt`` and ``sftp`` of the same rows, wall and CPU ratios; ``python -m bench.pgp -h``).
``recurring`` (1,000 recurring exports due in the same minute on the dev server: when the last firing
starts, when every firing's export exists, and that duplicate firings created nothing twice;
``python -m bench.recurring -h``).
``console`` (the console's export list, its counts and ``GET /exports``, the reconciler's queue and the audit
page over a ledger of 1,500,000 operator actions, at 10,000,000 exports against an empty database: p50 and p95
per request kind and per filter, and the plans; ``python -m bench.console -h``),
``index_cost`` (what the list's indexes of migration 0027 cost each write of an export's life, against the same
database as before 0027; ``python -m bench.index_cost -h``),
``gate`` (the hot path's statements with the pause-aware delivery gate of issue #26 against migration 0014's,
in alternating rounds on one database; ``python -m bench.gate -h``).
Without a name, all of them run, one after the other.
"""

from __future__ import annotations

import asyncio
import sys

from bench import (
    builder,
    bulk_cancel,
    claims,
    console,
    dispatch,
    e2e,
    gate,
    index_cost,
    notify,
    obs,
    pgp,
    recurring,
    scale,
    upload,
)

BENCHMARKS = {
    "builder": lambda: asyncio.run(builder.main(rows=1_000_000, runs=3)),
    "upload": lambda: upload.main(megabytes=200, runs=3),
    "claims": claims.run_with_defaults,
    "e2e": e2e.run_with_defaults,
    "notify": notify.run_with_defaults,
    "bulk_cancel": bulk_cancel.run_with_defaults,
    "dispatch": dispatch.run_with_defaults,
    "obs": obs.run_with_defaults,
    "scale_workers": scale.workers_with_defaults,
    "scale_db": scale.db_with_defaults,
    "pgp": pgp.run_with_defaults,
    "recurring": recurring.run_with_defaults,
    "console": console.run_with_defaults,
    "index_cost": index_cost.run_with_defaults,
    "gate": gate.run_with_defaults,
}

if __name__ == "__main__":
    names = sys.argv[1:] or list(BENCHMARKS)
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        raise SystemExit(f"unknown benchmark {unknown}; choose from {sorted(BENCHMARKS)}")
    for name in names:
        print(f"== {name}")
        BENCHMARKS[name]()
