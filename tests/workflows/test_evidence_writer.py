"""The delivery's evidence writer: the delivering thread hands each observation over and goes on, one writer
appends them in their order, several per statement, and the thread waits only for the baseline, which is on
record before the first byte is sent; what it observed before the rename is on record before the rename is
sent. The terminal write follows the last observation (evidence first)."""

from __future__ import annotations

import json
import uuid

from domain.models import EventKind, JobStatus
from tests.workflows.harness import Harness
from workflows.models import AttemptOutcome


async def _observations(harness: Harness, job_id: uuid.UUID) -> list[tuple[int, dict[str, object]]]:
    events = await harness.factory.worker.job_events(job_id)
    return [
        (e.id, json.loads(e.detail))
        for e in events
        if e.kind == EventKind.DELIVERY_EVIDENCE and e.detail is not None
    ]


async def test_the_baseline_is_on_record_before_the_first_byte_and_every_observation_lands_in_order(
    harness: Harness,
) -> None:
    job = await harness.queue_export(contacts=50)
    seen_at_first_byte: list[list[str]] = []
    seen_before_rename: list[list[str]] = []

    async def first_byte(job_id: uuid.UUID, sent: int) -> None:
        if not seen_at_first_byte:
            seen_at_first_byte.append(
                [str(o["observation"]) for _, o in await _observations(harness, job_id)]
            )

    async def rename_fenced(job_id: uuid.UUID) -> None:
        seen_before_rename.append([str(o["observation"]) for _, o in await _observations(harness, job_id)])

    harness.host.activities.seams.during_upload = first_byte
    harness.host.activities.seams.after_rename_fence = rename_fenced
    result = await harness.run(job)

    assert result.outcome == AttemptOutcome.COMPLETED
    assert seen_at_first_byte and "baseline" in seen_at_first_byte[0]
    # a worker killed once the rename is sent leaves the upload on record (recovery and reconcilers weigh it)
    assert seen_before_rename == [["connect", "baseline", "upload"]]
    observed = await _observations(harness, job.id)
    kinds = [str(o["observation"]) for _, o in observed]
    assert kinds == ["connect", "baseline", "upload", "rename", "read_back", "outcome"]
    # in the order the thread made them: ascending IDs and ascending observation times
    assert [i for i, _ in observed] == sorted(i for i, _ in observed)
    times = [str(o["at"]) for _, o in observed]
    assert times == sorted(times)
    assert all(o["destination_version"] == 1 for _, o in observed)
    # the terminal write came after the last observation
    events = await harness.factory.worker.job_events(job.id)
    finished = next(e for e in events if e.kind == EventKind.FINISHED)
    assert finished.id > observed[-1][0]
    assert (await harness.factory.job(job.id)).status == JobStatus.COMPLETED


async def test_observations_made_together_are_appended_in_one_statement(harness: Harness) -> None:
    """The upload, the rename, the read-back and the outcome come milliseconds apart: the writer appends
    them in fewer statements than observations (one statement gives its rows one transaction time)."""
    job = await harness.queue_export(contacts=50)
    result = await harness.run(job)
    assert result.outcome == AttemptOutcome.COMPLETED
    rows = await harness.factory.admin(
        "SELECT count(DISTINCT xmin::text) AS statements, count(*) AS observations FROM export_attempt_events"
        " WHERE job_id = %(id)s AND kind = 'DeliveryEvidence'",
        {"id": job.id},
    )
    assert rows[0]["observations"] == 6
    assert rows[0]["statements"] < rows[0]["observations"]
