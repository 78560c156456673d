"""A destination's manifest (issue #24.6) chosen through its recorded versions: over HTTP, from the command line
and on the console page. It is a delivery term (an edit bumps the delivery version, so a build for the version
before is given back); a value that is not none, sha256, json or both is refused with the field named, and
nothing changes."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.api.conftest import client_for, sign_in
from tests.api.test_destinations import HOST_KEY, SECRET_PATH, create, new_destination, recorded
from tests.api.test_starter import starter


async def test_a_destination_is_created_with_a_manifest_and_an_edit_of_it_is_a_delivery_term(
    client, factory, acme
):
    created = await create(client, acme, manifest="sha256")
    assert created["manifest"] == "sha256"
    default = await create(client, acme)
    assert default["manifest"] == "none"

    r = await client.patch(
        f"/destinations/{created['id']}",
        json={"manifest": "both", "reason": "the partner wants the JSON manifest too"},
        headers={**acme.admin, "If-Match": '"1"'},
    )

    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["changed_fields"] == ["manifest"]
    assert answer["delivery_changed"] is True  # a build for version 1 is given back and rebuilt
    assert answer["destination"]["manifest"] == "both"
    assert answer["destination"]["delivery_version"] == 2
    [_, latest] = (await recorded(factory, created["id"]))["versions"]
    assert (latest["before"]["manifest"], latest["after"]["manifest"]) == ("sha256", "both")


@pytest.mark.parametrize("value", ["md5", "", "SHA256", None, 1])
async def test_a_manifest_that_is_not_a_choice_is_refused_and_changes_nothing(client, factory, acme, value):
    created = await create(client, acme, manifest="json")
    before = await recorded(factory, created["id"])

    r = await client.patch(
        f"/destinations/{created['id']}",
        json={"manifest": value, "reason": "try it"},
        headers={**acme.admin, "If-Match": '"1"'},
    )

    assert r.status_code == 422, r.text
    assert "manifest" in r.text
    assert await recorded(factory, created["id"]) == before

    refused = await client.post(
        "/destinations",
        json=new_destination(manifest="md5"),
        headers={**acme.admin, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert refused.status_code == 422 and "manifest" in refused.text


@pytest.mark.slow
async def test_the_command_line_sets_the_manifest_and_refuses_another_value_clearly(database, factory, acme):
    add = [
        "--json",
        "destination",
        "add",
        "--name",
        "partner-manifest",
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
        "--manifest",
        "both",
    ]
    code, out, err = await starter(database, *add, tenant=acme.id, principal="ada.admin@acme")
    assert code == 0, err
    created = json.loads(out)["destination"]
    assert created["manifest"] == "both"

    code, out, err = await starter(
        database,
        "destination",
        "edit",
        created["id"],
        "--version",
        "1",
        "--manifest",
        "md5",
        "--reason",
        "x",
        tenant=acme.id,
        principal="ada.admin@acme",
    )
    assert code == 2 and "--manifest" in err and "invalid choice" in err
    assert len((await recorded(factory, created["id"]))["versions"]) == 1  # nothing changed

    code, out, err = await starter(
        database,
        "destination",
        "edit",
        created["id"],
        "--version",
        "1",
        "--manifest",
        "none",
        "--reason",
        "the partner stopped reading them",
        tenant=acme.id,
        principal="ada.admin@acme",
    )
    assert code == 0, err
    [row] = (await recorded(factory, created["id"]))["row"]
    assert (row["manifest"], row["version"]) == ("none", 2)


async def test_the_console_page_says_what_is_published_beside_each_file(make_app, client, acme):
    created = await create(client, acme, manifest="both")
    async with client_for(make_app()) as browser:
        await sign_in(browser, acme, "viewer")
        page = await browser.get(f"/console/destinations/{created['id']}")
    assert page.status_code == 200
    assert (
        "<code>.sha256</code> sidecar (for <code>sha256sum -c</code>) and a <code>.manifest.json</code>"
        in page.text
    )
