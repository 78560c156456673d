"""Record the workflow histories the replay tests replay: ``python -m tests.replay.record``.

It runs the demo (``demo.run_demo``: embedded PostgreSQL, the Temporal dev server, the local SFTP partner, the
real worker and API), so the histories are those of the incident's three timings and a plain delivery; then it
triggers the recovery and sweeper Schedules once each and records their runs too. Each history is written to
``tests/replay/histories/<name>.json``. Record again after a deliberate change of workflow code that is
guarded by ``workflow.patched`` (keep the old files: a history recorded before the patch must still replay).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import re
from pathlib import Path

from temporalio.client import Client, WorkflowExecutionStatus

from demo import DemoContext, run_demo
from runtime.schedules import RECOVERY_SCHEDULE_ID, SWEEPER_SCHEDULE_ID
from service.temporal import connect_client
from settings import Settings

HISTORIES = Path(__file__).parent / "histories"


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


async def _record_export_histories(client: Client, context: DemoContext, out: Path) -> list[Path]:
    written = []
    for scenario in context.scenarios:
        async for execution in client.list_workflows(
            f"WorkflowType = 'ExportWorkflow' AND ExportJobId = '{scenario.job_id}'"
        ):
            history = await client.get_workflow_handle(execution.id, run_id=execution.run_id).fetch_history()
            path = out / f"export-{slug(scenario.title)}.json"
            path.write_text(history.to_json())
            written.append(path)
            break
    return written


async def _record_schedule_run(client: Client, schedule_id: str, name: str, out: Path) -> Path:
    handle = client.get_schedule_handle(schedule_id)
    before = {a.action.workflow_id for a in (await handle.describe()).info.recent_actions}  # type: ignore[union-attr]
    await handle.trigger()
    for _ in range(600):
        recent = (await handle.describe()).info.recent_actions
        fresh = [a for a in recent if a.action.workflow_id not in before]  # type: ignore[union-attr]
        if fresh:
            workflow = client.get_workflow_handle(fresh[-1].action.workflow_id)  # type: ignore[union-attr]
            if (await workflow.describe()).status == WorkflowExecutionStatus.COMPLETED:
                path = out / f"{name}.json"
                path.write_text((await workflow.fetch_history()).to_json())
                return path
        await asyncio.sleep(0.1)
    raise TimeoutError(f"schedule {schedule_id} produced no completed run")


async def record(out: Path) -> list[Path]:
    """Run the demo and write every history it and the two Schedules produce into ``out``."""
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    written: list[Path] = []

    async def inspect(context: DemoContext) -> None:
        client = await connect_client(Settings(temporal_address=context.temporal_address))
        written.extend(await _record_export_histories(client, context, out))
        written.append(await _record_schedule_run(client, RECOVERY_SCHEDULE_ID, "recovery", out))
        written.append(await _record_schedule_run(client, SWEEPER_SCHEDULE_ID, "sweeper", out))

    await run_demo(Settings(), contacts=500, out=io.StringIO(), inspect=inspect, default_ports=False)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HISTORIES)
    args = parser.parse_args()
    for path in asyncio.run(record(args.out)):
        print(path)


if __name__ == "__main__":
    main()
