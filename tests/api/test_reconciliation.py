"""The reconciler's console over HTTP (issue 26 item 4): the queue and an export's evidence as JSON, a
reconciler's listing request, the console's pages and its correction request, against the real app and real
PostgreSQL. Every role reads; only a reconciler asks a partner or reconciles; another tenant's export, on every
new route, answers exactly as a missing one; a refusal records nothing."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from api.auth import CONSOLE_HEADER
from domain.models import DeliveryOutcome, FinishResult, JobStatus
from tests.api.conftest import another, approve, sign_in, snapshot

BASELINE_ABSENT = {"observation": "baseline", "present": False, "size": None, "mtime": None, "sha256": None}


async def unknown_with_evidence(factory, worker_store, keys) -> tuple[Any, uuid.UUID]:
    """An OutcomeUnknown reached along the protocol's edges, with the evidence a worker appends when the
    rename's answer is lost: baseline absent, fences, the upload, the rename sent and unanswered."""
    job, attempt = await factory.delivering(await factory.queued(keys.id, keys.destination_id), size=600_000)
    await factory.fence(job.id, attempt, rename=False)
    for item in (
        {
            "observation": "connect",
            "result": "ok",
            "host_key": "SHA256:abc",
            "cipher": "aes128-gcm@openssh.com",
        },
        {**BASELINE_ABSENT, "final_name": job.expected_file_name},
        {
            "observation": "upload",
            "result": "ok",
            "temp_name": f".partial-{attempt}",
            "bytes_sent": 600_000,
            "remote_size": 600_000,
        },
    ):
        await worker_store.append_delivery_evidence(job.id, attempt, "worker-3", item)
    assert await worker_store.fence_rename_if_delivering(job.id, attempt)
    for item in (
        {"observation": "rename", "form": "rename", "result": "no_answer", "error": "EOFError"},
        {
            "observation": "interrupted",
            "phase": "settle_rename",
            "rename_sent": True,
            "error": "ConnectRefused",
        },
        {
            "observation": "outcome",
            "outcome": "OutcomeUnknown",
            "failure_code": None,
            "summary": "rename sent but its answer never came",
            "rename_sent": True,
        },
    ):
        await worker_store.append_delivery_evidence(job.id, attempt, "worker-3", item)
    assert (
        await worker_store.finish_delivery(
            job.id, attempt, DeliveryOutcome.OUTCOME_UNKNOWN, summary="rename sent but its answer never came"
        )
        == FinishResult.WRITTEN
    )
    return await factory.job(job.id), attempt


# -- the queue ---------------------------------------------------------------------------------------------


async def test_every_role_reads_the_queue_oldest_first_and_another_tenants_is_not_in_it(
    client, factory, worker_store, acme, globex
):
    first, _ = await unknown_with_evidence(factory, worker_store, acme)
    second, _ = await unknown_with_evidence(factory, worker_store, acme)
    theirs, _ = await unknown_with_evidence(factory, worker_store, globex)

    for role in ("viewer", "operator", "reconciler", "admin"):
        r = await client.get("/reconciliation-queue", headers=getattr(acme, role))
        assert r.status_code == 200, r.text
        body = r.json()
        ids = [e["export"]["id"] for e in body["exports"]]
        assert ids.index(str(first.id)) < ids.index(str(second.id))
        assert str(theirs.id) not in ids
        assert body["count"]["kind"] == "exact" and body["count"]["value"] == len(ids)
    entry = next(e for e in body["exports"] if e["export"]["id"] == str(first.id))
    assert entry["why"] == "OutcomeUnknown: rename sent but its answer never came"
    assert entry["links"]["console"] == f"/console/reconciliation/{first.id}"


