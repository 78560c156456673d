"""``python -m bench scale_workers`` / ``scale_db``: scale figures (issue 12, point 4).

1. **Workers** (``workers``): the same batch of exports (default 200, all of one list of the soak, so the
   work per export is fixed) through the soak's real stack (``chaos/stack.py``: embedded PostgreSQL, the
   Temporal dev server, an OpenSSH sshd partner, ``python starter.py serve`` and N real ``worker.py``
   processes), with 1, 2 and 4 workers, one fresh stack (fresh database, fresh dev server) per count. The
   exports are created through ``POST /exports`` as the soak's clients create them (one Idempotency-Key
   per export, the same key on every retry, Retry-After honoured), after a small warm-up batch; then every
   one must end Completed, or the run fails. Per worker count: exports/s from the first ``created_at`` of
   the batch to its last terminal write (``Finished`` event), both on the database clock; per-export
   latency p50/p95 (``created_at`` to its terminal event); the ratio to the 1-worker rate, the machine's
   CPU count and load average beside them, and how the claims spread over the workers. The workers run
   the production defaults of ``Settings`` (leases, recovery, sweeper) rather than the soak's short
   ones, so no sweep or takeover adds work to one count and not another; their metrics ports are off
   (several workers share this host).
2. **Database size** (``db``): a fresh migrated database loaded with 1,000,000 finished exports
   (Completed, Failed, Canceled, Stopped, Rejected, over 4 tenants, each with its deliveries row, its
   Claimed and terminal events and its published wake-up) and 100,000 Queued ones, against a freshly
   migrated database on the same server with the same tenants. Both then get the same probe exports
   (created through ``ApiStore.create_original``), and the same statements run on both, alternating,
   each on a row that can take it: the claim (``claim_if_queued``) on a fresh Queued probe per
   iteration, cutoff 2 (``authorize_delivery_if_running``) on that probe's Running attempt, recovery's
   scan (``find_expired_leases``, the recovery batch) once the probes' leases have expired, the
   sweeper's batch (``sweep_stale_queued``, the sweep batch of stale Queued jobs, in a transaction rolled
   back each time so the data stays the same size), and the API's list page (``page_tenant_jobs`` with
   the service's limit, the first page and a keyset page from the middle of the tenant's history). The
   claim, cutoff 2, the scan and the pages go through the real store methods on one-connection
   pools of their roles; the sweep runs the named statement from ``db/queries.py`` with the parameters
   the store binds. Printed per statement: the median ms on each side, their ratio (target within 2x),
   the server's own execution time on each side (one EXPLAIN ANALYZE), and the top nodes of the loaded side's ``EXPLAIN (ANALYZE, BUFFERS)`` (in a rolled-back transaction),
   with a check that neither the custom nor the generic plan reads export_jobs sequentially.
   ``tests/db/test_plans_at_scale.py`` checks those plans on 200,000 + 100,000 rows in ``make test``.

The rows are loaded as the superuser with ``generate_series``, with the triggers off for the load
(``session_replication_role = replica``: the guard admits only new Queued jobs, and this loads a
history), then ``VACUUM ANALYZE``, as autovacuum would have done. Nothing prints contact data.

    python -m bench scale_workers            # 200 exports with 1, 2 and 4 workers
    python -m bench scale_db                 # 1,000,000 finished + 100,000 queued against empty
    python -m bench.scale workers [--exports 200] [--workers 1,2,4] [--list small] [--warmup 8]
    python -m bench.scale db [--finished 1000000] [--queued 100000] [--tenants 4] [--iterations 50]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, LiteralString, cast
from uuid import UUID

import psycopg
from psycopg import sql

from chaos.client import ApiClient
from chaos.config import LISTS, SoakConfig
from chaos.driver import retry_after
from chaos.stack import WORKER_READY_LINE, Stack
from db.admin import seed_tenant
from db.pool import Role, open_pool
from db.queries import fetch, q
from db.rows import JobIdRow
from db.stores.api import ApiStore
from db.stores.base import StoreBase
from db.stores.protocol import WorkerStore
from db.stores.reads import NO_BOUND_ID, NO_BOUND_TIME
from db.stores.recovery import RecoveryStore
from domain.models import AuthorizationResult, ClaimResult, ExportJob, final_name_for
from settings import Settings
from testbed.pg import TestDatabase, clone_database, make_template, postgres_server

# -- shared --------------------------------------------------------------------------------------------

TARGET_RATIO = 2.0
PAGE_LIMIT = 100  # the list route's default; the service asks the store for one more row
PAGE_TIMEOUT_MS = (
    10_000  # the page's bound here: a timing, not a refusal (bench/console.py measures the bound)
)
SCAN_NODES = re.compile(r"(Seq Scan|Index Scan|Index Only Scan|Bitmap Heap Scan|Bitmap Index Scan)")


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0-100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


# ==========================================================================================================
# 1. workers
# ==========================================================================================================

TERMINAL = ("Canceled", "Rejected", "Stopped", "Failed", "Completed", "OutcomeUnknown")
TERMINAL_EVENTS = ("Finished", "ResolvedByRecovery", "Reconciled")
START_TIMEOUT_SECONDS = 240.0
CREATE_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True)
class WorkerRun:
    """One worker count's figures (seconds and exports/s on the database clock)."""

    workers: int
    exports: int
    seconds: float
    rate: float
    p50: float
    p95: float
    load: float
    spread: dict[str, int]
    attempts_over_one: int


