"""What the partner receives, set and rotated by an admin over HTTP, from the command line and in the console
(issue #24, items 1 and 5): the CSV's header, delimiter and columns and the compression take one admin; the
partner's OpenPGP keys and the signing key's reference take two (asked: 202; approved by another admin). Each
change is the next version and moves the delivery version (a delivery term). A recipient key is shown by its
fingerprint (as Debian's gpg computes it), the signing key's reference as "set"; a bad value is refused with
422 naming the field, nothing is recorded, and a secret given by mistake is never repeated."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest

from testbed.gpg import GpgIdentity
from tests.api.conftest import another, approve, sign_in
from tests.api.test_destinations import create, recorded
from tests.api.test_starter import starter

SIGNING_REF = "/etc/fenced-exports/keys/acme-signing.asc"
SECRET_BLOCK = (
    "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nc2VjcmV0IGtleQ==\n-----END PGP PRIVATE KEY BLOCK-----\n"
)
# An armored block in form, but no key inside: gpg refuses it, as the builder would.
NOT_A_KEY = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nbm90IGEga2V5\n-----END PGP PUBLIC KEY BLOCK-----\n"


async def test_an_admin_sets_the_format_alone_and_it_moves_the_delivery_version(client, acme):
    created = await create(client, acme)
    assert (created["csv_header"], created["csv_delimiter"], created["compression"]) == (True, ",", "none")
    assert created["csv_columns"] == ["email", "first_name", "last_name"]
    assert created["pgp_recipient_keys"] == [] and created["pgp_signing_key_ref"] is None

    r = await client.patch(
        f"/destinations/{created['id']}",
        json={
            "csv_header": False,
            "csv_delimiter": "\t",
            "csv_columns": ["last_name", "email"],
            "compression": "gzip",
            "reason": "the partner's loader wants TSV",
        },
        headers={**acme.admin, "If-Match": '"1"'},
    )

    assert r.status_code == 200, r.text  # one admin: the format decides no one's access
    answer = r.json()
    assert answer["changed_fields"] == ["compression", "csv_columns", "csv_delimiter", "csv_header"]
    assert answer["delivery_changed"] is True
    shown = answer["destination"]
    assert (shown["version"], shown["delivery_version"]) == (2, 2)
    assert (shown["csv_header"], shown["csv_delimiter"], shown["compression"]) == (False, "\t", "gzip")
    assert shown["csv_columns"] == ["last_name", "email"]


async def test_rotating_the_partners_key_takes_two_admins_and_shows_fingerprints_never_key_text(
    client, database, factory, acme, partner_key: GpgIdentity, second_partner_key: GpgIdentity
):
    created = await create(client, acme, pgp_recipient_keys=[partner_key.public_key])
    assert created["pgp_recipient_keys"] == [{"fingerprint": partner_key.fingerprint}]
    path = f"/destinations/{created['id']}"

    asked = await client.patch(
        path,
        json={
            "pgp_recipient_keys": [second_partner_key.public_key],
            "pgp_signing_key_ref": SIGNING_REF,
            "reason": "the partner rotated its key",
        },
        headers={**acme.admin, "If-Match": '"1"'},
    )

    assert asked.status_code == 202, asked.text  # who can read the file: a second admin approves
    assert SIGNING_REF not in asked.text
    assert len((await recorded(factory, created["id"]))["versions"]) == 1  # nothing changed yet
    r = await approve(client, asked, await another(database, acme, "admin"))
    assert r.status_code == 200, r.text
    shown = r.json()["destination"]
    assert shown["pgp_recipient_keys"] == [{"fingerprint": second_partner_key.fingerprint}]
    assert shown["pgp_signing_key_ref"] == "set" and (shown["version"], shown["delivery_version"]) == (2, 2)
    history = (await client.get(path, headers=acme.viewer)).json()["versions"][0]["changes"]
    assert {"field": "pgp_recipient_keys", "before": [partner_key.fingerprint],
            "after": [second_partner_key.fingerprint]} in history  # fmt: skip
    assert {"field": "pgp_signing_key_ref", "before": None, "after": "set"} in history
    await sign_in(client, acme)
    page = await client.get(f"/console/destinations/{created['id']}")
    assert page.status_code == 200 and second_partner_key.fingerprint in page.text
    assert "BEGIN PGP" not in page.text and SIGNING_REF not in page.text
    row = (await recorded(factory, created["id"]))["row"][0]
    assert row["pgp_recipient_keys"] == [second_partner_key.public_key]  # stored, for the builder

    # No encryption any more is a change of who can read the file too: two admins.
    asked = await client.patch(
        path,
        json={"pgp_recipient_keys": [], "pgp_signing_key_ref": None, "reason": "the partner stops PGP"},
        headers={**acme.admin, "If-Match": '"2"'},
    )
    r = await approve(client, asked, await another(database, acme, "admin"))
    assert r.status_code == 200, r.text
    assert r.json()["destination"]["pgp_recipient_keys"] == []
    assert r.json()["destination"]["pgp_signing_key_ref"] is None


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("csv_delimiter", ":", "csv_delimiter"),
        ("csv_delimiter", "tab", "csv_delimiter"),
        ("csv_columns", ["email", "phone"], "csv_columns"),
        ("csv_columns", [], "csv_columns"),
        ("csv_columns", ["email", "email"], "csv_columns names a column twice"),
        ("csv_header", "maybe", "csv_header"),
        ("compression", "zip", "compression"),
        ("pgp_recipient_keys", [SECRET_BLOCK], "never a secret key"),
        ("pgp_recipient_keys", ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIc2VjcmV0IGtleQ=="], "public key block"),
        ("pgp_recipient_keys", [NOT_A_KEY], "gpg cannot encrypt to it"),
        ("pgp_signing_key_ref", SECRET_BLOCK, "pgp_signing_key_ref"),
        ("pgp_signing_key_ref", "", "pgp_signing_key_ref"),
    ],
)
async def test_a_bad_format_or_key_is_refused_naming_the_field_and_changes_nothing(
    client, factory, acme, field, value, problem
):
    created = await create(client, acme)
    before = await recorded(factory, created["id"])

    edited = await client.patch(
        f"/destinations/{created['id']}",
        json={field: value, "reason": "try it"},
        headers={**acme.admin, "If-Match": '"1"'},
    )
    made = await client.post(
        "/destinations",
        json={**_body(), field: value},
        headers={**acme.admin, "Idempotency-Key": str(uuid.uuid4())},
    )

    for r in (edited, made):
        assert r.status_code == 422, r.text
        assert problem in r.text
        assert "c2VjcmV0" not in r.text and "bm90IGEga2V5" not in r.text  # never the value given
    assert await recorded(factory, created["id"]) == before


def _body() -> dict[str, Any]:
    from tests.api.test_destinations import new_destination

    return new_destination()


@pytest.mark.slow  # starter.py processes, one per step: seconds
async def test_the_command_line_sets_the_format_and_rotates_the_key_with_a_second_admin(
    database, acme, partner_key: GpgIdentity, second_partner_key: GpgIdentity, tmp_path
):
    old, new = tmp_path / "old.asc", tmp_path / "new.asc"
    old.write_text(partner_key.public_key, encoding="ascii")
    new.write_text(second_partner_key.public_key, encoding="ascii")
    add = ["--json", "destination", "add", "--name", f"p-{uuid.uuid4().hex[:6]}", "--host", "h.example"]
    add += ["--user", "u", "--host-key", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPkLLBUVE9SUkdp3lQTifL94fdkAhpAlZBUlQmAzSPsD"]  # fmt: skip
    add += [
        "--credential-ref",
        "/keys/login",
        "--remote-dir",
        "/in",
        "--no-csv-header",
        "--csv-delimiter",
        "tab",
    ]
    add += ["--csv-columns", "email,last_name", "--compression", "gzip", "--pgp-recipient-key", str(old)]
    add += ["--pgp-signing-key-ref", SIGNING_REF]
    admin = {"tenant": acme.id, "principal": "ada.admin@acme"}

    code, out, err = await starter(database, *add, **admin)

    assert code == 0, err
    made = json.loads(out)["destination"]
    assert (made["csv_header"], made["csv_delimiter"], made["csv_columns"], made["compression"]) == (
        False,
        "\t",
        ["email", "last_name"],
        "gzip",
    )
    assert made["pgp_recipient_keys"] == [{"fingerprint": partner_key.fingerprint}]
    assert made["pgp_signing_key_ref"] == "set" and SIGNING_REF not in out

    edit = ["destination", "edit", made["id"]]
    code, out, err = await starter(
        database, "--json", *edit, "--version", "1", "--csv-delimiter", "semicolon", "--csv-header",
        "--reason", "the partner's loader changed", **admin,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["destination"]["csv_delimiter"] == ";"  # the format: one admin

    code, out, err = await starter(
        database, "--json", *edit, "--version", "2", "--pgp-recipient-key", str(new), "--no-pgp-signing-key",
        "--reason", "rotated", **admin,
    )  # fmt: skip
    assert code == 0, err
    asked = json.loads(out)["approval"]
    assert asked["state"] == "pending"  # the key: a second admin
    await another(database, acme, "admin", name="ann.admin@acme")
    code, out, err = await starter(
        database, "--json", "approvals", "approve", asked["id"], tenant=acme.id, principal="ann.admin@acme"
    )
    assert code == 0, err
    assert json.loads(out)["destination"]["version"] == 3

    code, out, _ = await starter(database, "destination", "show", made["id"], **admin)
    assert re.search(rf"^  pgp_recipient_keys +{second_partner_key.fingerprint}$", out, re.MULTILINE), out
    assert re.search(r"^  csv_delimiter +semicolon$", out, re.MULTILINE), out
    assert re.search(r"^  pgp_signing_key_ref +-$", out, re.MULTILINE), out
    assert "BEGIN PGP" not in out

    # Bad values are refused before anything is written; a secret key file is never repeated.
    secret = tmp_path / "secret.asc"
    secret.write_text(SECRET_BLOCK, encoding="ascii")
    code, out, err = await starter(
        database, *edit, "--version", "3", "--pgp-recipient-key", str(secret), "--reason", "oops", **admin
    )
    assert code != 0 and "never a secret key" in out + err and "c2VjcmV0" not in out + err
    code, out, err = await starter(
        database, *edit, "--version", "3", "--csv-columns", "email,phone", "--reason", "x", **admin
    )
    assert code == 2 and "--csv-columns" in err
    code, out, err = await starter(
        database, *edit, "--version", "3", "--csv-delimiter", ":", "--reason", "x", **admin
    )
    assert code == 2 and "--csv-delimiter" in err
    code, out, _ = await starter(database, "--json", "destination", "show", made["id"], **admin)
    assert json.loads(out)["destination"]["version"] == 3
