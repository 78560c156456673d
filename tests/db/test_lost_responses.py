"""Lost database responses through a real network fault (000 "A lost response is not a failure"; test
matrix row "Lost responses").

The store under test connects to PostgreSQL through a TCP proxy (``tests/support/tcp_proxy.py``). The
proxy lets a statement reach the server and commit, then swallows the reply and cuts the connection; or
cuts it before the statement arrives; or refuses the new connection the re-read needs. The store's wrapper
must then ask the row, not the exception: Claimed/Authorized/Written when the re-read finds its own attempt
in the expected state, Lost/NotOwner when it does not, Unknown when the re-read fails too.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from db.pool import Role, open_pool
from db.queries import q
from db.stores.base import StoreBase
from domain.models import AuthorizationResult, ClaimResult, DeliveryOutcome, FinishResult, JobStatus
from testbed.tcp_proxy import TcpProxy
from tests.db.race import authorize
from tests.support.stores import store_for

CLAIM = b"'Claimed'"  # only claim_if_queued's text carries these fragments
CUTOFF_2 = b"'DeliveryAuthorized'"
FINISH = b"'Finished'"
FAILING_REREAD_SECONDS = 1.0  # how long a re-read may wait for a connection the proxy refuses


def through_proxy(url: str, port: int) -> str:
    """``url`` pointed at the proxy, unencrypted so the proxy can see which statement is passing."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(
        parts._replace(netloc=f"{user}{host}:{port}", query="sslmode=disable&gssencmode=disable")
    )


@pytest.fixture
def proxy(database) -> AsyncIterator[TcpProxy]:
    target = urlsplit(database.app_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432).start()
    yield proxy
    proxy.stop()


StoreFactory = Callable[..., Awaitable[Any]]


@pytest.fixture
async def proxied(database, proxy) -> AsyncIterator[StoreFactory]:
    """Stores over a one-connection pool whose every connection goes through the proxy."""
    pools = []

    async def make(role: Role = "exports_worker", reread_timeout: float = 5.0) -> Any:
        pool = await open_pool(
            through_proxy(database.app_url, proxy.port), role, min_size=1, max_size=1, name=f"proxied-{role}"
        )
        pools.append(pool)
        return store_for(role, pool, reread_timeout=reread_timeout)

    yield make
    for pool in pools:
        await pool.close()


def assert_fault_fired_and_connection_replaced(
    proxy: TcpProxy, store: StoreBase, *, reconnected: bool
) -> None:
    assert proxy.fired.is_set(), "the fault never fired: the test would prove nothing"
    stats = store.pool.get_stats()
    assert stats.get("returns_bad", 0) >= 1, stats  # the broken connection was discarded, not reused
    if reconnected:
        assert proxy.accepted >= 2  # the re-read came on a new connection
    else:
        assert proxy.refused >= 1


def recovery_in_thread(database, statement: str, params: dict) -> Callable[[], None]:
    """A recovery run the proxy executes after the worker's statement committed and before the worker's
    re-read: the lease is expired (clock helper) and the takeover statement runs as ``exports_worker``."""

    def run() -> None:
        with psycopg.connect(database.admin_url, autocommit=True) as admin:
            admin.execute(
                "UPDATE export_jobs SET lease_expires_at = clock_timestamp() - interval '1 second'"
                " WHERE id = %(job_id)s",
                params,
            )
        with psycopg.connect(database.app_url, autocommit=True) as conn:
            conn.execute("SET ROLE exports_worker")
            assert conn.execute(q(statement), params).fetchall()

    return run


# -- cutoff 1 ---------------------------------------------------------------------------------------


async def test_claim_whose_reply_is_lost_after_commit_re_reads_and_finds_itself_claimed(
    factory, proxy, proxied
):
    store = await proxied()
    job = await factory.queued()
    attempt = uuid.uuid4()
    proxy.drop_next_reply_after(CLAIM)

    assert await store.claim_if_queued(job.id, job.version, attempt, "worker-3") == ClaimResult.CLAIMED

    assert_fault_fired_and_connection_replaced(proxy, store, reconnected=True)
    row = await factory.job(job.id)
    assert (row.status, row.attempt_id, row.attempt_count) == (JobStatus.RUNNING, attempt, 1)
    assert await factory.event_kinds(job.id) == ["Claimed"]


