"""Least privilege, enforced by the database rather than by convention (000 "The Tables", review point 12).

The history tables and ``deliveries`` are INSERT+SELECT only for every role; the outbox is insert-only
except ``UPDATE (published_at, publishing_until)`` for the dispatcher, and nobody deletes from it; each role may touch only
the columns its transitions write. Every refusal is a real statement against a real row, refused with
SQLSTATE 42501, and the row is unchanged afterwards.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from db.pool import Role
from domain.models import CancellationOutcome, ExportJob
from tests.db.race import cancel

ROLES: list[Role] = [
    "exports_api",
    "exports_worker",
    "exports_dispatcher",
    "exports_reconciler",
    "exports_platform",
]
APPEND_ONLY = ["export_attempt_events", "cancellation_requests", "deliveries"]


@asynccontextmanager
async def acting_as(database, role: Role | None) -> AsyncIterator[psycopg.AsyncConnection]:
    """An autocommit connection as the login ``exports_app`` acting as ``role`` (or as the bare login)."""
    async with await psycopg.AsyncConnection.connect(database.app_url, autocommit=True) as conn:
        if role is not None:
            await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        yield conn


async def assert_refused(database, role: Role | None, statement: Any, params: dict[str, Any]) -> None:
    async with acting_as(database, role) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute(statement, params)


@pytest.fixture(scope="module")
async def seeded(factory, api_store) -> ExportJob:
    """A Running job with a Claimed event, a recorded stop request, its deliveries row and outbox row."""
    job, _ = await factory.running()
    assert (await cancel(api_store, job)).outcome == CancellationOutcome.STOP_REQUESTED
    return await factory.job(job.id)


async def snapshot(factory, job: ExportJob) -> dict[str, Any]:
    """Everything the refused statements could have touched, read as the superuser."""
    reads = {
        "job": "SELECT * FROM export_jobs WHERE id = %(id)s",
        "events": "SELECT * FROM export_attempt_events WHERE job_id = %(id)s ORDER BY id",
        "requests": "SELECT * FROM cancellation_requests WHERE job_id = %(id)s ORDER BY id",
        "deliveries": "SELECT * FROM deliveries WHERE original_job_id = %(id)s",
        "outbox": "SELECT * FROM outbox WHERE job_id = %(id)s ORDER BY message_id",
    }
    async with await psycopg.AsyncConnection.connect(factory.db.admin_url, autocommit=True) as conn:
        found: dict[str, Any] = {}
        for name, query in reads.items():
            cur = await conn.execute(query, {"id": job.id})
            found[name] = await cur.fetchall()
        return found


# -- the append-only tables ---------------------------------------------------------------------------

_TAMPER = {
    "export_attempt_events": ("detail", "'tampered'", "job_id"),
    "cancellation_requests": ("outcome", "'TooLate'", "job_id"),
    "deliveries": ("original_job_id", "original_job_id", "original_job_id"),
}


@pytest.mark.parametrize("table", APPEND_ONLY)
@pytest.mark.parametrize("role", ROLES)
async def test_history_tables_and_deliveries_refuse_update_delete_and_truncate(
    database, factory, seeded, role, table
):
    before = await snapshot(factory, seeded)
    column, value, key = _TAMPER[table]
    update = sql.SQL("UPDATE {t} SET {c} = {v} WHERE {k} = %(id)s").format(
        t=sql.Identifier(table), c=sql.Identifier(column), v=sql.SQL(value), k=sql.Identifier(key)
    )
    delete = sql.SQL("DELETE FROM {t} WHERE {k} = %(id)s").format(
        t=sql.Identifier(table), k=sql.Identifier(key)
    )
    truncate = sql.SQL("TRUNCATE {t} CASCADE").format(t=sql.Identifier(table))

    for statement in (update, delete, truncate):
        await assert_refused(database, role, statement, {"id": seeded.id})

    async with acting_as(database, role) as conn:
        cur = await conn.execute(
            "SELECT has_any_column_privilege(%(r)s, %(t)s, 'UPDATE') AS upd,"
            " has_table_privilege(%(r)s, %(t)s, 'DELETE') AS del,"
            " has_table_privilege(%(r)s, %(t)s, 'TRUNCATE') AS trunc",
            {"r": role, "t": table},
        )
        assert await cur.fetchone() == (False, False, False)
    assert await snapshot(factory, seeded) == before


async def test_every_role_that_writes_history_may_insert_and_read_it(database):
    # The other half of "append-only": the grants that exist are INSERT and SELECT, and no more.
    expected = {
        ("exports_api", "export_attempt_events"),
        ("exports_api", "cancellation_requests"),
        ("exports_api", "deliveries"),
        ("exports_worker", "export_attempt_events"),
        ("exports_reconciler", "export_attempt_events"),
    }
    async with acting_as(database, None) as conn:
        cur = await conn.execute(
            "SELECT r AS role, t AS tbl FROM unnest(%(roles)s::text[]) r, unnest(%(tables)s::text[]) t"
            " WHERE has_table_privilege(r, t, 'INSERT')",
            {"roles": ROLES, "tables": APPEND_ONLY},
        )
        assert set(await cur.fetchall()) == expected


# -- the outbox ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
async def test_nobody_deletes_or_truncates_the_outbox(database, factory, seeded, role):
    before = await snapshot(factory, seeded)
    await assert_refused(database, role, "DELETE FROM outbox WHERE job_id = %(id)s", {"id": seeded.id})
    await assert_refused(database, role, "TRUNCATE outbox", {})
    assert await snapshot(factory, seeded) == before


@pytest.mark.parametrize(
    "assignment",
    [
        "kind = 'Tampered'",
        "job_id = gen_random_uuid()",
        "message_id = gen_random_uuid()",
        "created_at = clock_timestamp()",
        "traceparent = NULL",
    ],
)
async def test_dispatcher_may_change_no_outbox_column_but_published_at_and_its_lease(
    database, factory, seeded, assignment
):
    before = await snapshot(factory, seeded)
    statement = sql.SQL("UPDATE outbox SET {a} WHERE job_id = %(id)s").format(a=sql.SQL(assignment))
    await assert_refused(database, "exports_dispatcher", statement, {"id": seeded.id})
    assert await snapshot(factory, seeded) == before


async def test_dispatcher_leases_and_marks_published_through_its_own_statements(factory, dispatcher_store):
    job = await factory.queued()

    taken = await dispatcher_store.take_unpublished(batch=10_000, lease_seconds=30)
    [msg] = [m for m in taken if m.job_id == job.id]
    assert msg.publishing_until is not None
    assert await dispatcher_store.release_unpublished([msg]) == {msg.message_id}
    [msg] = [m for m in await dispatcher_store.take_unpublished(10_000, 30) if m.job_id == job.id]
    assert await dispatcher_store.mark_published([msg.message_id]) == {msg.message_id}

    rows = await factory.admin("SELECT published_at FROM outbox WHERE job_id = %(id)s", {"id": job.id})
    assert [r["published_at"] is not None for r in rows] == [True]


async def test_the_dispatchers_only_outbox_writes_are_published_at_and_its_lease(factory):
    rows = await factory.admin(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = 'public' AND table_name = 'outbox'"
        " AND has_column_privilege('exports_dispatcher', 'outbox', column_name, 'UPDATE')",
        {},
    )
    assert {r["column_name"] for r in rows} == {"published_at", "publishing_until"}


@pytest.mark.parametrize(
    ("statement", "params"),
    [
        ("SELECT id FROM export_jobs LIMIT 1", {}),
        ("UPDATE export_jobs SET woken_at = clock_timestamp() WHERE id = %(id)s", {}),
        (
            "INSERT INTO outbox (message_id, kind, job_id, created_at)"
            " VALUES (gen_random_uuid(), 'ExportReady', %(id)s, clock_timestamp())",
            {},
        ),
        (
            "INSERT INTO export_attempt_events (job_id, attempt_id, kind, recorded_at)"
            " VALUES (%(id)s, gen_random_uuid(), 'DeliveryEvidence', clock_timestamp())",
            {},
        ),
        ("SELECT email FROM contacts LIMIT 1", {}),
        ("SELECT credential_ref FROM destinations LIMIT 1", {}),
        ("SELECT token_sha256 FROM api_tokens LIMIT 1", {}),
    ],
)
async def test_dispatcher_can_do_nothing_else(database, seeded, statement, params):
    await assert_refused(database, "exports_dispatcher", statement, {"id": seeded.id, **params})


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT id FROM export_jobs LIMIT 1",
        "UPDATE export_jobs SET woken_at = clock_timestamp() WHERE id = %(id)s",
        "INSERT INTO outbox (message_id, kind, job_id, created_at)"
        " VALUES (gen_random_uuid(), 'ExportReady', %(id)s, clock_timestamp())",
        "SELECT 1 FROM export_attempt_events LIMIT 1",
        "SELECT email FROM contacts LIMIT 1",
        "SELECT credential_ref FROM destinations LIMIT 1",
        "SELECT token_sha256 FROM api_tokens LIMIT 1",
        "SELECT delivery_scope_open(gen_random_uuid(), gen_random_uuid())",
    ],
)
async def test_the_platform_role_can_do_nothing_but_the_global_switch(database, seeded, statement):
    # exports_platform (0019) exists for `starter.py pause --global` alone; the global row is the only one it
    # may write (tests/db/test_controls_permissions.py).
    await assert_refused(database, "exports_platform", statement, {"id": seeded.id})


async def test_the_platform_roles_grants_are_on_the_switch_tables_only(factory):
    rows = await factory.admin(
        "SELECT DISTINCT table_name FROM information_schema.role_table_grants WHERE grantee = 'exports_platform'"
        " UNION SELECT DISTINCT table_name FROM information_schema.column_privileges"
        " WHERE grantee = 'exports_platform'",
        {},
    )
    # 0031/0032: its pauses of the global scope, and the ledger rows of its own actions
    assert {r["table_name"] for r in rows} == {
        "delivery_switches",
        "delivery_switch_changes",
        "delivery_pauses",
        "operator_actions",
    }


# -- export_jobs: each role writes only the columns of its own transitions ----------------------------

_API_MUST_NOT_SET = [
    "attempt_id = gen_random_uuid()",
    "attempt_count = attempt_count + 1",
    "claimed_by = 'api'",
    "lease_expires_at = clock_timestamp()",
    "expected_file_name = 'x.csv'",
    "expected_file_bytes = 1",
    "expected_file_sha256 = '\\x00'::bytea",
    "delivery_authorized_at = clock_timestamp()",
    "workflow_id = 'wf'",
    "sweep_count = sweep_count + 1",
    "rejection_reason = 'no'",
]
_WORKER_MUST_NOT_SET = [
    "destination_id = gen_random_uuid()",
    "list_name = 'other'",
    "version = version + 1",
    "stop_request_id = NULL",
    "cancellation_request_id = gen_random_uuid()",
    "created_by = 'worker'",
    "replacement_reason = 'x'",
    "overwrite_agreement_ref = 'x'",
]
_RECONCILER_MUST_NOT_SET = [
    "attempt_id = gen_random_uuid()",
    "lease_expires_at = clock_timestamp()",
    "woken_at = clock_timestamp()",
    "version = version + 1",
    "stop_request_id = NULL",
]
_NOBODY_SETS = [
    "id = gen_random_uuid()",
    "tenant_id = gen_random_uuid()",
    "delivery_key = 'k'",
    "replaces_job_id = gen_random_uuid()",
    "created_at = clock_timestamp()",
]


@pytest.mark.parametrize(
    ("role", "assignment"),
    [("exports_api", a) for a in _API_MUST_NOT_SET]
    + [("exports_worker", a) for a in _WORKER_MUST_NOT_SET]
    + [("exports_reconciler", a) for a in _RECONCILER_MUST_NOT_SET]
    + [(r, a) for r in ROLES for a in _NOBODY_SETS],
)
async def test_role_may_not_write_columns_outside_its_transitions(
    database, factory, seeded, role, assignment
):
    before = await snapshot(factory, seeded)
    statement = sql.SQL("UPDATE export_jobs SET {a} WHERE id = %(id)s").format(a=sql.SQL(assignment))
    await assert_refused(database, role, statement, {"id": seeded.id})
    assert await snapshot(factory, seeded) == before


@pytest.mark.parametrize("role", ROLES)
async def test_nobody_deletes_an_export(database, factory, seeded, role):
    await assert_refused(database, role, "DELETE FROM export_jobs WHERE id = %(id)s", {"id": seeded.id})
    assert (await snapshot(factory, seeded))["job"]


@pytest.mark.parametrize(
    ("role", "statement"),
    [
        (
            "exports_worker",
            "INSERT INTO cancellation_requests (tenant_id, id, job_id, requested_by, outcome,"
            " found_status, found_attempt_count) SELECT tenant_id, gen_random_uuid(), id, 'w', 'TooLate', status, 0"
            " FROM export_jobs WHERE id = %(id)s",
        ),
        (
            "exports_worker",
            "INSERT INTO deliveries (tenant_id, delivery_key, original_job_id)"
            " SELECT tenant_id, 'k-' || gen_random_uuid(), id FROM export_jobs WHERE id = %(id)s",
        ),
        ("exports_worker", "SELECT token_sha256 FROM api_tokens LIMIT 1"),
        (
            "exports_reconciler",
            "INSERT INTO outbox (message_id, kind, job_id, created_at)"
            " VALUES (gen_random_uuid(), 'ExportReady', %(id)s, clock_timestamp())",
        ),
        ("exports_reconciler", "SELECT email FROM contacts LIMIT 1"),
        (
            "exports_reconciler",
            "INSERT INTO cancellation_requests (tenant_id, id, job_id, requested_by, outcome,"
            " found_status, found_attempt_count) SELECT tenant_id, gen_random_uuid(), id, 'r', 'TooLate', status, 0"
            " FROM export_jobs WHERE id = %(id)s",
        ),
        ("exports_dispatcher", "SELECT * FROM cancellation_requests LIMIT 1"),
    ],
)
async def test_role_may_not_insert_or_read_outside_its_job(database, seeded, role, statement):
    await assert_refused(database, role, statement, {"id": seeded.id})


async def test_the_login_alone_can_do_nothing(database, seeded):
    # NOINHERIT: a process must SET ROLE to the one its job needs; the bare login reads nothing.
    await assert_refused(
        database, None, "SELECT status FROM export_jobs WHERE id = %(id)s", {"id": seeded.id}
    )
    await assert_refused(database, None, "SELECT 1 FROM outbox LIMIT 1", {})
