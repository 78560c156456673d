"""After a StopRequested is recorded, the API signals the attempt's workflow (found from the row) with
``stop_requested(request_id)``, on a real Temporal test server. A failed signal is logged, not an error:
cutoff 2, not the signal, is what guarantees the stop."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from temporalio import workflow
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from service.signals import TemporalStopSignaller
from tests.api.conftest import cancel_body, client_for


@workflow.defn(name="StopListenerForApiTest")
class StopListener:
    """Stands where an ExportWorkflow would: waits for the stop signal and returns what it heard."""

    def __init__(self) -> None:
        self.heard: list[str] = []

    @workflow.run
    async def run(self) -> list[str]:
        await workflow.wait_condition(lambda: bool(self.heard))
        return self.heard

    @workflow.signal(name="stop_requested")
    async def stop_requested(self, request_id: str) -> None:
        self.heard.append(request_id)


@pytest.fixture(scope="module")
def temporal(ts_env: WorkflowEnvironment) -> WorkflowEnvironment:
    """The session's time-skipping test server (tests/fix_temporal.py)."""
    return ts_env


async def test_a_recorded_stop_request_is_signalled_to_the_attempts_workflow(
    make_app, temporal, factory, worker_store, acme
):
    queue = f"api-test-{uuid.uuid4()}"
    workflow_id = f"export-test-{uuid.uuid4()}"
    job = await factory.queued(acme.id, acme.destination_id)
    attempt = uuid.uuid4()
    await worker_store.claim_if_queued(job.id, job.version, attempt, "worker-3", workflow_id=workflow_id)
    request_id = uuid.uuid4()
    async with Worker(
        temporal.client,
        task_queue=queue,
        workflows=[StopListener],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await temporal.client.start_workflow(StopListener.run, id=workflow_id, task_queue=queue)
        async with client_for(make_app(signaller=temporal.client)) as client:
            r = await client.post(
                f"/exports/{job.id}/cancellations", json=cancel_body(request_id), headers=acme.operator
            )
        assert r.status_code == 202
        assert await asyncio.wait_for(handle.result(), timeout=30) == [str(request_id)]


async def test_a_failed_signal_is_logged_and_the_answer_is_still_202(
    make_app, temporal, factory, worker_store, acme, caplog
):
    job = await factory.queued(acme.id, acme.destination_id)
    await worker_store.claim_if_queued(
        job.id, job.version, uuid.uuid4(), "worker-3", workflow_id=f"no-such-workflow-{uuid.uuid4()}"
    )
    signaller = TemporalStopSignaller(temporal.client)

    with caplog.at_level(logging.WARNING, logger="service.signals"):
        async with client_for(make_app(signaller=signaller)) as client:
            r = await client.post(
                f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator
            )

    assert r.status_code == 202
    assert r.json()["outcome"] == "StopRequested"
    assert any("stop signal" in rec.getMessage() for rec in caplog.records)
    assert (await factory.job(job.id)).stop_request_id is not None
