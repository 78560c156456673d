"""The recovery and sweeper Schedules, created idempotently by every worker at start."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.common import Priority
from temporalio.service import RPCError, RPCStatusCode

from settings import Settings
from workflows.models import RecoveryInput, SweepInput
from workflows.recovery import RecoveryWorkflow
from workflows.sweeper import SweeperWorkflow

log = logging.getLogger(__name__)

RECOVERY_SCHEDULE_ID = "fenced-exports-recovery"
SWEEPER_SCHEDULE_ID = "fenced-exports-sweeper"
# Recovery's runs, and the activities they start (they inherit it), go ahead of every export's tasks on the
# shared queue (Temporal's task queue priority: 1 is first, 3 the default). Under a backlog of export workflow
# tasks a run waited minutes between its batches while leases stayed expired; the sweeper keeps the default,
# since re-waking a job that is only waiting in that backlog adds to it.
RECOVERY_PRIORITY = Priority(priority_key=1)


def _periodic(action: ScheduleActionStartWorkflow, every_seconds: float) -> Schedule:
    """A workflow started every ``every_seconds``; a run still going when the next is due is skipped."""
    return Schedule(
        action=action,
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(seconds=every_seconds))]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )


def recovery_schedule(settings: Settings) -> Schedule:
    """Recovery every ``recovery_every_seconds`` on the shared queue, ahead of the exports' tasks there."""
    return _periodic(
        ScheduleActionStartWorkflow(
            RecoveryWorkflow.run,
            RecoveryInput(
                batch=settings.recovery_batch, heartbeat_seconds=settings.recovery_heartbeat_seconds
            ),
            id=RECOVERY_SCHEDULE_ID,
            task_queue=settings.task_queue,
            execution_timeout=timedelta(hours=1),
            static_summary="Recovery: take over expired export leases",
            priority=RECOVERY_PRIORITY,
        ),
        settings.recovery_every_seconds,
    )


def sweeper_schedule(settings: Settings) -> Schedule:
    """The sweeper every ``sweep_every_seconds``; thresholds come from each worker's settings."""
    return _periodic(
        ScheduleActionStartWorkflow(
            SweeperWorkflow.run,
            SweepInput(),
            id=SWEEPER_SCHEDULE_ID,
            task_queue=settings.task_queue,
            execution_timeout=timedelta(hours=1),
            static_summary="Sweeper: re-wake stale queued exports",
        ),
        settings.sweep_every_seconds,
    )


async def ensure_schedules(client: Client, settings: Settings) -> None:
    """Create the recovery and sweeper Schedules, or bring existing ones to this worker's settings.

    Idempotent: any number of workers may call it at start. An existing schedule keeps its state (paused
    or not, with its note) and gets this worker's action, interval and overlap policy. A server without
    Schedules (the time-skipping test server) is logged and tolerated.
    """
    try:
        for schedule_id, schedule in (
            (RECOVERY_SCHEDULE_ID, recovery_schedule(settings)),
            (SWEEPER_SCHEDULE_ID, sweeper_schedule(settings)),
        ):
            try:
                await client.create_schedule(schedule_id, schedule)
                log.info("schedule %s created", schedule_id)
            except ScheduleAlreadyRunningError:
                await client.get_schedule_handle(schedule_id).update(_keep_state_update(schedule))
                log.info("schedule %s exists; updated to this worker's settings", schedule_id)
    except RPCError as exc:
        if exc.status != RPCStatusCode.UNIMPLEMENTED:
            raise
        log.warning("this Temporal server has no Schedules; recovery and the sweeper will not run from here")


def _keep_state_update(schedule: Schedule) -> Callable[[ScheduleUpdateInput], ScheduleUpdate]:
    def update(current: ScheduleUpdateInput) -> ScheduleUpdate:
        existing = current.description.schedule
        return ScheduleUpdate(
            schedule=Schedule(
                action=schedule.action, spec=schedule.spec, policy=schedule.policy, state=existing.state
            )
        )

    return update


__all__: list[Any] = [
    "RECOVERY_PRIORITY",
    "RECOVERY_SCHEDULE_ID",
    "SWEEPER_SCHEDULE_ID",
    "ensure_schedules",
    "recovery_schedule",
    "sweeper_schedule",
]
