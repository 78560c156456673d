"""The outbox dispatcher against the SDK's own ``start_workflow``, side by side in one run on the dev server.

Queues ``--wakeups`` wake-ups (outbox rows of real Queued jobs, written as the sweeper writes them) and
times ``OutboxDispatcher.dispatch_once`` publishing all of them: lease a batch, commit, start the
workflows concurrently, mark them published. The reference starts the same number of ``ExportWorkflow``
runs, with the same input, IDs of the same shape, the same ID policies and the same ``concurrency``,
straight from a client: no database at all. The ratio of the two rates is the cost of the outbox
(target: at least 0.8x). Nothing polls the task queue, so only the starts are measured. Each round runs
ours, the SDK, the SDK, ours (the dev server slows down as its history grows, and the machine's load
drifts: the order spreads both over the two sides alike); the rates are over all runs of a side.

    python -m bench dispatch
    python -m bench.dispatch [--wakeups 10000] [--concurrency 32] [--batch 50] [--passes 2] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from db.pool import open_pool
from db.stores.api import ApiStore
from db.stores.outbox import DispatcherStore
from domain.models import OutboxMessage
from runtime.dispatcher import OutboxDispatcher, export_input
from settings import Settings
from testbed.pg import TestDatabase, clone_database, make_template, postgres_server
from testbed.temporal import start_dev_server
from workflows.export import ExportWorkflow, export_summary, export_workflow_id


async def admin(url: str, query: Any, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params or {})
            return await cur.fetchall() if cur.description else []


async def create_jobs(database: TestDatabase, count: int) -> list[UUID]:
    """``count`` Queued exports of one tenant, created through the creation statement (4 connections)."""
    tenant_id, destination_id = uuid.uuid4(), uuid.uuid4()
    await admin(
        database.admin_url,
        "WITH t AS (INSERT INTO tenants (id, name) VALUES (%(t)s, 'bench') RETURNING id)"
        " INSERT INTO destinations (id, tenant_id, name, host, port, username, host_key, credential_ref,"
        " remote_dir) SELECT %(d)s, id, 'bench-partner', '127.0.0.1', 22, 'partner', 'ssh-ed25519 AAAA',"
        " '/nonexistent', '/upload' FROM t",
        {"t": tenant_id, "d": destination_id},
    )
    pool = await open_pool(database.app_url, "exports_api", max_size=4)
    api = ApiStore(pool)
    created: list[UUID] = []

    async def create(n: int) -> None:
        for _ in range(n):
            job = await api.create_original(
                tenant_id=tenant_id, destination_id=destination_id, list_name="main", created_by="bench"
            )
            created.append(job.job_id)

    try:
        await asyncio.gather(*(create(count // 4 + (1 if i < count % 4 else 0)) for i in range(4)))
    finally:
        await pool.close()
    return created


async def queue_wakeups(database: TestDatabase, jobs: list[UUID]) -> None:
    """One new unpublished wake-up per job, as the sweeper writes them (the creations' rows are published)."""
    await admin(
        database.admin_url,
        "INSERT INTO outbox (message_id, kind, job_id, created_at)"
        " SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp() FROM unnest(%(jobs)s::uuid[]) id",
        {"jobs": jobs},
    )


async def unpublished(database: TestDatabase) -> int:
    [row] = await admin(database.admin_url, "SELECT count(*) AS n FROM outbox WHERE published_at IS NULL")
    return int(row["n"])


async def sdk_starts(client: Client, settings: Settings, jobs: list[UUID], concurrency: int) -> float:
    """The reference: start one ExportWorkflow per job straight from the client, ``concurrency`` at once."""
    slots = asyncio.Semaphore(concurrency)

    async def start(job_id: UUID) -> None:
        msg = OutboxMessage(
            message_id=uuid.uuid4(), kind="ExportReady", job_id=job_id, created_at=datetime.now(UTC)
        )
        async with slots:
            await client.start_workflow(
                ExportWorkflow.run,
                export_input(settings, msg),
                id=export_workflow_id(msg.job_id, msg.message_id),
                task_queue=settings.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                static_summary=export_summary(msg.job_id),
                static_details=f"wake-up {msg.message_id} ({msg.kind}), job {msg.job_id}",
            )

    began = time.perf_counter()
    await asyncio.gather(*(start(job_id) for job_id in jobs))
    return time.perf_counter() - began


async def dispatched(dispatcher: OutboxDispatcher, database: TestDatabase, jobs: list[UUID]) -> float:
    """Ours: queue one wake-up per job, then time the dispatcher publishing every one of them."""
    await queue_wakeups(database, jobs)
    began = time.perf_counter()
    published = await dispatcher.dispatch_once()
    seconds = time.perf_counter() - began
    left = await unpublished(database)
    if published != len(jobs) or left:
        raise RuntimeError(f"published {published} of {len(jobs)}; {left} rows left unpublished")
    return seconds


@dataclass
class Side:
    """One side's runs: wall seconds and client CPU seconds of each."""

    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)

    def rate(self, per_run: int) -> float:
        return per_run * len(self.walls) / sum(self.walls)


