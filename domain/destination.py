"""A partner's SFTP endpoint and the contract agreed with it: the value of one ``destinations`` row.

The store reads it (``load_destination`` of ``db/stores/reads.py``); the partner client is handed the value and
never a pool.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from domain.file_format import CONTACT_COLUMNS, Compression, ContactColumn, Delimiter, FileFormat
from domain.manifest import ManifestChoice


class Destination(BaseModel):
    """Where an export lands and what the partner's side can prove about it.

    ``host_keys`` are the pinned host keys (``"ssh-ed25519 AAAA..."``, optionally preceded by a known_hosts
    host field), one to ten of them so a partner's key rotation can overlap (migration 0029); ``host_key`` is
    the first; ``credential_ref`` is the path of the private key file on the worker host, never the key.
    ``max_sessions`` is how many SFTP sessions the partner allows at once (``None``: no limit), held as slots
    in the database (issue #25.3); it is read as it is now, never as a version's term.
    The contract: ``name_and_size_identify`` (name and size identify a delivered file),
    ``hash_evidence`` (``read_back``: the account may read the file back to hash it; ``ack_file``: the
    partner writes ``{final}{ack_suffix}``, see :mod:`domain.evidence`), ``max_write_request``
    (the largest SFTP write the server accepts; OpenSSH's limit is 261,120) and ``temporary_files``
    (the cleanup agreement: ``remove`` lets an attempt's temporary and set-aside files be removed once its
    export is recorded Failed; ``keep`` leaves them to the partner). ``kind`` picks the partner code that
    serves it (``partner.kinds``); only ``sftp`` exists, and no column stores it yet.

    What the partner receives (migration 0020) is read as one value, :attr:`file_format`: the CSV's
    ``csv_header``, ``csv_delimiter`` and ``csv_columns``, its ``compression``, the partner's armored
    OpenPGP public keys (``pgp_recipient_keys``) and the reference to the tenant's signing key
    (``pgp_signing_key_ref``, a path on the worker host, never the key). ``manifest`` (migration 0037) is what
    is published beside each file after its rename: none, a ``.sha256`` sidecar, a JSON manifest, or both.
    """

    model_config = ConfigDict(frozen=True)

    id: UUID
    # Which partner serves it (partner/kinds.py); no column yet, so every row is an SFTP destination.
    kind: Literal["sftp"] = "sftp"
    tenant_id: UUID
    name: str
    host: str
    port: int
    username: str
    host_key: str
    host_keys: tuple[str, ...] = ()
    credential_ref: str
    remote_dir: str
    name_and_size_identify: bool = False
    hash_evidence: Literal["none", "read_back", "ack_file"] = "none"
    ack_suffix: str | None = None
    max_write_request: int = 32768
    temporary_files: Literal["keep", "remove"] = "keep"
    csv_header: bool = True
    csv_delimiter: Delimiter = ","
    csv_columns: tuple[ContactColumn, ...] = CONTACT_COLUMNS
    compression: Compression = "none"
    # Not in a repr, so a destination that reaches a log line never carries key blocks or the reference.
    pgp_recipient_keys: tuple[str, ...] = Field(default=(), repr=False)
    pgp_signing_key_ref: str | None = Field(default=None, repr=False)
    # The version of the destination this value is (issue #24: every change is a new version); a delivery
    # uses the version cutoff 2 authorized, and its evidence names it.
    version: int = 1
    max_sessions: int | None = None
    # What is published beside each delivered file, last (issue #24.6, migration 0037; ``domain.manifest``).
    manifest: ManifestChoice = "none"

    @property
    def pinned_keys(self) -> tuple[str, ...]:
        """Every host key this destination trusts: its ``host_keys``, or its one ``host_key`` when a value was
        built without them."""
        return self.host_keys or (self.host_key,)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Destination:
        """Build a destination from a ``destinations`` row (extra columns such as created_at are ignored)."""
        return cls.model_validate({name: row[name] for name in cls.model_fields if name in row})

    @property
    def file_format(self) -> FileFormat:
        """What this destination receives (validated: a bad column list or key block raises here)."""
        return FileFormat(
            header=self.csv_header,
            delimiter=self.csv_delimiter,
            columns=self.csv_columns,
            compression=self.compression,
            recipient_keys=self.pgp_recipient_keys,
            signing_key_ref=self.pgp_signing_key_ref,
        )

    def remote_path(self, name: str) -> str:
        """The absolute path of ``name`` in the destination's remote directory."""
        return f"{self.remote_dir.rstrip('/')}/{name}"


# What a pinned host key line may look like: an optional known_hosts host field, the key type, the base64 key
# blob, an optional comment; one line of visible ASCII (the API's pattern; the blob is checked below).
HOST_KEY_PATTERN = (
    r"^([!-~]+ )?(ssh-|ecdsa-|sk-|rsa-)[!-~]{1,60} [A-Za-z0-9+/]{16,16384}={0,3}( [ -~]{0,200})?$"
)
_KEY_TYPE_PREFIXES = ("ssh-", "ecdsa-", "sk-", "rsa-")


def host_key_blob(line: str) -> bytes | None:
    """The public key blob of a pinned host key line (``"ssh-ed25519 AAAA..."``, optionally after a known_hosts
    host field), or ``None`` when it is not one: the base64 must decode and the blob must name the same key
    type as the line (the SSH wire format starts with the type's length and name)."""
    parts = line.split()
    if len(parts) >= 3 and not parts[0].startswith(_KEY_TYPE_PREFIXES):
        parts = parts[1:]
    if len(parts) < 2 or not parts[0].startswith(_KEY_TYPE_PREFIXES):
        return None
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(blob) < 4:
        return None
    length = int.from_bytes(blob[:4], "big")
    if blob[4 : 4 + length] != parts[0].encode("ascii", "replace"):
        return None
    return blob


def normalized_host_key(line: str) -> str | None:
    """A pinned host key line as ``"<type> <base64>"`` (without a known_hosts host field or a comment), or
    ``None`` when it is not a public key line: how a key is pinned, so one key is never pinned twice."""
    if host_key_blob(line) is None:
        return None
    parts = line.split()
    if len(parts) >= 3 and not parts[0].startswith(_KEY_TYPE_PREFIXES):
        parts = parts[1:]
    return f"{parts[0]} {parts[1]}"


def host_key_fingerprint(line: str) -> str | None:
    """The OpenSSH ``SHA256:...`` fingerprint of a pinned host key line (what ``ssh-keygen -lf`` prints and the
    delivery's evidence records), or ``None`` when the line is not a key."""
    blob = host_key_blob(line)
    if blob is None:
        return None
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
