"""The append-only evidence of an attempt, written by the worker that holds it and by recovery
(roles ``exports_worker`` and ``exports_recovery``: INSERT on ``export_attempt_events``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from db.errors import translated
from db.queries import execute
from db.stores.base import StoreBase

log = logging.getLogger(__name__)


class EvidenceStatements(StoreBase):
    """Appends an attempt's delivery evidence, one event per observation."""

    async def append_delivery_evidence(
        self, job_id: UUID, attempt_id: UUID, observed_by: str, evidence: dict[str, Any]
    ) -> bool:
        """Append one observation with its provenance; never touches the job's status."""
        detail = json.dumps(evidence, sort_keys=True, default=str)
        return await self._matched(
            "append_delivery_evidence",
            job_id=job_id,
            attempt_id=attempt_id,
            observed_by=observed_by,
            detail=detail,
        )

    async def append_delivery_evidence_many(
        self, job_id: UUID, attempt_id: UUID, observed_by: str, evidence: Sequence[dict[str, Any]]
    ) -> int:
        """Append several observations in one statement, in their order; how many were appended (0 when the
        job does not exist). Never touches the job's status."""
        if not evidence:
            return 0
        details = [json.dumps(item, sort_keys=True, default=str) for item in evidence]
        async with translated(), self._connection() as conn:
            return await execute(
                conn,
                "append_delivery_evidence_many",
                {"job_id": job_id, "attempt_id": attempt_id, "observed_by": observed_by, "details": details},
            )
