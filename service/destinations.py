"""A tenant's destinations as versioned contracts (issue #24, item 1): an admin creates, edits and retires
them; everyone who reads exports reads them, with every version and the change that made it.

- Every change is the destination's next version, written in one statement with its record: who, the role,
  when, why, and the whole row before and after (``db/stores/destinations.py``; the database refuses a
  change that does not commit with its record, migration 0021).
- An edit names the version its author read (``If-Match``, compared as ``PATCH /exports/{id}`` compares it):
  428 without it, 412 when the destination moved on, 409 once it is retired.
- Secrets are never shown, stored or logged: a credential is a reference (the path of a key file on the worker
  host), the database refuses key material in it, and every ``*_ref`` column is shown as ``"set"`` (or
  ``null``) only, in the destination and in its history alike. A request the schema refuses answers which
  field and why, never the value.
- Which changes make an export building for the destination start again: a change of anything a delivery
  uses (the host, the port, the account, the pinned keys, the credential, the directory, the contract's
  evidence terms; any column a later migration adds) makes cutoff 2 refuse the file built for the version
  before, and the attempt is given back and rebuilt; the name, the contract window, the session limit and
  the retirement do not (cutoff 2 re-checks the window and the retirement itself). Nor does the delivery
  window (issue #25.2: the partner's intake hours in its time zone, and its blackout dates): the claim,
  cutoff 2 and the rename fence read it as it is at that moment.
- Several host keys may be pinned (one to ten: issue #24.4), so a partner's key rotation can overlap: an
  admin pins the new one (:meth:`Destinations.pin_key`), deliveries go on while both are trusted, then
  removes the old one (:meth:`Destinations.unpin_key`); each is a recorded version, and the last key is
  never removed. A connection test (:meth:`Destinations.test_connection`, issue #24.3) reports what the
  server presents and allows and never pins anything: a person pins a key after checking its fingerprint
  with the partner.
- ``max_sessions`` is the partner's limit of concurrent sessions (issue #25.3), held as slots: changing it
  rebuilds nothing.
- ``manifest`` (issue #24.6) is what is published beside each file after its rename: ``none``, ``sha256``,
  ``json`` or ``both``. It changes what is delivered, so it is a delivery term like the host or the key.
- What the partner receives (issue #24.5): the CSV's shape (``csv_header``, ``csv_delimiter``, ``csv_columns``),
  ``compression`` and the OpenPGP layer (``pgp_recipient_keys``, the partner's armored public keys, and
  ``pgp_signing_key_ref``, a reference to the tenant's signing key). Each is a delivery term: an edit during a
  build rebuilds the file, an edit after cutoff 2 leaves the upload on the version authorized. The keys take
  two admins (an encryption key decides who can read the file); the format takes one. A recipient key is
  checked with ``gpg --show-keys`` as the builder checks it, and shown by its fingerprint, never by its text.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
import uuid
from collections.abc import Mapping
from datetime import date
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, WithJsonSchema, model_validator

from db.errors import ConstraintRefused
from db.rows import DestinationEdit, DestinationRecord, DestinationVersion
from db.stores.api import ApiStore
from domain.audit import (
    ActionRecord,
    Approval,
    AuditAction,
    SubjectKind,
    TwoPersonAction,
    fields_needing_a_second_person,
)
from domain.destination import HOST_KEY_PATTERN, host_key_blob, host_key_fingerprint, normalized_host_key
from domain.evidence import ConnectionReport
from domain.file_format import ARMORED_PUBLIC_KEY, CONTACT_COLUMNS, Compression, ContactColumn, Delimiter
from domain.manifest import ManifestChoice
from encoding.errors import EncodingError
from encoding.openpgp import GpgHome, recipients
from service.approvals import Approvals, Subject
from service.audit import Ledger, answered
from service.auth import Caller
from service.commands import MAX_REASON, REASON_PATTERN, Name, Reason
from service.connection_tests import ConnectionTests, ConnectionTestUnavailable
from service.exports import ANY_VERSION, IDEMPOTENCY_KEY_PATTERN, if_match_versions
from service.outcomes import Answer, Kind, refusal
from service.permissions import Action, refused

_IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
CREATE_OPERATION = "create_destination"
ADMIN_ROLE = "admin"  # the role a record names for an admin's request (the database also knows 'owner')
VERSIONS_SHOWN = 100
SET = "set"  # how a reference is shown: never its value

# The fields of a destination's contract, as a request may name them (each column of ``destinations``).
HOST_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._:-]{0,251}[A-Za-z0-9])?$"  # a DNS name or an IP address
USERNAME_PATTERN = r"^[A-Za-z0-9._@+-]{1,200}$"
# A reference is one line naming where the secret is (a key file's path on the worker host), never the secret.
REFERENCE_PATTERN = r"^[!-~]([ -~]{0,998}[!-~])?$"
REMOTE_DIR_PATTERN = r"^/([ -~]{0,999})$"
ACK_SUFFIX_PATTERN = r"^[A-Za-z0-9._-]{1,50}$"
# One entry of a delivery window's intake hours, as migration 0035's intake_ranges reads it ("Mon-Fri 08:00-18:00",
# "Sat,Sun 10:00-12:00", "Mon-Fri 22:00-06:00" overnight, "Sun 00:00-24:00"): a test holds the two to the
# same answers. The database also refuses an entry that opens and closes at the same minute.
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_DAYS = rf"{_DAY}(?:-{_DAY})?"
INTAKE_HOURS_PATTERN = (
    rf"^{_DAYS}(?:,{_DAYS})* (?:[01][0-9]|2[0-3]):[0-5][0-9]-(?:(?:[01][0-9]|2[0-3]):[0-5][0-9]|24:00)$"
)
TIME_ZONE_PATTERN = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$"
_KEY_MATERIAL = re.compile(r"-----BEGIN|PRIVATE KEY", re.IGNORECASE)

Host = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=HOST_PATTERN)]
Port = Annotated[int, Field(ge=1, le=65535)]
Username = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=USERNAME_PATTERN)]
HostKey = Annotated[str, StringConstraints(min_length=20, max_length=16600, pattern=HOST_KEY_PATTERN)]
Reference = Annotated[str, StringConstraints(min_length=1, max_length=1000, pattern=REFERENCE_PATTERN)]
RemoteDir = Annotated[str, StringConstraints(min_length=1, max_length=1000, pattern=REMOTE_DIR_PATTERN)]
AckSuffix = Annotated[str, StringConstraints(min_length=1, max_length=50, pattern=ACK_SUFFIX_PATTERN)]
HashEvidence = Literal["none", "read_back", "ack_file"]
TemporaryFiles = Literal["keep", "remove"]
WriteRequest = Annotated[int, Field(ge=1024, le=261120)]
IntakeEntry = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=INTAKE_HOURS_PATTERN)]
TimeZone = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=TIME_ZONE_PATTERN)]
IntakeHours = Annotated[list[IntakeEntry], Field(min_length=1, max_length=50)]
BlackoutDates = Annotated[list[date], Field(max_length=366)]
_HOURS_OR_NULL: dict[str, Any] = {
    "anyOf": [
        {
            "type": "array",
            "minItems": 1,
            "maxItems": 50,
            "items": {"type": "string", "maxLength": 100, "pattern": INTAKE_HOURS_PATTERN},
        },
        {"type": "null"},
    ]
}
_DATE_OR_NULL: dict[str, Any] = {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]}
_SUFFIX_OR_NULL: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "minLength": 1, "maxLength": 50, "pattern": ACK_SUFFIX_PATTERN},
        {"type": "null"},
    ]
}
MAX_PINNED_KEYS = 10
MAX_SESSIONS = 100
SessionLimit = Annotated[int, Field(ge=1, le=MAX_SESSIONS)]
_SESSIONS_OR_NULL: dict[str, Any] = {
    "anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_SESSIONS}, {"type": "null"}]
}
HostKeys = Annotated[list[HostKey], Field(min_length=1, max_length=MAX_PINNED_KEYS)]
MAX_RECIPIENT_KEYS = 10  # 0020's armored_public_keys_ok() allows as many
RecipientKey = Annotated[str, StringConstraints(min_length=1, max_length=100_000)]
# An empty list: no encryption (an edit removes the keys with it).
RecipientKeys = Annotated[list[RecipientKey], Field(max_length=MAX_RECIPIENT_KEYS)]
CsvColumns = Annotated[list[ContactColumn], Field(min_length=1, max_length=len(CONTACT_COLUMNS))]

# Fields whose null means something (no acknowledgment file; an open-ended contract; intake at any hour; no
# session limit); every other field a PATCH names must have a value.
NULLABLE = frozenset(
    {"ack_suffix", "contract_ends_on", "intake_hours", "max_sessions", "pgp_signing_key_ref"}
)


def _edit_schema(schema: dict[str, Any], model: Any = None) -> None:
    """The published schema of a PATCH body says what the server enforces: the reason and at least one field
    (``minProperties``), and a field other than the nullable ones takes a value, never null."""
    schema["minProperties"] = 2
    for name, prop in schema.get("properties", {}).items():
        if name in NULLABLE or "anyOf" not in prop:
            continue
        kept = [option for option in prop["anyOf"] if option.get("type") != "null"]
        if len(kept) == 1:
            rest = {k: v for k, v in prop.items() if k not in ("anyOf", "default")}
            prop.clear()
            prop.update({**kept[0], **rest})


class DestinationFields(BaseModel):
    """What an admin may set on a destination (the columns of ``destinations`` a request may name)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name | None = None
    host: Host | None = None
    port: Port | None = None
    username: Username | None = None
    host_key: HostKey | None = Field(
        default=None,
        description="The server's public host key to pin, as `ssh-keyscan` prints it (an edit of it pins that "
        "key alone)",
    )
    host_keys: HostKeys | None = Field(
        default=None,
        description="Every host key to trust, one to ten (a rotation overlaps: pin the new one, then remove the "
        "old one); the first is host_key",
    )
    credential_ref: Reference | None = Field(
        default=None,
        description="Where the login key is (a path on the worker host): a reference, never the key; shown as 'set'",
    )
    remote_dir: RemoteDir | None = None
    name_and_size_identify: bool | None = None
    hash_evidence: HashEvidence | None = None
    ack_suffix: Annotated[AckSuffix | None, WithJsonSchema(_SUFFIX_OR_NULL)] = None
    max_write_request: WriteRequest | None = None
    temporary_files: TemporaryFiles | None = None
    contract_starts_on: Annotated[date | None, WithJsonSchema(_DATE_OR_NULL)] = None
    contract_ends_on: Annotated[date | None, WithJsonSchema(_DATE_OR_NULL)] = None
    # The delivery window (issue #25.2): the partner's time zone (IANA), its intake hours in that zone (null: any
    # hour) and its blackout dates (local dates on which it takes nothing).
    intake_time_zone: TimeZone | None = Field(
        default=None, description="The partner's time zone (IANA, e.g. Europe/Berlin); default UTC"
    )
    intake_hours: Annotated[IntakeHours | None, WithJsonSchema(_HOURS_OR_NULL)] = Field(
        default=None,
        description="When the partner takes deliveries, in its time zone, e.g. ['Mon-Fri 08:00-18:00']; "
        "null: at any hour",
    )
    blackout_dates: BlackoutDates | None = Field(
        default=None, description="Local dates on which the partner takes nothing, e.g. ['2026-12-24']"
    )
    max_sessions: Annotated[SessionLimit | None, WithJsonSchema(_SESSIONS_OR_NULL)] = Field(
        default=None,
        description="How many SFTP sessions the partner allows at once, held as slots across all workers "
        "(null: no limit); not a delivery term",
    )
    # A manifest published last (issue #24.6): a delivery term, so an edit during a build rebuilds the file.
    manifest: ManifestChoice | None = Field(
        default=None,
        description="What is published beside each file, after its rename: none, sha256 (a coreutils "
        "`<file>.sha256` sidecar for `sha256sum -c`), json (`<file>.manifest.json`) or both; a delivery term",
    )
    # What the partner receives (issue #24.5, columns of 0020): delivery terms, so an edit during a build rebuilds.
    csv_header: bool | None = Field(
        default=None,
        description="Whether the CSV's first line names its columns (default true); a delivery term",
    )
    csv_delimiter: Delimiter | None = Field(
        default=None,
        description="The CSV's delimiter: ',', ';', '|' or a tab ('\\t' in JSON); default ','; a delivery term",
    )
    csv_columns: CsvColumns | None = Field(
        default=None,
        description=f"Which contact columns the partner receives, in that order, each once: any of "
        f"{', '.join(CONTACT_COLUMNS)} (default all three); a delivery term",
    )
    compression: Compression | None = Field(
        default=None, description="none or gzip (the file is then .csv.gz); a delivery term"
    )
    pgp_recipient_keys: RecipientKeys | None = Field(
        default=None,
        description="The partner's OpenPGP public keys, each an ASCII-armored public key block (gpg --armor "
        "--export; never a secret key): files are encrypted to every one of them; [] encrypts no more. Shown "
        "by fingerprint; a change takes two admins; a delivery term",
    )
    pgp_signing_key_ref: Reference | None = Field(
        default=None,
        description="Where the tenant's OpenPGP signing key is (a path on the worker host): a reference, never "
        "the key; shown as 'set'; null: files are not signed. A change takes two admins; a delivery term",
    )


class CreateDestination(DestinationFields):
    """POST /destinations: a new partner destination of your tenant. It starts paused (resume it with POST
    /switches/resume once its connection is checked)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name
    host: Host
    port: Port = 22
    username: Username
    host_key: HostKey
    credential_ref: Reference
    remote_dir: RemoteDir
    name_and_size_identify: bool = False
    hash_evidence: HashEvidence = "read_back"
    max_write_request: WriteRequest = 32768
    temporary_files: TemporaryFiles = "keep"
    manifest: ManifestChoice = "none"
    reason: Reason = Field(default="created", description="Why (recorded with the first version)")


class EditDestination(DestinationFields):
    """PATCH /destinations/{id}: the fields to change (a field left out keeps its value; ``ack_suffix`` and
    ``contract_ends_on`` may be null to clear them) and why. At least one field besides the reason."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_edit_schema)

    reason: Reason

    @model_validator(mode="before")
    @classmethod
    def _nulls_only_where_they_mean_something(cls, data: Any) -> Any:
        if isinstance(data, dict):
            nulls = sorted(k for k, v in data.items() if v is None and k not in NULLABLE)
            if nulls:
                raise ValueError(
                    f"{', '.join(nulls)}: a field given must have a value; leave a field out to keep it"
                )
        return data

    @model_validator(mode="after")
    def _changes_something(self) -> EditDestination:
        if not self.changes():
            raise ValueError("name at least one field to change besides the reason")
        return self

    def changes(self) -> dict[str, Any]:
        """The fields this request sets, as JSON values (a null clears a nullable one); pinned keys as
        ``"<type> <base64>"``, each once."""
        changes = self.model_dump(mode="json", exclude_unset=True, exclude={"reason"})
        if isinstance(changes.get("host_keys"), list):
            changes["host_keys"] = [normalized_host_key(k) or k for k in changes["host_keys"]]
        return changes


