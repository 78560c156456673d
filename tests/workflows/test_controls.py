"""The operators' controls through ExportWorkflow on the real Temporal test server, real PostgreSQL and a real
SFTP server (issue 9.1, 9.2): the incident's export to a partner whose contract ended is Rejected before any
claim and nothing is sent; a revoked creator's export is Rejected; a paused destination leaves its export
Queued and a resume delivers it; a pause or a retirement that commits during the build stops the attempt at
cutoff 2, which gives it back to the queue, and the next claim decides."""

from __future__ import annotations

import uuid
from datetime import timedelta

from db.admin import retire_destination, revoke_principal, set_destination_contract
from domain.models import AuthorizationResult, JobStatus
from service.switches import DestinationSwitch, Operator, Switches, TenantSwitch
from tests.workflows.harness import Harness
from workflows.models import AttemptOutcome


def switches(harness: Harness) -> Switches:
    return Switches(harness.factory.api)


def operator(tenant_id: uuid.UUID) -> Operator:
    return Operator(principal="sam.ops", tenant_id=tenant_id)


def destination_switch(destination_id: uuid.UUID, reason: str) -> DestinationSwitch:
    return DestinationSwitch(scope="destination", destination_id=destination_id, reason=reason)


async def test_an_export_to_a_partner_whose_contract_ended_is_rejected_before_any_claim(
    harness: Harness,
) -> None:
    job = await harness.queue_export(contacts=5)
    facts = await harness.factory.worker.read_policy_facts(job.id)
    assert facts is not None
    ended = facts.today.replace(day=1) - timedelta(days=1)  # "whose contract ended last month"
    await set_destination_contract(
        harness.factory.db.admin_url,
        tenant_id=job.tenant_id,
        destination_id=job.destination_id,
        starts_on=ended - timedelta(days=365),
        ends_on=ended,
    )

    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.REJECTED
    row = await harness.factory.job(job.id)
    assert row.status == JobStatus.REJECTED and row.rejection_code == "contract_ended"
    assert row.rejection_reason == f"Rejected: partner-old's contract ended on {ended.isoformat()}"
    assert row.attempt_count == 0 and await harness.factory.event_kinds(job.id) == []
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []


async def test_a_revoked_creators_queued_export_is_rejected_with_its_reason(harness: Harness) -> None:
    job = await harness.queue_export(contacts=2)
    assert await revoke_principal(
        harness.factory.db.admin_url, tenant_id=job.tenant_id, name=job.created_by, revoked_by="lee.admin"
    )

    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.REJECTED
    row = await harness.factory.job(job.id)
    assert row.rejection_code == "creator_revoked"
    assert row.rejection_reason is not None
    assert row.rejection_reason.startswith(f"Rejected: {job.created_by}'s access was revoked on ")
    assert harness.partner_files(job) == []


async def test_an_export_queued_while_its_destination_is_paused_stays_queued_and_is_delivered_after_resume(
    harness: Harness,
) -> None:
    job = await harness.queue_export(contacts=4)
    ops, who = switches(harness), operator(job.tenant_id)
    paused = await ops.pause(who, destination_switch(job.destination_id, "partner maintenance"))
    assert paused.ok and paused.body["queued"] == 1

    first = await harness.run(job)

    assert first.outcome == AttemptOutcome.PAUSED
    row = await harness.factory.job(job.id)
    assert (row.status, row.attempt_count, row.sweep_count) == (JobStatus.QUEUED, 0, 0)
    assert await harness.factory.event_kinds(job.id) == [] and harness.partner_files(job) == []

    outbox = await harness.factory.outbox_count(job.id)
    resumed = await ops.resume(who, destination_switch(job.destination_id, "maintenance over"))
    assert resumed.ok and resumed.body["woken"] == 1 and resumed.body["still_paused"] == []
    assert await harness.factory.outbox_count(job.id) == outbox + 1  # the wake-up the dispatcher publishes

    second = await harness.run(job)

    assert second.outcome == AttemptOutcome.COMPLETED
    assert await harness.status(job) == JobStatus.COMPLETED and len(harness.uploads(job)) == 1


