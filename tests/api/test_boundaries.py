"""What every route refuses: another tenant's exports (indistinguishable from missing ones), malformed
input (a clear 4xx, never a 500, recording nothing), and callers without a valid token."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from api.auth import CONSOLE_HEADER
from domain.models import JobStatus
from tests.api.conftest import cancel_body, sign_in, snapshot

CORRECTION = {
    "recorded_status": "Completed",
    "corrected_status": "Failed",
    "failure_reason": "NotDelivered",
    "evidence_ref": "TICKET-1",
    "why": "partner says no file",
}


@pytest.fixture(scope="module")
async def globex_jobs(factory, globex) -> dict[str, Any]:
    """One of globex's exports per route, each in the state where that route would act on it."""
    queued = await factory.queued(globex.id, globex.destination_id)
    unknown, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(globex.id, globex.destination_id)
    )
    completed, _ = await factory.in_status(
        JobStatus.COMPLETED, job=await factory.queued(globex.id, globex.destination_id)
    )
    return {"queued": queued, "unknown": unknown, "completed": completed}


def routes(jobs: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any] | None, dict[str, str]]]:
    """(name, method, path, json body, extra headers) for every route that names one export."""
    return [
        ("read", "GET", f"/exports/{jobs['queued']}", None, {}),
        ("edit", "PATCH", f"/exports/{jobs['queued']}", {"list_name": "stolen"}, {"If-Match": '"1"'}),
        ("cancel", "POST", f"/exports/{jobs['queued']}/cancellations", cancel_body(), {}),
        ("replace", "POST", f"/exports/{jobs['unknown']}/replacements", {"reason": "mine now"}, {}),
        (
            "reconcile",
            "POST",
            f"/exports/{jobs['unknown']}/reconciliation",
            {"resolution": "Completed", "evidence_summary": "trust me"},
            {},
        ),
        ("correct", "POST", f"/exports/{jobs['completed']}/corrections", CORRECTION, {}),
    ]


ROUTE_NAMES = ["read", "edit", "cancel", "replace", "reconcile", "correct"]


@pytest.mark.parametrize("route", ROUTE_NAMES)
async def test_another_tenants_export_looks_exactly_like_a_missing_one_on_every_route(
    client, factory, acme, globex_jobs, route
):
    ids = {k: v.id for k, v in globex_jobs.items()}
    missing = {k: uuid.uuid4() for k in ids}
    _, method, path, body, extra = next(r for r in routes(ids) if r[0] == route)
    _, _, missing_path, _, _ = next(r for r in routes(missing) if r[0] == route)
    before = {k: await snapshot(factory, v) for k, v in ids.items()}
    headers = {**acme.reconciler, **extra}  # the strongest role acme has

    theirs = await client.request(method, path, json=body, headers=headers)
    absent = await client.request(method, missing_path, json=body, headers=headers)

    assert theirs.status_code == absent.status_code == 404
    assert theirs.json() == absent.json()
    assert {k: await snapshot(factory, v) for k, v in ids.items()} == before


async def test_the_console_shows_another_tenants_export_as_not_found(client, acme, globex_jobs):
    await sign_in(client, acme)
    try:
        theirs = await client.get(f"/console/exports/{globex_jobs['queued'].id}")
        absent = await client.get(f"/console/exports/{uuid.uuid4()}")
    finally:
        client.cookies.clear()

    assert theirs.status_code == absent.status_code == 404
    assert theirs.text == absent.text


MALFORMED: list[tuple[str, str, Any]] = [
    ("not-a-uuid-in-the-path", "path", None),
    ("missing-fields", "json", {}),
    ("wrong-uuid", "json", "uuid"),
    ("oversized-string", "json", "long"),
    ("control-character", "json", "nul"),
    ("unknown-field", "json", "extra"),
    ("not-json", "content", "{not json"),
    ("wrong-type", "content", "[1, 2, 3]"),
]


def malformed_body(route: str, kind: str, acme) -> Any:
    """A body for ``route`` broken in the way ``kind`` says."""
    good = {
        "create": {"destination_id": str(acme.destination_id), "list_name": "x"},
        "edit": {"list_name": "x"},
        "cancel": cancel_body(),
        "replace": {"reason": "x"},
        "reconcile": {"resolution": "Completed", "evidence_summary": "x"},
        "correct": dict(CORRECTION),
    }[route]
    uuid_field = {"create": "destination_id", "edit": "destination_id", "cancel": "request_id"}.get(
        route, "attempt_id"
    )
    text_field = {
        "create": "list_name",
        "edit": "list_name",
        "cancel": "reason",
        "replace": "reason",
        "reconcile": "evidence_summary",
        "correct": "why",
    }[route]
    match kind:
        case "uuid":
            return {**good, uuid_field: "123-not-a-uuid"}
        case "long":
            return {**good, text_field: "x" * 5000}
        case "nul":
            return {**good, text_field: "bad\x00value"}
        case "extra":
            return {**good, "status": "Completed"}
    raise AssertionError(kind)


