"""Fixtures for the operations tests: a generated PKI, and the Temporal dev server to put TLS in front of."""

from __future__ import annotations

import pytest
from temporalio.testing import WorkflowEnvironment

from testbed.tls import Pki, make_pki


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate, and an unrelated CA."""
    return make_pki(tmp_path_factory.mktemp("pki") / "pki")


@pytest.fixture(scope="module")
def dev_server(dev_env: WorkflowEnvironment) -> WorkflowEnvironment:
    """The session's Temporal CLI dev server (tests/fix_temporal.py; plain gRPC, no TLS options of its own)."""
    return dev_env


def upstream_of(env: WorkflowEnvironment) -> tuple[str, int]:
    """The dev server's plain ``host, port``."""
    host, port = env.client.service_client.config.target_host.rsplit(":", 1)
    return host, int(port)


def one_line(text: str) -> bool:
    """A message an operator reads at a glance: one non-empty line."""
    return bool(text.strip()) and "\n" not in text.strip()
