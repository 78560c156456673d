"""A worker process for tests/e2e/test_killed_worker.py: ``worker.run_worker`` with one export seam that
stops the attempt at a named point for good, so the test can SIGKILL the process exactly there.

``python -m tests.e2e.killed_worker_runner --block-at POINT --job JOB_ID --marker PATH`` (from the project
root), configured by ``EXPORTS_*`` variables like ``worker.py``. When the job's attempt reaches POINT
(``after_build``, ``before_upload``, ``during_upload`` once some bytes are sent, or ``after_rename_fence``:
the whole file uploaded under its temporary name, the rename fence written, the rename not sent; ``after_rename``:
the data file renamed, its manifests not published; ``before_manifest_rename``: a manifest's temporary file
written, its rename not sent), the seam writes PATH
(JSON: the point and the bytes sent, IDs and counts only) and then waits forever; only a signal ends it.
The lease timer is off, so the row is left exactly as the process had it when it was killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from uuid import UUID

from activities.export import ExportActivities
from settings import Settings
from worker import run_worker

BLOCK_POINTS = (
    "after_build",
    "before_upload",
    "during_upload",
    "after_rename_fence",
    "after_rename",  # the data file renamed into place, its manifests not yet (issue #24.6)
    "before_manifest_rename",  # a manifest's temporary file written, its rename not sent
)


def write_marker(marker: Path, point: str, job_id: UUID, bytes_sent: int | None) -> None:
    """Write the marker atomically (write, then rename), so the test never reads half of it."""
    partial = marker.with_suffix(".partial")
    partial.write_text(json.dumps({"point": point, "job_id": str(job_id), "bytes_sent": bytes_sent}))
    os.replace(partial, marker)


def block_at(
    point: str, job_id: UUID, marker: Path, released: asyncio.Event | None = None
) -> Callable[[ExportActivities], None]:
    """An ``export_hooks`` installer: the named seam, for ``job_id`` only, marks and then never returns,
    or returns once ``released`` is set (a drain lets the work go on)."""

    async def hold_forever(bytes_sent: int | None) -> None:
        write_marker(marker, point, job_id, bytes_sent)
        await (released or asyncio.Event()).wait()  # the process is killed here, or drained

    async def hook(seen: UUID) -> None:
        if seen == job_id:
            await hold_forever(None)

    async def upload_hook(seen: UUID, sent: int) -> None:
        if seen == job_id and sent > 0:
            await hold_forever(sent)

    def install(activities: ExportActivities) -> None:
        if released is None:
            activities.seams.lease_timer_disabled = True  # nothing renews the lease once the process is gone
        if point == "during_upload":
            activities.seams.during_upload = upload_hook
        else:
            setattr(activities.seams, point, hook)

    return install


def main() -> None:
    """Parse the seam's arguments, build the settings from ``EXPORTS_*`` and run the worker."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-at", choices=BLOCK_POINTS, required=True)
    parser.add_argument("--job", type=UUID, required=True)
    parser.add_argument("--marker", type=Path, required=True)
    parser.add_argument(
        "--drain-on-sigterm", action="store_true", help="install worker.py's own SIGTERM handling (a drain)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings()

    async def serve() -> None:
        # Without --drain-on-sigterm no signal handlers: SIGKILL is the point, and SIGTERM's default ends the
        # process just as well. With it, SIGTERM drains exactly as worker.py's main() does.
        stop = asyncio.Event()
        released: asyncio.Event | None = None
        if args.drain_on_sigterm:
            released = asyncio.Event()

            def drain() -> None:
                stop.set()
                # An upload is let go on, to its terminal write; a build stays held: the drain itself stops it.
                if args.block_at == "during_upload":
                    released.set()

            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, drain)
        await run_worker(
            settings,
            stop=stop,
            schedules=False,
            export_hooks=block_at(args.block_at, args.job, args.marker, released),
        )

    asyncio.run(serve())


if __name__ == "__main__":
    main()
