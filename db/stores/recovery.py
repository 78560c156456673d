"""Recovery's statements (role ``exports_recovery``): expired leases and one conditional takeover per
case, the set-aside proofs, and the re-checks that settle an OutcomeUnknown on evidence or on the row's own
fences.
"""

from __future__ import annotations

import logging
from uuid import UUID

from db.errors import (
    translated,
)
from db.queries import fetch, fetch_maybe
from db.rows import (
    EventIdRow,
    JobIdRow,
    ListingToAnswer,
    OpenRow,
    StoppedRow,
)
from db.stores.base import observe_stop, transition
from db.stores.evidence import EvidenceStatements
from db.stores.reads import Reads
from domain.models import (
    ExpiredLease,
    JobStatus,
    Statement,
    UnknownToRecheck,
)
from observability.metrics import StopPath
from observability.tracing import current_traceparent

log = logging.getLogger(__name__)


class RecoveryStatements(Reads):
    """Recovery's takeovers of expired attempts, its set-aside proofs and its re-checks."""

    async def find_expired_leases(self, limit: int = 100) -> list[ExpiredLease]:
        """Recovery's scan: candidates only."""
        return await self._rows("find_expired_leases", {"limit": limit}, ExpiredLease)

    async def delivery_scope_open(self, tenant_id: UUID, destination_id: UUID) -> bool:
        """Whether every delivery switch of the destination's scope is enabled now: recovery opens no
        session with a paused partner (a missing or unreadable switch is paused: a read that fails raises)."""
        row = await self._row(
            "read_delivery_scope", {"tenant_id": tenant_id, "destination_id": destination_id}, OpenRow
        )
        return row is not None and row.open

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
            observe_stop(row, StopPath.RECOVERY)
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

    async def find_unpublished_unknowns(self, *, limit: int) -> list[UnknownToRecheck]:
        """OutcomeUnknown attempts that fenced their upload and never their rename (issue 23), oldest first:
        the row's fences settle them, with no listing. Candidates only."""
        return await self._rows("find_unpublished_unknowns", {"limit": limit}, UnknownToRecheck)

    @transition(Statement.SETTLE_UNKNOWN_BY_FENCES)
    async def settle_unknown_by_fences(self, job_id: UUID, attempt_id: UUID, recovery_run_id: str) -> bool:
        """OutcomeUnknown, upload fenced, no rename fence -> Failed(NotDelivered): the attempt never sent its
        rename, so it never wrote the final name. The attempt's one reconciliation, recorded under the
        recovery run's ID; a person who reconciled first wins (nothing matches)."""
        return await self._matched(
            "settle_unknown_by_fences",
            job_id=job_id,
            attempt_id=attempt_id,
            recovery_run_id=recovery_run_id,
        )

    async def find_listing_requests(
        self, *, observer_prefix: str, window_seconds: float, limit: int
    ) -> list[ListingToAnswer]:
        """The reconcilers' listing requests to answer (0033), oldest first: made within ``window_seconds``,
        for an attempt still OutcomeUnknown, with no DeliveryEvidence observed by ``observer_prefix`` and the
        request's ID yet. Candidates only: answering re-reads the row."""
        return await self._rows(
            "find_listing_requests",
            {"observer_prefix": observer_prefix, "window_seconds": window_seconds, "limit": limit},
            ListingToAnswer,
        )


class RecoveryStore(RecoveryStatements, EvidenceStatements):
    """Recovery's store (role ``exports_recovery``): takeovers of expired attempts and re-checks."""
