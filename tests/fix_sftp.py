"""SFTP fixtures for every test (a plugin of ``tests/conftest.py``): the session's servers from
:mod:`testbed.sftp`, one fresh directory per test.

Fixtures: ``local_sftp_server`` and ``sshd_server`` (session), ``sftp_server`` (parametrized over
both; the sshd case carries the ``sshd`` marker) and ``sftp_target`` (a fresh upload directory on
that server behind a fresh proxy). When ``CI=true`` a missing sshd fails instead of skipping.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from partner.local_server import LocalSftpServer
from testbed.sftp import ServerKind, SftpTarget, Sshd, TcpProxy, sshd_available

__all__ = ["SftpTarget", "Sshd", "TcpProxy", "sshd_available"]


@pytest.fixture(scope="session")
async def local_sftp_server() -> AsyncIterator[LocalSftpServer]:
    """The in-process asyncssh server, rooted in a fresh temporary directory, for the whole session."""
    root = Path(tempfile.mkdtemp(prefix="fenced-sftp-root-"))
    server = LocalSftpServer(root)
    await server.start()
    yield server
    await server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def sshd_server() -> Iterator[Sshd]:
    """A real OpenSSH sshd for the session; skips on a developer machine without one, fails in CI."""
    from tests.conftest import require

    require(sshd_available(), "OpenSSH sshd (/usr/sbin/sshd, run as root)")
    server = Sshd.start()
    yield server
    server.stop()


@pytest.fixture(params=["asyncssh", pytest.param("sshd", marks=pytest.mark.sshd)])
def sftp_server(request: pytest.FixtureRequest) -> ServerKind:
    """Which real server a test runs against: each test using it runs once per server."""
    return request.param


@pytest.fixture
def sftp_target(request: pytest.FixtureRequest, sftp_server: ServerKind) -> Iterator[SftpTarget]:
    """A fresh upload directory on the chosen server, behind a fresh TCP proxy."""
    yield from target_on(request, sftp_server)


@pytest.fixture(scope="module")
def module_sftp_target(request: pytest.FixtureRequest) -> Iterator[SftpTarget]:
    """A fresh upload directory for a whole test module on the in-process asyncssh server (the workflow
    harness's; a module overrides it with ``yield from target_on(request, "sshd")`` for the real sshd)."""
    yield from target_on(request, "asyncssh")


@pytest.fixture
def sshd_target(request: pytest.FixtureRequest) -> Iterator[SftpTarget]:
    """A fresh upload directory on the real sshd only (race and performance tests)."""
    yield from target_on(request, "sshd")


def target_on(request: pytest.FixtureRequest, kind: ServerKind) -> Iterator[SftpTarget]:
    """A fresh upload directory on the session's server of ``kind``, behind a fresh TCP proxy."""
    if kind == "sshd":
        sshd: Sshd = request.getfixturevalue("sshd_server")
        local_dir = sshd.make_upload_dir()
        proxy = TcpProxy(sshd.host, sshd.port)
        target = SftpTarget(
            kind="sshd",
            host_key_line=sshd.host_key_line,
            client_key_path=sshd.client_key_path,
            remote_dir=str(local_dir),
            local_dir=local_dir,
            proxy=proxy,
            server_port=sshd.port,
        )
    else:
        local: LocalSftpServer = request.getfixturevalue("local_sftp_server")
        name = uuid.uuid4().hex
        local_dir = local.root / name
        local_dir.mkdir()
        proxy = TcpProxy(local.host, local.port)
        target = SftpTarget(
            kind="asyncssh",
            host_key_line=local.host_key_line,
            client_key_path=local.client_key_path,
            remote_dir=f"/{name}",
            local_dir=local_dir,
            proxy=proxy,
            server_port=local.port,
            chrooted=True,
        )
    try:
        yield target
    finally:
        proxy.close()
        shutil.rmtree(local_dir, ignore_errors=True)
