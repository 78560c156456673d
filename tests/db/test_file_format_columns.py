"""Migration 0020's columns: what a destination receives. Existing destinations keep the plain CSV; the
database refuses a bad format (each check by its name) and a secret key in place of a public one; the
worker reads the format and never changes it; seeding refuses a bad format before writing anything, and its
error never repeats a key."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from db.admin import add_destination
from db.errors import ConstraintRefused
from domain.file_format import FileFormat
from testbed import pg
from testbed.gpg import GpgIdentity
from tests.db.test_permissions import acting_as
from tests.support.factories import Factory

SECRET_BLOCK = "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nc2VjcmV0\n-----END PGP PRIVATE KEY BLOCK-----\n"


async def test_a_destination_without_a_format_receives_the_plain_csv_as_before(factory: Factory):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id)

    destination = await factory.worker.load_destination(tenant_id, destination_id)

    assert destination.file_format == FileFormat()
    assert destination.file_format.suffix == ".csv"


async def test_the_worker_reads_the_format_and_the_partners_keys(factory: Factory, partner_key: GpgIdentity):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(
        tenant_id,
        csv_header=False,
        csv_delimiter="|",
        csv_columns=["email", "last_name"],
        compression="gzip",
        pgp_recipient_keys=[partner_key.public_key],
        pgp_signing_key_ref="/run/secrets/acme-signing.asc",
    )

    fmt = (await factory.worker.load_destination(tenant_id, destination_id)).file_format

    assert (fmt.header, fmt.delimiter, fmt.columns, fmt.compression) == (
        False,
        "|",
        ("email", "last_name"),
        "gzip",
    )
    assert (
        fmt.recipient_keys == (partner_key.public_key,)
        and fmt.signing_key_ref == "/run/secrets/acme-signing.asc"
    )
    assert fmt.suffix == ".csv.gz.pgp"


@pytest.mark.parametrize(
    ("column", "value", "constraint"),
    [
        ("csv_delimiter", "x", "ck_destinations_csv_delimiter"),
        ("csv_columns", ["email", "email"], "ck_destinations_csv_columns"),
        ("csv_columns", ["email", "phone"], "ck_destinations_csv_columns"),
        ("csv_columns", [], "ck_destinations_csv_columns"),
        ("compression", "zstd", "ck_destinations_compression"),
        ("pgp_recipient_keys", [SECRET_BLOCK], "ck_destinations_pgp_recipient_keys"),
        ("pgp_recipient_keys", ["not a key"], "ck_destinations_pgp_recipient_keys"),
        ("pgp_signing_key_ref", "", "ck_destinations_pgp_signing_key_ref"),
        ("pgp_signing_key_ref", SECRET_BLOCK, "ck_destinations_pgp_signing_key_ref"),
    ],
)
async def test_the_database_refuses_a_bad_format_by_its_check(factory: Factory, column, value, constraint):
    tenant_id = await factory.tenant()
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        await factory.destination(tenant_id, **{column: value})
    assert refused.value.diag.constraint_name == constraint


async def test_the_worker_never_changes_a_format(database: pg.TestDatabase, factory: Factory):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id)
    async with acting_as(database, "exports_worker") as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute(
                "UPDATE destinations SET compression = 'gzip' WHERE id = %(id)s", {"id": destination_id}
            )
    assert (await factory.worker.load_destination(tenant_id, destination_id)).compression == "none"


async def test_the_dispatcher_reads_no_format(database: pg.TestDatabase, factory: Factory):
    async with acting_as(database, "exports_dispatcher") as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute("SELECT pgp_recipient_keys, pgp_signing_key_ref FROM destinations")


@pytest.mark.parametrize(
    "bad",
    [
        {"pgp_recipient_keys": [SECRET_BLOCK]},
        {"csv_columns": ["email", "email"]},
        {"csv_delimiter": "x"},
    ],
)
async def test_seeding_refuses_a_bad_format_before_writing_and_never_repeats_a_key(
    database: pg.TestDatabase, factory: Factory, bad: dict[str, Any]
):
    tenant_id = await factory.tenant()
    row = {
        "host": "127.0.0.1",
        "port": 22,
        "username": "partner",
        "host_key": "ssh-ed25519 AAAA",
        "credential_ref": "/k",
        "remote_dir": "/u",
    }
    name = f"bad-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ValueError) as refused:
        await add_destination(database.admin_url, tenant_id=tenant_id, name=name, destination={**row, **bad})

    assert "c2VjcmV0" not in str(refused.value) and "PRIVATE" not in str(refused.value)
    assert await factory.admin("SELECT id FROM destinations WHERE name = %(n)s", {"n": name}) == []
    assert not isinstance(refused.value, ConstraintRefused)  # refused before the database was asked
