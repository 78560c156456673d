"""One ledger of operator actions over HTTP and the command line (issue #26, item 2).

Every control-plane action is a row, with who, the role, when, what, why, the request ID, the outcome and the
subject before and after without secrets; a refusal (403, 404, 409) too; a Busy (nothing decided) and an
export's own way to its outcome (the hot path) never. ``GET /audit`` (admins and reconcilers) pages it by
keyset with filters; ``GET /audit.jsonl`` streams the filtered ledger as JSON Lines."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest

from db.admin import revoke_principal, revoke_tokens, upsert_principal
from domain.models import JobStatus
from service import audit as audit_service
from service.auth import mint_token
from tests.api.conftest import another, approve, cancel_body, make_tenant
from tests.api.test_destinations import HOST_KEY
from tests.api.test_starter import starter


async def ledger(factory, tenant, **where: Any) -> list[dict[str, Any]]:
    """The tenant's ledger rows, oldest first (read as the superuser), optionally narrowed by column."""
    rows = await factory.admin(
        "SELECT * FROM operator_actions WHERE tenant_id = %(t)s ORDER BY id", {"t": tenant}
    )
    return [r for r in rows if all(r[k] == v for k, v in where.items())]


async def last(factory, tenant) -> dict[str, Any]:
    return (await ledger(factory, tenant))[-1]


@pytest.fixture(scope="module")
async def acme(factory, database):
    return await make_tenant(factory, database, "acme-audit")


# -- what is recorded -------------------------------------------------------------------------------------


async def test_a_cancel_is_recorded_with_who_the_role_why_the_request_and_its_outcome(client, factory, acme):
    job = await factory.queued(acme.id, acme.destination_id)

    r = await client.post(
        f"/exports/{job.id}/cancellations",
        json=cancel_body(reason="wrong list"),
        headers={**acme.operator, "X-Request-ID": "ticket-4711-cancel"},
    )

    assert r.status_code == 200 and r.headers["X-Request-ID"] == "ticket-4711-cancel"
    row = await last(factory, acme.id)
    assert (row["principal"], row["role"], row["action"], row["subject_kind"], row["subject_id"]) == (
        acme.operator_name,
        "operator",
        "cancel",
        "export",
        str(job.id),
    )
    assert (row["request_id"], row["reason"], row["outcome"], row["detail"]) == (
        "ticket-4711-cancel",
        "wrong list",
        "done",
        "CanceledWhileQueued",
    )
    assert row["before"] == {"status": "Queued", "attempt_id": None}
    assert row["after"]["outcome"] == "CanceledWhileQueued"


async def test_a_refusal_is_recorded_with_its_outcome_and_changes_nothing_else(client, factory, acme):
    unknown, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(acme.id, acme.destination_id)
    )
    delivering, _ = await factory.delivering(await factory.queued(acme.id, acme.destination_id))

    forbidden = await client.post(
        f"/exports/{unknown.id}/reconciliation",
        json={"resolution": "Completed", "evidence_summary": "trust me"},
        headers=acme.operator,
    )
    missing = await client.post(
        f"/exports/{uuid.uuid4()}/cancellations", json=cancel_body(), headers=acme.operator
    )
    too_late = await client.post(
        f"/exports/{delivering.id}/cancellations", json=cancel_body(), headers=acme.operator
    )
    viewer = await client.post(
        "/switches/pause", json={"scope": "tenant", "reason": "x"}, headers=acme.viewer
    )

    assert [r.status_code for r in (forbidden, missing, too_late, viewer)] == [403, 404, 409, 403]
    rows = (await ledger(factory, acme.id))[-4:]
    assert [(r["action"], r["outcome"], r["role"]) for r in rows] == [
        ("reconcile", "forbidden", "operator"),
        ("cancel", "not_found", "operator"),
        ("cancel", "refused", "operator"),
        ("pause", "forbidden", "viewer"),
    ]
    assert rows[2]["detail"] == "TooLate"
    assert (await factory.job(unknown.id)).status == JobStatus.OUTCOME_UNKNOWN


