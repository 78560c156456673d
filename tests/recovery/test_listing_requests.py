"""A reconciler's request for today's listing of a final name (issue 26 item 4, migration 0033) is answered by
recovery's next run, against real SFTP servers and a real PostgreSQL, through RecoveryWorkflow on the
time-skipping server: the API records it (it holds no partner credentials), recovery lists the name once and
appends what it saw, with how its rules read it, as the attempt's evidence observed by
``reconciler-request:<id>``; it settles nothing, never contacts a paused partner, and a partner that does not
answer is an answer too."""

from __future__ import annotations

import json
import os

import pytest

from domain.models import DeliveryOutcome, EventKind, FinishResult, JobStatus
from rules.recovery import attempt_evidence
from service.auth import Caller
from service.outcomes import Kind
from service.reconciliation import Reconciliation
from testbed.sftp import SftpTarget
from tests.recovery.test_recovery_delivering import SIZE, delivering_to, recover

asyncssh_only = pytest.mark.parametrize("sftp_server", ["asyncssh"])


async def unknown_with_its_file_published(factory, target: SftpTarget, data: bytes):
    """The worker's rename landed and its answer was lost; the worker recorded OutcomeUnknown itself."""
    job, attempt = await delivering_to(factory, target, data)
    target.put(job.final_name, data)
    assert (
        await factory.worker.finish_delivery(job.id, attempt, DeliveryOutcome.OUTCOME_UNKNOWN)
        == FinishResult.WRITTEN
    )
    return job, attempt


async def ask(api_store, job) -> str:
    answer = await Reconciliation(api_store).request_listing(
        Caller(tenant_id=job.tenant_id, principal="rita.recon", role="reconciler"), job.id
    )
    assert answer.kind == Kind.ACCEPTED, answer.body
    return str(answer.body["request_id"])


async def answers(factory, job_id) -> list[tuple[str, dict]]:
    return [
        (e.observed_by, json.loads(e.detail))
        for e in await factory.worker.job_events(job_id)
        if e.kind == EventKind.DELIVERY_EVIDENCE and (e.observed_by or "").startswith("reconciler-request:")
    ]


async def test_a_listing_request_is_answered_by_recoverys_next_run_and_settles_nothing(
    client, settings, recovery_worker, factory, api_store, sftp_target: SftpTarget
):
    data = os.urandom(SIZE)
    job, attempt = await unknown_with_its_file_published(factory, sftp_target, data)
    request_id = await ask(api_store, job)

    result = await recover(client, settings)

    assert result.listings_answered == 1
    [(observed_by, seen)] = await answers(factory, job.id)
    assert observed_by == f"reconciler-request:{request_id}"
    assert (seen["observation"], seen["request_id"], seen["final_name"]) == (
        "requested_listing",
        request_id,
        job.expected_file_name,
    )
    assert (seen["present"], seen["size"]) == (True, SIZE)
    assert seen["answered_by"].startswith("recovery:")
    # How recovery's rules read it, for the person: a reading, not a settlement.
    assert seen["rules_read"] == "Completed" and f"size {SIZE} matches" in seen["rules_summary"]
    after = await factory.job(job.id)
    assert after.status == JobStatus.OUTCOME_UNKNOWN
    assert EventKind.RECONCILED not in await factory.event_kinds(job.id)
    assert sftp_target.files() == {job.final_name: data}  # looked at, nothing moved or sent
    # A person's question is never the attempt's own evidence, which recovery's rules weigh.
    events = await factory.worker.job_events(job.id)
    assert all(item.get("observation") != "requested_listing" for item in attempt_evidence(events, attempt))

    reached = sftp_target.proxy.accepted
    again = await recover(client, settings)
    assert again.listings_answered == 0 and sftp_target.proxy.accepted == reached  # answered once


@asyncssh_only
async def test_a_paused_partner_is_not_contacted_and_the_answer_says_why(
    client, settings, recovery_worker, factory, api_store, sftp_target: SftpTarget
):
    job, _ = await unknown_with_its_file_published(factory, sftp_target, os.urandom(SIZE))
    await ask(api_store, job)
    await factory.switch(job.tenant_id, job.destination_id, enabled=False, reason="partner incident")
    reached = sftp_target.proxy.accepted

    result = await recover(client, settings)

    assert result.listings_answered == 1
    [(_, seen)] = await answers(factory, job.id)
    assert seen["error"] == "not asked: deliveries to this partner are paused"
    assert "present" not in seen and "rules_read" not in seen
    assert sftp_target.proxy.accepted == reached  # no session was opened, not even to list


@asyncssh_only
async def test_a_partner_that_does_not_answer_is_the_answer_and_another_listing_may_be_asked(
    client, settings, recovery_worker, factory, api_store, sftp_target: SftpTarget
):
    job, _ = await unknown_with_its_file_published(factory, sftp_target, os.urandom(SIZE))
    await ask(api_store, job)
    sftp_target.proxy.refuse_new_connections()
    try:
        await recover(client, settings)
    finally:
        sftp_target.proxy.refuse_new_connections(False)

    [(_, seen)] = await answers(factory, job.id)
    assert seen["error"] and "present" not in seen
    assert seen["rules_read"] == "OutcomeUnknown"
    await ask(api_store, job)  # the first is answered: the reconciler may ask again
    await recover(client, settings)
    assert [item.get("present") for _, item in await answers(factory, job.id)] == [None, True]


@asyncssh_only
async def test_a_request_for_an_export_settled_meanwhile_is_not_listed(
    client, settings, recovery_worker, factory, api_store, reconciler_store, sftp_target: SftpTarget
):
    job, attempt = await unknown_with_its_file_published(factory, sftp_target, os.urandom(SIZE))
    await ask(api_store, job)
    assert await reconciler_store.reconcile_unknown(
        tenant_id=job.tenant_id,
        job_id=job.id,
        attempt_id=attempt,
        resolution=JobStatus.COMPLETED,
        reconciled_by="kim.reconciler",
        evidence_summary="the partner confirmed by phone",
    )
    reached = sftp_target.proxy.accepted

    result = await recover(client, settings)

    assert result.listings_answered == 0 and await answers(factory, job.id) == []
    assert sftp_target.proxy.accepted == reached
