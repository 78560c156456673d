"""The cancellation ledger (role ``exports_api``): one request's transaction in one pipelined round trip,
bulk cancels in pipelined segments, and the batches that record them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from uuid import UUID

import psycopg
from psycopg import AsyncConnection, AsyncCursor

from db.errors import (
    ConstraintRefused,
    InvariantViolation,
    LockTimeout,
    StoreError,
    TransientStoreError,
    translated,
)
from db.queries import execute, fetch_maybe, send
from db.rows import (
    ActionIdRow,
    CancellationBatch,
    JobIdRow,
    LedgerAnswer,
    OutcomeCount,
    PreviewedExport,
    StopToSignal,
)
from db.stores.reads import Reads
from domain.audit import ActionRecord
from domain.models import (
    CancellationOutcome,
    CancellationRequest,
    CancellationResult,
    ExportJob,
    Statement,
)
from observability.statements import observe_statement, record_transition

log = logging.getLogger(__name__)

# Exports whose ledger transactions a bulk cancel queues in one pipeline (one round trip for all).
PIPELINE_SEGMENT = 16

# The ledger transaction's test seam: awaited before its COMMIT.
BeforeCommit = Callable[[], Awaitable[None]]

_CHANGES_THE_JOB = {CancellationOutcome.CANCELED_WHILE_QUEUED, CancellationOutcome.STOP_REQUESTED}


class LedgerStatements(Reads):
    """The cancellation ledger: single and bulk cancellation requests, and their batches."""

    async def request_cancellation(
        self,
        *,
        tenant_id: UUID,
        job_id: UUID,
        request_id: UUID,
        requested_by: str,
        reason: str | None,
        lock_timeout: str = "2s",
        before_commit: BeforeCommit | None = None,
        batch_id: UUID | None = None,
        record: ActionRecord | None = None,
    ) -> CancellationResult:
        """Decide and record one cancellation request under a lock on this tenant's job row (000).

        One round trip: BEGIN, ``SET LOCAL lock_timeout``, the one statement that locks, classifies,
        updates and records (``cancel_and_record``), and COMMIT go out together in pipeline mode. Busy
        when the lock wait outlasts ``lock_timeout`` (nothing recorded; retry with the same ID).
        ``before_commit`` is a test seam awaited with the lock held, after the decision is written (the
        COMMIT then follows in a second round trip). ``batch_id`` names the bulk cancel it belongs to.
        With ``record``, the request's row of the ledger of operator actions goes in the same pipeline, before
        the COMMIT (``record_cancellation_action``; no extra round trip), and ``record.written`` says whether
        it was appended (not when nothing was recorded: no such export, a request ID of another request).
        """
        async with translated(), self.pool.connection() as conn:
            return await self._request_cancellation_on(
                conn,
                tenant_id=tenant_id,
                job_id=job_id,
                request_id=request_id,
                requested_by=requested_by,
                reason=reason,
                lock_timeout=lock_timeout,
                before_commit=before_commit,
                batch_id=batch_id,
                record=record,
            )

    async def _request_cancellation_on(
        self,
        conn: AsyncConnection[Any],
        *,
        tenant_id: UUID,
        job_id: UUID,
        request_id: UUID,
        requested_by: str,
        reason: str | None,
        lock_timeout: str,
        before_commit: BeforeCommit | None = None,
        batch_id: UUID | None = None,
        record: ActionRecord | None = None,
    ) -> CancellationResult:
        params = {
            "tenant_id": tenant_id,
            "job_id": job_id,
            "request_id": request_id,
            "requested_by": requested_by,
            "reason": reason,
            "batch_id": batch_id,
        }
        try:
            async with translated():
                answers = await _cancellation_ledger(conn, params, lock_timeout, before_commit, record)
        except LockTimeout:
            return CancellationResult(request_id=request_id, outcome=CancellationOutcome.BUSY)
        except ConstraintRefused as exc:
            if exc.constraint != "pk_cancellation_requests":
                raise
            # The same (tenant, request ID) committed first: under another job's lock, or under this one
            # while this statement waited (its snapshot predates that commit). This transaction rolled
            # back; read what was recorded, with the same job and operator check.
            async with translated():  # on this connection: a one-connection pool must not wait on itself
                earlier = await fetch_maybe(
                    conn,
                    "find_cancellation_request",
                    {"tenant_id": tenant_id, "request_id": request_id},
                    CancellationRequest,
                )
            if earlier is None:
                raise
            return _from_earlier(earlier, job_id, requested_by)
        return _ledger_result(answers, job_id, request_id, requested_by)

    async def record_cancellation_preview(
        self,
        *,
        tenant_id: UUID,
        previewed_by: str,
        destination_id: UUID,
        list_name: str | None,
        ttl_seconds: int,
    ) -> list[PreviewedExport]:
        """The live exports a bulk cancel with this filter would cover now, each with its status, and that
        exact set kept under a new preview token (on every row; no rows, no token) for ``ttl_seconds``."""
        return await self._rows(
            "record_cancellation_preview",
            {
                "tenant_id": tenant_id,
                "previewed_by": previewed_by,
                "destination_id": destination_id,
                "list_name": list_name,
                "ttl_seconds": ttl_seconds,
            },
            PreviewedExport,
        )

    async def record_cancellation_batch(
        self,
        *,
        tenant_id: UUID,
        batch_id: UUID,
        requested_by: str,
        reason: str,
        destination_id: UUID,
        list_name: str | None,
        preview_id: UUID | None = None,
    ) -> tuple[CancellationBatch, bool] | None:
        """Record a bulk cancel and the exports it covers, in one statement; or find it recorded.

        With ``preview_id`` it covers exactly the set that preview counted; without, the exports live now.
        Returns the batch and whether it was recorded now; ``None`` when the batch ID is new and the preview
        is not this principal's unexpired preview of this filter in this tenant (nothing recorded). Raises
        ``UnknownReference`` for a destination that is not the tenant's.
        """
        params = {
            "tenant_id": tenant_id,
            "batch_id": batch_id,
            "requested_by": requested_by,
            "reason": reason,
            "destination_id": destination_id,
            "list_name": list_name,
            "preview_id": preview_id,
        }
        # Another tenant's destination raises UnknownReference (db/errors.py's table).
        created = await self._row("record_cancellation_batch", params, CancellationBatch)
        if created is not None:
            return created, True
        earlier = await self.find_cancellation_batch(tenant_id, batch_id)
        if earlier is not None:
            return earlier, False
        if preview_id is None:
            raise InvariantViolation(f"batch {batch_id} was neither recorded nor found")
        return None

    async def find_cancellation_batch(self, tenant_id: UUID, batch_id: UUID) -> CancellationBatch | None:
        """A recorded bulk cancel of this tenant, or ``None``."""
        return await self._row(
            "find_cancellation_batch", {"tenant_id": tenant_id, "batch_id": batch_id}, CancellationBatch
        )

    async def batch_jobs_without_request(self, tenant_id: UUID, batch_id: UUID) -> list[UUID]:
        """The exports a batch covers that have no recorded request of that batch yet (Busy, or not tried)."""
        rows = await self._rows(
            "batch_jobs_without_request", {"tenant_id": tenant_id, "batch_id": batch_id}, JobIdRow
        )
        return [r.job_id for r in rows]

    async def batch_outcomes(self, tenant_id: UUID, batch_id: UUID) -> dict[CancellationOutcome, int]:
        """How many requests of a batch were recorded with each outcome."""
        rows = await self._rows(
            "batch_outcomes", {"tenant_id": tenant_id, "batch_id": batch_id}, OutcomeCount
        )
        return {r.outcome: r.n for r in rows}

    async def batch_live_exports_not_covered(self, tenant_id: UUID, batch_id: UUID) -> list[UUID]:
        """The exports live now under a batch's filter that it does not cover (live since its preview, or
        since it was recorded): the batch never touches them."""
        rows = await self._rows(
            "batch_live_exports_not_covered", {"tenant_id": tenant_id, "batch_id": batch_id}, JobIdRow
        )
        return [r.job_id for r in rows]

    async def batch_stops_to_signal(self, tenant_id: UUID, batch_id: UUID) -> list[StopToSignal]:
        """A batch's StopRequested requests not signalled yet whose attempt still runs under them."""
        return await self._rows(
            "batch_stops_to_signal", {"tenant_id": tenant_id, "batch_id": batch_id}, StopToSignal
        )

    async def record_stop_signals(self, tenant_id: UUID, signalled: list[StopToSignal]) -> None:
        """Record the stop signals Temporal took, so no later submission of the batch sends them again."""
        if not signalled:
            return
        params = {
            "tenant_id": tenant_id,
            "request_ids": [s.request_id for s in signalled],
            "workflow_ids": [s.workflow_id for s in signalled],
        }
        async with translated(), self.pool.connection() as conn:
            await execute(conn, "record_stop_signals", params)

    async def _cancel_segment(
        self,
        conn: AsyncConnection[Any],
        segment: list[int],
        requests: list[tuple[UUID, UUID]],
        results: list[CancellationResult | None],
        tenant_id: UUID,
        batch_id: UUID,
        requested_by: str,
        reason: str,
        lock_timeout: str,
    ) -> None:
        """Several exports' ledger transactions, each exactly as ``request_cancellation`` runs it (its own
        BEGIN ... COMMIT), queued in one pipeline: one round trip for the segment. The server runs them
        one after the other, each holding its row lock for its own transaction only. When one fails, the
        server skips the rest of the pipeline: those before it committed, it is decided on its own (Busy
        on lock_timeout), and those after it go round again."""
        pending = list(segment)
        while pending:
            sent: list[tuple[int, AsyncCursor[LedgerAnswer], AsyncCursor[Any]]] = []
            try:
                async with translated(), _observed("cancel_and_record", {"batch": len(pending)}):
                    async with conn.pipeline():
                        for i in pending:
                            job_id, request_id = requests[i]
                            params = {
                                "tenant_id": tenant_id,
                                "job_id": job_id,
                                "request_id": request_id,
                                "requested_by": requested_by,
                                "reason": reason,
                                "batch_id": batch_id,
                                "timeout": lock_timeout,
                            }
                            await send(conn, "begin_transaction", {})
                            await send(conn, "lock_job_for_cancel", params)
                            decided = await send(conn, "cancel_and_record", params, LedgerAnswer)
                            committed = await send(conn, "commit_transaction", {})
                            sent.append((i, decided, committed))
                failed_at = None
                busy = False
            except StoreError as exc:
                with contextlib.suppress(psycopg.Error):
                    await conn.rollback()
                failed_at = next((k for k, (_, _, c) in enumerate(sent) if c.pgresult is None), None)
                if failed_at is None or not isinstance(exc, LockTimeout | ConstraintRefused):
                    raise
                busy = isinstance(exc, LockTimeout)
            done = sent if failed_at is None else sent[:failed_at]
            for i, decided, _ in done:
                job_id, request_id = requests[i]
                results[i] = _ledger_result(await decided.fetchall(), job_id, request_id, requested_by)
            if failed_at is None:
                return
            failed = sent[failed_at][0]
            job_id, request_id = requests[failed]
            if busy:
                results[failed] = CancellationResult(request_id=request_id, outcome=CancellationOutcome.BUSY)
            else:  # decided on its own, with the single request's handling of a reused request ID
                results[failed] = await self._request_cancellation_on(
                    conn,
                    tenant_id=tenant_id,
                    job_id=job_id,
                    request_id=request_id,
                    requested_by=requested_by,
                    reason=reason,
                    lock_timeout=lock_timeout,
                    batch_id=batch_id,
                )
            handled = {i for i, _, _ in done} | {failed}
            pending = [i for i in pending if i not in handled]  # skipped by the server, or never sent

    async def request_cancellations(
        self,
        *,
        tenant_id: UUID,
        batch_id: UUID,
        requests: list[tuple[UUID, UUID]],
        requested_by: str,
        reason: str,
        lock_timeout: str = "2s",
        concurrency: int = 4,
    ) -> list[CancellationResult]:
        """One ledger transaction per ``(job ID, request ID)``, each as ``request_cancellation`` runs it,
        on ``concurrency`` connections at once (each job's lock is held only for its own round trip).

        Returns each job's result in the order given. A lane that loses its connection leaves its segment's
        fate unknown (its transactions may have committed before the answer was lost): those are re-read
        from the ledger once every lane is done, each answered with what was recorded (Busy when nothing
        was); when the re-read fails too, ``TransientStoreError``. An export no lane reached is Busy.
        """
        results: list[CancellationResult | None] = [None] * len(requests)
        todo = iter(range(len(requests)))
        failures: list[StoreError] = []
        unanswered: list[int] = []  # sent in a pipeline whose answer was lost

        async def lane() -> None:
            try:
                async with translated(), self.pool.connection() as conn:
                    while not failures:
                        segment = list(itertools.islice(todo, PIPELINE_SEGMENT))
                        if not segment:
                            return
                        try:
                            await self._cancel_segment(
                                conn,
                                segment,
                                requests,
                                results,
                                tenant_id,
                                batch_id,
                                requested_by,
                                reason,
                                lock_timeout,
                            )
                        except TransientStoreError as exc:
                            # An exception is not a "no": the ledger is re-read below. This lane's
                            # connection is gone; the other lanes take the segments left.
                            lost = [i for i in segment if results[i] is None]
                            unanswered.extend(lost)
                            log.warning("batch %s: %d exports got no answer (%s)", batch_id, len(lost), exc)
                            return
            except TransientStoreError as exc:
                log.warning("batch %s: a lane got no connection (%s)", batch_id, exc)
            except StoreError as exc:
                failures.append(exc)

        lanes = max(1, min(concurrency, len(requests)))
        await asyncio.gather(*(lane() for _ in range(lanes)))
        if failures:
            raise failures[0]
        if unanswered:
            await self._reread_unanswered(tenant_id, batch_id, requests, results, unanswered)
        return [
            r
            if r is not None
            else CancellationResult(request_id=requests[i][1], outcome=CancellationOutcome.BUSY)
            for i, r in enumerate(results)
        ]

    async def _reread_unanswered(
        self,
        tenant_id: UUID,
        batch_id: UUID,
        requests: list[tuple[UUID, UUID]],
        results: list[CancellationResult | None],
        unanswered: list[int],
    ) -> None:
        """Answer the exports whose ledger transactions were sent on a connection that was then lost, from
        what the ledger recorded for them (on another connection). A request found committed is answered
        with its outcome, and a change of the job it made is counted as cancel_and_record's transition; one
        not found recorded nothing (its transaction rolled back with the connection) and stays Busy."""
        params = {
            "tenant_id": tenant_id,
            "batch_id": batch_id,
            "job_ids": [requests[i][0] for i in unanswered],
        }
        recorded = {
            r.job_id: r for r in await self._rows("batch_requests_of_jobs", params, CancellationRequest)
        }
        for i in unanswered:
            job_id, request_id = requests[i]
            request = recorded.get(job_id)
            if request is None or request.id != request_id:
                continue
            if request.outcome in _CHANGES_THE_JOB:
                record_transition(
                    Statement.CANCEL_AND_RECORD,
                    True,
                    tenant_id=tenant_id,
                    job_id=job_id,
                    request_id=request_id,
                )
            results[i] = CancellationResult(request_id=request_id, outcome=request.outcome, request=request)


