"""A manifest published last (issue #24, item 6): what a destination may ask for beside its data file.

A destination's ``manifest`` is ``none``, ``sha256``, ``json`` or ``both``:

- ``sha256``: a sidecar ``{file}.sha256`` in coreutils format (``<64 hex digits>  <file>``, one line), so the
  partner runs ``sha256sum -c contacts-<key>.csv.gz.pgp.sha256`` in the directory and it passes;
- ``json``: ``{file}.manifest.json``, one JSON object: ``export_id``, ``delivery_key``, ``file``, ``bytes``,
  ``rows``, ``sha256``, ``created_at``;
- ``both``: the two.

A manifest names the file as delivered (for an encrypted destination the OpenPGP message: what lands under the
final name) and its SHA-256, which is what ``sha256sum -c`` checks: the file as stored, ciphertext when encrypted.
Its content is a function of the export's row alone (``expected_file_*``, written by cutoff 2, and
``delivery_authorized_at`` as ``created_at``; :func:`manifests_for_job`), never of who writes it or when: the
worker and recovery write the same bytes, so a manifest found in place is compared byte for byte. No contact data,
only names, sizes, counts and hashes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from uuid import UUID

from domain.models import ExportJob

ManifestChoice = Literal["none", "sha256", "json", "both"]
MANIFEST_CHOICES: tuple[ManifestChoice, ...] = ("none", "sha256", "json", "both")
ManifestKind = Literal["sha256", "json"]

SHA256_SUFFIX = ".sha256"
JSON_SUFFIX = ".manifest.json"
# The evidence kind a manifest's publication is recorded under; migration 0037's manifest_in_place() reads it.
MANIFEST_OBSERVATION = "manifest"
# What a manifest's evidence says when it is in place: written now, or found there with the same bytes.
IN_PLACE_RESULTS = frozenset({"published", "in_place"})


def manifest_kinds(choice: str | None) -> tuple[ManifestKind, ...]:
    """The manifests a destination's choice asks for, sidecar first."""
    kinds: dict[str, tuple[ManifestKind, ...]] = {
        "sha256": ("sha256",),
        "json": ("json",),
        "both": ("sha256", "json"),
    }
    return kinds.get(choice or "none", ())


def manifest_name(file_name: str, kind: ManifestKind) -> str:
    """The manifest's final name beside ``file_name`` (the delivered file's final name)."""
    return file_name + (SHA256_SUFFIX if kind == "sha256" else JSON_SUFFIX)


def manifest_names(file_name: str, choice: str | None) -> tuple[str, ...]:
    """Every manifest name a choice puts beside ``file_name`` (what the auditor and recovery look for)."""
    return tuple(manifest_name(file_name, kind) for kind in manifest_kinds(choice))


@dataclass(frozen=True)
class ManifestFacts:
    """What a manifest says: the delivered file as cutoff 2 recorded it, and the CSV inside it."""

    export_id: UUID
    delivery_key: str
    file: str
    size: int  # ``bytes`` in the JSON manifest
    sha256: bytes
    rows: int
    created_at: datetime


@dataclass(frozen=True)
class ManifestFile:
    """One manifest to publish: its kind, its final name and its exact bytes (and their SHA-256)."""

    kind: ManifestKind
    name: str
    content: bytes

    @property
    def sha256(self) -> bytes:
        return hashlib.sha256(self.content).digest()

    def evidence(self) -> dict[str, Any]:
        """What identifies it in evidence: name, kind, size and hash (its content is names and hashes too)."""
        return {"name": self.name, "kind": self.kind, "bytes": len(self.content), "sha256": self.sha256.hex()}


def sidecar_content(facts: ManifestFacts) -> bytes:
    """``sha256sum``'s own line for the file: the hash, two spaces (text mode), the name, a newline."""
    return f"{facts.sha256.hex()}  {facts.file}\n".encode("ascii")


def json_content(facts: ManifestFacts) -> bytes:
    """The JSON manifest, canonical (sorted keys, no spaces, one line): the same facts give the same bytes."""
    body: dict[str, Any] = {
        "export_id": str(facts.export_id),
        "delivery_key": facts.delivery_key,
        "file": facts.file,
        "bytes": facts.size,
        "rows": facts.rows,
        "sha256": facts.sha256.hex(),
        "created_at": facts.created_at.astimezone(UTC).isoformat(timespec="microseconds"),
    }
    return (json.dumps(body, sort_keys=True, separators=(",", ":")) + "\n").encode("ascii")


def manifest_files(choice: str | None, facts: ManifestFacts) -> tuple[ManifestFile, ...]:
    """The manifests ``choice`` asks for, with their bytes, in the order they are published."""
    made = {"sha256": sidecar_content, "json": json_content}
    return tuple(
        ManifestFile(kind=kind, name=manifest_name(facts.file, kind), content=made[kind](facts))
        for kind in manifest_kinds(choice)
    )


def manifests_for_job(job: ExportJob) -> tuple[ManifestFile, ...]:
    """The manifests the version cutoff 2 authorized asks for beside ``job``'s file, with their bytes (none
    when it asks for none, or before cutoff 2 recorded the expected file)."""
    if not manifest_kinds(job.expected_manifest):
        return ()
    if (
        job.expected_file_name is None
        or job.expected_file_bytes is None
        or job.expected_file_sha256 is None
        or job.delivery_authorized_at is None
    ):
        return ()
    facts = ManifestFacts(
        export_id=job.id,
        delivery_key=job.delivery_key,
        file=job.expected_file_name,
        size=job.expected_file_bytes,
        sha256=job.expected_file_sha256,
        rows=job.expected_file_rows or 0,
        created_at=job.delivery_authorized_at,
    )
    return manifest_files(job.expected_manifest, facts)


def manifests_in_place(evidence: Iterable[dict[str, Any]]) -> frozenset[str]:
    """The manifest names an attempt's evidence shows in place (published, or found with the same bytes)."""
    return frozenset(
        str(item.get("name"))
        for item in evidence
        if item.get("observation") == MANIFEST_OBSERVATION and item.get("result") in IN_PLACE_RESULTS
    )
