"""PostgreSQL restarted under the pools (issue 10.8): a real server stopped (immediate or fast) and started
again on the same port. A pool checks each connection on checkout, so the first statement after the
restart gets a live connection at once, not a dead one and not a back-off; while the server is down a
checkout fails as a transient error within the pool's timeout; a process starting while the server is down
waits for it (bounded, logged) and one that can never succeed says why at once."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from db.embedded import EmbeddedPostgres, free_port
from db.errors import StoreError, TransientStoreError
from db.pool import is_stale, open_pool, wait_for_postgres
from db.stores.protocol import WorkerStore
from tests.support.eventually import eventually
from tests.support.pg_restart import StopMode, app_url, own_postgres, start, stop

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def postgres() -> Iterator[EmbeddedPostgres]:
    with own_postgres("fenced-restarts-") as server:
        yield server


async def _warm(pool: AsyncConnectionPool, connections: int) -> None:
    """Have ``connections`` connections open and idle in the pool."""

    async def hold(release: asyncio.Event, ready: asyncio.Barrier) -> None:
        async with pool.connection() as conn:
            await conn.execute("SELECT 1")
            await ready.wait()
            await release.wait()

    release, ready = asyncio.Event(), asyncio.Barrier(connections + 1)
    tasks = [asyncio.create_task(hold(release, ready)) for _ in range(connections)]
    await asyncio.wait_for(ready.wait(), 30)
    release.set()
    await asyncio.gather(*tasks)


@pytest.mark.parametrize("mode", ["immediate", "fast"])
async def test_after_a_restart_every_checkout_gets_a_live_connection_at_once(postgres, mode: StopMode):
    pool = await open_pool(app_url(postgres), "exports_worker", min_size=4, max_size=4)
    store = WorkerStore(pool)
    try:
        await _warm(pool, 4)
        stop(postgres, mode)
        start(postgres)

        began = time.monotonic()
        for _ in range(12):  # three times the pool: every stale connection met and replaced
            assert await store.get_job(uuid.uuid4()) is None
        # psycopg_pool's own check would back off 1 s, 2 s, 4 s... for the stale connections in turn.
        assert time.monotonic() - began < 3.0
    finally:
        await pool.close()


async def test_an_idle_connection_the_server_ended_is_seen_as_stale_without_a_round_trip(postgres):
    async with await psycopg.AsyncConnection.connect(app_url(postgres), autocommit=True) as conn:
        assert not is_stale(conn)
        async with await psycopg.AsyncConnection.connect(postgres.url, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%(pid)s)", {"pid": conn.pgconn.backend_pid})
        # the termination message reaches the socket
        await eventually(
            lambda: is_stale(conn), "the terminated connection seen stale", within=2, interval=0.02
        )
        assert is_stale(conn)


async def test_a_pool_without_the_check_hands_out_the_dead_connection(postgres):
    # The fault is real: the same restart breaks the first statement of an unchecked pool.
    pool = AsyncConnectionPool(
        app_url(postgres), min_size=2, max_size=2, open=False, kwargs={"autocommit": True}
    )
    await pool.open(wait=True)
    try:
        stop(postgres, "fast")
        start(postgres)
        with pytest.raises(psycopg.OperationalError):
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")
    finally:
        await pool.close()


async def test_while_the_server_is_down_a_checkout_is_a_transient_error_within_its_timeout(postgres):
    pool = await open_pool(app_url(postgres), "exports_worker", min_size=1, max_size=2, checkout_timeout=1.0)
    store = WorkerStore(pool)
    try:
        stop(postgres, "fast")
        try:
            began = time.monotonic()
            with pytest.raises(TransientStoreError):
                await store.get_job(uuid.uuid4())
            assert time.monotonic() - began < 5.0
        finally:
            start(postgres)
        # And it comes back by itself, once the pool's reconnection (psycopg_pool's back-off: 1 s, 2 s,
        # 4 s...) reaches the server again; until then a checkout is still the same transient error.
        async with asyncio.timeout(30):
            while True:
                try:
                    assert await store.get_job(uuid.uuid4()) is None
                    break
                except TransientStoreError:
                    continue
    finally:
        await pool.close()


async def test_a_process_starting_while_the_server_is_down_waits_for_it(postgres, caplog):
    stop(postgres, "fast")
    caplog.set_level(logging.WARNING, logger="db.pool")
    opening = asyncio.create_task(open_pool(app_url(postgres), "exports_api", retry_for=60))
    try:
        async with asyncio.timeout(30):
            while not any("does not answer" in r.getMessage() for r in caplog.records):
                assert not opening.done(), opening
                await asyncio.sleep(0.1)
        assert not opening.done()
    finally:
        start(postgres)
    pool = await asyncio.wait_for(opening, 60)
    try:
        assert await WorkerStore(pool).get_job(uuid.uuid4()) is None
    finally:
        await pool.close()
    assert all(postgres.url not in r.getMessage() for r in caplog.records)


async def test_waiting_for_a_server_that_never_answers_ends_with_one_clear_error(caplog):
    caplog.set_level(logging.WARNING, logger="db.pool")
    began = time.monotonic()
    with pytest.raises(TransientStoreError, match=r"did not answer the worker within 2 s: .*refused"):
        await wait_for_postgres(f"postgresql://nobody@127.0.0.1:{free_port()}/none", 2, what="the worker")
    assert 1.5 < time.monotonic() - began < 10
    assert len([r for r in caplog.records if "retrying" in r.getMessage()]) >= 2


async def test_a_refusal_no_retry_can_fix_fails_at_once(postgres):
    began = time.monotonic()
    with pytest.raises(StoreError, match='database "no_such_database" does not exist') as caught:
        await wait_for_postgres(postgres.url_for("no_such_database"), 60)
    assert not isinstance(caught.value, TransientStoreError)
    assert time.monotonic() - began < 5
