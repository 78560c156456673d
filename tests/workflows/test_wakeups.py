"""Wake-ups are hints (001 "Redelivery", "A changed request"; 000 "The Worker"): a wake-up for a job that is
not Queued does nothing, two wake-ups racing claim once, and an edit's wake-up runs the new terms."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from domain.models import FailureCode, JobStatus
from testbed import pg
from tests.workflows.harness import Harness, Host, make_host
from workflows.models import AttemptOutcome


@pytest.fixture
async def second_host(
    temporal_env: WorkflowEnvironment, database: pg.TestDatabase, shared_queue: str, work_root: Path
) -> AsyncIterator[Host]:
    """Another machine on the same shared queue, with its own client, pools and queue, for one test."""
    h = await make_host(
        f"host-{uuid.uuid4().hex[:6]}",
        env_client=temporal_env.client,
        database=database,
        shared_queue=shared_queue,
        work_root=work_root,
    )
    yield h
    await h.close()


@pytest.mark.parametrize(
    "status",
    [
        JobStatus.CANCELED,
        JobStatus.REJECTED,
        JobStatus.STOPPED,
        JobStatus.COMPLETED,
        JobStatus.FAILED,
        JobStatus.OUTCOME_UNKNOWN,
        JobStatus.RUNNING,
        JobStatus.DELIVERING,
    ],
)
async def test_a_wake_up_for_a_job_that_is_not_queued_does_nothing(
    harness: Harness, status: JobStatus
) -> None:
    job = await harness.queue_export()
    job, _ = await harness.factory.in_status(status, code=FailureCode.NOT_DELIVERED, job=job)
    before = await harness.factory.worker.job_events(job.id)

    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.ALREADY_SETTLED
    assert await harness.status(job) == status
    assert await harness.factory.worker.job_events(job.id) == before
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []


async def test_a_wake_up_for_an_unknown_job_does_nothing(harness: Harness) -> None:
    result = await harness.run(uuid.uuid4())
    assert result.outcome == AttemptOutcome.ALREADY_SETTLED


async def test_a_redelivered_wake_up_reaches_the_same_workflow(harness: Harness) -> None:
    """The same outbox row maps to the same workflow ID: Temporal refuses a second start of it."""
    from temporalio.exceptions import WorkflowAlreadyStartedError

    job = await harness.queue_export()
    job, _ = await harness.factory.in_status(JobStatus.CANCELED, job=job)
    message_id = uuid.uuid4()
    first = await harness.start(job, message_id=message_id)
    with pytest.raises(WorkflowAlreadyStartedError):
        await harness.start(job, message_id=message_id)
    assert (await first.result()).outcome == AttemptOutcome.ALREADY_SETTLED


async def test_a_denied_policy_rejects_the_checked_version_only(harness: Harness) -> None:
    job = await harness.queue_export(contacts=0, list_name="   ")
    result = await harness.run(job)
    assert result.outcome == AttemptOutcome.REJECTED
    row = await harness.factory.job(job.id)
    assert row.status == JobStatus.REJECTED and row.rejection_reason == "Rejected: no contact list named"
    assert row.rejection_code == "list_invalid"
    assert row.attempt_count == 0 and await harness.factory.event_kinds(job.id) == []


async def test_duplicate_wake_ups_racing_claim_once_and_upload_once(
    harness: Harness, second_host: Host
) -> None:
    harness.hosts.append(second_host)
    try:
        job = await harness.queue_export(contacts=20)
        loaded: list[uuid.UUID] = []
        both_loaded = asyncio.Event()

        async def barrier(job_id: uuid.UUID) -> None:
            # Both claims have read the row as Queued before either writes: the race the claim decides.
            loaded.append(job_id)
            if len(loaded) == 2:
                both_loaded.set()
            await asyncio.wait_for(both_loaded.wait(), 20)

        for h in harness.hosts:
            h.activities.seams.after_load = barrier
        first = await harness.start(job)
        second = await harness.start(job, client=second_host.client)
        results = sorted([await first.result(), await second.result()], key=lambda r: r.outcome.value)
    finally:
        harness.hosts.remove(second_host)

    assert [r.outcome for r in results] == [AttemptOutcome.COMPLETED, AttemptOutcome.NOT_CLAIMED]
    assert await harness.status(job) == JobStatus.COMPLETED
    assert (await harness.factory.event_kinds(job.id)).count("Claimed") == 1
    assert len(harness.uploads(job)) == 1
    assert (await harness.factory.job(job.id)).attempt_count == 1


async def test_a_changed_request_fails_the_old_claim_and_its_wake_up_runs_the_new_terms(
    harness: Harness,
) -> None:
    job = await harness.queue_export(contacts=4)
    new_remote_dir, new_local_dir = harness.sftp.sibling(f"new-{uuid.uuid4().hex}")
    new_destination = await harness.destination(job.tenant_id, name="partner-new", remote_dir=new_remote_dir)
    edits = []

    async def edit_after_load(job_id: uuid.UUID) -> None:
        edits.append(
            await harness.factory.api.edit_terms_if_queued(
                tenant_id=job.tenant_id,
                job_id=job.id,
                expected_version=job.version,
                destination_id=new_destination,
                list_name=job.list_name,
            )
        )

    harness.host.activities.seams.after_load = edit_after_load
    old = await harness.run(job)
    harness.host.activities.seams.after_load = None

    assert edits == [job.version + 1]
    assert old.outcome == AttemptOutcome.NOT_CLAIMED
    assert await harness.status(job) == JobStatus.QUEUED
    assert harness.files_on_disk() == [] and await harness.factory.event_kinds(job.id) == []
    assert await harness.factory.outbox_count(job.id) == 2  # the creation's wake-up and the edit's

    new = await harness.run(job)  # the edit's wake-up
    assert new.outcome == AttemptOutcome.COMPLETED
    assert harness.uploads(job) == []  # nothing at the old destination
    assert (new_local_dir / job.final_name).is_file()
