"""The statements issue 10 adds to the row protocol, against the real database (the seed's matrix style):

- ``release_attempt_if_running``: Running -> Queued by the attempt that holds the job only (whichever host
  holds it: 23.8), never over a recorded stop request, with its Released event and a fresh wake-up, and not
  counted against the attempt cap (its backoff and bound: ``test_give_backs.py``);
- the upload and rename fences: written only by the owning attempt, Delivering, with a current lease
  (the rename fence only after the upload fence);
- ``fail_unpublished_delivery``: an expired attempt that never fenced its rename is Failed NotDelivered,
  and it and a late fence serialize on the row: whichever commits first, the other matches nothing;
- ``fail_set_aside_delivery``: an expired attempt that fenced its rename, whose temporary file recovery set
  aside, is Failed NotDelivered; it and the paused worker's renewal serialize on the row the same way;
- cutoff 2 gives the upload a full lease and marks the attempt as expecting its fences.
"""

from __future__ import annotations

import asyncio
import uuid

from domain.models import (
    AuthorizationResult,
    ClaimResult,
    DeliveryOutcome,
    EventKind,
    FailureCode,
    FenceResult,
    FinishResult,
    JobStatus,
    ReleaseResult,
)
from tests.db.race import authorize, cancel, still_waiting

RUN = "recovery-test"


def fence_params(job_id: uuid.UUID, attempt_id: uuid.UUID) -> dict[str, object]:
    return {"job_id": job_id, "attempt_id": attempt_id, "window_margin_seconds": 5.0}


def fail_params(job_id: uuid.UUID, attempt_id: uuid.UUID) -> dict[str, object]:
    return {"job_id": job_id, "expired_attempt_id": attempt_id, "recovery_run_id": RUN}


# -- release ------------------------------------------------------------------------------------------


async def test_the_owner_releases_a_running_attempt_with_its_event_and_a_fresh_wake_up(factory, worker_store):
    job, attempt = await factory.running()
    claimed = await factory.job(job.id)

    assert await worker_store.release_attempt_if_running(
        job.id, attempt, claimed.claimed_by, "worker draining"
    ) == (ReleaseResult.RELEASED)

    row = await factory.job(job.id)
    assert (row.status, row.attempt_id, row.claimed_by, row.lease_expires_at) == (
        JobStatus.QUEUED,
        None,
        None,
        None,
    )
    assert (row.attempt_count, row.attempts_released) == (1, 1)
    events = await worker_store.job_events(job.id)
    assert [(e.kind, e.attempt_id, e.worker_id, e.detail) for e in events][-1] == (
        EventKind.RELEASED,
        attempt,
        claimed.claimed_by,
        "drain: worker draining",
    )
    assert (row.available_at, row.transient_releases) == (None, 0)  # a drain neither waits nor counts
    assert await factory.outbox_count(job.id) == 2
    assert row.woken_at > claimed.woken_at


async def test_only_the_attempt_holding_the_job_releases_it_and_only_from_running(factory, worker_store):
    # Ownership is the attempt's (23.8): another attempt's ID is refused whoever sends it, and the attempt
    # that holds the job may be given back by the host that holds it now (test_give_backs.py).
    job, attempt = await factory.running()
    owner = (await factory.job(job.id)).claimed_by
    assert (
        await worker_store.release_attempt_if_running(job.id, uuid.uuid4(), owner, "x")
        == ReleaseResult.NOT_OWNER
    )
    delivering, d_attempt = await factory.delivering()
    d_owner = (await factory.job(delivering.id)).claimed_by
    assert await worker_store.release_attempt_if_running(delivering.id, d_attempt, d_owner, "x") == (
        ReleaseResult.NOT_OWNER
    )  # past cutoff 2 nothing goes back to the queue
    assert (await factory.job(job.id)).status == JobStatus.RUNNING
    assert (await factory.job(delivering.id)).status == JobStatus.DELIVERING


async def test_a_recorded_stop_request_is_never_released_into_the_queue(factory, worker_store, api_store):
    job, attempt = await factory.running()
    owner = (await factory.job(job.id)).claimed_by
    await cancel(api_store, job)  # StopRequested

    assert await worker_store.release_attempt_if_running(job.id, attempt, owner, "worker draining") == (
        ReleaseResult.NOT_OWNER
    )
    assert (await factory.job(job.id)).status == JobStatus.RUNNING  # finish_stopped honors it instead


