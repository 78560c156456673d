"""001 "Testing the Race", through ExportWorkflow: two writers contending for one row in the real
database, each on its own connection; hooks at named points and held transactions, never sleeps."""

from __future__ import annotations

import asyncio

import psycopg

from domain.models import CancellationOutcome, JobStatus
from tests.workflows.harness import Harness, idle_in_transaction_pid, wait_until_blocked_by
from workflows.models import AttemptOutcome


async def test_a_held_cancel_makes_the_claim_wait_then_the_claim_cannot_leave_queued(
    harness: Harness,
) -> None:
    job = await harness.queue_export()
    held, release = asyncio.Event(), asyncio.Event()

    async def hold_open() -> None:
        held.set()
        await release.wait()

    # Test-only: the cancellation's transaction is held open after its decision, keeping its row lock.
    cancel = asyncio.create_task(harness.factory.cancel(job, before_commit=hold_open))
    await asyncio.wait_for(held.wait(), 10)
    cancel_pid = await idle_in_transaction_pid(harness.factory)

    handle = await harness.start(job)
    await wait_until_blocked_by(harness.factory, cancel_pid)  # the workflow's claim waits on the cancel
    release.set()
    result = await handle.result()

    assert (await cancel).outcome == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert result.outcome == AttemptOutcome.NOT_CLAIMED
    assert await harness.status(job) == JobStatus.CANCELED
    assert await harness.factory.event_kinds(job.id) == []
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []


async def test_a_claim_that_commits_first_makes_the_cancel_a_stop_request(harness: Harness) -> None:
    job = await harness.queue_export()
    # A third session holds the row so the workflow's claim queues for it first and the cancel behind it.
    async with await psycopg.AsyncConnection.connect(harness.factory.db.admin_url) as holder:
        await holder.execute("SELECT id FROM export_jobs WHERE id = %(id)s FOR UPDATE", {"id": job.id})
        holder_pid = holder.info.backend_pid
        handle = await harness.start(job)
        claim_pid = await wait_until_blocked_by(harness.factory, holder_pid)
        cancel = asyncio.create_task(harness.factory.cancel(job))
        await wait_until_blocked_by(harness.factory, claim_pid)  # the cancel waits for the claim
        await holder.rollback()
    cancelled = await cancel
    result = await handle.result()

    assert cancelled.outcome == CancellationOutcome.STOP_REQUESTED
    assert cancelled.job is not None and cancelled.job.status == JobStatus.RUNNING
    assert result.outcome == AttemptOutcome.STOPPED
    assert await harness.status(job) == JobStatus.STOPPED
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []


async def test_a_cancel_that_rolls_back_lets_the_waiting_claim_run_the_job(harness: Harness) -> None:
    job = await harness.queue_export()
    held, release = asyncio.Event(), asyncio.Event()

    class RolledBack(Exception):
        pass

    async def hold_then_fail() -> None:
        held.set()
        await release.wait()
        raise RolledBack

    cancel = asyncio.create_task(harness.factory.cancel(job, before_commit=hold_then_fail))
    await asyncio.wait_for(held.wait(), 10)
    cancel_pid = await idle_in_transaction_pid(harness.factory)
    handle = await harness.start(job)
    await wait_until_blocked_by(harness.factory, cancel_pid)
    release.set()
    try:
        await cancel
    except RolledBack:
        pass
    result = await handle.result()

    assert result.outcome == AttemptOutcome.COMPLETED
    assert await harness.status(job) == JobStatus.COMPLETED
    assert await harness.factory.api.job_cancellation_requests(job.tenant_id, job.id) == []


async def test_cancellation_between_load_and_claim_prevents_the_export(harness: Harness) -> None:
    job = await harness.queue_export(contacts=5)
    answers = []

    async def cancel_after_load(job_id) -> None:
        answers.append(await harness.factory.cancel(job))

    harness.host.activities.seams.after_load = cancel_after_load
    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.NOT_CLAIMED
    assert await harness.status(job) == JobStatus.CANCELED
    assert [a.outcome for a in answers] == [CancellationOutcome.CANCELED_WHILE_QUEUED]
    requests = await harness.factory.api.job_cancellation_requests(job.tenant_id, job.id)
    assert [r.outcome for r in requests] == [CancellationOutcome.CANCELED_WHILE_QUEUED]
    assert harness.partner_files(job) == []
    assert harness.files_on_disk() == []
    assert await harness.factory.event_kinds(job.id) == []


async def test_stop_request_before_cutoff_2_sends_nothing_even_without_the_watcher(harness: Harness) -> None:
    job = await harness.queue_export(contacts=5)
    harness.host.activities.seams.watcher_disabled = True
    answers = []

    async def stop_before_authorize(job_id) -> None:
        answers.append(await harness.factory.cancel(job))

    harness.host.activities.seams.before_authorize = stop_before_authorize
    result = await harness.run(job)

    assert [a.outcome for a in answers] == [CancellationOutcome.STOP_REQUESTED]
    assert result.outcome == AttemptOutcome.STOPPED
    assert result.cutoff_answers == ["StopRecorded"]
    assert await harness.status(job) == JobStatus.STOPPED
    assert await harness.factory.event_kinds(job.id) == ["Claimed", "Stopped"]
    assert harness.partner_files(job) == []
    assert harness.files_on_disk() == []


async def test_a_cancel_during_the_upload_is_too_late_and_the_job_still_completes(harness: Harness) -> None:
    job = await harness.queue_export(contacts=2000)
    answers = []

    async def cancel_during_upload(job_id, sent: int) -> None:
        if not answers:  # awaited: the upload goes on only after the cancel has answered
            answers.append(await harness.factory.cancel(job))

    harness.host.activities.seams.during_upload = cancel_during_upload
    result = await harness.run(job)

    assert [a.outcome for a in answers] == [CancellationOutcome.TOO_LATE]
    assert answers[0].job is not None and answers[0].job.status == JobStatus.DELIVERING
    assert result.outcome == AttemptOutcome.COMPLETED
    assert await harness.status(job) == JobStatus.COMPLETED  # not rewritten to Canceled
    assert len(harness.uploads(job)) == 1
    assert harness.files_on_disk() == []
