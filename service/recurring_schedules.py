"""Bringing recurring exports' Temporal Schedules to their PostgreSQL rows.

The row is the source of truth: every change commits there first, then :meth:`ScheduleSync.apply` creates,
updates, pauses or deletes the Schedule. If Temporal does not answer, the change stays committed and the
answer says the Schedule is pending; a worker at start calls :meth:`ScheduleSync.reconcile` for every row
(re-creating missing Schedules, deleting those of deleted rows). A firing that reaches PostgreSQL under a
paused or deleted row is recorded skipped, so a stale Schedule never creates what the row forbids.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from enum import StrEnum

from temporalio.client import Client, ScheduleAlreadyRunningError, ScheduleUpdate, ScheduleUpdateInput
from temporalio.service import RPCError, RPCStatusCode

from db.stores.recurring import RecurringStatements
from domain.recurring import RecurringExport
from service.temporal import TemporalConnectError
from workflows.recurring_schedule import noted_version, recurring_schedule

log = logging.getLogger(__name__)

RECONCILE_BATCH = 500
CONNECT_SECONDS = 10.0
ClientSource = Callable[[], Awaitable[Client]]  # connects on first use (the API's stop signaller's client)


class ScheduleState(StrEnum):
    """What became of a row's Schedule."""

    CREATED = "created"
    UPDATED = "updated"
    DELETED = "deleted"
    UNCHANGED = "unchanged"  # it already matched a newer version of the row
    PENDING = "pending"  # Temporal did not answer: a worker brings it to the row at its next start


class ScheduleSync:
    """Applies rows to Schedules over one Temporal client (``None``: nothing is applied, all pending)."""

    def __init__(
        self, client: Client | ClientSource | None, *, task_queue: str, catchup_window_seconds: float
    ) -> None:
        self.client = client
        self.task_queue = task_queue
        self.catchup_window_seconds = catchup_window_seconds

    async def _client(self) -> Client | None:
        if self.client is None or isinstance(self.client, Client):
            return self.client
        return await asyncio.wait_for(self.client(), CONNECT_SECONDS)

    async def apply(self, row: RecurringExport) -> ScheduleState:
        """Bring ``row``'s Schedule to it; PENDING when Temporal did not answer (logged, never raised)."""
        try:
            client = await self._client()
            if client is None:
                return ScheduleState.PENDING
            return await self._apply(client, row)
        except (RPCError, RuntimeError, TimeoutError, OSError, TemporalConnectError) as exc:
            log.warning("schedule %s not brought to v%d: %s", row.schedule_id, row.version, exc)
            return ScheduleState.PENDING

    async def _apply(self, client: Client, row: RecurringExport) -> ScheduleState:
        handle = client.get_schedule_handle(row.schedule_id)
        if row.deleted_at is not None:
            try:
                await handle.delete()
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
            return ScheduleState.DELETED
        schedule = recurring_schedule(
            row, task_queue=self.task_queue, catchup_window_seconds=self.catchup_window_seconds
        )
        try:
            await client.create_schedule(row.schedule_id, schedule)
            return ScheduleState.CREATED
        except ScheduleAlreadyRunningError:
            pass
        outcome = ScheduleState.UPDATED

        def update(current: ScheduleUpdateInput) -> ScheduleUpdate | None:
            nonlocal outcome
            # Updates of one Schedule are conditional on what was read: an older row never wins.
            seen = noted_version(current.description.schedule.state.note)
            if seen is not None and seen > row.version:
                outcome = ScheduleState.UNCHANGED
                return None
            return ScheduleUpdate(schedule=schedule)

        await handle.update(update)
        return outcome

    async def reconcile(self, store: RecurringStatements) -> dict[ScheduleState, int]:
        """Bring every recurring export's Schedule to its row, in batches (a worker at start)."""
        counts: dict[ScheduleState, int] = dict.fromkeys(ScheduleState, 0)
        after = uuid.UUID(int=0)
        while True:
            rows = await store.recurring_exports_for_schedules(after, RECONCILE_BATCH)
            for row in rows:
                counts[await self.apply(row)] += 1
            if len(rows) < RECONCILE_BATCH:
                return counts
            after = rows[-1].id
