"""Give-backs through ExportWorkflow on the real Temporal test server, real PostgreSQL and a real SFTP server
(issue 23.1, 23.5, 23.6; 23.8 is in test_claim_on_another_host.py).

- A build whose database backend is killed every time (an OOM restarting sessions) is given back, waits
  longer each time, and ends Failed (AttemptsExhausted) at the bound, never looping; a wake-up that comes
  before its wait is over claims nothing.
- A switch read that fails at cutoff 2 gives the attempt back without using one up.
- A creator revoked during the build: cutoff 2 refuses, the attempt is given back with the policy's reason,
  and the next claim rejects it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from db.admin import revoke_principal
from domain.models import EventKind, FailureCode, JobStatus
from observability.metrics import get_metrics
from rules.releases import ReleasePolicy
from tests.workflows.harness import Harness, wait_until_blocked_by
from workflows.models import AttemptOutcome

QUICK = ReleasePolicy(base_seconds=0.3, cap_seconds=0.6, max_releases=2)


@pytest.fixture
def quick_backoff(harness: Harness) -> Iterator[ReleasePolicy]:
    """The module host gives back with a short backoff and a bound of two, for this test only."""
    before = harness.host.activities.host.release_policy
    harness.host.activities.host.release_policy = QUICK
    yield QUICK
    harness.host.activities.host.release_policy = before


def released_total(cause: str, ending: str) -> float:
    value = get_metrics().registry.get_sample_value(
        "fenced_exports_releases_total", {"cause": cause, "ending": ending}
    )
    return value or 0.0


async def test_a_build_whose_backend_is_killed_every_time_waits_longer_and_then_fails(
    harness: Harness, quick_backoff: ReleasePolicy
) -> None:
    job = await harness.queue_export(contacts=30)
    killed: list[int] = []
    killers: list[asyncio.Task[None]] = []

    async def kill_the_copy(conn: psycopg.AsyncConnection) -> None:
        # The COPY waits behind the lock this connection holds; its backend is terminated while it waits, as
        # an out-of-memory kill would end it mid-query; then the lock goes.
        try:
            victim = await wait_until_blocked_by(harness.factory, conn.info.backend_pid)
            rows = await harness.factory.admin(
                "SELECT query FROM pg_stat_activity WHERE pid = %(p)s", {"p": victim}
            )
            assert rows and rows[0]["query"].lstrip().upper().startswith("COPY"), rows
            await harness.factory.admin("SELECT pg_terminate_backend(%(p)s)", {"p": victim})
            killed.append(victim)
        finally:
            await conn.rollback()
            await conn.close()

    async def before_build(job_id: uuid.UUID) -> None:
        if job_id == job.id:
            # Held before the build starts, so its COPY is the statement that waits behind it.
            conn = await psycopg.AsyncConnection.connect(harness.factory.db.admin_url)
            await conn.execute("LOCK TABLE contacts IN ACCESS EXCLUSIVE MODE")
            killers.append(asyncio.create_task(kill_the_copy(conn)))

    harness.host.activities.seams.before_build = before_build
    released_before = released_total("transient", "Released")
    exhausted_before = released_total("transient", "Exhausted")

    outcomes = []
    for _ in range(quick_backoff.max_releases + 1):
        outcomes.append((await harness.run(job)).outcome)
        await asyncio.gather(*killers)
        row = await harness.factory.job(job.id)
        if row.status != JobStatus.QUEUED:
            break
        assert row.available_at is not None
        # A wake-up before the wait is over claims nothing; the job waits for its own wake-up.
        assert (await harness.run(job)).outcome == AttemptOutcome.NOT_YET
        await harness.wait_until_db_clock_passes(row.available_at)

    assert outcomes == [AttemptOutcome.RELEASED, AttemptOutcome.RELEASED, AttemptOutcome.FAILED]
    assert len(killed) == 3
    row = await harness.factory.job(job.id)
    assert (row.status, row.failure_reason, row.transient_releases) == (
        JobStatus.FAILED,
        FailureCode.ATTEMPTS_EXHAUSTED,
        2,
    )
    events = await harness.factory.worker.job_events(job.id)
    released = [e for e in events if e.kind == EventKind.RELEASED]
    # CopyFailed or DatabaseError, by where the kill lands; either way the database went away under it
    assert [e.detail.startswith("transient: build interrupted: ") for e in released] == [True, True]
    assert events[-1].kind == EventKind.ATTEMPTS_EXHAUSTED
    assert released_total("transient", "Released") - released_before == 2
    assert released_total("transient", "Exhausted") - exhausted_before == 1
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []


async def test_a_switch_read_that_fails_at_cutoff_2_gives_the_attempt_back_without_using_one(
    harness: Harness, quick_backoff: ReleasePolicy
) -> None:
    job = await harness.queue_export(contacts=5)

    async def switches_unreadable(job_id: uuid.UUID) -> None:
        await harness.factory.admin("REVOKE SELECT ON delivery_switches FROM exports_worker")

    harness.host.activities.seams.before_authorize = switches_unreadable
    try:
        result = await harness.run(job)
    finally:
        await harness.factory.admin("GRANT SELECT ON delivery_switches TO exports_worker")

    assert result.outcome == AttemptOutcome.RELEASED
    row = await harness.factory.job(job.id)
    assert (row.status, row.attempt_count, row.attempts_released) == (JobStatus.QUEUED, 1, 1)
    released = [e for e in await harness.factory.worker.job_events(job.id) if e.kind == EventKind.RELEASED]
    assert released[-1].detail.startswith("transient: cutoff 2 not decided: NotPermitted")
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []


async def test_a_creator_revoked_during_the_build_is_given_back_with_the_reason_and_then_rejected(
    harness: Harness,
) -> None:
    job = await harness.queue_export(contacts=5)

    async def revoke_while_building(job_id: uuid.UUID) -> None:
        assert await revoke_principal(
            harness.factory.db.admin_url, tenant_id=job.tenant_id, name=job.created_by, revoked_by="lee.admin"
        )

    harness.host.activities.seams.before_authorize = revoke_while_building
    result = await harness.run(job)
    harness.host.activities.seams.before_authorize = None

    assert result.outcome == AttemptOutcome.RELEASED
    row = await harness.factory.job(job.id)
    assert (row.status, row.available_at, row.transient_releases) == (JobStatus.QUEUED, None, 0)
    released = [e for e in await harness.factory.worker.job_events(job.id) if e.kind == EventKind.RELEASED]
    assert released[-1].detail.startswith(
        f"policy: cutoff 2: Rejected: {job.created_by}'s access was revoked on "
    )

    # The next claim's policy check rejects it with the same reason; nothing was ever sent.
    assert (await harness.run(job)).outcome == AttemptOutcome.REJECTED
    row = await harness.factory.job(job.id)
    assert (row.status, row.rejection_code) == (JobStatus.REJECTED, "creator_revoked")
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []
