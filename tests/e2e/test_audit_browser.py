"""The ledger of operator actions and the approvals in real headless Chromium (Debian's), against the real app
over HTTP and real PostgreSQL (issue #26, items 2 and 3): an admin asks to move a destination to another host,
which waits for a second admin; the second admin finds it from the console's navigation and approves it with
the page's button; the operator-actions page then shows both steps, naming both people, filters by action,
pages to older rows and offers the filtered ledger as JSON Lines. The requester is offered no button for their
own request, and a viewer is shown neither the ledger nor a button."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import pytest

from api.app import create_app
from api.server import BackgroundServer
from service.auth import Caller, mint_token
from service.destinations import Destinations, EditDestination
from service.exports import Exports
from service.switches import Operator, Switches, TenantSwitch
from settings import Settings
from tests.conftest import require
from tests.e2e.test_console_browser import CHROMIUM, CHROMIUM_FLAGS, CHROMIUM_INSTALLED

pytestmark = [pytest.mark.slow, pytest.mark.browser]

PEOPLE = {"ada": "admin", "ann": "admin", "vic": "viewer", "sam": "operator"}


@dataclass(frozen=True)
class Site:
    url: str
    tenant_id: UUID
    destination_id: UUID
    tokens: dict[str, str]
    exports: Exports


@pytest.fixture(scope="module")
async def site(api_store, reconciler_store, factory, database) -> AsyncIterator[Site]:
    tenant_id = await factory.tenant("acme")
    destination_id = await factory.destination(tenant_id, name="partner-old")
    tokens = {
        name: await mint_token(database.admin_url, tenant_id=tenant_id, principal=f"{name}@acme", role=role)  # type: ignore[arg-type]
        for name, role in PEOPLE.items()
    }
    settings = Settings(temporal_ui_url="http://localhost:8233")
    exports = Exports(api_store, reconciler_store, temporal_ui_url=settings.temporal_ui_url)
    server = BackgroundServer(create_app(settings, exports=exports))
    url = await server.start()
    yield Site(url, tenant_id, destination_id, tokens, exports)
    await server.stop()


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    require(CHROMIUM_INSTALLED, "Debian chromium (/usr/bin/chromium)")
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS, headless=True)
        yield browser
        await browser.close()


async def signed_in(browser, site: Site, name: str) -> Any:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    await page.goto(f"{site.url}/console/login")
    await page.fill("input[name=token]", site.tokens[name])
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{site.url}/console")
    return page


async def ask_to_move(site: Site) -> str:
    """ada asks to move the destination to another host: a change that waits for a second admin."""
    ada = Caller(tenant_id=site.tenant_id, principal="ada@acme", role="admin")
    asked = await Destinations(site.exports.store, approvals=site.exports.approvals).edit(
        ada, site.destination_id, EditDestination(host="sftp.moved.example", reason="the partner moved"), "*"
    )
    assert asked.body.get("approval"), asked.body
    return str(asked.body["approval"]["id"])


async def test_a_second_admin_approves_from_the_console_and_the_ledger_names_both(browser, site, factory):
    from playwright.async_api import expect

    approval = await ask_to_move(site)

    # the requester sees it waiting, with no button of their own to press
    ada = await signed_in(browser, site, "ada")
    await ada.click("#nav-approvals")
    row = ada.locator(f"tr.approval[data-id='{approval}']")
    await expect(row.locator(".approval-state")).to_have_text("pending")
    await expect(row.locator("button.approval-action")).to_have_count(0)
    await ada.context.close()

    ann = await signed_in(browser, site, "ann")
    await ann.click("#nav-approvals")
    row = ann.locator(f"tr.approval[data-id='{approval}']")
    await expect(row).to_contain_text("changing a destination's host, credentials or encryption keys")
    await expect(row.locator(".approval-requester")).to_contain_text("ada@acme")
    await row.locator("input.approval-reason").fill("confirmed with the partner by phone")
    await row.locator("button[data-action='approval']").click()
    await expect(ann.locator("#approval-message")).to_contain_text("Destination partner-old is at version 2.")
    await expect(ann.locator(f"tr.approval[data-id='{approval}'] .approval-state")).to_contain_text(
        "approved by ann@acme (done)", timeout=10_000
    )
    [moved] = await factory.admin(
        "SELECT host FROM destinations WHERE id = %(d)s", {"d": site.destination_id}
    )
    assert moved["host"] == "sftp.moved.example"

    await ann.click("#nav-audit")
    rows = ann.locator("#audit tr.audit-row[data-action='destination.edit']")
    await expect(rows).to_have_count(2)
    ran, asked = rows.nth(0), rows.nth(1)  # newest first
    await expect(ran.locator(".audit-who")).to_contain_text("ann@acme")
    await expect(ran.locator(".audit-second")).to_have_text("asked by ada@acme")
    await expect(ran.locator(".audit-outcome")).to_contain_text("done")
    await expect(asked.locator(".audit-who")).to_contain_text("ada@acme")
    await expect(asked.locator(".audit-outcome")).to_contain_text("accepted")
    await expect(asked.locator(".audit-reason")).to_have_text("the partner moved")

    # filtered by action: only those rows, and the JSON Lines of the same filter
    await ann.select_option("select[name=action]", "destination.edit")
    await ann.click("#audit-filters button[type=submit]")
    await expect(ann.locator("#audit tr.audit-row")).to_have_count(2)
    export = ann.locator("#audit-export")
    await expect(export).to_have_attribute("href", "/audit.jsonl?action=destination.edit")
    lines = (
        await (await ann.request.get(f"{site.url}/audit.jsonl?action=destination.edit")).text()
    ).splitlines()
    assert [json.loads(line)["principal"] for line in lines] == ["ann@acme", "ada@acme"]
    await ann.context.close()


async def test_the_ledger_pages_to_older_rows(browser, site):
    from playwright.async_api import expect

    sam = Caller(tenant_id=site.tenant_id, principal="sam@acme", role="operator")
    switches = Switches(site.exports.store, approvals=site.exports.approvals)
    operator = Operator(principal=sam.principal, tenant_id=sam.tenant_id, role=sam.role)
    for n in range(55):  # the console's page holds 50
        await switches.pause(operator, TenantSwitch(scope="tenant", reason=f"pause number {n}"))

    ann = await signed_in(browser, site, "ann")
    await ann.goto(f"{site.url}/console/audit?action=pause")
    await expect(ann.locator("#audit tr.audit-row")).to_have_count(50)
    await expect(ann.locator("#audit tr.audit-row").first.locator(".audit-reason")).to_have_text(
        "pause number 54"
    )
    await ann.click("#audit-next")
    await expect(ann.locator("#audit tr.audit-row")).to_have_count(5)
    await expect(ann.locator("#audit tr.audit-row").last.locator(".audit-reason")).to_have_text(
        "pause number 0"
    )
    await ann.click("#audit-first")
    await expect(ann.locator("#audit tr.audit-row")).to_have_count(50)
    await ann.context.close()


async def test_a_viewer_is_shown_neither_the_ledger_nor_a_button(browser, site):
    from playwright.async_api import expect

    await ask_to_move_destination_name(site)
    vic = await signed_in(browser, site, "vic")
    await vic.click("#nav-audit")
    await expect(vic.locator("#audit-refused")).to_contain_text("the viewer role may not read the ledger")
    await expect(vic.locator("#audit")).to_have_count(0)
    await vic.click("#nav-approvals")
    await expect(vic.locator("tr.approval").first).to_be_visible()
    await expect(vic.locator("button.approval-action")).to_have_count(0)
    await vic.context.close()


async def ask_to_move_destination_name(site: Site) -> None:
    """Something waiting for a second person (a new port for the destination)."""
    ada = Caller(tenant_id=site.tenant_id, principal="ada@acme", role="admin")
    asked = await Destinations(site.exports.store, approvals=site.exports.approvals).edit(
        ada,
        site.destination_id,
        EditDestination(port=2222, reason=f"the partner's new port {uuid.uuid4().hex[:4]}"),
        "*",
    )
    assert asked.kind.value == "accepted", asked.body


async def test_resuming_anothers_pause_from_the_switches_page_asks_for_a_second_person(
    browser, site, factory
):
    from playwright.async_api import expect

    sam = Operator(principal="sam@acme", tenant_id=site.tenant_id, role="operator")
    paused = await Switches(site.exports.store, approvals=site.exports.approvals).pause(
        sam, TenantSwitch(scope="tenant", reason="partner compromised")
    )
    pause_id = paused.body["pause_id"]

    ann = await signed_in(browser, site, "ann")
    await ann.click("#nav-switches")
    row = ann.locator(f"tr.pause[data-pause='{pause_id}']")
    await expect(row.locator(".pause-owner")).to_have_text("sam@acme")
    await expect(row.locator("button.switch-action")).to_have_text("Ask to resume")
    await row.locator("input.switch-reason").fill("the partner rotated its keys")
    await row.locator("button.switch-action").click()
    await expect(ann.locator("#switch-message")).to_contain_text("Waiting for approval")
    [waiting] = await factory.admin(
        "SELECT requested_by, decision FROM approvals WHERE subject_id = %(p)s", {"p": pause_id}
    )
    assert waiting == {"requested_by": "ann@acme", "decision": None}
    [still] = await factory.admin("SELECT released_at FROM delivery_pauses WHERE id = %(p)s", {"p": pause_id})
    assert still["released_at"] is None
    await ann.context.close()
