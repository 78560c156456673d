"""The job store: one function per transition of the row protocol, each one statement (or one short
transaction where the seed says so), named after its transition.

The row decides. Every write here repeats its conditions in the statement itself; the functions only
bind parameters, translate errors once, and, for the claim, cutoff 2 and the terminal writes, wrap the
statement in the lost-response rule of 000: when it throws or matches nothing, re-read state and
ownership together before answering. An exception is never taken for a "no".
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import AsyncConnectionPool

from db.errors import (
    ConstraintRefused,
    IdempotencyConflict,
    InvariantViolation,
    StoreError,
    TransientStoreError,
    UnknownReference,
    translate,
)
from db.models import (
    AttemptEvent,
    AuthorizationResult,
    CancellationOutcome,
    CancellationRequest,
    CancellationResult,
    ClaimResult,
    Created,
    DeliveryOutcome,
    ExpiredLease,
    ExportJob,
    FailureCode,
    FinishResult,
    JobStatus,
    OutboxMessage,
    OwnershipState,
    Renewal,
    StopPoint,
)
from db.queries import fetch_all, fetch_one

log = logging.getLogger(__name__)

Hook = Callable[[], Awaitable[None]]

# Bounded: a worker must not hang in a re-read during shutdown with the database unreachable.
REREAD_TIMEOUT_SECONDS = 5.0

_DELIVERY_FAILURE_CODES = {
    FailureCode.NOT_DELIVERED,
    FailureCode.FINAL_NAME_OCCUPIED,
    FailureCode.ORIGINAL_DELIVERED,
}
_RUNNING_FAILURE_CODES = {
    FailureCode.BUILD_FAILED,
    FailureCode.FINAL_NAME_OCCUPIED,
    FailureCode.ORIGINAL_DELIVERED,
}


def classify_cancellation(job: ExportJob) -> CancellationOutcome:
    """The outcome follows from the state the locked row shows (001 "When Cancellation Loses")."""
    match job.status:
        case JobStatus.QUEUED:
            return CancellationOutcome.CANCELED_WHILE_QUEUED
        case JobStatus.RUNNING if job.stop_request_id is None:
            return CancellationOutcome.STOP_REQUESTED
        case JobStatus.RUNNING:
            return CancellationOutcome.STOP_ALREADY_REQUESTED
        case JobStatus.CANCELED:
            return CancellationOutcome.ALREADY_CANCELED
        case JobStatus.REJECTED | JobStatus.STOPPED | JobStatus.FAILED:
            return CancellationOutcome.ALREADY_ENDED
        case _:  # Delivering, Completed, OutcomeUnknown: delivery was authorized
            return CancellationOutcome.TOO_LATE


class JobStore:
    """The statements of the protocol over one pool; the pool's role decides what the database allows."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        lease_seconds: float = 60.0,
        reread_timeout: float = REREAD_TIMEOUT_SECONDS,
    ) -> None:
        self.pool = pool
        self.lease_seconds = lease_seconds
        self.reread_timeout = reread_timeout

    # -- plumbing -----------------------------------------------------------------------------------

    async def _all(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            async with self.pool.connection() as conn:
                return await fetch_all(conn, name, params)
        except psycopg.Error as exc:
            raise translate(exc) from exc

    async def _one(self, name: str, params: dict[str, Any]) -> dict[str, Any] | None:
        rows = await self._all(name, params)
        return rows[0] if rows else None

    async def _matched(self, name: str, **params: Any) -> bool:
        """Run a conditional write; True when it matched a row (and so wrote its event)."""
        return bool(await self._all(name, params))

    async def _write_or_none(self, name: str, params: dict[str, Any]) -> bool | None:
        """Run a conditional write: True if it matched, False if it matched nothing, None if unanswered."""
        try:
            return bool(await self._all(name, params))
        except StoreError as exc:
            if isinstance(exc, TransientStoreError):
                log.warning("%s: no answer (%s); re-reading the row", name, exc)
                return None
            raise
        except (TimeoutError, OSError) as exc:
            log.warning("%s: no answer (%s); re-reading the row", name, type(exc).__name__)
            return None

    async def _reread(self, job_id: UUID) -> OwnershipState | None | type[TransientStoreError]:
        """State and ownership together; ``TransientStoreError`` (the class) when the re-read failed too."""
        try:
            row = await asyncio.wait_for(self._one("read_ownership", {"job_id": job_id}), self.reread_timeout)
        except (StoreError, TimeoutError, OSError) as exc:
            if isinstance(exc, StoreError) and not isinstance(exc, TransientStoreError):
                raise
            log.warning("re-read of %s failed too (%s)", job_id, type(exc).__name__)
            return TransientStoreError
        return OwnershipState(**row) if row else None

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
            row = await self._one("create_original", params)
        except ConstraintRefused as exc:
            if exc.constraint == "pk_idempotency_keys" and idempotency_key is not None:
                earlier = await self._one(
                    "find_idempotency_key",
                    {
                        "tenant_id": tenant_id,
                        "operation": "create_export",
                        "idempotency_key": idempotency_key,
                    },
                )
                if earlier is None:
                    raise
                if earlier["fingerprint"] != fingerprint:
                    raise IdempotencyConflict(earlier["job_id"]) from exc
                return Created(job_id=earlier["job_id"], replayed=True)
            if exc.constraint in ("fk_export_jobs_destination", "export_jobs_tenant_id_fkey"):
                raise UnknownReference("no such destination in this tenant") from exc
            raise
        assert row is not None  # the statement returns its outbox row whenever it commits
        return Created(job_id=row["job_id"])

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
        row = await self._one(
            "create_replacement",
            {
                "tenant_id": tenant_id,
                "original_job_id": original_job_id,
                "job_id": job_id or uuid.uuid4(),
                "created_by": created_by,
                "replacement_reason": replacement_reason,
                "overwrite_agreement_ref": overwrite_agreement_ref,
            },
        )
        return Created(job_id=row["job_id"]) if row else None

    async def edit_terms_if_queued(
        self, *, tenant_id: UUID, job_id: UUID, expected_version: int, destination_id: UUID, list_name: str
    ) -> int | None:
        """Change a queued export's terms; returns the new version, or ``None`` if it matched nothing."""
        try:
            row = await self._one(
                "edit_terms_if_queued",
                {
                    "tenant_id": tenant_id,
                    "job_id": job_id,
                    "expected_version": expected_version,
                    "destination_id": destination_id,
                    "list_name": list_name,
                },
            )
        except ConstraintRefused as exc:
            if exc.constraint == "fk_export_jobs_destination":
                raise UnknownReference("no such destination in this tenant") from exc
            raise
        return row["version"] if row else None

    async def reject_if_queued(self, job_id: UUID, checked_version: int, reason: str) -> bool:
        """Queued -> Rejected for the evaluated version only."""
        return await self._matched(
            "reject_if_queued", job_id=job_id, checked_version=checked_version, reason=reason
        )

    # -- cutoff 1 -------------------------------------------------------------------------------------

    async def claim_if_queued(
        self,
        job_id: UUID,
        checked_version: int,
        attempt_id: UUID,
        worker_id: str,
        workflow_id: str | None = None,
    ) -> ClaimResult:
        """Cutoff 1 with the lost-response re-read: Claimed only if the row is Running with this attempt."""
        wrote = await self._write_or_none(
            "claim_if_queued",
            {
                "job_id": job_id,
                "checked_version": checked_version,
                "attempt_id": attempt_id,
                "worker_id": worker_id,
                "workflow_id": workflow_id,
                "lease_seconds": self.lease_seconds,
            },
        )
        if wrote:
            return ClaimResult.CLAIMED
        state = await self._reread(job_id)
        if state is TransientStoreError:
            return ClaimResult.UNKNOWN
        assert not isinstance(state, type)
        # State and ownership together: Running with this attempt's ID, and nothing else, means claimed.
        if state is not None and state.status == JobStatus.RUNNING and state.attempt_id == attempt_id:
            return ClaimResult.CLAIMED
        return ClaimResult.LOST

    # -- cutoff 2 -------------------------------------------------------------------------------------

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
        """Cutoff 2 with the lost-response re-read, reporting why delivery was refused."""
        wrote = await self._write_or_none(
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
            },
        )
        if wrote:
            return AuthorizationResult.AUTHORIZED
        state = await self._reread(job_id)
        if state is TransientStoreError:
            return AuthorizationResult.UNKNOWN
        assert not isinstance(state, type)
        return authorization_from(state, attempt_id)

    # -- lease --------------------------------------------------------------------------------------

    async def renew_lease(self, job_id: UUID, attempt_id: UUID) -> Renewal:
        """Renew this attempt's lease; ``owned=False`` means a takeover or terminal write has ended it.

        Raises ``TransientStoreError`` when the database did not answer: the keeper retries next interval.
        """
        row = await self._one(
            "renew_lease", {"job_id": job_id, "attempt_id": attempt_id, "lease_seconds": self.lease_seconds}
        )
        if row is None:
            return Renewal(owned=False, stop_requested=False)
        return Renewal(owned=True, stop_requested=row["stop_requested"], status=row["status"])

    # -- terminal writes ----------------------------------------------------------------------------

    async def _finish(
        self, name: str, params: dict[str, Any], job_id: UUID, attempt_id: UUID, expect: JobStatus
    ) -> FinishResult:
        wrote = await self._write_or_none(name, params)
        if wrote:
            return FinishResult.WRITTEN
        state = await self._reread(job_id)
        if state is TransientStoreError:
            return FinishResult.UNKNOWN
        assert not isinstance(state, type)
        # A repeated call after a lost response finds its own terminal state; anything else is not ours.
        if state is not None and state.status == expect and state.attempt_id == attempt_id and wrote is None:
            return FinishResult.WRITTEN
        return FinishResult.NOT_OWNER

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
        return [ExpiredLease(**r) for r in await self._all("find_expired_leases", {"limit": limit})]

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

    # -- reconciliation and correction --------------------------------------------------------------

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
        """A recorded Completed/Failed corrected once, with who and why (reconciler role only)."""
        return await self._matched(
            "correct_outcome",
            tenant_id=tenant_id,
            job_id=job_id,
            attempt_id=attempt_id,
            recorded_status=recorded_status.value,
            corrected_status=corrected_status.value,
            failure_reason=failure_reason.value if failure_reason else None,
            corrected_by=corrected_by,
            evidence_ref=evidence_ref,
            why=why,
        )

    # -- sweeper and outbox -------------------------------------------------------------------------

    async def sweep_stale_queued(self, older_than_seconds: float, batch: int = 500) -> list[UUID]:
        """Republish a bounded batch of stale Queued jobs; returns the jobs swept."""
        rows = await self._all(
            "sweep_stale_queued", {"older_than_seconds": older_than_seconds, "batch": batch}
        )
        return [r["job_id"] for r in rows]

    async def take_and_publish(
        self, publish: Callable[[OutboxMessage], Awaitable[None]], batch: int = 50
    ) -> list[OutboxMessage]:
        """Take unpublished wake-ups under SKIP LOCKED, publish each, and mark it published.

        A row whose publish raises stays unpublished (its message ID is reused on the retry). Runs as
        ``exports_dispatcher``.
        """
        published: list[OutboxMessage] = []
        try:
            async with self.pool.connection() as conn, conn.transaction():
                for row in await fetch_all(conn, "take_unpublished", {"batch": batch}):
                    msg = OutboxMessage(**row)
                    try:
                        await publish(msg)
                    except Exception:  # noqa: BLE001 - any publish failure leaves the row for the retry
                        log.exception("publishing %s failed; it stays in the outbox", msg.message_id)
                        continue
                    await fetch_all(conn, "mark_published", {"message_id": msg.message_id})
                    published.append(msg)
        except psycopg.Error as exc:
            raise translate(exc) from exc
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
            return await self._decide_and_record(
                tenant_id, job_id, request_id, requested_by, reason, lock_timeout, before_commit
            )
        except pg_errors.LockNotAvailable:
            return CancellationResult(request_id=request_id, outcome=CancellationOutcome.BUSY)
        except pg_errors.UniqueViolation as exc:
            # The same (tenant, request ID) committed first, most likely under another job's lock. This
            # transaction rolled back; read what was recorded, with the same job and operator check.
            earlier = await self._recorded_request(tenant_id, request_id)
            if earlier is None:
                raise translate(exc) from exc
            return _from_earlier(earlier, job_id, requested_by)
        except psycopg.Error as exc:
            raise translate(exc) from exc

    async def _decide_and_record(
        self,
        tenant_id: UUID,
        job_id: UUID,
        request_id: UUID,
        requested_by: str,
        reason: str | None,
        lock_timeout: str,
        before_commit: Hook | None,
    ) -> CancellationResult:
        async with self.pool.connection() as conn, conn.transaction():
            # Bounds each lock wait in this transaction only (SET LOCAL).
            await conn.execute("SELECT set_config('lock_timeout', %(t)s, true)", {"t": lock_timeout})
            keys = {"tenant_id": tenant_id, "job_id": job_id}
            row = await fetch_one(conn, "lock_job_for_cancel", keys)
            if row is None:
                # Another tenant's job looks exactly like a missing one; nothing is recorded.
                return CancellationResult(request_id=request_id, outcome=CancellationOutcome.NOT_FOUND)
            found = ExportJob(**row)

            # Checked under the lock, so two submissions of one click are serialized here.
            earlier_row = await fetch_one(
                conn, "find_cancellation_request", {"tenant_id": tenant_id, "request_id": request_id}
            )
            if earlier_row is not None:
                return _from_earlier(CancellationRequest(**earlier_row), job_id, requested_by, found)

            outcome = classify_cancellation(found)
            params = {**keys, "request_id": request_id}
            if outcome == CancellationOutcome.CANCELED_WHILE_QUEUED:
                changed = len(await fetch_all(conn, "cancel_if_queued", params))
            elif outcome == CancellationOutcome.STOP_REQUESTED:
                changed = len(await fetch_all(conn, "request_stop_if_running", params))
            else:
                changed = 1  # these outcomes change nothing on the job
            if changed != 1:
                # Impossible while the row is locked; if it happens the outcome is not true: record nothing.
                log.critical("export %s changed under its row lock; outcome %s not recorded", job_id, outcome)
                raise InvariantViolation(f"export {job_id} changed under its row lock")

            recorded = await fetch_one(
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
            )
            assert recorded is not None
            if before_commit is not None:
                await before_commit()
        return CancellationResult(
            request_id=request_id, outcome=outcome, request=CancellationRequest(**recorded), job=found
        )

    async def _recorded_request(self, tenant_id: UUID, request_id: UUID) -> CancellationRequest | None:
        row = await self._one("find_cancellation_request", {"tenant_id": tenant_id, "request_id": request_id})
        return CancellationRequest(**row) if row else None

    # -- reads --------------------------------------------------------------------------------------

    async def get_job(self, job_id: UUID) -> ExportJob | None:
        row = await self._one("get_job", {"job_id": job_id})
        return ExportJob(**row) if row else None

    async def get_tenant_job(self, tenant_id: UUID, job_id: UUID) -> ExportJob | None:
        row = await self._one("get_tenant_job", {"tenant_id": tenant_id, "job_id": job_id})
        return ExportJob(**row) if row else None

    async def list_tenant_jobs(self, tenant_id: UUID, limit: int = 100) -> list[ExportJob]:
        return [
            ExportJob(**r)
            for r in await self._all("list_tenant_jobs", {"tenant_id": tenant_id, "limit": limit})
        ]

    async def job_events(self, job_id: UUID) -> list[AttemptEvent]:
        return [AttemptEvent(**r) for r in await self._all("job_events", {"job_id": job_id})]

    async def job_cancellation_requests(self, tenant_id: UUID, job_id: UUID) -> list[CancellationRequest]:
        rows = await self._all("job_cancellation_requests", {"tenant_id": tenant_id, "job_id": job_id})
        return [CancellationRequest(**r) for r in rows]

    async def live_attempts(self, attempt_ids: list[UUID]) -> set[UUID]:
        """The attempts among ``attempt_ids`` that are still Running or Delivering (the scavenger keeps their files)."""
        if not attempt_ids:
            return set()
        return {r["attempt_id"] for r in await self._all("live_attempts", {"attempt_ids": attempt_ids})}

    async def read_ownership(self, job_id: UUID) -> OwnershipState | None:
        row = await self._one("read_ownership", {"job_id": job_id})
        return OwnershipState(**row) if row else None

    async def find_idempotency_key(self, tenant_id: UUID, idempotency_key: str) -> dict[str, Any] | None:
        return await self._one(
            "find_idempotency_key",
            {"tenant_id": tenant_id, "operation": "create_export", "idempotency_key": idempotency_key},
        )