async def test_the_queue_pages_by_cursor_and_refuses_one_it_did_not_give(
    client, factory, worker_store, globex
):
    made = [(await unknown_with_evidence(factory, worker_store, globex))[0].id for _ in range(3)]
    seen: list[str] = []
    after = None
    while True:
        r = await client.get(
            "/reconciliation-queue",
            params={"limit": 2, **({"after": after} if after else {})},
            headers=globex.viewer,
        )
        assert r.status_code == 200
        seen += [e["export"]["id"] for e in r.json()["exports"]]
        after = r.json()["next"]
        if after is None:
            break
    assert [s for s in seen if uuid.UUID(s) in made] == [str(m) for m in made]
    assert len(seen) == len(set(seen))

    assert (
        await client.get("/reconciliation-queue", params={"after": "x"}, headers=globex.viewer)
    ).status_code in (
        400,
        422,
    )


# -- the evidence ------------------------------------------------------------------------------------------


async def test_the_evidence_reads_the_attempts_records_in_order_with_codes_and_sizes_only(
    client, factory, worker_store, acme
):
    job, attempt = await unknown_with_evidence(factory, worker_store, acme)

    r = await client.get(f"/exports/{job.id}/evidence", headers=acme.viewer)

    assert r.status_code == 200, r.text
    body = r.json()
    assert body["attempt_id"] == str(attempt)
    steps = [line["step"] for line in body["evidence"]]
    assert steps == [
        "what was sent",
        "upload fence",
        "session",
        "baseline listing",
        "upload",
        "rename fence",
        "rename",
        "interrupted",
        "worker's verdict",
        "recorded",
    ]
    says = {line["step"]: line["says"] for line in body["evidence"]}
    assert says["baseline listing"] == "before the upload the final name was absent"
    assert says["rename"] == "the rename was sent and its answer never came (EOFError)"
    assert says["rename fence"].endswith(": the rename request was sent only after this")
    facts = dict((f["fact"], f["value"]) for f in body["key_facts"])
    assert facts["what was sent"].startswith(f"{job.expected_file_name}, 600,000 bytes, SHA-256 {'01' * 32}")
    assert facts["rename fence"].endswith("the rename request may have been sent")
    assert body["actions"] == {
        "reconcile": False,
        "request_listing": False,
        "replace": False,
        "request_correction": False,
    }  # a viewer reads
    for_reconciler = (await client.get(f"/exports/{job.id}/evidence", headers=acme.reconciler)).json()
    assert for_reconciler["actions"] == {
        "reconcile": True,
        "request_listing": True,
        "replace": True,
        "request_correction": False,
    }
    assert "placeholder@factory.test" not in r.text  # the list's contact: never in the evidence


async def test_an_export_never_authorized_has_no_evidence_to_read(client, factory, acme):
    job = await factory.queued(acme.id, acme.destination_id)
    body = (await client.get(f"/exports/{job.id}/evidence", headers=acme.operator)).json()
    assert body["evidence"] == [] and body["key_facts"] == [
        {"fact": "delivery", "value": "never authorized: nothing was sent"}
    ]


# -- today's listing ---------------------------------------------------------------------------------------


async def test_a_reconciler_asks_for_todays_listing_once_at_a_time(client, factory, worker_store, acme):
    job, _ = await unknown_with_evidence(factory, worker_store, acme)

    asked = await client.post(f"/exports/{job.id}/listing-requests", headers=acme.reconciler)
    again = await client.post(f"/exports/{job.id}/listing-requests", headers=acme.reconciler)

    assert asked.status_code == 202, asked.text
    assert asked.headers["Location"] == f"/exports/{job.id}/evidence"
    assert "recovery's next run" in asked.json()["message"]
    assert again.status_code == 409
    assert again.json()["detail"].startswith(f"a listing asked by {acme.reconciler_name} at ")
    [waiting] = (await client.get(f"/exports/{job.id}/evidence", headers=acme.viewer)).json()[
        "listing_requests"
    ]
    assert (waiting["request_id"], waiting["waiting"], waiting["answer"]) == (
        asked.json()["request_id"],
        True,
        None,
    )


