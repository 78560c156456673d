"""The console's recurring exports page in real headless Chromium (Debian's), against the real app over HTTP
and real PostgreSQL: a recurring export is listed with its timing and state, and each of its firings with what
it did: the export it created (a link to it), or skipped and why."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from tests.e2e.test_console_browser import browser, page, site  # noqa: F401 - fixtures, by name

pytestmark = [pytest.mark.slow, pytest.mark.browser]


async def test_the_recurring_page_lists_each_recurring_export_with_its_firings(  # noqa: F811
    page,  # noqa: F811
    site,  # noqa: F811
    factory,
    api_store,
):
    from playwright.async_api import expect

    await factory.principal(site.tenant_id, "ada.admin", role="admin")
    row = await api_store.insert_recurring_export(
        tenant_id=site.tenant_id,
        id=uuid.uuid4(),
        destination_id=site.destination_id,
        list_name="newsletter",
        cron="0 2 * * *",
        interval_seconds=None,
        time_zone="Europe/Berlin",
        starts_at=None,
        ends_at=None,
        paused=False,
        paused_reason=None,
        created_by="ada.admin",
    )
    nominal = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=2)
    fired = {}
    for offset in (0, 1):
        fired[offset] = await api_store.fire_recurring_export(
            tenant_id=site.tenant_id,
            recurring_export_id=row.id,
            nominal_time=nominal + timedelta(minutes=offset),
            fired_by="browser-test",
            late_after_seconds=120,
            catchup_firings=1,
        )

    await page.goto(f"{site.url}/console")
    await page.locator("#nav-recurring").click()
    section = page.locator(f"#recurring-{row.id}")
    await expect(section.locator("h2")).to_contain_text("newsletter → partner-old")
    await expect(section.locator(".recurring-state")).to_have_text("active")
    await expect(section.locator(".recurring-when")).to_contain_text("cron '0 2 * * *' in Europe/Berlin")
    firings = section.locator("tr.firing")
    await expect(firings).to_have_count(2)
    skipped = section.locator("tr.firing-skipped")
    await expect(skipped).to_have_attribute("data-reason", "overlap")
    await expect(skipped.locator(".firing-message")).to_have_text(fired[1].firing.message)
    created = section.locator("tr.firing-created")
    await created.locator("a").click()
    await expect(page).to_have_url(f"{site.url}/console/exports/{fired[0].firing.job_id}")
