"""The Temporal Schedule of a recurring export, built from its PostgreSQL row (the source of truth).

Pure data: the service applies it after a definition commits, and a worker at start for every row. The
Schedule's overlap policy lets every firing start (``ALLOW_ALL``): whether the previous export is still live
is PostgreSQL's to decide, and a firing it skips is recorded there with its reason, which a firing Temporal
skipped would not be. ``catchup_window`` bounds how far back missed times fire after an outage; PostgreSQL
then runs at most ``EXPORTS_RECURRING_CATCHUP_FIRINGS`` of them. The note carries the row's version, so an
older definition never overwrites a newer one.
"""

from __future__ import annotations

import re
from datetime import timedelta

from temporalio.client import (
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
)

from domain.recurring import RecurringExport
from workflows.models import RecurringFireInput
from workflows.recurring import RecurringFireWorkflow

_NOTE_VERSION = re.compile(r"^recurring export v(\d+)")


def schedule_note(row: RecurringExport) -> str:
    """The Schedule's note: the row's version, and why it is paused."""
    note = f"recurring export v{row.version}"
    return f"{note}: paused ({row.paused_reason})" if row.paused and row.paused_reason else note


def noted_version(note: str | None) -> int | None:
    """The row version a Schedule's note says it was built from, if any."""
    found = _NOTE_VERSION.match(note or "")
    return int(found.group(1)) if found else None


def recurring_schedule(row: RecurringExport, *, task_queue: str, catchup_window_seconds: float) -> Schedule:
    """The Schedule whose action fires ``row`` (``RecurringFireWorkflow`` on the shared queue)."""
    spec = ScheduleSpec(
        cron_expressions=[row.cron] if row.cron else [],
        intervals=(
            [ScheduleIntervalSpec(every=timedelta(seconds=row.interval_seconds))]
            if row.interval_seconds
            else []
        ),
        time_zone_name=row.time_zone,
        start_at=row.starts_at,
        end_at=row.ends_at,
    )
    return Schedule(
        action=ScheduleActionStartWorkflow(
            RecurringFireWorkflow.run,
            RecurringFireInput(tenant_id=row.tenant_id, recurring_export_id=row.id),
            id=row.schedule_id,
            task_queue=task_queue,
            execution_timeout=timedelta(hours=2),
            static_summary=f"Recurring export {row.id}",
        ),
        spec=spec,
        policy=SchedulePolicy(
            overlap=ScheduleOverlapPolicy.ALLOW_ALL,
            catchup_window=timedelta(seconds=catchup_window_seconds),
        ),
        state=ScheduleState(paused=row.paused, note=schedule_note(row)),
    )
