"""The delivery, on the claiming host's own queue: never interrupted, never retried.

``deliver`` writes the upload fence, uploads through the destination's partner over the session the attempt
opened and verified before cutoff 2 (a new one, verified again, if that one died), writes the rename fence
when the partner is about to publish the final name, appends evidence as it is observed, and makes the
terminal write, which also ends the attempt's session slot. Past cutoff 2 nothing stops it: a cancellation
is noted and the work runs to its end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from uuid import UUID

from temporalio import activity

from activities.heartbeat import keep_heartbeating, run_to_end
from activities.host import ExportHost, JobSeam
from db.builder import remove_export_file
from db.errors import StoreError
from db.stores.protocol import WorkerStore
from db.stores.slots import CLEANUP
from domain.destination import Destination
from domain.manifest import manifests_for_job
from domain.models import (
    DeliveryOutcome,
    ExportJob,
    FailureCode,
    FenceResult,
    FinishResult,
    JobStatus,
    RetryResult,
    UploadFence,
)
from observability import logs
from observability.metrics import get_metrics
from partner.protocol import DeliveryHooks, DeliveryReport, FileToDeliver, OriginalFile
from rules.ownership import held_by
from rules.retries import retry_cause
from runtime.attempts import Attempt
from workflows.models import DeliverInput, DeliverResult

log = logging.getLogger(__name__)

EVIDENCE_TIMEOUT_SECONDS = 30.0
# Observations the delivering thread waits to see appended before it goes on. The baseline is the listing
# recovery and reconciliation compare the partner against, on record before the upload starts (seed 000:
# "Before uploading, the destination lists the final name and appends the result as evidence").
WAIT_FOR = frozenset({"baseline"})
# How long the evidence writer lets other observations gather before it appends one that nothing waits for:
# a delivery's observations come tens of milliseconds apart, so most go in two or three statements, and a
# crash loses at most this long's worth plus one round trip.
EVIDENCE_LINGER_SECONDS = 0.05
# The retry's answer as a terminal write: Retried and Failed both wrote this attempt's end.
_RETRY_FINISH = {
    RetryResult.RETRIED: FinishResult.WRITTEN,
    RetryResult.FAILED: FinishResult.WRITTEN,
    RetryResult.NOT_OWNER: FinishResult.NOT_OWNER,
    RetryResult.UNKNOWN: FinishResult.UNKNOWN,
}
FENCE_TIMEOUT_SECONDS = 30.0


class DeliverActivity:
    """``export.deliver`` on one host. Uploads run on this object's own ``max_concurrent_deliveries``
    threads (a delivery blocks its thread on evidence appends and fences); more wait their turn."""

    def __init__(self, host: ExportHost, *, max_concurrent_deliveries: int = 8) -> None:
        self.host = host
        self._delivery_threads = ThreadPoolExecutor(
            max_workers=max_concurrent_deliveries, thread_name_prefix="export-deliver"
        )

    def close(self) -> None:
        """Release the delivery threads; a delivery still running keeps its thread to its end."""
        self._delivery_threads.shutdown(wait=False)

    @activity.defn(name="export.deliver")
    async def deliver(self, inp: DeliverInput) -> DeliverResult:
        """Fence, upload, fence the rename, append evidence as it is observed, and make the terminal write.

        Past cutoff 2 nothing stops the upload: this activity's cancellation is noted and the work runs to
        its end; a renewal that changes no row does not stop it either, and the terminal write may then
        match nothing. No byte goes to the partner unless the upload fence matched, and no rename request
        unless the rename fence matched.
        """
        attempt, created = self.host.open(inp.job_id, inp.attempt_id)
        work = asyncio.create_task(self._deliver(inp, attempt, created))
        return await run_to_end(
            work,
            lambda: log.info("job %s: deliver activity cancelled; the delivery runs to its end", inp.job_id),
        )

    async def _deliver(self, inp: DeliverInput, attempt: Attempt, created: bool) -> DeliverResult:
        async with self.host.attempts.holding(attempt):
            attempt.stage = "delivering"
            heartbeat = asyncio.create_task(
                keep_heartbeating(lambda: {"stage": "delivering", "bytes_sent": attempt.sent})
            )
            try:
                # Handed on by prepare on this host when cutoff 2 authorized: the upload fence is then the first
                # statement, and its answer is the row. Otherwise (the attempt is new here) the row is read and
                # ownership confirmed before anything else.
                handed, attempt.contract = attempt.contract, None
                job: ExportJob | None = None
                if created or handed is None:
                    job = await self.host.read_job(inp.job_id)
                    refused = await self._not_ours(job, inp, attempt, created)
                    if refused is not None:
                        return refused
                else:
                    logs.bind_rest_of_task(tenant_id=handed.tenant_id)
                if self.host.seams.before_upload is not None:
                    await self.host.seams.before_upload(inp.job_id)
                # The contract cutoff 2 authorized, whatever the destination says since: an edit after cutoff 2
                # does not touch this upload (issue #24.2). Read while the upload fence is written, unless it
                # was handed on.
                contract = self._authorized_contract(job) if job is not None else None
                fence = await self._fence_upload(attempt)
                if fence.result != FenceResult.FENCED:
                    if contract is not None:
                        contract.cancel()
                    # Nothing was sent: the partner never heard of this attempt.
                    log.info(
                        "job %s attempt %s: upload fence %s; nothing sent",
                        inp.job_id,
                        attempt.attempt_id,
                        fence.result,
                    )
                    await self._append(
                        inp.job_id,
                        attempt.attempt_id,
                        {"observation": "upload_fence", "result": fence.result.value},
                    )
                    return DeliverResult(
                        finish=FinishResult.NOT_OWNER
                        if fence.result == FenceResult.NOT_OWNER
                        else FinishResult.UNKNOWN
                    )
                # The row as the fence wrote it (only a re-read after a lost answer leaves it to be read).
                job = fence.job or job or await self.host.read_job(inp.job_id)
                if job is None:
                    return DeliverResult(finish=FinishResult.UNKNOWN)  # fenced, and nothing sent
                if contract is not None:
                    destination = await contract
                elif handed is not None and handed.version == job.destination_version:
                    destination = handed  # what the build read is what cutoff 2 authorized
                else:
                    destination = await self.host.store.load_destination(
                        job.tenant_id, job.destination_id, job.destination_version
                    )
                return await self._upload_and_finish(job, inp, attempt, destination)
            finally:
                heartbeat.cancel()
                await self.host.attempts.end(
                    attempt
                )  # right after the terminal write, so no renewal reports a false loss
                remove_export_file(Path(inp.file.path))

    async def _not_ours(
        self, job: ExportJob | None, inp: DeliverInput, attempt: Attempt, created: bool
    ) -> DeliverResult | None:
        """Why this attempt must not start its upload, as the row just read says, or ``None``: the job is not
        Delivering for it, or (an attempt new on this host) its keeper cannot confirm it still owns the job."""
        if job is not None:
            logs.bind_rest_of_task(tenant_id=job.tenant_id)
        if not held_by(job, inp.attempt_id, JobStatus.DELIVERING):
            return DeliverResult(finish=FinishResult.NOT_OWNER)
        if created:
            first = await attempt.keeper.start()
            if first is None:
                first = await attempt.keeper.renew_now()
            if first is None or not first.owned:
                # Nothing has left the host yet: an attempt that cannot confirm it still owns the job does not
                # start an irreversible upload; recovery resolves the Delivering row.
                return DeliverResult(
                    finish=FinishResult.NOT_OWNER if first is not None else FinishResult.UNKNOWN
                )
        return None

    def _authorized_contract(self, job: ExportJob) -> asyncio.Task[Destination]:
        """The destination version cutoff 2 authorized for ``job``, read in a task of its own."""
        contract = asyncio.create_task(
            self.host.store.load_destination(job.tenant_id, job.destination_id, job.destination_version)
        )
        contract.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved
        return contract

    async def _fence_upload(self, attempt: Attempt) -> UploadFence:
        """Write the upload fence for this attempt, with the row it left. Anything but Fenced means: do not
        touch the partner."""
        answer = await self.host.store.fence_upload(attempt.job_id, attempt.attempt_id)
        if answer.result == FenceResult.LEASE_LAPSED and await self._renewed(attempt):
            answer = await self.host.store.fence_upload(attempt.job_id, attempt.attempt_id)
        return answer

    async def _fence_rename(self, attempt: Attempt) -> FenceResult:
        """Write the rename fence for this attempt. Anything but Fenced means: send no rename."""
        answer = await self.host.store.fence_rename_if_delivering(attempt.job_id, attempt.attempt_id)
        if answer == FenceResult.LEASE_LAPSED and await self._renewed(attempt):
            answer = await self.host.store.fence_rename_if_delivering(attempt.job_id, attempt.attempt_id)
        return answer

    @staticmethod
    async def _renewed(attempt: Attempt) -> bool:
        """A fence refused only for a lapsed lease: still the owner, only late, if a renewal succeeds (it does
        only while no takeover has committed); then the fence is written once more."""
        renewal = await attempt.keeper.renew_now()
        return renewal is not None and renewal.owned

    async def _append(self, job_id: UUID, attempt_id: UUID, evidence: dict[str, Any]) -> None:
        with contextlib.suppress(StoreError, OSError, TimeoutError):
            await self.host.store.append_delivery_evidence(job_id, attempt_id, self.host.worker_id, evidence)

    async def _upload_and_finish(
        self, job: ExportJob, inp: DeliverInput, attempt: Attempt, destination: Destination
    ) -> DeliverResult:
        """Upload to ``destination`` as cutoff 2 authorized it (every observation names its version), then
        the evidence and the terminal write."""
        loop = asyncio.get_running_loop()
        recorder = _EvidenceRecorder(
            self.host.store,
            job.id,
            inp.attempt_id,
            self.host.worker_id,
            loop,
            context={"destination_version": destination.version},
        )
        original = await self._original_file(job)

        def during_upload(sent: int) -> None:
            attempt.sent = sent
            if self.host.seams.during_upload is not None:
                asyncio.run_coroutine_threadsafe(self.host.seams.during_upload(job.id, sent), loop).result()

        def seam(hook: JobSeam | None) -> Callable[..., None] | None:
            # A seam of the delivering thread, run on the event loop (it may wait, or raise: a crash there).
            if hook is None:
                return None

            async def reached() -> None:
                await hook(job.id)

            return lambda *_: asyncio.run_coroutine_threadsafe(reached(), loop).result()

        def authorize_rename() -> bool:
            # In the delivering thread: the rename fence, on the event loop, bounded.
            async def fenced() -> bool:
                if self.host.seams.before_rename_fence is not None:
                    await self.host.seams.before_rename_fence(job.id)
                # What the thread observed so far (the upload) is on record before the rename is sent:
                # appended while the fence is written.
                answer, _ = await asyncio.gather(self._fence_rename(attempt), recorder.drain())
                if answer == FenceResult.FENCED and self.host.seams.after_rename_fence is not None:
                    await self.host.seams.after_rename_fence(job.id)
                if answer == FenceResult.OUTSIDE_WINDOW:
                    # The partner's delivery window closed since cutoff 2 (#25.2): no rename outside it. Why
                    # the fence was refused is kept with the attempt's evidence; the rename is never sent.
                    await self._append(
                        job.id, attempt.attempt_id, {"observation": "rename_fence", "result": answer.value}
                    )
                return answer == FenceResult.FENCED

            return asyncio.run_coroutine_threadsafe(fenced(), loop).result(timeout=FENCE_TIMEOUT_SECONDS)

        file = FileToDeliver(
            path=Path(inp.file.path),
            final_name=inp.file.final_name,
            size=inp.file.size,
            sha256=bytes.fromhex(inp.file.sha256),
            # what the version cutoff 2 authorized asks for beside it, published last (issue #24.6)
            manifests=manifests_for_job(job),
        )
        started = time.perf_counter()
        # The session opened and verified before cutoff 2 (issue #24.4), handed to the upload, which closes it.
        kept = attempt.take_session()
        try:
            # On this object's own threads: a delivery blocks its thread on evidence appends and fences.
            # The thread runs in a copy of this context, so its SFTP spans and log lines join the attempt's.
            report = await loop.run_in_executor(
                self._delivery_threads,
                functools.partial(
                    contextvars.copy_context().run,
                    self.host.partners(destination).deliver,
                    destination,
                    file,
                    inp.attempt_id,
                    original=original,
                    overwrite_agreed=job.overwrite_agreement_ref is not None,
                    on_evidence=recorder.observe_from_thread,
                    hooks=DeliveryHooks(
                        during_upload=during_upload,
                        authorize_rename=authorize_rename,
                        after_rename=seam(self.host.seams.after_rename),
                        before_manifest_rename=seam(self.host.seams.before_manifest_rename),
                    ),
                    session=kept,
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
        cleanup = code == FailureCode.NOT_DELIVERED and destination.temporary_files == "remove"
        # A cleanup opens one more session after the terminal write, which ends the attempt's slot: the
        # cleanup takes the slot over first, so the partner still sees no more sessions than slots.
        cleanup_slot = await self._slot_for_cleanup(job, inp.attempt_id) if cleanup else None
        # A NotDelivered whose evidence names a transient cause (the partner down, a cut session, no space) is
        # tried again after a backoff, within the attempt cap (issue #25.4); its terminal write is the retry's.
        cause = retry_cause(report.outcome, code, report.evidence)
        retried = False
        if cause is not None:
            answer = await self.host.store.retry_delivery_if_delivering(
                job.id, inp.attempt_id, cause, report.summary, self.host.retry_policy
            )
            retried = answer == RetryResult.RETRIED
            finished = _RETRY_FINISH[answer]
        else:
            finished = await self.host.store.finish_delivery(
                job.id, inp.attempt_id, report.outcome, code, summary=report.summary
            )
        if cleanup:
            try:
                if cleanup_slot is not False:
                    await self._clean_up_after_failed(job, inp.attempt_id, destination, finished)
                else:
                    await self._append(
                        job.id,
                        inp.attempt_id,
                        {"observation": "cleanup", "result": "not_asked", "why": "no free session slot"},
                    )
            finally:
                if isinstance(cleanup_slot, uuid.UUID):
                    with contextlib.suppress(StoreError):
                        await self.host.store.release_session_slot(cleanup_slot)
        return DeliverResult(
            delivery=report.outcome,
            failure_code=code,
            finish=finished,
            evidence_appended=recorder.appended,
            evidence_lost=len(recorder.pending),
            failure_cause=cause.value if cause is not None else None,
            retried=retried,
        )

    async def _slot_for_cleanup(self, job: ExportJob, attempt_id: UUID) -> uuid.UUID | bool:
        """A session slot for the cleanup after the terminal write: this attempt's own, taken over (its upload's
        session is closed) for at most ``session_hold_seconds``. The cleanup's holder ID; True when the
        destination has no limit; False when no slot could be had (the cleanup is then not asked for)."""
        holder = uuid.uuid4()
        try:
            answer = await self.host.store.take_session_slot(
                job.tenant_id,
                job.destination_id,
                holder,
                purpose=CLEANUP,
                hold_seconds=self.host.settings.session_hold_seconds,
                adopt=attempt_id,
            )
        except StoreError:
            return False
        if answer.max_sessions is None:
            return True
        return holder if answer.slot is not None else False

    async def _clean_up_after_failed(
        self, job: ExportJob, attempt_id: UUID, destination: Destination, finished: FinishResult
    ) -> None:
        """Under the partner's cleanup agreement, remove this attempt's temporary and set-aside files once
        its export is recorded Failed NotDelivered (no other failure uploads anything), or sent back to be
        tried again (issue #25.4: a new attempt uploads under its own temporary name): by this write, or
        by recovery before it (the row says Failed for this attempt). An uncertain write, or a row that says
        anything else (an OutcomeUnknown keeps its files as evidence), removes nothing. What the removal
        found, a failure included, is evidence, never a change of outcome."""
        if finished == FinishResult.NOT_OWNER:
            try:
                now = await self.host.store.get_job(job.id)
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
                self.host.partners(destination).remove_temporary_files,
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
        original = await self.host.store.get_job(job.replaces_job_id)
        if original is None:
            return None
        return OriginalFile(
            name=original.expected_file_name or original.final_name,
            size=original.expected_file_bytes,
            sha256=original.expected_file_sha256,
            attempt_id=original.attempt_id,
        )


class _EvidenceRecorder:
    """Appends the observations the delivering thread makes, in their order, by one writer on the event loop.

    The thread hands each observation over and goes on; the writer appends what gathered while its last
    append was in flight, or within :data:`EVIDENCE_LINGER_SECONDS`, as one statement
    (``append_delivery_evidence_many``), so a delivery spends its time with the partner, not waiting on one
    insert per observation. The thread waits only for an observation the next step relies on
    (:data:`WAIT_FOR`), which is appended at once with what gathered before it, and everything observed before
    the rename is appended while the rename fence is written, before the rename is sent. A crash loses at most
    what was handed over and not yet appended: the observations of one linger and one round trip. What cannot be
    appended is kept and retried by :meth:`flush`, which the terminal write waits for (evidence first)."""

    def __init__(
        self,
        store: WorkerStore,
        job_id: UUID,
        attempt_id: UUID,
        observed_by: str,
        loop: asyncio.AbstractEventLoop,
        context: dict[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.context = context or {}  # added to every observation (the destination version delivered to)
        self.job_id = job_id
        self.attempt_id = attempt_id
        self.observed_by = observed_by
        self.loop = loop
        self.appended = 0
        self.pending: list[dict[str, Any]] = []
        self._handed_over: list[tuple[dict[str, Any], concurrent.futures.Future[None] | None]] = []
        self._writer: asyncio.Task[None] | None = None
        self._now = asyncio.Event()  # append without lingering: the thread waits, or a drain has begun

    def observe_from_thread(self, evidence: dict[str, Any]) -> None:
        """Called in the delivering thread: hands the observation to the writer; waits until it is appended
        (or set aside for :meth:`flush`) only when it is one of :data:`WAIT_FOR`."""
        waiter: concurrent.futures.Future[None] | None = (
            concurrent.futures.Future() if evidence.get("observation") in WAIT_FOR else None
        )
        self.loop.call_soon_threadsafe(self._hand_over, {**evidence, **self.context}, waiter)
        if waiter is not None:
            waiter.result(timeout=EVIDENCE_TIMEOUT_SECONDS + 5)

    def _hand_over(self, evidence: dict[str, Any], waiter: concurrent.futures.Future[None] | None) -> None:
        self._handed_over.append((evidence, waiter))
        if waiter is not None:
            self._now.set()
        if self._writer is None or self._writer.done():
            self._writer = self.loop.create_task(self._write())

    async def _write(self) -> None:
        try:
            while self._handed_over:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._now.wait(), EVIDENCE_LINGER_SECONDS)
                self._now.clear()
                batch, self._handed_over = self._handed_over, []
                try:
                    await self._append([evidence for evidence, _ in batch])
                except asyncio.CancelledError:  # appended or not: evidence may be appended twice, never lost
                    self.pending.extend(evidence for evidence, _ in batch)
                    raise
                finally:
                    for _, waiter in batch:
                        if waiter is not None and not waiter.done():
                            waiter.set_result(None)
        finally:  # cancelled with the loop: whatever is left is the flush's, and no thread waits forever
            for evidence, waiter in self._handed_over:
                self.pending.append(evidence)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            self._handed_over = []

    async def _append(self, evidence: list[dict[str, Any]]) -> None:
        try:
            await asyncio.wait_for(
                self.store.append_delivery_evidence_many(
                    self.job_id, self.attempt_id, self.observed_by, evidence
                ),
                EVIDENCE_TIMEOUT_SECONDS,
            )
            self.appended += len(evidence)
        except (StoreError, OSError, TimeoutError) as exc:
            log.warning(
                "job %s: %d observations not appended (%s); retrying later",
                self.job_id,
                len(evidence),
                type(exc).__name__,
            )
            self.pending.extend(evidence)

    async def drain(self) -> None:
        """Wait until everything handed over so far is appended (or set aside for :meth:`flush`)."""
        self._now.set()
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    async def flush(self, tries: int = 3) -> None:
        """Wait for the writer to append what the thread handed over, then retry what could not be appended
        (``tries`` times, with a growing pause)."""
        await self.drain()
        for attempt in range(tries):
            if not self.pending:
                return
            retry, self.pending = self.pending, []
            await self._append(retry)
            if self.pending and attempt + 1 < tries:
                await asyncio.sleep(0.5 * (attempt + 1))
        if self.pending:
            log.error("job %s: %d observations could not be appended", self.job_id, len(self.pending))
