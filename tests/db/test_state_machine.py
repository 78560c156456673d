"""The database enforces the state diagram itself (001 "A Second Cutoff"; DESIGN "The database itself enforces
the state machine"): every status change that is not an edge is refused for every role, the superuser's
direct UPDATE included; identity columns never change; Canceled, Rejected and Stopped rows are final;
only ``exports_reconciler`` changes a recorded Completed or Failed; and ``exports_recovery`` takes its edges
only over a lease that has expired on the database clock.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from db.pool import Role
from domain.models import FailureCode, JobStatus

# The seed's diagram (001), edge by edge: the two cutoffs, cancel and reject from Queued, the attempt's
# endings and recovery's requeue from Running, the delivery outcomes, reconciliation of OutcomeUnknown,
# and the one-time correction between Completed and Failed.
SEED_EDGES = {
    ("Queued", "Running"),
    ("Queued", "Canceled"),
    ("Queued", "Rejected"),
    ("Running", "Delivering"),
    ("Running", "Stopped"),
    ("Running", "Failed"),
    ("Running", "Queued"),
    # issue #25.4: a transient NotDelivered goes back to the queue to be tried again (retry_delivery_if_delivering)
    ("Delivering", "Queued"),
    ("Delivering", "Completed"),
    ("Delivering", "Failed"),
    ("Delivering", "OutcomeUnknown"),
    ("OutcomeUnknown", "Completed"),
    ("OutcomeUnknown", "Failed"),
    ("Completed", "Failed"),
    ("Failed", "Completed"),
}
# Who may take each edge (issue 9 "Least privilege enforced by PostgreSQL"): the claim, cutoff 2, the
# release and the attempt's terminal writes are the worker's; takeovers recovery's; cancel the API's;
# reconciliation and correction the reconciler's. Nobody else, the superuser included.
WORKER, RECOVERY = "exports_worker", "exports_recovery"
EDGE_ROLES: dict[tuple[str, str], set[str]] = {
    ("Queued", "Running"): {WORKER},
    ("Queued", "Canceled"): {"exports_api"},
    ("Queued", "Rejected"): {WORKER},
    ("Running", "Delivering"): {WORKER},
    ("Running", "Stopped"): {WORKER, RECOVERY},
    ("Running", "Failed"): {WORKER, RECOVERY},
    ("Running", "Queued"): {WORKER, RECOVERY},
    ("Delivering", "Queued"): {WORKER},
    ("Delivering", "Completed"): {WORKER, RECOVERY},
    ("Delivering", "Failed"): {WORKER, RECOVERY},
    ("Delivering", "OutcomeUnknown"): {WORKER, RECOVERY},
    # A person's reconciliation, or recovery's settlement on evidence a re-check found (0013).
    ("OutcomeUnknown", "Completed"): {"exports_reconciler", RECOVERY},
    ("OutcomeUnknown", "Failed"): {"exports_reconciler", RECOVERY},
    ("Completed", "Failed"): {"exports_reconciler"},
    ("Failed", "Completed"): {"exports_reconciler"},
}
# Recovery's takeovers, each only over an expired lease (issue 9.4; 0010): the edges its statements take from
# an attempt's live states. From OutcomeUnknown, which has no lease, it settles on evidence instead (0013).
RECOVERY_EDGES = sorted(
    edge for edge, roles in EDGE_ROLES.items() if RECOVERY in roles and edge[0] != "OutcomeUnknown"
)
STATUSES = [s.value for s in JobStatus]
ILLEGAL = [(a, b) for a, b in itertools.permutations(STATUSES, 2) if (a, b) not in SEED_EDGES]
ROLES: list[Role | None] = [
    "exports_api",
    "exports_worker",
    "exports_recovery",
    "exports_dispatcher",
    "exports_reconciler",
    "exports_platform",
    None,
]
NO_UPDATE_GRANT = ("exports_dispatcher", "exports_platform")  # refused by privileges before any trigger
TRIGGER_CONSTRAINTS = {"ck_export_jobs_state_machine", "ck_export_jobs_recorded_outcome"}
# Leaving these commits with the attempt's event (0019; tests/db/test_outcome_events.py holds that rule).
EVENT_OF_LEAVING = {"OutcomeUnknown": "Reconciled", "Completed": "Corrected", "Failed": "Corrected"}


def role_name(role: Role | None) -> str:
    return role or "superuser"


@pytest.fixture(scope="module")
async def connections(database) -> AsyncIterator[dict[Role | None, psycopg.AsyncConnection]]:
    """One autocommit connection per role (the login ``exports_app`` after SET ROLE), plus the superuser."""
    conns: dict[Role | None, psycopg.AsyncConnection] = {}
    for role in ROLES:
        if role is None:
            conns[role] = await psycopg.AsyncConnection.connect(database.admin_url, autocommit=True)
        else:
            conn = await psycopg.AsyncConnection.connect(database.app_url, autocommit=True)
            await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            conns[role] = conn
    yield conns
    for conn in conns.values():
        await conn.close()


@pytest.fixture(scope="module")
async def one_job_per_status(factory) -> dict[str, Any]:
    """A job in every status, reached along the protocol's edges. Refused updates leave them as they are,
    so every test of a refusal may share them."""
    jobs = {}
    for status in JobStatus:
        job, _ = await factory.in_status(status, code=FailureCode.NOT_DELIVERED)
        jobs[status.value] = job
    return jobs


async def refusal(conn: psycopg.AsyncConnection, statement: Any, params: dict[str, Any]) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as refused:
        await conn.execute(statement, params)
    return refused.value


async def take_edge(conn: psycopg.AsyncConnection, job: Any, statement: Any, params: dict[str, Any]) -> None:
    """The direct UPDATE along an edge in one transaction, with the event the edge commits with, if any."""
    async with conn.transaction():
        await conn.execute(statement, params)
        kind = EVENT_OF_LEAVING.get(job.status.value)
        if kind is not None:
            await conn.execute(
                "INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, recorded_at)"
                " VALUES (%(j)s, %(a)s, %(k)s, 'a direct update', clock_timestamp())",
                {"j": job.id, "a": job.attempt_id, "k": kind},
            )


def direct_update(from_status: str, to_status: str) -> sql.Composed:
    """The direct UPDATE of one job (``%(id)s``) along an edge to ``%(to)s``, with the columns its target needs."""
    assignment = "status = %(to)s"
    if to_status == "Failed":
        assignment += ", failure_reason = 'NotDelivered'"
    elif to_status == "Rejected":  # every Rejected carries its reason code and message (0006)
        assignment += ", rejection_code = 'list_invalid', rejection_reason = 'Rejected: test'"
    elif from_status == "Failed":
        assignment += ", failure_reason = NULL"
    return sql.SQL("UPDATE export_jobs SET {a} WHERE id = %(id)s").format(a=sql.SQL(assignment))


async def test_the_edges_in_the_database_are_the_seed_diagram_each_with_its_roles(connections):
    cur = await connections[None].execute("SELECT from_status, to_status, roles FROM export_status_edges")
    rows = await cur.fetchall()
    assert {(a, b) for a, b, _ in rows} == SEED_EDGES
    assert {(a, b): set(roles) for a, b, roles in rows} == EDGE_ROLES


@pytest.mark.parametrize(("from_status", "to_status"), ILLEGAL)
async def test_status_change_off_the_diagram_is_refused_for_every_role(
    factory, connections, one_job_per_status, from_status, to_status
):
    job = one_job_per_status[from_status]
    for role in ROLES:
        refused = await refusal(
            connections[role],
            "UPDATE export_jobs SET status = %(to)s WHERE id = %(id)s",
            {"to": to_status, "id": job.id},
        )
        if role in NO_UPDATE_GRANT:
            assert isinstance(refused, psycopg.errors.InsufficientPrivilege), role_name(role)
        else:
            # Refused by the trigger itself, not by a missing grant or an unrelated check.
            assert refused.diag.constraint_name in TRIGGER_CONSTRAINTS, (role_name(role), refused)
    assert await factory.job(job.id) == job


@pytest.mark.parametrize("role", ROLES, ids=role_name)
@pytest.mark.parametrize(("from_status", "to_status"), sorted(SEED_EDGES))
async def test_each_edge_is_open_to_its_roles_and_refused_to_every_other(
    factory, connections, from_status, to_status, role
):
    # The same direct UPDATE along an edge, by every role: accepted exactly for the edge's roles (a
    # recorded outcome along its recorded correction), refused to all others, the superuser included.
    job, _ = await factory.in_status(JobStatus(from_status), code=FailureCode.NOT_DELIVERED)
    allowed = role in EDGE_ROLES[(from_status, to_status)]
    if role == RECOVERY and (from_status, to_status) in RECOVERY_EDGES:
        # Recovery takes its edges only over an expired lease (0010; the tests below hold it to that); every
        # other role meets the row with its lease current, as the worker ends its own attempt.
        await factory.expire_lease(job.id)
        job = await factory.job(job.id)
    if from_status in ("Completed", "Failed"):
        # a correction takes two people (0032): another reconciler asked for it, lee approved it
        await factory.approve(
            job.tenant_id,
            "correct_outcome",
            job.id,
            {"attempt_id": str(job.attempt_id), "corrected_status": to_status},
            approved_by="lee",
        )
        await connections["exports_reconciler"].execute(
            "INSERT INTO outcome_corrections (tenant_id, job_id, attempt_id, from_status, to_status,"
            " failure_reason, corrected_by, evidence_ref, why)"
            " VALUES (%(t)s, %(j)s, %(a)s, %(f)s, %(to)s, %(code)s, 'lee', 'ref', 'why')",
            {
                "t": job.tenant_id,
                "j": job.id,
                "a": job.attempt_id,
                "f": from_status,
                "to": to_status,
                "code": "NotDelivered" if to_status == "Failed" else None,
            },
        )
    statement = direct_update(from_status, to_status)

    if allowed:
        await take_edge(connections[role], job, statement, {"to": to_status, "id": job.id})
        assert (await factory.job(job.id)).status == JobStatus(to_status)
    else:
        refused = await refusal(connections[role], statement, {"to": to_status, "id": job.id})
        assert isinstance(refused, psycopg.errors.InsufficientPrivilege), (role_name(role), refused)
        assert await factory.job(job.id) == job


@pytest.mark.parametrize(
    "assignment",
    [
        "id = gen_random_uuid()",
        "tenant_id = gen_random_uuid()",
        "delivery_key = 'another-key'",
        "replaces_job_id = gen_random_uuid()",
        "created_by = 'someone-else'",
    ],
)
async def test_identity_columns_never_change_even_for_a_superuser(
    factory, connections, one_job_per_status, assignment
):
    job = one_job_per_status["Queued"]
    refused = await refusal(
        connections[None],
        sql.SQL("UPDATE export_jobs SET {a} WHERE id = %(id)s").format(a=sql.SQL(assignment)),
        {"id": job.id},
    )
    assert refused.diag.constraint_name == "ck_export_jobs_identity"
    assert await factory.job(job.id) == job


@pytest.mark.parametrize("status", ["Canceled", "Rejected", "Stopped"])
@pytest.mark.parametrize(
    "assignment", ["sweep_count = sweep_count + 1", "woken_at = clock_timestamp()", "status = 'Queued'"]
)
async def test_canceled_rejected_and_stopped_rows_are_final_for_everyone(
    factory, connections, one_job_per_status, status, assignment
):
    job = one_job_per_status[status]
    statement = sql.SQL("UPDATE export_jobs SET {a} WHERE id = %(id)s").format(a=sql.SQL(assignment))
    for role in (None, "exports_worker"):  # the worker holds UPDATE on all three columns
        refused = await refusal(connections[role], statement, {"id": job.id})
        assert refused.diag.constraint_name == "ck_export_jobs_state_machine", role_name(role)
    assert await factory.job(job.id) == job


@pytest.mark.parametrize("status", ["Completed", "Failed"])
@pytest.mark.parametrize("role", [None, "exports_api", "exports_worker", "exports_recovery"])
async def test_only_the_reconciler_changes_a_recorded_outcome(
    factory, connections, one_job_per_status, status, role
):
    job = one_job_per_status[status]
    corrected = "Failed" if status == "Completed" else "Completed"
    for statement, params, column in (
        ("UPDATE export_jobs SET status = %(s)s WHERE id = %(id)s", {"s": corrected}, "status"),
        ("UPDATE export_jobs SET failure_reason = failure_reason WHERE id = %(id)s", {}, "failure_reason"),
    ):
        refused = await refusal(connections[role], statement, {"id": job.id, **params})
        assert isinstance(refused, psycopg.errors.InsufficientPrivilege)
        if role == "exports_api" and column == "failure_reason":
            assert refused.diag.constraint_name is None  # the API holds no UPDATE on failure_reason at all
        else:
            assert refused.diag.constraint_name == "ck_export_jobs_recorded_outcome"
    assert await factory.job(job.id) == job


async def test_the_reconciler_changes_a_recorded_outcome_only_by_changing_its_status(factory, connections):
    job, _ = await factory.in_status(JobStatus.COMPLETED)
    reconciler = connections["exports_reconciler"]

    refused = await refusal(
        reconciler, "UPDATE export_jobs SET status = 'Completed' WHERE id = %(id)s", {"id": job.id}
    )
    assert refused.diag.constraint_name == "ck_export_jobs_state_machine"

    # Even the reconciler's direct UPDATE changes a recorded outcome only along its recorded correction ...
    flip = "UPDATE export_jobs SET status = 'Failed', failure_reason = 'NotDelivered' WHERE id = %(id)s"
    refused = await refusal(reconciler, flip, {"id": job.id})
    assert refused.diag.constraint_name == "ck_export_jobs_correction"
    for to_status in ("Failed", "Completed"):  # two people approved each (0032); the second is refused anyway
        await factory.approve(
            job.tenant_id,
            "correct_outcome",
            job.id,
            {"attempt_id": str(job.attempt_id), "corrected_status": to_status},
            approved_by="lee",
        )
    await reconciler.execute(
        "INSERT INTO outcome_corrections (tenant_id, job_id, attempt_id, from_status, to_status, failure_reason,"
        " corrected_by, evidence_ref, why)"
        " VALUES (%(t)s, %(j)s, %(a)s, 'Completed', 'Failed', 'NotDelivered', 'lee', 'ref', 'why')",
        {"t": job.tenant_id, "j": job.id, "a": job.attempt_id},
    )
    await take_edge(reconciler, job, flip, {"id": job.id})
    assert (await factory.job(job.id)).status == JobStatus.FAILED

    # ... once per attempt: flipping back has no correction to go along, and a second one cannot be recorded.
    back = "UPDATE export_jobs SET status = 'Completed', failure_reason = NULL WHERE id = %(id)s"
    refused = await refusal(reconciler, back, {"id": job.id})
    assert refused.diag.constraint_name == "ck_export_jobs_correction"
    refused = await refusal(
        reconciler,
        "INSERT INTO outcome_corrections (tenant_id, job_id, attempt_id, from_status, to_status, corrected_by,"
        " evidence_ref, why) VALUES (%(t)s, %(j)s, %(a)s, 'Failed', 'Completed', 'lee', 'ref', 'why')",
        {"t": job.tenant_id, "j": job.id, "a": job.attempt_id},
    )
    assert refused.diag.constraint_name == "pk_outcome_corrections"
    assert (await factory.job(job.id)).status == JobStatus.FAILED


async def test_a_new_export_starts_queued_without_an_attempt_even_when_inserted_directly(
    factory, connections, one_job_per_status
):
    template = one_job_per_status["Queued"]
    for status, attempt_count in (("Running", 1), ("Completed", 0), ("Queued", 2)):
        refused = await refusal(
            connections[None],
            "INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, delivery_key, created_by,"
            " woken_at, list_name, attempt_count)"
            " VALUES (gen_random_uuid(), %(t)s, %(s)s, 1, %(d)s, %(k)s, 'repair', clock_timestamp(), 'main', %(n)s)",
            {
                "t": template.tenant_id,
                "s": status,
                "d": template.destination_id,
                "k": template.delivery_key,
                "n": attempt_count,
            },
        )
        assert refused.diag.constraint_name == "ck_export_jobs_state_machine"


async def test_nobody_deletes_an_export_not_even_a_superuser(factory, connections, one_job_per_status):
    job = one_job_per_status["Canceled"]
    refused = await refusal(connections[None], "DELETE FROM export_jobs WHERE id = %(id)s", {"id": job.id})
    assert isinstance(refused, psycopg.errors.InsufficientPrivilege)
    assert await factory.job(job.id) == job


@pytest.mark.parametrize(("from_status", "to_status"), RECOVERY_EDGES)
async def test_recovery_takes_its_edges_only_once_the_lease_has_expired(
    factory, connections, from_status, to_status
):
    # Issue 9.4: takeovers are recovery's, and only of an expired lease, as each of its statements says.
    # The same direct UPDATE by exports_recovery is refused while the worker's lease is current and
    # accepted once the row's lease has expired (set on the row: the database clock decides).
    job, _ = await factory.in_status(JobStatus(from_status), code=FailureCode.NOT_DELIVERED)
    statement = direct_update(from_status, to_status)
    recovery = connections[RECOVERY]

    refused = await refusal(recovery, statement, {"to": to_status, "id": job.id})
    assert isinstance(refused, psycopg.errors.InsufficientPrivilege), refused
    assert refused.diag.constraint_name == "ck_export_jobs_recovery_lease"
    assert "only once the lease has expired" in (refused.diag.message_primary or "")
    assert await factory.job(job.id) == job

    await factory.expire_lease(job.id)
    await recovery.execute(statement, {"to": to_status, "id": job.id})
    assert (await factory.job(job.id)).status == JobStatus(to_status)


@pytest.mark.parametrize("to_status", ["Completed", "Failed"])
async def test_recovery_settles_an_outcome_unknown_which_has_no_lease(factory, connections, to_status):
    # 0013: the terminal write cleared the lease and no worker holds the row; the lease rule is for the
    # attempt's live states. The settling statement's own conditions are in tests/db/test_settle_unknown.py.
    job, _ = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
    assert job.lease_expires_at is None

    await take_edge(
        connections[RECOVERY],
        job,
        direct_update("OutcomeUnknown", to_status),
        {"to": to_status, "id": job.id},
    )

    assert (await factory.job(job.id)).status == JobStatus(to_status)


@pytest.mark.parametrize("from_status", ["Running", "Delivering"])
async def test_recovery_takes_nothing_from_a_row_without_a_lease(factory, connections, from_status):
    # A lease that is not there has not expired: the comparison is NULL, and NULL is a refusal.
    job, _ = await factory.in_status(JobStatus(from_status))
    await factory.admin("UPDATE export_jobs SET lease_expires_at = NULL WHERE id = %(id)s", {"id": job.id})
    to_status = "Queued" if from_status == "Running" else "OutcomeUnknown"

    refused = await refusal(
        connections[RECOVERY], direct_update(from_status, to_status), {"to": to_status, "id": job.id}
    )
    assert refused.diag.constraint_name == "ck_export_jobs_recovery_lease"
    assert (await factory.job(job.id)).status == JobStatus(from_status)
