"""Fixtures for workflow tests: one time-skipping Temporal test server for the session (with the export
search attributes registered), the module's fresh PostgreSQL database, a real SFTP server (the session's
servers from tests/fix_sftp.py: ``module_sftp_target``), and worker hosts on per-module task queues."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from testbed import pg
from tests.support.factories import Factory
from tests.workflows.harness import Harness, Host, SftpTarget, history_leaks, make_host


@pytest.fixture(scope="session")
def temporal_env(ts_env: WorkflowEnvironment) -> WorkflowEnvironment:
    """The session's time-skipping test server (tests/fix_temporal.py), export search attributes registered."""
    return ts_env


@pytest.fixture(scope="session")
def work_root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fenced-workflows-") as root:
        yield Path(root)


@pytest.fixture(scope="module")
def shared_queue() -> str:
    return f"exports-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
async def host(
    temporal_env: WorkflowEnvironment, database: pg.TestDatabase, shared_queue: str, work_root: Path
) -> AsyncIterator[Host]:
    """The module's worker host, with production lease timings (60 s lease, renewed every 20 s)."""
    h = await make_host(
        f"host-{uuid.uuid4().hex[:6]}",
        env_client=temporal_env.client,
        database=database,
        shared_queue=shared_queue,
        work_root=work_root,
    )
    yield h
    await h.close()


@pytest.fixture(scope="module")
async def harness(
    temporal_env: WorkflowEnvironment,
    factory: Factory,
    module_sftp_target: SftpTarget,
    shared_queue: str,
    host: Host,
) -> AsyncIterator[Harness]:
    """The module's harness. When the module ends, every history of a workflow it started is searched for
    contact data (DESIGN "Things that are easy to get wrong"; 004: payloads carry IDs only)."""
    harness = Harness(
        client=temporal_env.client,
        factory=factory,
        sftp=module_sftp_target,
        shared_queue=shared_queue,
        hosts=[host],
    )
    yield harness
    leaks = await history_leaks(harness.started)
    assert leaks == [], f"contact data in workflow histories: {leaks[:5]}"


@pytest.fixture(autouse=True)
def _reset_seams(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test starts and ends with the hosts' seams off."""
    yield
    if "harness" in request.fixturenames:
        for h in request.getfixturevalue("harness").hosts:
            h.reset_seams()
