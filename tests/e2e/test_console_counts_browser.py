"""The export list's counts and bounds in real headless Chromium (issue 26, item 5), against the real app over
HTTP and real PostgreSQL: the page says how many exports match and how many of each status (its chips); a
count too large to take exactly reads "about ..." with its reason, never a capped number; and a filter that
runs past its bound says so in place of the rows, instead of hanging or showing none, until the live
refresh finds the list answering again. The site counts exactly only up to 3 and bounds each read at 300 ms,
so a handful of exports and a held table lock show what ten million would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
import pytest

from api.app import create_app
from api.server import BackgroundServer
from domain.models import JobStatus
from service.auth import mint_token
from service.exports import Exports
from settings import Settings
from tests.conftest import require
from tests.e2e.test_console_browser import CHROMIUM, CHROMIUM_FLAGS, CHROMIUM_INSTALLED

pytestmark = [pytest.mark.slow, pytest.mark.browser]

EXACT_UP_TO = 3
BOUND_MS = 300


@dataclass(frozen=True)
class Site:
    url: str
    tenant_id: UUID
    token: str


@pytest.fixture(scope="module")
async def site(api_store, reconciler_store, factory, database) -> AsyncIterator[Site]:
    tenant_id = await factory.tenant("acme")
    await factory.destination(tenant_id, name="partner-old")
    token = await mint_token(database.admin_url, tenant_id=tenant_id, principal="vic.view", role="viewer")
    exports = Exports(api_store, reconciler_store, list_timeout_ms=BOUND_MS, exact_count_limit=EXACT_UP_TO)
    server = BackgroundServer(create_app(Settings(), exports=exports))
    url = await server.start()
    yield Site(url, tenant_id, token)
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


def chip(page, status: JobStatus):
    return page.locator(f".chip .count[data-status='{status.value}']")


async def test_the_list_says_how_many_match_and_how_many_of_each_status(page, site, factory):
    from playwright.async_api import expect

    destination = await factory.destination(site.tenant_id, name="partner-counted")
    for _ in range(2):
        await factory.queued(site.tenant_id, destination)
    await factory.in_status(JobStatus.CANCELED, job=await factory.queued(site.tenant_id, destination))

    await page.goto(f"{site.url}/console?destination={destination}")

    await expect(page.locator("#match-total")).to_have_text("3")
    await expect(page.locator("#match-noun")).to_have_text("exports match")
    await expect(chip(page, JobStatus.QUEUED)).to_have_text("2")
    await expect(chip(page, JobStatus.CANCELED)).to_have_text("1")
    await expect(chip(page, JobStatus.COMPLETED)).to_have_text("0")
    assert await page.locator("#match-total").get_attribute("data-kind") == "exact"

    await page.check("input[name=status][value=Canceled]")
    await page.click("#filters button[type=submit]")

    await expect(page.locator("#match-total")).to_have_text("1")
    await expect(page.locator("#match-noun")).to_have_text("export matches")
    assert await page.locator("#rows tr[data-export]").count() == 1


async def test_a_count_too_large_to_take_exactly_reads_about_with_its_reason(page, site, factory):
    from playwright.async_api import expect

    destination = await factory.destination(site.tenant_id, name="partner-busy")
    for _ in range(60):  # more than a page: the page's own rows cannot count them
        await factory.queued(site.tenant_id, destination)
    await factory.admin("ANALYZE export_jobs")  # as autovacuum would

    await page.goto(f"{site.url}/console?destination={destination}")

    total = page.locator("#match-total")
    shown = await total.text_content()
    assert shown is not None and shown.startswith(("about ", "more than ")), shown  # never "3", never "60"
    assert await total.get_attribute("data-kind") in ("estimate", "more_than")
    assert "counted" in (await total.get_attribute("title") or "")
    await expect(page.locator("#count-note")).to_have_text(
        "(not exact where counting exactly would take too long: hover a count to see why)"
    )
    queued = chip(page, JobStatus.QUEUED)
    assert (await queued.text_content() or "").startswith(("about ", "more than "))
    assert await page.locator("#rows tr[data-export]").count() == 50
    assert await page.locator("#next-page").count() == 1


async def test_a_filter_past_its_bound_says_so_on_the_page_until_the_list_answers_again(
    page, site, factory, database
):
    from playwright.async_api import expect

    destination = await factory.destination(site.tenant_id, name="partner-slow")
    job = await factory.queued(site.tenant_id, destination)
    async with await psycopg.AsyncConnection.connect(database.admin_url) as holder:
        await holder.execute("LOCK TABLE export_jobs IN ACCESS EXCLUSIVE MODE")  # no read of it can finish

        await page.goto(f"{site.url}/console?destination={destination}")

        too_slow = page.locator("#list-too-slow")
        await expect(too_slow).to_have_text(
            f"This filter took longer than {BOUND_MS} ms, so no exports are shown: narrow it (a status, a"
            " destination, a list, or more of the export ID)."
        )
        assert await page.locator("#rows tr.empty").count() == 0  # not "No exports match."
        await expect(page.locator("#match-total")).to_have_text("not counted")
        await holder.rollback()

    # The live refresh asks again every 2 s, and now the list answers.
    await expect(page.locator(f"#rows tr[data-export='{job.id}']")).to_have_count(1, timeout=10_000)
    await expect(too_slow).to_have_count(0)
