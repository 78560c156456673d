"""The export's activities: thin adapters from Temporal to the job store, the builder and the partner client.

``claim`` runs on the shared task queue and returns the claiming worker's own queue; everything after the
claim runs on that queue, so the local file never leaves the host that built it:

- ``prepare_delivery``: build (heartbeats, lease kept, stop watched) then cutoff 2, in one activity;
- ``confirm_stop``: the ``stop_requested`` signal's check against the row, which also stops the local build;
- ``deliver``: the upload fence, the upload, the rename fence, evidence and the terminal write; never
  interrupted, never retried.

One lease keeper per attempt, from the confirmed claim to the attempt's last write (000 "one stop source
and one lease keeper"): the claim opens it, ``prepare_delivery`` and ``deliver`` hold it, and it keeps
renewing across the gaps between them. When no activity of the attempt arrives within the schedule-to-start
bound (its workflow is gone), the keeper stops and the lease expires for recovery.

No activity crosses cutoff 2 once its workflow is gone, it is being cancelled, or its worker is draining:
the attempt is given back to the queue instead (``release_attempt_if_running``). A drain stops the builds
the same way; deliveries this host already authorized run to their terminal write.

``record_temporal_cancel`` (shared queue) records a workflow cancellation from Temporal as a stop request
through the cancellation transaction. Every write is one of the store's conditional statements; an
activity never decides from an exception that a write did not happen. Payloads and logs carry IDs, sizes,
hashes and codes only.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

from psycopg_pool import AsyncConnectionPool
from temporalio import activity
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from db.builder import BuildError, BuiltFile, build_export, remove_export_file
from db.errors import StoreError, TransientStoreError
from db.stores.ledger import LedgerStatements
from db.stores.protocol import WorkerStore
from domain.destination import Destination
from domain.models import (
    AuthorizationResult,
    CancellationOutcome,
    ClaimResult,
    DeliveryOutcome,
    ExportJob,
    FailureCode,
    FenceResult,
    FinishResult,
    JobStatus,
    StopPoint,
)
from observability import logs
from observability.metrics import CancellationSource, get_metrics
from partner.protocol import DeliveryHooks, DeliveryReport, FileToDeliver, OriginalFile, PartnerFor
from rules.outcomes import after_refused_cutoff, after_terminal_write
from rules.ownership import held_by
from rules.policy import evaluate_policy
from runtime.attempts import Attempt, AttemptRegistry, StopReason
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
FENCE_TIMEOUT_SECONDS = 30.0
READ_TRIES = 3  # a read before any side effect meets a dead pooled connection: retried, never fatal


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


async def keep_heartbeating(
    details: Callable[[], dict[str, Any]], paused: Callable[[], bool] = lambda: False
) -> None:
    """Heartbeat the current activity with ``details()`` (codes and counts only) until cancelled.

    The SDK throttles what it sends to 0.8 x the heartbeat timeout; this only keeps the latest details
    fresh, at a quarter of the timeout (at most every second). While ``paused()`` (a test seam: a stalled
    worker) nothing is sent.
    """
    interval = _heartbeat_interval()
    while True:
        if not paused():
            activity.heartbeat(details())
        await asyncio.sleep(interval)


class ExportActivities:
    """The export's activities on one worker host.

    ``store`` is a ``WorkerStore`` over an ``exports_worker`` pool whose ``lease_seconds`` is the lease each
    claim and renewal sets: it serves the protocol's statements (renewals, cutoff 2, fences, evidence,
    terminal writes). ``build_pool`` (same role) feeds the builder's COPY only, so builds can never hold
    the connections renewals need; at most ``settings.max_concurrent_builds`` builds run at once.
    ``own_task_queue`` is this host's queue, returned by the claim. ``cancellation_store`` is a ledger store (``ApiStore``)
    over an ``exports_api`` pool for recording a cancellation from Temporal (the worker role may not write
    cancellation requests). ``partners`` picks each destination's partner (``partner.kinds.partner_for``,
    injected so activities never import a partner kind). Uploads run on this object's own ``max_concurrent_deliveries`` threads; more
    wait their turn. ``search_attributes`` says whether the server has the export search attributes
    registered; ``None`` asks the server (ListSearchAttributes, which the time-skipping test server does
    not implement, so it then counts as not registered).

    The plain attributes below are test seams at named points; all default to off.
    """

    def __init__(
        self,
        store: WorkerStore,
        build_pool: AsyncConnectionPool[Any],
        settings: Settings,
        worker_id: str,
        own_task_queue: str,
        *,
        cancellation_store: LedgerStatements,
        partners: PartnerFor,
        search_attributes: bool | None = None,
        max_concurrent_deliveries: int = 8,
    ) -> None:
        self.store = store
        self.build_pool = build_pool
        self.settings = settings
        self.worker_id = worker_id
        self.own_task_queue = own_task_queue
        self.cancellation_store = cancellation_store
        self.partners = partners
        self._search_attributes = search_attributes
        self.attempts = AttemptRegistry(store, settings)
        self._builds = asyncio.Semaphore(max(1, settings.max_concurrent_builds))
        self._delivery_threads = ThreadPoolExecutor(
            max_workers=max_concurrent_deliveries, thread_name_prefix="export-deliver"
        )
        # Test seams.
        self.after_load: Hook | None = None  # in the claim, after the row is read, before policy and claim
        self.after_build: Hook | None = (
            None  # in the build phase, after the file is written (a stop cancels it)
        )
        self.before_build: Hook | None = None  # in the build phase, before the build waits for its turn
        self.before_authorize: Hook | None = None  # after the build, before cutoff 2
        self.before_upload: Hook | None = None  # in deliver, after ownership is confirmed, before the fence
        self.during_upload: UploadHook | None = None  # forwarded to DeliveryHooks.during_upload (bytes sent)
        self.before_rename_fence: Hook | None = None  # after the upload, before the rename fence
        self.after_rename_fence: Hook | None = None  # the rename fence matched, the rename not yet sent
        self.before_renewal: Callable[[], Awaitable[None]] | None = None  # each lease renewal; may raise
        self.watcher_disabled = False  # stop requests are then caught by cutoff 2 alone
        self.lease_timer_disabled = False  # a paused worker: only on-demand renewals
        self.workflow_check_disabled = False  # cutoff 2 without asking Temporal about the workflow
        self.heartbeats_paused = False  # a stalled worker: its activities stop heartbeating

    def shared_activities(self) -> list[Callable[..., Any]]:
        """Activities for the shared task queue: the claim and the recording of a Temporal cancel."""
        return [self.claim, self.record_temporal_cancel]

    def own_activities(self) -> list[Callable[..., Any]]:
        """Activities for this host's own task queue: everything that touches the local file."""
        return [self.prepare_delivery, self.confirm_stop, self.deliver]

    async def aclose(self) -> None:
        """Stop every keeper still running and release the delivery threads (pools belong to their opener)."""
        await self.attempts.end_all()
        self._delivery_threads.shutdown(wait=False)

    def _open(self, job_id: UUID, attempt_id: UUID) -> tuple[Attempt, bool]:
        """This host's record of an attempt (runtime.attempts), its keeper under this object's seams."""
        return self.attempts.open(
            job_id,
            attempt_id,
            timer=not self.lease_timer_disabled,
            before_renewal=self.before_renewal,
            watch_stops=lambda: not self.watcher_disabled,
        )

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
        cannot be read raises: nothing is claimed. A confirmed claim opens the attempt's lease keeper.
        """
        facts = await self.store.read_policy_facts(inp.job_id)
        if facts is None:
            return ClaimOutcome(step=ClaimStep.ALREADY_SETTLED)
        logs.bind_rest_of_task(tenant_id=facts.tenant_id)
        registered = await self._search_attributes_registered()
        if held_by(facts, inp.attempt_id, JobStatus.RUNNING):
            # A retry of this claim after a lost response: the claim committed.
            return self._claimed(facts.job_id, facts.tenant_id, inp.attempt_id, registered)
        if facts.status != JobStatus.QUEUED:
            return ClaimOutcome(
                step=ClaimStep.ALREADY_SETTLED, tenant_id=facts.tenant_id, search_attributes=registered
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
        return self._claimed(facts.job_id, facts.tenant_id, inp.attempt_id, registered)

    def _claimed(self, job_id: UUID, tenant_id: UUID, attempt_id: UUID, registered: bool) -> ClaimOutcome:
        # From the confirmed claim on, one keeper renews this attempt's lease (the claim has just set it).
        attempt, created = self._open(job_id, attempt_id)
        if created:
            attempt.keeper.start_timer()
            self.attempts.watch_idle(attempt)
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
        writes only if a stop request is recorded. Lost ownership stops at once and writes nothing. A drain,
        a gone workflow or a transient database failure gives the attempt back to the queue. Cutoff 2 is
        never skipped once the file is built, and the file is deleted unless it authorized.
        """
        attempt, created = self._open(inp.job_id, inp.attempt_id)
        work = asyncio.create_task(self._prepare(inp, attempt, created))
        return await _run_to_end(work, lambda: attempt.stop(StopReason.CANCELLED))

    async def _prepare(self, inp: PrepareInput, attempt: Attempt, created: bool) -> PrepareResult:
        async with self.attempts.holding(attempt):
            attempt.stage = "building"
            job = await self._read_job(inp.job_id)
            if job is not None:
                logs.bind_rest_of_task(tenant_id=job.tenant_id)
            if not held_by(job, inp.attempt_id, JobStatus.RUNNING):
                await self.attempts.end(attempt)
                return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)
            if created:
                # No claim on this host opened it (a restarted host cannot get here): confirm ownership now.
                first = await attempt.keeper.start()
                if first is not None and not first.owned:
                    await self.attempts.end(attempt)
                    return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)
            heartbeat = asyncio.create_task(
                keep_heartbeating(
                    lambda: {"stage": "building", "rows": attempt.rows, "bytes": attempt.bytes},
                    lambda: self.heartbeats_paused,
                )
            )
            built: BuiltFile | None = None
            authorized = False
            try:
                if self.attempts.draining:
                    attempt.stop(StopReason.DRAINING)
                if attempt.reason is None:
                    attempt.build = asyncio.create_task(self._build(job, attempt))
                    try:
                        built = await attempt.build
                    except asyncio.CancelledError:
                        if attempt.reason is None:  # not ours: nothing else cancels the build task
                            raise
                    except BuildError as exc:
                        if exc.transient:
                            # The database could not be reached: nothing is wrong with the export.
                            return await self._give_back(job, attempt, f"build interrupted: {exc.code}")
                        finished = await self.store.finish_failed(
                            job.id, inp.attempt_id, FailureCode.BUILD_FAILED, cause=str(exc)[:200]
                        )
                        return PrepareResult(
                            outcome=after_terminal_write(finished, AttemptOutcome.FAILED),
                            failure_code=FailureCode.BUILD_FAILED
                            if finished == FinishResult.WRITTEN
                            else None,
                        )
                if built is None:
                    return await self._stopped_while_building(job, attempt)

                if self.before_authorize is not None:
                    await self.before_authorize(job.id)
                refusal = await self._reason_not_to_authorize(attempt)
                if refusal is not None:
                    return await self._give_back(job, attempt, refusal)
                answers = await self._cutoff_2(job, attempt, built)
                answer = answers[-1]
                if answer == AuthorizationResult.AUTHORIZED:
                    authorized = True
                    attempt.stage = "authorized"
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
                    finished = await self.store.finish_stopped(
                        job.id, inp.attempt_id, StopPoint.BEFORE_DELIVERY
                    )
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
                        failure_code=FailureCode.ORIGINAL_DELIVERED
                        if finished == FinishResult.WRITTEN
                        else None,
                        cutoff_answers=answers,
                    )
                if answer in (AuthorizationResult.PAUSED, AuthorizationResult.DESTINATION_INACTIVE):
                    # Nothing has left the host: give the job back without using up an attempt. The next
                    # claim decides: a paused scope keeps it Queued, a retired destination is rejected.
                    given_back = await self._give_back(job, attempt, f"cutoff 2: {answer.value}")
                    return given_back.model_copy(update={"cutoff_answers": answers})
                # LeaseLapsed again, NotOwner or Unknown: write nothing; recovery reads the row.
                return PrepareResult(outcome=after_refused_cutoff(answer), cutoff_answers=answers)
            finally:
                heartbeat.cancel()
                if not authorized:
                    await self.attempts.end(attempt)
                if built is not None and not authorized:
                    remove_export_file(built.path)

    async def _build(self, job: ExportJob, attempt: Attempt) -> BuiltFile:
        def progress(rows: int, size: int) -> None:
            attempt.rows, attempt.bytes = rows, size

        if self.before_build is not None:
            await self.before_build(job.id)
        # At most max_concurrent_builds at once: waiting here holds no connection, and the keeper renews.
        async with self._builds:
            started = time.perf_counter()
            built = await build_export(
                self.build_pool,
                tenant_id=job.tenant_id,
                list_name=job.list_name,
                delivery_key=job.delivery_key,
                attempt_id=attempt.attempt_id,
                work_dir=self.settings.work_dir,
                progress=progress,
            )
        get_metrics().observe_build(time.perf_counter() - started, built.rows, built.size)
        attempt.rows, attempt.bytes = built.rows, built.size
        if self.after_build is not None:
            try:
                await self.after_build(job.id)
            except BaseException:  # a stop, or a simulated crash: the built file goes either way
                remove_export_file(built.path)
                raise
        return built

    async def _stopped_while_building(self, job: ExportJob, attempt: Attempt) -> PrepareResult:
        if attempt.reason == StopReason.OWNERSHIP_LOST:
            return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)
        if attempt.reason == StopReason.DRAINING:
            return await self._give_back(job, attempt, "worker draining")
        # Writes only when a stop request is recorded: a cancellation for any other reason (a timed-out
        # heartbeat, a gone workflow) matches nothing and leaves the attempt to its lease.
        finished = await self.store.finish_stopped(
            job.id, attempt.attempt_id, StopPoint.WHILE_BUILDING, note=str(attempt.reason)
        )
        if finished == FinishResult.WRITTEN:
            return PrepareResult(outcome=AttemptOutcome.STOPPED)
        if finished == FinishResult.NOT_OWNER and attempt.reason == StopReason.STOP_REQUESTED:
            return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)
        return PrepareResult(outcome=AttemptOutcome.LEFT_TO_RECOVERY)

    async def _give_back(self, job: ExportJob, attempt: Attempt, reason: str) -> PrepareResult:
        """Running -> Queued for this attempt, which is not counted against the job's attempts; a recorded
        stop request is honored instead (Stopped), never released into the queue again."""
        released = await self.store.release_attempt_if_running(
            job.id, attempt.attempt_id, self.worker_id, reason
        )
        if released == FinishResult.WRITTEN:
            log.info("job %s attempt %s given back to the queue (%s)", job.id, attempt.attempt_id, reason)
            return PrepareResult(outcome=AttemptOutcome.RELEASED)
        if released == FinishResult.NOT_OWNER:
            finished = await self.store.finish_stopped(
                job.id, attempt.attempt_id, StopPoint.WHILE_BUILDING, note=reason
            )
            if finished == FinishResult.WRITTEN:
                return PrepareResult(outcome=AttemptOutcome.STOPPED)
            if finished == FinishResult.NOT_OWNER:
                return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)
        return PrepareResult(outcome=AttemptOutcome.LEFT_TO_RECOVERY)

    async def _reason_not_to_authorize(self, attempt: Attempt) -> str | None:
        """Why this attempt must not cross cutoff 2 now, or ``None``: its worker is draining, it is being
        cancelled, or its workflow is no longer running (terminated, timed out, ended without it)."""
        if self.attempts.draining or attempt.reason == StopReason.DRAINING:
            return "worker draining"
        if attempt.reason == StopReason.CANCELLED or activity.is_cancelled():
            return "activity cancelled"
        if self.workflow_check_disabled:
            return None
        info = activity.info()
        if info.workflow_id is None:
            return "workflow not confirmed (no workflow)"
        try:
            described = (
                await activity.client()
                .get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
                .describe(rpc_timeout=timedelta(seconds=10))
            )
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return "workflow gone"
            return f"workflow not confirmed ({exc.status.name})"
        except (RuntimeError, TimeoutError) as exc:
            return f"workflow not confirmed ({type(exc).__name__})"
        if described.status != WorkflowExecutionStatus.RUNNING:
            return f"workflow {described.status.name.lower() if described.status else 'gone'}"
        return None

    async def _cutoff_2(
        self, job: ExportJob, attempt: Attempt, built: BuiltFile
    ) -> list[AuthorizationResult]:
        async def authorize() -> AuthorizationResult:
            return await self.store.authorize_delivery_if_running(
                tenant_id=job.tenant_id,
                job_id=job.id,
                attempt_id=attempt.attempt_id,
                replaces_job_id=job.replaces_job_id,
                final_name=built.final_name,
                length=built.size,
                sha256=built.sha256,
                rows=built.rows,
            )

        answers = [await authorize()]
        if answers[-1] == AuthorizationResult.LEASE_LAPSED:
            # Still the owner, only late: a renewal succeeds only if no takeover has committed. Retry once.
            renewal = await attempt.keeper.renew_now()
            if renewal is not None and renewal.owned:
                answers.append(await authorize())
        return answers

    async def _read_job(self, job_id: UUID) -> ExportJob | None:
        """Read the row before any side effect; a dead pooled connection is retried, not fatal."""
        for attempt in range(READ_TRIES):
            try:
                return await self.store.get_job(job_id)
            except TransientStoreError:
                if attempt + 1 == READ_TRIES:
                    raise
                await asyncio.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

    # -- the signal's confirmation (own queue) ------------------------------------------------------

    @activity.defn(name="export.confirm_stop")
    async def confirm_stop(self, inp: ConfirmStopInput) -> ConfirmStopResult:
        """Confirm a signalled stop against the row, and stop this host's build of the attempt at once.

        Confirmed only when the row is Running for this attempt with a stop request recorded; with the
        watcher disabled (a test seam) nothing is confirmed and cutoff 2 alone decides.
        """
        state = await self.store.read_ownership(inp.job_id)
        confirmed = held_by(state, inp.attempt_id, JobStatus.RUNNING) and state.stop_request_id is not None
        if not confirmed or self.watcher_disabled:
            return ConfirmStopResult(confirmed=False)
        assert state is not None
        attempt = self.attempts.get(inp.attempt_id)
        if attempt is not None:
            attempt.stop(StopReason.STOP_REQUESTED)
        return ConfirmStopResult(confirmed=True, stop_request_id=state.stop_request_id)

    # -- deliver (own queue) ------------------------------------------------------------------------

    @activity.defn(name="export.deliver")
    async def deliver(self, inp: DeliverInput) -> DeliverResult:
        """Fence, upload, fence the rename, append evidence as it is observed, and make the terminal write.

        Past cutoff 2 nothing stops the upload: this activity's cancellation is noted and the work runs to
        its end; a renewal that changes no row does not stop it either, and the terminal write may then
        match nothing. No byte goes to the partner unless the upload fence matched, and no rename request
        unless the rename fence matched.
        """
        attempt, created = self._open(inp.job_id, inp.attempt_id)
        work = asyncio.create_task(self._deliver(inp, attempt, created))
        return await _run_to_end(
            work,
            lambda: log.info("job %s: deliver activity cancelled; the delivery runs to its end", inp.job_id),
        )

    async def _deliver(self, inp: DeliverInput, attempt: Attempt, created: bool) -> DeliverResult:
        async with self.attempts.holding(attempt):
            attempt.stage = "delivering"
            heartbeat = asyncio.create_task(
                keep_heartbeating(lambda: {"stage": "delivering", "bytes_sent": attempt.sent})
            )
            try:
                job = await self._read_job(inp.job_id)
                if job is not None:
                    logs.bind_rest_of_task(tenant_id=job.tenant_id)
                if not held_by(job, inp.attempt_id, JobStatus.DELIVERING):
                    return DeliverResult(finish=FinishResult.NOT_OWNER)
                if created:
                    first = await attempt.keeper.start()
                    if first is None:
                        first = await attempt.keeper.renew_now()
                    if first is None or not first.owned:
                        # Nothing has left the host yet: an attempt that cannot confirm it still owns the job
                        # does not start an irreversible upload; recovery resolves the Delivering row.
                        return DeliverResult(
                            finish=FinishResult.NOT_OWNER if first is not None else FinishResult.UNKNOWN
                        )
                if self.before_upload is not None:
                    await self.before_upload(job.id)
                fenced = await self._fence(attempt, rename=False)
                if fenced != FenceResult.FENCED:
                    # Nothing was sent: the partner never heard of this attempt.
                    log.info(
                        "job %s attempt %s: upload fence %s; nothing sent", job.id, attempt.attempt_id, fenced
                    )
                    await self._append(
                        job.id, attempt.attempt_id, {"observation": "upload_fence", "result": fenced.value}
                    )
                    return DeliverResult(
                        finish=FinishResult.NOT_OWNER
                        if fenced == FenceResult.NOT_OWNER
                        else FinishResult.UNKNOWN
                    )
                return await self._upload_and_finish(job, inp, attempt)
            finally:
                heartbeat.cancel()
                await self.attempts.end(
                    attempt
                )  # right after the terminal write, so no renewal reports a false loss
                remove_export_file(Path(inp.file.path))

    async def _fence(self, attempt: Attempt, *, rename: bool) -> FenceResult:
        """Write the upload (or rename) fence for this attempt; renew once and retry when only the lease
        lapsed (still the owner, only late). Anything but Fenced means: do not touch the partner."""
        fence = self.store.fence_rename_if_delivering if rename else self.store.fence_upload_if_delivering
        answer = await fence(attempt.job_id, attempt.attempt_id)
        if answer == FenceResult.LEASE_LAPSED:
            renewal = await attempt.keeper.renew_now()
            if renewal is not None and renewal.owned:
                answer = await fence(attempt.job_id, attempt.attempt_id)
        return answer

    async def _append(self, job_id: UUID, attempt_id: UUID, evidence: dict[str, Any]) -> None:
        with contextlib.suppress(StoreError, OSError, TimeoutError):
            await self.store.append_delivery_evidence(job_id, attempt_id, self.worker_id, evidence)

    async def _upload_and_finish(self, job: ExportJob, inp: DeliverInput, attempt: Attempt) -> DeliverResult:
        loop = asyncio.get_running_loop()
        recorder = _EvidenceRecorder(self.store, job.id, inp.attempt_id, self.worker_id, loop)
        destination = await self.store.load_destination(job.tenant_id, job.destination_id)
        original = await self._original_file(job)

        def during_upload(sent: int) -> None:
            attempt.sent = sent
            if self.during_upload is not None:
                asyncio.run_coroutine_threadsafe(self.during_upload(job.id, sent), loop).result()

        def authorize_rename() -> bool:
            # In the delivering thread: the rename fence, on the event loop, bounded.
            async def fenced() -> bool:
                if self.before_rename_fence is not None:
                    await self.before_rename_fence(job.id)
                answer = await self._fence(attempt, rename=True)
                if answer == FenceResult.FENCED and self.after_rename_fence is not None:
                    await self.after_rename_fence(job.id)
                return answer == FenceResult.FENCED

            return asyncio.run_coroutine_threadsafe(fenced(), loop).result(timeout=FENCE_TIMEOUT_SECONDS)

        file = FileToDeliver(
            path=Path(inp.file.path),
            final_name=inp.file.final_name,
            size=inp.file.size,
            sha256=bytes.fromhex(inp.file.sha256),
        )
        started = time.perf_counter()
        try:
            # On this object's own threads: a delivery blocks its thread on evidence appends and fences.
            # The thread runs in a copy of this context, so its SFTP spans and log lines join the attempt's.
            report = await loop.run_in_executor(
                self._delivery_threads,
                functools.partial(
                    contextvars.copy_context().run,
                    self.partners(destination).deliver,
                    destination,
                    file,
                    inp.attempt_id,
                    original=original,
                    overwrite_agreed=job.overwrite_agreement_ref is not None,
                    on_evidence=recorder.observe_from_thread,
                    hooks=DeliveryHooks(during_upload=during_upload, authorize_rename=authorize_rename),
                ),
            )
        except Exception as exc:  # noqa: BLE001 - the seed's classifier: unknown unless proven otherwise
            log.warning("job %s: delivery raised %s; outcome unknown", job.id, type(exc).__name__)
            report = DeliveryReport(
                outcome=DeliveryOutcome.OUTCOME_UNKNOWN,
                failure_code=None,
                summary=f"raised {type(exc).__name__}",
            )

        get_metrics().observe_upload(time.perf_counter() - started, file.size, report.outcome.value)

        # Evidence first, whoever owns the job now; then the conditional terminal write for this attempt.
        await recorder.flush()
        code = report.failure_code if report.outcome == DeliveryOutcome.FAILED else None
        finished = await self.store.finish_delivery(
            job.id, inp.attempt_id, report.outcome, code, summary=report.summary
        )
        if code == FailureCode.NOT_DELIVERED and destination.temporary_files == "remove":
            await self._clean_up_after_failed(job, inp.attempt_id, destination, finished)
        return DeliverResult(
            delivery=report.outcome,
            failure_code=code,
            finish=finished,
            evidence_appended=recorder.appended,
            evidence_lost=len(recorder.pending),
        )

    async def _clean_up_after_failed(
        self, job: ExportJob, attempt_id: UUID, destination: Destination, finished: FinishResult
    ) -> None:
        """Under the partner's cleanup agreement, remove this attempt's temporary and set-aside files once
        its export is recorded Failed NotDelivered (no other failure uploads anything): by this write, or
        by recovery before it (the row says Failed for this attempt). An uncertain write, or a row that says
        anything else (an OutcomeUnknown keeps its files as evidence), removes nothing. What the removal
        found, a failure included, is evidence, never a change of outcome."""
        if finished == FinishResult.NOT_OWNER:
            try:
                now = await self.store.get_job(job.id)
            except StoreError:
                return
            if now is None or (now.status, now.attempt_id) != (JobStatus.FAILED, attempt_id):
                return
        elif finished != FinishResult.WRITTEN:
            return
        records = await asyncio.get_running_loop().run_in_executor(
            self._delivery_threads,
            functools.partial(
                contextvars.copy_context().run,
                self.partners(destination).remove_temporary_files,
                destination,
                attempt_id,
                job.expected_file_name or job.final_name,
            ),
        )
        for record in records:
            await self._append(job.id, attempt_id, record)

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


class _EvidenceRecorder:
    """Appends each observation as the delivering thread makes it; what cannot be appended is retried."""

    def __init__(
        self,
        store: WorkerStore,
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
