"""Recovery settles an OutcomeUnknown on evidence a later re-check found (0013), on the real server: the
statement's conditions, its nomination, the guard's edge, and its races with a person's reconciliation and
with a replacement's creation, in both orders (held transaction, ``pg_blocking_pids``, then commit).

A settlement is the attempt's one reconciliation: its ``Reconciled`` event is unique per attempt, recorded
under the recovery run's ID. A replacement delivers under its original's final name, so an original that a
replacement names is never settled from a listing; creation and settlement lock the original's row, and the
settling statement runs after its lock, so it sees a replacement committed while it waited.

Recovery also settles an OutcomeUnknown from the row's own fences (issue 23): upload fenced and no rename fence
means the rename request was never sent, so Failed NotDelivered, with no listing (``settle_unknown_by_fences``).
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest

from db.errors import NotPermitted, translate
from domain.models import DeliveryOutcome, EventKind, ExportJob, FailureCode, FinishResult, JobStatus
from tests.db.race import still_waiting

RUN = "recovery:recovery-test/run-1"
MINUTE = 60.0
DAY = 24 * 3600.0


async def unknown(factory) -> tuple[ExportJob, UUID]:
    """An original the worker recorded OutcomeUnknown (its rename's answer lost, say)."""
    job, attempt = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
    assert attempt is not None
    return job, attempt


async def settle(factory, job: ExportJob, attempt: UUID, resolution=JobStatus.COMPLETED) -> bool:
    return await factory.recovery.settle_unknown_by_evidence(
        job.id, attempt, resolution, RUN, "listing by recovery: the expected file"
    )


async def reconcile(factory, job: ExportJob, attempt: UUID) -> bool:
    return await factory.reconciler.reconcile_unknown(
        tenant_id=job.tenant_id,
        job_id=job.id,
        attempt_id=attempt,
        resolution=JobStatus.FAILED,
        reconciled_by="lee.reconciler",
        evidence_summary="the partner says nothing arrived",
    )


async def reconciled_events(factory, job_id: UUID) -> list[Any]:
    return [e for e in await factory.worker.job_events(job_id) if e.kind == EventKind.RECONCILED]


def settle_params(
    job: ExportJob, attempt: UUID, resolution: JobStatus = JobStatus.COMPLETED
) -> dict[str, Any]:
    """``settle_unknown_by_evidence``'s parameters as ``RecoveryStore.settle_unknown_by_evidence`` binds them."""
    return {
        "job_id": job.id,
        "attempt_id": attempt,
        "resolution": resolution.value,
        "recovery_run_id": RUN,
        "evidence_summary": "listing by recovery: the expected file",
    }


def replacement_params(original: ExportJob) -> dict[str, Any]:
    return {
        "tenant_id": original.tenant_id,
        "original_job_id": original.id,
        "job_id": uuid4(),
        "created_by": "lee.reconciler",
        "replacement_reason": "retry",
        "overwrite_agreement_ref": None,
        "traceparent": None,
    }


async def replace(factory, original: ExportJob) -> UUID:
    created = await factory.api.create_replacement(
        tenant_id=original.tenant_id,
        original_job_id=original.id,
        created_by="lee.reconciler",
        replacement_reason="retry",
    )
    assert created is not None
    return created.job_id


# -- the statement ---------------------------------------------------------------------------------------


async def test_a_settlement_to_completed_writes_the_status_and_its_reconciled_event_together(factory):
    job, attempt = await unknown(factory)

    assert await settle(factory, job, attempt)

    settled = await factory.job(job.id)
    assert (settled.status, settled.failure_reason) == (JobStatus.COMPLETED, None)
    (event,) = await reconciled_events(factory, job.id)
    assert (event.attempt_id, event.observed_by) == (attempt, RUN)
    assert event.detail == "Completed: listing by recovery: the expected file"


async def test_a_settlement_to_failed_records_not_delivered(factory):
    job, attempt = await unknown(factory)

    assert await settle(factory, job, attempt, JobStatus.FAILED)

    settled = await factory.job(job.id)
    assert (settled.status, settled.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    (event,) = await reconciled_events(factory, job.id)
    assert event.detail.startswith("Failed: ")


async def test_a_settlement_is_once_per_attempt_and_only_for_its_attempt(factory):
    job, attempt = await unknown(factory)

    assert not await settle(factory, job, uuid4())  # another attempt's
    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN
    assert await settle(factory, job, attempt)
    assert not await settle(factory, job, attempt, JobStatus.FAILED)  # already settled

    assert await factory.status(job.id) == JobStatus.COMPLETED
    assert len(await reconciled_events(factory, job.id)) == 1


@pytest.mark.parametrize("status", [JobStatus.DELIVERING, JobStatus.COMPLETED, JobStatus.FAILED])
async def test_only_an_outcome_unknown_is_settled(factory, status):
    job, attempt = await factory.in_status(status, code=FailureCode.NOT_DELIVERED)
    assert attempt is not None

    assert not await settle(factory, job, attempt)

    assert await factory.status(job.id) == status
    assert await reconciled_events(factory, job.id) == []


async def test_an_outcome_unknown_is_never_settled_as_outcome_unknown(factory):
    job, attempt = await unknown(factory)
    with pytest.raises(ValueError):
        await settle(factory, job, attempt, JobStatus.OUTCOME_UNKNOWN)


async def test_a_person_who_reconciled_first_wins_and_a_settlement_after_matches_nothing(factory):
    job, attempt = await unknown(factory)
    assert await reconcile(factory, job, attempt)

    assert not await settle(factory, job, attempt)

    settled = await factory.job(job.id)
    assert (settled.status, settled.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    (event,) = await reconciled_events(factory, job.id)
    assert event.observed_by == "lee.reconciler"


async def test_a_person_cannot_reconcile_what_recovery_settled(factory):
    job, attempt = await unknown(factory)
    assert await settle(factory, job, attempt)

    assert not await reconcile(factory, job, attempt)
    assert await factory.status(job.id) == JobStatus.COMPLETED


async def test_an_original_a_replacement_names_is_never_settled(factory):
    # A replacement delivers under the original's final name: a file there may be the replacement's.
    job, attempt = await unknown(factory)
    await replace(factory, job)

    assert not await settle(factory, job, attempt)

    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN
    assert await reconciled_events(factory, job.id) == []


# -- the guard -------------------------------------------------------------------------------------------


async def test_the_guard_lets_recovery_take_an_outcome_unknown_but_never_change_a_recorded_outcome(
    factory, kit
):
    job, attempt = await unknown(factory)
    recovery = await kit.hold("exports_recovery")
    await recovery.execute(
        "UPDATE export_jobs SET status = 'Completed' WHERE id = %(id)s AND status = 'OutcomeUnknown'",
        {"id": job.id},
    )
    await recovery.rollback()

    done, _ = await factory.in_status(JobStatus.COMPLETED)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await recovery.execute("UPDATE export_jobs SET status = 'Failed' WHERE id = %(id)s", {"id": done.id})
    await recovery.rollback()


@pytest.mark.parametrize("role", ["exports_worker", "exports_api", "exports_dispatcher"])
async def test_no_other_process_role_takes_outcome_unknown_to_an_outcome(factory, kit, role):
    job, _ = await unknown(factory)
    held = await kit.hold(role)
    with pytest.raises(psycopg.Error) as refused:
        await held.execute("UPDATE export_jobs SET status = 'Completed' WHERE id = %(id)s", {"id": job.id})
    assert isinstance(translate(refused.value), NotPermitted)
    await held.rollback()
    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN


# -- the nomination --------------------------------------------------------------------------------------


async def recorded_ago(factory, job_id: UUID, seconds: float) -> None:
    """Date the attempt's OutcomeUnknown write ``seconds`` back (the database clock decides the windows)."""
    await factory.admin(
        "UPDATE export_attempt_events SET recorded_at = clock_timestamp() - make_interval(secs => %(s)s)"
        " WHERE job_id = %(id)s AND kind = 'Finished'",
        {"id": job_id, "s": seconds},
    )


async def listed_by_recovery_ago(
    factory, job: ExportJob, attempt: UUID, seconds: float, *, answered: bool = False
) -> None:
    """Recovery's listing of the final name ``seconds`` ago: unanswered (an ``error``) unless ``answered``."""
    seen = {"present": False, "size": None} if answered else {"error": "TimeoutError (3 tries)"}
    await factory.recovery.append_delivery_evidence(
        job.id, attempt, RUN, {"observation": "recovery_listing", **seen}
    )
    await factory.admin(
        "UPDATE export_attempt_events SET recorded_at = clock_timestamp() - make_interval(secs => %(s)s)"
        " WHERE job_id = %(id)s AND kind = 'DeliveryEvidence'",
        {"id": job.id, "s": seconds},
    )


async def nominated(factory) -> set[UUID]:
    found = await factory.recovery.find_unknowns_to_recheck(
        observer_prefix="recovery:", within_seconds=DAY, every_seconds=10 * MINUTE, limit=10_000
    )
    return {c.job_id for c in found}


async def test_an_outcome_unknown_is_nominated_one_interval_after_it_was_recorded_within_the_window(factory):
    fresh, _ = await unknown(factory)
    due, attempt = await unknown(factory)
    await recorded_ago(factory, due.id, 20 * MINUTE)
    old, _ = await unknown(factory)
    await recorded_ago(factory, old.id, 2 * DAY)

    found = await factory.recovery.find_unknowns_to_recheck(
        observer_prefix="recovery:", within_seconds=DAY, every_seconds=10 * MINUTE, limit=10_000
    )

    ids = {c.job_id: c.attempt_id for c in found}
    assert ids.get(due.id) == attempt
    assert fresh.id not in ids  # the worker or recovery listed it just now
    assert old.id not in ids  # past the window: a person's now


async def test_an_outcome_unknown_listed_by_recovery_within_the_interval_waits_for_the_next(factory):
    recent, recent_attempt = await unknown(factory)
    await recorded_ago(factory, recent.id, 30 * MINUTE)
    await listed_by_recovery_ago(factory, recent, recent_attempt, 5 * MINUTE)
    earlier, earlier_attempt = await unknown(factory)
    await recorded_ago(factory, earlier.id, 30 * MINUTE)
    await listed_by_recovery_ago(factory, earlier, earlier_attempt, 15 * MINUTE)

    ids = await nominated(factory)

    assert recent.id not in ids
    assert earlier.id in ids


async def test_an_outcome_unknown_whose_partner_answered_recovery_is_left_to_a_person(factory):
    # A partner that answered gave what it will give: listing it every interval would settle nothing.
    job, attempt = await unknown(factory)
    await recorded_ago(factory, job.id, 3 * 3600)
    await listed_by_recovery_ago(factory, job, attempt, 2 * 3600, answered=True)

    assert job.id not in await nominated(factory)


async def test_reconciled_replaced_and_settled_jobs_are_never_nominated(factory):
    reconciled, reconciled_attempt = await unknown(factory)
    replaced, _ = await unknown(factory)
    settled, settled_attempt = await unknown(factory)
    for job in (reconciled, replaced, settled):
        await recorded_ago(factory, job.id, 20 * MINUTE)
    assert await reconcile(factory, reconciled, reconciled_attempt)
    await replace(factory, replaced)
    assert await settle(factory, settled, settled_attempt)

    ids = await nominated(factory)

    assert not ids & {reconciled.id, replaced.id, settled.id}


# -- races -----------------------------------------------------------------------------------------------


async def test_a_settlement_waits_for_a_replacement_being_created_then_matches_nothing(factory, kit):
    job, attempt = await unknown(factory)
    creation = await kit.hold("exports_api")
    assert await creation.run("create_replacement", replacement_params(job))

    recovery = await kit.solo("exports_recovery")
    settling = asyncio.create_task(
        recovery.store.settle_unknown_by_evidence(
            job.id, attempt, JobStatus.COMPLETED, RUN, "the expected file"
        )
    )
    await kit.wait_until_blocked_by(recovery.pid, creation.pid)
    await still_waiting(settling)

    await creation.commit()
    assert await settling is False  # its statement ran after the lock: it saw the replacement

    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN
    assert await reconciled_events(factory, job.id) == []


async def test_a_replacement_waits_for_a_settlement_to_completed_then_is_refused(factory, kit):
    job, attempt = await unknown(factory)
    settling = await kit.hold("exports_recovery")
    assert await settling.run("lock_unknown_for_settling", settle_params(job, attempt))
    assert await settling.run("settle_unknown_by_evidence", settle_params(job, attempt))

    api = await kit.solo("exports_api")
    creating = asyncio.create_task(
        api.store.create_replacement(
            tenant_id=job.tenant_id,
            original_job_id=job.id,
            created_by="lee.reconciler",
            replacement_reason="retry",
        )
    )
    await kit.wait_until_blocked_by(api.pid, settling.pid)
    await still_waiting(creating)

    await settling.commit()
    assert await creating is None

    assert await factory.status(job.id) == JobStatus.COMPLETED
    rows = await factory.admin(
        "SELECT count(*) AS n FROM export_jobs WHERE replaces_job_id = %(id)s", {"id": job.id}
    )
    assert rows[0]["n"] == 0


async def test_a_settlement_waits_for_a_persons_reconciliation_then_matches_nothing(factory, kit):
    job, attempt = await unknown(factory)
    person = await kit.hold("exports_reconciler")
    assert await person.run(
        "reconcile_unknown",
        {
            "tenant_id": job.tenant_id,
            "job_id": job.id,
            "attempt_id": attempt,
            "resolution": JobStatus.FAILED.value,
            "reconciled_by": "lee.reconciler",
            "evidence_summary": "the partner says nothing arrived",
        },
    )

    recovery = await kit.solo("exports_recovery")
    settling = asyncio.create_task(
        recovery.store.settle_unknown_by_evidence(
            job.id, attempt, JobStatus.COMPLETED, RUN, "the expected file"
        )
    )
    await kit.wait_until_blocked_by(recovery.pid, person.pid)
    await still_waiting(settling)

    await person.commit()
    assert await settling is False

    assert await factory.status(job.id) == JobStatus.FAILED
    (event,) = await reconciled_events(factory, job.id)
    assert event.observed_by == "lee.reconciler"


async def test_a_persons_reconciliation_waits_for_a_settlement_then_matches_nothing(factory, kit):
    job, attempt = await unknown(factory)
    settling = await kit.hold("exports_recovery")
    assert await settling.run("lock_unknown_for_settling", settle_params(job, attempt))
    assert await settling.run("settle_unknown_by_evidence", settle_params(job, attempt))

    reconciler = await kit.solo("exports_reconciler")
    reconciling = asyncio.create_task(
        reconciler.store.reconcile_unknown(
            tenant_id=job.tenant_id,
            job_id=job.id,
            attempt_id=attempt,
            resolution=JobStatus.FAILED,
            reconciled_by="lee.reconciler",
            evidence_summary="the partner says nothing arrived",
        )
    )
    await kit.wait_until_blocked_by(reconciler.pid, settling.pid)
    await still_waiting(reconciling)

    await settling.commit()
    assert await reconciling is False

    assert await factory.status(job.id) == JobStatus.COMPLETED
    (event,) = await reconciled_events(factory, job.id)
    assert event.observed_by == RUN


# -- settling from the row's own fences (issue 23) ------------------------------------------------------
#
# An OutcomeUnknown whose attempt fenced its upload and never its rename never sent the rename request (it is
# never sent unless that fence matched), so it never wrote the final name: Failed NotDelivered with no listing,
# as the attempt's one reconciliation. No fence can be written any more: both require Delivering.

FENCES_DETAIL = (
    "Failed: the attempt fenced its upload and never its rename, so it never sent the rename request "
    "and never wrote the final name"
)


async def unknown_fenced(
    factory, fenced: str = "upload", job: ExportJob | None = None
) -> tuple[ExportJob, UUID]:
    """An OutcomeUnknown the worker recorded after its fences up to ``fenced`` ("none", "upload", "rename"):
    as older code did after a refused upload whose fresh listing failed."""
    job, attempt = await factory.delivering(job)
    if fenced != "none":
        await factory.fence(job.id, attempt, rename=fenced == "rename")
    finished = await factory.worker.finish_delivery(
        job.id,
        attempt,
        DeliveryOutcome.OUTCOME_UNKNOWN,
        summary="upload refused and the fresh listing failed",
    )
    assert finished == FinishResult.WRITTEN
    return await factory.job(job.id), attempt


async def settle_by_fences(factory, job: ExportJob, attempt: UUID) -> bool:
    return await factory.recovery.settle_unknown_by_fences(job.id, attempt, RUN)


async def nominated_by_fences(factory) -> set[UUID]:
    return {c.job_id for c in await factory.recovery.find_unpublished_unknowns(limit=10_000)}


def fences_params(job: ExportJob, attempt: UUID) -> dict[str, Any]:
    return {"job_id": job.id, "attempt_id": attempt, "recovery_run_id": RUN}


async def test_an_unknown_that_fenced_its_upload_and_never_its_rename_is_settled_not_delivered(factory):
    job, attempt = await unknown_fenced(factory)

    assert await settle_by_fences(factory, job, attempt)

    settled = await factory.job(job.id)
    assert (settled.status, settled.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    assert (settled.upload_fenced_at is not None, settled.rename_fenced_at) == (True, None)
    (event,) = await reconciled_events(factory, job.id)
    assert (event.attempt_id, event.observed_by, event.detail) == (attempt, RUN, FENCES_DETAIL)


@pytest.mark.parametrize("fenced", ["rename", "none"])
async def test_the_fences_settle_only_an_unknown_with_its_upload_fence_and_no_rename_fence(factory, fenced):
    # Past the rename fence the rename may have been sent, or its fence committed and its answer lost: the
    # fences prove nothing. Without an upload fence the row is not what this statement was given to prove.
    job, attempt = await unknown_fenced(factory, fenced)

    assert not await settle_by_fences(factory, job, attempt)

    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN
    assert await reconciled_events(factory, job.id) == []
    assert job.id not in await nominated_by_fences(factory)


async def test_the_fences_of_an_attempt_authorized_before_they_existed_prove_nothing(factory):
    job, attempt = await unknown_fenced(factory)
    await factory.admin("UPDATE export_jobs SET fence_expected = false WHERE id = %(id)s", {"id": job.id})

    assert not await settle_by_fences(factory, job, attempt)

    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN
    assert job.id not in await nominated_by_fences(factory)


async def test_the_fences_settle_only_an_outcome_unknown_and_only_for_its_attempt(factory):
    delivering, delivering_attempt = await factory.delivering()
    await factory.fence(
        delivering.id, delivering_attempt, rename=False
    )  # recovery's takeover is another statement
    job, attempt = await unknown_fenced(factory)

    assert not await settle_by_fences(factory, delivering, delivering_attempt)
    assert not await settle_by_fences(factory, job, uuid4())
    assert await settle_by_fences(factory, job, attempt)
    assert not await settle_by_fences(factory, job, attempt)  # once: it is Failed now

    assert await factory.status(delivering.id) == JobStatus.DELIVERING
    assert len(await reconciled_events(factory, job.id)) == 1


async def test_a_person_who_reconciled_first_wins_over_the_fences(factory):
    job, attempt = await unknown_fenced(factory)
    assert await reconcile(factory, job, attempt)

    assert not await settle_by_fences(factory, job, attempt)

    (event,) = await reconciled_events(factory, job.id)
    assert event.observed_by == "lee.reconciler"


async def test_an_original_a_replacement_names_is_settled_from_its_fences_all_the_same(factory):
    # Unlike a listing, the fences are this attempt's own requests, not the final name it shares with the
    # replacement: they prove the original never wrote it.
    job, attempt = await unknown_fenced(factory)
    await replace(factory, job)

    assert job.id in await nominated_by_fences(factory)
    assert await settle_by_fences(factory, job, attempt)

    assert await factory.status(job.id) == JobStatus.FAILED


async def test_an_unknown_is_nominated_by_its_fences_whenever_it_was_recorded(factory):
    # The proof does not age, and needs no listing: neither the re-check's interval nor its window applies.
    fresh, _ = await unknown_fenced(factory)
    old, _ = await unknown_fenced(factory)
    await recorded_ago(factory, old.id, 30 * DAY)
    settled, settled_attempt = await unknown_fenced(factory)
    assert await settle_by_fences(factory, settled, settled_attempt)

    ids = await nominated_by_fences(factory)

    assert {fresh.id, old.id} <= ids
    assert settled.id not in ids


async def test_a_settlement_by_the_fences_waits_for_a_persons_reconciliation_then_matches_nothing(
    factory, kit
):
    job, attempt = await unknown_fenced(factory)
    person = await kit.hold("exports_reconciler")
    assert await person.run(
        "reconcile_unknown",
        {
            "tenant_id": job.tenant_id,
            "job_id": job.id,
            "attempt_id": attempt,
            "resolution": JobStatus.COMPLETED.value,
            "reconciled_by": "lee.reconciler",
            "evidence_summary": "the partner says it arrived",
        },
    )

    recovery = await kit.solo("exports_recovery")
    settling = asyncio.create_task(recovery.store.settle_unknown_by_fences(job.id, attempt, RUN))
    await kit.wait_until_blocked_by(recovery.pid, person.pid)
    await still_waiting(settling)

    await person.commit()
    assert await settling is False  # re-evaluated on the committed row: no longer OutcomeUnknown

    assert await factory.status(job.id) == JobStatus.COMPLETED
    (event,) = await reconciled_events(factory, job.id)
    assert event.observed_by == "lee.reconciler"


async def test_a_persons_reconciliation_waits_for_a_settlement_by_the_fences_then_matches_nothing(
    factory, kit
):
    job, attempt = await unknown_fenced(factory)
    settling = await kit.hold("exports_recovery")
    assert await settling.run("settle_unknown_by_fences", fences_params(job, attempt))

    reconciler = await kit.solo("exports_reconciler")
    reconciling = asyncio.create_task(
        reconciler.store.reconcile_unknown(
            tenant_id=job.tenant_id,
            job_id=job.id,
            attempt_id=attempt,
            resolution=JobStatus.COMPLETED,
            reconciled_by="lee.reconciler",
            evidence_summary="the partner says it arrived",
        )
    )
    await kit.wait_until_blocked_by(reconciler.pid, settling.pid)
    await still_waiting(reconciling)

    await settling.commit()
    assert await reconciling is False

    settled = await factory.job(job.id)
    assert (settled.status, settled.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
    (event,) = await reconciled_events(factory, job.id)
    assert (event.observed_by, event.detail) == (RUN, FENCES_DETAIL)


@pytest.mark.parametrize("role", ["exports_worker", "exports_api", "exports_dispatcher"])
async def test_no_other_process_role_may_run_the_settlement_by_the_fences(factory, kit, role):
    job, attempt = await unknown_fenced(factory)
    held = await kit.hold(role)
    with pytest.raises(psycopg.Error) as refused:
        await held.run("settle_unknown_by_fences", fences_params(job, attempt))
    assert isinstance(translate(refused.value), NotPermitted)
    await held.rollback()
    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN
