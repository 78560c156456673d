"""The job store: one method per transition of the row protocol, each one statement (or one short
transaction where the seed says so), named after its transition.

The row decides. Every write here repeats its conditions in the statement itself; the methods only
bind parameters, type the rows, translate errors at the one boundary (:func:`db.errors.translated`),
and, for the claim, cutoff 2 and the terminal writes, apply the lost-response rule of 000: the claim and
cutoff 2 answer with the row whether or not they matched, so a refusal is classified from that answer;
only when a statement's answer is lost is state and ownership re-read. An exception is never a "no".
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar
from uuid import UUID

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from db.errors import (
    ConstraintRefused,
    DestinationNotFound,
    IdempotencyConflict,
    InvariantViolation,
    LockTimeout,
    StoreError,
    TransientStoreError,
    UnknownReference,
    translated,
)
from db.queries import execute, fetch, fetch_maybe
from db.rows import (
    AttemptIdRow,
    ClaimAnswer,
    CutoffAnswer,
    DestinationName,
    EventIdRow,
    FenceAnswer,
    IdempotencyRow,
    IdRow,
    JobIdRow,
    MessageIdRow,
    NameRow,
    RenewalRow,
    TokenRow,
    VersionRow,
)
from domain.destination import Destination
from domain.models import (
    AttemptEvent,
    AuthorizationResult,
    CancellationOutcome,
    CancellationRequest,
    CancellationResult,
    ClaimResult,
    Created,
    DeliveryOutcome,
    EventKind,
    ExpiredLease,
    ExportJob,
    FailureCode,
    FenceResult,
    FinishResult,
    JobStatus,
    OutboxMessage,
    OwnershipState,
    Renewal,
    StopPoint,
)
from observability.metrics import Statement
from observability.statements import record_transition
from rules.cancellation import classify_cancellation
from rules.cutoff import authorization_from

log = logging.getLogger(__name__)

Hook = Callable[[], Awaitable[None]]
Row = TypeVar("Row")
P = ParamSpec("P")
Answer = TypeVar("Answer")

# Bounded: a worker must not hang in a re-read during shutdown with the database unreachable.
REREAD_TIMEOUT_SECONDS = 5.0

_DELIVERY_FAILURE_CODES = {
    FailureCode.NOT_DELIVERED,
    FailureCode.FINAL_NAME_OCCUPIED,
    FailureCode.ORIGINAL_DELIVERED,
}
# The cancellation outcomes whose transaction changed the job row, and the statement that did.
_CHANGES_THE_JOB = {
    CancellationOutcome.CANCELED_WHILE_QUEUED: Statement.CANCEL_IF_QUEUED,
    CancellationOutcome.STOP_REQUESTED: Statement.REQUEST_STOP_IF_RUNNING,
}
_RUNNING_FAILURE_CODES = {
    FailureCode.BUILD_FAILED,
    FailureCode.FINAL_NAME_OCCUPIED,
    FailureCode.ORIGINAL_DELIVERED,
}


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


class JobStore:
    """The statements of the protocol over one pool; the pool's role decides what the database allows."""

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

    # -- plumbing -----------------------------------------------------------------------------------

    async def _rows(self, name: str, params: dict[str, Any], row: type[Row]) -> list[Row]:
        async with translated(), self.pool.connection() as conn:
            return await fetch(conn, name, params, row)

    async def _row(self, name: str, params: dict[str, Any], row: type[Row]) -> Row | None:
        rows = await self._rows(name, params, row)
        return rows[0] if rows else None

    async def _matched(self, name: str, **params: Any) -> bool:
        """Run a conditional write; True when it matched a row (and so wrote its event)."""
        async with translated(), self.pool.connection() as conn:
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

    # -- creation and terms -------------------------------------------------------------------------

    async def create_original(
        self,
        *,
        tenant_id: UUID,
        destination_id: UUID,
        list_name: str,
        created_by: str,
        idempotency_key: str | None = None,
        fingerprint: str | None = None,
        job_id: UUID | None = None,
        delivery_key: str | None = None,
    ) -> Created:
        """Create an original export with its deliveries row and first wake-up, in one statement.

        With an idempotency key, the same key and fingerprint returns the first job (``replayed``);
        the same key with another fingerprint raises ``IdempotencyConflict``.
        """
        params = {
            "tenant_id": tenant_id,
            "job_id": job_id or uuid.uuid4(),
            "delivery_key": delivery_key or str(uuid.uuid4()),
            "destination_id": destination_id,
            "created_by": created_by,
            "list_name": list_name,
            "idempotency_key": idempotency_key,
            "fingerprint": fingerprint,
        }
        try:
            row = await self._row("create_original", params, JobIdRow)
        except ConstraintRefused as exc:
            if exc.constraint == "pk_idempotency_keys" and idempotency_key is not None:
                earlier = await self._row(
                    "find_idempotency_key",
                    {
                        "tenant_id": tenant_id,
                        "operation": "create_export",
                        "idempotency_key": idempotency_key,
                    },
                    IdempotencyRow,
                )
                if earlier is None:
                    raise
                if earlier.fingerprint != fingerprint:
                    raise IdempotencyConflict(earlier.job_id) from exc
                return Created(job_id=earlier.job_id, replayed=True)
            if exc.constraint in ("fk_export_jobs_destination", "export_jobs_tenant_id_fkey"):
                raise UnknownReference("no such destination in this tenant") from exc
            raise
        if row is None:
            raise InvariantViolation("create_original committed without returning its job")
        return Created(job_id=row.job_id)

    async def create_replacement(
        self,
        *,
        tenant_id: UUID,
        original_job_id: UUID,
        created_by: str,
        replacement_reason: str,
        overwrite_agreement_ref: str | None = None,
        job_id: UUID | None = None,
    ) -> Created | None:
        """Create a replacement for a named person; ``None`` when the original may not be replaced.

        A second live replacement raises ``ConstraintRefused('uq_export_jobs_one_replacement')``.
        """
        row = await self._row(
            "create_replacement",
            {
                "tenant_id": tenant_id,
                "original_job_id": original_job_id,
                "job_id": job_id or uuid.uuid4(),
                "created_by": created_by,
                "replacement_reason": replacement_reason,
                "overwrite_agreement_ref": overwrite_agreement_ref,
            },
            JobIdRow,
        )
        return Created(job_id=row.job_id) if row else None

    async def edit_terms_if_queued(
        self, *, tenant_id: UUID, job_id: UUID, expected_version: int, destination_id: UUID, list_name: str
    ) -> int | None:
        """Change a queued export's terms; returns the new version, or ``None`` if it matched nothing."""
        try:
            row = await self._row(
                "edit_terms_if_queued",
                {
                    "tenant_id": tenant_id,
                    "job_id": job_id,
                    "expected_version": expected_version,
                    "destination_id": destination_id,
                    "list_name": list_name,
                },
                VersionRow,
            )
        except ConstraintRefused as exc:
            if exc.constraint == "fk_export_jobs_destination":
                raise UnknownReference("no such destination in this tenant") from exc
            raise
        return row.version if row else None

    @transition(Statement.REJECT_IF_QUEUED)
    async def reject_if_queued(self, job_id: UUID, checked_version: int, reason: str) -> bool:
        """Queued -> Rejected for the evaluated version only."""
        return await self._matched(
            "reject_if_queued", job_id=job_id, checked_version=checked_version, reason=reason
        )

    # -- cutoff 1 -------------------------------------------------------------------------------------

    @transition(Statement.CLAIM_IF_QUEUED)
    async def claim_if_queued(
        self,
        job_id: UUID,
        checked_version: int,
        attempt_id: UUID,
        worker_id: str,
        workflow_id: str | None = None,
    ) -> ClaimResult:
        """Cutoff 1. Claimed only if the row is Running with this attempt: from the statement's own
        answer, or, when that answer was lost, from a re-read of state and ownership."""
        answers = await self._unless_lost(
            "claim_if_queued",
            {
                "job_id": job_id,
                "checked_version": checked_version,
                "attempt_id": attempt_id,
                "worker_id": worker_id,
                "workflow_id": workflow_id,
                "lease_seconds": self.lease_seconds,
            },
            ClaimAnswer,
        )
        if answers is not None:
            found = answers[0] if answers else None
            if found is not None and found.matched:
                return ClaimResult.CLAIMED
            status, owner = (found.status, found.attempt_id) if found else (None, None)
        else:
            try:
                state = await self._reread(job_id)
            except TransientStoreError:
                return ClaimResult.UNKNOWN
            status, owner = (state.status, state.attempt_id) if state else (None, None)
        # State and ownership together: Running with this attempt's ID, and nothing else, means claimed
        # (a retry of a claim whose first answer was lost finds its own claim).
        if status == JobStatus.RUNNING and owner == attempt_id:
            return ClaimResult.CLAIMED
        return ClaimResult.LOST

    # -- cutoff 2 -------------------------------------------------------------------------------------

    @transition(Statement.AUTHORIZE_DELIVERY_IF_RUNNING)
    async def authorize_delivery_if_running(
        self,
        *,
        tenant_id: UUID,
        job_id: UUID,
        attempt_id: UUID,
        replaces_job_id: UUID | None,
        final_name: str,
        length: int,
        sha256: bytes,
        rows: int | None = None,
    ) -> AuthorizationResult:
        """Cutoff 2, reporting why delivery was refused from the statement's own answer (or, when that
        answer was lost, from a re-read)."""
        answers = await self._unless_lost(
            "authorize_delivery_if_running",
            {
                "tenant_id": tenant_id,
                "job_id": job_id,
                "attempt_id": attempt_id,
                "replaces_job_id": replaces_job_id,
                "final_name": final_name,
                "length": length,
                "sha256": sha256,
                "rows": rows,
                "lease_seconds": self.lease_seconds,
            },
            CutoffAnswer,
        )
        if answers is None:
            try:
                return authorization_from(await self._reread(job_id), attempt_id)
            except TransientStoreError:
                return AuthorizationResult.UNKNOWN
        if not answers:
            return AuthorizationResult.NOT_OWNER  # no such job
        found = answers[0]
        if found.matched:
            return AuthorizationResult.AUTHORIZED
        return authorization_from(
            OwnershipState(
                status=found.status,
                attempt_id=found.attempt_id,
                stop_request_id=found.stop_request_id,
                lease_current=found.lease_current,
                original_status=found.original_status,
            ),
            attempt_id,
        )

    # -- lease --------------------------------------------------------------------------------------

    async def renew_lease(self, job_id: UUID, attempt_id: UUID) -> Renewal:
        """Renew this attempt's lease; ``owned=False`` means a takeover or terminal write has ended it.

        Raises ``TransientStoreError`` when the database did not answer: the keeper retries next interval.
        """
        row = await self._row(
            "renew_lease",
            {"job_id": job_id, "attempt_id": attempt_id, "lease_seconds": self.lease_seconds},
            RenewalRow,
        )
        if row is None:
            return Renewal(owned=False, stop_requested=False)
        return Renewal(owned=True, stop_requested=row.stop_requested, status=row.status)

    # -- giving an attempt back, fencing an upload ---------------------------------------------------

    @transition(Statement.RELEASE_ATTEMPT_IF_RUNNING)
    async def release_attempt_if_running(
        self, job_id: UUID, attempt_id: UUID, worker_id: str, reason: str
    ) -> FinishResult:
        """Running -> Queued by the owning worker (a drain or a pause), without using up an attempt.

        Written, NotOwner (the row is no longer this attempt's, or it has a stop request to honor instead),
        or Unknown (the answer and its re-read were lost).
        """
        params = {"job_id": job_id, "attempt_id": attempt_id, "worker_id": worker_id, "reason": reason}
        written = await self._unless_lost("release_attempt_if_running", params, JobIdRow)
        if written:
            return FinishResult.WRITTEN
        if written is not None:
            return FinishResult.NOT_OWNER
        try:
            state = await self._reread(job_id)
        except TransientStoreError:
            return FinishResult.UNKNOWN
        # A lost answer: released if the row is Queued again and this attempt's Released event exists.
        if (
            state is not None
            and state.status == JobStatus.QUEUED
            and await self._released(job_id, attempt_id)
        ):
            return FinishResult.WRITTEN
        return FinishResult.NOT_OWNER

    async def _released(self, job_id: UUID, attempt_id: UUID) -> bool:
        events = await self.job_events(job_id)
        return any(e.kind == EventKind.RELEASED and e.attempt_id == attempt_id for e in events)

    @transition(Statement.FENCE_UPLOAD_IF_DELIVERING)
    async def fence_upload_if_delivering(self, job_id: UUID, attempt_id: UUID) -> FenceResult:
        """The upload fence: Fenced only if this attempt, Delivering with a current lease, wrote it (or,
        after a lost answer, the re-read shows its own fence). Nothing may be sent to the partner otherwise."""
        return await self._fence("fence_upload_if_delivering", job_id, attempt_id, rename=False)

    @transition(Statement.FENCE_RENAME_IF_DELIVERING)
    async def fence_rename_if_delivering(self, job_id: UUID, attempt_id: UUID) -> FenceResult:
        """The rename fence, after the upload and before the rename request: the rename is never sent
        unless this is Fenced."""
        return await self._fence("fence_rename_if_delivering", job_id, attempt_id, rename=True)

    async def _fence(self, name: str, job_id: UUID, attempt_id: UUID, *, rename: bool) -> FenceResult:
        answers = await self._unless_lost(name, {"job_id": job_id, "attempt_id": attempt_id}, FenceAnswer)
        if answers is None:
            try:
                state = await self._reread(job_id)
            except TransientStoreError:
                return FenceResult.UNKNOWN
            if state is None:
                return FenceResult.NOT_OWNER
            found = FenceAnswer(
                matched=False,
                status=state.status,
                attempt_id=state.attempt_id,
                fenced=state.rename_fenced if rename else state.upload_fenced,
                lease_current=state.lease_current,
            )
        elif not answers:
            return FenceResult.NOT_OWNER
        else:
            found = answers[0]
        return fence_result(found, attempt_id)

    # -- terminal writes ----------------------------------------------------------------------------

    async def _finish(
        self, name: str, params: dict[str, Any], job_id: UUID, attempt_id: UUID, expect: JobStatus
    ) -> FinishResult:
        written = await self._unless_lost(name, params, EventIdRow)
        if written:
            return FinishResult.WRITTEN
        try:
            state = await self._reread(job_id)
        except TransientStoreError:
            return FinishResult.UNKNOWN
        # A repeated call after a lost response finds its own terminal state; anything else is not ours.
        lost = written is None
        if lost and state is not None and state.status == expect and state.attempt_id == attempt_id:
            return FinishResult.WRITTEN
        return FinishResult.NOT_OWNER

    @transition(Statement.FINISH_STOPPED)
    async def finish_stopped(
        self, job_id: UUID, attempt_id: UUID, stop_point: StopPoint, note: str = ""
    ) -> FinishResult:
        """Running -> Stopped for this attempt, only with a recorded stop request."""
        return await self._finish(
            "finish_stopped",
            {"job_id": job_id, "attempt_id": attempt_id, "stop_point": stop_point.value, "note": note},
            job_id,
            attempt_id,
            JobStatus.STOPPED,
        )

    @transition(Statement.FINISH_FAILED)
    async def finish_failed(
        self, job_id: UUID, attempt_id: UUID, code: FailureCode, cause: str | None
    ) -> FinishResult:
        """Running -> Failed(code) for this attempt; ``cause`` is an error type or code, never data."""
        if code not in _RUNNING_FAILURE_CODES:
            raise ValueError(f"{code} is not a failure a Running attempt can record")
        return await self._finish(
            "finish_failed",
            {"job_id": job_id, "attempt_id": attempt_id, "code": code.value, "cause": cause},
            job_id,
            attempt_id,
            JobStatus.FAILED,
        )

    @transition(Statement.FINISH_DELIVERY)
    async def finish_delivery(
        self,
        job_id: UUID,
        attempt_id: UUID,
        outcome: DeliveryOutcome,
        code: FailureCode | None = None,
        summary: str | None = None,
    ) -> FinishResult:
        """Delivering -> Completed / Failed(code) / OutcomeUnknown: the attempt's terminal write."""
        if (outcome == DeliveryOutcome.FAILED) != (code is not None):
            raise ValueError("a Failed delivery needs exactly one failure code, and only Failed has one")
        if code is not None and code not in _DELIVERY_FAILURE_CODES:
            raise ValueError(f"{code} is not a delivery failure")
        return await self._finish(
            "finish_delivery",
            {
                "job_id": job_id,
                "attempt_id": attempt_id,
                "outcome": outcome.value,
                "code": code.value if code else None,
                "summary": summary,
            },
            job_id,
            attempt_id,
            JobStatus(outcome.value),
        )

    async def append_delivery_evidence(
        self, job_id: UUID, attempt_id: UUID, observed_by: str, evidence: dict[str, Any]
    ) -> bool:
        """Append one observation with its provenance; never touches the job's status."""
        detail = json.dumps(evidence, sort_keys=True, default=str)
        return await self._matched(
            "append_delivery_evidence",
            job_id=job_id,
            attempt_id=attempt_id,
            observed_by=observed_by,
            detail=detail,
        )

    # -- recovery -----------------------------------------------------------------------------------

    async def find_expired_leases(self, limit: int = 100) -> list[ExpiredLease]:
        """Recovery's scan: candidates only."""
        return await self._rows("find_expired_leases", {"limit": limit}, ExpiredLease)

    @transition(Statement.REQUEUE_EXPIRED_ATTEMPT)
    async def requeue_expired_attempt(
        self, job_id: UUID, expired_attempt_id: UUID, max_attempts: int, recovery_run_id: str
    ) -> bool:
        """Running, expired, no stop request, under the cap -> Queued with a new outbox row."""
        return await self._matched(
            "requeue_expired_attempt",
            job_id=job_id,
            expired_attempt_id=expired_attempt_id,
            max_attempts=max_attempts,
            recovery_run_id=recovery_run_id,
        )

    @transition(Statement.STOP_EXPIRED_ATTEMPT)
    async def stop_expired_attempt(
        self, job_id: UUID, expired_attempt_id: UUID, recovery_run_id: str
    ) -> bool:
        """Running, expired, with a stop request -> Stopped."""
        return await self._matched(
            "stop_expired_attempt",
            job_id=job_id,
            expired_attempt_id=expired_attempt_id,
            recovery_run_id=recovery_run_id,
        )

    @transition(Statement.EXHAUST_EXPIRED_ATTEMPT)
    async def exhaust_expired_attempt(
        self, job_id: UUID, expired_attempt_id: UUID, max_attempts: int, recovery_run_id: str
    ) -> bool:
        """Running, expired, at the cap -> Failed(AttemptsExhausted)."""
        return await self._matched(
            "exhaust_expired_attempt",
            job_id=job_id,
            expired_attempt_id=expired_attempt_id,
            max_attempts=max_attempts,
            recovery_run_id=recovery_run_id,
        )

    @transition(Statement.RESOLVE_EXPIRED_DELIVERY)
    async def resolve_expired_delivery(
        self,
        job_id: UUID,
        expired_attempt_id: UUID,
        resolution: JobStatus,
        recovery_run_id: str,
        evidence_summary: str,
    ) -> bool:
        """Delivering, expired -> Completed (on evidence only) or OutcomeUnknown."""
        if resolution not in (JobStatus.COMPLETED, JobStatus.OUTCOME_UNKNOWN):
            raise ValueError("recovery resolves a delivery to Completed or OutcomeUnknown only")
        return await self._matched(
            "resolve_expired_delivery",
            job_id=job_id,
            expired_attempt_id=expired_attempt_id,
            resolution=resolution.value,
            recovery_run_id=recovery_run_id,
            evidence_summary=evidence_summary,
        )

    @transition(Statement.FAIL_UNPUBLISHED_DELIVERY)
    async def fail_unpublished_delivery(
        self, job_id: UUID, expired_attempt_id: UUID, recovery_run_id: str
    ) -> bool:
        """Delivering, expired, its rename fence never written -> Failed NotDelivered (final name untouched)."""
        return await self._matched(
            "fail_unpublished_delivery",
            job_id=job_id,
            expired_attempt_id=expired_attempt_id,
            recovery_run_id=recovery_run_id,
        )

    # -- reconciliation and correction --------------------------------------------------------------

    @transition(Statement.RECONCILE_UNKNOWN)
    async def reconcile_unknown(
        self,
        *,
        tenant_id: UUID,
        job_id: UUID,
        attempt_id: UUID,
        resolution: JobStatus,
        reconciled_by: str,
        evidence_summary: str,
    ) -> bool:
        """OutcomeUnknown -> Completed or Failed(NotDelivered), once per attempt."""
        if resolution not in (JobStatus.COMPLETED, JobStatus.FAILED):
            raise ValueError("reconciliation resolves to Completed or Failed")
        return await self._matched(
            "reconcile_unknown",
            tenant_id=tenant_id,
            job_id=job_id,
            attempt_id=attempt_id,
            resolution=resolution.value,
            reconciled_by=reconciled_by,
            evidence_summary=evidence_summary,
        )

    @transition(Statement.CORRECT_OUTCOME)
    async def correct_outcome(
        self,
        *,
        tenant_id: UUID,
        job_id: UUID,
        attempt_id: UUID,
        recorded_status: JobStatus,
        corrected_status: JobStatus,
        failure_reason: FailureCode | None,
        corrected_by: str,
        evidence_ref: str,
        why: str,
    ) -> bool:
        """A recorded Completed/Failed corrected once, with who and why (reconciler role only).

        One short transaction: the correction row (once per attempt; the trigger allows the status change
        only along it), then the conditional change with its Corrected event. Nothing is recorded when the
        change matches nothing.
        """
        params = {
            "tenant_id": tenant_id,
            "job_id": job_id,
            "attempt_id": attempt_id,
            "recorded_status": recorded_status.value,
            "corrected_status": corrected_status.value,
            "failure_reason": failure_reason.value if failure_reason else None,
            "corrected_by": corrected_by,
            "evidence_ref": evidence_ref,
            "why": why,
        }
        async with translated(), self.pool.connection() as conn:
            try:
                async with conn.transaction():
                    if not await fetch(conn, "record_correction", params, JobIdRow):
                        return False
                    if not await fetch(conn, "correct_outcome", params, EventIdRow):
                        raise _NothingMatched
            except _NothingMatched:
                return False
        return True

    # -- sweeper and outbox -------------------------------------------------------------------------

    async def sweep_stale_queued(self, older_than_seconds: float, batch: int = 500) -> list[UUID]:
        """Republish a bounded batch of stale Queued jobs; returns the jobs swept."""
        rows = await self._rows(
            "sweep_stale_queued", {"older_than_seconds": older_than_seconds, "batch": batch}, JobIdRow
        )
        return [r.job_id for r in rows]

    async def take_and_publish(
        self, publish: Callable[[OutboxMessage], Awaitable[None]], batch: int = 50
    ) -> list[OutboxMessage]:
        """Take unpublished wake-ups under SKIP LOCKED, publish each, and mark it published.

        A row whose publish raises stays unpublished (its message ID is reused on the retry). Runs as
        ``exports_dispatcher``.
        """
        published: list[OutboxMessage] = []
        async with translated(), self.pool.connection() as conn, conn.transaction():
            for msg in await fetch(conn, "take_unpublished", {"batch": batch}, OutboxMessage):
                try:
                    await publish(msg)
                except Exception:  # any publish failure leaves the row for the retry
                    log.exception("publishing %s failed; it stays in the outbox", msg.message_id)
                    continue
                await fetch(conn, "mark_published", {"message_id": msg.message_id}, MessageIdRow)
                published.append(msg)
        return published

    # -- cancellation -------------------------------------------------------------------------------

    async def request_cancellation(
        self,
        *,
        tenant_id: UUID,
        job_id: UUID,
        request_id: UUID,
        requested_by: str,
        reason: str | None,
        lock_timeout: str = "2s",
        before_commit: Hook | None = None,
    ) -> CancellationResult:
        """Decide and record one cancellation request under a lock on this tenant's job row (000).

        Busy when the lock wait outlasts ``lock_timeout`` (nothing recorded; retry with the same ID).
        ``before_commit`` is a test seam awaited with the lock held, after the decision is written.
        """
        try:
            async with translated(), self.pool.connection() as conn, conn.transaction():
                result = await self._decide_and_record(
                    conn, tenant_id, job_id, request_id, requested_by, reason, lock_timeout, before_commit
                )
            # Committed: the job row changed with the request recorded (never a replay, which changes nothing).
            if not result.replayed and result.outcome in _CHANGES_THE_JOB:
                record_transition(
                    _CHANGES_THE_JOB[result.outcome],
                    True,
                    tenant_id=tenant_id,
                    job_id=job_id,
                    request_id=request_id,
                )
            return result
        except LockTimeout:
            return CancellationResult(request_id=request_id, outcome=CancellationOutcome.BUSY)
        except ConstraintRefused as exc:
            if exc.constraint != "pk_cancellation_requests":
                raise
            # The same (tenant, request ID) committed first, most likely under another job's lock. This
            # transaction rolled back; read what was recorded, with the same job and operator check.
            earlier = await self._row(
                "find_cancellation_request",
                {"tenant_id": tenant_id, "request_id": request_id},
                CancellationRequest,
            )
            if earlier is None:
                raise
            return _from_earlier(earlier, job_id, requested_by)

    async def _decide_and_record(
        self,
        conn: AsyncConnection[Any],
        tenant_id: UUID,
        job_id: UUID,
        request_id: UUID,
        requested_by: str,
        reason: str | None,
        lock_timeout: str,
        before_commit: Hook | None,
    ) -> CancellationResult:
        await execute(conn, "set_lock_timeout", {"timeout": lock_timeout})
        keys = {"tenant_id": tenant_id, "job_id": job_id}
        found = await fetch_maybe(conn, "lock_job_for_cancel", keys, ExportJob)
        if found is None:
            # Another tenant's job looks exactly like a missing one; nothing is recorded.
            return CancellationResult(request_id=request_id, outcome=CancellationOutcome.NOT_FOUND)

        # Checked under the lock, so two submissions of one click are serialized here.
        earlier = await fetch_maybe(
            conn,
            "find_cancellation_request",
            {"tenant_id": tenant_id, "request_id": request_id},
            CancellationRequest,
        )
        if earlier is not None:
            return _from_earlier(earlier, job_id, requested_by, found)

        outcome = classify_cancellation(found)
        params = {**keys, "request_id": request_id}
        if outcome == CancellationOutcome.CANCELED_WHILE_QUEUED:
            changed = len(await fetch(conn, "cancel_if_queued", params, IdRow))
        elif outcome == CancellationOutcome.STOP_REQUESTED:
            changed = len(await fetch(conn, "request_stop_if_running", params, IdRow))
        else:
            changed = 1  # these outcomes change nothing on the job
        if changed != 1:
            # Impossible while the row is locked; if it happens the outcome is not true: record nothing.
            log.critical("export %s changed under its row lock; outcome %s not recorded", job_id, outcome)
            raise InvariantViolation(f"export {job_id} changed under its row lock")

        recorded = await fetch_maybe(
            conn,
            "insert_cancellation_request",
            {
                **params,
                "requested_by": requested_by,
                "reason": reason,
                "outcome": outcome.value,
                "found_status": found.status.value,
                "found_attempt_id": found.attempt_id,
                "found_attempt_count": found.attempt_count,
                "found_delivery_authorized_at": found.delivery_authorized_at,
            },
            CancellationRequest,
        )
        if recorded is None:
            raise InvariantViolation("the cancellation request was not recorded")
        if before_commit is not None:
            await before_commit()
        return CancellationResult(request_id=request_id, outcome=outcome, request=recorded, job=found)

    # -- reads --------------------------------------------------------------------------------------

    async def get_job(self, job_id: UUID) -> ExportJob | None:
        """One export by ID (the worker's and recovery's view; job IDs are globally unique)."""
        return await self._row("get_job", {"job_id": job_id}, ExportJob)

    async def get_tenant_job(self, tenant_id: UUID, job_id: UUID) -> ExportJob | None:
        """One export as a tenant sees it: another tenant's job is indistinguishable from a missing one."""
        return await self._row("get_tenant_job", {"tenant_id": tenant_id, "job_id": job_id}, ExportJob)

    async def list_tenant_jobs(self, tenant_id: UUID, limit: int = 100) -> list[ExportJob]:
        """A tenant's exports, newest first."""
        return await self._rows("list_tenant_jobs", {"tenant_id": tenant_id, "limit": limit}, ExportJob)

    async def job_events(self, job_id: UUID) -> list[AttemptEvent]:
        """An export's attempt history, in the order it was recorded."""
        return await self._rows("job_events", {"job_id": job_id}, AttemptEvent)

    async def job_cancellation_requests(self, tenant_id: UUID, job_id: UUID) -> list[CancellationRequest]:
        """Every cancellation request recorded for an export, oldest first."""
        return await self._rows(
            "job_cancellation_requests", {"tenant_id": tenant_id, "job_id": job_id}, CancellationRequest
        )

    async def live_attempts(self, attempt_ids: list[UUID]) -> set[UUID]:
        """The attempts among ``attempt_ids`` that are still Running or Delivering (the scavenger keeps their files)."""
        if not attempt_ids:
            return set()
        rows = await self._rows("live_attempts", {"attempt_ids": attempt_ids}, AttemptIdRow)
        return {r.attempt_id for r in rows}

    async def read_ownership(self, job_id: UUID) -> OwnershipState | None:
        """State and ownership read together (the signal's confirmation, the re-read)."""
        return await self._row("read_ownership", {"job_id": job_id}, OwnershipState)

    async def load_destination(self, tenant_id: UUID, destination_id: UUID) -> Destination:
        """One tenant's destination with its contract; raises :class:`DestinationNotFound`."""
        found = await self._row(
            "load_destination", {"tenant_id": tenant_id, "destination_id": destination_id}, Destination
        )
        if found is None:
            raise DestinationNotFound(str(destination_id))
        return found

    async def tenant_name(self, tenant_id: UUID) -> str | None:
        """The tenant's display name."""
        row = await self._row("tenant_name", {"tenant_id": tenant_id}, NameRow)
        return row.name if row else None

    async def tenant_destinations(self, tenant_id: UUID) -> list[DestinationName]:
        """The tenant's destinations for display (never their credential references)."""
        return await self._rows("tenant_destinations", {"tenant_id": tenant_id}, DestinationName)

    async def find_token(self, token_sha256: bytes) -> TokenRow | None:
        """The tenant, principal and role a token's hash is bound to, or ``None``."""
        return await self._row("find_api_token", {"token_sha256": token_sha256}, TokenRow)


class _NothingMatched(Exception):
    """Rolls back a short transaction whose conditional write matched nothing."""


def fence_result(found: FenceAnswer, attempt_id: UUID) -> FenceResult:
    """The fence's answer from the row it left: Fenced when this attempt's fence is written."""
    if found.attempt_id != attempt_id or found.status != JobStatus.DELIVERING:
        return FenceResult.NOT_OWNER
    if found.matched or found.fenced:
        return FenceResult.FENCED
    return FenceResult.LEASE_LAPSED if not found.lease_current else FenceResult.NOT_OWNER


def _from_earlier(
    earlier: CancellationRequest, job_id: UUID, requested_by: str, job: ExportJob | None = None
) -> CancellationResult:
    if earlier.job_id == job_id and earlier.requested_by == requested_by:
        return CancellationResult(
            request_id=earlier.id, outcome=earlier.outcome, request=earlier, job=job, replayed=True
        )
    # A client error; says nothing about the other request.
    return CancellationResult(request_id=earlier.id, outcome=CancellationOutcome.REQUEST_ID_REUSED)


__all__ = ["JobStore", "StoreError"]