def _say(prefix: str) -> Callable[[str], None]:
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{prefix} {time.monotonic() - started:6.1f}s] {text}", flush=True)

    return say


async def _create_exports(
    api: ApiClient, destination_id: str, list_name: str, n: int, deadline: float
) -> list[str]:
    """``n`` exports through ``POST /exports`` at once, as the soak's clients create them: one
    Idempotency-Key per export, the same key on every retry after no answer or a 5xx."""

    async def create() -> str:
        key = str(uuid.uuid4())
        body = {"destination_id": destination_id, "list_name": list_name}
        while time.monotonic() < deadline:
            response, _ = await api.request(
                "POST", "POST /exports", "/exports", json=body, headers={"Idempotency-Key": key}
            )
            if response is not None and response.status_code in (200, 201):
                return str(response.json()["export"]["id"])
            if response is not None and response.status_code < 500:
                raise SystemExit(f"POST /exports answered {response.status_code}: {response.text[:300]}")
            await asyncio.sleep(retry_after(response))
        raise SystemExit("POST /exports: no 200/201 answer before the deadline")

    return list(await asyncio.gather(*(create() for _ in range(n))))


async def _wait_terminal(
    admin_url: str, jobs: list[str], settle_seconds: float, say: Callable[[str], None]
) -> None:
    """Until every job has a terminal status; then every one must be Completed (else the run fails)."""
    deadline = time.monotonic() + settle_seconds
    last_report = time.monotonic()
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        while True:
            cur = await conn.execute(
                "SELECT status, count(*) FROM export_jobs WHERE id = ANY(%(ids)s::uuid[]) GROUP BY status",
                {"ids": jobs},
            )
            statuses: dict[str, int] = dict(await cur.fetchall())
            if sum(v for k, v in statuses.items() if k in TERMINAL) == len(jobs):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the batch did not settle within {settle_seconds:g} s: {statuses}")
            if time.monotonic() - last_report > 10:
                say(f"waiting: {statuses}")
                last_report = time.monotonic()
            await asyncio.sleep(0.25)
        if statuses != {"Completed": len(jobs)}:
            cur = await conn.execute(
                "SELECT j.id, j.status, j.failure_reason, array_agg(e.kind ORDER BY e.id)"
                " FROM export_jobs j LEFT JOIN export_attempt_events e ON e.job_id = j.id"
                " WHERE j.id = ANY(%(ids)s::uuid[]) AND j.status <> 'Completed'"
                " GROUP BY j.id, j.status, j.failure_reason LIMIT 20",
                {"ids": jobs},
            )
            for row in await cur.fetchall():
                print(f"  not Completed: {row}", file=sys.stderr)
            raise SystemExit(f"the batch ended {statuses}, not all Completed")


async def _figures(admin_url: str, jobs: list[str]) -> tuple[float, list[float], dict[str, int], int]:
    """(seconds from the first created_at to the last terminal event, per-export latencies in seconds,
    claims per worker, exports that took more than one attempt), all from the database."""
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        cur = await conn.execute(
            "SELECT j.id, j.created_at, j.claimed_by, j.attempt_count, max(e.recorded_at) AS finished_at"
            " FROM export_jobs j LEFT JOIN export_attempt_events e"
            "   ON e.job_id = j.id AND e.attempt_id = j.attempt_id AND e.kind = ANY(%(kinds)s::text[])"
            " WHERE j.id = ANY(%(ids)s::uuid[])"
            " GROUP BY j.id, j.created_at, j.claimed_by, j.attempt_count",
            {"ids": jobs, "kinds": list(TERMINAL_EVENTS)},
        )
        rows = await cur.fetchall()
    missing = [r[0] for r in rows if r[4] is None]
    if len(rows) != len(jobs) or missing:
        raise SystemExit(f"{len(missing)} exports have no terminal event ({len(rows)} of {len(jobs)} found)")
    first: datetime = min(r[1] for r in rows)
    last: datetime = max(r[4] for r in rows)
    latencies = [(r[4] - r[1]).total_seconds() for r in rows]
    spread = Counter(str(r[2]).rsplit(".", 1)[0] for r in rows)
    return (
        (last - first).total_seconds(),
        latencies,
        dict(sorted(spread.items())),
        sum(r[3] > 1 for r in rows),
    )