class PinHostKey(BaseModel):
    """POST /destinations/{id}/host-keys: one more host key to trust (as ``ssh-keyscan`` prints it), after its
    fingerprint was checked with the partner; the keys pinned before stay trusted until removed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: HostKey
    reason: Reason


class UnpinHostKey(BaseModel):
    """POST /destinations/{id}/host-keys/removal: stop trusting the pinned key with this fingerprint (the last
    key is never removed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fingerprint: Annotated[
        str, StringConstraints(min_length=8, max_length=100, pattern=r"^SHA256:[A-Za-z0-9+/]+$")
    ]
    reason: Reason


class RetireDestination(BaseModel):
    """POST /destinations/{id}/retirement: why. What is building for it stops at cutoff 2, what is queued is
    rejected; a retirement is final."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: Annotated[str, StringConstraints(min_length=1, max_length=MAX_REASON, pattern=REASON_PATTERN)]


def value_problem(fields: Mapping[str, Any]) -> str | None:
    """What the schema cannot see inside a value given (``None``: nothing): key material where a reference
    belongs, a host key that is not a public key line. It answers 422 with a ``detail`` and no ``errors``,
    before anything is written (the database refuses key material in a reference too). A message never
    repeats a value: one refused here may be the secret itself."""
    reference = fields.get("credential_ref")
    if isinstance(reference, str) and _KEY_MATERIAL.search(reference):
        return "credential_ref must be a reference to a secret (a key file's path on the worker host), never the secret"
    host_key = fields.get("host_key")
    if isinstance(host_key, str) and ("PRIVATE" in host_key.upper() or host_key_blob(host_key) is None):
        return "host_key must be the server's public key line, '<type> <base64>', as ssh-keyscan prints it"
    recipient_keys = fields.get("pgp_recipient_keys")
    if isinstance(recipient_keys, list):
        if not all(map(_armored_public_key, recipient_keys)):
            return (
                "each of pgp_recipient_keys must be an ASCII-armored OpenPGP public key block (gpg --armor "
                "--export), never a secret key"
            )
        if len(set(recipient_keys)) != len(recipient_keys):
            return "pgp_recipient_keys names one key twice"
    signing = fields.get("pgp_signing_key_ref")
    if isinstance(signing, str) and _KEY_MATERIAL.search(signing):
        return (
            "pgp_signing_key_ref must be a reference to the signing key (its file's path on the worker host), "
            "never the key"
        )
    columns = fields.get("csv_columns")
    if isinstance(columns, list) and len(set(columns)) != len(columns):
        return f"csv_columns names a column twice: each of {', '.join(CONTACT_COLUMNS)} at most once"
    time_zone = fields.get("intake_time_zone")
    if isinstance(time_zone, str) and time_zone not in _known_time_zones():
        return "intake_time_zone must be an IANA time zone name, such as Europe/Berlin or UTC"
    host_keys = fields.get("host_keys")
    if isinstance(host_keys, list):
        if host_key is not None:
            return "give host_key or host_keys, not both (host_key is the first of host_keys)"
        if any("PRIVATE" in k.upper() or host_key_blob(k) is None for k in host_keys):
            return "each of host_keys must be a server's public key line, '<type> <base64>', as ssh-keyscan prints it"
        if len({normalized_host_key(k) for k in host_keys}) != len(host_keys):
            return "host_keys names one key twice"
    return None


def _armored_public_key(key: object) -> bool:
    """One armored public key block and never a secret one (0020's ``armored_public_keys_ok`` reads keys alike)."""
    return (
        isinstance(key, str)
        and key.startswith(ARMORED_PUBLIC_KEY)
        and "-----END PGP PUBLIC KEY BLOCK-----" in key
        and "PRIVATE KEY" not in key.upper()
    )


def recipient_key_problem(keys: list[str]) -> str | None:
    """What ``gpg --show-keys`` finds wrong with the partner's keys, as the builder will check them
    (``encoding.openpgp.recipients``: one key each, usable for encryption, not expired or revoked); ``None``:
    nothing, or no gpg on this host to ask (the build checks them again). Blocking: run it in a thread. The
    answer names a key by its position, never by its text."""
    if not keys:
        return None
    home = GpgHome.create(label="fenced-api-keys")
    try:
        recipients(home, tuple(keys))
    except EncodingError as exc:
        if exc.code == "GpgMissing":
            return None
        return f"pgp_recipient_keys: gpg cannot encrypt to it ({exc.detail}; keys are counted from 0)"
    finally:
        home.close()
    return None


@functools.lru_cache(maxsize=256)
def recipient_key_fingerprint(armored: str) -> str | None:
    """The primary key's fingerprint of one armored public key, as the builder's evidence records it
    (``gpg --show-keys`` through ``encoding.openpgp``); ``None`` when gpg cannot use it (or is missing).
    Blocking: run it in a thread."""
    home = GpgHome.create(label="fenced-api-keys")
    try:
        [found] = recipients(home, (armored,))
    except EncodingError:
        return None
    finally:
        home.close()
    return found.fingerprint


async def _fingerprints(keys: object) -> list[str | None] | object:
    """The fingerprints of a row's recipient keys (anything else: as it is)."""
    if not isinstance(keys, list):
        return keys
    return [await asyncio.to_thread(recipient_key_fingerprint, str(k)) for k in keys]


def _known_time_zones() -> frozenset[str]:
    """The IANA names this host knows (the database checks its own list too: ck_destinations_intake_time_zone)."""
    import zoneinfo

    return frozenset(zoneinfo.available_timezones()) | {"UTC"}


def contract_problem(row: Mapping[str, Any]) -> str | None:
    """What does not hold between a destination's fields (``None``: it holds), which the schema cannot say:
    the acknowledgment suffix goes with its evidence kind, the contract ends no earlier than it starts."""
    if (row.get("hash_evidence") == "ack_file") != (row.get("ack_suffix") is not None):
        return "ack_suffix is required with hash_evidence 'ack_file', and only with it"
    starts, ends = row.get("contract_starts_on"), row.get("contract_ends_on")
    if starts is not None and ends is not None and str(ends) < str(starts):
        return "contract_ends_on must not be before contract_starts_on"
    return None


def masked(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A destination's columns for people: every reference (``*_ref``) shown as ``"set"`` or ``None``."""
    if row is None:
        return None
    return {k: (SET if v is not None else None) if k.endswith("_ref") else v for k, v in row.items()}


def pinned_keys(settings: Mapping[str, Any]) -> list[str]:
    """The host keys a destination's row pins (``host_keys``; a row without them pins its ``host_key``)."""
    keys = settings.get("host_keys")
    if isinstance(keys, list) and keys:
        return [str(k) for k in keys]
    host_key = settings.get("host_key")
    return [host_key] if isinstance(host_key, str) else []


async def destination_json(record: DestinationRecord) -> dict[str, Any]:
    """One destination as the API shows it: its columns with references masked, its pinned keys with their
    fingerprints, the partner's OpenPGP keys by fingerprint (``null``: gpg cannot use that key), its session
    limit and the slots held now, and whether its deliveries are on."""
    settings = masked(record.settings) or {}
    host_key = record.settings.get("host_key")
    recipient_keys = record.settings.get("pgp_recipient_keys") or []
    return {
        **settings,
        "pgp_recipient_keys": [
            {"fingerprint": f}
            for f in await _fingerprints(recipient_keys)  # type: ignore[union-attr]
        ],
        "host_key_fingerprint": host_key_fingerprint(host_key) if isinstance(host_key, str) else None,
        "pinned_host_keys": [
            {"key": k, "fingerprint": host_key_fingerprint(k)} for k in pinned_keys(record.settings)
        ],
        "sessions_in_use": record.sessions_in_use,
        "deliveries": "enabled" if record.enabled else "paused",
        "paused_because": record.paused_because,  # the pause's reason (None: enabled, or never enabled)
        "links": {"self": f"/destinations/{record.id}", "console": f"/console/destinations/{record.id}"},
    }


async def version_json(v: DestinationVersion) -> dict[str, Any]:
    """One recorded version: who, the role, when, why, and each changed field before and after (masked; the
    partner's OpenPGP keys by fingerprint)."""
    before, after = masked(v.before) or {}, masked(v.after) or {}
    if "pgp_recipient_keys" in v.changed_fields:
        for side in (before, after):
            side["pgp_recipient_keys"] = await _fingerprints(side.get("pgp_recipient_keys"))
    return {
        "version": v.version,
        "change": v.change,
        "changed_by": v.changed_by,
        "changed_role": v.changed_role,
        "reason": v.reason,
        "changed_at": v.changed_at.isoformat(),
        "delivery_changed": v.delivery_changed,
        "changes": [{"field": f, "before": before.get(f), "after": after.get(f)} for f in v.changed_fields],
    }


def request_fingerprint(caller: Caller, body: CreateDestination) -> str:
    """SHA-256 of the canonical JSON of the validated creation and its scope (002 "Canonical fingerprint"),
    so the same Idempotency-Key with another request is told apart; the reference is hashed, never stored."""
    canonical = json.dumps(
        {
            "operation": CREATE_OPERATION,
            "tenant_id": str(caller.tenant_id),
            "principal": caller.principal,
            **body.model_dump(mode="json"),
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class Destinations:
    """The destination operations over an ``exports_api`` store; every change is in the ledger of operator
    actions, in its own transaction, and a change of where deliveries go or whom they trust (the fields of
    ``TWO_PERSON_DESTINATION_FIELDS``: host, port, account, credential, host key, encryption and signing keys)
    takes two admins (:mod:`service.approvals`). ``tests`` runs connection tests on a worker (through
    Temporal; ``None``: this process has no Temporal client, and a test answers 503)."""

    def __init__(
        self, store: ApiStore, tests: ConnectionTests | None = None, *, approvals: Approvals | None = None
    ) -> None:
        self.store = store
        self.tests = tests
        self.approvals = approvals or Approvals(store)
        self.ledger = Ledger(store)

    def _action(self, caller: Caller, action: AuditAction, subject_id: object, reason: str | None) -> Any:
        return self.ledger.action(
            tenant_id=caller.tenant_id,
            principal=caller.principal,
            role=caller.role,
            action=action,
            subject_kind=SubjectKind.DESTINATION,
            subject_id=subject_id,
            reason=reason,
        )

    async def caller(self, tenant_id: UUID, principal: str) -> Caller | None:
        """The command line's caller: the named principal with the role the tenant gave it (``None`` when it
        is no principal of the tenant, or revoked). A token carries its role; the command line has none."""
        role = await self.store.principal_role(tenant_id, principal)
        if role not in ("viewer", "operator", "reconciler", "admin"):
            return None
        return Caller(tenant_id=tenant_id, principal=principal, role=role)  # type: ignore[arg-type]

    # -- reads -----------------------------------------------------------------------------------------

    async def list(self, caller: Caller) -> Answer:
        """``GET /destinations``: the tenant's destinations (ID, name, version, retired; never a reference)."""
        rows = await self.store.tenant_destinations(caller.tenant_id)
        return Answer(
            Kind.DONE,
            {
                "destinations": [
                    {
                        "id": str(d.id),
                        "name": d.name,
                        "version": d.version,
                        "retired": d.retired_at is not None,
                    }
                    for d in rows
                ]
            },
        )

    async def show(self, caller: Caller, destination_id: UUID, *, limit: int = VERSIONS_SHOWN) -> Answer:
        """``GET /destinations/{id}``: the destination as it is now and its versions, newest first; the ETag
        is its version (what an edit's If-Match names)."""
        record = await self.store.get_tenant_destination(caller.tenant_id, destination_id)
        if record is None:
            return refusal(Kind.NOT_FOUND, "no such destination")
        versions = await self.store.destination_versions_of(caller.tenant_id, destination_id, limit)
        return Answer(
            Kind.DONE,
            {
                "destination": await destination_json(record),
                "versions": [await version_json(v) for v in versions],
            },
            version=record.version,
        )

    # -- changes ---------------------------------------------------------------------------------------

    async def create(self, caller: Caller, body: CreateDestination, idempotency_key: str | None) -> Answer:
        """Create a destination once per Idempotency-Key (the same key and request replay the first, 200;
        another request is 409); it is version 1, recorded with who and why, and starts paused."""
        async with self._action(caller, AuditAction.DESTINATION_CREATE, None, body.reason) as audit:
            return answered(audit, await self._create(caller, body, idempotency_key, audit))

    async def _create(
        self, caller: Caller, body: CreateDestination, idempotency_key: str | None, audit: ActionRecord
    ) -> Answer:
        forbidden = refused(caller.role, Action.MANAGE_DESTINATIONS)
        if forbidden is not None:
            return forbidden
        if idempotency_key is None:
            return refusal(
                Kind.MALFORMED,
                "the Idempotency-Key header is required: one value per request, reused on retry",
            )
        if not _IDEMPOTENCY_KEY.match(idempotency_key):
            return refusal(Kind.MALFORMED, "Idempotency-Key must be 1-200 visible ASCII characters")
        given = body.model_dump(mode="json", exclude={"reason"})
        if given.get("host_keys") is not None:
            return refusal(
                Kind.INVALID,
                "a new destination pins its host_key; pin more keys once it exists (POST /destinations/{id}/host-keys)",
            )
        problem = (
            value_problem(given)
            or contract_problem(given)
            or await asyncio.to_thread(recipient_key_problem, given.get("pgp_recipient_keys") or [])
        )
        if problem:
            return refusal(Kind.INVALID, problem)
        fingerprint = request_fingerprint(caller, body)
        fields = body.model_dump(exclude={"reason", "contract_starts_on", "contract_ends_on"})
        for attempt in range(2):
            try:
                async with self.store.recording(audit):
                    created = await self.store.create_destination(
                        destination_id=uuid.uuid4(),
                        tenant_id=caller.tenant_id,
                        fields=fields,
                        contract_starts_on=body.contract_starts_on,
                        contract_ends_on=body.contract_ends_on,
                        changed_by=caller.principal,
                        changed_role=ADMIN_ROLE,
                        reason=body.reason,
                        request_key=idempotency_key,
                        request_fingerprint=fingerprint,
                    )
                    audit.subject_id = str(created.destination_id)
                    if created.replayed and created.fingerprint != fingerprint:
                        audit.outcome = Kind.REFUSED.value
                        audit.detail = "this Idempotency-Key was used for a different request"
                    else:
                        audit.outcome = (Kind.DONE if created.replayed else Kind.CREATED).value
                        audit.after = {"destination": {**given, "version": 1}, "replayed": created.replayed}
                break
            except ConstraintRefused as exc:
                # The same key, submitted twice at once: the other submission created it; read its answer.
                if exc.constraint == "uq_destination_versions_request" and attempt == 0:
                    continue
                return refusal(Kind.INVALID, _refused_contract(exc))
        if created.replayed and created.fingerprint != fingerprint:
            return refusal(
                Kind.REFUSED,
                "this Idempotency-Key was used for a different request",
                code="idempotency_conflict",
            )
        record = await self.store.get_tenant_destination(caller.tenant_id, created.destination_id)
        assert record is not None  # created in this tenant, never deleted
        return Answer(
            Kind.DONE if created.replayed else Kind.CREATED,
            {
                "destination": await destination_json(record),
                "replayed": created.replayed,
                "message": (
                    f"Destination {record.settings['name']} {'was already created' if created.replayed else 'created'}"
                    f" (version {record.version}); its deliveries are "
                    f"{'enabled' if record.enabled else 'paused until an operator resumes them'}."
                ),
            },
            location=f"/destinations/{record.id}",
            version=record.version,
            replayed=created.replayed,
        )

    async def edit(
        self,
        caller: Caller,
        destination_id: UUID,
        body: EditDestination,
        if_match: str | None,
        *,
        approval: Approval | None = None,
    ) -> Answer:
        """Change a destination from the version its author read (``If-Match``): its next version, recorded.

        428 without If-Match, 400 when it is malformed, 412 when the destination moved on, 409 once retired,
        422 when the contract would not hold together. Changing nothing records nothing (200). A change of its
        host, port, account, credential, host key or encryption keys takes two admins: asked, it waits for
        another admin's approval (202); approved, it is made as the approver's, from the version asked about.
        """
        async with self._action(caller, AuditAction.DESTINATION_EDIT, destination_id, body.reason) as audit:
            if approval is not None:
                audit.approval_id, audit.requested_by = approval.id, approval.requested_by
            return answered(audit, await self._edit(caller, destination_id, body, if_match, audit, approval))

    async def _edit(
        self,
        caller: Caller,
        destination_id: UUID,
        body: EditDestination,
        if_match: str | None,
        audit: ActionRecord,
        approval: Approval | None,
    ) -> Answer:
        forbidden = refused(caller.role, Action.MANAGE_DESTINATIONS)
        if forbidden is not None:
            return forbidden
        if if_match is None:
            return refusal(
                Kind.PRECONDITION_REQUIRED,
                'the If-Match header is required: the version you read, e.g. If-Match: "1"',
            )
        versions = if_match_versions(if_match)
        if versions is None:
            return refusal(
                Kind.MALFORMED,
                'If-Match must be entity tags as the ETag header gives them, e.g. If-Match: "1" (quoted)',
            )
        record = await self.store.get_tenant_destination(caller.tenant_id, destination_id)
        if record is None:
            return refusal(Kind.NOT_FOUND, "no such destination")
        if ANY_VERSION not in versions and record.version not in versions:
            why = "" if versions else " (a weak entity tag never matches: If-Match uses strong comparison)"
            return refusal(
                Kind.STALE,
                f'the destination is at version {record.version}; If-Match names no "{record.version}"{why}',
                version=record.version,
            )
        if record.settings.get("retired_at") is not None:
            return _retired(record.settings)
        current = record.settings
        changes = {k: v for k, v in body.changes().items() if current.get(k) != v}
        if not changes:
            return Answer(
                Kind.DONE,
                {
                    "destination": await destination_json(record),
                    "changed_fields": [],
                    "message": f"Nothing changed: every field already has that value (still version {record.version}).",
                },
                version=record.version,
            )
        problem = (
            value_problem(changes)
            or contract_problem({**current, **changes})
            or await asyncio.to_thread(recipient_key_problem, changes.get("pgp_recipient_keys") or [])
        )
        if problem:
            return refusal(Kind.INVALID, problem)
        audit.before = {k: current.get(k) for k in changes}
        two_person = fields_needing_a_second_person(changes, current)
        if two_person and approval is None:
            return await self.approvals.request(
                caller,
                TwoPersonAction.CHANGE_DESTINATION,
                Subject("destination", destination_id),
                {
                    "changes": changes,
                    "fields": two_person,
                    "expected_version": record.version,
                    "body": body.model_dump(mode="json", exclude_unset=True),
                },
                body.reason,
                audit,
            )
        try:
            if approval is not None:
                transaction = self.approvals.executing(self.store, audit, approval, caller)
            else:
                transaction = self.store.recording(audit)
            async with transaction:
                edited = await self.store.edit_destination_if_version(
                    tenant_id=caller.tenant_id,
                    destination_id=destination_id,
                    expected_version=record.version,
                    changes=changes,
                    changed_by=caller.principal,
                    changed_role=ADMIN_ROLE,
                    reason=body.reason,
                )
                audit.outcome = _edit_outcome(edited).value
                audit.after = {**changes, "version": edited.version} if edited and edited.matched else None
        except ConstraintRefused as exc:
            return refusal(Kind.INVALID, _refused_contract(exc))
        if edited is None:
            return refusal(Kind.NOT_FOUND, "no such destination")
        if not edited.matched:
            # Someone moved first (another edit, or the retirement): say which.
            if edited.retired_at is not None:
                return refusal(
                    Kind.REFUSED, "the destination was retired meanwhile; a retired one never changes"
                )
            return refusal(
                Kind.STALE,
                f"the destination is at version {edited.version}, not {record.version}",
                version=edited.version,
            )
        now = await self.store.get_tenant_destination(caller.tenant_id, destination_id)
        assert now is not None
        consequence = (
            "Exports building for it are given back at cutoff 2 and rebuilt for this version; "
            "deliveries already authorized finish on the version they were authorized for."
            if edited.delivery_changed
            else "No delivery term changed: exports building for it go on."
        )
        if _WINDOW_FIELDS & set(edited.changed_fields):
            consequence += (
                " The delivery window applies from now on to claims, cutoff 2 and renames; an export already"
                " waiting for an opening is woken at the opening it was given, and its claim checks again."
            )
        return Answer(
            Kind.DONE,
            {
                "destination": await destination_json(now),
                "changed_fields": edited.changed_fields,
                "delivery_changed": edited.delivery_changed,
                "message": f"Destination {now.settings['name']} is at version {edited.version}. {consequence}",
            },
            version=edited.version,
        )

    async def pin_key(
        self, caller: Caller, destination_id: UUID, body: PinHostKey, if_match: str | None
    ) -> Answer:
        """Trust one more host key (an edit of ``host_keys`` from the version the admin read, recorded with its
        reason): the keys pinned before stay trusted, so deliveries go on through a rotation. A key already
        pinned changes nothing (200)."""
        forbidden = refused(caller.role, Action.MANAGE_DESTINATIONS)
        if forbidden is not None:
            return forbidden
        key = normalized_host_key(body.key) if "PRIVATE" not in body.key.upper() else None
        if key is None:
            return refusal(
                Kind.INVALID,
                "key must be the server's public key line, '<type> <base64>', as ssh-keyscan prints it",
            )
        record = await self.store.get_tenant_destination(caller.tenant_id, destination_id)
        if record is None:
            return refusal(Kind.NOT_FOUND, "no such destination")
        pinned = pinned_keys(record.settings)
        if key in {normalized_host_key(k) for k in pinned}:
            keys = pinned
        elif len(pinned) >= MAX_PINNED_KEYS:
            return refusal(Kind.INVALID, f"at most {MAX_PINNED_KEYS} host keys are pinned: remove one first")
        else:
            keys = [*pinned, key]
        return await self.edit(
            caller, destination_id, EditDestination(host_keys=keys, reason=body.reason), if_match
        )

    async def unpin_key(
        self, caller: Caller, destination_id: UUID, body: UnpinHostKey, if_match: str | None
    ) -> Answer:
        """Stop trusting the pinned key with ``body.fingerprint`` (an edit of ``host_keys``, recorded); the last
        key is never removed (422), and a fingerprint pinned nowhere is 404."""
        forbidden = refused(caller.role, Action.MANAGE_DESTINATIONS)
        if forbidden is not None:
            return forbidden
        record = await self.store.get_tenant_destination(caller.tenant_id, destination_id)
        if record is None:
            return refusal(Kind.NOT_FOUND, "no such destination")
        pinned = pinned_keys(record.settings)
        kept = [k for k in pinned if host_key_fingerprint(k) != body.fingerprint]
        if len(kept) == len(pinned):
            return refusal(Kind.NOT_FOUND, f"no pinned host key has the fingerprint {body.fingerprint}")
        if not kept:
            return refusal(
                Kind.INVALID, "a destination keeps at least one pinned host key: pin the new one first"
            )
        return await self.edit(
            caller, destination_id, EditDestination(host_keys=kept, reason=body.reason), if_match
        )

    async def test_connection(self, caller: Caller, destination_id: UUID) -> Answer:
        """``POST /destinations/{id}/connection-tests``: run the connection test on a worker (which holds the
        login key) and answer what the server presented and allowed. It pins nothing and records nothing; our
        login is offered only to a server whose key is pinned. 503 when no worker could be asked, or every
        session slot of the partner is in use."""
        forbidden = refused(caller.role, Action.TEST_CONNECTION)
        if forbidden is not None:
            return forbidden
        record = await self.store.get_tenant_destination(caller.tenant_id, destination_id)
        if record is None:
            return refusal(Kind.NOT_FOUND, "no such destination")
        if self.tests is None:
            return refusal(
                Kind.BUSY,
                "connection tests run on a worker, through Temporal, and this process has no Temporal client",
            )
        try:
            result = await self.tests.run(caller.tenant_id, destination_id)
        except ConnectionTestUnavailable as exc:
            return Answer(Kind.BUSY, {"detail": str(exc)}, retry_after_seconds=10)
        if not result.found:
            return refusal(Kind.NOT_FOUND, "no such destination")
        if result.slots_busy or result.report is None:
            return Answer(
                Kind.BUSY,
                {
                    "detail": f"every session slot of the partner is in use ({result.in_use} of "
                    f"{result.max_sessions}): the test was not run; try again shortly",
                    "in_use": result.in_use,
                    "max_sessions": result.max_sessions,
                },
                retry_after_seconds=10,
            )
        return Answer(
            Kind.DONE,
            connection_test_json(record, result.destination_version, result.report, caller.principal)
            | {
                "tested_on": result.worker_id,
                "sessions": {"in_use": result.in_use, "max": result.max_sessions},
            },
        )

    async def retire(self, caller: Caller, destination_id: UUID, body: RetireDestination) -> Answer:
        """Retire a destination (its next version, recorded): what is building for it stops at cutoff 2, what is
        queued is rejected. 409 when it is already retired. Stopping takes one person."""
        async with self._action(caller, AuditAction.DESTINATION_RETIRE, destination_id, body.reason) as audit:
            return answered(audit, await self._retire(caller, destination_id, body, audit))

    async def _retire(
        self, caller: Caller, destination_id: UUID, body: RetireDestination, audit: ActionRecord
    ) -> Answer:
        forbidden = refused(caller.role, Action.MANAGE_DESTINATIONS)
        if forbidden is not None:
            return forbidden
        async with self.store.recording(audit):
            retired = await self.store.retire_destination(
                tenant_id=caller.tenant_id,
                destination_id=destination_id,
                retired_by=caller.principal,
                changed_role=ADMIN_ROLE,
                reason=body.reason,
            )
            audit.outcome = (
                Kind.NOT_FOUND if retired is None else Kind.DONE if retired.matched else Kind.REFUSED
            ).value
            audit.after = (
                {"retired": True, "version": retired.version} if retired and retired.matched else None
            )
        if retired is None:
            return refusal(Kind.NOT_FOUND, "no such destination")
        record = await self.store.get_tenant_destination(caller.tenant_id, destination_id)
        assert record is not None
        if not retired.matched:
            return _retired(record.settings)
        return Answer(
            Kind.DONE,
            {
                "destination": await destination_json(record),
                "message": (
                    f"Destination {record.settings['name']} retired (version {retired.version}): exports building "
                    "for it stop at cutoff 2 and are given back; queued ones are rejected."
                ),
            },
            version=retired.version,
        )


_WINDOW_FIELDS = frozenset({"intake_time_zone", "intake_hours", "blackout_dates"})


def connection_test_json(
    record: DestinationRecord, version: int | None, report: ConnectionReport, tested_by: str
) -> dict[str, Any]:
    """A connection test's answer: what the server presented (its public key line and fingerprint) and whether
    it is pinned, our login's result, the remote directory, the server's extensions, and a sentence."""
    name = record.settings.get("name")
    return {
        "destination_id": str(record.id),
        "destination_version": version,
        "tested_by": tested_by,
        "connected": report.connected,
        "host_key": {
            "presented": report.host_key,
            "fingerprint": report.host_key_fingerprint,
            "pinned": report.pinned,
            "pinned_fingerprints": report.pinned_fingerprints,
        },
        "authentication": report.authentication,
        "remote_dir": {
            "path": record.settings.get("remote_dir"),
            "listable": report.remote_dir_listable,
            "writable": report.remote_dir_writable,
            "status": report.remote_dir_status,
        },
        "posix_rename": report.posix_rename,
        "max_write_length": report.max_write_length,
        "extensions": report.extensions,
        "cipher": report.cipher,
        "error": report.error,
        "pinned_anything": False,  # a test never pins: a person pins a key after checking it
        "message": connection_test_message(str(name), record.settings, report),
    }


def connection_test_message(name: str, settings: Mapping[str, Any], report: ConnectionReport) -> str:
    """The connection test in one paragraph, for people."""
    where = f"{settings.get('host')}:{settings.get('port')}"
    if not report.connected:
        return f"{name}: could not reach {where} ({report.error}). Nothing was sent."
    presented = f"The server at {where} presented {report.host_key_fingerprint}"
    if not report.pinned:
        return (
            f"{name}: {presented}, which is not pinned (pinned: {', '.join(report.pinned_fingerprints) or 'none'}). "
            "Our login was not offered to it and nothing was sent. If the partner confirms this fingerprint "
            "(compare it with them out of band), pin the key: starter.py destination pin-key, or POST "
            "/destinations/{id}/host-keys. A test never pins a key by itself."
        )
    if report.authentication != "accepted":
        return (
            f"{name}: {presented}, which is pinned; the server refused our login as {settings.get('username')}"
            f" ({report.error}). Nothing was sent."
        )
    writable = {
        True: "is writable",
        False: f"is not writable (status {report.remote_dir_status})",
        None: "was not checked",
    }[report.remote_dir_writable]
    limit = f"{report.max_write_length:,} bytes" if report.max_write_length else "not announced"
    rename = "supported" if report.posix_rename else "not announced"
    problem = f" It stopped at: {report.error}." if report.error else ""
    return (
        f"{name}: {presented}, which is pinned; our login was accepted; {settings.get('remote_dir')} {writable} "
        f"(a temporary name was created and removed); posix-rename {rename}; write limit {limit}.{problem}"
    )


def _edit_outcome(edited: DestinationEdit | None) -> Kind:
    """What an edit's statement answered, as the ledger records it (the service's answer says the same)."""
    if edited is None:
        return Kind.NOT_FOUND
    if edited.matched:
        return Kind.DONE
    return Kind.REFUSED if edited.retired_at is not None else Kind.STALE


def _retired(settings: Mapping[str, Any]) -> Answer:
    return refusal(
        Kind.REFUSED,
        f"the destination was retired on {str(settings.get('retired_at'))[:10]} by {settings.get('retired_by')};"
        " a retired destination never changes",
    )


# What each check of the destinations table means, in words (the request was refused and nothing changed).
_CONTRACT_CHECKS = {
    "ck_destinations_host_keys": "a destination pins one to ten host keys, none twice",
    "ck_destinations_max_sessions": f"max_sessions must be between 1 and {MAX_SESSIONS}",
    "ck_destinations_ack": "ack_suffix is required with hash_evidence 'ack_file', and only with it",
    "ck_destinations_contract": "contract_ends_on must not be before contract_starts_on",
    "ck_destinations_credential_ref": "credential_ref must be a reference to a secret, never the secret",
    "ck_destinations_intake_time_zone": "intake_time_zone must be an IANA time zone name the database knows",
    "ck_destinations_intake_hours": (
        "intake_hours: 1 to 50 entries like 'Mon-Fri 08:00-18:00', each opening and closing at different times"
    ),
    "ck_destinations_blackout_dates": "blackout_dates: at most 366 dates",
    "ck_destinations_pgp_recipient_keys": (
        f"pgp_recipient_keys: at most {MAX_RECIPIENT_KEYS} ASCII-armored OpenPGP public key blocks"
    ),
    "ck_destinations_pgp_signing_key_ref": "pgp_signing_key_ref must be a reference to the key, never the key",
    "ck_destinations_csv_delimiter": "csv_delimiter must be one of ',', ';', '|' or a tab",
    "ck_destinations_csv_columns": f"csv_columns: one to three of {', '.join(CONTACT_COLUMNS)}, each once",
    "ck_destinations_compression": "compression must be none or gzip",
}


def _refused_contract(exc: ConstraintRefused) -> str:
    return _CONTRACT_CHECKS.get(
        exc.constraint or "", f"the destination's contract refuses that ({exc.constraint})"
    )
