"""Numbered ``.sql`` migrations, applied under an advisory lock and recorded, so running twice is a no-op."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from importlib import resources

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from db.errors import translated
from db.queries import fetch, fetch_sync
from db.rows import NameRow

log = logging.getLogger(__name__)

# Any constant works; it only has to be the same for every migrating process.
_MIGRATION_LOCK = 7_461_003_211

# Every NOLOGIN role the migrations create; exports_platform (0019) changes the global delivery switch only.
APP_ROLES = (
    "exports_api",
    "exports_worker",
    "exports_recovery",
    "exports_dispatcher",
    "exports_reconciler",
    "exports_platform",
)


def migration_files() -> list[tuple[str, str]]:
    """Return ``(name, sql_text)`` for every migration, in order."""
    folder = resources.files("db") / "migrations"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".sql"))
    return [(n, (folder / n).read_text(encoding="utf-8")) for n in names]


def migrate(url: str) -> list[str]:
    """Apply every pending migration to ``url`` and return the names applied now.

    Idempotent and safe to run from several processes at once: the advisory lock serializes them and
    each migration commits together with its record in ``schema_migrations``.
    """
    applied_now: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        fetch_sync(conn, "lock_migrations", {"key": _MIGRATION_LOCK})
        try:
            fetch_sync(conn, "create_migrations_table", {})
            done = {r["name"] for r in fetch_sync(conn, "applied_migrations", {})}
            for name, text in migration_files():
                if name in done:
                    continue
                with conn.transaction():
                    conn.execute(text)  # a whole file of DDL, no parameters
                    fetch_sync(conn, "record_migration", {"name": name})
                log.info("applied migration %s", name)
                applied_now.append(name)
        finally:
            fetch_sync(conn, "unlock_migrations", {"key": _MIGRATION_LOCK})
    return applied_now


def ensure_app_login(url: str, login: str) -> None:
    """Create ``login`` (a LOGIN role without superuser) as a member of every application role.

    Processes connect as this login and ``SET ROLE`` to the role their job needs; NOINHERIT means the
    login alone can do nothing. Used by the demo and the tests; production grants membership its own way.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        exists = fetch_sync(conn, "role_exists", {"role": login})
        if not exists:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOINHERIT").format(sql.Identifier(login)))
        for role in APP_ROLES:
            conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), sql.Identifier(login)))


async def missing_migrations(pool: AsyncConnectionPool, expected: Sequence[str] | None = None) -> list[str]:
    """The migrations of ``expected`` (default: every file this build ships) that ``schema_migrations``
    does not record, in order; readiness asks it on the process's own pool (any application role may)."""
    wanted = [name for name, _ in migration_files()] if expected is None else list(expected)
    async with translated(), pool.connection() as conn:
        applied = {row.name for row in await fetch(conn, "applied_migrations", {}, NameRow)}
    return [name for name in wanted if name not in applied]
