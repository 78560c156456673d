"""How many exports match, and a list that runs past its bound (issue 26, item 5), over HTTP: counts are exact
per status and in total, for the caller's tenant only and for every role that reads; a count the planner
expects beyond the exact limit is an estimate labelled "about"; a list past its bound answers 503 with
``code`` ``query_timeout`` (the console page says "took longer than ... ms; narrow it") instead of hanging or
showing part of the list, and nothing is left waiting in the database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest

from api.app import create_app
from domain.models import JobStatus
from service.exports import Exports
from settings import Settings
from tests.api.conftest import client_for, make_tenant, sign_in

BOUND_MS = 200


@pytest.fixture(scope="module")
async def counted_tenant(factory, database):
    """A tenant with 3 Queued, 2 Canceled and 1 Completed export, and another tenant with 4 Queued."""
    keys = await make_tenant(factory, database, "counted")
    for status, n in ((JobStatus.QUEUED, 3), (JobStatus.CANCELED, 2), (JobStatus.COMPLETED, 1)):
        for _ in range(n):
            await factory.in_status(status, job=await factory.queued(keys.id, keys.destination_id))
    other = await make_tenant(factory, database, "uncounted")
    for _ in range(4):
        await factory.queued(other.id, other.destination_id)
    return keys, other


def app_with(api_store, reconciler_store, **limits):
    exports = Exports(api_store, reconciler_store, temporal_ui_url="http://ui.test:8233", **limits)
    return create_app(Settings(temporal_ui_url="http://ui.test:8233"), exports=exports)


@pytest.fixture(scope="module")
async def bounded(api_store, reconciler_store) -> AsyncIterator:
    """The app with a short bound on the list's reads."""
    async with client_for(app_with(api_store, reconciler_store, list_timeout_ms=BOUND_MS)) as c:
        yield c


async def test_counts_are_exact_per_status_and_in_total_for_the_callers_tenant_only(client, counted_tenant):
    keys, other = counted_tenant

    r = await client.get("/export-counts", headers=keys.operator)

    assert r.status_code == 200
    body = r.json()
    assert body["matching"] == {"count": 6, "kind": "exact", "exact": True, "text": "6", "note": ""}
    by_status = {s: c["count"] for s, c in body["by_status"].items()}
    assert by_status == {s.value: 0 for s in JobStatus} | {"Queued": 3, "Canceled": 2, "Completed": 1}
    assert all(c["kind"] == "exact" for c in body["by_status"].values())
    assert body["timed_out"] is False

    theirs = (await client.get("/export-counts", headers=other.operator)).json()
    assert theirs["matching"]["count"] == 4 and theirs["by_status"]["Queued"]["count"] == 4


async def test_the_total_counts_the_statuses_asked_for_and_the_chips_count_every_status(
    client, counted_tenant
):
    keys, _ = counted_tenant

    body = (
        await client.get(
            "/export-counts?status=Queued&status=Completed", headers=keys.viewer
        )  # a viewer reads
    ).json()

    assert body["matching"]["count"] == 4
    assert body["by_status"]["Canceled"]["count"] == 2  # under the other filters, not the status filter


async def test_another_tenants_destination_counts_and_lists_like_a_missing_one(client, counted_tenant):
    keys, other = counted_tenant  # the other tenant has 4 Queued exports at its destination
    theirs = f"destination_id={other.destination_id}"
    missing = "destination_id=00000000-0000-4000-8000-000000000000"

    answers = [
        (await client.get(f"/export-counts?{q}", headers=keys.operator)).json() for q in (theirs, missing)
    ]
    listed = [(await client.get(f"/exports?{q}", headers=keys.operator)).json() for q in (theirs, missing)]

    assert answers[0] == answers[1]
    assert answers[0]["matching"]["count"] == 0
    assert listed[0] == listed[1] == {"exports": [], "next": None}


async def test_counts_follow_the_destination_list_and_id_filters(client, factory, database):
    keys = await make_tenant(factory, database, "filtered")
    await factory.queued(keys.id, keys.destination_id)
    elsewhere = await factory.destination(keys.id)
    job = await factory.queued(keys.id, elsewhere, list_name="vip")

    by_destination = (
        await client.get(f"/export-counts?destination_id={elsewhere}", headers=keys.operator)
    ).json()
    by_list = (await client.get("/export-counts?list_name=vip", headers=keys.operator)).json()
    by_id = (await client.get(f"/export-counts?q={str(job.id)[:13]}", headers=keys.operator)).json()

    assert by_destination["matching"]["count"] == by_list["matching"]["count"] == 1
    assert by_id["matching"]["count"] == 1 and by_id["by_status"]["Queued"]["count"] == 1


