"""The reconciler's console in real headless Chromium (Debian's), against the real app over HTTP, real
PostgreSQL and a real SFTP partner (issue 26 item 4).

An export is made OutcomeUnknown by a real interrupted delivery: the worker's own delivery code uploads, fences
and renames, and the partner is lost right after the rename, before the read-back; recovery's re-check then
finds the partner silent. A reconciler finds the export in the queue, reads its evidence, asks for today's
listing (answered by recovery's activity on the partner, which answers again), and reconciles it Completed
from the same page. An operator reads the page without its reconciler's actions and is refused if it posts
one anyway; another tenant's unknown export is neither in the queue nor found."""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from temporalio.testing import ActivityEnvironment

from activities.recovery import RecoveryActivities
from api.app import create_app
from api.server import BackgroundServer
from domain.evidence import FileToDeliver
from domain.models import DeliveryOutcome, EventKind, FenceResult, FinishResult, JobStatus, UnknownToRecheck
from partner.kinds import partner_for
from partner.protocol import DeliveryHooks
from service.auth import mint_token
from service.exports import Exports
from settings import Settings
from testbed.sftp import SftpTarget
from tests.conftest import require
from tests.e2e.test_console_browser import CHROMIUM, CHROMIUM_FLAGS, CHROMIUM_INSTALLED
from workflows.models import RecheckInput

pytestmark = [pytest.mark.slow, pytest.mark.browser]
# Set to a path (docs/reconciliation.png) to refresh the docs' screenshot of an evidence page.
SCREENSHOT = os.environ.get("FENCED_RECONCILIATION_SCREENSHOT")
SIZE = 600_000


@dataclass(frozen=True)
class Site:
    url: str
    tenant_id: UUID
    destination_id: UUID
    tokens: dict[str, str]
    other_tenant: UUID
    other_destination: UUID


@pytest.fixture(scope="module")
async def site(api_store, reconciler_store, factory, database, module_sftp_target) -> AsyncIterator[Site]:
    tenant_id = await factory.tenant("acme")
    destination_id = await factory.destination(tenant_id, **module_sftp_target.destination_row())
    tokens = {
        key: await mint_token(database.admin_url, tenant_id=tenant_id, principal=name, role=role)
        for key, role, name in (
            ("reconciler", "reconciler", "rita.recon"),
            ("operator", "operator", "sam.ops"),
            (
                "second reconciler",
                "reconciler",
                "ron.recon",
            ),  # a correction's second person (issue 26 item 3)
        )
    }
    other = await factory.tenant("globex")
    other_destination = await factory.destination(other)
    settings = Settings(temporal_ui_url="http://localhost:8233")
    app = create_app(settings, exports=Exports(api_store, reconciler_store, cancel_lock_timeout="300ms"))
    server = BackgroundServer(app)
    url = await server.start()
    yield Site(url, tenant_id, destination_id, tokens, other, other_destination)
    await server.stop()


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    require(CHROMIUM_INSTALLED, "Debian chromium (/usr/bin/chromium)")
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS, headless=True)
        yield b
        await b.close()


async def signed_in(browser, site: Site, role: str) -> Any:
    context = await browser.new_context(viewport={"width": 1280, "height": 1000})
    page = await context.new_page()
    await page.goto(f"{site.url}/console/login")
    await page.fill("input[name=token]", site.tokens[role])
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{site.url}/console")
    return page


@pytest.fixture
def recovery(recovery_store) -> RecoveryActivities:
    """Recovery's activities on this test's partner, as a worker runs them."""
    return RecoveryActivities(recovery_store, Settings(recovery_observe_tries=1), partners=partner_for)


