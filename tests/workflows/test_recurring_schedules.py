"""Recurring exports on real Temporal Schedules (the CLI dev server: the time-skipping server has none), with
a real PostgreSQL: each recurring export is a Schedule whose action (RecurringFireWorkflow) creates the export
through the same idempotent create, keyed by the Schedule's ID and the nominal fire time, and records the
firing in PostgreSQL. Duplicate firings are real ones: Temporal starts a second run for a nominal time it
already fired when that time is backfilled again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.client import Client, ScheduleActionStartWorkflow, ScheduleBackfill, ScheduleOverlapPolicy
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from activities.recurring import RecurringActivities
from domain.recurring import SkipReason, firing_key, schedule_id_for
from service.auth import Caller
from service.recurring import DefineRecurringExport, PauseRecurringExport, RecurringExports
from service.recurring_schedules import ScheduleState, ScheduleSync
from settings import Settings
from tests.support.eventually import eventually
from workflows.models import RecurringFireResult
from workflows.recurring import RecurringFireWorkflow

WAIT = 60  # a bound on waiting for an outcome, never a delay that decides one
ADMIN = "ada.admin"


@pytest.fixture(scope="module")
def task_queue() -> str:
    return f"recurring-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
async def firing_worker(dev_env, api_store, task_queue) -> AsyncIterator[Client]:
    """RecurringFireWorkflow and its activity over the exports_api store, on this module's queue."""
    activities = RecurringActivities(api_store, Settings())
    async with Worker(
        dev_env.client,
        task_queue=task_queue,
        workflows=[RecurringFireWorkflow],
        activities=activities.activities(),
    ):
        yield dev_env.client


@pytest.fixture(scope="module")
def sync(dev_env, task_queue) -> ScheduleSync:
    return ScheduleSync(dev_env.client, task_queue=task_queue, catchup_window_seconds=3600)


async def define(factory, api_store, sync, **timing):
    tenant = await factory.tenant()
    await factory.principal(tenant, ADMIN, role="admin")
    destination = await factory.destination(tenant, name="partner-new")
    ops = RecurringExports(api_store, sync)
    caller = Caller(tenant_id=tenant, principal=ADMIN, role="admin")
    body = DefineRecurringExport(
        destination_id=destination,
        list_name="newsletter",
        time_zone="Europe/Berlin",
        **(timing or {"cron": "0 3 * * *"}),
    )
    answer = await ops.create(caller, body)
    assert answer.body["schedule"] == ScheduleState.CREATED, answer.body
    return ops, caller, uuid.UUID(answer.body["recurring_export"]["id"])


async def closed_runs(client: Client, schedule_id: str, expected: int) -> list:
    """Every run the Schedule started, once ``expected`` of them have closed."""

    async def runs():
        found = [w async for w in client.list_workflows(f'TemporalScheduledById = "{schedule_id}"')]
        closed = [w for w in found if w.close_time is not None]
        return found if len(closed) >= expected else None

    return await eventually(runs, f"{expected} closed runs of {schedule_id}", within=WAIT, interval=0.2)


async def exports_of(factory, tenant_id) -> list[dict]:
    return await factory.admin(
        "SELECT j.id, j.status, k.key FROM export_jobs j LEFT JOIN idempotency_keys k ON k.job_id = j.id"
        " WHERE j.tenant_id = %(t)s",
        {"t": tenant_id},
    )


def past_berlin_3am(days_ago: int) -> datetime:
    """A nominal time of '0 3 * * *' in Europe/Berlin, in UTC (02:00 in winter)."""
    from zoneinfo import ZoneInfo

    day = datetime.now(ZoneInfo("Europe/Berlin")).date() - timedelta(days=days_ago)
    return datetime(day.year, day.month, day.day, 3, tzinfo=ZoneInfo("Europe/Berlin")).astimezone(UTC)


def around(moment: datetime) -> ScheduleBackfill:
    return ScheduleBackfill(
        start_at=moment - timedelta(minutes=1),
        end_at=moment + timedelta(minutes=1),
        overlap=ScheduleOverlapPolicy.ALLOW_ALL,
    )


