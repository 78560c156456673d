"""The builder in a destination's format, against the real database as the worker's role, with Debian's
GnuPG as the partner's decryptor: the CSV's header, delimiter and columns come from COPY itself; gzip and
OpenPGP stream after it; what is recorded (both hashes and sizes, rows, fingerprints) is what the partner
gets back; an unusable key fails the build before any row is read, and a cancel leaves no file and no gpg."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from db.builder import BuildError, BuiltFile, build_export
from db.pool import open_pool
from domain.file_format import FileFormat
from testbed import pg
from testbed.gpg import GpgIdentity
from tests.db.test_builder import CONTACTS, leftovers, many_contacts
from tests.support.factories import Factory


@pytest.fixture(scope="module")
async def worker_pool(database: pg.TestDatabase) -> AsyncIterator:
    pool = await open_pool(database.app_url, "exports_worker", max_size=4)
    yield pool
    await pool.close()


async def build(pool, tenant_id: uuid.UUID, list_name: str, work_dir: Path, **kw) -> BuiltFile:
    return await build_export(
        pool,
        tenant_id=tenant_id,
        list_name=list_name,
        delivery_key=f"k-{uuid.uuid4().hex[:8]}",
        attempt_id=uuid.uuid4(),
        work_dir=work_dir,
        **kw,
    )


async def spring_list(factory: Factory) -> uuid.UUID:
    tenant_id = await factory.tenant()
    await factory.contacts(tenant_id, "spring", CONTACTS)
    return tenant_id


def gpg_children() -> list[int]:
    """This process's gpg children still alive (a cancelled build must leave none)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if comm == "gpg" and int(rest[1]) == os.getpid() and rest[0] != "Z":
            found.append(int(entry.name))
    return found


async def test_the_destinations_header_delimiter_and_columns_shape_the_csv(
    factory: Factory, worker_pool, tmp_path
):
    tenant_id = await spring_list(factory)

    built = await build(
        worker_pool,
        tenant_id,
        "spring",
        tmp_path,
        file_format=FileFormat(header=False, delimiter=";", columns=("last_name", "email")),
    )

    assert built.path.read_bytes() == (
        b"Lovelace;ada@example.com\n"
        b"Hopper, Rear Adm.;grace@example.com\n"  # a comma needs no quotes with ';'
        b'"";q@example.com\n'
        b"Zo\xc3\xab;multi@example.com\n"
    )
    assert built.rows == 4 and built.final_name.endswith(".csv")
    assert built.plain_sha256 == built.sha256 == hashlib.sha256(built.path.read_bytes()).digest()


async def test_a_tab_delimited_file_with_its_header_names_only_the_chosen_columns(
    factory: Factory, worker_pool, tmp_path
):
    tenant_id = await spring_list(factory)

    built = await build(
        worker_pool, tenant_id, "spring", tmp_path, file_format=FileFormat(delimiter="\t", columns=("email",))
    )

    lines = built.path.read_bytes().splitlines()
    assert lines[0] == b"email" and lines[1:] == [c[0].encode() for c in CONTACTS]
    assert built.rows == 4


async def test_gzipped_encrypted_and_signed_each_partner_gets_exactly_the_recorded_csv(
    factory: Factory,
    worker_pool,
    tmp_path,
    partner_key: GpgIdentity,
    second_partner_key: GpgIdentity,
    tenant_key: GpgIdentity,
):
    tenant_id, list_name = await many_contacts(factory, 30_000)
    file_format = FileFormat(
        compression="gzip",
        recipient_keys=(partner_key.public_key, second_partner_key.public_key),
        signing_key_ref=str(tenant_key.secret_key_file),
    )
    plain = await build(worker_pool, tenant_id, list_name, tmp_path / "plain")

    built = await build(worker_pool, tenant_id, list_name, tmp_path / "pgp", file_format=file_format)

    assert built.final_name.endswith(".csv.gz.pgp") and built.path.name == built.final_name
    delivered = built.path.read_bytes()
    assert (built.size, built.sha256) == (len(delivered), hashlib.sha256(delivered).digest())
    # The plaintext recorded is the CSV the plain build wrote, byte for byte.
    assert (built.plain_size, built.plain_sha256, built.rows) == (plain.size, plain.sha256, 30_000)
    for partner in (partner_key, second_partner_key):
        decrypted = partner.decrypt(built.path)
        assert decrypted.returncode == 0 and decrypted.has("VALIDSIG", tenant_key.fingerprint)
        assert hashlib.sha256(gzip.decompress(decrypted.data)).digest() == built.plain_sha256
    evidence = built.evidence()
    assert evidence["recipients"] == [partner_key.fingerprint, second_partner_key.fingerprint]
    assert evidence["signer"] == tenant_key.fingerprint
    assert evidence["plaintext"] == {"bytes": plain.size, "sha256": plain.sha256.hex()}
    assert (evidence["bytes"], evidence["sha256"], evidence["rows"]) == (
        len(delivered),
        built.sha256.hex(),
        30_000,
    )
    assert "BEGIN PGP" not in str(evidence) and str(tenant_key.secret_key_file) not in str(evidence)


async def test_an_unusable_partner_key_fails_the_build_before_any_row_is_read(
    factory: Factory, database: pg.TestDatabase, worker_pool, tmp_path
):
    tenant_id = await spring_list(factory)
    not_a_key = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nbm90IGEga2V5\n-----END PGP PUBLIC KEY BLOCK-----\n"

    # contacts is locked: a build that sent its COPY would wait here, not fail.
    async with await psycopg.AsyncConnection.connect(database.admin_url) as holder:
        await holder.execute("LOCK TABLE contacts IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(BuildError) as failed:
            await asyncio.wait_for(
                build(
                    worker_pool,
                    tenant_id,
                    "spring",
                    tmp_path,
                    file_format=FileFormat(recipient_keys=(not_a_key,)),
                ),
                timeout=20,
            )
        await holder.rollback()

    assert failed.value.code == "RecipientKeyUnusable" and not failed.value.transient
    assert "bm90IGEga2V5" not in str(failed.value)
    assert leftovers(tmp_path) == []


async def test_cancel_mid_stream_of_an_encrypted_build_leaves_no_file_and_no_gpg(
    factory: Factory, worker_pool, tmp_path, partner_key: GpgIdentity
):
    tenant_id, list_name = await many_contacts(factory, 120_000)
    task: asyncio.Task | None = None
    progressed = asyncio.Event()

    def cancel_at_first_progress(rows: int, size: int) -> None:
        progressed.set()
        assert task is not None
        task.cancel()

    task = asyncio.create_task(
        build(
            worker_pool,
            tenant_id,
            list_name,
            tmp_path,
            file_format=FileFormat(compression="gzip", recipient_keys=(partner_key.public_key,)),
            progress=cancel_at_first_progress,
            progress_interval=0.01,
        )
    )
    with pytest.raises(asyncio.CancelledError):
        await task

    assert progressed.is_set()
    assert leftovers(tmp_path) == []
    assert gpg_children() == []
