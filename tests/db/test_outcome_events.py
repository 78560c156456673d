"""A recorded outcome and an OutcomeUnknown change only together with their event, and a correction only to
the failure code it recorded, for every writer (issue 23.10, migration 0019; 000 "Reconciliation is
one-shot: the unique index allows one Reconciled event per attempt", "one Corrected event per attempt").

The statements insert the event in another CTE of the same statement, which a BEFORE row trigger cannot
see, so a deferred constraint trigger checks at commit that the attempt's Reconciled (out of
OutcomeUnknown) or Corrected (out of Completed or Failed) event exists: a bare UPDATE by a role the guard
lets take the edge, a superuser's repair acting as that role included, fails as it commits. The roles the
guard refuses the edge to are refused at the UPDATE (tests/db/test_state_machine.py).
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from db.pool import Role
from domain.models import FailureCode, JobStatus
from tests.db.race import HeldTransaction, RaceKit, authorize_params, claim_params

# Who may take the edges out of OutcomeUnknown (the reconciler, and recovery settling on evidence) and out
# of Completed/Failed (the reconciler), each as its own role and as a superuser's session acting as it.
UNKNOWN_ACTORS: list[tuple[Role | None, Role]] = [
    ("exports_reconciler", "exports_reconciler"),
    ("exports_recovery", "exports_recovery"),
    (None, "exports_reconciler"),
    (None, "exports_recovery"),
]
CORRECTION_ACTORS: list[tuple[Role | None, Role]] = [
    ("exports_reconciler", "exports_reconciler"),
    (None, "exports_reconciler"),
]


def actor_id(actor: tuple[Role | None, Role]) -> str:
    login, role = actor
    return role if login is not None else f"superuser-as-{role}"


async def acting(kit: RaceKit, actor: tuple[Role | None, Role]) -> HeldTransaction:
    """A held transaction as the actor's role, or a superuser's session that SET ROLEs to it."""
    login, role = actor
    held = await kit.hold(login)
    if login is None:
        await held.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
    return held


async def events(factory, job_id: uuid.UUID, kind: str) -> list[Any]:
    return await factory.admin(
        "SELECT attempt_id FROM export_attempt_events WHERE job_id = %(j)s AND kind = %(k)s",
        {"j": job_id, "k": kind},
    )


INSERT_EVENT = (
    "INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, recorded_at)"
    " VALUES (%(j)s, %(a)s, %(k)s, 'a repair', clock_timestamp())"
)


async def refused_at_commit(held: HeldTransaction) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as refused:
        await held.commit()
    return refused.value


# A bare UPDATE of one job (``%(id)s``) to Completed, or to Failed with the code ``%(code)s``.
TO_COMPLETED = "UPDATE export_jobs SET status = 'Completed', failure_reason = NULL WHERE id = %(id)s"
TO_FAILED = "UPDATE export_jobs SET status = 'Failed', failure_reason = %(code)s WHERE id = %(id)s"


def set_outcome(job_id: uuid.UUID, to_status: str, code: str = "NotDelivered") -> tuple[str, dict[str, Any]]:
    """The bare UPDATE to ``to_status`` and its parameters (a Failed row carries ``code``)."""
    if to_status == "Failed":
        return TO_FAILED, {"id": job_id, "code": code}
    return TO_COMPLETED, {"id": job_id}


# -- out of OutcomeUnknown: with its Reconciled event -----------------------------------------------------


@pytest.mark.parametrize("to_status", ["Completed", "Failed"])
@pytest.mark.parametrize("actor", UNKNOWN_ACTORS, ids=actor_id)
async def test_a_bare_update_out_of_outcome_unknown_fails_at_commit_without_its_reconciled_event(
    factory, kit, actor, to_status
):
    job, _ = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
    held = await acting(kit, actor)

    await held.execute(*set_outcome(job.id, to_status))  # the guard lets this role take the edge
    refused = await refused_at_commit(held)

    assert isinstance(refused, psycopg.errors.CheckViolation), refused
    assert refused.diag.constraint_name == "ck_export_jobs_transition_event"
    assert await factory.job(job.id) == job
    assert await events(factory, job.id, "Reconciled") == []


async def test_a_superusers_bare_update_in_autocommit_fails_as_it_commits(factory, database):
    # The repair script as typed in psql: one statement, committed at once.
    job, _ = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
    async with await psycopg.AsyncConnection.connect(database.admin_url, autocommit=True) as conn:
        await conn.execute("SET ROLE exports_reconciler")
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            await conn.execute(
                "UPDATE export_jobs SET status = 'Completed' WHERE id = %(id)s", {"id": job.id}
            )
    assert refused.value.diag.constraint_name == "ck_export_jobs_transition_event"
    assert (await factory.job(job.id)).status == JobStatus.OUTCOME_UNKNOWN


@pytest.mark.parametrize("actor", UNKNOWN_ACTORS, ids=actor_id)
async def test_the_event_may_follow_the_update_in_the_same_transaction(factory, kit, actor):
    # Checked at commit, not at the statement's end: a repair that writes the event after the UPDATE commits.
    job, attempt = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
    held = await acting(kit, actor)

    await held.execute(*set_outcome(job.id, "Completed"))
    await held.execute(INSERT_EVENT, {"k": "Reconciled", "j": job.id, "a": attempt})
    await held.commit()

    assert (await factory.job(job.id)).status == JobStatus.COMPLETED
    assert await events(factory, job.id, "Reconciled") == [{"attempt_id": attempt}]


@pytest.mark.parametrize("wrong", ["another kind", "another attempt", "another job"])
async def test_only_the_edges_own_event_for_that_job_and_attempt_counts(factory, kit, wrong):
    job, attempt = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
    other, _ = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
    kind, event_job, event_attempt = {
        "another kind": ("Corrected", job.id, attempt),
        "another attempt": ("Reconciled", job.id, uuid.uuid4()),
        "another job": ("Reconciled", other.id, other.attempt_id),
    }[wrong]
    held = await kit.hold("exports_reconciler")

    await held.execute(*set_outcome(job.id, "Completed"))
    await held.execute(INSERT_EVENT, {"k": kind, "j": event_job, "a": event_attempt})
    refused = await refused_at_commit(held)

    assert refused.diag.constraint_name == "ck_export_jobs_transition_event"
    assert await factory.job(job.id) == job


# -- out of Completed and Failed: with its Corrected event, to the code its correction recorded ---------


def correction(job, to_status: str, code: str | None) -> dict[str, Any]:
    """``record_correction``'s parameters for ``job``'s attempt, as the reconciler's store binds them."""
    return {
        "tenant_id": job.tenant_id,
        "job_id": job.id,
        "attempt_id": job.attempt_id,
        "recorded_status": job.status.value,
        "corrected_status": to_status,
        "failure_reason": code,
        "corrected_by": "lee.reconciler",
        "evidence_ref": "listing",
        "why": "the listing says otherwise",
    }


