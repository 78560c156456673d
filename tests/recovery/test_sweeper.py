"""The sweeper (000 test matrix, "The sweeper"), run as SweeperWorkflow on the time-skipping server
against a real PostgreSQL. Wake-up ages are set on the row: the database clock decides."""

from __future__ import annotations

import asyncio
import uuid

import psycopg

from domain.models import JobStatus
from workflows.models import SweepInput, SweepResult
from workflows.sweeper import SweeperWorkflow


async def sweep(client, settings, **overrides) -> SweepResult:
    return await client.execute_workflow(
        SweeperWorkflow.run,
        SweepInput(**overrides),
        id=f"sweep-{uuid.uuid4()}",
        task_queue=settings.task_queue,
        result_type=SweepResult,
    )


async def test_sweeper_rewakes_a_job_31_minutes_stale_but_not_the_29_minute_control(
    client, settings, recovery_worker, factory
):
    stale = await factory.queued()
    control = await factory.queued()
    await factory.age_wake_up(stale.id, 31)
    await factory.age_wake_up(control.id, 29)
    outbox_before = await factory.outbox_count(stale.id)

    result = await sweep(client, settings)

    assert result.swept >= 1
    swept = await factory.job(stale.id)
    assert swept.sweep_count == 1
    assert swept.woken_at > stale.woken_at
    assert await factory.outbox_count(stale.id) == outbox_before + 1
    untouched = await factory.job(control.id)
    assert untouched.sweep_count == 0
    assert await factory.outbox_count(control.id) == 1


async def test_each_republication_increments_sweep_count(client, settings, recovery_worker, factory):
    job = await factory.queued()
    for expected in (1, 2):
        await factory.age_wake_up(job.id, 31)
        await sweep(client, settings)
        assert (await factory.job(job.id)).sweep_count == expected
    assert await factory.outbox_count(job.id) == 3


async def test_sweeper_drains_a_backlog_in_bounded_batches(client, settings, recovery_worker, factory):
    jobs = [await factory.queued() for _ in range(5)]
    for job in jobs:
        await factory.age_wake_up(job.id, 45)

    result = await sweep(client, settings, batch=2)

    assert result.batch == 2
    assert result.batches >= 3  # 2 + 2 + 1: never one long transaction
    for job in jobs:
        assert (await factory.job(job.id)).sweep_count == 1
        assert await factory.outbox_count(job.id) == 2


async def test_a_job_that_left_queued_gets_no_outbox_row(client, settings, recovery_worker, factory):
    job, _ = await factory.running()
    await factory.admin(
        "UPDATE export_jobs SET woken_at = clock_timestamp() - interval '2 hours' WHERE id = %(id)s",
        {"id": job.id},
    )

    await sweep(client, settings)

    assert await factory.status(job.id) == JobStatus.RUNNING
    assert await factory.outbox_count(job.id) == 1
    assert (await factory.job(job.id)).sweep_count == 0


async def test_a_row_locked_by_a_cancellation_is_skipped_and_taken_by_the_next_sweep(
    client, settings, recovery_worker, factory, database
):
    job = await factory.queued()
    await factory.age_wake_up(job.id, 31)
    async with await psycopg.AsyncConnection.connect(database.admin_url) as holder:
        # The cancellation transaction's locking read, held open while the sweep runs.
        await holder.execute("SELECT 1 FROM export_jobs WHERE id = %(id)s FOR UPDATE", {"id": job.id})
        await asyncio.wait_for(sweep(client, settings), timeout=30)
        assert (await factory.job(job.id)).sweep_count == 0
        await holder.rollback()

    await sweep(client, settings)
    assert (await factory.job(job.id)).sweep_count == 1
    assert await factory.outbox_count(job.id) == 2