async def main(wakeups: int, concurrency: int, batch: int, passes: int, rounds: int) -> dict[str, float]:
    """Run ``rounds`` blocks of ours, SDK, SDK, ours (so a server that slows down as its history grows
    weighs on both sides alike); print and return the rates over all runs and their ratio."""
    with postgres_server() as server_url:
        database = clone_database(server_url, make_template(server_url))
        env = await start_dev_server()
        pool = await open_pool(database.app_url, "exports_dispatcher", max_size=2 * passes)
        try:
            settings = Settings(task_queue=f"bench-dispatch-{uuid.uuid4().hex[:8]}", dispatcher_batch=batch)
            jobs = await create_jobs(database, wakeups)
            # The creations' own wake-ups are not part of the comparison.
            await admin(database.admin_url, "UPDATE outbox SET published_at = clock_timestamp()")
            dispatcher = OutboxDispatcher(
                DispatcherStore(pool),
                env.client,
                settings,
                listen_url=None,
                concurrency=concurrency,
                passes=passes,
            )
            # Warm both paths (connections, the server's namespace caches).
            await dispatched(dispatcher, database, jobs[:200])
            await sdk_starts(env.client, settings, jobs[:200], concurrency)
            sides = {"ours": Side(), "sdk": Side()}
            for _ in range(rounds):
                for name in ("ours", "sdk", "sdk", "ours"):
                    cpu = time.process_time()
                    if name == "ours":
                        wall = await dispatched(dispatcher, database, jobs)
                    else:
                        wall = await sdk_starts(env.client, settings, jobs, concurrency)
                    sides[name].walls.append(wall)
                    sides[name].cpus.append(time.process_time() - cpu)
        finally:
            await pool.close()
            await env.shutdown()
    ours, sdk = sides["ours"], sides["sdk"]
    result = {
        "dispatcher_per_s": ours.rate(wakeups),
        "sdk_per_s": sdk.rate(wakeups),
        "ratio": ours.rate(wakeups) / sdk.rate(wakeups),
    }
    print(
        f"wake-ups: {wakeups} per run; concurrency {concurrency}; batch {batch}; passes in flight {passes};"
        f" {rounds} round(s) of ours, SDK, SDK, ours  cpus: {os.cpu_count()}  load: {os.getloadavg()[0]:.2f}"
    )
    for label, side, unit in (("dispatcher", ours, "wake-ups/s"), ("SDK start_workflow", sdk, "starts/s")):
        cpu_ms = 1000 * sum(side.cpus) / (wakeups * len(side.cpus))
        print(
            f"{label:<18}: {side.rate(wakeups):7.0f} {unit:<10} runs {[round(wakeups / w) for w in side.walls]}"
            f"  client CPU {cpu_ms:.2f} ms per start"
        )
    print(f"ratio dispatcher/SDK: {result['ratio']:.2f}x  (target >= 0.8x)")
    return result


def run_with_defaults() -> None:
    """``python -m bench dispatch``: 10,000 wake-ups at the dispatcher's default concurrency."""
    asyncio.run(
        main(wakeups=10_000, concurrency=Settings().dispatcher_concurrency, batch=50, passes=2, rounds=1)
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wakeups", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=Settings().dispatcher_concurrency)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    options = parser.parse_args()
    asyncio.run(main(options.wakeups, options.concurrency, options.batch, options.passes, options.rounds))
