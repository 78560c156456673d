"""The plumbing every store shares: one pool (its role decides what the database allows), typed rows,
the one error boundary (:func:`db.errors.translated`), the lost-response re-read of 000, and the
``transition`` decorator that counts and logs a transition's answer once it has decided."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar
from uuid import UUID

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from db.errors import (
    InvariantViolation,
    StoreError,
    TransientStoreError,
    translated,
)
from db.queries import execute, fetch
from db.rows import (
    ActionIdRow,
    StoppedRow,
)
from domain.audit import ActionRecord
from domain.models import (
    OwnershipState,
    Statement,
)
from observability.metrics import StopPath, get_metrics
from observability.statements import record_transition

log = logging.getLogger(__name__)

Row = TypeVar("Row")
P = ParamSpec("P")
Answer = TypeVar("Answer")

# Bounded: a worker must not hang in a re-read during shutdown with the database unreachable.
REREAD_TIMEOUT_SECONDS = 5.0

# The transaction an operator action and its ledger row share (StoreBase.recording): while it is open in this
# task, the statements of every store over the same pool run on its connection, each in a savepoint.
_AMBIENT: ContextVar[tuple[AsyncConnectionPool[Any], AsyncConnection[Any]] | None] = ContextVar(
    "fenced_exports_ambient_transaction", default=None
)


def transition(
    statement: Statement,
) -> Callable[[Callable[P, Awaitable[Answer]]], Callable[P, Awaitable[Answer]]]:
    """Count and log a transition method's answer once it has decided (after any lost-response re-read):
    ``fenced_exports_transitions_total{statement, result}`` and one log line with the IDs it was called
    with. A method that raises a ``StoreError`` is counted ``unknown`` (an exception is not a "no")."""

    def decorate(method: Callable[P, Awaitable[Answer]]) -> Callable[P, Awaitable[Answer]]:
        signature = inspect.signature(method)

        def record(answer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            called = signature.bind(*args, **kwargs).arguments
            record_transition(
                statement,
                answer,
                tenant_id=called.get("tenant_id"),
                job_id=called.get("job_id"),
                attempt_id=called.get("attempt_id", called.get("expired_attempt_id")),
            )

        @functools.wraps(method)
        async def recorded(*args: P.args, **kwargs: P.kwargs) -> Answer:
            try:
                answer = await method(*args, **kwargs)
            except StoreError:
                record(None, args, kwargs)
                raise
            record(answer, args, kwargs)
            return answer

        return recorded

    return decorate


class StoreBase:
    """The statements of one role over one pool; the pool's role decides what the database allows."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        lease_seconds: float = 60.0,
        reread_timeout: float = REREAD_TIMEOUT_SECONDS,
    ) -> None:
        self.pool = pool
        self.lease_seconds = lease_seconds
        self.reread_timeout = reread_timeout

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection of this store's pool: the one of an action being recorded in this task
        (:meth:`recording`), in a savepoint, so a statement that fails undoes itself only; else one checked out
        for this use."""
        ambient = _AMBIENT.get()
        if ambient is not None and ambient[0] is self.pool:
            conn = ambient[1]
            async with conn.transaction():
                yield conn
            return
        async with self.pool.connection() as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def recording(self, record: ActionRecord) -> AsyncIterator[ActionRecord]:
        """An operator action and its ledger row in one transaction (0031): the block runs the action's
        statements (through any store over this pool) and sets ``record.outcome``; its row is appended as the
        last statement before COMMIT. An exception rolls both back: an action that did not happen is not in
        the ledger. The block must not run statements of this pool concurrently (one connection)."""
        async with translated(), self.pool.connection() as conn, conn.transaction():
            token = _AMBIENT.set((self.pool, conn))
            try:
                yield record
            finally:
                _AMBIENT.reset(token)
            if record.outcome is None:
                raise InvariantViolation(f"{record.action} ended without an outcome to record")
            await execute(conn, "record_operator_action", record.params())
        record.written = True

    async def record_operator_action(self, record: ActionRecord) -> int:
        """Append one ledger row on its own (a refusal, or an action that is no database write)."""
        async with translated(), self._connection() as conn:
            rows = await fetch(conn, "record_operator_action", record.params(), ActionIdRow)
        record.written = True
        return rows[0].id

    async def _rows(self, name: str, params: dict[str, Any], row: type[Row]) -> list[Row]:
        async with translated(), self._connection() as conn:
            return await fetch(conn, name, params, row)

    async def _row(self, name: str, params: dict[str, Any], row: type[Row]) -> Row | None:
        rows = await self._rows(name, params, row)
        return rows[0] if rows else None

    @contextlib.asynccontextmanager
    async def _bounded(self, timeout_ms: int) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection in a short read transaction bounded by ``timeout_ms`` (``bound_this_read``: a
        statement_timeout, and custom plans for statements whose filters are optional). A statement past the
        bound raises :class:`db.errors.QueryTimedOut`; the transaction is rolled back and the connection goes
        back to its pool idle. Every list and count of the console and the list API runs so."""
        async with translated(), self.pool.connection() as conn, conn.transaction():
            # 0 would mean no bound at all
            await execute(conn, "bound_this_read", {"timeout": f"{max(1, int(timeout_ms))}ms"})
            yield conn

    async def _bounded_rows(
        self, name: str, params: dict[str, Any], row: type[Row], timeout_ms: int
    ) -> list[Row]:
        """Run one read under :meth:`_bounded`."""
        async with self._bounded(timeout_ms) as conn:
            return await fetch(conn, name, params, row)

    async def _matched(self, name: str, **params: Any) -> bool:
        """Run a conditional write; True when it matched a row (and so wrote its event)."""
        async with translated(), self._connection() as conn:
            return await execute(conn, name, params) > 0

    async def _unless_lost(self, name: str, params: dict[str, Any], row: type[Row]) -> list[Row] | None:
        """Run a write; its rows, or ``None`` when its answer was lost (it may or may not have committed)."""
        try:
            return await self._rows(name, params, row)
        except TransientStoreError as exc:
            log.warning("%s: no answer (%s); re-reading the row", name, exc)
            return None

    async def _reread(self, job_id: UUID) -> OwnershipState | None:
        """State and ownership together; raises ``TransientStoreError`` when the re-read fails too."""
        try:
            return await asyncio.wait_for(
                self._row("read_ownership", {"job_id": job_id}, OwnershipState), self.reread_timeout
            )
        except TimeoutError as exc:
            raise TransientStoreError("the re-read timed out") from exc


def observe_stop(row: StoppedRow, path: StopPath) -> None:
    if row.stop_latency_seconds is not None:
        get_metrics().observe_stop_latency(row.stop_latency_seconds, path=path)