def _run_dir(workers: int) -> Path:
    """A fresh directory for one stack's logs and work directories."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"fenced-bench-scale-{workers}w-"))
    run_dir.chmod(0o755)  # PostgreSQL runs as its own user below it
    return run_dir


async def run_workers(
    workers: int, exports: int, list_name: str, warmup: int, settle_seconds: float
) -> WorkerRun:
    """One fresh stack with ``workers`` worker.py processes: a warm-up batch, then the measured batch."""
    s = Settings()
    config = SoakConfig(
        workers=workers,
        faults=(),
        lists={list_name: LISTS[list_name]},
        # Production defaults, not the soak's short leases: no sweep or takeover during a run.
        lease_seconds=s.lease_seconds,
        renew_every_seconds=s.renew_every_seconds,
        recovery_every_seconds=s.recovery_every_seconds,
        sweep_after_seconds=s.sweep_after_seconds,
        sweep_every_seconds=s.sweep_every_seconds,
        shutdown_grace_seconds=s.shutdown_grace_seconds,
        max_attempts=s.max_attempts,
    )
    say = _say(f"{workers}w")
    run_dir = _run_dir(workers)
    stack = Stack(config, run_dir)
    api: ApiClient | None = None
    ok = False
    try:
        await asyncio.wait_for(stack.start(say), START_TIMEOUT_SECONDS)
        for managed in stack.managed():
            if not managed.child.running():
                raise SystemExit(
                    f"{managed.name} is not running after start; its log: {managed.child.log_path}"
                )
        not_ready = [m.name for m in stack.workers if not m.child.log_contains(WORKER_READY_LINE)]
        if not_ready:
            raise SystemExit(f"workers {not_ready} never said they serve their queues; logs in {run_dir}")
        assert stack.token is not None and stack.destination_id is not None
        api = ApiClient(stack.api_url, stack.token)
        if warmup:
            say(f"warm-up: {warmup} exports")
            warm = await _create_exports(
                api, str(stack.destination_id), list_name, warmup, time.monotonic() + CREATE_TIMEOUT_SECONDS
            )
            await _wait_terminal(stack.admin_url, warm, settle_seconds, say)
        say(
            f"{exports} exports of the {list_name!r} list ({LISTS[list_name]} contacts each), created at once"
        )
        load_before = os.getloadavg()[0]
        jobs = await _create_exports(
            api, str(stack.destination_id), list_name, exports, time.monotonic() + CREATE_TIMEOUT_SECONDS
        )
        await _wait_terminal(stack.admin_url, jobs, settle_seconds, say)
        load = max(load_before, os.getloadavg()[0])
        seconds, latencies, spread, retried = await _figures(stack.admin_url, jobs)
        exits = [e for m in stack.managed() for e in m.exits]
        if exits:
            raise SystemExit(f"processes exited during the run: {[(e.name, e.code) for e in exits]}")
        ok = True
        return WorkerRun(
            workers=workers,
            exports=exports,
            seconds=seconds,
            rate=exports / seconds if seconds > 0 else float("inf"),
            p50=percentile(latencies, 50),
            p95=percentile(latencies, 95),
            load=load,
            spread=spread,
            attempts_over_one=retried,
        )
    finally:
        if api is not None:
            await api.aclose()
        say("stopping the stack")
        await stack.stop()
        if ok:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            print(f"logs kept in {run_dir}", file=sys.stderr)


def _require_sshd() -> None:
    """The soak's partner is a real OpenSSH sshd: it needs root and the Debian package."""
    if os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists():
        raise SystemExit("scale_workers needs root and /usr/sbin/sshd (the soak's OpenSSH partner)")


async def scale_workers(
    exports: int, counts: Sequence[int], list_name: str, warmup: int, settle_seconds: float
) -> list[WorkerRun]:
    """The same batch with each worker count in ``counts``, one fresh stack each; prints the table."""
    _require_sshd()
    # Several worker.py processes share this host: none serves a metrics port (their defaults would clash).
    os.environ.setdefault("EXPORTS_METRICS_PORT", "0")
    os.environ.setdefault("EXPORTS_TEMPORAL_METRICS_PORT", "0")
    runs = [await run_workers(n, exports, list_name, warmup, settle_seconds) for n in counts]
    base = next((r for r in runs if r.workers == 1), runs[0])
    cpus = os.cpu_count()
    print(
        f"\n{exports} exports of the {list_name!r} list per run, created at once through POST /exports; "
        f"one fresh stack per worker count; cpus: {cpus}"
    )
    print(
        f"{'workers':>7} {'seconds':>8} {'exports/s':>10} {f'vs {base.workers}w':>7} {'p50 s':>7} {'p95 s':>7}"
        f" {'cpus':>4} {'load':>5}  claims per worker"
    )
    for r in runs:
        spread = ", ".join(f"{k} {v}" for k, v in r.spread.items())
        retried = f"; {r.attempts_over_one} took more than one attempt" if r.attempts_over_one else ""
        print(
            f"{r.workers:>7} {r.seconds:>8.1f} {r.rate:>10.2f} {r.rate / base.rate:>6.2f}x {r.p50:>7.2f}"
            f" {r.p95:>7.2f} {cpus:>4} {r.load:>5.1f}  {spread}{retried}"
        )
    return runs


# ==========================================================================================================
# 2. database size
# ==========================================================================================================


@dataclass(frozen=True)
class Scope:
    """A tenant and its one destination, both enabled."""

    tenant_id: UUID
    destination_id: UUID


