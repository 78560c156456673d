"""Recurring exports (role ``exports_api``): their definitions, and their firings.

A firing is one short transaction on one connection: lock the recurring export's row and read the firing's
facts (``lock_recurring_export_for_firing``), decide (:func:`rules.recurring.decide_firing`), then either
create the export through the same statement as ``POST /exports`` (``create_original``, with the firing's
idempotency key and the create fingerprint) and record the firing beside it, or record the skip; COMMIT.
The export and its firing row commit together or not at all, so a crash between them loses nothing and
duplicates nothing, and a retry or a duplicate firing of the same nominal time finds the firing recorded
and records nothing new. The row lock serializes a recurring export's firings with each other and with its
pause, edit and deletion.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from db.errors import ConstraintRefused, IdempotencyConflict, InvariantViolation, translated
from db.queries import fetch, fetch_maybe
from db.rows import FiringFactsRow, IdempotencyRow, IdRow, JobIdRow, PrincipalRow, StatusCountRow
from db.stores.base import StoreBase
from domain.controls import PolicyFacts
from domain.models import JobStatus
from domain.recurring import Firing, FiringOutcome, RecurringExport, firing_key
from observability.tracing import current_traceparent
from rules.fingerprint import CREATE_OPERATION, create_fingerprint
from rules.recurring import FiringFacts, created_message, decide_firing

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FiringAnswer:
    """What one firing did: ``created`` or ``skipped`` (recorded now), or ``duplicate`` (the firing of this
    nominal time was recorded before; ``firing`` is that record)."""

    outcome: FiringOutcome
    firing: Firing


class RecurringStatements(StoreBase):
    """Recurring exports' definitions and firings."""

    # -- definitions ----------------------------------------------------------------------------------

    async def insert_recurring_export(self, **params: Any) -> RecurringExport:
        """Store a new definition (its Schedule follows); another tenant's destination is UnknownReference."""
        row = await self._row("insert_recurring_export", params, RecurringExport)
        if row is None:
            raise InvariantViolation("insert_recurring_export committed without returning its row")
        return row

    async def get_recurring_export(
        self, tenant_id: UUID, recurring_export_id: UUID
    ) -> RecurringExport | None:
        """One recurring export of the tenant (deleted ones too), or ``None``."""
        return await self._row(
            "get_recurring_export", {"tenant_id": tenant_id, "id": recurring_export_id}, RecurringExport
        )

    async def page_recurring_exports(
        self, tenant_id: UUID, *, limit: int = 100, include_deleted: bool = False
    ) -> list[RecurringExport]:
        """The tenant's recurring exports, newest first."""
        return await self._rows(
            "page_recurring_exports",
            {"tenant_id": tenant_id, "limit": limit, "include_deleted": include_deleted},
            RecurringExport,
        )

    async def edit_recurring_export_if_version(self, **params: Any) -> RecurringExport | None:
        """New terms and timing for the version read; ``None`` when the version moved on or it is deleted."""
        return await self._row("edit_recurring_export_if_version", params, RecurringExport)

    async def set_recurring_export_paused(
        self, *, tenant_id: UUID, recurring_export_id: UUID, paused: bool, reason: str | None, updated_by: str
    ) -> RecurringExport | None:
        """Pause or resume; ``None`` when it is deleted, already in that state, or not the tenant's."""
        return await self._row(
            "set_recurring_export_paused",
            {
                "tenant_id": tenant_id,
                "id": recurring_export_id,
                "paused": paused,
                "reason": reason,
                "updated_by": updated_by,
            },
            RecurringExport,
        )

    async def delete_recurring_export(
        self, *, tenant_id: UUID, recurring_export_id: UUID, deleted_by: str
    ) -> RecurringExport | None:
        """Record the deletion; ``None`` when it was deleted already or is not the tenant's."""
        return await self._row(
            "delete_recurring_export",
            {"tenant_id": tenant_id, "id": recurring_export_id, "deleted_by": deleted_by},
            RecurringExport,
        )

    async def recurring_export_exports_by_status(
        self, tenant_id: UUID, recurring_export_id: UUID
    ) -> dict[JobStatus, int]:
        """How many exports its firings created, by their status now."""
        rows = await self._rows(
            "recurring_export_exports_by_status",
            {"tenant_id": tenant_id, "id": recurring_export_id},
            StatusCountRow,
        )
        return {r.status: r.n for r in rows}

    async def recurring_export_firings(
        self, tenant_id: UUID, recurring_export_id: UUID, *, limit: int = 50
    ) -> list[Firing]:
        """Its latest firings, newest recorded first, each with its export's status now."""
        return await self._rows(
            "recurring_export_firings",
            {"tenant_id": tenant_id, "id": recurring_export_id, "limit": limit},
            Firing,
        )

    async def recurring_exports_for_schedules(self, after: UUID, limit: int) -> list[RecurringExport]:
        """Every tenant's recurring exports after ``after`` by ID (deleted too), for the Schedules' reconcile."""
        return await self._rows(
            "recurring_exports_for_schedules", {"after": after, "limit": limit}, RecurringExport
        )

    async def find_principal(self, tenant_id: UUID, name: str) -> PrincipalRow | None:
        """A principal of the tenant (the command line acts as one), or ``None``."""
        return await self._row("find_principal", {"tenant_id": tenant_id, "name": name}, PrincipalRow)

    # -- firings --------------------------------------------------------------------------------------

    async def fire_recurring_export(
        self,
        *,
        tenant_id: UUID,
        recurring_export_id: UUID,
        nominal_time: datetime,
        fired_by: str,
        late_after_seconds: float,
        catchup_firings: int,
    ) -> FiringAnswer | None:
        """One firing of ``nominal_time``, decided and recorded in one short transaction (see the module);
        ``None`` when the tenant has no such recurring export (nothing recorded). The nominal time counts in
        whole seconds, as the key and Temporal's workflow IDs spell it."""
        nominal_time = nominal_time.replace(microsecond=0)
        lock = {
            "tenant_id": tenant_id,
            "id": recurring_export_id,
            "nominal_time": nominal_time,
            "late_after_seconds": late_after_seconds,
        }
        async with translated(), self._connection() as conn, conn.transaction():
            # The lock first, alone: the facts statement's snapshot then sees a firing committed meanwhile.
            if (
                await fetch_maybe(
                    conn, "lock_recurring_export", {"tenant_id": tenant_id, "id": recurring_export_id}, IdRow
                )
                is None
            ):
                return None
            facts = await fetch_maybe(conn, "lock_recurring_export_for_firing", lock, FiringFactsRow)
            if facts is None:
                return None
            at = {"tenant_id": tenant_id, "id": recurring_export_id, "nominal_time": nominal_time}
            if facts.recorded_outcome is not None:
                earlier = await fetch_maybe(conn, "recurring_export_firing_at", at, Firing)
                if earlier is None:
                    raise InvariantViolation("a recorded firing was not found under its own lock")
                return FiringAnswer(FiringOutcome.DUPLICATE, earlier)
            job_id = uuid.uuid4()
            decision = decide_firing(
                _firing_facts(facts, job_id), nominal_time, catchup_firings=catchup_firings
            )
            record = {**at, "late": facts.late, "fired_by": fired_by}
            if not decision.create:
                assert decision.reason is not None
                skipped = await fetch(
                    conn,
                    "record_recurring_firing",
                    {
                        **record,
                        "outcome": FiringOutcome.SKIPPED.value,
                        "reason": decision.reason.value,
                        "message": decision.message,
                        "job_id": decision.job_id,
                    },
                    Firing,
                )
                return FiringAnswer(FiringOutcome.SKIPPED, skipped[0])
            job_id = await self._create_for_firing(
                conn, facts, job_id, firing_key(recurring_export_id, nominal_time)
            )
            created = await fetch(
                conn,
                "record_recurring_firing",
                {
                    **record,
                    "outcome": FiringOutcome.CREATED.value,
                    "reason": None,
                    "message": created_message(job_id, facts.late),
                    "job_id": job_id,
                },
                Firing,
            )
            return FiringAnswer(FiringOutcome.CREATED, created[0].model_copy(update={"job_status": "Queued"}))

    async def _create_for_firing(self, conn: Any, facts: FiringFactsRow, job_id: UUID, key: str) -> UUID:
        """The export of a firing, through ``create_original`` with the firing's key, in the caller's
        transaction. The key is taken already only by an export of the same key and fingerprint (then that
        export is the firing's: the same idempotent create replays it) or by a client's forged key for other
        terms (IdempotencyConflict, raised: nothing is recorded)."""
        fingerprint = create_fingerprint(
            tenant_id=facts.tenant_id,
            principal=facts.created_by,
            destination_id=facts.destination_id,
            list_name=facts.list_name,
        )
        params = {
            "tenant_id": facts.tenant_id,
            "job_id": job_id,
            "delivery_key": str(uuid.uuid4()),
            "destination_id": facts.destination_id,
            "created_by": facts.created_by,
            "list_name": facts.list_name,
            "idempotency_key": key,
            "fingerprint": fingerprint,
            "traceparent": current_traceparent(),
        }
        try:
            async with translated(), conn.transaction():  # a savepoint: a taken key leaves the firing's lock
                await fetch(conn, "create_original", params, JobIdRow)
            return job_id
        except ConstraintRefused as exc:
            if exc.constraint != "pk_idempotency_keys":
                raise
        earlier = await fetch_maybe(
            conn,
            "find_idempotency_key",
            {"tenant_id": facts.tenant_id, "operation": CREATE_OPERATION, "idempotency_key": key},
            IdempotencyRow,
        )
        if earlier is None or earlier.fingerprint != fingerprint:
            raise IdempotencyConflict(earlier.job_id if earlier else job_id)
        return earlier.job_id


