"""Migration 0006 on a database that already has data (issue 9): an upgrade pauses nothing and rejects
nothing that was allowed before. Existing tenants and destinations are enabled, the global switch is on,
token holders and the creators of existing exports become principals, and a Rejected row recorded before
codes existed gets one; a destination created after the upgrade starts paused."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from db.migrate import migrate, migration_files
from db.queries import fetch_sync
from testbed.pg import with_database

BEFORE = "0005_fences_and_roles.sql"


@pytest.fixture(scope="module")
def old_database(pg_server: str) -> Iterator[str]:
    """A database migrated up to 0005 only, as a deployment before this change had it."""
    name = f"fenced_upgrade_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = with_database(pg_server, name)
    with psycopg.connect(url, autocommit=True) as conn:
        fetch_sync(conn, "create_migrations_table", {})
        for file, text in migration_files():
            if file > BEFORE:
                break
            with conn.transaction():
                conn.execute(text)  # a whole file of DDL, as db.migrate applies it
                fetch_sync(conn, "record_migration", {"name": file})
    yield url


def test_an_upgrade_keeps_everything_that_ran_running(old_database: str) -> None:
    tenant, destination, queued, rejected = (uuid.uuid4() for _ in range(4))
    with psycopg.connect(old_database, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("INSERT INTO tenants (id, name) VALUES (%(t)s, 'acme')", {"t": tenant})
        conn.execute(
            "INSERT INTO destinations (id, tenant_id, name, host, port, username, host_key, credential_ref,"
            " remote_dir, created_at) VALUES (%(d)s, %(t)s, 'partner-old', 'h', 22, 'u', 'k', '/k', '/',"
            " '2025-03-04 10:00+00')",
            {"d": destination, "t": tenant},
        )
        conn.execute(
            "INSERT INTO api_tokens (token_sha256, tenant_id, principal, role) VALUES"
            " ('\\x01', %(t)s, 'sam.ops', 'operator'), ('\\x02', %(t)s, 'rita', 'operator'),"
            " ('\\x03', %(t)s, 'rita', 'reconciler')",
            {"t": tenant},
        )
        for job, creator in ((queued, "cli-user"), (rejected, "sam.ops")):
            conn.execute(
                "WITH d AS (INSERT INTO deliveries (tenant_id, delivery_key, original_job_id)"
                " VALUES (%(t)s, %(k)s, %(j)s))"
                " INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, delivery_key,"
                " created_by, woken_at, list_name) VALUES (%(j)s, %(t)s, 'Queued', 1, %(d)s, %(k)s, %(c)s,"
                " clock_timestamp(), 'main')",
                {"t": tenant, "d": destination, "j": job, "k": str(job), "c": creator},
            )
        conn.execute("SET ROLE exports_worker")  # the edge is the worker's, even for the owner
        conn.execute(
            "UPDATE export_jobs SET status = 'Rejected', rejection_reason = 'policy: no contact list named'"
            " WHERE id = %(j)s",
            {"j": rejected},
        )
        conn.execute("RESET ROLE")

    assert migrate(old_database)[0] == "0006_controls.sql"  # and any later ones

    with psycopg.connect(old_database, autocommit=True, row_factory=dict_row) as conn:
        switches = conn.execute(
            "SELECT scope, tenant_id, destination_id, enabled FROM delivery_switches ORDER BY scope"
        ).fetchall()
        assert switches == [
            {"scope": "destination", "tenant_id": tenant, "destination_id": destination, "enabled": True},
            {"scope": "global", "tenant_id": None, "destination_id": None, "enabled": True},
            {"scope": "tenant", "tenant_id": tenant, "destination_id": None, "enabled": True},
        ]
        history = conn.execute("SELECT count(*) AS n FROM delivery_switch_changes").fetchone()
        assert history == {"n": 3}  # each enabling is on record, by the migration

        principals = conn.execute(
            "SELECT name, role FROM principals WHERE tenant_id = %(t)s ORDER BY name", {"t": tenant}
        ).fetchall()
        assert principals == [
            {"name": "cli-user", "role": "operator"},  # created an export: still allowed to
            {"name": "rita", "role": "reconciler"},  # held both roles' tokens: keeps the wider one
            {"name": "sam.ops", "role": "operator"},
        ]

        destination_row = conn.execute(
            "SELECT contract_starts_on, contract_ends_on, retired_at FROM destinations WHERE id = %(d)s",
            {"d": destination},
        ).fetchone()
        assert destination_row is not None
        assert str(destination_row["contract_starts_on"]) == "2025-03-04"
        assert destination_row["contract_ends_on"] is None and destination_row["retired_at"] is None

        rejected_row = conn.execute(
            "SELECT status, rejection_code, rejection_reason FROM export_jobs WHERE id = %(j)s",
            {"j": rejected},
        ).fetchone()
        assert rejected_row == {
            "status": "Rejected",
            "rejection_code": "list_invalid",
            "rejection_reason": "policy: no contact list named",
        }
        # The guard trigger set aside for the backfill is back: a Rejected row is final again.
        conn.execute("SET ROLE exports_worker")
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "UPDATE export_jobs SET rejection_code = 'list_missing' WHERE id = %(j)s", {"j": rejected}
            )
        conn.execute("RESET ROLE")

        # A destination added after the upgrade starts paused: it has no switch row until enabled.
        new_destination = uuid.uuid4()
        conn.execute(
            "INSERT INTO destinations (id, tenant_id, name, host, port, username, host_key, credential_ref,"
            " remote_dir) VALUES (%(d)s, %(t)s, 'partner-new', 'h', 22, 'u', 'k', '/k', '/')",
            {"d": new_destination, "t": tenant},
        )
        found = conn.execute(
            "SELECT count(*) AS n FROM delivery_switches WHERE destination_id = %(d)s AND enabled",
            {"d": new_destination},
        ).fetchone()
        assert found == {"n": 0}

    assert migrate(old_database) == []  # and migrating again is a no-op
