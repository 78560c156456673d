"""A partner's session limit held as slots (issue #25.3, migration 0029), on the real server.

A destination's limit is rows, slot 1..max_sessions. An attempt takes one with the conditional statement
``take_session_slot`` only while it holds its Running job with a current lease; the slot is then held while the
attempt holds that job Running or Delivering, so its terminal write, a give-back and recovery's takeover end it
in their own statements. Two takers of the last slot serialize on its row (both orders, proven with
``pg_blocking_pids``): never two holders. Recovery takes over the expired attempt's slot for its own session and
gives it back if the attempt renewed. Any other holder's slot ends when released or when it expires.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from db.pool import open_pool
from db.stores.recovery import RecoveryStore
from domain.models import (
    AuthorizationResult,
    DeliveryOutcome,
    FailureCode,
    FinishResult,
    ReleaseCause,
    StopPoint,
)
from tests.db.race import authorize, still_waiting
from tests.db.test_permissions import assert_refused


async def limited(factory, max_sessions: int = 2, **fields: Any) -> tuple[uuid.UUID, uuid.UUID]:
    tenant_id = await factory.tenant()
    return tenant_id, await factory.destination(tenant_id, max_sessions=max_sessions, **fields)


async def running_to(factory, tenant_id: uuid.UUID, destination_id: uuid.UUID):
    return await factory.running(await factory.queued(tenant_id, destination_id))


async def take(store, job, attempt_id):
    return await store.take_session_slot(job.tenant_id, job.destination_id, attempt_id, job_id=job.id)


def take_params(job, attempt_id) -> dict[str, Any]:
    """``take_session_slot``'s parameters as ``SlotStatements.take_session_slot`` binds them for an attempt."""
    return {
        "tenant_id": job.tenant_id,
        "destination_id": job.destination_id,
        "holder": attempt_id,
        "job_id": job.id,
        "purpose": "attempt",
        "hold_seconds": None,
        "adopt": None,
    }


async def slots(factory, destination_id: uuid.UUID) -> list[dict[str, Any]]:
    return await factory.admin(
        "SELECT slot, holder, purpose, session_slot_held(s) AS held FROM destination_session_slots s"
        " WHERE destination_id = %(d)s ORDER BY slot",
        {"d": destination_id},
    )


# -- taking ---------------------------------------------------------------------------------------------


async def test_a_limit_is_its_slots_and_a_third_attempt_finds_none_while_two_hold_them(factory, worker_store):
    tenant_id, destination_id = await limited(factory, 2)
    assert [s["slot"] for s in await slots(factory, destination_id)] == [1, 2]
    (a, attempt_a), (b, attempt_b), (c, attempt_c) = [
        await running_to(factory, tenant_id, destination_id) for _ in range(3)
    ]

    first, second, third = (
        await take(worker_store, a, attempt_a),
        await take(worker_store, b, attempt_b),
        await take(worker_store, c, attempt_c),
    )

    assert (first.slot, second.slot, third.slot) == (1, 2, None)
    assert (third.max_sessions, third.in_use, third.eligible) == (2, 2, True)
    again = await take(worker_store, a, attempt_a)  # a retried take after a lost answer finds its own slot
    assert again.slot == 1
    assert [(s["holder"], s["purpose"], s["held"]) for s in await slots(factory, destination_id)] == [
        (attempt_a, "attempt", True),
        (attempt_b, "attempt", True),
    ]


async def test_a_destination_without_a_limit_has_no_slots_and_takes_none(factory, worker_store):
    job, attempt = await factory.running()

    answer = await take(worker_store, job, attempt)

    assert (answer.destination_found, answer.max_sessions, answer.slot) == (True, None, None)
    assert await slots(factory, job.destination_id) == []


async def test_an_attempt_that_no_longer_holds_its_job_takes_no_slot(factory, worker_store):
    tenant_id, destination_id = await limited(factory, 1)
    job, attempt = await running_to(factory, tenant_id, destination_id)
    await factory.expire_lease(job.id)

    lapsed = await take(worker_store, job, attempt)
    stranger = await take(worker_store, job, uuid.uuid4())

    assert (lapsed.slot, lapsed.eligible) == (None, False)
    assert (stranger.slot, stranger.eligible) == (None, False)
    assert [s["holder"] for s in await slots(factory, destination_id)] == [None]


# -- every way an attempt ends ends its slot, in the same statement ---------------------------------------


