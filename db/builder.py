"""The reversible half of an export: the tenant's contacts in scope, streamed into a local file in the
destination's format.

``COPY ... TO STDOUT`` runs on a connection borrowed from the worker's pool, shaped as the destination's
CSV (header, delimiter, columns; composed with ``psycopg.sql``); its rows are read by libpq in a thread
(psycopg's per-row async reads cost about four times what ``psql \\copy`` spends on the same query) and
handed in 1 MiB blocks to the encoding stages (``encoding/``: gzip, OpenPGP), which hash the CSV and the
delivered bytes as they write them into a private directory. Cancellation
stops the thread within one poll interval, asks the server to cancel the query, discards the
connection and removes the partial file; every other failure is one :class:`BuildError` whose
message carries codes only, never contact data.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import select
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

import psycopg
from psycopg import pq, sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from db.errors import is_transient
from db.queries import q
from domain.file_format import FileFormat
from domain.models import final_name_for
from encoding import EncodedFile, EncodingError, EncodingStopped, FileWriter, open_file_writer
from encoding.openpgp import remove_home

log = logging.getLogger("fenced.builder")

PRIVATE_DIR_PREFIX = "build-"
_FLUSH_BYTES = 1 << 20
_POLL_SECONDS = 0.1


@dataclass(frozen=True)
class BuiltFile:
    """A finished export file: where it is, the name it will have at the partner, and what it holds.

    ``size`` and ``sha256`` describe the delivered bytes (what recovery compares with the partner's file);
    ``plain_size`` and ``plain_sha256`` the CSV inside (what the partner's ``gpg --decrypt`` and
    ``gunzip`` give back); ``recipients`` and ``signer`` are OpenPGP fingerprints.
    """

    path: Path
    final_name: str
    size: int
    sha256: bytes
    rows: int
    plain_size: int = 0
    plain_sha256: bytes = b""
    recipients: tuple[str, ...] = ()
    signer: str | None = None
    file_format: FileFormat = FileFormat()

    def evidence(self) -> dict[str, object]:
        """What cutoff 2 records with the attempt (the DeliveryAuthorized event): the file, both hashes and
        sizes, the row count, the format and the fingerprints; hashes in hex, never contents or keys."""
        return {
            "file": self.final_name,
            "bytes": self.size,
            "sha256": self.sha256.hex(),
            "rows": self.rows,
            "plaintext": {"bytes": self.plain_size, "sha256": self.plain_sha256.hex()},
            "format": self.file_format.describe(),
            "recipients": list(self.recipients),
            "signer": self.signer,
        }


class BuildError(Exception):
    """The build failed for a reason other than cancellation; ``code`` names it, the message has no data.

    ``transient`` says the database could not be reached (a pool timeout, a lost connection): nothing is
    wrong with the export, so the attempt is given back rather than failed.
    """

    def __init__(self, code: str, detail: str = "", *, transient: bool = False) -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.transient = transient


class _Stopped(Exception):
    """Raised in the copy thread when the caller was cancelled."""


@dataclass
class _Counters:
    rows: int = 0
    bytes: int = 0


async def build_export(
    pool: AsyncConnectionPool,
    *,
    tenant_id: UUID,
    list_name: str,
    delivery_key: str,
    attempt_id: UUID,
    work_dir: Path,
    file_format: FileFormat = FileFormat(),
    signing_passphrase: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    progress_interval: float = 0.5,
) -> BuiltFile:
    """Stream the tenant's contacts in ``list_name`` into ``contacts-{delivery_key}{suffix}`` in
    ``file_format`` (``.csv``, ``.csv.gz``, ``.csv.pgp``, ``.csv.gz.pgp``) and hash them.

    The file is written under a fresh 0700 directory in ``work_dir``, with the SHA-256 and size of the CSV
    and of the delivered bytes computed as it is written (``encoding/``). ``progress(rows, bytes)`` (CSV
    bytes) is called on the event loop about every ``progress_interval`` seconds and once at the end, so an
    activity can heartbeat from it. On cancellation the copy stops within a poll interval, the partial file
    is removed and ``asyncio.CancelledError`` propagates unwrapped; every other failure removes the partial
    file and raises :class:`BuildError` (an unusable partner key or signing key before any row is read).
    ``signing_passphrase`` unlocks a protected signing key; it is never logged.
    """
    final_name = final_name_for(delivery_key, file_format.suffix)
    path = _private_dir(work_dir, attempt_id) / final_name
    try:
        rows, encoded = await _copy_to_file(
            pool,
            tenant_id,
            list_name,
            path,
            _Encoding(file_format, signing_passphrase, gpg_root_for(work_dir), str(attempt_id)),
            progress,
            progress_interval,
        )
    except BaseException:
        remove_export_file(path)
        raise
    return BuiltFile(
        path=path,
        final_name=final_name,
        size=encoded.size,
        sha256=encoded.sha256,
        rows=rows,
        plain_size=encoded.plain_size,
        plain_sha256=encoded.plain_sha256,
        recipients=encoded.recipients,
        signer=encoded.signer,
        file_format=file_format,
    )


@dataclass(frozen=True)
class _Encoding:
    file_format: FileFormat
    passphrase: str | None = field(default=None, repr=False)
    gpg_root: Path | None = None
    label: str = ""


def gpg_root_for(work_dir: Path) -> Path:
    """Where this work directory's builds keep their private GnuPG homes (one per OpenPGP file, named by
    attempt): a short path under the system's temporary directory (the agent's socket must fit in 108
    bytes), one per work directory, so a scavenger only ever looks at its own."""
    tag = hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"fx-gpg-{tag}"


def gpg_homes(work_dir: Path) -> dict[UUID, list[Path]]:
    """The GnuPG homes builds in ``work_dir`` left, by the attempt ID their name carries (a killed worker's
    may hold an imported signing key)."""
    found: dict[UUID, list[Path]] = {}
    try:
        entries = list(gpg_root_for(work_dir).iterdir())
    except FileNotFoundError:
        return found
    for entry in entries:
        try:
            attempt_id = UUID(entry.name[:36])
        except ValueError:
            continue
        if entry.is_dir():
            found.setdefault(attempt_id, []).append(entry)
    return found


def remove_gpg_home(path: Path) -> None:
    """Stop a GnuPG home's agent and remove it (with any imported key); never raises."""
    remove_home(path)


def copy_statement(file_format: FileFormat) -> bytes:
    """``copy_contacts`` for ``file_format``: its columns as identifiers, header and delimiter as literals
    (from a checked ``FileFormat``; COPY takes no parameters, and no request's value is merged)."""
    return (
        sql.SQL(q("copy_contacts"))
        .format(
            columns=sql.SQL(", ").join(sql.Identifier(c) for c in file_format.columns),
            header=sql.Literal(file_format.header),
            delimiter=sql.Literal(file_format.delimiter),
        )
        .as_bytes(None)
    )


def _private_dir(work_dir: Path, attempt_id: UUID) -> Path:
    """A fresh 0700 directory for one attempt's file, so no other local user can read it."""
    try:
        work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{PRIVATE_DIR_PREFIX}{attempt_id}-", dir=work_dir))
    except OSError as exc:
        raise BuildError("WorkDirUnusable", _os_code(exc)) from None


async def _copy_to_file(
    pool: AsyncConnectionPool,
    tenant_id: UUID,
    list_name: str,
    path: Path,
    encoding: _Encoding,
    progress: Callable[[int, int], None] | None,
    progress_interval: float,
) -> tuple[int, EncodedFile]:
    try:
        async with pool.connection() as conn:
            return await _copy_on(conn, tenant_id, list_name, path, encoding, progress, progress_interval)
    except BuildError:
        raise
    except EncodingError as exc:
        # A partner key gpg cannot use, a signing key that is missing, open to others or locked: it would
        # fail the same way on every attempt.
        raise BuildError(exc.code, exc.detail) from None
    except PoolTimeout:
        raise BuildError("DatabaseUnavailable", "PoolTimeout", transient=True) from None
    except psycopg.Error as exc:
        raise BuildError("DatabaseError", _pg_code(exc), transient=is_transient(exc)) from None
    except OSError as exc:
        raise BuildError("WriteFailed", _os_code(exc)) from None
    except Exception as exc:  # the seed: every failure but cancellation is one typed build error
        raise BuildError("Unexpected", type(exc).__name__) from None


