"""The destination pages in real headless Chromium (Debian's), against the real app over HTTP and real PostgreSQL
(issue #24, item 1): from the console's navigation to the tenant's destinations, then to one destination's page
with its settings (a credential reference shown as "set"), its versions (who, the role, when, why) and each
change's fields before and after; an admin is told how to change it, a viewer is not; an export delivered after
an edit names, on its own page, the destination version cutoff 2 authorized."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import pytest

from api.app import create_app
from api.server import BackgroundServer
from domain.models import AuthorizationResult
from service.auth import Caller, mint_token
from service.destinations import CreateDestination, Destinations, EditDestination
from service.exports import Exports
from settings import Settings
from tests.conftest import require
from tests.db.race import authorize_params
from tests.e2e.test_console_browser import CHROMIUM, CHROMIUM_FLAGS, CHROMIUM_INSTALLED

SECRET_PATH = "/etc/fenced-exports/keys/partner-4411_ed25519"
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPkLLBUVE9SUkdp3lQTifL94fdkAhpAlZBUlQmAzSPsD"

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@dataclass(frozen=True)
class Site:
    url: str
    tenant_id: UUID
    tokens: dict[str, str]


@pytest.fixture(scope="module")
async def site(api_store, reconciler_store, factory, database) -> AsyncIterator[Site]:
    tenant_id = await factory.tenant("acme")
    tokens = {
        role: await mint_token(
            database.admin_url, tenant_id=tenant_id, principal=f"{role[:3]}.{role}@acme", role=role
        )
        for role in ("admin", "viewer")
    }
    settings = Settings(temporal_ui_url="http://localhost:8233")
    exports = Exports(api_store, reconciler_store, temporal_ui_url=settings.temporal_ui_url)
    server = BackgroundServer(create_app(settings, exports=exports))
    url = await server.start()
    yield Site(url, tenant_id, tokens)
    await server.stop()


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    require(CHROMIUM_INSTALLED, "Debian chromium (/usr/bin/chromium)")
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS, headless=True)
        yield browser
        await browser.close()


async def signed_in(browser, site: Site, role: str) -> Any:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    await page.goto(f"{site.url}/console/login")
    await page.fill("input[name=token]", site.tokens[role])
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{site.url}/console")
    return page


async def onboarded(api_store, site: Site) -> UUID:
    """A destination an admin created, then moved to another directory (version 2)."""
    admin = Caller(tenant_id=site.tenant_id, principal="adm.admin@acme", role="admin")
    ops = Destinations(api_store)
    created = await ops.create(
        admin,
        CreateDestination(
            name=f"partner-{uuid.uuid4().hex[:6]}",
            host="sftp.partner.example",
            username="acme-drop",
            host_key=HOST_KEY,
            credential_ref=SECRET_PATH,
            remote_dir="/incoming",
            reason="onboarding",
        ),
        str(uuid.uuid4()),
    )
    destination_id = UUID(created.body["destination"]["id"])
    edited = await ops.edit(
        admin, destination_id, EditDestination(remote_dir="/incoming/v2", reason="new drop folder"), '"1"'
    )
    assert edited.ok, edited.body
    return destination_id


async def test_an_admin_follows_the_console_to_a_destination_its_versions_and_changes(
    browser, site, api_store
):
    from playwright.async_api import expect

    destination_id = await onboarded(api_store, site)
    page = await signed_in(browser, site, "admin")

    await page.click("#nav-destinations")
    await page.click(f"tr[data-destination='{destination_id}'] a")

    await expect(page.locator("#destination-version")).to_have_text("version 2")
    await expect(page.locator("#settings dd[data-field='credential_ref']")).to_have_text("set")
    await expect(page.locator("#settings dd[data-field='remote_dir']")).to_have_text("/incoming/v2")
    await expect(page.locator("#versions tr.version")).to_have_count(2)
    latest = page.locator("#versions tr.version[data-version='2']")
    await expect(latest).to_contain_text("new drop folder")
    await expect(latest).to_contain_text("adm.admin@acme (admin)")
    await expect(latest.locator(".change[data-field='remote_dir']")).to_have_text(
        "remote_dir: /incoming → /incoming/v2"
    )
    await expect(page.locator("main")).to_contain_text("starter.py destination edit")
    assert SECRET_PATH not in await page.content()
    await page.context.close()


async def test_a_viewer_reads_the_same_page_and_is_offered_no_change(browser, site, api_store):
    from playwright.async_api import expect

    destination_id = await onboarded(api_store, site)
    page = await signed_in(browser, site, "viewer")

    await page.goto(f"{site.url}/console/destinations/{destination_id}")

    await expect(page.locator("#versions tr.version")).to_have_count(2)
    await expect(page.locator("main")).not_to_contain_text("starter.py destination edit")
    assert SECRET_PATH not in await page.content()
    await page.context.close()


async def test_an_export_page_names_the_destination_version_cutoff_2_authorized(
    browser, site, api_store, factory, worker_store
):
    from playwright.async_api import expect

    destination_id = await onboarded(api_store, site)
    await factory.switch(
        site.tenant_id, destination_id, enabled=True
    )  # created paused; an operator resumed it
    job, attempt = await factory.running(await factory.queued(site.tenant_id, destination_id))
    params = {**authorize_params(job, attempt), "destination_version": 2}
    del params["lease_seconds"], params["detail"]  # the store binds its own
    assert await worker_store.authorize_delivery_if_running(**params) == AuthorizationResult.AUTHORIZED
    page = await signed_in(browser, site, "viewer")

    await page.goto(f"{site.url}/console/exports/{job.id}")

    await expect(page.locator("#timeline .entry-authorized")).to_contain_text("destination version 2")
    await page.context.close()
