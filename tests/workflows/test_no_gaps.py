"""Issue 10 through ExportWorkflow on the real time-skipping server, real PostgreSQL and a real SFTP server:

1. a workflow that is gone (terminated, or ended by a timed-out heartbeat) cannot authorize delivery: the
   attempt is given back to the queue instead of crossing cutoff 2 with nobody left to deliver;
4. one lease keeper per attempt, no gaps: the lease is renewed between the claim and the build's start,
   and cutoff 2 leaves the upload a full lease;
5. leases never wait behind builds: builds stuck on their COPY hold connections of their own pool, while
   renewals keep every lease current; a build that cannot reach the database gives the attempt back.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

import psycopg
import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from domain.models import AuthorizationResult, EventKind, JobStatus
from testbed import pg
from tests.workflows.harness import Harness, Host, make_host, wait_until
from workflows.models import AttemptOutcome


async def lease_current(harness: Harness, job_id: uuid.UUID) -> bool:
    state = await harness.factory.worker.read_ownership(job_id)
    assert state is not None
    return state.lease_current


async def assert_given_back(harness: Harness, job_id: uuid.UUID, attempt_id: uuid.UUID) -> None:
    """Queued again with a fresh wake-up, the attempt recorded as Released and not counted."""
    row = await harness.factory.job(job_id)
    assert (row.status, row.attempt_id, row.attempts_released, row.attempt_count) == (
        JobStatus.QUEUED,
        None,
        1,
        1,
    )
    events = await harness.factory.worker.job_events(job_id)
    assert [e.kind for e in events] == [EventKind.CLAIMED, EventKind.RELEASED]
    assert events[-1].attempt_id == attempt_id
    assert await harness.factory.outbox_count(job_id) == 2  # the creation's wake-up and the release's


# -- 1. a workflow that is gone cannot authorize delivery ----------------------------------------------


async def test_a_workflow_terminated_while_building_never_crosses_cutoff_2_and_gives_the_job_back(
    harness: Harness,
) -> None:
    job = await harness.queue_export(contacts=20)
    terminated = asyncio.Event()

    async def terminated_before_cutoff_2(job_id: uuid.UUID) -> None:
        # The Web UI's "terminate", between the build and cutoff 2: the activity is still running.
        await handle.terminate(reason="terminated from the Web UI")
        terminated.set()

    harness.host.activities.seams.before_authorize = terminated_before_cutoff_2
    handle = await harness.start(job)
    await asyncio.wait_for(terminated.wait(), 20)
    await wait_until(lambda: _released(harness, job.id), "the attempt given back", within=20)
    await wait_until(lambda: _build_removed(harness), "the local file removed", within=10)

    described = await handle.describe()
    assert described.status == WorkflowExecutionStatus.TERMINATED
    running = await harness.factory.worker.job_events(job.id)
    await assert_given_back(harness, job.id, running[0].attempt_id)
    assert "DeliveryAuthorized" not in await harness.factory.event_kinds(job.id)
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []

    # The fresh wake-up runs it once, on a new workflow.
    harness.host.activities.seams.before_authorize = None
    result = await harness.run(job)
    assert result.outcome == AttemptOutcome.COMPLETED
    assert len(harness.uploads(job)) == 1


async def test_a_build_whose_heartbeat_timed_out_never_crosses_cutoff_2(harness: Harness) -> None:
    # The worker stalls after its build: its heartbeats stop, the workflow ends LeftToRecovery on the
    # heartbeat timeout, and only then does the activity reach cutoff 2. Nobody would deliver.
    job = await harness.queue_export(contacts=20)
    timed_out = asyncio.Event()

    async def stall_past_the_heartbeat_timeout(job_id: uuid.UUID) -> None:
        harness.host.activities.seams.heartbeats_paused = True
        with contextlib.suppress(asyncio.CancelledError):
            result = await handle.result()
            assert result.outcome == AttemptOutcome.LEFT_TO_RECOVERY
        timed_out.set()

    harness.host.activities.seams.before_authorize = stall_past_the_heartbeat_timeout
    handle = await harness.start(job, build_heartbeat_seconds=1.0)
    await asyncio.wait_for(timed_out.wait(), 30)
    await wait_until(lambda: _released(harness, job.id), "the attempt given back", within=20)
    await wait_until(lambda: _build_removed(harness), "the local file removed", within=10)

    assert "DeliveryAuthorized" not in await harness.factory.event_kinds(job.id)
    assert (await harness.factory.job(job.id)).status == JobStatus.QUEUED
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []


async def _released(harness: Harness, job_id: uuid.UUID) -> bool:
    return "Released" in await harness.factory.event_kinds(job_id)


async def _build_removed(harness: Harness) -> bool:
    # The activity removes its file in its finally, after the release committed: the row says Released a
    # moment before the activity has ended.
    return harness.files_on_disk() == []


# -- 4. one lease keeper per attempt, no gaps ---------------------------------------------------------


async def test_the_lease_is_renewed_between_the_claim_and_the_build_start(
    harness: Harness, temporal_env: WorkflowEnvironment, database: pg.TestDatabase, work_root: Path
) -> None:
    # A host whose own queue is slow to start the build (its own-queue worker is down for longer than the
    # lease): the claim's keeper keeps the lease current, so nobody takes the attempt over meanwhile.
    host = await make_host(
        f"slow-{uuid.uuid4().hex[:6]}",
        env_client=temporal_env.client,
        database=database,
        shared_queue=harness.shared_queue + "-slow",
        work_root=work_root,
        lease_seconds=1.0,
        renew_every_seconds=0.2,
    )
    try:
        await host.stop()
        host.start_only("workflows", "claims")  # claims are served; the build waits in the own queue
        job = await harness.queue_export(contacts=5)
        handle = await harness.start(job, task_queue=host.shared_queue)
        await wait_until(lambda: _claimed(harness, job.id), "claimed", within=20)
        await asyncio.sleep(2.5)  # two and a half leases with no activity of the attempt running

        assert await lease_current(harness, job.id)
        state = await harness.factory.worker.read_ownership(job.id)
        assert state is not None and state.status == JobStatus.RUNNING

        host.start_only("own")
        result = await handle.result()
        assert result.outcome == AttemptOutcome.COMPLETED
        assert result.cutoff_answers == [AuthorizationResult.AUTHORIZED]
    finally:
        await host.close()


async def _claimed(harness: Harness, job_id: uuid.UUID) -> bool:
    return "Claimed" in await harness.factory.event_kinds(job_id)


async def test_cutoff_2_leaves_the_upload_a_full_lease(harness: Harness) -> None:
    job = await harness.queue_export(contacts=5)
    leases: list[float] = []

    async def lease_left_before_the_upload(job_id: uuid.UUID) -> None:
        rows = await harness.factory.admin(
            "SELECT extract(epoch FROM lease_expires_at - clock_timestamp()) AS left FROM export_jobs"
            " WHERE id = %(id)s",
            {"id": job_id},
        )
        leases.append(float(rows[0]["left"]))

    async def one_second_left(job_id: uuid.UUID) -> None:
        await harness.factory.admin(
            "UPDATE export_jobs SET lease_expires_at = clock_timestamp() + interval '1 second'"
            " WHERE id = %(id)s",
            {"id": job_id},
        )

    harness.host.activities.seams.before_authorize = one_second_left
    harness.host.activities.seams.before_upload = lease_left_before_the_upload
    assert (await harness.run(job)).outcome == AttemptOutcome.COMPLETED
    assert leases and leases[0] > 50  # the build had one second left; the upload starts with a full lease


# -- 5. leases never wait behind builds -----------------------------------------------------------------


@pytest.mark.slow
async def test_builds_stuck_on_their_copy_never_starve_the_renewals(
    harness: Harness, temporal_env: WorkflowEnvironment, database: pg.TestDatabase, work_root: Path
) -> None:
    host = await make_host(
        f"busy-{uuid.uuid4().hex[:6]}",
        env_client=temporal_env.client,
        database=database,
        shared_queue=harness.shared_queue + "-busy",
        work_root=work_root,
        lease_seconds=2.0,
        renew_every_seconds=0.3,
        worker_pool_size=2,
        max_concurrent_builds=2,
    )
    jobs = [await harness.queue_export(contacts=50) for _ in range(4)]
    builds_may_start = asyncio.Event()

    async def after_the_lock(_job_id: uuid.UUID) -> None:
        await builds_may_start.wait()

    host.activities.seams.before_build = after_the_lock
    try:
        async with await psycopg.AsyncConnection.connect(database.admin_url) as locker:
            handles = [await harness.start(job, task_queue=host.shared_queue) for job in jobs]
            await wait_until(lambda: _all_claimed(harness, jobs), "all four claimed", within=20)
            # Every COPY now waits on this lock, holding its connection: the builds are "large" for as long
            # as the test likes. (Taken after the claims, which read the contacts for the policy.)
            await locker.execute("LOCK TABLE contacts IN ACCESS EXCLUSIVE MODE")
            builds_may_start.set()
            await asyncio.sleep(5)  # two and a half leases with every build stuck

            for job in jobs:
                assert await lease_current(harness, job.id), f"{job.id}'s lease expired behind the builds"
            events = [await harness.factory.event_kinds(job.id) for job in jobs]
            assert all(kinds == ["Claimed"] for kinds in events)  # nothing failed, nothing was taken over
            await locker.rollback()

        results = [await h.result() for h in handles]
        assert [r.outcome for r in results] == [AttemptOutcome.COMPLETED] * 4
        for job in jobs:
            assert len(harness.uploads(job)) == 1
    finally:
        await host.close()


async def _all_claimed(harness: Harness, jobs: list) -> bool:
    return all([await _claimed(harness, job.id) for job in jobs])


async def test_a_build_that_cannot_reach_the_database_gives_the_attempt_back(
    harness: Harness, temporal_env: WorkflowEnvironment, database: pg.TestDatabase, work_root: Path
) -> None:
    # The build pool cannot hand out a connection in time (here: the database refuses every new one for
    # the build): transient, so the attempt goes back to the queue, never a terminal BuildFailed.
    host = await make_host(
        f"cutoff-{uuid.uuid4().hex[:6]}",
        env_client=temporal_env.client,
        database=database,
        shared_queue=harness.shared_queue + "-nodb",
        work_root=work_root,
        build_url="postgresql://exports_app@127.0.0.1:9/nowhere?connect_timeout=1",
        build_pool_timeout=1.0,
    )
    job = await harness.queue_export(contacts=5)
    try:
        result = await harness.run(job, task_queue=host.shared_queue)
    finally:
        await host.close()

    assert result.outcome == AttemptOutcome.RELEASED
    row = await harness.factory.job(job.id)
    assert (row.status, row.failure_reason, row.attempts_released) == (JobStatus.QUEUED, None, 1)
    assert "Failed" not in await harness.factory.event_kinds(job.id)


@pytest.fixture(autouse=True)
def _unpause(harness: Harness):
    yield
    for host in harness.hosts:
        host.activities.seams.heartbeats_paused = False


__all__ = ["Host"]
