"""The SFTP connection to a partner, on paramiko: pinned host key, tuned transfer, typed SFTP statuses.

Everything here blocks; callers run it in a thread (``asyncio.to_thread``). The host key is pinned:
the key the server presents is compared with the destination's before authentication, so an
unknown or changed key is refused before any credential is offered or any file is touched, and
nothing is ever added to a known-hosts store. The transfer is tuned as ``shared/facts/sftp.md``
measured: ``aes128-gcm@openssh.com`` first, TCP_NODELAY, pipelined writes whose request size is the
destination's ``max_write_request``, set on the file object, never on paramiko's class.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import os
import socket
import stat
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from paramiko.sftp import SFTP_NO_SUCH_FILE

from domain.destination import Destination
from observability.tracing import SftpStep, sftp_span

PREFERRED_CIPHER = "aes128-gcm@openssh.com"
READ_CHUNK = 1 << 20

# Host key algorithms that can present each pinned key type (RSA keys sign with SHA-2 variants).
_ALGORITHMS_FOR_KEY = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256")}


class ConnectRefused(Exception):
    """No SFTP session was opened, so nothing was sent to the partner; ``code`` says why."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code


class SftpStatusError(OSError):
    """The server answered a request with an SFTP error status (the connection was alive to say so)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"SFTP status {status}")
        self.status = status


class _StatusSFTPClient(paramiko.SFTPClient):
    """paramiko's client, raising :class:`SftpStatusError` with the status code for error statuses.

    paramiko maps most statuses to a bare ``IOError(text)``, which cannot be told apart from a closed
    socket without reading message texts; the status code can.
    """

    def _convert_status(self, msg: paramiko.Message) -> None:
        position = msg.packet.tell()
        status = msg.get_int()
        msg.packet.seek(position)
        try:
            super()._convert_status(msg)  # type: ignore[misc]  # private in the stubs, present in paramiko
        except EOFError:
            raise  # end of file while reading: paramiko's own read loop expects it
        except OSError:
            raise SftpStatusError(status) from None


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

    @property
    def cipher(self) -> str:
        """The negotiated cipher (for evidence: it shows the tuning took)."""
        cipher: str = self.transport.remote_cipher  # type: ignore[attr-defined]  # set after kex
        return cipher

    def close(self) -> None:
        """Close the SFTP channel and the transport; never raises."""
        with contextlib.suppress(Exception):
            self.sftp.close()
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
) -> PartnerSession:
    """Open an SFTP session to ``destination``, refusing any host key but the pinned one.

    The private key (``credential_ref``) is loaded first, with ``passphrase`` or else the process's
    (:func:`set_key_passphrase`); a key file open to group or others, unreadable, or locked raises
    :class:`ConnectRefused` before any connection is made. The server's key is checked right after the
    key exchange, before authentication: a different or unknown key raises :class:`ConnectRefused`
    with code ``HostKeyMismatch`` and nothing is sent. Every failure before the SFTP session exists
    raises :class:`ConnectRefused`. ``io_timeout`` bounds every later wait for the server.
    """
    pinned = parse_pinned_key(destination.host_key)
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
        if presented.get_name() != pinned.get_name() or presented.asbytes() != pinned.asbytes():
            raise ConnectRefused("HostKeyMismatch", f"server presented {fingerprint}")
        try:
            transport.auth_publickey(destination.username, client_key)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectRefused(_refused_or_lost(transport, "AuthRefused"), type(exc).__name__) from None
        try:
            sftp = _StatusSFTPClient.from_transport(transport)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectRefused(_refused_or_lost(transport, "SessionRefused"), type(exc).__name__) from None
        if sftp is None:
            raise ConnectRefused("SessionRefused")
        channel = sftp.get_channel()
        if channel is None:
            raise ConnectRefused("SessionRefused")
        channel.settimeout(io_timeout)
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


def _tune(transport: paramiko.Transport, pinned: paramiko.PKey) -> None:
    options = transport.get_security_options()
    ciphers = tuple(options.ciphers)
    if PREFERRED_CIPHER in ciphers:
        options.ciphers = (PREFERRED_CIPHER, *(c for c in ciphers if c != PREFERRED_CIPHER))
    # Ask only for the pinned key's type, so a server that also has other keys presents that one.
    wanted = _ALGORITHMS_FOR_KEY.get(pinned.get_name(), (pinned.get_name(),))
    offered = tuple(k for k in options.key_types if k in wanted)
    if offered:
        options.key_types = offered


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
