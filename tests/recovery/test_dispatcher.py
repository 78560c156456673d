"""The outbox dispatcher against a real PostgreSQL and the real time-skipping Temporal server: NOTIFY wakes
it, polling backs it up, a retried row reaches the same workflow once, and two dispatchers running at once
publish each row once. Rows are leased and committed before any start, starts run concurrently within a
bound, and a dispatcher that dies (a real SIGKILL) or stalls after taking its batch leaves it to another
once the lease passes, with the same message ID and one workflow. Each start continues the trace of the
request that wrote the row and records the outbox lag. Interleavings are forced with hooks while the rows
are leased, and a passed lease is the row's timestamp set in the past, never a sleep."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest
from temporalio.client import WorkflowExecutionStatus

from db.pool import open_pool
from db.store import JobStore
from domain.models import OutboxMessage
from runtime.dispatcher import OutboxDispatcher
from settings import Settings
from workflows.export import export_workflow_id

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
        JobStore(second_pool),
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


async def _next_for(queue: asyncio.Queue[OutboxMessage], job_id: uuid.UUID) -> OutboxMessage:
    while True:
        msg = await queue.get()
        if msg.job_id == job_id:
            return msg
