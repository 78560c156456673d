"""The cancellation request record on the real server (000 "Recording Cancellation Requests"; test matrix
row "The request record").

Each request is decided under a lock on this tenant's job row, bound to its job and operator by the
client's request ID, and recorded with what it found; a lock wait past ``lock_timeout`` records nothing and
answers Busy, and the client retries with the same ID.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from uuid import UUID

import pytest

from domain.models import (
    CancellationOutcome,
    DeliveryOutcome,
    FailureCode,
    FinishResult,
    JobStatus,
    StopPoint,
)
from rules.cancellation import classify_cancellation
from tests.db.race import Gate, cancel, claim_params, matched, still_waiting

LONG_LOCK_TIMEOUT = "30s"


async def recorded_with_id(factory, request_id: UUID) -> int:
    """How many requests carry this ID, in any tenant (read as the superuser, to see them all)."""
    rows = await factory.admin(
        "SELECT count(*) AS n FROM cancellation_requests WHERE id = %(id)s", {"id": request_id}
    )
    return rows[0]["n"]


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (JobStatus.QUEUED, CancellationOutcome.CANCELED_WHILE_QUEUED),
        (JobStatus.RUNNING, CancellationOutcome.STOP_REQUESTED),
        (JobStatus.DELIVERING, CancellationOutcome.TOO_LATE),
        (JobStatus.CANCELED, CancellationOutcome.ALREADY_CANCELED),
        (JobStatus.REJECTED, CancellationOutcome.ALREADY_ENDED),
        (JobStatus.STOPPED, CancellationOutcome.ALREADY_ENDED),
        (JobStatus.FAILED, CancellationOutcome.ALREADY_ENDED),
        (JobStatus.COMPLETED, CancellationOutcome.TOO_LATE),
        (JobStatus.OUTCOME_UNKNOWN, CancellationOutcome.TOO_LATE),
    ],
)
async def test_every_request_is_recorded_with_the_state_and_attempt_it_found(
    factory, api_store, status, outcome
):
    job, attempt = await factory.in_status(status)

    result = await cancel(api_store, job)

    assert result.outcome == outcome
    [recorded] = [
        r
        for r in await api_store.job_cancellation_requests(job.tenant_id, job.id)
        if r.id == result.request_id
    ]
    assert (recorded.outcome, recorded.found_status, recorded.found_attempt_id, recorded.requested_by) == (
        outcome,
        status,
        job.attempt_id,
        "sam.ops",
    )
    assert recorded.found_attempt_count == job.attempt_count
    assert recorded.found_delivery_authorized_at == job.delivery_authorized_at
    after = await factory.job(job.id)
    if outcome == CancellationOutcome.CANCELED_WHILE_QUEUED:
        assert (after.status, after.cancellation_request_id) == (JobStatus.CANCELED, result.request_id)
    elif outcome == CancellationOutcome.STOP_REQUESTED:
        assert (after.status, after.stop_request_id) == (JobStatus.RUNNING, result.request_id)
    else:
        assert after == job  # recorded, not obeyed


async def test_two_simultaneous_submissions_of_one_request_id_give_one_record_and_one_answer(factory, kit):
    job = await factory.queued()
    request_id = uuid.uuid4()
    first_api, second_api = await kit.solo("exports_api"), await kit.solo("exports_api")
    gate = Gate()
    first = asyncio.create_task(cancel(first_api.store, job, request_id=request_id, before_commit=gate))
    await gate.wait_entered()

    second = asyncio.create_task(
        cancel(second_api.store, job, request_id=request_id, lock_timeout=LONG_LOCK_TIMEOUT)
    )
    await kit.wait_until_blocked_by(second_api.pid, first_api.pid)
    await still_waiting(second)
    gate.commit()

    one, two = await first, await second
    assert one.outcome == two.outcome == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert (one.replayed, two.replayed) == (False, True)
    assert one.request == two.request
    assert await recorded_with_id(factory, request_id) == 1


async def test_request_id_reused_for_another_job_or_operator_is_refused_and_records_nothing(
    factory, api_store
):
    job = await factory.queued()
    other = await factory.queued(job.tenant_id, job.destination_id)
    request_id = uuid.uuid4()
    assert (
        await cancel(api_store, job, request_id=request_id)
    ).outcome == CancellationOutcome.CANCELED_WHILE_QUEUED

    reused = await cancel(api_store, other, request_id=request_id)
    by_someone_else = await cancel(api_store, job, request_id=request_id, requested_by="kim.ops")

    assert reused.outcome == by_someone_else.outcome == CancellationOutcome.REQUEST_ID_REUSED
    assert reused.request is None  # says nothing about the other request
    assert (await factory.job(other.id)).status == JobStatus.QUEUED
    assert await api_store.job_cancellation_requests(other.tenant_id, other.id) == []
    assert await recorded_with_id(factory, request_id) == 1


async def test_request_id_reused_for_another_job_at_the_same_moment_changes_neither(factory, kit):
    # Different jobs, different row locks: the two transactions meet only on the request's primary key.
    job = await factory.queued()
    other = await factory.queued(job.tenant_id, job.destination_id)
    request_id = uuid.uuid4()
    first_api, second_api = await kit.solo("exports_api"), await kit.solo("exports_api")
    gate = Gate()
    first = asyncio.create_task(cancel(first_api.store, job, request_id=request_id, before_commit=gate))
    await gate.wait_entered()

    second = asyncio.create_task(cancel(second_api.store, other, request_id=request_id))
    await kit.wait_until_blocked_by(second_api.pid, first_api.pid)  # on the uncommitted key
    gate.commit()

    assert (await first).outcome == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert (await second).outcome == CancellationOutcome.REQUEST_ID_REUSED
    assert (await factory.job(other.id)).status == JobStatus.QUEUED  # its cancel rolled back with the insert
    assert await recorded_with_id(factory, request_id) == 1


async def test_the_same_request_id_in_another_tenant_is_a_different_request(factory, api_store):
    ours = await factory.queued()
    theirs = await factory.queued(await factory.tenant("globex"))
    request_id = uuid.uuid4()

    first = await cancel(api_store, ours, request_id=request_id)
    second = await cancel(api_store, theirs, request_id=request_id)

    assert first.outcome == second.outcome == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert second.replayed is False
    assert await recorded_with_id(factory, request_id) == 2


async def test_missing_job_and_another_tenants_job_are_not_found_and_record_nothing(factory, api_store):
    job = await factory.queued()
    intruder = await factory.tenant("globex")
    missing_id, foreign_id = uuid.uuid4(), uuid.uuid4()

    missing = await api_store.request_cancellation(
        tenant_id=job.tenant_id,
        job_id=uuid.uuid4(),
        request_id=missing_id,
        requested_by="sam.ops",
        reason=None,
    )
    foreign = await api_store.request_cancellation(
        tenant_id=intruder, job_id=job.id, request_id=foreign_id, requested_by="eve.ops", reason=None
    )

    assert missing.outcome == foreign.outcome == CancellationOutcome.NOT_FOUND
    assert (missing.request, foreign.request, foreign.job) == (None, None, None)
    assert await recorded_with_id(factory, missing_id) == await recorded_with_id(factory, foreign_id) == 0
    assert await factory.job(job.id) == job


async def test_busy_after_lock_timeout_records_nothing_then_retry_with_the_same_id_succeeds(
    factory, kit, api_store
):
    job = await factory.queued()
    attempt = uuid.uuid4()
    claim = await kit.hold("exports_worker")
    assert matched(await claim.run("claim_if_queued", claim_params(job, attempt)))

    request_id = uuid.uuid4()
    busy = await cancel(api_store, job, request_id=request_id, lock_timeout="200ms")

    assert busy.outcome == CancellationOutcome.BUSY
    assert (busy.request, busy.request_id) == (None, request_id)
    assert await recorded_with_id(factory, request_id) == 0
    assert (await factory.job(job.id)).status == JobStatus.QUEUED  # the claim is still uncommitted

    await claim.commit()
    retried = await cancel(api_store, job, request_id=request_id, lock_timeout="200ms")

    assert retried.outcome == CancellationOutcome.STOP_REQUESTED
    assert retried.request is not None and retried.request.found_attempt_id == attempt
    assert await recorded_with_id(factory, request_id) == 1


# The blocking proof of the locking read (hold a cancellation after its FOR UPDATE, start a claim, see it
# wait in pg_blocking_pids, then commit) is test_claim_waits_for_cancel_then_cannot_leave_queued in
# test_claim_cancel_race.py; it makes every assertion this module would, and more.


def renewal_owned(job_id: UUID, attempt: UUID):
    async def write(store) -> bool:
        return (await store.renew_lease(job_id, attempt)).owned

    return write


def completion_written(job_id: UUID, attempt: UUID):
    async def write(store) -> bool:
        return await store.finish_delivery(job_id, attempt, DeliveryOutcome.COMPLETED) == FinishResult.WRITTEN

    return write


async def test_locking_read_holds_the_row_even_when_the_outcome_changes_nothing(factory, kit, api_store):
    # StopAlreadyRequested and TooLate write nothing to the job: only the FOR UPDATE can make a writer wait.
    running, attempt = await factory.running()
    assert (await cancel(api_store, running)).outcome == CancellationOutcome.STOP_REQUESTED
    delivering, delivering_attempt = await factory.delivering()

    for job, writer_call, outcome in (
        (
            running,
            renewal_owned(running.id, attempt),
            CancellationOutcome.STOP_ALREADY_REQUESTED,
        ),
        (
            delivering,
            completion_written(delivering.id, delivering_attempt),
            CancellationOutcome.TOO_LATE,
        ),
    ):
        api = await kit.solo("exports_api")
        gate = Gate()
        canceling = asyncio.create_task(cancel(api.store, job, before_commit=gate))
        await gate.wait_entered()

        worker = await kit.solo("exports_worker")
        writing = asyncio.create_task(writer_call(worker.store))
        await kit.wait_until_blocked_by(worker.pid, api.pid)
        await still_waiting(writing)
        gate.commit()

        assert (await canceling).outcome == outcome
        assert await writing is True  # the worker's own write then goes ahead


async def test_retry_after_the_job_moved_on_returns_the_outcome_already_recorded(
    factory, api_store, worker_store
):
    job, attempt = await factory.running()
    request_id = uuid.uuid4()
    first = await cancel(api_store, job, request_id=request_id)
    assert first.outcome == CancellationOutcome.STOP_REQUESTED
    assert (
        await worker_store.finish_stopped(job.id, attempt, StopPoint.BEFORE_DELIVERY) == FinishResult.WRITTEN
    )

    again = await cancel(api_store, job, request_id=request_id)

    assert (again.outcome, again.replayed, again.request) == (
        CancellationOutcome.STOP_REQUESTED,
        True,
        first.request,
    )
    assert (await factory.job(job.id)).status == JobStatus.STOPPED
    assert await recorded_with_id(factory, request_id) == 1


async def test_cancellation_never_rewrites_a_recorded_failure(factory, api_store):
    job, _ = await factory.in_status(JobStatus.FAILED, code=FailureCode.BUILD_FAILED)
    assert (await cancel(api_store, job)).outcome == CancellationOutcome.ALREADY_ENDED
    assert await factory.job(job.id) == job


# -- the ledger in one statement: its classification is the rule's -------------------------------------


def _every_state() -> list[tuple[JobStatus, bool]]:
    """Every status, and Running once more with a stop request already recorded."""
    return [(s, False) for s in JobStatus] + [(JobStatus.RUNNING, True)]


@pytest.mark.parametrize(("status", "stop_requested"), _every_state())
async def test_the_ledger_statement_classifies_exactly_as_the_rule_for_every_status(
    factory, api_store, status, stop_requested
):
    # The CASE in cancel_and_record is rules.cancellation.classify_cancellation written in SQL.
    job, _ = await factory.in_status(status)
    if stop_requested:
        assert (await cancel(api_store, job)).outcome == CancellationOutcome.STOP_REQUESTED
        job = await factory.job(job.id)

    result = await cancel(api_store, job)

    assert result.outcome == classify_cancellation(job)
    assert result.request is not None and result.request.outcome == result.outcome
    assert result.job == job  # the row as the locking read found it


class _SlowReplies:
    """A loopback TCP proxy that holds every server reply for ``delay`` seconds: each client round trip
    then costs at least ``delay``, so the time of one operation counts its round trips."""

    def __init__(self, target_port: int, delay: float) -> None:
        self.target_port = target_port
        self.delay = delay
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._link, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _link(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
            # Each chunk is delivered ``delay`` after it arrived (latency, not a queue of sleeps), so
            # replies that follow one another closely still cost one delay together.
            loop = asyncio.get_running_loop()
            chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

            async def deliver() -> None:
                while True:
                    due, data = await chunks.get()
                    if not data:
                        break
                    await asyncio.sleep(max(0.0, due - loop.time()))
                    writer.write(data)
                    await writer.drain()

            delivering = asyncio.create_task(deliver())
            try:
                while data := await reader.read(65536):
                    chunks.put_nowait((loop.time() + delay, data))
            except ConnectionError:
                pass
            finally:
                chunks.put_nowait((0.0, b""))
                with contextlib.suppress(ConnectionError):
                    await delivering
                writer.close()

        await asyncio.gather(pipe(client_r, server_w, 0.0), pipe(server_r, client_w, self.delay))

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


async def test_one_cancellation_is_one_round_trip(factory, database):
    from urllib.parse import urlsplit, urlunsplit

    from db.pool import open_pool
    from db.stores.api import ApiStore

    job = await factory.queued()
    url = urlsplit(database.app_url)
    delay = 0.25
    proxy = _SlowReplies(url.port or 5432, delay)
    port = await proxy.start()
    proxied = urlunsplit(url._replace(netloc=f"{url.username}@127.0.0.1:{port}"))
    if url.password:
        proxied = urlunsplit(url._replace(netloc=f"{url.username}:{url.password}@127.0.0.1:{port}"))
    pool = await open_pool(
        proxied + ("&" if "?" in proxied else "?") + "sslmode=disable", "exports_api", max_size=1
    )
    try:
        store = ApiStore(pool)
        started = asyncio.get_running_loop().time()
        result = await cancel(store, job)
        elapsed = asyncio.get_running_loop().time() - started
    finally:
        await pool.close()
        await proxy.stop()

    assert result.outcome == CancellationOutcome.CANCELED_WHILE_QUEUED
    # One reply waited for: about one delay; the old transaction waited for six.
    assert delay <= elapsed < 2 * delay, f"{elapsed:.3f}s for a {delay}s round trip"


# -- bulk cancel: one request per export, grouped under a batch ------------------------------------------


async def _batch(api_store, job, batch_id, **kw):
    return await api_store.record_cancellation_batch(
        tenant_id=job.tenant_id,
        batch_id=batch_id,
        requested_by="sam.ops",
        reason="contract ended",
        destination_id=job.destination_id,
        **{"list_name": None, **kw},
    )


async def test_a_batch_covers_the_live_exports_of_its_filter_fixed_when_recorded(factory, api_store):
    queued = await factory.queued()
    tenant, destination = queued.tenant_id, queued.destination_id
    running, _ = await factory.running(await factory.queued(tenant, destination))
    delivering, _ = await factory.delivering(await factory.queued(tenant, destination))
    other_list = await factory.queued(tenant, destination, list_name="vip")
    ended, _ = await factory.in_status(JobStatus.STOPPED, job=await factory.queued(tenant, destination))
    elsewhere = await factory.queued(tenant, await factory.destination(tenant, name="partner-new"))

    batch, created = await _batch(api_store, queued, uuid.uuid4())
    main_only, _ = await _batch(api_store, queued, uuid.uuid4(), list_name="main")
    later = await factory.queued(tenant, destination)

    assert created and batch.matched == 4 and main_only.matched == 3
    covered = set(await api_store.batch_jobs_without_request(tenant, batch.id))
    assert covered == {queued.id, running.id, delivering.id, other_list.id}
    assert later.id not in covered and ended.id not in covered and elsewhere.id not in covered
    again, created_again = await _batch(api_store, queued, batch.id)
    assert (again, created_again) == (batch, False)


async def test_each_export_of_a_batch_gets_its_own_request_through_the_ledger(factory, api_store):
    from service.bulk import request_id_for

    queued = await factory.queued()
    running, attempt = await factory.running(await factory.queued(queued.tenant_id, queued.destination_id))
    delivering, _ = await factory.delivering(await factory.queued(queued.tenant_id, queued.destination_id))
    batch, _ = await _batch(api_store, queued, uuid.uuid4())
    pending = await api_store.batch_jobs_without_request(queued.tenant_id, batch.id)

    results = await api_store.request_cancellations(
        tenant_id=queued.tenant_id,
        batch_id=batch.id,
        requests=[(j, request_id_for(batch.id, j)) for j in pending],
        requested_by="sam.ops",
        reason="contract ended",
    )

    by_job = {r.request.job_id: r for r in results if r.request}
    assert by_job[queued.id].outcome == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert by_job[running.id].outcome == CancellationOutcome.STOP_REQUESTED
    assert by_job[delivering.id].outcome == CancellationOutcome.TOO_LATE
    assert all(
        r.request.batch_id == batch.id and r.request.reason == "contract ended" for r in by_job.values()
    )
    assert (await factory.job(queued.id)).cancellation_request_id == request_id_for(batch.id, queued.id)
    assert (await factory.job(running.id)).stop_request_id == request_id_for(batch.id, running.id)
    assert await api_store.batch_jobs_without_request(queued.tenant_id, batch.id) == []
    assert await api_store.batch_outcomes(queued.tenant_id, batch.id) == {
        CancellationOutcome.CANCELED_WHILE_QUEUED: 1,
        CancellationOutcome.STOP_REQUESTED: 1,
        CancellationOutcome.TOO_LATE: 1,
    }


async def test_a_busy_export_of_a_batch_records_nothing_and_a_retry_decides_only_it(factory, kit, api_store):
    from service.bulk import request_id_for

    free = await factory.queued()
    held = await factory.queued(free.tenant_id, free.destination_id)
    after = await factory.queued(free.tenant_id, free.destination_id)  # queued behind the Busy one
    batch, _ = await _batch(api_store, free, uuid.uuid4())
    claim = await kit.hold("exports_worker")
    assert await claim.run("claim_if_queued", claim_params(held, uuid.uuid4()))

    def pairs(jobs):
        return [(j, request_id_for(batch.id, j)) for j in jobs]

    first = await api_store.request_cancellations(
        tenant_id=free.tenant_id,
        batch_id=batch.id,
        requests=pairs(await api_store.batch_jobs_without_request(free.tenant_id, batch.id)),
        requested_by="sam.ops",
        reason="contract ended",
        lock_timeout="200ms",
    )
    outcomes = {r.request_id: r.outcome for r in first}
    assert outcomes[request_id_for(batch.id, held.id)] == CancellationOutcome.BUSY
    assert outcomes[request_id_for(batch.id, free.id)] == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert outcomes[request_id_for(batch.id, after.id)] == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert await recorded_with_id(factory, request_id_for(batch.id, held.id)) == 0
    assert await api_store.batch_jobs_without_request(free.tenant_id, batch.id) == [held.id]

    await claim.commit()
    retry = await api_store.request_cancellations(
        tenant_id=free.tenant_id,
        batch_id=batch.id,
        requests=pairs(await api_store.batch_jobs_without_request(free.tenant_id, batch.id)),
        requested_by="sam.ops",
        reason="contract ended",
    )
    assert [r.outcome for r in retry] == [CancellationOutcome.STOP_REQUESTED]
    # Submitting every export again records nothing twice: the recorded ones replay.
    again = await api_store.request_cancellations(
        tenant_id=free.tenant_id,
        batch_id=batch.id,
        requests=pairs([free.id, held.id, after.id]),
        requested_by="sam.ops",
        reason="contract ended",
    )
    assert all(r.replayed for r in again)
    rows = await factory.admin(
        "SELECT count(*) AS n FROM cancellation_requests WHERE batch_id = %(b)s", {"b": batch.id}
    )
    assert rows[0]["n"] == 3
