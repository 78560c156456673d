"""OpenPGP through Debian's GnuPG (``gpg``), a subprocess fed by a pipe: chosen by measurement.

On 128 MiB here (docs/benchmarks.md, "OpenPGP library"), ``gpg`` encrypted at 337 MB/s and signed and
encrypted at 170 MB/s, streaming with 17 MB resident; pysequoia streamed only file to file, at 160 and
105 MB/s, holding the GIL for the whole call (no Python thread, nor the event loop, runs meanwhile); PGPy
reached 77 and 54 MB/s with the whole message in memory five times over. The partner's ``gpg --decrypt``
read every one of them. ``gpg`` also runs in its own process, beside the COPY reader and the compressor.

Each file gets a private, short-lived GnuPG home (0700): the partner's public keys are read from files
there (``--recipient-file``, no keyring trust involved), and the tenant's signing key is imported there
from the file its reference names, then the home and its agent are removed. Nothing here logs or raises
with key material, a passphrase or a user ID: errors carry exit codes and GnuPG status keywords.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from encoding.errors import EncodingError

_GPG_ERR_BAD_PASSPHRASE, _GPG_ERR_NO_PASSPHRASE = 11, 177  # libgpg-error codes
GPG_TIMEOUT_SECONDS = 30.0  # a key inspection or import; the stream itself is bounded by its input
_HOME_PREFIX = "fx-gpg-"
# The status keywords worth reporting (``--status-fd``); every other line of gpg's output is dropped.
_STATUS_KEYWORDS = frozenset(
    {
        "INV_RECP",
        "INV_SGNR",
        "KEYEXPIRED",
        "KEYREVOKED",
        "NO_PUBKEY",
        "NO_SECKEY",
        "BAD_PASSPHRASE",
        "MISSING_PASSPHRASE",
        "FAILURE",
        "ERROR",
        "KEY_CONSIDERED",
    }
)


def gpg_binary() -> str:
    """The ``gpg`` to run (Debian's ``gnupg``); :class:`EncodingError` ``GpgMissing`` without one."""
    found = shutil.which("gpg")
    if found is None:
        raise EncodingError("GpgMissing", "no gpg on PATH (install Debian's gnupg)")
    return found


@dataclass
class GpgHome:
    """A private GnuPG home for one file: 0700, short (its agent's socket path must fit), removed with
    its agent by :meth:`close`."""

    path: Path
    agent_started: bool = False

    @classmethod
    def create(cls, root: Path | None = None, label: str = "") -> GpgHome:
        """A new home under ``root`` (default: the system's temporary directory), named ``{label}-...``
        so that whoever removes what a killed process left (the scavenger) can tell whose it was."""
        # Short, not under the build directory: a Unix socket path is limited to 108 bytes, and the agent's
        # socket lives in the home.
        try:
            if root is not None:
                root.mkdir(mode=0o700, parents=True, exist_ok=True)
            prefix = f"{label}-" if label else _HOME_PREFIX
            return cls(Path(tempfile.mkdtemp(prefix=prefix, dir=root)))
        except OSError as exc:
            raise EncodingError("WorkDirUnusable", _os_code(exc)) from None

    def close(self) -> None:
        """Stop the agent an import started, and remove the home (with any imported secret key)."""
        remove_home(self.path, agent=self.agent_started)

    def base_args(self) -> list[str]:
        return [
            gpg_binary(),
            "--homedir",
            str(self.path),
            "--batch",
            "--no-tty",
            "--quiet",
            "--no-greeting",
            "--no-auto-key-retrieve",
            "--no-auto-key-locate",
        ]


def remove_home(path: Path, *, agent: bool = True) -> None:
    """Stop a GnuPG home's agent (if it may have one) and remove the home; never raises."""
    if agent:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                ["gpgconf", "--homedir", str(path), "--kill", "gpg-agent"],
                capture_output=True,
                timeout=GPG_TIMEOUT_SECONDS,
                check=False,
            )
    shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class Recipient:
    """One partner key, as a file in the home, and its primary key's fingerprint (upper-case hex)."""

    fingerprint: str
    key_file: Path


