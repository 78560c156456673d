"""Recovery does not stall behind one slow candidate or one stalled worker (issue 10; the soak found runs that
took minutes while leases stayed expired).

- Candidates are decided concurrently: an expired Delivering attempt whose partner listing hangs does not
  hold up the Running attempts scanned after it.
- The batch heartbeats on a timer, so a listing longer than the heartbeat timeout is not silence; and a
  batch whose worker stops heartbeating (the ``heartbeats_paused`` seam: a SIGSTOPped process sends
  nothing) is retried after ``recovery_heartbeat_seconds``, not after minutes.

Real PostgreSQL, a real SFTP server behind the listing, the real time-skipping Temporal server.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from activities.recovery import RecoveryActivities
from domain.destination import Destination
from domain.evidence import Observation
from domain.models import JobStatus
from partner.delivery import observe_final_name
from partner.kinds import partner_for
from settings import Settings
from testbed.sftp import SftpTarget
from tests.recovery.test_recovery_delivering import delivering_to
from workflows.models import RecoveryBatchInput, RecoveryBatchResult, RecoveryInput
from workflows.recovery import RecoveryWorkflow

pytestmark = pytest.mark.parametrize("sftp_server", ["asyncssh"])


class GatedListing:
    """The real listing, held at a gate until the test opens it (a slow partner; the server is real).
    ``only_attempt`` holds only that attempt of the activity; ``attempts`` records who listed."""

    def __init__(self, *, only_attempt: int | None = None) -> None:
        self.opened = threading.Event()
        self.entered = threading.Event()
        self.only_attempt = only_attempt
        self.attempts: list[int] = []

    def __call__(self, destination: Destination, name: str) -> Observation:
        attempt = activity.info().attempt  # the activity's context reaches this thread
        self.attempts.append(attempt)
        if self.only_attempt in (None, attempt):
            self.entered.set()
            self.opened.wait(timeout=60)
        return observe_final_name(destination, name)


async def wait_for_status(factory, job_id, status: JobStatus, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while (current := (await factory.job(job_id)).status) != status:
        assert time.monotonic() < deadline, f"job {job_id} is {current}, not {status}"
        await asyncio.sleep(0.1)


async def test_a_slow_listing_does_not_hold_up_the_running_attempts_behind_it(
    factory, recovery_store, sftp_target: SftpTarget
) -> None:
    delivering, _ = await delivering_to(factory, sftp_target, os.urandom(500))
    await factory.expire_lease(delivering.id, seconds_ago=30)  # scanned first: the oldest lease
    running = [(await factory.running())[0] for _ in range(3)]
    for job in running:
        await factory.expire_lease(job.id, seconds_ago=10)
    listing = GatedListing()
    recovery = RecoveryActivities(
        recovery_store, Settings(max_attempts=3), observe=listing, partners=partner_for
    )

    batch = asyncio.create_task(
        ActivityEnvironment().run(
            recovery.recover_expired_leases, RecoveryBatchInput(recovery_run_id="recovery:slow", limit=50)
        )
    )
    try:
        assert await asyncio.to_thread(listing.entered.wait, 20)
        for job in running:  # requeued while the partner is still being asked about the first job
            await wait_for_status(factory, job.id, JobStatus.QUEUED)
        assert (await factory.job(delivering.id)).status == JobStatus.DELIVERING
    finally:
        listing.opened.set()
    result = await batch
    assert result.requeued >= 3 and result.outcome_unknown + result.completed >= 1
    assert (await factory.job(delivering.id)).status != JobStatus.DELIVERING


async def test_listings_that_fill_every_slot_do_not_hold_up_the_running_attempts_either(
    factory, recovery_store, sftp_target: SftpTarget
) -> None:
    # One listing slot, held by a hung partner: the Running candidates need no slot (a statement each).
    delivering, _ = await delivering_to(factory, sftp_target, os.urandom(500))
    await factory.expire_lease(delivering.id, seconds_ago=30)
    running = [(await factory.running())[0] for _ in range(3)]
    for job in running:
        await factory.expire_lease(job.id, seconds_ago=10)
    listing = GatedListing()
    recovery = RecoveryActivities(
        recovery_store,
        Settings(max_attempts=3, recovery_concurrency=1),
        observe=listing,
        partners=partner_for,
    )

    batch = asyncio.create_task(
        ActivityEnvironment().run(
            recovery.recover_expired_leases, RecoveryBatchInput(recovery_run_id="recovery:full", limit=50)
        )
    )
    try:
        assert await asyncio.to_thread(listing.entered.wait, 20)
        for job in running:
            await wait_for_status(factory, job.id, JobStatus.QUEUED)
    finally:
        listing.opened.set()
    result = await batch
    assert result.requeued >= 3 and result.outcome_unknown + result.completed >= 1


async def run_recovery(client: Client, task_queue: str, heartbeat_seconds: float) -> RecoveryBatchResult:
    return await client.execute_workflow(
        RecoveryWorkflow.run,
        RecoveryInput(batch=50, max_batches=1, heartbeat_seconds=heartbeat_seconds),
        id=f"recovery-{uuid.uuid4()}",
        task_queue=task_queue,
        result_type=RecoveryBatchResult,
    )


async def test_a_listing_longer_than_the_heartbeat_timeout_is_not_silence(
    ts_env, factory, recovery_store, sftp_target: SftpTarget
) -> None:
    delivering, _ = await delivering_to(factory, sftp_target, os.urandom(500))
    await factory.expire_lease(delivering.id, seconds_ago=30)
    listing = GatedListing()
    recovery = RecoveryActivities(
        recovery_store, Settings(max_attempts=3), observe=listing, partners=partner_for
    )
    task_queue = f"recovery-{uuid.uuid4().hex[:8]}"
    async with Worker(
        ts_env.client, task_queue=task_queue, workflows=[RecoveryWorkflow], activities=recovery.activities()
    ):
        run = asyncio.create_task(run_recovery(ts_env.client, task_queue, heartbeat_seconds=1.0))
        assert await asyncio.to_thread(listing.entered.wait, 20)
        await asyncio.sleep(3.0)  # three heartbeat timeouts of listing: the timer keeps the batch alive
        listing.opened.set()
        result = await asyncio.wait_for(run, 30)
    assert result.outcome_unknown + result.completed == 1 and result.errors == 0
    assert listing.attempts == [1]  # never timed out, so never retried


async def test_a_batch_on_a_stalled_worker_is_retried_after_the_heartbeat_timeout(
    ts_env, factory, recovery_store, sftp_target: SftpTarget
) -> None:
    delivering, _ = await delivering_to(factory, sftp_target, os.urandom(500))
    await factory.expire_lease(delivering.id, seconds_ago=30)  # the stalled attempt waits on its listing
    running, _ = await factory.running()
    await factory.expire_lease(running.id, seconds_ago=10)
    listing = GatedListing(only_attempt=1)
    # The first attempt of the batch stalls as a SIGSTOPped worker would: no heartbeat, no progress.
    recovery = RecoveryActivities(
        recovery_store,
        Settings(max_attempts=3, recovery_concurrency=1),
        observe=listing,
        partners=partner_for,
    )
    recovery.heartbeats_paused = lambda: activity.info().attempt == 1
    task_queue = f"recovery-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    try:
        async with Worker(
            ts_env.client,
            task_queue=task_queue,
            workflows=[RecoveryWorkflow],
            activities=recovery.activities(),
        ):
            run = asyncio.create_task(run_recovery(ts_env.client, task_queue, heartbeat_seconds=2.0))
            assert await asyncio.to_thread(listing.entered.wait, 20)
            # The Running one needs no listing slot: requeued at once. The second attempt, after the timeout,
            # resolves the Delivering one while the first attempt is still stuck on its listing.
            await wait_for_status(factory, running.id, JobStatus.QUEUED, within=20)
            deadline = time.monotonic() + 20
            while (await factory.job(delivering.id)).status == JobStatus.DELIVERING:
                assert time.monotonic() < deadline, "the retried batch never resolved the Delivering job"
                await asyncio.sleep(0.1)
            elapsed = time.monotonic() - started
            listing.opened.set()
            await asyncio.wait_for(run, 60)
    finally:
        listing.opened.set()
    assert listing.attempts[:2] == [1, 2]
    assert elapsed < 15, f"the stalled batch held recovery for {elapsed:.1f}s"
