"""/recurring-exports over HTTP (issue 25, item 1): admins define, edit, pause, resume and delete recurring
exports; every role reads them; another tenant's looks missing; bad input is a 422 that says which field and
why, and stores nothing. No Temporal here: the answer says each Schedule is pending (a worker brings it to the
row at start); the Schedules themselves are tested on the dev server (tests/workflows/test_recurring_schedules.py).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from domain.recurring import FiringOutcome

DEFINITION = {"list_name": "newsletter", "cron": "0 2 * * *", "time_zone": "Europe/Berlin"}


def body(acme, **changes):
    return {"destination_id": str(acme.destination_id), **DEFINITION, **changes}


async def count(factory, table: str, tenant) -> int:
    rows = await factory.admin(
        f"SELECT count(*) AS n FROM {table} WHERE tenant_id = %(t)s",  # noqa: S608 - a table name of this test
        {"t": tenant},
    )
    return rows[0]["n"]


async def define(client, acme, **changes) -> dict:
    r = await client.post("/recurring-exports", json=body(acme, **changes), headers=acme.admin)
    assert r.status_code == 201, r.text
    return r.json()


async def test_an_admin_defines_a_recurring_export_and_reads_it_back(client, acme):
    r = await client.post("/recurring-exports", json=body(acme), headers=acme.admin)

    assert r.status_code == 201, r.text
    made = r.json()["recurring_export"]
    assert r.headers["Location"] == f"/recurring-exports/{made['id']}"
    assert r.headers["ETag"] == '"1"'
    assert made["schedule_id"] == f"recurring-export-{made['id']}"
    assert made["created_by"] == "ada.admin@acme" and made["state"] == "active"
    assert made["when"] == "cron '0 2 * * *' in Europe/Berlin"
    assert r.json()["schedule"] == "pending"
    assert "its Schedule follows when a worker next starts" in r.json()["message"]

    shown = await client.get(f"/recurring-exports/{made['id']}", headers=acme.viewer)
    assert shown.status_code == 200
    assert shown.json()["recurring_export"]["id"] == made["id"]
    assert shown.json()["firings"] == [] and shown.json()["exports"]["total"] == 0
    listed = await client.get("/recurring-exports", headers=acme.operator)
    assert made["id"] in [x["id"] for x in listed.json()["recurring_exports"]]


@pytest.mark.parametrize("role", ["viewer", "operator", "reconciler"])
async def test_only_admins_manage_recurring_exports_and_a_refusal_records_nothing(
    client, factory, acme, role
):
    made = (await define(client, acme))["recurring_export"]
    before = await count(factory, "recurring_exports", acme.id)
    headers = getattr(acme, role)
    attempts = [
        ("POST", "/recurring-exports", body(acme), {}),
        ("PATCH", f"/recurring-exports/{made['id']}", {"list_name": "other"}, {"If-Match": '"1"'}),
        ("POST", f"/recurring-exports/{made['id']}/pause", {"reason": "x"}, {}),
        ("POST", f"/recurring-exports/{made['id']}/resume", None, {}),
        ("DELETE", f"/recurring-exports/{made['id']}", None, {}),
    ]
    for method, path, json, extra in attempts:
        r = await client.request(method, path, json=json, headers={**headers, **extra})
        assert r.status_code == 403, (method, path, r.text)
        assert r.json()["detail"] == (
            f"the {role} role may not manage recurring exports; that needs the admin role"
        )
    assert await count(factory, "recurring_exports", acme.id) == before
    after = (await client.get(f"/recurring-exports/{made['id']}", headers=headers)).json()["recurring_export"]
    assert (after["version"], after["state"], after["list_name"]) == (1, "active", "newsletter")


async def test_another_tenants_recurring_export_looks_missing(client, acme, globex):
    made = (await define(client, acme))["recurring_export"]
    for method, path in (
        ("GET", f"/recurring-exports/{made['id']}"),
        ("POST", f"/recurring-exports/{made['id']}/pause"),
        ("POST", f"/recurring-exports/{made['id']}/resume"),
        ("DELETE", f"/recurring-exports/{made['id']}"),
    ):
        r = await client.request(method, path, headers=globex.admin)
        assert r.status_code == 404, (method, path)
        assert r.json()["detail"] == "no such recurring export"
    r = await client.patch(
        f"/recurring-exports/{made['id']}",
        json={"list_name": "x"},
        headers={**globex.admin, "If-Match": '"1"'},
    )
    assert r.status_code == 404
    listed = await client.get("/recurring-exports", headers=globex.admin)
    assert made["id"] not in [x["id"] for x in listed.json()["recurring_exports"]]


async def test_a_destination_of_another_tenant_is_refused_and_nothing_is_stored(
    client, factory, acme, globex
):
    before = await count(factory, "recurring_exports", acme.id)
    r = await client.post(
        "/recurring-exports", json=body(acme, destination_id=str(globex.destination_id)), headers=acme.admin
    )
    assert r.status_code == 422
    assert r.json()["detail"] == "destination_id: no such destination in this tenant"
    assert await count(factory, "recurring_exports", acme.id) == before


@pytest.mark.parametrize(
    ("changes", "field", "problem"),
    [
        ({"cron": "0 25 * * *"}, "cron", "hour: 25 is outside 0-23"),
        ({"cron": "every night"}, "cron", "2 fields; a cron expression has five"),
        ({"cron": "*/0 * * * *"}, "cron", "minute: a step of 0"),
        ({"cron": "0 2 * * * 2026"}, "cron", "6 fields"),
        ({"cron": "CRON_TZ=UTC 0 2 * * *"}, "cron", "give the timezone in time_zone"),
        ({"cron": "@fortnightly"}, "cron", "is not one of @annually"),
        ({"time_zone": "Mars/Olympus"}, "time_zone", "'Mars/Olympus' is not an IANA timezone name"),
        ({"interval_seconds": 3600}, "cron", "give either cron or interval_seconds, not both"),
        ({"cron": None}, "cron", "give either cron or interval_seconds, not both and not neither"),
        (
            {"starts_at": "2026-01-02T00:00:00Z", "ends_at": "2026-01-01T00:00:00Z"},
            "ends_at",
            "must be after starts_at",
        ),
        # what the published schema says itself: refused by validation, with ``errors``
        ({"cron": None, "interval_seconds": 30}, "body.interval_seconds", "greater than or equal to 60"),
        ({"starts_at": "2026-01-02T00:00:00"}, "body.starts_at", "timezone"),
    ],
)
async def test_invalid_timing_is_a_422_that_says_which_field_and_why_and_stores_nothing(
    client, factory, acme, changes, field, problem
):
    before = await count(factory, "recurring_exports", acme.id)
    payload = {k: v for k, v in body(acme, **changes).items() if v is not None}
    r = await client.post("/recurring-exports", json=payload, headers=acme.admin)
    assert r.status_code == 422, r.text
    answer = r.json()
    said = dict(answer.get("problems") or {}) | {e["field"]: e["problem"] for e in answer.get("errors", [])}
    assert problem in said.get(field, ""), answer
    assert field.removeprefix("body.") in answer["detail"] or problem in answer["detail"]
    assert await count(factory, "recurring_exports", acme.id) == before


async def test_an_edit_needs_the_version_read_and_a_valid_result(client, acme):
    made = (await define(client, acme))["recurring_export"]
    path = f"/recurring-exports/{made['id']}"

    r = await client.patch(path, json={"list_name": "weekly"}, headers=acme.admin)
    assert r.status_code == 428
    r = await client.patch(path, json={"list_name": "weekly"}, headers={**acme.admin, "If-Match": '"7"'})
    assert r.status_code == 412
    r = await client.patch(
        path, json={"time_zone": "Nowhere/Land"}, headers={**acme.admin, "If-Match": '"1"'}
    )
    assert r.status_code == 422 and "time_zone" in r.json()["detail"]
    r = await client.patch(path, json={"interval_seconds": 5}, headers={**acme.admin, "If-Match": '"1"'})
    assert r.status_code == 422 and "interval_seconds" in r.json()["detail"]

    r = await client.patch(
        path,
        json={"interval_seconds": 7200, "list_name": "weekly"},
        headers={**acme.admin, "If-Match": '"1"'},
    )
    assert r.status_code == 200, r.text
    edited = r.json()["recurring_export"]
    assert (edited["cron"], edited["interval_seconds"], edited["list_name"]) == (None, 7200, "weekly")
    assert edited["version"] == 2 and r.headers["ETag"] == '"2"'


async def firing(api_store, row_id, tenant_id, nominal):
    return await api_store.fire_recurring_export(
        tenant_id=tenant_id,
        recurring_export_id=uuid.UUID(row_id),
        nominal_time=nominal,
        fired_by="test",
        late_after_seconds=120,
        catchup_firings=1,
    )


async def test_pausing_and_deleting_never_touch_the_exports_it_created_and_say_so(
    client, factory, api_store, acme
):
    made = (await define(client, acme))["recurring_export"]
    fired = await firing(api_store, made["id"], acme.id, datetime.now(UTC).replace(microsecond=0))
    assert fired.outcome == FiringOutcome.CREATED
    job_id = fired.firing.job_id
    before = await factory.job(job_id)

    r = await client.post(
        f"/recurring-exports/{made['id']}/pause", json={"reason": "holiday"}, headers=acme.admin
    )
    assert r.status_code == 200, r.text
    assert r.json()["exports_untouched"] == {"total": 1, "live": 1, "by_status": {"Queued": 1}}
    assert r.json()["message"] == (
        f"Paused recurring export {made['id']}: it creates no export until resumed (a firing meanwhile is "
        "recorded as skipped). The 1 export(s) it already created are untouched: 1 still live and will run; "
        "cancel them separately if they must not deliver. Temporal did not answer: its Schedule follows when "
        "a worker next starts."
    )
    assert r.json()["recurring_export"]["state"] == "paused"
    assert await factory.job(job_id) == before

    again = await client.post(f"/recurring-exports/{made['id']}/pause", headers=acme.admin)
    assert again.status_code == 200 and again.json()["changed"] is False
    assert "was already paused; nothing changed" in again.json()["message"]

    r = await client.post(f"/recurring-exports/{made['id']}/resume", headers=acme.admin)
    assert r.status_code == 200 and r.json()["recurring_export"]["state"] == "active"

    r = await client.delete(f"/recurring-exports/{made['id']}", headers=acme.admin)
    assert r.status_code == 200, r.text
    assert r.json()["exports_untouched"]["live"] == 1
    assert (
        "its firings stay recorded. The 1 export(s) it already created are untouched" in r.json()["message"]
    )
    assert await factory.job(job_id) == before
    shown = (await client.get(f"/recurring-exports/{made['id']}", headers=acme.viewer)).json()
    assert shown["recurring_export"]["state"] == "deleted"
    assert [f["job_id"] for f in shown["firings"]] == [str(job_id)]
    r = await client.post(f"/recurring-exports/{made['id']}/resume", headers=acme.admin)
    assert r.status_code == 409


async def test_the_console_lists_recurring_exports_with_their_firings(client, api_store, acme):
    from tests.api.conftest import sign_in

    made = (await define(client, acme, list_name="console-list"))["recurring_export"]
    nominal = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=3)
    created = await firing(api_store, made["id"], acme.id, nominal)
    skipped = await firing(api_store, made["id"], acme.id, nominal + timedelta(minutes=1))
    await sign_in(client, acme, as_role="viewer")
    try:
        page = (await client.get("/console/recurring")).text
    finally:
        client.cookies.clear()
    assert f'id="recurring-{made["id"]}"' in page
    assert "cron &#39;0 2 * * *&#39; in Europe/Berlin" in page
    assert f"/console/exports/{created.firing.job_id}" in page
    assert 'data-reason="overlap"' in page and skipped.firing.message in page
