"""``starter.py recurring add|list|show|pause|resume|delete`` from a shell: the same operations as
/recurring-exports, acting as ``--as`` with the role that principal holds in the tenant (admins manage,
everyone reads). No Temporal answers here (EXPORTS_TEMPORAL_ADDRESS points nowhere): each Schedule is pending."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest

from tests.api.test_starter import starter


@pytest.fixture(scope="module")
async def tenant(factory):
    tenant_id = await factory.tenant("initech")
    await factory.principal(tenant_id, "ada.admin", role="admin")
    await factory.principal(tenant_id, "vic.view", role="viewer")
    destination = await factory.destination(tenant_id, name="partner-new")
    return tenant_id, destination


@pytest.mark.slow
async def test_an_admin_manages_a_recurring_export_from_the_command_line(
    database, factory, api_store, tenant
):
    tenant_id, destination = tenant
    code, out, err = await starter(
        database,
        "--json",
        "recurring",
        "add",
        "--destination",
        str(destination),
        "--list",
        "newsletter",
        "--cron",
        "0 2 * * *",
        "--time-zone",
        "Europe/Berlin",
        tenant=tenant_id,
        principal="ada.admin",
    )
    assert code == 0, err
    made = json.loads(out)
    recurring_id = made["recurring_export"]["id"]
    assert made["schedule"] == "pending"

    fired = await api_store.fire_recurring_export(
        tenant_id=tenant_id,
        recurring_export_id=uuid.UUID(recurring_id),
        nominal_time=datetime.now(UTC).replace(microsecond=0),
        fired_by="test",
        late_after_seconds=120,
        catchup_firings=1,
    )

    code, out, _ = await starter(database, "recurring", "list", tenant=tenant_id, principal="vic.view")
    assert code == 0 and recurring_id in out and "cron '0 2 * * *' in Europe/Berlin" in out
    code, out, _ = await starter(
        database, "recurring", "show", recurring_id, tenant=tenant_id, principal="vic.view"
    )
    assert code == 0
    assert f"created {fired.firing.job_id}" in out and "exports created: 1 (1 live)" in out

    code, out, _ = await starter(
        database,
        "recurring",
        "pause",
        recurring_id,
        "--reason",
        "holiday",
        tenant=tenant_id,
        principal="ada.admin",
    )
    assert code == 0
    assert out.startswith(f"Paused recurring export {recurring_id}")
    assert "The 1 export(s) it already created are untouched: 1 still live" in out
    code, out, _ = await starter(
        database, "recurring", "resume", recurring_id, tenant=tenant_id, principal="ada.admin"
    )
    assert code == 0 and out.startswith(f"Resumed recurring export {recurring_id}")
    code, out, _ = await starter(
        database, "recurring", "delete", recurring_id, tenant=tenant_id, principal="ada.admin"
    )
    assert code == 0 and "its firings stay recorded" in out
    assert (await factory.job(fired.firing.job_id)).status == "Queued"


async def test_a_viewer_or_a_stranger_may_not_manage_and_nothing_is_stored(database, factory, tenant):
    tenant_id, destination = tenant
    before = await factory.admin(
        "SELECT count(*) AS n FROM recurring_exports WHERE tenant_id = %(t)s", {"t": tenant_id}
    )
    add = (
        "recurring",
        "add",
        "--destination",
        str(destination),
        "--list",
        "x",
        "--every",
        "3600",
        "--time-zone",
        "UTC",
    )

    code, out, _ = await starter(database, *add, tenant=tenant_id, principal="vic.view")
    assert code == 1
    assert out.strip() == "the viewer role may not manage recurring exports; that needs the admin role"
    code, out, _ = await starter(database, *add, tenant=tenant_id, principal="nobody")
    assert code == 1 and "nobody is not a principal of this tenant" in out
    after = await factory.admin(
        "SELECT count(*) AS n FROM recurring_exports WHERE tenant_id = %(t)s", {"t": tenant_id}
    )
    assert after == before


async def test_invalid_timing_is_a_usage_error_that_says_why(database, tenant):
    tenant_id, destination = tenant
    code, out, _ = await starter(
        database,
        "recurring",
        "add",
        "--destination",
        str(destination),
        "--list",
        "x",
        "--cron",
        "61 * * * *",
        "--time-zone",
        "Europe/Berlin",
        tenant=tenant_id,
        principal="ada.admin",
    )
    assert code == 2
    assert out.strip() == "cron: minute: 61 is outside 0-59"