CORRECTIONS = [("Completed", "Failed"), ("Failed", "Completed")]


async def approve(factory, job, to_status: str, attempt=None, by: str = "lee.reconciler") -> None:
    """A correction takes two people (0032): another reconciler asked for it, ``by`` approved it."""
    await factory.approve(
        job.tenant_id,
        "correct_outcome",
        job.id,
        {"attempt_id": str(attempt or job.attempt_id), "corrected_status": to_status},
        approved_by=by,
    )


async def recorded(factory, status: str):
    job, _ = await factory.in_status(JobStatus(status), code=FailureCode.NOT_DELIVERED)
    return job


@pytest.mark.parametrize(("from_status", "to_status"), CORRECTIONS)
@pytest.mark.parametrize("actor", CORRECTION_ACTORS, ids=actor_id)
async def test_a_correction_by_bare_update_fails_at_commit_without_its_corrected_event(
    factory, kit, actor, from_status, to_status
):
    job = await recorded(factory, from_status)
    await approve(factory, job, to_status)
    held = await acting(kit, actor)
    code = "NotDelivered" if to_status == "Failed" else None

    assert await held.run("record_correction", correction(job, to_status, code))
    await held.execute(*set_outcome(job.id, to_status))  # along its recorded correction
    refused = await refused_at_commit(held)

    assert refused.diag.constraint_name == "ck_export_jobs_transition_event"
    assert await factory.job(job.id) == job
    assert await events(factory, job.id, "Corrected") == []


@pytest.mark.parametrize("actor", CORRECTION_ACTORS, ids=actor_id)
async def test_a_correction_to_failed_ends_with_the_code_it_recorded(factory, kit, actor):
    job = await recorded(factory, "Completed")
    await approve(factory, job, "Failed")
    held = await acting(kit, actor)
    assert await held.run("record_correction", correction(job, "Failed", "NotDelivered"))

    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        await held.execute(*set_outcome(job.id, "Failed", code="BuildFailed"))
    assert refused.value.diag.constraint_name == "ck_export_jobs_correction_code"
    await held.rollback()
    assert await factory.job(job.id) == job

    # The same correction with its own code, and its event, commits.
    held = await acting(kit, actor)
    assert await held.run("record_correction", correction(job, "Failed", "NotDelivered"))
    await held.execute(*set_outcome(job.id, "Failed", code="NotDelivered"))
    await held.execute(INSERT_EVENT, {"k": "Corrected", "j": job.id, "a": job.attempt_id})
    await held.commit()
    row = await factory.job(job.id)
    assert (row.status, row.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)


