"""The stages after ``COPY``: CSV bytes in, the delivered file out, both sides hashed as they pass.

``FileWriter.write`` is called with the CSV as ``COPY`` produces it (in the builder's copy thread): it
hashes the plaintext and hands the block on. A gzip destination's blocks are compressed on a thread of
their own (zlib releases the GIL), an OpenPGP destination's are piped through ``gpg`` in its own process,
and a reader thread hashes the message and writes it to the file. So COPY, gzip and OpenPGP run side by
side, as a shell pipeline would, and at most a few blocks are in memory at once. A plain CSV is written and
hashed once, by the caller's thread. ``finish`` returns what the evidence records: the delivered bytes' and
the plaintext's SHA-256 and sizes, the recipients' fingerprints and the signer's.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from isal import isal_zlib

from domain.file_format import FileFormat
from encoding.errors import EncodingError, EncodingStopped
from encoding.openpgp import GpgHome, GpgStream, import_signing_key, recipients, start_stream

# ISA-L's deflate (the ``isal`` wheel), standard gzip output that any gunzip reads: on 1M contacts here
# level 1 took 0.07 s where zlib's level 6 (gzip's default) took 0.56 s, for a file 3 % larger.
GZIP_LEVEL = 1
_QUEUE_BLOCKS = 4  # blocks of about 1 MiB waiting for the compressor: the memory bound between stages
_READ_BYTES = 1 << 20
_POLL_SECONDS = 0.1
_FINISH_TIMEOUT_SECONDS = 300.0
_DONE = object()


@dataclass(frozen=True)
class EncodedFile:
    """What was written: the delivered bytes (``size``, ``sha256``, what the partner compares), the CSV
    inside (``plain_size``, ``plain_sha256``), and who can read and verify it."""

    size: int
    sha256: bytes
    plain_size: int
    plain_sha256: bytes
    recipients: tuple[str, ...] = ()
    signer: str | None = None


@dataclass
class _Sink:
    """The file on disk, hashed as it is written (the delivered side)."""

    fd: int
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)
    size: int = 0
    closed: bool = False

    def write(self, data: bytes) -> None:
        try:
            _write_all(self.fd, data)
        except OSError as exc:
            raise EncodingError("WriteFailed", _os_code(exc)) from None
        self.digest.update(data)
        self.size += len(data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                os.close(self.fd)


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte (a pipe or file may take fewer than offered in one call)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class FileWriter:
    """Write one export file in a destination's format (see the module docstring); use
    :func:`open_file_writer`. ``write`` from one thread, then ``finish`` or ``abort`` from the same one."""

    def __init__(
        self,
        path: Path,
        file_format: FileFormat,
        *,
        should_stop: Callable[[], bool],
        passphrase: str | None = None,
        gpg_root: Path | None = None,
        label: str = "",
    ) -> None:
        self.path = path
        self.format = file_format
        self._should_stop = should_stop
        self._plain = hashlib.sha256()
        self._plain_size = 0
        self._error: BaseException | None = None
        self._failed = threading.Event()
        self._aborting = threading.Event()
        self._threads: list[threading.Thread] = []
        self._queue: queue.Queue[object] = queue.Queue(maxsize=_QUEUE_BLOCKS)
        self._home: GpgHome | None = None
        self._gpg: GpgStream | None = None
        self._recipients: tuple[str, ...] = ()
        self._signer: str | None = None
        self._sink: _Sink | None = None
        try:
            if file_format.openpgp:
                self._home = GpgHome.create(gpg_root, label)
                found = recipients(self._home, file_format.recipient_keys)
                self._recipients = tuple(r.fingerprint for r in found)
                if file_format.signing_key_ref is not None:
                    self._signer = import_signing_key(self._home, file_format.signing_key_ref)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except OSError as exc:
                raise EncodingError("WorkDirUnusable", _os_code(exc)) from None
            self._sink = _Sink(fd)
            if file_format.openpgp:
                assert self._home is not None
                literal_name = path.name.removesuffix(".pgp")
                self._gpg = start_stream(
                    self._home,
                    recipients_=found,
                    signer=self._signer,
                    literal_name=literal_name,
                    passphrase=passphrase,
                )
                self._start(self._read_message, "encode-openpgp-out")
            if not file_format.plain:
                self._start(self._encode, "encode-stages")
        except BaseException:
            self._release()
            raise

    # -- the caller's side --------------------------------------------------------------------------

    def write(self, block: bytes) -> None:
        """Pass ``block`` on (hashed as plaintext on the way); waits while the stages are behind (a few
        blocks), raising :class:`EncodingStopped` if the caller stops meanwhile and the stages' error if one
        failed. A plain CSV is hashed and written here; otherwise the stage thread hashes it, off the COPY
        reader's path."""
        self._raise_if_failed()
        self._plain_size += len(block)
        if self.format.plain:
            assert self._sink is not None
            self._plain.update(block)
            self._sink.write(block)
            return
        self._put(block)

    def finish(self) -> EncodedFile:
        """Flush every stage, wait for them and close the file; what was written."""
        assert self._sink is not None
        sink = self._sink
        try:
            if not self.format.plain:
                self._put(_DONE)
                for thread in self._threads:
                    thread.join(timeout=_FINISH_TIMEOUT_SECONDS)
                    if thread.is_alive():
                        raise EncodingError("OpenPgpFailed", "a stage did not finish")
                self._raise_if_failed()
                if self._gpg is not None:
                    self._gpg.wait(timeout=_FINISH_TIMEOUT_SECONDS)
            plain_sha256 = self._plain.digest()
            return EncodedFile(
                size=sink.size,
                sha256=plain_sha256 if self.format.plain else sink.digest.digest(),
                plain_size=self._plain_size,
                plain_sha256=plain_sha256,
                recipients=self._recipients,
                signer=self._signer,
            )
        finally:
            self._release()

    def abort(self) -> None:
        """Stop every stage (gpg is killed) and close the file; the caller removes it. Never raises."""
        self._aborting.set()
        if self._gpg is not None:
            self._gpg.kill()
        for thread in self._threads:
            thread.join(timeout=_FINISH_TIMEOUT_SECONDS)
        self._release()

    # -- the stages ---------------------------------------------------------------------------------

    def _encode(self) -> None:
        """The stage thread: gzip when asked, then into gpg's stdin or the file."""
        compressor = (
            isal_zlib.compressobj(GZIP_LEVEL, isal_zlib.DEFLATED, 31)  # 31: the gzip container
            if self.format.compression == "gzip"
            else None
        )
        assert self._sink is not None
        sink = self._sink
        gpg_in = self._gpg.stdin.fileno() if self._gpg is not None else None

        def downstream(data: bytes) -> None:
            if gpg_in is None:
                sink.write(data)
            else:
                _write_all(gpg_in, data)

        while True:
            try:
                item = self._queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if self._aborting.is_set():
                    return
                continue
            if item is _DONE:
                break
            assert isinstance(item, bytes)
            self._plain.update(item)
            data = compressor.compress(item) if compressor is not None else item
            if data:
                downstream(data)
        if compressor is not None:
            downstream(compressor.flush())
        if self._gpg is not None:
            self._gpg.stdin.close()  # end of input: gpg writes the rest of the message and exits

    def _read_message(self) -> None:
        """The reader thread: gpg's output, hashed and written to the file."""
        assert self._gpg is not None and self._sink is not None
        read, sink = self._gpg.stdout.read, self._sink
        while block := read(_READ_BYTES):
            sink.write(block)

    def _start(self, target: Callable[[], None], name: str) -> None:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, never lost
                if self._error is None and not self._aborting.is_set():
                    self._error = _as_encoding_error(exc, self._gpg)
                self._failed.set()
                if self._gpg is not None:
                    self._gpg.kill()  # the other stage stops too: its pipe closes

        thread = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _put(self, item: object) -> None:
        while True:
            self._raise_if_failed()
            if self._should_stop():
                raise EncodingStopped
            try:
                self._queue.put(item, timeout=_POLL_SECONDS)
                return
            except queue.Full:
                continue

    def _raise_if_failed(self) -> None:
        if self._failed.is_set():
            raise self._error or EncodingError("OpenPgpFailed", "a stage failed")

    def _release(self) -> None:
        if self._gpg is not None:
            self._gpg.close()
        if self._sink is not None:
            self._sink.close()
        if self._home is not None:
            self._home.close()
            self._home = None


