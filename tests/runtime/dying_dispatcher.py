"""A dispatcher process for tests/runtime/test_dispatcher.py that takes its batch and then stops for good
before it starts the workflow of one job's wake-up, so the test can SIGKILL it exactly there.

``python -m tests.runtime.dying_dispatcher --job JOB_ID --marker PATH --temporal HOST:PORT`` (from the
project root), with ``EXPORTS_DATABASE_URL`` and ``EXPORTS_TASK_QUEUE``. When the leased row of JOB_ID
reaches the start, the hook writes PATH (the message ID) and waits forever; only a signal ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from uuid import UUID

from temporalio.client import Client

from db.pool import open_pool
from db.stores.outbox import DispatcherStore
from domain.models import OutboxMessage
from runtime.dispatcher import OutboxDispatcher
from service.temporal import DATA_CONVERTER
from settings import Settings


async def main(job_id: UUID, marker: Path, temporal: str) -> None:
    settings = Settings()
    assert settings.database_url is not None
    pool = await open_pool(settings.database_url, "exports_dispatcher", max_size=2)
    client = await Client.connect(temporal, data_converter=DATA_CONVERTER)

    async def hold_forever(msg: OutboxMessage) -> None:
        if msg.job_id == job_id:
            partial = marker.with_suffix(".partial")
            partial.write_text(str(msg.message_id))
            os.replace(partial, marker)
            await asyncio.Event().wait()  # the process is killed here, its row leased and committed

    dispatcher = OutboxDispatcher(
        DispatcherStore(pool), client, settings, listen_url=None, before_publish=hold_forever
    )
    await dispatcher.dispatch_once()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", type=UUID, required=True)
    parser.add_argument("--marker", type=Path, required=True)
    parser.add_argument("--temporal", required=True)
    args = parser.parse_args()
    asyncio.run(main(args.job, args.marker, args.temporal))
