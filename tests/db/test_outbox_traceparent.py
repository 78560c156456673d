"""Issue 11's trace crosses the outbox: every statement that writes a wake-up stores the W3C traceparent of
the span it ran in (the API request, the recovery or sweeper activity, the worker's release), so the
dispatcher can start the workflow in that trace; with tracing off it stores nothing."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from db.queries import all_queries, q
from domain.models import (
    ClaimResult,
    ExportJob,
    FailureCause,
    FailureCode,
    JobStatus,
    ReleaseResult,
    RetryResult,
)
from observability import tracing
from rules.retries import RetryPolicy
from tests.support.factories import Factory


@pytest.fixture
def traced() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.setup_tracing("fenced-exports-test", exporter=exporter, set_global=False)
    yield exporter
    tracing.shutdown_tracing()


async def newest_traceparent(factory: Factory, job_id: Any) -> str | None:
    rows = await factory.admin(
        "SELECT traceparent FROM outbox WHERE job_id = %(id)s ORDER BY created_at DESC LIMIT 1",
        {"id": job_id},
    )
    return rows[0]["traceparent"]


# Each writer of a wake-up: set the job up (untraced), then the write itself (traced); returns the job.
Setup = Callable[[Factory], Awaitable[Any]]
Write = Callable[[Factory, Any], Awaitable[ExportJob]]


async def _create(factory: Factory, _: Any) -> ExportJob:
    return await factory.queued()


async def _failed(factory: Factory) -> ExportJob:
    job, _ = await factory.in_status(JobStatus.FAILED, FailureCode.BUILD_FAILED)
    return job


async def _replace(factory: Factory, original: ExportJob) -> ExportJob:
    created = await factory.api.create_replacement(
        tenant_id=original.tenant_id,
        original_job_id=original.id,
        created_by="sam.ops",
        replacement_reason="the build failed",
    )
    assert created is not None
    return await factory.job(created.job_id)


async def _queued(factory: Factory) -> ExportJob:
    return await factory.queued()


async def _edit(factory: Factory, job: ExportJob) -> ExportJob:
    version = await factory.api.edit_terms_if_queued(
        tenant_id=job.tenant_id,
        job_id=job.id,
        expected_version=job.version,
        destination_id=job.destination_id,
        list_name="other",
    )
    assert version == job.version + 1
    return job


async def _running(factory: Factory) -> tuple[ExportJob, Any]:
    return await factory.running(worker_id="worker-3")


async def _release(factory: Factory, claimed: tuple[ExportJob, Any]) -> ExportJob:
    job, attempt_id = claimed
    assert (
        await factory.worker.release_attempt_if_running(job.id, attempt_id, "worker-3", "drain")
        == ReleaseResult.RELEASED
    )
    return job


async def _failed_delivery(factory: Factory) -> tuple[ExportJob, Any]:
    job, attempt_id = await factory.delivering()
    await factory.fence(job.id, attempt_id, rename=False)  # the upload fenced, the rename never asked
    return job, attempt_id


async def _retry(factory: Factory, delivering: tuple[ExportJob, Any]) -> ExportJob:
    job, attempt_id = delivering
    policy = RetryPolicy(base_seconds=60.0, cap_seconds=600.0, max_attempts=3)
    answer = await factory.worker.retry_delivery_if_delivering(
        job.id, attempt_id, FailureCause.CONNECT_REFUSED, "connect refused", policy
    )
    assert answer == RetryResult.RETRIED
    return job


async def _expired(factory: Factory) -> tuple[ExportJob, Any]:
    job, attempt_id = await factory.running()
    await factory.expire_lease(job.id)
    return job, attempt_id


async def _requeue(factory: Factory, expired: tuple[ExportJob, Any]) -> ExportJob:
    job, attempt_id = expired
    assert await factory.recovery.requeue_expired_attempt(job.id, attempt_id, 3, "recovery-run-1")
    return job


async def _stale(factory: Factory) -> ExportJob:
    job = await factory.queued()
    await factory.age_wake_up(job.id, minutes=60)
    return job


async def _sweep(factory: Factory, job: ExportJob) -> ExportJob:
    assert job.id in await factory.worker.sweep_stale_queued(older_than_seconds=30 * 60, batch=10_000)
    return job


async def _resume(factory: Factory, job: ExportJob) -> ExportJob:
    # The wake-ups a resume writes for the scope's Queued jobs woken before it (here: an hour ago).
    woken = await factory.api.wake_resumed_queued(
        datetime.now(UTC), destination_id=job.destination_id, batch=10_000
    )
    assert job.id in woken
    return job


async def _nothing(factory: Factory) -> None:
    return None


async def _outside_window(factory: Factory) -> ExportJob:
    job = await factory.queued()
    await factory.close_window(job.tenant_id, job.destination_id)
    return job


async def _claim_outside_window(factory: Factory, job: ExportJob) -> ExportJob:
    # The claim outside the destination's delivery window makes the job wait, with a deferred wake-up (#25.2).
    result = await factory.worker.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-3")
    assert result == ClaimResult.OUTSIDE_WINDOW
    return job


WRITERS: dict[str, tuple[Setup, Write]] = {
    "claim_if_queued": (_outside_window, _claim_outside_window),
    "create_original": (_nothing, _create),
    "create_replacement": (_failed, _replace),
    "edit_terms_if_queued": (_queued, _edit),
    "release_attempt_if_running": (_running, _release),
    "requeue_expired_attempt": (_expired, _requeue),
    "retry_delivery_if_delivering": (_failed_delivery, _retry),
    "sweep_stale_queued": (_stale, _sweep),
    "wake_resumed_queued": (_stale, _resume),
}


def test_every_statement_that_writes_a_wake_up_is_covered_here() -> None:
    writers = {name for name in all_queries() if "INSERT INTO outbox" in q(name)}
    assert writers == set(WRITERS)


@pytest.mark.parametrize("statement", sorted(WRITERS))
async def test_every_wake_up_carries_the_traceparent_of_the_span_that_wrote_it(traced, factory, statement):
    setup, write = WRITERS[statement]
    prepared = await setup(factory)
    with tracing.tracer().start_as_current_span(f"test {statement}"):
        expected = tracing.current_traceparent()
        job = await write(factory, prepared)
    assert expected is not None
    assert await newest_traceparent(factory, job.id) == expected


@pytest.mark.parametrize("statement", sorted(WRITERS))
async def test_with_tracing_off_a_wake_up_carries_no_traceparent(factory, statement):
    setup, write = WRITERS[statement]
    assert tracing.current_traceparent() is None
    job = await write(factory, await setup(factory))
    assert await newest_traceparent(factory, job.id) is None
