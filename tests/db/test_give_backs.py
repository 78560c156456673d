"""Give-backs that wait and end (issue 23.1), and ownership by attempt (23.8), against the real database.

- a give-back for a failure writes ``available_at`` (exponential backoff with jitter, capped) on the row and
  on its wake-up; the claim, the dispatcher's take and the sweeper leave the job alone until then;
- past ``max_releases`` such give-backs the give-back ends the job Failed (AttemptsExhausted) instead, with
  its event, and no wake-up;
- a drain or a pause is not counted and does not wait;
- the trigger keeps ``available_at`` for give-backs alone and the count from going down, for every writer;
- the attempt, not the host, holds the job: a claim confirmed on another host after a lost answer names that
  host, which can give the attempt back.
"""

from __future__ import annotations

import random
import uuid
from datetime import timedelta

import psycopg
import pytest

from domain.models import (
    ClaimResult,
    EventKind,
    FailureCode,
    JobStatus,
    ReleaseCause,
    ReleaseResult,
)
from rules.releases import ReleasePolicy, delay_seconds
from tests.support.eventually import eventually

FAST = ReleasePolicy(base_seconds=0.2, cap_seconds=0.8, max_releases=3)


class FixedJitter(random.Random):
    """A jitter source whose every draw is ``value``: the wait is then known to the millisecond."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


async def give_back(store, job_id, attempt, cause=ReleaseCause.TRANSIENT, policy=FAST, worker="worker-3"):
    return await store.release_attempt_if_running(
        job_id, attempt, worker, "build interrupted: 57P01", cause, policy
    )


async def deferred_wake_ups(factory, job_id) -> list[dict]:
    return await factory.admin(
        "SELECT available_at, published_at FROM outbox WHERE job_id = %(j)s AND available_at IS NOT NULL"
        " ORDER BY created_at",
        {"j": job_id},
    )


async def test_a_give_back_for_a_failure_makes_the_next_claim_wait_on_the_row_and_its_wake_up(
    factory, worker_store
):
    job, attempt = await factory.running()
    policy = ReleasePolicy(base_seconds=30.0, cap_seconds=300.0, max_releases=6, rng=FixedJitter(1.0))

    assert await give_back(worker_store, job.id, attempt, policy=policy) == ReleaseResult.RELEASED

    row = await factory.job(job.id)
    assert (row.status, row.transient_releases, row.attempts_released) == (JobStatus.QUEUED, 1, 1)
    released = [e for e in await worker_store.job_events(job.id) if e.kind == EventKind.RELEASED][-1]
    assert row.available_at is not None
    # 30 s * 2^0 * (0.5 + 0.5 * 1.0), from the give-back's own clock reading
    assert abs((row.available_at - released.recorded_at).total_seconds() - 30.0) < 0.5
    assert released.detail.startswith("transient: build interrupted: 57P01; the next claim waits until ")
    [wake_up] = await deferred_wake_ups(factory, job.id)
    assert wake_up["available_at"] == row.available_at and wake_up["published_at"] is None

    # Nothing claims it before then: the claim matches nothing and says why; the row is as it was.
    assert (
        await worker_store.claim_if_queued(job.id, row.version, uuid.uuid4(), "worker-4")
        == ClaimResult.NOT_YET
    )
    facts = await worker_store.read_policy_facts(job.id)
    assert facts is not None and facts.available is False
    again = await factory.job(job.id)
    assert (again.status, again.attempt_count) == (JobStatus.QUEUED, 1)


async def test_each_give_back_for_a_failure_doubles_the_wait_up_to_the_cap(factory, worker_store):
    policy = ReleasePolicy(base_seconds=10.0, cap_seconds=25.0, max_releases=6, rng=FixedJitter(0.0))
    job, attempt = await factory.running()
    waits = []
    for earlier in range(3):
        assert await give_back(worker_store, job.id, attempt, policy=policy) == ReleaseResult.RELEASED
        row = await factory.job(job.id)
        released = [e for e in await worker_store.job_events(job.id) if e.kind == EventKind.RELEASED][-1]
        waits.append((row.available_at - released.recorded_at).total_seconds())
        assert abs(waits[-1] - delay_seconds(policy, earlier, 0.0)) < 0.5
        await factory.end_wait(job.id)
        job, attempt = await factory.running(await factory.job(job.id))
    assert [round(w, 1) for w in waits] == [5.0, 10.0, 12.5]  # 10, 20, 40 capped at 25; halved by the jitter


async def test_a_waiting_job_is_claimed_once_its_wait_is_over_and_its_wake_up_is_taken_then(
    factory, worker_store, dispatcher_store
):
    job, attempt = await factory.running()
    mine = lambda taken: [m for m in taken if m.job_id == job.id]  # noqa: E731 - other tests' rows may wait too
    created = mine(await dispatcher_store.take_unpublished(1000, 30.0))  # the creation's wake-up
    await dispatcher_store.mark_published([m.message_id for m in created])
    assert await give_back(worker_store, job.id, attempt) == ReleaseResult.RELEASED
    row = await factory.job(job.id)

    # The dispatcher takes no wake-up of this job until the wait is over ...
    assert mine(await dispatcher_store.take_unpublished(1000, 30.0)) == []

    # ... then takes it, and the claim succeeds (bounded waits on the database clock, never a sleep that decides).
    async def taken_once_due():
        return mine(await dispatcher_store.take_unpublished(1000, 30.0))

    taken = await eventually(taken_once_due, "the waiting wake-up taken once due", within=15.0)
    assert len(taken) == 1 and taken[0].waited_seconds >= 0

    async def claimed_once_due():
        answer = await worker_store.claim_if_queued(job.id, row.version, uuid.uuid4(), "worker-4")
        return answer if answer != ClaimResult.NOT_YET else None

    assert await eventually(claimed_once_due, "the claim once the wait is over") == ClaimResult.CLAIMED


async def test_the_sweeper_leaves_a_waiting_job_alone(factory, worker_store):
    job, attempt = await factory.running()
    policy = ReleasePolicy(base_seconds=600.0, cap_seconds=600.0, max_releases=6)
    assert await give_back(worker_store, job.id, attempt, policy=policy) == ReleaseResult.RELEASED
    await factory.age_wake_up(job.id, minutes=31)  # stale by woken_at, but its wait is not over

    swept = await worker_store.sweep_stale_queued(older_than_seconds=1800, batch=500)

    assert job.id not in swept
    assert (await factory.job(job.id)).sweep_count == 0


async def test_past_the_bound_a_give_back_ends_the_job_failed_with_every_give_back_on_record(
    factory, worker_store
):
    job, attempt = await factory.running()
    for _ in range(FAST.max_releases):
        assert await give_back(worker_store, job.id, attempt) == ReleaseResult.RELEASED
        await factory.end_wait(job.id)
        job, attempt = await factory.running(await factory.job(job.id))
    outbox_before = await factory.outbox_count(job.id)

    assert await give_back(worker_store, job.id, attempt) == ReleaseResult.EXHAUSTED

    row = await factory.job(job.id)
    assert (row.status, row.failure_reason, row.lease_expires_at) == (
        JobStatus.FAILED,
        FailureCode.ATTEMPTS_EXHAUSTED,
        None,
    )
    assert row.transient_releases == FAST.max_releases
    events = await worker_store.job_events(job.id)
    assert [e.kind for e in events].count(EventKind.RELEASED) == FAST.max_releases
    last = events[-1]
    assert (last.kind, last.attempt_id, last.worker_id) == (EventKind.ATTEMPTS_EXHAUSTED, attempt, "worker-3")
    assert last.detail == (
        "given back 3 times after failures (the limit); this time transient: build interrupted: 57P01"
    )
    assert await factory.outbox_count(job.id) == outbox_before  # nothing wakes a job that ended


async def test_a_drain_a_pause_a_policy_refusal_or_a_terminate_neither_counts_nor_waits(
    factory, worker_store
):
    job, attempt = await factory.running()
    assert await give_back(worker_store, job.id, attempt) == ReleaseResult.RELEASED  # a failure: it waits
    await factory.end_wait(job.id)
    for cause in (ReleaseCause.DRAIN, ReleaseCause.PAUSED, ReleaseCause.POLICY, ReleaseCause.TERMINATED):
        job, attempt = await factory.running(await factory.job(job.id))
        assert await give_back(worker_store, job.id, attempt, cause=cause) == ReleaseResult.RELEASED
        row = await factory.job(job.id)
        assert (row.transient_releases, row.available_at) == (1, None)
    assert len(await deferred_wake_ups(factory, job.id)) == 1  # only the failure's wake-up waited


async def test_a_recorded_stop_request_is_honored_never_released_even_for_a_failure(factory, worker_store):
    job, attempt = await factory.running()
    await factory.cancel(job)  # StopRequested
    assert await give_back(worker_store, job.id, attempt) == ReleaseResult.NOT_OWNER
    row = await factory.job(job.id)
    assert (row.status, row.transient_releases, row.available_at) == (JobStatus.RUNNING, 0, None)


@pytest.mark.parametrize(
    "change",
    [
        "SET available_at = clock_timestamp() + interval '1 hour'",  # a Queued job made to wait by hand
        "SET available_at = NULL",  # a waiting job made claimable by hand
        "SET transient_releases = 0",  # the record of give-backs wiped
    ],
)
async def test_the_trigger_keeps_the_wait_for_give_backs_alone_for_every_writer(
    factory, worker_store, change
):
    job, attempt = await factory.running()
    assert await give_back(worker_store, job.id, attempt) == ReleaseResult.RELEASED
    with pytest.raises(psycopg.errors.CheckViolation, match="give-back"):
        await factory.admin(f"UPDATE export_jobs {change} WHERE id = %(j)s", {"j": job.id})  # as superuser
    assert (await factory.job(job.id)).transient_releases == 1


async def test_a_claim_confirmed_on_another_host_is_that_hosts_to_give_back(factory, worker_store):
    # worker-3's claim committed but its answer was lost; Temporal retried the claim on worker-4, which found
    # the claim its attempt made and adopted it (23.8).
    job, attempt = await factory.running(worker_id="worker-3")
    assert await worker_store.adopt_claim_if_running(job.id, attempt, "worker-4") is True
    assert (await factory.job(job.id)).claimed_by == "worker-4"
    assert await worker_store.adopt_claim_if_running(job.id, attempt, "worker-4") is False  # already its own

    # A drain on worker-4 gives the attempt back; the event names the host that held it.
    result = await give_back(worker_store, job.id, attempt, cause=ReleaseCause.DRAIN, worker="worker-4")
    assert result == ReleaseResult.RELEASED
    released = [e for e in await worker_store.job_events(job.id) if e.kind == EventKind.RELEASED][-1]
    assert (released.attempt_id, released.worker_id) == (attempt, "worker-4")


async def test_only_the_attempt_holding_a_running_job_adopts_or_gives_it_back(factory, worker_store):
    job, attempt = await factory.running(worker_id="worker-3")
    assert await worker_store.adopt_claim_if_running(job.id, uuid.uuid4(), "worker-4") is False
    assert (
        await give_back(worker_store, job.id, uuid.uuid4(), cause=ReleaseCause.DRAIN)
        == ReleaseResult.NOT_OWNER
    )
    delivering, d_attempt = await factory.delivering()
    assert await worker_store.adopt_claim_if_running(delivering.id, d_attempt, "worker-4") is False
    assert (await factory.job(job.id)).claimed_by == "worker-3"


async def test_the_wait_is_on_the_database_clock_and_never_shorter_than_half_the_backoff(
    factory, worker_store
):
    policy = ReleasePolicy(base_seconds=40.0, cap_seconds=300.0, max_releases=6, rng=random.Random(7))
    for _ in range(5):
        job, attempt = await factory.running()
        assert await give_back(worker_store, job.id, attempt, policy=policy) == ReleaseResult.RELEASED
        row = await factory.job(job.id)
        released = [e for e in await worker_store.job_events(job.id) if e.kind == EventKind.RELEASED][-1]
        wait = row.available_at - released.recorded_at
        assert timedelta(seconds=20) <= wait <= timedelta(seconds=40.1)
