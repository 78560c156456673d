"""A tenant's destinations as versioned contracts over HTTP, from the command line and in the console (issue
#24, item 1): an admin creates, edits (If-Match on the version) and retires; every change is the next version,
recorded with who, the role, when, why and each field before and after; operators and viewers read and are
refused every change (403, nothing recorded); another tenant's destination looks missing; a credential stays a
reference, shown as "set" and never by its value, in answers, history, errors and pages alike."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import httpx
import pytest

from tests.api.conftest import TenantKeys, another, approve, client_for, sign_in
from tests.api.test_starter import starter

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPkLLBUVE9SUkdp3lQTifL94fdkAhpAlZBUlQmAzSPsD"
OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBSeB5jnKD5SRjOa2kPNKGX0L/Jk5TKpTx7k4r0YsBgE"
SECRET_PATH = "/etc/fenced-exports/keys/partner-7f3a9c_ed25519"


def new_destination(**overrides: Any) -> dict[str, Any]:
    body = {
        "name": f"partner-{uuid.uuid4().hex[:6]}",
        "host": "sftp.partner.example",
        "port": 2222,
        "username": "acme-drop",
        "host_key": HOST_KEY,
        "credential_ref": SECRET_PATH,
        "remote_dir": "/incoming",
        "reason": "onboarding the partner",
    }
    body.update(overrides)
    return body


async def create(client: httpx.AsyncClient, keys: TenantKeys, **overrides: Any) -> dict[str, Any]:
    r = await client.post(
        "/destinations",
        json=new_destination(**overrides),
        headers={**keys.admin, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 201, r.text
    return r.json()["destination"]


async def recorded(factory, destination_id) -> dict[str, Any]:
    """Everything a request could have changed about a destination: its row and its recorded versions."""
    row = await factory.admin("SELECT * FROM destinations WHERE id = %(d)s", {"d": destination_id})
    versions = await factory.admin(
        "SELECT * FROM destination_versions WHERE destination_id = %(d)s ORDER BY version",
        {"d": destination_id},
    )
    return {"row": row, "versions": versions}


# -- an admin creates, reads, edits and retires ------------------------------------------------------------


async def test_an_admin_creates_a_destination_as_version_1_paused_with_its_reference_shown_as_set(
    client, factory, acme
):
    body = new_destination()
    key = str(uuid.uuid4())

    r = await client.post("/destinations", json=body, headers={**acme.admin, "Idempotency-Key": key})

    assert r.status_code == 201, r.text
    assert r.headers["ETag"] == '"1"'
    created = r.json()["destination"]
    assert r.headers["Location"] == f"/destinations/{created['id']}"
    assert created["version"] == 1 and created["delivery_version"] == 1
    assert created["credential_ref"] == "set"
    assert created["deliveries"] == "paused"  # fail-closed until an operator resumes it
    assert created["host_key_fingerprint"].startswith("SHA256:")
    assert SECRET_PATH not in r.text
    [version] = (await recorded(factory, created["id"]))["versions"]
    assert (version["version"], version["change"], version["changed_by"], version["changed_role"]) == (
        1,
        "created",
        "ada.admin@acme",
        "admin",
    )
    assert version["reason"] == "onboarding the partner"
    assert version["after"]["credential_ref"] == SECRET_PATH  # a reference, stored so a delivery can use it

    replay = await client.post("/destinations", json=body, headers={**acme.admin, "Idempotency-Key": key})
    assert replay.status_code == 200 and replay.json()["replayed"] is True
    assert replay.json()["destination"]["id"] == created["id"]
    other = await client.post(
        "/destinations", json=new_destination(), headers={**acme.admin, "Idempotency-Key": key}
    )
    assert other.status_code == 409 and other.json()["code"] == "idempotency_conflict"
    missing = await client.post("/destinations", json=new_destination(), headers=acme.admin)
    assert missing.status_code == 400


async def test_an_edit_is_the_next_version_recorded_with_who_why_and_each_field_before_and_after(
    client, factory, database, acme
):
    created = await create(client, acme)
    path = f"/destinations/{created['id']}"

    asked = await client.patch(
        path,
        json={"host": "sftp2.partner.example", "credential_ref": "/etc/keys/rotated", "reason": "new server"},
        headers={**acme.admin, "If-Match": '"1"'},
    )
    # where deliveries go and as whom: a second admin approves, and the change is theirs (issue #26)
    assert asked.status_code == 202 and "/etc/keys/rotated" not in asked.text
    r = await approve(client, asked, await another(database, acme, "admin", name="ann.admin@acme"))

    assert r.status_code == 200, r.text
    assert r.headers["ETag"] == '"2"'
    answer = r.json()
    assert answer["changed_fields"] == ["credential_ref", "host"]
    assert answer["delivery_changed"] is True
    assert "rebuilt for this version" in answer["message"]
    shown = await client.get(path, headers=acme.viewer)
    assert shown.status_code == 200 and shown.headers["ETag"] == '"2"'
    latest, first = shown.json()["versions"]
    assert (latest["version"], latest["change"], latest["changed_by"], latest["reason"]) == (
        2,
        "edited",
        "ann.admin@acme",
        "new server",
    )
    assert latest["changes"] == [
        {"field": "credential_ref", "before": "set", "after": "set"},
        {"field": "host", "before": "sftp.partner.example", "after": "sftp2.partner.example"},
    ]
    assert first["version"] == 1
    assert SECRET_PATH not in shown.text and "/etc/keys/rotated" not in shown.text

    renamed = await client.patch(
        path,
        json={"name": "partner-renamed", "reason": "display name"},
        headers={**acme.admin, "If-Match": '"2"'},
    )
    assert renamed.status_code == 200 and renamed.json()["delivery_changed"] is False
    assert renamed.json()["destination"]["delivery_version"] == 2  # a name is no delivery term


async def test_an_edit_needs_the_version_it_was_read_at(client, factory, acme):
    created = await create(client, acme)
    path = f"/destinations/{created['id']}"
    change = {
        "remote_dir": "/moved",
        "reason": "directory moved",
    }  # one admin suffices (not where or as whom)

    assert (await client.patch(path, json=change, headers=acme.admin)).status_code == 428
    malformed = await client.patch(path, json=change, headers={**acme.admin, "If-Match": "1"})
    assert malformed.status_code == 400
    weak = await client.patch(path, json=change, headers={**acme.admin, "If-Match": 'W/"1"'})
    assert weak.status_code == 412
    assert (
        await client.patch(path, json=change, headers={**acme.admin, "If-Match": '"1"'})
    ).status_code == 200

    stale = await client.patch(
        path, json={"remote_dir": "/again", "reason": "again"}, headers={**acme.admin, "If-Match": '"1"'}
    )
    assert stale.status_code == 412 and stale.json()["version"] == 2
    assert len((await recorded(factory, created["id"]))["versions"]) == 2


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"hash_evidence": "ack_file"}, "ack_suffix is required"),
        ({"contract_starts_on": "2030-01-02", "contract_ends_on": "2030-01-01"}, "contract_ends_on"),
        ({"host": None}, "a field given must have a value"),
        (
            {"credential_ref": "-----BEGIN OPENSSH PRIVATE KEY----- b3BlbnNzaC1rZXktdjEAAAAA"},
            "credential_ref",
        ),
        ({"host_key": "ssh-ed25519 AAAAnot-a-key"}, "host_key"),
        ({"reason": "nothing else"}, "at least one field"),
        ({"port": 2200, "reason": None}, "reason"),
    ],
)
async def test_a_change_that_does_not_hold_is_refused_and_changes_nothing(
    client, factory, acme, change, problem
):
    created = await create(client, acme)
    before = await recorded(factory, created["id"])

    r = await client.patch(
        f"/destinations/{created['id']}",
        json={"reason": "why not", **change},
        headers={**acme.admin, "If-Match": '"1"'},
    )

    assert r.status_code == 422, r.text
    assert problem in r.text
    assert "b3BlbnNzaC1rZXktdjEAAAAA" not in r.text  # a refused secret is never echoed
    assert await recorded(factory, created["id"]) == before


async def test_a_nullable_field_is_cleared_by_null(client, acme):
    created = await create(
        client, acme, hash_evidence="ack_file", ack_suffix=".ok", contract_ends_on="2099-12-31"
    )
    r = await client.patch(
        f"/destinations/{created['id']}",
        json={
            "hash_evidence": "read_back",
            "ack_suffix": None,
            "contract_ends_on": None,
            "reason": "no acks",
        },
        headers={**acme.admin, "If-Match": '"1"'},
    )
    assert r.status_code == 200, r.text
    shown = r.json()["destination"]
    assert (shown["ack_suffix"], shown["contract_ends_on"], shown["hash_evidence"]) == (
        None,
        None,
        "read_back",
    )


async def test_a_retirement_is_recorded_once_and_final(client, factory, acme):
    created = await create(client, acme)
    path = f"/destinations/{created['id']}"

    r = await client.post(f"{path}/retirement", json={"reason": "contract over"}, headers=acme.admin)

    assert r.status_code == 200, r.text
    assert r.headers["ETag"] == '"2"'
    assert r.json()["destination"]["retired_by"] == "ada.admin@acme"
    again = await client.post(f"{path}/retirement", json={"reason": "again"}, headers=acme.admin)
    assert again.status_code == 409 and "retired on" in again.json()["detail"]
    edit = await client.patch(
        path, json={"port": 2, "reason": "x"}, headers={**acme.admin, "If-Match": '"2"'}
    )
    assert edit.status_code == 409
    versions = (await recorded(factory, created["id"]))["versions"]
    assert [(v["version"], v["change"], v["reason"]) for v in versions] == [
        (1, "created", "onboarding the partner"),
        (2, "retired", "contract over"),
    ]
    listed = (await client.get("/destinations", headers=acme.viewer)).json()["destinations"]
    assert {"id": created["id"], "name": created["name"], "version": 2, "retired": True} in listed


# -- operators and viewers read; only an admin changes ------------------------------------------------------


def changes(destination_id: str) -> list[tuple[str, str, dict[str, Any], dict[str, str]]]:
    return [
        ("POST", "/destinations", new_destination(), {"Idempotency-Key": str(uuid.uuid4())}),
        ("PATCH", f"/destinations/{destination_id}", {"port": 2022, "reason": "x"}, {"If-Match": '"1"'}),
        ("POST", f"/destinations/{destination_id}/retirement", {"reason": "x"}, {}),
    ]


@pytest.mark.parametrize("role", ["operator", "viewer", "reconciler"])
@pytest.mark.parametrize("which", range(3))
async def test_only_an_admin_changes_a_destination_and_a_refusal_records_nothing(
    client, factory, acme, role, which
):
    created = await create(client, acme)
    method, path, body, headers = changes(created["id"])[which]
    before = await recorded(factory, created["id"])
    count = await factory.admin(
        "SELECT count(*) AS n FROM destinations WHERE tenant_id = %(t)s", {"t": acme.id}
    )

    r = await client.request(method, path, json=body, headers={**getattr(acme, role), **headers})

    assert r.status_code == 403, r.text
    assert r.json()["detail"] == f"the {role} role may not manage destinations; that needs the admin role"
    assert await recorded(factory, created["id"]) == before
    assert (
        await factory.admin("SELECT count(*) AS n FROM destinations WHERE tenant_id = %(t)s", {"t": acme.id})
        == count
    )
    shown = await client.get(f"/destinations/{created['id']}", headers=getattr(acme, role))
    assert shown.status_code == 200 and shown.json()["destination"]["credential_ref"] == "set"


async def test_another_tenants_destination_looks_missing(client, factory, acme, globex):
    created = await create(client, acme)
    path = f"/destinations/{created['id']}"
    before = await recorded(factory, created["id"])

    assert (await client.get(path, headers=globex.admin)).status_code == 404
    edit = await client.patch(
        path, json={"port": 1, "reason": "x"}, headers={**globex.admin, "If-Match": '"1"'}
    )
    assert edit.status_code == 404
    retire = await client.post(f"{path}/retirement", json={"reason": "x"}, headers=globex.admin)
    assert retire.status_code == 404
    listed = (await client.get("/destinations", headers=globex.admin)).json()["destinations"]
    assert created["id"] not in {d["id"] for d in listed}
    assert await recorded(factory, created["id"]) == before


# -- the command line -------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_the_command_line_adds_shows_edits_and_retires_as_an_admin(database, factory, acme):
    add = [
        "--json",
        "destination",
        "add",
        "--name",
        "partner-cli",
        "--host",
        "sftp.cli.example",
        "--user",
        "drop",
        "--host-key",
        HOST_KEY,
        "--credential-ref",
        SECRET_PATH,
        "--remote-dir",
        "/in",
        "--reason",
        "onboarding",
    ]
    code, out, err = await starter(database, *add, tenant=acme.id, principal="ada.admin@acme")
    assert code == 0, err
    created = json.loads(out)
    assert created["outcome_kind"] == "created" and SECRET_PATH not in out
    destination_id = created["destination"]["id"]

    code, out, _ = await starter(
        database,
        "destination",
        "edit",
        destination_id,
        "--version",
        "1",
        "--host-key",
        OTHER_KEY,
        "--reason",
        "key rotated",
        tenant=acme.id,
        principal="ada.admin@acme",
    )
    # pinning a new host key takes two admins (issue #26): it waits for another's approval
    assert code == 0 and out.startswith("Waiting for approval: changing a destination's host"), out
    [waiting] = [
        a
        for a in (
            await factory.admin(
                "SELECT id, requested_by FROM approvals WHERE subject_id = %(d)s", {"d": destination_id}
            )
        )
    ]
    assert waiting["requested_by"] == "ada.admin@acme"
    await another(database, acme, "admin", name="ann.admin@acme")
    code, out, _ = await starter(
        database,
        "approvals",
        "approve",
        str(waiting["id"]),
        "--reason",
        "fingerprint checked by phone",
        tenant=acme.id,
        principal="ann.admin@acme",
    )
    assert code == 0 and out.startswith("Destination partner-cli is at version 2."), out

    code, out, _ = await starter(
        database, "destination", "show", destination_id, tenant=acme.id, principal="vic.view@acme"
    )
    assert code == 0
    assert (
        "version 2" in out
        and re.search(r"^  credential_ref +set$", out, re.MULTILINE)
        and SECRET_PATH not in out
    )
    assert "key rotated" in out and "host_key: " in out

    code, out, _ = await starter(
        database,
        "--json",
        "destination",
        "edit",
        destination_id,
        "--version",
        "1",
        "--port",
        "2",
        "--reason",
        "x",
        tenant=acme.id,
        principal="ada.admin@acme",
    )
    assert code == 1 and json.loads(out)["outcome_kind"] == "stale"

    for principal in ("sam.ops@acme", "vic.view@acme", "nobody@acme"):
        code, out, _ = await starter(
            database,
            "--json",
            "destination",
            "retire",
            destination_id,
            "--reason",
            "x",
            tenant=acme.id,
            principal=principal,
        )
        assert code == 1 and json.loads(out)["outcome_kind"] == "forbidden", principal

    code, out, _ = await starter(
        database,
        "destination",
        "retire",
        destination_id,
        "--reason",
        "partner gone",
        tenant=acme.id,
        principal="ada.admin@acme",
    )
    assert code == 0 and "retired (version 3)" in out
    versions = (await recorded(factory, destination_id))["versions"]
    assert [(v["change"], v["changed_by"]) for v in versions] == [
        ("created", "ada.admin@acme"),
        ("edited", "ann.admin@acme"),
        ("retired", "ada.admin@acme"),
    ]


async def test_the_command_line_refuses_a_secret_as_a_reference_without_repeating_it(database, acme):
    code, out, err = await starter(
        database,
        "destination",
        "add",
        "--name",
        "p",
        "--host",
        "h.example",
        "--user",
        "u",
        "--host-key",
        HOST_KEY,
        "--credential-ref",
        "-----BEGIN OPENSSH PRIVATE KEY----- c2VjcmV0",
        "--remote-dir",
        "/in",
        tenant=acme.id,
        principal="ada.admin@acme",
    )
    assert code == 2 and "credential_ref must be a reference" in out + err
    assert "c2VjcmV0" not in out + err


async def test_a_destination_is_created_with_the_partners_openpgp_keys_shown_by_fingerprint(
    database, factory, acme, partner_key, client, tmp_path
):
    armored = tmp_path / "partner.asc"
    armored.write_text(partner_key.public_key, encoding="ascii")
    add = [
        "--json",
        "destination",
        "add",
        "--name",
        "partner-pgp",
        "--host",
        "sftp.pgp.example",
        "--user",
        "drop",
    ]
    add += ["--host-key", HOST_KEY, "--credential-ref", SECRET_PATH, "--remote-dir", "/in"]

    code, out, err = await starter(
        database, *add, "--pgp-recipient-key", str(armored), tenant=acme.id, principal="ada.admin@acme"
    )

    assert code == 0, err
    created = json.loads(out)["destination"]
    [version] = (await recorded(factory, created["id"]))["versions"]
    assert version["after"]["pgp_recipient_keys"] == [partner_key.public_key]
    code, out, _ = await starter(
        database, "destination", "show", created["id"], tenant=acme.id, principal="vic.view@acme"
    )
    assert re.search(rf"^  pgp_recipient_keys +{partner_key.fingerprint}$", out, re.MULTILINE), out
    assert "BEGIN PGP" not in out

    # Anything but an armored public key block is refused before anything is written, and never repeated.
    secret = "-----BEGIN PGP PRIVATE KEY BLOCK-----\nc2VjcmV0\n-----END PGP PRIVATE KEY BLOCK-----\n"
    r = await client.post(
        "/destinations",
        json=new_destination(pgp_recipient_keys=[secret]),
        headers={**acme.admin, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert r.status_code == 422 and "pgp_recipient_keys" in r.text and "c2VjcmV0" not in r.text


async def test_a_queued_export_to_a_paused_destination_says_why_it_waits(client, factory, acme):
    job = await factory.queued(acme.id, acme.destination_id)
    switch = {"scope": "destination", "destination_id": str(acme.destination_id)}
    reason = "host key changed: presented SHA256:ggJkj0aBYWKw2tgMhwyOxYev6LYU8T5nPJU1Hd2oRAM"
    paused = await client.post("/switches/pause", json={**switch, "reason": reason}, headers=acme.operator)
    assert paused.status_code == 200, paused.text

    view = (await client.get(f"/exports/{job.id}", headers=acme.viewer)).json()
    shown = (await client.get(f"/destinations/{acme.destination_id}", headers=acme.viewer)).json()[
        "destination"
    ]

    name = shown["name"]
    assert (
        view["status_line"]
        == f"Queued (v1): deliveries to {name} are paused: {reason}; it waits for a resume."
    )
    assert (shown["deliveries"], shown["paused_because"]) == ("paused", reason)
    resumed = await client.post(
        "/switches/resume", json={**switch, "reason": "pinned"}, headers=acme.operator
    )
    assert resumed.status_code == 200, resumed.text
    view = (await client.get(f"/exports/{job.id}", headers=acme.viewer)).json()
    shown = (await client.get(f"/destinations/{acme.destination_id}", headers=acme.viewer)).json()[
        "destination"
    ]
    assert (shown["deliveries"], shown["paused_because"]) == ("enabled", None)
    assert view["status_line"] == "Queued (v1), waiting for a worker."


# -- the console ------------------------------------------------------------------------------------------


async def test_the_console_shows_a_destination_its_versions_and_changes_to_every_role(make_app, client, acme):
    created = await create(client, acme)
    await client.patch(
        f"/destinations/{created['id']}",
        json={"remote_dir": "/incoming/v2", "reason": "new drop folder"},
        headers={**acme.admin, "If-Match": '"1"'},
    )
    for role in ("viewer", "operator", "admin"):
        async with client_for(make_app()) as browser:
            await sign_in(browser, acme, role)
            page = await browser.get(f"/console/destinations/{created['id']}")
            assert page.status_code == 200
            assert "version 2" in page.text and "new drop folder" in page.text
            assert "/incoming → /incoming/v2" in page.text
            assert SECRET_PATH not in page.text
            assert ("destination edit" in page.text) == (role == "admin")
            listing = await browser.get("/console/destinations")
            assert created["name"] in listing.text


async def test_the_console_shows_another_tenants_destination_as_missing(make_app, client, acme, globex):
    created = await create(client, acme)
    async with client_for(make_app()) as browser:
        await sign_in(browser, globex, "admin")
        assert (await browser.get(f"/console/destinations/{created['id']}")).status_code == 404
        assert (await browser.get("/console/destinations/not-an-id")).status_code == 404
