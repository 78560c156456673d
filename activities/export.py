"""The export's activities: thin adapters from Temporal to the job store, the builder and the partner client.

``claim`` runs on the shared task queue and returns the claiming worker's own queue; everything after the
claim runs on that queue, so the local file never leaves the host that built it:

- ``prepare_delivery``: build (heartbeats, lease kept, stop watched) then cutoff 2, in one activity;
- ``confirm_stop``: the ``stop_requested`` signal's check against the row, which also stops the local build;
- ``deliver``: the upload, evidence and terminal write; never interrupted, never retried.

``record_temporal_cancel`` (shared queue) records a workflow cancellation from Temporal as a stop request
through the cancellation transaction. Every write is one of the store's conditional statements; an
activity never decides from an exception that a write did not happen. Payloads and logs carry IDs, sizes,
hashes and codes only.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

from psycopg_pool import AsyncConnectionPool
from temporalio import activity
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from db.builder import BuildError, BuiltFile, build_export, remove_export_file
from db.errors import StoreError
from db.store import JobStore
from domain.models import (
    AuthorizationResult,
    CancellationOutcome,
    ClaimResult,
    DeliveryOutcome,
    ExportJob,
    FailureCode,
    FinishResult,
    JobStatus,
    StopPoint,
)
from partner.delivery import DeliveryHooks, DeliveryReport, FileToDeliver, OriginalFile, deliver
from rules.outcomes import after_refused_cutoff, after_terminal_write
from rules.policy import evaluate_policy
from runtime.lease import LeaseKeeper
from settings import Settings
from workflows.models import (
    SEARCH_ATTRIBUTE_NAMES,
    AttemptOutcome,
    ClaimInput,
    ClaimOutcome,
    ClaimStep,
    ConfirmStopInput,
    ConfirmStopResult,
    DeliverInput,
    DeliverResult,
    LocalFile,
    PrepareInput,
    PrepareResult,
    RecordCancelInput,
    RecordCancelResult,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
Hook = Callable[[UUID], Awaitable[None]]
UploadHook = Callable[[UUID, int], Coroutine[Any, Any, None]]

TEMPORAL_REQUESTER = "temporal"
EVIDENCE_TIMEOUT_SECONDS = 30.0


class StopReason(StrEnum):
    STOP_REQUESTED = "stop requested"  # the keeper's renewal or the signal's confirmation saw a stop request
    OWNERSHIP_LOST = "ownership lost"  # a renewal changed no row: a takeover committed
    CANCELLED = "activity cancelled"  # Temporal cancelled the activity (workflow, timeout, worker shutdown)


@dataclass
class _AttemptControl:
    """One attempt's stop switch on this host: cancels the build phase, never cutoff 2 or the upload."""

    build: asyncio.Task[Any] | None = None
    reason: StopReason | None = None
    rows: int = 0
    bytes: int = 0
    sent: int = 0

    def stop(self, reason: StopReason) -> None:
        if self.reason is None:
            self.reason = reason
        if self.build is not None and not self.build.done():
            self.build.cancel()


async def _run_to_end(work: asyncio.Task[T], on_cancel: Callable[[], None]) -> T:
    """Await ``work`` to its end even if the activity is cancelled; ``on_cancel`` runs at each cancel."""
    while True:
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            if work.done():
                return work.result()
            on_cancel()


def _heartbeat_interval() -> float:
    timeout = activity.info().heartbeat_timeout
    if timeout is None:
        return 1.0
    return max(0.05, min(1.0, timeout.total_seconds() / 4))


async def keep_heartbeating(details: Callable[[], dict[str, Any]]) -> None:
    """Heartbeat the current activity with ``details()`` (codes and counts only) until cancelled.

    The SDK throttles what it sends to 0.8 x the heartbeat timeout; this only keeps the latest details
    fresh, at a quarter of the timeout (at most every second).
    """
    interval = _heartbeat_interval()
    while True:
        activity.heartbeat(details())
        await asyncio.sleep(interval)