async def interrupted_after_the_rename(
    factory, worker_store, target: SftpTarget, site: Site, tmp_path: Path
) -> tuple[Any, UUID, bytes]:
    """A delivery through the worker's own code, its evidence appended as it is observed and its fences
    written as the worker writes them; the partner is lost right after the rename request is answered, and
    stays unreachable, so the read-back never comes: the worker records OutcomeUnknown."""
    data = os.urandom(SIZE)
    sha = hashlib.sha256(data).digest()
    job, attempt = await factory.delivering(
        await factory.queued(site.tenant_id, site.destination_id), size=SIZE, sha256=sha
    )
    destination = await worker_store.load_destination(
        job.tenant_id, job.destination_id, job.destination_version
    )
    local = tmp_path / job.expected_file_name
    local.write_bytes(data)
    loop = asyncio.get_running_loop()

    def on_evidence(item: dict[str, Any]) -> None:
        append = worker_store.append_delivery_evidence(job.id, attempt, "worker-7", item)
        asyncio.run_coroutine_threadsafe(append, loop).result(30)

    def authorize_rename() -> bool:
        fence = worker_store.fence_rename_if_delivering(job.id, attempt)
        return asyncio.run_coroutine_threadsafe(fence, loop).result(30) == FenceResult.FENCED

    def lose_the_partner() -> None:
        target.proxy.refuse_new_connections()
        target.proxy.cut()

    await factory.fence(job.id, attempt, rename=False)  # no byte leaves before the upload fence
    report = await asyncio.to_thread(
        partner_for(destination).deliver,
        destination,
        FileToDeliver(path=local, final_name=job.expected_file_name, size=SIZE, sha256=sha),
        attempt,
        original=None,
        overwrite_agreed=False,
        on_evidence=on_evidence,
        hooks=DeliveryHooks(authorize_rename=authorize_rename, after_rename=lose_the_partner),
    )
    assert report.outcome == DeliveryOutcome.OUTCOME_UNKNOWN, report.summary
    assert (
        await worker_store.finish_delivery(job.id, attempt, report.outcome, None, summary=report.summary)
        == FinishResult.WRITTEN
    )
    return await factory.job(job.id), attempt, data


