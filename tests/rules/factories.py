"""Values for the pure rules' tests: rows as the store would return them, built in memory."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from domain.models import ExportJob, JobStatus


def job(status: JobStatus = JobStatus.QUEUED, **fields: Any) -> ExportJob:
    """An ``export_jobs`` row in ``status``, with plausible values for every other column."""
    now = datetime.now(UTC)
    values: dict[str, Any] = {
        "id": uuid.uuid4(),
        "tenant_id": uuid.uuid4(),
        "status": status,
        "version": 1,
        "destination_id": uuid.uuid4(),
        "attempt_id": None if status == JobStatus.QUEUED else uuid.uuid4(),
        "attempt_count": 0 if status == JobStatus.QUEUED else 1,
        "claimed_by": None,
        "lease_expires_at": None,
        "stop_request_id": None,
        "cancellation_request_id": None,
        "expected_file_name": None,
        "expected_file_bytes": None,
        "expected_file_sha256": None,
        "expected_file_rows": None,
        "delivery_authorized_at": None,
        "woken_at": now,
        "failure_reason": None,
        "delivery_key": str(uuid.uuid4()),
        "replaces_job_id": None,
        "created_by": "sam.ops",
        "replacement_reason": None,
        "overwrite_agreement_ref": None,
        "sweep_count": 0,
        "list_name": "main",
        "rejection_reason": None,
        "workflow_id": None,
        "created_at": now,
        "attempts_released": 0,
        "fence_expected": False,
        "upload_fenced_at": None,
        "rename_fenced_at": None,
        "rejection_code": None,
    }
    values.update(fields)
    return ExportJob(**values)