async def test_claim_whose_reply_and_re_read_are_lost_is_unknown_and_recovery_takes_over(
    factory, proxy, proxied, worker_store, recovery_store
):
    store = await proxied(reread_timeout=FAILING_REREAD_SECONDS)
    job = await factory.queued()
    attempt = uuid.uuid4()
    proxy.refuse_new_connections()
    proxy.drop_next_reply_after(CLAIM)

    assert await store.claim_if_queued(job.id, job.version, attempt, "worker-3") == ClaimResult.UNKNOWN

    assert_fault_fired_and_connection_replaced(proxy, store, reconnected=False)
    assert (await factory.job(job.id)).attempt_id == attempt  # it had committed
    # The message stays unsettled and is delivered again: the redelivery finds the job Running and does nothing,
    assert (
        await worker_store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-4") == ClaimResult.LOST
    )
    # and recovery takes the attempt over when its lease expires.
    await factory.expire_lease(job.id)
    assert await recovery_store.requeue_expired_attempt(job.id, attempt, 3, "recovery-1")
    assert (await factory.job(job.id)).status == JobStatus.QUEUED


async def test_claim_cut_before_it_reaches_the_server_with_a_failing_re_read_is_unknown_and_runs_once_later(
    factory, proxy, proxied, worker_store, recovery_store
):
    store = await proxied(reread_timeout=FAILING_REREAD_SECONDS)
    job = await factory.queued()
    proxy.refuse_new_connections()
    proxy.drop_next_request_containing(CLAIM)

    assert await store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-3") == ClaimResult.UNKNOWN

    assert_fault_fired_and_connection_replaced(proxy, store, reconnected=False)
    row = await factory.job(job.id)
    assert (row.status, row.attempt_id, row.attempt_count) == (JobStatus.QUEUED, None, 0)
    # The unsettled message comes back, and the next claim runs the job once.
    attempt = uuid.uuid4()
    assert await worker_store.claim_if_queued(job.id, job.version, attempt, "worker-4") == ClaimResult.CLAIMED
    assert await factory.event_kinds(job.id) == ["Claimed"]


async def test_claim_cut_before_the_server_with_a_working_re_read_is_lost_and_the_job_stays_queued(
    factory, proxy, proxied
):
    # The worker cannot tell this from "someone else claimed it"; the row is still Queued and the sweeper or
    # the redelivered message wakes it again.
    store = await proxied()
    job = await factory.queued()
    proxy.drop_next_request_containing(CLAIM)

    assert await store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-3") == ClaimResult.LOST

    assert_fault_fired_and_connection_replaced(proxy, store, reconnected=True)
    assert (await factory.job(job.id)).status == JobStatus.QUEUED


async def test_claim_whose_attempt_recovery_requeued_before_the_re_read_is_lost(
    database, factory, proxy, proxied
):
    store = await proxied()
    job = await factory.queued()
    attempt = uuid.uuid4()
    proxy.drop_next_reply_after(
        CLAIM,
        on_drop=recovery_in_thread(
            database,
            "requeue_expired_attempt",
            {
                "job_id": job.id,
                "expired_attempt_id": attempt,
                "max_attempts": 3,
                "recovery_run_id": "recovery-1",
                "traceparent": None,
            },
        ),
    )

    assert await store.claim_if_queued(job.id, job.version, attempt, "worker-3") == ClaimResult.LOST

    assert_fault_fired_and_connection_replaced(proxy, store, reconnected=True)
    assert await factory.event_kinds(job.id) == ["Claimed", "RequeuedByRecovery"]


# -- cutoff 2 ---------------------------------------------------------------------------------------