async def ended_by_release(factory, job, attempt) -> None:
    assert (
        await factory.worker.release_attempt_if_running(
            job.id, attempt, "worker-3", "a partner at its limit", ReleaseCause.SESSION_LIMIT, wait_seconds=30
        )
    ).value == "Released"


async def ended_by_stop(factory, job, attempt) -> None:
    await factory.cancel(job)
    assert (
        await factory.worker.finish_stopped(job.id, attempt, StopPoint.BEFORE_DELIVERY)
        == FinishResult.WRITTEN
    )


async def ended_by_terminal_write(factory, job, attempt) -> None:
    assert (
        await authorize(factory.worker, job, attempt) == AuthorizationResult.AUTHORIZED
    )  # still held: Delivering
    assert (
        await factory.worker.finish_delivery(
            job.id, attempt, DeliveryOutcome.FAILED, FailureCode.NOT_DELIVERED, summary="refused"
        )
        == FinishResult.WRITTEN
    )


@pytest.mark.parametrize(
    "ending",
    [ended_by_release, ended_by_stop, ended_by_terminal_write],
    ids=lambda f: f.__name__,
)
async def test_the_statement_that_ends_an_attempt_frees_its_slot_for_the_next(factory, worker_store, ending):
    tenant_id, destination_id = await limited(factory, 1)
    job, attempt = await running_to(factory, tenant_id, destination_id)
    assert (await take(worker_store, job, attempt)).slot == 1
    waiting, waiting_attempt = await running_to(factory, tenant_id, destination_id)
    assert (await take(worker_store, waiting, waiting_attempt)).slot is None

    await ending(factory, job, attempt)

    assert (await take(worker_store, waiting, waiting_attempt)).slot == 1
    [row] = await factory.admin(
        "SELECT available_at IS NOT NULL AS waits FROM export_jobs WHERE id = %(j)s", {"j": job.id}
    )
    if ending is ended_by_release:
        assert row["waits"]  # a give-back for want of a slot is not counted, but its next claim waits


# -- recovery's takeover leaves the slot held for a while (0041) -------------------------------------------


async def recovery_with_hold(database, seconds: float):
    """Recovery's store on a pool that sets the takeover hold as the worker sets it from its settings."""
    pool = await open_pool(
        database.app_url,
        "exports_recovery",
        max_size=2,
        parameters={"fenced.session_takeover_hold_seconds": str(seconds)},
    )
    return pool, RecoveryStore(pool, lease_seconds=60)


async def test_recovery_takeover_leaves_the_slot_held_until_the_old_attempt_gives_it_back(
    factory, worker_store
):
    # The taken-over attempt may be alive with its session open (a paused worker, one cut off from
    # PostgreSQL): the partner still counts that session, so the slot is not anyone else's yet.
    tenant_id, destination_id = await limited(factory, 1)
    job, attempt = await running_to(factory, tenant_id, destination_id)
    assert (await take(worker_store, job, attempt)).slot == 1
    waiting, waiting_attempt = await running_to(factory, tenant_id, destination_id)
    await factory.expire_lease(job.id)
    assert await factory.recovery.requeue_expired_attempt(job.id, attempt, 3, "recovery-test")

    assert (await take(worker_store, waiting, waiting_attempt)).slot is None
    [row] = await slots(factory, destination_id)
    assert (row["holder"], row["purpose"], row["held"]) == (attempt, "attempt", True)
    # Someone else's release, or the waiting attempt's, gives back nothing.
    assert not await worker_store.release_taken_over_slot(waiting_attempt)
    assert not await worker_store.release_session_slot(waiting_attempt)
    assert (await take(worker_store, waiting, waiting_attempt)).slot is None

    # The old attempt found its job gone and closed its session: it gives the slot back.
    assert await worker_store.release_taken_over_slot(attempt)
    assert (await take(worker_store, waiting, waiting_attempt)).slot == 1
    assert not await worker_store.release_taken_over_slot(attempt)  # it is the other attempt's now
    assert [(s["holder"], s["held"]) for s in await slots(factory, destination_id)] == [
        (waiting_attempt, True)
    ]


