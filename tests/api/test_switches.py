"""The delivery switches over HTTP and from the command line (issue 9.2): a tenant's operator pauses and
resumes the tenant or one of its destinations with a reason, each answer mapped through the one Kind table;
the global switch is the platform's (403 over HTTP, the command line only); the console's list page shows a
banner while anything in the tenant's scope is paused, and a switches page; a switch that cannot be read
is shown as paused, never as running."""

from __future__ import annotations

import json
import uuid

import psycopg

from service.outcomes import Kind
from service.switches import SWITCH_REQUEST, UNREADABLE, Operator, Switches
from tests.api.conftest import client_for, make_tenant, sign_in
from tests.api.test_starter import starter


def body(scope: str = "tenant", destination_id=None, reason: str = "partner incident") -> dict:
    data = {"scope": scope, "reason": reason}
    if destination_id is not None:
        data["destination_id"] = str(destination_id)
    return data


async def test_pause_and_resume_a_destination_with_a_reason(client, factory, acme):
    job = await factory.queued(acme.id, acme.destination_id)

    paused = await client.post(
        "/switches/pause", json=body("destination", acme.destination_id), headers=acme.operator
    )

    assert paused.status_code == 200
    answer = paused.json()
    assert answer["change"]["enabled"] is False and answer["change"]["changed_by"] == acme.operator_name
    assert answer["message"].startswith("Paused deliveries to partner-old: partner incident.")
    assert answer["queued"] >= 1
    view = (await client.get("/switches", headers=acme.operator)).json()
    assert view["paused"] is True
    assert any(line.startswith("Deliveries to partner-old are paused since ") for line in view["banner"])
    assert view["history"][0]["reason"] == "partner incident"

    resumed = await client.post(
        "/switches/resume", json=body("destination", acme.destination_id, "fixed"), headers=acme.operator
    )

    assert resumed.status_code == 200
    assert resumed.json()["woken"] >= 1 and resumed.json()["still_paused"] == []
    assert (await client.get("/switches", headers=acme.operator)).json()["paused"] is False
    row = await factory.job(job.id)
    assert row.woken_at.isoformat() >= resumed.json()["change"]["changed_at"]


async def test_a_destination_resumed_under_a_paused_tenant_says_it_is_still_paused(client, acme):
    await client.post("/switches/pause", json=body("tenant", reason="audit"), headers=acme.operator)
    try:
        resumed = await client.post(
            "/switches/resume", json=body("destination", acme.destination_id, "ok"), headers=acme.operator
        )
        assert resumed.status_code == 200
        assert resumed.json()["woken"] == 0
        assert resumed.json()["still_paused"][0].startswith("Deliveries for this tenant are paused since ")
    finally:
        await client.post("/switches/resume", json=body("tenant", reason="audit done"), headers=acme.operator)


async def test_the_global_switch_is_not_a_tenants(client, acme):
    r = await client.post("/switches/pause", json=body("global"), headers=acme.operator)
    assert r.status_code == 403 and "starter.py pause --global" in r.json()["detail"]


async def test_another_tenants_destination_is_invalid_and_changes_nothing(client, factory, acme, globex):
    before = await factory.admin("SELECT count(*) AS n FROM delivery_switch_changes", {})
    r = await client.post(
        "/switches/pause", json=body("destination", globex.destination_id), headers=acme.operator
    )
    assert r.status_code == 422 and r.json()["detail"] == "destination_id: no such destination in this tenant"
    assert await factory.admin("SELECT count(*) AS n FROM delivery_switch_changes", {}) == before


async def test_a_malformed_switch_request_is_refused_with_its_reason(client, acme):
    for bad in (
        {"scope": "tenant"},  # no reason
        body("tenant", reason=""),
        body("tenant", reason="x\x00y"),
        body("destination"),  # no destination
        body("tenant", destination_id=uuid.uuid4()),  # a destination without its scope
        {**body(), "extra": 1},
        body("planet"),
    ):
        r = await client.post("/switches/pause", json=bad, headers=acme.operator)
        assert r.status_code == 422, bad


async def test_the_published_schema_says_which_fields_each_scope_needs(client):
    schemas = (await client.get("/openapi.json")).json()["components"]["schemas"]
    assert schemas["DestinationSwitch"]["required"] == ["scope", "destination_id", "reason"]
    assert schemas["TenantSwitch"]["required"] == ["scope", "reason"]
    assert schemas["TenantSwitch"]["additionalProperties"] is False


async def test_switches_need_a_token(client):
    assert (await client.get("/switches")).status_code == 401
    assert (await client.post("/switches/pause", json=body())).status_code == 401


# -- the console ----------------------------------------------------------------------------------------


async def test_the_list_page_shows_a_banner_while_paused_and_none_otherwise(
    make_app, client, factory, database
):
    acme = await make_tenant(factory, database, "acme-console")
    async with client_for(make_app()) as console:
        await sign_in(console, acme)
        page = (await console.get("/console")).text
        assert 'id="switch-banner"' not in page
        assert 'href="/console/switches" id="nav-switches"' in page  # reachable when nothing is paused

        await client.post(
            "/switches/pause", json=body("tenant", reason="quarterly audit"), headers=acme.operator
        )
        try:
            page = (await console.get("/console")).text
            assert 'id="switch-banner"' in page
            assert "Deliveries for this tenant are paused since " in page and "quarterly audit" in page

            switches_page = await console.get("/console/switches")
            assert switches_page.status_code == 200
            assert "quarterly audit" in switches_page.text and 'data-scope="tenant"' in switches_page.text
        finally:
            await client.post(
                "/switches/resume", json=body("tenant", reason="audit done"), headers=acme.operator
            )
        assert 'id="switch-banner"' not in (await console.get("/console")).text


