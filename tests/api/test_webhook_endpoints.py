"""Webhook endpoints over HTTP (issue 26, item 1): a tenant's admins register, change, rotate and remove them;
the signing secret is in the answer that makes it and in no other; every role reads them, a non-admin sees a
URL's origin only; URLs are https (http only to a loopback host); a delivery is redelivered by hand."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from db.pool import open_pool
from db.stores.notifications import NotificationStore
from domain.models import JobStatus
from settings import Settings

HOOK = "https://hooks.example.com/fenced/T0KEN-in-the-path?sig=abc"


def endpoint_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"url": HOOK, "events": ["export.completed", "export.cancellation_lost"]}
    body.update(overrides)
    return body


async def endpoint_count(factory, tenant_id) -> int:
    rows = await factory.admin(
        "SELECT count(*) AS n FROM webhook_endpoints WHERE tenant_id = %(t)s", {"t": tenant_id}
    )
    return rows[0]["n"]


async def test_an_admin_registers_an_endpoint_and_its_secret_is_shown_once(client, factory, acme):
    r = await client.post(
        "/webhook-endpoints", json=endpoint_body(description="CRM sync"), headers=acme.admin
    )

    assert r.status_code == 201, r.text
    secret = r.json()["secret"]
    assert secret.startswith("whsec_") and len(secret) >= 38
    endpoint = r.json()["endpoint"]
    assert endpoint["url"] == HOOK and endpoint["enabled"] is True and endpoint["version"] == 1
    assert endpoint["events"] == ["export.completed", "export.cancellation_lost"]
    assert r.headers["location"] == f"/webhook-endpoints/{endpoint['id']}"
    assert r.headers["etag"] == '"1"'
    for read in (f"/webhook-endpoints/{endpoint['id']}", "/webhook-endpoints"):
        again = await client.get(read, headers=acme.admin)
        assert again.status_code == 200
        assert secret not in again.text and secret.removeprefix("whsec_") not in again.text
        assert "secret" not in again.text


async def test_a_secret_the_tenant_brings_is_used_and_a_malformed_one_refused(client, factory, acme):
    mine = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # 24 bytes
    r = await client.post("/webhook-endpoints", json=endpoint_body(secret=mine), headers=acme.admin)
    assert r.status_code == 201 and r.json()["secret"] == mine

    before = await endpoint_count(factory, acme.id)
    for bad in ("whsec_short", "sk_" + "A" * 40, "whsec_" + "A" * 37 + "!"):
        refused = await client.post("/webhook-endpoints", json=endpoint_body(secret=bad), headers=acme.admin)
        assert refused.status_code == 422, refused.text
        assert bad not in refused.text
    assert await endpoint_count(factory, acme.id) == before


@pytest.mark.parametrize("role", ["viewer", "operator", "reconciler"])
async def test_only_an_admin_manages_endpoints_and_a_refusal_records_nothing(client, factory, acme, role):
    created = await client.post("/webhook-endpoints", json=endpoint_body(), headers=acme.admin)
    endpoint_id = created.json()["endpoint"]["id"]
    headers = getattr(acme, role)
    before = await endpoint_count(factory, acme.id)

    answers = [
        await client.post("/webhook-endpoints", json=endpoint_body(), headers=headers),
        await client.patch(
            f"/webhook-endpoints/{endpoint_id}",
            json={"enabled": False},
            headers={**headers, "If-Match": '"1"'},
        ),
        await client.delete(f"/webhook-endpoints/{endpoint_id}", headers=headers),
        await client.post(
            f"/webhook-endpoints/{endpoint_id}/deliveries/{uuid.uuid4()}/redelivery", headers=headers
        ),
    ]

    assert [a.status_code for a in answers] == [403] * 4
    assert all("admin" in a.json()["detail"] for a in answers)
    assert await endpoint_count(factory, acme.id) == before
    seen = await client.get(f"/webhook-endpoints/{endpoint_id}", headers=headers)
    assert seen.status_code == 200 and seen.json()["endpoint"]["enabled"] is True
    # a non-admin reads the endpoint, but not the path and query of its URL (they may carry a token)
    assert seen.json()["endpoint"]["url"] == "https://hooks.example.com/…"
    assert "T0KEN" not in seen.text


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://hooks.example.com/x", "https"),
        ("http://10.0.0.8/x", "https"),
        ("ftp://hooks.example.com/x", "https"),
        ("https://user:pass@hooks.example.com/x", "password"),
        ("https://hooks.example.com/x#frag", "fragment"),
        ("https:///nohost", "host"),
        ("https://hooks.example.com:99999/x", "port"),
    ],
)
async def test_an_endpoint_url_must_be_https_without_credentials(client, factory, acme, url, why):
    before = await endpoint_count(factory, acme.id)

    r = await client.post("/webhook-endpoints", json=endpoint_body(url=url), headers=acme.admin)

    assert r.status_code == 422, r.text
    assert why in r.json()["detail"]
    assert await endpoint_count(factory, acme.id) == before


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8099/hooks", "http://localhost/hooks", "http://[::1]:81/h"]
)
async def test_plain_http_is_allowed_to_a_loopback_receiver(client, acme, url):
    r = await client.post("/webhook-endpoints", json=endpoint_body(url=url), headers=acme.admin)
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    "body",
    [
        {"url": HOOK, "events": []},
        {"url": HOOK, "events": ["export.completed", "export.completed"]},
        {"url": HOOK, "events": ["export.exploded"]},
        {"url": HOOK},
        {"url": HOOK, "events": ["export.completed"], "enabled": False},
    ],
)
async def test_a_malformed_registration_is_422_and_records_nothing(client, factory, acme, body):
    before = await endpoint_count(factory, acme.id)
    r = await client.post("/webhook-endpoints", json=body, headers=acme.admin)
    assert r.status_code == 422, r.text
    assert await endpoint_count(factory, acme.id) == before


async def test_an_edit_needs_the_version_read_and_a_rotated_secret_is_shown_once(client, acme):
    created = await client.post("/webhook-endpoints", json=endpoint_body(), headers=acme.admin)
    path = f"/webhook-endpoints/{created.json()['endpoint']['id']}"

    missing = await client.patch(path, json={"enabled": False}, headers=acme.admin)
    edited = await client.patch(
        path, json={"enabled": False, "events": ["export.failed"]}, headers={**acme.admin, "If-Match": '"1"'}
    )
    stale = await client.patch(path, json={"enabled": True}, headers={**acme.admin, "If-Match": '"1"'})
    rotated = await client.patch(
        path, json={"rotate_secret": True}, headers={**acme.admin, "If-Match": '"2"'}
    )

    assert missing.status_code == 428
    assert edited.status_code == 200 and edited.json()["endpoint"]["enabled"] is False
    assert edited.json()["endpoint"]["events"] == ["export.failed"] and "secret" not in edited.json()
    assert stale.status_code == 412 and stale.json()["version"] == 2
    assert rotated.status_code == 200 and rotated.json()["endpoint"]["version"] == 3
    assert rotated.json()["secret"] != created.json()["secret"]
    assert rotated.json()["secret"] not in (await client.get(path, headers=acme.admin)).text


async def test_a_removed_endpoint_is_gone_and_a_second_removal_is_404(client, factory, acme):
    created = await client.post("/webhook-endpoints", json=endpoint_body(), headers=acme.admin)
    path = f"/webhook-endpoints/{created.json()['endpoint']['id']}"

    first = await client.delete(path, headers=acme.admin)
    second = await client.delete(path, headers=acme.admin)

    assert first.status_code == 200 and second.status_code == 404
    assert (await client.get(path, headers=acme.admin)).status_code == 404


async def test_the_tenant_may_register_only_so_many_endpoints(make_app, factory, database):
    from tests.api.conftest import client_for, make_tenant

    tenant = await make_tenant(factory, database, "crowded")
    app = make_app()
    app.state.settings = Settings(webhook_max_endpoints=2)
    async with client_for(app) as c:
        answers = [
            await c.post("/webhook-endpoints", json=endpoint_body(), headers=tenant.admin) for _ in range(3)
        ]

    assert [a.status_code for a in answers] == [201, 201, 409]
    assert await endpoint_count(factory, tenant.id) == 2


async def test_deliveries_are_listed_per_endpoint_and_redelivered_by_hand(client, factory, database, acme):
    created = await client.post(
        "/webhook-endpoints",
        json=endpoint_body(url="http://127.0.0.1:9/never", events=["export.completed"]),
        headers=acme.admin,
    )
    endpoint_id = created.json()["endpoint"]["id"]
    job, _ = await factory.in_status(
        JobStatus.COMPLETED, job=await factory.queued(acme.id, acme.destination_id)
    )
    pool = await open_pool(database.app_url, "exports_dispatcher", max_size=1)
    try:
        await NotificationStore(pool).fan_out_notification_events(500, 86400.0)
    finally:
        await pool.close()
    await factory.admin(
        "UPDATE webhook_deliveries SET state = 'failed', attempts = 30, last_error = 'ConnectError',"
        " last_attempt_at = clock_timestamp() WHERE endpoint_id = %(e)s",
        {"e": endpoint_id},
    )

    listed = await client.get(f"/webhook-endpoints/{endpoint_id}/deliveries", headers=acme.viewer)
    failed = await client.get(
        f"/webhook-endpoints/{endpoint_id}/deliveries?state=failed", headers=acme.viewer
    )
    summary = await client.get(f"/webhook-endpoints/{endpoint_id}", headers=acme.viewer)

    (delivery,) = listed.json()["deliveries"]
    assert failed.json()["deliveries"] == [delivery]
    assert (delivery["type"], delivery["export_id"], delivery["state"], delivery["last_error"]) == (
        "export.completed",
        str(job.id),
        "failed",
        "ConnectError",
    )
    assert summary.json()["endpoint"]["deliveries"]["failed"] == 1

    redelivered = await client.post(
        f"/webhook-endpoints/{endpoint_id}/deliveries/{delivery['id']}/redelivery", headers=acme.admin
    )
    unknown = await client.post(
        f"/webhook-endpoints/{endpoint_id}/deliveries/{uuid.uuid4()}/redelivery", headers=acme.admin
    )

    assert redelivered.status_code == 202 and unknown.status_code == 404
    (after,) = (await client.get(f"/webhook-endpoints/{endpoint_id}/deliveries", headers=acme.admin)).json()[
        "deliveries"
    ]
    assert (after["state"], after["redeliveries"], after["event_id"]) == ("pending", 1, delivery["event_id"])
    assert after["redelivered_by"] == "ada.admin@acme"