@pytest.mark.parametrize("role", ["viewer", "operator", "admin"])
async def test_only_a_reconciler_asks_a_partner_for_a_listing_and_a_refusal_records_nothing(
    client, factory, worker_store, acme, role
):
    job, _ = await unknown_with_evidence(factory, worker_store, acme)
    before = await snapshot(factory, job.id)

    r = await client.post(f"/exports/{job.id}/listing-requests", headers=getattr(acme, role))

    assert r.status_code == 403
    assert "reconciler role" in r.json()["detail"]
    assert await listing_requests(factory, job.id) == 0
    assert await snapshot(factory, job.id) == before


async def test_no_listing_is_asked_of_a_paused_partner_nor_for_a_settled_export(
    client, factory, worker_store, acme
):
    job, _ = await unknown_with_evidence(factory, worker_store, acme)
    completed, _ = await factory.in_status(
        JobStatus.COMPLETED, job=await factory.queued(acme.id, acme.destination_id)
    )
    r = await client.post(f"/exports/{completed.id}/listing-requests", headers=acme.reconciler)
    assert r.status_code == 409 and "Completed" in r.json()["detail"]

    await factory.switch(acme.id, acme.destination_id, enabled=False)
    try:
        paused = await client.post(f"/exports/{job.id}/listing-requests", headers=acme.reconciler)
    finally:
        await factory.switch(acme.id, acme.destination_id, enabled=True)
    assert paused.status_code == 409 and "paused" in paused.json()["detail"]
    assert await listing_requests(factory, job.id) == await listing_requests(factory, completed.id) == 0


async def listing_requests(factory, job_id) -> int:
    rows = await factory.admin(
        "SELECT count(*) AS n FROM listing_requests WHERE job_id = %(id)s", {"id": job_id}
    )
    return rows[0]["n"]


# -- isolation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/exports/{id}/evidence"), ("POST", "/exports/{id}/listing-requests")],
)
async def test_another_tenants_unknown_export_looks_exactly_like_a_missing_one(
    client, factory, worker_store, acme, globex, method, path
):
    theirs, _ = await unknown_with_evidence(factory, worker_store, globex)
    before = await snapshot(factory, theirs.id)

    r_theirs = await client.request(method, path.format(id=theirs.id), headers=acme.reconciler)
    r_absent = await client.request(method, path.format(id=uuid.uuid4()), headers=acme.reconciler)

    assert r_theirs.status_code == r_absent.status_code == 404
    assert r_theirs.json() == r_absent.json()
    assert await snapshot(factory, theirs.id) == before
    assert await listing_requests(factory, theirs.id) == 0


async def test_the_console_shows_another_tenants_evidence_page_as_not_found(
    client, factory, worker_store, acme, globex
):
    theirs, _ = await unknown_with_evidence(factory, worker_store, globex)
    await sign_in(client, acme, "reconciler")
    try:
        page = await client.get(f"/console/reconciliation/{theirs.id}")
        absent = await client.get(f"/console/reconciliation/{uuid.uuid4()}")
        queue = await client.get("/console/reconciliation")
        correction = await client.post(
            f"/console/reconciliation/{theirs.id}/correction",
            json=correction_body("Completed"),
            headers={CONSOLE_HEADER: "1"},
        )
        missing = await client.post(
            f"/console/reconciliation/{uuid.uuid4()}/correction",
            json=correction_body("Completed"),
            headers={CONSOLE_HEADER: "1"},
        )
    finally:
        client.cookies.clear()

    assert page.status_code == absent.status_code == 404
    assert page.text == absent.text
    assert str(theirs.id) not in queue.text and str(theirs.id)[:8] not in queue.text
    assert correction.status_code == missing.status_code == 404
    assert correction.json() == missing.json()


# -- the console's correction request ----------------------------------------------------------------------


def correction_body(recorded: str) -> dict[str, Any]:
    failed = recorded == "Completed"
    return {
        "recorded_status": recorded,
        "corrected_status": "Failed" if failed else "Completed",
        "failure_reason": "NotDelivered" if failed else None,
        "evidence_ref": "TICKET-26",
        "why": "the partner found no file",
    }