@contextlib.asynccontextmanager
async def _observed(name: str, params: dict[str, Any]) -> AsyncIterator[None]:
    """A pipeline's round trip observed as one statement (statements sent in a pipeline have no latency of
    their own): a span and ``fenced_exports_statement_duration_seconds{statement=name}``."""
    with observe_statement(name, params):
        yield


async def _cancellation_ledger(
    conn: AsyncConnection[Any],
    params: dict[str, Any],
    lock_timeout: str,
    before_commit: BeforeCommit | None,
    record: ActionRecord | None = None,
) -> list[LedgerAnswer]:
    """The ledger transaction of one cancellation request in one round trip: BEGIN; the locking read
    (which first sets this transaction's lock_timeout); the statement that classifies, updates and records;
    with ``record``, the request's row of the operator-action ledger; COMMIT, sent together in pipeline mode.
    The server runs them in order, so the decision's snapshot is taken after the lock wait. With
    ``before_commit`` (a test seam) the COMMIT waits for it, in a second round trip.

    On any error the transaction is rolled back before the error propagates, so the connection goes back
    to its pool idle.
    """
    try:
        # Leaving the pipeline block sends the Sync and reads every result: the one round trip, observed
        # (span and latency) as the statement that decides.
        noted = None
        async with _observed("cancel_and_record", params), conn.pipeline():
            await send(conn, "begin_transaction", {})
            await send(conn, "lock_job_for_cancel", {**params, "timeout": lock_timeout})
            decided = await send(conn, "cancel_and_record", params, LedgerAnswer)
            if record is not None:
                noted = await send(
                    conn,
                    "record_cancellation_action",
                    {
                        **record.params(),
                        "cancellation_request_id": params["request_id"],
                        "job_id": params["job_id"],
                    },
                    ActionIdRow,
                )
            if before_commit is None:
                await send(conn, "commit_transaction", {})
        answers: list[LedgerAnswer] = await decided.fetchall()
        appended = bool(await noted.fetchall()) if noted is not None else False
        if before_commit is not None:
            await before_commit()
            await execute(conn, "commit_transaction", {})
        if record is not None and appended:
            record.written = True
        return answers
    except BaseException:
        with contextlib.suppress(psycopg.Error):
            await conn.rollback()
        raise


