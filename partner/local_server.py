"""A stand-in partner: an in-process asyncssh SFTP server on loopback, rooted in a directory.

For the demo and functional tests. It has its own host key (pin :attr:`LocalSftpServer.host_key_line`),
accepts one generated client key (:attr:`LocalSftpServer.client_key_path`, the ``credential_ref``),
and, when ``ack_suffix`` is given, acts like a partner that acknowledges each file published under a
final name (see :mod:`domain.evidence` for the format). A directory can be given a quota
(:meth:`LocalSftpServer.set_quota`): the server then refuses the writes past it, as a partner whose quota is
full does, and may drop the session that heard the refusal. Its rename is check-then-act, not atomic:
race and performance tests use a real OpenSSH sshd instead. It runs on the caller's event loop, so
the paramiko client must run in a thread (``asyncio.to_thread``), as it does in production.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from domain.evidence import TEMP_PREFIX


@dataclass(frozen=True)
class Quota:
    """How many bytes a file in a directory may hold: a write past them is refused, and with none left
    (``limit_bytes`` 0) so is the creation of a file. With ``drop_session`` the server drops the session
    right after the refusal has been answered, as a partner's server that gives up on it does."""

    limit_bytes: int
    drop_session: bool = False


class _PartnerSftp(asyncssh.SFTPServer):
    """asyncssh's file server chrooted at the root, acknowledging published files when asked to, and
    refusing what a directory's quota does not allow."""

    def __init__(
        self,
        chan: asyncssh.SSHServerChannel[bytes],
        *,
        root: Path,
        ack_suffix: str | None,
        quotas: dict[Path, Quota],
    ) -> None:
        super().__init__(chan, chroot=os.fsencode(root))
        self._ack_suffix = ack_suffix
        self._quotas = quotas

    def open(self, path: bytes, pflags: int, attrs: asyncssh.SFTPAttrs) -> object:
        quota = self._quotas.get(Path(os.fsdecode(self.map_path(path))).parent)
        if quota is not None and quota.limit_bytes <= 0 and pflags & asyncssh.FXF_CREAT:
            self._refuse(quota)
        return super().open(path, pflags, attrs)

    def write(self, file_obj: object, offset: int, data: bytes) -> int:
        name = getattr(file_obj, "name", None)
        quota = self._quotas.get(Path(os.fsdecode(name)).parent) if name is not None else None
        if quota is not None and offset + len(data) > quota.limit_bytes:
            self._refuse(quota)
        written: int = super().write(file_obj, offset, data)  # type: ignore[assignment]  # sync for files
        return written

    def _refuse(self, quota: Quota) -> None:
        if quota.drop_session:
            # Once this refusal is answered (it is sent as this request ends) and the session waits for the
            # client's next request: that one finds the connection gone.
            asyncio.get_running_loop().call_soon(self.channel.get_connection().close)
        raise asyncssh.SFTPQuotaExceeded("quota exceeded")  # a version 3 client hears SSH_FX_FAILURE

    def rename(self, oldpath: bytes, newpath: bytes) -> None:
        super().rename(oldpath, newpath)
        self._acknowledge(oldpath, newpath)

    def posix_rename(self, oldpath: bytes, newpath: bytes) -> None:
        super().posix_rename(oldpath, newpath)
        self._acknowledge(oldpath, newpath)

    def _acknowledge(self, oldpath: bytes, newpath: bytes) -> None:
        name = os.path.basename(os.fsdecode(newpath))
        if not self._ack_suffix or name.startswith(".") or name.endswith(self._ack_suffix):
            return
        local = Path(os.fsdecode(self.map_path(newpath)))
        digest = hashlib.sha256()
        with local.open("rb") as published:
            for block in iter(lambda: published.read(1 << 20), b""):
                digest.update(block)
        upload = os.path.basename(os.fsdecode(oldpath))
        ack = {
            "name": name,
            "size": local.stat().st_size,
            "sha256": digest.hexdigest(),
            "upload": upload if upload.startswith(TEMP_PREFIX) else None,
        }
        ack_path = local.with_name(name + self._ack_suffix)
        scratch = ack_path.with_name(f".{ack_path.name}.tmp")
        scratch.write_text(json.dumps(ack), encoding="utf-8")
        scratch.replace(ack_path)


