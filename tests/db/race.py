"""Deterministic races on the real server (001 "Testing the Race"): one writer's transaction is held open
on its own connection, the second writer is proven to wait on that session with ``pg_blocking_pids``
within a bounded time, and only then does the first commit or roll back. Nothing here sleeps to win a race.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from db.pool import Role, open_pool
from db.queries import q
from db.stores.api import ApiStore
from db.stores.protocol import WorkerStore
from domain.models import AuthorizationResult, CancellationResult, ExportJob, final_name_for
from tests.support.stores import store_for

BLOCKING_WAIT_SECONDS = 5.0


class HeldTransaction:
    """A real connection whose transaction the test ends: as ``role`` (SET ROLE) or as the superuser (None).

    Statements run inside one open transaction (psycopg begins it implicitly); ``commit`` or ``rollback``
    releases the locks they took.
    """

    def __init__(self, conn: psycopg.AsyncConnection) -> None:
        self.conn = conn
        self.pid = conn.info.backend_pid

    @classmethod
    async def open(cls, url: str, role: Role | None) -> HeldTransaction:
        """Connect to ``url``, act as ``role`` when given, and leave the connection in manual-commit mode."""
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        if role is not None:
            await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        await conn.set_autocommit(False)
        return cls(conn)

    async def run(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Run the named statement of ``db/queries.sql`` (the same text the store runs), uncommitted."""
        return await self.execute(q(name), params)

    async def execute(self, query: Any, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run any statement inside the held transaction and return its rows."""
        async with self.conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params or {})
            return await cur.fetchall() if cur.description else []

    async def commit(self) -> None:
        await self.conn.commit()

    async def rollback(self) -> None:
        await self.conn.rollback()

    async def close(self) -> None:
        await self.conn.close()


@dataclass(frozen=True)
class SoloWriter:
    """A store over a one-connection pool, so the test knows which backend its statements run on."""

    store: Any  # the store of the role it was opened as (tests.support.stores)
    pid: int


class Gate:
    """A ``before_commit`` hook for ``ApiStore.request_cancellation``: holds the cancellation's transaction
    (row lock taken, decision written) until released; ``abort()`` makes it roll back instead."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self._release = asyncio.Event()
        self._abort = False

    async def __call__(self) -> None:
        self.entered.set()
        await self._release.wait()
        if self._abort:
            raise RolledBackOnPurpose

    async def wait_entered(self) -> None:
        """Wait (bounded) until the cancellation holds its lock and sits before its commit."""
        await asyncio.wait_for(self.entered.wait(), BLOCKING_WAIT_SECONDS)

    def commit(self) -> None:
        self._release.set()

    def abort(self) -> None:
        self._abort = True
        self._release.set()


class RolledBackOnPurpose(Exception):
    """Raised by ``Gate.abort()`` inside the held transaction so that it rolls back."""


class RaceKit:
    """What one test needs to stage a race: held transactions, one-connection stores, the blocking proof."""

    def __init__(self, app_url: str, admin_url: str) -> None:
        self.app_url = app_url
        self.admin_url = admin_url
        self._held: list[HeldTransaction] = []
        self._pools: list[Any] = []

    async def hold(self, role: Role | None) -> HeldTransaction:
        """A held transaction as ``role`` (the login ``exports_app``), or as the superuser when ``None``."""
        held = await HeldTransaction.open(self.admin_url if role is None else self.app_url, role)
        self._held.append(held)
        return held

    async def solo(self, role: Role, **store_kw: Any) -> SoloWriter:
        """A store whose every statement runs on one known backend."""
        pool = await open_pool(self.app_url, role, min_size=1, max_size=1, name=f"solo-{role}")
        self._pools.append(pool)
        async with pool.connection() as conn:
            pid = conn.info.backend_pid
        return SoloWriter(store_for(role, pool, **store_kw), pid)

    async def wait_until_blocked_by(
        self, waiter_pid: int, holder_pid: int, within: float = BLOCKING_WAIT_SECONDS
    ) -> None:
        """Poll ``pg_blocking_pids(waiter)`` until it contains ``holder``; fail the test on timeout."""
        deadline = time.monotonic() + within
        async with await psycopg.AsyncConnection.connect(self.app_url, autocommit=True) as conn:
            blockers: list[int] = []
            while time.monotonic() < deadline:
                cur = await conn.execute("SELECT pg_blocking_pids(%(w)s) AS b", {"w": waiter_pid})
                row = await cur.fetchone()
                blockers = list(row[0]) if row else []
                if holder_pid in blockers:
                    return
                await asyncio.sleep(0.01)  # polling a condition, bounded by the deadline
        pytest.fail(
            f"backend {waiter_pid} was not blocked by {holder_pid} within {within}s (blockers {blockers})"
        )

    async def close(self) -> None:
        for held in self._held:
            await held.close()
        for pool in self._pools:
            await pool.close()


@asynccontextmanager
async def race_kit(app_url: str, admin_url: str) -> AsyncIterator[RaceKit]:
    kit = RaceKit(app_url, admin_url)
    try:
        yield kit
    finally:
        await kit.close()


async def still_waiting(task: asyncio.Task[Any]) -> None:
    """Assert the second writer has not finished while the first holds the row."""
    await asyncio.sleep(0)
    assert not task.done(), "the second writer finished while the first still held the row"


# -- the store's statements with the parameters the store binds, for held transactions -----------------


def claim_params(
    job: ExportJob, attempt_id: UUID, worker_id: str = "worker-held", lease_seconds: float = 60.0
) -> dict[str, Any]:
    """Parameters of ``claim_if_queued`` as ``WorkerStore.claim_if_queued`` binds them."""
    return {
        "job_id": job.id,
        "checked_version": job.version,
        "attempt_id": attempt_id,
        "worker_id": worker_id,
        "workflow_id": None,
        "lease_seconds": lease_seconds,
        "traceparent": None,
    }


def matched(rows: list[dict[str, Any]]) -> bool:
    """Whether a claim or cutoff 2 run directly matched: they answer with the row either way."""
    return len(rows) == 1 and rows[0]["matched"] is True


def authorize_params(job: ExportJob, attempt_id: UUID, length: int = 1234) -> dict[str, Any]:
    """Parameters of ``authorize_delivery_if_running`` as ``WorkerStore.authorize_delivery_if_running`` binds them."""
    return {
        "tenant_id": job.tenant_id,
        "job_id": job.id,
        "attempt_id": attempt_id,
        "replaces_job_id": job.replaces_job_id,
        "final_name": final_name_for(job.delivery_key),
        "length": length,
        "sha256": b"\x01" * 32,
        "rows": 10,
        "detail": json.dumps({"file": final_name_for(job.delivery_key)}),
        "destination_version": None,  # the build read no destination here: cutoff 2 checks no version
        "lease_seconds": 60.0,
    }


async def authorize(store: WorkerStore, job: ExportJob, attempt_id: UUID) -> AuthorizationResult:
    """Cutoff 2 through the store for ``job``'s own final name."""
    params = authorize_params(job, attempt_id)
    del params["lease_seconds"], params["detail"]  # the store binds its own
    return await store.authorize_delivery_if_running(**params)


async def cancel(
    store: ApiStore,
    job: ExportJob,
    *,
    request_id: UUID | None = None,
    requested_by: str = "sam.ops",
    **kw: Any,
) -> CancellationResult:
    """One cancellation request through the store, with a fresh request ID unless one is given."""
    return await store.request_cancellation(
        tenant_id=job.tenant_id,
        job_id=job.id,
        request_id=request_id or uuid.uuid4(),
        requested_by=requested_by,
        reason="wrong destination",
        **kw,
    )
