"""Connection pools, one per database role: each connection ``SET ROLE``s before it is handed out, and is
checked on checkout so a restart or failover of PostgreSQL never hands out a dead connection."""

from __future__ import annotations

import asyncio
import logging
import re
import select
import time
from typing import Any, Literal
from urllib.parse import quote, urlsplit

import psycopg
from psycopg import AsyncConnection, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import ConnStatus, TransactionStatus
from psycopg_pool import AsyncConnectionPool

from db.errors import StoreError, TransientStoreError, translated
from db.queries import execute

log = logging.getLogger(__name__)

Role = Literal[
    "exports_api",
    "exports_worker",
    "exports_recovery",
    "exports_dispatcher",
    "exports_reconciler",
    "exports_platform",
]

# Start-up: how long a process keeps trying to reach PostgreSQL before it gives up with one clear error.
START_RETRY_SECONDS = 60.0

# Roles whose connections run the row protocol: the same few dozen statements over and over, each reading and
# writing rows by their keys. Once psycopg prepares a statement on a connection (its fifth run there), the
# server plans it once, a generic plan kept until the tables' statistics or definitions change, instead of
# planning each call for its parameters: planning took about as much of the server's time per export as running
# the statements (bench e2e; docs/benchmarks.md). Statements stay unprepared for their first runs, so the
# fault seams that recognise a statement by its text on the wire (testbed.tcp_proxy) still see it.
PLANNED_ONCE: frozenset[str] = frozenset({"exports_worker"})


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
    parameters: dict[str, str] | None = None,
) -> AsyncConnectionPool[AsyncConnection[Any]]:
    """Open an autocommit pool whose connections act as ``role``; fails at start on a bad URL.

    Every statement of the protocol is one autocommit statement; the few short transactions open
    their own with ``conn.transaction()``. ``checkout_timeout`` bounds each checkout. With ``retry_for`` the pool
    first waits for the server (:func:`wait_for_postgres`), so a process started while PostgreSQL restarts
    comes up once it is back. ``parameters`` are set on each connection (``set_config``, for the session):
    settings the role's triggers read, such as ``fenced.session_takeover_hold_seconds`` (0041).
    """

    async def configure(conn: AsyncConnection[Any]) -> None:
        await conn.set_autocommit(True)
        await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        if role in PLANNED_ONCE:
            await conn.execute("SET plan_cache_mode = force_generic_plan")
        for name, value in (parameters or {}).items():
            await conn.execute("SELECT set_config(%s, %s, false)", (name, value))

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

# libpq's words for a TLS setting of the URL that cannot work, and what each means: no retry fixes these
# (a TLS connection cut short, "SSL SYSCALL error" or "closed unexpectedly", is a restart: retried).
_TLS_REFUSALS = (
    (
        re.compile(r"certificate verify failed"),
        "the server's certificate is not signed by the CA in sslrootcert, or has expired",
    ),
    (
        re.compile(r"does not match host name|host name must be specified"),
        "the server's certificate does not name the URL's host (sslmode=verify-full checks it)",
    ),
    (re.compile(r"root certificate file"), "the sslrootcert file is missing or holds no certificate"),
    (re.compile(r"could not (?:open|read) certificate file"), "the sslcert file cannot be read"),
    (re.compile(r"private (?:SSL )?key"), "the sslkey file cannot be used with sslcert"),
    (re.compile(r"server does not support SSL"), "the server does not offer TLS, but sslmode requires it"),
    (
        re.compile(r"sslmode|SSL protocol version|_protocol_version|sslnegotiation|sslcertmode|SSL context"),
        "a TLS parameter of the URL is invalid",
    ),
    (
        re.compile(r"SSL error: \S+ alert"),
        "the server refused the TLS handshake (the client certificate, or no common TLS version)",
    ),
)


def _tls_refusal(reason: str) -> str | None:
    """What is wrong with the URL's TLS settings when ``reason`` is one of libpq's TLS refusals, else None."""
    for pattern, meaning in _TLS_REFUSALS:
        if pattern.search(reason):
            return meaning
    return None


def _redacted(text: str, url: str) -> str:
    """``text`` without the URL's password. libpq's connection errors name the host and port, never the
    password, but a URL it cannot parse is quoted in part: the password is masked wherever it appears."""
    try:
        password = conninfo_to_dict(url).get("password")
    except psycopg.Error:
        try:
            password = urlsplit(url).password
        except ValueError:
            password = None
    if not password:
        return text
    for form in {str(password), quote(str(password), safe="")}:
        text = text.replace(form, "***")
    return text


async def wait_for_postgres(url: str, retry_for: float, *, what: str = "PostgreSQL") -> None:
    """Connect once to ``url``, retrying with backoff (0.5 s doubling to 5 s) for ``retry_for`` seconds
    while the server does not answer or is starting; each failure is logged (without the URL or its
    password).

    Raises ``TransientStoreError`` naming the last failure when the time is up, and ``StoreError`` at
    once for a refusal no retry can fix: the server's (an unknown database or role, a failed
    authentication, no ``pg_hba.conf`` entry), a TLS setting of the URL that cannot work (the server's
    certificate fails verification against ``sslrootcert`` or does not name the host, the ``sslrootcert``,
    ``sslcert`` or ``sslkey`` file is missing or unusable, an invalid ``sslmode``, a server without TLS),
    or a URL that is not a connection string.
    """
    deadline = time.monotonic() + retry_for
    delay = 0.5
    while True:
        try:
            conn = await AsyncConnection.connect(url, connect_timeout=max(1, min(10, int(retry_for))))
        except psycopg.Error as exc:
            reason = _redacted(" ".join(str(exc).split()) or type(exc).__name__, url)
            if isinstance(exc, psycopg.ProgrammingError):
                raise StoreError(f"not a PostgreSQL connection string ({reason})") from exc
            if (tls := _tls_refusal(reason)) is not None:
                raise StoreError(
                    f"TLS with PostgreSQL failed for {what}, and no retry fixes it: {tls} ({reason})"
                ) from exc
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