class ExportActivities:
    """The export's activities on one worker host.

    ``store`` is a ``JobStore`` over an ``exports_worker`` pool whose ``lease_seconds`` is the lease each
    claim and renewal sets; ``worker_pool`` (same role) feeds the builder.
    ``own_task_queue`` is this host's queue, returned by the claim. ``cancellation_store`` is a ``JobStore``
    over an ``exports_api`` pool for recording a cancellation from Temporal (the worker role may not write
    cancellation requests). Uploads run on this object's own
    ``max_concurrent_deliveries`` threads; more wait their turn. ``search_attributes`` says whether the
    server has the export search attributes registered; ``None`` asks the server (ListSearchAttributes,
    which the time-skipping test server does not implement, so it then counts as not registered).

    The plain attributes below are test seams at named points; all default to off.
    """

    def __init__(
        self,
        store: JobStore,
        worker_pool: AsyncConnectionPool,
        settings: Settings,
        worker_id: str,
        own_task_queue: str,
        *,
        cancellation_store: JobStore,
        search_attributes: bool | None = None,
        max_concurrent_deliveries: int = 8,
    ) -> None:
        self.store = store
        self.worker_pool = worker_pool
        self.settings = settings
        self.worker_id = worker_id
        self.own_task_queue = own_task_queue
        self.cancellation_store = cancellation_store
        self._search_attributes = search_attributes
        self._attempts: dict[UUID, _AttemptControl] = {}
        self._delivery_threads = ThreadPoolExecutor(
            max_workers=max_concurrent_deliveries, thread_name_prefix="export-deliver"
        )
        # Test seams.
        self.after_load: Hook | None = None  # in the claim, after the row is read, before policy and claim
        self.after_build: Hook | None = (
            None  # in the build phase, after the file is written (a stop cancels it)
        )
        self.before_authorize: Hook | None = None  # after the build, before cutoff 2
        self.before_upload: Hook | None = None  # in deliver, after ownership is confirmed, before the upload
        self.during_upload: UploadHook | None = None  # forwarded to DeliveryHooks.during_upload (bytes sent)
        self.before_renewal: Callable[[], Awaitable[None]] | None = None  # each lease renewal; may raise
        self.watcher_disabled = False  # stop requests are then caught by cutoff 2 alone
        self.lease_timer_disabled = False  # a paused worker: only on-demand renewals

    def shared_activities(self) -> list[Callable[..., Any]]:
        """Activities for the shared task queue: the claim and the recording of a Temporal cancel."""
        return [self.claim, self.record_temporal_cancel]

    def own_activities(self) -> list[Callable[..., Any]]:
        """Activities for this host's own task queue: everything that touches the local file."""
        return [self.prepare_delivery, self.confirm_stop, self.deliver]

    async def aclose(self) -> None:
        """Release the delivery threads (the pools belong to whoever opened them)."""
        self._delivery_threads.shutdown(wait=False)

    # -- claim (shared queue) -----------------------------------------------------------------------

    @activity.defn(name="export.claim")
    async def claim(self, inp: ClaimInput) -> ClaimOutcome:
        """Read the row with the policy's facts, evaluate the policy, and claim it (cutoff 1) with this
        attempt's ID.

        The message is only a hint: a row that is not Queued settles it. While a delivery switch of the
        job's scope is paused nothing is decided: the wake-up is settled and the job stays Queued (the
        resume wakes it). A denied policy rejects the checked version only, with its reason code and
        message. A claim whose answer and re-read were both lost raises a retryable ``ClaimUnknown``; the
        retry uses the same attempt ID, so it finds its own claim if it committed. A switch or fact that
        cannot be read raises: nothing is claimed.
        """
        facts = await self.store.read_policy_facts(inp.job_id)
        if facts is None:
            return ClaimOutcome(step=ClaimStep.SETTLED)
        registered = await self._search_attributes_registered()
        if facts.status == JobStatus.RUNNING and facts.attempt_id == inp.attempt_id:
            # A retry of this claim after a lost response: the claim committed.
            return self._claimed(facts.tenant_id, registered)
        if facts.status != JobStatus.QUEUED:
            return ClaimOutcome(
                step=ClaimStep.SETTLED, tenant_id=facts.tenant_id, search_attributes=registered
            )
        if self.after_load is not None:
            await self.after_load(facts.job_id)

        if not facts.deliveries_open:
            # Paused: no decision is taken on the job, not even a rejection; the resume wakes it.
            return ClaimOutcome(
                step=ClaimStep.PAUSED, tenant_id=facts.tenant_id, search_attributes=registered
            )
        decision = evaluate_policy(facts)
        if not decision.allowed:
            # This version only: if the terms changed meanwhile, the edit's own wake-up brings it back.
            assert decision.code is not None
            rejected = await self.store.reject_if_queued(
                facts.job_id, facts.version, decision.code, decision.message
            )
            step = ClaimStep.REJECTED if rejected else ClaimStep.NOT_CLAIMED
            return ClaimOutcome(step=step, tenant_id=facts.tenant_id, search_attributes=registered)

        result = await self.store.claim_if_queued(
            facts.job_id, facts.version, inp.attempt_id, self.worker_id, workflow_id=inp.workflow_id
        )
        if result == ClaimResult.UNKNOWN:
            raise ApplicationError("the claim's answer and its re-read were both lost", type="ClaimUnknown")
        if result == ClaimResult.PAUSED:
            # Paused between the facts and the claim: the claim, under the switch's lock, matched nothing.
            return ClaimOutcome(
                step=ClaimStep.PAUSED, tenant_id=facts.tenant_id, search_attributes=registered
            )
        if result == ClaimResult.LOST:
            return ClaimOutcome(
                step=ClaimStep.NOT_CLAIMED, tenant_id=facts.tenant_id, search_attributes=registered
            )
        return self._claimed(facts.tenant_id, registered)

    def _claimed(self, tenant_id: UUID, registered: bool) -> ClaimOutcome:
        return ClaimOutcome(
            step=ClaimStep.CLAIMED,
            tenant_id=tenant_id,
            task_queue=self.own_task_queue,
            search_attributes=registered,
        )

    async def _search_attributes_registered(self) -> bool:
        if self._search_attributes is not None:
            return self._search_attributes
        try:
            client = activity.client()
            answer = await client.operator_service.list_search_attributes(
                ListSearchAttributesRequest(namespace=client.namespace)
            )
        except (RuntimeError, RPCError) as exc:
            log.info(
                "search attributes not readable (%s); the workflow will not set them", type(exc).__name__
            )
            if isinstance(exc, RPCError) and exc.status == RPCStatusCode.UNIMPLEMENTED:
                self._search_attributes = False  # the time-skipping test server: that will not change
            return False
        registered = all(name in answer.custom_attributes for name in SEARCH_ATTRIBUTE_NAMES)
        if registered:  # once registered, they stay; a missing one is asked about again next time
            self._search_attributes = True
        return registered

    # -- build and cutoff 2 (own queue) -------------------------------------------------------------

    @activity.defn(name="export.prepare_delivery")
    async def prepare_delivery(self, inp: PrepareInput) -> PrepareResult:
        """Build the file with the lease kept and stops watched, then pass cutoff 2 or record why not.

        A stop (recorded stop request seen by a renewal or by ``confirm_stop``, or this activity's
        cancellation) cancels the build, whose partial file is removed, then ``finish_stopped`` runs; it
        writes only if a stop request is recorded. Lost ownership stops at once and writes nothing.
        Cutoff 2 is never skipped once the file is built, and the file is deleted unless it authorized.
        """
        control = _AttemptControl()
        work = asyncio.create_task(self._prepare(inp, control))
        return await _run_to_end(work, lambda: control.stop(StopReason.CANCELLED))

    async def _prepare(self, inp: PrepareInput, control: _AttemptControl) -> PrepareResult:
        job = await self.store.get_job(inp.job_id)
        if job is None or job.attempt_id != inp.attempt_id or job.status != JobStatus.RUNNING:
            return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)

        keeper = LeaseKeeper(
            self.store,
            job.id,
            inp.attempt_id,
            every=self.settings.renew_every_seconds,
            on_stop_requested=None
            if self.watcher_disabled
            else lambda: control.stop(StopReason.STOP_REQUESTED),
            on_lost=lambda: control.stop(StopReason.OWNERSHIP_LOST),
            timer=not self.lease_timer_disabled,
            before_renewal=self.before_renewal,
        )
        self._attempts[inp.attempt_id] = control
        heartbeat = asyncio.create_task(
            keep_heartbeating(lambda: {"stage": "building", "rows": control.rows, "bytes": control.bytes})
        )
        built: BuiltFile | None = None
        authorized = False
        try:
            first = await keeper.start()
            if first is not None and not first.owned:
                return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)
            if control.reason is None:
                control.build = asyncio.create_task(self._build(job, inp.attempt_id, control))
                try:
                    built = await control.build
                except asyncio.CancelledError:
                    if control.reason is None:  # not ours: nothing else cancels the build task
                        raise
                except BuildError as exc:
                    finished = await self.store.finish_failed(
                        job.id, inp.attempt_id, FailureCode.BUILD_FAILED, cause=str(exc)[:200]
                    )
                    return PrepareResult(
                        outcome=after_terminal_write(finished, AttemptOutcome.FAILED),
                        failure_code=FailureCode.BUILD_FAILED if finished == FinishResult.WRITTEN else None,
                    )
            if built is None:
                return await self._stopped_while_building(job, inp.attempt_id, control)

            answers = await self._cutoff_2(job, inp.attempt_id, built, keeper)
            answer = answers[-1]
            if answer == AuthorizationResult.AUTHORIZED:
                authorized = True
                return PrepareResult(
                    cutoff_answers=answers,
                    file=LocalFile(
                        path=str(built.path),
                        final_name=built.final_name,
                        size=built.size,
                        sha256=built.sha256.hex(),
                        rows=built.rows,
                    ),
                )
            if answer == AuthorizationResult.STOP_RECORDED:
                finished = await self.store.finish_stopped(job.id, inp.attempt_id, StopPoint.BEFORE_DELIVERY)
                return PrepareResult(
                    outcome=after_terminal_write(finished, AttemptOutcome.STOPPED), cutoff_answers=answers
                )
            if answer == AuthorizationResult.ORIGINAL_COMPLETED:
                # A replacement whose original was corrected to Completed: nothing has left the host.
                finished = await self.store.finish_failed(
                    job.id, inp.attempt_id, FailureCode.ORIGINAL_DELIVERED, cause=None
                )
                return PrepareResult(
                    outcome=after_terminal_write(finished, AttemptOutcome.FAILED),
                    failure_code=FailureCode.ORIGINAL_DELIVERED if finished == FinishResult.WRITTEN else None,
                    cutoff_answers=answers,
                )
            if answer in (AuthorizationResult.PAUSED, AuthorizationResult.DESTINATION_INACTIVE):
                # Nothing has left the host: give the job back without using up an attempt. The next claim
                # decides: a paused scope keeps it Queued, a retired destination is rejected with its reason.
                released = await self.store.release_attempt_if_running(
                    job.id, inp.attempt_id, self.worker_id, reason=f"cutoff 2: {answer.value}"
                )
                return PrepareResult(
                    outcome=after_terminal_write(released, AttemptOutcome.RELEASED), cutoff_answers=answers
                )
            # LeaseLapsed again, NotOwner or Unknown: write nothing; recovery reads the row.
            return PrepareResult(outcome=after_refused_cutoff(answer), cutoff_answers=answers)
        finally:
            heartbeat.cancel()
            await keeper.finish()
            self._attempts.pop(inp.attempt_id, None)
            if built is not None and not authorized:
                remove_export_file(built.path)

    async def _build(self, job: ExportJob, attempt_id: UUID, control: _AttemptControl) -> BuiltFile:
        def progress(rows: int, size: int) -> None:
            control.rows, control.bytes = rows, size

        built = await build_export(
            self.worker_pool,
            tenant_id=job.tenant_id,
            list_name=job.list_name,
            delivery_key=job.delivery_key,
            attempt_id=attempt_id,
            work_dir=self.settings.work_dir,
            progress=progress,
        )
        control.rows, control.bytes = built.rows, built.size
        if self.after_build is not None:
            try:
                await self.after_build(job.id)
            except BaseException:  # a stop, or a simulated crash: the built file goes either way
                remove_export_file(built.path)
                raise
        return built

    async def _stopped_while_building(
        self, job: ExportJob, attempt_id: UUID, control: _AttemptControl
    ) -> PrepareResult:
        if control.reason == StopReason.OWNERSHIP_LOST:
            return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)
        # Writes only when a stop request is recorded: a cancellation for any other reason (worker
        # shutdown, a timed-out heartbeat) matches nothing and leaves the attempt to its lease.
        finished = await self.store.finish_stopped(
            job.id, attempt_id, StopPoint.WHILE_BUILDING, note=str(control.reason)
        )
        if finished == FinishResult.WRITTEN:
            return PrepareResult(outcome=AttemptOutcome.STOPPED)
        if finished == FinishResult.NOT_OWNER and control.reason == StopReason.STOP_REQUESTED:
            return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)
        return PrepareResult(outcome=AttemptOutcome.LEFT_TO_RECOVERY)

    async def _cutoff_2(
        self, job: ExportJob, attempt_id: UUID, built: BuiltFile, keeper: LeaseKeeper
    ) -> list[AuthorizationResult]:
        if self.before_authorize is not None:
            await self.before_authorize(job.id)

        async def authorize() -> AuthorizationResult:
            return await self.store.authorize_delivery_if_running(
                tenant_id=job.tenant_id,
                job_id=job.id,
                attempt_id=attempt_id,
                replaces_job_id=job.replaces_job_id,
                final_name=built.final_name,
                length=built.size,
                sha256=built.sha256,
                rows=built.rows,
            )

        answers = [await authorize()]
        if answers[-1] == AuthorizationResult.LEASE_LAPSED:
            # Still the owner, only late: a renewal succeeds only if no takeover has committed. Retry once.
            renewal = await keeper.renew_now()
            if renewal is not None and renewal.owned:
                answers.append(await authorize())
        return answers

    # -- the signal's confirmation (own queue) ------------------------------------------------------

    @activity.defn(name="export.confirm_stop")
    async def confirm_stop(self, inp: ConfirmStopInput) -> ConfirmStopResult:
        """Confirm a signalled stop against the row, and stop this host's build of the attempt at once.

        Confirmed only when the row is Running for this attempt with a stop request recorded; with the
        watcher disabled (a test seam) nothing is confirmed and cutoff 2 alone decides.
        """
        state = await self.store.read_ownership(inp.job_id)
        confirmed = (
            state is not None
            and state.status == JobStatus.RUNNING
            and state.attempt_id == inp.attempt_id
            and state.stop_request_id is not None
        )
        if not confirmed or self.watcher_disabled:
            return ConfirmStopResult(confirmed=False)
        assert state is not None
        control = self._attempts.get(inp.attempt_id)
        if control is not None:
            control.stop(StopReason.STOP_REQUESTED)
        return ConfirmStopResult(confirmed=True, stop_request_id=state.stop_request_id)

    # -- deliver (own queue) ------------------------------------------------------------------------

    @activity.defn(name="export.deliver")
    async def deliver(self, inp: DeliverInput) -> DeliverResult:
        """Upload, append evidence as it is observed, and make the attempt's terminal write.

        Past cutoff 2 nothing stops the upload: this activity's cancellation is noted and the work runs to
        its end; a renewal that changes no row does not stop it either, and the terminal write may then
        match nothing. An upload is never started for an attempt that cannot first confirm its ownership.
        """
        control = _AttemptControl()
        work = asyncio.create_task(self._deliver(inp, control))
        return await _run_to_end(
            work,
            lambda: log.info("job %s: deliver activity cancelled; the delivery runs to its end", inp.job_id),
        )

    async def _deliver(self, inp: DeliverInput, control: _AttemptControl) -> DeliverResult:
        heartbeat = asyncio.create_task(
            keep_heartbeating(lambda: {"stage": "delivering", "bytes_sent": control.sent})
        )
        keeper: LeaseKeeper | None = None
        try:
            job = await self.store.get_job(inp.job_id)
            if job is None or job.attempt_id != inp.attempt_id or job.status != JobStatus.DELIVERING:
                return DeliverResult(finish=FinishResult.NOT_OWNER)
            keeper = LeaseKeeper(
                self.store,
                job.id,
                inp.attempt_id,
                every=self.settings.renew_every_seconds,
                timer=not self.lease_timer_disabled,
                before_renewal=self.before_renewal,
            )
            first = await keeper.start()
            if first is None:
                first = await keeper.renew_now()
            if first is None or not first.owned:
                # Nothing has left the host yet: an attempt that cannot confirm it still owns the job
                # does not start an irreversible upload; recovery resolves the Delivering row.
                return DeliverResult(
                    finish=FinishResult.NOT_OWNER if first is not None else FinishResult.UNKNOWN
                )
            if self.before_upload is not None:
                await self.before_upload(job.id)
            return await self._upload_and_finish(job, inp, control)
        finally:
            heartbeat.cancel()
            if keeper is not None:
                await keeper.finish()  # right after the terminal write, so no renewal reports a false loss
            remove_export_file(Path(inp.file.path))

    async def _upload_and_finish(
        self, job: ExportJob, inp: DeliverInput, control: _AttemptControl
    ) -> DeliverResult:
        loop = asyncio.get_running_loop()
        recorder = _EvidenceRecorder(self.store, job.id, inp.attempt_id, self.worker_id, loop)
        destination = await self.store.load_destination(job.tenant_id, job.destination_id)
        original = await self._original_file(job)

        def during_upload(sent: int) -> None:
            control.sent = sent
            if self.during_upload is not None:
                asyncio.run_coroutine_threadsafe(self.during_upload(job.id, sent), loop).result()

        file = FileToDeliver(
            path=Path(inp.file.path),
            final_name=inp.file.final_name,
            size=inp.file.size,
            sha256=bytes.fromhex(inp.file.sha256),
        )
        try:
            # On this object's own threads: a delivery blocks its thread on evidence appends, which need
            # pool connections that builders hold while they wait for default-executor threads.
            report = await loop.run_in_executor(
                self._delivery_threads,
                functools.partial(
                    deliver,
                    destination,
                    file,
                    inp.attempt_id,
                    original=original,
                    overwrite_agreed=job.overwrite_agreement_ref is not None,
                    on_evidence=recorder.observe_from_thread,
                    hooks=DeliveryHooks(during_upload=during_upload),
                ),
            )
        except Exception as exc:  # noqa: BLE001 - the seed's classifier: unknown unless proven otherwise
            log.warning("job %s: delivery raised %s; outcome unknown", job.id, type(exc).__name__)
            report = DeliveryReport(
                outcome=DeliveryOutcome.OUTCOME_UNKNOWN,
                failure_code=None,
                summary=f"raised {type(exc).__name__}",
            )

        # Evidence first, whoever owns the job now; then the conditional terminal write for this attempt.
        await recorder.flush()
        code = report.failure_code if report.outcome == DeliveryOutcome.FAILED else None
        finished = await self.store.finish_delivery(
            job.id, inp.attempt_id, report.outcome, code, summary=report.summary
        )
        return DeliverResult(
            delivery=report.outcome,
            failure_code=code,
            finish=finished,
            evidence_appended=recorder.appended,
            evidence_lost=len(recorder.pending),
        )

    async def _original_file(self, job: ExportJob) -> OriginalFile | None:
        if job.replaces_job_id is None:
            return None
        original = await self.store.get_job(job.replaces_job_id)
        if original is None:
            return None
        return OriginalFile(
            name=original.expected_file_name or original.final_name,
            size=original.expected_file_bytes,
            sha256=original.expected_file_sha256,
            attempt_id=original.attempt_id,
        )

    # -- a cancellation from Temporal (shared queue) ------------------------------------------------

    @activity.defn(name="export.record_temporal_cancel")
    async def record_temporal_cancel(self, inp: RecordCancelInput) -> RecordCancelResult:
        """Record a workflow cancellation from Temporal as a request through the cancellation transaction.

        Requested by ``temporal`` with the request ID the workflow derived, so a retry after ``Busy`` or a
        lost answer returns the outcome already recorded.
        """
        store = self.cancellation_store
        job = await store.get_job(inp.job_id)
        if job is None:
            return RecordCancelResult(outcome=CancellationOutcome.NOT_FOUND)
        result = await store.request_cancellation(
            tenant_id=job.tenant_id,
            job_id=job.id,
            request_id=inp.request_id,
            requested_by=TEMPORAL_REQUESTER,
            reason="workflow cancelled in Temporal",
        )
        if result.outcome == CancellationOutcome.BUSY:
            raise ApplicationError("the job row is locked; retry with the same request ID", type="Busy")
        return RecordCancelResult(outcome=result.outcome)


