"""Recurring exports (issue #25, item 1): a tenant's standing order to export one list to one destination on
a cron expression or an interval, in a timezone, between an optional start and end; and the record of each of
its firings. The rows are PostgreSQL's (the source of truth); the Temporal Schedule is reconciled from them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from uuid import UUID

from domain.models import RejectionCode, Row

SCHEDULE_ID_PREFIX = "recurring-export-"
LIVE_STATUSES = ("Queued", "Running", "Delivering")


def schedule_id_for(recurring_export_id: UUID) -> str:
    """The Temporal Schedule of a recurring export: one per row, named after its ID (IDs are global)."""
    return f"{SCHEDULE_ID_PREFIX}{recurring_export_id}"


def nominal_iso(nominal_time: datetime) -> str:
    """A firing's nominal time as the key spells it: UTC, whole seconds, ``Z`` (as Temporal's workflow IDs)."""
    utc = nominal_time.astimezone(UTC).replace(microsecond=0, tzinfo=None)
    return f"{utc.isoformat()}Z"


def firing_key(recurring_export_id: UUID, nominal_time: datetime) -> str:
    """The idempotency key of a firing's export: the schedule's ID and the nominal fire time, so a duplicate
    or caught-up firing of the same time finds the same key and never makes a second export."""
    return f"{schedule_id_for(recurring_export_id)}@{nominal_iso(nominal_time)}"


class FiringOutcome(StrEnum):
    """What a firing did: created an export, or was skipped (with a reason). A duplicate firing of a nominal
    time already recorded records nothing new and answers ``duplicate`` with the first firing's record."""

    CREATED = "created"
    SKIPPED = "skipped"
    DUPLICATE = "duplicate"  # never stored: the answer and the metric of a repeated firing


class SkipReason(StrEnum):
    """Why a firing created nothing: the values the ``reason`` column's CHECK allows. Besides its own, a
    firing is skipped with the claim's policy codes (``RejectionCode``) a firing can evaluate."""

    OVERLAP = "overlap"  # the previous export of this recurring export is still live
    DELIVERIES_PAUSED = "deliveries_paused"  # a delivery switch of the scope is paused
    RECURRING_PAUSED = "recurring_paused"
    RECURRING_DELETED = "recurring_deleted"
    CATCH_UP = "catch_up"  # a missed firing beyond the catch-up allowance after an outage
    OUTSIDE_WINDOW = "outside_window"  # a nominal time before its start or after its end (a backfill)
    LIST_INVALID = RejectionCode.LIST_INVALID.value
    DESTINATION_NOT_FOUND = RejectionCode.DESTINATION_NOT_FOUND.value
    DESTINATION_RETIRED = RejectionCode.DESTINATION_RETIRED.value
    CONTRACT_NOT_STARTED = RejectionCode.CONTRACT_NOT_STARTED.value
    CONTRACT_ENDED = RejectionCode.CONTRACT_ENDED.value
    CREATOR_UNKNOWN = RejectionCode.CREATOR_UNKNOWN.value
    CREATOR_REVOKED = RejectionCode.CREATOR_REVOKED.value
    CREATOR_NOT_PERMITTED = RejectionCode.CREATOR_NOT_PERMITTED.value


class RecurringExport(Row):
    """One recurring export, as ``recurring_exports`` holds it."""

    tenant_id: UUID
    id: UUID
    destination_id: UUID
    list_name: str
    cron: str | None
    interval_seconds: int | None
    time_zone: str
    starts_at: datetime | None
    ends_at: datetime | None
    paused: bool
    paused_reason: str | None
    deleted_at: datetime | None
    deleted_by: str | None
    created_by: str
    created_at: datetime
    updated_by: str
    updated_at: datetime
    version: int

    @property
    def schedule_id(self) -> str:
        return schedule_id_for(self.id)


class Firing(Row):
    """One recorded firing: created export ``job_id``, or skipped with a reason and the message people read
    (for an overlap, ``job_id`` is the live export it waited for). ``job_status`` is that export's status now."""

    tenant_id: UUID
    recurring_export_id: UUID
    nominal_time: datetime
    id: int
    outcome: FiringOutcome
    reason: SkipReason | None
    message: str
    job_id: UUID | None
    late: bool
    fired_by: str
    recorded_at: datetime
    job_status: str | None = None