async def test_a_busy_cancel_decided_nothing_and_is_not_recorded(client, factory, database, acme):
    job = await factory.queued(acme.id, acme.destination_id)
    before = len(await ledger(factory, acme.id))
    async with await psycopg.AsyncConnection.connect(database.admin_url) as holder:
        await holder.execute("SELECT 1 FROM export_jobs WHERE id = %(id)s FOR UPDATE", {"id": job.id})
        busy = await client.post(
            f"/exports/{job.id}/cancellations", json=cancel_body(), headers=acme.operator
        )
        await holder.rollback()
    assert busy.status_code == 503
    assert len(await ledger(factory, acme.id)) == before


async def test_pauses_resumes_bulk_cancels_reconciliations_and_replacements_are_recorded(
    client, factory, acme
):
    destination = str(acme.destination_id)
    pause = await client.post(
        "/switches/pause",
        json={"scope": "destination", "destination_id": destination, "reason": "deploy"},
        headers=acme.operator,
    )
    resume = await client.post(
        "/switches/resume",
        json={"scope": "destination", "destination_id": destination, "reason": "deployed"},
        headers=acme.operator,
    )
    queued = await factory.queued(acme.id, acme.destination_id)
    batch = uuid.uuid4()
    bulk = await client.post(
        "/cancellation-batches",
        json={"batch_id": str(batch), "destination_id": destination, "reason": "partner asked"},
        headers=acme.operator,
    )
    unknown, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(acme.id, acme.destination_id)
    )
    reconcile = await client.post(
        f"/exports/{unknown.id}/reconciliation",
        json={"resolution": "Failed", "evidence_summary": "listing shows no file"},
        headers=acme.reconciler,
    )
    replace = await client.post(
        f"/exports/{unknown.id}/replacements", json={"reason": "send it again"}, headers=acme.operator
    )
    assert [r.status_code for r in (pause, resume, bulk, reconcile, replace)] == [200, 200, 201, 200, 201]

    rows = (await ledger(factory, acme.id))[-5:]
    assert [(r["action"], r["subject_kind"], r["outcome"]) for r in rows] == [
        ("pause", "delivery_scope", "done"),
        ("resume", "delivery_scope", "done"),
        ("bulk_cancel", "cancellation_batch", "created"),
        ("reconcile", "export", "done"),
        ("replace", "export", "created"),
    ]
    paused, resumed, bulked, reconciled, replaced = rows
    assert paused["subject_id"] == destination and paused["after"]["pause_ids"] == [pause.json()["pause_id"]]
    assert resumed["after"]["pause_ids"] == [pause.json()["pause_id"]] and resumed["after"]["open"] is True
    assert bulked["subject_id"] == str(batch) and bulked["after"]["outcomes"] == bulk.json()["outcomes"]
    assert (
        bulked["after"]["matched"] == sum(bulk.json()["outcomes"].values()) and bulked["after"]["busy"] == 0
    )
    assert (reconciled["principal"], reconciled["role"], reconciled["after"]) == (
        acme.reconciler_name,
        "reconciler",
        {"status": "Failed"},
    )
    assert replaced["after"] == {"replacement": replace.json()["export"]["id"]}
    assert (await factory.job(queued.id)).status == JobStatus.CANCELED


async def test_a_two_person_action_is_recorded_asked_and_then_run_naming_both_people(
    client, factory, database, acme
):
    job, _ = await factory.in_status(
        JobStatus.COMPLETED, job=await factory.queued(acme.id, acme.destination_id)
    )
    correction = {
        "recorded_status": "Completed",
        "corrected_status": "Failed",
        "failure_reason": "NotDelivered",
        "evidence_ref": "TICKET-9",
        "why": "the partner never received it",
    }
    asked = await client.post(f"/exports/{job.id}/corrections", json=correction, headers=acme.reconciler)
    second = await another(database, acme, "reconciler", name="ron.recon@acme-audit")
    done = await approve(client, asked, second, reason="checked the listing")
    assert done.status_code == 200

    asked_row, ran = (await ledger(factory, acme.id, action="correct"))[-2:]
    approval = uuid.UUID(asked.json()["approval"]["id"])
    assert (
        asked_row["principal"],
        asked_row["outcome"],
        asked_row["approval_id"],
        asked_row["requested_by"],
    ) == (
        acme.reconciler_name,
        "accepted",
        approval,
        None,
    )
    assert (ran["principal"], ran["outcome"], ran["approval_id"], ran["requested_by"]) == (
        "ron.recon@acme-audit",
        "done",
        approval,
        acme.reconciler_name,
    )
    assert ran["before"]["status"] == "Completed" and ran["after"]["status"] == "Failed"


