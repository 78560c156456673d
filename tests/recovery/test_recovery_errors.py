"""Recovery contains errors per job (issue 10 item 6, issue 8 "one error boundary"): a database error while
recovery handles one job is translated at the store's boundary, counted, and leaves that job for the next
run, while the other candidates of the same batch are still taken over. The fault is real: the recovery
store's connection goes through a TCP proxy that cuts it when the destination read passes."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
from temporalio.testing import ActivityEnvironment

from activities.recovery import RecoveryActivities
from db.pool import open_pool
from db.store import JobStore
from domain.models import JobStatus
from settings import Settings
from testbed.sftp import SftpTarget
from testbed.tcp_proxy import TcpProxy
from tests.db.test_lost_responses import through_proxy
from tests.recovery.test_recovery_delivering import delivering_to
from workflows.models import RecoveryBatchInput

DESTINATION_READ = b"FROM destinations"

pytestmark = pytest.mark.parametrize("sftp_server", ["asyncssh"])


@pytest.fixture
async def proxied_store(database) -> AsyncIterator[tuple[TcpProxy, JobStore]]:
    target = urlsplit(database.app_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432).start()
    pool = await open_pool(through_proxy(database.app_url, proxy.port), "exports_worker", max_size=1)
    yield proxy, JobStore(pool)
    await pool.close()
    proxy.stop()


async def test_a_driver_error_on_one_job_is_counted_and_the_rest_of_the_batch_is_taken_over(
    factory, sftp_target: SftpTarget, proxied_store: tuple[TcpProxy, JobStore]
) -> None:
    proxy, store = proxied_store
    first, _ = await delivering_to(factory, sftp_target, os.urandom(1000))
    second, _ = await delivering_to(factory, sftp_target, os.urandom(1000))
    await factory.expire_lease(first.id, seconds_ago=20)  # scanned first: the older lease
    await factory.expire_lease(second.id, seconds_ago=10)
    # One at a time, so the cut meets the first job's destination read (the batch is concurrent by default).
    recovery = RecoveryActivities(store, Settings(max_attempts=3, recovery_concurrency=1))

    proxy.drop_next_request_containing(DESTINATION_READ)  # the first job's destination read is cut
    result = await ActivityEnvironment().run(
        recovery.recover_expired_leases, RecoveryBatchInput(recovery_run_id="recovery:test", limit=10)
    )

    assert proxy.fired.is_set()
    assert (result.scanned, result.errors, result.outcome_unknown) == (2, 1, 1)
    assert (await factory.job(first.id)).status == JobStatus.DELIVERING  # left for the next run
    assert (await factory.job(second.id)).status == JobStatus.OUTCOME_UNKNOWN  # nothing there: unknown

    again = await ActivityEnvironment().run(
        recovery.recover_expired_leases, RecoveryBatchInput(recovery_run_id="recovery:again", limit=10)
    )
    assert (again.scanned, again.errors, again.outcome_unknown) == (1, 0, 1)
    assert (await factory.job(first.id)).status == JobStatus.OUTCOME_UNKNOWN
