"""The cancellation request record on the real server (000 "Recording Cancellation Requests"; test matrix
row "The request record").

Each request is decided under a lock on this tenant's job row, bound to its job and operator by the
client's request ID, and recorded with what it found; a lock wait past ``lock_timeout`` records nothing and
answers Busy, and the client retries with the same ID.
"""

from __future__ import annotations

import asyncio
import uuid
from uuid import UUID

import pytest

from domain.models import (
    CancellationOutcome,
    DeliveryOutcome,
    FailureCode,
    FinishResult,
    JobStatus,
    StopPoint,
)
from tests.db.race import Gate, cancel, claim_params, matched, still_waiting

LONG_LOCK_TIMEOUT = "30s"


async def recorded_with_id(factory, request_id: UUID) -> int:
    """How many requests carry this ID, in any tenant (read as the superuser, to see them all)."""
    rows = await factory.admin(
        "SELECT count(*) AS n FROM cancellation_requests WHERE id = %(id)s", {"id": request_id}
    )
    return rows[0]["n"]


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (JobStatus.QUEUED, CancellationOutcome.CANCELED_WHILE_QUEUED),
        (JobStatus.RUNNING, CancellationOutcome.STOP_REQUESTED),
        (JobStatus.DELIVERING, CancellationOutcome.TOO_LATE),
        (JobStatus.CANCELED, CancellationOutcome.ALREADY_CANCELED),
        (JobStatus.REJECTED, CancellationOutcome.ALREADY_ENDED),
        (JobStatus.STOPPED, CancellationOutcome.ALREADY_ENDED),
        (JobStatus.FAILED, CancellationOutcome.ALREADY_ENDED),
        (JobStatus.COMPLETED, CancellationOutcome.TOO_LATE),
        (JobStatus.OUTCOME_UNKNOWN, CancellationOutcome.TOO_LATE),
    ],
)
async def test_every_request_is_recorded_with_the_state_and_attempt_it_found(
    factory, api_store, status, outcome
):
    job, attempt = await factory.in_status(status)

    result = await cancel(api_store, job)

    assert result.outcome == outcome
    [recorded] = [
        r
        for r in await api_store.job_cancellation_requests(job.tenant_id, job.id)
        if r.id == result.request_id
    ]
    assert (recorded.outcome, recorded.found_status, recorded.found_attempt_id, recorded.requested_by) == (
        outcome,
        status,
        job.attempt_id,
        "sam.ops",
    )
    assert recorded.found_attempt_count == job.attempt_count
    assert recorded.found_delivery_authorized_at == job.delivery_authorized_at
    after = await factory.job(job.id)
    if outcome == CancellationOutcome.CANCELED_WHILE_QUEUED:
        assert (after.status, after.cancellation_request_id) == (JobStatus.CANCELED, result.request_id)
    elif outcome == CancellationOutcome.STOP_REQUESTED:
        assert (after.status, after.stop_request_id) == (JobStatus.RUNNING, result.request_id)
    else:
        assert after == job  # recorded, not obeyed


async def test_two_simultaneous_submissions_of_one_request_id_give_one_record_and_one_answer(factory, kit):
    job = await factory.queued()
    request_id = uuid.uuid4()
    first_api, second_api = await kit.solo("exports_api"), await kit.solo("exports_api")
    gate = Gate()
    first = asyncio.create_task(cancel(first_api.store, job, request_id=request_id, before_commit=gate))
    await gate.wait_entered()

    second = asyncio.create_task(
        cancel(second_api.store, job, request_id=request_id, lock_timeout=LONG_LOCK_TIMEOUT)
    )
    await kit.wait_until_blocked_by(second_api.pid, first_api.pid)
    await still_waiting(second)
    gate.commit()

    one, two = await first, await second
    assert one.outcome == two.outcome == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert (one.replayed, two.replayed) == (False, True)
    assert one.request == two.request
    assert await recorded_with_id(factory, request_id) == 1


async def test_request_id_reused_for_another_job_or_operator_is_refused_and_records_nothing(
    factory, api_store
):
    job = await factory.queued()
    other = await factory.queued(job.tenant_id, job.destination_id)
    request_id = uuid.uuid4()
    assert (
        await cancel(api_store, job, request_id=request_id)
    ).outcome == CancellationOutcome.CANCELED_WHILE_QUEUED

    reused = await cancel(api_store, other, request_id=request_id)
    by_someone_else = await cancel(api_store, job, request_id=request_id, requested_by="kim.ops")

    assert reused.outcome == by_someone_else.outcome == CancellationOutcome.REQUEST_ID_REUSED
    assert reused.request is None  # says nothing about the other request
    assert (await factory.job(other.id)).status == JobStatus.QUEUED
    assert await api_store.job_cancellation_requests(other.tenant_id, other.id) == []
    assert await recorded_with_id(factory, request_id) == 1


async def test_request_id_reused_for_another_job_at_the_same_moment_changes_neither(factory, kit):
    # Different jobs, different row locks: the two transactions meet only on the request's primary key.
    job = await factory.queued()
    other = await factory.queued(job.tenant_id, job.destination_id)
    request_id = uuid.uuid4()
    first_api, second_api = await kit.solo("exports_api"), await kit.solo("exports_api")
    gate = Gate()
    first = asyncio.create_task(cancel(first_api.store, job, request_id=request_id, before_commit=gate))
    await gate.wait_entered()

    second = asyncio.create_task(cancel(second_api.store, other, request_id=request_id))
    await kit.wait_until_blocked_by(second_api.pid, first_api.pid)  # on the uncommitted key
    gate.commit()

    assert (await first).outcome == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert (await second).outcome == CancellationOutcome.REQUEST_ID_REUSED
    assert (await factory.job(other.id)).status == JobStatus.QUEUED  # its cancel rolled back with the insert
    assert await recorded_with_id(factory, request_id) == 1