async def test_destination_changes_are_recorded_without_their_secrets(client, factory, database, acme):
    secret_path = "/etc/keys/partner-audit-ed25519"
    created = await client.post(
        "/destinations",
        json={
            "name": "partner-audited",
            "host": "sftp.audit.example",
            "username": "drop",
            "host_key": HOST_KEY,
            "credential_ref": secret_path,
            "remote_dir": "/in",
            "reason": "onboarding",
        },
        headers={**acme.admin, "Idempotency-Key": str(uuid.uuid4())},
    )
    destination = created.json()["destination"]["id"]
    rotated = await client.patch(
        f"/destinations/{destination}",
        json={"credential_ref": "/etc/keys/rotated-audit", "reason": "key rotated"},
        headers={**acme.admin, "If-Match": '"1"'},
    )
    approved = await approve(
        client, rotated, await another(database, acme, "admin", name="ann.admin@acme-audit")
    )
    retired = await client.post(
        f"/destinations/{destination}/retirement", json={"reason": "partner gone"}, headers=acme.admin
    )
    assert [r.status_code for r in (created, approved, retired)] == [201, 200, 200]

    rows = await ledger(factory, acme.id, subject_id=destination)
    assert [(r["action"], r["outcome"]) for r in rows] == [
        ("destination.create", "created"),
        ("destination.edit", "accepted"),
        ("destination.edit", "done"),
        ("destination.retire", "done"),
    ]
    assert rows[0]["after"]["destination"]["credential_ref"] == "set"
    assert rows[2]["before"] == {"credential_ref": "set"} and rows[2]["after"]["credential_ref"] == "set"
    text = (await client.get("/audit", params={"subject_id": destination}, headers=acme.admin)).text
    assert secret_path not in text and "rotated-audit" not in text and '"set"' in text


async def test_recurring_export_changes_are_recorded(client, factory, acme):
    made = await client.post(
        "/recurring-exports",
        json={
            "destination_id": str(acme.destination_id),
            "list_name": "newsletter",
            "cron": "0 2 * * *",
            "time_zone": "Europe/Berlin",
        },
        headers=acme.admin,
    )
    recurring = made.json()["recurring_export"]["id"]
    await client.post(
        f"/recurring-exports/{recurring}/pause", json={"reason": "campaign over"}, headers=acme.admin
    )
    await client.post(f"/recurring-exports/{recurring}/resume", headers=acme.admin)
    await client.delete(f"/recurring-exports/{recurring}", headers=acme.admin)
    refused = await client.post(
        f"/recurring-exports/{recurring}/pause", json={"reason": "x"}, headers=acme.operator
    )
    assert refused.status_code == 403

    rows = await ledger(factory, acme.id, subject_kind="recurring_export", subject_id=recurring)
    assert [(r["action"], r["outcome"]) for r in rows] == [
        ("recurring.create", "created"),
        ("recurring.pause", "done"),
        ("recurring.resume", "done"),
        ("recurring.delete", "done"),
        ("recurring.pause", "forbidden"),
    ]
    assert rows[1]["reason"] == "campaign over" and rows[1]["after"]["paused"] is True


async def test_token_mint_and_revoke_and_role_grants_are_an_administrators_recorded_actions(
    factory, database, acme
):
    url = database.admin_url
    await mint_token(url, tenant_id=acme.id, principal="new.hire", role="viewer", minted_by="root.admin")
    await upsert_principal(url, tenant_id=acme.id, name="new.hire", role="operator", granted_by="root.admin")
    assert await revoke_tokens(url, tenant_id=acme.id, principal="new.hire", revoked_by="root.admin") == 1
    assert await revoke_principal(url, tenant_id=acme.id, name="new.hire", revoked_by="root.admin")

    rows = await ledger(factory, acme.id, subject_id="new.hire")
    assert [(r["action"], r["principal"], r["role"], r["outcome"]) for r in rows] == [
        ("token.mint", "root.admin", "owner", "created"),
        ("principal.grant", "root.admin", "owner", "done"),
        ("token.revoke", "root.admin", "owner", "done"),
        ("principal.revoke", "root.admin", "owner", "done"),
    ]
    assert rows[0]["after"] == {"principal": "new.hire", "role": "viewer"}  # never the token
    assert (
        rows[1]["before"] == {"role": "viewer", "revoked": False} and rows[1]["after"]["role"] == "operator"
    )