async def seed_scopes(admin_url: str, tenants: int) -> list[Scope]:
    """``tenants`` tenants, each with one enabled destination (``db.admin.seed_tenant``), no contacts."""
    scopes = []
    for i in range(tenants):
        seeded = await seed_tenant(
            admin_url,
            tenant_name=f"scale-{i}",
            destination_name="partner",
            destination={
                "host": "127.0.0.1",
                "port": 22,
                "username": "partner",
                "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPlaceholder",
                "credential_ref": "/nonexistent/key",
                "remote_dir": "/upload",
            },
            contacts=0,
        )
        scopes.append(Scope(seeded.tenant_id, seeded.destination_id))
    return scopes


# The history: ``finished`` jobs of a production-like mix (by mod(g / tenants, 100): 90 % Completed, 3 %
# Failed NotDelivered, 1 % BuildFailed, 1 % AttemptsExhausted, 3 % Canceled, 1 % Stopped, 1 % Rejected),
# then ``queued`` Queued jobs, the newest, woken within the last two hours (so most are due for a sweep).
# Job g belongs to tenant 1 + mod(g, tenants); created_at is one second per job, up to now.
LOAD: list[LiteralString] = [
    "SET session_replication_role = replica",
    """
    INSERT INTO deliveries (tenant_id, delivery_key, original_job_id)
    SELECT (%(tenants)s::uuid[])[1 + mod(g, %(t)s)], 'k' || g, md5('job' || g)::uuid
    FROM generate_series(1, %(total)s) g
    """,
    """
    INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, attempt_id, attempt_count, claimed_by,
        stop_request_id, expected_file_name, expected_file_bytes, expected_file_sha256, expected_file_rows,
        delivery_authorized_at, woken_at, failure_reason, delivery_key, created_by, list_name, rejection_code,
        rejection_reason, workflow_id, fence_expected, upload_fenced_at, rename_fenced_at, created_at)
    SELECT md5('job' || g)::uuid, (%(tenants)s::uuid[])[c.k], s.status, 1, (%(destinations)s::uuid[])[c.k],
        CASE WHEN s.attempted THEN md5('att' || g)::uuid END,
        CASE WHEN s.attempted THEN 1 ELSE 0 END,
        CASE WHEN s.attempted THEN 'bench-worker.1' END,
        CASE WHEN s.status = 'Stopped' THEN md5('stop' || g)::uuid END,
        CASE WHEN s.authorized THEN 'contacts-k' || g || '.csv' END,
        CASE WHEN s.authorized THEN 40000 + mod(g, 1000) END,
        CASE WHEN s.authorized THEN sha256(('file' || g)::bytea) END,
        CASE WHEN s.authorized THEN 400 END,
        CASE WHEN s.authorized THEN c.created_at + interval '20 s' END,
        CASE WHEN s.status = 'Queued' THEN now() - mod(g, 120) * interval '1 min' ELSE c.created_at END,
        s.failure, 'k' || g, 'bench', 'main',
        CASE WHEN s.status = 'Rejected' THEN 'contract_ended' END,
        CASE WHEN s.status = 'Rejected' THEN 'the partner contract ended' END,
        CASE WHEN s.attempted THEN 'export-' || md5('job' || g)::uuid || '-' || md5('msg' || g)::uuid END,
        s.authorized,
        CASE WHEN s.authorized THEN c.created_at + interval '21 s' END,
        CASE WHEN s.status = 'Completed' THEN c.created_at + interval '25 s' END,
        c.created_at
    FROM generate_series(1, %(total)s) g
    CROSS JOIN LATERAL (SELECT 1 + mod(g, %(t)s) AS k, mod(g / %(t)s, 100) AS m,
                               now() - (%(total)s - g) * interval '1 s' AS created_at) c
    CROSS JOIN LATERAL (SELECT
        CASE WHEN g > %(finished)s THEN 'Queued' WHEN c.m < 90 THEN 'Completed' WHEN c.m < 95 THEN 'Failed'
             WHEN c.m < 98 THEN 'Canceled' WHEN c.m < 99 THEN 'Stopped' ELSE 'Rejected' END AS status,
        g <= %(finished)s AND (c.m < 95 OR c.m = 98) AS attempted,
        g <= %(finished)s AND c.m < 93 AS authorized,
        CASE WHEN g > %(finished)s OR c.m < 90 OR c.m >= 95 THEN NULL WHEN c.m < 93 THEN 'NotDelivered'
             WHEN c.m < 94 THEN 'BuildFailed' ELSE 'AttemptsExhausted' END AS failure) s
    """,
    """
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, version, worker_id, recorded_at)
    SELECT id, attempt_id, 'Claimed', 1, claimed_by, created_at + interval '1 s'
    FROM export_jobs WHERE attempt_id IS NOT NULL
    """,
    """
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, detail, recorded_at)
    SELECT id, attempt_id,
           CASE WHEN status = 'Stopped' THEN 'Stopped' WHEN failure_reason = 'BuildFailed' THEN 'Failed'
                WHEN failure_reason = 'AttemptsExhausted' THEN 'AttemptsExhausted' ELSE 'Finished' END,
           claimed_by, status || coalesce(' ' || failure_reason, ''), created_at + interval '30 s'
    FROM export_jobs WHERE attempt_id IS NOT NULL
    """,
    """
    INSERT INTO outbox (message_id, kind, job_id, created_at, published_at)
    SELECT md5('msg' || g)::uuid, 'ExportReady', md5('job' || g)::uuid, now() - (%(total)s - g) * interval '1 s',
           now() - (%(total)s - g) * interval '1 s' + interval '50 ms'
    FROM generate_series(1, %(total)s) g
    """,
    "SET session_replication_role = origin",
]


