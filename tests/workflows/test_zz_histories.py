"""No contact data in Temporal history (DESIGN "Things that are easy to get wrong"; 004: payloads carry IDs
only). Runs last in this package: it fetches the history of every ExportWorkflow the harnesses started in
this session, plus one full export with a stop and a cancellation of its own, and searches every field,
payloads included, for contact addresses, names and CSV content."""

from __future__ import annotations

import asyncio
import uuid

from domain.models import CancellationOutcome
from tests.workflows.harness import CONTACT_VALUES, LEAK, STARTED, Harness, history_text
from workflows.export import ExportWorkflow
from workflows.models import AttemptOutcome


async def test_no_contact_data_appears_in_any_workflow_history_of_the_run(harness: Harness) -> None:
    # A run of our own, so the check never passes on an empty list: one delivered, one stopped mid-build.
    delivered = await harness.queue_export(contacts=40)
    assert (await harness.run(delivered)).outcome == AttemptOutcome.COMPLETED
    stopped = await harness.queue_export(contacts=40)
    building = asyncio.Event()

    async def hold(job_id: uuid.UUID) -> None:
        building.set()
        await asyncio.Event().wait()

    harness.host.activities.after_build = hold
    handle = await harness.start(stopped)
    await asyncio.wait_for(building.wait(), 20)
    answer = await harness.factory.cancel(stopped)
    assert answer.outcome == CancellationOutcome.STOP_REQUESTED
    await handle.signal(ExportWorkflow.stop_requested, str(answer.request_id))
    assert (await handle.result()).outcome == AttemptOutcome.STOPPED

    assert CONTACT_VALUES, "no contacts were inserted: the search would prove nothing"
    assert all(LEAK.search(value.encode()) for value in list(CONTACT_VALUES)[:100])  # it finds what it seeks
    checked, leaks = 0, []
    for started in list(STARTED):
        text = await history_text(started)
        assert b"ExportWorkflow" in text  # the history really was read
        checked += 1
        found = LEAK.search(text)
        if found:
            leaks.append((started.id, found.group(0).decode(errors="replace")))
    assert checked >= 2
    assert leaks == [], f"contact data in workflow histories: {leaks[:5]}"
