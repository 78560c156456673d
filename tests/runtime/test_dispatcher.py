"""The outbox dispatcher against a real PostgreSQL and the real time-skipping Temporal server: NOTIFY wakes
it, polling backs it up, a retried row reaches the same workflow once, and two dispatchers running at once
publish each row once. Rows are leased and committed before any start, starts run concurrently within a
bound, and a dispatcher that dies (a real SIGKILL) or stalls after taking its batch leaves it to another
once the lease passes, with the same message ID and one workflow. Each start continues the trace of the
request that wrote the row and records the outbox lag. Interleavings are forced with hooks while the rows
are leased, and a passed lease is the row's timestamp set in the past, never a sleep."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from db.pool import open_pool
from db.stores.outbox import DispatcherStore
from domain.models import OutboxMessage
from observability import tracing
from observability.metrics import ExportMetrics, get_metrics, set_metrics
from observability.temporal import temporal_interceptors
from runtime.dispatcher import OutboxDispatcher
from settings import Settings
from workflows.export import export_workflow_id

ROOT = Path(__file__).resolve().parents[2]

WAIT = 15  # seconds: a bound on waiting for an outcome, never a delay that decides one


@pytest.fixture
def task_queue() -> str:
    # No worker polls it: a started ExportWorkflow waits there, which is all these tests need.
    return f"dispatch-{uuid.uuid4().hex[:8]}"


async def outbox_rows(factory, job_id):
    return await factory.admin(
        "SELECT message_id, published_at FROM outbox WHERE job_id = %(id)s ORDER BY created_at",
        {"id": job_id},
    )


async def run_in_background(dispatcher: OutboxDispatcher):
    stop = asyncio.Event()
    task = asyncio.create_task(dispatcher.run(stop))
    await asyncio.wait_for(dispatcher.ready.wait(), WAIT)
    return stop, task


async def test_a_notify_wakes_the_dispatcher_without_waiting_for_a_poll(
    client, dispatcher_store, factory, database, task_queue
):
    started: asyncio.Queue[OutboxMessage] = asyncio.Queue()

    async def after_start(msg: OutboxMessage) -> None:
        await started.put(msg)

    # A poll interval of an hour: only the notification can bring the row out in time.
    dispatcher = OutboxDispatcher(
        dispatcher_store,
        client,
        Settings(task_queue=task_queue),
        listen_url=database.app_url,
        poll_seconds=3600,
        after_start=after_start,
    )
    stop, task = await run_in_background(dispatcher)
    try:
        job = await factory.queued()
        msg = await asyncio.wait_for(_next_for(started, job.id), WAIT)
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT)

    [row] = await outbox_rows(factory, job.id)
    assert row["message_id"] == msg.message_id and row["published_at"] is not None
    described = await client.get_workflow_handle(export_workflow_id(job.id, msg.message_id)).describe()
    assert described.status == WorkflowExecutionStatus.RUNNING
    assert described.task_queue == task_queue


async def test_polling_publishes_when_there_is_no_listener(client, dispatcher_store, factory, task_queue):
    started: asyncio.Queue[OutboxMessage] = asyncio.Queue()
    dispatcher = OutboxDispatcher(
        dispatcher_store,
        client,
        Settings(task_queue=task_queue),
        listen_url=None,
        poll_seconds=0.1,
        after_start=started.put,
    )
    stop, task = await run_in_background(dispatcher)
    try:
        job = await factory.queued()
        await asyncio.wait_for(_next_for(started, job.id), WAIT)
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT)
    assert all(r["published_at"] is not None for r in await outbox_rows(factory, job.id))


async def test_a_row_retried_after_an_uncertain_publish_reaches_the_same_workflow_once(
    client, dispatcher_store, factory, task_queue
):
    job = await factory.queued()
    runs: list[str] = []
    fail_once = {"armed": True}

    async def after_start(msg: OutboxMessage) -> None:
        if msg.job_id != job.id:
            return
        handle = client.get_workflow_handle(export_workflow_id(msg.job_id, msg.message_id))
        runs.append((await handle.describe()).run_id)
        if fail_once.pop("armed", False):
            # The workflow started, but the dispatcher never marks the row: its answer was lost.
            raise ConnectionError("lost after the start")

    dispatcher = OutboxDispatcher(
        dispatcher_store, client, Settings(task_queue=task_queue), listen_url=None, after_start=after_start
    )
    await dispatcher.dispatch_once()
    [row] = await outbox_rows(factory, job.id)
    assert row["published_at"] is None  # stays in the outbox, with its message ID, for the retry

    await dispatcher.dispatch_once()

    [row] = await outbox_rows(factory, job.id)
    assert row["published_at"] is not None
    assert len(runs) == 2 and runs[0] == runs[1]  # USE_EXISTING: the same run, started once


async def test_a_row_retried_after_its_workflow_ended_counts_as_published_and_starts_nothing(
    client, dispatcher_store, factory, task_queue
):
    job = await factory.queued()
    [row] = await outbox_rows(factory, job.id)
    handle = client.get_workflow_handle(export_workflow_id(job.id, row["message_id"]))
    fail_once = {"armed": True}

    async def after_start(msg: OutboxMessage) -> None:
        if msg.job_id == job.id and fail_once.pop("armed", False):
            await handle.terminate(reason="test: the run ended before the row was marked")
            raise ConnectionError("lost after the start")

    dispatcher = OutboxDispatcher(
        dispatcher_store, client, Settings(task_queue=task_queue), listen_url=None, after_start=after_start
    )
    await dispatcher.dispatch_once()
    first = await handle.describe()
    assert first.status == WorkflowExecutionStatus.TERMINATED

    await dispatcher.dispatch_once()  # REJECT_DUPLICATE: WorkflowAlreadyStarted, taken as published

    [row] = await outbox_rows(factory, job.id)
    assert row["published_at"] is not None
    again = await handle.describe()
    assert (again.run_id, again.status) == (first.run_id, WorkflowExecutionStatus.TERMINATED)


async def test_two_dispatchers_at_once_publish_each_row_once(
    client, dispatcher_store, factory, database, task_queue
):
    jobs = [await factory.queued() for _ in range(6)]
    second_pool = await open_pool(database.app_url, "exports_dispatcher", max_size=2)
    published: Counter[uuid.UUID] = Counter()
    by_dispatcher: dict[str, set[uuid.UUID]] = {"a": set(), "b": set()}
    a_holds_batch = asyncio.Event()
    release_a = asyncio.Event()

    def recorder(name: str):
        async def after_start(msg: OutboxMessage) -> None:
            published[msg.message_id] += 1
            by_dispatcher[name].add(msg.message_id)

        return after_start

    async def hold_a(msg: OutboxMessage) -> None:
        if not a_holds_batch.is_set():
            a_holds_batch.set()  # A has leased its batch and is starting its workflows
            await release_a.wait()

    a = OutboxDispatcher(
        dispatcher_store,
        client,
        Settings(task_queue=task_queue, dispatcher_batch=3),
        listen_url=None,
        passes=1,  # one batch in flight: A takes no second batch while its first is held
        before_publish=hold_a,
        after_start=recorder("a"),
    )
    b = OutboxDispatcher(
        DispatcherStore(second_pool),
        client,
        Settings(task_queue=task_queue),
        listen_url=None,
        after_start=recorder("b"),
    )
    try:
        a_pass = asyncio.create_task(a.dispatch_once())
        await asyncio.wait_for(a_holds_batch.wait(), WAIT)
        await asyncio.wait_for(b.dispatch_once(), WAIT)  # skips A's leased rows, takes the rest
        release_a.set()
        await asyncio.wait_for(a_pass, WAIT)
    finally:
        await second_pool.close()

    assert by_dispatcher["a"] and by_dispatcher["b"]
    assert not by_dispatcher["a"] & by_dispatcher["b"]
    assert set(published.values()) == {1}
    for job in jobs:
        [row] = await outbox_rows(factory, job.id)
        assert published[row["message_id"]] == 1 and row["published_at"] is not None


# -- the publishing lease ----------------------------------------------------------------------------------


async def lease_of(factory, job_id) -> dict:
    [row] = await factory.admin(
        "SELECT message_id, published_at, publishing_until,"
        " coalesce(publishing_until > clock_timestamp(), false) AS leased"
        " FROM outbox WHERE job_id = %(id)s",
        {"id": job_id},
    )
    return row


async def let_lease_pass(factory, job_id) -> None:
    """The lease's end, as the row's own timestamp moved into the past (never a sleep)."""
    await factory.admin(
        "UPDATE outbox SET publishing_until = clock_timestamp() - interval '1 second'"
        " WHERE job_id = %(id)s AND published_at IS NULL AND publishing_until IS NOT NULL",
        {"id": job_id},
    )


async def workflow_runs(client: Client, job_id, message_id) -> str | None:
    """The run ID of the wake-up's workflow, or ``None`` when it was never started."""
    try:
        return (await client.get_workflow_handle(export_workflow_id(job_id, message_id)).describe()).run_id
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def test_rows_are_leased_and_committed_before_their_workflows_start_concurrently(
    client, dispatcher_store, factory, database, task_queue
):
    jobs = [await factory.queued() for _ in range(4)]
    ours = {job.id for job in jobs}
    inside: set[uuid.UUID] = set()
    all_inside = asyncio.Event()
    release = asyncio.Event()

    async def hold(msg: OutboxMessage) -> None:
        if msg.job_id in ours:
            inside.add(msg.job_id)
            if inside == ours:
                all_inside.set()  # all four starts are in flight at once
            await release.wait()

    dispatcher = OutboxDispatcher(
        dispatcher_store,
        client,
        Settings(task_queue=task_queue, dispatcher_batch=10),
        listen_url=None,
        before_publish=hold,
    )
    run = asyncio.create_task(dispatcher.dispatch_once())
    try:
        await asyncio.wait_for(all_inside.wait(), WAIT)
        # While the starts are in flight: the leases are committed (another session sees them), no row is
        # locked, and the dispatcher's connections sit in no transaction.
        for job in jobs:
            row = await lease_of(factory, job.id)
            assert row["leased"] and row["published_at"] is None
        locked = await factory.admin(
            "SELECT message_id FROM outbox WHERE job_id = ANY(%(ids)s) FOR UPDATE NOWAIT",
            {"ids": [job.id for job in jobs]},
        )
        assert len(locked) == 4
        in_transaction = await factory.admin(
            "SELECT count(*) AS n FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = 'fenced-exports:exports_dispatcher'"
            " AND state LIKE 'idle in transaction%%'"
        )
        assert in_transaction[0]["n"] == 0
    finally:
        release.set()
        await asyncio.wait_for(run, WAIT)
    for job in jobs:
        row = await lease_of(factory, job.id)
        assert row["published_at"] is not None
        assert await workflow_runs(client, job.id, row["message_id"]) is not None


