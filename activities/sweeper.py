"""The sweeper's activity: re-wake Queued jobs whose last wake-up is older than the threshold.

A cheap backstop for stranded wake-ups (000 "Messages, the Outbox, and the Sweeper"): one bounded batch
per call, ``FOR UPDATE SKIP LOCKED`` so rows another writer holds wait for the next sweep, and a fresh
outbox row only for a job that is still Queued in the same statement. Runs as ``exports_worker``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from temporalio import activity

from db.stores.protocol import WorkerStore
from settings import Settings
from workflows.models import SweepBatchInput, SweepBatchResult

log = logging.getLogger(__name__)


class SweeperActivities:
    """The sweeper's activity over a worker store."""

    def __init__(self, store: WorkerStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings

    def activities(self) -> list[Callable[..., Any]]:
        """The activities to register on the shared task queue."""
        return [self.sweep_stale_queued]

    @activity.defn(name="sweep_stale_queued")
    async def sweep_stale_queued(self, inp: SweepBatchInput) -> SweepBatchResult:
        """Republish one bounded batch of stale Queued jobs; returns how many were swept."""
        batch = inp.batch or self.settings.sweep_batch
        older_than = (
            inp.older_than_seconds
            if inp.older_than_seconds is not None
            else self.settings.sweep_after_seconds
        )
        swept = await self.store.sweep_stale_queued(older_than, batch)
        if swept:
            log.info("sweeper re-woke %d queued jobs (threshold %.0f s)", len(swept), older_than)
        return SweepBatchResult(swept=len(swept), batch=batch)