async def test_a_correction_request_from_the_console_needs_the_console_and_a_reconciler(
    client, factory, database, acme
):
    job, _ = await factory.in_status(
        JobStatus.COMPLETED, job=await factory.queued(acme.id, acme.destination_id)
    )
    path = f"/console/reconciliation/{job.id}/correction"

    await sign_in(client, acme, "operator")
    try:
        by_operator = await client.post(
            path, json=correction_body("Completed"), headers={CONSOLE_HEADER: "1"}
        )
    finally:
        client.cookies.clear()
    await sign_in(client, acme, "reconciler")
    try:
        forged = await client.post(path, json=correction_body("Completed"))  # a cross-site form has no header
        done = await client.post(path, json=correction_body("Completed"), headers={CONSOLE_HEADER: "1"})
    finally:
        client.cookies.clear()

    assert by_operator.status_code == 403 and forged.status_code == 403
    # a correction takes two people (issue 26 item 3): the request waits for another reconciler's approval
    assert done.status_code == 202, done.text
    assert done.json()["approval"]["parameters"]["body"]["evidence_ref"] == "TICKET-26"
    assert (await factory.job(job.id)).status == JobStatus.COMPLETED
    approved = await approve(client, done, await another(database, acme, "reconciler", name="ron.recon@acme"))
    assert approved.status_code == 200, approved.text
    now = await factory.job(job.id)
    assert (now.status, now.failure_reason) == (JobStatus.FAILED, "NotDelivered")
    rows = await factory.admin(
        "SELECT corrected_by, evidence_ref FROM outcome_corrections WHERE job_id = %(id)s", {"id": job.id}
    )
    assert rows == [{"corrected_by": "ron.recon@acme", "evidence_ref": "TICKET-26"}]


async def test_the_console_pages_offer_what_the_role_may_do(client, factory, worker_store, acme):
    job, _ = await unknown_with_evidence(factory, worker_store, acme)
    offered: dict[str, dict[str, bool]] = {}
    for role in ("viewer", "operator", "reconciler"):
        await sign_in(client, acme, role)
        try:
            queue = await client.get("/console/reconciliation")
            page = await client.get(f"/console/reconciliation/{job.id}")
        finally:
            client.cookies.clear()
        assert queue.status_code == page.status_code == 200
        assert f'href="/console/reconciliation/{job.id}"' in queue.text
        offered[role] = {
            form: f'id="{form}"' in page.text
            for form in ("reconcile", "request-listing", "replace", "correct")
        }
        assert "before the upload the final name was absent" in page.text
    assert offered == {
        "viewer": {"reconcile": False, "request-listing": False, "replace": False, "correct": False},
        "operator": {"reconcile": False, "request-listing": False, "replace": True, "correct": False},
        "reconciler": {"reconcile": True, "request-listing": True, "replace": True, "correct": False},
    }


async def test_the_queue_past_its_bound_says_so_on_the_api_and_the_page(client, acme, database):
    # 26.5 for the reconciler's queue: a read past its bound answers 503 query_timeout, and the page says
    # so instead of its rows, never hangs or shows a silent part of the queue.
    from tests.api.conftest import sign_in

    async with await psycopg.AsyncConnection.connect(database.admin_url) as holder:
        await holder.execute("LOCK TABLE export_jobs IN ACCESS EXCLUSIVE MODE")  # no read of it can finish
        answered = await client.get("/reconciliation-queue", headers=acme.reconciler)
        await sign_in(client, acme, as_role="reconciler")
        page = await client.get("/console/reconciliation")
        client.cookies.clear()
        await holder.rollback()

    assert answered.status_code == 503
    assert (
        answered.json()["code"] == "query_timeout" and "took longer than 250 ms" in answered.json()["detail"]
    )
    assert page.status_code == 200 and 'id="queue-timed-out"' in page.text and 'id="queue"' not in page.text
    assert (await client.get("/reconciliation-queue", headers=acme.reconciler)).status_code == 200
