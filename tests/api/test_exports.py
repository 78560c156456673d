"""Creation with idempotency keys (002), reads, terms edits with If-Match, replacements, reconciliation
and reconciler-only corrections, all through HTTP against real PostgreSQL."""

from __future__ import annotations

import json
import uuid

import pytest

from domain.models import DeliveryOutcome, FailureCode, FinishResult, JobStatus
from tests.api.conftest import another, approve, snapshot


def create_body(tenant, list_name: str = "main") -> dict:
    return {"destination_id": str(tenant.destination_id), "list_name": list_name}


def key() -> dict[str, str]:
    return {"Idempotency-Key": f"create-{uuid.uuid4()}"}


async def test_create_returns_201_with_the_queued_export_and_its_location(client, factory, acme):
    r = await client.post("/exports", json=create_body(acme), headers={**acme.operator, **key()})

    assert r.status_code == 201
    export = r.json()["export"]
    assert r.headers["location"] == f"/exports/{export['id']}"
    assert export["status"] == "Queued" and export["version"] == 1
    assert export["created_by"] == acme.operator_name
    assert await factory.outbox_count(uuid.UUID(export["id"])) == 1


async def test_the_same_key_and_request_returns_the_first_export_and_creates_nothing(client, factory, acme):
    headers = {**acme.operator, **key(), "Content-Type": "application/json"}
    first = await client.post("/exports", json=create_body(acme, "replay"), headers=headers)
    # The same request with its keys in another order and other whitespace: the same canonical fingerprint.
    reordered = json.dumps({"list_name": "replay", "destination_id": str(acme.destination_id)}, indent=3)

    again = await client.post("/exports", content=reordered, headers=headers)

    assert first.status_code == 201
    assert again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["export"]["id"] == first.json()["export"]["id"]
    rows = await factory.admin(
        "SELECT count(*) AS n FROM export_jobs WHERE tenant_id = %(t)s AND list_name = 'replay'",
        {"t": acme.id},
    )
    assert rows[0]["n"] == 1
    assert await factory.outbox_count(uuid.UUID(first.json()["export"]["id"])) == 1


async def test_the_same_key_with_a_different_request_is_409_and_creates_nothing(client, factory, acme):
    headers = {**acme.operator, **key()}
    await client.post("/exports", json=create_body(acme, "conflict-a"), headers=headers)

    r = await client.post("/exports", json=create_body(acme, "conflict-b"), headers=headers)

    assert r.status_code == 409
    assert r.json()["code"] == "idempotency_conflict"
    rows = await factory.admin(
        "SELECT count(*) AS n FROM export_jobs WHERE tenant_id = %(t)s AND list_name = 'conflict-b'",
        {"t": acme.id},
    )
    assert rows[0]["n"] == 0


async def test_the_same_key_in_another_tenant_is_a_different_request(client, acme, globex):
    shared = key()
    mine = await client.post("/exports", json=create_body(acme), headers={**acme.operator, **shared})

    theirs = await client.post("/exports", json=create_body(globex), headers={**globex.operator, **shared})

    assert mine.status_code == theirs.status_code == 201
    assert mine.json()["export"]["id"] != theirs.json()["export"]["id"]
    assert theirs.json()["export"]["tenant_id"] == str(globex.id)


async def test_create_needs_a_well_formed_idempotency_key(client, acme):
    missing = await client.post("/exports", json=create_body(acme), headers=acme.operator)
    too_long = await client.post(
        "/exports", json=create_body(acme), headers={**acme.operator, "Idempotency-Key": "k" * 201}
    )

    assert missing.status_code == too_long.status_code == 400
    assert "Idempotency-Key" in missing.json()["detail"]


async def test_create_for_another_tenants_destination_is_422(client, acme, globex):
    r = await client.post("/exports", json=create_body(globex), headers={**acme.operator, **key()})

    assert r.status_code == 422
    assert "no such destination" in r.json()["detail"]


async def test_get_shows_the_export_its_timeline_and_a_link_to_its_workflows(client, factory, acme):
    job, attempt = await factory.running(await factory.queued(acme.id, acme.destination_id))

    r = await client.get(f"/exports/{job.id}", headers=acme.operator)

    assert r.status_code == 200
    assert r.headers["etag"] == '"1"'
    view = r.json()
    assert [e["label"] for e in view["timeline"]] == ["Requested", "Claimed"]
    assert view["timeline"][1]["subject"] == f"attempt {attempt}"
    assert view["links"]["workflows"].startswith("http://ui.test:8233/namespaces/default/workflows?query=")
    assert str(job.id) in view["links"]["workflows"]


