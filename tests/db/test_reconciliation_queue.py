"""The reconciler's queue in the database (migration 0033; issue 26 item 4): the row records when it became
OutcomeUnknown, in the statement that makes the change and by nobody else; the queue reads a tenant's
OutcomeUnknowns oldest first by that time, keyset paged, and no other tenant's; its count stops at its cap;
a listing request is history nobody rewrites; and at a realistic size every read of the queue goes through an
index, in the queue's order, with no sort, for the custom plan and the generic one."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, LiteralString

import psycopg
import pytest

from bench.scale import explain, index_scans_on, plan_nodes, seq_scans_on
from db.pool import Role
from domain.models import DeliveryOutcome, FinishResult, JobStatus
from rules.recovery import LISTING_REQUEST_OBSERVER_PREFIX, LISTING_REQUEST_WINDOW_SECONDS
from service.reconciliation import queue_count, reconciler_queue_page
from tests.db.test_permissions import acting_as

ROLES: list[Role] = [
    "exports_api",
    "exports_worker",
    "exports_recovery",
    "exports_dispatcher",
    "exports_reconciler",
    "exports_platform",
]


async def db_now(factory) -> Any:
    return (await factory.admin("SELECT clock_timestamp() AS now"))[0]["now"]


async def unknown(factory, tenant_id=None, destination_id=None):
    job, attempt = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(tenant_id, destination_id)
    )
    return job, attempt


# -- when it became OutcomeUnknown -----------------------------------------------------------------------


async def test_the_workers_write_of_outcome_unknown_records_when_on_the_row(factory, worker_store):
    job, attempt = await factory.delivering(await factory.queued())
    assert job.outcome_unknown_at is None
    before = await db_now(factory)

    assert (
        await worker_store.finish_delivery(job.id, attempt, DeliveryOutcome.OUTCOME_UNKNOWN)
        == FinishResult.WRITTEN
    )

    after = await db_now(factory)
    row = await factory.job(job.id)
    assert row.outcome_unknown_at is not None and before <= row.outcome_unknown_at <= after


async def test_recoverys_write_of_outcome_unknown_records_when_too(factory, recovery_store):
    job, attempt = await factory.delivering(await factory.queued())
    await factory.fence(job.id, attempt, rename=True)
    await factory.expire_lease(job.id)
    before = await db_now(factory)

    assert await recovery_store.resolve_expired_delivery(
        job.id, attempt, JobStatus.OUTCOME_UNKNOWN, "recovery:test/run", "destination not observed"
    )

    row = await factory.job(job.id)
    assert row.outcome_unknown_at is not None and row.outcome_unknown_at >= before


async def test_a_completed_export_has_no_such_time_and_a_reconciled_one_keeps_it(factory, reconciler_store):
    completed, _ = await factory.in_status(JobStatus.COMPLETED, job=await factory.queued())
    assert completed.outcome_unknown_at is None
    job, attempt = await unknown(factory)
    recorded = job.outcome_unknown_at

    assert await reconciler_store.reconcile_unknown(
        tenant_id=job.tenant_id,
        job_id=job.id,
        attempt_id=attempt,
        resolution=JobStatus.COMPLETED,
        reconciled_by="lee.reconciler",
        evidence_summary="partner confirmed",
    )

    assert (await factory.job(job.id)).outcome_unknown_at == recorded


@pytest.mark.parametrize("role", ROLES)
async def test_no_role_may_write_when_an_export_became_outcome_unknown(database, factory, role):
    job, _ = await unknown(factory)
    async with acting_as(database, role) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute(
                "UPDATE export_jobs SET outcome_unknown_at = clock_timestamp() WHERE id = %(id)s",
                {"id": job.id},
            )
    assert (await factory.job(job.id)).outcome_unknown_at == job.outcome_unknown_at


async def test_an_outcome_unknown_without_its_time_is_refused_even_with_the_triggers_off(factory):
    # A history loaded with the triggers off (a benchmark's) must say when, or the queue could not order it.
    job, _ = await factory.delivering(await factory.queued())
    async with await psycopg.AsyncConnection.connect(factory.db.admin_url, autocommit=True) as conn:
        await conn.execute("SET session_replication_role = replica")
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            await conn.execute(
                "UPDATE export_jobs SET status = 'OutcomeUnknown' WHERE id = %(id)s", {"id": job.id}
            )
    assert refused.value.diag.constraint_name == "ck_export_jobs_outcome_unknown_at"
    assert await factory.status(job.id) == JobStatus.DELIVERING


# -- the queue -------------------------------------------------------------------------------------------


async def test_the_queue_is_oldest_first_by_when_each_became_unknown_not_by_creation(factory, api_store):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    created_first = await factory.queued(tenant, destination)
    created_second = await factory.queued(tenant, destination)
    second, _ = await factory.in_status(JobStatus.OUTCOME_UNKNOWN, job=created_second)
    first, _ = await factory.in_status(JobStatus.OUTCOME_UNKNOWN, job=created_first)
    await factory.in_status(JobStatus.COMPLETED, job=await factory.queued(tenant, destination))

    page = await reconciler_queue_page(api_store, tenant)

    assert [e.job.id for e in page.entries] == [second.id, first.id]
    assert page.next is None
    assert (page.count.kind, page.count.value) == ("exact", 2)


async def test_the_queue_pages_by_keyset_and_a_new_unknown_moves_nothing_already_read(factory, api_store):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    jobs = [(await unknown(factory, tenant, destination))[0] for _ in range(5)]

    first = await reconciler_queue_page(api_store, tenant, limit=2)
    late, _ = await unknown(factory, tenant, destination)  # arrives while the reconciler reads page one
    after = first.entries[-1].job
    assert first.next is not None and after.outcome_unknown_at is not None
    second = await reconciler_queue_page(
        api_store, tenant, limit=2, after=(after.outcome_unknown_at, after.id)
    )
    last_read = second.entries[-1].job
    assert last_read.outcome_unknown_at is not None
    third = await reconciler_queue_page(
        api_store, tenant, limit=2, after=(last_read.outcome_unknown_at, last_read.id)
    )

    read = [e.job.id for p in (first, second, third) for e in p.entries]
    assert read == [j.id for j in jobs] + [late.id]
    assert third.next is None


async def test_another_tenants_unknown_exports_are_not_in_the_queue(factory, api_store):
    mine = await factory.tenant()
    theirs = await factory.tenant()
    own, _ = await unknown(factory, mine, await factory.destination(mine))
    await unknown(factory, theirs, await factory.destination(theirs))

    page = await reconciler_queue_page(api_store, mine)

    assert [e.job.id for e in page.entries] == [own.id]
    assert page.count.value == 1


async def test_the_count_stops_at_its_cap_and_never_claims_the_cap_as_the_number(factory, api_store):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    for _ in range(3):
        await unknown(factory, tenant, destination)

    assert await api_store.count_outcome_unknown_queue(tenant, cap=2) == 3  # cap + 1: more than 2
    page = await reconciler_queue_page(api_store, tenant, count_cap=2)

    # The planner knows nothing of so few rows, so it cannot vouch for more than the cap: "more than 2".
    assert page.count.kind in ("more_than", "estimate")
    assert page.count.label.startswith(("more than 2", "about"))
    assert len(page.entries) == 3


def test_a_capped_count_is_exact_an_estimate_or_a_bound():
    assert queue_count(7, None, 1000).label == "7"
    assert queue_count(1001, 9_800_000, 1000).label == "about 9,800,000 (an estimate)"
    # an estimate below what was counted is wrong: only the bound is claimed
    assert queue_count(1001, 40, 1000).label == "more than 1,000"
    assert queue_count(1001, None, 1000).label == "more than 1,000"


async def test_each_queued_export_says_why_and_how_often_recovery_listed_it(
    factory, api_store, recovery_store
):
    tenant = await factory.tenant()
    job, attempt = await unknown(factory, tenant, await factory.destination(tenant))
    for error in ("ConnectRefused", None):
        listing = {"observation": "recovery_listing", "present": error is None, "size": None}
        await recovery_store.append_delivery_evidence(
            job.id, attempt, "recovery:test/run", {**listing, "error": error} if error else listing
        )
    await recovery_store.append_delivery_evidence(
        job.id, attempt, "recovery:test/run", {"observation": "recovery_set_aside", "error": "EOFError"}
    )

    (summary,) = await api_store.outcome_unknown_summaries(
        tenant,
        [job.id],
        recovery_prefix="recovery:",
        observer_prefix=f"{LISTING_REQUEST_OBSERVER_PREFIX}:",
        window_seconds=LISTING_REQUEST_WINDOW_SECONDS,
    )

    assert summary.reason == "OutcomeUnknown"  # the worker's Finished event, as finish_delivery wrote it
    assert summary.recovery_listings == 2  # listings only, not the set-aside
    assert summary.listing_requested is False
    other = await factory.tenant()
    assert (
        await api_store.outcome_unknown_summaries(
            other,
            [job.id],
            recovery_prefix="recovery:",
            observer_prefix=f"{LISTING_REQUEST_OBSERVER_PREFIX}:",
            window_seconds=LISTING_REQUEST_WINDOW_SECONDS,
        )
        == []
    )


# -- listing requests are history ------------------------------------------------------------------------


async def test_a_listing_request_is_recorded_once_while_it_waits_and_then_answered_by_evidence(
    factory, api_store, recovery_store
):
    job, attempt = await unknown(factory)
    ask = {
        "tenant_id": job.tenant_id,
        "job_id": job.id,
        "requested_by": "lee.reconciler",
        "observer_prefix": f"{LISTING_REQUEST_OBSERVER_PREFIX}:",
        "window_seconds": LISTING_REQUEST_WINDOW_SECONDS,
    }
    first = await api_store.record_listing_request(**ask)
    assert first is not None and first.attempt_id == attempt
    assert await api_store.record_listing_request(**ask) is None  # the first still waits

    [nominated] = await recovery_store.find_listing_requests(
        observer_prefix=f"{LISTING_REQUEST_OBSERVER_PREFIX}:",
        window_seconds=LISTING_REQUEST_WINDOW_SECONDS,
        limit=10,
    )
    assert (nominated.request_id, nominated.job_id) == (first.id, job.id)
    await recovery_store.append_delivery_evidence(
        job.id, attempt, f"{LISTING_REQUEST_OBSERVER_PREFIX}:{first.id}", {"observation": "requested_listing"}
    )

    assert (
        await recovery_store.find_listing_requests(
            observer_prefix=f"{LISTING_REQUEST_OBSERVER_PREFIX}:",
            window_seconds=LISTING_REQUEST_WINDOW_SECONDS,
            limit=10,
        )
        == []
    )  # answered: its evidence is there
    assert await api_store.record_listing_request(**ask) is not None  # answered: another may be asked


async def test_no_listing_request_is_recorded_for_a_paused_partner_or_a_settled_export(factory, api_store):
    job, _ = await unknown(factory)
    await factory.switch(job.tenant_id, job.destination_id, enabled=False)
    ask = {
        "tenant_id": job.tenant_id,
        "requested_by": "lee.reconciler",
        "observer_prefix": f"{LISTING_REQUEST_OBSERVER_PREFIX}:",
        "window_seconds": LISTING_REQUEST_WINDOW_SECONDS,
    }
    assert await api_store.record_listing_request(job_id=job.id, **ask) is None
    completed, _ = await factory.in_status(JobStatus.COMPLETED, job=await factory.queued())
    assert (
        await api_store.record_listing_request(
            **{**ask, "tenant_id": completed.tenant_id}, job_id=completed.id
        )
        is None
    )
    other = await factory.tenant()
    assert await api_store.record_listing_request(**{**ask, "tenant_id": other}, job_id=job.id) is None
    rows = await factory.admin(
        "SELECT count(*) AS n FROM listing_requests WHERE job_id = ANY(%(ids)s)",
        {"ids": [job.id, completed.id]},
    )
    assert rows[0]["n"] == 0


@pytest.mark.parametrize("role", ROLES)
async def test_nobody_rewrites_or_removes_a_listing_request(database, factory, api_store, role):
    job, _ = await unknown(factory)
    recorded = await api_store.record_listing_request(
        tenant_id=job.tenant_id,
        job_id=job.id,
        requested_by="lee.reconciler",
        observer_prefix=f"{LISTING_REQUEST_OBSERVER_PREFIX}:",
        window_seconds=LISTING_REQUEST_WINDOW_SECONDS,
    )
    assert recorded is not None
    for statement in (
        "UPDATE listing_requests SET requested_by = 'someone else' WHERE id = %(id)s",
        "DELETE FROM listing_requests WHERE id = %(id)s",
        "TRUNCATE listing_requests CASCADE",
    ):
        async with acting_as(database, role) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(statement, {"id": recorded.id})
    rows = await factory.admin(
        "SELECT requested_by FROM listing_requests WHERE id = %(id)s", {"id": recorded.id}
    )
    assert rows == [{"requested_by": "lee.reconciler"}]


async def test_only_the_api_records_listing_requests_and_only_it_and_recovery_read_them(database):
    async with acting_as(database, None) as conn:
        cur = await conn.execute(
            "SELECT r, has_table_privilege(r, 'listing_requests', 'INSERT'),"
            " has_table_privilege(r, 'listing_requests', 'SELECT') FROM unnest(%(roles)s::text[]) r",
            {"roles": ROLES},
        )
        grants = {role: (insert, select) for role, insert, select in await cur.fetchall()}
    assert grants == {
        "exports_api": (True, True),
        "exports_worker": (False, False),
        "exports_recovery": (False, True),
        "exports_dispatcher": (False, False),
        "exports_reconciler": (False, False),
        "exports_platform": (False, False),
    }


# -- the plans at a realistic size -----------------------------------------------------------------------

HISTORY = (
    200_000  # exports over 4 tenants in runs of 200; one in 200 OutcomeUnknown (a thousand, 250 a tenant)
)
TENANTS = 4

_LOAD: LiteralString = """
INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, attempt_id, attempt_count, claimed_by,
    expected_file_name, expected_file_bytes, expected_file_sha256, expected_file_rows, delivery_authorized_at,
    woken_at, delivery_key, created_by, list_name, fence_expected, upload_fenced_at, rename_fenced_at, created_at,
    outcome_unknown_at)
