"""Delivery windows per destination (issue #25, item 2), through ExportWorkflow on the real Temporal test
server, real PostgreSQL and the real OpenSSH sshd, with the window changed by an admin through the service.

- Outside the window the claim makes no attempt: the workflow ends OutsideWindow, the export stays Queued and
  waits for the next opening, and the partner never hears of it.
- A window that closes during the build (seam ``before_authorize``: an admin adds today as a blackout date)
  gives the attempt back at cutoff 2 (WindowClosed), uncounted, waiting for the next opening; nothing reaches
  the partner. Once the window is open again and its time has come, the next wake-up delivers it once.
- A window that closes after cutoff 2, before the rename (seam ``before_rename_fence``): the rename fence is
  refused, no rename is sent, and the attempt ends Failed NotDelivered, proven by the fences, with the reason
  in its evidence; the final name was never written.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta

import pytest

from domain.models import AuthorizationResult, EventKind, FailureCode, JobStatus
from service.auth import Caller
from service.destinations import Destinations, EditDestination
from tests.fix_sftp import target_on
from tests.workflows.harness import Harness, SftpTarget
from workflows.models import AttemptOutcome

pytestmark = pytest.mark.sshd


@pytest.fixture(scope="module")
def module_sftp_target(request: pytest.FixtureRequest) -> Iterator[SftpTarget]:
    """The harness's directory on the session's real sshd."""
    yield from target_on(request, "sshd")


async def queue(harness: Harness, contacts: int = 40):
    tenant_id = await harness.factory.tenant()
    destination_id = await harness.destination(tenant_id, max_write_request=261120)
    await harness.factory.principal(tenant_id, "ada.admin", "admin")
    await harness.add_contacts(tenant_id, "main", contacts)
    return await harness.factory.queued(tenant_id, destination_id, list_name="main")


async def today(harness: Harness) -> date:
    [row] = await harness.factory.admin("SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date AS d")
    return row["d"]


async def set_blackouts(harness: Harness, job, blackouts: list[date], reason: str) -> None:
    """An admin changes the destination's blackout dates (UTC), from the version it is at now."""
    [row] = await harness.factory.admin(
        "SELECT version FROM destinations WHERE id = %(d)s", {"d": job.destination_id}
    )
    answer = await Destinations(harness.factory.api).edit(
        Caller(tenant_id=job.tenant_id, principal="ada.admin", role="admin"),
        job.destination_id,
        EditDestination(blackout_dates=blackouts, intake_time_zone="UTC", reason=reason),
        f'"{row["version"]}"',
    )
    assert answer.ok and answer.body["delivery_changed"] is False, answer.body


async def test_outside_the_window_the_claim_makes_no_attempt_and_the_export_waits(harness: Harness) -> None:
    job = await queue(harness)
    day = await today(harness)
    await set_blackouts(harness, job, [day, day + timedelta(days=1)], "the partner's year-end freeze")

    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.OUTSIDE_WINDOW
    row = await harness.factory.job(job.id)
    opening = datetime.combine(day + timedelta(days=2), time(0), tzinfo=UTC)
    assert (row.status, row.attempt_count, row.available_at) == (JobStatus.QUEUED, 0, opening)
    assert await harness.factory.worker.job_events(job.id) == []
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []


async def test_a_window_that_closes_mid_build_gives_the_attempt_back(harness: Harness) -> None:
    job = await queue(harness)
    day = await today(harness)

    async def the_partner_closes(job_id: uuid.UUID) -> None:
        await set_blackouts(
            harness, job, [day, day + timedelta(days=1)], "the partner closed for an incident"
        )

    harness.host.activities.seams.before_authorize = the_partner_closes
    first = await harness.run(job)

    assert first.cutoff_answers == [AuthorizationResult.WINDOW_CLOSED]
    assert first.outcome == AttemptOutcome.RELEASED
    row = await harness.factory.job(job.id)
    opening = datetime.combine(day + timedelta(days=2), time(0), tzinfo=UTC)
    assert (row.status, row.attempt_id, row.attempts_released, row.transient_releases, row.available_at) == (
        JobStatus.QUEUED,
        None,
        1,
        0,  # not counted: the attempt is given back, not used
        opening,  # a wake-up at the next opening
    )
    [released] = [e for e in await harness.factory.worker.job_events(job.id) if e.kind == EventKind.RELEASED]
    assert released.detail is not None and released.detail.startswith("window_closed: cutoff 2:")
    [deferred] = await harness.factory.admin(
        "SELECT available_at FROM outbox WHERE job_id = %(j)s AND available_at IS NOT NULL", {"j": job.id}
    )
    assert deferred["available_at"] == opening
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []  # nothing left the host

    # The partner opens again, and the opening's time has come (on the row, as the database clock would).
    harness.host.activities.seams.before_authorize = None
    await set_blackouts(harness, job, [], "the partner reopened")
    await harness.factory.end_wait(job.id)
    second = await harness.run(job)

    assert second.outcome == AttemptOutcome.COMPLETED
    row = await harness.factory.job(job.id)
    assert (row.status, row.attempt_count) == (JobStatus.COMPLETED, 2)
    assert [p.name for p in harness.uploads(job)] == [row.expected_file_name]  # delivered once


async def test_a_window_that_closes_before_the_rename_sends_no_rename_and_the_fences_prove_not_delivered(
    harness: Harness,
) -> None:
    job = await queue(harness)
    day = await today(harness)

    async def the_partner_closes(job_id: uuid.UUID) -> None:
        await set_blackouts(
            harness, job, [day, day + timedelta(days=1)], "the partner closed for an incident"
        )

    harness.host.activities.seams.before_rename_fence = the_partner_closes
    result = await harness.run(job)

    assert result.cutoff_answers == [AuthorizationResult.AUTHORIZED]
    assert (result.outcome, result.failure_code) == (AttemptOutcome.FAILED, FailureCode.NOT_DELIVERED)
    row = await harness.factory.job(job.id)
    assert (row.status, row.failure_reason, row.rename_fenced_at) == (
        JobStatus.FAILED,
        FailureCode.NOT_DELIVERED,
        None,
    )
    events = await harness.factory.worker.job_events(job.id)
    assert EventKind.RENAME_FENCED not in {e.kind for e in events}
    observations = [json.loads(e.detail or "{}") for e in events if e.kind == EventKind.DELIVERY_EVIDENCE]
    assert {"observation": "rename_fence", "result": "OutsideWindow"} in observations
    assert any(o.get("observation") == "rename" and o.get("result") == "not_authorized" for o in observations)
    assert harness.uploads(job) == []  # the final name was never written
