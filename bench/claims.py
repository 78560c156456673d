"""Claims and cancellations racing for one set of jobs, from several connections at once.

Starts its own embedded PostgreSQL, migrates it, creates ``--jobs`` queued exports, then lets claimers
(``exports_worker``) and cancelers (``exports_api``) work through the same jobs at the same time, twice:
in lockstep (every connection released onto the same job at once) and shuffled (each connection in its
own random order). Reports throughput and latencies, then checks from the rows that each race was
decided exactly once per job: every job ends Running or Canceled, never both; claims won + cancels won =
jobs; every recorded cancellation request's outcome matches what it found and what its caller was told;
and every request that found Running was recorded after that job's claim. One row per configuration.

    python -m bench claims                      (the defaults)
    python -m bench.claims [--jobs 1000] [--connections 1,2,4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from db.embedded import EmbeddedPostgres
from db.migrate import ensure_app_login, migrate
from db.pool import open_pool
from db.stores.api import ApiStore
from db.stores.protocol import WorkerStore
from domain.models import CancellationOutcome, ClaimResult

APP_LOGIN = "exports_app"
MODES = ("lockstep", "shuffled")


@dataclass
class Tally:
    """What the callers were told, and how long each call took."""

    claims: Counter[ClaimResult] = field(default_factory=Counter)
    cancels: Counter[CancellationOutcome] = field(default_factory=Counter)
    claim_ms: list[float] = field(default_factory=list)
    cancel_ms: list[float] = field(default_factory=list)
    claimed_by_attempt: dict[UUID, UUID] = field(default_factory=dict)  # job -> the attempt told Claimed


@dataclass
class Outcome:
    mode: str
    claimers: int
    cancelers: int
    jobs: int
    seconds: float
    tally: Tally
    problems: list[str]

    @property
    def ops(self) -> int:
        return len(self.tally.claim_ms) + len(self.tally.cancel_ms)


async def admin_rows(url: str, query: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params)
            return await cur.fetchall()


async def create_jobs(admin_url: str, api: ApiStore, count: int) -> tuple[UUID, list[UUID]]:
    """A tenant with one destination and ``count`` queued exports, created through the creation statement."""
    tenant_id, destination_id = uuid.uuid4(), uuid.uuid4()
    await admin_rows(
        admin_url,
        "WITH t AS (INSERT INTO tenants (id, name) VALUES (%(t)s, 'bench') RETURNING id)"
        " INSERT INTO destinations (id, tenant_id, name, host, port, username, host_key, credential_ref,"
        " remote_dir) SELECT %(d)s, id, 'bench-partner', '127.0.0.1', 22, 'partner', 'ssh-ed25519 AAAA',"
        " '/nonexistent', '/upload' FROM t RETURNING id",
        {"t": tenant_id, "d": destination_id},
    )
    # Deliveries are fail-closed (issue 9): the tenant and its destination are enabled explicitly.
    await admin_rows(
        admin_url,
        "INSERT INTO delivery_switches (scope, tenant_id, destination_id, enabled, reason, changed_by)"
        " VALUES ('tenant', %(t)s, NULL, true, 'bench', 'bench'), ('destination', %(t)s, %(d)s, true, 'bench', 'bench')"
        " RETURNING scope",
        {"t": tenant_id, "d": destination_id},
    )
    created: list[UUID] = []

    async def create(n: int) -> None:
        for _ in range(n):
            job = await api.create_original(
                tenant_id=tenant_id, destination_id=destination_id, list_name="main", created_by="bench"
            )
            created.append(job.job_id)

    per_task = [count // 4 + (1 if i < count % 4 else 0) for i in range(4)]
    await asyncio.gather(*(create(n) for n in per_task))
    return tenant_id, sorted(created)


async def claimer(
    store: WorkerStore,
    jobs: list[UUID],
    tally: Tally,
    start: asyncio.Event,
    name: str,
    step: asyncio.Barrier | None,
) -> None:
    await start.wait()
    for job_id in jobs:
        if step is not None:
            await step.wait()
        attempt = uuid.uuid4()
        began = time.perf_counter()
        result = await store.claim_if_queued(job_id, 1, attempt, name)
        tally.claim_ms.append((time.perf_counter() - began) * 1000)
        tally.claims[result] += 1
        if result == ClaimResult.CLAIMED:
            tally.claimed_by_attempt[job_id] = attempt


async def canceler(
    store: WorkerStore,
    tenant_id: UUID,
    jobs: list[UUID],
    tally: Tally,
    start: asyncio.Event,
    name: str,
    step: asyncio.Barrier | None,
) -> None:
    await start.wait()
    for job_id in jobs:
        if step is not None:
            await step.wait()
        began = time.perf_counter()
        result = await store.request_cancellation(
            tenant_id=tenant_id,
            job_id=job_id,
            request_id=uuid.uuid4(),
            requested_by=name,
            reason="bench",
            lock_timeout="30s",
        )
        tally.cancel_ms.append((time.perf_counter() - began) * 1000)
        tally.cancels[result.outcome] += 1


async def verify(admin_url: str, tenant_id: UUID, jobs: list[UUID], tally: Tally) -> list[str]:
    """Every check the race must pass, read from the rows; an empty list means it was decided once per job."""
    problems: list[str] = []
    rows = await admin_rows(
        admin_url,
        "SELECT j.id, j.status, j.attempt_id, j.stop_request_id, j.cancellation_request_id,"
        " (SELECT count(*) FROM export_attempt_events e WHERE e.job_id = j.id AND e.kind = 'Claimed') AS claims,"
        " (SELECT min(e.recorded_at) FROM export_attempt_events e"
        "   WHERE e.job_id = j.id AND e.kind = 'Claimed') AS claimed_at"
        " FROM export_jobs j WHERE j.tenant_id = %(t)s",
        {"t": tenant_id},
    )
    requests = await admin_rows(
        admin_url,
        "SELECT id, job_id, outcome, found_status, recorded_at FROM cancellation_requests WHERE tenant_id = %(t)s",
        {"t": tenant_id},
    )
    by_job = {r["id"]: r for r in rows}
    statuses = Counter(r["status"] for r in rows)
    running, canceled = statuses.get("Running", 0), statuses.get("Canceled", 0)
    claims_won = tally.claims[ClaimResult.CLAIMED]
    cancels_won = tally.cancels[CancellationOutcome.CANCELED_WHILE_QUEUED]

    if set(by_job) != set(jobs):
        problems.append("the tenant's jobs are not the jobs created")
    if set(statuses) - {"Running", "Canceled"}:
        problems.append(f"jobs outside Running/Canceled: {dict(statuses)}")
    if claims_won + cancels_won != len(jobs):
        problems.append(f"claims won {claims_won} + cancels won {cancels_won} != {len(jobs)} jobs")
    if (claims_won, cancels_won) != (running, canceled):
        problems.append(f"callers were told {claims_won}/{cancels_won}, rows say {running}/{canceled}")
    if tally.claims[ClaimResult.UNKNOWN] or tally.cancels[CancellationOutcome.BUSY]:
        problems.append("an Unknown claim or a Busy cancellation")

    for job in rows:
        if job["status"] == "Canceled" and job["claims"] != 0:
            problems.append(f"{job['id']} was both canceled and claimed")
        if job["status"] == "Running" and (
            job["claims"] != 1 or tally.claimed_by_attempt.get(job["id"]) != job["attempt_id"]
        ):
            problems.append(f"{job['id']} is Running without exactly one claim by the attempt told Claimed")

    expected_found = {
        "CanceledWhileQueued": "Queued",
        "StopRequested": "Running",
        "StopAlreadyRequested": "Running",
        "AlreadyCanceled": "Canceled",
    }
    recorded = Counter(r["outcome"] for r in requests)
    if recorded != Counter({k.value: v for k, v in tally.cancels.items() if v}):
        problems.append(f"recorded outcomes {dict(recorded)} differ from the answers {dict(tally.cancels)}")
    for request in requests:
        job = by_job[request["job_id"]]
        if expected_found.get(request["outcome"]) != request["found_status"]:
            problems.append(
                f"request {request['id']}: {request['outcome']} after finding {request['found_status']}"
            )
        if request["outcome"] == "CanceledWhileQueued" and job["cancellation_request_id"] != request["id"]:
            problems.append(f"request {request['id']} canceled a job that does not name it")
        if request["outcome"] == "StopRequested" and job["stop_request_id"] != request["id"]:
            problems.append(f"request {request['id']} requested a stop the job does not record")
        if request["found_status"] == "Running" and not request["recorded_at"] >= job["claimed_at"]:
            problems.append(f"request {request['id']} found Running before the claim was recorded")
    return problems


def order_for(job_ids: list[UUID], mode: str, seed: int) -> list[UUID]:
    """The order one connection walks the jobs in: the same for all (lockstep), or its own (shuffled)."""
    if mode == "lockstep":
        return job_ids
    shuffled = list(job_ids)
    random.Random(seed).shuffle(shuffled)
    return shuffled


async def race(pg: EmbeddedPostgres, database: str, jobs: int, connections: int, mode: str) -> Outcome:
    """One configuration: ``connections`` claimers and ``connections`` cancelers over ``jobs`` fresh jobs.

    lockstep: every connection is released onto the same job at the same moment (a barrier per job), so
    each job is contended by all of them. shuffled: each connection walks its own random order, so a job's
    fate depends on which side reaches it first, and collisions happen as they would in production.
    """
    admin_url, app_url = pg.url_for(database), pg.url_for(database, APP_LOGIN)
    worker_pool = await open_pool(app_url, "exports_worker", min_size=connections, max_size=connections)
    api_pool = await open_pool(app_url, "exports_api", min_size=connections, max_size=connections)
    try:
        worker, api = WorkerStore(worker_pool), ApiStore(api_pool)
        tenant_id, job_ids = await create_jobs(admin_url, api, jobs)
        tally, start = Tally(), asyncio.Event()
        step = asyncio.Barrier(2 * connections) if mode == "lockstep" else None
        tasks = [
            *(
                claimer(worker, order_for(job_ids, mode, i), tally, start, f"worker-{i}", step)
                for i in range(connections)
            ),
            *(
                canceler(
                    api, tenant_id, order_for(job_ids, mode, 1000 + i), tally, start, f"operator-{i}", step
                )
                for i in range(connections)
            ),
        ]
        running = [asyncio.create_task(t) for t in tasks]
        await asyncio.sleep(0)
        began = time.perf_counter()
        start.set()
        await asyncio.gather(*running)
        seconds = time.perf_counter() - began
        problems = await verify(admin_url, tenant_id, job_ids, tally)
        return Outcome(mode, connections, connections, jobs, seconds, tally, problems)
    finally:
        await worker_pool.close()
        await api_pool.close()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def print_table(outcomes: list[Outcome], version: str) -> None:
    print(f"claims vs cancellations on one set of jobs (PostgreSQL {version}, {os.cpu_count()} CPUs)")
    header = (
        "| mode | claim+cancel conns | jobs | ops | s | ops/s | claims won | cancels won | claim p50/p99 ms"
        " | cancel p50/p99 ms | verified |"
    )
    print(header)
    print("|" + "|".join("---" for _ in range(header.count("|") - 1)) + "|")
    for o in outcomes:
        t = o.tally
        print(
            f"| {o.mode} | {o.claimers}+{o.cancelers} | {o.jobs} | {o.ops} | {o.seconds:.2f} | {o.ops / o.seconds:,.0f}"
            f" | {t.claims[ClaimResult.CLAIMED]} | {t.cancels[CancellationOutcome.CANCELED_WHILE_QUEUED]}"
            f" | {statistics.median(t.claim_ms):.1f}/{percentile(t.claim_ms, 99):.1f}"
            f" | {statistics.median(t.cancel_ms):.1f}/{percentile(t.cancel_ms, 99):.1f}"
            f" | {'yes' if not o.problems else 'NO'} |"
        )
    for o in outcomes:
        answers = ", ".join(f"{k.value} {v}" for k, v in sorted(o.tally.cancels.items()))
        claims = ", ".join(f"{k.value} {v}" for k, v in sorted(o.tally.claims.items()))
        print(f"  {o.mode} {o.claimers}+{o.cancelers}: claims told {claims}; cancellations told {answers}")
        for problem in o.problems[:20]:
            print(f"  PROBLEM: {problem}")


async def main(jobs: int, connections: list[int]) -> int:
    """Run every configuration on one embedded server; returns 0 when every race verified."""
    pg = EmbeddedPostgres.start()
    try:
        database = "bench_claims"
        async with await psycopg.AsyncConnection.connect(pg.url, autocommit=True) as conn:
            await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
            version = (await (await conn.execute("SHOW server_version")).fetchone())[0]
        migrate(pg.url_for(database))
        ensure_app_login(pg.url, APP_LOGIN)
        outcomes = [await race(pg, database, jobs, n, mode) for mode in MODES for n in connections]
    finally:
        pg.stop()
    print_table(outcomes, version)
    return 0 if all(not o.problems for o in outcomes) else 1


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench claims", description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--connections", default="1,2,4", help="claim (and cancel) connections per run")
    options = parser.parse_args(argv)
    return asyncio.run(main(options.jobs, [int(n) for n in options.connections.split(",")]))


def run_with_defaults() -> None:
    """``python -m bench claims``: the default configurations; exits non-zero if a race did not verify."""
    if cli([]) != 0:
        raise SystemExit("bench claims: a race was not decided exactly once per job")


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