def authorization_from(state: OwnershipState | None, attempt_id: UUID) -> AuthorizationResult:
    """Why cutoff 2 did not (or did) commit, from the re-read of state and ownership (000)."""
    if state is None or state.attempt_id != attempt_id:
        return AuthorizationResult.NOT_OWNER
    if state.status == JobStatus.DELIVERING:
        return AuthorizationResult.AUTHORIZED
    if state.status != JobStatus.RUNNING:
        return AuthorizationResult.NOT_OWNER
    if state.stop_request_id is not None:
        return AuthorizationResult.STOP_RECORDED
    if state.original_status == JobStatus.COMPLETED:
        return AuthorizationResult.ORIGINAL_COMPLETED
    # Expired, or renewed between the refusal and the re-read: either way LeaseLapsed, with its one retry.
    return AuthorizationResult.LEASE_LAPSED


def _from_earlier(
    earlier: CancellationRequest, job_id: UUID, requested_by: str, job: ExportJob | None = None
) -> CancellationResult:
    if earlier.job_id == job_id and earlier.requested_by == requested_by:
        return CancellationResult(
            request_id=earlier.id, outcome=earlier.outcome, request=earlier, job=job, replayed=True
        )
    # A client error; says nothing about the other request.
    return CancellationResult(request_id=earlier.id, outcome=CancellationOutcome.REQUEST_ID_REUSED)
