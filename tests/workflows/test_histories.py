"""No contact data in Temporal history (DESIGN "Things that are easy to get wrong"; 004: payloads carry IDs
only). Every workflow module's harness searches the histories of its own workflows when the module ends
(tests/workflows/conftest.py); this test shows that search on one full export with a stop and a
cancellation of its own, and that it finds what it seeks."""

from __future__ import annotations

import asyncio
import uuid

from domain.models import CancellationOutcome
from tests.workflows.harness import LEAK, Harness, history_leaks, history_text
from workflows.export import ExportWorkflow
from workflows.models import AttemptOutcome


async def test_no_contact_data_appears_in_the_histories_of_a_delivered_and_a_stopped_export(
    harness: Harness,
) -> None:
    # A run of our own, so the check never passes on an empty list: one delivered, one stopped mid-build.
    delivered = await harness.queue_export(contacts=40)
    assert (await harness.run(delivered)).outcome == AttemptOutcome.COMPLETED
    stopped = await harness.queue_export(contacts=40)
    building = asyncio.Event()

    async def hold(job_id: uuid.UUID) -> None:
        building.set()
        await asyncio.Event().wait()

    harness.host.activities.seams.after_build = hold
    handle = await harness.start(stopped)
    await asyncio.wait_for(building.wait(), 20)
    answer = await harness.factory.cancel(stopped)
    assert answer.outcome == CancellationOutcome.STOP_REQUESTED
    await handle.signal(ExportWorkflow.stop_requested, str(answer.request_id))
    assert (await handle.result()).outcome == AttemptOutcome.STOPPED

    assert harness.contact_values, "no contacts were inserted: the search would prove nothing"
    assert all(LEAK.search(value.encode()) for value in harness.contact_values)  # it finds what it seeks
    assert len(harness.started) >= 2
    for started in harness.started:
        assert b"ExportWorkflow" in await history_text(started)  # the histories really are read
    assert await history_leaks(harness.started) == []
