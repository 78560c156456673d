"""Build, the partner session, and cutoff 2, in one activity on the claiming host's own queue.

``prepare_delivery`` builds the file with the lease kept and stops watched (heartbeats carry rows and
bytes); then takes one of the partner's session slots (waiting for one, bounded, when the partner is at its
limit: issue #25.3) and opens and verifies the partner session the upload will use (the presented host key
against every pinned one, the login, the remote directory: issue #24.4); then passes cutoff 2 or records why
not. A server whose key matches none of the pinned ones, or that refuses our login, is found here, before
anything is authorized: nothing is sent, the presented fingerprint is recorded, the destination's switch is
paused with the reason, and the attempt is given back uncounted. No attempt crosses cutoff 2 once its
workflow is gone, it is being cancelled, or its worker is draining: the attempt is given back to the queue
instead (``release_attempt_if_running``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.heartbeat import keep_heartbeating, run_to_end
from activities.host import ExportHost
from db.builder import BuildError, BuiltFile, build_export, remove_export_file
from db.errors import StoreError
from domain.destination import Destination
from domain.models import (
    AuthorizationResult,
    ExportJob,
    FailureCode,
    FinishResult,
    JobStatus,
    ReleaseCause,
    ReleaseResult,
    StopPoint,
)
from observability import logs
from observability.metrics import get_metrics
from partner.protocol import TRUST_REFUSALS, PartnerRefused
from rules.outcomes import after_refused_cutoff, after_terminal_write
from rules.ownership import held_by
from rules.policy import evaluate_policy
from runtime.attempts import Attempt, StopReason
from settings import Settings
from workflows.models import AttemptOutcome, LocalFile, PrepareInput, PrepareResult

log = logging.getLogger(__name__)


class PrepareActivity:
    """``export.prepare_delivery`` on one host: at most ``settings.max_concurrent_builds`` builds at once."""

    def __init__(self, host: ExportHost) -> None:
        self.host = host
        self._builds = asyncio.Semaphore(max(1, host.settings.max_concurrent_builds))
        # Opening a partner session blocks a thread for its key exchange and login: on threads of its own, so
        # attempts opening sessions together never queue behind other work of the default executor.
        self._session_threads = ThreadPoolExecutor(
            max_workers=max(1, host.settings.max_concurrent_deliveries), thread_name_prefix="export-session"
        )

    def close(self) -> None:
        """Release the session threads (an open in progress keeps its thread to its end)."""
        self._session_threads.shutdown(wait=False)

    @activity.defn(name="export.prepare_delivery")
    async def prepare_delivery(self, inp: PrepareInput) -> PrepareResult:
        """Build the file with the lease kept and stops watched, then pass cutoff 2 or record why not.

        A stop (recorded stop request seen by a renewal or by ``confirm_stop``, or this activity's
        cancellation) cancels the build, whose partial file is removed, then ``finish_stopped`` runs; it
        writes only if a stop request is recorded. Lost ownership stops at once and writes nothing. A drain,
        a gone workflow or a transient database failure gives the attempt back to the queue. Cutoff 2 is
        never skipped once the file is built, and the file is deleted unless it authorized.
        """
        attempt, created = self.host.open(inp.job_id, inp.attempt_id)
        work = asyncio.create_task(self._prepare(inp, attempt, created))
        return await run_to_end(work, lambda: attempt.stop(StopReason.CANCELLED))

    async def _prepare(self, inp: PrepareInput, attempt: Attempt, created: bool) -> PrepareResult:
        async with self.host.attempts.holding(attempt):
            attempt.stage = "building"
            # The row as the claim on this host wrote it, or (an attempt new here) as read now.
            handed, attempt.claimed = attempt.claimed, None
            job = handed or await self.host.read_job(inp.job_id)
            if job is not None:
                logs.bind_rest_of_task(tenant_id=job.tenant_id)
            if not held_by(job, inp.attempt_id, JobStatus.RUNNING):
                await self.host.attempts.end(attempt)
                return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)
            if created:
                # No claim on this host opened it (a restarted host cannot get here): confirm ownership now.
                first = await attempt.keeper.start()
                if first is not None and not first.owned:
                    await self.host.attempts.end(attempt)
                    return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)
            heartbeat = asyncio.create_task(
                keep_heartbeating(
                    lambda: {"stage": attempt.stage, "rows": attempt.rows, "bytes": attempt.bytes},
                    lambda: self.host.seams.heartbeats_paused,
                )
            )
            built: BuiltFile | None = None
            destination: Destination | None = (
                None  # as the build read it: its version is what cutoff 2 checks
            )
            authorized = False
            try:
                if self.host.attempts.draining:
                    attempt.stop(StopReason.DRAINING)
                if attempt.reason is None:
                    attempt.build = asyncio.create_task(self._build(job, attempt))
                    try:
                        built, destination = await attempt.build
                    except asyncio.CancelledError:
                        if attempt.reason is None:  # not ours: nothing else cancels the build task
                            raise
                    except BuildError as exc:
                        if exc.transient:
                            # The database could not be reached: nothing is wrong with the export. It is
                            # given back to wait and try again, a bounded number of times (23.1).
                            return await self._give_back(
                                job, attempt, ReleaseCause.TRANSIENT, f"build interrupted: {exc.code}"
                            )
                        finished = await self.host.store.finish_failed(
                            job.id, inp.attempt_id, FailureCode.BUILD_FAILED, cause=str(exc)[:200]
                        )
                        return PrepareResult(
                            outcome=after_terminal_write(finished, AttemptOutcome.FAILED),
                            failure_code=FailureCode.BUILD_FAILED
                            if finished == FinishResult.WRITTEN
                            else None,
                        )
                if built is None or destination is None:
                    return await self._stopped_while_building(job, attempt)
                destination_version = destination.version

                if self.host.seams.before_authorize is not None:
                    await self.host.seams.before_authorize(job.id)
                # A slot of the partner's session limit, then the session the upload will use, opened and
                # verified before anything is authorized (#25.3, #24.4).
                attempt.stage = "taking a session slot"
                not_now = await self._take_slot(job, attempt)
                if not_now is not None:
                    return not_now
                # Whether the workflow still runs is asked of Temporal while the session opens: one round trip
                # off the way to cutoff 2, and both answers are in before it.
                workflow_gone = asyncio.create_task(self._workflow_reason())
                workflow_gone.add_done_callback(
                    lambda done: done.cancelled() or done.exception()
                )  # retrieved
                try:
                    not_now = await self._partner_session(job, attempt, destination)
                    if not_now is not None:
                        return not_now
                    refusal = self._local_reason(attempt) or await workflow_gone
                finally:
                    workflow_gone.cancel()
                if refusal is not None:
                    return await self._give_back(job, attempt, *refusal)
                try:
                    answers = await self._cutoff_2(job, attempt, built, destination_version)
                except StoreError as exc:
                    # Cutoff 2 could not read a fact it decides on (a delivery switch, the destination, the
                    # creator): it authorized nothing, so nothing has left the host. The attempt is given
                    # back without using one up, never left to its lease (23.5). The release reads none of
                    # those facts.
                    return await self._give_back(
                        job, attempt, ReleaseCause.TRANSIENT, f"cutoff 2 not decided: {type(exc).__name__}"
                    )
                answer = answers[-1]
                if answer != AuthorizationResult.AUTHORIZED:
                    # Closed before any write that ends the attempt: the write ends its slot too (0029).
                    await attempt.close_session()
                if answer == AuthorizationResult.AUTHORIZED:
                    authorized = True
                    attempt.stage = "authorized"
                    # The upload on this host uses it if cutoff 2 authorized this very version (its fence's
                    # answer says which it did), and reads nothing before its fence.
                    attempt.contract = destination
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
                    finished = await self.host.store.finish_stopped(
                        job.id, inp.attempt_id, StopPoint.BEFORE_DELIVERY
                    )
                    return PrepareResult(
                        outcome=after_terminal_write(finished, AttemptOutcome.STOPPED), cutoff_answers=answers
                    )
                if answer == AuthorizationResult.ORIGINAL_COMPLETED:
                    # A replacement whose original was corrected to Completed: nothing has left the host.
                    finished = await self.host.store.finish_failed(
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
                    given_back = await self._give_back(
                        job, attempt, ReleaseCause.PAUSED, f"cutoff 2: {answer.value}"
                    )
                    return given_back.model_copy(update={"cutoff_answers": answers})
                if answer == AuthorizationResult.DESTINATION_CHANGED:
                    # An admin changed what a delivery uses (host, credentials, keys, format) after the build
                    # read the destination: this file is for a version cutoff 2 no longer authorizes. Nothing
                    # has left the host; given back uncounted, the next claim rebuilds for the new version.
                    given_back = await self._give_back(
                        job,
                        attempt,
                        ReleaseCause.DESTINATION_CHANGED,
                        f"cutoff 2: the destination's delivery terms changed after version {destination_version},"
                        " which this file was built for",
                    )
                    return given_back.model_copy(update={"cutoff_answers": answers})
                if answer == AuthorizationResult.WINDOW_CLOSED:
                    # The partner's delivery window closed during the build (issue #25.2): nothing has left the
                    # host. Given back uncounted; the next claim waits for the window's next opening.
                    given_back = await self._give_back(
                        job,
                        attempt,
                        ReleaseCause.WINDOW_CLOSED,
                        "cutoff 2: the destination's delivery window closed during the build",
                    )
                    return given_back.model_copy(update={"cutoff_answers": answers})
                if answer == AuthorizationResult.POLICY_DENIED:
                    # The creator may no longer export, or the list is gone (001: facts outside the row):
                    # nothing has left the host. Given back with the policy's reason; the next claim's
                    # policy check rejects it with that reason.
                    given_back = await self._give_back(
                        job, attempt, ReleaseCause.POLICY, f"cutoff 2: {await self._policy_reason(job)}"
                    )
                    return given_back.model_copy(update={"cutoff_answers": answers})
                # LeaseLapsed again, NotOwner or Unknown: write nothing; recovery reads the row.
                return PrepareResult(outcome=after_refused_cutoff(answer), cutoff_answers=answers)
            finally:
                heartbeat.cancel()
                if not authorized:
                    await self.host.attempts.end(attempt)  # closes a session still kept
                if built is not None and not authorized:
                    remove_export_file(built.path)

    async def _build(self, job: ExportJob, attempt: Attempt) -> tuple[BuiltFile, Destination]:
        """The file, and the destination as read before it was built: its version is the one cutoff 2 must
        still find, for every term a delivery uses (issue #24.2), and its pinned keys are what the session
        opened before cutoff 2 is verified against."""

        def progress(rows: int, size: int) -> None:
            attempt.rows, attempt.bytes = rows, size

        if self.host.seams.before_build is not None:
            await self.host.seams.before_build(job.id)
        # What the partner receives (its format, keys and signing key reference) is the destination's.
        try:
            destination = await self.host.store.load_destination(job.tenant_id, job.destination_id)
        except StoreError as exc:
            raise BuildError("DestinationUnreadable", type(exc).__name__, transient=True) from None
        # At most max_concurrent_builds at once: waiting here holds no connection, and the keeper renews.
        async with self._builds:
            started = time.perf_counter()
            built = await build_export(
                self.host.build_pool,
                tenant_id=job.tenant_id,
                list_name=job.list_name,
                delivery_key=job.delivery_key,
                attempt_id=attempt.attempt_id,
                work_dir=self.host.settings.work_dir,
                file_format=destination.file_format,
                signing_passphrase=_signing_passphrase(self.host.settings)
                if destination.pgp_signing_key_ref is not None
                else None,
                progress=progress,
            )
        get_metrics().observe_build(time.perf_counter() - started, built.rows, built.size)
        attempt.rows, attempt.bytes = built.rows, built.size
        if self.host.seams.after_build is not None:
            try:
                await self.host.seams.after_build(job.id)
            except BaseException:  # a stop, or a simulated crash: the built file goes either way
                remove_export_file(built.path)
                raise
        return built, destination

    # -- the partner's session slot and the session itself, before cutoff 2 --------------------------------

    async def _partner_session(
        self, job: ExportJob, attempt: Attempt, destination: Destination
    ) -> PrepareResult | None:
        """Open and verify the session the upload will use, on the slot the attempt holds, and keep it in the
        attempt. ``None``: go on to cutoff 2 (with the session, or, when the partner did not answer, without
        one: the upload then tries again). Otherwise what the attempt ended with: given back for a server it
        must not trust (after the destination was paused)."""
        attempt.stage = "opening the partner session"
        partner = self.host.partners(destination)
        try:
            attempt.session = await asyncio.get_running_loop().run_in_executor(
                self._session_threads,
                functools.partial(contextvars.copy_context().run, partner.open_session, destination),
            )
        except PartnerRefused as exc:
            evidence = {
                "observation": "connect",
                "result": "refused",
                "phase": "before cutoff 2",
                "code": exc.code,
                "destination_version": destination.version,
                **({"presented": exc.presented} if exc.presented else {}),
            }
            await self._append(job, attempt, evidence)
            if exc.code in TRUST_REFUSALS:
                return await self._refused_by_partner(job, attempt, destination, exc)
            # Not answered (or refused for a reason of ours, such as an unreadable key): nothing was sent and
            # nothing is decided here; the upload opens its own session and its rules classify what it meets.
            log.info("job %s: no partner session before cutoff 2 (%s); the upload will try", job.id, exc.code)
        except Exception as exc:  # noqa: BLE001 - a defect here must not cost the attempt: the upload retries
            log.warning("job %s: partner session not opened before cutoff 2 (%s)", job.id, type(exc).__name__)
        finally:
            attempt.stage = "authorizing"
        return None

    async def _take_slot(self, job: ExportJob, attempt: Attempt) -> PrepareResult | None:
        """One of the destination's session slots for this attempt, by the conditional statement
        ``take_session_slot``; while none is free, ask again with a growing pause (heartbeating, the lease kept),
        for at most ``session_slot_wait_seconds``, then give the job back (``session_limit``: not counted, the
        next claim waits ``session_slot_retry_seconds``). The wait is recorded once as evidence ("waiting for a
        delivery slot: 2 of 2 in use"), which the console shows. ``None``: a slot is held, or there is no
        limit."""
        settings = self.host.settings
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.session_slot_wait_seconds
        pause = 0.2
        waited_since: float | None = None
        seen: tuple[int, int] | None = None
        while True:
            stopped = await self._stopped_while_waiting(job, attempt)
            if stopped is not None:
                return stopped
            try:
                answer = await self.host.store.take_session_slot(
                    job.tenant_id, job.destination_id, attempt.attempt_id, job_id=job.id
                )
            except StoreError as exc:
                # No answer: the slot may be taken or not; the same holder finds it again on the next ask, and
                # a give-back ends it either way.
                log.info("job %s: session slot not answered (%s)", job.id, type(exc).__name__)
                answer = None
            if answer is not None:
                if answer.max_sessions is None or answer.slot is not None:
                    if waited_since is not None:
                        attempt.waiting_for_slot = None
                        await self._append(
                            job,
                            attempt,
                            {
                                "observation": "session_slot",
                                "result": "taken",
                                "slot": answer.slot,
                                "limit": answer.max_sessions,
                                "waited_seconds": round(loop.time() - waited_since, 3),
                            },
                        )
                    return None
                if not answer.eligible:
                    # The attempt no longer holds its job with a current lease: renew once (only late), else
                    # it is not ours any more and nothing may be opened for it.
                    renewal = await attempt.keeper.renew_now()
                    if renewal is None:
                        return PrepareResult(outcome=AttemptOutcome.LEFT_TO_RECOVERY)
                    if not renewal.owned:
                        return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)
                else:
                    seen = (answer.in_use, answer.max_sessions)
                    if waited_since is None:
                        waited_since = loop.time()
                        attempt.waiting_for_slot = seen
                        attempt.stage = "waiting for a delivery slot"
                        await self._append(
                            job,
                            attempt,
                            {
                                "observation": "session_slot",
                                "result": "waiting",
                                "in_use": answer.in_use,
                                "limit": answer.max_sessions,
                            },
                        )
            if loop.time() >= deadline:
                attempt.waiting_for_slot = None
                in_use = f" ({seen[0]} of {seen[1]} in use)" if seen else ""
                return await self._give_back(
                    job,
                    attempt,
                    ReleaseCause.SESSION_LIMIT,
                    f"no delivery slot came free within {settings.session_slot_wait_seconds:g} s{in_use}",
                    wait_seconds=settings.session_slot_retry_seconds,
                )
            await asyncio.sleep(min(pause * (0.5 + random.random() / 2), max(0.0, deadline - loop.time())))
            pause = min(pause * 1.5, 5.0)

    async def _stopped_while_waiting(self, job: ExportJob, attempt: Attempt) -> PrepareResult | None:
        """What ends an attempt that waits for a session slot: a drain or a cancelled activity gives it back,
        a stop request is honored (Stopped, before delivery), a lost job ends it here."""
        if self.host.attempts.draining or attempt.reason == StopReason.DRAINING:
            return await self._give_back(job, attempt, ReleaseCause.DRAIN, "worker draining")
        if attempt.reason == StopReason.OWNERSHIP_LOST:
            return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)
        if attempt.reason == StopReason.CANCELLED or activity.is_cancelled():
            return await self._give_back(job, attempt, ReleaseCause.WORKFLOW, "activity cancelled")
        if attempt.reason == StopReason.STOP_REQUESTED:
            finished = await self.host.store.finish_stopped(
                job.id,
                attempt.attempt_id,
                StopPoint.BEFORE_DELIVERY,
                note="while waiting for a delivery slot",
            )
            if finished == FinishResult.WRITTEN:
                return PrepareResult(outcome=AttemptOutcome.STOPPED)
            if finished == FinishResult.NOT_OWNER:
                return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)
            return PrepareResult(outcome=AttemptOutcome.LEFT_TO_RECOVERY)
        return None

    async def _refused_by_partner(
        self, job: ExportJob, attempt: Attempt, destination: Destination, exc: PartnerRefused
    ) -> PrepareResult:
        """The server presented a host key none of the pinned ones match, or refused our login: nothing was
        sent, and nothing must be until a person looks. The destination's switch is paused with the reason
        (the worker's one way to, 0029), then the attempt is given back, not counted: the paused scope keeps
        the export Queued until an operator resumes it, after an admin pinned the right key. A destination an
        admin changed since the build read it is not paused: the attempt is given back to be rebuilt."""
        if exc.code == "HostKeyMismatch":
            reason = f"host key changed: presented {exc.presented or 'an unknown key'}"
        else:
            reason = (
                f"authentication refused: {destination.username} at {destination.host}:{destination.port}"
            )
        try:
            pause = await self.host.store.pause_destination_for_partner(
                job.tenant_id,
                job.destination_id,
                destination.version,
                reason,
                f"worker {self.host.worker_id}",
            )
        except StoreError as exc_store:
            # The pause is not known to be written: the attempt is still given back (nothing was sent); the
            # next attempt meets the same server and tries again.
            log.warning("job %s: destination not paused (%s)", job.id, type(exc_store).__name__)
            return await self._give_back(job, attempt, ReleaseCause.TRANSIENT, f"{reason}; the pause failed")
        if pause.destination_changed:
            return await self._give_back(
                job,
                attempt,
                ReleaseCause.DESTINATION_CHANGED,
                f"{reason}, at version {destination.version}, which an admin changed since",
            )
        log.warning("job %s: %s; deliveries to %s paused", job.id, reason, destination.name)
        paused = "paused" if pause.paused else "already paused"
        return await self._give_back(
            job, attempt, ReleaseCause.PAUSED, f"{reason}; deliveries to {destination.name} {paused}"
        )

    async def _append(self, job: ExportJob, attempt: Attempt, evidence: dict[str, object]) -> None:
        """Keep an observation of this attempt (before cutoff 2) as evidence; a failure to store it is logged,
        never a reason to decide otherwise."""
        try:
            await self.host.store.append_delivery_evidence(
                job.id, attempt.attempt_id, self.host.worker_id, evidence
            )
        except StoreError as exc:
            log.info("job %s: evidence not appended (%s)", job.id, type(exc).__name__)

    async def _stopped_while_building(self, job: ExportJob, attempt: Attempt) -> PrepareResult:
        if attempt.reason == StopReason.OWNERSHIP_LOST:
            return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)
        if attempt.reason == StopReason.DRAINING:
            return await self._give_back(job, attempt, ReleaseCause.DRAIN, "worker draining")
        # Writes only when a stop request is recorded: a cancellation for any other reason (a timed-out
        # heartbeat, a gone workflow) matches nothing and leaves the attempt to its lease.
        finished = await self.host.store.finish_stopped(
            job.id, attempt.attempt_id, StopPoint.WHILE_BUILDING, note=str(attempt.reason)
        )
        if finished == FinishResult.WRITTEN:
            return PrepareResult(outcome=AttemptOutcome.STOPPED)
        if finished == FinishResult.NOT_OWNER and attempt.reason == StopReason.STOP_REQUESTED:
            return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)
        return PrepareResult(outcome=AttemptOutcome.LEFT_TO_RECOVERY)

    async def _give_back(
        self,
        job: ExportJob,
        attempt: Attempt,
        cause: ReleaseCause,
        reason: str,
        *,
        wait_seconds: float | None = None,
    ) -> PrepareResult:
        """Running -> Queued for this attempt, which is not counted against the job's attempts; a give-back
        for a failure makes the next claim wait, and past the bound ends the job Failed (AttemptsExhausted)
        instead (``rules.releases``); ``wait_seconds`` makes an uncounted one wait too. A recorded stop
        request is honored instead (Stopped), never released into the queue again. A kept partner session is
        closed first: the give-back ends the attempt's session slot."""
        await attempt.close_session()
        released = await self.host.store.release_attempt_if_running(
            job.id,
            attempt.attempt_id,
            self.host.worker_id,
            reason,
            cause,
            self.host.release_policy,
            wait_seconds=wait_seconds,
        )
        if released == ReleaseResult.RELEASED:
            log.info(
                "job %s attempt %s given back to the queue (%s: %s)",
                job.id,
                attempt.attempt_id,
                cause,
                reason,
            )
            return PrepareResult(outcome=AttemptOutcome.RELEASED)
        if released == ReleaseResult.EXHAUSTED:
            log.info("job %s attempt %s: given back too often, ended Failed", job.id, attempt.attempt_id)
            return PrepareResult(outcome=AttemptOutcome.FAILED, failure_code=FailureCode.ATTEMPTS_EXHAUSTED)
        if released == ReleaseResult.NOT_OWNER:
            finished = await self.host.store.finish_stopped(
                job.id, attempt.attempt_id, StopPoint.WHILE_BUILDING, note=reason
            )
            if finished == FinishResult.WRITTEN:
                return PrepareResult(outcome=AttemptOutcome.STOPPED)
            if finished == FinishResult.NOT_OWNER:
                return PrepareResult(outcome=AttemptOutcome.NOT_OWNER)
        return PrepareResult(outcome=AttemptOutcome.LEFT_TO_RECOVERY)

    def _local_reason(self, attempt: Attempt) -> tuple[ReleaseCause, str] | None:
        """Why this attempt must not cross cutoff 2 now, as this host knows it, with the cause of its
        give-back, or ``None``: its worker is draining, or it is being cancelled."""
        if self.host.attempts.draining or attempt.reason == StopReason.DRAINING:
            return ReleaseCause.DRAIN, "worker draining"
        if attempt.reason == StopReason.CANCELLED or activity.is_cancelled():
            return ReleaseCause.WORKFLOW, "activity cancelled"
        return None

    async def _workflow_reason(self) -> tuple[ReleaseCause, str] | None:
        """Why this attempt must not cross cutoff 2, as Temporal knows it, or ``None``: its workflow is no
        longer running (terminated, timed out, ended without it) or cannot be confirmed (Temporal unreachable
        or throttling)."""
        if self.host.seams.workflow_check_disabled:
            return None
        info = activity.info()
        if info.workflow_id is None:
            return ReleaseCause.WORKFLOW, "workflow not confirmed (no workflow)"
        try:
            described = (
                await activity.client()
                .get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
                .describe(rpc_timeout=timedelta(seconds=10))
            )
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return ReleaseCause.WORKFLOW, "workflow gone"
            return ReleaseCause.WORKFLOW, f"workflow not confirmed ({exc.status.name})"
        except (RuntimeError, TimeoutError) as exc:
            return ReleaseCause.WORKFLOW, f"workflow not confirmed ({type(exc).__name__})"
        if described.status in (WorkflowExecutionStatus.TERMINATED, WorkflowExecutionStatus.CANCELED):
            # A person ended it (the Web UI, the CLI): not a failure of the export, and no loop.
            return ReleaseCause.TERMINATED, f"workflow {described.status.name.lower()}"
        if described.status != WorkflowExecutionStatus.RUNNING:
            status = described.status.name.lower() if described.status else "gone"
            return ReleaseCause.WORKFLOW, f"workflow {status}"
        return None

    async def _policy_reason(self, job: ExportJob) -> str:
        """The policy's reason for refusing ``job`` now (the message the next claim's rejection records),
        read afresh; a generic one when the facts cannot be read or now allow it."""
        try:
            facts = await self.host.store.read_policy_facts(job.id)
        except StoreError:
            facts = None
        decision = evaluate_policy(facts) if facts is not None else None
        if decision is None or decision.allowed:
            return "the creator or the list no longer passes the policy check"
        return decision.message

    async def _cutoff_2(
        self, job: ExportJob, attempt: Attempt, built: BuiltFile, destination_version: int
    ) -> list[AuthorizationResult]:
        async def authorize() -> AuthorizationResult:
            return await self.host.store.authorize_delivery_if_running(
                tenant_id=job.tenant_id,
                job_id=job.id,
                attempt_id=attempt.attempt_id,
                replaces_job_id=job.replaces_job_id,
                final_name=built.final_name,
                length=built.size,
                sha256=built.sha256,
                rows=built.rows,
                evidence=built.evidence(),
                destination_version=destination_version,
            )

        answers = [await authorize()]
        if answers[-1] == AuthorizationResult.LEASE_LAPSED:
            # Still the owner, only late: a renewal succeeds only if no takeover has committed. Retry once.
            renewal = await attempt.keeper.renew_now()
            if renewal is not None and renewal.owned:
                answers.append(await authorize())
        return answers


def _signing_passphrase(settings: Settings) -> str | None:
    """The passphrase of protected signing keys, from its setting or its secrets file (first line); never
    logged, and a file that cannot be read fails the build with codes only."""
    if settings.signing_key_passphrase is not None:
        return settings.signing_key_passphrase.get_secret_value()
    if settings.signing_key_passphrase_file is None:
        return None
    try:
        lines = settings.signing_key_passphrase_file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BuildError("SigningKeyLocked", f"passphrase file unreadable ({type(exc).__name__})") from None
    return lines[0] if lines else None
