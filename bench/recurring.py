"""1,000 recurring exports due in the same minute, on the Temporal dev server (issue 25, item 1).

Defines ``--count`` recurring exports through the service (each one its Temporal Schedule, cron ``M * * * *``
in UTC, all due at the same minute), runs the firing workflow and activity in one worker configured as
``worker.py`` configures it (an ``exports_api`` pool of 4 connections for the firings), and measures, from
the nominal time:

- when the last firing's workflow started (Temporal's visibility start time of the last RecurringFireWorkflow);
- when every firing's export exists (the last ``created_at`` of the exports the firings created);

then fires ``--duplicates`` of the same nominal times again (Schedule backfills: real duplicate firings) and
checks that no firing created two exports: one export per recurring export, one firing per nominal time,
every export under its own key.

    python -m bench recurring
    python -m bench.recurring [--count 1000] [--duplicates 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from temporalio.client import ScheduleBackfill, ScheduleOverlapPolicy
from temporalio.worker import Worker

from activities.recurring import RecurringActivities
from db.pool import open_pool
from db.stores.api import ApiStore
from domain.recurring import schedule_id_for
from service.auth import Caller
from service.recurring import DefineRecurringExport, RecurringExports
from service.recurring_schedules import ScheduleState, ScheduleSync
from settings import Settings
from testbed.pg import clone_database, make_template, postgres_server
from testbed.temporal import start_dev_server
from workflows.recurring import RecurringFireWorkflow

ADMIN = "bench.admin"


async def admin(url: str, query: Any, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params or {})
            return await cur.fetchall() if cur.description else []


async def seed(url: str) -> tuple[uuid.UUID, uuid.UUID]:
    tenant_id, destination_id = uuid.uuid4(), uuid.uuid4()
    await admin(
        url,
        "WITH t AS (INSERT INTO tenants (id, name) VALUES (%(t)s, 'bench') RETURNING id),"
        " p AS (INSERT INTO principals (tenant_id, name, role) SELECT id, %(a)s, 'admin' FROM t),"
        " d AS (INSERT INTO destinations (id, tenant_id, name, host, port, username, host_key, credential_ref,"
        " remote_dir) SELECT %(d)s, id, 'bench-partner', '127.0.0.1', 22, 'partner', 'ssh-ed25519 AAAA',"
        " '/nonexistent', '/upload' FROM t RETURNING id, tenant_id)"
        " INSERT INTO delivery_switches (scope, tenant_id, destination_id, enabled, reason, changed_by)"
        " SELECT 'tenant', tenant_id, NULL, true, 'bench', 'bench' FROM d"
        " UNION ALL SELECT 'destination', tenant_id, id, true, 'bench', 'bench' FROM d",
        {"t": tenant_id, "d": destination_id, "a": ADMIN},
    )
    return tenant_id, destination_id


async def run(count: int, duplicates: int, define_concurrency: int = 16) -> dict[str, Any]:
    with postgres_server() as server:
        database = clone_database(server, make_template(server))
        env = await start_dev_server()
        pool = await open_pool(database.app_url, "exports_api", max_size=4)
        define_pool = await open_pool(database.app_url, "exports_api", max_size=define_concurrency)
        try:
            client = env.client
            settings = Settings(task_queue=f"bench-recurring-{uuid.uuid4().hex[:6]}")
            tenant_id, destination_id = await seed(database.admin_url)
            sync = ScheduleSync(client, task_queue=settings.task_queue, catchup_window_seconds=3600)
            ops = RecurringExports(ApiStore(define_pool), sync)
            caller = Caller(tenant_id=tenant_id, principal=ADMIN, role="admin")
            # Every one due at the same minute: far enough ahead to define them all first.
            define_started = time.monotonic()
            due = (datetime.now(UTC) + timedelta(minutes=2)).replace(second=0, microsecond=0)
            budget = max(60.0, count * 0.2)
            while (due - datetime.now(UTC)).total_seconds() < budget:
                due += timedelta(minutes=1)
            body = DefineRecurringExport(
                destination_id=destination_id,
                list_name="newsletter",
                cron=f"{due.minute} * * * *",
                time_zone="UTC",
            )
            ids: list[uuid.UUID] = []
            failed: list[str] = []

            async def define(n: int) -> None:
                for _ in range(n):
                    answer = await ops.create(caller, body)
                    if answer.body.get("schedule") != ScheduleState.CREATED:
                        failed.append(str(answer.body.get("schedule")))
                    ids.append(uuid.UUID(answer.body["recurring_export"]["id"]))

            per = [
                count // define_concurrency + (1 if i < count % define_concurrency else 0)
                for i in range(define_concurrency)
            ]
            await asyncio.gather(*(define(n) for n in per))
            define_seconds = time.monotonic() - define_started
            print(
                f"defined {len(ids)} recurring exports in {define_seconds:.1f} s, all due at {due.isoformat()}"
            )
            if failed:
                raise SystemExit(f"{len(failed)} Schedules were not created: {failed[:5]}")

            activities = RecurringActivities(ApiStore(pool), settings)
            async with Worker(
                client,
                task_queue=settings.task_queue,
                workflows=[RecurringFireWorkflow],
                activities=activities.activities(),
            ):
                await asyncio.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()))
                last_created = await wait_all_created(database.admin_url, tenant_id, count, due)
                starts = [
                    w.start_time
                    async for w in client.list_workflows(
                        f'WorkflowType = "RecurringFireWorkflow" AND TaskQueue = "{settings.task_queue}"'
                    )
                ]
                last_start = max(starts)
                # Duplicate firings of the same nominal time: one export each, still.
                dup_started = time.monotonic()
                window = ScheduleBackfill(
                    start_at=due - timedelta(seconds=1),
                    end_at=due + timedelta(seconds=1),
                    overlap=ScheduleOverlapPolicy.ALLOW_ALL,
                )
                for recurring_id in ids[:duplicates]:
                    await client.get_schedule_handle(schedule_id_for(recurring_id)).backfill(window)
                await wait_runs(client, settings.task_queue, count + duplicates)
                duplicate_seconds = time.monotonic() - dup_started
            checks = await verify(database.admin_url, tenant_id, count)
            return {
                "count": count,
                "due": due.isoformat(),
                "define_seconds": round(define_seconds, 1),
                "last_firing_started_after_s": round((last_start - due).total_seconds(), 2),
                "every_export_exists_after_s": round((last_created - due).total_seconds(), 2),
                "firing_workflows": len(starts),
                "duplicates_fired": duplicates,
                "duplicates_seconds": round(duplicate_seconds, 1),
                **checks,
                "load_average": os.getloadavg()[0],
                "cpus": os.cpu_count(),
            }
        finally:
            await pool.close()
            await define_pool.close()
            await env.shutdown()


async def wait_all_created(url: str, tenant_id: uuid.UUID, count: int, due: datetime) -> datetime:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        rows = await admin(
            url,
            "SELECT count(*) AS n, max(j.created_at) AS last FROM recurring_export_firings f"
            " JOIN export_jobs j ON j.id = f.job_id WHERE f.tenant_id = %(t)s AND f.outcome = 'created'",
            {"t": tenant_id},
        )
        if rows[0]["n"] >= count:
            return rows[0]["last"]
        await asyncio.sleep(0.1)
    raise SystemExit(f"not every firing's export existed 600 s after {due.isoformat()}")


async def wait_runs(client: Any, task_queue: str, expected: int) -> None:
    query = f'WorkflowType = "RecurringFireWorkflow" AND TaskQueue = "{task_queue}" AND ExecutionStatus != "Running"'
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if (await client.count_workflows(query)).count >= expected:
            return
        await asyncio.sleep(0.5)
    raise SystemExit(f"fewer than {expected} firing workflows closed within 600 s")


async def verify(url: str, tenant_id: uuid.UUID, count: int) -> dict[str, Any]:
    """No firing created two exports: every figure below must equal ``count`` (and the last be 0)."""
    [row] = await admin(
        url,
        "SELECT (SELECT count(*) FROM export_jobs WHERE tenant_id = %(t)s) AS exports,"
        " (SELECT count(*) FROM recurring_export_firings WHERE tenant_id = %(t)s) AS firings,"
        " (SELECT count(DISTINCT job_id) FROM recurring_export_firings WHERE tenant_id = %(t)s"
        "   AND outcome = 'created') AS exports_by_firings,"
        " (SELECT count(*) FROM idempotency_keys WHERE tenant_id = %(t)s AND key LIKE 'recurring-export-%%')"
        "   AS keys,"
        " (SELECT count(*) FROM (SELECT recurring_export_id FROM recurring_export_firings"
        "   WHERE tenant_id = %(t)s AND outcome = 'created' GROUP BY recurring_export_id HAVING count(*) > 1) x)"
        "   AS recurring_with_two_exports",
        {"t": tenant_id},
    )
    ok = all(row[k] == count for k in ("exports", "firings", "exports_by_firings", "keys"))
    ok = ok and row["recurring_with_two_exports"] == 0
    return {**row, "none_created_twice": ok}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.recurring", description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--duplicates", type=int, default=200)
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.count, args.duplicates))
    print(json.dumps(result, indent=2, default=str))
    if not result["none_created_twice"]:
        raise SystemExit("a firing created two exports")
    return result


def run_with_defaults() -> None:
    main([])


if __name__ == "__main__":
    main()
