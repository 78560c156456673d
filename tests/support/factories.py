"""Factories that put a job in any state through the protocol's own statements, and clock helpers.

Lease and wake-up ages are set on the row (the database clock decides), never with sleeps: time-skipping
moves Temporal's clock, not PostgreSQL's.

Deliveries are fail-closed (issue 9): a tenant or destination without an enabled switch is paused, and an
export whose creator is not a principal of its tenant is rejected. So a tenant made here is created
enabled, with the principals the tests create exports as (``DEFAULT_PRINCIPALS``), and a destination is
created enabled unless ``enabled=False``.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from db.admin import edit_destination
from db.stores.api import ApiStore
from db.stores.protocol import WorkerStore
from db.stores.reconciler import ReconcilerStore
from db.stores.recovery import RecoveryStore
from domain.models import (
    AuthorizationResult,
    CancellationOutcome,
    ClaimResult,
    DeliveryOutcome,
    ExportJob,
    FailureCode,
    FenceResult,
    FinishResult,
    JobStatus,
    RejectionCode,
    StopPoint,
    final_name_for,
)
from testbed.pg import TestDatabase

# The names tests create exports and replacements as; each is an operator of every tenant made here.
DEFAULT_PRINCIPALS = (
    "admin@acme",
    "rita.ops",
    "sam.ops",
    "lee.reconciler",
    "kim.reconciler",
    "reconciler@acme",
)


# The role a test's two people hold for each two-person action (one that may do it: approval_roles(), 0032).
TWO_PERSON_TEST_ROLE = {
    "correct_outcome": "reconciler",
    "change_destination": "admin",
    "pin_host_key": "admin",
    "resume_pause": "operator",
    "replace_with_overwrite": "operator",
}


class Factory:
    """Fresh uuid identifiers every call; nothing shared between tests."""

    def __init__(
        self,
        database: TestDatabase,
        *,
        api: ApiStore,
        worker: WorkerStore,
        recovery: RecoveryStore | None = None,
        reconciler: ReconcilerStore | None = None,
    ) -> None:
        self.db = database
        self.api = api
        self.worker = worker
        self.recovery = recovery or worker  # recovery's takeovers, as exports_recovery
        self.reconciler = reconciler or api  # reconciliation and corrections, as exports_reconciler

    # -- superuser helpers (set-up and clocks only) --------------------------------------------------

    async def admin(self, query: Any, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        async with await psycopg.AsyncConnection.connect(self.db.admin_url, autocommit=True) as conn:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query, params or {})
                return await cur.fetchall() if cur.description else []

    async def tenant(
        self, name: str = "acme", *, enabled: bool = True, principals: tuple[str, ...] = DEFAULT_PRINCIPALS
    ) -> UUID:
        """A tenant, created enabled (its delivery switch on) unless ``enabled=False``, whose
        ``principals`` are operators (reconcilers, those whose name says so)."""
        tenant_id = uuid.uuid4()
        await self.admin(
            "INSERT INTO tenants (id, name) VALUES (%(id)s, %(n)s)", {"id": tenant_id, "n": name}
        )
        if enabled:
            await self.switch(tenant_id, None, enabled=True)
        for principal in principals:
            # a reconciler's name holds the reconciler role: only a reconciler reconciles (0032)
            await self.principal(
                tenant_id, principal, "reconciler" if "reconciler" in principal else "operator"
            )
        return tenant_id

    async def principal(
        self, tenant_id: UUID, name: str, role: str = "operator", export_lists: list[str] | None = None
    ) -> None:
        """Make ``name`` a principal of the tenant (reinstated, with this role, if it was one)."""
        await self.admin(
            "INSERT INTO principals (tenant_id, name, role, export_lists) VALUES (%(t)s, %(n)s, %(r)s, %(l)s)"
            " ON CONFLICT (tenant_id, name) DO UPDATE SET role = EXCLUDED.role,"
            " export_lists = EXCLUDED.export_lists, revoked_at = NULL, revoked_by = NULL",
            {"t": tenant_id, "n": name, "r": role, "l": export_lists},
        )

    async def approve(
        self,
        tenant_id: UUID,
        action: str,
        subject_id: object,
        parameters: dict[str, Any],
        *,
        approved_by: str,
        requested_by: str = "asker@two-person",
    ) -> UUID:
        """An approval of a two-person action (0032), asked by ``requested_by`` and approved by ``approved_by``
        (who runs it), both made principals of the tenant with a role that may do it: set-up for a statement
        that needs one (the service asks and decides them through the API)."""
        role = TWO_PERSON_TEST_ROLE.get(action, "operator")
        for name in (requested_by, approved_by):
            await self.principal(tenant_id, name, role)
        [row] = await self.admin(
            "INSERT INTO approvals (tenant_id, action, subject_kind, subject_id, parameters, reason, requested_by,"
            " requested_role, expires_at)"
            " VALUES (%(t)s, %(a)s, %(k)s, %(s)s, %(p)s::jsonb, 'set up by a test', %(r)s, %(role)s,"
            " clock_timestamp() + interval '1 hour') RETURNING id",
            {
                "t": tenant_id,
                "a": action,
                "k": {"resume_pause": "delivery_pause", "correct_outcome": "export"}.get(
                    action, "destination" if "destination" in action or "host_key" in action else "export"
                ),
                "s": str(subject_id),
                "p": json.dumps(parameters, default=str),
                "r": requested_by,
                "role": role,
            },
        )
        await self.admin(
            "UPDATE approvals SET decision = 'approved', decided_by = %(b)s, decided_role = %(role)s"
            " WHERE id = %(id)s",
            {"b": approved_by, "role": role, "id": row["id"]},
        )
        return UUID(str(row["id"]))

    async def switch(
        self, tenant_id: UUID | None, destination_id: UUID | None, *, enabled: bool, reason: str = "factory"
    ) -> None:
        """Set a scope's switch as the superuser (set-up only: operators go through the service)."""
        scope = "global" if tenant_id is None else "tenant" if destination_id is None else "destination"
        await self.admin(
            "INSERT INTO delivery_switches (scope, tenant_id, destination_id, enabled, reason, changed_by)"
            " VALUES (%(s)s, %(t)s, %(d)s, %(e)s, %(r)s, 'factory')"
            " ON CONFLICT ON CONSTRAINT uq_delivery_switches_scope DO UPDATE"
            " SET enabled = EXCLUDED.enabled, reason = EXCLUDED.reason, changed_at = clock_timestamp()",
            {"s": scope, "t": tenant_id, "d": destination_id, "e": enabled, "r": reason},
        )

    async def destination(self, tenant_id: UUID, *, enabled: bool = True, **fields: Any) -> UUID:
        """A destination, created enabled unless ``enabled=False`` (a new one is paused until enabled)."""
        dest_id = uuid.uuid4()
        row = {
            "id": dest_id,
            "tenant_id": tenant_id,
            "name": "partner-old",
            "host": "127.0.0.1",
            "port": 22,
            "username": "partner",
            "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPlaceholder",
            "credential_ref": "/nonexistent/key",
            "remote_dir": "/upload",
            "name_and_size_identify": False,
            "hash_evidence": "none",
            "ack_suffix": None,
            "max_write_request": 32768,
            "temporary_files": "keep",
            # What the partner receives (0020): plain CSV unless a test asks for a format.
            "csv_header": True,
            "csv_delimiter": ",",
            "csv_columns": ["email", "first_name", "last_name"],
            "compression": "none",
            "pgp_recipient_keys": [],
            "pgp_signing_key_ref": None,
            "host_keys": None,  # several pinned keys (0029); none given: host_key alone
            "max_sessions": None,  # the partner's session limit (0029); none: no limit
            "manifest": "none",  # the manifest published beside each file (0037)
        }
        row.update(fields)
        row = {
            k: list(v) if isinstance(v, tuple) else v for k, v in row.items()
        }  # arrays, as psycopg sends lists
        await self.admin(
            "INSERT INTO destinations (id, tenant_id, name, host, port, username, host_key, credential_ref,"
            " remote_dir, name_and_size_identify, hash_evidence, ack_suffix, max_write_request, temporary_files,"
            " csv_header, csv_delimiter, csv_columns, compression, pgp_recipient_keys, pgp_signing_key_ref,"
            " host_keys, max_sessions, manifest)"
            " VALUES (%(id)s, %(tenant_id)s, %(name)s, %(host)s, %(port)s, %(username)s, %(host_key)s,"
            " %(credential_ref)s, %(remote_dir)s, %(name_and_size_identify)s, %(hash_evidence)s, %(ack_suffix)s,"
            " %(max_write_request)s, %(temporary_files)s, %(csv_header)s, %(csv_delimiter)s, %(csv_columns)s,"
            " %(compression)s, %(pgp_recipient_keys)s, %(pgp_signing_key_ref)s, %(host_keys)s::text[],"
            " %(max_sessions)s::int, %(manifest)s)",
            row,
        )
        if enabled:
            await self.switch(tenant_id, dest_id, enabled=True)
        return dest_id

    async def change_destination(self, tenant_id: UUID, destination_id: UUID, **changes: Any) -> int:
        """Change a destination's columns as an administrator would (its next version, recorded with who and
        why: the statement an admin's PATCH runs); returns the version it is now at."""
        edited = await edit_destination(
            self.db.admin_url,
            tenant_id=tenant_id,
            destination_id=destination_id,
            changes=changes,
            changed_by="factory",
            reason="test set-up",
        )
        assert edited is not None and edited.matched, edited
        return edited.version

    async def db_today(self) -> date:
        """Today's UTC day on the database clock (what the policy check and cutoff 2 judge contracts by)."""
        rows = await self.admin("SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date AS today")
        return rows[0]["today"]

    async def contacts(self, tenant_id: UUID, list_name: str, rows: list[tuple[str, str, str]]) -> None:
        """Insert contacts (email, first, last) for a tenant's list."""
        async with await psycopg.AsyncConnection.connect(self.db.admin_url, autocommit=True) as conn:
            async with conn.cursor() as cur:
                async with cur.copy(
                    "COPY contacts (tenant_id, list_name, email, first_name, last_name) FROM STDIN"
                ) as copy:
                    for email, first, last in rows:
                        await copy.write_row((tenant_id, list_name, email, first, last))

    async def close_window(self, tenant_id: UUID, destination_id: UUID) -> datetime:
        """Give a destination a delivery window that is closed now, whatever the time of day: today and tomorrow
        (UTC, the database clock) are blackout dates (0035). Returns its next opening, the day after tomorrow at
        00:00 UTC (a test that crosses midnight still finds it closed)."""
        [row] = await self.admin("SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date AS today")
        today: date = row["today"]
        await self.change_destination(
            tenant_id,
            destination_id,
            intake_time_zone="UTC",
            blackout_dates=[today, today + timedelta(days=1)],
        )
        return datetime.combine(today + timedelta(days=2), time(0), tzinfo=UTC)

    async def expire_lease(self, job_id: UUID, seconds_ago: float = 1.0) -> None:
        await self.admin(
            "UPDATE export_jobs SET lease_expires_at = clock_timestamp() - make_interval(secs => %(s)s)"
            " WHERE id = %(id)s AND status IN ('Running', 'Delivering')",
            {"id": job_id, "s": seconds_ago},
        )

    async def end_wait(self, job_id: UUID) -> None:
        """End a give-back's wait on the row as if its time had passed (a clock, like ``expire_lease``). The
        trigger keeps ``available_at`` for give-backs alone, for every writer: this one superuser statement
        runs with triggers off (``session_replication_role = replica``), as only a test may."""
        async with await psycopg.AsyncConnection.connect(self.db.admin_url) as conn:
            async with conn.transaction():
                await conn.execute("SET LOCAL session_replication_role = replica")
                await conn.execute(
                    "UPDATE export_jobs SET available_at = clock_timestamp() - interval '1 second'"
                    " WHERE id = %(id)s AND status = 'Queued' AND available_at IS NOT NULL",
                    {"id": job_id},
                )

    async def age_wake_up(self, job_id: UUID, minutes: float) -> None:
        await self.admin(
            "UPDATE export_jobs SET woken_at = clock_timestamp() - make_interval(mins => %(m)s)"
            " WHERE id = %(id)s AND status = 'Queued'",
            {"id": job_id, "m": minutes},
        )

    async def status(self, job_id: UUID) -> JobStatus:
        rows = await self.admin("SELECT status FROM export_jobs WHERE id = %(id)s", {"id": job_id})
        return JobStatus(rows[0]["status"])

    async def job(self, job_id: UUID) -> ExportJob:
        job = await self.worker.get_job(job_id)
        assert job is not None
        return job

    async def event_kinds(self, job_id: UUID) -> list[str]:
        return [e.kind.value for e in await self.worker.job_events(job_id)]

    async def outbox_count(self, job_id: UUID) -> int:
        rows = await self.admin("SELECT count(*) AS n FROM outbox WHERE job_id = %(id)s", {"id": job_id})
        return rows[0]["n"]

    # -- jobs in any state, through the protocol's statements ----------------------------------------

    async def queued(
        self, tenant_id: UUID | None = None, destination_id: UUID | None = None, list_name: str = "main"
    ) -> ExportJob:
        tenant_id = tenant_id or await self.tenant()
        destination_id = destination_id or await self.destination(tenant_id)
        # The policy check rejects an export of a list that does not exist (has no contacts): a list no
        # test filled gets one placeholder contact, so the export is claimable.
        await self.admin(
            "INSERT INTO contacts (tenant_id, list_name, email) SELECT %(t)s, %(l)s, 'placeholder@factory.test'"
            " WHERE NOT EXISTS (SELECT 1 FROM contacts WHERE tenant_id = %(t)s AND list_name = %(l)s)",
            {"t": tenant_id, "l": list_name},
        )
        created = await self.api.create_original(
            tenant_id=tenant_id, destination_id=destination_id, list_name=list_name, created_by="admin@acme"
        )
        return await self.job(created.job_id)

    async def running(
        self, job: ExportJob | None = None, worker_id: str = "worker-3"
    ) -> tuple[ExportJob, UUID]:
        job = job or await self.queued()
        attempt_id = uuid.uuid4()
        assert (
            await self.worker.claim_if_queued(job.id, job.version, attempt_id, worker_id)
            == ClaimResult.CLAIMED
        )
        return await self.job(job.id), attempt_id

    async def delivering(
        self, job: ExportJob | None = None, size: int = 1234, sha256: bytes = b"\x01" * 32, rows: int = 48_112
    ) -> tuple[ExportJob, UUID]:
        job, attempt_id = await self.running(job)
        result = await self.worker.authorize_delivery_if_running(
            tenant_id=job.tenant_id,
            job_id=job.id,
            attempt_id=attempt_id,
            replaces_job_id=job.replaces_job_id,
            final_name=final_name_for(job.delivery_key),
            length=size,
            sha256=sha256,
            rows=rows,
        )
        assert result == AuthorizationResult.AUTHORIZED
        return await self.job(job.id), attempt_id

    async def cancel(
        self, job: ExportJob, requested_by: str = "sam.ops", request_id: UUID | None = None, **kw: Any
    ):
        return await self.api.request_cancellation(
            tenant_id=job.tenant_id,
            job_id=job.id,
            request_id=request_id or uuid.uuid4(),
            requested_by=requested_by,
            reason="wrong destination",
            **kw,
        )

    async def fence(self, job_id: UUID, attempt_id: UUID, *, rename: bool) -> None:
        """Write the upload fence (and the rename fence with ``rename``), as a worker does before it sends
        its first byte and before its rename request."""
        assert await self.worker.fence_upload_if_delivering(job_id, attempt_id) == FenceResult.FENCED
        if rename:
            assert await self.worker.fence_rename_if_delivering(job_id, attempt_id) == FenceResult.FENCED

    async def in_status(
        self, status: JobStatus, code: FailureCode = FailureCode.BUILD_FAILED, job: ExportJob | None = None
    ) -> tuple[ExportJob, UUID | None]:
        """A job in ``status``, reached only along the protocol's edges."""
        match status:
            case JobStatus.QUEUED:
                j = job or await self.queued()
                return j, None
            case JobStatus.RUNNING:
                return await self.running(job)
            case JobStatus.DELIVERING:
                return await self.delivering(job)
            case JobStatus.CANCELED:
                j = job or await self.queued()
                assert (await self.cancel(j)).outcome == CancellationOutcome.CANCELED_WHILE_QUEUED
                return await self.job(j.id), None
            case JobStatus.REJECTED:
                j = job or await self.queued()
                assert await self.worker.reject_if_queued(
                    j.id,
                    j.version,
                    RejectionCode.DESTINATION_NOT_FOUND,
                    "Rejected: the destination is not one of this tenant's",
                )
                return await self.job(j.id), None
            case JobStatus.STOPPED:
                j, attempt = await self.running(job)
                assert (await self.cancel(j)).outcome == CancellationOutcome.STOP_REQUESTED
                assert (
                    await self.worker.finish_stopped(j.id, attempt, StopPoint.WHILE_BUILDING)
                    == FinishResult.WRITTEN
                )
                return await self.job(j.id), attempt
            case JobStatus.FAILED if code in (FailureCode.BUILD_FAILED,):
                j, attempt = await self.running(job)
                assert (
                    await self.worker.finish_failed(j.id, attempt, code, "BuildError") == FinishResult.WRITTEN
                )
                return await self.job(j.id), attempt
            case JobStatus.FAILED:
                j, attempt = await self.delivering(job)
                assert (
                    await self.worker.finish_delivery(j.id, attempt, DeliveryOutcome.FAILED, code)
                    == FinishResult.WRITTEN
                )
                return await self.job(j.id), attempt
            case JobStatus.COMPLETED | JobStatus.OUTCOME_UNKNOWN:
                j, attempt = await self.delivering(job)
                assert (
                    await self.worker.finish_delivery(j.id, attempt, DeliveryOutcome(status.value))
                    == FinishResult.WRITTEN
                )
                return await self.job(j.id), attempt
        raise AssertionError(status)