async def test_list_shows_only_the_callers_tenant(client, factory, acme, globex):
    mine = await factory.queued(acme.id, acme.destination_id)
    theirs = await factory.queued(globex.id, globex.destination_id)

    r = await client.get("/exports", headers=acme.operator)

    ids = {e["id"] for e in r.json()["exports"]}
    assert str(mine.id) in ids and str(theirs.id) not in ids


async def test_edit_with_the_read_version_changes_terms_bumps_the_version_and_wakes_the_job(
    client, factory, acme
):
    job = await factory.queued(acme.id, acme.destination_id)

    r = await client.patch(
        f"/exports/{job.id}", json={"list_name": "vip"}, headers={**acme.operator, "If-Match": '"1"'}
    )

    assert r.status_code == 200
    assert r.json()["export"]["version"] == 2 and r.json()["export"]["list_name"] == "vip"
    assert r.headers["etag"] == '"2"'
    assert await factory.outbox_count(job.id) == 2


async def test_edit_with_a_stale_version_is_412_and_without_if_match_428(client, factory, acme):
    job = await factory.queued(acme.id, acme.destination_id)
    await client.patch(
        f"/exports/{job.id}", json={"list_name": "v2"}, headers={**acme.operator, "If-Match": '"1"'}
    )
    before = await snapshot(factory, job.id)

    stale = await client.patch(
        f"/exports/{job.id}", json={"list_name": "v3"}, headers={**acme.operator, "If-Match": '"1"'}
    )
    missing = await client.patch(f"/exports/{job.id}", json={"list_name": "v3"}, headers=acme.operator)

    assert stale.status_code == 412 and stale.json()["version"] == 2
    assert missing.status_code == 428
    assert await snapshot(factory, job.id) == before


async def test_edit_of_a_running_export_is_409(client, factory, acme):
    job, _ = await factory.running(await factory.queued(acme.id, acme.destination_id))

    r = await client.patch(
        f"/exports/{job.id}", json={"list_name": "late"}, headers={**acme.operator, "If-Match": '"1"'}
    )

    assert r.status_code == 409
    assert "Running" in r.json()["detail"]


async def test_a_replacements_terms_cannot_be_edited_and_the_answer_says_why(client, factory, acme):
    original, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(acme.id, acme.destination_id)
    )
    created = await client.post(
        f"/exports/{original.id}/replacements",
        json={"reason": "partner lost the file"},
        headers=acme.operator,
    )
    replacement = created.json()["export"]
    before = await snapshot(factory, uuid.UUID(replacement["id"]))

    r = await client.patch(
        f"/exports/{replacement['id']}",
        json={"list_name": "someone-elses-list"},
        headers={**acme.operator, "If-Match": f'"{replacement["version"]}"'},
    )

    assert r.status_code == 409
    assert f"replaces {original.id}" in r.json()["detail"] and "cannot change" in r.json()["detail"]
    assert await snapshot(factory, uuid.UUID(replacement["id"])) == before


async def test_a_replacement_is_created_by_the_named_caller_with_its_reason(client, factory, database, acme):
    original, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(acme.id, acme.destination_id)
    )

    asked = await client.post(
        f"/exports/{original.id}/replacements",
        json={"reason": "partner lost the file", "overwrite_agreement_ref": "AGR-7"},
        headers=acme.operator,
    )
    # an overwrite agreement takes two people (issue #26): it waits, then runs as the approver's
    second = await another(database, acme, "operator", name="olga.ops@acme")
    r = await approve(client, asked, second)

    assert r.status_code == 201
    new = r.json()["export"]
    assert new["replaces_job_id"] == str(original.id)
    assert new["created_by"] == "olga.ops@acme"
    assert new["replacement_reason"] == "partner lost the file"
    assert new["overwrite_agreement_ref"] == "AGR-7"
    assert new["delivery_key"] == original.delivery_key
    again = await client.post(
        f"/exports/{original.id}/replacements", json={"reason": "twice"}, headers=acme.operator
    )
    assert again.status_code == 409


async def test_a_replacement_of_a_replacement_resolves_to_the_original(client, factory, worker_store, acme):
    original, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(acme.id, acme.destination_id)
    )
    first = await client.post(
        f"/exports/{original.id}/replacements", json={"reason": "one"}, headers=acme.operator
    )
    replacement = await factory.job(uuid.UUID(first.json()["export"]["id"]))
    _, attempt = await factory.delivering(replacement)
    assert (
        await worker_store.finish_delivery(
            replacement.id, attempt, DeliveryOutcome.FAILED, FailureCode.NOT_DELIVERED
        )
        == FinishResult.WRITTEN
    )

    r = await client.post(
        f"/exports/{replacement.id}/replacements", json={"reason": "two"}, headers=acme.operator
    )

    assert r.status_code == 201
    assert r.json()["replaces_job_id"] == str(original.id)
    assert r.json()["export"]["replaces_job_id"] == str(original.id)


