"""Debian's GnuPG as a partner (or a tenant) would run it, each identity in its own temporary GNUPGHOME.

Keys are generated here, at test time (``gpg --batch --quick-gen-key ... --passphrase ''``, ed25519 with
a cv25519 encryption subkey), and never committed. ``decrypt`` and ``verify`` are what a partner runs on a
delivered file: ``gpg --decrypt`` in its own home, with the tenant's public key imported to verify.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

GPG = shutil.which("gpg") or "/usr/bin/gpg"


def gpg_available() -> bool:
    return shutil.which("gpg") is not None


@dataclass
class Decrypted:
    """What ``gpg --decrypt`` gave back: the data, its exit code and its status lines."""

    data: bytes
    returncode: int
    status: list[str] = field(default_factory=list)

    def has(self, keyword: str, *args: str) -> bool:
        """A status line ``[GNUPG:] KEYWORD args...`` (prefix match on the arguments)."""
        for line in self.status:
            fields = line.split()[1:]
            if fields[:1] == [keyword] and fields[1 : 1 + len(args)] == list(args):
                return True
        return False


@dataclass
class GpgIdentity:
    """One OpenPGP identity in its own GNUPGHOME: its fingerprint, armored public key, and its secret key
    exported to a 0600 file (what a signing key reference names)."""

    home: Path
    fingerprint: str
    public_key: str
    secret_key_file: Path

    @classmethod
    def generate(cls, user_id: str, root: Path | None = None, passphrase: str = "") -> GpgIdentity:
        """A new key pair; with ``passphrase``, its secret key file is protected by it."""
        home = Path(tempfile.mkdtemp(prefix="fx-id-", dir=_short_enough(root)))
        loopback = ("--pinentry-mode", "loopback", "--passphrase", passphrase)
        _gpg(home, *loopback, "--quick-gen-key", user_id, "future-default", "default", "never")
        listing = _gpg(home, "--with-colons", "--list-keys").decode()
        fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
        public_key = _gpg(home, "--armor", "--export", fingerprint).decode()
        secret = _gpg(home, "--armor", *loopback, "--export-secret-keys", fingerprint)
        secret_key_file = home / "signing-key.asc"
        secret_key_file.touch(mode=0o600)
        secret_key_file.write_bytes(secret)
        return cls(home, fingerprint.upper(), public_key, secret_key_file)

    def import_public(self, other: GpgIdentity) -> None:
        """Trust ``other``'s public key for verification (a partner importing the tenant's key)."""
        subprocess.run(
            [GPG, "--homedir", str(self.home), "--batch", "--import"],
            input=other.public_key.encode(),
            capture_output=True,
            check=True,
        )

    def decrypt(self, path: Path) -> Decrypted:
        """``gpg --decrypt FILE`` in this identity's home, as the partner runs it."""
        done = subprocess.run(
            [GPG, "--homedir", str(self.home), "--batch", "--status-fd", "2", "--decrypt", str(path)],
            capture_output=True,
            check=False,
        )
        status = [
            line for line in done.stderr.decode(errors="replace").splitlines() if line.startswith("[GNUPG:]")
        ]
        return Decrypted(done.stdout, done.returncode, status)

    def close(self) -> None:
        subprocess.run(
            ["gpgconf", "--homedir", str(self.home), "--kill", "gpg-agent"], capture_output=True, check=False
        )
        shutil.rmtree(self.home, ignore_errors=True)


# gpg-agent listens on a Unix socket in the home (``S.gpg-agent.browser``, 19 characters more), and a socket's
# path holds at most 107 bytes: a home deeper than this fails key generation with exit 2 (as root there is no
# /run/user/0 to fall back on). pytest-xdist's ``popen-gw0/`` made the soak's run directory that deep.
_MAX_HOME_PARENT = 60


def _short_enough(root: Path | None) -> Path | None:
    """``root`` when a home made in it leaves gpg-agent's socket path short enough; else the temp directory."""
    return root if root is not None and len(str(root)) <= _MAX_HOME_PARENT else None


def _gpg(home: Path, *args: str) -> bytes:
    return subprocess.run(
        [GPG, "--homedir", str(home), "--batch", *args], capture_output=True, check=True
    ).stdout
