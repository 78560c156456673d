"""Lost responses around the claim and cutoff 2, through ExportWorkflow (000 test matrix, "Lost responses").

The proxied host's worker pool reaches PostgreSQL through a TCP proxy that swallows the reply to a
committed statement (and, when asked, refuses the re-read's new connection): a real network fault at a
named point, not a replaced component. The row decides what the attempt does next."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from temporalio.testing import WorkflowEnvironment

from db.queries import q
from domain.models import AuthorizationResult, JobStatus
from testbed import pg
from testbed.tcp_proxy import TcpProxy
from tests.workflows.harness import Harness, Host, make_host, recover, wait_until
from workflows.models import AttemptOutcome

CLAIM = b"'Claimed'"  # only claim_if_queued's text carries this fragment
CUTOFF_2 = b"'DeliveryAuthorized'"  # only authorize_delivery_if_running's


def through_proxy(url: str, port: int) -> str:
    """``url`` pointed at the proxy, unencrypted so the proxy can see which statement is passing."""
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    netloc = f"{user}{parts.hostname or '127.0.0.1'}:{port}"
    return urlunsplit(parts._replace(netloc=netloc, query="sslmode=disable&gssencmode=disable"))


@pytest.fixture
def proxy(database: pg.TestDatabase) -> Iterator[TcpProxy]:
    target = urlsplit(database.app_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432).start()
    yield proxy
    proxy.stop()


@pytest.fixture
async def proxied_host(
    temporal_env: WorkflowEnvironment,
    database: pg.TestDatabase,
    shared_queue: str,
    work_root: Path,
    proxy: TcpProxy,
) -> AsyncIterator[Host]:
    """A host whose worker pool goes through the proxy, on a shared queue of its own (so only it claims)."""
    h = await make_host(
        f"proxied-{uuid.uuid4().hex[:6]}",
        env_client=temporal_env.client,
        database=database,
        shared_queue=f"{shared_queue}-proxied-{uuid.uuid4().hex[:4]}",
        work_root=work_root,
        worker_url=through_proxy(database.app_url, proxy.port),
        reread_timeout=1.0,
    )
    yield h
    await h.close()


def takeover_before_the_re_read(
    database: pg.TestDatabase, job_id: uuid.UUID, statement: str
) -> Callable[[], None]:
    """Recovery, run by the proxy after the worker's statement committed and before its re-read: the
    lease is expired on the database clock and the takeover statement runs as ``exports_recovery``."""

    def run() -> None:
        with psycopg.connect(database.admin_url, autocommit=True) as admin:
            row = admin.execute(
                "UPDATE export_jobs SET lease_expires_at = clock_timestamp() - interval '1 second'"
                " WHERE id = %(id)s RETURNING attempt_id",
                {"id": job_id},
            ).fetchone()
        assert row is not None
        params: dict[str, Any] = {
            "job_id": job_id,
            "expired_attempt_id": row[0],
            "max_attempts": 3,
            "recovery_run_id": "recovery-before-re-read",
            "resolution": "OutcomeUnknown",
            "evidence_summary": "no evidence",
            "traceparent": None,
        }
        with psycopg.connect(database.app_url, autocommit=True) as conn:
            conn.execute("SET ROLE exports_recovery")
            assert conn.execute(q(statement), params).fetchall()

    return run


async def claim_retrying(handle) -> bool:
    described = await handle.describe()
    return any(p.attempt >= 2 for p in described.raw_description.pending_activities)


async def claim_attempts(handle) -> list[int]:
    """The attempt numbers of the claim activity's starts in the workflow's history."""
    attempts = []
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_started_event_attributes"):
            attempts.append(event.activity_task_started_event_attributes.attempt)
    return attempts


async def test_a_claim_whose_reply_is_lost_re_reads_finds_itself_and_the_export_completes(
    harness: Harness, proxy: TcpProxy, proxied_host: Host
) -> None:
    job = await harness.queue_export(contacts=5)
    proxy.drop_next_reply_after(CLAIM)

    result = await (await harness.start(job, task_queue=proxied_host.shared_queue)).result()

    assert proxy.fired.is_set(), "the fault never fired: the test would prove nothing"
    assert result.outcome == AttemptOutcome.COMPLETED
    row = await harness.factory.job(job.id)
    assert row.attempt_count == 1 and row.attempt_id == result.attempt_id
    assert (await harness.factory.event_kinds(job.id)).count("Claimed") == 1
    assert len(harness.uploads(job)) == 1


async def test_a_claim_whose_reply_and_re_read_are_lost_is_retried_and_a_redelivered_wake_up_finds_it_running(
    harness: Harness, proxy: TcpProxy, proxied_host: Host
) -> None:
    job = await harness.queue_export(contacts=5)
    proxy.refuse_new_connections()
    proxy.drop_next_reply_after(CLAIM)

    handle = await harness.start(job, task_queue=proxied_host.shared_queue)
    await harness.wait_for_row(job, lambda r: r["status"] == "Running")  # the claim committed
    assert proxy.fired.wait(10)
    # The first attempt could not tell (ClaimUnknown); Temporal is retrying it.
    await wait_until(lambda: claim_retrying(handle), "the claim activity is on its second attempt")
    # The attempt cannot tell; a redelivered wake-up (another workflow) finds the job Running and settles.
    redelivered = await harness.run(job)
    assert redelivered.outcome == AttemptOutcome.ALREADY_SETTLED
    proxy.refuse_new_connections(False)
    result = await handle.result()

    assert proxy.refused >= 1
    assert result.outcome == AttemptOutcome.COMPLETED  # the claim's retry, same attempt ID, found itself
    assert max(await claim_attempts(handle)) >= 2
    row = await harness.factory.job(job.id)
    assert row.attempt_count == 1 and row.attempt_id == result.attempt_id
    assert (await harness.factory.event_kinds(job.id)).count("Claimed") == 1
    assert len(harness.uploads(job)) == 1


async def test_a_claim_taken_over_before_its_re_read_writes_nothing_further(
    harness: Harness, proxy: TcpProxy, proxied_host: Host, database: pg.TestDatabase
) -> None:
    job = await harness.queue_export(contacts=5)
    proxy.drop_next_reply_after(
        CLAIM, on_drop=takeover_before_the_re_read(database, job.id, "requeue_expired_attempt")
    )

    result = await (await harness.start(job, task_queue=proxied_host.shared_queue)).result()

    assert proxy.fired.is_set()
    assert result.outcome == AttemptOutcome.NOT_CLAIMED
    assert await harness.status(job) == JobStatus.QUEUED
    assert await harness.factory.event_kinds(job.id) == ["Claimed", "RequeuedByRecovery"]
    assert harness.files_on_disk() == [] and proxied_host.files_on_disk() == []


async def test_a_cutoff_2_whose_reply_is_lost_re_reads_finds_itself_delivering_and_delivers(
    harness: Harness, proxy: TcpProxy, proxied_host: Host
) -> None:
    job = await harness.queue_export(contacts=5)
    proxy.drop_next_reply_after(CUTOFF_2)

    result = await (await harness.start(job, task_queue=proxied_host.shared_queue)).result()

    assert proxy.fired.is_set()
    assert result.cutoff_answers == [AuthorizationResult.AUTHORIZED]
    assert result.outcome == AttemptOutcome.COMPLETED
    assert (await harness.factory.event_kinds(job.id)).count("DeliveryAuthorized") == 1
    assert len(harness.uploads(job)) == 1 and proxied_host.files_on_disk() == []


async def test_a_cutoff_2_whose_reply_and_re_read_are_lost_sends_nothing_and_recovery_resolves_it(
    harness: Harness, proxy: TcpProxy, proxied_host: Host
) -> None:
    job = await harness.queue_export(contacts=5)

    async def refuse_the_re_read(job_id: uuid.UUID) -> None:
        proxy.refuse_new_connections()
        proxy.drop_next_reply_after(CUTOFF_2)

    proxied_host.activities.seams.before_authorize = refuse_the_re_read
    result = await (await harness.start(job, task_queue=proxied_host.shared_queue)).result()
    proxy.refuse_new_connections(False)

    assert proxy.fired.is_set() and proxy.refused >= 1
    assert result.cutoff_answers == [AuthorizationResult.UNKNOWN]
    assert result.outcome == AttemptOutcome.LEFT_TO_RECOVERY
    assert await harness.status(job) == JobStatus.DELIVERING  # it had committed; nothing was sent
    assert harness.partner_files(job) == [] and proxied_host.files_on_disk() == []  # the file is gone
    await harness.factory.expire_lease(job.id)
    # Nothing was sent and no fence was written: recovery proves it (issue 10), no person needed.
    assert await recover(harness, job) == "NotDelivered"


async def test_a_cutoff_2_resolved_by_recovery_before_its_re_read_sends_nothing(
    harness: Harness, proxy: TcpProxy, proxied_host: Host, database: pg.TestDatabase
) -> None:
    job = await harness.queue_export(contacts=5)
    proxy.drop_next_reply_after(
        CUTOFF_2, on_drop=takeover_before_the_re_read(database, job.id, "resolve_expired_delivery")
    )

    result = await (await harness.start(job, task_queue=proxied_host.shared_queue)).result()

    assert proxy.fired.is_set()
    assert result.cutoff_answers == [AuthorizationResult.NOT_OWNER]  # its own ID, in the wrong state
    assert result.outcome == AttemptOutcome.NOT_OWNER
    assert await harness.status(job) == JobStatus.OUTCOME_UNKNOWN
    assert harness.partner_files(job) == [] and proxied_host.files_on_disk() == []