class _EvidenceRecorder:
    """Appends each observation as the delivering thread makes it; what cannot be appended is retried."""

    def __init__(
        self,
        store: JobStore,
        job_id: UUID,
        attempt_id: UUID,
        observed_by: str,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.attempt_id = attempt_id
        self.observed_by = observed_by
        self.loop = loop
        self.appended = 0
        self.pending: list[dict[str, Any]] = []

    def observe_from_thread(self, evidence: dict[str, Any]) -> None:
        """Called in the delivering thread: blocks until the observation is appended (or set aside)."""
        future = asyncio.run_coroutine_threadsafe(self.append(evidence), self.loop)
        future.result(timeout=EVIDENCE_TIMEOUT_SECONDS + 5)

    async def append(self, evidence: dict[str, Any]) -> None:
        try:
            await asyncio.wait_for(
                self.store.append_delivery_evidence(self.job_id, self.attempt_id, self.observed_by, evidence),
                EVIDENCE_TIMEOUT_SECONDS,
            )
            self.appended += 1
        except (StoreError, OSError, TimeoutError) as exc:
            log.warning("job %s: evidence not appended (%s); retrying later", self.job_id, type(exc).__name__)
            self.pending.append(evidence)

    async def flush(self, tries: int = 3) -> None:
        for attempt in range(tries):
            if not self.pending:
                return
            retry, self.pending = self.pending, []
            for evidence in retry:
                await self.append(evidence)
            if self.pending and attempt + 1 < tries:
                await asyncio.sleep(0.5 * (attempt + 1))
        if self.pending:
            log.error("job %s: %d observations could not be appended", self.job_id, len(self.pending))
