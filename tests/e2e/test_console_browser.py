"""The console in real headless Chromium (Debian's), against the real app over HTTP and real PostgreSQL:
Cancel on a queued export, on a building one, and after cutoff 2 reads the seed's three messages; a Busy
answer keeps the request ID for the retry; each new click is a new request."""

from __future__ import annotations

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
# Set to a path (docs/console.png) to refresh the README's screenshot.
SCREENSHOT = os.environ.get("FENCED_CONSOLE_SCREENSHOT")

pytestmark = pytest.mark.slow


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
    if SCREENSHOT:
        await page.screenshot(path=SCREENSHOT, full_page=True)


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
