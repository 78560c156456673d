"""The outbox dispatcher's statements (role ``exports_dispatcher``): lease unpublished wake-ups, mark them
published, give back what it could not start.
"""

from __future__ import annotations

import logging
from datetime import datetime
from uuid import UUID

from db.rows import (
    MessageIdRow,
)
from db.stores.base import StoreBase
from domain.models import (
    OutboxMessage,
)

log = logging.getLogger(__name__)


class OutboxStatements(StoreBase):
    """The dispatcher's lease, publication and give-back of outbox rows."""

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


class DispatcherStore(OutboxStatements):
    """The outbox dispatcher's store (role ``exports_dispatcher``): it reads no export row."""
