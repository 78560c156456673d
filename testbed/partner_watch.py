"""A watch on a partner's upload directory from the partner's own disk, which the code under test never
touches: every name that appeared, was renamed or was removed there, with the time it was seen.

It reads inotify events (``inotify_simple``) in a thread, started before any export runs. From them it
tells which final names were written, how many times, and by which attempt: an upload goes to
``.partial-{attempt}-{final}`` and is published by a rename, which OpenSSH performs as ``link`` +
``unlink`` (a new name sharing the temporary file's inode, then the temporary name removed) or, for
``posix_rename``, as ``rename`` (a MOVED_FROM/MOVED_TO pair with one cookie). Either way the writer is
the attempt in the temporary name.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from inotify_simple import INotify, flags

TEMP_PREFIX = ".partial-"
_UUID_LENGTH = 36
_MASK = (
    flags.CREATE
    | flags.MOVED_TO
    | flags.MOVED_FROM
    | flags.DELETE
    | flags.CLOSE_WRITE
    | flags.DELETE_SELF
    | flags.MOVE_SELF
)


@dataclass(frozen=True)
class WatchEvent:
    """One thing seen in the directory: ``kind`` is create, moved_to, moved_from, delete, close_write or
    overflow; ``inode`` and ``size`` are what a stat right after the event showed (None if gone)."""

    t: float
    kind: str
    name: str
    cookie: int = 0
    inode: int | None = None
    size: int | None = None


@dataclass(frozen=True)
class FinalWrite:
    """A final name that appeared, and the attempt whose temporary file it was (None: not attributable)."""

    t: float
    name: str
    how: str  # "link" (rename by link+unlink), "rename" (posix_rename), "direct" (no temporary file)
    temp_name: str | None
    attempt_id: uuid.UUID | None


def parse_temp_name(name: str) -> tuple[uuid.UUID, str] | None:
    """(attempt ID, final name) from ``.partial-{attempt}-{final}``, or None for any other name."""
    if not name.startswith(TEMP_PREFIX):
        return None
    rest = name[len(TEMP_PREFIX) :]
    try:
        attempt = uuid.UUID(rest[:_UUID_LENGTH])
    except ValueError:
        return None
    if rest[_UUID_LENGTH : _UUID_LENGTH + 1] != "-":
        return None
    return attempt, rest[_UUID_LENGTH + 1 :]


class PartnerWatch:
    """Watches one directory (not recursively) until :meth:`stop`; events are kept in order."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.events: list[WatchEvent] = []
        self.overflowed = False
        self.errors: list[str] = []
        self._inotify = INotify()
        self._inotify.add_watch(str(directory), _MASK)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="partner-watch", daemon=True)

    def start(self) -> PartnerWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Read what is pending, then stop the thread and close the inotify descriptor."""
        self._stopping.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self._inotify.close()

    def snapshot(self) -> list[WatchEvent]:
        with self._lock:
            return list(self.events)

    def _stat(self, name: str) -> tuple[int | None, int | None]:
        try:
            st = os.lstat(self.directory / name)
        except OSError:
            return None, None
        return st.st_ino, st.st_size

    def _run(self) -> None:
        try:
            while True:
                batch = self._inotify.read(timeout=200)
                now = time.time()
                seen: list[WatchEvent] = []
                for event in batch:
                    mask = event.mask
                    if mask & flags.Q_OVERFLOW:
                        self.overflowed = True
                        seen.append(WatchEvent(now, "overflow", ""))
                        continue
                    if mask & flags.ISDIR:
                        continue
                    if mask & flags.CREATE:
                        inode, size = self._stat(event.name)
                        seen.append(WatchEvent(now, "create", event.name, inode=inode, size=size))
                    if mask & flags.MOVED_FROM:
                        seen.append(WatchEvent(now, "moved_from", event.name, cookie=event.cookie))
                    if mask & flags.MOVED_TO:
                        inode, size = self._stat(event.name)
                        seen.append(
                            WatchEvent(
                                now, "moved_to", event.name, cookie=event.cookie, inode=inode, size=size
                            )
                        )
                    if mask & flags.CLOSE_WRITE:
                        inode, size = self._stat(event.name)
                        seen.append(WatchEvent(now, "close_write", event.name, inode=inode, size=size))
                    if mask & flags.DELETE:
                        seen.append(WatchEvent(now, "delete", event.name))
                    if mask & (flags.DELETE_SELF | flags.MOVE_SELF):
                        self.errors.append("the watched directory itself was removed or moved")
                if seen:
                    with self._lock:
                        self.events.extend(seen)
                if not batch and self._stopping.is_set():
                    return
        except Exception as exc:  # noqa: BLE001 - reported: an audit over a broken watch proves nothing
            self.errors.append(f"watch thread failed: {exc!r}")


def final_writes(events: list[WatchEvent], link_window: float = 5.0) -> list[FinalWrite]:
    """Every appearance of a final name (not a temporary name), with the attempt that wrote it if known."""
    temp_inodes: dict[int, str] = {}
    moved_from: dict[int, str] = {}
    writes: list[FinalWrite] = []
    for index, event in enumerate(events):
        temp = parse_temp_name(event.name)
        if temp is not None:
            if event.kind == "create" and event.inode is not None:
                temp_inodes[event.inode] = event.name
            elif event.kind == "moved_from":
                moved_from[event.cookie] = event.name
            continue
        if event.kind not in ("create", "moved_to") or event.name.startswith("."):
            continue
        source: str | None = None
        how = "direct"
        if event.kind == "moved_to" and event.cookie in moved_from:
            source, how = moved_from[event.cookie], "rename"
        elif event.inode is not None and event.inode in temp_inodes:
            candidate = temp_inodes[event.inode]
            if (parse_temp_name(candidate) or (None, ""))[1] == event.name:
                source, how = candidate, "link"
        if source is None:
            # The stat missed the inode: the temporary name removed right after the link names the writer.
            for later in events[index + 1 :]:
                if later.t - event.t > link_window:
                    break
                parsed = parse_temp_name(later.name)
                if later.kind == "delete" and parsed is not None and parsed[1] == event.name:
                    source, how = later.name, "link"
                    break
        parsed = parse_temp_name(source) if source else None
        writes.append(FinalWrite(event.t, event.name, how, source, parsed[0] if parsed else None))
    return writes


def temp_files_created(events: list[WatchEvent]) -> dict[uuid.UUID, list[WatchEvent]]:
    """The temporary files each attempt created, by attempt ID (an upload that started)."""
    created: dict[uuid.UUID, list[WatchEvent]] = {}
    for event in events:
        parsed = parse_temp_name(event.name)
        if parsed is not None and event.kind == "create":
            created.setdefault(parsed[0], []).append(event)
    return created
