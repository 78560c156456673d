"""Connection pools, one per database role: each connection ``SET ROLE``s before it is handed out."""

from __future__ import annotations

from typing import Literal

from psycopg import AsyncConnection, sql
from psycopg_pool import AsyncConnectionPool

from db.errors import translated
from db.queries import execute

Role = Literal[
    "exports_api", "exports_worker", "exports_recovery", "exports_dispatcher", "exports_reconciler"
]


async def open_pool(
    url: str,
    role: Role,
    *,
    min_size: int = 1,
    max_size: int = 8,
    name: str | None = None,
    acquire_timeout: float = 15.0,
) -> AsyncConnectionPool:
    """Open an autocommit pool whose connections act as ``role``; fails at start on a bad URL.

    Every statement of the protocol is one autocommit statement; the few short transactions open
    their own with ``conn.transaction()``.
    """

    async def configure(conn: AsyncConnection) -> None:
        await conn.set_autocommit(True)
        await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))

    pool = AsyncConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        open=False,
        configure=configure,
        name=name or role,
        kwargs={"application_name": f"fenced-exports:{role}", "connect_timeout": 10},
        timeout=acquire_timeout,
    )
    await pool.open(wait=True, timeout=30)
    return pool


async def ping(pool: AsyncConnectionPool) -> None:
    """Readiness: the database answers ``ping_database`` on a connection of ``pool``; raises the
    translated error (``TransientStoreError`` when it does not answer) otherwise."""
    async with translated(), pool.connection() as conn:
        await execute(conn, "ping_database", {})