@pytest.mark.parametrize("route", ["create", *ROUTE_NAMES[1:]])
@pytest.mark.parametrize(("kind", "where", "spec"), MALFORMED, ids=[m[0] for m in MALFORMED])
async def test_malformed_input_is_a_clear_4xx_and_records_nothing_on_every_route(
    client, factory, acme, route, kind, where, spec
):
    queued = await factory.queued(acme.id, acme.destination_id)
    unknown, _ = await factory.in_status(
        JobStatus.OUTCOME_UNKNOWN, job=await factory.queued(acme.id, acme.destination_id)
    )
    completed, _ = await factory.in_status(
        JobStatus.COMPLETED, job=await factory.queued(acme.id, acme.destination_id)
    )
    jobs = {"queued": queued.id, "unknown": unknown.id, "completed": completed.id}
    before = {k: await snapshot(factory, v) for k, v in jobs.items()}
    count_before = await factory.admin(
        "SELECT count(*) AS n FROM export_jobs WHERE tenant_id = %(t)s", {"t": acme.id}
    )
    if route == "create":
        method, path, extra = "POST", "/exports", {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    else:
        _, method, path, _, extra = next(r for r in routes(jobs) if r[0] == route)
    if where == "path":
        path = (
            path.replace(str(next(v for v in jobs.values() if str(v) in path)), "12345")
            if route != "create"
            else "/exports/12345"
        )
        method = "GET" if route == "create" else method
    headers = {**acme.reconciler, **extra}
    kwargs: dict[str, Any] = {}
    if where == "json":
        kwargs["json"] = spec if spec == {} else malformed_body(route, spec, acme)
    elif where == "content":
        kwargs["content"] = spec
        headers["Content-Type"] = "application/json"
    else:
        kwargs["json"] = {}

    r = await client.request(method, path, headers=headers, **kwargs)

    assert 400 <= r.status_code < 500, r.text
    assert isinstance(r.json()["detail"], str) and r.json()["detail"]
    assert "\x00" not in r.text and "x" * 1000 not in r.text  # never echoes the input
    assert {k: await snapshot(factory, v) for k, v in jobs.items()} == before
    count_after = await factory.admin(
        "SELECT count(*) AS n FROM export_jobs WHERE tenant_id = %(t)s", {"t": acme.id}
    )
    assert count_after == count_before


async def test_the_list_refuses_a_bad_limit(client, acme):
    for limit in ("0", "501", "many"):
        r = await client.get("/exports", params={"limit": limit}, headers=acme.operator)
        assert r.status_code == 422
        assert "limit" in r.json()["detail"]


async def test_an_oversized_body_is_413(client, factory, acme):
    job = await factory.queued(acme.id, acme.destination_id)

    r = await client.post(
        f"/exports/{job.id}/cancellations",
        content=b'{"reason": "' + b"x" * 70_000 + b'"}',
        headers={**acme.operator, "Content-Type": "application/json"},
    )

    assert r.status_code == 413
    assert await factory.status(job.id) == JobStatus.QUEUED


@pytest.mark.parametrize(
    "authorization", [None, "Basic dXNlcjpwYXNz", "Bearer ", "Bearer fx_unknown", "Bearer " + "a" * 500]
)
async def test_a_request_without_a_valid_bearer_token_is_401(client, factory, acme, authorization):
    job = await factory.queued(acme.id, acme.destination_id)
    headers = {"Authorization": authorization} if authorization else {}

    r = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body(), headers=headers)

    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert await factory.status(job.id) == JobStatus.QUEUED


async def test_a_cookie_authenticated_write_needs_the_console_header(client, factory, acme):
    job = await factory.queued(acme.id, acme.destination_id)
    await sign_in(client, acme)
    try:
        forged = await client.post(f"/exports/{job.id}/cancellations", json=cancel_body())
        assert forged.status_code == 403
        assert await factory.status(job.id) == JobStatus.QUEUED

        console = await client.post(
            f"/exports/{job.id}/cancellations", json=cancel_body(), headers={CONSOLE_HEADER: "1"}
        )
        assert console.status_code == 200
    finally:
        client.cookies.clear()


# -- webhook endpoints (issue 26, item 1) ------------------------------------------------------------------


