"""A tenant's destinations as versioned contracts (issue #24; role ``exports_api``, for an admin's requests):
create, edit from the version the editor read, retire, and read a destination with its recorded versions.

Each write is one statement that changes the row and records the version it makes (who, the role, why, the
row before and after) together; the database refuses a change that does not commit with its record and
computes itself which version last changed what a delivery uses (migration 0021).
"""

from __future__ import annotations

import json
from datetime import date
from typing import Any
from uuid import UUID

from db.rows import (
    CreatedDestination,
    DestinationEdit,
    DestinationRecord,
    DestinationRetirement,
    DestinationVersion,
    RoleRow,
)
from db.stores.base import StoreBase


class DestinationStatements(StoreBase):
    """Create, edit, retire and read a tenant's destinations, each change with its recorded version."""

    async def create_destination(
        self,
        *,
        destination_id: UUID,
        tenant_id: UUID,
        fields: dict[str, Any],
        contract_starts_on: date | None,
        contract_ends_on: date | None,
        changed_by: str,
        changed_role: str,
        reason: str,
        request_key: str,
        request_fingerprint: str,
    ) -> CreatedDestination:
        """Create a destination as version 1 with its record, once per Idempotency-Key in the tenant; an
        earlier creation with the key is answered instead (``replayed``, with its request's fingerprint)."""
        params = {
            **fields,
            "id": destination_id,
            "tenant_id": tenant_id,
            "contract_starts_on": contract_starts_on,
            "contract_ends_on": contract_ends_on,
            "changed_by": changed_by,
            "changed_role": changed_role,
            "reason": reason,
            "request_key": request_key,
            "request_fingerprint": request_fingerprint,
        }
        [created] = await self._rows("create_destination", params, CreatedDestination)
        return created

    async def edit_destination_if_version(
        self,
        *,
        tenant_id: UUID,
        destination_id: UUID,
        expected_version: int | None,
        changes: dict[str, Any],
        changed_by: str,
        changed_role: str,
        reason: str,
    ) -> DestinationEdit | None:
        """Apply ``changes`` (column: JSON value) as the next version, only from ``expected_version`` and
        while the destination is not retired; ``None`` when the tenant has no such destination."""
        return await self._row(
            "edit_destination_if_version",
            {
                "tenant_id": tenant_id,
                "destination_id": destination_id,
                "expected_version": expected_version,
                "changes": json.dumps(changes, default=str),
                "changed_by": changed_by,
                "changed_role": changed_role,
                "reason": reason,
            },
            DestinationEdit,
        )

    async def retire_destination(
        self, *, tenant_id: UUID, destination_id: UUID, retired_by: str, changed_role: str, reason: str
    ) -> DestinationRetirement | None:
        """Retire a destination as its next version (once); ``None`` when the tenant has no such destination."""
        return await self._row(
            "retire_destination",
            {
                "tenant_id": tenant_id,
                "destination_id": destination_id,
                "retired_by": retired_by,
                "changed_role": changed_role,
                "reason": reason,
            },
            DestinationRetirement,
        )

    async def get_tenant_destination(self, tenant_id: UUID, destination_id: UUID) -> DestinationRecord | None:
        """One destination of the tenant as it is now (another tenant's looks missing)."""
        return await self._row(
            "get_tenant_destination",
            {"tenant_id": tenant_id, "destination_id": destination_id},
            DestinationRecord,
        )

    async def destination_versions_of(
        self, tenant_id: UUID, destination_id: UUID, limit: int = 100
    ) -> list[DestinationVersion]:
        """A destination's recorded versions, newest first (empty for another tenant's)."""
        return await self._rows(
            "destination_versions_of",
            {"tenant_id": tenant_id, "destination_id": destination_id, "limit": limit},
            DestinationVersion,
        )

    async def principal_role(self, tenant_id: UUID, name: str) -> str | None:
        """The role ``name`` holds in the tenant, or ``None`` when it is not a principal or is revoked."""
        row = await self._row("principal_role", {"tenant_id": tenant_id, "name": name}, RoleRow)
        return row.role if row else None
