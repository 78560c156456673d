"""What only a reconciler may record (role ``exports_reconciler``): an OutcomeUnknown's reconciliation and
the correction of a recorded outcome, each with its event.
"""

from __future__ import annotations

import logging
from uuid import UUID

from db.errors import (
    translated,
)
from db.queries import fetch
from db.rows import (
    EventIdRow,
    JobIdRow,
)
from db.stores.audit import ApprovalDecisions
from db.stores.base import transition
from db.stores.reads import Reads
from domain.models import (
    FailureCode,
    JobStatus,
    Statement,
)

log = logging.getLogger(__name__)


class ReconcilerStatements(Reads):
    """A reconciler's reconciliation of an OutcomeUnknown and correction of a recorded outcome."""

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
        async with translated(), self._connection() as conn:
            try:
                async with conn.transaction():
                    if not await fetch(conn, "record_correction", params, JobIdRow):
                        return False
                    if not await fetch(conn, "correct_outcome", params, EventIdRow):
                        raise _NothingMatched
            except _NothingMatched:
                return False
        return True


class _NothingMatched(Exception):
    """Rolls back a short transaction whose conditional write matched nothing."""


class ReconcilerStore(ReconcilerStatements, ApprovalDecisions):
    """The reconciler's store (role ``exports_reconciler``): reconciliations and corrections, and the decision
    on a correction's approval in the correction's own transaction."""