@pytest.fixture(scope="module")
async def globex_hook(client, factory, database, globex) -> dict[str, Any]:
    """One of globex's webhook endpoints with one delivery (a Completed export fanned out to it)."""
    from db.pool import open_pool
    from db.stores.notifications import NotificationStore

    created = await client.post(
        "/webhook-endpoints",
        json={"url": "https://hooks.globex.example/in", "events": ["export.completed"]},
        headers=globex.admin,
    )
    assert created.status_code == 201
    endpoint_id = created.json()["endpoint"]["id"]
    await factory.in_status(JobStatus.COMPLETED, job=await factory.queued(globex.id, globex.destination_id))
    pool = await open_pool(database.app_url, "exports_dispatcher", max_size=1)
    try:
        await NotificationStore(pool).fan_out_notification_events(500, 86400.0)
    finally:
        await pool.close()
    rows = await factory.admin(
        "SELECT id FROM webhook_deliveries WHERE endpoint_id = %(e)s", {"e": endpoint_id}
    )
    return {"endpoint": endpoint_id, "delivery": str(rows[0]["id"])}


def hook_routes(ids: dict[str, Any]) -> list[tuple[str, str, str, dict[str, Any] | None, dict[str, str]]]:
    """(name, method, path, json body, extra headers) for every route that names one webhook endpoint."""
    base = f"/webhook-endpoints/{ids['endpoint']}"
    return [
        ("read", "GET", base, None, {}),
        ("edit", "PATCH", base, {"enabled": False}, {"If-Match": '"1"'}),
        ("rotate", "PATCH", base, {"rotate_secret": True}, {"If-Match": "*"}),
        ("remove", "DELETE", base, None, {}),
        ("deliveries", "GET", f"{base}/deliveries", None, {}),
        ("redeliver", "POST", f"{base}/deliveries/{ids['delivery']}/redelivery", None, {}),
    ]


async def hook_snapshot(factory, endpoint_id: str) -> list[dict[str, Any]]:
    return await factory.admin(
        "SELECT w.*, d.state, d.next_attempt_at, d.redeliveries FROM webhook_endpoints w"
        " LEFT JOIN webhook_deliveries d ON d.endpoint_id = w.id WHERE w.id = %(e)s",
        {"e": endpoint_id},
    )


@pytest.mark.parametrize("route", ["read", "edit", "rotate", "remove", "deliveries", "redeliver"])
async def test_another_tenants_webhook_endpoint_looks_exactly_like_a_missing_one(
    client, factory, acme, globex_hook, route
):
    missing = {"endpoint": str(uuid.uuid4()), "delivery": str(uuid.uuid4())}
    _, method, path, body, extra = next(r for r in hook_routes(globex_hook) if r[0] == route)
    _, _, missing_path, _, _ = next(r for r in hook_routes(missing) if r[0] == route)
    before = await hook_snapshot(factory, globex_hook["endpoint"])
    headers = {**acme.admin, **extra}  # the role that may manage endpoints

    theirs = await client.request(method, path, json=body, headers=headers)
    absent = await client.request(method, missing_path, json=body, headers=headers)

    assert theirs.status_code == absent.status_code == 404
    assert theirs.json() == absent.json()
    assert await hook_snapshot(factory, globex_hook["endpoint"]) == before


async def test_another_tenants_delivery_through_ones_own_endpoint_is_missing_too(
    client, factory, acme, globex_hook
):
    mine = await client.post(
        "/webhook-endpoints",
        json={"url": "https://hooks.acme.example/in", "events": ["export.completed"]},
        headers=acme.admin,
    )
    own = mine.json()["endpoint"]["id"]
    before = await hook_snapshot(factory, globex_hook["endpoint"])

    theirs = await client.post(
        f"/webhook-endpoints/{own}/deliveries/{globex_hook['delivery']}/redelivery", headers=acme.admin
    )
    absent = await client.post(
        f"/webhook-endpoints/{own}/deliveries/{uuid.uuid4()}/redelivery", headers=acme.admin
    )

    assert theirs.status_code == absent.status_code == 404
    assert theirs.json() == absent.json()
    assert await hook_snapshot(factory, globex_hook["endpoint"]) == before
    listed = await client.get("/webhook-endpoints", headers=acme.admin)
    assert globex_hook["endpoint"] not in listed.text