async def test_a_reconciler_reads_the_evidence_asks_for_todays_listing_and_reconciles_from_the_page(
    browser, site, factory, worker_store, module_sftp_target, recovery, tmp_path
):
    from playwright.async_api import expect

    target: SftpTarget = module_sftp_target
    try:
        job, attempt, data = await interrupted_after_the_rename(factory, worker_store, target, site, tmp_path)
        # Recovery's re-check while the partner is still silent: its listing gets no answer.
        await recovery.recheck(
            UnknownToRecheck(job_id=job.id, attempt_id=attempt), f"recovery:rc/{uuid.uuid4()}"
        )
    finally:
        target.proxy.refuse_new_connections(False)
    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN
    page = await signed_in(browser, site, "reconciler")

    await page.click("#nav-reconciliation")
    row = page.locator(f"#queue tr[data-export='{job.id}']")
    await expect(row.locator(".why")).to_contain_text(
        "OutcomeUnknown: renamed, but the read-back was interrupted"
    )
    await expect(row.locator(".rechecks")).to_contain_text("1, last ")
    await row.locator("a").click()
    await page.wait_for_url(f"{site.url}/console/reconciliation/{job.id}")

    def line(step: str) -> Any:
        return page.locator(f'#evidence tr[data-step="{step}"]')

    await expect(line("baseline listing")).to_contain_text("before the upload the final name was absent")
    await expect(line("upload fence")).to_contain_text("nothing was sent to the partner before this")
    await expect(line("upload")).to_contain_text(f"uploaded {SIZE:,} bytes to the temporary name")
    await expect(line("rename fence")).to_contain_text("the rename request was sent only after this")
    await expect(line("rename")).to_contain_text("the server confirmed the rename to the final name")
    await expect(line("worker's verdict")).to_contain_text(
        "OutcomeUnknown: renamed, but the read-back was interrupted"
    )
    await expect(line("recovery's listing")).to_contain_text("listed the final name: no answer")
    await expect(page.locator("#key-facts")).to_contain_text(
        f"{job.expected_file_name}, {SIZE:,} bytes, SHA-256 {hashlib.sha256(data).hexdigest()}"
    )
    assert "placeholder@factory.test" not in await page.content()  # the list's contact: never evidence

    await page.click("#request-listing")
    await expect(page.locator("#listing-requests .waiting")).to_contain_text("waits for recovery's next run")
    await ActivityEnvironment().run(
        recovery.recheck_unknown_outcomes,
        RecheckInput(recovery_run_id=f"recovery:rc/{uuid.uuid4()}", limit=10),
    )
    # The page follows the waiting request and shows its answer.
    answered = page.locator("#listing-requests .answered")
    await expect(answered).to_contain_text(f"present, {SIZE:,} bytes, the expected size", timeout=15_000)
    await expect(answered).to_contain_text("recovery's rules read it as: Completed")
    await expect(line("today's listing")).to_contain_text("asked by rita.recon")
    if SCREENSHOT:
        await page.screenshot(path=SCREENSHOT, full_page=True)

    await page.check("#reconcile input[value=Completed]")
    await page.fill(
        "#reconcile textarea[name=evidence_summary]",
        f"today's listing shows {SIZE:,} bytes, the expected size",
    )
    await page.click("#reconcile button[type=submit]")
    await expect(page.locator("#action-message")).to_have_text("Reconciled: Completed.")
    await expect(page.locator("#status")).to_have_text("Completed", timeout=15_000)

    after = await factory.job(job.id)
    assert after.status == JobStatus.COMPLETED
    [reconciled] = [e for e in await factory.worker.job_events(job.id) if e.kind == EventKind.RECONCILED]
    assert (reconciled.observed_by, reconciled.attempt_id) == ("rita.recon", attempt)
    assert reconciled.detail == f"Completed: today's listing shows {SIZE:,} bytes, the expected size"
    assert target.files()[job.expected_file_name] == data  # nothing was sent again
    await page.goto(f"{site.url}/console/reconciliation")
    assert await page.locator(f"#queue tr[data-export='{job.id}']").count() == 0
    await page.context.close()


async def test_the_queue_is_oldest_first_with_how_many_wait(browser, site, factory):
    from playwright.async_api import expect

    later = await factory.queued(site.tenant_id, site.destination_id)
    earlier = await factory.queued(site.tenant_id, site.destination_id)
    first, _ = await factory.in_status(JobStatus.OUTCOME_UNKNOWN, job=earlier)
    second, _ = await factory.in_status(JobStatus.OUTCOME_UNKNOWN, job=later)
    page = await signed_in(browser, site, "operator")

    await page.goto(f"{site.url}/console/reconciliation")

    ids = await page.locator("#queue tr[data-export]").evaluate_all("rows => rows.map(r => r.dataset.export)")
    assert ids.index(str(first.id)) < ids.index(str(second.id))  # by when each became unknown
    await expect(page.locator("#queue-count")).to_contain_text(f"{len(ids)} export")
    assert await page.locator("#queue-count").get_attribute("data-kind") == "exact"
    await page.context.close()


async def test_an_operator_reads_the_evidence_without_the_reconcilers_actions_and_is_refused_them(
    browser, site, factory
):
    from playwright.async_api import expect

    job, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(site.tenant_id, site.destination_id)
    )
    page = await signed_in(browser, site, "operator")

    await page.goto(f"{site.url}/console/reconciliation/{job.id}")

    await expect(page.locator("#status")).to_have_text("OutcomeUnknown")
    assert await page.locator("#reconcile").count() == 0
    assert await page.locator("#request-listing").count() == 0
    await expect(page.locator("#no-reconcile")).to_contain_text("Reconciling needs the reconciler role")
    # Posting it anyway, from the page, as a person who edits the page would:
    status = await page.evaluate(
        """async (id) => (await fetch(`/exports/${id}/reconciliation`, {method: "POST",
             headers: {"Content-Type": "application/json", "X-Console-Request": "1"},
             body: JSON.stringify({resolution: "Completed", evidence_summary: "looks fine"})})).status""",
        str(job.id),
    )
    assert status == 403
    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN
    assert EventKind.RECONCILED not in await factory.event_kinds(job.id)
    await page.context.close()