def load(admin_url: str, scopes: Sequence[Scope], *, finished: int, queued: int) -> float:
    """Load the history above as the superuser, then VACUUM ANALYZE; returns the seconds it took."""
    started = time.perf_counter()
    params = {
        "tenants": [s.tenant_id for s in scopes],
        "destinations": [s.destination_id for s in scopes],
        "t": len(scopes),
        "finished": finished,
        "total": finished + queued,
    }
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for statement in LOAD:
            conn.execute(statement, params)
        for table in ("export_jobs", "deliveries", "export_attempt_events", "outbox"):
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table)))
        counts = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'Queued'), count(*) FROM export_jobs"
        ).fetchone()
    if counts != (queued, finished + queued):
        raise SystemExit(f"loaded {counts}, expected ({queued}, {finished + queued})")
    return time.perf_counter() - started


# -- the statements' parameters, as the store binds them ------------------------------------------------


def claim_params(job: ExportJob, attempt_id: UUID, *, lease_seconds: float, worker_id: str) -> dict[str, Any]:
    """``claim_if_queued`` as ``WorkerStore.claim_if_queued`` binds it (the workflow ID as the dispatcher names it)."""
    return {
        "job_id": job.id,
        "checked_version": job.version,
        "attempt_id": attempt_id,
        "worker_id": worker_id,
        "workflow_id": f"export-{job.id}-{uuid.uuid4()}",
        "lease_seconds": lease_seconds,
        "traceparent": None,  # the wake-up a claim outside its delivery window defers (issue #25.2)
    }


def cutoff2_params(job: ExportJob, attempt_id: UUID, *, lease_seconds: float) -> dict[str, Any]:
    """``authorize_delivery_if_running`` as ``WorkerStore.authorize_delivery_if_running`` binds it."""
    return {
        "tenant_id": job.tenant_id,
        "job_id": job.id,
        "attempt_id": attempt_id,
        "replaces_job_id": job.replaces_job_id,
        "final_name": final_name_for(job.delivery_key),
        "length": 40_123,
        "sha256": b"\x01" * 32,
        "rows": 400,
        "detail": json.dumps({"file": final_name_for(job.delivery_key)}),
        "destination_version": 1,  # the version the build read, as the worker passes it (issue #24.2)
        "lease_seconds": lease_seconds,
    }


def recovery_params(settings: Settings) -> dict[str, Any]:
    """``find_expired_leases`` as recovery runs it: ``RecoveryStore.find_expired_leases(limit=recovery_batch)``."""
    return {"limit": settings.recovery_batch}


def sweep_params(settings: Settings) -> dict[str, Any]:
    """``sweep_stale_queued`` as ``WorkerStore.sweep_stale_queued`` binds it with the sweeper's settings."""
    return {
        "older_than_seconds": settings.sweep_after_seconds,
        "batch": settings.sweep_batch,
        "traceparent": None,
    }


def page_params(tenant_id: UUID, before: tuple[datetime, UUID] | None = None) -> dict[str, Any]:
    """``page_tenant_jobs`` as the list route calls it (``Exports.page``: the default limit plus one, no
    filters) through ``ApiStore.page_tenant_jobs``."""
    created_at, last_id = before or (NO_BOUND_TIME, NO_BOUND_ID)
    return {
        "tenant_id": tenant_id,
        "before_created_at": created_at,
        "before_id": last_id,
        "destination_id": None,
        "list_name": None,
        "id_from": None,
        "id_to": None,
        "limit": PAGE_LIMIT + 1,
    }


# -- plans ------------------------------------------------------------------------------------------------


def _positional(text: str) -> str:
    """The statement with ``%(name)s`` placeholders as ``$n`` (one number per name), for GENERIC_PLAN."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    return re.sub(r"%\((\w+)\)s", number, text)


async def explain(
    conn: psycopg.AsyncConnection[Any],
    role: Role,
    name: str,
    params: dict[str, Any],
    *,
    analyze: bool = False,
    generic: bool = False,
) -> Any:
    """The plan of the named statement as ``role``, in a transaction that is rolled back (EXPLAIN ANALYZE
    runs a write): text lines with ``analyze`` (ANALYZE, BUFFERS), else the JSON plan; ``generic`` asks for
    the generic plan a prepared statement may switch to (PostgreSQL 16+), without values."""
    if analyze:
        prefix, args = "EXPLAIN (ANALYZE, BUFFERS) ", params
        text = q(name)
    elif generic:
        prefix, args, text = "EXPLAIN (GENERIC_PLAN, FORMAT JSON) ", None, _positional(q(name))
    else:
        prefix, args, text = "EXPLAIN (FORMAT JSON) ", params, q(name)
    async with conn.transaction(force_rollback=True):
        await conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
        cur = await conn.execute(prefix + text, args)
        rows = await cur.fetchall()
    if analyze:
        return [r[0] for r in rows]
    return rows[0][0][0]["Plan"]


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of a JSON plan, depth first (init plans and subplans included)."""
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def seq_scans_on(plan: dict[str, Any], table: str = "export_jobs") -> list[dict[str, Any]]:
    return [n for n in plan_nodes(plan) if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == table]