def open_file_writer(
    path: Path,
    file_format: FileFormat,
    *,
    should_stop: Callable[[], bool] = lambda: False,
    passphrase: str | None = None,
    gpg_root: Path | None = None,
    label: str = "",
) -> FileWriter:
    """Create ``path`` (0600, exclusively) and the stages ``file_format`` needs; the partner's keys are
    checked and the signing key imported first, so a bad key fails before any data is read.

    An OpenPGP file's private GnuPG home is made under ``gpg_root`` (default: the system's temporary
    directory) and named ``{label}-...``, so a home a killed process left can be found and removed."""
    return FileWriter(
        path, file_format, should_stop=should_stop, passphrase=passphrase, gpg_root=gpg_root, label=label
    )


def _as_encoding_error(exc: BaseException, gpg: GpgStream | None) -> EncodingError:
    if isinstance(exc, EncodingError):
        return exc
    if isinstance(exc, BrokenPipeError | ValueError) and gpg is not None:
        # gpg stopped reading: its exit code and status say why (a bad key, a locked signing key).
        try:
            gpg.wait(timeout=_FINISH_TIMEOUT_SECONDS)
        except EncodingError as failed:
            return failed
        return EncodingError("OpenPgpFailed", "gpg stopped reading")
    if isinstance(exc, OSError):
        return EncodingError("WriteFailed", _os_code(exc))
    if type(exc).__module__.startswith("isal"):  # isal_zlib.error (typed as an instance in its stub)
        return EncodingError("CompressFailed", type(exc).__name__)
    return EncodingError("Unexpected", type(exc).__name__)


def _os_code(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "")
    return f"{type(exc).__name__}{'(' + name + ')' if name else ''}"