async def test_the_console_shows_another_tenants_webhook_endpoint_as_not_found(client, acme, globex_hook):
    await sign_in(client, acme, as_role="admin")
    try:
        theirs = await client.get(f"/console/webhook-endpoints/{globex_hook['endpoint']}")
        absent = await client.get(f"/console/webhook-endpoints/{uuid.uuid4()}")
        listed = await client.get("/console/webhook-endpoints")
    finally:
        client.cookies.clear()

    assert theirs.status_code == absent.status_code == 404
    assert theirs.text == absent.text
    assert listed.status_code == 200 and globex_hook["endpoint"] not in listed.text


# -- the ledger and the approvals (issue #26): another tenant's looks like a missing one ------------------


@pytest.fixture(scope="module")
async def globex_approval(client, factory, globex) -> dict[str, Any]:
    """A waiting approval of globex's (a correction its reconciler asked for), and a pause of its own."""
    completed, _ = await factory.in_status(
        JobStatus.COMPLETED, job=await factory.queued(globex.id, globex.destination_id)
    )
    asked = await client.post(
        f"/exports/{completed.id}/corrections", json=CORRECTION, headers=globex.reconciler
    )
    assert asked.status_code == 202, asked.text
    paused = await client.post(
        "/switches/pause",
        json={"scope": "destination", "destination_id": str(globex.destination_id), "reason": "globex's own"},
        headers=globex.operator,
    )
    return {"approval": asked.json()["approval"]["id"], "pause": paused.json()["pause_id"]}


APPROVAL_ROUTES = [
    ("read", "GET", "", None),
    ("approve", "POST", "/approval", {"reason": "mine now"}),
    ("decline", "POST", "/refusal", {"reason": "mine now"}),
]


@pytest.mark.parametrize(
    ("name", "method", "suffix", "body"), APPROVAL_ROUTES, ids=[r[0] for r in APPROVAL_ROUTES]
)
async def test_another_tenants_approval_looks_exactly_like_a_missing_one(
    client, factory, acme, globex_approval, name, method, suffix, body
):
    theirs = await client.request(
        method, f"/approvals/{globex_approval['approval']}{suffix}", json=body, headers=acme.reconciler
    )
    absent = await client.request(
        method, f"/approvals/{uuid.uuid4()}{suffix}", json=body, headers=acme.reconciler
    )

    assert theirs.status_code == absent.status_code == 404
    assert theirs.json() == absent.json()
    [row] = await factory.admin(
        "SELECT decision FROM approvals WHERE id = %(a)s", {"a": globex_approval["approval"]}
    )
    assert row["decision"] is None


async def test_another_tenants_approvals_and_ledger_rows_are_never_listed(
    client, acme, globex, globex_approval
):
    listed = await client.get("/approvals", headers=acme.admin)
    assert globex_approval["approval"] not in listed.text
    # acme's ledger holds acme's own actions only (its probes of globex's IDs above included: they are acme's)
    page = (await client.get("/audit", params={"limit": 500}, headers=acme.admin)).json()["actions"]
    lines = [
        json.loads(line) for line in (await client.get("/audit.jsonl", headers=acme.admin)).text.splitlines()
    ]
    for rows in (page, lines):
        assert rows and {r["tenant_id"] for r in rows} == {str(acme.id)}
        assert not any(r["principal"].endswith("@globex") for r in rows)
    # globex's request of that approval is globex's: acme filtering by it finds only its own probes
    theirs = (
        await client.get("/audit", params={"subject_id": globex_approval["approval"]}, headers=acme.admin)
    ).json()
    assert all(r["principal"].endswith("@acme") for r in theirs["actions"])


async def test_another_tenants_pause_looks_like_a_missing_one_to_a_resume(
    client, factory, acme, globex_approval
):
    body = {"scope": "destination", "destination_id": str(acme.destination_id), "reason": "mine now"}
    theirs = await client.post(
        "/switches/resume", json={**body, "pause_id": globex_approval["pause"]}, headers=acme.operator
    )
    absent = await client.post(
        "/switches/resume", json={**body, "pause_id": str(uuid.uuid4())}, headers=acme.operator
    )

    assert theirs.status_code == absent.status_code == 422
    assert theirs.json() == absent.json()
    [row] = await factory.admin(
        "SELECT released_at FROM delivery_pauses WHERE id = %(p)s", {"p": globex_approval["pause"]}
    )
    assert row["released_at"] is None


async def test_the_console_shows_another_tenants_ledger_and_approvals_to_no_one(
    client, acme, globex_approval
):
    await sign_in(client, acme, as_role="admin")
    try:
        audit = await client.get("/console/audit")
        approvals = await client.get("/console/approvals")
    finally:
        client.cookies.clear()
    assert audit.status_code == approvals.status_code == 200
    assert globex_approval["approval"] not in approvals.text
    assert "globex" not in audit.text + approvals.text  # no row of theirs (their principals are *@globex)
