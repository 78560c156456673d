"""The session's PostgreSQL server, its migrated template, a fresh database per test module, and the
module's stores by role and factory (brought in by ``pytest_plugins`` in ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from db.pool import open_pool
from db.stores.api import ApiStore
from db.stores.outbox import DispatcherStore
from db.stores.platform import PlatformStore
from db.stores.protocol import WorkerStore
from db.stores.reconciler import ReconcilerStore
from db.stores.recovery import RecoveryStore
from testbed.pg import TestDatabase, clone_database, make_template, postgres_server
from tests.support.factories import Factory


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.fixture(scope="session")
def pg_template(pg_server: str) -> str:
    return make_template(pg_server)


@pytest.fixture(scope="module")
def database(pg_server: str, pg_template: str) -> TestDatabase:
    """A fresh migrated database for this test module."""
    return clone_database(pg_server, pg_template)


@pytest.fixture(scope="module")
async def worker_store(database: TestDatabase) -> AsyncIterator[WorkerStore]:
    pool = await open_pool(database.app_url, "exports_worker", max_size=10)
    yield WorkerStore(pool, lease_seconds=60)
    await pool.close()


@pytest.fixture(scope="module")
async def recovery_store(database: TestDatabase) -> AsyncIterator[RecoveryStore]:
    """Recovery's takeovers, as their own role."""
    pool = await open_pool(database.app_url, "exports_recovery", max_size=4)
    yield RecoveryStore(pool, lease_seconds=60)
    await pool.close()


@pytest.fixture(scope="module")
async def api_store(database: TestDatabase) -> AsyncIterator[ApiStore]:
    pool = await open_pool(database.app_url, "exports_api", max_size=10)
    yield ApiStore(pool)
    await pool.close()


@pytest.fixture(scope="module")
async def reconciler_store(database: TestDatabase) -> AsyncIterator[ReconcilerStore]:
    pool = await open_pool(database.app_url, "exports_reconciler", max_size=4)
    yield ReconcilerStore(pool)
    await pool.close()


@pytest.fixture(scope="module")
async def platform_store(database: TestDatabase) -> AsyncIterator[PlatformStore]:
    """The global delivery switch, as the platform's role (``starter.py pause --global``)."""
    pool = await open_pool(database.app_url, "exports_platform", max_size=2)
    yield PlatformStore(pool)
    await pool.close()


@pytest.fixture(scope="module")
async def dispatcher_store(database: TestDatabase) -> AsyncIterator[DispatcherStore]:
    pool = await open_pool(database.app_url, "exports_dispatcher", max_size=4)
    yield DispatcherStore(pool)
    await pool.close()


@pytest.fixture(scope="module")
async def factory(
    database: TestDatabase,
    api_store: ApiStore,
    worker_store: WorkerStore,
    recovery_store: RecoveryStore,
    reconciler_store: ReconcilerStore,
) -> Factory:
    """Puts a job in any state through the protocol's own statements; clock helpers act as superuser."""
    return Factory(
        database, api=api_store, worker=worker_store, recovery=recovery_store, reconciler=reconciler_store
    )
