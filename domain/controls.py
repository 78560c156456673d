"""The operators' controls in the seeds' terms: the claim's policy facts and reason codes (000 "The Worker",
001 "facts that live outside the claimed row"), and the fail-closed delivery switches (004)."""

from __future__ import annotations

from datetime import date, datetime
from enum import StrEnum
from uuid import UUID

from domain.models import JobStatus, RejectionCode, Row

__all__ = ["DeliverySwitch", "PolicyFacts", "RejectionCode", "ScopeActivity", "SwitchChange", "SwitchScope"]


class PolicyFacts(Row):
    """Everything the policy check reads, in one statement, for the version of the terms it evaluates.

    The destination's and principal's columns are ``None`` when no such row exists; ``today`` is the
    database clock's UTC date (contracts are whole UTC days); ``deliveries_open`` says whether every
    switch of the job's scope was enabled at that read (the claim re-reads them itself).
    """

    job_id: UUID
    tenant_id: UUID
    status: JobStatus
    version: int
    attempt_id: UUID | None
    destination_id: UUID
    list_name: str
    created_by: str
    destination_found: bool
    destination_name: str | None
    destination_retired_at: datetime | None
    contract_starts_on: date | None
    contract_ends_on: date | None
    principal_found: bool
    principal_role: str | None
    principal_revoked_at: datetime | None
    principal_lists: list[str] | None
    list_exists: bool
    deliveries_open: bool
    available: bool = True  # not waiting after a give-back (available_at passed, or none)
    today: date


class SwitchScope(StrEnum):
    GLOBAL = "global"
    TENANT = "tenant"
    DESTINATION = "destination"


class DeliverySwitch(Row):
    """One scope's switch as an operator sees it. ``enabled`` is ``None`` when the scope has no row:
    never enabled, so paused (fail-closed)."""

    scope: SwitchScope
    tenant_id: UUID | None
    destination_id: UUID | None
    destination_name: str | None
    destination_retired: bool
    enabled: bool | None
    reason: str | None
    changed_by: str | None
    changed_at: datetime | None

    @property
    def paused(self) -> bool:
        """Paused unless explicitly enabled."""
        return self.enabled is not True


class SwitchChange(Row):
    """One entry of the append-only history (or the answer of the change just made)."""

    id: int
    scope: SwitchScope
    tenant_id: UUID | None
    destination_id: UUID | None
    enabled: bool
    was_enabled: bool | None
    reason: str
    changed_by: str
    changed_at: datetime
    pause_ids: list[UUID] | None = None  # the pauses this change started, re-armed or released (0032)


class ScopeActivity(Row):
    """How many exports of a scope are in each live state (what a pause leaves behind it)."""

    queued: int
    running: int
    delivering: int
