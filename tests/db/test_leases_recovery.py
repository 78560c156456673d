"""Leases and recovery on the real server (000 "Leases, Expiry, and Ownership", "Recovery"; test matrix rows
"Recovery interleavings", "A long build", "A paused attempt").

Expiry makes an attempt eligible for takeover; only a committed takeover ends its ownership. Each takeover
repeats every condition recovery's scan relied on, the lease included, so a renewal after the scan wins.
Lease ages are set on the row (the database clock decides), never with sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from uuid import UUID

import psycopg
import pytest

from db.stores.recovery import RecoveryStore
from domain.models import (
    AuthorizationResult,
    CancellationOutcome,
    DeliveryOutcome,
    EventKind,
    ExportJob,
    FailureCode,
    FinishResult,
    JobStatus,
    StopPoint,
)
from tests.db.race import authorize, authorize_params, cancel, matched, still_waiting
from tests.support.eventually import eventually

MAX_ATTEMPTS = 3
RUN = "recovery-run-1"


async def lease_current(store: RecoveryStore, job_id: UUID) -> bool:
    state = await store.read_ownership(job_id)
    assert state is not None
    return state.lease_current


async def events_of(store: RecoveryStore, job_id: UUID, kind: EventKind):
    return [e for e in await store.job_events(job_id) if e.kind == kind]


# The four takeovers, each as recovery would call it for the case it nominated.
Takeover = Callable[[RecoveryStore, ExportJob, UUID], Awaitable[bool]]


async def requeue(store: RecoveryStore, job: ExportJob, attempt: UUID) -> bool:
    return await store.requeue_expired_attempt(job.id, attempt, MAX_ATTEMPTS, RUN)


async def stop(store: RecoveryStore, job: ExportJob, attempt: UUID) -> bool:
    return await store.stop_expired_attempt(job.id, attempt, RUN)


async def exhaust(store: RecoveryStore, job: ExportJob, attempt: UUID) -> bool:
    return await store.exhaust_expired_attempt(
        job.id, attempt, 1, RUN
    )  # a cap of 1: this attempt is the last


async def resolve(store: RecoveryStore, job: ExportJob, attempt: UUID) -> bool:
    return await store.resolve_expired_delivery(
        job.id, attempt, JobStatus.OUTCOME_UNKNOWN, RUN, "no evidence"
    )


async def nominated(factory, case: str) -> tuple[ExportJob, UUID]:
    """A job in the state recovery's case ``case`` takes over, with its lease still current."""
    if case == "resolve":
        return await factory.delivering()
    job, attempt = await factory.running()
    if case == "stop":
        assert (await cancel(factory.api, job)).outcome == CancellationOutcome.STOP_REQUESTED
    return await factory.job(job.id), attempt


TAKEOVERS: dict[str, Takeover] = {"requeue": requeue, "stop": stop, "exhaust": exhaust, "resolve": resolve}


# -- renewal until a takeover commits -------------------------------------------------------------------


@pytest.mark.parametrize("case", ["requeue", "resolve"])
async def test_renewal_after_expiry_works_until_a_takeover_commits(
    factory, worker_store, case, recovery_store
):
    job, attempt = await nominated(factory, case)
    await factory.expire_lease(job.id, seconds_ago=120)
    assert not await lease_current(worker_store, job.id)

    renewal = await worker_store.renew_lease(job.id, attempt)
    assert (renewal.owned, renewal.status) == (True, job.status)  # expired, but nobody took over: still ours
    assert await lease_current(worker_store, job.id)

    await factory.expire_lease(job.id)
    assert await TAKEOVERS[case](recovery_store, job, attempt)
    assert (await worker_store.renew_lease(job.id, attempt)).owned is False


@pytest.mark.parametrize("case", list(TAKEOVERS))
async def test_renewal_after_recovery_scan_prevents_the_takeover(factory, worker_store, case, recovery_store):
    job, attempt = await nominated(factory, case)
    await factory.expire_lease(job.id)
    assert job.id in {c.id for c in await recovery_store.find_expired_leases(limit=100_000)}

    assert (await worker_store.renew_lease(job.id, attempt)).owned
    assert await TAKEOVERS[case](recovery_store, job, attempt) is False

    after = await factory.job(job.id)
    assert (after.status, after.attempt_id) == (job.status, attempt)
    assert await lease_current(worker_store, job.id)


@pytest.mark.parametrize("case", list(TAKEOVERS))
async def test_takeover_refuses_a_current_lease(factory, worker_store, case, recovery_store):
    job, attempt = await nominated(factory, case)
    assert await TAKEOVERS[case](recovery_store, job, attempt) is False
    assert await factory.job(job.id) == job


