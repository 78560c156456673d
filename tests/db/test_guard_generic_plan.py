"""The state machine's guard keeps working on a long-lived connection (a regression of 0005 fixed in 0006).

0005's trigger tested ``OLD.status IN ('Completed', 'Failed') AND NOT EXISTS (SELECT ... outcome_corrections)``
as one expression. With statistics, plpgsql's cached plan turns generic after five executions on a
connection, keeps the subquery, and PostgreSQL checks SELECT on outcome_corrections before running it: the
sixth status change by the worker (or by recovery), which may not read that table, failed with "permission
denied". A worker's pool connection claims far more than five jobs."""

from __future__ import annotations

import uuid

from domain.models import ClaimResult, JobStatus
from tests.db.race import authorize


async def test_one_worker_connection_claims_and_authorizes_many_jobs_after_analyze(factory, kit):
    await factory.admin("ANALYZE")
    worker = await kit.solo("exports_worker")  # one connection: the plan cache is that connection's
    jobs = [await factory.queued() for _ in range(12)]

    for job in jobs:
        attempt = uuid.uuid4()
        assert (
            await worker.store.claim_if_queued(job.id, job.version, attempt, "worker-3")
            == ClaimResult.CLAIMED
        )
        assert (await authorize(worker.store, job, attempt)).value == "Authorized"

    assert {await factory.status(j.id) for j in jobs} == {JobStatus.DELIVERING}


async def test_one_recovery_connection_takes_over_many_expired_attempts_after_analyze(factory, kit):
    await factory.admin("ANALYZE")
    recovery = await kit.solo("exports_recovery")
    running = [await factory.running() for _ in range(8)]
    for job, _ in running:
        await factory.expire_lease(job.id)

    for job, attempt in running:
        assert await recovery.store.requeue_expired_attempt(
            job.id, attempt, max_attempts=3, recovery_run_id="r-1"
        )

    assert {await factory.status(j.id) for j, _ in running} == {JobStatus.QUEUED}
