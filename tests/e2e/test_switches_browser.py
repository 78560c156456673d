"""The delivery switches in real headless Chromium (Debian's), against the real app over HTTP and real
PostgreSQL: the switches page pauses a destination with a reason, the list page then shows the banner, and
Resume takes it away; the switch rows and their history say who did it and why."""

from __future__ import annotations

import pytest

from tests.e2e.test_console_browser import browser, page, site  # noqa: F401 - fixtures, by name

pytestmark = [pytest.mark.slow, pytest.mark.browser]


async def test_pause_from_the_switches_page_shows_the_banner_and_resume_removes_it(page, site, factory):  # noqa: F811
    from playwright.async_api import expect

    await page.goto(f"{site.url}/console")
    await expect(page.locator("#switch-banner")).to_have_count(0)

    await page.goto(f"{site.url}/console/switches")
    row = page.locator(f"tr[data-destination='{site.destination_id}']")
    await expect(row.locator(".switch-state")).to_have_text("enabled")
    await row.locator("input.switch-reason").fill("partner incident")
    await row.locator("button.switch-action").click()

    await expect(page.locator("#switch-message")).to_contain_text(
        "Paused deliveries to partner-old: partner incident."
    )
    await expect(row.locator(".switch-state")).to_have_text("paused", timeout=10_000)  # after the reload

    await page.goto(f"{site.url}/console")
    banner = page.locator("#switch-banner")
    await expect(banner).to_contain_text("Deliveries to partner-old are paused since ")
    await expect(banner).to_contain_text("by sam.ops: partner incident")

    await banner.locator("a").click()
    row = page.locator(f"tr[data-destination='{site.destination_id}']")
    await row.locator("input.switch-reason").fill("fixed")
    await row.locator("button.switch-action").click()
    await expect(page.locator("#switch-message")).to_contain_text("Resumed deliveries to partner-old: fixed.")

    await page.goto(f"{site.url}/console")
    await expect(page.locator("#switch-banner")).to_have_count(0)
    history = await factory.admin(
        "SELECT enabled, changed_by, reason FROM delivery_switch_changes WHERE destination_id = %(d)s"
        " AND changed_by = 'sam.ops' ORDER BY id",
        {"d": site.destination_id},
    )
    assert history == [
        {"enabled": False, "changed_by": "sam.ops", "reason": "partner incident"},
        {"enabled": True, "changed_by": "sam.ops", "reason": "fixed"},
    ]


async def test_a_pause_without_a_reason_is_not_sent(page, site, factory):  # noqa: F811
    from playwright.async_api import expect

    await page.goto(f"{site.url}/console/switches")
    row = page.locator("tr[data-scope='tenant']")
    await row.locator("button.switch-action").click()
    await expect(page.locator("#switch-message")).to_have_text(
        "Give a reason: it is recorded with the change."
    )
    rows = await factory.admin(
        "SELECT enabled FROM delivery_switches WHERE scope = 'tenant' AND tenant_id = %(t)s",
        {"t": site.tenant_id},
    )
    assert rows == [{"enabled": True}]