async def test_recovery_takeover_leaves_the_slot_held_only_for_its_hold(factory, worker_store, database):
    pool, recovery = await recovery_with_hold(database, 0.3)
    try:
        tenant_id, destination_id = await limited(factory, 1)
        job, attempt = await running_to(factory, tenant_id, destination_id)
        assert (await take(worker_store, job, attempt)).slot == 1
        waiting, waiting_attempt = await running_to(factory, tenant_id, destination_id)
        await factory.expire_lease(job.id)
        assert await recovery.requeue_expired_attempt(job.id, attempt, 3, "recovery-test")

        assert (await take(worker_store, waiting, waiting_attempt)).slot is None
        await factory.admin("SELECT pg_sleep(0.4)")  # the database's clock passes the hold's end
        assert (await take(worker_store, waiting, waiting_attempt)).slot == 1
    finally:
        await pool.close()


async def test_an_attempt_still_holding_its_job_cannot_give_its_slot_back_as_taken_over(
    factory, worker_store
):
    tenant_id, destination_id = await limited(factory, 1)
    job, attempt = await running_to(factory, tenant_id, destination_id)
    assert (await take(worker_store, job, attempt)).slot == 1

    assert not await worker_store.release_taken_over_slot(attempt)

    [row] = await slots(factory, destination_id)
    assert (row["holder"], row["held"]) == (attempt, True)


# -- two takers of the last slot -------------------------------------------------------------------------


async def test_two_attempts_racing_for_the_last_slot_the_second_waits_then_finds_none(factory, kit):
    tenant_id, destination_id = await limited(factory, 1)
    first, first_attempt = await running_to(factory, tenant_id, destination_id)
    second, second_attempt = await running_to(factory, tenant_id, destination_id)
    held = await kit.hold("exports_worker")
    [taken] = await held.run("take_session_slot", take_params(first, first_attempt))
    assert taken["slot"] == 1

    worker = await kit.solo("exports_worker")
    taking = asyncio.create_task(take(worker.store, second, second_attempt))
    await kit.wait_until_blocked_by(worker.pid, held.pid)
    await still_waiting(taking)
    await held.commit()

    answer = await taking
    assert (answer.slot, answer.eligible) == (None, True)
    # what the waiting attempt shows: every slot held, though its snapshot predates the first take
    assert (answer.in_use, answer.max_sessions) == (1, 1)
    assert [s["holder"] for s in await slots(factory, destination_id)] == [first_attempt]


async def test_two_attempts_racing_for_the_last_slot_the_second_takes_it_when_the_first_rolls_back(
    factory, kit
):
    tenant_id, destination_id = await limited(factory, 1)
    first, first_attempt = await running_to(factory, tenant_id, destination_id)
    second, second_attempt = await running_to(factory, tenant_id, destination_id)
    held = await kit.hold("exports_worker")
    [taken] = await held.run("take_session_slot", take_params(first, first_attempt))
    assert taken["slot"] == 1

    worker = await kit.solo("exports_worker")
    taking = asyncio.create_task(take(worker.store, second, second_attempt))
    await kit.wait_until_blocked_by(worker.pid, held.pid)
    await still_waiting(taking)
    await held.rollback()

    assert (await taking).slot == 1
    assert [s["holder"] for s in await slots(factory, destination_id)] == [second_attempt]


async def test_a_slot_whose_attempt_ended_goes_to_one_of_two_racing_takers_only(factory, kit):
    tenant_id, destination_id = await limited(factory, 1)
    ended, ended_attempt = await running_to(factory, tenant_id, destination_id)
    assert (await take(factory.worker, ended, ended_attempt)).slot == 1
    await ended_by_release(
        factory, ended, ended_attempt
    )  # the slot is free now, its row still names the attempt
    first, first_attempt = await running_to(factory, tenant_id, destination_id)
    second, second_attempt = await running_to(factory, tenant_id, destination_id)
    held = await kit.hold("exports_worker")
    assert (await held.run("take_session_slot", take_params(first, first_attempt)))[0]["slot"] == 1

    worker = await kit.solo("exports_worker")
    taking = asyncio.create_task(take(worker.store, second, second_attempt))
    await kit.wait_until_blocked_by(worker.pid, held.pid)
    await held.commit()

    assert (await taking).slot is None
    assert [s["holder"] for s in await slots(factory, destination_id)] == [first_attempt]


# -- recovery and other holders ---------------------------------------------------------------------------


