"""Cutoff 2 on the real server: a stop request and the delivery authorization compete for one Running row.

Same technique as cutoff 1: the first writer's transaction is held open on its own connection, the second
is proven to wait on it with ``pg_blocking_pids``, then the first commits or rolls back. The authorization,
not the watcher, is what keeps a stop request that committed first from letting anything be delivered.
"""

from __future__ import annotations

import asyncio

import pytest

from domain.models import AuthorizationResult, CancellationOutcome, JobStatus
from tests.db.race import (
    Gate,
    RolledBackOnPurpose,
    authorize,
    authorize_params,
    cancel,
    matched,
    still_waiting,
)

LONG_LOCK_TIMEOUT = "30s"


async def test_authorization_waits_for_stop_request_then_reports_stop_recorded(factory, kit):
    job, attempt = await factory.running()
    api = await kit.solo("exports_api")
    gate = Gate()
    stopping = asyncio.create_task(cancel(api.store, job, before_commit=gate))
    await gate.wait_entered()

    worker = await kit.solo("exports_worker")
    authorizing = asyncio.create_task(authorize(worker.store, job, attempt))
    await kit.wait_until_blocked_by(worker.pid, api.pid)
    await still_waiting(authorizing)

    gate.commit()
    stop = await stopping
    assert stop.outcome == CancellationOutcome.STOP_REQUESTED
    assert await authorizing == AuthorizationResult.STOP_RECORDED

    row = await factory.job(job.id)
    assert (row.status, row.stop_request_id, row.delivery_authorized_at) == (
        JobStatus.RUNNING,
        stop.request_id,
        None,
    )
    assert await factory.event_kinds(job.id) == ["Claimed"]


async def test_stop_request_waits_for_authorization_then_is_too_late(factory, kit):
    job, attempt = await factory.running()
    cutoff = await kit.hold("exports_worker")
    assert matched(await cutoff.run("authorize_delivery_if_running", authorize_params(job, attempt)))

    api = await kit.solo("exports_api")
    stopping = asyncio.create_task(cancel(api.store, job, lock_timeout=LONG_LOCK_TIMEOUT))
    await kit.wait_until_blocked_by(api.pid, cutoff.pid)
    await still_waiting(stopping)

    await cutoff.commit()
    stop = await stopping

    assert stop.outcome == CancellationOutcome.TOO_LATE
    assert stop.request is not None
    assert stop.request.found_status == JobStatus.DELIVERING
    assert stop.request.found_delivery_authorized_at is not None
    row = await factory.job(job.id)
    assert (row.status, row.stop_request_id) == (JobStatus.DELIVERING, None)  # recorded, not obeyed


async def test_stop_request_is_recorded_when_the_held_authorization_rolls_back(factory, kit, worker_store):
    job, attempt = await factory.running()
    cutoff = await kit.hold("exports_worker")
    assert matched(await cutoff.run("authorize_delivery_if_running", authorize_params(job, attempt)))

    api = await kit.solo("exports_api")
    stopping = asyncio.create_task(cancel(api.store, job, lock_timeout=LONG_LOCK_TIMEOUT))
    await kit.wait_until_blocked_by(api.pid, cutoff.pid)
    await cutoff.rollback()

    stop = await stopping
    assert stop.outcome == CancellationOutcome.STOP_REQUESTED
    # The worker's retry of cutoff 2 now meets the recorded stop request.
    assert await authorize(worker_store, job, attempt) == AuthorizationResult.STOP_RECORDED
    assert (await factory.job(job.id)).status == JobStatus.RUNNING


async def test_authorization_succeeds_when_the_held_stop_request_rolls_back(factory, kit, api_store):
    job, attempt = await factory.running()
    api = await kit.solo("exports_api")
    gate = Gate()
    stopping = asyncio.create_task(cancel(api.store, job, before_commit=gate))
    await gate.wait_entered()

    worker = await kit.solo("exports_worker")
    authorizing = asyncio.create_task(authorize(worker.store, job, attempt))
    await kit.wait_until_blocked_by(worker.pid, api.pid)

    gate.abort()
    with pytest.raises(RolledBackOnPurpose):
        await stopping
    assert await authorizing == AuthorizationResult.AUTHORIZED

    row = await factory.job(job.id)
    assert (row.status, row.stop_request_id) == (JobStatus.DELIVERING, None)
    assert row.expected_file_name == f"contacts-{job.delivery_key}.csv"
    assert row.expected_file_bytes == 1234
    assert await api_store.job_cancellation_requests(job.tenant_id, job.id) == []
    assert await factory.event_kinds(job.id) == ["Claimed", "DeliveryAuthorized"]


async def test_a_second_stop_request_is_recorded_as_already_requested(factory, api_store):
    job, _ = await factory.running()
    first = await cancel(api_store, job)
    second = await cancel(api_store, job, requested_by="kim.ops")

    assert (first.outcome, second.outcome) == (
        CancellationOutcome.STOP_REQUESTED,
        CancellationOutcome.STOP_ALREADY_REQUESTED,
    )
    assert (await factory.job(job.id)).stop_request_id == first.request_id  # the first one stands
