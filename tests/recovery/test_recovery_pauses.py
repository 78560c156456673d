"""Recovery honours a pause (issue 23.5): a partner whose deliveries are paused (a compromise, an incident) gets
no session from recovery either, not to list, not to set aside, not to tidy up; what only that partner can
settle waits for the resume, and is settled then. Against both real SFTP servers behind a TCP proxy, whose
count of accepted connections is the partner's own witness, and a real PostgreSQL."""

from __future__ import annotations

import os
import uuid

import pytest

from activities.recovery import RecoveryActivities
from domain.models import EventKind, FailureCode, JobStatus
from partner.kinds import partner_for
from settings import Settings
from testbed import pg
from testbed.sftp import SftpTarget
from tests.recovery.conftest import MAX_ATTEMPTS
from tests.recovery.test_recovery_delivering import SIZE, delivering_to, recover, recovery_evidence
from tests.recovery.test_recovery_recheck import (
    INTERVAL_MINUTES,
    minutes_pass,
    unknown_because_the_partner_was_silent,
)
from tests.recovery.test_recovery_set_aside import candidate_for, paused_after_the_rename_fence
from workflows.models import Takeover


@pytest.fixture(scope="module")
def settings(database: pg.TestDatabase) -> Settings:
    """The re-check's settings (one listing per try, a ten-minute interval), as in test_recovery_recheck."""
    return Settings(
        database_url=database.app_url,
        task_queue=f"exports-{uuid.uuid4().hex[:8]}",
        max_attempts=MAX_ATTEMPTS,
        lease_seconds=60,
        recovery_observe_tries=1,
        recovery_recheck_minutes=INTERVAL_MINUTES,
        recovery_recheck_hours=24,
    )


async def pause(factory, job) -> None:
    await factory.switch(job.tenant_id, job.destination_id, enabled=False, reason="partner compromised")


async def resume(factory, job) -> None:
    await factory.switch(job.tenant_id, job.destination_id, enabled=True, reason="all clear")


async def test_an_expired_delivery_to_a_paused_partner_waits_and_is_settled_after_the_resume(
    client,
    settings,
    recovery_worker,
    factory,
    worker_store,
    sftp_target: SftpTarget,
):
    p = await paused_after_the_rename_fence(factory, worker_store, sftp_target)
    await pause(factory, p.job)
    connections = sftp_target.proxy.accepted

    await recover(client, settings)

    assert await factory.status(p.job.id) == JobStatus.DELIVERING  # waits, untouched
    assert await recovery_evidence(factory, p.job.id) == []
    assert sftp_target.proxy.accepted == connections  # no session opened to the paused partner
    assert sftp_target.files() == {p.temp: p.data}

    await resume(factory, p.job)
    await recover(client, settings)

    settled = await factory.job(p.job.id)
    assert (settled.status, settled.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    assert sftp_target.proxy.accepted > connections


async def test_a_pause_after_the_scan_stops_the_takeover_before_any_session(
    settings,
    factory,
    worker_store,
    recovery_store,
    sftp_target: SftpTarget,
):
    p = await paused_after_the_rename_fence(factory, worker_store, sftp_target)
    candidate = await candidate_for(factory, p.job.id)  # nominated while the partner was open
    await pause(factory, p.job)
    connections = sftp_target.proxy.accepted
    recovery = RecoveryActivities(recovery_store, settings, partners=partner_for)

    assert await recovery.take_over(candidate, "recovery:test") == Takeover.WAITING_FOR_RESUME

    assert await factory.status(p.job.id) == JobStatus.DELIVERING
    assert sftp_target.proxy.accepted == connections


async def test_the_recheck_of_an_unknown_outcome_waits_for_the_resume(
    client,
    settings,
    recovery_worker,
    factory,
    sftp_target: SftpTarget,
):
    data = os.urandom(SIZE)
    job, _ = await delivering_to(factory, sftp_target, data)
    sftp_target.put(job.final_name, data)
    await factory.expire_lease(job.id)
    await unknown_because_the_partner_was_silent(client, settings, factory, sftp_target, job.id)
    await pause(factory, job)
    await minutes_pass(factory, job.id, INTERVAL_MINUTES + 1)
    connections = sftp_target.proxy.accepted

    await recover(client, settings)

    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN
    assert len(await recovery_evidence(factory, job.id)) == 1  # only the first, silent listing
    assert sftp_target.proxy.accepted == connections

    await resume(factory, job)
    await recover(client, settings)
    assert await factory.status(job.id) == JobStatus.COMPLETED


async def test_no_cleanup_session_with_a_paused_partner_and_the_skip_is_recorded(
    client,
    settings,
    recovery_worker,
    factory,
    sftp_target: SftpTarget,
):
    # It uploaded to its temporary name and never fenced its rename: Failed NotDelivered needs no partner.
    # The cleanup agreement asks recovery to remove the temporary file, but the partner is paused.
    data = os.urandom(SIZE)
    job, attempt = await delivering_to(factory, sftp_target, data, fenced="upload", temporary_files="remove")
    await factory.expire_lease(job.id)
    await pause(factory, job)
    connections = sftp_target.proxy.accepted

    await recover(client, settings)

    row = await factory.job(job.id)
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    assert sftp_target.proxy.accepted == connections
    skipped = [
        e.detail
        for e in await factory.worker.job_events(job.id)
        if e.kind == EventKind.DELIVERY_EVIDENCE and e.attempt_id == attempt
    ]
    assert skipped == ['{"cleanup": "skipped", "why": "deliveries paused"}']
