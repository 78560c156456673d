"""The sweeper on the real server (000 "Messages, the Outbox, and the Sweeper"; test matrix row "The sweeper").

A Queued job whose last wake-up is older than the threshold gets a fresh outbox row, in bounded batches,
skipping rows another writer holds (``FOR UPDATE SKIP LOCKED``) and re-checking Queued in the same
statement. Wake-up ages are set on the row; the database clock decides.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from domain.models import CancellationOutcome, JobStatus
from tests.db.race import Gate, RolledBackOnPurpose, cancel, claim_params, matched

THRESHOLD_SECONDS = 30 * 60


async def message_ids(factory, job_id: uuid.UUID) -> list[uuid.UUID]:
    rows = await factory.admin("SELECT message_id FROM outbox WHERE job_id = %(id)s", {"id": job_id})
    return [r["message_id"] for r in rows]


async def test_wake_up_31_minutes_old_is_republished_and_29_minutes_old_is_not(factory, worker_store):
    stale = await factory.queued()
    fresh = await factory.queued()
    await factory.age_wake_up(stale.id, 31)
    await factory.age_wake_up(fresh.id, 29)

    swept = await worker_store.sweep_stale_queued(THRESHOLD_SECONDS)

    assert stale.id in swept and fresh.id not in swept
    assert (await factory.outbox_count(stale.id), await factory.outbox_count(fresh.id)) == (2, 1)
    after = await factory.job(stale.id)
    assert (after.status, after.sweep_count) == (JobStatus.QUEUED, 1)
    assert after.woken_at > stale.woken_at
    assert (await factory.job(fresh.id)).sweep_count == 0


async def test_each_republication_increments_sweep_count_with_a_new_message_id(factory, worker_store):
    job = await factory.queued()
    for expected in (1, 2, 3):
        await factory.age_wake_up(job.id, 31)
        assert job.id in await worker_store.sweep_stale_queued(THRESHOLD_SECONDS)
        assert (await factory.job(job.id)).sweep_count == expected

    ids = await message_ids(factory, job.id)
    assert len(ids) == 4 and len(set(ids)) == 4  # never keyed on the job: a deduplicating broker keeps each


async def test_job_leaving_queued_while_the_sweep_runs_gets_no_wake_up(factory, kit, worker_store):
    job = await factory.queued()
    await factory.age_wake_up(job.id, 31)
    claim = await kit.hold("exports_worker")
    assert matched(await claim.run("claim_if_queued", claim_params(job, uuid.uuid4())))

    # The claim has moved the row out of Queued but not committed: the sweep neither waits nor wakes it.
    assert job.id not in await worker_store.sweep_stale_queued(THRESHOLD_SECONDS)
    await claim.commit()
    assert job.id not in await worker_store.sweep_stale_queued(THRESHOLD_SECONDS)

    after = await factory.job(job.id)
    assert (after.status, after.sweep_count) == (JobStatus.RUNNING, 0)
    assert await factory.outbox_count(job.id) == 1


async def test_row_locked_by_a_cancellation_is_skipped_and_picked_up_by_the_next_sweep(
    factory, kit, worker_store
):
    job = await factory.queued()
    await factory.age_wake_up(job.id, 31)
    api = await kit.solo("exports_api")
    gate = Gate()
    canceling = asyncio.create_task(cancel(api.store, job, before_commit=gate))
    await gate.wait_entered()

    # Returns while the cancellation still holds the row: SKIP LOCKED, not a wait.
    assert job.id not in await worker_store.sweep_stale_queued(THRESHOLD_SECONDS)
    assert not canceling.done()

    gate.abort()
    with pytest.raises(RolledBackOnPurpose):
        await canceling
    assert job.id in await worker_store.sweep_stale_queued(THRESHOLD_SECONDS)
    assert (await factory.job(job.id)).sweep_count == 1
    assert await factory.outbox_count(job.id) == 2


async def test_canceled_job_is_never_republished(factory, worker_store, api_store):
    job = await factory.queued()
    await factory.age_wake_up(job.id, 31)
    assert (await cancel(api_store, job)).outcome == CancellationOutcome.CANCELED_WHILE_QUEUED

    assert job.id not in await worker_store.sweep_stale_queued(THRESHOLD_SECONDS)
    assert await factory.outbox_count(job.id) == 1


async def test_sweep_takes_a_bounded_batch_oldest_first(factory, worker_store):
    jobs = [await factory.queued() for _ in range(3)]
    # Older than anything else in this database, so these three are the oldest candidates.
    for minutes, job in zip((300_000, 200_000, 100_000), jobs, strict=True):
        await factory.age_wake_up(job.id, minutes)

    first = await worker_store.sweep_stale_queued(THRESHOLD_SECONDS, batch=2)
    assert set(first) == {jobs[0].id, jobs[1].id}  # RETURNING order is not promised; membership is
    second = await worker_store.sweep_stale_queued(THRESHOLD_SECONDS, batch=1)
    assert second == [jobs[2].id]
