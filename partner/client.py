"""The SFTP connection to a partner, on paramiko: pinned host keys, tuned transfer, typed SFTP statuses.

Everything here blocks; callers run it in a thread (``asyncio.to_thread``). The host keys are pinned:
the key the server presents is compared with every one the destination pins (one to ten, so a rotation can
overlap) before authentication, so an unknown or changed key is refused before any credential is offered or
any file is touched, and nothing is ever added to a known-hosts store. The transfer is tuned as
``shared/facts/sftp.md`` measured: ``aes128-gcm@openssh.com`` first, TCP_NODELAY, pipelined writes whose
request size is the destination's ``max_write_request``, set on the file object, never on paramiko's class.
:func:`probe` is the connection test (issue #24.3): it reports what the server presents and allows without
trusting it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import os
import re
import socket
import stat
import struct
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from paramiko.sftp import (
    CMD_CLOSE,
    CMD_EXTENDED,
    CMD_EXTENDED_REPLY,
    CMD_HANDLE,
    CMD_INIT,
    CMD_OPENDIR,
    CMD_READDIR,
    CMD_VERSION,
    SFTP_FAILURE,
    SFTP_NO_SUCH_FILE,
)

from domain.destination import Destination, host_key_fingerprint
from domain.evidence import ConnectionReport
from observability.tracing import SftpStep, sftp_span
from partner.protocol import PartnerRefused

PREFERRED_CIPHER = "aes128-gcm@openssh.com"
READ_CHUNK = 1 << 20

# Host key algorithms that can present each pinned key type (RSA keys sign with SHA-2 variants).
_ALGORITHMS_FOR_KEY = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256")}


# How often an idle session says it is alive (a session kept from before cutoff 2 to the upload waits).
KEEPALIVE_SECONDS = 5
# How long a close waits for the server to end its side of the connection (it counts the session until then).
CLOSE_WAIT_SECONDS = 5.0
POSIX_RENAME_EXTENSION = "posix-rename@openssh.com"
LIMITS_EXTENSION = "limits@openssh.com"
CONNECTION_TEST_PREFIX = ".fenced-connection-test-"


class ConnectRefused(PartnerRefused):
    """No SFTP session was opened, so nothing was sent to the partner; ``code`` says why (and ``presented``
    which key the server showed, once it showed one)."""


# SFTP status codes that say the partner has no room for our writes (draft-ietf-secsh-filexfer-13: 14
# SSH_FX_NO_SPACE_ON_FILESYSTEM, 15 SSH_FX_QUOTA_EXCEEDED). A version 3 server (OpenSSH, asyncssh) has only
# SSH_FX_FAILURE (4) for them; its message then is the one place the reason shows.
NO_SPACE_STATUSES = frozenset({14, 15})
_NO_SPACE_WORDS = re.compile(r"quota|no space|disk full|space left|insufficient space|storage full", re.I)


class SftpStatusError(OSError):
    """The server answered a request with an SFTP error status (the connection was alive to say so).

    ``no_space`` says whether the answer says the partner has no room for our writes: a status of its own
    (14, 15), or a version 3 server's FAILURE whose message speaks of a quota or full storage. The message
    itself is the partner's text and is never kept: only this fact, for the retry rules (rules/retries.py).
    """

    def __init__(self, status: int, *, no_space: bool = False) -> None:
        super().__init__(f"SFTP status {status}")
        self.status = status
        self.no_space = no_space or status in NO_SPACE_STATUSES


class _StatusSFTPClient(paramiko.SFTPClient):
    """paramiko's client, raising :class:`SftpStatusError` with the status code for error statuses.

    paramiko maps most statuses to a bare ``IOError(text)``, which cannot be told apart from a closed
    socket without reading message texts; the status code can.
    """

    server_extensions: dict[str, bytes]

    def _send_version(self) -> int:
        """paramiko's version exchange, keeping the extensions the server announces (paramiko drops them):
        ``posix-rename@openssh.com``, ``limits@openssh.com``, ... for the connection test."""
        message = paramiko.Message()
        message.add_int(3)
        self._send_packet(CMD_INIT, message)  # type: ignore[attr-defined]  # paramiko's BaseSFTP
        kind, data = self._read_packet()  # type: ignore[attr-defined]
        if kind != CMD_VERSION:
            raise paramiko.SFTPError("Incompatible sftp protocol")
        version: int = struct.unpack(">I", data[:4])[0]
        extensions: dict[str, bytes] = {}
        rest = paramiko.Message(data[4:])
        with contextlib.suppress(Exception):  # a malformed list leaves what was read so far
            while rest.get_remainder():
                name = rest.get_text()
                extensions[name] = rest.get_binary()
        self.server_extensions = extensions
        return version

    def _convert_status(self, msg: paramiko.Message) -> None:
        position = msg.packet.tell()
        status = msg.get_int()
        try:
            text = msg.get_text()
        except Exception:  # noqa: BLE001 - a status without its message: nothing more to learn from it
            text = ""
        msg.packet.seek(position)
        try:
            super()._convert_status(msg)  # type: ignore[misc]  # private in the stubs, present in paramiko
        except EOFError:
            raise  # end of file while reading: paramiko's own read loop expects it
        except OSError:
            no_space = status == SFTP_FAILURE and bool(_NO_SPACE_WORDS.search(text))
            raise SftpStatusError(status, no_space=no_space) from None


def parse_pinned_key(line: str) -> paramiko.PKey:
    """Parse ``"ssh-ed25519 AAAA..."`` (optionally after a known_hosts host field) into a public key."""
    parts = line.split()
    if len(parts) >= 3 and not _looks_like_key_type(parts[0]):
        parts = parts[1:]
    if len(parts) < 2:
        raise ConnectRefused("HostKeyUnusable", "pinned host key is not '<type> <base64>'")
    try:
        return paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1]))
    except (binascii.Error, ValueError, paramiko.SSHException) as exc:
        raise ConnectRefused("HostKeyUnusable", type(exc).__name__) from None


def key_line(key: paramiko.PKey) -> str:
    """A public key as the line ``ssh-keyscan`` prints without its host: ``"<type> <base64>"``."""
    return f"{key.get_name()} {key.get_base64()}"


def _same_key(a: paramiko.PKey, b: paramiko.PKey) -> bool:
    return a.get_name() == b.get_name() and a.asbytes() == b.asbytes()


def _looks_like_key_type(token: str) -> bool:
    return token.startswith(("ssh-", "ecdsa-", "sk-", "rsa-"))


def key_fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint of a public key: safe for logs and evidence."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


@dataclass
class PartnerSession:
    """One authenticated SSH transport and its SFTP client; close it with :meth:`close`."""

    transport: paramiko.Transport
    sftp: paramiko.SFTPClient
    host_key_fingerprint: str

    def alive(self) -> bool:
        """Whether the connection and the SFTP channel are still up (a cut link or a server that dropped
        the session ends the transport)."""
        channel = self.sftp.get_channel()
        return bool(self.transport.is_active()) and channel is not None and not channel.closed

    @property
    def cipher(self) -> str:
        """The negotiated cipher (for evidence: it shows the tuning took)."""
        cipher: str = self.transport.remote_cipher  # type: ignore[attr-defined]  # set after kex
        return cipher

    def close(self, *, wait: float = CLOSE_WAIT_SECONDS) -> None:
        """Close the SFTP channel and the transport; never raises. The connection is ended from our side first
        and the server's end of it is awaited (at most ``wait`` seconds): the partner counts a session until its
        side is gone, and a session slot released before that could let another session in while the partner
        still holds this one (issue #25.3)."""
        with contextlib.suppress(Exception):
            self.sftp.close()
        with contextlib.suppress(Exception):
            if self.transport.is_active():
                self.transport.sock.shutdown(socket.SHUT_WR)  # ends our side
                deadline = time.monotonic() + wait
                while self.transport.is_active() and time.monotonic() < deadline:
                    time.sleep(0.005)  # the transport's thread ends when the server has closed its side
        with contextlib.suppress(Exception):
            self.transport.close()


def _refused_or_lost(transport: paramiko.Transport, refused: str) -> str:
    """``refused`` when the server answered no over a link that is still up; ``LinkLost`` when the link
    died during the step. paramiko reports both as the same exception (a lost link during authentication is
    an ``AuthenticationException`` too); only the transport tells them apart."""
    return refused if transport.is_active() else "LinkLost"


def connect(
    destination: Destination,
    *,
    timeout: float = 15.0,
    io_timeout: float = 60.0,
    passphrase: str | None = None,
    keepalive: int = 0,
) -> PartnerSession:
    """Open an SFTP session to ``destination``, refusing any host key but the pinned ones.

    The private key (``credential_ref``) is loaded first, with ``passphrase`` or else the process's
    (:func:`set_key_passphrase`); a key file open to group or others, unreadable, or locked raises
    :class:`ConnectRefused` before any connection is made. The server's key is checked right after the
    key exchange, before authentication, against every pinned key: a key that matches none raises
    :class:`ConnectRefused` with code ``HostKeyMismatch`` and the presented key's fingerprint, and nothing is
    sent. Every failure before the SFTP session exists raises :class:`ConnectRefused`. ``io_timeout`` bounds
    every later wait for the server; ``keepalive`` (seconds, 0: off) keeps an idle session alive.
    """
    pinned = [parse_pinned_key(line) for line in destination.pinned_keys]
    # The key is read and checked before anything goes to the partner: a refused key sends nothing.
    client_key = load_private_key(
        Path(destination.credential_ref), _default_passphrase if passphrase is None else passphrase
    )
    try:
        sock = socket.create_connection((destination.host, destination.port), timeout=timeout)
    except OSError as exc:
        raise ConnectRefused("Unreachable", type(exc).__name__) from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport = paramiko.Transport(sock)
    try:
        _tune(transport, pinned)
        try:
            transport.start_client(timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectRefused("HandshakeFailed", type(exc).__name__) from None
        try:
            presented = transport.get_remote_server_key()
        except paramiko.SSHException:  # start_client returns without a session when its timeout passes
            raise ConnectRefused("HandshakeFailed", "Timeout") from None
        fingerprint = key_fingerprint(presented)
        if not any(_same_key(presented, key) for key in pinned):
            raise ConnectRefused("HostKeyMismatch", f"server presented {fingerprint}", presented=fingerprint)
        try:
            transport.auth_publickey(destination.username, client_key)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            code = _refused_or_lost(transport, "AuthRefused")
            raise ConnectRefused(code, type(exc).__name__, presented=fingerprint) from None
        try:
            sftp = _StatusSFTPClient.from_transport(transport)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            code = _refused_or_lost(transport, "SessionRefused")
            raise ConnectRefused(code, type(exc).__name__, presented=fingerprint) from None
        if sftp is None:
            raise ConnectRefused("SessionRefused", presented=fingerprint)
        channel = sftp.get_channel()
        if channel is None:
            raise ConnectRefused("SessionRefused", presented=fingerprint)
        channel.settimeout(io_timeout)
        if keepalive:
            transport.set_keepalive(keepalive)
        return PartnerSession(transport=transport, sftp=sftp, host_key_fingerprint=fingerprint)
    except BaseException:
        transport.close()
        raise


@contextlib.contextmanager
def session(destination: Destination, **kwargs: Any) -> Iterator[PartnerSession]:
    """:func:`connect` as a context manager that always closes the session (the connect is one span)."""
    with sftp_span(SftpStep.CONNECT):
        opened = connect(destination, **kwargs)
    try:
        yield opened
    finally:
        opened.close()


# -- the private key: read once, checked, never logged ---------------------------------------------------

_default_passphrase: str | None = None


def set_key_passphrase(passphrase: str | None) -> None:
    """The passphrase :func:`connect` uses for encrypted private keys in this process (worker start-up)."""
    global _default_passphrase
    _default_passphrase = passphrase


def passphrase_from(value: str | None, file: Path | None) -> str | None:
    """The key passphrase from a setting's value or from a secrets file (its first line); not both.

    Raises ``ValueError`` (without the passphrase in its message) when both are given or the file
    cannot be read.
    """
    if value is not None and file is not None:
        raise ValueError("give the key passphrase once: as a value or as a file, not both")
    if file is None:
        return value
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the passphrase file {file} ({type(exc).__name__})") from None
    if not lines or not lines[0]:
        raise ValueError(f"the passphrase file {file} is empty")
    return lines[0]


def load_private_key(path: Path, passphrase: str | None) -> paramiko.PKey:
    """Read the private key at ``path`` once and check it, as OpenSSH would, before any connection.

    Refused with :class:`ConnectRefused`: a file with any permission for group or others
    (``CredentialTooOpen``: OpenSSH's "unprotected private key file" rule, checked on the file
    descriptor that is then read), a file that cannot be read or is not a private key
    (``CredentialUnavailable``), an encrypted key without a passphrase or with a wrong one
    (``CredentialLocked``). A passphrase given for an unencrypted key is not used. Messages carry
    codes and the file's mode only, never the key or the passphrase.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise ConnectRefused("CredentialUnavailable", type(exc).__name__) from None
    with os.fdopen(fd, "rb") as file:
        mode = stat.S_IMODE(os.fstat(file.fileno()).st_mode)
        if mode & 0o077:
            raise ConnectRefused(
                "CredentialTooOpen",
                f"the private key file has mode {mode:04o}; it must not be open to group or others (chmod 600)",
            )
        try:
            data = file.read()
        except OSError as exc:
            raise ConnectRefused("CredentialUnavailable", type(exc).__name__) from None
    loaded, password = _decrypt(data, passphrase)
    try:
        if isinstance(loaded, rsa.RSAPrivateKey):
            return paramiko.RSAKey(key=loaded)
        if isinstance(loaded, ec.EllipticCurvePrivateKey):
            return paramiko.ECDSAKey(vals=(loaded, loaded.public_key()))
        if isinstance(loaded, ed25519.Ed25519PrivateKey):  # paramiko reads these from OpenSSH's format
            return paramiko.Ed25519Key.from_private_key(io.StringIO(data.decode("ascii")), password=password)
    except (paramiko.SSHException, ValueError, UnicodeDecodeError) as exc:
        raise ConnectRefused("CredentialUnavailable", type(exc).__name__) from None
    raise ConnectRefused("CredentialUnavailable", f"unsupported key type {type(loaded).__name__}")


def _decrypt(data: bytes, passphrase: str | None) -> tuple[Any, str | None]:
    """Load the key without a password, else with the passphrase; returns it and the password used."""
    for loader in (serialization.load_ssh_private_key, serialization.load_pem_private_key):
        try:
            return loader(data, password=None), None
        except TypeError:  # encrypted: the passphrase is needed
            if passphrase is None:
                raise ConnectRefused(
                    "CredentialLocked", "the private key is encrypted and no passphrase is configured"
                ) from None
            try:
                return loader(data, password=passphrase.encode()), passphrase
            except (ValueError, TypeError):
                raise ConnectRefused(
                    "CredentialLocked", "the passphrase does not open the private key"
                ) from None
        except ValueError:
            continue  # not this format: try the next
        except Exception as exc:  # cryptography's unsupported-algorithm errors and the like
            raise ConnectRefused("CredentialUnavailable", type(exc).__name__) from None
    raise ConnectRefused("CredentialUnavailable", "the file holds no private key")


def _tune(transport: paramiko.Transport, pinned: list[paramiko.PKey], *, others: bool = False) -> None:
    options = transport.get_security_options()
    ciphers = tuple(options.ciphers)
    if PREFERRED_CIPHER in ciphers:
        options.ciphers = (PREFERRED_CIPHER, *(c for c in ciphers if c != PREFERRED_CIPHER))
    # Ask only for the pinned keys' types, in the order they are pinned, so a server that also has keys of
    # other types presents one of those (``others``: then any other type, for a test that only reports).
    wanted: list[str] = []
    for key in pinned:
        wanted += [a for a in _ALGORITHMS_FOR_KEY.get(key.get_name(), (key.get_name(),)) if a not in wanted]
    offered = tuple(a for a in wanted if a in options.key_types)
    if others:
        offered += tuple(a for a in options.key_types if a not in offered)
    if offered:
        options.key_types = offered


def open_remote_dir(sftp: paramiko.SFTPClient, path: str) -> None:
    """List ``path``'s first names and close it again: the remote directory is there and this account may list
    it (one batch of names, whatever the directory holds). Raises :class:`SftpStatusError` when the server
    refuses."""
    kind, message = sftp._request(CMD_OPENDIR, path)  # type: ignore[attr-defined]  # paramiko's request call
    if kind != CMD_HANDLE:
        raise paramiko.SFTPError("Expected handle")
    handle = message.get_binary()
    try:
        sftp._request(CMD_READDIR, handle)  # type: ignore[attr-defined]
    except EOFError:
        pass  # an empty directory: listed, nothing in it
    finally:
        with contextlib.suppress(SftpStatusError, EOFError):
            sftp._request(CMD_CLOSE, handle)  # type: ignore[attr-defined]


def open_verified(
    destination: Destination, *, timeout: float = 15.0, io_timeout: float = 60.0
) -> PartnerSession:
    """:func:`connect` (host key against every pinned one, login), then open the remote directory, with the
    session kept alive while it waits: what an attempt opens before cutoff 2 and uploads over after. Raises
    :class:`ConnectRefused` (the directory refused: ``RemoteDirRefused`` with its status)."""
    with sftp_span(SftpStep.CONNECT):
        opened = connect(destination, timeout=timeout, io_timeout=io_timeout, keepalive=KEEPALIVE_SECONDS)
    try:
        open_remote_dir(opened.sftp, destination.remote_dir)
    except SftpStatusError as exc:
        opened.close()
        raise ConnectRefused(
            "RemoteDirRefused", f"status {exc.status}", presented=opened.host_key_fingerprint
        ) from None
    except BaseException as exc:
        opened.close()
        raise ConnectRefused("LinkLost", type(exc).__name__, presented=opened.host_key_fingerprint) from None
    return opened


def probe(
    destination: Destination,
    *,
    timeout: float = 15.0,
    io_timeout: float = 30.0,
    passphrase: str | None = None,
) -> ConnectionReport:
    """The connection test (issue #24.3): connect, report the host key the server presents (its line and
    ``SHA256:`` fingerprint) and whether it is pinned; only when it is, log in and report the result, open
    the remote directory, create a temporary name there and remove it, and read the server's
    ``posix-rename`` support and write limit (``limits@openssh.com``). It never pins anything and never
    offers our login to a server whose key is not pinned. Never raises: a step that fails is the report's
    ``error``."""
    report: dict[str, Any] = {
        "connected": False,
        "pinned_fingerprints": [fp for fp in map(host_key_fingerprint, destination.pinned_keys) if fp],
    }
    pinned: list[paramiko.PKey] = []
    for line in destination.pinned_keys:
        with contextlib.suppress(ConnectRefused):  # an unusable pinned line matches nothing
            pinned.append(parse_pinned_key(line))
    try:
        sock = socket.create_connection((destination.host, destination.port), timeout=timeout)
    except OSError as exc:
        return ConnectionReport(**report, error=f"Unreachable ({type(exc).__name__})")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport = paramiko.Transport(sock)
    try:
        _tune(transport, pinned, others=True)
        try:
            transport.start_client(timeout=timeout)
            presented = transport.get_remote_server_key()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            return ConnectionReport(**report, error=f"HandshakeFailed ({type(exc).__name__})")
        report.update(
            connected=True,
            host_key=key_line(presented),
            host_key_fingerprint=key_fingerprint(presented),
            pinned=any(_same_key(presented, key) for key in pinned),
            cipher=transport.remote_cipher,  # type: ignore[attr-defined]  # set after kex
        )
        if not report["pinned"]:
            return ConnectionReport(**report, error="HostKeyNotPinned")
        try:
            client_key = load_private_key(
                Path(destination.credential_ref), _default_passphrase if passphrase is None else passphrase
            )
        except ConnectRefused as exc:
            return ConnectionReport(**report, error=exc.code)
        try:
            transport.auth_publickey(destination.username, client_key)
        except (paramiko.SSHException, OSError, EOFError):
            refused = _refused_or_lost(transport, "AuthRefused")
            return ConnectionReport(
                **report, authentication="refused" if refused == "AuthRefused" else "not_tried", error=refused
            )
        report["authentication"] = "accepted"
        try:
            sftp = _StatusSFTPClient.from_transport(transport)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            return ConnectionReport(**report, error=f"SessionRefused ({type(exc).__name__})")
        if sftp is None:
            return ConnectionReport(**report, error="SessionRefused")
        channel = sftp.get_channel()
        if channel is not None:
            channel.settimeout(io_timeout)
        return ConnectionReport(**report, **_sftp_facts(sftp, destination))
    finally:
        transport.close()


def _sftp_facts(sftp: _StatusSFTPClient, destination: Destination) -> dict[str, Any]:
    """What the SFTP session of a connection test finds: its extensions, the write limit, whether the
    remote directory lists and takes a new file (a temporary name, removed at once)."""
    extensions = dict(getattr(sftp, "server_extensions", {}))
    facts: dict[str, Any] = {
        "extensions": sorted(extensions),
        "posix_rename": POSIX_RENAME_EXTENSION in extensions,
    }
    try:
        if LIMITS_EXTENSION in extensions:
            kind, message = sftp._request(CMD_EXTENDED, LIMITS_EXTENSION)  # type: ignore[attr-defined]
            if kind == CMD_EXTENDED_REPLY:
                message.get_int64()  # the largest packet
                message.get_int64()  # the largest read
                facts["max_write_length"] = message.get_int64() or None  # 0: no limit given
                facts["max_open_handles"] = message.get_int64() or None
        try:
            open_remote_dir(sftp, destination.remote_dir)
            facts["remote_dir_listable"] = True
        except SftpStatusError as exc:
            facts.update(remote_dir_listable=False, remote_dir_status=exc.status)
        name = destination.remote_path(f"{CONNECTION_TEST_PREFIX}{uuid.uuid4().hex}.tmp")
        try:
            sftp.open(name, "wx").close()
        except SftpStatusError as exc:
            facts.update(remote_dir_writable=False, remote_dir_status=exc.status)
        else:
            facts["remote_dir_writable"] = True
            sftp.remove(name)
    except SftpStatusError as exc:
        facts["error"] = f"SftpStatus {exc.status}"
    except (paramiko.SSHException, OSError, EOFError) as exc:
        facts["error"] = f"LinkLost ({type(exc).__name__})"
    return facts


def stat_or_none(sftp: paramiko.SFTPClient, path: str) -> paramiko.SFTPAttributes | None:
    """``stat`` the path; ``None`` when the server says there is no such file."""
    try:
        return sftp.stat(path)
    except SftpStatusError as exc:
        if exc.status == SFTP_NO_SUCH_FILE:
            return None
        raise


def read_sha256(sftp: paramiko.SFTPClient, path: str) -> tuple[int, bytes]:
    """Read a remote file back and return its size and SHA-256 (prefetched, default windows)."""
    digest = hashlib.sha256()
    size = 0
    with sftp.open(path, "rb") as remote:
        remote.prefetch()
        while chunk := remote.read(READ_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.digest()


def read_small(sftp: paramiko.SFTPClient, path: str, limit: int = 64 * 1024) -> bytes | None:
    """A small remote file's bytes (at most ``limit``); ``None`` when it does not exist."""
    try:
        with sftp.open(path, "rb") as remote:
            return remote.read(limit)
    except SftpStatusError as exc:
        if exc.status == SFTP_NO_SUCH_FILE:
            return None
        raise


def upload_exclusive(
    sftp: paramiko.SFTPClient,
    local_path: Path,
    remote_path: str,
    *,
    write_request: int,
    after_write: Callable[[int], None] | None = None,
) -> int:
    """Copy ``local_path`` to a new remote file, opened exclusively ('wx'); returns the bytes sent.

    An existing remote file is never reused: the open fails. Writes are pipelined, ``write_request``
    bytes each (set on this file object only); ``after_write(bytes_sent)`` runs after each write.
    A write the server refused (a full quota, say) raises :class:`SftpStatusError` by the time this returns.
    """
    sent = 0
    with local_path.open("rb") as source:
        remote = sftp.open(remote_path, "wx", bufsize=0)
        try:
            remote.MAX_REQUEST_SIZE = write_request
            remote.set_pipelined(True)
            while chunk := source.read(write_request):
                remote.write(chunk)
                sent += len(chunk)
                if after_write is not None:
                    after_write(sent)
            # paramiko files a pipelined write's answer under no file object, and closing the file drops it
            # unread: a refused write would pass unseen. Each answer still awaited is read here, in order (the
            # status of a refusal raises SftpStatusError through _StatusSFTPClient._convert_status).
            # The unread writes' request numbers: paramiko keeps them only here (private, absent from the stubs).
            pending: deque[int] = remote._reqs  # type: ignore[attr-defined]
            while pending:
                sftp._read_response(pending.popleft())  # type: ignore[attr-defined]
        except BaseException:
            # What ended the upload is its answer, not a close on a session the server may have dropped after it.
            with contextlib.suppress(Exception):
                remote.close()
            raise
        remote.close()
    return sent
