"""RecoveryWorkflow: one recovery run over expired leases, in batches, started by a Temporal Schedule.

No I/O here: the activities scan, take over, and re-check OutcomeUnknowns whose partner did not answer
(0013). The run's ID (workflow ID and run ID) is recorded as ``observed_by`` on every takeover event, every
settlement and every piece of evidence recovery appends.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.recovery import RecoveryActivities
    from rules.recovery import RECOVERY_OBSERVER_PREFIX
    from workflows.models import RecheckInput, RecoveryBatchInput, RecoveryBatchResult, RecoveryInput

# Runs started before the re-check existed replay without it (README "Changing workflow code safely").
RECHECK_PATCH = "recheck-unknown-outcomes"


@workflow.defn(name="RecoveryWorkflow")
class RecoveryWorkflow:
    """Runs recovery batches until a batch is short or took nothing over, at most ``max_batches``; then one
    re-check of OutcomeUnknowns."""

    @workflow.run
    async def run(self, inp: RecoveryInput) -> RecoveryBatchResult:
        """Take over expired leases batch by batch; returns the counts by takeover for the whole run."""
        info = workflow.info()
        run_id = f"{RECOVERY_OBSERVER_PREFIX}:{info.workflow_id}/{info.run_id}"
        total = RecoveryBatchResult()
        for _ in range(inp.max_batches):
            # Retrying a batch is safe: every takeover is conditional, and a repeated one matches nothing.
            batch = await workflow.execute_activity_method(
                RecoveryActivities.recover_expired_leases,
                RecoveryBatchInput(recovery_run_id=run_id, limit=inp.batch),
                start_to_close_timeout=timedelta(minutes=10),
                heartbeat_timeout=timedelta(seconds=inp.heartbeat_seconds),
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
            total.add(batch)
            # Candidates that matched nothing are no longer expired; errors wait for the next run.
            if batch.scanned < inp.batch or batch.taken_over == 0:
                break
        if workflow.patched(RECHECK_PATCH):
            # Retrying is safe too: a settlement is conditional, and a listing made waits for the interval.
            total.add(
                await workflow.execute_activity_method(
                    RecoveryActivities.recheck_unknown_outcomes,
                    RecheckInput(recovery_run_id=run_id, limit=inp.batch),
                    start_to_close_timeout=timedelta(minutes=10),
                    heartbeat_timeout=timedelta(seconds=inp.heartbeat_seconds),
                    retry_policy=RetryPolicy(maximum_attempts=3),
                )
            )
        return total