@pytest.mark.parametrize("actor", CORRECTION_ACTORS, ids=actor_id)
async def test_a_correction_to_completed_is_refused_when_its_row_records_a_code(factory, kit, actor):
    # A correction row written directly with a code (record_correction writes none for Completed): the job
    # cannot end as what its correction says, so it does not change.
    job = await recorded(factory, "Failed")
    await approve(factory, job, "Completed", by="lee")
    held = await acting(kit, actor)
    await held.execute(
        "INSERT INTO outcome_corrections (tenant_id, job_id, attempt_id, from_status, to_status, failure_reason,"
        " corrected_by, evidence_ref, why)"
        " VALUES (%(t)s, %(j)s, %(a)s, 'Failed', 'Completed', 'BuildFailed', 'lee', 'ref', 'why')",
        {"t": job.tenant_id, "j": job.id, "a": job.attempt_id},
    )

    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        await held.execute(*set_outcome(job.id, "Completed"))
    assert refused.value.diag.constraint_name == "ck_export_jobs_correction_code"
    await held.rollback()
    assert await factory.job(job.id) == job


# -- the protocol's own statements still pass -------------------------------------------------------------


async def test_the_protocols_statements_commit_their_event_and_pass_on_one_connection(factory, kit):
    # Each inserts its event in another CTE of its statement; seven of each on one connection after ANALYZE,
    # so the triggers' cached plans turn generic (a guard's plan once needed a grant the role lacked, 0006).
    await factory.admin("ANALYZE")
    reconciler = await kit.solo("exports_reconciler")
    recovery = await kit.solo("exports_recovery")
    for _ in range(7):
        job, attempt = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
        assert await reconciler.store.reconcile_unknown(
            tenant_id=job.tenant_id,
            job_id=job.id,
            attempt_id=attempt,
            resolution=JobStatus.COMPLETED,
            reconciled_by="lee.reconciler",
            evidence_summary="partner acknowledged",
        )
        await approve(factory, job, "Failed", attempt)
        assert await reconciler.store.correct_outcome(
            tenant_id=job.tenant_id,
            job_id=job.id,
            attempt_id=attempt,
            recorded_status=JobStatus.COMPLETED,
            corrected_status=JobStatus.FAILED,
            failure_reason=FailureCode.NOT_DELIVERED,
            corrected_by="lee.reconciler",
            evidence_ref="listing",
            why="the partner removed it unread",
        )
        settled, settled_attempt = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
        assert await recovery.store.settle_unknown_by_evidence(
            settled.id, settled_attempt, JobStatus.FAILED, "recovery-run-1", "set aside; baseline unchanged"
        )
        failed = await factory.job(job.id)
        assert (failed.status, failed.failure_reason) == (JobStatus.FAILED, FailureCode.NOT_DELIVERED)
        assert {"Reconciled", "Corrected"} <= set(await factory.event_kinds(job.id))
        assert await factory.status(settled.id) == JobStatus.FAILED


# -- the hot path pays for a comparison only -----------------------------------------------------------


async def test_the_deferred_check_runs_for_no_edge_of_an_attempts_way_to_its_outcome(factory, kit):
    # With the constraint made immediate, an event queued by an UPDATE runs at the statement's end, where
    # the transaction's function counters see it: the claim, cutoff 2 and the terminal write run it zero
    # times (their WHEN is false, so nothing is queued), the reconciliation after them once.
    job = await factory.queued()
    attempt = uuid.uuid4()
    held = await kit.hold(None)
    await held.execute("SET track_functions = 'pl'")
    await held.execute("SET CONSTRAINTS tr_export_jobs_transition_event IMMEDIATE")

    async def calls() -> int:
        rows = await held.execute(
            "SELECT coalesce(pg_stat_get_xact_function_calls('export_jobs_transition_event_guard'::regproc), 0)"
            " AS n"
        )
        return int(rows[0]["n"])

    await held.execute("SET ROLE exports_worker")
    [claimed] = await held.run("claim_if_queued", claim_params(job, attempt))
    assert claimed["matched"] is True, claimed
    [authorized] = await held.run("authorize_delivery_if_running", authorize_params(job, attempt))
    assert authorized["matched"] is True, authorized
    finished = await held.run(
        "finish_delivery",
        {"job_id": job.id, "attempt_id": attempt, "outcome": "OutcomeUnknown", "code": None, "summary": "x"},
    )
    assert len(finished) == 1
    assert await calls() == 0

    await held.execute("SET ROLE exports_reconciler")
    reconciled = await held.run(
        "reconcile_unknown",
        {
            "tenant_id": job.tenant_id,
            "job_id": job.id,
            "attempt_id": attempt,
            "resolution": "Completed",
            "reconciled_by": "lee.reconciler",
            "evidence_summary": "acknowledged",
        },
    )
    assert len(reconciled) == 1
    assert await calls() == 1
    await held.commit()
    assert await factory.status(job.id) == JobStatus.COMPLETED
