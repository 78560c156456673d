"""The tenant roles (issues #24, #26): a viewer reads and may change nothing; an admin may do what an operator
may and export; reconciliation stays the reconciler's. Every refusal is a 403 that names who may, and
records nothing (the row, its events, requests and outbox as they were)."""

from __future__ import annotations

import uuid

import pytest

from domain.models import JobStatus
from service.permissions import PERMISSIONS, ROLES, Action, may
from tests.api.conftest import cancel_body, snapshot


def test_each_role_may_do_exactly_what_its_row_says():
    assert set(PERMISSIONS) == set(ROLES)
    assert {a for a in Action if may("viewer", a)} == {Action.READ}
    operator = {a for a in Action if may("operator", a)}
    assert operator == {Action.READ, Action.EXPORT, Action.CANCEL, Action.SWITCH, Action.TEST_CONNECTION}
    assert {a for a in Action if may("reconciler", a)} == operator | {Action.RECONCILE, Action.READ_AUDIT}
    assert {a for a in Action if may("admin", a)} == operator | {
        Action.MANAGE_DESTINATIONS,
        Action.MANAGE_RECURRING,
        Action.MANAGE_NOTIFICATIONS,
        Action.READ_AUDIT,
    }
    assert not any(may("nobody", a) for a in Action)


async def test_a_viewer_reads_exports_timelines_and_switches(client, factory, acme):
    job = await factory.queued(acme.id, acme.destination_id)
    for path in ("/exports", f"/exports/{job.id}", "/switches", "/destinations"):
        r = await client.get(path, headers=acme.viewer)
        assert r.status_code == 200, (path, r.text)


def writes(job_id: uuid.UUID, destination_id: uuid.UUID) -> list[tuple[str, str, dict, dict]]:
    """Every write a viewer might try: (method, path, body, extra headers)."""
    return [
        (
            "POST",
            "/exports",
            {"destination_id": str(destination_id), "list_name": "main"},
            {"Idempotency-Key": "k1"},
        ),
        ("PATCH", f"/exports/{job_id}", {"list_name": "other"}, {"If-Match": '"1"'}),
        ("POST", f"/exports/{job_id}/cancellations", cancel_body(), {}),
        ("POST", f"/exports/{job_id}/replacements", {"reason": "retry it"}, {}),
        (
            "POST",
            f"/exports/{job_id}/reconciliation",
            {"resolution": "Completed", "evidence_summary": "the partner confirmed"},
            {},
        ),
        (
            "POST",
            "/cancellation-batches",
            {"batch_id": str(uuid.uuid4()), "destination_id": str(destination_id), "reason": "incident"},
            {},
        ),
        (
            "POST",
            "/switches/pause",
            {"scope": "destination", "destination_id": str(destination_id), "reason": "x"},
            {},
        ),
        ("POST", "/switches/resume", {"scope": "tenant", "reason": "x"}, {}),
    ]


@pytest.mark.parametrize("which", range(8))
async def test_a_viewer_is_refused_every_write_and_nothing_is_recorded(client, factory, acme, which):
    job = await factory.queued(acme.id, acme.destination_id)
    method, path, body, headers = writes(job.id, acme.destination_id)[which]
    before = await snapshot(factory, job.id)
    switches_before = await factory.admin(
        "SELECT count(*) AS n FROM delivery_switch_changes WHERE tenant_id = %(t)s", {"t": acme.id}
    )

    r = await client.request(method, path, json=body, headers={**acme.viewer, **headers})

    assert r.status_code == 403, r.text
    assert "the viewer role may not" in r.json()["detail"] or "reconciler role" in r.json()["detail"]
    assert await snapshot(factory, job.id) == before
    assert (
        await factory.admin(
            "SELECT count(*) AS n FROM delivery_switch_changes WHERE tenant_id = %(t)s", {"t": acme.id}
        )
        == switches_before
    )


async def test_a_viewer_is_refused_the_bulk_cancel_preview(client, acme):
    r = await client.get(
        "/cancellation-batches/preview",
        params={"destination_id": str(acme.destination_id)},
        headers=acme.viewer,
    )
    assert r.status_code == 403
    assert r.json()["detail"] == (
        "the viewer role may not cancel; that needs the admin or operator or reconciler role"
    )


async def test_an_admin_exports_and_cancels_but_does_not_reconcile(client, factory, acme):
    r = await client.post(
        "/exports",
        json={"destination_id": str(acme.destination_id), "list_name": "main"},
        headers={**acme.admin, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 201, r.text
    job_id = r.json()["export"]["id"]
    facts = await factory.worker.read_policy_facts(uuid.UUID(job_id))
    assert facts is not None and facts.principal_role == "admin"  # the policy check lets an admin's export go

    r = await client.post(f"/exports/{job_id}/cancellations", json=cancel_body(), headers=acme.admin)
    assert r.status_code == 200 and r.json()["outcome"] == "CanceledWhileQueued"
    r = await client.post(
        f"/exports/{job_id}/reconciliation",
        json={"resolution": "Completed", "evidence_summary": "the partner confirmed"},
        headers=acme.admin,
    )
    assert r.status_code == 403


async def test_the_console_offers_a_viewer_no_cancel_no_bulk_cancel_and_no_switch(client, factory, acme):
    from tests.api.conftest import sign_in

    job = await factory.queued(acme.id, acme.destination_id)
    await sign_in(client, acme, as_role="viewer")
    try:
        listing = (await client.get("/console")).text
        detail = (await client.get(f"/console/exports/{job.id}")).text
        switches = (await client.get("/console/switches")).text
    finally:
        client.cookies.clear()
    assert "Cancel…" not in listing and 'id="bulk"' not in listing
    assert str(job.id) in listing
    assert 'id="cancel"' not in detail and "Your role (viewer) reads exports" in detail
    assert "switch-action" not in switches


async def test_an_operators_reconcile_is_refused_by_the_database_even_without_the_services_check(
    client, factory, acme, monkeypatch
):
    # Issue #26: take the service's check away (as a bug would): the operator's request now goes over the
    # reconciler's pool, and the statement, which names who reconciles, still changes nothing.
    import service.exports

    monkeypatch.setattr(service.exports, "may", lambda role, action: True)
    job, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(acme.id, acme.destination_id)
    )
    before = await snapshot(factory, job.id)

    r = await client.post(
        f"/exports/{job.id}/reconciliation",
        json={"resolution": "Completed", "evidence_summary": "trust me"},
        headers=acme.operator,
    )

    assert r.status_code == 409 and "nothing matched" in r.json()["detail"]
    assert await snapshot(factory, job.id) == before