async def test_released_attempts_do_not_count_towards_the_attempt_cap(factory, worker_store, recovery_store):
    job, _ = await factory.running()
    for _ in range(3):  # three drains in a row
        row = await factory.job(job.id)
        assert row.attempt_id is not None and row.claimed_by is not None
        await worker_store.release_attempt_if_running(
            job.id, row.attempt_id, row.claimed_by, "worker draining"
        )
        job, _ = await factory.running(await factory.job(job.id))
    row = await factory.job(job.id)
    assert (row.attempt_count, row.attempts_released) == (4, 3)
    await factory.expire_lease(job.id)
    # One attempt counted against a cap of 3: recovery requeues rather than exhausting.
    assert await recovery_store.exhaust_expired_attempt(job.id, row.attempt_id, 3, RUN) is False
    assert await recovery_store.requeue_expired_attempt(job.id, row.attempt_id, 3, RUN) is True


# -- the fences -----------------------------------------------------------------------------------------


async def test_cutoff_2_gives_a_full_lease_and_expects_the_fences(factory, worker_store):
    job, attempt = await factory.running()
    await factory.admin(
        "UPDATE export_jobs SET lease_expires_at = clock_timestamp() + interval '1 second' WHERE id = %(id)s",
        {"id": job.id},
    )
    assert await authorize(worker_store, job, attempt) == AuthorizationResult.AUTHORIZED
    rows = await factory.admin(
        "SELECT fence_expected, upload_fenced_at, rename_fenced_at,"
        " extract(epoch FROM lease_expires_at - clock_timestamp()) AS left FROM export_jobs WHERE id = %(id)s",
        {"id": job.id},
    )
    assert rows[0]["fence_expected"] is True
    assert rows[0]["upload_fenced_at"] is None and rows[0]["rename_fenced_at"] is None
    assert float(rows[0]["left"]) > 50  # the worker store's 60 s lease, not what the build had left


async def test_only_the_owning_attempt_fences_and_a_repeated_fence_finds_its_own(factory, worker_store):
    job, attempt = await factory.delivering()
    assert (
        await worker_store.fence_rename_if_delivering(job.id, attempt) == FenceResult.NOT_OWNER
    )  # upload first
    assert await worker_store.fence_upload_if_delivering(job.id, uuid.uuid4()) == FenceResult.NOT_OWNER
    assert await worker_store.fence_upload_if_delivering(job.id, attempt) == FenceResult.FENCED
    assert await worker_store.fence_upload_if_delivering(job.id, attempt) == FenceResult.FENCED  # a retry
    assert await worker_store.fence_rename_if_delivering(job.id, attempt) == FenceResult.FENCED
    kinds = await factory.event_kinds(job.id)
    assert kinds.count("UploadFenced") == 1 and kinds.count("RenameFenced") == 1
    running, r_attempt = await factory.running()
    assert await worker_store.fence_upload_if_delivering(running.id, r_attempt) == FenceResult.NOT_OWNER


async def test_a_fence_with_a_lapsed_lease_is_refused_until_the_owner_renews(factory, worker_store):
    job, attempt = await factory.delivering()
    await factory.expire_lease(job.id)
    assert await worker_store.fence_upload_if_delivering(job.id, attempt) == FenceResult.LEASE_LAPSED
    assert (await worker_store.renew_lease(job.id, attempt)).owned
    assert await worker_store.fence_upload_if_delivering(job.id, attempt) == FenceResult.FENCED


async def test_recovery_fails_an_attempt_that_never_fenced_its_rename_and_only_that(
    factory, recovery_store, worker_store
):
    unfenced, a = await factory.delivering()
    uploaded, b = await factory.delivering()
    await factory.fence(uploaded.id, b, rename=False)
    renamed, c = await factory.delivering()
    await factory.fence(renamed.id, c, rename=True)
    for job in (unfenced, uploaded, renamed):
        await factory.expire_lease(job.id)

    assert await recovery_store.fail_unpublished_delivery(unfenced.id, a, RUN)
    assert await recovery_store.fail_unpublished_delivery(uploaded.id, b, RUN)
    assert not await recovery_store.fail_unpublished_delivery(renamed.id, c, RUN)  # only evidence can tell

    for job in (unfenced, uploaded):
        row = await factory.job(job.id)
        assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    assert (await factory.job(renamed.id)).status == JobStatus.DELIVERING
    candidates = {c.id: c for c in await recovery_store.find_expired_leases(limit=1000)}
    assert candidates[renamed.id].unpublished is False
    # The late fence of the failed attempt is refused.
    assert await worker_store.fence_rename_if_delivering(uploaded.id, b) == FenceResult.NOT_OWNER


