"""A switch that cannot be read means "paused", never "not paused" (004: fail-closed; issue 9.2). Here the
worker's role loses its read of the switches (this module's own database): the policy's facts, the claim,
cutoff 2 and the sweeper all fail as a whole, so nothing is claimed, authorized or swept, and every row is
as it was. The error is a typed one, never a "no" the caller could mistake for "not paused"."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest

from db.errors import NotPermitted
from domain.models import JobStatus
from tests.db.race import authorize


@pytest.fixture
async def unreadable(database) -> AsyncIterator[None]:
    async with await psycopg.AsyncConnection.connect(database.admin_url, autocommit=True) as conn:
        await conn.execute("REVOKE SELECT ON delivery_switches FROM exports_worker")
        try:
            yield
        finally:
            await conn.execute("GRANT SELECT ON delivery_switches TO exports_worker")


async def test_nothing_is_claimed_when_the_switches_cannot_be_read(factory, worker_store, unreadable):
    job = await factory.queued()

    with pytest.raises(NotPermitted):
        await worker_store.read_policy_facts(job.id)
    with pytest.raises(NotPermitted):
        await worker_store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-3")

    row = await factory.job(job.id)
    assert (row.status, row.attempt_count) == (JobStatus.QUEUED, 0)
    assert await factory.event_kinds(job.id) == []


async def test_nothing_is_authorized_when_the_switches_cannot_be_read(factory, worker_store, database):
    job, attempt = await factory.running()
    async with await psycopg.AsyncConnection.connect(database.admin_url, autocommit=True) as conn:
        await conn.execute("REVOKE SELECT ON delivery_switches FROM exports_worker")
        try:
            with pytest.raises(NotPermitted):
                await authorize(worker_store, job, attempt)
        finally:
            await conn.execute("GRANT SELECT ON delivery_switches TO exports_worker")

    row = await factory.job(job.id)
    assert (row.status, row.delivery_authorized_at) == (JobStatus.RUNNING, None)
    assert await factory.event_kinds(job.id) == ["Claimed"]


async def test_nothing_is_swept_when_the_switches_cannot_be_read(factory, worker_store, unreadable):
    job = await factory.queued()
    await factory.age_wake_up(job.id, minutes=31)
    outbox = await factory.outbox_count(job.id)

    with pytest.raises(NotPermitted):
        await worker_store.sweep_stale_queued(older_than_seconds=30 * 60, batch=10_000)

    assert (await factory.job(job.id)).sweep_count == 0
    assert await factory.outbox_count(job.id) == outbox


async def test_the_claim_activity_raises_rather_than_settle_when_the_switches_cannot_be_read(
    factory, database, unreadable
):
    # The activity the workflow runs: an unreadable switch is an error (retried, then left to the row),
    # never a settled wake-up that could pass for "not paused" or "rejected".
    from settings import Settings
    from worker import open_export_activities
    from workflows.models import ClaimInput

    job = await factory.queued()
    async with contextlib.AsyncExitStack() as resources:
        activities = await open_export_activities(
            Settings(database_url=database.app_url, worker_id="worker-3", worker_pool_size=2),
            resources,
            worker_id="worker-3",
            search_attributes=False,
        )
        with pytest.raises(NotPermitted):
            await activities.claiming.claim(
                ClaimInput(job_id=job.id, attempt_id=uuid.uuid4(), workflow_id="wf")
            )
    assert await factory.status(job.id) == JobStatus.QUEUED
