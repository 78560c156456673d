"""Setting one delivery switch with its history entry, shared by the two roles that may: ``exports_api``
(a tenant's switch and its destinations') and ``exports_platform`` (the global switch). Which role writes
which scope is the database's rule (migration 0019's trigger), not this room's.
"""

from __future__ import annotations

from uuid import UUID

from db.errors import InvariantViolation, translated
from db.queries import fetch_maybe
from db.rows import SwitchStateRow
from db.stores.base import StoreBase
from domain.controls import SwitchChange, SwitchScope


class SwitchChanges(StoreBase):
    """Pause or resume one scope, with who and why, appended to the history in the same transaction."""

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

        A destination that is not the tenant's raises ``UnknownReference``; a scope the pool's role may not
        switch (the global one over ``exports_api``, any other over ``exports_platform``) ``NotPermitted``.
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
