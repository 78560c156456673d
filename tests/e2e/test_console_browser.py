"""The console in real headless Chromium (Debian's), against the real app over HTTP and real PostgreSQL:
Cancel on a queued export, on a building one, and after cutoff 2 reads the seed's three messages; a Busy
answer keeps the request ID for the retry; each new click is a new request; Cancel shows only where it can
matter. Sign-in from another origin is refused, the cookie is a session, sign-out ends it. The list filters
by status, destination and list, searches by export ID, pages by keyset, refreshes live, and bulk cancel
confirms how many exports match before it records anything, then cancels exactly those (an export queued
after the review is not touched, and the answer names it)."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from api.app import create_app
from api.server import BackgroundServer
from domain.models import FinishResult, JobStatus, StopPoint
from service.auth import mint_token
from service.exports import Exports
from settings import Settings
from tests.conftest import require

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_INSTALLED = CHROMIUM.exists()
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
# Set to a path (docs/console.png) to refresh the README's screenshot of the list page.
SCREENSHOT = os.environ.get("FENCED_CONSOLE_SCREENSHOT")

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@dataclass(frozen=True)
class Site:
    url: str
    tenant_id: UUID
    destination_id: UUID
    token: str


@pytest.fixture(scope="module")
async def site(api_store, reconciler_store, factory, database) -> AsyncIterator[Site]:
    tenant_id = await factory.tenant("acme")
    destination_id = await factory.destination(tenant_id, name="partner-old")
    token = await mint_token(database.admin_url, tenant_id=tenant_id, principal="sam.ops", role="operator")
    settings = Settings(temporal_ui_url="http://localhost:8233")
    exports = Exports(
        api_store, reconciler_store, temporal_ui_url=settings.temporal_ui_url, cancel_lock_timeout="300ms"
    )
    app = create_app(settings, exports=exports)
    server = BackgroundServer(app)
    url = await server.start()
    yield Site(url, tenant_id, destination_id, token)
    await server.stop()


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    require(CHROMIUM_INSTALLED, "Debian chromium (/usr/bin/chromium)")
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS, headless=True)
        yield browser
        await browser.close()


@pytest.fixture
async def page(browser, site) -> AsyncIterator[Any]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    await page.goto(f"{site.url}/console/login")
    await page.fill("input[name=token]", site.token)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{site.url}/console")
    yield page
    await context.close()


async def open_export(page, site: Site, job_id: UUID) -> None:
    await page.goto(f"{site.url}/console/exports/{job_id}")


async def test_cancel_on_a_queued_export_reads_canceled_while_queued(page, site, factory):
    from playwright.async_api import expect

    job = await factory.queued(site.tenant_id, site.destination_id)
    await open_export(page, site, job.id)

    await page.click("#cancel")

    await expect(page.locator("#message")).to_have_text(
        "Canceled while queued. No attempt had started, and none will."
    )
    assert await factory.status(job.id) == JobStatus.CANCELED


async def test_cancel_on_a_building_export_reads_the_stop_message_and_then_stopped(
    page, site, factory, worker_store
):
    from playwright.async_api import expect

    job, attempt = await factory.running(await factory.queued(site.tenant_id, site.destination_id))
    await open_export(page, site, job.id)

    await page.fill("#reason", "wrong destination")
    await page.click("#cancel")

    message = page.locator("#message")
    await expect(message).to_contain_text("Already started at ")
    await expect(message).to_contain_text("Stop requested")
    assert (
        await worker_store.finish_stopped(job.id, attempt, StopPoint.WHILE_BUILDING) == FinishResult.WRITTEN
    )
    # The page follows the status URL until the attempt records its ending.
    await expect(message).to_contain_text("before delivery was authorized. Nothing was sent.", timeout=15_000)
    await expect(message).to_contain_text("Stopped at ")
    await expect(page.locator("#status")).to_have_text("Stopped")
    await expect(page.locator("#timeline")).to_contain_text("Cancel")


async def test_cancel_after_cutoff_2_reads_too_late(page, site, factory):
    from playwright.async_api import expect

    job, _ = await factory.delivering(await factory.queued(site.tenant_id, site.destination_id))
    await open_export(page, site, job.id)

    await page.click("#cancel")

    await expect(page.locator("#message")).to_contain_text("Too late: delivery was authorized at about ")
    assert await factory.status(job.id) == JobStatus.DELIVERING


async def test_each_click_is_a_new_request_and_a_busy_retry_reuses_its_id(page, site, factory, database):
    from playwright.async_api import expect

    job = await factory.queued(site.tenant_id, site.destination_id)
    await open_export(page, site, job.id)
    message = page.locator("#message")

    async with await psycopg.AsyncConnection.connect(database.admin_url) as holder:
        await holder.execute("SELECT 1 FROM export_jobs WHERE id = %(id)s FOR UPDATE", {"id": job.id})
        await page.click("#cancel")
        await expect(message).to_contain_text("Busy")
        pending = await page.locator("#pending").text_content()
        await holder.rollback()
    busy_id = pending.split("request ")[1].rstrip(".")
    assert await factory.status(job.id) == JobStatus.QUEUED

    await page.click("#cancel")
    await expect(message).to_have_text("Canceled while queued. No attempt had started, and none will.")
    await page.click("#cancel")
    await expect(message).to_contain_text(f"Already canceled by {busy_id}.")

    rows = await factory.admin(
        "SELECT id, outcome FROM cancellation_requests WHERE job_id = %(id)s ORDER BY recorded_at",
        {"id": job.id},
    )
    assert [r["outcome"] for r in rows] == ["CanceledWhileQueued", "AlreadyCanceled"]
    assert rows[0]["id"] == uuid.UUID(busy_id)
    assert rows[1]["id"] != rows[0]["id"]


async def test_the_list_links_each_export_and_the_detail_links_the_temporal_ui(page, site, factory):
    job = await factory.queued(site.tenant_id, site.destination_id)
    await page.goto(f"{site.url}/console")

    await page.click(f"a[href='/console/exports/{job.id}']")

    href = await page.get_attribute("#temporal-link", "href")
    assert href.startswith("http://localhost:8233/namespaces/default/workflows?query=")
    assert str(job.id) in href


# -- sign-in, sessions, sign-out ---------------------------------------------------------------------


async def test_a_sign_in_posted_from_another_origin_is_refused(page, site, factory, database):
    other_tenant = await factory.tenant("globex")
    intruder = await mint_token(database.admin_url, tenant_id=other_tenant, principal="eve", role="operator")
    evil = "http://evil.test/"
    form = (
        f'<form id="f" method="post" action="{site.url}/console/login">'
        f'<input name="token" value="{intruder}"><input name="csrf" value="guess"></form>'
        '<script>document.getElementById("f").submit()</script>'
    )
    await page.route(evil, lambda route: route.fulfill(status=200, content_type="text/html", body=form))

    await page.goto(evil)
    await page.wait_for_url(f"{site.url}/console/login")

    assert "Sign-in refused" in await page.locator(".error").text_content()
    await page.goto(f"{site.url}/console")
    assert "acme" in await page.locator("h1").text_content()  # still signed in as before, not as globex


async def test_a_sign_out_posted_from_another_origin_is_refused_and_the_session_lives_on(page, site, factory):
    session = {c["name"]: c for c in await page.context.cookies()}["fenced_console"]["value"]
    evil = "http://evil.test/"
    form = (
        f'<form id="f" method="post" action="{site.url}/console/logout">'
        '<input name="csrf" value="guess"></form>'
        '<script>document.getElementById("f").submit()</script>'
    )
    await page.route(evil, lambda route: route.fulfill(status=200, content_type="text/html", body=form))

    async with page.expect_response(f"{site.url}/console/logout") as answer:
        await page.goto(evil)
    assert (await answer.value).status == 403
    assert "Sign-out refused" in await page.locator("body").text_content()

    await page.goto(f"{site.url}/console")
    assert page.url == f"{site.url}/console" and "acme" in await page.locator("h1").text_content()
    rows = await factory.admin("SELECT session_sha256 FROM console_sessions")
    assert hashlib.sha256(session.encode()).digest() in [bytes(r["session_sha256"]) for r in rows]


async def test_the_cookie_is_a_session_not_the_token_and_sign_out_ends_it(page, site, factory, browser):
    cookies = {c["name"]: c for c in await page.context.cookies()}
    session = cookies["fenced_console"]
    assert session["value"] != site.token and session["httpOnly"] and session["sameSite"] == "Strict"
    rows = await factory.admin("SELECT session_sha256 FROM console_sessions")
    assert hashlib.sha256(session["value"].encode()).digest() in [bytes(r["session_sha256"]) for r in rows]

    await page.click("header button[type=submit]")  # Sign out
    await page.wait_for_url(f"{site.url}/console/login")

    stolen = await browser.new_context()
    try:
        await stolen.add_cookies([{"name": "fenced_console", "value": session["value"], "url": site.url}])
        other = await stolen.new_page()
        await other.goto(f"{site.url}/console")
        assert other.url == f"{site.url}/console/login"  # the old session ID no longer signs anyone in
    finally:
        await stolen.close()
    rows = await factory.admin("SELECT session_sha256 FROM console_sessions")
    assert hashlib.sha256(session["value"].encode()).digest() not in [
        bytes(r["session_sha256"]) for r in rows
    ]


# -- the list as operators use it ----------------------------------------------------------------------


async def test_cancel_shows_only_where_a_cancel_can_still_matter(page, site, factory):
    cases = {
        JobStatus.QUEUED: True,
        JobStatus.RUNNING: True,
        JobStatus.DELIVERING: True,
        JobStatus.STOPPED: False,
        JobStatus.CANCELED: False,
        JobStatus.COMPLETED: False,
        JobStatus.FAILED: False,
    }
    for status, shown in cases.items():
        job, _ = await factory.in_status(
            status, job=await factory.queued(site.tenant_id, site.destination_id)
        )
        await open_export(page, site, job.id)
        assert await page.locator("#cancel").count() == (1 if shown else 0), status
        assert await page.locator("#no-cancel").count() == (0 if shown else 1), status


async def test_a_running_export_whose_stop_is_requested_shows_no_cancel_and_is_followed_to_its_end(
    page, site, factory, worker_store
):
    from playwright.async_api import expect

    job, attempt = await factory.running(await factory.queued(site.tenant_id, site.destination_id))
    assert (await factory.cancel(job)).outcome.value == "StopRequested"
    await open_export(page, site, job.id)

    assert await page.locator("#cancel").count() == 0
    await expect(page.locator("#no-cancel")).to_contain_text("A stop is already requested")
    assert (
        await worker_store.finish_stopped(job.id, attempt, StopPoint.WHILE_BUILDING) == FinishResult.WRITTEN
    )
    await expect(page.locator("#status")).to_have_text("Stopped", timeout=15_000)  # followed, no reload


async def test_the_list_filters_by_status_destination_and_list_and_searches_by_id(page, site, factory):
    destination = await factory.destination(site.tenant_id, name="partner-filter")
    queued = await factory.queued(site.tenant_id, destination, list_name="vip")
    stopped, _ = await factory.in_status(
        JobStatus.STOPPED, job=await factory.queued(site.tenant_id, destination)
    )
    await page.goto(f"{site.url}/console")

    await page.select_option("#filter-destination", str(destination))
    await page.check("input[name=status][value=Stopped]")
    await page.click("#filters button[type=submit]")
    ids = await page.locator("#rows tr[data-export]").evaluate_all("rows => rows.map(r => r.dataset.export)")
    assert ids == [str(stopped.id)]

    await page.goto(f"{site.url}/console?destination={destination}&list=vip")
    ids = await page.locator("#rows tr[data-export]").evaluate_all("rows => rows.map(r => r.dataset.export)")
    assert ids == [str(queued.id)]

    await page.goto(f"{site.url}/console")
    await page.fill("#search", str(queued.id)[:8])
    await page.press("#search", "Enter")
    ids = await page.locator("#rows tr[data-export]").evaluate_all("rows => rows.map(r => r.dataset.export)")
    assert ids == [str(queued.id)]


async def test_the_list_pages_through_a_large_tenant_without_repeats_or_gaps(page, site, factory):
    destination = await factory.destination(site.tenant_id, name="partner-pages")
    created = {(await factory.queued(site.tenant_id, destination)).id for _ in range(120)}
    await page.goto(f"{site.url}/console?destination={destination}")

    seen: list[str] = []
    for _ in range(5):
        seen += await page.locator("#rows tr[data-export]").evaluate_all(
            "rows => rows.map(r => r.dataset.export)"
        )
        if await page.locator("#next-page").count() == 0:
            break
        await page.click("#next-page")
    assert len(seen) == len(set(seen)) == 120
    assert {uuid.UUID(i) for i in seen} == created


async def test_the_list_refreshes_live_while_exports_move(page, site, factory, worker_store):
    destination = await factory.destination(site.tenant_id, name="partner-live")
    job = await factory.queued(site.tenant_id, destination)
    await page.goto(f"{site.url}/console?destination={destination}")
    row = page.locator(f"#rows tr[data-export='{job.id}'] .status")
    assert await row.text_content() == "Queued"

    await factory.running(job)

    from playwright.async_api import expect

    await expect(row).to_have_text("Running", timeout=10_000)  # no reload: the page polls its rows


async def test_bulk_cancel_from_the_list_confirms_the_count_then_cancels_each(page, site, factory):
    from playwright.async_api import expect

    destination = await factory.destination(site.tenant_id, name="partner-ended")
    jobs = [await factory.queued(site.tenant_id, destination) for _ in range(3)]
    running, _ = await factory.running(await factory.queued(site.tenant_id, destination))
    await page.goto(f"{site.url}/console")

    await page.click("#bulk-details summary")
    await page.select_option("#bulk-destination", str(destination))
    await page.fill("#bulk-reason", "contract ended")
    await page.click("#bulk-review")

    await expect(page.locator("#bulk-count")).to_contain_text(
        "4 live exports of partner-ended match: 3 queued, 1 running"
    )
    assert all([await factory.status(j.id) == JobStatus.QUEUED for j in jobs])  # nothing recorded yet
    await page.click("#bulk-go")

    await expect(page.locator("#bulk-result")).to_have_text(
        "4 live exports matched: 3 canceled while queued, 1 stop requested."
    )
    assert [await factory.status(j.id) for j in jobs] == [JobStatus.CANCELED] * 3
    assert (await factory.job(running.id)).stop_request_id is not None


async def test_bulk_cancel_confirms_the_previewed_set_and_leaves_an_export_queued_after_the_review(
    page, site, factory
):
    from playwright.async_api import expect

    destination = await factory.destination(site.tenant_id, name="partner-confirmed")
    jobs = [await factory.queued(site.tenant_id, destination) for _ in range(2)]
    await page.goto(f"{site.url}/console")
    await page.click("#bulk-details summary")
    await page.select_option("#bulk-destination", str(destination))
    await page.fill("#bulk-reason", "contract ended")
    await page.click("#bulk-review")
    await expect(page.locator("#bulk-count")).to_contain_text("2 live exports of partner-confirmed match")
    await expect(page.locator("#bulk-go")).to_have_text("Cancel 2 exports")

    later = await factory.queued(site.tenant_id, destination)  # queued while the operator reads the count
    await page.click("#bulk-go")

    await expect(page.locator("#bulk-result")).to_have_text(
        "2 live exports matched: 2 canceled while queued."
        f" 1 live export not in the previewed set was not touched: {str(later.id)[:8]}."
    )
    assert [await factory.status(j.id) for j in jobs] == [JobStatus.CANCELED] * 2
    assert await factory.status(later.id) == JobStatus.QUEUED
    requests = await factory.admin(
        "SELECT count(*) AS n FROM cancellation_requests WHERE job_id = %(id)s", {"id": later.id}
    )
    assert requests == [{"n": 0}]


async def test_the_list_page_reads_well(page, site, factory):
    # A tenant with exports in every state an operator meets; the screenshot goes in the README.
    destination = await factory.destination(site.tenant_id, name="partner-new")
    for status in (
        JobStatus.COMPLETED,
        JobStatus.FAILED,
        JobStatus.STOPPED,
        JobStatus.DELIVERING,
        JobStatus.RUNNING,
        JobStatus.QUEUED,
    ):
        await factory.in_status(
            status, job=await factory.queued(site.tenant_id, destination, list_name="newsletter")
        )
    await page.goto(f"{site.url}/console")
    assert await page.locator("#bulk-confirm").is_hidden()
    await page.click("#bulk-details summary")
    await page.select_option("#bulk-destination", str(destination))
    await page.fill("#bulk-reason", "partner-new's contract ended")
    await page.click("#bulk-review")
    from playwright.async_api import expect

    await expect(page.locator("#bulk-count")).to_contain_text("3 live exports of partner-new match")

    assert await page.locator("#banner-slot").count() == 1  # the kill-switch banner's place
    assert await page.locator("#rows tr[data-export]").count() >= 6
    if SCREENSHOT:
        await page.screenshot(path=SCREENSHOT)
