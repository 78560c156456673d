"""The delivery switches (role ``exports_api``): set one with its change record, read a tenant's switches,
their history and what a scope holds, and re-wake what a resume let through.
"""

from __future__ import annotations

import logging
from datetime import datetime
from uuid import UUID

from db.errors import (
    InvariantViolation,
    translated,
)
from db.queries import fetch_maybe
from db.rows import (
    JobIdRow,
    SwitchStateRow,
)
from db.stores.base import StoreBase
from domain.controls import DeliverySwitch, ScopeActivity, SwitchChange, SwitchScope
from observability.tracing import current_traceparent

log = logging.getLogger(__name__)


class SwitchStatements(StoreBase):
    """The delivery switches: set, read, history, scope activity, and the resume's re-wake."""

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
        # Another tenant's destination raises UnknownReference (db/errors.py's table).
        async with translated(), self.pool.connection() as conn, conn.transaction():
            before = await fetch_maybe(conn, "lock_delivery_switch", params, SwitchStateRow)
            changed = await fetch_maybe(
                conn,
                "set_delivery_switch",
                {**params, "was_enabled": before.enabled if before else None},
                SwitchChange,
            )
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
