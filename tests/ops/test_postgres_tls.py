"""PostgreSQL over ``sslmode=verify-full``: every connection the project opens honours the URL's TLS
parameters, against a real server started with ``ssl=on`` and a certificate signed by a test CA.

The server's ``pg_hba.conf`` rejects every TCP connection that is not TLS, so whatever works here went
over TLS; each test also asks the server (``pg_stat_ssl``) about the very backend it used. No setting is
needed beyond the URL: libpq reads ``sslmode``, ``sslrootcert`` (and ``sslcert``/``sslkey`` for client
certificates) from ``EXPORTS_DATABASE_URL`` for the pools, the builder's COPY (a pool connection), the
dispatcher's LISTEN connection and the migrations alike. A TLS setting that cannot work (a wrong CA, a
missing ``sslrootcert`` file, a certificate for another host) is a refusal no retry fixes: the worker and
the API exit at once with one line naming ``EXPORTS_DATABASE_URL``, not after the start-up retry window.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from temporalio.testing import WorkflowEnvironment

from db.builder import build_export
from db.embedded import free_port
from db.errors import StoreError, TransientStoreError
from db.migrate import APP_ROLES
from db.pool import START_RETRY_SECONDS, open_pool, wait_for_postgres
from db.queries import q
from db.stores.api import ApiStore
from db.stores.outbox import DispatcherStore
from db.stores.protocol import WorkerStore
from runtime.dispatcher import OutboxDispatcher
from settings import Settings
from testbed import pg
from testbed.pg_tls import TlsPostgres, can_run
from testbed.tls import Pki
from tests.conftest import require
from tests.ops.conftest import one_line, upstream_of
from tests.support.eventually import eventually
from tests.support.factories import Factory

ROOT = Path(__file__).resolve().parents[2]
ROLES = APP_ROLES  # every role a process may SET ROLE to
PASSWORD = f"pw-{uuid.uuid4().hex}"  # in the URLs of the refusal tests: it must never be printed
AT_ONCE = 15.0  # seconds from spawn to exit (interpreter, imports, Temporal); the retry window is 60 s


def server_side_tls(admin_url: str, pid: int) -> tuple[bool, str]:
    """What the server says about backend ``pid``'s channel (asked as superuser: a role sees only its own)."""
    with psycopg.connect(admin_url) as admin:
        row = admin.execute("SELECT ssl, version FROM pg_stat_ssl WHERE pid = %(p)s", {"p": pid}).fetchone()
    assert row is not None
    return row


@pytest.fixture(scope="module")
def tls_server(pki: Pki) -> Iterator[TlsPostgres]:
    require(can_run(), "Debian's PostgreSQL server with OpenSSL (apt-get install -y postgresql)")
    server = TlsPostgres.start(pki)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tls_database(tls_server: TlsPostgres) -> pg.TestDatabase:
    """A migrated database on the TLS server; both of its URLs carry sslmode=verify-full and the CA."""
    template = pg.make_template(tls_server.url())
    return pg.clone_database(tls_server.url(), template)


@pytest.fixture(scope="module")
async def tls_factory(tls_database: pg.TestDatabase) -> AsyncIterator[Factory]:
    api = await open_pool(tls_database.app_url, "exports_api", max_size=2)
    worker = await open_pool(tls_database.app_url, "exports_worker", max_size=4)
    yield Factory(tls_database, api=ApiStore(api), worker=WorkerStore(worker, lease_seconds=60))
    await api.close()
    await worker.close()


def test_the_urls_under_test_verify_the_server_and_the_server_refuses_plain_tcp(
    tls_server: TlsPostgres, tls_database: pg.TestDatabase, pki: Pki
) -> None:
    assert "sslmode=verify-full" in tls_database.app_url and "sslrootcert=" in tls_database.app_url
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        psycopg.connect(tls_server.url(sslmode="disable"), connect_timeout=5).close()
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        psycopg.connect(tls_server.url(ca=pki.other_ca_cert), connect_timeout=5).close()


@pytest.mark.parametrize("role", ROLES)
async def test_every_pool_connects_over_verified_tls(tls_database: pg.TestDatabase, role: str) -> None:
    pool = await open_pool(tls_database.app_url, role, min_size=2, max_size=2)  # type: ignore[arg-type]
    try:
        for _ in range(2):
            async with pool.connection() as conn:
                assert conn.pgconn.ssl_in_use
                ssl, version = server_side_tls(tls_database.admin_url, conn.info.backend_pid)
                current = await (await conn.execute("SELECT current_user")).fetchone()
                assert ssl is True and version.startswith("TLS")
                assert current[0] == role
    finally:
        await pool.close()