async def test_takeover_waits_for_an_uncommitted_renewal_then_matches_nothing(factory, kit):
    job, attempt = await factory.running()
    await factory.expire_lease(job.id)
    renewal = await kit.hold("exports_worker")
    rows = await renewal.run("renew_lease", {"job_id": job.id, "attempt_id": attempt, "lease_seconds": 60})
    assert rows == [{"status": "Running", "stop_requested": False}]

    recovery = await kit.solo("exports_recovery")
    taking_over = asyncio.create_task(requeue(recovery.store, job, attempt))
    await kit.wait_until_blocked_by(recovery.pid, renewal.pid)
    await still_waiting(taking_over)

    await renewal.commit()
    assert await taking_over is False
    assert (await factory.job(job.id)).attempt_id == attempt


async def test_renewal_reports_a_recorded_stop_request_in_the_same_round_trip(
    factory, worker_store, api_store
):
    job, attempt = await factory.running()
    assert not (await worker_store.renew_lease(job.id, attempt)).stop_requested
    await cancel(api_store, job)
    renewal = await worker_store.renew_lease(job.id, attempt)
    assert (renewal.owned, renewal.stop_requested) == (True, True)


async def test_renewal_after_the_attempts_terminal_write_owns_nothing(factory, worker_store):
    job, attempt = await factory.delivering()
    assert (
        await worker_store.finish_delivery(job.id, attempt, DeliveryOutcome.COMPLETED) == FinishResult.WRITTEN
    )
    assert (await worker_store.renew_lease(job.id, attempt)).owned is False
    assert (await factory.job(job.id)).lease_expires_at is None


# -- each recovery case, with its event ---------------------------------------------------------------


async def test_recovery_requeues_an_expired_running_attempt_with_a_new_wake_up(
    factory, worker_store, recovery_store
):
    job, attempt = await factory.running()
    await factory.expire_lease(job.id)

    assert await requeue(recovery_store, job, attempt)

    after = await factory.job(job.id)
    assert (after.status, after.attempt_id, after.claimed_by, after.lease_expires_at) == (
        JobStatus.QUEUED,
        None,
        None,
        None,
    )
    assert after.attempt_count == 1 and after.woken_at > job.woken_at
    assert await factory.outbox_count(job.id) == 2
    [event] = await events_of(worker_store, job.id, EventKind.REQUEUED_BY_RECOVERY)
    assert (event.attempt_id, event.observed_by) == (attempt, RUN)


async def test_recovery_stops_an_expired_attempt_that_has_a_stop_request(
    factory, worker_store, recovery_store
):
    job, attempt = await nominated(factory, "stop")
    await factory.expire_lease(job.id)

    assert await requeue(recovery_store, job, attempt) is False  # a stop request is finished, not restarted
    assert await exhaust(recovery_store, job, attempt) is False
    assert await stop(recovery_store, job, attempt)

    after = await factory.job(job.id)
    assert (after.status, after.attempt_id, after.lease_expires_at) == (JobStatus.STOPPED, attempt, None)
    [event] = await events_of(worker_store, job.id, EventKind.STOPPED_BY_RECOVERY)
    assert (event.attempt_id, event.observed_by, event.detail) == (attempt, RUN, f"for {job.stop_request_id}")
    assert await factory.outbox_count(job.id) == 1


async def test_recovery_fails_a_job_that_crashes_every_attempt_at_the_cap(
    factory, worker_store, recovery_store
):
    job = await factory.queued()
    for n in range(1, MAX_ATTEMPTS + 1):
        running, attempt = await factory.running(await factory.job(job.id))
        assert running.attempt_count == n
        await factory.expire_lease(job.id)
        if n < MAX_ATTEMPTS:
            assert await recovery_store.exhaust_expired_attempt(job.id, attempt, MAX_ATTEMPTS, RUN) is False
            assert await requeue(recovery_store, running, attempt)

    assert await requeue(recovery_store, running, attempt) is False
    assert await recovery_store.exhaust_expired_attempt(job.id, attempt, MAX_ATTEMPTS, RUN)

    after = await factory.job(job.id)
    assert (after.status, after.failure_reason, after.attempt_count) == (
        JobStatus.FAILED,
        FailureCode.ATTEMPTS_EXHAUSTED,
        MAX_ATTEMPTS,
    )
    [event] = await events_of(worker_store, job.id, EventKind.ATTEMPTS_EXHAUSTED)
    assert (event.attempt_id, event.observed_by, event.detail) == (
        attempt,
        RUN,
        f"after {MAX_ATTEMPTS} attempts",
    )
    assert len(await events_of(worker_store, job.id, EventKind.REQUEUED_BY_RECOVERY)) == MAX_ATTEMPTS - 1


