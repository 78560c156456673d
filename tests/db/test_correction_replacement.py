"""Replacements, reconciliation and corrections on the real server (000 "Recovery", test matrix rows
"Reconciliation", "Replacement creation" and "Correction and replacement, in both orders").

A correction of the original to Completed and a replacement's cutoff 2 meet on the original's row: the
authorization reads it ``FOR SHARE``, the correction updates it, so whichever commits first makes the other
wait, and the waiter re-checks. Creation locks the original ``FOR UPDATE`` and re-checks the same way.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import psycopg
import pytest

from db.errors import ConstraintRefused, NotPermitted, translate
from db.stores.reconciler import ReconcilerStore
from domain.models import (
    AuthorizationResult,
    EventKind,
    ExportJob,
    FailureCode,
    FinishResult,
    JobStatus,
)
from tests.db.race import authorize, authorize_params, matched, still_waiting


async def failed_original(factory) -> tuple[ExportJob, UUID]:
    """An original whose delivery was proven not to have happened: Failed(NotDelivered), replaceable."""
    job, attempt = await factory.in_status(JobStatus.FAILED, code=FailureCode.NOT_DELIVERED)
    assert attempt is not None
    return job, attempt


async def replacement_of(factory, original: ExportJob) -> ExportJob:
    created = await factory.api.create_replacement(
        tenant_id=original.tenant_id,
        original_job_id=original.id,
        created_by="lee.reconciler",
        replacement_reason="partner confirmed nothing was published",
    )
    assert created is not None
    return await factory.job(created.job_id)


def correction_to_completed(original: ExportJob, attempt: UUID) -> dict[str, Any]:
    """``correct_outcome``'s parameters: the original's recorded Failed becomes Completed."""
    return {
        "tenant_id": original.tenant_id,
        "job_id": original.id,
        "attempt_id": attempt,
        "recorded_status": JobStatus.FAILED.value,
        "corrected_status": JobStatus.COMPLETED.value,
        "failure_reason": None,
        "corrected_by": "lee.reconciler",
        "evidence_ref": "ack-4711",
        "why": "partner acknowledged the original file",
    }


async def approve_correction(
    factory, job: ExportJob, attempt: UUID, to: JobStatus = JobStatus.COMPLETED, by: str = "lee.reconciler"
) -> None:
    """A correction takes two people (0032): another reconciler asked for it, ``by`` approved it (and runs it)."""
    await factory.approve(
        job.tenant_id,
        "correct_outcome",
        job.id,
        {"attempt_id": str(attempt), "corrected_status": to.value},
        approved_by=by,
    )


async def correct_to_completed(store, original: ExportJob, attempt: UUID) -> bool:
    params = correction_to_completed(original, attempt)
    return await store.correct_outcome(
        tenant_id=original.tenant_id,
        job_id=original.id,
        attempt_id=attempt,
        recorded_status=JobStatus.FAILED,
        corrected_status=JobStatus.COMPLETED,
        failure_reason=None,
        corrected_by=params["corrected_by"],
        evidence_ref=params["evidence_ref"],
        why=params["why"],
    )


# -- correction vs a replacement's cutoff 2, both lock orders -------------------------------------------


async def test_correction_committed_first_makes_the_replacement_cutoff_report_original_completed(
    factory, kit
):
    original, original_attempt = await failed_original(factory)
    replacement, attempt = await factory.running(await replacement_of(factory, original))
    await approve_correction(factory, original, original_attempt)

    correction = await kit.hold("exports_reconciler")
    assert await correction.run("record_correction", correction_to_completed(original, original_attempt))
    assert await correction.run("correct_outcome", correction_to_completed(original, original_attempt))

    worker = await kit.solo("exports_worker")
    authorizing = asyncio.create_task(authorize(worker.store, replacement, attempt))
    await kit.wait_until_blocked_by(worker.pid, correction.pid)  # FOR SHARE waits for the correction's UPDATE
    await still_waiting(authorizing)

    await correction.commit()
    assert await authorizing == AuthorizationResult.ORIGINAL_COMPLETED

    # The replacement sent nothing and ends Failed with OriginalDelivered.
    assert (
        await worker.store.finish_failed(replacement.id, attempt, FailureCode.ORIGINAL_DELIVERED, None)
        == FinishResult.WRITTEN
    )
    row = await factory.job(replacement.id)
    assert (row.status, row.failure_reason, row.delivery_authorized_at) == (
        JobStatus.FAILED,
        FailureCode.ORIGINAL_DELIVERED,
        None,
    )
    assert (await factory.job(original.id)).status == JobStatus.COMPLETED


async def test_correction_waits_for_a_replacement_cutoff_committed_first_then_succeeds(factory, kit):
    original, original_attempt = await failed_original(factory)
    replacement, attempt = await factory.running(await replacement_of(factory, original))
    # before cutoff 2 holds the creator's principal row FOR SHARE (setting up the approval updates it)
    await approve_correction(factory, original, original_attempt)

    cutoff = await kit.hold("exports_worker")
    assert matched(await cutoff.run("authorize_delivery_if_running", authorize_params(replacement, attempt)))

    reconciler = await kit.solo("exports_reconciler")
    correcting = asyncio.create_task(correct_to_completed(reconciler.store, original, original_attempt))
    await kit.wait_until_blocked_by(reconciler.pid, cutoff.pid)  # the UPDATE waits for the FOR SHARE lock
    await still_waiting(correcting)

    await cutoff.commit()
    assert await correcting is True

    assert (await factory.job(original.id)).status == JobStatus.COMPLETED
    # Already past cutoff 2: from here the final-name check and the partner's contract govern the upload.
    assert (await factory.job(replacement.id)).status == JobStatus.DELIVERING


async def test_replacement_still_queued_when_the_original_is_corrected_is_refused_at_cutoff_2(
    factory, reconciler_store, worker_store
):
    original, original_attempt = await failed_original(factory)
    replacement = await replacement_of(factory, original)
    await approve_correction(factory, original, original_attempt)
    assert await correct_to_completed(reconciler_store, original, original_attempt)

    # The claim deliberately ignores the original: a refused claim would leave the job Queued forever.
    running, attempt = await factory.running(replacement)
    assert await authorize(worker_store, running, attempt) == AuthorizationResult.ORIGINAL_COMPLETED
    assert (await factory.job(replacement.id)).status == JobStatus.RUNNING


# -- creation racing a correction ------------------------------------------------------------------------


async def test_replacement_creation_waits_for_a_correction_to_completed_then_inserts_nothing(factory, kit):
    original, original_attempt = await failed_original(factory)
    await approve_correction(factory, original, original_attempt)
    correction = await kit.hold("exports_reconciler")
    assert await correction.run("record_correction", correction_to_completed(original, original_attempt))
    assert await correction.run("correct_outcome", correction_to_completed(original, original_attempt))

    api = await kit.solo("exports_api")
    creating = asyncio.create_task(
        api.store.create_replacement(
            tenant_id=original.tenant_id,
            original_job_id=original.id,
            created_by="lee.reconciler",
            replacement_reason="retry",
        )
    )
    await kit.wait_until_blocked_by(api.pid, correction.pid)
    await still_waiting(creating)

    await correction.commit()
    assert await creating is None

    rows = await factory.admin(
        "SELECT count(*) AS n FROM export_jobs WHERE replaces_job_id = %(id)s", {"id": original.id}
    )
    assert rows[0]["n"] == 0


async def test_replacement_creation_succeeds_when_the_held_correction_rolls_back(factory, kit):
    original, original_attempt = await failed_original(factory)
    await approve_correction(factory, original, original_attempt)
    correction = await kit.hold("exports_reconciler")
    assert await correction.run("record_correction", correction_to_completed(original, original_attempt))
    assert await correction.run("correct_outcome", correction_to_completed(original, original_attempt))

    api = await kit.solo("exports_api")
    creating = asyncio.create_task(
        api.store.create_replacement(
            tenant_id=original.tenant_id,
            original_job_id=original.id,
            created_by="lee.reconciler",
            replacement_reason="retry",
        )
    )
    await kit.wait_until_blocked_by(api.pid, correction.pid)
    await correction.rollback()

    created = await creating
    assert created is not None
    replacement = await factory.job(created.job_id)
    assert (replacement.replaces_job_id, replacement.delivery_key) == (original.id, original.delivery_key)
    assert await factory.outbox_count(replacement.id) == 1


# -- reconciliation: one-shot ------------------------------------------------------------------------


async def unknown_after_recovery(factory) -> tuple[ExportJob, UUID]:
    job, attempt = await factory.delivering()
    await factory.expire_lease(job.id)
    assert await factory.recovery.resolve_expired_delivery(
        job.id, attempt, JobStatus.OUTCOME_UNKNOWN, "recovery-1", "final name absent, temp present"
    )
    return await factory.job(job.id), attempt


@pytest.mark.parametrize("resolution", [JobStatus.COMPLETED, JobStatus.FAILED])
async def test_reconciliation_is_one_shot_and_keeps_the_recovery_event(
    factory, api_store, reconciler_store, resolution
):
    job, attempt = await unknown_after_recovery(factory)
    reconcile = dict(
        tenant_id=job.tenant_id,
        job_id=job.id,
        attempt_id=attempt,
        reconciled_by="lee.reconciler",
        evidence_summary="partner listing 2026-11-14",
    )

    assert await reconciler_store.reconcile_unknown(resolution=resolution, **reconcile) is True
    row = await factory.job(job.id)
    assert row.status == resolution
    assert row.failure_reason == (FailureCode.NOT_DELIVERED if resolution == JobStatus.FAILED else None)
    kinds = await factory.event_kinds(job.id)
    assert kinds[-2:] == ["ResolvedByRecovery", "Reconciled"]

    # A second reconciliation matches nothing, whichever way it goes ...
    for again in (JobStatus.COMPLETED, JobStatus.FAILED):
        assert await reconciler_store.reconcile_unknown(resolution=again, **reconcile) is False
    # ... and the unique index refuses a second Reconciled event for the attempt even when written directly.
    with pytest.raises(ConstraintRefused) as refused:
        await insert_event_as_api(factory, job.id, attempt, EventKind.RECONCILED)
    assert refused.value.constraint == "uq_attempt_transition"
    assert (await factory.job(job.id)).status == resolution
    # Evidence that arrives afterwards is still appended, and changes nothing.
    assert await factory.recovery.append_delivery_evidence(
        job.id, attempt, "recovery-2", {"observation": "late"}
    )
    assert (await factory.job(job.id)).status == resolution


async def insert_event_as_api(factory, job_id: UUID, attempt_id: UUID, kind: EventKind) -> None:
    """A direct INSERT of an attempt event as the API role (which may insert events)."""
    async with await psycopg.AsyncConnection.connect(factory.db.app_url, autocommit=True) as conn:
        await conn.execute("SET ROLE exports_api")
        try:
            await conn.execute(
                "INSERT INTO export_attempt_events (job_id, attempt_id, kind, recorded_at)"
                " VALUES (%(j)s, %(a)s, %(k)s, clock_timestamp())",
                {"j": job_id, "a": attempt_id, "k": kind.value},
            )
        except psycopg.Error as exc:
            raise translate(exc) from exc


# -- correction: once, by the reconciler, with who and why -----------------------------------------------


async def test_correction_is_recorded_once_with_who_and_why(factory, reconciler_store):
    original, attempt = await failed_original(factory)
    await approve_correction(factory, original, attempt)

    assert await correct_to_completed(reconciler_store, original, attempt) is True

    row = await factory.job(original.id)
    assert (row.status, row.failure_reason) == (JobStatus.COMPLETED, None)
    corrected = [e for e in await factory.worker.job_events(original.id) if e.kind == EventKind.CORRECTED]
    assert len(corrected) == 1
    assert corrected[0].attempt_id == attempt
    assert corrected[0].observed_by == "lee.reconciler"
    assert corrected[0].detail == "Failed to Completed: ack-4711; partner acknowledged the original file"

    # Refused a second time, in either direction, even approved: one correction per attempt (its row's primary
    # key; the unique index on Corrected events stands behind it).
    await approve_correction(factory, original, attempt, JobStatus.FAILED, by="kim.reconciler")
    with pytest.raises(ConstraintRefused) as refused:
        await reconciler_store.correct_outcome(
            tenant_id=original.tenant_id,
            job_id=original.id,
            attempt_id=attempt,
            recorded_status=JobStatus.COMPLETED,
            corrected_status=JobStatus.FAILED,
            failure_reason=FailureCode.NOT_DELIVERED,
            corrected_by="kim.reconciler",
            evidence_ref="ticket-9",
            why="second thoughts",
        )
    assert refused.value.constraint == "pk_outcome_corrections"
    assert (await factory.job(original.id)).status == JobStatus.COMPLETED


@pytest.mark.parametrize("store_name", ["api", "worker"])
async def test_correction_is_refused_for_the_api_and_worker_roles(factory, store_name):
    original, attempt = await failed_original(factory)
    # The reconciler's statement, sent over the API's or the worker's pool: the database refuses the role.
    store = ReconcilerStore((factory.api if store_name == "api" else factory.worker).pool)

    with pytest.raises(NotPermitted):
        await correct_to_completed(store, original, attempt)

    row = await factory.job(original.id)
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    assert EventKind.CORRECTED.value not in await factory.event_kinds(original.id)


@pytest.mark.parametrize("store_name", ["api", "worker"])
async def test_reconciliation_is_refused_for_the_api_and_worker_roles(factory, store_name):
    job, attempt = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
    # The reconciler's statement, sent over the API's or the worker's pool: the database refuses the role.
    store = ReconcilerStore((factory.api if store_name == "api" else factory.worker).pool)

    with pytest.raises(NotPermitted):
        await store.reconcile_unknown(
            tenant_id=job.tenant_id,
            job_id=job.id,
            attempt_id=attempt,
            resolution=JobStatus.COMPLETED,
            reconciled_by="oscar.operator",
            evidence_summary="looked fine to me",
        )

    assert await factory.job(job.id) == job
    assert EventKind.RECONCILED.value not in await factory.event_kinds(job.id)


async def test_correction_to_failed_needs_a_code_and_to_completed_drops_it(factory, reconciler_store, kit):
    completed, attempt = await factory.in_status(JobStatus.COMPLETED)
    assert attempt is not None
    to_failed = dict(
        tenant_id=completed.tenant_id,
        job_id=completed.id,
        attempt_id=attempt,
        recorded_status=JobStatus.COMPLETED,
        corrected_status=JobStatus.FAILED,
        corrected_by="lee.reconciler",
        evidence_ref="listing",
        why="file never appeared",
    )
    await approve_correction(factory, completed, attempt, JobStatus.FAILED)
    with pytest.raises(ConstraintRefused) as refused:
        await reconciler_store.correct_outcome(failure_reason=None, **to_failed)
    assert refused.value.constraint == "ck_export_jobs_failure"
    assert (await factory.job(completed.id)).status == JobStatus.COMPLETED

    failed, failed_attempt = await failed_original(factory)
    await approve_correction(factory, failed, failed_attempt)
    assert await reconciler_store.correct_outcome(
        tenant_id=failed.tenant_id,
        job_id=failed.id,
        attempt_id=failed_attempt,
        recorded_status=JobStatus.FAILED,
        corrected_status=JobStatus.COMPLETED,
        failure_reason=FailureCode.NOT_DELIVERED,  # ignored: only Failed carries a code
        corrected_by="lee.reconciler",
        evidence_ref="ack",
        why="acknowledged",
    )
    assert (await factory.job(failed.id)).failure_reason is None

    # Even the reconciler's own direct UPDATE, along its recorded correction, cannot leave a code on a
    # non-Failed row: the correction to Completed records none, and the row ends with the code its correction
    # recorded (0019's trigger, which refuses before ck_export_jobs_failure would).
    other, other_attempt = await failed_original(factory)
    await approve_correction(factory, other, other_attempt)
    direct = await kit.hold("exports_reconciler")
    assert await direct.run("record_correction", correction_to_completed(other, other_attempt))
    with pytest.raises(psycopg.errors.CheckViolation) as check:
        await direct.execute(
            "UPDATE export_jobs SET status = 'Completed' WHERE id = %(id)s", {"id": other.id}
        )
    assert check.value.diag.constraint_name == "ck_export_jobs_correction_code"


@pytest.mark.parametrize(
    ("status", "recorded"),
    [
        (
            JobStatus.OUTCOME_UNKNOWN,
            JobStatus.OUTCOME_UNKNOWN,
        ),  # not a recorded outcome: reconcile it instead
        (JobStatus.COMPLETED, JobStatus.FAILED),  # the recorded status is not what the corrector read
    ],
)
async def test_correction_matches_nothing_unless_it_names_the_recorded_outcome(
    factory, reconciler_store, status, recorded
):
    job, attempt = await factory.in_status(status)
    assert attempt is not None
    corrected = JobStatus.COMPLETED if recorded != JobStatus.COMPLETED else JobStatus.FAILED
    await approve_correction(factory, job, attempt, corrected)  # approved: it is the status that refuses
    assert (
        await reconciler_store.correct_outcome(
            tenant_id=job.tenant_id,
            job_id=job.id,
            attempt_id=attempt,
            recorded_status=recorded,
            corrected_status=JobStatus.COMPLETED if recorded != JobStatus.COMPLETED else JobStatus.FAILED,
            failure_reason=FailureCode.NOT_DELIVERED,
            corrected_by="lee.reconciler",
            evidence_ref="e",
            why="w",
        )
        is False
    )
    assert await factory.job(job.id) == job


# -- a replacement's terms are its original's (0015) ---------------------------------------------------


async def queued_replacement(factory) -> tuple[ExportJob, ExportJob]:
    original, _ = await failed_original(factory)
    return original, await replacement_of(factory, original)


async def test_a_queued_replacements_terms_edit_matches_nothing_and_changes_nothing(factory):
    original, replacement = await queued_replacement(factory)
    assert replacement.status == JobStatus.QUEUED
    wakeups = await factory.outbox_count(replacement.id)

    version = await factory.api.edit_terms_if_queued(
        tenant_id=replacement.tenant_id,
        job_id=replacement.id,
        expected_version=replacement.version,
        destination_id=replacement.destination_id,
        list_name="another-list",
    )

    assert version is None
    assert await factory.job(replacement.id) == replacement
    assert await factory.outbox_count(replacement.id) == wakeups
    assert (replacement.list_name, replacement.destination_id) == (
        original.list_name,
        original.destination_id,
    )


@pytest.mark.parametrize("assignment", ["list_name = 'another-list'", "destination_id = gen_random_uuid()"])
async def test_the_trigger_refuses_a_replacements_new_terms_even_for_a_superuser(factory, assignment):
    _, replacement = await queued_replacement(factory)

    async with await psycopg.AsyncConnection.connect(factory.db.admin_url, autocommit=True) as admin:
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            await admin.execute(
                psycopg.sql.SQL("UPDATE export_jobs SET {a} WHERE id = %(id)s").format(
                    a=psycopg.sql.SQL(assignment)
                ),
                {"id": replacement.id},
            )

    assert refused.value.diag.constraint_name == "ck_export_jobs_replacement_terms"
    assert await factory.job(replacement.id) == replacement


async def test_the_trigger_lets_a_replacement_keep_its_terms_and_an_original_change_them(factory):
    _, replacement = await queued_replacement(factory)
    original = await factory.queued()

    async with await psycopg.AsyncConnection.connect(factory.db.admin_url, autocommit=True) as admin:
        # The same terms written again are no change; an original's new list is an edit like any other.
        await admin.execute(
            "UPDATE export_jobs SET list_name = list_name WHERE id = %(id)s", {"id": replacement.id}
        )
        await admin.execute("UPDATE export_jobs SET list_name = 'vip' WHERE id = %(id)s", {"id": original.id})

    assert (await factory.job(original.id)).list_name == "vip"
