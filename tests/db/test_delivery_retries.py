"""Retries that wait (issue #25, item 4): ``retry_delivery_if_delivering`` against the real database.

- a transient NotDelivered goes back to Queued with its RetryScheduled event, a backoff on the row and on its
  wake-up, the attempt counted as used, the delivery key and final name kept;
- each condition of the statement is repeated: this attempt, Delivering, no rename fence (the row's proof the
  rename was never sent), no stop or cancel recorded against the attempt, within the attempt cap; where a
  retry may not be made the job ends Failed NotDelivered and its event says why;
- a cancel answered TooLate and committed while the retry waits for the row stops the retry, and a retry
  committed while the cancel waits leaves a Queued job that the cancel cancels (both orders, held
  transactions, ``pg_blocking_pids``).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import timedelta

from domain.models import (
    CancellationOutcome,
    ClaimResult,
    EventKind,
    FailureCause,
    FailureCode,
    JobStatus,
    RetryResult,
)
from rules.retries import RetryPolicy, retry_delay_seconds
from tests.db.race import Gate, cancel, still_waiting
from tests.support.eventually import eventually

LONG_LOCK_TIMEOUT = "30s"  # the cancellation must wait for the held retry, not give up as Busy


class FixedJitter(random.Random):
    """A jitter source whose every draw is ``value``: the wait is then known to the millisecond."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


POLICY = RetryPolicy(base_seconds=60.0, cap_seconds=600.0, max_attempts=3, rng=FixedJitter(1.0))
SHORT = RetryPolicy(base_seconds=0.05, cap_seconds=0.05, max_attempts=3, rng=FixedJitter(1.0))


async def retry(store, job_id, attempt_id, policy=POLICY, cause=FailureCause.CONNECT_REFUSED):
    return await store.retry_delivery_if_delivering(
        job_id, attempt_id, cause, "no SFTP session opened (Unreachable); nothing was sent", policy
    )


async def failed_delivery(factory, job=None, *, rename_fenced=False):
    """A job Delivering whose attempt fenced its upload (and its rename with ``rename_fenced``)."""
    job, attempt = await factory.delivering(job)
    await factory.fence(job.id, attempt, rename=rename_fenced)
    return job, attempt


async def again_after_its_wait(factory, job_id):
    """Once the job's retry wait has passed (a short one), its next attempt claimed and authorized, and its
    upload fenced: the job Delivering again with a new attempt."""

    async def due():
        rows = await factory.admin(
            "SELECT available_at <= clock_timestamp() AS due FROM export_jobs WHERE id = %(j)s", {"j": job_id}
        )
        return rows[0]["due"]

    await eventually(due, "the retry's wait to pass", within=5.0)
    return await failed_delivery(factory, await factory.job(job_id))


async def events_of(factory, job_id, kind):
    return [e for e in await factory.worker.job_events(job_id) if e.kind == kind]


async def db_now(factory):
    return (await factory.admin("SELECT clock_timestamp() AS now", {}))[0]["now"]


async def test_a_transient_not_delivered_goes_back_to_queued_and_waits_its_backoff(factory, worker_store):
    job, attempt = await failed_delivery(factory)
    before = await db_now(factory)

    assert await retry(worker_store, job.id, attempt) == RetryResult.RETRIED

    row = await factory.job(job.id)
    after = await db_now(factory)
    assert (row.status, row.attempt_id, row.claimed_by, row.lease_expires_at) == (
        JobStatus.QUEUED,
        None,
        None,
        None,
    )
    # The failed attempt is a used one (a real try): attempt_count grew, attempts_released did not.
    assert (row.attempt_count, row.attempts_released, row.transient_releases) == (1, 0, 0)
    # The retry keeps the delivery key and the final name (they are the job's).
    assert (row.delivery_key, row.expected_file_name) == (job.delivery_key, job.expected_file_name)
    # First retry: base * 2^0, jitter 1.0, on the database clock.
    wait = timedelta(seconds=retry_delay_seconds(POLICY, 0, 1.0))
    assert before + wait <= row.available_at <= after + wait
    [event] = await events_of(factory, job.id, EventKind.RETRY_SCHEDULED)
    assert event.attempt_id == attempt
    assert event.detail.startswith("connect_refused: no SFTP session opened (Unreachable)")
    assert "try 1 of 3" in event.detail and "the next try waits until" in event.detail
    [wake_up] = await factory.admin(
        "SELECT available_at FROM outbox WHERE job_id = %(j)s AND available_at IS NOT NULL", {"j": job.id}
    )
    assert wake_up["available_at"] == row.available_at
    # Not claimable before its time: the claim answers NotYet and the job stays Queued.
    assert await worker_store.claim_if_queued(job.id, row.version, uuid.uuid4(), "w") == ClaimResult.NOT_YET
    assert (await factory.job(job.id)).status == JobStatus.QUEUED


