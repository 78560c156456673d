"""A bulk cancel cancels the set it confirmed, and a lane that loses its connection is answered from the
ledger (issue 23, point 7), on the real server.

The preview keeps the exact set it counted under a token bound to its tenant and its caller; a batch that
confirms the token covers exactly that set, whatever each export's status is by then, and nothing that
became live since. A lane whose connection is cut (at a TCP proxy after its segment committed, or by
``pg_terminate_backend`` in the middle of its pipeline) leaves its segment's fate unknown: the store
re-reads the ledger and answers each export with what was recorded, never Busy for a committed request.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import psycopg
import pytest

from db.errors import TransientStoreError
from db.pool import open_pool
from db.stores.api import ApiStore
from domain.models import CancellationOutcome, JobStatus
from service.bulk import request_id_for
from testbed.tcp_proxy import TcpProxy
from tests.db.test_lost_responses import through_proxy

OPERATOR = "sam.ops"
# Only cancel_and_record's text carries this fragment: the lane's pipeline, not the batch's other reads.
LEDGER = b"'CanceledWhileQueued'"


async def preview(api_store, job, principal: str = OPERATOR, list_name: str | None = None):
    return await api_store.record_cancellation_preview(
        tenant_id=job.tenant_id,
        previewed_by=principal,
        destination_id=job.destination_id,
        list_name=list_name,
        ttl_seconds=900,
    )


async def confirm(api_store, job, token, principal: str = OPERATOR, **kw):
    """Record a batch confirming the preview ``token`` (``None``: a batch of the exports live now)."""
    return await api_store.record_cancellation_batch(
        tenant_id=job.tenant_id,
        batch_id=uuid.uuid4(),
        requested_by=principal,
        reason="contract ended",
        destination_id=job.destination_id,
        **{"list_name": None, **({"preview_id": token} if token else {}), **kw},
    )


async def decide(store, batch, job_ids, **kw):
    return await store.request_cancellations(
        tenant_id=batch.tenant_id,
        batch_id=batch.id,
        requests=[(j, request_id_for(batch.id, j)) for j in job_ids],
        requested_by=batch.requested_by,
        reason=batch.reason,
        **kw,
    )


async def batches_of(factory, tenant_id) -> int:
    rows = await factory.admin(
        "SELECT count(*) AS n FROM cancellation_batches WHERE tenant_id = %(t)s", {"t": tenant_id}
    )
    return rows[0]["n"]


# -- the previewed set ------------------------------------------------------------------------------------


async def test_a_preview_keeps_the_exact_set_it_counted_under_one_token(factory, api_store):
    queued = await factory.queued()
    tenant, destination = queued.tenant_id, queued.destination_id
    running, _ = await factory.running(await factory.queued(tenant, destination))
    await factory.in_status(JobStatus.COMPLETED, job=await factory.queued(tenant, destination))
    elsewhere = await factory.queued(tenant, await factory.destination(tenant, name="partner-new"))

    rows = await preview(api_store, queued)

    assert {r.job_id: r.status for r in rows} == {queued.id: JobStatus.QUEUED, running.id: JobStatus.RUNNING}
    tokens = {r.preview_id for r in rows}
    assert len(tokens) == 1 and None not in tokens
    kept = await factory.admin(
        "SELECT tenant_id, previewed_by, job_ids FROM cancellation_previews WHERE id = %(id)s",
        {"id": tokens.pop()},
    )
    assert kept == [
        {"tenant_id": tenant, "previewed_by": OPERATOR, "job_ids": sorted([queued.id, running.id])}
    ]
    assert (
        await preview(api_store, elsewhere, list_name="no-such-list") == []
    )  # nothing counted, nothing kept


async def test_a_batch_confirming_a_preview_covers_exactly_its_set_whatever_their_status_now(
    factory, api_store
):
    stays = await factory.queued()
    tenant, destination = stays.tenant_id, stays.destination_id
    ends = await factory.queued(tenant, destination)
    authorized = await factory.queued(tenant, destination)
    running, _ = await factory.running(await factory.queued(tenant, destination))
    token = (await preview(api_store, stays))[0].preview_id
    # Meanwhile: one of the set ends, one passes cutoff 2, and a new export is queued.
    await factory.in_status(JobStatus.STOPPED, job=ends)
    await factory.delivering(authorized)
    later = await factory.queued(tenant, destination)

    recorded = await confirm(api_store, stays, token)

    assert recorded is not None
    batch, created = recorded
    assert created and batch.matched == 4 and batch.preview_id == token
    covered = await api_store.batch_jobs_without_request(tenant, batch.id)
    assert set(covered) == {stays.id, ends.id, authorized.id, running.id}
    assert await api_store.batch_live_exports_not_covered(tenant, batch.id) == [later.id]
    results = {r.request.job_id: r.outcome for r in await decide(api_store, batch, covered) if r.request}
    assert results == {
        stays.id: CancellationOutcome.CANCELED_WHILE_QUEUED,
        ends.id: CancellationOutcome.ALREADY_ENDED,
        authorized.id: CancellationOutcome.TOO_LATE,
        running.id: CancellationOutcome.STOP_REQUESTED,
    }
    assert await factory.status(later.id) == JobStatus.QUEUED
    assert await factory.admin(
        "SELECT count(*) AS n FROM cancellation_requests WHERE job_id = %(id)s", {"id": later.id}
    ) == [{"n": 0}]


async def test_a_preview_token_confirms_nothing_for_another_tenant_caller_filter_or_after_it_expired(
    factory, api_store
):
    job = await factory.queued()
    token = (await preview(api_store, job))[0].preview_id
    other_tenant = await factory.queued()  # a tenant of its own, with a destination of its own
    theirs = job.model_copy(update={"tenant_id": other_tenant.tenant_id})

    assert await confirm(api_store, theirs, token) is None
    assert await confirm(api_store, other_tenant, token) is None
    assert await confirm(api_store, job, token, principal="someone.else") is None
    assert await confirm(api_store, job, token, list_name="vip") is None
    await factory.admin(
        "UPDATE cancellation_previews SET previewed_at = clock_timestamp() - interval '20 minutes',"
        " expires_at = clock_timestamp() - interval '5 minutes' WHERE id = %(id)s",
        {"id": token},
    )
    assert await confirm(api_store, job, token) is None

    assert await batches_of(factory, job.tenant_id) == 0
    assert await batches_of(factory, other_tenant.tenant_id) == 0
    assert await factory.status(job.id) == JobStatus.QUEUED


# -- a lane that loses its connection ---------------------------------------------------------------------


@pytest.fixture
def proxy(database) -> AsyncIterator[TcpProxy]:
    target = urlsplit(database.app_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432).start()
    yield proxy
    proxy.stop()


@pytest.fixture
async def proxied_api_store(database, proxy) -> AsyncIterator[ApiStore]:
    """An ``exports_api`` store over one connection through the proxy: the lanes' and the re-read's."""
    pool = await open_pool(
        through_proxy(database.app_url, proxy.port),
        "exports_api",
        min_size=1,
        max_size=1,
        name="proxied-api",
        checkout_timeout=1.0,
    )
    yield ApiStore(pool)
    await pool.close()


async def a_batch_of(factory, api_store, *statuses: JobStatus):
    """A batch (no preview: the exports live now) over one new export in each status, in that order."""
    first = await factory.queued()
    jobs = [first] + [await factory.queued(first.tenant_id, first.destination_id) for _ in statuses[1:]]
    for job, status in zip(jobs, statuses, strict=True):
        await factory.in_status(status, job=job)
    recorded = await confirm(api_store, first, None)
    assert recorded is not None
    batch, _ = recorded
    covered = await api_store.batch_jobs_without_request(first.tenant_id, batch.id)
    assert covered == [j.id for j in jobs]
    return batch, covered


async def test_a_lane_cut_after_its_segment_committed_answers_each_export_as_the_ledger_recorded_it(
    factory, api_store, proxy, proxied_api_store
):
    batch, covered = await a_batch_of(factory, api_store, JobStatus.QUEUED, JobStatus.RUNNING)
    # The lane's pipeline reaches the server and commits; its answer never comes back.
    proxy.drop_next_reply_after(LEDGER)

    results = await decide(proxied_api_store, batch, covered)

    assert proxy.fired.is_set(), "the fault never fired: the test would prove nothing"
    assert [r.outcome for r in results] == [
        CancellationOutcome.CANCELED_WHILE_QUEUED,
        CancellationOutcome.STOP_REQUESTED,
    ]
    assert [r.request.job_id for r in results if r.request] == covered
    assert await api_store.batch_jobs_without_request(batch.tenant_id, batch.id) == []


async def test_a_lane_whose_answer_and_re_read_are_both_lost_says_so_rather_than_busy(
    factory, api_store, proxy, proxied_api_store
):
    batch, covered = await a_batch_of(factory, api_store, JobStatus.QUEUED, JobStatus.RUNNING)

    def partition() -> None:  # run by the proxy once the segment committed, before the lane hears anything
        proxy.refuse_new_connections()
        proxy.close_all()

    proxy.drop_next_reply_after(LEDGER, on_drop=partition)

    with pytest.raises(TransientStoreError):
        await decide(proxied_api_store, batch, covered)

    assert proxy.fired.is_set()
    proxy.refuse_new_connections(False)
    # Committed, not Busy: a retry of the batch finds both recorded and decides nothing again.
    assert await api_store.batch_outcomes(batch.tenant_id, batch.id) == {
        CancellationOutcome.CANCELED_WHILE_QUEUED: 1,
        CancellationOutcome.STOP_REQUESTED: 1,
    }


async def test_a_lane_whose_backend_is_terminated_mid_pipeline_answers_committed_ones_and_busy_for_the_rest(
    factory, api_store, kit, database
):
    batch, covered = await a_batch_of(
        factory, api_store, JobStatus.QUEUED, JobStatus.QUEUED, JobStatus.QUEUED
    )
    first, held, last = covered
    lane = await kit.solo("exports_api")
    holder = await kit.hold(None)
    await holder.execute("SELECT 1 FROM export_jobs WHERE id = %(id)s FOR UPDATE", {"id": held})

    deciding = asyncio.create_task(decide(lane.store, batch, covered, lock_timeout="30s", concurrency=1))
    # The first export's transaction committed; the lane now waits for the second one's row lock.
    await kit.wait_until_blocked_by(lane.pid, holder.pid)
    async with await psycopg.AsyncConnection.connect(database.admin_url, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%(pid)s)", {"pid": lane.pid})
    results = await deciding
    await holder.rollback()

    assert [r.outcome for r in results] == [
        CancellationOutcome.CANCELED_WHILE_QUEUED,
        CancellationOutcome.BUSY,
        CancellationOutcome.BUSY,
    ]
    assert await api_store.batch_jobs_without_request(batch.tenant_id, batch.id) == [held, last]
    assert await factory.status(first) == JobStatus.CANCELED


# -- who may touch the previews and the signals -----------------------------------------------------------


async def test_only_the_api_previews_and_records_signals_and_nobody_rewrites_a_signal(database):
    roles = ["exports_api", "exports_worker", "exports_recovery", "exports_dispatcher", "exports_reconciler"]
    privileges = ["SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE"]
    async with await psycopg.AsyncConnection.connect(database.admin_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT r, t, p FROM unnest(%(roles)s::text[]) r, unnest(%(tables)s::text[]) t,"
            " unnest(%(privileges)s::text[]) p WHERE has_table_privilege(r, t, p)",
            {
                "roles": roles,
                "tables": ["cancellation_previews", "cancellation_stop_signals"],
                "privileges": privileges,
            },
        )
        granted = set(await cur.fetchall())
    assert granted == {
        # a preview expires: the API deletes expired ones on the way, as it does console sessions
        ("exports_api", "cancellation_previews", "SELECT"),
        ("exports_api", "cancellation_previews", "INSERT"),
        ("exports_api", "cancellation_previews", "DELETE"),
        # a delivered signal is history
        ("exports_api", "cancellation_stop_signals", "SELECT"),
        ("exports_api", "cancellation_stop_signals", "INSERT"),
    }
