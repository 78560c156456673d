"""Bulk cancel against plain single-row UPDATEs, side by side in one run on one embedded PostgreSQL.

Creates two sets of ``--jobs`` queued exports of one destination. Ours: one bulk cancel through the
service (``BulkCancels.submit``: the batch and the exports it covers recorded in one statement, then each
export's own ledger transaction, one round trip each, on the service's lanes), timed from the call to its
answer. The reference: the same number of single-row ``UPDATE ... WHERE id = ... AND status = 'Queued'``
statements from psycopg on one connection (autocommit, one at a time), on the other set. Prints jobs/s for
each and the ratio (target: at least 0.2x), and checks that every export of the batch ended Canceled
with exactly one request.

    python -m bench bulk_cancel                 (10,000 jobs, one run)
    python -m bench.bulk_cancel [--jobs 10000] [--runs 1] [--lanes 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from db.embedded import EmbeddedPostgres
from db.migrate import ensure_app_login, migrate
from db.pool import open_pool
from db.stores.api import ApiStore
from service.auth import Caller
from service.bulk import BulkCancels
from service.commands import BulkCancel
from service.signals import NoSignaller

APP_LOGIN = "exports_app"
TARGET_RATIO = 0.2


async def admin(url: str, query: Any, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params or {})
            return await cur.fetchall() if cur.description else []


async def seed(url: str, jobs: int) -> tuple[UUID, UUID, list[UUID]]:
    """A tenant, a destination and ``jobs`` queued exports with their deliveries rows (as an administrator,
    in one statement: the creation statement itself is not what is measured)."""
    tenant_id, destination_id = uuid.uuid4(), uuid.uuid4()
    await admin(
        url,
        "WITH t AS (INSERT INTO tenants (id, name) VALUES (%(t)s, 'bench') RETURNING id)"
        " INSERT INTO destinations (id, tenant_id, name, host, port, username, host_key, credential_ref,"
        " remote_dir) SELECT %(d)s, id, 'bench-partner', '127.0.0.1', 22, 'partner', 'ssh-ed25519 AAAA',"
        " '/nonexistent', '/upload' FROM t",
        {"t": tenant_id, "d": destination_id},
    )
    rows = await admin(
        url,
        "WITH ids AS (SELECT gen_random_uuid() AS id, gen_random_uuid()::text AS k FROM generate_series(1, %(n)s)),"
        " d AS (INSERT INTO deliveries (tenant_id, delivery_key, original_job_id) SELECT %(t)s, k, id FROM ids)"
        " INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, delivery_key, created_by,"
        " woken_at, list_name) SELECT id, %(t)s, 'Queued', 1, %(d)s, k, 'bench', clock_timestamp(), 'main'"
        " FROM ids RETURNING id",
        {"n": jobs, "t": tenant_id, "d": destination_id},
    )
    await admin(url, "VACUUM ANALYZE export_jobs")
    return tenant_id, destination_id, [r["id"] for r in rows]


async def single_row_updates(app_url: str, job_ids: list[UUID]) -> float:
    """The reference: one conditional single-row UPDATE per job, one at a time, on one connection."""
    async with await psycopg.AsyncConnection.connect(app_url, autocommit=True) as conn:
        await conn.execute("SET ROLE exports_api")
        began = time.perf_counter()
        for job_id in job_ids:
            await conn.execute(
                "UPDATE export_jobs SET woken_at = clock_timestamp() WHERE id = %(id)s AND status = 'Queued'",
                {"id": job_id},
            )
        return time.perf_counter() - began


async def one_run(
    pg: EmbeddedPostgres, database: str, jobs: int, lanes: int
) -> tuple[float, float, list[str]]:
    url, app_url = pg.url_for(database), pg.url_for(database, APP_LOGIN)
    tenant_id, destination_id, _ = await seed(url, jobs)
    other_tenant, _, reference_jobs = await seed(url, jobs)

    reference_s = await single_row_updates(app_url, reference_jobs)

    pool = await open_pool(app_url, "exports_api", min_size=lanes, max_size=lanes + 1, name="bench-bulk")
    try:
        bulk = BulkCancels(ApiStore(pool), NoSignaller(), lock_timeout="2s", lanes=lanes)
        caller = Caller(tenant_id=tenant_id, principal="bench.ops", role="operator")
        body = BulkCancel(
            batch_id=uuid.uuid4(), destination_id=destination_id, reason="bench: contract ended"
        )
        began = time.perf_counter()
        answer = await bulk.submit(caller, body)
        ours_s = time.perf_counter() - began
    finally:
        await pool.close()

    problems = []
    if answer.body.get("outcomes") != {"CanceledWhileQueued": jobs}:
        problems.append(f"outcomes {answer.body.get('outcomes')}")
    check = await admin(
        url,
        "SELECT (SELECT count(*) FROM export_jobs WHERE tenant_id = %(t)s AND status = 'Canceled') AS canceled,"
        " (SELECT count(*) FROM cancellation_requests WHERE tenant_id = %(t)s AND batch_id = %(b)s) AS requests,"
        " (SELECT count(DISTINCT job_id) FROM cancellation_requests WHERE tenant_id = %(t)s) AS jobs_with_one",
        {"t": tenant_id, "b": body.batch_id},
    )
    if check[0] != {"canceled": jobs, "requests": jobs, "jobs_with_one": jobs}:
        problems.append(f"rows {check[0]}")
    del other_tenant
    return ours_s, reference_s, problems


async def main(jobs: int, runs: int, lanes: int) -> int:
    pg = EmbeddedPostgres.start()
    try:
        database = "bench_bulk_cancel"
        async with await psycopg.AsyncConnection.connect(pg.url, autocommit=True) as conn:
            await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        migrate(pg.url_for(database))
        ensure_app_login(pg.url, APP_LOGIN)
        results = []
        for i in range(runs):
            ours, reference, problems = await one_run(pg, database, jobs, lanes)
            ratio = reference / ours
            load = os.getloadavg()[0]
            print(
                f"run {i + 1}: bulk cancel {jobs / ours:,.0f} jobs/s ({ours:.2f} s, {lanes} lanes), "
                f"single-row UPDATEs {jobs / reference:,.0f} rows/s ({reference:.2f} s, 1 connection): "
                f"ratio {ratio:.2f}x (target >= {TARGET_RATIO}x), load avg {load:.1f}"
                + (f"; PROBLEMS: {problems}" if problems else "; verified")
            )
            results.append((ratio, problems))
    finally:
        pg.stop()
    median = statistics.median(r for r, _ in results)
    print(f"median ratio {median:.2f}x over {runs} run(s)")
    return 0 if all(not p for _, p in results) else 1


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bulk_cancel", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--lanes", type=int, default=4, help="connections the bulk cancel uses at once")
    args = parser.parse_args(argv)
    return asyncio.run(main(args.jobs, args.runs, args.lanes))


def run_with_defaults() -> None:
    """``python -m bench bulk_cancel``: 10,000 jobs, one run; exits non-zero if the batch did not verify."""
    if cli([]) != 0:
        raise SystemExit("bench bulk_cancel: the batch did not cancel every export exactly once")


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
