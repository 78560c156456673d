"""The builder against the real database, as the worker's role: exact bytes and hash, prompt cancellation
with nothing left on disk, failures as one typed error without data."""

from __future__ import annotations

import asyncio
import hashlib
import stat
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from db.builder import BuildError, BuiltFile, build_export, remove_export_file
from db.pool import open_pool
from testbed import pg
from tests.support.eventually import eventually
from tests.support.factories import Factory

CONTACTS = [
    ("ada@example.com", "Ada", "Lovelace"),
    ("grace@example.com", "Grace", "Hopper, Rear Adm."),  # a comma: quoted
    ("q@example.com", 'Quote "Q"', ""),  # quotes doubled; an empty string is "" (NULL would be bare)
    ("multi@example.com", "Line\nBreak", "Zoë"),  # a newline: quoted; UTF-8 as is
]
EXPECTED = (
    b"email,first_name,last_name\n"
    b"ada@example.com,Ada,Lovelace\n"
    b'grace@example.com,Grace,"Hopper, Rear Adm."\n'
    b'q@example.com,"Quote ""Q""",""\n'
    b'multi@example.com,"Line\nBreak",Zo\xc3\xab\n'
)


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
        delivery_key=str(uuid.uuid4()),
        attempt_id=uuid.uuid4(),
        work_dir=work_dir,
        **kw,
    )


async def many_contacts(factory: Factory, count: int) -> tuple[uuid.UUID, str]:
    tenant_id = await factory.tenant()
    list_name = f"big-{uuid.uuid4().hex[:6]}"
    await factory.admin(
        "INSERT INTO contacts (tenant_id, list_name, email, first_name, last_name)"
        " SELECT %(t)s, %(l)s, 'person' || g || '@example.com', 'First' || g, 'Last' || g"
        " FROM generate_series(1, %(n)s) g",
        {"t": tenant_id, "l": list_name, "n": count},
    )
    return tenant_id, list_name


def leftovers(work_dir: Path) -> list[Path]:
    return sorted(work_dir.rglob("*")) if work_dir.exists() else []


async def blocked_backends(factory: Factory, holder_pid: int) -> list[int]:
    rows = await factory.admin(
        "SELECT pid FROM pg_stat_activity WHERE %(h)s = ANY(pg_blocking_pids(pid))", {"h": holder_pid}
    )
    return [r["pid"] for r in rows]


async def wait_for_blocked(factory: Factory, holder_pid: int) -> int:
    """Wait until a backend is waiting on the holder's lock (a condition, not a guess at timing)."""
    pids = await eventually(
        lambda: blocked_backends(factory, holder_pid),
        "the build waiting on the held lock",
        within=10,
        interval=0.02,
    )
    return pids[0]


async def build_ended_by(
    factory: Factory, database: pg.TestDatabase, pool, work_dir: Path, function: str
) -> tuple[str, BuildError]:
    """A build held behind a lock on contacts, then ended from outside by ``function`` (the server's
    pg_terminate_backend or pg_cancel_backend on its backend); the list's name and the build's error."""
    tenant_id, list_name = await many_contacts(factory, 10)
    ends = {
        "pg_terminate_backend": "SELECT pg_terminate_backend(%(p)s)",
        "pg_cancel_backend": "SELECT pg_cancel_backend(%(p)s)",
    }
    async with await psycopg.AsyncConnection.connect(database.admin_url) as holder:
        await holder.execute("LOCK TABLE contacts IN ACCESS EXCLUSIVE MODE")
        task = asyncio.create_task(build(pool, tenant_id, list_name, work_dir))
        blocked_pid = await wait_for_blocked(factory, holder.info.backend_pid)
        await factory.admin(ends[function], {"p": blocked_pid})
        with pytest.raises(BuildError) as caught:
            await task
        await holder.rollback()
    return list_name, caught.value


async def test_builds_exact_csv_bytes_and_hash_of_the_tenants_list_only(
    factory: Factory, worker_pool, tmp_path
):
    tenant_id = await factory.tenant()
    await factory.contacts(tenant_id, "spring", CONTACTS)
    await factory.contacts(tenant_id, "autumn", [("other-list@example.com", "Not", "Included")])
    other_tenant = await factory.tenant("globex")
    await factory.contacts(other_tenant, "spring", [("other-tenant@example.com", "Not", "Included")])
    seen: list[tuple[int, int]] = []

    built = await build(
        worker_pool, tenant_id, "spring", tmp_path / "work", progress=lambda r, b: seen.append((r, b))
    )

    assert built.path.read_bytes() == EXPECTED
    assert (built.size, built.sha256, built.rows) == (len(EXPECTED), hashlib.sha256(EXPECTED).digest(), 4)
    assert built.path.name == built.final_name and built.final_name.startswith("contacts-")
    assert stat.S_IMODE(built.path.parent.stat().st_mode) == 0o700  # private directory
    assert stat.S_IMODE(built.path.stat().st_mode) == 0o600
    assert seen[-1] == (4, len(EXPECTED))  # the caller can heartbeat from it


