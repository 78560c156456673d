"""ExportWorkflow: claim on the shared queue, then build, cutoff 2 and deliver on the claiming worker's queue.

The PostgreSQL row decides; this workflow orchestrates. It does no I/O and its payloads carry IDs, sizes,
hashes and codes only. ``attempt_id = workflow.uuid4()`` is the same across activity retries, so a claim
retried after a lost response re-reads the row and finds itself. A timed-out or failed activity after the
claim ends the workflow without writing: the lease and recovery take over.

A ``stop_requested`` signal is confirmed against the row and then stops the build at once. A cancellation
from the Web UI or CLI is recorded as a stop request through the cancellation transaction (requested by
``temporal``, with a request ID derived from the workflow ID) and then follows the same rules: cutoff 2 is
never skipped and a delivery in progress is never interrupted.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.claim import ClaimActivity
    from activities.deliver import DeliverActivity
    from activities.prepare import PrepareActivity
    from activities.stops import StopActivities
    from domain.models import CancellationOutcome
    from rules.outcomes import after_delivery
    from workflows.models import (
        SEARCH_ATTRIBUTE_JOB_ID,
        SEARCH_ATTRIBUTE_OUTCOME,
        SEARCH_ATTRIBUTE_TENANT_ID,
        AttemptOutcome,
        ClaimInput,
        ClaimStep,
        ConfirmStopInput,
        DeliverInput,
        ExportInput,
        ExportProgress,
        ExportResult,
        PrepareInput,
        PrepareResult,
        RecordCancelInput,
        Stage,
    )

T = TypeVar("T")

EXPORT_JOB_ID = SearchAttributeKey.for_keyword(SEARCH_ATTRIBUTE_JOB_ID)
EXPORT_TENANT_ID = SearchAttributeKey.for_keyword(SEARCH_ATTRIBUTE_TENANT_ID)
EXPORT_OUTCOME = SearchAttributeKey.for_keyword(SEARCH_ATTRIBUTE_OUTCOME)

# A fixed namespace for request IDs derived from workflow IDs (uuid5), so a replay derives the same one.
TEMPORAL_CANCEL_NAMESPACE = uuid.UUID("5f0c1d2e-7a4b-4c8d-9e6f-0a1b2c3d4e5f")

SHORT_CALL = timedelta(seconds=30)
CLAIM_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10), maximum_attempts=6
)
CANCEL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500), maximum_interval=timedelta(seconds=5), maximum_attempts=10
)
NEVER_RETRY = RetryPolicy(maximum_attempts=1)


def export_workflow_id(job_id: uuid.UUID, message_id: uuid.UUID) -> str:
    """The workflow ID of one wake-up: a redelivered outbox row maps to the same workflow."""
    return f"export-{job_id}-{message_id}"


def export_summary(job_id: uuid.UUID) -> str:
    """The static summary shown in the Web UI's workflow list: it names the export, nothing more."""
    return f"Export {job_id}"


def temporal_cancel_request_id(workflow_id: str) -> uuid.UUID:
    """The cancellation request ID recorded for a cancel of this workflow from Temporal (deterministic)."""
    return uuid.uuid5(TEMPORAL_CANCEL_NAMESPACE, f"{workflow_id}/temporal-cancel")