async def test_starts_in_flight_never_exceed_the_concurrency(client, dispatcher_store, factory, task_queue):
    jobs = {(await factory.queued()).id for _ in range(6)}
    in_flight = 0
    most = 0

    async def enter(msg: OutboxMessage) -> None:
        nonlocal in_flight, most
        if msg.job_id in jobs:
            in_flight += 1
            most = max(most, in_flight)
            for _ in range(20):  # give every other start the chance to enter, were it allowed to
                await asyncio.sleep(0)

    async def leave(msg: OutboxMessage) -> None:
        nonlocal in_flight
        if msg.job_id in jobs:
            in_flight -= 1

    dispatcher = OutboxDispatcher(
        dispatcher_store,
        client,
        Settings(task_queue=task_queue, dispatcher_batch=10),
        listen_url=None,
        concurrency=2,
        before_publish=enter,
        after_start=leave,
    )
    await asyncio.wait_for(dispatcher.dispatch_once(), WAIT)
    assert most == 2
    for job_id in jobs:
        assert (await lease_of(factory, job_id))["published_at"] is not None


async def test_a_failed_start_gives_its_row_back_at_once_with_its_message_id(
    client, dispatcher_store, factory, task_queue
):
    job = await factory.queued()
    before = await lease_of(factory, job.id)

    async def refuse(msg: OutboxMessage) -> None:
        if msg.job_id == job.id:
            raise ConnectionError("Temporal did not answer")

    failing = OutboxDispatcher(
        dispatcher_store, client, Settings(task_queue=task_queue), listen_url=None, before_publish=refuse
    )
    await failing.dispatch_once()
    row = await lease_of(factory, job.id)
    assert row["published_at"] is None and row["publishing_until"] is None  # no lease to wait out

    await OutboxDispatcher(
        dispatcher_store, client, Settings(task_queue=task_queue), listen_url=None
    ).dispatch_once()
    row = await lease_of(factory, job.id)
    assert row["message_id"] == before["message_id"] and row["published_at"] is not None
    assert await workflow_runs(client, job.id, row["message_id"]) is not None


