"""The stop latency histogram (fenced_exports_stop_latency_seconds): a Stopped write by the attempt's worker
(finish_stopped) or by recovery (stop_expired_attempt) records the seconds from the stop request's
recorded_at to the write, both read on the database clock by the statement itself. Real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from domain.models import CancellationOutcome, FinishResult, JobStatus, StopPoint
from observability.metrics import ExportMetrics, get_metrics, set_metrics


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    previous = get_metrics()
    registry = CollectorRegistry()
    set_metrics(ExportMetrics(registry))
    yield registry
    set_metrics(previous)


def stops(registry: CollectorRegistry, path: str) -> tuple[float, float]:
    labels = {"path": path}
    count = registry.get_sample_value("fenced_exports_stop_latency_seconds_count", labels) or 0.0
    total = registry.get_sample_value("fenced_exports_stop_latency_seconds_sum", labels) or 0.0
    return count, total


async def test_a_stop_written_by_the_worker_records_its_latency(registry, factory):
    job, attempt = await factory.running()
    assert (await factory.cancel(job)).outcome == CancellationOutcome.STOP_REQUESTED
    await factory.admin(  # the request was recorded 3 s ago (database clock)
        "UPDATE cancellation_requests SET recorded_at = recorded_at - interval '3 seconds'"
        " WHERE job_id = %(id)s",
        {"id": job.id},
    )

    assert (
        await factory.worker.finish_stopped(job.id, attempt, StopPoint.WHILE_BUILDING) == FinishResult.WRITTEN
    )

    count, total = stops(registry, "worker")
    assert count == 1 and 3.0 <= total < 30.0
    assert stops(registry, "recovery") == (0.0, 0.0)


async def test_a_stop_written_by_recovery_records_its_latency(registry, factory):
    job, attempt = await factory.running()
    assert (await factory.cancel(job)).outcome == CancellationOutcome.STOP_REQUESTED
    await factory.expire_lease(job.id)

    assert await factory.recovery.stop_expired_attempt(job.id, attempt, "recovery:test")

    assert (await factory.job(job.id)).status == JobStatus.STOPPED
    count, total = stops(registry, "recovery")
    assert count == 1 and total >= 0.0


async def test_a_stop_that_matched_nothing_records_nothing(registry, factory):
    job, attempt = await factory.running()  # no stop request: finish_stopped matches nothing
    assert (
        await factory.worker.finish_stopped(job.id, attempt, StopPoint.WHILE_BUILDING)
        == FinishResult.NOT_OWNER
    )
    assert stops(registry, "worker") == (0.0, 0.0)