@workflow.defn(name="ExportWorkflow")
class ExportWorkflow:
    """One wake-up of one export job; see the module docstring."""

    def __init__(self) -> None:
        self._progress = ExportProgress()
        self._pending_stops: list[str] = []
        self._stop_signals = 0
        self._cancel_recorded = False
        self._search_attributes = False

    @workflow.run
    async def run(self, inp: ExportInput) -> ExportResult:
        """Run the wake-up to its end and say what this attempt did (the row says what the job is)."""
        attempt_id = workflow.uuid4()
        self._progress = ExportProgress(job_id=inp.job_id, attempt_id=attempt_id)
        workflow.set_current_details(f"claiming export {inp.job_id}")
        result = await self._export(inp, attempt_id)
        result.temporal_cancel = self._progress.temporal_cancel
        result.stop_signals = self._stop_signals
        self._progress.stage = Stage.FINISHED
        self._progress.outcome = result.outcome
        workflow.set_current_details(f"export {inp.job_id}: {result.outcome.value}")
        if self._search_attributes:
            workflow.upsert_search_attributes([EXPORT_OUTCOME.value_set(result.outcome.value)])
        return result

    @workflow.signal(name="stop_requested")
    async def stop_requested(self, request_id: str) -> None:
        """A stop request was recorded for this job (sent by the API): confirm it and stop the build."""
        self._stop_signals += 1
        self._progress.stop_request_ids.append(request_id)
        self._pending_stops.append(request_id)

    @workflow.query(name="progress")
    def progress(self) -> ExportProgress:
        """Where the attempt stands: stage, worker queue, file size, stops seen, outcome."""
        return self._progress

    # -- steps --------------------------------------------------------------------------------------

    async def _export(self, inp: ExportInput, attempt_id: uuid.UUID) -> ExportResult:
        def ended(outcome: AttemptOutcome, **fields: Any) -> ExportResult:
            return ExportResult(job_id=inp.job_id, attempt_id=attempt_id, outcome=outcome, **fields)

        info = workflow.info()
        claim_handle = workflow.start_activity_method(
            ClaimActivity.claim,
            ClaimInput(job_id=inp.job_id, attempt_id=attempt_id, workflow_id=info.workflow_id),
            task_queue=info.task_queue,
            start_to_close_timeout=SHORT_CALL,
            retry_policy=CLAIM_RETRY,
        )
        try:
            claim = await self._shielded(inp, claim_handle)
        except ActivityError:
            # Unanswered even after retries: if the claim committed, its lease expires and recovery takes over.
            return ended(AttemptOutcome.LEFT_TO_RECOVERY)
        if claim.search_attributes and claim.tenant_id is not None:
            self._search_attributes = True
            workflow.upsert_search_attributes(
                [EXPORT_JOB_ID.value_set(str(inp.job_id)), EXPORT_TENANT_ID.value_set(str(claim.tenant_id))]
            )
        if claim.step != ClaimStep.CLAIMED:
            return ended(AttemptOutcome(claim.step.value))
        assert claim.task_queue is not None
        own_queue = claim.task_queue
        self._progress.worker_task_queue = own_queue

        # Build and cutoff 2 on the claiming worker's queue.
        self._progress.stage = Stage.BUILDING
        workflow.set_current_details(f"building export {inp.job_id}")
        prepared = await self._build_and_authorize(inp, attempt_id, own_queue)
        if prepared is None:
            return ended(AttemptOutcome.LEFT_TO_RECOVERY)
        if prepared.outcome is not None or prepared.file is None:
            return ended(
                prepared.outcome or AttemptOutcome.LEFT_TO_RECOVERY,
                failure_code=prepared.failure_code,
                cutoff_answers=prepared.cutoff_answers,
            )
        file = prepared.file
        self._progress.file_bytes = file.size
        self._progress.file_rows = file.rows

        # Past cutoff 2: the delivery runs to its terminal write whatever happens to this workflow.
        self._progress.stage = Stage.DELIVERING
        workflow.set_current_details(f"delivering export {inp.job_id} ({file.size} bytes)")
        deliver_handle = workflow.start_activity_method(
            DeliverActivity.deliver,
            DeliverInput(job_id=inp.job_id, attempt_id=attempt_id, file=file),
            task_queue=own_queue,
            start_to_close_timeout=timedelta(seconds=inp.deliver_timeout_seconds),
            schedule_to_start_timeout=timedelta(seconds=inp.schedule_to_start_seconds),
            heartbeat_timeout=timedelta(seconds=inp.deliver_heartbeat_seconds),
            retry_policy=NEVER_RETRY,
        )
        try:
            delivered = await self._shielded(inp, deliver_handle)
        except ActivityError:
            return ended(AttemptOutcome.LEFT_TO_RECOVERY, cutoff_answers=prepared.cutoff_answers)
        return ended(
            after_delivery(delivered.delivery, delivered.finish, retried=delivered.retried),
            failure_code=delivered.failure_code,
            cutoff_answers=prepared.cutoff_answers,
            file_bytes=file.size,
            file_sha256=file.sha256,
        )

    async def _build_and_authorize(
        self, inp: ExportInput, attempt_id: uuid.UUID, own_queue: str
    ) -> PrepareResult | None:
        """Run the build and cutoff 2, confirming each stop signal against the row while it builds."""
        prepare = workflow.start_activity_method(
            PrepareActivity.prepare_delivery,
            PrepareInput(job_id=inp.job_id, attempt_id=attempt_id),
            task_queue=own_queue,
            start_to_close_timeout=timedelta(seconds=inp.build_timeout_seconds),
            schedule_to_start_timeout=timedelta(seconds=inp.schedule_to_start_seconds),
            heartbeat_timeout=timedelta(seconds=inp.build_heartbeat_seconds),
            retry_policy=NEVER_RETRY,
        )
        while not prepare.done():
            try:
                await workflow.wait_condition(lambda: prepare.done() or bool(self._pending_stops))
            except asyncio.CancelledError:
                await self._record_temporal_cancel(inp)
                continue
            if self._pending_stops and not prepare.done():
                request_id = self._pending_stops.pop(0)
                confirm = workflow.start_activity_method(
                    StopActivities.confirm_stop,
                    ConfirmStopInput(job_id=inp.job_id, attempt_id=attempt_id, request_id=request_id),
                    task_queue=own_queue,
                    start_to_close_timeout=SHORT_CALL,
                    schedule_to_start_timeout=timedelta(seconds=inp.schedule_to_start_seconds),
                    retry_policy=RetryPolicy(maximum_attempts=3),
                )
                try:
                    answer = await self._shielded(inp, confirm)
                except ActivityError:
                    continue  # the watcher is for speed; cutoff 2 still refuses a recorded stop
                # A confirmed stop has already stopped the build: confirm_stop runs on the building host
                # and stops it there at once. No activity cancel is sent as well: it would arrive only
                # with a heartbeat response, and it races the activity's own completion.
                self._progress.stop_checks += 1
                if answer.confirmed:
                    self._progress.stops_confirmed += 1
        try:
            return await self._shielded(inp, prepare)
        except ActivityError:
            return None

    async def _shielded(self, inp: ExportInput, handle: asyncio.Task[T]) -> T:
        """Await an activity that a workflow cancellation must not interrupt; the cancel is recorded."""
        while True:
            try:
                return await asyncio.shield(handle)
            except asyncio.CancelledError:
                # Recorded even when the activity has just ended: the row then says it was too late.
                await self._record_temporal_cancel(inp)

    async def _record_temporal_cancel(self, inp: ExportInput) -> None:
        """Record this workflow's cancellation once, as a stop request through the cancellation transaction."""
        if self._cancel_recorded:
            return
        self._cancel_recorded = True
        request_id = temporal_cancel_request_id(workflow.info().workflow_id)
        handle = workflow.start_activity_method(
            StopActivities.record_temporal_cancel,
            RecordCancelInput(job_id=inp.job_id, request_id=request_id),
            task_queue=workflow.info().task_queue,
            start_to_close_timeout=SHORT_CALL,
            retry_policy=CANCEL_RETRY,
        )
        while True:
            try:
                recorded = await asyncio.shield(handle)
                break
            except asyncio.CancelledError:
                if handle.done():
                    recorded = handle.result()
                    break
            except ActivityError:
                workflow.logger.warning("export %s: the cancellation could not be recorded", inp.job_id)
                return
        self._progress.temporal_cancel = recorded.outcome
        if recorded.outcome in (
            CancellationOutcome.STOP_REQUESTED,
            CancellationOutcome.STOP_ALREADY_REQUESTED,
        ):
            self._pending_stops.append(str(request_id))