async def test_an_empty_list_is_the_header_alone(factory: Factory, worker_pool, tmp_path):
    built = await build(worker_pool, await factory.tenant(), "nobody", tmp_path)
    assert built.path.read_bytes() == b"email,first_name,last_name\n"
    assert built.rows == 0


async def test_remove_export_file_removes_the_private_directory_and_is_idempotent(
    factory: Factory, worker_pool, tmp_path
):
    tenant_id = await factory.tenant()
    await factory.contacts(tenant_id, "l", CONTACTS[:1])
    built = await build(worker_pool, tenant_id, "l", tmp_path)

    assert remove_export_file(built.path) is True
    assert leftovers(tmp_path) == []
    assert remove_export_file(built.path) is True


async def test_cancel_mid_stream_stops_promptly_and_leaves_no_file(factory: Factory, worker_pool, tmp_path):
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
            progress=cancel_at_first_progress,
            progress_interval=0.01,
        )
    )
    with pytest.raises(asyncio.CancelledError):
        await task
    assert progressed.is_set()  # it was cancelled mid-stream, after rows had been written
    assert leftovers(tmp_path) == []

    # The pool is still healthy: the next build runs to the end.
    built = await build(worker_pool, tenant_id, list_name, tmp_path)
    assert built.rows == 120_000


async def test_cancel_while_the_query_waits_stops_promptly_and_frees_the_server(
    factory: Factory, database: pg.TestDatabase, worker_pool, tmp_path
):
    tenant_id, list_name = await many_contacts(factory, 10)
    async with await psycopg.AsyncConnection.connect(database.admin_url) as holder:
        await holder.execute("LOCK TABLE contacts IN ACCESS EXCLUSIVE MODE")
        holder_pid = holder.info.backend_pid
        task = asyncio.create_task(build(worker_pool, tenant_id, list_name, tmp_path))
        await wait_for_blocked(factory, holder_pid)

        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - started < 2.0
        assert leftovers(tmp_path) == []
        # The server abandoned the query while the lock is still held (a cancel request, not a closed socket).
        assert await blocked_backends(factory, holder_pid) == []
        await holder.rollback()


async def test_a_dropped_connection_is_a_build_error_without_data(
    factory: Factory, database: pg.TestDatabase, worker_pool, tmp_path
):
    list_name, error = await build_ended_by(factory, database, worker_pool, tmp_path, "pg_terminate_backend")

    assert error.code in {"CopyFailed", "DatabaseError"}
    # The server went away under the build (a restart's admin_shutdown): the attempt is given back, not failed.
    assert error.transient
    assert list_name not in str(error) and "example.com" not in str(error)
    # no driver exception (whose message could hold data) travels with it
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    assert leftovers(tmp_path) == []


async def test_a_query_cancelled_by_someone_else_is_a_build_error_that_would_recur_so_not_transient(
    factory: Factory, database: pg.TestDatabase, worker_pool, tmp_path
):
    _, error = await build_ended_by(factory, database, worker_pool, tmp_path, "pg_cancel_backend")

    assert (error.code, str(error), error.transient) == (
        "CopyFailed",
        "CopyFailed: sqlstate=57014",
        False,
    )
    assert leftovers(tmp_path) == []


async def test_an_unusable_work_dir_is_a_build_error(factory: Factory, worker_pool, tmp_path):
    not_a_dir = tmp_path / "plain-file"
    not_a_dir.write_text("")

    with pytest.raises(BuildError) as caught:
        await build(worker_pool, await factory.tenant(), "l", not_a_dir)
    assert caught.value.code == "WorkDirUnusable"


def test_a_failed_removal_is_reported_for_the_scavenger_not_claimed(tmp_path, caplog):
    stuck = tmp_path / "build-x" / "contacts-k.csv"
    stuck.mkdir(parents=True)  # unlink() cannot remove it, even as root

    with caplog.at_level("WARNING", logger="fenced.builder"):
        assert remove_export_file(stuck) is False

    assert stuck.exists()
    (record,) = caplog.records
    assert record.export_file == str(stuck) and record.error.startswith("IsADirectoryError")