async def test_the_builder_copies_over_verified_tls(
    tls_factory: Factory, tls_database: pg.TestDatabase, tmp_path: Path
) -> None:
    tenant_id = await tls_factory.tenant()
    list_name = f"tls-{uuid.uuid4().hex[:6]}"
    await tls_factory.admin(
        "INSERT INTO contacts (tenant_id, list_name, email, first_name, last_name)"
        " SELECT %(t)s, %(l)s, 'person' || g || '@example.com', 'First' || g, 'Last' || g"
        " FROM generate_series(1, 50000) g",
        {"t": tenant_id, "l": list_name},
    )
    pool = await open_pool(tls_database.app_url, "exports_worker", max_size=1)
    try:
        async with pool.connection() as conn:  # the one connection the build will borrow
            assert server_side_tls(tls_database.admin_url, conn.info.backend_pid)[0] is True
        started = time.monotonic()
        built = await build_export(
            pool,
            tenant_id=tenant_id,
            list_name=list_name,
            delivery_key=str(uuid.uuid4()),
            attempt_id=uuid.uuid4(),
            work_dir=tmp_path,
        )
        elapsed = time.monotonic() - started
    finally:
        await pool.close()
    assert built.rows == 50_000
    content = built.path.read_bytes()
    assert hashlib.sha256(content).digest() == built.sha256 and len(content) == built.size
    assert content.splitlines()[1] == b"person1@example.com,First1,Last1"
    assert elapsed < 10  # a stalled TLS read loop would show here (it polls every 0.1 s)


async def test_a_cancelled_build_cancels_its_query_over_tls(
    tls_factory: Factory, tls_database: pg.TestDatabase, tmp_path: Path
) -> None:
    tenant_id = await tls_factory.tenant()
    pool = await open_pool(tls_database.app_url, "exports_worker", max_size=1)
    try:
        async with await psycopg.AsyncConnection.connect(tls_database.admin_url) as holder:
            await holder.execute("LOCK TABLE contacts IN ACCESS EXCLUSIVE MODE")
            holder_pid = holder.info.backend_pid
            task = asyncio.create_task(
                build_export(
                    pool,
                    tenant_id=tenant_id,
                    list_name="none",
                    delivery_key=str(uuid.uuid4()),
                    attempt_id=uuid.uuid4(),
                    work_dir=tmp_path,
                )
            )
            blocked = "SELECT pid FROM pg_stat_activity WHERE %(h)s = ANY(pg_blocking_pids(pid))"
            await eventually(
                lambda: tls_factory.admin(blocked, {"h": holder_pid}),
                "the build's COPY waiting on the lock",
                within=4,
                interval=0.02,
            )
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The cancel request reached the server (through verify-full TLS): nothing waits any more.
            assert await tls_factory.admin(blocked, {"h": holder_pid}) == []
            await holder.rollback()
    finally:
        await pool.close()


class CountingDispatcher(OutboxDispatcher):
    """Counts its passes: a NOTIFY heard on the LISTEN connection shows up as one more pass."""

    passes = 0

    async def dispatch_once(self) -> int:
        self.passes += 1
        return await super().dispatch_once()


async def test_the_dispatcher_listens_over_verified_tls(tls_database: pg.TestDatabase) -> None:
    pool = await open_pool(tls_database.app_url, "exports_dispatcher", max_size=2)
    # No outbox rows are written, so nothing is published and no Temporal client is needed.
    dispatcher = CountingDispatcher(
        DispatcherStore(pool),
        client=None,
        settings=Settings(),
        listen_url=tls_database.app_url,
        poll_seconds=60,
    )  # type: ignore[arg-type]
    stop = asyncio.Event()
    running = asyncio.create_task(dispatcher.run(stop))
    try:
        await asyncio.wait_for(dispatcher.ready.wait(), 15)
        async with await psycopg.AsyncConnection.connect(tls_database.admin_url, autocommit=True) as admin:
            listener = await (
                await admin.execute(
                    "SELECT s.ssl, a.usename FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)"
                    " WHERE a.query = %(q)s AND a.datname = current_database()",
                    {"q": q("listen_outbox")},
                )
            ).fetchall()
            assert listener == [(True, pg.APP_LOGIN)]
            passes = dispatcher.passes
            await admin.execute("NOTIFY outbox")
            # the poll is 60 s away: only the NOTIFY can cause another pass
            await eventually(
                lambda: dispatcher.passes > passes, "a pass after the NOTIFY", within=4, interval=0.02
            )
            assert dispatcher.passes > passes
    finally:
        stop.set()
        await asyncio.wait_for(running, 15)
        await pool.close()


