"""Record the workflow histories the replay tests replay: ``python -m tests.replay.record``.

It runs the demo (``demo.run_demo``: embedded PostgreSQL, the Temporal dev server, the local SFTP partner, the
real worker and API), so the histories are those of every demo scenario: the incident's three timings, a plain
delivery, the rejection by the policy check and the pause and resume; then it triggers the recovery and
sweeper Schedules once each and records their runs too. Each history is written to
``tests/replay/histories/<name>.json``: ``export-<scenario>.json`` for a scenario of one wake-up, and
``export-<scenario>-wake-up-<n>-<outcome>.json`` for each wake-up of a scenario that has several (the pause
and resume: the first ends Paused, the resume's delivers).

An existing file is never overwritten: a history recorded before a change of workflow code must still
replay, so it is kept and reported as kept. After a deliberate change guarded by ``workflow.patched``,
record again with ``--tag <change-id>``: every history is then written beside the old ones as
``<name>-<change-id>.json``. A history that holds contact data is refused, not written.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import re
from dataclasses import dataclass
from pathlib import Path

import psycopg
from google.protobuf import text_format
from temporalio.api.history.v1 import History
from temporalio.client import (
    Client,
    ScheduleActionExecutionStartWorkflow,
    WorkflowExecutionStatus,
    WorkflowHistory,
)

from demo import DemoContext, run_demo
from runtime.schedules import RECOVERY_SCHEDULE_ID, SWEEPER_SCHEDULE_ID
from service.temporal import connect_client
from settings import Settings
from workflows.export import ExportWorkflow, export_workflow_id

HISTORIES = Path(__file__).parent / "histories"
WAIT = 120  # seconds: a bound on waiting for a run to complete, never a delay that decides an outcome

# The demo's contacts as db/support.sql's insert_generated_contacts writes them (contact<n>@example.test,
# First<n>, Last<n>) and the CSV's header: none of it may appear in a history (payloads carry IDs only).
DEMO_CONTACT_DATA = re.compile(rb"contact\d+@|@example\.test|\b(?:First|Last)\d+\b|email,first_name")


@dataclass(frozen=True)
class Recorded:
    """One history: where it is, and whether this run wrote it (False: the file existed and was kept)."""

    path: Path
    written: bool


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def history_text(history: WorkflowHistory) -> bytes:
    """Every field of a history as text; payload bytes appear as they are stored (not base64)."""
    return text_format.MessageToString(History(events=history.events), as_utf8=True).encode()


def _keep(history: WorkflowHistory, path: Path) -> Recorded:
    leak = DEMO_CONTACT_DATA.search(history_text(history))
    if leak:
        raise ValueError(f"{path.name}: the history holds contact data ({leak.group(0)!r}); not written")
    if path.exists():
        return Recorded(path, written=False)
    path.write_text(history.to_json())
    return Recorded(path, written=True)


def _name(base: str, tag: str | None) -> str:
    return f"{base}-{slug(tag)}" if tag else base


async def _wake_up_ids(admin_url: str, job_id: object) -> list[str]:
    """The workflow IDs of a job's wake-ups, oldest first: one per outbox message (its workflow ID)."""
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT message_id FROM outbox WHERE job_id = %(j)s ORDER BY created_at, message_id",
            {"j": job_id},
        )
        return [export_workflow_id(job_id, row[0]) for row in await cur.fetchall()]  # type: ignore[arg-type]


async def _record_export_histories(
    client: Client, context: DemoContext, out: Path, tag: str | None
) -> list[Recorded]:
    recorded = []
    for scenario in context.scenarios:
        assert scenario.job_id is not None
        workflow_ids = await _wake_up_ids(context.admin_url, scenario.job_id)
        assert workflow_ids, f"{scenario.title}: the export has no wake-up"
        for number, workflow_id in enumerate(workflow_ids, start=1):
            handle = client.get_workflow_handle_for(ExportWorkflow.run, workflow_id)
            result = await asyncio.wait_for(handle.result(), WAIT)  # complete: the whole history
            name = f"export-{slug(scenario.title)}"
            if len(workflow_ids) > 1:
                name += f"-wake-up-{number}-{slug(result.outcome.value)}"
            history = await handle.fetch_history()
            recorded.append(_keep(history, out / f"{_name(name, tag)}.json"))
    return recorded


async def _record_schedule_run(
    client: Client, schedule_id: str, name: str, out: Path, tag: str | None
) -> Recorded:
    handle = client.get_schedule_handle(schedule_id)

    async def started() -> list[str]:
        recent = (await handle.describe()).info.recent_actions
        return [
            a.action.workflow_id for a in recent if isinstance(a.action, ScheduleActionExecutionStartWorkflow)
        ]

    before = set(await started())
    await handle.trigger()
    for _ in range(600):
        fresh = [workflow_id for workflow_id in await started() if workflow_id not in before]
        if fresh:
            workflow = client.get_workflow_handle(fresh[-1])
            if (await workflow.describe()).status == WorkflowExecutionStatus.COMPLETED:
                return _keep(await workflow.fetch_history(), out / f"{_name(name, tag)}.json")
        await asyncio.sleep(0.1)
    raise TimeoutError(f"schedule {schedule_id} produced no completed run")


async def record(out: Path, *, tag: str | None = None) -> list[Recorded]:
    """Run the demo and keep every history it and the two Schedules produce in ``out``; an existing
    file is kept, never overwritten (``tag`` names a new set written beside the old one)."""
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    recorded: list[Recorded] = []

    async def inspect(context: DemoContext) -> None:
        client = await connect_client(Settings(temporal_address=context.temporal_address))
        recorded.extend(await _record_export_histories(client, context, out, tag))
        recorded.append(await _record_schedule_run(client, RECOVERY_SCHEDULE_ID, "recovery", out, tag))
        recorded.append(await _record_schedule_run(client, SWEEPER_SCHEDULE_ID, "sweeper", out, tag))

    await run_demo(Settings(), contacts=500, out=io.StringIO(), inspect=inspect, default_ports=False)
    return recorded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HISTORIES)
    parser.add_argument(
        "--tag", help="write every history as <name>-<tag>.json, beside the old ones (after a patched change)"
    )
    args = parser.parse_args()
    for recorded in asyncio.run(record(args.out, tag=args.tag)):
        print(f"{'wrote' if recorded.written else 'kept '} {recorded.path}")


if __name__ == "__main__":
    main()
