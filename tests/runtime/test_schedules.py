"""The recovery and sweeper Schedules, and finding an export in Temporal's visibility store: both exist
only on the Temporal CLI dev server (the time-skipping server has no Schedules and no list queries), so
these tests run there, with a real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.client import (
    Client,
    ScheduleActionExecutionStartWorkflow,
    ScheduleActionResult,
    ScheduleActionStartWorkflow,
    ScheduleHandle,
    ScheduleOverlapPolicy,
)
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from activities.export import ExportActivities
from activities.recovery import RecoveryActivities
from activities.sweeper import SweeperActivities
from domain.models import JobStatus
from partner.kinds import partner_for
from runtime.schedules import RECOVERY_PRIORITY, RECOVERY_SCHEDULE_ID, SWEEPER_SCHEDULE_ID, ensure_schedules
from tests.support.eventually import eventually
from worker import run_worker
from workflows.recovery import RecoveryWorkflow
from workflows.sweeper import SweeperWorkflow

WAIT = 30  # a bound on waiting for an outcome, never a delay that decides one


@pytest.fixture(scope="module")
def dev_client(dev_env) -> Client:
    return dev_env.client


async def triggered_run(handle: ScheduleHandle) -> ScheduleActionExecutionStartWorkflow:
    """Trigger the schedule now and wait for the run it started.

    The session's dev server is shared: a worker of an earlier module (its own task queue, gone now) may have
    left a run of this schedule open that nobody polls, and the schedule's SKIP would skip the trigger behind
    it. This run is started whatever is open (ALLOW_ALL); what it does is for the caller to assert.
    """
    before = (await handle.describe()).info.num_actions
    await handle.trigger(overlap=ScheduleOverlapPolicy.ALLOW_ALL)

    async def a_new_action() -> ScheduleActionResult | None:
        info = (await handle.describe()).info
        return info.recent_actions[-1] if info.num_actions > before and info.recent_actions else None

    found = await eventually(a_new_action, "the triggered run", within=WAIT, interval=0.2)
    assert isinstance(found.action, ScheduleActionExecutionStartWorkflow)
    return found.action


async def test_ensure_schedules_creates_both_idempotently_with_overlap_skip(dev_client, settings):
    await ensure_schedules(dev_client, settings)
    await ensure_schedules(dev_client, settings)  # a second worker starting: no error, no duplicate

    ids = [s.id async for s in await dev_client.list_schedules()]
    for schedule_id, workflow_type, every in (
        (RECOVERY_SCHEDULE_ID, "RecoveryWorkflow", settings.recovery_every_seconds),
        (SWEEPER_SCHEDULE_ID, "SweeperWorkflow", settings.sweep_every_seconds),
    ):
        assert ids.count(schedule_id) <= 1
        schedule = (await dev_client.get_schedule_handle(schedule_id).describe()).schedule
        action = schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        assert (action.workflow, action.task_queue) == (workflow_type, settings.task_queue)
        assert schedule.spec.intervals[0].every == timedelta(seconds=every)
        assert schedule.policy.overlap == ScheduleOverlapPolicy.SKIP


async def test_an_existing_schedule_is_updated_and_keeps_its_paused_state(dev_client, settings):
    await ensure_schedules(dev_client, settings)
    handle = dev_client.get_schedule_handle(RECOVERY_SCHEDULE_ID)
    await handle.pause(note="operator: investigating")
    try:
        changed = settings.model_copy(update={"recovery_every_seconds": 45.0})
        await ensure_schedules(dev_client, changed)

        described = await handle.describe()
        assert described.schedule.spec.intervals[0].every == timedelta(seconds=45)
        assert described.schedule.state.paused
    finally:
        await handle.unpause()
        await ensure_schedules(dev_client, settings)


async def test_the_recovery_schedule_runs_recovery_on_a_worker(
    dev_client, settings, worker_store, recovery_store, factory
):
    from temporalio.worker import Worker

    await ensure_schedules(dev_client, settings)
    job, _ = await factory.running()
    await factory.expire_lease(job.id)
    recovery = RecoveryActivities(recovery_store, settings, partners=partner_for)
    sweeper = SweeperActivities(worker_store, settings)
    async with Worker(
        dev_client,
        task_queue=settings.task_queue,
        workflows=[RecoveryWorkflow, SweeperWorkflow],
        activities=[*recovery.activities(), *sweeper.activities()],
    ):
        handle = dev_client.get_schedule_handle(RECOVERY_SCHEDULE_ID)
        started = await triggered_run(handle)
        run = dev_client.get_workflow_handle(started.workflow_id)
        await asyncio.wait_for(run.result(), WAIT)
        # The schedule's own interval can fire beside the trigger and take the job first (CI saw it):
        # either way the requeue is by a run of this schedule.
        runs = {a.action.workflow_id for a in (await handle.describe()).info.recent_actions}

    requeued = await factory.job(job.id)
    assert requeued.status == JobStatus.QUEUED
    event = (await factory.worker.job_events(job.id))[-1]
    assert event.kind == "RequeuedByRecovery"
    assert event.observed_by.startswith("recovery:")
    assert event.observed_by.removeprefix("recovery:").rsplit("/", 1)[0] in runs


async def test_an_exports_workflow_is_found_by_its_export_job_id(dev_client, settings, factory):
    host = settings.model_copy(
        update={"task_queue": f"exports-{uuid.uuid4().hex[:8]}", "shutdown_grace_seconds": 1}
    )
    tenant = await factory.tenant()
    job = await factory.queued(tenant_id=tenant)
    held, release = asyncio.Event(), asyncio.Event()

    def hold_before_cutoff_2(activities: ExportActivities) -> None:
        async def before_authorize(job_id: uuid.UUID) -> None:
            if job_id == job.id:
                held.set()
                await release.wait()  # never delivered: the host stops and the lease decides

        activities.seams.before_authorize = before_authorize

    stop, ready = asyncio.Event(), asyncio.Event()
    host_task = asyncio.create_task(
        run_worker(host, stop=stop, client=dev_client, ready=ready, export_hooks=hold_before_cutoff_2)
    )
    try:
        await asyncio.wait_for(ready.wait(), WAIT)
        await asyncio.wait_for(held.wait(), WAIT)  # claimed, built, search attributes set

        async def by_job_id():
            found = [wf async for wf in dev_client.list_workflows(f'ExportJobId = "{job.id}"')]
            return found or None

        [found] = await eventually(
            by_job_id, "the export's workflow by ExportJobId", within=WAIT, interval=0.2
        )
        assert found.id.startswith(f"export-{job.id}-")
        by_tenant = [wf.id async for wf in dev_client.list_workflows(f'ExportTenantId = "{tenant}"')]
        assert found.id in by_tenant
        row = await factory.job(job.id)
        assert row.workflow_id == found.id  # the API finds the same workflow from the row
    finally:
        stop.set()
        release.set()  # cutoff 2 is never skipped: it runs, and the host stops
        await asyncio.wait_for(host_task, WAIT)


@activity.defn(name="backlog.note")
async def _note(name: str) -> None:
    pass


class _StartOrder(Interceptor):
    """Records the type of every activity this worker starts, in the order it starts them."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        order = self

        class Recording(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> Any:
                order.started.append(activity.info().activity_type)
                return await super().execute_activity(input)

        return Recording(next)


@workflow.defn(name="BacklogWorkflow", sandboxed=False)
class _Backlog:
    """An export's stand-in: one workflow task, one activity, one more workflow task."""

    @workflow.run
    async def run(self, name: str) -> None:
        await workflow.execute_activity(_note, name, start_to_close_timeout=timedelta(seconds=30))


async def test_a_recovery_run_goes_ahead_of_a_backlog_of_export_tasks_on_the_shared_queue(
    dev_client, settings, worker_store, recovery_store
):
    """Forty workflows wait on the shared queue with no worker, then recovery's schedule fires; one worker taking
    one task at a time from the shared queue (no sticky cache) then starts recovery's first batch ahead of the
    backlog's activities (its priority is 1, the backlog's the default 3, and its activities inherit it). Without the priority the batch waits behind
    all forty workflow tasks and most of their activities: under the soak's load a run waited minutes between
    its batches while leases stayed expired."""
    from temporalio.worker import Worker

    queue = f"backlog-{uuid.uuid4()}"
    shared = settings.model_copy(update={"task_queue": queue})
    order = _StartOrder()
    try:
        await ensure_schedules(dev_client, shared)
        action = (await dev_client.get_schedule_handle(RECOVERY_SCHEDULE_ID).describe()).schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow) and action.priority == RECOVERY_PRIORITY
        for i in range(40):
            await dev_client.start_workflow(_Backlog.run, f"b{i}", id=f"{queue}-b{i}", task_queue=queue)
        triggered = await triggered_run(dev_client.get_schedule_handle(RECOVERY_SCHEDULE_ID))
        recovery = RecoveryActivities(recovery_store, shared, partners=partner_for)
        sweeper = SweeperActivities(worker_store, shared)
        async with Worker(
            dev_client,
            task_queue=queue,
            workflows=[RecoveryWorkflow, SweeperWorkflow, _Backlog],
            activities=[*recovery.activities(), *sweeper.activities(), _note],
            interceptors=[order],
            max_concurrent_workflow_tasks=1,
            max_concurrent_workflow_task_polls=1,
            max_cached_workflows=0,
            max_concurrent_activities=1,
        ):
            await asyncio.wait_for(dev_client.get_workflow_handle(triggered.workflow_id).result(), WAIT)
            for i in range(40):
                await asyncio.wait_for(dev_client.get_workflow_handle(f"{queue}-b{i}").result(), WAIT)
    finally:
        await ensure_schedules(dev_client, settings)
    first_batch = order.started.index("recover_expired_leases")
    # measured on the dev server: 0 to 4 of the backlog's activities before the batch with the priority, 25 to 33
    # without it
    assert order.started[:first_batch].count("backlog.note") < 10, order.started[: first_batch + 1]
    assert order.started.count("backlog.note") == 40  # the backlog ran too, after it
