"""Connection pools, one per database role: each connection ``SET ROLE``s before it is handed out, and is
checked on checkout so a restart or failover of PostgreSQL never hands out a dead connection."""

from __future__ import annotations

import asyncio
import logging
import select
import time
from typing import Any, Literal

import psycopg
from psycopg import AsyncConnection, sql
from psycopg.pq import ConnStatus, TransactionStatus
from psycopg_pool import AsyncConnectionPool

from db.errors import StoreError, TransientStoreError, translated
from db.queries import execute

log = logging.getLogger(__name__)

Role = Literal[
    "exports_api", "exports_worker", "exports_recovery", "exports_dispatcher", "exports_reconciler"
]

# Start-up: how long a process keeps trying to reach PostgreSQL before it gives up with one clear error.
START_RETRY_SECONDS = 60.0


def is_stale(conn: AsyncConnection[Any]) -> bool:
    """True when an idle pooled connection can no longer serve a statement.

    An idle connection is sent nothing by the server, so anything readable on its socket is the server
    ending it: a restart (fast or immediate stop), a failover, an administrator's terminate, an idle
    timeout; EOF and errors are the same. This needs no round trip (a ``poll`` with a zero timeout): a
    round trip per checkout costs as much as the statement itself on loopback.
    """
    pgconn = conn.pgconn
    if conn.closed or pgconn.status != ConnStatus.OK or pgconn.transaction_status != TransactionStatus.IDLE:
        return True
    try:
        poller = select.poll()
        poller.register(pgconn.socket, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


class CheckedPool(AsyncConnectionPool[AsyncConnection[Any]]):
    """A pool that checks each connection on checkout (:func:`is_stale`) and replaces a stale one at once.

    psycopg_pool's own ``check=`` callback backs off (1 s, 2 s, 4 s, ...) after each connection that fails
    it, so the first request after a restart would wait out one back-off per dead connection in the pool.
    Here a stale connection is closed and returned (the pool replaces it in the background) and the next
    one is taken without waiting; only when none is left does the checkout wait, up to the pool's
    timeout, for a new connection (``PoolTimeout``, translated as transient, while the server is down).
    """

    async def getconn(self, timeout: float | None = None) -> AsyncConnection[Any]:  # noqa: ASYNC109 - the pool's signature
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            conn = await super().getconn(timeout=max(deadline - time.monotonic(), 0.001))
            if not is_stale(conn):
                return conn
            log.info("pool %s: discarding a connection the server ended", self.name)
            await conn.close()
            await self.putconn(conn)


async def open_pool(
    url: str,
    role: Role,
    *,
    min_size: int = 1,
    max_size: int = 8,
    name: str | None = None,
    checkout_timeout: float = 15.0,
    retry_for: float = 0.0,
) -> AsyncConnectionPool[AsyncConnection[Any]]:
    """Open an autocommit pool whose connections act as ``role``; fails at start on a bad URL.

    Every statement of the protocol is one autocommit statement; the few short transactions open
    their own with ``conn.transaction()``. ``checkout_timeout`` bounds each checkout. With ``retry_for`` the pool
    first waits for the server (:func:`wait_for_postgres`), so a process started while PostgreSQL restarts
    comes up once it is back.
    """

    async def configure(conn: AsyncConnection[Any]) -> None:
        await conn.set_autocommit(True)
        await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))

    if retry_for > 0:
        await wait_for_postgres(url, retry_for, what=f"the {role} pool")
    pool = CheckedPool(
        url,
        min_size=min_size,
        max_size=max_size,
        open=False,
        configure=configure,
        name=name or role,
        kwargs={"application_name": f"fenced-exports:{role}", "connect_timeout": 10},
        timeout=checkout_timeout,
    )
    await pool.open(wait=True, timeout=30)
    return pool


# A server that refuses a connection with one of these is starting, stopping or full: worth a retry.
_RETRYABLE_REFUSALS = (
    "starting up",
    "shutting down",
    "in recovery",
    "not yet accepting connections",
    "not accepting connections",
    "too many clients",
    "remaining connection slots",
)


async def wait_for_postgres(url: str, retry_for: float, *, what: str = "PostgreSQL") -> None:
    """Connect once to ``url``, retrying with backoff (0.5 s doubling to 5 s) for ``retry_for`` seconds
    while the server does not answer or is starting; each failure is logged (without the URL).

    Raises ``TransientStoreError`` naming the last failure when the time is up, and ``StoreError`` at
    once when the server answered with a refusal no retry can fix (an unknown database or role, a failed
    authentication, no ``pg_hba.conf`` entry).
    """
    deadline = time.monotonic() + retry_for
    delay = 0.5
    while True:
        try:
            conn = await AsyncConnection.connect(url, connect_timeout=max(1, min(10, int(retry_for))))
        except psycopg.Error as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            if "FATAL:" in reason and not any(text in reason for text in _RETRYABLE_REFUSALS):
                raise StoreError(f"PostgreSQL refused {what}: {reason}") from exc
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransientStoreError(
                    f"PostgreSQL did not answer {what} within {retry_for:g} s: {reason}"
                ) from exc
            log.warning("PostgreSQL does not answer %s yet (%s); retrying in %.1f s", what, reason, delay)
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 5.0)
        else:
            await conn.close()
            return


async def ping(pool: AsyncConnectionPool) -> None:
    """Readiness: the database answers ``ping_database`` on a connection of ``pool``; raises the
    translated error (``TransientStoreError`` when it does not answer) otherwise."""
    async with translated(), pool.connection() as conn:
        await execute(conn, "ping_database", {})
