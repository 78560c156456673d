"""Helpers shared by the partner tests: stand-in export files, the partner's acknowledgment, one delivery."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

from domain.destination import Destination
from partner.delivery import DeliveryHooks, DeliveryReport, FileToDeliver, OriginalFile, deliver
from testbed.sftp import SftpTarget

SIZE = 600_000  # a few write requests at either request size


def contact_bytes(size: int = SIZE) -> bytes:
    """Bytes standing in for an export (random, so two builds never collide)."""
    return os.urandom(size)


def local_file(tmp_path: Path, data: bytes, final_name: str | None = None) -> FileToDeliver:
    """Write ``data`` as a built export file and describe it as the delivery expects it."""
    final_name = final_name or f"contacts-{uuid.uuid4()}.csv"
    path = tmp_path / final_name
    path.write_bytes(data)
    return FileToDeliver(
        path=path, final_name=final_name, size=len(data), sha256=hashlib.sha256(data).digest()
    )


def original_of(data: bytes, final_name: str, attempt_id: UUID | None = None) -> OriginalFile:
    """What a replacement knows of its original's file, from the original's row."""
    return OriginalFile(
        name=final_name,
        size=len(data),
        sha256=hashlib.sha256(data).digest(),
        attempt_id=attempt_id or uuid.uuid4(),
    )


def partner_ack(
    target: SftpTarget, final_name: str, data: bytes, upload: str | None, suffix: str = ".ack"
) -> None:
    """Write an acknowledgment as the partner does after publishing ``final_name`` (domain.evidence)."""
    ack = {
        "name": final_name,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "upload": upload,
    }
    target.put(final_name + suffix, json.dumps(ack).encode())


class Run:
    """One delivery attempt, with everything it handed to ``on_evidence``."""

    def __init__(self, report: DeliveryReport, evidence: list[dict[str, Any]], attempt_id: UUID) -> None:
        self.report = report
        self.evidence = evidence
        self.attempt_id = attempt_id

    def kinds(self) -> list[str]:
        return [e["observation"] for e in self.evidence]

    def one(self, kind: str) -> dict[str, Any]:
        found = [e for e in self.evidence if e["observation"] == kind]
        assert len(found) == 1, (kind, self.kinds())
        return found[0]


async def run_delivery(
    destination: Destination,
    file: FileToDeliver,
    *,
    original: OriginalFile | None = None,
    overwrite_agreed: bool = False,
    hooks: DeliveryHooks | None = None,
    attempt_id: UUID | None = None,
    ack_wait: float = 5.0,
    on_evidence: Callable[[dict[str, Any]], None] | None = None,
) -> Run:
    """Deliver in a thread, as production does, collecting the evidence; ``on_evidence`` also sees each
    record as it is made (a seam: act at a named point of the delivery)."""
    attempt_id = attempt_id or uuid.uuid4()
    evidence: list[dict[str, Any]] = []

    def record(observation: dict[str, Any]) -> None:
        evidence.append(observation)
        if on_evidence is not None:
            on_evidence(observation)

    report = await asyncio.to_thread(
        deliver,
        destination,
        file,
        attempt_id,
        original=original,
        overwrite_agreed=overwrite_agreed,
        on_evidence=record,
        hooks=hooks,
        ack_wait=ack_wait,
        io_timeout=20.0,
    )
    assert report.evidence == evidence  # the report repeats what was handed over, in order
    assert evidence[-1]["observation"] == "outcome"
    return Run(report, evidence, attempt_id)


def assert_no_data_in(evidence: list[dict[str, Any]], data: bytes) -> None:
    text = json.dumps(evidence)
    assert data[:32].hex() not in text
    for e in evidence:
        assert set(e) >= {"observation", "at", "attempt_id", "destination_id"}
