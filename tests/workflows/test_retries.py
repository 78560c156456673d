"""Retries that wait (issue #25, item 4), end to end on the time-skipping Temporal server, real PostgreSQL and a
real OpenSSH sshd behind a TCP proxy (the partner's link), woken by the real outbox dispatcher: nobody starts
a workflow by hand after the first wake-up.

- Done when: "a partner down for a while is delivered to after it returns, without a person". The proxy refuses
  every connection (the partner is down); the delivery fails NotDelivered (connect refused), goes back to
  Queued with its backoff, is woken at its time by the dispatcher, fails again while the partner is down, and
  once the partner is back it is delivered: Completed, one file under the final name, each try in the timeline
  with its cause.
- A permanent cause (the partner refuses our writes: permission denied) ends Failed at once, no retry.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from temporalio.testing import WorkflowEnvironment

from db.stores.outbox import DispatcherStore
from domain.models import EventKind, FailureCode, JobStatus
from observability.metrics import get_metrics
from rules.retries import RetryPolicy
from runtime.dispatcher import OutboxDispatcher
from settings import Settings
from tests.fix_sftp import target_on
from tests.support.eventually import eventually
from tests.workflows.harness import Harness, SftpTarget

pytestmark = pytest.mark.sshd

QUICK = RetryPolicy(base_seconds=0.3, cap_seconds=1.0, max_attempts=6)


@pytest.fixture(scope="module")
def module_sftp_target(request: pytest.FixtureRequest) -> Iterator[SftpTarget]:
    """The harness's directory on the session's real sshd, reached through its proxy (the partner's link)."""
    yield from target_on(request, "sshd")


@pytest.fixture
def quick_retries(harness: Harness) -> Iterator[RetryPolicy]:
    """The module host retries after a short backoff, for this test only."""
    before = harness.host.activities.host.retry_policy
    harness.host.activities.host.retry_policy = QUICK
    yield QUICK
    harness.host.activities.host.retry_policy = before


@pytest.fixture
async def dispatcher(
    harness: Harness, dispatcher_store: DispatcherStore, temporal_env: WorkflowEnvironment
) -> AsyncIterator[OutboxDispatcher]:
    """The real outbox dispatcher on the module's shared queue: it starts every wake-up once it is due."""
    running = OutboxDispatcher(
        dispatcher_store,
        temporal_env.client,
        Settings(task_queue=harness.shared_queue),
        listen_url=None,
        poll_seconds=0.1,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(running.run(stop))
    await asyncio.wait_for(running.ready.wait(), 10)
    yield running
    stop.set()
    await asyncio.wait_for(task, 10)


def retries_total(cause: str) -> float:
    value = get_metrics().registry.get_sample_value("fenced_exports_delivery_retries_total", {"cause": cause})
    return value or 0.0


async def test_a_partner_down_for_a_while_is_delivered_to_after_it_returns_without_a_person(
    harness: Harness, quick_retries: RetryPolicy, dispatcher: OutboxDispatcher
) -> None:
    proxy = harness.sftp.proxy
    proxy.refuse_new_connections()  # the partner is down: every connect is closed at once
    retried_before = retries_total("connect_refused")
    try:
        job = await harness.queue_export(contacts=40, port=proxy.port)  # its wake-up goes to the dispatcher

        async def tried_twice() -> bool:
            kinds = await harness.factory.event_kinds(job.id)
            return kinds.count(EventKind.RETRY_SCHEDULED.value) >= 2

        # Two tries fail while the partner is down, the second woken by the dispatcher at its time.
        await eventually(tried_twice, "two retries while the partner is down", within=60)
    finally:
        proxy.refuse_new_connections(False)  # the partner is back

    async def completed() -> bool:
        return await harness.status(job) == JobStatus.COMPLETED

    await eventually(completed, "the export delivered once the partner is back", within=60)

    row = await harness.factory.job(job.id)
    events = await harness.factory.worker.job_events(job.id)
    retries = [e for e in events if e.kind == EventKind.RETRY_SCHEDULED]
    assert len(retries) >= 2
    assert all(e.detail.startswith("connect_refused: no SFTP session opened") for e in retries)
    # Each try is its own attempt, counted as used; the last one delivered.
    claimed = [e.attempt_id for e in events if e.kind == EventKind.CLAIMED]
    assert len(set(claimed)) == row.attempt_count == len(retries) + 1
    assert row.attempts_released == 0
    assert [e.attempt_id for e in retries] == claimed[:-1]
    assert row.attempt_id == claimed[-1]
    # The partner's own witness: one file under the final name, the one the last attempt authorized, no other.
    [delivered] = harness.uploads(job)
    assert delivered.name == job.final_name
    data = delivered.read_bytes()
    assert (len(data), hashlib.sha256(data).digest()) == (row.expected_file_bytes, row.expected_file_sha256)
    assert harness.partner_files(job) == [delivered]
    assert retries_total("connect_refused") - retried_before == len(retries)


async def test_a_permanent_cause_ends_failed_at_once_without_a_retry(
    harness: Harness, quick_retries: RetryPolicy, dispatcher: OutboxDispatcher
) -> None:
    # The partner refuses our writes (its directory is not writable for our login): permission denied.
    os.chmod(harness.sftp.local_dir, 0o555)
    try:
        job = await harness.queue_export(contacts=5, port=harness.sftp.proxy.port)

        async def ended() -> bool:
            return await harness.status(job) == JobStatus.FAILED

        await eventually(ended, "the export to end Failed", within=60)
    finally:
        os.chmod(harness.sftp.local_dir, 0o755)

    row = await harness.factory.job(job.id)
    assert (row.failure_reason, row.attempt_count) == (FailureCode.NOT_DELIVERED, 1)
    kinds = await harness.factory.event_kinds(job.id)
    assert EventKind.RETRY_SCHEDULED.value not in kinds
    assert harness.uploads(job) == []
    assert uuid.UUID(str(row.attempt_id))  # the one attempt's own failure