async def test_a_duplicate_firing_of_one_nominal_time_makes_one_export(
    firing_worker, factory, api_store, sync
):
    ops, caller, recurring_id = await define(factory, api_store, sync)
    schedule = firing_worker.get_schedule_handle(schedule_id_for(recurring_id))
    nominal = past_berlin_3am(days_ago=2)

    await schedule.backfill(around(nominal))
    [first] = await closed_runs(firing_worker, schedule.id, 1)
    await schedule.backfill(around(nominal))  # Temporal fires the same nominal time again: a second run
    runs = await closed_runs(firing_worker, schedule.id, 2)

    assert {w.id for w in runs} == {first.id} and len({w.run_id for w in runs}) == 2
    results = sorted(
        [
            (
                await firing_worker.get_workflow_handle(
                    w.id, run_id=w.run_id, result_type=RecurringFireResult
                ).result()
            ).outcome
            for w in runs
        ]
    )
    assert results == ["created", "duplicate"]
    [export] = await exports_of(factory, caller.tenant_id)
    assert export["key"] == firing_key(recurring_id, nominal)
    firings = await api_store.recurring_export_firings(caller.tenant_id, recurring_id)
    assert [(f.nominal_time, f.outcome.value, f.job_id) for f in firings] == [
        (nominal, "created", export["id"])
    ]


async def test_a_firing_under_a_paused_destination_is_skipped_with_its_reason(
    firing_worker, factory, api_store, sync
):
    ops, caller, recurring_id = await define(factory, api_store, sync)
    [destination] = (await api_store.tenant_destinations(caller.tenant_id))[:1]
    await factory.switch(caller.tenant_id, destination.id, enabled=False, reason="partner maintenance")
    schedule = firing_worker.get_schedule_handle(schedule_id_for(recurring_id))

    await schedule.trigger()
    await closed_runs(firing_worker, schedule.id, 1)

    [firing] = await api_store.recurring_export_firings(caller.tenant_id, recurring_id)
    assert (firing.outcome.value, firing.reason) == ("skipped", SkipReason.DELIVERIES_PAUSED)
    assert (
        firing.message
        == "Skipped: deliveries to partner-new are paused (partner maintenance); nothing was queued."
    )
    assert await exports_of(factory, caller.tenant_id) == []
    shown = await ops.show(caller, recurring_id)
    assert shown.body["firings"][0]["reason"] == "deliveries_paused"


async def test_a_firing_while_its_previous_export_is_live_is_skipped_as_an_overlap(
    firing_worker, factory, api_store, sync
):
    ops, caller, recurring_id = await define(factory, api_store, sync)
    schedule = firing_worker.get_schedule_handle(schedule_id_for(recurring_id))
    earlier, later = past_berlin_3am(days_ago=3), past_berlin_3am(days_ago=2)

    await schedule.backfill(around(earlier))
    await closed_runs(firing_worker, schedule.id, 1)
    await schedule.backfill(around(later))
    await closed_runs(firing_worker, schedule.id, 2)

    firings = {
        f.nominal_time: f for f in await api_store.recurring_export_firings(caller.tenant_id, recurring_id)
    }
    created = firings[earlier]
    assert created.outcome.value == "created"
    assert (firings[later].reason, firings[later].job_id) == (SkipReason.OVERLAP, created.job_id)
    assert len(await exports_of(factory, caller.tenant_id)) == 1


async def test_after_an_outage_at_most_one_missed_firing_runs(firing_worker, factory, api_store, sync):
    ops, caller, recurring_id = await define(factory, api_store, sync, cron="0 * * * *")
    schedule = firing_worker.get_schedule_handle(schedule_id_for(recurring_id))
    top = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    # Four hourly times missed while nothing ran: Temporal fires all of them now, late.
    await schedule.backfill(
        ScheduleBackfill(
            start_at=top - timedelta(hours=4, minutes=30),
            end_at=top - timedelta(minutes=30),
            overlap=ScheduleOverlapPolicy.ALLOW_ALL,
        )
    )
    await closed_runs(firing_worker, schedule.id, 4)

    async def four_recorded():
        found = await api_store.recurring_export_firings(caller.tenant_id, recurring_id)
        return found if len(found) >= 4 else None

    firings = await eventually(four_recorded, "four firings recorded", within=WAIT, interval=0.2)
    assert len(firings) == 4, [(f.nominal_time, f.outcome, f.reason) for f in firings]
    assert all(f.late for f in firings), [(f.nominal_time, f.recorded_at, f.late) for f in firings]
    assert sum(f.outcome.value == "created" for f in firings) == 1
    assert {f.reason for f in firings if f.reason} <= {SkipReason.OVERLAP, SkipReason.CATCH_UP}
    assert len(await exports_of(factory, caller.tenant_id)) == 1
    described = await schedule.describe()
    assert described.schedule.policy.catchup_window == timedelta(hours=1)