@pytest.mark.parametrize("resolution", [JobStatus.COMPLETED, JobStatus.OUTCOME_UNKNOWN])
async def test_recovery_resolves_an_expired_delivery_from_evidence(
    factory, worker_store, resolution, recovery_store
):
    job, attempt = await factory.delivering()
    await factory.expire_lease(job.id)
    assert await requeue(recovery_store, job, attempt) is False  # Delivering is never retried

    assert await recovery_store.resolve_expired_delivery(job.id, attempt, resolution, RUN, "name+size match")

    after = await factory.job(job.id)
    assert (after.status, after.attempt_id, after.lease_expires_at) == (resolution, attempt, None)
    [event] = await events_of(worker_store, job.id, EventKind.RESOLVED_BY_RECOVERY)
    assert (event.observed_by, event.detail) == (RUN, f"{resolution.value}: name+size match")


async def test_recovery_never_resolves_a_delivery_to_failed(factory, worker_store, kit, recovery_store):
    job, attempt = await factory.delivering()
    await factory.expire_lease(job.id)
    with pytest.raises(ValueError):
        await recovery_store.resolve_expired_delivery(job.id, attempt, JobStatus.FAILED, RUN, "file absent")
    # The statement itself refuses it too, when run directly.
    held = await kit.hold("exports_worker")
    rows = await held.run(
        "resolve_expired_delivery",
        {
            "job_id": job.id,
            "expired_attempt_id": attempt,
            "resolution": "Failed",
            "recovery_run_id": RUN,
            "evidence_summary": "file absent",
        },
    )
    assert rows == []
    await held.rollback()
    assert (await factory.job(job.id)).status == JobStatus.DELIVERING


# -- interleavings ----------------------------------------------------------------------------------


async def test_late_worker_waits_for_a_requeue_then_can_neither_renew_nor_authorize(factory, kit):
    # The late worker's way back to cutoff 2 is a renewal (its lease has expired); it waits for the held
    # takeover, and once that commits the attempt owns nothing.
    job, attempt = await factory.running()
    await factory.expire_lease(job.id)
    recovery = await kit.hold("exports_recovery")
    rows = await recovery.run(
        "requeue_expired_attempt",
        {
            "job_id": job.id,
            "expired_attempt_id": attempt,
            "max_attempts": MAX_ATTEMPTS,
            "recovery_run_id": RUN,
            "traceparent": None,
        },
    )
    assert rows == [{"job_id": job.id}]

    worker = await kit.solo("exports_worker")
    renewing = asyncio.create_task(worker.store.renew_lease(job.id, attempt))
    await kit.wait_until_blocked_by(worker.pid, recovery.pid)
    await still_waiting(renewing)
    await recovery.commit()

    assert (await renewing).owned is False
    assert await authorize(worker.store, job, attempt) == AuthorizationResult.NOT_OWNER
    assert (await factory.job(job.id)).status == JobStatus.QUEUED
    assert EventKind.DELIVERY_AUTHORIZED.value not in await factory.event_kinds(job.id)


async def wait_for_database_clock_to_pass_lease(factory, job_id: UUID, within: float = 10.0) -> None:
    """Poll until the database clock is past the row's lease (a condition, bounded; not a race sleep)."""
    async with await psycopg.AsyncConnection.connect(factory.db.admin_url, autocommit=True) as conn:

        async def expired() -> bool:
            cur = await conn.execute(
                "SELECT lease_expires_at < clock_timestamp() FROM export_jobs WHERE id = %(id)s",
                {"id": job_id},
            )
            return bool((await cur.fetchone())[0])

        await eventually(expired, "the lease expired on the database clock", within=within)