def _ledger_result(
    answers: list[LedgerAnswer], job_id: UUID, request_id: UUID, requested_by: str
) -> CancellationResult:
    """What one committed ledger transaction's answer means for its caller (a change of the job row is
    counted here, as cancel_and_record's transition)."""
    if not answers:
        # Another tenant's job looks exactly like a missing one; nothing is recorded.
        return CancellationResult(request_id=request_id, outcome=CancellationOutcome.NOT_FOUND)
    answer = answers[0]
    # Already validated as part of the answer: construct, do not validate again.
    found = ExportJob.model_construct(**{f: getattr(answer, f) for f in ExportJob.model_fields})
    if answer.request is None:
        # The guarded change matched nothing under the row lock, so nothing was recorded: impossible
        # while the row is locked, and if it happens the outcome is not true.
        log.critical("export %s changed under its row lock; nothing recorded", job_id)
        raise InvariantViolation(f"export {job_id} changed under its row lock")
    request = CancellationRequest.model_validate(answer.request)
    if answer.replayed:
        return _from_earlier(request, job_id, requested_by, found)
    if request.outcome in _CHANGES_THE_JOB:
        # Committed: the job row changed with the request recorded (a replay changes nothing).
        record_transition(
            Statement.CANCEL_AND_RECORD,
            True,
            tenant_id=found.tenant_id,
            job_id=job_id,
            request_id=request_id,
        )
    return CancellationResult(request_id=request_id, outcome=request.outcome, request=request, job=found)


def _from_earlier(
    earlier: CancellationRequest, job_id: UUID, requested_by: str, job: ExportJob | None = None
) -> CancellationResult:
    if earlier.job_id == job_id and earlier.requested_by == requested_by:
        return CancellationResult(
            request_id=earlier.id, outcome=earlier.outcome, request=earlier, job=job, replayed=True
        )
    # A client error; says nothing about the other request.
    return CancellationResult(request_id=earlier.id, outcome=CancellationOutcome.REQUEST_ID_REUSED)
