"""Cutoff 2 re-checks the facts outside the claimed row that the policy check read before the build (issue
23.6; 001 "facts that live outside the claimed row"): the creator may still export the list, and the list
still has contacts. A refusal authorizes nothing (PolicyDenied); the attempt gives the job back and the next
claim's policy check rejects it with the policy's reason. The principal row is read FOR SHARE, so a
revocation and cutoff 2 serialize, in both orders (held transactions, ``pg_blocking_pids``)."""

from __future__ import annotations

import asyncio

import pytest

from domain.models import AuthorizationResult, JobStatus
from rules.policy import evaluate_policy
from tests.db.race import authorize, authorize_params, matched, still_waiting

CREATOR = "admin@acme"  # the factory's creator of every export

REVOKE = "UPDATE principals SET revoked_at = clock_timestamp(), revoked_by = 'lee.admin' WHERE tenant_id = %(t)s AND name = %(n)s"


async def test_a_creator_revoked_during_the_build_is_refused_at_cutoff_2(factory, worker_store):
    job, attempt = await factory.running()
    await factory.admin(REVOKE, {"t": job.tenant_id, "n": CREATOR})

    assert await authorize(worker_store, job, attempt) == AuthorizationResult.POLICY_DENIED

    row = await factory.job(job.id)
    assert (row.status, row.attempt_id, row.delivery_authorized_at) == (JobStatus.RUNNING, attempt, None)
    assert await factory.event_kinds(job.id) == ["Claimed"]


async def test_a_list_that_lost_its_contacts_during_the_build_is_refused_at_cutoff_2(factory, worker_store):
    job, attempt = await factory.running()
    await factory.admin(
        "DELETE FROM contacts WHERE tenant_id = %(t)s AND list_name = %(l)s",
        {"t": job.tenant_id, "l": job.list_name},
    )

    assert await authorize(worker_store, job, attempt) == AuthorizationResult.POLICY_DENIED
    assert (await factory.job(job.id)).status == JobStatus.RUNNING


async def test_a_creator_no_longer_allowed_this_list_is_refused_at_cutoff_2(factory, worker_store):
    job, attempt = await factory.running()
    await factory.principal(job.tenant_id, CREATOR, export_lists=["newsletter"])

    assert await authorize(worker_store, job, attempt) == AuthorizationResult.POLICY_DENIED


async def test_a_stop_request_is_still_reported_first(factory, worker_store):
    job, attempt = await factory.running()
    await factory.cancel(job)
    await factory.admin(REVOKE, {"t": job.tenant_id, "n": CREATOR})
    assert await authorize(worker_store, job, attempt) == AuthorizationResult.STOP_RECORDED


@pytest.mark.parametrize(
    "change",
    [
        None,
        REVOKE,
        "UPDATE principals SET export_lists = ARRAY['newsletter'] WHERE tenant_id = %(t)s AND name = %(n)s",
        "UPDATE principals SET export_lists = ARRAY['main', 'other'] WHERE tenant_id = %(t)s AND name = %(n)s",
        "DELETE FROM contacts WHERE tenant_id = %(t)s",
        "UPDATE principals SET role = 'viewer' WHERE tenant_id = %(t)s AND name = %(n)s",  # may not export
        "UPDATE principals SET role = 'admin' WHERE tenant_id = %(t)s AND name = %(n)s",
    ],
)
async def test_cutoff_2_and_the_policy_check_agree_on_the_creator_and_the_list(factory, worker_store, change):
    job, attempt = await factory.running()
    if change is not None:
        await factory.admin(change, {"t": job.tenant_id, "n": CREATOR})
    facts = await worker_store.read_policy_facts(job.id)
    assert facts is not None

    answer = await authorize(worker_store, job, attempt)

    allowed = evaluate_policy(facts).allowed
    assert answer == (AuthorizationResult.AUTHORIZED if allowed else AuthorizationResult.POLICY_DENIED)


async def test_cutoff_2_waits_for_a_revocation_then_authorizes_nothing(factory, kit):
    job, attempt = await factory.running()
    revocation = await kit.hold(None)  # an administrator's connection
    await revocation.execute(REVOKE, {"t": job.tenant_id, "n": CREATOR})

    worker = await kit.solo("exports_worker")
    authorizing = asyncio.create_task(authorize(worker.store, job, attempt))
    await kit.wait_until_blocked_by(worker.pid, revocation.pid)
    await still_waiting(authorizing)

    await revocation.commit()
    assert await authorizing == AuthorizationResult.POLICY_DENIED
    assert (await factory.job(job.id)).status == JobStatus.RUNNING


async def test_a_revocation_waits_for_cutoff_2_which_stands(factory, kit):
    job, attempt = await factory.running()
    cutoff = await kit.hold("exports_worker")
    assert matched(await cutoff.run("authorize_delivery_if_running", authorize_params(job, attempt)))

    admin = await kit.hold(None)
    revoking = asyncio.create_task(
        admin.execute(REVOKE + " RETURNING name", {"t": job.tenant_id, "n": CREATOR})
    )
    await kit.wait_until_blocked_by(admin.pid, cutoff.pid)
    await still_waiting(revoking)

    await cutoff.commit()
    assert await revoking == [{"name": CREATOR}]
    await admin.commit()
    # Delivery was authorized before the revocation: it stands (the revocation stops what is still queued).
    assert (await factory.job(job.id)).status == JobStatus.DELIVERING


async def test_the_worker_may_lock_a_principal_but_never_change_it(factory, kit):
    job, _ = await factory.running()
    worker = await kit.hold("exports_worker")
    with pytest.raises(Exception, match="never changes them"):
        await worker.execute(
            "UPDATE principals SET name = name WHERE tenant_id = %(t)s AND name = %(n)s",
            {"t": job.tenant_id, "n": CREATOR},
        )
