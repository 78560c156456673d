"""A partner's session limit across all workers (issue #25.3), on the real OpenSSH sshd, real PostgreSQL and
the Temporal dev server (real time: attempts that wait for a slot wait, and nothing skips past their
heartbeats): ten worker hosts deliver ten exports at once to a destination whose limit is 2.

The partner's witness is a TCP proxy in front of its sshd (``testbed.sftp.TcpProxy.open_high_water``): it
counts the connections the server holds open at once, from its side, not ours. Each delivery holds its
session until the witness shows the limit reached (bounded), so sessions overlap for certain: the witness
must see exactly 2, never 3, and the exports that waited for a slot said so on their timeline.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from domain.models import EventKind, JobStatus
from service.views import status_line
from testbed import pg
from tests.fix_sftp import target_on
from tests.support.factories import Factory
from tests.workflows.harness import Harness, Host, SftpTarget, make_host
from workflows.models import AttemptOutcome

pytestmark = pytest.mark.sshd

LIMIT = 2
HOSTS = 10
EXPORTS = 10


@pytest.fixture(scope="module")
def module_sftp_target(request: pytest.FixtureRequest) -> Iterator[SftpTarget]:
    """The harness's directory on the session's real sshd, behind the proxy that is the partner's witness."""
    yield from target_on(request, "sshd")


@pytest.fixture(scope="module")
async def ten_hosts(
    dev_env: WorkflowEnvironment, database: pg.TestDatabase, work_root: Path
) -> AsyncIterator[list[Host]]:
    """Ten worker hosts on one shared queue of the dev server, each with its own client, pools and queue, as
    ten machines would have."""
    queue = f"exports-limits-{uuid.uuid4().hex[:6]}"
    hosts = [
        await make_host(
            f"host{i}-{uuid.uuid4().hex[:6]}",
            env_client=dev_env.client,
            database=database,
            shared_queue=queue,
            work_root=work_root,
            worker_pool_size=3,
            max_concurrent_builds=1,
        )
        for i in range(HOSTS)
    ]
    yield hosts
    for h in hosts:
        await h.close()


async def test_ten_workers_deliver_ten_exports_and_the_partner_never_sees_more_sessions_than_its_limit(
    dev_env: WorkflowEnvironment,
    factory: Factory,
    module_sftp_target: SftpTarget,
    ten_hosts: list[Host],
) -> None:
    target = module_sftp_target
    witness = target.proxy
    harness = Harness(
        client=dev_env.client,
        factory=factory,
        sftp=target,
        shared_queue=ten_hosts[0].shared_queue,
        hosts=ten_hosts,
    )
    tenant_id = await factory.tenant()
    destination_id = await harness.destination(
        tenant_id, port=witness.port, max_write_request=261120, max_sessions=LIMIT
    )
    await harness.add_contacts(tenant_id, "main", 50)
    jobs = [await factory.queued(tenant_id, destination_id, list_name="main") for _ in range(EXPORTS)]

    async def hold_until_the_limit_is_reached(job_id: uuid.UUID) -> None:
        # A slow partner: each upload keeps its session until the partner holds LIMIT of them (bounded), so
        # the sessions overlap for certain and a third one, if any slot let it through, would show.
        for _ in range(100):
            if witness.open_now >= LIMIT:
                return
            await asyncio.sleep(0.02)

    for h in ten_hosts:
        h.activities.seams.before_rename_fence = hold_until_the_limit_is_reached
    witness.reset_high_water()
    lines: set[str] = set()

    async def watch_status_lines() -> None:
        while True:
            for job in jobs:
                row = await factory.job(job.id)
                if row.status == JobStatus.RUNNING:
                    lines.add(status_line(row, await factory.worker.job_events(job.id)))
            await asyncio.sleep(0.05)

    watching = asyncio.create_task(watch_status_lines())
    try:
        results = await asyncio.gather(*(harness.run(job) for job in jobs))
    finally:
        watching.cancel()

    assert [r.outcome for r in results] == [AttemptOutcome.COMPLETED] * EXPORTS
    assert witness.open_high_water == LIMIT  # the partner's own count: the limit was reached, never passed
    rows = [await factory.job(job.id) for job in jobs]
    assert len({r.claimed_by for r in rows}) > 1  # across workers
    assert sorted(p.name for p in target.local_dir.iterdir()) == sorted(r.expected_file_name for r in rows)
    waited = 0
    for job in jobs:
        seen = [
            json.loads(e.detail or "{}")
            for e in await factory.worker.job_events(job.id)
            if e.kind == EventKind.DELIVERY_EVIDENCE
        ]
        slot = [e for e in seen if e.get("observation") == "session_slot"]
        if slot:
            waited += 1
            assert [e["result"] for e in slot] == ["waiting", "taken"]
            assert (slot[0]["in_use"], slot[0]["limit"]) == (LIMIT, LIMIT)
    assert waited >= 1  # some found every slot held, and waited for one
    assert any(line.endswith(f"; waiting for a delivery slot: {LIMIT} of {LIMIT} in use.") for line in lines)
    held = await factory.admin(
        "SELECT count(*) AS n FROM destination_session_slots s WHERE destination_id = %(d)s AND session_slot_held(s)",
        {"d": destination_id},
    )
    assert held == [{"n": 0}]  # every terminal write ended its attempt's slot
