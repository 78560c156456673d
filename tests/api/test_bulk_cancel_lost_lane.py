"""A bulk cancel whose lane loses its connection (issue 23, point 7): the API counts what the ledger
recorded, never Busy for a segment whose requests committed, and signals every committed stop request
that no submission has signalled yet, a replay with the same batch ID included, and none twice.

The API's ``exports_api`` store reaches PostgreSQL through a TCP proxy that lets the lane's pipeline commit
and then swallows its answer (optionally cutting every connection and refusing new ones, so the re-read
fails too); the stop signals go to workflows on the real Temporal test server that stand where the
exports' workflows would."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import pytest
from fastapi import FastAPI
from temporalio import workflow
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from api.app import create_app
from db.pool import open_pool
from db.stores.api import ApiStore
from service.bulk import request_id_for
from service.exports import Exports
from service.signals import TemporalStopSignaller
from settings import Settings
from testbed.tcp_proxy import TcpProxy
from tests.api.conftest import client_for, counted, increase, make_tenant
from tests.db.test_lost_responses import through_proxy
from tests.support.eventually import eventually

# Only cancel_and_record's text carries this fragment: the lane's pipeline, not the batch's other statements.
LEDGER = b"'CanceledWhileQueued'"


@workflow.defn(name="BulkStopListenerForApiTest")
class StopListener:
    """Stands where an ExportWorkflow would: records every stop signal it hears, until cancelled."""

    def __init__(self) -> None:
        self.heard: list[str] = []

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.signal(name="stop_requested")
    async def stop_requested(self, request_id: str) -> None:
        self.heard.append(request_id)

    @workflow.query(name="heard")
    def heard_ids(self) -> list[str]:
        return self.heard


@pytest.fixture(scope="module")
def temporal(ts_env: WorkflowEnvironment) -> WorkflowEnvironment:
    """The session's time-skipping test server (tests/fix_temporal.py)."""
    return ts_env


@pytest.fixture
def proxy(database) -> Iterator[TcpProxy]:
    target = urlsplit(database.app_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432).start()
    yield proxy
    proxy.stop()


@pytest.fixture
async def proxied_app(database, proxy, reconciler_store, temporal) -> AsyncIterator[Callable[[], FastAPI]]:
    """The API over an ``exports_api`` pool whose every connection (the lanes' too) goes through the proxy."""
    pool = await open_pool(
        through_proxy(database.app_url, proxy.port),
        "exports_api",
        min_size=1,
        max_size=1,
        name="proxied-api",
        checkout_timeout=1.0,
    )

    def build() -> FastAPI:
        settings = Settings(temporal_ui_url="http://ui.test:8233")
        exports = Exports(
            ApiStore(pool),
            reconciler_store,
            TemporalStopSignaller(temporal.client),
            temporal_ui_url=settings.temporal_ui_url,
            cancel_lock_timeout="300ms",
        )
        return create_app(settings, exports=exports)

    yield build
    await pool.close()


@pytest.fixture
async def listeners(temporal) -> AsyncIterator[Callable[[], Any]]:
    """Start a StopListener per call on a worker of its own; every one is terminated at the end."""
    queue = f"bulk-stop-{uuid.uuid4()}"
    handles: list[WorkflowHandle[Any, Any]] = []
    async with Worker(
        temporal.client,
        task_queue=queue,
        workflows=[StopListener],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):

        async def start() -> WorkflowHandle[Any, Any]:
            handle = await temporal.client.start_workflow(
                StopListener.run, id=f"export-bulk-{uuid.uuid4()}", task_queue=queue
            )
            handles.append(handle)
            return handle

        yield start
        for handle in handles:
            await handle.terminate()


async def running_under(factory, worker_store, keys, handle) -> UUID:
    """A Running export of ``keys``' destination whose attempt recorded ``handle`` as its workflow."""
    job = await factory.queued(keys.id, keys.destination_id)
    await worker_store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-3", workflow_id=handle.id)
    return job.id


async def heard(handle) -> list[str]:
    return await handle.query(StopListener.heard_ids)


def bulk_body(keys, batch_id: UUID) -> dict[str, Any]:
    return {"batch_id": str(batch_id), "destination_id": str(keys.destination_id), "reason": "contract ended"}


COUNTED = {"source": "api"}


def answers(before, after, outcome: str) -> float:
    return increase(before, after, "fenced_exports_cancellations_total", outcome=outcome, **COUNTED)


