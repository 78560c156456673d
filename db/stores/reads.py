"""Reads every role that may see export rows shares: a job, a tenant's newest jobs, a job's events and
cancellation requests, live attempts, ownership, destinations and names (the console's bounded list is
``db/stores/listing.py``).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from uuid import UUID

from db.errors import (
    DestinationNotFound,
)
from db.rows import (
    AttemptIdRow,
    DestinationName,
    NameRow,
)
from db.stores.base import StoreBase
from domain.destination import Destination
from domain.models import (
    AttemptEvent,
    CancellationRequest,
    ExportJob,
    OwnershipState,
)

log = logging.getLogger(__name__)

# The keyset bound of a first page: after every real row.
NO_BOUND_TIME = datetime.max.replace(tzinfo=UTC)
NO_BOUND_ID = UUID(int=(1 << 128) - 1)


class Reads(StoreBase):
    """The reads shared by every role that may see export rows."""

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

    async def tenant_job_events(self, tenant_id: UUID, job_id: UUID) -> list[AttemptEvent]:
        """An export's attempt history, only if it is ``tenant_id``'s export (else empty)."""
        return await self._rows("tenant_job_events", {"tenant_id": tenant_id, "job_id": job_id}, AttemptEvent)

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

    async def load_destination(
        self, tenant_id: UUID, destination_id: UUID, version: int | None = None
    ) -> Destination:
        """One tenant's destination with its contract, as it is now or, given ``version``, as that version
        recorded it (a delivery uses the version cutoff 2 authorized); raises :class:`DestinationNotFound`
        (also for a version nothing recorded)."""
        found = await self._row(
            "load_destination",
            {"tenant_id": tenant_id, "destination_id": destination_id, "version": version},
            Destination,
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