async def test_the_same_request_id_in_another_tenant_is_a_different_request(factory, api_store):
    ours = await factory.queued()
    theirs = await factory.queued(await factory.tenant("globex"))
    request_id = uuid.uuid4()

    first = await cancel(api_store, ours, request_id=request_id)
    second = await cancel(api_store, theirs, request_id=request_id)

    assert first.outcome == second.outcome == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert second.replayed is False
    assert await recorded_with_id(factory, request_id) == 2


async def test_missing_job_and_another_tenants_job_are_not_found_and_record_nothing(factory, api_store):
    job = await factory.queued()
    intruder = await factory.tenant("globex")
    missing_id, foreign_id = uuid.uuid4(), uuid.uuid4()

    missing = await api_store.request_cancellation(
        tenant_id=job.tenant_id,
        job_id=uuid.uuid4(),
        request_id=missing_id,
        requested_by="sam.ops",
        reason=None,
    )
    foreign = await api_store.request_cancellation(
        tenant_id=intruder, job_id=job.id, request_id=foreign_id, requested_by="eve.ops", reason=None
    )

    assert missing.outcome == foreign.outcome == CancellationOutcome.NOT_FOUND
    assert (missing.request, foreign.request, foreign.job) == (None, None, None)
    assert await recorded_with_id(factory, missing_id) == await recorded_with_id(factory, foreign_id) == 0
    assert await factory.job(job.id) == job


async def test_busy_after_lock_timeout_records_nothing_then_retry_with_the_same_id_succeeds(
    factory, kit, api_store
):
    job = await factory.queued()
    attempt = uuid.uuid4()
    claim = await kit.hold("exports_worker")
    assert matched(await claim.run("claim_if_queued", claim_params(job, attempt)))

    request_id = uuid.uuid4()
    busy = await cancel(api_store, job, request_id=request_id, lock_timeout="200ms")

    assert busy.outcome == CancellationOutcome.BUSY
    assert (busy.request, busy.request_id) == (None, request_id)
    assert await recorded_with_id(factory, request_id) == 0
    assert (await factory.job(job.id)).status == JobStatus.QUEUED  # the claim is still uncommitted

    await claim.commit()
    retried = await cancel(api_store, job, request_id=request_id, lock_timeout="200ms")

    assert retried.outcome == CancellationOutcome.STOP_REQUESTED
    assert retried.request is not None and retried.request.found_attempt_id == attempt
    assert await recorded_with_id(factory, request_id) == 1


# The blocking proof of the locking read (hold a cancellation after its FOR UPDATE, start a claim, see it
# wait in pg_blocking_pids, then commit) is test_claim_waits_for_cancel_then_cannot_leave_queued in
# test_claim_cancel_race.py; it makes every assertion this module would, and more.


def renewal_owned(job_id: UUID, attempt: UUID):
    async def write(store) -> bool:
        return (await store.renew_lease(job_id, attempt)).owned

    return write


def completion_written(job_id: UUID, attempt: UUID):
    async def write(store) -> bool:
        return await store.finish_delivery(job_id, attempt, DeliveryOutcome.COMPLETED) == FinishResult.WRITTEN

    return write


async def test_locking_read_holds_the_row_even_when_the_outcome_changes_nothing(factory, kit, api_store):
    # StopAlreadyRequested and TooLate write nothing to the job: only the FOR UPDATE can make a writer wait.
    running, attempt = await factory.running()
    assert (await cancel(api_store, running)).outcome == CancellationOutcome.STOP_REQUESTED
    delivering, delivering_attempt = await factory.delivering()

    for job, writer_call, outcome in (
        (
            running,
            renewal_owned(running.id, attempt),
            CancellationOutcome.STOP_ALREADY_REQUESTED,
        ),
        (
            delivering,
            completion_written(delivering.id, delivering_attempt),
            CancellationOutcome.TOO_LATE,
        ),
    ):
        api = await kit.solo("exports_api")
        gate = Gate()
        canceling = asyncio.create_task(cancel(api.store, job, before_commit=gate))
        await gate.wait_entered()

        worker = await kit.solo("exports_worker")
        writing = asyncio.create_task(writer_call(worker.store))
        await kit.wait_until_blocked_by(worker.pid, api.pid)
        await still_waiting(writing)
        gate.commit()

        assert (await canceling).outcome == outcome
        assert await writing is True  # the worker's own write then goes ahead


async def test_retry_after_the_job_moved_on_returns_the_outcome_already_recorded(
    factory, api_store, worker_store
):
    job, attempt = await factory.running()
    request_id = uuid.uuid4()
    first = await cancel(api_store, job, request_id=request_id)
    assert first.outcome == CancellationOutcome.STOP_REQUESTED
    assert (
        await worker_store.finish_stopped(job.id, attempt, StopPoint.BEFORE_DELIVERY) == FinishResult.WRITTEN
    )

    again = await cancel(api_store, job, request_id=request_id)

    assert (again.outcome, again.replayed, again.request) == (
        CancellationOutcome.STOP_REQUESTED,
        True,
        first.request,
    )
    assert (await factory.job(job.id)).status == JobStatus.STOPPED
    assert await recorded_with_id(factory, request_id) == 1


async def test_cancellation_never_rewrites_a_recorded_failure(factory, api_store):
    job, _ = await factory.in_status(JobStatus.FAILED, code=FailureCode.BUILD_FAILED)
    assert (await cancel(api_store, job)).outcome == CancellationOutcome.ALREADY_ENDED
    assert await factory.job(job.id) == job