async def test_a_lane_cut_after_its_segment_committed_is_counted_as_recorded_and_its_stops_signalled(
    proxied_app, proxy, listeners, factory, worker_store, database
):
    keys = await make_tenant(factory, database, "lost-lane")
    await factory.queued(keys.id, keys.destination_id)
    workflows = [await listeners(), await listeners()]
    running = [await running_under(factory, worker_store, keys, h) for h in workflows]
    batch_id = uuid.uuid4()
    async with client_for(proxied_app()) as client:
        before = await counted(client)
        proxy.drop_next_reply_after(LEDGER)

        r = await client.post("/cancellation-batches", json=bulk_body(keys, batch_id), headers=keys.operator)

        assert proxy.fired.is_set(), "the fault never fired: the test would prove nothing"
        assert r.status_code == 201, r.text
        assert r.json()["outcomes"] == {"CanceledWhileQueued": 1, "StopRequested": 2}
        after = await counted(client)
    assert answers(before, after, "StopRequested") == 2
    assert answers(before, after, "CanceledWhileQueued") == 1
    assert answers(before, after, "Busy") == 0
    assert increase(before, after, "fenced_exports_busy_answers_total", operation="cancel") == 0
    written = {"statement": "cancel_and_record", "result": "written"}
    assert increase(before, after, "fenced_exports_transitions_total", **written) == 3
    for handle, job_id in zip(workflows, running, strict=True):
        expected = [str(request_id_for(batch_id, job_id))]
        assert await eventually(lambda h=handle: heard(h), "the stop signal") == expected


async def test_a_replay_signals_the_stop_requests_a_lost_lane_committed_and_none_twice(
    proxied_app, make_app, proxy, listeners, factory, worker_store, database, temporal
):
    keys = await make_tenant(factory, database, "lost-replay")
    await factory.queued(keys.id, keys.destination_id)
    workflows = [await listeners(), await listeners()]
    running = [await running_under(factory, worker_store, keys, h) for h in workflows]
    batch_id = uuid.uuid4()

    def partition() -> None:  # after the segment committed: its answer, and every re-read, are lost
        proxy.refuse_new_connections()
        proxy.close_all()

    proxy.drop_next_reply_after(LEDGER, on_drop=partition)
    async with client_for(proxied_app()) as lost:
        first = await lost.post(
            "/cancellation-batches", json=bulk_body(keys, batch_id), headers=keys.operator
        )
    assert proxy.fired.is_set()
    assert first.status_code == 503, first.text
    recorded = await factory.admin(
        "SELECT outcome, count(*) AS n FROM cancellation_requests WHERE batch_id = %(b)s GROUP BY outcome",
        {"b": batch_id},
    )
    assert {r["outcome"]: r["n"] for r in recorded} == {"CanceledWhileQueued": 1, "StopRequested": 2}
    assert [await heard(h) for h in workflows] == [[], []]  # committed, and nobody told the attempts

    # The client retries the same batch ID (here through another API process).
    async with client_for(make_app(signaller=temporal.client)) as client:
        before = await counted(client)
        replay = await client.post(
            "/cancellation-batches", json=bulk_body(keys, batch_id), headers=keys.operator
        )
        after = await counted(client)
        for handle, job_id in zip(workflows, running, strict=True):
            expected = [str(request_id_for(batch_id, job_id))]
            assert await eventually(lambda h=handle: heard(h), "the replay's stop signal") == expected
        again = await client.post(
            "/cancellation-batches", json=bulk_body(keys, batch_id), headers=keys.operator
        )

    assert replay.status_code == 200 and replay.json()["replayed"] is True, replay.text
    assert replay.json()["outcomes"] == {"CanceledWhileQueued": 1, "StopRequested": 2}
    assert answers(before, after, "StopRequested") == 2 and answers(before, after, "Busy") == 0
    assert again.status_code == 200
    signalled = await factory.admin(
        "SELECT s.request_id FROM cancellation_stop_signals s JOIN cancellation_requests r"
        " ON r.tenant_id = s.tenant_id AND r.id = s.request_id WHERE r.batch_id = %(b)s",
        {"b": batch_id},
    )
    assert sorted(r["request_id"] for r in signalled) == sorted(request_id_for(batch_id, j) for j in running)
    assert [await heard(h) for h in workflows] == [[str(request_id_for(batch_id, j))] for j in running]