async def test_a_dispatcher_killed_after_taking_its_batch_leaves_it_to_another_once_the_lease_passes(
    ts_env, client, dispatcher_store, factory, database, task_queue
):
    job = await factory.queued()
    marker = Path(tempfile.mkdtemp(prefix="dying-dispatcher-")) / "taken"
    env = {
        **os.environ,
        "EXPORTS_DATABASE_URL": database.app_url,
        "EXPORTS_TASK_QUEUE": task_queue,
        "PYTHONPATH": str(ROOT),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.runtime.dying_dispatcher",
        "--job",
        str(job.id),
        "--marker",
        str(marker),
        "--temporal",
        ts_env.client.service_client.config.target_host,
        cwd=ROOT,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(WAIT * 2):
            while not marker.exists():
                assert process.returncode is None, "the dispatcher process ended before it took the row"
                await asyncio.sleep(0.05)
    finally:
        process.send_signal(signal.SIGKILL)  # dies between taking (committed) and starting
        await process.wait()
    message_id = uuid.UUID(marker.read_text())

    started: list[OutboxMessage] = []
    other = OutboxDispatcher(
        dispatcher_store,
        client,
        Settings(task_queue=task_queue),
        listen_url=None,
        after_start=lambda msg: _record(started, msg),
    )
    await other.dispatch_once()
    row = await lease_of(factory, job.id)
    assert row["leased"] and row["published_at"] is None  # the dead dispatcher's lease still holds it
    assert job.id not in {m.job_id for m in started}
    assert await workflow_runs(client, job.id, message_id) is None  # nothing was started

    await let_lease_pass(factory, job.id)
    await other.dispatch_once()

    [retried] = [m for m in started if m.job_id == job.id]
    assert retried.message_id == message_id  # the same message ID, so the same workflow ID
    row = await lease_of(factory, job.id)
    assert row["message_id"] == message_id and row["published_at"] is not None
    assert await workflow_runs(client, job.id, message_id) is not None
    assert await factory.outbox_count(job.id) == 1


async def test_a_stalled_dispatcher_whose_lease_passed_reaches_the_same_workflow_and_marks_nothing(
    client, dispatcher_store, factory, database, task_queue
):
    job = await factory.queued()
    stalled = asyncio.Event()
    resume = asyncio.Event()
    runs: dict[str, str] = {}

    async def stall(msg: OutboxMessage) -> None:
        if msg.job_id == job.id:
            stalled.set()
            await resume.wait()  # as a paused process: its lease passes meanwhile

    def run_id_as(name: str):
        async def after_start(msg: OutboxMessage) -> None:
            if msg.job_id == job.id:
                runs[name] = await workflow_runs(client, msg.job_id, msg.message_id)

        return after_start

    second_pool = await open_pool(database.app_url, "exports_dispatcher", max_size=2)
    a = OutboxDispatcher(
        dispatcher_store,
        client,
        Settings(task_queue=task_queue),
        listen_url=None,
        before_publish=stall,
        after_start=run_id_as("a"),
    )
    b = OutboxDispatcher(
        DispatcherStore(second_pool),
        client,
        Settings(task_queue=task_queue),
        listen_url=None,
        after_start=run_id_as("b"),
    )
    try:
        a_pass = asyncio.create_task(a.dispatch_once())
        await asyncio.wait_for(stalled.wait(), WAIT)
        await let_lease_pass(factory, job.id)
        await asyncio.wait_for(b.dispatch_once(), WAIT)  # takes the row again and publishes it
        assert (await lease_of(factory, job.id))["published_at"] is not None
        resume.set()
        await asyncio.wait_for(a_pass, WAIT)  # A's start reaches B's workflow; its mark matches nothing
    finally:
        await second_pool.close()

    assert runs["a"] == runs["b"] is not None  # USE_EXISTING: one workflow, started once
    assert b.published_count >= 1 and a.published_count == 0


# -- the trace and the lag ---------------------------------------------------------------------------------


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    previous = get_metrics()
    set_metrics(ExportMetrics(CollectorRegistry()))
    exporter = InMemorySpanExporter()
    tracing.setup_tracing("fenced-exports-test", exporter=exporter, set_global=False)
    yield exporter
    tracing.shutdown_tracing()
    set_metrics(previous)


async def test_each_start_continues_the_trace_of_the_request_that_wrote_the_row_and_records_the_lag(
    spans, ts_env, factory, dispatcher_store, task_queue
):
    with tracing.tracer().start_as_current_span("POST /exports") as request_span:
        job = await factory.queued()  # the creation statement stores this span's traceparent
    trace_id = request_span.get_span_context().trace_id
    [row] = await factory.admin("SELECT traceparent FROM outbox WHERE job_id = %(id)s", {"id": job.id})
    assert row["traceparent"] is not None and row["traceparent"].split("-")[1] == format(trace_id, "032x")

    traced_client = Client(**{**ts_env.client.config(), "interceptors": temporal_interceptors()})
    dispatcher = OutboxDispatcher(
        dispatcher_store, traced_client, Settings(task_queue=task_queue), listen_url=None
    )
    published = await dispatcher.dispatch_once()

    starts = [s for s in spans.get_finished_spans() if s.name == "StartWorkflow:ExportWorkflow"]
    assert starts and all(s.context.trace_id == trace_id for s in starts)
    lag = get_metrics().outbox_lag.collect()[0].samples
    count = next(s.value for s in lag if s.name.endswith("_count"))
    total = next(s.value for s in lag if s.name.endswith("_sum"))
    assert count == published >= 1 and total > 0


async def _record(seen: list[OutboxMessage], msg: OutboxMessage) -> None:
    seen.append(msg)


async def _next_for(queue: asyncio.Queue[OutboxMessage], job_id: uuid.UUID) -> OutboxMessage:
    while True:
        msg = await queue.get()
        if msg.job_id == job_id:
            return msg
