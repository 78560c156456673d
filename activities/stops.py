"""Stops: the ``stop_requested`` signal's confirmation (own queue) and a cancellation from Temporal (shared).

``confirm_stop`` checks a signalled stop against the row and stops this host's build of the attempt at
once. ``record_temporal_cancel`` records a workflow cancellation from Temporal as a stop request through
the cancellation transaction, as any other requester's.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.host import ExportHost
from domain.models import CancellationOutcome, JobStatus
from observability.metrics import CancellationSource, get_metrics
from rules.ownership import held_by
from runtime.attempts import StopReason
from workflows.models import ConfirmStopInput, ConfirmStopResult, RecordCancelInput, RecordCancelResult

TEMPORAL_REQUESTER = "temporal"


class StopActivities:
    """``export.confirm_stop`` and ``export.record_temporal_cancel`` on one host."""

    def __init__(self, host: ExportHost) -> None:
        self.host = host

    @activity.defn(name="export.confirm_stop")
    async def confirm_stop(self, inp: ConfirmStopInput) -> ConfirmStopResult:
        """Confirm a signalled stop against the row, and stop this host's build of the attempt at once.

        Confirmed only when the row is Running for this attempt with a stop request recorded; with the
        watcher disabled (a test seam) nothing is confirmed and cutoff 2 alone decides.
        """
        state = await self.host.store.read_ownership(inp.job_id)
        confirmed = held_by(state, inp.attempt_id, JobStatus.RUNNING) and state.stop_request_id is not None
        if not confirmed or self.host.seams.watcher_disabled:
            return ConfirmStopResult(confirmed=False)
        assert state is not None
        attempt = self.host.attempts.get(inp.attempt_id)
        if attempt is not None:
            attempt.stop(StopReason.STOP_REQUESTED)
        return ConfirmStopResult(confirmed=True, stop_request_id=state.stop_request_id)

    @activity.defn(name="export.record_temporal_cancel")
    async def record_temporal_cancel(self, inp: RecordCancelInput) -> RecordCancelResult:
        """Record a workflow cancellation from Temporal as a request through the cancellation transaction.

        Requested by ``temporal`` with the request ID the workflow derived, so a retry after ``Busy`` or a
        lost answer returns the outcome already recorded.
        """
        store = self.host.cancellation_store
        job = await store.get_job(inp.job_id)
        if job is None:
            get_metrics().observe_cancellation(
                CancellationOutcome.NOT_FOUND.value, source=CancellationSource.TEMPORAL
            )
            return RecordCancelResult(outcome=CancellationOutcome.NOT_FOUND)
        result = await store.request_cancellation(
            tenant_id=job.tenant_id,
            job_id=job.id,
            request_id=inp.request_id,
            requested_by=TEMPORAL_REQUESTER,
            reason="workflow cancelled in Temporal",
        )
        get_metrics().observe_cancellation(
            result.outcome.value, source=CancellationSource.TEMPORAL, tenant_id=job.tenant_id
        )
        if result.outcome == CancellationOutcome.BUSY:
            raise ApplicationError("the job row is locked; retry with the same request ID", type="Busy")
        return RecordCancelResult(outcome=result.outcome)
