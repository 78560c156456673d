"""A switch or a retirement racing the claim or cutoff 2, on the real server, in both orders (001 "Testing
the Race"): one writer's transaction is held open, the other is proven to wait on it with
``pg_blocking_pids``, then the first commits (or rolls back). The claim and cutoff 2 read the switch rows,
and cutoff 2 the destination row, FOR SHARE inside their own statements, so a pause or a retirement and
the decision serialize: whichever commits first, the other sees it."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from domain.controls import SwitchScope
from domain.models import AuthorizationResult, ClaimResult, JobStatus
from tests.db.race import authorize, authorize_params, claim_params, matched, still_waiting


def switch_params(job, *, scope: str, enabled: bool, was_enabled: bool | None = True) -> dict[str, Any]:
    """The parameters ``ApiStore.set_delivery_switch`` binds to its two statements."""
    return {
        "scope": scope,
        "tenant_id": None if scope == "global" else job.tenant_id,
        "destination_id": job.destination_id if scope == "destination" else None,
        "enabled": enabled,
        "reason": "held in a test",
        "changed_by": "sam.ops",
        "was_enabled": was_enabled,
        # 0032: a pause is its owner's row (sam.ops's own, until released); a resume releases sam.ops's
        "expires_at": None,
        "kind": "manual",
        "pause_ids": None,
    }


async def hold_switch(kit, job, *, scope: str = "destination", enabled: bool = False):
    """A switch change as the API makes it (lock the row, then upsert with its history), left uncommitted."""
    held = await kit.hold("exports_api")
    params = switch_params(job, scope=scope, enabled=enabled)
    await held.run("lock_delivery_switch", params)
    assert len(await held.run("set_delivery_switch", params)) == 1
    return held


async def store_switch(store, job, *, scope: SwitchScope, enabled: bool):
    return await store.set_delivery_switch(
        scope=scope,
        tenant_id=job.tenant_id,
        destination_id=job.destination_id if scope == SwitchScope.DESTINATION else None,
        enabled=enabled,
        reason="racing",
        changed_by="sam.ops",
    )


# -- a pause and the claim ------------------------------------------------------------------------------


async def test_a_claim_waits_for_a_pause_then_matches_nothing_and_the_job_stays_queued(factory, kit):
    job = await factory.queued()
    pause = await hold_switch(kit, job, scope="destination")

    worker = await kit.solo("exports_worker")
    claiming = asyncio.create_task(
        worker.store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-3")
    )
    await kit.wait_until_blocked_by(worker.pid, pause.pid)
    await still_waiting(claiming)

    await pause.commit()
    assert await claiming == ClaimResult.PAUSED
    row = await factory.job(job.id)
    assert (row.status, row.attempt_count) == (JobStatus.QUEUED, 0)
    assert await factory.event_kinds(job.id) == []


async def test_a_claim_that_waited_for_a_rolled_back_pause_claims(factory, kit):
    job = await factory.queued()
    pause = await hold_switch(kit, job, scope="tenant")

    worker = await kit.solo("exports_worker")
    claiming = asyncio.create_task(
        worker.store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-3")
    )
    await kit.wait_until_blocked_by(worker.pid, pause.pid)

    await pause.rollback()
    assert await claiming == ClaimResult.CLAIMED


async def test_a_pause_waits_for_a_claim_then_the_claimed_attempt_is_refused_at_cutoff_2(
    factory, kit, worker_store
):
    job = await factory.queued()
    attempt = uuid.uuid4()
    claim = await kit.hold("exports_worker")
    assert matched(await claim.run("claim_if_queued", claim_params(job, attempt, worker_id="worker-3")))

    api = await kit.solo("exports_api")
    pausing = asyncio.create_task(store_switch(api.store, job, scope=SwitchScope.DESTINATION, enabled=False))
    await kit.wait_until_blocked_by(api.pid, claim.pid)
    await still_waiting(pausing)

    await claim.commit()
    paused = await pausing
    assert paused.enabled is False and paused.was_enabled is True
    assert await factory.status(job.id) == JobStatus.RUNNING  # the claim committed first: it stands

    # The pause committed before cutoff 2: the attempt is not authorized, and is given back.
    assert await authorize(worker_store, job, attempt) == AuthorizationResult.PAUSED
    assert (
        await worker_store.release_attempt_if_running(job.id, attempt, "worker-3", "paused")
    ).value == "Released"
    assert await factory.status(job.id) == JobStatus.QUEUED


# -- a pause and cutoff 2 -------------------------------------------------------------------------------


async def test_cutoff_2_waits_for_a_pause_then_authorizes_nothing(factory, kit):
    job, attempt = await factory.running()
    pause = await hold_switch(kit, job, scope="tenant")

    worker = await kit.solo("exports_worker")
    authorizing = asyncio.create_task(authorize(worker.store, job, attempt))
    await kit.wait_until_blocked_by(worker.pid, pause.pid)
    await still_waiting(authorizing)

    await pause.commit()
    assert await authorizing == AuthorizationResult.PAUSED
    row = await factory.job(job.id)
    assert (row.status, row.delivery_authorized_at) == (JobStatus.RUNNING, None)
    assert await factory.event_kinds(job.id) == ["Claimed"]


async def test_a_pause_waits_for_cutoff_2_then_finds_the_delivery_past_it(factory, kit):
    job, attempt = await factory.running()
    cutoff = await kit.hold("exports_worker")
    assert matched(await cutoff.run("authorize_delivery_if_running", authorize_params(job, attempt)))

    api = await kit.solo("exports_api")
    pausing = asyncio.create_task(store_switch(api.store, job, scope=SwitchScope.DESTINATION, enabled=False))
    await kit.wait_until_blocked_by(api.pid, cutoff.pid)
    await still_waiting(pausing)

    await cutoff.commit()
    await pausing
    assert await factory.status(job.id) == JobStatus.DELIVERING  # authorized first: it finishes
    activity = await api.store.scope_activity(tenant_id=job.tenant_id, destination_id=job.destination_id)
    assert (activity.running, activity.delivering) == (0, 1)


# -- a retirement and cutoff 2 --------------------------------------------------------------------------


async def _hold_retirement(kit, job):
    retire = await kit.hold(None)  # an administrator's connection
    rows = await retire.run(
        "retire_destination",
        {
            "tenant_id": job.tenant_id,
            "destination_id": job.destination_id,
            "retired_by": "lee.admin",
            "changed_role": "owner",
            "reason": "contract ended",
        },
    )
    assert len(rows) == 1
    return retire


async def test_cutoff_2_waits_for_a_retirement_then_stops_the_attempt(factory, kit):
    job, attempt = await factory.running()
    retire = await _hold_retirement(kit, job)

    worker = await kit.solo("exports_worker")
    authorizing = asyncio.create_task(authorize(worker.store, job, attempt))
    await kit.wait_until_blocked_by(worker.pid, retire.pid)
    await still_waiting(authorizing)

    await retire.commit()
    assert await authorizing == AuthorizationResult.DESTINATION_INACTIVE
    assert await factory.status(job.id) == JobStatus.RUNNING


async def test_a_retirement_waits_for_cutoff_2_and_the_authorized_delivery_stands(factory, kit):
    job, attempt = await factory.running()
    cutoff = await kit.hold("exports_worker")
    assert matched(await cutoff.run("authorize_delivery_if_running", authorize_params(job, attempt)))

    retire = await kit.hold(None)
    retiring = asyncio.create_task(
        retire.run(
            "retire_destination",
            {
                "tenant_id": job.tenant_id,
                "destination_id": job.destination_id,
                "retired_by": "lee.admin",
                "changed_role": "owner",
                "reason": "contract ended",
            },
        )
    )
    await kit.wait_until_blocked_by(retire.pid, cutoff.pid)
    await still_waiting(retiring)

    await cutoff.commit()
    assert len(await retiring) == 1
    await retire.commit()
    assert await factory.status(job.id) == JobStatus.DELIVERING


async def test_a_claim_does_not_wait_for_a_retirement(factory, kit, worker_store):
    # The claim does not read the destination row: the policy check before it did, and cutoff 2 re-checks.
    job = await factory.queued()
    retire = await _hold_retirement(kit, job)
    result = await asyncio.wait_for(
        worker_store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-3"), timeout=5
    )
    await retire.commit()
    assert result == ClaimResult.CLAIMED
