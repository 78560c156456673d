"""How each observation a delivery makes is recorded, the moment it is made.

Every observation becomes one JSON-able dict, handed to ``on_evidence`` at once (the worker's writer appends
them in order, a few per statement, and has all of them on record before the rename is sent: see
``activities.deliver._EvidenceRecorder``). Each dict carries ``observation`` (its kind), ``at`` (UTC, when it was seen),
``attempt_id`` and ``destination_id``; the caller adds who observed it when it stores the dict
(``append_delivery_evidence`` of the worker's and recovery's stores). Only names, sizes, mtimes, hashes (hex), SFTP status codes and
error type names appear: never file contents, contact data or credentials. The values themselves are in
:mod:`domain.evidence`.

Observation kinds: ``connect``, ``baseline``, ``final_name_occupied``, ``upload``, ``interrupted``,
``rename``, ``fresh_listing``, ``set_aside`` (the temporary file moved away after a lost rename answer),
``read_back``, ``ack``, ``outcome``; and after a Failed export under a cleanup agreement, ``cleanup``
(:func:`partner.delivery.remove_temporary_files`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from uuid import UUID


class EvidenceLog:
    """Stamps each observation and hands it to ``on_evidence`` at once; keeps them for the report.

    A failing ``on_evidence`` never changes what the delivery does: the observation stays in the
    report's list so the caller can store it later.
    """

    def __init__(
        self, attempt_id: UUID, destination_id: UUID, on_evidence: Callable[[dict[str, Any]], None]
    ) -> None:
        self.attempt_id = attempt_id
        self.destination_id = destination_id
        self.on_evidence = on_evidence
        self.records: list[dict[str, Any]] = []
        self.undelivered = 0

    def record(self, observation: str, **fields: Any) -> dict[str, Any]:
        """Record one observation of kind ``observation`` with its fields (JSON-able, no data)."""
        entry = {
            "observation": observation,
            "at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "attempt_id": str(self.attempt_id),
            "destination_id": str(self.destination_id),
            **fields,
        }
        self.records.append(entry)
        try:
            self.on_evidence(entry)
        except Exception:  # the caller's store may be down; the report still carries the entry
            self.undelivered += 1
        return entry


def error_code(exc: BaseException) -> dict[str, Any]:
    """An exception as evidence: its type and, for SFTP refusals, the status code; never its message."""
    status = getattr(exc, "status", None)
    code = getattr(exc, "code", None)
    fields: dict[str, Any] = {"error": type(exc).__name__}
    if isinstance(status, int):
        fields["status"] = status
    if isinstance(code, str):
        fields["code"] = code
    if getattr(exc, "no_space", False) is True:
        fields["no_space"] = True  # the partner said it has no room for our writes (never its message)
    return fields