def test_starter_migrate_runs_over_verified_tls(tls_server: TlsPostgres) -> None:
    name = f"fenced_migrate_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(tls_server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # a fresh name made here, not input
    env = {**os.environ, "EXPORTS_DATABASE_URL": tls_server.url(name)}
    first = subprocess.run(
        [sys.executable, "starter.py", "migrate"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("applied ")
    again = subprocess.run(
        [sys.executable, "starter.py", "migrate"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and again.stdout.strip() == "already up to date"


def with_password(url: str) -> str:
    """``url`` with ``PASSWORD`` (the server trusts every login, so it is ignored, but it is in the URL)."""
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{PASSWORD}@", 1)


def bad_tls_url(server: TlsPostgres, pki: Pki, case: str, tmp_path: Path) -> str:
    """A URL whose TLS settings cannot work, as ``case`` says, with a password in it."""
    if case == "wrong CA":
        return with_password(server.url(ca=pki.other_ca_cert))
    if case == "missing sslrootcert":
        return with_password(server.url(ca=tmp_path / "absent-ca.pem"))
    if case == "sslrootcert not a certificate":
        (tmp_path / "not-a-ca.pem").write_text("not a certificate\n")
        return with_password(server.url(ca=tmp_path / "not-a-ca.pem"))
    assert case == "certificate for another host"
    return with_password(server.url()) + "&host=db.elsewhere.example&hostaddr=127.0.0.1"


TLS_REFUSALS = {
    "wrong CA": "not signed by the CA in sslrootcert",
    "missing sslrootcert": "the sslrootcert file is missing",
    "sslrootcert not a certificate": "the sslrootcert file is missing or holds no certificate",
    "certificate for another host": "does not name the URL's host",
}


@pytest.mark.parametrize("case", list(TLS_REFUSALS))
async def test_a_tls_setting_that_cannot_work_is_refused_at_once_not_retried(
    tls_server: TlsPostgres, pki: Pki, tmp_path: Path, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = bad_tls_url(tls_server, pki, case, tmp_path)
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        await wait_for_postgres(url, START_RETRY_SECONDS, what="the worker")
    assert time.monotonic() - started < 5
    assert not isinstance(caught.value, TransientStoreError)
    message = str(caught.value)
    assert one_line(message) and message.startswith("TLS with PostgreSQL failed for the worker, and no retry")
    assert TLS_REFUSALS[case] in message, message
    assert PASSWORD not in message and PASSWORD not in caplog.text
    assert "retrying" not in caplog.text  # refused on the first attempt


async def test_a_url_that_is_not_a_connection_string_is_refused_at_once_without_its_password() -> None:
    url = f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/postgres?sslmode=verify-full&sslrotcert=/ca.pem"
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        await wait_for_postgres(url, START_RETRY_SECONDS, what="the worker")
    assert time.monotonic() - started < 5 and not isinstance(caught.value, TransientStoreError)
    assert str(caught.value).startswith("not a PostgreSQL connection string") and "sslrotcert" in str(
        caught.value
    )
    assert PASSWORD not in str(caught.value)


def worker_env(url: str, temporal: WorkflowEnvironment, tmp_path: Path) -> dict[str, str]:
    host, port = upstream_of(temporal)
    return {
        **os.environ,
        "EXPORTS_DATABASE_URL": url,
        "EXPORTS_TEMPORAL_ADDRESS": f"{host}:{port}",  # reached first: the worker then waits for PostgreSQL
        "EXPORTS_TASK_QUEUE": f"tls-{uuid.uuid4().hex[:8]}",
        "EXPORTS_WORK_DIR": str(tmp_path / "work"),
        "EXPORTS_METRICS_PORT": "0",
        "EXPORTS_TEMPORAL_METRICS_PORT": "0",
        "PYTHONPATH": str(ROOT),
    }


def assert_refused_in_one_line(done: subprocess.CompletedProcess[str], elapsed: float, program: str) -> str:
    assert done.returncode == 1, done.stderr
    assert elapsed < AT_ONCE, f"exited after {elapsed:.1f} s: {done.stderr}"
    assert "Traceback" not in done.stderr and "retrying" not in done.stderr, done.stderr
    assert PASSWORD not in done.stderr + done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{program}: EXPORTS_DATABASE_URL: TLS with PostgreSQL failed for "), lines[0]
    return lines[0]


@pytest.mark.parametrize("case", ["wrong CA", "missing sslrootcert"])
def test_a_worker_with_a_bad_sslrootcert_exits_at_once_with_one_line_naming_the_setting(
    tls_server: TlsPostgres, pki: Pki, dev_server: WorkflowEnvironment, tmp_path: Path, case: str
) -> None:
    env = worker_env(bad_tls_url(tls_server, pki, case, tmp_path), dev_server, tmp_path)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "worker.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    line = assert_refused_in_one_line(done, time.monotonic() - started, "worker.py")
    assert "failed for the worker" in line and TLS_REFUSALS[case] in line


@pytest.mark.parametrize("case", ["wrong CA", "missing sslrootcert"])
def test_the_api_with_a_bad_sslrootcert_exits_at_once_with_one_line_naming_the_setting(
    tls_server: TlsPostgres, pki: Pki, tmp_path: Path, case: str
) -> None:
    # `starter.py serve` waits for PostgreSQL at start too (its exports_api pool); Temporal is not needed.
    env = {
        **os.environ,
        "EXPORTS_DATABASE_URL": bad_tls_url(tls_server, pki, case, tmp_path),
        "PYTHONPATH": str(ROOT),
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "starter.py", "serve", "--host", "127.0.0.1", "--port", str(free_port())],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = assert_refused_in_one_line(done, time.monotonic() - started, "starter.py")
    assert "failed for the exports_api pool" in line and TLS_REFUSALS[case] in line
