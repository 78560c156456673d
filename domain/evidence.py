"""What a delivery expects and what it saw at the partner: the values the delivery rules decide on.

Only names, sizes, mtimes, hashes (hex) and codes: never file contents, contact data or credentials.

The acknowledgment file (contract ``hash_evidence = 'ack_file'``): after it publishes a file under
its final name, the partner writes ``{final_name}{ack_suffix}`` in the same directory, one JSON
object, UTF-8, at most 64 KiB::

    {"name": "contacts-<delivery_key>.csv",   # the final name it acknowledges
     "size": 1234,                            # bytes it received under that name
     "sha256": "<64 hex digits>",             # SHA-256 of those bytes
     "upload": ".partial-<attempt_id>-contacts-<delivery_key>.csv"}   # optional: the name it was renamed from

An acknowledgment is tied to an upload when name, size and sha256 all match the file that upload
sent and, when ``upload`` is present, it names that upload's temporary file (which carries the
attempt ID). A later upload's acknowledgment replaces the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from domain.manifest import ManifestFile
from domain.models import DeliveryOutcome, FailureCode

TEMP_PREFIX = ".partial-"


def temp_name_for(attempt_id: UUID, final_name: str) -> str:
    """The temporary name one attempt uploads under: hidden from the partner, attributable to the attempt."""
    return f"{TEMP_PREFIX}{attempt_id}-{final_name}"


def set_aside_name_for(attempt_id: UUID, final_name: str) -> str:
    """Where an attempt sets its temporary file aside when a rename's answer was lost and the rename had
    not published it: once moved, the lost rename can never publish it. Still a temporary name (the same
    prefix, so the same cleanup agreement covers it), with an extension of its own."""
    return f"{temp_name_for(attempt_id, final_name)}.set-aside"


@dataclass(frozen=True)
class SetAside:
    """What moving an attempt's temporary file to its set-aside name (``set_aside_name_for``) found.

    ``result``: ``ok``, moved now; ``already_moved``, the temporary name was empty and the set-aside name
    holds the file (an earlier move whose answer was lost); ``gone``, neither name holds it (a rename
    took it, or somebody removed it); ``refused``, the server refused the move for another reason.
    """

    name: str
    result: str
    status: int | None = None  # the SFTP status of a refused move
    size: int | None = None  # of the file found under the set-aside name (``already_moved``)

    @property
    def moved(self) -> bool:
        """The file is under the set-aside name: a rename of the temporary name can never publish it."""
        return self.result in ("ok", "already_moved")

    def evidence(self) -> list[dict[str, Any]]:
        """The ``set_aside`` evidence items: a refused move first, then what the set-aside name showed."""
        if self.result == "ok":
            return [{"result": "ok", "set_aside_name": self.name}]
        refused = {"result": "refused", "set_aside_name": self.name, "status": self.status}
        if self.result == "already_moved":
            return [refused, {"result": "already_moved", "set_aside_name": self.name, "size": self.size}]
        return [refused]


@dataclass(frozen=True)
class FileToDeliver:
    """The local file an attempt uploads, with the size and hash recorded at cutoff 2."""

    path: Path
    final_name: str
    size: int
    sha256: bytes
    # published beside it once its rename is confirmed, in this order (issue #24.6; ``domain.manifest``)
    manifests: tuple[ManifestFile, ...] = ()


@dataclass(frozen=True)
class OriginalFile:
    """A replacement's original job's expected file, from its ``export_jobs`` row."""

    name: str
    size: int | None
    sha256: bytes | None
    attempt_id: UUID | None


class DeliveryReport(BaseModel):
    """The classified outcome of one delivery; ``summary`` holds codes and sizes only."""

    outcome: DeliveryOutcome
    failure_code: FailureCode | None = None
    summary: str
    evidence: list[dict[str, Any]] = []


class Ack(BaseModel):
    """A parsed acknowledgment file (see the module docstring for the format)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str
    size: int
    sha256: str
    upload: str | None = None

    @field_validator("sha256")
    @classmethod
    def _hex_digest(cls, value: str) -> str:
        value = value.lower()
        bytes.fromhex(value)
        if len(value) != 64:
            raise ValueError("sha256 must be 64 hex digits")
        return value

    @classmethod
    def parse(cls, raw: bytes | None) -> Ack | None:
        """Parse an acknowledgment file's bytes; ``None`` when absent or not in the agreed format."""
        if raw is None:
            return None
        try:
            return cls.model_validate(json.loads(raw.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError, ValidationError, ValueError, TypeError):
            return None

    def as_evidence(self) -> dict[str, Any]:
        """The acknowledgment's agreed fields only: whatever else a partner writes is not recorded."""
        return self.model_dump()

    def acknowledges(self, name: str, size: int | None, sha256: bytes | None, upload: str | None) -> bool:
        """True when this acknowledgment is for exactly that file (and that upload, when it names one)."""
        if size is None or sha256 is None:
            return False
        if (self.name, self.size, self.sha256) != (name, size, sha256.hex()):
            return False
        return upload is None or self.upload is None or self.upload == upload


class Observation(BaseModel):
    """What the partner's server showed under one name: presence, size, mtime, a hash and an ack if read."""

    present: bool
    size: int | None = None
    mtime: int | None = None
    sha256: bytes | None = None
    ack: dict[str, Any] | None = None

    def same_as(self, other: Observation) -> bool:
        """The same listing: presence, size and mtime equal, and hashes too where both were read."""
        if (self.present, self.size, self.mtime) != (other.present, other.size, other.mtime):
            return False
        return self.sha256 is None or other.sha256 is None or self.sha256 == other.sha256

    def parsed_ack(self) -> Ack | None:
        """The acknowledgment seen with this observation, when it was in the agreed format."""
        if self.ack is None:
            return None
        try:
            return Ack.model_validate(self.ack)
        except ValidationError:
            return None

    def as_evidence(self) -> dict[str, Any]:
        """The observation as evidence fields: the hash in hex, the ack as the partner wrote it."""
        return {
            "present": self.present,
            "size": self.size,
            "mtime": self.mtime,
            "sha256": self.sha256.hex() if self.sha256 is not None else None,
            "ack": self.ack,
        }


class ConnectionReport(BaseModel):
    """What a connection test found at a destination's server (issue #24.3): public facts and codes only.

    ``host_key`` is the public key line the server presented and ``host_key_fingerprint`` its OpenSSH
    ``SHA256:`` fingerprint; ``pinned`` says whether it is one of the destination's pinned keys. A test never
    pins anything, and it offers our login only to a server whose key is pinned: otherwise
    ``authentication`` is ``not_tried``. ``remote_dir_writable`` says whether a temporary name could be
    created (and was removed) in the remote directory, with the SFTP status of a refusal. ``posix_rename`` and
    ``max_write_length`` come from the server's SFTP extensions (``posix-rename@openssh.com``, and the
    ``limits@openssh.com`` reply). ``error`` is the code of the step that failed first, if one did.
    """

    model_config = ConfigDict(frozen=True)

    connected: bool
    error: str | None = None
    host_key: str | None = None
    host_key_fingerprint: str | None = None
    pinned: bool | None = None
    pinned_fingerprints: list[str] = []
    authentication: str = "not_tried"  # accepted, refused or not_tried
    remote_dir_listable: bool | None = None
    remote_dir_writable: bool | None = None
    remote_dir_status: int | None = None
    posix_rename: bool | None = None
    max_write_length: int | None = None
    max_open_handles: int | None = None
    extensions: list[str] = []
    cipher: str | None = None