async def test_pause_and_delete_reach_the_schedule_and_leave_created_exports_untouched(
    firing_worker, factory, api_store, sync
):
    ops, caller, recurring_id = await define(factory, api_store, sync)
    schedule = firing_worker.get_schedule_handle(schedule_id_for(recurring_id))
    await schedule.trigger()
    await closed_runs(firing_worker, schedule.id, 1)
    [export] = await exports_of(factory, caller.tenant_id)
    before = await factory.job(export["id"])

    paused = await ops.pause(caller, recurring_id, PauseRecurringExport(reason="holiday"))
    assert paused.body["schedule"] == "updated"
    state = (await schedule.describe()).schedule.state
    assert state.paused and state.note == "recurring export v2: paused (holiday)"
    assert paused.body["exports_untouched"] == {"total": 1, "live": 1, "by_status": {"Queued": 1}}

    # A firing that reaches PostgreSQL anyway (a backfill runs on a paused Schedule) is recorded skipped.
    missed = past_berlin_3am(days_ago=4)
    await schedule.backfill(around(missed))
    await closed_runs(firing_worker, schedule.id, 2)
    firings = {
        f.nominal_time: f for f in await api_store.recurring_export_firings(caller.tenant_id, recurring_id)
    }
    assert firings[missed].reason == SkipReason.RECURRING_PAUSED

    deleted = await ops.delete(caller, recurring_id)
    assert deleted.body["schedule"] == "deleted"
    assert "The 1 export(s) it already created are untouched" in deleted.body["message"]
    with pytest.raises(RPCError) as gone:
        await schedule.describe()
    assert gone.value.status == RPCStatusCode.NOT_FOUND
    assert await factory.job(export["id"]) == before


async def test_a_worker_at_start_recreates_missing_schedules_and_removes_deleted_ones(
    firing_worker, factory, api_store, sync
):
    ops, caller, kept = await define(factory, api_store, sync)
    _, other, removed = await define(factory, api_store, sync)
    await firing_worker.get_schedule_handle(schedule_id_for(kept)).delete()  # lost from Temporal
    # deleted in PostgreSQL while Temporal did not answer: its Schedule is still there
    await api_store.delete_recurring_export(
        tenant_id=other.tenant_id, recurring_export_id=removed, deleted_by=ADMIN
    )

    counts = await sync.reconcile(api_store)

    assert counts[ScheduleState.CREATED] >= 1 and counts[ScheduleState.DELETED] >= 1
    described = await firing_worker.get_schedule_handle(schedule_id_for(kept)).describe()
    assert described.schedule.spec.time_zone_name == "Europe/Berlin" and described.schedule.spec.calendars
    assert isinstance(described.schedule.action, ScheduleActionStartWorkflow)
    assert described.schedule.action.workflow == "RecurringFireWorkflow"
    with pytest.raises(RPCError):
        await firing_worker.get_schedule_handle(schedule_id_for(removed)).describe()


async def test_an_older_definition_never_overwrites_a_newer_schedule(firing_worker, factory, api_store, sync):
    ops, caller, recurring_id = await define(factory, api_store, sync)
    stale = await api_store.get_recurring_export(caller.tenant_id, recurring_id)
    await ops.pause(caller, recurring_id, PauseRecurringExport(reason="newer"))

    assert stale is not None and await sync.apply(stale) == ScheduleState.UNCHANGED
    assert (
        await firing_worker.get_schedule_handle(schedule_id_for(recurring_id)).describe()
    ).schedule.state.paused