SELECT md5('queue' || g)::uuid, (%(tenants)s::uuid[])[1 + (g / 200) %% %(n)s],
    CASE WHEN g %% 200 = 0 THEN 'OutcomeUnknown' ELSE 'Completed' END, 1,
    (%(destinations)s::uuid[])[1 + (g / 200) %% %(n)s], md5('attempt' || g)::uuid, 1, 'bench-worker',
    'contacts-q' || g || '.csv', 40000, sha256(('file' || g)::bytea), 400, c.at + interval '20 s',
    c.at, 'q' || g, 'bench', 'main', true, c.at + interval '21 s', c.at + interval '22 s', c.at,
    CASE WHEN g %% 200 = 0 THEN c.at + interval '30 s' END
FROM generate_series(1, %(total)s) g
CROSS JOIN LATERAL (SELECT now() - (%(total)s - g) * interval '1 s' AS at) c
"""


@pytest.fixture(scope="module")
async def history(factory) -> list[uuid.UUID]:
    """``HISTORY`` exports loaded as a benchmark loads them (the triggers off, as the superuser, then VACUUM
    ANALYZE as autovacuum would); returns the tenants."""
    tenants = [await factory.tenant() for _ in range(TENANTS)]
    destinations = [await factory.destination(t) for t in tenants]

    def load() -> None:
        with psycopg.connect(factory.db.admin_url, autocommit=True) as conn:
            conn.execute("SET session_replication_role = replica")
            conn.execute(
                _LOAD, {"tenants": tenants, "destinations": destinations, "n": TENANTS, "total": HISTORY}
            )
            conn.execute("SET session_replication_role = origin")
            conn.execute("VACUUM ANALYZE export_jobs")

    await asyncio.to_thread(load)
    return tenants


@pytest.mark.slow
async def test_the_queue_reads_export_jobs_by_its_index_in_its_order_at_scale(history, factory, api_store):
    tenant = history[0]
    page = await reconciler_queue_page(api_store, tenant, limit=50)
    assert len(page.entries) == 50 and (page.count.kind, page.count.value) == (
        "exact",
        HISTORY // 200 // TENANTS,
    )
    middle = page.entries[-1].job
    reads: list[tuple[str, dict[str, Any]]] = [
        (
            "page_outcome_unknown_queue",
            {"tenant_id": tenant, "after_at": "-infinity", "after_id": uuid.UUID(int=0), "limit": 51},
        ),
        (
            "page_outcome_unknown_queue",
            {"tenant_id": tenant, "after_at": middle.outcome_unknown_at, "after_id": middle.id, "limit": 51},
        ),
    ]
    async with await psycopg.AsyncConnection.connect(factory.db.admin_url, autocommit=True) as conn:
        for name, params in reads:
            for generic in (False, True):
                plan = await explain(conn, "exports_api", name, params, generic=generic)
                assert seq_scans_on(plan) == [], (name, generic, plan)
                # the tenant's entries, in the queue's order: no sort, whatever other tenants hold
                assert index_scans_on(plan) == ["ix_export_jobs_tenant_outcome_unknown"], (
                    name,
                    generic,
                    plan,
                )
                assert not [n for n in plan_nodes(plan) if n["Node Type"] in ("Sort", "Incremental Sort")], (
                    name,
                    generic,
                )
        for generic in (False, True):
            counted = await explain(
                conn,
                "exports_api",
                "count_outcome_unknown_queue",
                {"tenant_id": tenant, "cap": 1000},
                generic=generic,
            )
            assert seq_scans_on(counted) == []
            assert len(index_scans_on(counted)) == 1 and set(index_scans_on(counted)) <= {
                "ix_export_jobs_tenant_outcome_unknown",
                "ix_export_jobs_outcome_unknown",
            }
        summaries = await explain(
            conn,
            "exports_api",
            "outcome_unknown_summaries",
            {
                "tenant_id": tenant,
                "job_ids": [e.job.id for e in page.entries],
                "recovery_prefix": "recovery:",
                "observer_prefix": f"{LISTING_REQUEST_OBSERVER_PREFIX}:",
                "window_seconds": LISTING_REQUEST_WINDOW_SECONDS,
            },
        )
        assert seq_scans_on(summaries) == [] and seq_scans_on(summaries, "export_attempt_events") == []