async def test_a_current_lease_keeps_recovery_from_failing_an_unfenced_attempt(factory, recovery_store):
    job, attempt = await factory.delivering()
    assert not await recovery_store.fail_unpublished_delivery(job.id, attempt, RUN)
    assert (await factory.job(job.id)).status == JobStatus.DELIVERING


async def test_a_fence_committed_first_makes_recovery_wait_then_match_nothing(factory, kit):
    job, attempt = await factory.delivering()
    await factory.fence(job.id, attempt, rename=False)
    await factory.admin(
        "UPDATE export_jobs SET lease_expires_at = clock_timestamp() + interval '1 second' WHERE id = %(id)s",
        {"id": job.id},
    )
    held = await kit.hold("exports_worker")
    rows = await held.run("fence_rename_if_delivering", fence_params(job.id, attempt))
    assert rows[0]["matched"] is True  # with its lease still current; uncommitted
    await factory.admin("SELECT pg_sleep(1.2)")  # the lease expires on the database clock meanwhile

    recovery = await kit.solo("exports_recovery")
    failing = asyncio.create_task(recovery.store.fail_unpublished_delivery(job.id, attempt, RUN))
    await kit.wait_until_blocked_by(recovery.pid, held.pid)
    await still_waiting(failing)

    await held.commit()
    assert await failing is False  # the rename fence is written: recovery must read the evidence instead
    assert (await factory.job(job.id)).status == JobStatus.DELIVERING


async def test_recovery_committed_first_makes_a_late_fence_wait_then_be_refused(factory, kit):
    job, attempt = await factory.delivering()
    await factory.expire_lease(job.id)
    held = await kit.hold("exports_recovery")
    assert await held.run("fail_unpublished_delivery", fail_params(job.id, attempt))

    worker = await kit.solo("exports_worker")
    fencing = asyncio.create_task(worker.store.fence_upload(job.id, attempt))
    await kit.wait_until_blocked_by(worker.pid, held.pid)
    await still_waiting(fencing)

    await held.commit()
    answer = await fencing
    assert answer.result == FenceResult.NOT_OWNER  # the paused worker sends nothing
    row = await factory.job(job.id)
    # its answer is the row recovery committed, read after the wait, not the one its snapshot saw first
    assert answer.job == row
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)


async def test_the_upload_fence_answers_with_the_row_it_wrote_or_found(factory, worker_store):
    """The upload reads nothing before its fence: the fence's answer is the whole row, as it wrote it (with the
    terms cutoff 2 authorized), or, refused, as its locking read found it."""
    job, attempt = await factory.delivering()
    refused = await worker_store.fence_upload(job.id, uuid.uuid4())
    assert refused.result == FenceResult.NOT_OWNER
    assert refused.job == await factory.job(job.id)  # as found: not fenced, this attempt's

    fenced = await worker_store.fence_upload(job.id, attempt)
    row = await factory.job(job.id)
    assert fenced.result == FenceResult.FENCED and fenced.job == row
    assert row.upload_fenced_at is not None and row.attempt_id == attempt
    assert (row.expected_file_name, row.destination_version) == (
        fenced.job.expected_file_name,
        fenced.job.destination_version,
    ) and row.delivery_authorized_at is not None


async def test_the_claim_answers_with_the_row_it_wrote_and_only_when_it_claimed(factory, worker_store):
    """The build reads nothing before it starts: the claim's answer is the whole row as the claim wrote it. A
    claim that matched nothing hands on no row."""
    job = await factory.queued()
    attempt = uuid.uuid4()
    claim = await worker_store.claim(job.id, job.version, attempt, "w1")
    row = await factory.job(job.id)
    assert claim.result == ClaimResult.CLAIMED and claim.job == row
    assert (row.status, row.attempt_id, row.claimed_by, row.attempt_count) == (
        JobStatus.RUNNING,
        attempt,
        "w1",
        1,
    )

    again = await worker_store.claim(job.id, job.version, uuid.uuid4(), "w2")
    assert (again.result, again.job) == (ClaimResult.LOST, None)


