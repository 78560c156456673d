"""The delivery switches (role ``exports_api``): set a tenant's or destination's with its change record
(:mod:`db.stores.switching`; the global one is the platform's, :mod:`db.stores.platform`), read a tenant's
switches, their history and what a scope holds, and re-wake what a resume let through.
"""

from __future__ import annotations

import logging
from datetime import datetime
from uuid import UUID

from db.rows import JobIdRow
from db.stores.switching import SwitchChanges
from domain.audit import DeliveryPause
from domain.controls import DeliverySwitch, ScopeActivity, SwitchChange
from observability.tracing import current_traceparent

log = logging.getLogger(__name__)


class SwitchStatements(SwitchChanges):
    """The delivery switches: set (a tenant's and its destinations'), read, history, scope activity, and the
    resume's re-wake."""

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

    async def tenant_switches(self, tenant_id: UUID | None) -> list[DeliverySwitch]:
        """The global switch, the tenant's and one per destination of the tenant (``enabled`` is
        ``None`` where no row exists: never enabled, so paused); with no tenant, the global one."""
        return await self._rows("tenant_switches", {"tenant_id": tenant_id}, DeliverySwitch)

    async def tenant_pauses(self, tenant_id: UUID | None) -> list[DeliveryPause]:
        """The active pauses a tenant's operators see (the global scope's, the tenant's, its destinations'),
        oldest first."""
        return await self._rows("tenant_pauses", {"tenant_id": tenant_id}, DeliveryPause)

    async def find_delivery_pause(self, tenant_id: UUID | None, pause_id: UUID) -> DeliveryPause | None:
        """One active pause of the tenant (or the global one), or ``None``: another tenant's looks missing."""
        return await self._row(
            "find_delivery_pause", {"tenant_id": tenant_id, "pause_id": pause_id}, DeliveryPause
        )

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