async def test_a_destination_never_enabled_is_on_the_banner(make_app, factory, database):
    acme = await make_tenant(factory, database, "acme-new-partner")
    await factory.destination(acme.id, name="partner-new", enabled=False)
    async with client_for(make_app()) as console:
        await sign_in(console, acme)
        assert (
            "Deliveries to partner-new are paused: it was never enabled."
            in (await console.get("/console")).text
        )


async def test_the_switches_page_needs_a_session(make_app):
    async with client_for(make_app()) as anonymous:
        r = await anonymous.get("/console/switches")
        assert r.status_code == 303 and r.headers["location"] == "/console/login"


async def test_switches_that_cannot_be_read_are_shown_as_paused(factory, database, api_store):
    acme = await make_tenant(factory, database, "acme-unreadable")
    # Fail-closed in what people read, too: a read error never shows as "running".
    async with await psycopg.AsyncConnection.connect(database.admin_url, autocommit=True) as conn:
        await conn.execute("REVOKE SELECT ON delivery_switches FROM exports_api")
        try:
            assert await Switches(api_store).banner(acme.id) == [UNREADABLE]
        finally:
            await conn.execute("GRANT SELECT ON delivery_switches TO exports_api")
    assert await Switches(api_store).banner(acme.id) == []


async def test_the_global_switch_is_changed_only_over_the_platforms_role(factory, api_store):
    # Even a platform operator's request is refused when the service holds only the API's store: it never
    # falls back to the exports_api pool, which the database refuses the global switch anyway (0019).
    before = await factory.admin("SELECT * FROM delivery_switches WHERE scope = 'global'", {})
    request = SWITCH_REQUEST.validate_python({"scope": "global", "reason": "partner-wide incident"})

    answer = await Switches(api_store).pause(Operator("pat.platform", None, platform=True), request)

    assert answer.kind == Kind.FORBIDDEN and "exports_platform" in answer.text
    assert await factory.admin("SELECT * FROM delivery_switches WHERE scope = 'global'", {}) == before


# -- the command line ------------------------------------------------------------------------------------


async def test_pause_resume_and_switches_from_the_command_line(database, factory):
    tenant = await factory.tenant()
    destination = await factory.destination(tenant)
    job = await factory.queued(tenant, destination)

    code, out, _ = await starter(
        database, "pause", "--destination", str(destination), "--reason", "partner incident", tenant=tenant
    )
    assert code == 0 and out.startswith("Paused deliveries to partner-old: partner incident.")

    code, out, _ = await starter(database, "switches", tenant=tenant)
    assert code == 0
    assert any(line.startswith("destination partner-old") and "paused" in line for line in out.splitlines())

    code, out, _ = await starter(
        database, "--json", "resume", "--destination", str(destination), "--reason", "fixed", tenant=tenant
    )
    assert code == 0
    answer = json.loads(out)
    assert answer["outcome_kind"] == "done" and answer["woken"] == 1
    assert (await factory.job(job.id)).woken_at.isoformat() >= answer["change"]["changed_at"]


async def test_the_global_switch_from_the_command_line(database, factory):
    code, out, _ = await starter(database, "--json", "pause", "--global", "--reason", "partner-wide incident")
    try:
        assert code == 0
        assert json.loads(out)["change"]["scope"] == "global"
        # the pause is sam.ops's own row (0032), which the gate reads beside the switch
        rows = await factory.admin(
            "SELECT owner, reason FROM delivery_pauses WHERE scope = 'global' AND released_at IS NULL", {}
        )
        assert rows == [{"owner": "sam.ops", "reason": "partner-wide incident"}]
    finally:
        code, out, _ = await starter(database, "resume", "--global", "--reason", "incident over")
    assert code == 0 and out.startswith("Resumed deliveries globally: incident over.")


async def test_command_line_usage_errors_exit_2(database, factory):
    tenant = await factory.tenant()
    code, _, err = await starter(database, "pause", "--reason", "no scope")  # no tenant, not --global
    assert code == 2 and "--tenant" in err
    code, _, err = await starter(database, "pause", "--reason", "", tenant=tenant)
    assert code == 2 and "reason" in err
    code, out, _ = await starter(
        database, "--json", "pause", "--destination", str(uuid.uuid4()), "--reason", "x", tenant=tenant
    )
    assert code == 2 and json.loads(out)["outcome_kind"] == "invalid"


async def test_a_pause_may_have_an_expiry_and_one_already_past_is_refused(client, factory, database):
    acme = await make_tenant(factory, database, "acme-expiring")
    [row] = await factory.admin(
        "SELECT clock_timestamp() + interval '2 hours' AS later, clock_timestamp() AS now", {}
    )
    late = await client.post(
        "/switches/pause",
        json={"scope": "tenant", "reason": "deploy", "expires_at": row["now"].isoformat()},
        headers=acme.operator,
    )
    assert late.status_code == 422 and late.json()["detail"] == "expires_at: must be later than now"

    paused = await client.post(
        "/switches/pause",
        json={"scope": "tenant", "reason": "deploy", "expires_at": row["later"].isoformat()},
        headers=acme.operator,
    )

    assert paused.status_code == 200, paused.text
    assert paused.json()["message"].startswith("Paused deliveries for this tenant: deploy until ")
    [pause] = (await client.get("/switches", headers=acme.viewer)).json()["pauses"]
    assert (pause["id"], pause["owner"], pause["reason"]) == (
        paused.json()["pause_id"],
        acme.operator_name,
        "deploy",
    )
    assert pause["expires_at"] is not None