async def test_a_count_beyond_the_exact_limit_is_the_planners_estimate_labelled_about(
    api_store, reconciler_store, counted_tenant
):
    keys, _ = counted_tenant
    async with client_for(app_with(api_store, reconciler_store, exact_count_limit=0)) as c:
        body = (await c.get("/export-counts", headers=keys.operator)).json()

    assert body["matching"]["kind"] == "estimate" and body["matching"]["exact"] is False
    assert body["matching"]["text"].startswith("about ")
    assert "estimate" in body["matching"]["note"]
    assert all(c["kind"] == "estimate" for c in body["by_status"].values())


async def test_the_console_shows_how_many_match_and_each_status_count(
    api_store, reconciler_store, counted_tenant
):
    keys, _ = counted_tenant
    async with client_for(app_with(api_store, reconciler_store)) as c:
        await sign_in(c, keys)
        page = (await c.get("/console?status=Queued&status=Canceled")).text
    async with client_for(app_with(api_store, reconciler_store, exact_count_limit=0)) as c:
        await sign_in(c, keys)
        estimated = (await c.get("/console")).text

    assert '<span id="match-total" class="count count-exact" data-kind="exact" title="">5</span>' in page
    assert 'data-status="Completed" data-kind="exact" title="">1</span>' in page
    assert 'data-counts-url="/export-counts?status=Queued&amp;status=Canceled"' in page
    # Every match fits on the first page, so the page's own rows count it: exact whatever the limit.
    assert 'id="match-total" class="count count-exact"' in estimated
    assert 'data-status="Queued" data-kind="exact"' in estimated


async def _waiting_on_locks(admin: psycopg.AsyncConnection, holder: int) -> list[tuple]:
    cur = await admin.execute(
        "SELECT pid, query FROM pg_stat_activity WHERE datname = current_database() AND pid <> %(h)s"
        " AND wait_event_type = 'Lock'",
        {"h": holder},
    )
    return await cur.fetchall()


async def test_a_list_past_its_bound_answers_503_query_timeout_and_leaves_nothing_waiting(
    bounded, database, counted_tenant
):
    keys, _ = counted_tenant
    async with await psycopg.AsyncConnection.connect(database.admin_url) as holder:
        await holder.execute("LOCK TABLE export_jobs IN ACCESS EXCLUSIVE MODE")  # no read of it can finish

        listed = await bounded.get("/exports?status=Queued", headers=keys.operator)
        counts = await bounded.get("/export-counts", headers=keys.operator)

        async with await psycopg.AsyncConnection.connect(database.admin_url, autocommit=True) as admin:
            assert await _waiting_on_locks(admin, holder.info.backend_pid) == []
        await holder.rollback()

    assert listed.status_code == 503
    assert listed.headers["retry-after"] == "2"
    body = listed.json()
    assert body["code"] == "query_timeout" and body["timeout_ms"] == BOUND_MS
    assert "took longer than 200 ms" in body["detail"] and "narrow it" in body["detail"]
    assert "exports" not in body  # nothing rather than part of the list
    # Counting past the bound is not an error: what could not be counted or estimated says so.
    assert counts.status_code == 200
    assert counts.json()["timed_out"] is True
    assert counts.json()["matching"] == {
        "count": None,
        "kind": "unknown",
        "exact": False,
        "text": "not counted",
        "note": "Neither counted nor estimated within 200 ms.",
    }
    assert (await bounded.get("/exports?status=Queued", headers=keys.operator)).status_code == 200


async def test_the_console_says_a_filter_took_too_long_instead_of_showing_no_exports(
    api_store, reconciler_store, database, counted_tenant
):
    keys, _ = counted_tenant
    async with client_for(app_with(api_store, reconciler_store, list_timeout_ms=BOUND_MS)) as c:
        await sign_in(c, keys)
        async with await psycopg.AsyncConnection.connect(database.admin_url) as holder:
            await holder.execute("LOCK TABLE export_jobs IN ACCESS EXCLUSIVE MODE")
            page = await c.get("/console?status=Queued")
            rows = await c.get("/console/rows?status=Queued")
            await holder.rollback()

    assert page.status_code == 200 and rows.status_code == 200
    for text in (page.text, rows.text):
        assert 'id="list-too-slow"' in text
        assert "This filter took longer than 200 ms, so no exports are shown: narrow it" in text
        assert "No exports match." not in text
    assert ">not counted</span>" in page.text


async def test_the_openapi_document_says_what_a_list_past_its_bound_answers(client):
    schema = (await client.get("/openapi.json")).json()

    assert "query_timeout" in schema["paths"]["/exports"]["get"]["responses"]["503"]["description"]
    counts = schema["paths"]["/export-counts"]["get"]
    assert counts["operationId"] == "count_exports"
    assert {p["name"] for p in counts["parameters"]} == {"status", "destination_id", "list_name", "q"}
