"""``db/schema.sql`` is the schema the migrations leave: a freshly migrated database dumps to exactly that file
(tables, constraints, indexes, functions, triggers, grants, and the application roles)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from db.schema import REGENERATE, SCHEMA_FILE, differences, dump_schema, pg_dump_major


@pytest.fixture(scope="module")
def schema_server(pg_server: str) -> Iterator[str]:
    """The session's server when it is of pg_dump's major version (the one schema.sql is written from),
    else an embedded server of that version: another server version deparses some definitions differently."""
    with psycopg.connect(pg_server) as conn:
        major = conn.info.server_version // 10000
    if major == pg_dump_major():
        yield pg_server
        return
    from db.embedded import EmbeddedPostgres

    server = EmbeddedPostgres.start()
    try:
        yield server.url
    finally:
        server.stop()


def test_a_freshly_migrated_database_matches_schema_sql(schema_server: str) -> None:
    diff = differences(SCHEMA_FILE.read_text(encoding="utf-8"), dump_schema(schema_server))
    assert not diff, f"db/schema.sql is stale; regenerate it with: {REGENERATE}\n{diff}"


def test_schema_sql_holds_the_grants_and_the_roles() -> None:
    text = SCHEMA_FILE.read_text(encoding="utf-8")
    assert "GRANT " in text
    for role in (
        "exports_api",
        "exports_worker",
        "exports_recovery",
        "exports_dispatcher",
        "exports_reconciler",
    ):
        assert f"-- CREATE ROLE {role};" in text, role
