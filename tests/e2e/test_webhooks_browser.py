"""Webhook endpoints in real headless Chromium (Debian's), against the real app over HTTP, real PostgreSQL
and a real HTTP receiver: an admin registers an endpoint on the console and reads its secret once; a delivery
the receiver refuses shows on the endpoint's page as failing with its last answer; given up, it is redelivered
from the page and then reads delivered. A viewer sees the page without the buttons."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

from api.app import create_app
from api.server import BackgroundServer
from db.pool import open_pool
from db.stores.notifications import NotificationStore
from domain.models import JobStatus
from runtime.webhooks import WebhookDispatcher
from service.auth import mint_token
from service.exports import Exports
from settings import Settings
from testbed.webhook_receiver import WebhookReceiver
from tests.conftest import require
from tests.e2e.test_console_browser import CHROMIUM, CHROMIUM_FLAGS, CHROMIUM_INSTALLED, Site

pytestmark = [pytest.mark.slow, pytest.mark.browser]
# Set to a path (docs/webhooks.png) to refresh the docs' screenshot of an endpoint's page.
SCREENSHOT = os.environ.get("FENCED_WEBHOOKS_SCREENSHOT")


@pytest.fixture(scope="module")
async def site(api_store, reconciler_store, factory, database) -> AsyncIterator[dict[str, Any]]:
    tenant_id = await factory.tenant("acme")
    destination_id = await factory.destination(tenant_id, name="partner-old")
    admin = await mint_token(database.admin_url, tenant_id=tenant_id, principal="ada.admin", role="admin")
    viewer = await mint_token(database.admin_url, tenant_id=tenant_id, principal="vic.view", role="viewer")
    settings = Settings(temporal_ui_url="http://localhost:8233")
    app = create_app(settings, exports=Exports(api_store, reconciler_store, cancel_lock_timeout="300ms"))
    server = BackgroundServer(app)
    url = await server.start()
    yield {"site": Site(url, tenant_id, destination_id, admin), "viewer": viewer}
    await server.stop()


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    require(CHROMIUM_INSTALLED, "Debian chromium (/usr/bin/chromium)")
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS, headless=True)
        yield b
        await b.close()


async def signed_in(browser, url: str, token: str) -> Any:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    await page.goto(f"{url}/console/login")
    await page.fill("input[name=token]", token)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{url}/console")
    return page


@pytest.fixture(scope="module")
def receiver() -> Any:
    r = WebhookReceiver().start()
    yield r
    r.stop()


async def test_register_watch_a_failure_and_redeliver_from_the_console(
    browser, site, receiver, factory, database
):
    from playwright.async_api import expect

    s: Site = site["site"]
    page = await signed_in(browser, s.url, s.token)
    path = "/hooks/console"
    await page.goto(f"{s.url}/console/webhook-endpoints")
    await page.fill("#new-endpoint input[name=url]", receiver.url(path))
    await page.fill("#new-endpoint input[name=description]", "CRM sync")
    await page.click("#new-endpoint button[type=submit]")

    await expect(page.locator("#new-secret")).to_be_visible()
    secret = await page.locator("#new-secret-value").text_content()
    assert secret and secret.startswith("whsec_")
    receiver.expect(path, secret)
    receiver.answer(path, 500, 500)
    await page.reload()
    assert secret not in await page.content()  # shown once
    await page.click("text=CRM sync")
    endpoint_id = page.url.rsplit("/", 1)[1]

    job, _ = await factory.in_status(
        JobStatus.COMPLETED, job=await factory.queued(s.tenant_id, s.destination_id)
    )
    pool = await open_pool(database.app_url, "exports_dispatcher", max_size=2)
    try:
        dispatcher = WebhookDispatcher(NotificationStore(pool), Settings())
        await dispatcher.dispatch_once()  # 500: retrying
        await page.reload()
        row = page.locator("tr.delivery").first
        await expect(row.locator(".status")).to_have_text("pending")
        await expect(row.locator(".last-answer")).to_have_text("HTTP 500")
        await expect(row).to_contain_text(str(job.id)[:8])

        await factory.admin(  # a day later, still failing: the window's end moves onto the row
            "UPDATE webhook_deliveries SET give_up_at = clock_timestamp(), next_attempt_at = clock_timestamp()"
            " WHERE endpoint_id = %(e)s",
            {"e": endpoint_id},
        )
        await dispatcher.dispatch_once()
        await page.goto(f"{s.url}/console/webhook-endpoints")
        await expect(page.locator("tr.endpoint .count-failed")).to_have_text("1")
        await page.click("tr.endpoint .count-failed a")
        row = page.locator("tr.delivery").first
        await expect(row.locator(".status")).to_have_text("failed")

        await row.locator("button.redeliver").click()
        await expect(page.locator("#webhook-message")).to_contain_text("Redelivery queued")
        await dispatcher.dispatch_once()
        await dispatcher.aclose()
    finally:
        await pool.close()

    await page.goto(f"{s.url}/console/webhook-endpoints/{endpoint_id}")
    row = page.locator("tr.delivery").first
    await expect(row.locator(".status")).to_have_text("delivered")
    await expect(row).to_contain_text("(1 by hand)")
    if SCREENSHOT:
        await page.screenshot(path=SCREENSHOT, full_page=True)
    got = receiver.received(path)
    assert [r.answered for r in got] == [500, 500, 204]
    assert all(r.verified for r in got) and len({r.webhook_id for r in got}) == 1
    await page.context.close()


async def test_a_viewer_reads_the_endpoint_page_without_its_url_path_or_buttons(browser, site, factory):
    from playwright.async_api import expect

    s: Site = site["site"]
    rows = await factory.admin(
        "INSERT INTO webhook_endpoints (tenant_id, url, secret, events, description, created_by)"
        " VALUES (%(t)s, 'https://hooks.example.com/T0KEN/in', %(s)s, ARRAY['export.failed'], 'partner feed',"
        " 'ada.admin') RETURNING id",
        {"t": s.tenant_id, "s": "whsec_" + "B" * 43 + "="},
    )
    page = await signed_in(browser, s.url, site["viewer"])
    await page.goto(f"{s.url}/console/webhook-endpoints/{rows[0]['id']}")

    await expect(page.locator("h1")).to_have_text("partner feed")
    assert "T0KEN" not in await page.content()
    await expect(page.locator("#toggle-endpoint")).to_have_count(0)
    await page.goto(f"{s.url}/console/webhook-endpoints")
    await expect(page.locator("#new-endpoint")).to_have_count(0)
    await page.context.close()