def _firing_facts(row: FiringFactsRow, job_id: UUID) -> FiringFacts:
    """The firing's facts for the rules: the policy's facts are those of the export it would create."""
    return FiringFacts(
        recurring_export_id=row.id,
        paused=row.paused,
        paused_reason=row.paused_reason,
        deleted_at=row.deleted_at,
        starts_at=row.starts_at,
        ends_at=row.ends_at,
        policy=PolicyFacts(
            job_id=job_id,
            tenant_id=row.tenant_id,
            status=JobStatus.QUEUED,
            version=1,
            attempt_id=None,
            destination_id=row.destination_id,
            list_name=row.list_name,
            created_by=row.created_by,
            destination_found=row.destination_found,
            destination_name=row.destination_name,
            destination_retired_at=row.destination_retired_at,
            contract_starts_on=row.contract_starts_on,
            contract_ends_on=row.contract_ends_on,
            principal_found=row.principal_found,
            principal_role=row.principal_role,
            principal_revoked_at=row.principal_revoked_at,
            principal_lists=row.principal_lists,
            list_exists=True,
            deliveries_open=row.deliveries_open,
            today=row.today,
        ),
        paused_scope=row.paused_scope,
        paused_scope_reason=row.paused_scope_reason,
        live_job_id=row.live_job_id,
        live_job_status=row.live_job_status,
        late=row.late,
        late_runs=row.late_runs,
    )
