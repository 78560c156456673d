"""The export list's bounded reads (issue 26, item 5; ``db/stores/listing.py``): a page over several statuses
is the tenant's matches newest first, paged by keyset without repeats or gaps; an ID prefix finds exactly the
IDs that start with it; a count stops at its cap and says so; the list names are the tenant's; and a read
past its bound is canceled and raises ``QueryTimedOut`` instead of hanging, while a cancel that is not the
bound stays a plain transient error."""

from __future__ import annotations

import asyncio
import random

import psycopg
import pytest

from db.errors import QueryTimedOut, TransientStoreError
from domain.listing import ExportFilter
from domain.models import JobStatus

BOUND_MS = 200
ROOMY_MS = 30_000  # a bound no test read comes near


@pytest.fixture(scope="module")
async def acme(factory):
    return await factory.tenant("acme")


async def test_a_page_of_several_statuses_is_newest_first_across_them_and_pages_without_repeats_or_gaps(
    factory, api_store, acme
):
    destination = await factory.destination(acme)
    jobs = []
    for i in range(14):
        status = [JobStatus.QUEUED, JobStatus.CANCELED, JobStatus.RUNNING, JobStatus.COMPLETED][i % 4]
        job, _ = await factory.in_status(status, job=await factory.queued(acme, destination))
        jobs.append(job)
    # Ties on created_at are broken by the ID, as the keyset bound does: give four of them one instant.
    async with await psycopg.AsyncConnection.connect(factory.db.admin_url, autocommit=True) as admin:
        await admin.execute("SET session_replication_role = replica")  # the guard admits no such edit
        await admin.execute(
            "UPDATE export_jobs SET created_at = (SELECT created_at FROM export_jobs WHERE id = %(first)s)"
            " WHERE id = ANY(%(ids)s)",
            {"first": jobs[4].id, "ids": [j.id for j in jobs[4:8]]},
        )
    wanted = {JobStatus.QUEUED, JobStatus.CANCELED, JobStatus.COMPLETED}
    rows = await factory.admin(
        "SELECT id FROM export_jobs WHERE tenant_id = %(t)s AND destination_id = %(d)s"
        " AND status = ANY(%(s)s) ORDER BY created_at DESC, id DESC",
        {"t": acme, "d": destination, "s": [s.value for s in wanted]},
    )
    expected = [r["id"] for r in rows]
    assert len(expected) == 11  # not the 3 Running

    # in any order, one of them twice: the page is the same
    statuses = (JobStatus.COMPLETED, JobStatus.QUEUED, JobStatus.CANCELED, JobStatus.QUEUED)
    filters = ExportFilter(statuses, destination_id=destination)
    seen, before = [], None
    while True:
        page = await api_store.page_tenant_jobs(
            acme, limit=3, before=before, filters=filters, timeout_ms=ROOMY_MS
        )
        seen += [j.id for j in page]
        if len(page) < 3:
            break
        before = (page[-1].created_at, page[-1].id)
    assert seen == expected


async def test_an_id_prefix_finds_exactly_the_ids_that_start_with_it(factory, api_store, acme):
    destination = await factory.destination(acme)
    ids = [(await factory.queued(acme, destination)).id for _ in range(40)]
    random.seed(26)
    for job_id in random.sample(ids, 8):
        for length in (1, 2, 3, 9, 36):
            prefix = str(job_id)[:length]
            page = await api_store.page_tenant_jobs(
                acme,
                limit=100,
                filters=ExportFilter(destination_id=destination, id_prefix=prefix),
                timeout_ms=ROOMY_MS,
            )
            assert {j.id for j in page} == {i for i in ids if str(i).startswith(prefix)}, prefix
    misplaced = str(ids[0])[:4] + "-"  # no ID has a hyphen there
    assert (
        await api_store.page_tenant_jobs(
            acme, limit=100, filters=ExportFilter(id_prefix=misplaced), timeout_ms=ROOMY_MS
        )
        == []
    )


async def test_a_count_stops_at_its_cap_plus_one_and_counts_exactly_below_it(factory, api_store, acme):
    destination = await factory.destination(acme)
    for _ in range(5):
        await factory.queued(acme, destination)
    await factory.in_status(JobStatus.CANCELED, job=await factory.queued(acme, destination))
    scope = ExportFilter(destination_id=destination)

    counted = await api_store.count_tenant_jobs_by_status(
        acme,
        [JobStatus.QUEUED, JobStatus.CANCELED, JobStatus.FAILED],
        filters=scope,
        cap=3,
        timeout_ms=ROOMY_MS,
    )

    assert counted.complete
    assert counted.counted == {
        JobStatus.QUEUED: 4,
        JobStatus.CANCELED: 1,
        JobStatus.FAILED: 0,
    }  # 4: more than 3