def recipients(home: GpgHome, armored_keys: tuple[str, ...]) -> list[Recipient]:
    """Write each armored public key into ``home`` and check it with ``gpg --show-keys``: exactly one key,
    usable for encryption (not expired, not revoked); its fingerprint is what the evidence records.

    Raises :class:`EncodingError` ``RecipientKeyUnusable`` with the key's position (never its text).
    """
    found = []
    for index, armored in enumerate(armored_keys):
        key_file = home.path / f"recipient-{index}.asc"
        key_file.write_text(armored, encoding="utf-8")
        listing = _run(
            [*home.base_args(), "--with-colons", "--show-keys", str(key_file)], f"recipient key {index}"
        )
        keys = [line.split(":") for line in listing.splitlines() if line.startswith(("pub:", "fpr:"))]
        primaries = [i for i, fields in enumerate(keys) if fields[0] == "pub"]
        if len(primaries) != 1:
            raise EncodingError(
                "RecipientKeyUnusable", f"recipient key {index}: {len(primaries)} keys, not one"
            )
        pub = keys[primaries[0]]
        if pub[1] in ("e", "r", "i", "d", "n"):
            raise EncodingError("RecipientKeyUnusable", f"recipient key {index}: validity {pub[1]}")
        if "E" not in pub[11]:
            raise EncodingError("RecipientKeyUnusable", f"recipient key {index}: no usable encryption key")
        if primaries[0] + 1 >= len(keys) or keys[primaries[0] + 1][0] != "fpr":
            raise EncodingError("RecipientKeyUnusable", f"recipient key {index}: no fingerprint")
        found.append(Recipient(keys[primaries[0] + 1][9].upper(), key_file))
    return found


def import_signing_key(home: GpgHome, key_ref: str) -> str:
    """Import the tenant's secret key from the file ``key_ref`` names into ``home``; its fingerprint.

    The file must not be open to group or others (OpenSSH's rule for private keys, as for SFTP keys:
    ``SigningKeyTooOpen``), must be readable (``SigningKeyUnavailable``) and must hold exactly one secret
    key that can sign (``SigningKeyUnusable``). The key goes to gpg through a pipe.
    """
    try:
        fd = os.open(key_ref, os.O_RDONLY)
    except OSError as exc:
        raise EncodingError("SigningKeyUnavailable", _os_code(exc)) from None
    with os.fdopen(fd, "rb") as file:
        mode = stat.S_IMODE(os.fstat(file.fileno()).st_mode)
        if mode & 0o077:
            raise EncodingError(
                "SigningKeyTooOpen", f"the signing key file has mode {mode:04o}; it must be 0600 or stricter"
            )
        try:
            secret = file.read()
        except OSError as exc:
            raise EncodingError("SigningKeyUnavailable", _os_code(exc)) from None
    home.agent_started = True  # an import of a secret key starts the home's agent
    _run([*home.base_args(), "--import"], "signing key import", stdin=secret, code="SigningKeyUnusable")
    listing = _run(
        [*home.base_args(), "--with-colons", "--list-secret-keys"], "signing key", code="SigningKeyUnusable"
    )
    keys = [line.split(":") for line in listing.splitlines() if line.startswith(("sec:", "fpr:"))]
    primaries = [i for i, fields in enumerate(keys) if fields[0] == "sec"]
    if len(primaries) != 1:
        raise EncodingError("SigningKeyUnusable", f"{len(primaries)} secret keys, not one")
    sec = keys[primaries[0]]
    if sec[1] in ("e", "r", "i", "d", "n") or "S" not in sec[11]:
        raise EncodingError("SigningKeyUnusable", f"validity {sec[1] or '-'}, capabilities {sec[11] or '-'}")
    return keys[primaries[0] + 1][9].upper()


