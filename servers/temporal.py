"""The Temporal SDK's two servers, started through :func:`servers.ports.astart_with_retries`.

``WorkflowEnvironment.start_time_skipping`` and ``start_local`` pick their ports by binding port 0 (the
ephemeral range) and wait 5 s by default; here every port comes from :func:`servers.ports.pick_port`,
the dev server is given its HTTP and metrics ports too (it picks them at random otherwise), the wait is
:data:`servers.ports.STARTUP_TIMEOUT`, and a failed start is tried again on new ports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.testing import WorkflowEnvironment

from servers.ports import STARTUP_TIMEOUT, TRIES, PortPicker, astart_with_retries, pick_port


async def start_time_skipping(
    *,
    tries: int = TRIES,
    pick: PortPicker = pick_port,
    startup_timeout: float = STARTUP_TIMEOUT,
    **options: Any,
) -> WorkflowEnvironment:
    """The time-skipping test server on a picked port; ``options`` go to the SDK's ``start_time_skipping``."""

    async def start(ports: PortPicker) -> WorkflowEnvironment:
        return await WorkflowEnvironment.start_time_skipping(
            port=ports(), test_server_startup_timeout=timedelta(seconds=startup_timeout), **options
        )

    return await astart_with_retries("the Temporal time-skipping test server", start, tries=tries, pick=pick)


@dataclass(frozen=True)
class DevServer:
    """A started dev server: its environment (``shutdown()`` stops it) and the ports it serves."""

    env: WorkflowEnvironment
    port: int
    ui_port: int | None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


async def start_dev_server(
    *,
    port: int | None = None,
    ui: bool = False,
    ui_port: int | None = None,
    extra_args: Sequence[str] = (),
    tries: int = TRIES,
    pick: PortPicker = pick_port,
    startup_timeout: float = STARTUP_TIMEOUT,
    **options: Any,
) -> DevServer:
    """The dev server (``temporal server start-dev``) with every port it binds picked: the frontend
    (``port`` is preferred on the first try when free), the Web UI (``ui_port`` likewise), HTTP and
    metrics; ``options`` go to the SDK's ``start_local``. The UI's preferred port is kept only beside
    the preferred frontend port (7233 and 8233 go together)."""
    first = True

    async def start(ports: PortPicker) -> DevServer:
        nonlocal first
        preferred, first = first, False
        frontend = pick_port(port) if preferred and port else ports()
        web: int | None = None
        if ui:
            web = pick_port(ui_port) if preferred and ui_port and frontend == port else ports()
        http, metrics = ports(), ports()
        env = await WorkflowEnvironment.start_local(
            port=frontend,
            ui=ui,
            ui_port=web,
            dev_server_extra_args=[*extra_args, "--http-port", str(http), "--metrics-port", str(metrics)],
            dev_server_startup_timeout=timedelta(seconds=startup_timeout),
            **options,
        )
        return DevServer(env=env, port=frontend, ui_port=web)

    return await astart_with_retries("the Temporal dev server", start, tries=tries, pick=pick)
