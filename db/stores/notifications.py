"""The webhook dispatcher's statements (role ``exports_dispatcher``): fan events out to the endpoints
subscribed to them, lease due deliveries, record how their attempts ended. It reads no export row: an
event carries what it reports."""

from __future__ import annotations

from db.stores.base import StoreBase
from domain.notifications import AttemptRecord, DueDelivery, FanOut, RecordedAttempt


class NotificationStore(StoreBase):
    """The webhook dispatcher's store, over an ``exports_dispatcher`` pool."""

    async def fan_out_notification_events(self, batch: int, window_seconds: float) -> FanOut:
        """Give up to ``batch`` new events one delivery per enabled, subscribed endpoint of their tenant."""
        row = await self._row(
            "fan_out_notification_events", {"batch": batch, "window_seconds": window_seconds}, FanOut
        )
        return row or FanOut(events=0, deliveries=0)

    async def take_due_webhook_deliveries(self, batch: int, lease_seconds: float) -> list[DueDelivery]:
        """Lease up to ``batch`` due deliveries in one committed statement, with their events and secrets."""
        return await self._rows(
            "take_due_webhook_deliveries", {"batch": batch, "lease_seconds": lease_seconds}, DueDelivery
        )

    async def record_webhook_attempts(
        self, attempts: list[AttemptRecord], *, base_seconds: float, cap_seconds: float
    ) -> list[RecordedAttempt]:
        """Record a batch of attempts in one round trip: delivered, retried later, or given up."""
        if not attempts:
            return []
        return await self._rows(
            "record_webhook_attempts",
            {
                "delivery_ids": [a.delivery_id for a in attempts],
                "leases": [a.leased_until for a in attempts],
                "status_codes": [a.status_code for a in attempts],
                "errors": [a.error for a in attempts],
                "jitters": [a.jitter for a in attempts],
                "base_seconds": base_seconds,
                "cap_seconds": cap_seconds,
            },
            RecordedAttempt,
        )