async def test_a_count_in_one_pass_counts_every_status_or_says_it_stopped(factory, api_store, acme):
    destination = await factory.destination(acme)
    for _ in range(3):
        await factory.queued(acme, destination)
    await factory.in_status(JobStatus.CANCELED, job=await factory.queued(acme, destination))
    scope = ExportFilter(destination_id=destination)

    whole = await api_store.count_tenant_jobs_in_scope(acme, filters=scope, cap=4, timeout_ms=ROOMY_MS)
    stopped = await api_store.count_tenant_jobs_in_scope(acme, filters=scope, cap=2, timeout_ms=ROOMY_MS)

    assert whole == {JobStatus.QUEUED: 3, JobStatus.CANCELED: 1}
    assert sum(stopped.values()) == 3  # cap + 1: the pass stopped, no status's count is known


async def test_the_list_names_are_the_tenants_own_each_once_in_order(factory, api_store, acme):
    tenant = await factory.tenant("names")
    other = await factory.tenant("others")
    for name in ("zeta", "alpha", "mid", "alpha", "zeta"):
        await factory.queued(tenant, list_name=name)
    await factory.queued(other, list_name="beta")

    assert await api_store.tenant_list_names(tenant, timeout_ms=ROOMY_MS) == ["alpha", "mid", "zeta"]


async def _waiting_backends(factory, pid: int) -> list[dict]:
    return await factory.admin(
        "SELECT pid, state, wait_event_type FROM pg_stat_activity WHERE pid = %(p)s AND state = 'active'",
        {"p": pid},
    )


async def test_a_read_past_its_bound_is_canceled_and_raises_query_timed_out_instead_of_hanging(
    factory, kit, acme
):
    solo = await kit.solo("exports_api")
    held = await kit.hold(None)
    await held.execute("LOCK TABLE export_jobs IN ACCESS EXCLUSIVE MODE")  # no read of it can finish

    with pytest.raises(QueryTimedOut):
        await solo.store.page_tenant_jobs(acme, limit=50, timeout_ms=BOUND_MS)
    # The counts one by one share one budget: what it did not reach is left out, and says so.
    partial = await solo.store.count_tenant_jobs_by_status(
        acme, [JobStatus.QUEUED, JobStatus.FAILED], filters=ExportFilter(), cap=10, timeout_ms=BOUND_MS
    )
    assert partial.counted == {} and not partial.complete
    with pytest.raises(QueryTimedOut):
        await solo.store.count_tenant_jobs_in_scope(acme, filters=ExportFilter(), cap=10, timeout_ms=BOUND_MS)
    with pytest.raises(QueryTimedOut):
        await solo.store.estimate_tenant_jobs(
            acme, [JobStatus.QUEUED], filters=ExportFilter(), timeout_ms=BOUND_MS
        )

    assert await _waiting_backends(factory, solo.pid) == []  # canceled, not left waiting on the lock
    await held.rollback()
    # The connection went back to its pool idle, out of the aborted transaction, and serves the next read.
    assert isinstance(await solo.store.page_tenant_jobs(acme, limit=1, timeout_ms=ROOMY_MS), list)


async def test_a_cancel_that_is_not_the_bound_is_a_transient_error_not_a_timeout(factory, kit, acme):
    solo = await kit.solo("exports_api")
    held = await kit.hold(None)
    await held.execute("LOCK TABLE export_jobs IN ACCESS EXCLUSIVE MODE")
    read = asyncio.create_task(solo.store.page_tenant_jobs(acme, limit=50, timeout_ms=ROOMY_MS))
    await kit.wait_until_blocked_by(solo.pid, held.pid)

    await factory.admin("SELECT pg_cancel_backend(%(p)s)", {"p": solo.pid})  # an administrator's cancel

    with pytest.raises(TransientStoreError) as raised:
        await asyncio.wait_for(read, 10)
    assert not isinstance(raised.value, QueryTimedOut)
    await held.rollback()


async def test_the_bound_is_per_read_and_a_slow_lock_wait_under_it_still_answers(factory, kit, acme):
    # A read that waits less than its bound is not canceled: the bound is a ceiling, not a deadline race.
    solo = await kit.solo("exports_api")
    job = await factory.queued(acme)
    held = await kit.hold(None)
    await held.execute("LOCK TABLE export_jobs IN ACCESS EXCLUSIVE MODE")
    read = asyncio.create_task(
        solo.store.page_tenant_jobs(
            acme, limit=500, timeout_ms=ROOMY_MS, filters=ExportFilter(id_prefix=str(job.id))
        )
    )
    await kit.wait_until_blocked_by(solo.pid, held.pid)
    await held.rollback()

    page = await asyncio.wait_for(read, 10)

    assert [j.id for j in page] == [job.id]


def test_query_timed_out_is_transient_so_a_write_that_meets_it_is_re_read_as_before():
    assert issubclass(QueryTimedOut, TransientStoreError)
