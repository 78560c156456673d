"""What the time-skipping server cannot show: on the Temporal dev server, an operator finds an export's
workflow by its search attributes (a visibility query) and reads its summary and outcome. The host
registers the attributes as a production worker does at start-up (``register_search_attributes``) and
passes on what the server answered."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from domain.models import JobStatus
from runtime.search_attributes import register_search_attributes
from testbed import pg
from tests.support.factories import Factory
from tests.workflows.harness import LEAK, Harness, Host, SftpTarget, history_text, make_host, wait_until
from workflows.models import AttemptOutcome


@pytest.fixture(scope="module")
async def dev_host(
    dev_env: WorkflowEnvironment, database: pg.TestDatabase, work_root: Path
) -> AsyncIterator[Host]:
    h = await make_host(
        f"dev-{uuid.uuid4().hex[:6]}",
        env_client=dev_env.client,
        database=database,
        shared_queue=f"exports-dev-{uuid.uuid4().hex[:6]}",
        work_root=work_root,
        own_client=False,
        search_attributes=await register_search_attributes(dev_env.client, dev_env.client.namespace),
    )
    yield h
    await h.close()


@pytest.fixture(scope="module")
def dev_harness(
    dev_env: WorkflowEnvironment, factory: Factory, module_sftp_target: SftpTarget, dev_host: Host
) -> Harness:
    return Harness(
        client=dev_env.client,
        factory=factory,
        sftp=module_sftp_target,
        shared_queue=dev_host.shared_queue,
        hosts=[dev_host],
        track_histories=False,  # this server is gone by the session-end search; searched here instead
    )


async def test_an_operator_finds_an_export_by_its_job_id_and_reads_its_outcome(dev_harness: Harness) -> None:
    job = await dev_harness.queue_export(contacts=5)
    handle = await dev_harness.start(job)
    result = await handle.result()
    assert result.outcome == AttemptOutcome.COMPLETED
    assert await dev_harness.status(job) == JobStatus.COMPLETED

    query = f"ExportJobId = '{job.id}' AND ExportOutcome = 'Completed'"

    async def listed() -> bool:
        return [w.id async for w in dev_harness.client.list_workflows(query)] == [handle.id]

    await wait_until(listed, "the visibility store lists the export by its search attributes")
    [found] = [w async for w in dev_harness.client.list_workflows(query)]
    attributes = {key.name: value for key, value in found.typed_search_attributes}
    assert attributes["ExportTenantId"] == str(job.tenant_id)
    described = await handle.describe()
    assert await described.static_summary() == f"Export {job.id}"
    by_tenant = [w.id async for w in dev_harness.client.list_workflows(f"ExportTenantId = '{job.tenant_id}'")]
    assert by_tenant == [handle.id]
    assert LEAK.search(await history_text(handle)) is None