async def test_requeue_waits_for_an_authorization_committed_first_then_matches_nothing(factory, kit):
    job, attempt = await factory.running()
    # Current for the authorization, expired by the time recovery's takeover runs: the worker's last renewal
    # set a short lease (committed), and its authorization follows at once on the same connection.
    cutoff = await kit.hold("exports_worker")
    assert await cutoff.run("renew_lease", {"job_id": job.id, "attempt_id": attempt, "lease_seconds": 0.5})
    await cutoff.commit()
    assert matched(await cutoff.run("authorize_delivery_if_running", authorize_params(job, attempt)))
    await wait_for_database_clock_to_pass_lease(factory, job.id)

    recovery = await kit.solo("exports_recovery")
    taking_over = asyncio.create_task(requeue(recovery.store, job, attempt))
    await kit.wait_until_blocked_by(recovery.pid, cutoff.pid)
    await cutoff.commit()

    assert await taking_over is False
    assert (await factory.job(job.id)).status == JobStatus.DELIVERING
    assert EventKind.REQUEUED_BY_RECOVERY.value not in await factory.event_kinds(job.id)


async def test_cancellation_after_a_requeue_is_canceled_while_queued_with_the_attempt_count(
    factory, worker_store, api_store, recovery_store
):
    job, attempt = await factory.running()
    await factory.expire_lease(job.id)
    assert await requeue(recovery_store, job, attempt)

    result = await cancel(api_store, job)

    assert result.outcome == CancellationOutcome.CANCELED_WHILE_QUEUED
    assert result.request is not None
    assert (
        result.request.found_status,
        result.request.found_attempt_count,
        result.request.found_attempt_id,
    ) == (
        JobStatus.QUEUED,
        1,
        None,
    )
    assert (await factory.job(job.id)).status == JobStatus.CANCELED


async def test_worker_with_an_expired_lease_is_refused_at_cutoff_2_until_it_renews(factory, worker_store):
    job, attempt = await factory.running()
    await factory.expire_lease(job.id)

    assert await authorize(worker_store, job, attempt) == AuthorizationResult.LEASE_LAPSED
    assert (await factory.job(job.id)).status == JobStatus.RUNNING

    assert (await worker_store.renew_lease(job.id, attempt)).owned
    assert await authorize(worker_store, job, attempt) == AuthorizationResult.AUTHORIZED


async def test_worker_resuming_after_a_takeover_writes_nothing_to_the_row(
    factory, worker_store, recovery_store
):
    job, attempt = await factory.running()
    await factory.expire_lease(job.id)
    assert await requeue(recovery_store, job, attempt)
    _, new_attempt = await factory.running(await factory.job(job.id), worker_id="worker-7")
    before = await factory.job(job.id)

    assert (await worker_store.renew_lease(job.id, attempt)).owned is False
    assert await authorize(worker_store, job, attempt) == AuthorizationResult.NOT_OWNER
    assert await worker_store.finish_failed(job.id, attempt, FailureCode.BUILD_FAILED, "BuildError") == (
        FinishResult.NOT_OWNER
    )
    assert (
        await worker_store.finish_stopped(job.id, attempt, StopPoint.WHILE_BUILDING) == FinishResult.NOT_OWNER
    )

    assert await factory.job(job.id) == before
    assert before.attempt_id == new_attempt


async def test_superseded_delivery_keeps_its_late_receipt_as_evidence_only(
    factory, worker_store, recovery_store
):
    job, attempt = await factory.delivering()
    await factory.expire_lease(job.id)
    assert await resolve(recovery_store, job, attempt)

    # The original worker finishes its upload after recovery resolved the attempt.
    assert await worker_store.append_delivery_evidence(
        job.id, attempt, "worker-3", {"observation": "renamed", "size": 1234}
    )
    assert (
        await worker_store.finish_delivery(job.id, attempt, DeliveryOutcome.COMPLETED)
        == FinishResult.NOT_OWNER
    )

    after = await factory.job(job.id)
    assert after.status == JobStatus.OUTCOME_UNKNOWN
    [evidence] = await events_of(worker_store, job.id, EventKind.DELIVERY_EVIDENCE)
    assert (evidence.attempt_id, evidence.observed_by) == (attempt, "worker-3")


async def test_stop_request_on_a_running_attempt_ends_only_in_stopped(factory, worker_store, api_store):
    # Stopped means a recorded stop request: an attempt without one cannot write Stopped.
    job, attempt = await factory.running()
    assert (
        await worker_store.finish_stopped(job.id, attempt, StopPoint.WHILE_BUILDING) == FinishResult.NOT_OWNER
    )
    assert (await factory.job(job.id)).status == JobStatus.RUNNING

    request = await cancel(api_store, job)
    assert (
        await worker_store.finish_stopped(job.id, attempt, StopPoint.WHILE_BUILDING) == FinishResult.WRITTEN
    )
    [event] = await events_of(worker_store, job.id, EventKind.STOPPED)
    assert event.detail is not None and str(request.request_id) in event.detail
