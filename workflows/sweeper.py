"""SweeperWorkflow: one sweep of stale Queued jobs in bounded batches, started by a Temporal Schedule."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.sweeper import SweeperActivities
    from workflows.models import SweepBatchInput, SweepInput, SweepResult


@workflow.defn(name="SweeperWorkflow")
class SweeperWorkflow:
    """Calls the sweep activity until a batch comes back short, at most ``max_batches`` times."""

    @workflow.run
    async def run(self, inp: SweepInput) -> SweepResult:
        """Sweep until a batch is not full, so a backlog is drained in bounded transactions."""
        total = SweepResult(swept=0, batch=0)
        for _ in range(inp.max_batches):
            done = await workflow.execute_activity_method(
                SweeperActivities.sweep_stale_queued,
                SweepBatchInput(batch=inp.batch, older_than_seconds=inp.older_than_seconds),
                # One statement per batch: a worker that stalls on it hands the batch on quickly.
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
            total.swept += done.swept
            total.batch = done.batch
            total.batches += 1
            if done.swept < done.batch:
                break
        return total
