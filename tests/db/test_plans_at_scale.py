"""The statements that run against the whole job table read export_jobs through indexes, never sequentially,
at a realistic size: 200,000 finished exports and 100,000 queued ones over 4 tenants (the history of
``python -m bench scale_db``, a fifth of its history and all of its queue, loaded in about 15 s).

Checked for each: the claim (``claim_if_queued``) on a Queued job, cutoff 2 (``authorize_delivery_if_running``)
on that job's Running attempt, recovery's scan of expired leases (``find_expired_leases``) and its re-check
of OutcomeUnknowns (``find_unknowns_to_recheck``), the sweeper's
batch (``sweep_stale_queued``) and a resume's (``wake_resumed_queued``), both in wake-up order through
``ix_export_jobs_woken``, and the API's list page (``page_tenant_jobs``: the first page and a keyset
page from the middle of the tenant's history), each with the parameters the store binds. Both plans count:
the custom plan for those values, and the generic plan a prepared statement may switch to after five runs
on one pool connection (PostgreSQL 16+). The latencies against an empty database, and the plans at a
million rows, are the benchmark's: loading those takes about a minute, and a wall-clock threshold flakes on
a shared machine; a plan does not.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from bench.scale import (
    claim_params,
    cutoff2_params,
    explain,
    index_scans_on,
    load,
    page_params,
    recovery_params,
    seed_scopes,
    seq_scans_on,
    sweep_params,
)
from db.pool import Role
from domain.models import AuthorizationResult, ClaimResult
from settings import Settings

FINISHED = 200_000
QUEUED = 100_000  # the size at which a batch must walk ix_export_jobs_woken rather than read them all
TENANTS = 4
WORKER_ID = "worker-1"


@pytest.mark.slow
async def test_the_statements_read_export_jobs_through_indexes_at_scale(database, api_store, worker_store):
    settings = Settings()
    scopes = await seed_scopes(database.admin_url, TENANTS)
    await asyncio.to_thread(load, database.admin_url, scopes, finished=FINISHED, queued=QUEUED)
    scope = scopes[0]
    created = await api_store.create_original(
        tenant_id=scope.tenant_id, destination_id=scope.destination_id, list_name="main", created_by="bench"
    )
    # cutoff 2 re-checks the creator and the list (23.6): the benchmark's creator is a principal with a list
    async with await psycopg.AsyncConnection.connect(database.admin_url, autocommit=True) as admin:
        await admin.execute(
            "INSERT INTO principals (tenant_id, name, role) VALUES (%(t)s, 'bench', 'operator')"
            " ON CONFLICT DO NOTHING",
            {"t": scope.tenant_id},
        )
        await admin.execute(
            "INSERT INTO contacts (tenant_id, list_name, email) VALUES (%(t)s, 'main', 'bench@example.test')",
            {"t": scope.tenant_id},
        )
    job = await worker_store.get_job(created.job_id)
    assert job is not None
    attempt = uuid.uuid4()

    plans: dict[str, Any] = {}
    async with await psycopg.AsyncConnection.connect(database.admin_url, autocommit=True) as admin:
        shown = await (await admin.execute("SHOW server_version_num")).fetchone()
        assert shown is not None
        row = await (
            await admin.execute(
                "SELECT created_at, id FROM export_jobs WHERE tenant_id = %(t)s ORDER BY created_at DESC, id DESC"
                " OFFSET %(half)s LIMIT 1",
                {"t": scope.tenant_id, "half": (FINISHED + QUEUED) // TENANTS // 2},
            )
        ).fetchone()
        assert row is not None
        middle = (row[0], row[1])
        async with await psycopg.AsyncConnection.connect(database.app_url, autocommit=True) as conn:

            async def plan(label: str, role: Role, name: str, params: dict[str, Any]) -> None:
                plans[f"{label}, custom plan"] = await explain(conn, role, name, params)
                if int(shown[0]) >= 160000:  # EXPLAIN (GENERIC_PLAN)
                    plans[f"{label}, generic plan"] = await explain(conn, role, name, params, generic=True)

            lease = settings.lease_seconds
            await plan(
                "the claim",
                "exports_worker",
                "claim_if_queued",
                claim_params(job, attempt, lease_seconds=lease, worker_id=WORKER_ID),
            )
            assert (
                await worker_store.claim_if_queued(job.id, job.version, attempt, WORKER_ID)
                == ClaimResult.CLAIMED
            )
            params = cutoff2_params(job, attempt, lease_seconds=lease)
            await plan("cutoff 2", "exports_worker", "authorize_delivery_if_running", params)
            del params["lease_seconds"], params["detail"]  # the store binds its own
            assert (
                await worker_store.authorize_delivery_if_running(**params) == AuthorizationResult.AUTHORIZED
            )
            await admin.execute(
                "UPDATE export_jobs SET lease_expires_at = clock_timestamp() - interval '1 minute'"
                " WHERE id = %(id)s AND status = 'Delivering'",
                {"id": job.id},
            )
            await plan(
                "recovery's scan", "exports_recovery", "find_expired_leases", recovery_params(settings)
            )
            await plan(
                "recovery's re-check",
                "exports_recovery",
                "find_unknowns_to_recheck",
                {
                    "observer_prefix": "recovery:",
                    "within_seconds": 24 * 3600.0,
                    "every_seconds": 600.0,
                    "limit": settings.recovery_batch,
                },
            )
            await plan("the sweep", "exports_worker", "sweep_stale_queued", sweep_params(settings))
            await plan(
                "a resume's wake-up",
                "exports_api",
                "wake_resumed_queued",
                {
                    "resumed_at": datetime.now(UTC),
                    "tenant_id": None,
                    "destination_id": None,
                    "batch": 500,
                    "traceparent": None,
                },
            )
            await plan(
                "the list's first page", "exports_api", "page_tenant_jobs", page_params(scope.tenant_id)
            )
            await plan(
                "a keyset page mid-history",
                "exports_api",
                "page_tenant_jobs",
                page_params(scope.tenant_id, middle),
            )

    for label, found in plans.items():
        print(f"{label}: export_jobs read by {sorted(set(index_scans_on(found)))}")
    sequential = {label: found for label, found in plans.items() if seq_scans_on(found)}
    assert not sequential, f"export_jobs read sequentially by {list(sequential)}:\n" + json.dumps(
        sequential, indent=1, default=str
    )
    unindexed = [label for label, found in plans.items() if not index_scans_on(found)]
    assert not unindexed, f"export_jobs read through no index by {unindexed}"
    # A batch walks the Queued jobs in wake-up order and stops at its size: with the switch checks as
    # joins the planner read every stale Queued job through two bitmaps and sorted them (6.5x at 100k).
    for label in ("the sweep", "a resume's wake-up"):
        for kind in ("custom", "generic"):
            found = plans.get(f"{label}, {kind} plan")
            if found is not None:
                assert "ix_export_jobs_woken" in index_scans_on(found), f"{label}, {kind} plan"