def index_scans_on(plan: dict[str, Any], table: str = "export_jobs") -> list[str]:
    """The indexes the plan reads ``table`` through."""
    return [
        n["Index Name"]
        for n in plan_nodes(plan)
        if n["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Index Scan")
        and (n.get("Relation Name") == table or table in n["Index Name"])
    ]


def execution_ms(lines: list[str]) -> float:
    """The execution time an EXPLAIN ANALYZE text plan reports."""
    for line in lines:
        if line.startswith("Execution Time:"):
            return float(line.split()[2])
    return float("nan")


def top_nodes(lines: list[str], width: int = 140, most: int = 14) -> list[str]:
    """The plan nodes of an EXPLAIN ANALYZE text plan (no detail lines), the scans of export_jobs always
    among them, and the execution time; long lines cut at ``width``."""
    nodes = [line for i, line in enumerate(lines) if i == 0 or "->" in line]
    if len(nodes) > most:  # keep the top of the tree and every scan of the jobs table
        top = nodes[: most // 2]
        nodes = top + [n for n in nodes[most // 2 :] if "export_jobs" in n or "Sort" in n or "Limit" in n]
    nodes += [line for line in lines if "Execution Time" in line]
    return [line if len(line) <= width else line[: width - 3] + "..." for line in nodes]


# -- the measurement --------------------------------------------------------------------------------------

STATEMENTS = (
    "claim_if_queued",
    "authorize_delivery_if_running",
    "find_expired_leases",
    "sweep_stale_queued",
    "page_tenant_jobs (first page)",
    "page_tenant_jobs (keyset, mid-history)",
)


@dataclass
class Side:
    """One database under measurement: its stores (one connection each), probes and timings."""

    label: str
    database: TestDatabase
    scopes: list[Scope]
    settings: Settings
    api: ApiStore | None = None
    worker: WorkerStore | None = None
    recovery: RecoveryStore | None = None
    probes: list[ExportJob] = field(default_factory=list)
    attempts: dict[UUID, UUID] = field(default_factory=dict)
    mid_bound: tuple[datetime, UUID] | None = None
    times: dict[str, list[float]] = field(default_factory=dict)
    plans: dict[str, list[str]] = field(default_factory=dict)
    seq_scans: dict[str, list[str]] = field(default_factory=dict)
    indexes: dict[str, list[str]] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[Side]:
        pools = []
        try:
            stores: tuple[tuple[str, str, type[StoreBase]], ...] = (
                ("api", "exports_api", ApiStore),
                ("worker", "exports_worker", WorkerStore),
                ("recovery", "exports_recovery", RecoveryStore),
            )
            for attr, role, store in stores:
                pool = await open_pool(self.database.app_url, cast(Role, role), min_size=1, max_size=1)
                pools.append(pool)
                setattr(self, attr, store(pool, lease_seconds=self.settings.lease_seconds))
            yield self
        finally:
            for pool in pools:
                await pool.close()

    async def admin(
        self, query: LiteralString, params: dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(self.database.admin_url, autocommit=True) as conn:
            cur = await conn.execute(query, params)
            return await cur.fetchall() if cur.description else []

    async def create_probes(self, claims: int, sweeps: int) -> None:
        """``claims`` fresh Queued exports for the claim (and then cutoff 2 and the scan), and ``sweeps``
        Queued ones whose wake-up is older than the sweep threshold, all in the first tenant."""
        assert self.api is not None and self.worker is not None
        scope = self.scopes[0]
        created = []
        for _ in range(claims + sweeps):
            made = await self.api.create_original(
                tenant_id=scope.tenant_id,
                destination_id=scope.destination_id,
                list_name="main",
                created_by="bench",
            )
            created.append(made.job_id)
        stale = created[claims:]
        await self.admin(
            "UPDATE export_jobs SET woken_at = clock_timestamp() - make_interval(secs => %(s)s)"
            " WHERE id = ANY(%(ids)s::uuid[]) AND status = 'Queued'",
            {"ids": stale, "s": self.settings.sweep_after_seconds + 15 * 60},
        )
        for job_id in created[:claims]:
            job = await self.worker.get_job(job_id)
            assert job is not None
            self.probes.append(job)
        await self.admin("ANALYZE export_jobs")  # as autovacuum would, on both sides alike
        rows = await self.admin(
            "SELECT created_at, id FROM export_jobs WHERE tenant_id = %(t)s ORDER BY created_at DESC, id DESC"
            " OFFSET (SELECT count(*) / 2 FROM export_jobs WHERE tenant_id = %(t)s) LIMIT 1",
            {"t": scope.tenant_id},
        )
        self.mid_bound = (rows[0][0], rows[0][1])

    def record(self, name: str, started: float) -> None:
        self.times.setdefault(name, []).append((time.perf_counter() - started) * 1000)

    async def plan(self, name: str, role: Role, statement: str, params: dict[str, Any]) -> None:
        """EXPLAIN (ANALYZE, BUFFERS) for the printout, and the custom and generic JSON plans' scans."""
        async with await psycopg.AsyncConnection.connect(self.database.app_url, autocommit=True) as conn:
            self.plans[name] = await explain(conn, role, statement, params, analyze=True)
            custom = await explain(conn, role, statement, params)
            generic = await explain(conn, role, statement, params, generic=True)
        self.indexes[name] = index_scans_on(custom)
        self.seq_scans[name] = [
            f"custom: {n['Node Type']} on {n['Relation Name']}" for n in seq_scans_on(custom)
        ] + [f"generic: {n['Node Type']} on {n['Relation Name']}" for n in seq_scans_on(generic)]


async def _alternating(
    sides: Sequence[Side], rounds: int, step: Callable[[Side, int], Awaitable[None]]
) -> None:
    """``rounds`` of ``step`` on each side in turn (the order flips every round): both sides share the
    machine's load of the moment."""
    for i in range(rounds):
        for side in sides if i % 2 == 0 else list(reversed(sides)):
            await step(side, i)


async def measure(sides: Sequence[Side], iterations: int) -> None:
    """Every statement on every side, alternating, each on rows that can take it; plans from each side."""
    settings = sides[0].settings

    async def claim(side: Side, i: int) -> None:
        assert side.worker is not None
        job, attempt = side.probes[i], uuid.uuid4()
        started = time.perf_counter()
        result = await side.worker.claim_if_queued(
            job.id, job.version, attempt, "bench-worker.1", f"export-{job.id}"
        )
        side.record("claim_if_queued", started)
        if result != ClaimResult.CLAIMED:
            raise SystemExit(f"{side.label}: the claim answered {result}")
        side.attempts[job.id] = attempt

    async def cutoff2(side: Side, i: int) -> None:
        assert side.worker is not None
        job = side.probes[i]
        params = cutoff2_params(job, side.attempts[job.id], lease_seconds=settings.lease_seconds)
        del params["lease_seconds"], params["detail"]  # the store binds its own
        started = time.perf_counter()
        result = await side.worker.authorize_delivery_if_running(**params)
        side.record("authorize_delivery_if_running", started)
        if result != AuthorizationResult.AUTHORIZED:
            raise SystemExit(f"{side.label}: cutoff 2 answered {result}")

    async def scan(side: Side, i: int) -> None:
        assert side.recovery is not None
        started = time.perf_counter()
        found = await side.recovery.find_expired_leases(limit=settings.recovery_batch)
        side.record("find_expired_leases", started)
        if len(found) != min(len(side.probes), settings.recovery_batch):
            raise SystemExit(f"{side.label}: recovery's scan found {len(found)} expired leases")

    async def sweep(side: Side, i: int) -> None:
        assert side.worker is not None
        async with side.worker.pool.connection() as conn, conn.transaction(force_rollback=True):
            started = time.perf_counter()
            swept = await fetch(conn, "sweep_stale_queued", sweep_params(settings), JobIdRow)
            side.record("sweep_stale_queued", started)
        if len(swept) != settings.sweep_batch:
            raise SystemExit(f"{side.label}: the sweep took {len(swept)} jobs, not {settings.sweep_batch}")

    async def page(side: Side, i: int) -> None:
        assert side.api is not None
        tenant = side.scopes[0].tenant_id
        for name, before in (
            ("page_tenant_jobs (first page)", None),
            ("page_tenant_jobs (keyset, mid-history)", side.mid_bound),
        ):
            started = time.perf_counter()
            jobs = await side.api.page_tenant_jobs(
                tenant, limit=PAGE_LIMIT + 1, before=before, timeout_ms=PAGE_TIMEOUT_MS
            )
            side.record(name, started)
            if len(jobs) != PAGE_LIMIT + 1:
                raise SystemExit(f"{side.label}: {name} returned {len(jobs)} rows")

    # Plans first, each on a row that can take it and rolled back: a Queued probe for the claim, then (once
    # it is claimed for real) its Running attempt for cutoff 2.
    for side in sides:
        job = side.probes[0]
        await side.plan(
            "claim_if_queued",
            "exports_worker",
            "claim_if_queued",
            claim_params(job, uuid.uuid4(), lease_seconds=settings.lease_seconds, worker_id="bench-worker.1"),
        )
    await _alternating(sides, iterations, claim)
    for side in sides:
        job = side.probes[0]
        await side.plan(
            "authorize_delivery_if_running",
            "exports_worker",
            "authorize_delivery_if_running",
            cutoff2_params(job, side.attempts[job.id], lease_seconds=settings.lease_seconds),
        )
    await _alternating(sides, iterations, cutoff2)
    for side in sides:  # every probe's upload outlived its lease: recovery's candidates
        await side.admin(
            "UPDATE export_jobs SET lease_expires_at = clock_timestamp() - interval '1 minute'"
            " WHERE id = ANY(%(ids)s::uuid[]) AND status = 'Delivering'",
            {"ids": [p.id for p in side.probes]},
        )
        await side.plan(
            "find_expired_leases", "exports_recovery", "find_expired_leases", recovery_params(settings)
        )
    await _alternating(sides, iterations, scan)
    for side in sides:
        await side.plan("sweep_stale_queued", "exports_worker", "sweep_stale_queued", sweep_params(settings))
    await _alternating(sides, iterations, sweep)
    for side in sides:
        tenant = side.scopes[0].tenant_id
        await side.plan(
            "page_tenant_jobs (first page)", "exports_api", "page_tenant_jobs", page_params(tenant)
        )
        await side.plan(
            "page_tenant_jobs (keyset, mid-history)",
            "exports_api",
            "page_tenant_jobs",
            page_params(tenant, side.mid_bound),
        )
    await _alternating(sides, iterations, page)


async def scale_db(finished: int, queued: int, tenants: int, iterations: int) -> dict[str, float]:
    """Load a history into one database, measure the statements against an empty one; prints the table."""
    settings = Settings()
    claims = iterations  # one fresh Queued probe per claim iteration
    with postgres_server() as server_url:
        template = make_template(server_url)
        empty = Side("empty", clone_database(server_url, template), [], settings)
        loaded = Side("loaded", clone_database(server_url, template), [], settings)
        for side in (empty, loaded):
            side.scopes = await seed_scopes(side.database.admin_url, tenants)
        seconds = await asyncio.to_thread(
            load, loaded.database.admin_url, loaded.scopes, finished=finished, queued=queued
        )
        print(
            f"loaded {finished:,} finished and {queued:,} queued exports over {tenants} tenants "
            f"(with deliveries, events and outbox rows) in {seconds:.1f} s"
        )
        async with empty.opened(), loaded.opened():
            for side in (empty, loaded):
                await side.create_probes(claims, settings.sweep_batch)
            sizes = {
                side.label: (await side.admin("SELECT count(*) FROM export_jobs"))[0][0]
                for side in (empty, loaded)
            }
            await measure((empty, loaded), iterations)

    print(
        f"\nmedian ms of {iterations} runs per statement, sides alternating; empty: {sizes['empty']:,} jobs "
        f"(the probes), loaded: {sizes['loaded']:,}; cpus: {os.cpu_count()}, load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'statement':<40} {'empty ms':>9} {'loaded ms':>10} {'ratio':>7}  {'target':<8}"
        f" {'server ms (EXPLAIN ANALYZE)':>27}  export_jobs read by (loaded)"
    )
    ratios: dict[str, float] = {}
    for name in STATEMENTS:
        e, lo = median(empty.times[name]), median(loaded.times[name])
        ratios[name] = lo / e
        verdict = "ok" if ratios[name] <= TARGET_RATIO else "OVER 2x"
        server = f"{execution_ms(empty.plans[name]):.2f} / {execution_ms(loaded.plans[name]):.2f}"
        print(
            f"{name:<40} {e:>9.2f} {lo:>10.2f} {ratios[name]:>6.2f}x  {verdict:<8} {server:>27}  "
            f"{', '.join(sorted(set(loaded.indexes[name]))) or '-'}"
        )
    for side, note in (
        (loaded, ""),
        (empty, " (on a table of a few hundred rows the planner may rightly read it all)"),
    ):
        found = [f"{name}: {', '.join(side.seq_scans[name])}" for name in STATEMENTS if side.seq_scans[name]]
        print(
            f"sequential scans of export_jobs on the {side.label} side (custom and generic plans): "
            + ("none" if not found else "; ".join(found) + note)
        )
    print("\nEXPLAIN (ANALYZE, BUFFERS) on the loaded side, top nodes:")
    for name in STATEMENTS:
        print(f"-- {name}")
        for line in top_nodes(loaded.plans[name]):
            print(f"   {line}")
    return ratios


# ==========================================================================================================


def workers_with_defaults() -> None:
    """``python -m bench scale_workers``: 200 exports with 1, 2 and 4 workers."""
    asyncio.run(
        scale_workers(exports=200, counts=(1, 2, 4), list_name="small", warmup=8, settle_seconds=900.0)
    )


def db_with_defaults() -> None:
    """``python -m bench scale_db``: a million finished and 100,000 queued exports against empty."""
    asyncio.run(scale_db(finished=1_000_000, queued=100_000, tenants=4, iterations=50))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="part", required=True)
    w = sub.add_parser("workers", help="the same batch with 1, 2 and 4 worker.py processes")
    w.add_argument("--exports", type=int, default=200)
    w.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated")
    w.add_argument(
        "--list", default="small", choices=sorted(LISTS), help="the soak's list every export exports"
    )
    w.add_argument("--warmup", type=int, default=8, help="exports run first on each stack, not measured")
    w.add_argument("--timeout", type=float, default=900.0, help="seconds a batch may take to settle")
    d = sub.add_parser("db", help="the statements on a loaded database against an empty one")
    d.add_argument("--finished", type=int, default=1_000_000)
    d.add_argument("--queued", type=int, default=100_000)
    d.add_argument("--tenants", type=int, default=4)
    d.add_argument("--iterations", type=int, default=50)
    options = parser.parse_args()
    if options.part == "workers":
        counts = [int(n) for n in options.workers.split(",") if n]
        asyncio.run(scale_workers(options.exports, counts, options.list, options.warmup, options.timeout))
    else:
        asyncio.run(scale_db(options.finished, options.queued, options.tenants, options.iterations))
    sys.exit(0)
