"""Pausing and resuming one delivery scope with its history entry, shared by the two roles that may: ``exports_api``
(a tenant's switch and its destinations') and ``exports_platform`` (the global switch). Which role writes
which scope is the database's rule (migration 0019's trigger), not this room's.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal
from uuid import UUID

from db.errors import InvariantViolation, translated
from db.queries import fetch_maybe
from db.rows import SwitchStateRow
from db.stores.base import StoreBase
from domain.controls import SwitchChange, SwitchScope

PauseKind = Literal["manual", "host_key"]
HOST_KEY_TRIP = "host-key-check"  # the owner a host-key trip's pause names


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
        expires_at: datetime | None = None,
        kind: PauseKind = "manual",
        pause_ids: Sequence[UUID] | None = None,
    ) -> SwitchChange:
        """Pause (``enabled=False``: the changer's pause of the scope, of ``kind``, until ``expires_at`` or its
        release) or resume one scope (its switch row on, and the pauses named by ``pause_ids`` released, by
        default the changer's own), with who and why, and append the change to the history: one short
        transaction that locks the scope's row first (so it serializes with every claim and cutoff 2 that read
        it FOR SHARE), then writes the pause or the release with its history entry (0032).

        A pause someone else set, or a host-key trip, is released only under an approval the changer decided
        (two people); without one it is left as it is (the history entry names what was released). A
        destination that is not the tenant's raises ``UnknownReference``; a scope the pool's role may not switch
        (the global one over ``exports_api``, any other over ``exports_platform``) ``NotPermitted``.
        """
        params = {
            "scope": scope.value,
            "tenant_id": tenant_id,
            "destination_id": destination_id,
            "enabled": enabled,
            "reason": reason,
            "changed_by": changed_by,
            "expires_at": expires_at,
            "kind": kind,
            "pause_ids": list(pause_ids) if pause_ids is not None else None,
        }
        # Another tenant's destination raises UnknownReference (db/errors.py's table).
        async with translated(), self._connection() as conn, conn.transaction():
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

    async def trip_host_key_pause(
        self, *, tenant_id: UUID, destination_id: UUID, reason: str, tripped_by: str = HOST_KEY_TRIP
    ) -> SwitchChange:
        """Pause a destination because its host key changed (a pause of kind ``host_key``): resuming it takes
        two people, whoever asks (0032). For the partner session's host-key check."""
        return await self.set_delivery_switch(
            scope=SwitchScope.DESTINATION,
            tenant_id=tenant_id,
            destination_id=destination_id,
            enabled=False,
            reason=reason,
            changed_by=tripped_by,
            kind="host_key",
        )