async def test_the_wait_doubles_with_each_attempt_the_job_used(factory, worker_store):
    job, attempt = await failed_delivery(factory)
    assert await retry(worker_store, job.id, attempt, SHORT) == RetryResult.RETRIED
    job, attempt = await again_after_its_wait(factory, job.id)
    before = await db_now(factory)

    assert await retry(worker_store, job.id, attempt) == RetryResult.RETRIED

    row = await factory.job(job.id)
    assert (row.attempt_count, row.attempts_released) == (2, 0)
    wait = timedelta(seconds=retry_delay_seconds(POLICY, 1, 1.0))  # 2 x base: one attempt used before
    assert before + wait <= row.available_at <= before + wait + timedelta(seconds=5)
    details = [e.detail for e in await events_of(factory, job.id, EventKind.RETRY_SCHEDULED)]
    assert ["try 1 of 3" in details[0], "try 2 of 3" in details[1]] == [True, True]


async def test_past_the_attempt_cap_the_job_ends_failed_not_delivered(factory, worker_store):
    job, attempt = await failed_delivery(factory)
    capped = RetryPolicy(base_seconds=60.0, cap_seconds=600.0, max_attempts=1)

    assert await retry(worker_store, job.id, attempt, capped) == RetryResult.FAILED

    row = await factory.job(job.id)
    assert (row.status, row.failure_reason, row.attempt_id) == (
        JobStatus.FAILED,
        FailureCode.NOT_DELIVERED,
        attempt,
    )
    assert await events_of(factory, job.id, EventKind.RETRY_SCHEDULED) == []
    [finished] = await events_of(factory, job.id, EventKind.FINISHED)
    assert finished.detail.startswith("Failed NotDelivered: no SFTP session opened")
    assert finished.detail.endswith("not retried (connect_refused): try 1 of 1, the attempt cap")
    assert await factory.outbox_count(job.id) == 1  # only the creation's wake-up


async def test_a_written_rename_fence_is_no_proof_so_no_retry(factory, worker_store):
    job, attempt = await failed_delivery(factory, rename_fenced=True)

    assert await retry(worker_store, job.id, attempt) == RetryResult.FAILED

    row = await factory.job(job.id)
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    [finished] = await events_of(factory, job.id, EventKind.FINISHED)
    assert finished.detail.endswith("not retried (connect_refused): the rename fence was written")


async def test_a_cancel_answered_too_late_during_the_attempt_stops_the_retry(factory, worker_store):
    job, attempt = await failed_delivery(factory)
    answered = await factory.cancel(job)
    assert answered.outcome == CancellationOutcome.TOO_LATE

    assert await retry(worker_store, job.id, attempt) == RetryResult.FAILED

    row = await factory.job(job.id)
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    [finished] = await events_of(factory, job.id, EventKind.FINISHED)
    assert finished.detail.endswith(
        f"not retried (connect_refused): cancellation request {answered.request_id} was recorded during this "
        "attempt"
    )