async def test_recovery_takes_over_an_expired_attempts_slot_and_gives_it_back_when_the_attempt_renewed(
    factory, worker_store, recovery_store
):
    tenant_id, destination_id = await limited(factory, 1)
    job, attempt = await running_to(factory, tenant_id, destination_id)
    assert (await take(worker_store, job, attempt)).slot == 1
    await factory.expire_lease(job.id)
    recovery = uuid.uuid4()

    adopted = await recovery_store.take_session_slot(
        tenant_id, destination_id, recovery, purpose="recovery", hold_seconds=60, adopt=attempt
    )

    assert adopted.slot == 1
    assert [(s["holder"], s["purpose"]) for s in await slots(factory, destination_id)] == [
        (recovery, "recovery")
    ]
    other, other_attempt = await running_to(factory, tenant_id, destination_id)
    assert (await take(worker_store, other, other_attempt)).slot is None  # recovery's session holds it now

    # The attempt renewed meanwhile (its worker woke up): recovery leaves it alone and gives its slot back.
    assert (await worker_store.renew_lease(job.id, attempt)).owned
    assert await recovery_store.release_session_slot(recovery, return_to=attempt, return_job_id=job.id)
    assert [(s["holder"], s["purpose"], s["held"]) for s in await slots(factory, destination_id)] == [
        (attempt, "attempt", True)
    ]
    assert (await take(worker_store, other, other_attempt)).slot is None


async def test_recovery_takes_a_free_slot_before_the_slot_of_an_attempt_that_may_still_be_alive(
    factory, worker_store, recovery_store
):
    tenant_id, destination_id = await limited(factory, 2)
    job, attempt = await running_to(factory, tenant_id, destination_id)
    assert (await take(worker_store, job, attempt)).slot == 1
    await factory.expire_lease(job.id)  # a lapsed lease: its worker may be alive, its session open

    first = await recovery_store.take_session_slot(
        tenant_id, destination_id, uuid.uuid4(), purpose="recovery", hold_seconds=60, adopt=attempt
    )
    second = await recovery_store.take_session_slot(
        tenant_id, destination_id, uuid.uuid4(), purpose="recovery", hold_seconds=60, adopt=attempt
    )

    assert (first.slot, first.adopted) == (2, False)  # the free one: the attempt keeps its own
    assert (second.slot, second.adopted) == (1, True)  # none free: the expired attempt's, taken over
    assert [s["purpose"] for s in await slots(factory, destination_id)] == ["recovery", "recovery"]


async def test_a_slot_held_by_anyone_else_ends_when_released_or_when_it_expires(factory, worker_store):
    tenant_id, destination_id = await limited(factory, 1)
    job, attempt = await running_to(factory, tenant_id, destination_id)
    test = uuid.uuid4()
    assert (
        await worker_store.take_session_slot(
            tenant_id, destination_id, test, purpose="connection_test", hold_seconds=60
        )
    ).slot == 1
    assert (await take(worker_store, job, attempt)).slot is None
    assert await worker_store.release_session_slot(test)
    assert (await take(worker_store, job, attempt)).slot == 1

    other_tenant, other_destination = await limited(factory, 1)
    forgotten = uuid.uuid4()
    assert (
        await worker_store.take_session_slot(
            other_tenant, other_destination, forgotten, purpose="cleanup", hold_seconds=0.2
        )
    ).slot == 1
    await factory.admin("SELECT pg_sleep(0.3)")  # the database's clock passes the hold's end
    job, attempt = await running_to(factory, other_tenant, other_destination)
    assert (await take(worker_store, job, attempt)).slot == 1


# -- roles ------------------------------------------------------------------------------------------------


async def test_only_the_worker_and_recovery_change_slots_and_nobody_deletes_one(factory, database):
    tenant_id, destination_id = await limited(factory, 1)
    claim = (
        "UPDATE destination_session_slots SET holder = gen_random_uuid(), purpose = 'recovery',"
        " taken_at = now(), expires_at = now() WHERE destination_id = %(d)s"
    )
    for role in ("exports_api", "exports_dispatcher", "exports_reconciler", "exports_platform"):
        await assert_refused(database, role, claim, {"d": destination_id})
    for role in ("exports_worker", "exports_recovery", "exports_api"):
        await assert_refused(
            database,
            role,
            "DELETE FROM destination_session_slots WHERE destination_id = %(d)s",
            {"d": destination_id},
        )
    await assert_refused(
        database,
        "exports_worker",
        "INSERT INTO destination_session_slots (tenant_id, destination_id, slot) VALUES (%(t)s, %(d)s, 9)",
        {"t": tenant_id, "d": destination_id},
    )