class LocalSftpServer:
    """An SFTP server on ``127.0.0.1`` serving ``root``; ``start()`` it, point a destination at it.

    Keys live outside ``root`` (so the SFTP client cannot read them) in a private directory that
    :meth:`stop` removes. Any user name is accepted with the generated client key.
    """

    def __init__(
        self, root: Path, *, host: str = "127.0.0.1", port: int = 0, ack_suffix: str | None = None
    ) -> None:
        self.root = Path(root)
        self.host = host
        self.port = port
        self.ack_suffix = ack_suffix
        self.host_key_line = ""
        self.client_key_path = Path()
        self._key_dir: Path | None = None
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._quotas: dict[Path, Quota] = {}
        self._authorized: asyncssh.SSHAuthorizedKeys | None = None

    async def start(self) -> None:
        """Generate the host and client keys and start listening (``port`` 0 picks a free one)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._key_dir = Path(tempfile.mkdtemp(prefix="fenced-sftp-keys-"))
        host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.host_key_line = host_key.export_public_key("openssh").decode().strip()
        self.client_key_path = self.new_client_key()
        self._authorized = asyncssh.import_authorized_keys(
            (self.client_key_path.with_suffix(".pub")).read_text(encoding="ascii")
        )
        await self._listen(host_key)

    async def _listen(self, host_key: asyncssh.SSHKey) -> None:
        self._acceptor = await asyncssh.listen(
            self.host,
            self.port,
            server_host_keys=[host_key],
            authorized_client_keys=self._authorized,
            sftp_factory=functools.partial(
                _PartnerSftp, root=self.root, ack_suffix=self.ack_suffix, quotas=self._quotas
            ),
            allow_scp=False,
        )
        self.port = self._acceptor.get_port()

    async def restart_with_new_host_key(self) -> str:
        """Restart on the same port with a newly generated host key, as a partner rotating its server's key
        does: open sessions are closed, the directory and the authorized client key stay. Returns the new
        public key line (what an admin pins once the partner confirms its fingerprint)."""
        if self._acceptor is None:
            raise RuntimeError("start() the server first")
        self._acceptor.close()
        await self._acceptor.wait_closed()
        host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.host_key_line = host_key.export_public_key("openssh").decode().strip()
        await self._listen(host_key)
        return self.host_key_line

    def set_quota(self, directory: Path, limit_bytes: int, *, drop_session: bool = False) -> None:
        """Give ``directory`` (on this machine's disk, under ``root``) a quota: from now on a write that would
        take one of its files past ``limit_bytes`` is refused, as by a partner whose quota is full (with 0, the
        creation of a file too), and with ``drop_session`` the session that heard the refusal is dropped
        right after it. Sessions already open obey it too; :meth:`clear_quota` lifts it."""
        self._quotas[Path(directory).resolve()] = Quota(limit_bytes, drop_session)

    def clear_quota(self, directory: Path) -> None:
        """Lift ``directory``'s quota."""
        self._quotas.pop(Path(directory).resolve(), None)

    def new_client_key(self) -> Path:
        """Write a fresh ed25519 client key pair (private 0600, ``.pub`` beside it); return the private path."""
        if self._key_dir is None:
            raise RuntimeError("start() the server first")
        key = asyncssh.generate_private_key("ssh-ed25519")
        path = Path(tempfile.mkstemp(prefix="client-", dir=self._key_dir)[1])
        key.write_private_key(path, "openssh")
        path.chmod(0o600)
        path.with_suffix(".pub").write_bytes(key.export_public_key("openssh"))
        return path

    def destination_fields(self, remote_dir: str = "/", username: str = "partner") -> dict[str, Any]:
        """The ``destinations`` columns that point at this server (contract columns left to the caller)."""
        return {
            "host": self.host,
            "port": self.port,
            "username": username,
            "host_key": self.host_key_line,
            "credential_ref": str(self.client_key_path),
            "remote_dir": remote_dir,
        }

    async def stop(self) -> None:
        """Stop listening, close open sessions and remove the keys."""
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()
            self._acceptor = None
        if self._key_dir is not None:
            shutil.rmtree(self._key_dir, ignore_errors=True)
            self._key_dir = None

    async def __aenter__(self) -> LocalSftpServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