async def test_another_tenants_unknown_export_is_not_in_the_queue_and_looks_missing(browser, site, factory):
    theirs, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(site.other_tenant, site.other_destination)
    )
    page = await signed_in(browser, site, "reconciler")

    await page.goto(f"{site.url}/console/reconciliation")
    assert await page.locator(f"#queue tr[data-export='{theirs.id}']").count() == 0
    found = await page.goto(f"{site.url}/console/reconciliation/{theirs.id}")
    theirs_page = await page.content()
    missing = await page.goto(f"{site.url}/console/reconciliation/{uuid.uuid4()}")

    assert found is not None and missing is not None and found.status == missing.status == 404
    assert theirs_page == await page.content()
    assert str(theirs.id) not in theirs_page
    await page.context.close()


async def test_a_replacement_and_a_correction_request_are_made_from_the_evidence_page(browser, site, factory):
    from playwright.async_api import expect

    unknown, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(site.tenant_id, site.destination_id)
    )
    completed, attempt = await factory.in_status(
        JobStatus.COMPLETED, job=await factory.queued(site.tenant_id, site.destination_id)
    )
    page = await signed_in(browser, site, "reconciler")

    await page.goto(f"{site.url}/console/reconciliation/{unknown.id}")
    await page.fill("#replace input[name=reason]", "the partner lost the file")
    await page.click("#replace button[type=submit]")
    await expect(page.locator("#action-message")).to_contain_text("(Queued)")
    [replacement] = await factory.admin(
        "SELECT id, created_by, replacement_reason FROM export_jobs WHERE replaces_job_id = %(id)s",
        {"id": unknown.id},
    )
    assert (replacement["created_by"], replacement["replacement_reason"]) == (
        "rita.recon",
        "the partner lost the file",
    )
    await expect(page.locator("#action-message")).to_contain_text(str(replacement["id"]))

    await page.goto(f"{site.url}/console/reconciliation/{completed.id}")
    assert await page.locator("#reconcile").count() == 0  # a recorded outcome is corrected, not reconciled
    await page.fill("#correct input[name=evidence_ref]", "TICKET-4")
    await page.fill("#correct input[name=why]", "the partner's listing shows no file")
    await page.click("#correct button[type=submit]")
    # a correction takes two people (issue 26 item 3): it waits, and the export is as it was
    await expect(page.locator("#action-message")).to_contain_text("Waiting for approval")
    await expect(page.locator("#status")).to_have_text("Completed", timeout=15_000)
    await page.context.close()

    second = await signed_in(browser, site, "second reconciler")
    await second.click("#nav-approvals")
    row = second.locator("tr.approval-pending")
    await expect(row.locator(".approval-requester")).to_contain_text("rita.recon")
    await row.locator("button[data-action='approval']").click()
    await expect(second.locator("#approval-message")).to_contain_text("approved by ron.recon")
    await second.goto(f"{site.url}/console/reconciliation/{completed.id}")
    await expect(second.locator("#status")).to_have_text("Failed NotDelivered", timeout=15_000)
    [correction] = await factory.admin(
        "SELECT attempt_id, corrected_by, evidence_ref, why FROM outcome_corrections WHERE job_id = %(id)s",
        {"id": completed.id},
    )
    assert correction == {
        "attempt_id": attempt,
        "corrected_by": "ron.recon",
        "evidence_ref": "TICKET-4",
        "why": "the partner's listing shows no file",
    }
    await second.context.close()