async def _copy_on(
    conn: psycopg.AsyncConnection,
    tenant_id: UUID,
    list_name: str,
    path: Path,
    encoding: _Encoding,
    progress: Callable[[int, int], None] | None,
    progress_interval: float,
) -> tuple[int, EncodedFile]:
    await conn.execute("BEGIN READ ONLY")
    await conn.execute(q("set_build_scope"), {"tenant_id": str(tenant_id), "list_name": list_name})
    stop = threading.Event()
    counters = _Counters()
    loop = asyncio.get_running_loop()
    copying = loop.run_in_executor(None, _stream_copy, conn.pgconn, path, encoding, stop, counters)
    reported = (-1, -1)
    try:
        while True:
            done, _ = await asyncio.wait({copying}, timeout=progress_interval)
            if progress is not None and (counters.rows, counters.bytes) != reported:
                reported = (counters.rows, counters.bytes)
                progress(*reported)
            if done:
                break
        rows, encoded = copying.result()
    except BaseException:
        # Cancelled, or failed: stop the thread (it never blocks longer than a poll interval), have the
        # server abandon the query (a backend waiting on a lock would not notice a closed socket), and
        # discard the connection, whose protocol state psycopg did not follow.
        stop.set()
        await _wait_for_thread(copying)
        with contextlib.suppress(Exception):
            await conn.cancel_safe(timeout=2.0)
        await conn.close()
        raise
    await conn.execute("COMMIT")
    if progress is not None and (counters.rows, counters.bytes) != reported:
        progress(counters.rows, counters.bytes)
    return rows, encoded


async def _wait_for_thread(copying: asyncio.Future[tuple[int, EncodedFile]]) -> None:
    """Wait for the copy thread to leave, even through repeated cancellation; its error is not ours."""
    while not copying.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({copying})
    if not copying.cancelled():
        copying.exception()  # retrieved, so asyncio does not log it as never retrieved


def _stream_copy(
    pgconn: pq.abc.PGconn, path: Path, encoding: _Encoding, stop: threading.Event, counters: _Counters
) -> tuple[int, EncodedFile]:
    """Run in a thread: send the COPY, hand its rows to the encoding stages in blocks; (rows, what they wrote).

    The stages start first (the partner's keys are checked, the signing key imported), so a key that
    cannot be used fails before the query is sent.
    """
    writer = open_file_writer(
        path,
        encoding.file_format,
        should_stop=stop.is_set,
        passphrase=encoding.passphrase,
        gpg_root=encoding.gpg_root,
        label=encoding.label,
    )
    try:
        tagged, messages = _copy_into(pgconn, writer, stop, counters)
        encoded = writer.finish()
    except EncodingStopped:
        writer.abort()
        raise _Stopped from None
    except BaseException:
        writer.abort()
        raise
    header = 1 if encoding.file_format.header else 0
    rows = tagged if tagged is not None else max(messages - header, 0)
    counters.rows, counters.bytes = rows, encoded.plain_size
    return rows, encoded


def _copy_into(
    pgconn: pq.abc.PGconn, writer: FileWriter, stop: threading.Event, counters: _Counters
) -> tuple[int | None, int]:
    """The COPY itself, into ``writer``; (rows by the command tag, COPY messages read)."""
    pgconn.send_query(copy_statement(writer.format))
    _flush_query(pgconn, stop)
    _wait_until_ready(pgconn, stop)
    result = pgconn.get_result()
    if result is None or result.status != pq.ExecStatus.COPY_OUT:
        raise _copy_failed(pgconn, result)
    buffer = bytearray()
    size = 0
    messages = 0
    get = pgconn.get_copy_data
    while True:
        nbytes, data = get(1)
        if nbytes > 0:
            buffer += data
            messages += 1
            if len(buffer) >= _FLUSH_BYTES:
                size += _flush(writer, buffer)
                counters.rows, counters.bytes = messages - 1, size
                if stop.is_set():
                    raise _Stopped
            continue
        if nbytes == 0:
            _wait_readable(pgconn, stop)
            continue
        break  # -1: the copy is complete; -2: an error, reported by the final result
    size += _flush(writer, buffer)
    _wait_until_ready(pgconn, stop)
    final = pgconn.get_result()
    if final is None or final.status != pq.ExecStatus.COMMAND_OK:
        raise _copy_failed(pgconn, final)
    while pgconn.get_result() is not None:
        pass
    return final.command_tuples, messages