async def test_cutoff_2_whose_reply_is_lost_after_commit_re_reads_and_finds_itself_authorized(
    factory, proxy, proxied
):
    store = await proxied()
    job, attempt = await factory.running()
    proxy.drop_next_reply_after(CUTOFF_2)

    assert await authorize(store, job, attempt) == AuthorizationResult.AUTHORIZED

    assert_fault_fired_and_connection_replaced(proxy, store, reconnected=True)
    row = await factory.job(job.id)
    assert (row.status, row.attempt_id) == (JobStatus.DELIVERING, attempt)
    assert await factory.event_kinds(job.id) == ["Claimed", "DeliveryAuthorized"]


async def test_cutoff_2_whose_reply_and_re_read_are_lost_is_unknown(factory, proxy, proxied):
    store = await proxied(reread_timeout=FAILING_REREAD_SECONDS)
    job, attempt = await factory.running()
    proxy.refuse_new_connections()
    proxy.drop_next_reply_after(CUTOFF_2)

    assert await authorize(store, job, attempt) == AuthorizationResult.UNKNOWN

    assert_fault_fired_and_connection_replaced(proxy, store, reconnected=False)
    # The row says which side of cutoff 2 the attempt is on; recovery reads it.
    assert (await factory.job(job.id)).status == JobStatus.DELIVERING


async def test_cutoff_2_whose_attempt_recovery_resolved_before_the_re_read_does_nothing_further(
    database, factory, proxy, proxied
):
    store = await proxied()
    job, attempt = await factory.running()
    proxy.drop_next_reply_after(
        CUTOFF_2,
        on_drop=recovery_in_thread(
            database,
            "resolve_expired_delivery",
            {
                "job_id": job.id,
                "expired_attempt_id": attempt,
                "resolution": "OutcomeUnknown",
                "recovery_run_id": "recovery-1",
                "evidence_summary": "no evidence",
            },
        ),
    )

    # Its own attempt ID, in the wrong state: the worker writes nothing further to the row.
    assert await authorize(store, job, attempt) == AuthorizationResult.NOT_OWNER

    assert_fault_fired_and_connection_replaced(proxy, store, reconnected=True)
    row = await factory.job(job.id)
    assert (row.status, row.attempt_id) == (JobStatus.OUTCOME_UNKNOWN, attempt)


# -- the terminal write -----------------------------------------------------------------------------


async def test_delivery_finish_whose_reply_is_lost_re_reads_and_finds_it_written(factory, proxy, proxied):
    store = await proxied()
    job, attempt = await factory.delivering()
    proxy.drop_next_reply_after(FINISH)

    assert await store.finish_delivery(job.id, attempt, DeliveryOutcome.COMPLETED) == FinishResult.WRITTEN

    assert_fault_fired_and_connection_replaced(proxy, store, reconnected=True)
    assert (await factory.job(job.id)).status == JobStatus.COMPLETED
    assert (await factory.event_kinds(job.id)).count("Finished") == 1


async def test_delivery_finish_whose_reply_and_re_read_are_lost_is_unknown(factory, proxy, proxied):
    store = await proxied(reread_timeout=FAILING_REREAD_SECONDS)
    job, attempt = await factory.delivering()
    proxy.refuse_new_connections()
    proxy.drop_next_reply_after(FINISH)

    assert await store.finish_delivery(job.id, attempt, DeliveryOutcome.COMPLETED) == FinishResult.UNKNOWN

    assert_fault_fired_and_connection_replaced(proxy, store, reconnected=False)
    assert (await factory.job(job.id)).status == JobStatus.COMPLETED


async def test_store_works_again_once_the_network_is_back(factory, proxy, proxied):
    store = await proxied(reread_timeout=FAILING_REREAD_SECONDS)
    job = await factory.queued()
    proxy.refuse_new_connections()
    proxy.drop_next_request_containing(CLAIM)
    assert await store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-3") == ClaimResult.UNKNOWN

    proxy.refuse_new_connections(False)
    attempt = uuid.uuid4()
    assert await store.claim_if_queued(job.id, job.version, attempt, "worker-3") == ClaimResult.CLAIMED
    assert (await store.renew_lease(job.id, attempt)).owned
