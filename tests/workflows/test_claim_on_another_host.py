"""A claim whose answer was lost on one host and confirmed on another is that host's (issue 23.8), on the
Temporal dev server: its activity retries wait their real backoff (the time-skipping server would run them
back to back), so the first host is gone before the retry of the claim is handed out.

Host A serves only claims; its claim commits and its answer is lost (the ``after_claim`` seam raises), and
A goes away. Temporal retries the claim on host B, which finds the claim its attempt made, adopts it, builds,
and at cutoff 2 finds the destination paused: it gives the attempt back. Before 23.8 the row still named A,
so B's give-back matched nothing and the attempt burned.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from domain.models import EventKind, JobStatus
from runtime.search_attributes import register_search_attributes
from service.switches import DestinationSwitch, Operator, Switches
from testbed import pg
from tests.support.factories import Factory
from tests.workflows.harness import Harness, Host, SftpTarget, make_host
from workflows.models import AttemptOutcome


@pytest.fixture
async def hosts(
    dev_env: WorkflowEnvironment, database: pg.TestDatabase, work_root: Path
) -> AsyncIterator[tuple[Host, Host]]:
    queue = f"exports-moved-{uuid.uuid4().hex[:6]}"
    search = await register_search_attributes(dev_env.client, dev_env.client.namespace)
    made = []
    for name in ("a", "b"):
        host = await make_host(
            f"{name}-{uuid.uuid4().hex[:6]}",
            env_client=dev_env.client,
            database=database,
            shared_queue=queue,
            work_root=work_root,
            search_attributes=search,
        )
        await host.stop()
        made.append(host)
    first, second = made
    first.start_only("claims")
    second.start_only("workflows", "own")
    yield first, second
    for host in made:
        await host.close()


async def test_a_claim_confirmed_on_another_host_after_a_lost_answer_is_given_back_by_that_host(
    dev_env: WorkflowEnvironment, factory: Factory, module_sftp_target: SftpTarget, hosts: tuple[Host, Host]
) -> None:
    first, second = hosts
    harness = Harness(
        client=dev_env.client,
        factory=factory,
        sftp=module_sftp_target,
        shared_queue=first.shared_queue,
        hosts=[first, second],
        track_histories=False,
    )
    job = await harness.queue_export(contacts=5)
    switches = Switches(factory.api)
    operator = Operator(principal="sam.ops", tenant_id=job.tenant_id)
    pause = DestinationSwitch(scope="destination", destination_id=job.destination_id, reason="incident")
    handing_over: list[asyncio.Task[None]] = []

    async def hand_over() -> None:
        await first.stop()
        second.start_only("claims")

    async def answer_lost(job_id: uuid.UUID) -> None:
        # The claim committed; its answer never reaches Temporal, and host A goes away.
        if not handing_over:
            handing_over.append(asyncio.create_task(hand_over()))
        raise RuntimeError("the claim's answer was lost")

    async def pause_while_building(job_id: uuid.UUID) -> None:
        await switches.pause(operator, pause)

    first.activities.seams.after_claim = answer_lost
    second.activities.seams.before_authorize = pause_while_building
    try:
        result = await asyncio.wait_for(harness.run(job), 60)
    finally:
        await asyncio.gather(*handing_over)
        await switches.resume(operator, pause)

    # B confirmed the claim and held the attempt; the pause made it give the attempt back at cutoff 2, and
    # the attempt is not used up. The events name the host that held the attempt at each step.
    assert result.outcome == AttemptOutcome.RELEASED
    row = await factory.job(job.id)
    assert (row.status, row.attempt_count, row.attempts_released) == (JobStatus.QUEUED, 1, 1)
    events = await factory.worker.job_events(job.id)
    assert [(e.kind, e.worker_id) for e in events] == [
        (EventKind.CLAIMED, first.name),
        (EventKind.RELEASED, second.name),
    ]
    assert harness.partner_files(job) == [] and harness.files_on_disk() == []
