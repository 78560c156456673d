"""Outcome notifications (issue 26, item 1): the event kinds a tenant's webhook endpoints may subscribe to,
and the rows of endpoints, events and their deliveries.

An event reports one terminal outcome of an export (or OutcomeUnknown), one cancellation that lost to a
delivery, or one skipped recurring firing. The database writes it in the transaction of what it reports
(migration 0025's triggers); the worker's webhook dispatcher delivers it to every subscribed endpoint, at
least once, with the event ID as the idempotency key.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

from pydantic import SecretStr

from domain.models import JobStatus, Row


class NotificationKind(StrEnum):
    """The event types, as ``type`` in the body and as a subscription names them (0025's CHECK)."""

    COMPLETED = "export.completed"
    FAILED = "export.failed"
    STOPPED = "export.stopped"
    CANCELED = "export.canceled"
    REJECTED = "export.rejected"
    OUTCOME_UNKNOWN = "export.outcome_unknown"
    CANCELLATION_LOST = "export.cancellation_lost"
    RECURRING_FIRING_SKIPPED = "recurring_export.firing_skipped"


# The event an export's status change into each of these statuses writes.
OUTCOME_KINDS: dict[JobStatus, NotificationKind] = {
    JobStatus.COMPLETED: NotificationKind.COMPLETED,
    JobStatus.FAILED: NotificationKind.FAILED,
    JobStatus.STOPPED: NotificationKind.STOPPED,
    JobStatus.CANCELED: NotificationKind.CANCELED,
    JobStatus.REJECTED: NotificationKind.REJECTED,
    JobStatus.OUTCOME_UNKNOWN: NotificationKind.OUTCOME_UNKNOWN,
}


class DeliveryState(StrEnum):
    PENDING = "pending"  # due now or at next_attempt_at (retrying with backoff)
    DELIVERED = "delivered"  # the endpoint answered 2xx
    FAILED = "failed"  # gave up: still failing at the end of the retry window (redeliver by hand)


class WebhookEndpoint(Row):
    """An endpoint as the API reads it: never its secret (the API's role may not read that column)."""

    tenant_id: UUID
    id: UUID
    url: str
    events: list[NotificationKind]
    description: str | None
    enabled: bool
    version: int
    created_by: str
    created_at: datetime
    updated_by: str | None
    updated_at: datetime | None


class EndpointSummary(Row):
    """An endpoint with how its deliveries stand: pending, failed (given up) and delivered counts."""

    tenant_id: UUID
    id: UUID
    url: str
    events: list[NotificationKind]
    description: str | None
    enabled: bool
    version: int
    created_by: str
    created_at: datetime
    updated_by: str | None
    updated_at: datetime | None
    pending: int
    failed: int
    delivered: int
    last_failure_at: datetime | None


class WebhookDelivery(Row):
    """One event's delivery to one endpoint, with its event's type and export, as the console shows it."""

    id: UUID
    tenant_id: UUID
    event_id: UUID
    endpoint_id: UUID
    kind: NotificationKind
    job_id: UUID | None
    state: DeliveryState
    attempts: int
    next_attempt_at: datetime
    give_up_at: datetime
    last_attempt_at: datetime | None
    last_status_code: int | None
    last_error: str | None
    delivered_at: datetime | None
    redeliveries: int
    redelivered_by: str | None
    redelivered_at: datetime | None
    created_at: datetime
    event_created_at: datetime


class DueDelivery(Row):
    """What the dispatcher leased to send: the event, the endpoint's URL and secret, and the lease token."""

    id: UUID
    tenant_id: UUID
    event_id: UUID
    endpoint_id: UUID
    kind: NotificationKind
    event_created_at: datetime
    payload: dict[str, Any]
    url: str
    secret: SecretStr  # never printed: a SecretStr's repr and str are masked
    attempts: int
    leased_until: datetime


class AttemptRecord(Row):
    """How one attempt ended: the HTTP status (``None`` when no answer came) and the error's type."""

    delivery_id: UUID
    leased_until: datetime
    status_code: int | None
    error: str | None
    jitter: float

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


class RecordedAttempt(Row):
    """The delivery's state after an attempt was recorded."""

    id: UUID
    state: DeliveryState
    attempts: int
    next_attempt_at: datetime


class FanOut(Row):
    """One fan-out pass: events taken, deliveries made."""

    events: int
    deliveries: int
