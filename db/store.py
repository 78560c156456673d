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
import contextlib
import functools
import inspect
import itertools
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar
from uuid import UUID

import psycopg
from psycopg import AsyncConnection, AsyncCursor
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
from db.queries import execute, fetch, fetch_maybe, send
from db.rows import (
    AttemptIdRow,
    CancellationBatch,
    ClaimAnswer,
    CutoffAnswer,
    DestinationName,
    EventIdRow,
    ExpiryRow,
    FenceAnswer,
    IdempotencyRow,
    JobIdRow,
    LedgerAnswer,
    MessageIdRow,
    NameRow,
    OutcomeCount,
    RenewalRow,
    StatusCount,
    StoppedRow,
    SwitchStateRow,
    TokenRow,
    VersionRow,
)
from domain.controls import DeliverySwitch, PolicyFacts, ScopeActivity, SwitchChange, SwitchScope
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
    RejectionCode,
    Renewal,
    Statement,
    StopPoint,
    UnknownToRecheck,
)
from observability.metrics import StopPath, get_metrics
from observability.statements import observe_statement, record_transition
from observability.tracing import current_traceparent
from rules.cutoff import authorization_from
from rules.ownership import held_by

log = logging.getLogger(__name__)

# The keyset bound of a first page: after every real row.
_NO_BOUND_TIME = datetime.max.replace(tzinfo=UTC)
_NO_BOUND_ID = UUID(int=(1 << 128) - 1)

Hook = Callable[[], Awaitable[None]]
Row = TypeVar("Row")
P = ParamSpec("P")
Answer = TypeVar("Answer")

# Exports whose ledger transactions a bulk cancel queues in one pipeline (one round trip for all).
PIPELINE_SEGMENT = 16

# Bounded: a worker must not hang in a re-read during shutdown with the database unreachable.
REREAD_TIMEOUT_SECONDS = 5.0

