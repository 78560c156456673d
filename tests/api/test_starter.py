"""``starter.py`` from a shell: the same operations as the API, readable or ``--json`` output, and exit
codes that tell success (0), refusal (1), retryable Busy (75) and usage errors (2) apart."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from domain.models import JobStatus

ROOT = Path(__file__).resolve().parents[2]


async def starter(database, *args: str, tenant=None, principal: str = "sam.ops") -> tuple[int, str, str]:
    env = {
        **os.environ,
        "EXPORTS_DATABASE_URL": database.app_url,
        "EXPORTS_PRINCIPAL": principal,
        # No Temporal here: a stop's signal fails fast and is only logged; cutoff 2 enforces the stop.
        "EXPORTS_TEMPORAL_ADDRESS": "127.0.0.1:9",
    }
    if tenant is not None:
        env["EXPORTS_TENANT"] = str(tenant)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "starter.py"),
        *args,
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.slow
async def test_create_then_cancel_from_the_command_line(database, factory):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)

    code, out, _ = await starter(
        database, "--json", "create", "--destination", str(destination), "--list", "main", tenant=tenant
    )
    assert code == 0
    job_id = json.loads(out)["export"]["id"]

    code, out, _ = await starter(database, "cancel", job_id, "--reason", "wrong destination", tenant=tenant)
    assert code == 0
    assert out.startswith("Canceled while queued. No attempt had started, and none will.")
    assert await factory.status(uuid.UUID(job_id)) == JobStatus.CANCELED

    code, out, _ = await starter(database, "timeline", job_id, tenant=tenant)
    assert code == 0
    assert [line.split()[0] for line in out.splitlines() if line and not line.startswith(" ")] == [
        "Requested",
        "Cancel",
    ]


async def test_a_running_export_is_a_stop_request_and_after_cutoff_2_a_refusal(database, factory):
    running, _ = await factory.running()
    delivering, _ = await factory.delivering()

    code, out, _ = await starter(database, "cancel", str(running.id), tenant=running.tenant_id)
    assert code == 0
    assert out.startswith("Already started at ") and "Stop requested" in out

    code, out, _ = await starter(
        database, "--json", "cancel", str(delivering.id), tenant=delivering.tenant_id
    )
    assert code == 1
    assert json.loads(out)["outcome"] == "TooLate"
    assert json.loads(out)["outcome_kind"] == "refused"  # the CLI speaks outcomes, not HTTP statuses


@pytest.mark.slow
async def test_busy_exits_75_and_the_retry_with_the_same_request_id_decides(database, factory):
    job = await factory.queued()
    request_id = str(uuid.uuid4())
    async with await psycopg.AsyncConnection.connect(database.admin_url) as holder:
        await holder.execute("SELECT 1 FROM export_jobs WHERE id = %(id)s FOR UPDATE", {"id": job.id})
        code, out, err = await starter(
            database, "cancel", str(job.id), "--request-id", request_id, tenant=job.tenant_id
        )
        await holder.rollback()
    assert code == 75
    assert f"--request-id {request_id}" in err

    code, out, _ = await starter(
        database, "cancel", str(job.id), "--request-id", request_id, tenant=job.tenant_id
    )
    assert code == 0
    assert "CanceledWhileQueued" in out


async def test_status_of_another_tenants_export_is_not_found(database, factory):
    job = await factory.queued()
    other = await factory.tenant("globex")

    code, out, _ = await starter(database, "status", str(job.id), tenant=other)

    assert code == 1
    assert "no such export" in out


async def test_usage_errors_exit_2(database, factory):
    tenant = await factory.tenant()

    bad_uuid = await starter(database, "cancel", "not-a-uuid", tenant=tenant)
    too_long = await starter(
        database, "create", "--destination", str(uuid.uuid4()), "--list", "x" * 500, tenant=tenant
    )

    assert bad_uuid[0] == 2
    assert too_long[0] == 2 and "list_name" in too_long[2]


async def test_migrate_is_idempotent(database):
    env_url = database.admin_url
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "starter.py"),
        "--json",
        "migrate",
        env={**os.environ, "EXPORTS_DATABASE_URL": env_url},
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()

    assert proc.returncode == 0
    assert json.loads(out) == {"applied": []}


async def test_seed_demo_records_the_partners_cleanup_agreement(database):
    args = (
        "--host-key",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPlaceholder",
        "--credential-ref",
        "/keys/partner",
    )
    seeded = []
    for agreement in ("remove", None):
        extra = ("--temporary-files", agreement) if agreement else ()
        code, out, err = await starter(
            database,
            "--json",
            "seed-demo",
            "--database-url",
            database.admin_url,
            "--contacts",
            "1",
            *args,
            *extra,
        )
        assert code == 0, err
        seeded.append(json.loads(out)["destination_id"])
    with psycopg.connect(database.admin_url) as conn:
        rows = dict(
            conn.execute(
                "SELECT id::text, temporary_files FROM destinations WHERE id = ANY(%s::uuid[])", (seeded,)
            ).fetchall()
        )
    assert [rows[d] for d in seeded] == ["remove", "keep"]  # keep unless the partner agreed

    code, _, err = await starter(
        database, "seed-demo", "--database-url", database.admin_url, *args, "--temporary-files", "delete"
    )
    assert code == 2 and "invalid choice" in err
