"""Recovery of expired Running attempts (000 "Recovery", test matrix "Recovery interleavings"), run as
RecoveryWorkflow on the time-skipping server against a real PostgreSQL. Leases are expired on the row:
the database clock decides, never a sleep."""

from __future__ import annotations

import uuid

from domain.models import (
    AuthorizationResult,
    CancellationOutcome,
    ClaimResult,
    FailureCode,
    JobStatus,
    final_name_for,
)
from tests.recovery.conftest import MAX_ATTEMPTS
from workflows.models import RecoveryBatchResult, RecoveryInput, Takeover
from workflows.recovery import RecoveryWorkflow


async def recover(client, settings) -> RecoveryBatchResult:
    return await client.execute_workflow(
        RecoveryWorkflow.run,
        RecoveryInput(batch=50),
        id=f"recovery-{uuid.uuid4()}",
        task_queue=settings.task_queue,
        result_type=RecoveryBatchResult,
    )


async def events_of(factory, job_id):
    return await factory.worker.job_events(job_id)


async def test_an_expired_running_attempt_without_a_stop_request_is_requeued_with_a_new_wake_up(
    client, settings, recovery_worker, factory
):
    job, attempt = await factory.running()
    await factory.expire_lease(job.id)

    result = await recover(client, settings)

    assert result.requeued >= 1
    requeued = await factory.job(job.id)
    assert requeued.status == JobStatus.QUEUED
    assert requeued.attempt_id is None and requeued.lease_expires_at is None
    assert requeued.attempt_count == 1
    assert await factory.outbox_count(job.id) == 2  # the creation's wake-up and recovery's new one
    event = (await events_of(factory, job.id))[-1]
    assert (event.kind, event.attempt_id) == ("RequeuedByRecovery", attempt)
    assert event.observed_by.startswith("recovery:")


async def test_an_expired_running_attempt_with_a_stop_request_is_stopped_not_restarted(
    client, settings, recovery_worker, factory
):
    job, attempt = await factory.running()
    assert (await factory.cancel(job)).outcome == CancellationOutcome.STOP_REQUESTED
    await factory.expire_lease(job.id)

    await recover(client, settings)

    stopped = await factory.job(job.id)
    assert stopped.status == JobStatus.STOPPED
    assert stopped.attempt_id == attempt  # terminal states keep the attempt for audit
    assert await factory.outbox_count(job.id) == 1
    assert (await events_of(factory, job.id))[-1].kind == "StoppedByRecovery"


async def test_a_job_that_crashes_its_worker_every_time_ends_failed_at_the_attempt_cap(
    client, settings, recovery_worker, factory
):
    job = await factory.queued()
    for attempt_number in range(1, MAX_ATTEMPTS + 1):
        current = await factory.job(job.id)
        assert current.status == JobStatus.QUEUED
        attempt = uuid.uuid4()
        claim = await factory.worker.claim_if_queued(
            job.id, current.version, attempt, f"worker-{attempt_number}"
        )
        assert claim == ClaimResult.CLAIMED
        await factory.expire_lease(job.id)  # the worker died: its lease runs out
        await recover(client, settings)

    failed = await factory.job(job.id)
    assert failed.status == JobStatus.FAILED
    assert failed.failure_reason == FailureCode.ATTEMPTS_EXHAUSTED
    assert failed.attempt_count == MAX_ATTEMPTS
    kinds = [e.kind.value for e in await events_of(factory, job.id)]
    assert kinds == ["Claimed", "RequeuedByRecovery"] * (MAX_ATTEMPTS - 1) + ["Claimed", "AttemptsExhausted"]
    assert await factory.outbox_count(job.id) == MAX_ATTEMPTS  # creation plus one per requeue


async def test_a_lease_renewed_after_the_scan_prevents_the_takeover(settings, recovery_worker, factory):
    job, attempt = await factory.running()
    await factory.expire_lease(job.id)
    [candidate] = [c for c in await factory.recovery.find_expired_leases(500) if c.id == job.id]

    renewal = await factory.worker.renew_lease(job.id, attempt)  # the slow worker wakes up and renews
    assert renewal.owned

    assert await recovery_worker.take_over(candidate, "recovery:test") == Takeover.MATCHED_NOTHING
    still = await factory.job(job.id)
    assert (still.status, still.attempt_id) == (JobStatus.RUNNING, attempt)
    assert await factory.outbox_count(job.id) == 1


async def test_a_stop_request_recorded_after_the_scan_makes_the_requeue_match_nothing(
    client, settings, recovery_worker, factory
):
    job, _ = await factory.running()
    await factory.expire_lease(job.id)
    [candidate] = [c for c in await factory.recovery.find_expired_leases(500) if c.id == job.id]
    assert (await factory.cancel(job)).outcome == CancellationOutcome.STOP_REQUESTED

    assert await recovery_worker.take_over(candidate, "recovery:test") == Takeover.MATCHED_NOTHING
    assert await factory.status(job.id) == JobStatus.RUNNING

    await recover(client, settings)  # the next run sees the request and stops it
    assert await factory.status(job.id) == JobStatus.STOPPED


async def test_requeue_and_a_late_authorization_cannot_both_commit(settings, recovery_worker, factory):
    job, attempt = await factory.running()
    await factory.expire_lease(job.id)
    [candidate] = [c for c in await factory.recovery.find_expired_leases(500) if c.id == job.id]
    assert await recovery_worker.take_over(candidate, "recovery:test") == Takeover.REQUEUED

    late = await factory.worker.authorize_delivery_if_running(
        tenant_id=job.tenant_id,
        job_id=job.id,
        attempt_id=attempt,
        replaces_job_id=None,
        final_name=final_name_for(job.delivery_key),
        length=10,
        sha256=b"\x00" * 32,
    )
    assert late == AuthorizationResult.NOT_OWNER
    assert await factory.status(job.id) == JobStatus.QUEUED
    assert not (await factory.worker.renew_lease(job.id, attempt)).owned


async def test_a_cancellation_after_recovery_requeued_finds_queued_with_a_nonzero_attempt_count(
    client, settings, recovery_worker, factory
):
    job, _ = await factory.running()
    await factory.expire_lease(job.id)
    await recover(client, settings)

    result = await factory.cancel(job)

    assert result.outcome == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert result.request.found_attempt_count == 1


async def test_an_unexpired_lease_is_left_alone(client, settings, recovery_worker, factory):
    job, attempt = await factory.running()

    await recover(client, settings)

    current = await factory.job(job.id)
    assert (current.status, current.attempt_id) == (JobStatus.RUNNING, attempt)
