"""The worker's protocol (role ``exports_worker``): the policy facts and rejection, cutoff 1 (the
claim), cutoff 2 (the authorization), lease renewal, the give-back, the fences, the terminal writes, and
the sweeper's re-wake of stale queued jobs. Every write repeats its conditions; the claim and cutoff 2
answer with the row, and a lost answer is re-read with state and ownership together (000).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from psycopg_pool import AsyncConnectionPool

from db.errors import (
    TransientStoreError,
    translated,
)
from db.queries import fetch, fetch_maybe
from db.rows import (
    ClaimAnswer,
    CutoffAnswer,
    EventIdRow,
    FenceAnswer,
    JobIdRow,
    PartnerPause,
    ReleaseRow,
    RenewalRow,
    RetryRow,
    StoppedRow,
    UploadFenceAnswer,
)
from db.stores.base import REREAD_TIMEOUT_SECONDS, observe_stop, transition
from db.stores.evidence import EvidenceStatements
from db.stores.reads import Reads
from db.stores.slots import SlotStatements
from domain.controls import PolicyFacts
from domain.models import (
    AuthorizationResult,
    Claim,
    ClaimResult,
    DeliveryOutcome,
    EventKind,
    FailureCause,
    FailureCode,
    FenceResult,
    FinishResult,
    JobStatus,
    OwnershipState,
    RejectionCode,
    ReleaseCause,
    ReleaseResult,
    Renewal,
    RetryResult,
    Statement,
    StopPoint,
    UploadFence,
)
from observability.metrics import StopPath, get_metrics
from observability.tracing import current_traceparent
from rules.cutoff import authorization_from
from rules.ownership import held_by
from rules.releases import ReleasePolicy
from rules.retries import RetryPolicy, is_transient

DEFAULT_RELEASE_POLICY = ReleasePolicy()

log = logging.getLogger(__name__)

_DELIVERY_FAILURE_CODES = {
    FailureCode.NOT_DELIVERED,
    FailureCode.FINAL_NAME_OCCUPIED,
    FailureCode.ORIGINAL_DELIVERED,
}
# The cancellation outcomes whose ledger transaction changed the job row (Canceled, or a stop request).
_RUNNING_FAILURE_CODES = {
    FailureCode.BUILD_FAILED,
    FailureCode.FINAL_NAME_OCCUPIED,
    FailureCode.ORIGINAL_DELIVERED,
}


class ProtocolStatements(Reads):
    """The worker's row protocol: claim, cutoff 2, renewal, give-back, fences, terminal writes, sweep."""

    window_margin_seconds: float = 5.0  # the rename fence's look-ahead into the delivery window (#25.2)

    async def read_policy_facts(self, job_id: UUID) -> PolicyFacts | None:
        """What the policy check evaluates, read in one statement; ``None`` when there is no such job."""
        return await self._row("read_policy_facts", {"job_id": job_id}, PolicyFacts)

    @transition(Statement.REJECT_IF_QUEUED)
    async def reject_if_queued(
        self, job_id: UUID, checked_version: int, code: RejectionCode, message: str
    ) -> bool:
        """Queued -> Rejected for the evaluated version only, with its reason code and message."""
        return await self._matched(
            "reject_if_queued",
            job_id=job_id,
            checked_version=checked_version,
            code=code.value,
            message=message,
        )

    async def claim_if_queued(
        self,
        job_id: UUID,
        checked_version: int,
        attempt_id: UUID,
        worker_id: str,
        workflow_id: str | None = None,
    ) -> ClaimResult:
        """Cutoff 1 (:meth:`claim`), its result alone."""
        return (await self.claim(job_id, checked_version, attempt_id, worker_id, workflow_id)).result

    @transition(Statement.CLAIM_IF_QUEUED)
    async def claim(
        self,
        job_id: UUID,
        checked_version: int,
        attempt_id: UUID,
        worker_id: str,
        workflow_id: str | None = None,
    ) -> Claim:
        """Cutoff 1, with the row as it wrote it when it claimed. Claimed only if the row is Running with this attempt: from the statement's own
        answer, or, when that answer was lost, from a re-read of state and ownership. NotYet when the
        claim matched nothing because the job waits after a give-back, Paused when only because a
        delivery switch of the job's scope is paused, OutsideWindow when only because its destination's
        delivery window is closed (the statement then made the job wait for the next opening, with a wake-up
        deferred as long); in each case the job is still Queued at the version checked."""
        answers = await self._unless_lost(
            "claim_if_queued",
            {
                "job_id": job_id,
                "checked_version": checked_version,
                "attempt_id": attempt_id,
                "worker_id": worker_id,
                "workflow_id": workflow_id,
                "lease_seconds": self.lease_seconds,
                "traceparent": current_traceparent(),
            },
            ClaimAnswer,
        )
        if answers is not None:
            found = answers[0] if answers else None
            assert found is None or isinstance(found, ClaimAnswer)
            if found is not None and found.matched:
                return Claim(result=ClaimResult.CLAIMED, job=found.job())
            if found is not None and found.status == JobStatus.QUEUED and found.version == checked_version:
                if not found.available:
                    return Claim(result=ClaimResult.NOT_YET)
                if not found.deliveries_open:
                    return Claim(result=ClaimResult.PAUSED)
                if not found.window_open:
                    return Claim(result=ClaimResult.OUTSIDE_WINDOW)
            status, owner = (found.status, found.attempt_id) if found else (None, None)
        else:
            try:
                state = await self._reread(job_id)
            except TransientStoreError:
                return Claim(result=ClaimResult.UNKNOWN)
            status, owner = (state.status, state.attempt_id) if state else (None, None)
        # State and ownership together: Running with this attempt's ID, and nothing else, means claimed
        # (a retry of a claim whose first answer was lost finds its own claim).
        if status == JobStatus.RUNNING and owner == attempt_id:
            return Claim(result=ClaimResult.CLAIMED)
        return Claim(result=ClaimResult.LOST)

    @transition(Statement.ADOPT_CLAIM_IF_RUNNING)
    async def adopt_claim_if_running(self, job_id: UUID, attempt_id: UUID, worker_id: str) -> bool:
        """A claim confirmed on ``worker_id`` after its first answer was lost elsewhere: the row names this
        host from now on (no status change). False when the row already names it, or the attempt no longer
        holds a Running job."""
        return await self._matched(
            "adopt_claim_if_running", job_id=job_id, attempt_id=attempt_id, worker_id=worker_id
        )

    @transition(Statement.AUTHORIZE_DELIVERY_IF_RUNNING)
    async def authorize_delivery_if_running(
        self,
        *,
        tenant_id: UUID,
        job_id: UUID,
        attempt_id: UUID,
        replaces_job_id: UUID | None,
        final_name: str,
        length: int,
        sha256: bytes,
        rows: int | None = None,
        evidence: Mapping[str, object] | None = None,
        destination_version: int | None = None,
    ) -> AuthorizationResult:
        """Cutoff 2, reporting why delivery was refused from the statement's own answer (or, when that
        answer was lost, from a re-read).

        The DeliveryAuthorized event's detail is the attempt's file evidence as JSON: the file, its bytes,
        SHA-256 and rows, and whatever ``evidence`` adds (the builder's: the plaintext's hash and size, the
        format, the OpenPGP fingerprints). IDs, sizes, hashes and fingerprints only. ``destination_version`` is
        the version of the destination the build read: cutoff 2 authorizes delivery only while nothing a
        delivery uses changed since (``None``: not checked, for callers that built nothing from the
        destination; the worker always passes it).
        """
        detail = {
            "file": final_name,
            "bytes": length,
            "sha256": sha256.hex(),
            "rows": rows,
            **(evidence or {}),
        }
        answers = await self._unless_lost(
            "authorize_delivery_if_running",
            {
                "tenant_id": tenant_id,
                "job_id": job_id,
                "attempt_id": attempt_id,
                "replaces_job_id": replaces_job_id,
                "final_name": final_name,
                "length": length,
                "sha256": sha256,
                "rows": rows,
                "detail": json.dumps(detail, sort_keys=True),
                "destination_version": destination_version,
                "lease_seconds": self.lease_seconds,
            },
            CutoffAnswer,
        )
        if answers is None:
            try:
                return authorization_from(await self._reread(job_id), attempt_id)
            except TransientStoreError:
                return AuthorizationResult.UNKNOWN
        if not answers:
            return AuthorizationResult.NOT_OWNER  # no such job
        found = answers[0]
        if found.matched:
            return AuthorizationResult.AUTHORIZED
        return authorization_from(
            OwnershipState(
                status=found.status,
                attempt_id=found.attempt_id,
                stop_request_id=found.stop_request_id,
                lease_current=found.lease_current,
                original_status=found.original_status,
            ),
            attempt_id,
            destination_usable=found.destination_usable,
            deliveries_open=found.deliveries_open,
            policy_allows=found.policy_allows,
            destination_unchanged=found.destination_unchanged,
            window_open=found.window_open,
        )

    async def renew_lease(self, job_id: UUID, attempt_id: UUID) -> Renewal:
        """Renew this attempt's lease; ``owned=False`` means a takeover or terminal write has ended it.

        Raises ``TransientStoreError`` when the database did not answer: the keeper retries next interval.
        """
        row = await self._row(
            "renew_lease",
            {"job_id": job_id, "attempt_id": attempt_id, "lease_seconds": self.lease_seconds},
            RenewalRow,
        )
        if row is None:
            return Renewal(owned=False, stop_requested=False)
        return Renewal(owned=True, stop_requested=row.stop_requested, status=row.status)

    @transition(Statement.RELEASE_ATTEMPT_IF_RUNNING)
    async def release_attempt_if_running(
        self,
        job_id: UUID,
        attempt_id: UUID,
        worker_id: str,
        reason: str,
        cause: ReleaseCause = ReleaseCause.DRAIN,
        policy: ReleasePolicy = DEFAULT_RELEASE_POLICY,
        wait_seconds: float | None = None,
    ) -> ReleaseResult:
        """Running -> Queued by the attempt that holds the job, before cutoff 2, without using up an
        attempt; ``worker_id`` is the host giving it back (its event names it).

        A give-back for a failure (``policy.counts(cause)``) makes the next claim wait and, past the
        policy's bound, ends the job Failed (AttemptsExhausted) instead: Released, Exhausted, NotOwner (the
        row is no longer this attempt's, or it has a stop request to honor instead), or Unknown (the answer
        and its re-read were lost). ``wait_seconds`` makes an uncounted give-back's next claim wait too (a
        partner at its session limit, 25.3). The give-back ends the attempt's session slot with its hold of
        the job, in the same statement (0029).
        """
        params = {
            "job_id": job_id,
            "attempt_id": attempt_id,
            "worker_id": worker_id,
            "reason": reason,
            "cause": cause.value,
            "counted": policy.counts(cause),
            "base_seconds": policy.base_seconds,
            "cap_seconds": policy.cap_seconds,
            "max_releases": policy.max_releases,
            "jitter": policy.jitter(),
            # not counted, but the next claim waits for the delivery window's next opening (#25.2)
            "until_window_opens": cause == ReleaseCause.WINDOW_CLOSED,
            "wait_seconds": None if policy.counts(cause) else wait_seconds,
            "traceparent": current_traceparent(),
        }
        answers = await self._unless_lost("release_attempt_if_running", params, ReleaseRow)
        if answers:
            ended = ReleaseResult.EXHAUSTED if answers[0].ending == "Exhausted" else ReleaseResult.RELEASED
            get_metrics().count_release(cause.value, ended.value)
            return ended
        if answers is not None:
            return ReleaseResult.NOT_OWNER
        try:
            state = await self._reread(job_id)
        except TransientStoreError:
            return ReleaseResult.UNKNOWN
        # A lost answer: released if the row is Queued again with this attempt's Released event, exhausted
        # if it is Failed with this attempt's AttemptsExhausted event.
        if state is not None and state.status in (JobStatus.QUEUED, JobStatus.FAILED):
            kinds = {e.kind for e in await self.job_events(job_id) if e.attempt_id == attempt_id}
            if state.status == JobStatus.QUEUED and EventKind.RELEASED in kinds:
                get_metrics().count_release(cause.value, ReleaseResult.RELEASED.value)
                return ReleaseResult.RELEASED
            if state.status == JobStatus.FAILED and EventKind.ATTEMPTS_EXHAUSTED in kinds:
                get_metrics().count_release(cause.value, ReleaseResult.EXHAUSTED.value)
                return ReleaseResult.EXHAUSTED
        return ReleaseResult.NOT_OWNER

    async def fence_upload_if_delivering(self, job_id: UUID, attempt_id: UUID) -> FenceResult:
        """The upload fence: Fenced only if this attempt, Delivering with a current lease, wrote it (or,
        after a lost answer, the re-read shows its own fence). Nothing may be sent to the partner otherwise."""
        return (await self.fence_upload(job_id, attempt_id)).result

    @transition(Statement.FENCE_UPLOAD_IF_DELIVERING)
    async def fence_upload(self, job_id: UUID, attempt_id: UUID) -> UploadFence:
        """The upload fence (:meth:`fence_upload_if_delivering`) with the row it left, so the upload need not
        read it first; no row when only the re-read after a lost answer decided."""
        answers = await self._unless_lost(
            "fence_upload_if_delivering", {"job_id": job_id, "attempt_id": attempt_id}, UploadFenceAnswer
        )
        if answers is None:
            return UploadFence(result=await self._fence_reread(job_id, attempt_id, rename=False))
        if not answers:
            return UploadFence(result=FenceResult.NOT_OWNER)
        found = answers[0]
        assert isinstance(found, UploadFenceAnswer)
        return UploadFence(result=fence_result(found, attempt_id), job=found.job())

    @transition(Statement.FENCE_RENAME_IF_DELIVERING)
    async def fence_rename_if_delivering(self, job_id: UUID, attempt_id: UUID) -> FenceResult:
        """The rename fence, after the upload and before the rename request: the rename is never sent
        unless this is Fenced."""
        return await self._fence("fence_rename_if_delivering", job_id, attempt_id, rename=True)

    async def _fence(self, name: str, job_id: UUID, attempt_id: UUID, *, rename: bool) -> FenceResult:
        params: dict[str, object] = {"job_id": job_id, "attempt_id": attempt_id}
        if rename:
            # the rename fence requires the delivery window open this long after it, too (#25.2)
            params["window_margin_seconds"] = self.window_margin_seconds
        answers = await self._unless_lost(name, params, FenceAnswer)
        if answers is None:
            return await self._fence_reread(job_id, attempt_id, rename=rename)
        if not answers:
            return FenceResult.NOT_OWNER
        return fence_result(answers[0], attempt_id)

    async def _fence_reread(self, job_id: UUID, attempt_id: UUID, *, rename: bool) -> FenceResult:
        """A fence whose answer was lost, decided from a re-read of state and ownership: Fenced only when
        this attempt's own fence is on the row."""
        try:
            state = await self._reread(job_id)
        except TransientStoreError:
            return FenceResult.UNKNOWN
        if state is None:
            return FenceResult.NOT_OWNER
        found = FenceAnswer(
            matched=False,
            status=state.status,
            attempt_id=state.attempt_id,
            fenced=state.rename_fenced if rename else state.upload_fenced,
            lease_current=state.lease_current,
        )
        return fence_result(found, attempt_id)

    async def _finish(
        self,
        name: str,
        params: dict[str, Any],
        job_id: UUID,
        attempt_id: UUID,
        expect: JobStatus,
        row: type[EventIdRow] = EventIdRow,
    ) -> FinishResult:
        written = await self._unless_lost(name, params, row)
        if written:
            if isinstance(written[0], StoppedRow):
                observe_stop(written[0], StopPath.WORKER)
            return FinishResult.WRITTEN
        try:
            state = await self._reread(job_id)
        except TransientStoreError:
            return FinishResult.UNKNOWN
        # A repeated call after a lost response finds its own terminal state; anything else is not ours.
        lost = written is None
        if lost and held_by(state, attempt_id, expect):
            return FinishResult.WRITTEN
        return FinishResult.NOT_OWNER

    @transition(Statement.FINISH_STOPPED)
    async def finish_stopped(
        self, job_id: UUID, attempt_id: UUID, stop_point: StopPoint, note: str = ""
    ) -> FinishResult:
        """Running -> Stopped for this attempt, only with a recorded stop request."""
        return await self._finish(
            "finish_stopped",
            {"job_id": job_id, "attempt_id": attempt_id, "stop_point": stop_point.value, "note": note},
            job_id,
            attempt_id,
            JobStatus.STOPPED,
            StoppedRow,
        )

    @transition(Statement.FINISH_FAILED)
    async def finish_failed(
        self, job_id: UUID, attempt_id: UUID, code: FailureCode, cause: str | None
    ) -> FinishResult:
        """Running -> Failed(code) for this attempt; ``cause`` is an error type or code, never data."""
        if code not in _RUNNING_FAILURE_CODES:
            raise ValueError(f"{code} is not a failure a Running attempt can record")
        return await self._finish(
            "finish_failed",
            {"job_id": job_id, "attempt_id": attempt_id, "code": code.value, "cause": cause},
            job_id,
            attempt_id,
            JobStatus.FAILED,
        )

    @transition(Statement.FINISH_DELIVERY)
    async def finish_delivery(
        self,
        job_id: UUID,
        attempt_id: UUID,
        outcome: DeliveryOutcome,
        code: FailureCode | None = None,
        summary: str | None = None,
    ) -> FinishResult:
        """Delivering -> Completed / Failed(code) / OutcomeUnknown: the attempt's terminal write."""
        if (outcome == DeliveryOutcome.FAILED) != (code is not None):
            raise ValueError("a Failed delivery needs exactly one failure code, and only Failed has one")
        if code is not None and code not in _DELIVERY_FAILURE_CODES:
            raise ValueError(f"{code} is not a delivery failure")
        return await self._finish(
            "finish_delivery",
            {
                "job_id": job_id,
                "attempt_id": attempt_id,
                "outcome": outcome.value,
                "code": code.value if code else None,
                "summary": summary,
            },
            job_id,
            attempt_id,
            JobStatus(outcome.value),
        )

    @transition(Statement.RETRY_DELIVERY_IF_DELIVERING)
    async def retry_delivery_if_delivering(
        self,
        job_id: UUID,
        attempt_id: UUID,
        cause: FailureCause,
        summary: str,
        policy: RetryPolicy,
    ) -> RetryResult:
        """The terminal write of a delivery that failed NotDelivered for a transient ``cause`` (issue #25.4):
        Delivering -> Queued, waiting a backoff, to be tried again in a new attempt (Retried); or Delivering ->
        Failed NotDelivered when a retry may not be made, its event saying why (Failed); NotOwner; Unknown.

        One short transaction: the row locked first (``lock_job_for_retry``), then the conditional statement,
        whose snapshot then sees a cancellation request committed while it waited for the lock.
        """
        if not is_transient(cause):
            raise ValueError(f"{cause} is not a transient cause: finish_delivery records it")
        params = {
            "job_id": job_id,
            "attempt_id": attempt_id,
            "cause": cause.value,
            "summary": summary,
            "base_seconds": policy.base_seconds,
            "cap_seconds": policy.cap_seconds,
            "max_attempts": policy.max_attempts,
            "jitter": policy.jitter(),
            "traceparent": current_traceparent(),
        }
        try:
            async with translated(), self.pool.connection() as conn, conn.transaction():
                if await fetch_maybe(conn, "lock_job_for_retry", params, JobIdRow) is None:
                    answers: list[RetryRow] | None = []
                else:
                    answers = await fetch(conn, "retry_delivery_if_delivering", params, RetryRow)
        except TransientStoreError as exc:
            log.warning("retry_delivery_if_delivering: no answer (%s); re-reading the row", exc)
            answers = None
        if answers:
            ended = RetryResult.RETRIED if answers[0].ending == "Retried" else RetryResult.FAILED
            if ended == RetryResult.RETRIED:
                get_metrics().count_delivery_retry(cause.value)
            return ended
        if answers is not None:
            return RetryResult.NOT_OWNER
        # A lost answer: retried if this attempt's RetryScheduled event is recorded (the row no longer names
        # the attempt once Queued), Failed if the row is Failed with this attempt.
        try:
            state = await self._reread(job_id)
            events = await self.job_events(job_id)
        except TransientStoreError:
            return RetryResult.UNKNOWN
        mine = {e.kind for e in events if e.attempt_id == attempt_id}
        if EventKind.RETRY_SCHEDULED in mine:
            get_metrics().count_delivery_retry(cause.value)
            return RetryResult.RETRIED
        if state is not None and state.status == JobStatus.FAILED and state.attempt_id == attempt_id:
            return RetryResult.FAILED
        return RetryResult.NOT_OWNER

    async def pause_destination_for_partner(
        self, tenant_id: UUID, destination_id: UUID, version: int, reason: str, changed_by: str
    ) -> PartnerPause:
        """Pause one destination whose server presented a host key none of the pinned ones match, or refused
        our login (``reason`` says which, "host key changed: presented SHA256:..."), as checked against its
        ``version``: the worker's only switch change, through the function 0029 grants it. Never a resume;
        an earlier pause keeps its reason; a destination whose delivery terms changed since ``version`` is not
        paused."""
        row = await self._row(
            "pause_destination_for_partner",
            {
                "tenant_id": tenant_id,
                "destination_id": destination_id,
                "version": version,
                "reason": reason,
                "changed_by": changed_by,
            },
            PartnerPause,
        )
        assert row is not None  # the function answers one row
        return row

    async def sweep_stale_queued(self, older_than_seconds: float, batch: int = 500) -> list[UUID]:
        """Republish a bounded batch of stale Queued jobs; returns the jobs swept."""
        rows = await self._rows(
            "sweep_stale_queued",
            {"older_than_seconds": older_than_seconds, "batch": batch, "traceparent": current_traceparent()},
            JobIdRow,
        )
        return [r.job_id for r in rows]


def fence_result(found: FenceAnswer | UploadFenceAnswer, attempt_id: UUID) -> FenceResult:
    """The fence's answer from the row it left: Fenced when this attempt's fence is written."""
    if not held_by(found, attempt_id, JobStatus.DELIVERING):
        return FenceResult.NOT_OWNER
    if found.matched or found.fenced:
        return FenceResult.FENCED
    if found.lease_current and not found.window_open:
        return FenceResult.OUTSIDE_WINDOW
    return FenceResult.LEASE_LAPSED if not found.lease_current else FenceResult.NOT_OWNER


class WorkerStore(ProtocolStatements, EvidenceStatements, SlotStatements):
    """The worker's store (role ``exports_worker``): the row protocol of the attempts it claims.
    ``window_margin_seconds``: how long after the rename fence a destination's delivery window must still be
    open for the fence to be written (``EXPORTS_WINDOW_RENAME_MARGIN_SECONDS``)."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        lease_seconds: float = 60.0,
        reread_timeout: float = REREAD_TIMEOUT_SECONDS,
        window_margin_seconds: float = 5.0,
    ) -> None:
        super().__init__(pool, lease_seconds=lease_seconds, reread_timeout=reread_timeout)
        self.window_margin_seconds = window_margin_seconds