async def test_a_completed_export_cannot_be_replaced(client, factory, acme):
    job, _ = await factory.in_status(
        JobStatus.COMPLETED, job=await factory.queued(acme.id, acme.destination_id)
    )
    before = await snapshot(factory, job.id)

    r = await client.post(f"/exports/{job.id}/replacements", json={"reason": "again"}, headers=acme.operator)

    assert r.status_code == 409
    assert "Completed" in r.json()["detail"]
    assert await snapshot(factory, job.id) == before


async def test_reconciliation_resolves_an_unknown_outcome_once(client, factory, acme):
    job, attempt = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(acme.id, acme.destination_id)
    )
    body = {"resolution": "Completed", "evidence_summary": "partner ack ACK-1 matches size and hash"}

    r = await client.post(f"/exports/{job.id}/reconciliation", json=body, headers=acme.reconciler)
    again = await client.post(f"/exports/{job.id}/reconciliation", json=body, headers=acme.reconciler)

    assert r.status_code == 200 and r.json()["export"]["status"] == "Completed"
    assert again.status_code == 409
    events = await factory.worker.job_events(job.id)
    reconciled = [e for e in events if e.kind.value == "Reconciled"]
    assert len(reconciled) == 1
    assert reconciled[0].observed_by == acme.reconciler_name and reconciled[0].attempt_id == attempt


async def test_an_operators_reconciliation_is_403_and_records_nothing(client, factory, acme):
    job, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(acme.id, acme.destination_id)
    )
    before = await snapshot(factory, job.id)

    r = await client.post(
        f"/exports/{job.id}/reconciliation",
        json={"resolution": "Failed", "evidence_summary": "looked fine to me"},
        headers=acme.operator,
    )

    assert r.status_code == 403
    assert "reconciler role" in r.json()["detail"]
    assert await snapshot(factory, job.id) == before


async def test_reconciliation_of_a_queued_export_is_409(client, factory, acme):
    job = await factory.queued(acme.id, acme.destination_id)

    r = await client.post(
        f"/exports/{job.id}/reconciliation",
        json={"resolution": "Failed", "evidence_summary": "x"},
        headers=acme.reconciler,
    )

    assert r.status_code == 409


CORRECTION = {
    "recorded_status": "Completed",
    "corrected_status": "Failed",
    "failure_reason": "NotDelivered",
    "evidence_ref": "TICKET-42",
    "why": "partner confirmed the file never arrived",
}


async def test_only_a_reconciler_may_correct_and_only_once(client, factory, database, acme):
    job, _ = await factory.in_status(
        JobStatus.COMPLETED, job=await factory.queued(acme.id, acme.destination_id)
    )

    as_operator = await client.post(f"/exports/{job.id}/corrections", json=CORRECTION, headers=acme.operator)
    assert as_operator.status_code == 403
    assert await factory.status(job.id) == JobStatus.COMPLETED

    asked = await client.post(f"/exports/{job.id}/corrections", json=CORRECTION, headers=acme.reconciler)
    assert await factory.status(job.id) == JobStatus.COMPLETED  # a correction takes two people (issue #26)
    corrected = await approve(
        client, asked, await another(database, acme, "reconciler", name="ron.recon@acme")
    )
    assert corrected.status_code == 200
    assert corrected.json()["export"]["status"] == "Failed"
    assert corrected.json()["export"]["failure_reason"] == "NotDelivered"
    event = [e for e in await factory.worker.job_events(job.id) if e.kind.value == "Corrected"][0]
    assert event.observed_by == "ron.recon@acme"
    assert "TICKET-42" in event.detail and "never arrived" in event.detail

    back = {
        **CORRECTION,
        "recorded_status": "Failed",
        "corrected_status": "Completed",
        "failure_reason": None,
    }
    twice = await client.post(f"/exports/{job.id}/corrections", json=back, headers=acme.reconciler)
    assert twice.status_code == 409
    assert await factory.status(job.id) == JobStatus.FAILED


async def test_a_correction_from_the_wrong_recorded_status_is_409(client, factory, acme):
    job, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(acme.id, acme.destination_id)
    )

    r = await client.post(f"/exports/{job.id}/corrections", json=CORRECTION, headers=acme.reconciler)

    assert r.status_code == 409
    assert await factory.status(job.id) == JobStatus.OUTCOME_UNKNOWN


async def test_openapi_is_served(client):
    r = await client.get("/openapi.json")

    assert r.status_code == 200
    paths = r.json()["paths"]
    assert "/exports/{export_id}/cancellations" in paths and "/exports" in paths


