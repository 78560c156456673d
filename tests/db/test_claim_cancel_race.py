"""Cutoff 1 on the real server: the claim and the cancellation compete for one row (001 "Testing the Race").

Each race holds the first writer's transaction open on its own connection, proves with
``pg_blocking_pids`` that the second writer waits on that session, and only then commits or rolls back.
Also here: what a claim does with a redelivered message, and with terms edited since they were checked.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from domain.models import CancellationOutcome, ClaimResult, JobStatus
from tests.db.race import Gate, RolledBackOnPurpose, cancel, claim_params, matched, still_waiting

LONG_LOCK_TIMEOUT = "30s"  # the cancellation must wait for the held claim, not give up as Busy


async def test_cancel_waits_for_claim_then_finds_running(factory, kit, worker_store):
    job = await factory.queued()
    attempt = uuid.uuid4()
    claim = await kit.hold("exports_worker")
    assert matched(await claim.run("claim_if_queued", claim_params(job, attempt)))

    api = await kit.solo("exports_api")
    canceling = asyncio.create_task(cancel(api.store, job, lock_timeout=LONG_LOCK_TIMEOUT))
    await kit.wait_until_blocked_by(api.pid, claim.pid)
    await still_waiting(canceling)

    await claim.commit()
    result = await canceling

    assert result.outcome == CancellationOutcome.STOP_REQUESTED
    assert result.request is not None
    assert result.request.found_status == JobStatus.RUNNING
    assert result.request.found_attempt_id == attempt
    assert result.request.found_attempt_count == 1
    row = await factory.job(job.id)
    assert (row.status, row.attempt_id, row.stop_request_id) == (
        JobStatus.RUNNING,
        attempt,
        result.request_id,
    )


async def test_claim_waits_for_cancel_then_cannot_leave_queued(factory, kit):
    job = await factory.queued()
    api = await kit.solo("exports_api")
    gate = Gate()
    canceling = asyncio.create_task(cancel(api.store, job, before_commit=gate))
    await gate.wait_entered()

    worker = await kit.solo("exports_worker")
    claiming = asyncio.create_task(
        worker.store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-3")
    )
    await kit.wait_until_blocked_by(worker.pid, api.pid)
    await still_waiting(claiming)

    gate.commit()
    assert (await canceling).outcome == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert await claiming == ClaimResult.LOST

    row = await factory.job(job.id)
    assert (row.status, row.attempt_id, row.attempt_count) == (JobStatus.CANCELED, None, 0)
    assert await factory.event_kinds(job.id) == []


async def test_cancel_cancels_while_queued_when_the_held_claim_rolls_back(factory, kit):
    job = await factory.queued()
    claim = await kit.hold("exports_worker")
    assert matched(await claim.run("claim_if_queued", claim_params(job, uuid.uuid4())))

    api = await kit.solo("exports_api")
    canceling = asyncio.create_task(cancel(api.store, job, lock_timeout=LONG_LOCK_TIMEOUT))
    await kit.wait_until_blocked_by(api.pid, claim.pid)
    await still_waiting(canceling)

    await claim.rollback()
    result = await canceling

    assert result.outcome == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert result.request is not None and result.request.found_attempt_count == 0
    row = await factory.job(job.id)
    assert (row.status, row.cancellation_request_id) == (JobStatus.CANCELED, result.request_id)
    assert await factory.event_kinds(job.id) == []


async def test_claim_succeeds_when_the_held_cancellation_rolls_back(factory, kit, api_store):
    job = await factory.queued()
    api = await kit.solo("exports_api")
    gate = Gate()
    canceling = asyncio.create_task(cancel(api.store, job, before_commit=gate))
    await gate.wait_entered()

    worker = await kit.solo("exports_worker")
    attempt = uuid.uuid4()
    claiming = asyncio.create_task(worker.store.claim_if_queued(job.id, job.version, attempt, "worker-3"))
    await kit.wait_until_blocked_by(worker.pid, api.pid)
    await still_waiting(claiming)

    gate.abort()
    with pytest.raises(RolledBackOnPurpose):
        await canceling
    assert await claiming == ClaimResult.CLAIMED

    row = await factory.job(job.id)
    assert (row.status, row.attempt_id, row.cancellation_request_id) == (JobStatus.RUNNING, attempt, None)
    assert await api_store.job_cancellation_requests(job.tenant_id, job.id) == []
    assert await factory.event_kinds(job.id) == ["Claimed"]


async def test_of_two_claims_for_one_message_only_the_first_commits(factory, kit):
    # Duplicate deliveries race exactly like a cancel: the same WHERE status = 'Queued' lets one start.
    job = await factory.queued()
    first = await kit.hold("exports_worker")
    first_attempt = uuid.uuid4()
    assert matched(await first.run("claim_if_queued", claim_params(job, first_attempt)))

    worker = await kit.solo("exports_worker")
    second = asyncio.create_task(worker.store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-4"))
    await kit.wait_until_blocked_by(worker.pid, first.pid)
    await first.commit()

    assert await second == ClaimResult.LOST
    row = await factory.job(job.id)
    assert (row.attempt_id, row.attempt_count) == (first_attempt, 1)
    assert await factory.event_kinds(job.id) == ["Claimed"]


# -- redelivery: a message for a job that left Queued does nothing -------------------------------------


@pytest.mark.parametrize(
    "status",
    [
        JobStatus.RUNNING,
        JobStatus.DELIVERING,
        JobStatus.CANCELED,
        JobStatus.REJECTED,
        JobStatus.STOPPED,
        JobStatus.FAILED,
        JobStatus.COMPLETED,
        JobStatus.OUTCOME_UNKNOWN,
    ],
)
async def test_redelivered_message_for_a_job_not_queued_claims_nothing(factory, worker_store, status):
    job, _ = await factory.in_status(status)
    events_before = await worker_store.job_events(job.id)

    result = await worker_store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-9")

    assert result == ClaimResult.LOST
    assert await factory.job(job.id) == job
    assert await worker_store.job_events(job.id) == events_before


# -- a changed request ---------------------------------------------------------------------------------


async def test_edit_increments_version_and_wakes_the_job_so_a_claim_of_the_old_terms_fails(
    factory, api_store, worker_store
):
    job = await factory.queued()
    new_destination = await factory.destination(job.tenant_id, name="partner-new")

    new_version = await api_store.edit_terms_if_queued(
        tenant_id=job.tenant_id,
        job_id=job.id,
        expected_version=job.version,
        destination_id=new_destination,
        list_name="main",
    )

    assert new_version == job.version + 1
    edited = await factory.job(job.id)
    assert (edited.status, edited.version, edited.destination_id) == (JobStatus.QUEUED, 2, new_destination)
    assert edited.woken_at > job.woken_at
    assert await factory.outbox_count(job.id) == 2  # the edit's own wake-up, with a new message ID

    # A worker that evaluated version 1 builds nothing; the edit's message brings a worker that checks version 2.
    assert (
        await worker_store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-old")
        == ClaimResult.LOST
    )
    assert await factory.event_kinds(job.id) == []
    assert (
        await worker_store.claim_if_queued(job.id, new_version, uuid.uuid4(), "worker-new")
        == ClaimResult.CLAIMED
    )


async def test_edit_matches_nothing_for_a_stale_version_or_a_started_job(factory, api_store):
    job = await factory.queued()
    other = await factory.destination(job.tenant_id, name="partner-new")
    edit = dict(tenant_id=job.tenant_id, job_id=job.id, destination_id=other, list_name="main")

    assert await api_store.edit_terms_if_queued(expected_version=job.version + 1, **edit) is None
    running, _ = await factory.running(job)
    assert await api_store.edit_terms_if_queued(expected_version=running.version, **edit) is None

    after = await factory.job(job.id)
    assert (after.version, after.destination_id) == (1, job.destination_id)
    assert await factory.outbox_count(job.id) == 1


async def test_claim_of_the_old_version_waits_for_an_edit_then_finds_nothing(factory, kit):
    job = await factory.queued()
    other = await factory.destination(job.tenant_id, name="partner-new")
    edit = await kit.hold("exports_api")
    rows = await edit.run(
        "edit_terms_if_queued",
        {
            "tenant_id": job.tenant_id,
            "job_id": job.id,
            "expected_version": job.version,
            "destination_id": other,
            "list_name": "main",
            "traceparent": None,
        },
    )
    assert rows == [{"job_id": job.id, "version": 2}]

    worker = await kit.solo("exports_worker")
    claiming = asyncio.create_task(
        worker.store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-3")
    )
    await kit.wait_until_blocked_by(worker.pid, edit.pid)
    await edit.commit()

    assert await claiming == ClaimResult.LOST
    assert (await factory.job(job.id)).status == JobStatus.QUEUED
