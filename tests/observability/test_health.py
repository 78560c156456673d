"""Health: /readyz answers 503 while a real PostgreSQL is stopped and 200 once it is back, on the building
block, on the real worker's metrics port (``worker.run_worker``) and on the API (``create_app``); it also
says not ready when a migration is missing or Temporal does not answer."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from api.app import create_app
from db.embedded import EmbeddedPostgres, free_port
from db.migrate import ensure_app_login, migrate
from db.pool import open_pool
from observability.health import MetricsServer, Readiness, expected_migrations, standard_readiness
from observability.metrics import ExportMetrics
from observability.setup import start_worker_endpoints
from service.exports import open_exports
from service.signals import TemporalStopSignaller
from settings import Settings
from testbed.pg import APP_LOGIN
from worker import run_worker

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def postgres() -> Iterator[EmbeddedPostgres]:
    """A server of this module's own, so stopping it disturbs no other test."""
    server = EmbeddedPostgres.start(data_dir=Path(tempfile.mkdtemp(prefix="fenced-health-")), keep=True)
    migrate(server.url)
    ensure_app_login(server.url, APP_LOGIN)
    yield server
    server.keep = False
    server.stop()


@pytest.fixture(scope="module")
def temporal(ts_env: WorkflowEnvironment) -> WorkflowEnvironment:
    """The session's time-skipping test server (tests/fix_temporal.py)."""
    return ts_env


async def ready_within(http: httpx.AsyncClient, status: int, seconds: float) -> dict:
    """Poll /readyz until it answers ``status`` (bounded); returns the last body."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        response = await http.get("/readyz")
        if response.status_code == status or asyncio.get_running_loop().time() > deadline:
            assert response.status_code == status, response.text
            return response.json()
        await asyncio.sleep(0.2)


async def test_readyz_is_503_while_postgres_is_stopped_and_200_once_it_is_back(postgres, temporal):
    pool = await open_pool(postgres.url_for("postgres", APP_LOGIN), "exports_worker", min_size=1, max_size=2)
    registry = CollectorRegistry()
    ExportMetrics(registry).observe_transition("claim_if_queued", "written")
    server = MetricsServer(standard_readiness(pool, temporal.client), port=0, registry=registry)
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            body = await ready_within(http, 200, 10)
            assert body == {
                "status": "ready",
                "checks": {"postgres": "ok", "migrations": "ok", "temporal": "ok"},
            }
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            metrics = (await http.get("/metrics")).text
            assert (
                'fenced_exports_transitions_total{result="written",statement="claim_if_queued"} 1.0'
                in metrics
            )

            postgres.stop()  # keep=True: the data directory stays for the restart
            body = await ready_within(http, 503, 10)
            assert body["status"] == "not ready"
            assert body["checks"]["postgres"] != "ok" and body["checks"]["temporal"] == "ok"
            assert (await http.get("/healthz")).status_code == 200  # alive all the same

            EmbeddedPostgres.start(data_dir=postgres.data_dir, port=postgres.port, keep=True)
            body = await ready_within(http, 200, 30)
            assert body["checks"] == {"postgres": "ok", "migrations": "ok", "temporal": "ok"}
    finally:
        await server.stop()
        await pool.close()


async def test_readyz_is_503_while_a_migration_this_build_ships_is_missing(postgres):
    pool = await open_pool(postgres.url_for("postgres", APP_LOGIN), "exports_worker", min_size=1, max_size=2)
    server = MetricsServer(standard_readiness(pool, None), port=0, registry=CollectorRegistry())
    url = await server.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            assert (await ready_within(http, 200, 10))["checks"]["migrations"] == "ok"
            assert await pool_admin(
                postgres, "DELETE FROM schema_migrations WHERE name = %(n)s RETURNING name"
            )
            body = await ready_within(http, 503, 5)
            assert body["checks"]["migrations"] == f"missing {expected_migrations()[-1]}"
            await pool_admin(postgres, "INSERT INTO schema_migrations (name) VALUES (%(n)s) RETURNING name")
            await ready_within(http, 200, 5)
    finally:
        await server.stop()
        await pool.close()


async def pool_admin(postgres: EmbeddedPostgres, statement: str) -> list:
    """A statement on schema_migrations as the superuser, about the newest migration."""
    async with await psycopg.AsyncConnection.connect(postgres.url, autocommit=True) as conn:
        cur = await conn.execute(statement, {"n": expected_migrations()[-1]})
        return await cur.fetchall()


async def test_readyz_is_503_when_temporal_does_not_answer(postgres):
    pool = await open_pool(postgres.url_for("postgres", APP_LOGIN), "exports_worker", min_size=1, max_size=2)
    nobody = await Client.connect(f"127.0.0.1:{free_port()}", lazy=True)
    readiness = standard_readiness(pool, nobody, timeout_seconds=2)
    try:
        report = await readiness.report()
    finally:
        await pool.close()
    assert not report.ready
    assert report.checks["postgres"] == "ok" and report.checks["temporal"] != "ok"


async def test_a_check_that_hangs_is_a_timeout_not_a_hang():
    async def hangs() -> None:
        await asyncio.sleep(3600)

    report = await Readiness({"slow": hangs}, timeout_seconds=0.1).report()
    assert report.checks == {"slow": "timeout"} and not report.ready


async def test_the_worker_endpoints_from_the_settings_serve_gauges_config_and_readiness(postgres, temporal):
    await ready_postgres(postgres)
    url = postgres.url_for("postgres", APP_LOGIN)
    settings = Settings(database_url=url, metrics_port=free_port(), recovery_every_seconds=45)
    pool = await open_pool(url, "exports_worker", min_size=1, max_size=2)
    registry = CollectorRegistry()
    metrics = ExportMetrics(registry)
    endpoints = await start_worker_endpoints(settings, metrics, pool, temporal.client, registry=registry)
    assert endpoints.server is not None and endpoints.gauges is not None
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{settings.metrics_port}", timeout=10
        ) as http:
            text = (await http.get("/metrics")).text
            assert "fenced_exports_db_gauges_up 1.0" in text
            assert 'fenced_exports_jobs{status="Queued"}' in text
            assert 'fenced_exports_config_seconds{setting="recovery_every_seconds"} 45.0' in text
            await ready_within(http, 200, 10)
    finally:
        await endpoints.stop()
        await pool.close()
    assert "fenced_exports_db_gauges_up" not in generate_latest(registry).decode()  # unregistered


async def ready_postgres(postgres: EmbeddedPostgres) -> None:
    """Start the module's server again if an earlier test left it stopped."""
    try:
        async with await psycopg.AsyncConnection.connect(postgres.url, connect_timeout=2):
            return
    except psycopg.OperationalError:
        EmbeddedPostgres.start(data_dir=postgres.data_dir, port=postgres.port, keep=True)


