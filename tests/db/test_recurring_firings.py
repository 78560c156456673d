"""A recurring export's firing in PostgreSQL (issue 25, item 1): one short transaction under the lock of its
recurring export's row creates the export through the same create as POST /exports (key: the Schedule's ID
and the nominal time) and records the firing beside it, or records why it was skipped. Real PostgreSQL, the
exports_api role that runs it in the worker."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, date, datetime, timedelta

import psycopg
import pytest

from db.admin import set_destination_contract
from db.stores.api import ApiStore
from domain.models import JobStatus
from domain.recurring import FiringOutcome, SkipReason, firing_key
from tests.support.factories import Factory

ADMIN = "ada.admin"
LATE_AFTER = 120.0


async def recurring(factory: Factory, api_store: ApiStore, **overrides):
    tenant = await factory.tenant()
    await factory.principal(tenant, ADMIN, role="admin")
    destination = await factory.destination(tenant, name="partner-new")
    fields = {
        "tenant_id": tenant,
        "id": uuid.uuid4(),
        "destination_id": destination,
        "list_name": "newsletter",
        "cron": "0 2 * * *",
        "interval_seconds": None,
        "time_zone": "Europe/Berlin",
        "starts_at": None,
        "ends_at": None,
        "paused": False,
        "paused_reason": None,
        "created_by": ADMIN,
    }
    fields.update(overrides)
    return await api_store.insert_recurring_export(**fields)


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


async def fire(api_store: ApiStore, row, nominal: datetime, *, catchup: int = 1):
    return await api_store.fire_recurring_export(
        tenant_id=row.tenant_id,
        recurring_export_id=row.id,
        nominal_time=nominal,
        fired_by=f"test/{uuid.uuid4()}",
        late_after_seconds=LATE_AFTER,
        catchup_firings=catchup,
    )


async def exports_of(factory: Factory, tenant_id) -> list[dict]:
    return await factory.admin(
        "SELECT j.id, j.status, j.created_by, j.list_name, k.key FROM export_jobs j"
        " LEFT JOIN idempotency_keys k ON k.job_id = j.id WHERE j.tenant_id = %(t)s",
        {"t": tenant_id},
    )


async def test_a_firing_creates_its_export_through_the_same_create_and_records_it(factory, api_store):
    row = await recurring(factory, api_store)
    nominal = now()

    answer = await fire(api_store, row, nominal)

    assert answer is not None and answer.outcome == FiringOutcome.CREATED
    [export] = await exports_of(factory, row.tenant_id)
    assert answer.firing.job_id == export["id"]
    assert (export["status"], export["created_by"], export["list_name"]) == ("Queued", ADMIN, "newsletter")
    assert (
        export["key"]
        == firing_key(row.id, nominal)
        == f"recurring-export-{row.id}@{nominal:%Y-%m-%dT%H:%M:%S}Z"
    )
    assert await factory.outbox_count(export["id"]) == 1  # its wake-up, as POST /exports writes it
    assert answer.firing.message == f"Created export {export['id']}."
    assert not answer.firing.late


async def test_a_duplicate_firing_of_the_same_nominal_time_creates_nothing_and_records_nothing(
    factory, api_store
):
    row = await recurring(factory, api_store)
    nominal = now()
    first = await fire(api_store, row, nominal)

    again = await fire(api_store, row, nominal)

    assert again is not None and again.outcome == FiringOutcome.DUPLICATE
    assert again.firing.job_id == first.firing.job_id and again.firing.id == first.firing.id
    assert len(await exports_of(factory, row.tenant_id)) == 1
    assert len(await api_store.recurring_export_firings(row.tenant_id, row.id)) == 1


async def test_concurrent_firings_of_one_nominal_time_make_one_export(factory, api_store):
    row = await recurring(factory, api_store)
    nominal = now()

    answers = await asyncio.gather(*(fire(api_store, row, nominal) for _ in range(6)))

    assert sorted(a.outcome.value for a in answers) == ["created"] + ["duplicate"] * 5
    assert len({a.firing.job_id for a in answers}) == 1
    assert len(await exports_of(factory, row.tenant_id)) == 1


async def test_a_firing_under_a_paused_destination_is_skipped_with_the_reason_and_queues_nothing(
    factory, api_store
):
    row = await recurring(factory, api_store)
    await factory.switch(row.tenant_id, row.destination_id, enabled=False, reason="partner maintenance")

    answer = await fire(api_store, row, now())

    assert answer.outcome == FiringOutcome.SKIPPED
    assert answer.firing.reason == SkipReason.DELIVERIES_PAUSED
    assert answer.firing.message == (
        "Skipped: deliveries to partner-new are paused (partner maintenance); nothing was queued."
    )
    assert await exports_of(factory, row.tenant_id) == []
    outbox = await factory.admin(
        "SELECT count(*) AS n FROM outbox o JOIN export_jobs j ON j.id = o.job_id WHERE j.tenant_id = %(t)s",
        {"t": row.tenant_id},
    )
    assert outbox[0]["n"] == 0


async def test_a_firing_after_the_contract_ended_is_skipped_with_the_policys_reason(factory, api_store):
    row = await recurring(factory, api_store)
    # every change to a destination is its next version, recorded (#24): an administrator's statement
    await set_destination_contract(
        factory.db.admin_url,
        tenant_id=row.tenant_id,
        destination_id=row.destination_id,
        starts_on=date(2020, 1, 1),
        ends_on=date(2020, 12, 31),
    )

    answer = await fire(api_store, row, now())

    assert answer.firing.reason == SkipReason.CONTRACT_ENDED
    assert answer.firing.message == "Skipped: partner-new's contract ended on 2020-12-31; nothing was queued."
    assert await exports_of(factory, row.tenant_id) == []


async def test_a_firing_while_the_previous_export_is_live_is_skipped_as_an_overlap(factory, api_store):
    row = await recurring(factory, api_store)
    first = await fire(api_store, row, now() - timedelta(minutes=1))

    second = await fire(api_store, row, now())

    assert second.firing.reason == SkipReason.OVERLAP
    assert second.firing.job_id == first.firing.job_id  # the live export it waited for
    assert f"its previous export {first.firing.job_id} is still Queued" in second.firing.message
    assert len(await exports_of(factory, row.tenant_id)) == 1


async def test_once_the_previous_export_ended_the_next_firing_creates_again(factory, api_store):
    row = await recurring(factory, api_store)
    first = await fire(api_store, row, now() - timedelta(minutes=1))
    await factory.cancel(await factory.job(first.firing.job_id))

    second = await fire(api_store, row, now())

    assert second.outcome == FiringOutcome.CREATED
    assert second.firing.job_id != first.firing.job_id


async def test_after_an_outage_at_most_one_missed_firing_runs(factory, api_store):
    row = await recurring(factory, api_store, cron=None, interval_seconds=3600)
    first_missed = await fire(api_store, row, now() - timedelta(hours=5))  # the one missed firing that runs
    assert first_missed.outcome == FiringOutcome.CREATED and first_missed.firing.late
    await factory.cancel(await factory.job(first_missed.firing.job_id))
    missed = [now() - timedelta(hours=h) for h in (4, 3, 2)]

    answers = [await fire(api_store, row, t) for t in missed]
    for a in answers:
        if a.firing.job_id and a.outcome == FiringOutcome.CREATED:
            await factory.cancel(
                await factory.job(a.firing.job_id)
            )  # no overlap: only the catch-up rule may skip

    assert [a.firing.reason for a in answers] == [SkipReason.CATCH_UP] * 3
    assert all(a.firing.late for a in answers)
    assert "at most 1 missed firing(s) run after one" in answers[0].firing.message

    on_time_again = await fire(api_store, row, now())
    assert on_time_again.outcome == FiringOutcome.CREATED and not on_time_again.firing.late


async def test_the_catch_up_allowance_is_a_setting(factory, api_store):
    row = await recurring(factory, api_store, cron=None, interval_seconds=3600)
    created = 0
    for hours in (4, 3, 2):
        answer = await fire(api_store, row, now() - timedelta(hours=hours), catchup=2)
        if answer.outcome == FiringOutcome.CREATED:
            created += 1
            await factory.cancel(await factory.job(answer.firing.job_id))
    assert created == 2


async def test_a_paused_or_deleted_recurring_export_records_its_firing_as_skipped(factory, api_store):
    row = await recurring(factory, api_store)
    await api_store.set_recurring_export_paused(
        tenant_id=row.tenant_id, recurring_export_id=row.id, paused=True, reason="holiday", updated_by=ADMIN
    )
    paused = await fire(api_store, row, now() - timedelta(seconds=30))
    assert paused.firing.reason == SkipReason.RECURRING_PAUSED
    assert paused.firing.message == "Skipped: this recurring export is paused (holiday); nothing was queued."

    await api_store.delete_recurring_export(
        tenant_id=row.tenant_id, recurring_export_id=row.id, deleted_by=ADMIN
    )
    deleted = await fire(api_store, row, now())
    assert deleted.firing.reason == SkipReason.RECURRING_DELETED
    assert await exports_of(factory, row.tenant_id) == []


async def test_a_backfilled_time_outside_its_start_and_end_is_skipped(factory, api_store):
    start = now() - timedelta(hours=1)
    row = await recurring(factory, api_store, starts_at=start, ends_at=start + timedelta(days=1))
    answer = await fire(api_store, row, start - timedelta(days=2))
    assert answer.firing.reason == SkipReason.OUTSIDE_WINDOW


async def test_another_tenants_recurring_export_does_not_fire(factory, api_store):
    row = await recurring(factory, api_store)
    other = await factory.tenant("globex")
    answer = await api_store.fire_recurring_export(
        tenant_id=other,
        recurring_export_id=row.id,
        nominal_time=now(),
        fired_by="test",
        late_after_seconds=LATE_AFTER,
        catchup_firings=1,
    )
    assert answer is None
    assert await api_store.recurring_export_firings(row.tenant_id, row.id) == []


async def test_the_firings_are_append_only_for_every_role_and_the_owner(factory, api_store, database):
    row = await recurring(factory, api_store)
    await fire(api_store, row, now())
    for statement in (
        "UPDATE recurring_export_firings SET message = 'rewritten'",
        "DELETE FROM recurring_export_firings",
    ):
        async with api_store.pool.connection() as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(statement)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await factory.admin(statement)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await factory.admin("DELETE FROM recurring_exports")


@pytest.mark.parametrize(
    "role", ["exports_worker", "exports_recovery", "exports_dispatcher", "exports_reconciler"]
)
async def test_only_the_api_role_reads_or_writes_recurring_exports(database, role):
    async with await psycopg.AsyncConnection.connect(database.app_url, autocommit=True) as conn:
        await conn.execute(psycopg.sql.SQL("SET ROLE {}").format(psycopg.sql.Identifier(role)))
        for table in ("recurring_exports", "recurring_export_firings"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(psycopg.sql.SQL("SELECT 1 FROM {}").format(psycopg.sql.Identifier(table)))


async def test_a_firing_of_a_queued_export_leaves_it_to_the_claim(factory, api_store, worker_store):
    """The firing checks the policy without the list's contacts (the API role may not read them): the
    claim's own check still rejects an export of a list with no contacts."""
    row = await recurring(factory, api_store, list_name="empty-list")
    answer = await fire(api_store, row, now())
    assert answer.outcome == FiringOutcome.CREATED
    facts = await worker_store.read_policy_facts(answer.firing.job_id)
    assert facts is not None and not facts.list_exists and facts.status == JobStatus.QUEUED