@dataclass
class GpgStream:
    """One running ``gpg`` that reads the data on ``stdin`` and writes the OpenPGP message on ``stdout``."""

    process: subprocess.Popen[bytes]
    status_file: Path
    passphrase_fd: int | None = None

    @property
    def stdin(self) -> IO[bytes]:
        assert self.process.stdin is not None
        return self.process.stdin

    @property
    def stdout(self) -> IO[bytes]:
        assert self.process.stdout is not None
        return self.process.stdout

    def wait(self, timeout: float) -> None:
        """Wait for gpg to end; :class:`EncodingError` unless it succeeded."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise EncodingError("OpenPgpFailed", "gpg did not finish") from None
        if code != 0:
            raise EncodingError(
                "SigningKeyLocked" if self._locked() else "OpenPgpFailed",
                f"gpg exit {code}{self.status_summary()}",
            )

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=GPG_TIMEOUT_SECONDS)

    def close(self) -> None:
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def _statuses(self) -> list[list[str]]:
        try:
            text = self.status_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        lines = [line.split()[1:] for line in text.splitlines() if line.startswith("[GNUPG:] ")]
        return [fields for fields in lines if fields and fields[0] in _STATUS_KEYWORDS]

    def _has(self, *keywords: str) -> bool:
        return any(fields[0] in keywords for fields in self._statuses())

    def _locked(self) -> bool:
        """The signing key would not unlock: a wrong or missing passphrase (GnuPG's error codes 11 and 177 in
        a FAILURE status, or its passphrase keywords)."""
        if self._has("BAD_PASSPHRASE", "MISSING_PASSPHRASE"):
            return True
        for fields in self._statuses():
            if fields[0] == "FAILURE" and len(fields) > 2 and fields[2].isdigit():
                if int(fields[2]) & 0xFFFF in (_GPG_ERR_BAD_PASSPHRASE, _GPG_ERR_NO_PASSPHRASE):
                    return True
        return False

    def status_summary(self) -> str:
        """GnuPG's status keywords, with their reason codes only (no user ID, no key ID)."""
        kept = []
        for fields in self._statuses():
            if fields[0] in ("INV_RECP", "INV_SGNR") and len(fields) > 1:
                kept.append(f"{fields[0]} {fields[1]}")  # the reason code, not the key named
            elif fields[0] in ("FAILURE", "ERROR") and len(fields) > 2:
                kept.append(f"{fields[0]} {fields[1]} {fields[2]}")  # location and error code
            elif fields[0] != "KEY_CONSIDERED":
                kept.append(fields[0])
        return f" ({', '.join(dict.fromkeys(kept))})" if kept else ""


def start_stream(
    home: GpgHome,
    *,
    recipients_: list[Recipient],
    signer: str | None,
    literal_name: str,
    passphrase: str | None = None,
) -> GpgStream:
    """Start ``gpg`` encrypting to ``recipients_`` and/or signing with ``signer`` (a fingerprint imported
    into ``home``), binary output, no compression of its own (the destination's gzip is the compression).

    ``literal_name`` is the name inside the message (what ``gpg --decrypt-files`` would write). A
    passphrase goes through a pipe (``--passphrase-fd``), never on the command line.
    """
    args = [
        *home.base_args(),
        "--trust-model",
        "always",  # the keys are the destination's, pinned by its administrator, not a web of trust
        "--compress-algo",
        "none",
        "--set-filename",
        literal_name,
        "--status-fd",
        "2",
        "--output",
        "-",
    ]
    for recipient in recipients_:
        args += ["--recipient-file", str(recipient.key_file)]
    passphrase_fd: int | None = None
    if signer is not None:
        args += ["--local-user", signer, "--pinentry-mode", "loopback"]
        if passphrase is not None:
            read_end, write_end = os.pipe()
            os.write(write_end, passphrase.encode() + b"\n")
            os.close(write_end)
            passphrase_fd = read_end
            args += ["--passphrase-fd", str(read_end)]
        else:
            args += ["--passphrase", ""]  # an unprotected key; a protected one then fails as locked
    if recipients_:
        args.append("--encrypt")
    if signer is not None:
        args.append("--sign")
    status_file = home.path / "status"
    try:
        with status_file.open("wb") as status:
            process = subprocess.Popen(
                args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=status,
                pass_fds=(passphrase_fd,) if passphrase_fd is not None else (),
                bufsize=0,
            )
    except OSError as exc:
        raise EncodingError("GpgMissing", _os_code(exc)) from None
    finally:
        if passphrase_fd is not None:
            os.close(passphrase_fd)
    return GpgStream(process, status_file)


def _run(
    args: list[str], what: str, *, stdin: bytes | None = None, code: str = "RecipientKeyUnusable"
) -> str:
    """Run a short gpg command; its standard output. Its other output is never repeated (user IDs)."""
    try:
        done = subprocess.run(
            args, input=stdin, capture_output=True, timeout=GPG_TIMEOUT_SECONDS, check=False
        )
    except subprocess.TimeoutExpired:
        raise EncodingError(code, f"{what}: gpg did not answer") from None
    except OSError as exc:
        raise EncodingError("GpgMissing", _os_code(exc)) from None
    if done.returncode != 0:
        raise EncodingError(code, f"{what}: gpg exit {done.returncode}")
    return done.stdout.decode("utf-8", errors="replace")


def _os_code(exc: OSError) -> str:
    import errno

    name = errno.errorcode.get(exc.errno or 0, "")
    return f"{type(exc).__name__}{'(' + name + ')' if name else ''}"
