"""The fail-closed delivery switches in the statements themselves (004 "Kill switch: the first line of every
runner"; issue 9.2): the claim and cutoff 2 read the switches of the job's scope in their own WHERE
clauses, a scope without an enabled row is paused, the sweeper leaves paused scopes alone, a resume wakes
the scope's Queued jobs in bounded conditional batches, and every change is recorded with who and why."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from db.admin import retire_destination
from db.errors import UnknownReference
from domain.controls import SwitchScope
from domain.models import AuthorizationResult, ClaimResult, JobStatus
from tests.db.race import authorize, cancel


async def switch(store, tenant_id, destination_id=None, *, enabled, reason="test", by="sam.ops"):
    scope = (
        SwitchScope.GLOBAL
        if tenant_id is None
        else SwitchScope.TENANT
        if destination_id is None
        else SwitchScope.DESTINATION
    )
    return await store.set_delivery_switch(
        scope=scope,
        tenant_id=tenant_id,
        destination_id=destination_id,
        enabled=enabled,
        reason=reason,
        changed_by=by,
    )


async def claim(worker_store, job) -> ClaimResult:
    return await worker_store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-3")


# -- the claim ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scope", ["tenant", "destination"])
async def test_a_paused_scope_leaves_its_job_queued_and_the_claim_says_paused(
    factory, api_store, worker_store, scope
):
    job = await factory.queued()
    await switch(
        api_store, job.tenant_id, job.destination_id if scope == "destination" else None, enabled=False
    )

    assert await claim(worker_store, job) == ClaimResult.PAUSED

    row = await factory.job(job.id)
    assert (row.status, row.attempt_id, row.attempt_count) == (JobStatus.QUEUED, None, 0)
    assert await factory.event_kinds(job.id) == []

    await switch(
        api_store, job.tenant_id, job.destination_id if scope == "destination" else None, enabled=True
    )
    assert await claim(worker_store, job) == ClaimResult.CLAIMED


async def test_a_destination_never_enabled_is_paused(factory, worker_store):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant, enabled=False)
    job = await factory.queued(tenant, destination)

    assert await claim(worker_store, job) == ClaimResult.PAUSED
    assert await factory.status(job.id) == JobStatus.QUEUED


async def test_a_tenant_without_a_switch_row_is_paused(factory, worker_store):
    tenant = await factory.tenant(enabled=False)
    job = await factory.queued(tenant, await factory.destination(tenant))

    assert await claim(worker_store, job) == ClaimResult.PAUSED


async def test_a_disabled_row_pauses_even_when_its_other_scopes_are_enabled(factory, worker_store):
    # Fail-closed counts rows that say enabled, not rows that say paused.
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    await factory.switch(tenant, destination, enabled=False)
    job = await factory.queued(tenant, destination)

    assert await claim(worker_store, job) == ClaimResult.PAUSED


async def test_the_global_switch_pauses_every_tenant(factory, platform_store, worker_store):
    # The platform's role switches it (0019); the API's may not (tests/db/test_controls_permissions.py).
    first, second = await factory.queued(), await factory.queued()
    await switch(platform_store, None, enabled=False, by="platform-ops")
    try:
        assert await claim(worker_store, first) == ClaimResult.PAUSED
        assert await claim(worker_store, second) == ClaimResult.PAUSED
    finally:
        await switch(platform_store, None, enabled=True, by="platform-ops")
    assert await claim(worker_store, first) == ClaimResult.CLAIMED


async def test_a_claim_of_a_moved_version_is_lost_not_paused(factory, api_store, worker_store):
    # Paused is said only when the switch was the one reason: a stale version is an ordinary lost claim.
    job = await factory.queued()
    await switch(api_store, job.tenant_id, enabled=False)
    stale = await worker_store.claim_if_queued(job.id, job.version + 1, uuid.uuid4(), "worker-3")
    assert stale == ClaimResult.LOST
    await factory.cancel(job)
    assert await claim(worker_store, job) == ClaimResult.LOST


# -- cutoff 2 -------------------------------------------------------------------------------------------


async def test_cutoff_2_under_a_pause_authorizes_nothing_and_says_paused(factory, api_store, worker_store):
    job, attempt = await factory.running()
    await switch(api_store, job.tenant_id, job.destination_id, enabled=False)

    assert await authorize(worker_store, job, attempt) == AuthorizationResult.PAUSED

    row = await factory.job(job.id)
    assert (row.status, row.delivery_authorized_at) == (JobStatus.RUNNING, None)
    assert await factory.event_kinds(job.id) == ["Claimed"]


async def test_the_paused_attempt_is_given_back_without_using_up_an_attempt(factory, api_store, worker_store):
    job, attempt = await factory.running()
    await switch(api_store, job.tenant_id, enabled=False)
    assert await authorize(worker_store, job, attempt) == AuthorizationResult.PAUSED
    outbox_before = await factory.outbox_count(job.id)

    released = await worker_store.release_attempt_if_running(job.id, attempt, "worker-3", "cutoff 2: Paused")

    assert released.value == "Released"
    row = await factory.job(job.id)
    assert (row.status, row.attempt_id, row.attempts_released) == (JobStatus.QUEUED, None, 1)
    assert await factory.outbox_count(job.id) == outbox_before + 1
    assert await factory.event_kinds(job.id) == ["Claimed", "Released"]
    assert await claim(worker_store, row) == ClaimResult.PAUSED  # still paused: stays Queued


async def test_a_retired_destination_stops_cutoff_2(factory, worker_store):
    job, attempt = await factory.running()
    assert await retire_destination(
        factory.db.admin_url, tenant_id=job.tenant_id, destination_id=job.destination_id, retired_by="lee"
    )
    assert await authorize(worker_store, job, attempt) == AuthorizationResult.DESTINATION_INACTIVE
    assert await factory.status(job.id) == JobStatus.RUNNING


@pytest.mark.parametrize(
    ("starts", "ends"), [(-60, -1), (1, None)], ids=["contract-ended", "contract-not-started"]
)
async def test_a_destination_out_of_contract_stops_cutoff_2(factory, worker_store, starts, ends):
    # Offsets in days from the database clock's UTC day, the one cutoff 2 judges by.
    job, attempt = await factory.running()
    today = await factory.db_today()
    await factory.change_destination(
        job.tenant_id,
        job.destination_id,
        contract_starts_on=today + timedelta(days=starts),
        contract_ends_on=None if ends is None else today + timedelta(days=ends),
    )
    assert await authorize(worker_store, job, attempt) == AuthorizationResult.DESTINATION_INACTIVE


async def test_a_contract_that_ends_today_still_delivers_today(factory, worker_store):
    job, attempt = await factory.running()
    today = await factory.db_today()
    await factory.change_destination(
        job.tenant_id,
        job.destination_id,
        contract_starts_on=today - timedelta(days=30),
        contract_ends_on=today,
    )
    assert await authorize(worker_store, job, attempt) == AuthorizationResult.AUTHORIZED


async def test_a_recorded_stop_wins_over_a_pause_at_cutoff_2(factory, api_store, worker_store):
    job, attempt = await factory.running()
    await cancel(api_store, job)
    await switch(api_store, job.tenant_id, enabled=False)
    assert await authorize(worker_store, job, attempt) == AuthorizationResult.STOP_RECORDED


async def test_another_attempts_cutoff_2_is_not_owner_whatever_the_switches(factory, api_store, worker_store):
    job, _ = await factory.running()
    await switch(api_store, job.tenant_id, enabled=False)
    assert await authorize(worker_store, job, uuid.uuid4()) == AuthorizationResult.NOT_OWNER


# -- the sweeper and the resume -------------------------------------------------------------------------


async def test_the_sweeper_skips_a_paused_scope_and_its_sweep_count_does_not_climb(
    factory, api_store, worker_store
):
    job = await factory.queued()
    await factory.age_wake_up(job.id, minutes=31)
    await switch(api_store, job.tenant_id, job.destination_id, enabled=False)

    for _ in range(3):
        assert job.id not in await worker_store.sweep_stale_queued(older_than_seconds=30 * 60, batch=10_000)
    assert (await factory.job(job.id)).sweep_count == 0

    # the pause is its owner's row (0032): its owner's resume releases it (a switch row alone would not)
    await switch(api_store, job.tenant_id, job.destination_id, enabled=True)
    assert job.id in await worker_store.sweep_stale_queued(older_than_seconds=30 * 60, batch=10_000)
    assert (await factory.job(job.id)).sweep_count == 1


async def test_a_resume_wakes_the_scopes_queued_jobs_in_bounded_batches(factory, api_store):
    tenant = await factory.tenant()
    destination, other = (
        await factory.destination(tenant),
        await factory.destination(tenant, name="partner-b"),
    )
    paused = await switch(api_store, tenant, destination, enabled=False)
    jobs = [await factory.queued(tenant, destination) for _ in range(5)]
    bystander = await factory.queued(tenant, other)
    canceled = await factory.queued(tenant, destination)
    await factory.cancel(canceled)
    outbox = {j.id: await factory.outbox_count(j.id) for j in [*jobs, bystander, canceled]}

    resumed = await switch(api_store, tenant, destination, enabled=True)
    assert resumed.changed_at > paused.changed_at
    batches = []
    while True:
        batch = await api_store.wake_resumed_queued(
            resumed.changed_at, tenant_id=tenant, destination_id=destination, batch=2
        )
        batches.append(len(batch))
        if len(batch) < 2:
            break

    assert batches == [2, 2, 1, 0][: len(batches)] and sum(batches) == 5
    for j in jobs:
        row = await factory.job(j.id)
        assert row.woken_at > resumed.changed_at and row.sweep_count == 0
        assert await factory.outbox_count(j.id) == outbox[j.id] + 1
    assert await factory.outbox_count(bystander.id) == outbox[bystander.id]  # another destination
    assert await factory.outbox_count(canceled.id) == outbox[canceled.id]  # no longer Queued


async def test_a_resume_wakes_nothing_while_another_scope_still_pauses_it(factory, api_store):
    job = await factory.queued()
    await switch(api_store, job.tenant_id, enabled=False)
    await switch(api_store, job.tenant_id, job.destination_id, enabled=False)
    resumed = await switch(api_store, job.tenant_id, job.destination_id, enabled=True)

    woken = await api_store.wake_resumed_queued(
        resumed.changed_at, tenant_id=job.tenant_id, destination_id=job.destination_id
    )
    assert woken == []

    tenant_resumed = await switch(api_store, job.tenant_id, enabled=True)
    assert await api_store.wake_resumed_queued(tenant_resumed.changed_at, tenant_id=job.tenant_id) == [job.id]


# -- the record of changes ------------------------------------------------------------------------------


async def test_every_change_is_recorded_with_who_why_and_what_it_replaced(factory, api_store):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant, enabled=False)

    first = await switch(api_store, tenant, destination, enabled=True, reason="contract signed", by="sam.ops")
    second = await switch(api_store, tenant, destination, enabled=False, reason="partner incident", by="lee")

    assert (first.enabled, first.was_enabled, first.changed_by) == (True, None, "sam.ops")
    assert (second.enabled, second.was_enabled, second.reason) == (False, True, "partner incident")
    history = await api_store.switch_history(tenant)
    assert [c.id for c in history[:2]] == [second.id, first.id]
    switches = {s.destination_id: s for s in await api_store.tenant_switches(tenant)}
    assert switches[destination].enabled is False and switches[destination].changed_by == "lee"


async def test_the_switches_listing_shows_a_destination_never_enabled_as_paused(factory, api_store):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant, enabled=False, name="partner-new")
    listed = await api_store.tenant_switches(tenant)

    scopes = [(s.scope, s.destination_id) for s in listed]
    assert scopes == [
        (SwitchScope.GLOBAL, None),
        (SwitchScope.TENANT, None),
        (SwitchScope.DESTINATION, destination),
    ]
    never = listed[2]
    assert never.enabled is None and never.paused and never.destination_name == "partner-new"


async def test_another_tenants_destination_cannot_be_switched(factory, api_store):
    mine, theirs = await factory.tenant(), await factory.tenant("globex")
    their_destination = await factory.destination(theirs)
    with pytest.raises(UnknownReference):
        await switch(api_store, mine, their_destination, enabled=False)
    assert (await api_store.tenant_switches(theirs))[2].enabled is True