async def test_a_rolled_back_recovery_lets_the_waiting_fence_through(factory, kit, worker_store):
    job, attempt = await factory.delivering()
    await factory.expire_lease(job.id)
    held = await kit.hold("exports_recovery")
    assert await held.run("fail_unpublished_delivery", fail_params(job.id, attempt))

    worker = await kit.solo("exports_worker")
    fencing = asyncio.create_task(worker.store.fence_upload_if_delivering(job.id, attempt))
    await kit.wait_until_blocked_by(worker.pid, held.pid)
    await held.rollback()

    # Still the owner, only late: the fence reports the lapsed lease; a renewal lets it through.
    assert await fencing == FenceResult.LEASE_LAPSED
    assert (await worker_store.renew_lease(job.id, attempt)).owned
    assert await worker_store.fence_upload_if_delivering(job.id, attempt) == FenceResult.FENCED


# -- recovery's set-aside ---------------------------------------------------------------------------


def set_aside_params(job_id: uuid.UUID, attempt_id: uuid.UUID) -> dict[str, object]:
    return {**fail_params(job_id, attempt_id), "evidence_summary": "set aside (test)"}


async def test_recovery_fails_a_set_aside_attempt_only_after_its_rename_fence_and_over_an_expired_lease(
    factory, recovery_store
):
    renamed, a = await factory.delivering()
    await factory.fence(renamed.id, a, rename=True)
    uploaded, b = await factory.delivering()
    await factory.fence(uploaded.id, b, rename=False)
    current, c = await factory.delivering()
    await factory.fence(current.id, c, rename=True)
    for job in (renamed, uploaded):
        await factory.expire_lease(job.id)

    assert await recovery_store.fail_set_aside_delivery(renamed.id, a, RUN, "set aside (test)")
    # Without the rename fence the upload may not have been complete: fail_unpublished_delivery's case.
    assert not await recovery_store.fail_set_aside_delivery(uploaded.id, b, RUN, "set aside (test)")
    assert not await recovery_store.fail_set_aside_delivery(
        current.id, c, RUN, "set aside (test)"
    )  # its lease

    row = await factory.job(renamed.id)
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    [event] = [
        e for e in await recovery_store.job_events(renamed.id) if e.kind == EventKind.RESOLVED_BY_RECOVERY
    ]
    assert (event.attempt_id, event.observed_by, event.detail) == (
        a,
        RUN,
        "Failed NotDelivered: set aside (test)",
    )
    for job in (uploaded, current):
        assert (await factory.job(job.id)).status == JobStatus.DELIVERING


async def test_a_renewal_committed_first_makes_the_set_aside_failure_wait_then_match_nothing(factory, kit):
    job, attempt = await factory.delivering()
    await factory.fence(job.id, attempt, rename=True)
    await factory.expire_lease(job.id)
    held = await kit.hold("exports_worker")
    assert await held.run("renew_lease", {"job_id": job.id, "attempt_id": attempt, "lease_seconds": 60})

    recovery = await kit.solo("exports_recovery")
    failing = asyncio.create_task(recovery.store.fail_set_aside_delivery(job.id, attempt, RUN, "set aside"))
    await kit.wait_until_blocked_by(recovery.pid, held.pid)
    await still_waiting(failing)

    await held.commit()
    assert await failing is False  # the paused worker woke: it finds its rename refused and says so itself
    assert (await factory.job(job.id)).status == JobStatus.DELIVERING


async def test_the_set_aside_failure_committed_first_makes_the_renewal_wait_then_lose_the_job(factory, kit):
    job, attempt = await factory.delivering()
    await factory.fence(job.id, attempt, rename=True)
    await factory.expire_lease(job.id)
    held = await kit.hold("exports_recovery")
    assert await held.run("fail_set_aside_delivery", set_aside_params(job.id, attempt))

    worker = await kit.solo("exports_worker")
    renewing = asyncio.create_task(worker.store.renew_lease(job.id, attempt))
    await kit.wait_until_blocked_by(worker.pid, held.pid)
    await still_waiting(renewing)

    await held.commit()
    assert (await renewing).owned is False
    assert (
        await worker.store.finish_delivery(job.id, attempt, DeliveryOutcome.COMPLETED)
        == FinishResult.NOT_OWNER
    )
    row = await factory.job(job.id)
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