def _flush(writer: FileWriter, buffer: bytearray) -> int:
    writer.write(bytes(buffer))
    written = len(buffer)
    buffer.clear()
    return written


def _wait_readable(pgconn: pq.abc.PGconn, stop: threading.Event) -> None:
    """Wait for the server to send more, checking for a stop every poll interval."""
    if stop.is_set():
        raise _Stopped
    select.select([pgconn.socket], [], [], _POLL_SECONDS)
    pgconn.consume_input()


def _flush_query(pgconn: pq.abc.PGconn, stop: threading.Event) -> None:
    """The pool's connections are non-blocking: push the whole query out before waiting for answers."""
    while pgconn.flush() != 0:
        if stop.is_set():
            raise _Stopped
        select.select([], [pgconn.socket], [], _POLL_SECONDS)


def _wait_until_ready(pgconn: pq.abc.PGconn, stop: threading.Event) -> None:
    """Wait, a poll interval at a time, until a whole result can be read without blocking."""
    while True:
        pgconn.consume_input()
        if not pgconn.is_busy():
            return
        _wait_readable(pgconn, stop)


def remove_export_file(path: Path) -> bool:
    """Remove an export file and its private build directory; True when nothing is left.

    Best effort, and never raises: a failed removal is logged (IDs and error codes only) for the
    scavenger, and False is returned rather than claiming the file is gone. Calling it again is harmless.
    """
    try:
        path.unlink(missing_ok=True)
        parent = path.parent
        if parent.name.startswith(PRIVATE_DIR_PREFIX):
            shutil.rmtree(parent)
        return True
    except FileNotFoundError:
        return True
    except OSError as exc:
        log.warning(
            "export file not removed; left for the scavenger",
            extra={"export_file": str(path), "error": _os_code(exc)},
        )
        return False


def build_dirs(work_dir: Path) -> dict[UUID, list[Path]]:
    """The private build directories under ``work_dir``, by the attempt ID their name carries."""
    found: dict[UUID, list[Path]] = {}
    try:
        entries = list(work_dir.iterdir())
    except FileNotFoundError:
        return found
    for entry in entries:
        if not entry.is_dir() or not entry.name.startswith(PRIVATE_DIR_PREFIX):
            continue
        try:
            attempt_id = UUID(entry.name[len(PRIVATE_DIR_PREFIX) :][:36])
        except ValueError:
            continue
        found.setdefault(attempt_id, []).append(entry)
    return found


def _os_code(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "")
    return f"{type(exc).__name__}{'(' + name + ')' if name else ''}"


def _pg_code(exc: psycopg.Error) -> str:
    return f"{type(exc).__name__}(sqlstate={exc.sqlstate})" if exc.sqlstate else type(exc).__name__


def _copy_failed(pgconn: pq.abc.PGconn, result: pq.abc.PGresult | None) -> BuildError:
    """The COPY's failure, transient when the server went away under it (a restart's admin_shutdown,
    a crash, a lost connection): nothing is wrong with the export, so the attempt is given back, not failed
    (the soak saw a fast PostgreSQL restart fail a build with 57P01). A cancel (57014) is not: the builder
    cancels only on a stop, and a statement timeout would recur on every attempt."""
    code = _result_code(pgconn, result)
    gone = code == "ConnectionLost" or code.startswith(("sqlstate=57P", "sqlstate=08"))
    return BuildError("CopyFailed", code, transient=gone or pgconn.status != pq.ConnStatus.OK)


def _result_code(pgconn: pq.abc.PGconn, result: pq.abc.PGresult | None) -> str:
    if result is not None:
        sqlstate = result.error_field(pq.DiagnosticField.SQLSTATE)
        if sqlstate:
            return f"sqlstate={sqlstate.decode()}"
        return f"status={pq.ExecStatus(result.status).name}"
    if pgconn.status != pq.ConnStatus.OK:
        return "ConnectionLost"
    return "NoResult"