_DELIVERY_FAILURE_CODES = {
    FailureCode.NOT_DELIVERED,
    FailureCode.FINAL_NAME_OCCUPIED,
    FailureCode.ORIGINAL_DELIVERED,
}
# The cancellation outcomes whose ledger transaction changed the job row (Canceled, or a stop request).
_CHANGES_THE_JOB = {CancellationOutcome.CANCELED_WHILE_QUEUED, CancellationOutcome.STOP_REQUESTED}
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
            "traceparent": current_traceparent(),
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
                "traceparent": current_traceparent(),
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
                    "traceparent": current_traceparent(),
                },
                VersionRow,
            )
        except ConstraintRefused as exc:
            if exc.constraint == "fk_export_jobs_destination":
                raise UnknownReference("no such destination in this tenant") from exc
            raise
        return row.version if row else None

    async def read_policy_facts(self, job_id: UUID) -> PolicyFacts | None:
        """What the policy check evaluates, read in one statement; ``None`` when there is no such job."""
        return await self._row("read_policy_facts", {"job_id": job_id}, PolicyFacts)

    @transition(Statement.REJECT_IF_QUEUED)
    async def reject_if_queued(
        self, job_id: UUID, checked_version: int, code: RejectionCode, message: str
    ) -> bool:
        """Queued -> Rejected for the evaluated version only, with its reason code and message."""
        return await self._matched(
            "reject_if_queued",
            job_id=job_id,
            checked_version=checked_version,
            code=code.value,
            message=message,
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
        answer, or, when that answer was lost, from a re-read of state and ownership. Paused when the
        claim matched nothing only because a delivery switch of the job's scope is paused (the job is
        still Queued at the version checked)."""
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
            if (
                found is not None
                and found.status == JobStatus.QUEUED
                and found.version == checked_version
                and not found.deliveries_open
            ):
                return ClaimResult.PAUSED
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
            destination_usable=found.destination_usable,
            deliveries_open=found.deliveries_open,
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
        params = {
            "job_id": job_id,
            "attempt_id": attempt_id,
            "worker_id": worker_id,
            "reason": reason,
            "traceparent": current_traceparent(),
        }
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
        self,
        name: str,
        params: dict[str, Any],
        job_id: UUID,
        attempt_id: UUID,
        expect: JobStatus,
        row: type[EventIdRow] = EventIdRow,
    ) -> FinishResult:
        written = await self._unless_lost(name, params, row)
        if written:
            if isinstance(written[0], StoppedRow):
                _observe_stop(written[0], StopPath.WORKER)
            return FinishResult.WRITTEN
        try:
            state = await self._reread(job_id)
        except TransientStoreError:
            return FinishResult.UNKNOWN
        # A repeated call after a lost response finds its own terminal state; anything else is not ours.
        lost = written is None
        if lost and held_by(state, attempt_id, expect):
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
            StoppedRow,
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
            traceparent=current_traceparent(),
        )

    @transition(Statement.STOP_EXPIRED_ATTEMPT)
    async def stop_expired_attempt(
        self, job_id: UUID, expired_attempt_id: UUID, recovery_run_id: str
    ) -> bool:
        """Running, expired, with a stop request -> Stopped."""
        rows = await self._rows(
            "stop_expired_attempt",
            {"job_id": job_id, "expired_attempt_id": expired_attempt_id, "recovery_run_id": recovery_run_id},
            StoppedRow,
        )
        for row in rows:
            _observe_stop(row, StopPath.RECOVERY)
        return bool(rows)

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

    @transition(Statement.FAIL_SET_ASIDE_DELIVERY)
    async def fail_set_aside_delivery(
        self, job_id: UUID, expired_attempt_id: UUID, recovery_run_id: str, evidence_summary: str
    ) -> bool:
        """Delivering, expired, rename fenced, its temporary file set aside by recovery -> Failed NotDelivered."""
        return await self._matched(
            "fail_set_aside_delivery",
            job_id=job_id,
            expired_attempt_id=expired_attempt_id,
            recovery_run_id=recovery_run_id,
            evidence_summary=evidence_summary,
        )

    async def find_unknowns_to_recheck(
        self, *, observer_prefix: str, within_seconds: float, every_seconds: float, limit: int
    ) -> list[UnknownToRecheck]:
        """Recovery's re-check candidates (0013): OutcomeUnknown attempts recorded within ``within_seconds``
        and at least ``every_seconds`` ago, not reconciled, not replaced, whose partner has not answered
        recovery yet and which recovery has not listed in the last ``every_seconds``; oldest first.
        Recovery's evidence is what was observed by an ID starting with ``observer_prefix``. Candidates
        only."""
        return await self._rows(
            "find_unknowns_to_recheck",
            {
                "observer_prefix": observer_prefix,
                "within_seconds": within_seconds,
                "every_seconds": every_seconds,
                "limit": limit,
            },
            UnknownToRecheck,
        )

    @transition(Statement.SETTLE_UNKNOWN_BY_EVIDENCE)
    async def settle_unknown_by_evidence(
        self,
        job_id: UUID,
        attempt_id: UUID,
        resolution: JobStatus,
        recovery_run_id: str,
        evidence_summary: str,
    ) -> bool:
        """OutcomeUnknown -> Completed or Failed(NotDelivered) on evidence a re-check found, as the attempt's
        one reconciliation, recorded under the recovery run's ID; never on a job a replacement names.

        One short transaction: the row locked first (as ``create_replacement`` locks it), then the
        conditional change with its Reconciled event, whose snapshot sees a replacement committed meanwhile.
        """
        if resolution not in (JobStatus.COMPLETED, JobStatus.FAILED):
            raise ValueError("a re-check settles an OutcomeUnknown as Completed or Failed")
        params = {
            "job_id": job_id,
            "attempt_id": attempt_id,
            "resolution": resolution.value,
            "recovery_run_id": recovery_run_id,
            "evidence_summary": evidence_summary,
        }
        async with translated(), self.pool.connection() as conn, conn.transaction():
            if await fetch_maybe(conn, "lock_unknown_for_settling", params, JobIdRow) is None:
                return False
            return bool(await fetch(conn, "settle_unknown_by_evidence", params, EventIdRow))

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
            "sweep_stale_queued",
            {"older_than_seconds": older_than_seconds, "batch": batch, "traceparent": current_traceparent()},
            JobIdRow,
        )
        return [r.job_id for r in rows]

    async def take_unpublished(self, batch: int, lease_seconds: float) -> list[OutboxMessage]:
        """Lease up to ``batch`` unpublished wake-ups, oldest first, in one committed statement.

        No lock outlives the statement: another dispatcher skips these rows until ``publishing_until``
        (the database clock) passes, and then takes them again with their message IDs. Runs as
        ``exports_dispatcher``.
        """
        taken = await self._rows(
            "take_unpublished", {"batch": batch, "lease_seconds": lease_seconds}, OutboxMessage
        )
        return sorted(taken, key=lambda m: (m.created_at, str(m.message_id)))

    async def mark_published(self, message_ids: list[UUID]) -> set[UUID]:
        """Mark wake-ups whose workflows started as published; returns those this call marked (a row
        another dispatcher marked first is not among them)."""
        if not message_ids:
            return set()
        rows = await self._rows("mark_published", {"message_ids": message_ids}, MessageIdRow)
        return {r.message_id for r in rows}

    async def release_unpublished(self, messages: list[OutboxMessage]) -> set[UUID]:
        """Give leased rows back at once (their starts failed) while they still carry the lease they were
        taken with; returns those given back. A release that is lost only leaves the lease to expire."""
        by_lease: dict[datetime, list[UUID]] = {}
        for msg in messages:
            if msg.publishing_until is not None:
                by_lease.setdefault(msg.publishing_until, []).append(msg.message_id)
        released: set[UUID] = set()
        for until, ids in by_lease.items():
            rows = await self._rows(
                "release_unpublished", {"message_ids": ids, "publishing_until": until}, MessageIdRow
            )
            released.update(r.message_id for r in rows)
        return released

    async def wake_resumed_queued(
        self,
        resumed_at: datetime,
        *,
        tenant_id: UUID | None = None,
        destination_id: UUID | None = None,
        batch: int = 500,
    ) -> list[UUID]:
        """One bounded batch of fresh wake-ups for the Queued jobs of a resumed scope woken before
        ``resumed_at`` whose whole scope is enabled now; returns the jobs woken (empty when done)."""
        rows = await self._rows(
            "wake_resumed_queued",
            {
                "resumed_at": resumed_at,
                "tenant_id": tenant_id,
                "destination_id": destination_id,
                "batch": batch,
                "traceparent": current_traceparent(),
            },
            JobIdRow,
        )
        return [r.job_id for r in rows]

    # -- delivery switches --------------------------------------------------------------------------

    async def set_delivery_switch(
        self,
        *,
        scope: SwitchScope,
        tenant_id: UUID | None,
        destination_id: UUID | None,
        enabled: bool,
        reason: str,
        changed_by: str,
    ) -> SwitchChange:
        """Pause (``enabled=False``) or resume one scope, with who and why, and append the change to the
        history: one short transaction that locks the scope's row first (so it serializes with every
        claim and cutoff 2 that read it FOR SHARE), then upserts it with its history entry.

        A destination that is not the tenant's raises ``UnknownReference``.
        """
        params = {
            "scope": scope.value,
            "tenant_id": tenant_id,
            "destination_id": destination_id,
            "enabled": enabled,
            "reason": reason,
            "changed_by": changed_by,
        }
        try:
            async with translated(), self.pool.connection() as conn, conn.transaction():
                before = await fetch_maybe(conn, "lock_delivery_switch", params, SwitchStateRow)
                changed = await fetch_maybe(
                    conn,
                    "set_delivery_switch",
                    {**params, "was_enabled": before.enabled if before else None},
                    SwitchChange,
                )
        except ConstraintRefused as exc:
            if exc.constraint in ("fk_delivery_switches_destination", "delivery_switches_tenant_id_fkey"):
                raise UnknownReference("no such destination in this tenant") from exc
            raise
        if changed is None:
            raise InvariantViolation("set_delivery_switch committed without returning its change")
        return changed

    async def tenant_switches(self, tenant_id: UUID | None) -> list[DeliverySwitch]:
        """The global switch, the tenant's and one per destination of the tenant (``enabled`` is
        ``None`` where no row exists: never enabled, so paused); with no tenant, the global one."""
        return await self._rows("tenant_switches", {"tenant_id": tenant_id}, DeliverySwitch)

    async def switch_history(self, tenant_id: UUID | None, limit: int = 50) -> list[SwitchChange]:
        """The latest switch changes a tenant's operators may see (global and their tenant's), newest first."""
        return await self._rows("switch_history", {"tenant_id": tenant_id, "limit": limit}, SwitchChange)

    async def scope_activity(
        self, *, tenant_id: UUID | None = None, destination_id: UUID | None = None
    ) -> ScopeActivity:
        """How many exports of the scope are Queued, Running and Delivering now."""
        row = await self._row(
            "scope_activity", {"tenant_id": tenant_id, "destination_id": destination_id}, ScopeActivity
        )
        return row or ScopeActivity(queued=0, running=0, delivering=0)

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
        batch_id: UUID | None = None,
    ) -> CancellationResult:
        """Decide and record one cancellation request under a lock on this tenant's job row (000).

        One round trip: BEGIN, ``SET LOCAL lock_timeout``, the one statement that locks, classifies,
        updates and records (``cancel_and_record``), and COMMIT go out together in pipeline mode. Busy
        when the lock wait outlasts ``lock_timeout`` (nothing recorded; retry with the same ID).
        ``before_commit`` is a test seam awaited with the lock held, after the decision is written (the
        COMMIT then follows in a second round trip). ``batch_id`` names the bulk cancel it belongs to.
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
        before_commit: Hook | None = None,
        batch_id: UUID | None = None,
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
                answers = await _cancellation_ledger(conn, params, lock_timeout, before_commit)
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

    # -- bulk cancel ---------------------------------------------------------------------------------

    async def record_cancellation_batch(
        self,
        *,
        tenant_id: UUID,
        batch_id: UUID,
        requested_by: str,
        reason: str,
        destination_id: UUID,
        list_name: str | None,
    ) -> tuple[CancellationBatch, bool]:
        """Record a bulk cancel and the live exports it covers, in one statement; or find it recorded.

        Returns the batch and whether it was recorded now. Raises ``UnknownReference`` for a destination
        that is not the tenant's.
        """
        params = {
            "tenant_id": tenant_id,
            "batch_id": batch_id,
            "requested_by": requested_by,
            "reason": reason,
            "destination_id": destination_id,
            "list_name": list_name,
        }
        try:
            created = await self._row("record_cancellation_batch", params, CancellationBatch)
        except ConstraintRefused as exc:
            if exc.constraint == "fk_cancellation_batches_destination":
                raise UnknownReference("no such destination in this tenant") from exc
            raise
        if created is not None:
            return created, True
        earlier = await self.find_cancellation_batch(tenant_id, batch_id)
        if earlier is None:
            raise InvariantViolation(f"batch {batch_id} was neither recorded nor found")
        return earlier, False

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

    async def _cancel_segment(
        self,
        conn: AsyncConnection[Any],
        segment: list[int],
        requests: list[tuple[UUID, UUID]],
        results: list[CancellationResult],
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

    async def count_live_exports(
        self, tenant_id: UUID, destination_id: UUID, list_name: str | None
    ) -> dict[JobStatus, int]:
        """How many live exports (Queued, Running, Delivering) a bulk cancel with this filter would cover."""
        rows = await self._rows(
            "count_live_exports",
            {"tenant_id": tenant_id, "destination_id": destination_id, "list_name": list_name},
            StatusCount,
        )
        return {r.status: r.n for r in rows}

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

        Returns each job's result in the order given.
        """
        results: list[CancellationResult] = [
            CancellationResult(request_id=request_id, outcome=CancellationOutcome.BUSY)
            for _, request_id in requests
        ]
        todo = iter(range(len(requests)))
        failures: list[StoreError] = []

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
                            # Their fate is unknown, like a Busy one's is not: either way a retry of the same
                            # batch decides them, or returns what was recorded. This lane's connection is gone.
                            log.warning(
                                "batch %s: %d exports got no answer (%s)", batch_id, len(segment), exc
                            )
                            return
            except TransientStoreError as exc:
                log.warning("batch %s: a lane got no connection (%s)", batch_id, exc)
            except StoreError as exc:
                failures.append(exc)

        lanes = max(1, min(concurrency, len(requests)))
        await asyncio.gather(*(lane() for _ in range(lanes)))
        if failures:
            raise failures[0]
        return results

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

    async def page_tenant_jobs(
        self,
        tenant_id: UUID,
        *,
        limit: int,
        before: tuple[datetime, UUID] | None = None,
        statuses: list[JobStatus] | None = None,
        destination_id: UUID | None = None,
        list_name: str | None = None,
        id_prefix: str | None = None,
    ) -> list[ExportJob]:
        """One page of a tenant's exports, newest first, strictly after the keyset bound ``before``
        (the last row of the previous page), with optional filters."""
        created_at, last_id = before or (_NO_BOUND_TIME, _NO_BOUND_ID)
        return await self._rows(
            "page_tenant_jobs",
            {
                "tenant_id": tenant_id,
                "before_created_at": created_at,
                "before_id": last_id,
                "statuses": [s.value for s in statuses] if statuses else None,
                "destination_id": destination_id,
                "list_name": list_name,
                "id_prefix": id_prefix,
                "limit": limit,
            },
            ExportJob,
        )

    async def tenant_list_names(self, tenant_id: UUID) -> list[str]:
        """The list names a tenant's exports use (at most 200), for the console's filter."""
        return [r.name for r in await self._rows("tenant_list_names", {"tenant_id": tenant_id}, NameRow)]

    async def open_console_session(
        self, session_sha256: bytes, token_sha256: bytes, ttl_seconds: float
    ) -> None:
        """Store a console session's hash, bound to a token's hash, until ``ttl_seconds`` from now."""
        await self._rows(
            "open_console_session",
            {"session_sha256": session_sha256, "token_sha256": token_sha256, "ttl_seconds": ttl_seconds},
            ExpiryRow,
        )

    async def find_console_session(self, session_sha256: bytes) -> TokenRow | None:
        """The tenant, principal and role a live console session is bound to, or ``None``."""
        return await self._row("find_console_session", {"session_sha256": session_sha256}, TokenRow)

    async def close_console_session(self, session_sha256: bytes) -> bool:
        """Delete a console session (sign-out); whether there was one."""
        return await self._matched("close_console_session", session_sha256=session_sha256)

    async def find_token(self, token_sha256: bytes) -> TokenRow | None:
        """The tenant, principal and role a token's hash is bound to, or ``None``."""
        return await self._row("find_api_token", {"token_sha256": token_sha256}, TokenRow)


class _NothingMatched(Exception):
    """Rolls back a short transaction whose conditional write matched nothing."""


def fence_result(found: FenceAnswer, attempt_id: UUID) -> FenceResult:
    """The fence's answer from the row it left: Fenced when this attempt's fence is written."""
    if not held_by(found, attempt_id, JobStatus.DELIVERING):
        return FenceResult.NOT_OWNER
    if found.matched or found.fenced:
        return FenceResult.FENCED
    return FenceResult.LEASE_LAPSED if not found.lease_current else FenceResult.NOT_OWNER


@contextlib.asynccontextmanager
async def _observed(name: str, params: dict[str, Any]) -> AsyncIterator[None]:
    """A pipeline's round trip observed as one statement (statements sent in a pipeline have no latency of
    their own): a span and ``fenced_exports_statement_duration_seconds{statement=name}``."""
    with observe_statement(name, params):
        yield


async def _cancellation_ledger(
    conn: AsyncConnection[Any], params: dict[str, Any], lock_timeout: str, before_commit: Hook | None
) -> list[LedgerAnswer]:
    """The ledger transaction of one cancellation request in one round trip: BEGIN; the locking read
    (which first sets this transaction's lock_timeout); the statement that classifies, updates and records;
    COMMIT, sent together in pipeline mode. The server runs them in order, so the decision's snapshot is taken after
    the lock wait. With ``before_commit`` (a test seam) the COMMIT waits for it, in a second round trip.

    On any error the transaction is rolled back before the error propagates, so the connection goes back
    to its pool idle.
    """
    try:
        # Leaving the pipeline block sends the Sync and reads every result: the one round trip, observed
        # (span and latency) as the statement that decides.
        async with _observed("cancel_and_record", params), conn.pipeline():
            await send(conn, "begin_transaction", {})
            await send(conn, "lock_job_for_cancel", {**params, "timeout": lock_timeout})
            decided = await send(conn, "cancel_and_record", params, LedgerAnswer)
            if before_commit is None:
                await send(conn, "commit_transaction", {})
        answers: list[LedgerAnswer] = await decided.fetchall()
        if before_commit is not None:
            await before_commit()
            await execute(conn, "commit_transaction", {})
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


__all__ = ["JobStore", "StoreError"]


def _observe_stop(row: StoppedRow, path: StopPath) -> None:
    if row.stop_latency_seconds is not None:
        get_metrics().observe_stop_latency(row.stop_latency_seconds, path=path)
