"""Stopping an export through Temporal (issue 4, "Cancellation through Temporal"): the stop_requested signal,
the lease renewal as a watcher, and a workflow cancelled from the Web UI or CLI, which is recorded as a stop
request and then follows the same rules. A build is held open at the builder's ``after_build`` seam."""

from __future__ import annotations

import asyncio
import uuid

from domain.models import CancellationOutcome, JobStatus
from tests.workflows.harness import Harness, wait_until
from workflows.export import ExportWorkflow, temporal_cancel_request_id
from workflows.models import AttemptOutcome, Stage


class HeldBuild:
    """An ``after_build`` seam that holds the build phase open until it is cancelled."""

    def __init__(self) -> None:
        self.building = asyncio.Event()
        self.cancelled = False

    async def __call__(self, job_id: uuid.UUID) -> None:
        self.building.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def requests_of(harness: Harness, job) -> list:
    return await harness.factory.api.job_cancellation_requests(job.tenant_id, job.id)


async def _recorded(harness: Harness, job) -> bool:
    return bool(await requests_of(harness, job))


async def _stop_checked(handle) -> bool:
    return (await handle.query(ExportWorkflow.progress)).stop_checks > 0


async def test_the_stop_signal_is_confirmed_against_the_row_and_stops_the_build_at_once(
    harness: Harness,
) -> None:
    job = await harness.queue_export(contacts=50)
    harness.host.set_timings(60, 3600)  # no renewal during the test: only the signal can stop the build
    held = HeldBuild()
    harness.host.activities.seams.after_build = held
    handle = await harness.start(job)
    await asyncio.wait_for(held.building.wait(), 20)

    progress = await handle.query(ExportWorkflow.progress)
    assert progress.stage == Stage.BUILDING and progress.worker_task_queue == harness.host.own_queue

    answer = await harness.factory.cancel(job)
    assert answer.outcome == CancellationOutcome.STOP_REQUESTED
    await handle.signal(ExportWorkflow.stop_requested, str(answer.request_id))
    result = await handle.result()

    assert held.cancelled
    assert result.outcome == AttemptOutcome.STOPPED and result.stop_signals == 1
    assert await harness.status(job) == JobStatus.STOPPED
    events = await harness.factory.worker.job_events(job.id)
    assert [e.kind for e in events] == ["Claimed", "Stopped"]
    assert events[-1].detail is not None and events[-1].detail.startswith("while building")
    assert str(answer.request_id) in events[-1].detail
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []
    assert (await handle.query(ExportWorkflow.progress)).outcome == AttemptOutcome.STOPPED


async def test_a_stop_signal_without_a_recorded_request_stops_nothing(harness: Harness) -> None:
    """The signal is a hint: the row decides. Unconfirmed, the build goes on and delivers."""
    job = await harness.queue_export(contacts=5)
    harness.host.set_timings(60, 3600)
    released = asyncio.Event()
    building = asyncio.Event()

    async def build_until_released(job_id: uuid.UUID) -> None:
        building.set()
        await released.wait()

    harness.host.activities.seams.after_build = build_until_released

    handle = await harness.start(job)
    await asyncio.wait_for(building.wait(), 20)
    await handle.signal(ExportWorkflow.stop_requested, str(uuid.uuid4()))
    # The build is released once the workflow has checked the signal against the row.
    await wait_until(lambda: _stop_checked(handle), "the workflow checked the signal against the row")
    released.set()
    result = await handle.result()

    assert result.outcome == AttemptOutcome.COMPLETED and result.stop_signals == 1
    assert await harness.status(job) == JobStatus.COMPLETED


async def test_without_the_signal_the_lease_renewal_sees_the_stop_request(harness: Harness) -> None:
    job = await harness.queue_export(contacts=50)
    harness.host.set_timings(60, 0.2)
    held = HeldBuild()
    harness.host.activities.seams.after_build = held
    handle = await harness.start(job)
    await asyncio.wait_for(held.building.wait(), 20)

    assert (await harness.factory.cancel(job)).outcome == CancellationOutcome.STOP_REQUESTED
    result = await handle.result()  # no signal: the next renewal answers that a stop is recorded

    assert held.cancelled
    assert result.outcome == AttemptOutcome.STOPPED and result.stop_signals == 0
    assert await harness.status(job) == JobStatus.STOPPED
    assert harness.files_on_disk() == []


