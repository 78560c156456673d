"""The reconciler's console's reads and its one write (role ``exports_api``; issue 26 item 4): a tenant's
OutcomeUnknown exports oldest first, how many wait (counted up to a cap, else the planner's estimate), each
one's line of why, and the listing requests a reconciler makes for an export's final name (recorded here,
answered by recovery on a worker: the API holds no partner credentials).
"""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID

from db.rows import CountedRow, ListingRequestRow, OpenRow, QueryPlanRow, QueueSummaryRow
from db.stores.reads import Reads
from domain.models import ExportJob

# The keyset bound of a queue's first page: before every real row.
QUEUE_START_AT = datetime.min.replace(tzinfo=UTC)
QUEUE_START_ID = UUID(int=0)


class ReconciliationStatements(Reads):
    """The queue of OutcomeUnknown exports and the reconcilers' listing requests."""

    async def page_outcome_unknown_queue(
        self, tenant_id: UUID, *, limit: int, after: tuple[datetime, UUID] | None = None
    ) -> list[ExportJob]:
        """One page of the tenant's OutcomeUnknown exports, oldest first by ``outcome_unknown_at``, strictly
        after the keyset bound ``after`` (the last row of the previous page)."""
        after_at, after_id = after or (QUEUE_START_AT, QUEUE_START_ID)
        return await self._rows(
            "page_outcome_unknown_queue",
            {"tenant_id": tenant_id, "after_at": after_at, "after_id": after_id, "limit": limit},
            ExportJob,
        )

    async def count_outcome_unknown_queue(self, tenant_id: UUID, *, cap: int) -> int:
        """How many of the tenant's exports are OutcomeUnknown, counted up to ``cap + 1`` (more than ``cap``)."""
        row = await self._row("count_outcome_unknown_queue", {"tenant_id": tenant_id, "cap": cap}, CountedRow)
        return row.counted if row else 0

    async def estimate_outcome_unknown_queue(self, tenant_id: UUID) -> int:
        """The planner's estimate of the tenant's OutcomeUnknown exports (reads only the statistics)."""
        row = await self._row("estimate_outcome_unknown_queue", {"tenant_id": tenant_id}, QueryPlanRow)
        return row.estimated_rows if row else 0

    async def outcome_unknown_summaries(
        self,
        tenant_id: UUID,
        job_ids: list[UUID],
        *,
        recovery_prefix: str,
        observer_prefix: str,
        window_seconds: float,
    ) -> list[QueueSummaryRow]:
        """Each of ``job_ids`` (the tenant's only) with the write that recorded it OutcomeUnknown, recovery's
        listings of it since, and whether a listing request of it waits."""
        if not job_ids:
            return []
        return await self._rows(
            "outcome_unknown_summaries",
            {
                "tenant_id": tenant_id,
                "job_ids": job_ids,
                "recovery_prefix": recovery_prefix,
                "observer_prefix": observer_prefix,
                "window_seconds": window_seconds,
            },
            QueueSummaryRow,
        )

    async def record_listing_request(
        self,
        *,
        tenant_id: UUID,
        job_id: UUID,
        requested_by: str,
        observer_prefix: str,
        window_seconds: float,
    ) -> ListingRequestRow | None:
        """Record a request for today's listing of the export's final name; ``None`` when nothing was
        recorded (not the tenant's, not OutcomeUnknown, its partner paused, or a request already waits)."""
        return await self._row(
            "record_listing_request",
            {
                "tenant_id": tenant_id,
                "job_id": job_id,
                "requested_by": requested_by,
                "observer_prefix": observer_prefix,
                "window_seconds": window_seconds,
            },
            ListingRequestRow,
        )

    async def listing_requests_of_job(
        self, tenant_id: UUID, job_id: UUID, *, window_seconds: float
    ) -> list[ListingRequestRow]:
        """Every listing request of one of the tenant's exports, oldest first."""
        return await self._rows(
            "listing_requests_of_job",
            {"tenant_id": tenant_id, "job_id": job_id, "window_seconds": window_seconds},
            ListingRequestRow,
        )

    async def delivery_scope_open(self, tenant_id: UUID, destination_id: UUID) -> bool:
        """Whether every delivery switch of the destination's scope is enabled now (the console says why a
        listing request was not recorded: no session is opened to a paused partner)."""
        row = await self._row(
            "read_delivery_scope", {"tenant_id": tenant_id, "destination_id": destination_id}, OpenRow
        )
        return row is not None and row.open