async def test_a_key_taken_by_the_same_create_is_the_firings_export_and_one_for_other_terms_records_nothing(
    factory, api_store
):
    from db.errors import IdempotencyConflict
    from rules.fingerprint import create_fingerprint

    row = await recurring(factory, api_store)
    same, other = now() - timedelta(minutes=1), now()
    fingerprint = create_fingerprint(
        tenant_id=row.tenant_id, principal=ADMIN, destination_id=row.destination_id, list_name="newsletter"
    )
    earlier = await api_store.create_original(
        tenant_id=row.tenant_id,
        destination_id=row.destination_id,
        list_name="newsletter",
        created_by=ADMIN,
        idempotency_key=firing_key(row.id, same),
        fingerprint=fingerprint,
    )
    answer = await fire(api_store, row, same)
    assert answer.outcome == FiringOutcome.CREATED and answer.firing.job_id == earlier.job_id
    await factory.cancel(await factory.job(earlier.job_id))

    await api_store.create_original(
        tenant_id=row.tenant_id,
        destination_id=row.destination_id,
        list_name="someone-elses",
        created_by=ADMIN,
        idempotency_key=firing_key(row.id, other),
        fingerprint="forged",
    )
    with pytest.raises(IdempotencyConflict):
        await fire(api_store, row, other)
    assert [f.nominal_time for f in await api_store.recurring_export_firings(row.tenant_id, row.id)] == [same]
    assert len(await exports_of(factory, row.tenant_id)) == 2