async def test_a_destination_never_enabled_is_paused_not_rejected(harness: Harness) -> None:
    job = await harness.queue_export(contacts=1, enabled=False)
    result = await harness.run(job)
    assert result.outcome == AttemptOutcome.PAUSED
    assert await harness.status(job) == JobStatus.QUEUED


async def test_a_paused_scope_decides_nothing_not_even_a_rejection(harness: Harness) -> None:
    # Paused means frozen: the export's reason to be rejected waits for the resume, as the export does.
    job = await harness.queue_export(contacts=1)
    await revoke_principal(
        harness.factory.db.admin_url, tenant_id=job.tenant_id, name=job.created_by, revoked_by="lee.admin"
    )
    await switches(harness).pause(
        operator(job.tenant_id), TenantSwitch(scope="tenant", reason="tenant under review")
    )
    assert (await harness.run(job)).outcome == AttemptOutcome.PAUSED
    assert await harness.status(job) == JobStatus.QUEUED

    await switches(harness).resume(
        operator(job.tenant_id), TenantSwitch(scope="tenant", reason="review done")
    )
    assert (await harness.run(job)).outcome == AttemptOutcome.REJECTED


async def test_a_pause_during_the_build_gives_the_attempt_back_at_cutoff_2(harness: Harness) -> None:
    job = await harness.queue_export(contacts=6)
    ops, who = switches(harness), operator(job.tenant_id)

    async def pause_while_building(job_id: uuid.UUID) -> None:
        assert (await ops.pause(who, destination_switch(job.destination_id, "partner incident"))).ok

    harness.host.activities.seams.before_authorize = pause_while_building
    result = await harness.run(job)

    assert result.cutoff_answers == [AuthorizationResult.PAUSED]
    assert result.outcome == AttemptOutcome.RELEASED
    row = await harness.factory.job(job.id)
    assert (row.status, row.attempt_id, row.attempts_released) == (JobStatus.QUEUED, None, 1)
    assert row.delivery_authorized_at is None
    assert await harness.factory.event_kinds(job.id) == ["Claimed", "Released"]
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []  # the built file is gone

    harness.host.activities.seams.before_authorize = None
    assert (await harness.run(job)).outcome == AttemptOutcome.PAUSED  # the release's wake-up, still paused
    await ops.resume(who, destination_switch(job.destination_id, "incident closed"))
    assert (await harness.run(job)).outcome == AttemptOutcome.COMPLETED
    row = await harness.factory.job(job.id)
    assert (row.attempt_count, row.attempts_released) == (2, 1)
    assert len(harness.uploads(job)) == 1


async def test_a_destination_retired_during_the_build_stops_the_attempt_and_the_next_claim_rejects_it(
    harness: Harness,
) -> None:
    job = await harness.queue_export(contacts=3)

    async def retire_while_building(job_id: uuid.UUID) -> None:
        assert await retire_destination(
            harness.factory.db.admin_url,
            tenant_id=job.tenant_id,
            destination_id=job.destination_id,
            retired_by="lee.admin",
        )

    harness.host.activities.seams.before_authorize = retire_while_building
    result = await harness.run(job)

    assert result.cutoff_answers == [AuthorizationResult.DESTINATION_INACTIVE]
    assert result.outcome == AttemptOutcome.RELEASED
    assert await harness.status(job) == JobStatus.QUEUED
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []

    harness.host.activities.seams.before_authorize = None
    again = await harness.run(job)

    assert again.outcome == AttemptOutcome.REJECTED
    row = await harness.factory.job(job.id)
    assert row.rejection_code == "destination_retired"
    assert row.rejection_reason is not None and row.rejection_reason.startswith(
        "Rejected: partner-old was retired on "
    )
    assert await harness.factory.event_kinds(job.id) == ["Claimed", "Released"]
    assert harness.partner_files(job) == []