async def test_only_this_attempt_while_delivering_may_retry(factory, worker_store):
    job, attempt = await failed_delivery(factory)
    assert await retry(worker_store, job.id, uuid.uuid4()) == RetryResult.NOT_OWNER
    assert (await factory.job(job.id)).status == JobStatus.DELIVERING

    running, running_attempt = await factory.running()
    assert await retry(worker_store, running.id, running_attempt) == RetryResult.NOT_OWNER
    assert (await factory.job(running.id)).status == JobStatus.RUNNING

    # A second call after the first answered finds the job no longer the attempt's: nothing more is written.
    assert await retry(worker_store, job.id, attempt) == RetryResult.RETRIED
    assert await retry(worker_store, job.id, attempt) == RetryResult.NOT_OWNER
    assert len(await events_of(factory, job.id, EventKind.RETRY_SCHEDULED)) == 1


async def test_a_cancel_while_the_job_waits_for_its_retry_cancels_it(factory, worker_store):
    job, attempt = await failed_delivery(factory)
    assert await retry(worker_store, job.id, attempt) == RetryResult.RETRIED

    answered = await factory.cancel(job)

    assert answered.outcome == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert (await factory.job(job.id)).status == JobStatus.CANCELED


async def test_a_permanent_cause_is_refused_by_the_store(factory, worker_store):
    job, attempt = await failed_delivery(factory)
    try:
        await retry(worker_store, job.id, attempt, cause=FailureCause.AUTH_REFUSED)
    except ValueError:
        pass
    else:
        raise AssertionError("a permanent cause must be refused before any statement")
    assert (await factory.job(job.id)).status == JobStatus.DELIVERING


# -- the race with a cancellation: both orders ----------------------------------------------------------


async def test_retry_waits_for_a_too_late_cancel_then_ends_failed_naming_it(factory, kit):
    job, attempt = await failed_delivery(factory)
    api = await kit.solo("exports_api")
    gate = Gate()
    request_id = uuid.uuid4()
    canceling = asyncio.create_task(
        cancel(api.store, job, request_id=request_id, before_commit=gate, lock_timeout=LONG_LOCK_TIMEOUT)
    )
    await gate.wait_entered()  # the cancellation holds the row, its TooLate recorded, not committed

    worker = await kit.solo("exports_worker")
    retrying = asyncio.create_task(retry(worker.store, job.id, attempt))
    await kit.wait_until_blocked_by(worker.pid, api.pid)
    await still_waiting(retrying)

    gate.commit()
    assert (await canceling).outcome == CancellationOutcome.TOO_LATE
    assert await retrying == RetryResult.FAILED

    row = await factory.job(job.id)
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    [finished] = await events_of(factory, job.id, EventKind.FINISHED)
    assert f"cancellation request {request_id} was recorded during this attempt" in finished.detail
    assert await events_of(factory, job.id, EventKind.RETRY_SCHEDULED) == []


async def test_cancel_waits_for_the_retry_then_cancels_the_queued_job(factory, kit):
    job, attempt = await failed_delivery(factory)
    held = await kit.hold("exports_worker")
    params = {
        "job_id": job.id,
        "attempt_id": attempt,
        "cause": FailureCause.CONNECT_REFUSED.value,
        "summary": "no SFTP session opened (Unreachable); nothing was sent",
        "base_seconds": 60.0,
        "cap_seconds": 600.0,
        "max_attempts": 3,
        "jitter": 1.0,
        "traceparent": None,
    }
    assert len(await held.run("lock_job_for_retry", params)) == 1
    [answer] = await held.run("retry_delivery_if_delivering", params)
    assert answer["ending"] == "Retried"

    api = await kit.solo("exports_api")
    canceling = asyncio.create_task(cancel(api.store, job, lock_timeout=LONG_LOCK_TIMEOUT))
    await kit.wait_until_blocked_by(api.pid, held.pid)
    await still_waiting(canceling)

    await held.commit()
    result = await canceling

    assert result.outcome == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert result.request is not None and result.request.found_status == JobStatus.QUEUED
    row = await factory.job(job.id)
    assert row.status == JobStatus.CANCELED
    assert len(await events_of(factory, job.id, EventKind.RETRY_SCHEDULED)) == 1