# -- the real endpoints: the worker's metrics port and the API ------------------------------------------


async def test_the_worker_readyz_is_503_while_postgres_is_stopped_and_200_once_it_is_back(
    postgres, temporal, tmp_path
):
    await ready_postgres(postgres)
    port = free_port()
    settings = Settings(
        database_url=postgres.url_for("postgres", APP_LOGIN),
        task_queue=f"health-{uuid.uuid4()}",
        work_dir=tmp_path,
        metrics_port=port,
        metrics_db_cache_seconds=0,
        dispatcher_poll_seconds=1,
    )
    stop, ready = asyncio.Event(), asyncio.Event()
    worker = asyncio.create_task(
        run_worker(settings, stop=stop, client=temporal.client, ready=ready, schedules=False)
    )
    try:
        await asyncio.wait_for(ready.wait(), 60)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            body = await ready_within(http, 200, 10)
            assert body["checks"] == {"postgres": "ok", "migrations": "ok", "temporal": "ok"}
            assert "fenced_exports_db_gauges_up 1.0" in (await http.get("/metrics")).text

            postgres.stop()
            body = await ready_within(http, 503, 10)
            assert body["checks"]["postgres"] != "ok" and body["checks"]["temporal"] == "ok"
            assert (await http.get("/healthz")).status_code == 200
            assert "fenced_exports_db_gauges_up 0.0" in (await http.get("/metrics")).text
            assert not worker.done()  # the worker rides it out

            EmbeddedPostgres.start(data_dir=postgres.data_dir, port=postgres.port, keep=True)
            body = await ready_within(http, 200, 30)
            assert body["checks"] == {"postgres": "ok", "migrations": "ok", "temporal": "ok"}
            assert "fenced_exports_db_gauges_up 1.0" in (await http.get("/metrics")).text
    finally:
        stop.set()
        await asyncio.wait_for(worker, 60)
    with pytest.raises(httpx.ConnectError):  # stopped with the worker
        async with httpx.AsyncClient(timeout=2) as http:
            await http.get(f"http://127.0.0.1:{port}/healthz")


async def test_the_api_readyz_is_503_while_postgres_is_stopped_and_200_once_it_is_back(postgres, temporal):
    await ready_postgres(postgres)
    settings = Settings(database_url=postgres.url_for("postgres", APP_LOGIN))
    async with open_exports(settings, signaller=TemporalStopSignaller(temporal.client)) as exports:
        app = create_app(settings, exports=exports)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://api", timeout=10
        ) as http:
            body = await ready_within(http, 200, 10)
            assert body["checks"] == {"postgres": "ok", "migrations": "ok", "temporal": "ok"}
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            assert "fenced_exports_cancellations_total" in (await http.get("/metrics")).text

            postgres.stop()
            body = await ready_within(http, 503, 10)
            assert body["checks"]["postgres"] != "ok" and body["checks"]["temporal"] == "ok"
            assert (await http.get("/healthz")).status_code == 200

            EmbeddedPostgres.start(data_dir=postgres.data_dir, port=postgres.port, keep=True)
            body = await ready_within(http, 200, 30)
            assert body["checks"] == {"postgres": "ok", "migrations": "ok", "temporal": "ok"}