async def test_a_workflow_cancelled_from_temporal_while_building_ends_stopped_with_a_recorded_request(
    harness: Harness,
) -> None:
    job = await harness.queue_export(contacts=50)
    harness.host.set_timings(60, 3600)
    held = HeldBuild()
    harness.host.activities.seams.after_build = held
    handle = await harness.start(job)
    await asyncio.wait_for(held.building.wait(), 20)

    await handle.cancel()
    result = await handle.result()

    assert held.cancelled
    assert result.outcome == AttemptOutcome.STOPPED
    assert result.temporal_cancel == CancellationOutcome.STOP_REQUESTED
    assert await harness.status(job) == JobStatus.STOPPED
    [request] = await requests_of(harness, job)
    assert request.requested_by == "temporal" and request.outcome == CancellationOutcome.STOP_REQUESTED
    assert request.id == temporal_cancel_request_id(handle.id)
    assert (await harness.factory.job(job.id)).stop_request_id == request.id
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []


async def test_a_workflow_cancelled_between_load_and_claim_cancels_the_queued_job(harness: Harness) -> None:
    job = await harness.queue_export()
    handle_ready: asyncio.Future = asyncio.get_running_loop().create_future()

    async def cancel_workflow_after_load(job_id: uuid.UUID) -> None:
        handle = await handle_ready
        await handle.cancel()
        # Go on once the workflow has recorded it, so the claim meets the cancellation.
        await wait_until(lambda: _recorded(harness, job), "the workflow recorded the cancellation")

    harness.host.activities.seams.after_load = cancel_workflow_after_load
    handle = await harness.start(job)
    handle_ready.set_result(handle)
    result = await handle.result()

    assert result.outcome == AttemptOutcome.NOT_CLAIMED
    assert result.temporal_cancel == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert await harness.status(job) == JobStatus.CANCELED
    assert harness.files_on_disk() == [] and harness.partner_files(job) == []


async def test_a_workflow_cancelled_from_temporal_while_delivering_still_completes(harness: Harness) -> None:
    job = await harness.queue_export(contacts=2000)
    handle_ready: asyncio.Future = asyncio.get_running_loop().create_future()
    cancelled: list[bool] = []

    async def cancel_workflow_during_upload(job_id: uuid.UUID, sent: int) -> None:
        if cancelled:
            return
        cancelled.append(True)
        handle = await handle_ready
        await handle.cancel()
        # The upload goes on only after the workflow has recorded the cancellation (TooLate).
        await wait_until(lambda: _recorded(harness, job), "the workflow recorded the cancellation")

    harness.host.activities.seams.during_upload = cancel_workflow_during_upload
    handle = await harness.start(job)
    handle_ready.set_result(handle)
    result = await handle.result()

    assert cancelled
    assert result.outcome == AttemptOutcome.COMPLETED
    assert result.temporal_cancel == CancellationOutcome.TOO_LATE
    assert await harness.status(job) == JobStatus.COMPLETED
    [request] = await requests_of(harness, job)
    assert request.requested_by == "temporal" and request.found_status == JobStatus.DELIVERING
    assert len(harness.uploads(job)) == 1 and harness.files_on_disk() == []


async def test_a_completed_export_is_findable_by_its_search_attributes_and_summary(harness: Harness) -> None:
    job = await harness.queue_export(contacts=3)
    handle = await harness.start(job)
    result = await handle.result()
    assert result.outcome == AttemptOutcome.COMPLETED

    described = await handle.describe()
    attributes = {key.name: value for key, value in described.typed_search_attributes}
    assert attributes == {
        "ExportJobId": str(job.id),
        "ExportTenantId": str(job.tenant_id),
        "ExportOutcome": "Completed",
    }
    assert await described.static_summary() == f"Export {job.id}"
    progress = await handle.query(ExportWorkflow.progress)
    assert progress.stage == Stage.FINISHED and progress.file_rows == 3
    assert progress.file_bytes == result.file_bytes and result.file_sha256 is not None
