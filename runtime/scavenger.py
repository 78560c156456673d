"""The scavenger: removes the local export files (contact data) of attempts that have ended.

A worker killed mid-build or mid-upload leaves its private build directory behind, and nothing else
removes it. Every worker scavenges at start and every recovery interval; the row decides what is orphaned.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from uuid import UUID

from db.builder import build_dirs, gpg_homes, remove_gpg_home
from db.errors import StoreError
from db.stores.protocol import WorkerStore

log = logging.getLogger(__name__)


async def scavenge_export_files(
    work_dir: Path, live_attempts: Callable[[list[UUID]], Awaitable[set[UUID]]]
) -> list[UUID]:
    """Remove the local files of attempts that can no longer use them; returns the attempts cleaned.

    A worker killed mid-build or mid-upload leaves contact data on disk that nothing else removes. The row
    decides what is orphaned: a directory is kept while its attempt is Running or Delivering (possibly in
    another live process on this host) and removed once recovery or a terminal write has ended it.
    """
    dirs = build_dirs(work_dir)
    homes = gpg_homes(work_dir)  # a killed build's GnuPG home may hold the tenant's imported signing key
    if not dirs and not homes:
        return []
    live = await live_attempts(list({*dirs, *homes}))
    cleaned: list[UUID] = []
    for attempt_id, home_paths in homes.items():
        if attempt_id not in live:
            for home in home_paths:
                remove_gpg_home(home)
            if attempt_id not in dirs:
                log.info("removed the GnuPG home of ended attempt %s", attempt_id)
                cleaned.append(attempt_id)
    for attempt_id, paths in dirs.items():
        if attempt_id in live:
            continue
        for path in paths:
            try:
                shutil.rmtree(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning(
                    "orphaned export directory not removed",
                    extra={"attempt_id": str(attempt_id), "error": _os_code(exc)},
                )
                continue
        log.info("removed the local export files of ended attempt %s", attempt_id)
        cleaned.append(attempt_id)
    return cleaned


async def scavenge_periodically(store: WorkerStore, work_dir: Path, every_seconds: float) -> None:
    """Remove the local export files of ended attempts (a killed worker's contact data), now and every
    ``every_seconds``; a failed pass is logged and tried again next time."""
    while True:
        try:
            await scavenge_export_files(work_dir, store.live_attempts)
        except StoreError as exc:
            log.warning("scavenger pass failed (%s); trying again later", type(exc).__name__)
        await asyncio.sleep(every_seconds)


def _os_code(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "")
    return f"{type(exc).__name__}{'(' + name + ')' if name else ''}"
