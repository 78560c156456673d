"""What the API creates and edits (role ``exports_api``): an original with its deliveries row and first
wake-up, a replacement, and a queued export's terms.
"""

from __future__ import annotations

import logging
import uuid
from uuid import UUID

from db.errors import (
    ConstraintRefused,
    IdempotencyConflict,
    InvariantViolation,
)
from db.rows import (
    IdempotencyRow,
    JobIdRow,
    VersionRow,
)
from db.stores.base import StoreBase
from domain.models import (
    Created,
)
from observability.tracing import current_traceparent

log = logging.getLogger(__name__)


class RequestStatements(StoreBase):
    """Creation of originals and replacements, and edits of a queued export's terms."""

    async def create_original(
        self,
        *,
        tenant_id: UUID,
        destination_id: UUID,
        list_name: str,
        created_by: str,
        idempotency_key: str | None = None,
        fingerprint: str | None = None,
        job_id: UUID | None = None,
        delivery_key: str | None = None,
    ) -> Created:
        """Create an original export with its deliveries row and first wake-up, in one statement.

        With an idempotency key, the same key and fingerprint returns the first job (``replayed``);
        the same key with another fingerprint raises ``IdempotencyConflict``.
        """
        params = {
            "tenant_id": tenant_id,
            "job_id": job_id or uuid.uuid4(),
            "delivery_key": delivery_key or str(uuid.uuid4()),
            "destination_id": destination_id,
            "created_by": created_by,
            "list_name": list_name,
            "idempotency_key": idempotency_key,
            "fingerprint": fingerprint,
            "traceparent": current_traceparent(),
        }
        try:
            row = await self._row("create_original", params, JobIdRow)
        except ConstraintRefused as exc:
            if exc.constraint == "pk_idempotency_keys" and idempotency_key is not None:
                earlier = await self._row(
                    "find_idempotency_key",
                    {
                        "tenant_id": tenant_id,
                        "operation": "create_export",
                        "idempotency_key": idempotency_key,
                    },
                    IdempotencyRow,
                )
                if earlier is None:
                    raise
                if earlier.fingerprint != fingerprint:
                    raise IdempotencyConflict(earlier.job_id) from exc
                return Created(job_id=earlier.job_id, replayed=True)
            raise  # another tenant's destination is UnknownReference already (db/errors.py's table)
        if row is None:
            raise InvariantViolation("create_original committed without returning its job")
        return Created(job_id=row.job_id)

    async def create_replacement(
        self,
        *,
        tenant_id: UUID,
        original_job_id: UUID,
        created_by: str,
        replacement_reason: str,
        overwrite_agreement_ref: str | None = None,
        job_id: UUID | None = None,
    ) -> Created | None:
        """Create a replacement for a named person; ``None`` when the original may not be replaced.

        A second live replacement raises ``ConstraintRefused('uq_export_jobs_one_replacement')``.
        """
        row = await self._row(
            "create_replacement",
            {
                "tenant_id": tenant_id,
                "original_job_id": original_job_id,
                "job_id": job_id or uuid.uuid4(),
                "created_by": created_by,
                "replacement_reason": replacement_reason,
                "overwrite_agreement_ref": overwrite_agreement_ref,
                "traceparent": current_traceparent(),
            },
            JobIdRow,
        )
        return Created(job_id=row.job_id) if row else None

    async def edit_terms_if_queued(
        self, *, tenant_id: UUID, job_id: UUID, expected_version: int, destination_id: UUID, list_name: str
    ) -> int | None:
        """Change a queued export's terms; returns the new version, or ``None`` if it matched nothing."""
        # Another tenant's destination raises UnknownReference (db/errors.py's table).
        row = await self._row(
            "edit_terms_if_queued",
            {
                "tenant_id": tenant_id,
                "job_id": job_id,
                "expected_version": expected_version,
                "destination_id": destination_id,
                "list_name": list_name,
                "traceparent": current_traceparent(),
            },
            VersionRow,
        )
        return row.version if row else None