# -- If-Match, RFC 9110 §13.1.1: strong comparison ----------------------------------------------------


@pytest.mark.parametrize(
    ("if_match", "status"),
    [
        ("1", 400),  # unquoted
        ('"1', 400),  # unterminated
        ("W/1", 400),
        ('"1" "2"', 400),  # a list needs commas
        ('W/"1"', 412),  # a weak tag never matches under strong comparison
        ('W/"1", W/"2"', 412),
        ('"2"', 412),  # another version
        ('"v1"', 412),  # a well-formed tag that is not one of ours
    ],
)
async def test_if_match_is_strong_comparison_of_quoted_tags(client, factory, acme, if_match, status):
    job = await factory.queued(acme.id, acme.destination_id)
    before = await snapshot(factory, job.id)

    r = await client.patch(
        f"/exports/{job.id}", json={"list_name": "vip"}, headers={**acme.operator, "If-Match": if_match}
    )

    assert r.status_code == status, r.text
    assert isinstance(r.json()["detail"], str)
    assert await snapshot(factory, job.id) == before


@pytest.mark.parametrize("if_match", ['"1"', ' "1" ', 'W/"1", "1"', '"7", "1"', "*"])
async def test_if_match_matches_a_strong_tag_of_the_current_version_in_a_list_or_star(
    client, factory, acme, if_match
):
    job = await factory.queued(acme.id, acme.destination_id)

    r = await client.patch(
        f"/exports/{job.id}", json={"list_name": "vip"}, headers={**acme.operator, "If-Match": if_match}
    )

    assert r.status_code == 200, r.text
    assert r.headers["ETag"] == '"2"'
    assert (await factory.job(job.id)).list_name == "vip"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"list_name": None},
        {"destination_id": None, "list_name": "vip"},
        {"list_name": " vip"},
        {"list_name": "vip\n"},
        {"list_name": "v\x07ip"},
    ],
)
async def test_what_the_schema_refuses_in_a_patch_is_422_and_changes_nothing(client, factory, acme, body):
    job = await factory.queued(acme.id, acme.destination_id)
    before = await snapshot(factory, job.id)

    r = await client.patch(f"/exports/{job.id}", json=body, headers={**acme.operator, "If-Match": '"1"'})

    assert r.status_code == 422, r.text
    assert r.json()["errors"]
    assert await snapshot(factory, job.id) == before


async def test_the_openapi_document_marks_the_required_headers_and_the_constraints(client):
    spec = (await client.get("/openapi.json")).json()

    def header(path: str, method: str, name: str) -> dict:
        params = spec["paths"][path][method]["parameters"]
        return next(p for p in params if p["in"] == "header" and p["name"] == name)

    assert header("/exports", "post", "Idempotency-Key")["required"] is True
    assert header("/exports/{export_id}", "patch", "If-Match")["required"] is True
    assert "413" in spec["paths"]["/exports/{export_id}/cancellations"]["post"]["responses"]
    schemas = spec["components"]["schemas"]
    assert schemas["EditTerms"]["minProperties"] == 1
    assert "pattern" in schemas["CreateExport"]["properties"]["list_name"]
    shapes = schemas["CorrectExport"]["oneOf"]
    assert {
        (s["properties"]["recorded_status"]["const"], s["properties"]["corrected_status"]["const"])
        for s in shapes
    } == {
        ("Completed", "Failed"),
        ("Failed", "Completed"),
    }
    links = spec["paths"]["/exports"]["post"]["responses"]["201"]["links"]
    assert {link["operationId"] for link in links.values()} >= {"get_export", "edit_export", "cancel_export"}
    assert links["EditExport"]["parameters"]["header.If-Match"] == "$response.header.ETag"
    assert "bearerAuth" in str(spec["components"]["securitySchemes"]) or spec["components"]["securitySchemes"]


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/exports", {"GET", "POST", "OPTIONS"}),
        ("/exports/{id}", {"GET", "PATCH", "OPTIONS"}),
        ("/exports/{id}/cancellations", {"POST", "OPTIONS"}),
        ("/cancellation-batches", {"POST", "OPTIONS"}),
    ],
)
async def test_options_and_405_list_every_method_the_path_serves(client, factory, acme, path, allowed):
    job = await factory.queued(acme.id, acme.destination_id)
    url = path.replace("{id}", str(job.id))

    options = await client.options(url, headers=acme.operator)
    not_allowed = await client.request("DELETE", url, headers=acme.operator)

    assert options.status_code == 204
    assert set(options.headers["Allow"].split(", ")) == allowed
    assert not_allowed.status_code == 405
    assert set(not_allowed.headers["Allow"].split(", ")) == allowed
