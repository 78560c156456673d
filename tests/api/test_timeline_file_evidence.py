"""The timeline reads cutoff 2's file evidence (JSON since issue #24 item 5): the file and its layers, never
a key; an event recorded before, whose detail is the bare file name, still reads as it did."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from domain.models import AttemptEvent, EventKind
from service.views import timeline
from tests.support.factories import Factory


def authorized(job_id: uuid.UUID, attempt_id: uuid.UUID, detail: str) -> AttemptEvent:
    return AttemptEvent(
        id=1,
        job_id=job_id,
        attempt_id=attempt_id,
        kind=EventKind.DELIVERY_AUTHORIZED,
        version=None,
        worker_id=None,
        observed_by=None,
        detail=detail,
        recorded_at=datetime.now(UTC),
    )


async def test_the_authorized_entry_names_the_file_its_gzip_its_keys_and_its_signature(factory: Factory):
    job, _ = await factory.running()
    other_attempt = uuid.uuid4()  # not the job's attempt: no "bytes expected" from the row
    evidence = {
        "file": "contacts-k.csv.gz.pgp",
        "bytes": 10,
        "sha256": "00",
        "rows": 2,
        "plaintext": {"bytes": 40, "sha256": "11"},
        "format": {"compression": "gzip", "encrypted": True, "signed": True},
        "recipients": ["A" * 40, "B" * 40],
        "signer": "C" * 40,
    }
    for detail, shown in (
        (json.dumps(evidence), "contacts-k.csv.gz.pgp, gzip, encrypted to 2 keys, signed"),
        ("contacts-k.csv", "contacts-k.csv"),
    ):
        entries = timeline(
            job, [authorized(job.id, other_attempt, detail)], [], tenant_name="acme", destination_name="p"
        )
        assert entries[-1].label == "Authorized" and entries[-1].detail == shown