async def test_an_exports_way_to_its_outcome_appends_nothing_to_the_ledger(
    client, factory, worker_store, acme
):
    # The ledger is written on control-plane actions only: creation, the claim, cutoff 2 and the terminal
    # write (the hot path that bench e2e measures) add no row.
    before = len(await ledger(factory, acme.id))
    created = await client.post(
        "/exports",
        json={"destination_id": str(acme.destination_id), "list_name": "main"},
        headers={**acme.operator, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert created.status_code == 201
    job = await factory.job(uuid.UUID(created.json()["export"]["id"]))
    await factory.in_status(JobStatus.COMPLETED, job=job)
    assert len(await ledger(factory, acme.id)) == before


# -- reading it -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["operator", "viewer"])
async def test_only_admins_and_reconcilers_read_the_ledger(client, acme, role):
    for path in ("/audit", "/audit.jsonl"):
        r = await client.get(path, headers=getattr(acme, role))
        assert r.status_code == 403 and "admin or reconciler" in r.json()["detail"], path
    for reader in (acme.admin, acme.reconciler):
        assert (await client.get("/audit", headers=reader)).status_code == 200


async def test_a_page_is_newest_first_and_the_next_one_neither_repeats_nor_skips(client, factory, database):
    tenant = await make_tenant(factory, database, "acme-pages")
    for n in range(5):
        await client.post(
            "/switches/pause", json={"scope": "tenant", "reason": f"pause {n}"}, headers=tenant.operator
        )
    pauses = {"limit": 2, "action": "pause"}  # the tenant's token mints are in the ledger too
    first = (await client.get("/audit", params=pauses, headers=tenant.admin)).json()
    await client.post(
        "/switches/pause", json={"scope": "tenant", "reason": "meanwhile"}, headers=tenant.operator
    )
    second = (
        await client.get("/audit", params={**pauses, "before": first["next"]}, headers=tenant.admin)
    ).json()
    third = (
        await client.get("/audit", params={**pauses, "before": second["next"]}, headers=tenant.admin)
    ).json()

    reasons = [a["reason"] for page in (first, second, third) for a in page["actions"]]
    assert reasons == ["pause 4", "pause 3", "pause 2", "pause 1", "pause 0"]
    assert third["next"] is None
    bad = await client.get("/audit", params={"before": "0"}, headers=tenant.admin)
    assert bad.status_code == 422  # the published pattern refuses it, as for GET /exports


async def test_the_filters_narrow_by_principal_action_subject_and_time(client, factory, database):
    tenant = await make_tenant(factory, database, "acme-filters")
    await client.post("/switches/pause", json={"scope": "tenant", "reason": "one"}, headers=tenant.operator)
    [mark] = await factory.admin("SELECT clock_timestamp() AS t", {})
    await client.post("/switches/resume", json={"scope": "tenant", "reason": "two"}, headers=tenant.operator)
    await client.post(
        "/switches/pause", json={"scope": "tenant", "reason": "three"}, headers=tenant.reconciler
    )

    async def reasons(**params: Any) -> list[str]:
        r = await client.get("/audit", params=params, headers=tenant.admin)
        assert r.status_code == 200, r.text
        return [a["reason"] for a in r.json()["actions"]]

    assert await reasons(principal=tenant.reconciler_name) == ["three"]
    assert await reasons(action="resume") == ["two"]
    assert await reasons(subject_kind="delivery_scope", subject_id=str(tenant.id)) == ["three", "two", "one"]
    assert await reasons(since=mark["t"].isoformat()) == ["three", "two"]
    assert await reasons(until=mark["t"].isoformat(), subject_kind="delivery_scope") == ["one"]
    assert await reasons(action="cancel") == []
    wrong = await client.get(
        "/audit",
        params={"since": mark["t"].isoformat(), "until": mark["t"].isoformat()},
        headers=tenant.admin,
    )
    assert wrong.status_code == 422 and wrong.json()["detail"] == "until must be after since"
    unknown = await client.get("/audit", params={"action": "delete everything"}, headers=tenant.admin)
    assert unknown.status_code == 422


async def test_the_json_lines_export_streams_the_whole_filtered_ledger(
    client, factory, database, monkeypatch
):
    tenant = await make_tenant(factory, database, "acme-jsonl")
    for n in range(5):
        await client.post(
            "/switches/pause", json={"scope": "tenant", "reason": f"p{n}"}, headers=tenant.operator
        )
    await client.post("/switches/resume", json={"scope": "tenant", "reason": "done"}, headers=tenant.operator)
    monkeypatch.setattr(
        audit_service, "EXPORT_PAGE", 2
    )  # read in pages of two: the stream goes on across them

    r = await client.get("/audit.jsonl", params={"action": "pause"}, headers=tenant.reconciler)

    assert r.status_code == 200 and r.headers["content-type"].startswith("application/jsonl")
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert [x["reason"] for x in lines] == ["p4", "p3", "p2", "p1", "p0"]
    assert r.text.endswith("\n") and {x["principal"] for x in lines} == {tenant.operator_name}


@pytest.mark.slow  # starter.py processes: seconds
async def test_the_command_line_prints_the_ledger_and_its_json_lines(database, factory):
    tenant_id = await factory.tenant("acme-cli-audit")
    await factory.destination(tenant_id)
    await factory.principal(tenant_id, "ada.admin", "admin")
    await factory.principal(tenant_id, "sam.ops", "operator")
    code, _, _ = await starter(
        database, "pause", "--reason", "quarterly review", tenant=tenant_id, principal="sam.ops"
    )
    assert code == 0

    code, out, _ = await starter(database, "--json", "audit", tenant=tenant_id, principal="ada.admin")
    assert code == 0
    [row] = json.loads(out)["actions"]
    assert (row["action"], row["principal"], row["reason"]) == ("pause", "sam.ops", "quarterly review")
    assert row["request_id"].startswith("cli-")

    code, out, _ = await starter(
        database, "audit", "--jsonl", "--action", "pause", tenant=tenant_id, principal="ada.admin"
    )
    assert code == 0 and json.loads(out.splitlines()[0])["reason"] == "quarterly review"

    code, out, _ = await starter(database, "audit", tenant=tenant_id, principal="sam.ops")
    assert code == 1 and "admin or reconciler" in out


async def test_webhook_endpoint_changes_and_listing_requests_are_recorded_never_a_secret(
    client, factory, worker_store, acme
):
    created = await client.post(
        "/webhook-endpoints",
        json={"url": "https://hooks.acme.example/in/s3cr3t-path", "events": ["export.completed"]},
        headers=acme.admin,
    )
    assert created.status_code == 201, created.text
    endpoint = created.json()["endpoint"]["id"]
    secret = created.json()["secret"]
    rotated = await client.patch(
        f"/webhook-endpoints/{endpoint}",
        json={"rotate_secret": True},
        headers={**acme.admin, "If-Match": '"1"'},
    )
    removed = await client.delete(f"/webhook-endpoints/{endpoint}", headers=acme.admin)
    assert rotated.status_code == 200 and removed.status_code == 200
    unknown, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(acme.id, acme.destination_id)
    )
    asked = await client.post(f"/exports/{unknown.id}/listing-requests", headers=acme.reconciler)
    assert asked.status_code == 202, asked.text

    rows = await ledger(factory, acme.id, subject_kind="webhook_endpoint", subject_id=endpoint)
    assert [(r["action"], r["outcome"]) for r in rows] == [
        ("webhook.create", "created"),
        ("webhook.edit", "done"),
        ("webhook.delete", "done"),
    ]
    assert rows[0]["after"]["url_origin"] == "https://hooks.acme.example/…"  # its path is never recorded
    assert rows[1]["after"]["signing_key_rotated"] is True
    every = json.dumps([r["after"] for r in rows]) + json.dumps([r["detail"] for r in rows])
    assert secret not in every and rotated.json()["secret"] not in every and "s3cr3t-path" not in every
    [listing] = await ledger(factory, acme.id, action="listing.request")
    assert (listing["subject_id"], listing["outcome"], listing["principal"]) == (
        str(unknown.id),
        "accepted",
        acme.reconciler_name,
    )
