"""The worker-level rows of 000's test matrix through ExportWorkflow: leases kept through long builds and
uploads, a paused worker at cutoff 2, takeovers during an upload, crashes after the claim and after cutoff 2.
Short leases (2 s, renewed every 0.3 s) and waits on the database clock, never on the test's."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from db.errors import TransientStoreError
from domain.evidence import set_aside_name_for
from domain.models import AuthorizationResult, EventKind, ExportJob, FailureCode, JobStatus
from testbed import pg
from tests.workflows.harness import Harness, make_host, recover
from workflows.models import AttemptOutcome

LEASE, RENEW = 2.0, 0.3


async def claimed_at(harness: Harness, job_id: uuid.UUID):
    events = await harness.factory.worker.job_events(job_id)
    return next(e.recorded_at for e in events if e.kind == EventKind.CLAIMED)


async def outlast_the_initial_lease(harness: Harness, job_id: uuid.UUID) -> None:
    """Hold the attempt until the database clock is past the lease its claim set."""
    await harness.wait_until_db_clock_passes(await claimed_at(harness, job_id) + timedelta(seconds=LEASE + 1))


async def assert_delivered_once(harness: Harness, job: ExportJob) -> None:
    row = await harness.factory.job(job.id)
    assert row.status == JobStatus.COMPLETED and row.attempt_count == 1
    kinds = await harness.factory.event_kinds(job.id)
    assert kinds.count("Claimed") == 1 and kinds.count("DeliveryAuthorized") == 1 and kinds[-1] == "Finished"
    assert len(harness.uploads(job)) == 1 and harness.files_on_disk() == []


async def test_a_long_build_that_outlasts_the_initial_lease_keeps_it_and_delivers_once(
    harness: Harness,
) -> None:
    harness.host.set_timings(LEASE, RENEW)
    job = await harness.queue_export(contacts=10)

    async def long_build(job_id: uuid.UUID) -> None:
        await outlast_the_initial_lease(harness, job_id)

    harness.host.activities.seams.after_build = long_build
    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.COMPLETED
    assert result.cutoff_answers == [AuthorizationResult.AUTHORIZED]  # never lapsed: the keeper renewed
    await assert_delivered_once(harness, job)


async def test_a_renewal_that_throws_does_not_stop_a_healthy_build(harness: Harness) -> None:
    harness.host.set_timings(LEASE, RENEW)
    job = await harness.queue_export(contacts=10)
    calls = 0

    async def flaky_renewal() -> None:
        nonlocal calls
        calls += 1
        if calls in (2, 3):
            raise TransientStoreError("injected at the before_renewal seam")

    async def long_build(job_id: uuid.UUID) -> None:
        await outlast_the_initial_lease(harness, job_id)

    harness.host.activities.seams.before_renewal = flaky_renewal
    harness.host.activities.seams.after_build = long_build
    result = await harness.run(job)

    assert calls > 3
    assert result.outcome == AttemptOutcome.COMPLETED
    assert result.cutoff_answers == [AuthorizationResult.AUTHORIZED]
    await assert_delivered_once(harness, job)


async def test_a_long_upload_that_outlasts_the_initial_lease_finishes_completed(harness: Harness) -> None:
    harness.host.set_timings(LEASE, RENEW)
    job = await harness.queue_export(contacts=3000)
    waited: list[bool] = []

    async def long_upload(job_id: uuid.UUID, sent: int) -> None:
        if not waited:
            waited.append(True)
            await outlast_the_initial_lease(harness, job_id)

    harness.host.activities.seams.during_upload = long_upload
    result = await harness.run(job)

    assert waited and result.outcome == AttemptOutcome.COMPLETED
    await assert_delivered_once(harness, job)


async def taken_over_mid_upload(harness: Harness, job: ExportJob) -> tuple[list[str], Any]:
    """Run ``job`` on a paused worker (its lease can expire) that recovery takes over after the first bytes
    of its upload; returns (the takeovers, the run's result)."""
    harness.host.set_timings(LEASE, RENEW)
    harness.host.activities.seams.lease_timer_disabled = True
    takeovers: list[str] = []

    async def taken_over(job_id: uuid.UUID, sent: int) -> None:
        if not takeovers:
            await harness.factory.expire_lease(job.id)
            takeovers.append(await recover(harness, job))

    harness.host.activities.seams.during_upload = taken_over
    return takeovers, await harness.run(job)


async def test_a_takeover_during_the_upload_refuses_the_rename_and_nothing_is_published(
    harness: Harness,
) -> None:
    # Issue 10: the rename fence. Taken over before it, the attempt never wrote the final name, so
    # recovery proves NotDelivered and refuses the late fence; the upload finishes into its temporary name
    # and the rename is never sent.
    job = await harness.queue_export(contacts=3000)
    takeovers, result = await taken_over_mid_upload(harness, job)

    assert takeovers == ["NotDelivered"]
    assert result.outcome == AttemptOutcome.NOT_OWNER  # its terminal write matched nothing
    row = await harness.factory.job(job.id)
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    assert harness.uploads(job) == []  # no final name: only the attempt's temporary file is left
    events = await harness.factory.worker.job_events(job.id)
    assert [e.kind for e in events if e.kind in (EventKind.UPLOAD_FENCED, EventKind.RENAME_FENCED)] == [
        EventKind.UPLOAD_FENCED
    ]
    resolved = next(i for i, e in enumerate(events) if e.kind == EventKind.RESOLVED_BY_RECOVERY)
    late = [e for e in events[resolved + 1 :] if e.kind == EventKind.DELIVERY_EVIDENCE]
    assert any('"result": "not_authorized"' in (e.detail or "") for e in late)
    assert "Finished" not in [e.kind for e in events]
    assert harness.files_on_disk() == []


async def taken_over_after_the_rename_fence(
    harness: Harness, job: ExportJob, *, refuse_the_move: bool = False
):
    """Run ``job`` on a paused worker (its lease can expire) that recovery takes over right after its rename
    fence; with ``refuse_the_move`` a directory at the set-aside name makes the partner refuse recovery's
    move. Returns (the takeovers, the run's result, the events after recovery's resolution, all events)."""
    harness.host.set_timings(LEASE, RENEW)
    harness.host.activities.seams.lease_timer_disabled = True
    takeovers: list[str] = []

    async def taken_over_before_the_rename(job_id: uuid.UUID) -> None:
        if not takeovers:
            if refuse_the_move:
                attempt = (await harness.factory.job(job.id)).attempt_id
                (harness.sftp.local_dir / set_aside_name_for(attempt, job.final_name)).mkdir()
            await harness.factory.expire_lease(job.id)
            takeovers.append(await recover(harness, job))

    harness.host.activities.seams.after_rename_fence = taken_over_before_the_rename
    result = await harness.run(job)
    events = await harness.factory.worker.job_events(job.id)
    resolved = next(i for i, e in enumerate(events) if e.kind == EventKind.RESOLVED_BY_RECOVERY)
    late = [e for e in events[resolved + 1 :] if e.kind == EventKind.DELIVERY_EVIDENCE]
    return takeovers, result, events[resolved], late, events


def late_evidence(late, observation: str, word: str) -> bool:
    return any(
        f'"observation": "{observation}"' in (e.detail or "") and word in (e.detail or "") for e in late
    )


async def test_a_takeover_after_the_rename_fence_sets_the_file_aside_and_the_late_rename_is_refused(
    harness: Harness,
) -> None:
    # The seed's case "if a takeover does commit during the upload", past the rename fence: recovery moves
    # the paused attempt's temporary file to its set-aside name, so the rename can no longer publish it, and
    # records Failed NotDelivered. The worker wakes, sends its rename, is refused (nothing there), and
    # classifies the same outcome; its terminal write matches nothing, and the final name is never written.
    job = await harness.queue_export(contacts=3000)
    takeovers, result, _, late, events = await taken_over_after_the_rename_fence(harness, job)

    assert takeovers == ["NotDelivered"]
    assert result.outcome == AttemptOutcome.NOT_OWNER  # its terminal write matched nothing
    row = await harness.factory.job(job.id)
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    assert harness.uploads(job) == []  # the final name was never written
    assert [p.name for p in harness.partner_files(job)] == [
        set_aside_name_for(row.attempt_id, job.final_name)
    ]
    assert late_evidence(late, "rename", '"refused"') and late_evidence(late, "outcome", "NotDelivered")
    assert "Finished" not in [e.kind for e in events]
    assert harness.files_on_disk() == []


async def test_a_takeover_after_the_rename_fence_keeps_the_late_receipt_as_evidence(harness: Harness) -> None:
    # The same takeover where the partner refuses recovery's move: nothing proves the rename can no longer
    # publish (OutcomeUnknown); the rename goes ahead, and its late receipt is kept as evidence without
    # changing the row.
    job = await harness.queue_export(contacts=3000)
    takeovers, result, resolved, late, events = await taken_over_after_the_rename_fence(
        harness, job, refuse_the_move=True
    )

    assert takeovers == ["OutcomeUnknown"]  # nothing under the final name yet, and the move was refused
    assert result.outcome == AttemptOutcome.NOT_OWNER  # its terminal write matched nothing
    assert await harness.status(job) == JobStatus.OUTCOME_UNKNOWN  # the late receipt changed nothing
    assert len(harness.uploads(job)) == 1  # the upload was not interrupted
    assert "the move to" in (resolved.detail or "") and "was refused" in (resolved.detail or "")
    assert late and all(e.observed_by == harness.host.name for e in late)
    assert late_evidence(late, "outcome", "Completed")
    assert "Finished" not in [e.kind for e in events]
    assert harness.files_on_disk() == []


async def test_a_paused_worker_is_refused_at_cutoff_2_then_renews_and_delivers(harness: Harness) -> None:
    harness.host.set_timings(LEASE, RENEW)
    harness.host.activities.seams.lease_timer_disabled = True

    job = await harness.queue_export(contacts=5)

    async def pause_past_the_lease(job_id: uuid.UUID) -> None:
        await harness.factory.expire_lease(job.id)  # presumed dead; no takeover has committed

    harness.host.activities.seams.before_authorize = pause_past_the_lease
    result = await harness.run(job)

    assert result.cutoff_answers == [AuthorizationResult.LEASE_LAPSED, AuthorizationResult.AUTHORIZED]
    assert result.outcome == AttemptOutcome.COMPLETED
    await assert_delivered_once(harness, job)


async def test_a_paused_worker_stops_when_a_takeover_committed(harness: Harness) -> None:
    harness.host.set_timings(LEASE, RENEW)
    harness.host.activities.seams.lease_timer_disabled = True
    job = await harness.queue_export(contacts=5)
    takeovers: list[str] = []

    async def pause_until_taken_over(job_id: uuid.UUID) -> None:
        await harness.factory.expire_lease(job.id)
        takeovers.append(await recover(harness, job))

    harness.host.activities.seams.before_authorize = pause_until_taken_over
    result = await harness.run(job)

    assert takeovers == ["Requeued"]
    assert result.cutoff_answers == [AuthorizationResult.NOT_OWNER]
    assert result.outcome == AttemptOutcome.NOT_OWNER
    assert (
        await harness.status(job) == JobStatus.QUEUED
    )  # recovery's requeue stands; the attempt wrote nothing
    assert await harness.factory.event_kinds(job.id) == ["Claimed", "RequeuedByRecovery"]
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []


async def test_a_crash_after_cutoff_2_before_the_upload_is_never_uploaded_twice(harness: Harness) -> None:
    job = await harness.queue_export(contacts=5)

    async def crash(job_id: uuid.UUID) -> None:
        raise RuntimeError("simulated crash")

    harness.host.activities.seams.before_upload = crash
    result = await harness.run(job)
    harness.host.activities.seams.before_upload = None

    assert result.outcome == AttemptOutcome.LEFT_TO_RECOVERY
    assert await harness.status(job) == JobStatus.DELIVERING
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []

    await harness.factory.expire_lease(job.id)
    # Issue 10: the attempt never wrote its upload fence, so it sent nothing; recovery proves NotDelivered
    # (and refuses a late fence) where it used to leave OutcomeUnknown for a person.
    assert await recover(harness, job) == "NotDelivered"
    again = await harness.run(job)  # a redelivered wake-up
    assert again.outcome == AttemptOutcome.ALREADY_SETTLED
    row = await harness.factory.job(job.id)
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    assert harness.partner_files(job) == []


async def test_a_job_that_crashes_its_worker_every_time_ends_failed_at_the_cap(harness: Harness) -> None:
    job = await harness.queue_export(contacts=5)

    async def crash(job_id: uuid.UUID) -> None:
        raise RuntimeError("simulated crash")

    harness.host.activities.seams.after_build = crash
    outcomes, takeovers = [], []
    for _ in range(3):
        outcomes.append((await harness.run(job)).outcome)
        await harness.factory.expire_lease(job.id)
        takeovers.append(await recover(harness, job, max_attempts=3))

    assert outcomes == [AttemptOutcome.LEFT_TO_RECOVERY] * 3
    assert takeovers == ["Requeued", "Requeued", "Exhausted"]
    row = await harness.factory.job(job.id)
    assert row.status == JobStatus.FAILED and row.failure_reason == FailureCode.ATTEMPTS_EXHAUSTED
    assert row.attempt_count == 3
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []


async def test_a_takeover_during_the_build_stops_it_at_once_and_writes_nothing(harness: Harness) -> None:
    harness.host.set_timings(LEASE, RENEW)
    job = await harness.queue_export(contacts=10)
    building, taken_over = asyncio.Event(), asyncio.Event()
    build_cancelled: list[bool] = []
    holding_renewals = False

    async def renewals_wait_for_the_takeover() -> None:
        if holding_renewals:
            await taken_over.wait()

    async def hold_build(job_id: uuid.UUID) -> None:
        building.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            build_cancelled.append(True)
            raise

    harness.host.activities.seams.before_renewal = renewals_wait_for_the_takeover
    harness.host.activities.seams.after_build = hold_build
    handle = await harness.start(job)
    await asyncio.wait_for(building.wait(), 20)
    holding_renewals = True  # the keeper's next renewal waits until recovery has committed its takeover
    await harness.factory.expire_lease(job.id)
    assert await recover(harness, job) == "Requeued"
    taken_over.set()
    result = await handle.result()

    assert build_cancelled == [True]
    assert result.outcome == AttemptOutcome.NOT_OWNER
    assert await harness.status(job) == JobStatus.QUEUED
    assert await harness.factory.event_kinds(job.id) == ["Claimed", "RequeuedByRecovery"]
    assert harness.files_on_disk() == [] and harness.partner_files(job) == []


async def test_an_attempt_taken_over_between_cutoff_2_and_the_upload_never_starts_it(
    harness: Harness,
) -> None:
    job = await harness.queue_export(contacts=5)
    takeovers: list[str] = []

    async def taken_over_before_delivery(job_id: uuid.UUID) -> None:
        # After cutoff 2, before the upload fence: the paused worker's lease expires and recovery acts.
        if not takeovers:
            await harness.factory.expire_lease(job.id)
            takeovers.append(await recover(harness, job))

    harness.host.activities.seams.before_upload = taken_over_before_delivery
    result = await harness.run(job)

    # Recovery proves nothing was sent (no upload fence) and refuses the late fence: the upload never starts.
    assert takeovers == ["NotDelivered"]
    assert result.cutoff_answers == [AuthorizationResult.AUTHORIZED]
    assert result.outcome == AttemptOutcome.NOT_OWNER
    row = await harness.factory.job(job.id)
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    assert "UploadFenced" not in await harness.factory.event_kinds(job.id)
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []


async def test_a_host_stopping_mid_build_writes_nothing_and_recovery_hands_the_job_on(
    harness: Harness, temporal_env: WorkflowEnvironment, database: pg.TestDatabase, work_root: Path
) -> None:
    doomed = await make_host(
        f"doomed-{uuid.uuid4().hex[:6]}",
        env_client=temporal_env.client,
        database=database,
        shared_queue=f"{harness.shared_queue}-doomed-{uuid.uuid4().hex[:4]}",
        work_root=work_root,
    )
    building = asyncio.Event()
    cancelled: list[bool] = []

    async def hold(job_id: uuid.UUID) -> None:
        building.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    doomed.activities.seams.after_build = hold
    job = await harness.queue_export(contacts=10)
    handle = await harness.start(job, client=doomed.client, task_queue=doomed.shared_queue)
    try:
        await asyncio.wait_for(building.wait(), 20)
        await doomed.stop()  # the host goes away mid-build: its worker cancels the running activity

        assert cancelled == [True]
        assert await harness.status(job) == JobStatus.RUNNING  # no stop request: nothing to write
        assert await harness.factory.event_kinds(job.id) == ["Claimed"]
        assert doomed.files_on_disk() == []  # the partial work was removed

        await harness.factory.expire_lease(job.id)
        assert await recover(harness, job) == "Requeued"
        result = await harness.run(job)  # the requeue's wake-up, on a live host
    finally:
        with contextlib.suppress(RPCError):  # its workflow has no worker left on its queue
            await handle.terminate()
        await doomed.close()

    assert result.outcome == AttemptOutcome.COMPLETED
    row = await harness.factory.job(job.id)
    assert row.status == JobStatus.COMPLETED and row.attempt_count == 2
    kinds = await harness.factory.event_kinds(job.id)
    assert (
        kinds[:3] == ["Claimed", "RequeuedByRecovery", "Claimed"] and kinds.count("DeliveryAuthorized") == 1
    )
    assert len(harness.uploads(job)) == 1
