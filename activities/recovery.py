"""Recovery's activities: take over expired leases, one conditional statement per case (000 "Recovery").

The scan only nominates. Each takeover repeats every condition the scan relied on, so a renewal that
commits after the scan makes it match nothing, and the job is left to its worker:

- Running, no stop request, under the attempt cap: back to Queued with a new outbox row.
- Running with a recorded stop request: Stopped.
- Running at the attempt cap: Failed with AttemptsExhausted.
- Delivering: resolved from evidence, never stopped, retried or failed. Completed only when the
  destination or a receipt the attempt appended matches the expected file recorded at cutoff 2;
  otherwise OutcomeUnknown. An absent file is never a reason for Failed: a paused worker can still
  upload. What recovery observed is appended as DeliveryEvidence under the recovery run's ID.

Runs as ``exports_worker``. Payloads and evidence carry IDs, sizes, hashes and codes only.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any
from uuid import UUID

from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel
from temporalio import activity

from db.errors import StoreError
from db.models import AttemptEvent, DeliveryOutcome, EventKind, ExpiredLease, ExportJob, JobStatus
from db.store import JobStore
from partner.classifier import confirm_delivery
from partner.delivery import observe_final_name
from partner.destination import Destination, DestinationNotFound, load_destination
from partner.evidence import FileToDeliver, Observation, temp_name_for
from settings import Settings

log = logging.getLogger(__name__)

OBSERVE_TIMEOUT_SECONDS = 60.0  # a listing (and read-back) that takes longer is "not observed"


class RecoveryInput(BaseModel):
    """One recovery run: scan in batches of ``batch`` leases, at most ``max_batches`` batches."""

    batch: int = 100
    max_batches: int = 20


class RecoveryBatchInput(BaseModel):
    recovery_run_id: str
    limit: int = 100


class Takeover(StrEnum):
    """What recovery did with one candidate."""

    REQUEUED = "Requeued"
    STOPPED = "Stopped"
    EXHAUSTED = "Exhausted"
    COMPLETED = "Completed"
    OUTCOME_UNKNOWN = "OutcomeUnknown"
    MATCHED_NOTHING = "MatchedNothing"  # renewed, finished or taken over since the scan
    ERROR = "Error"  # not decided this run; the next run nominates it again


class RecoveryBatchResult(BaseModel):
    """Counts by takeover for one batch (or a whole run)."""

    scanned: int = 0
    requeued: int = 0
    stopped: int = 0
    exhausted: int = 0
    completed: int = 0
    outcome_unknown: int = 0
    matched_nothing: int = 0
    errors: int = 0

    @property
    def taken_over(self) -> int:
        return self.requeued + self.stopped + self.exhausted + self.completed + self.outcome_unknown

    def count(self, takeover: Takeover) -> None:
        field = {
            Takeover.REQUEUED: "requeued",
            Takeover.STOPPED: "stopped",
            Takeover.EXHAUSTED: "exhausted",
            Takeover.COMPLETED: "completed",
            Takeover.OUTCOME_UNKNOWN: "outcome_unknown",
            Takeover.MATCHED_NOTHING: "matched_nothing",
            Takeover.ERROR: "errors",
        }[takeover]
        setattr(self, field, getattr(self, field) + 1)

    def add(self, other: RecoveryBatchResult) -> None:
        for name in RecoveryBatchResult.model_fields:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class Verdict(BaseModel):
    """Recovery's decision for an expired delivery, with a summary of codes and sizes only."""

    resolution: JobStatus
    summary: str


# -- evidence rules --------------------------------------------------------------------------------

RECOVERY_OBSERVER_PREFIX = "recovery"


def attempt_evidence(events: list[AttemptEvent], attempt_id: UUID) -> list[dict[str, Any]]:
    """The attempt's own DeliveryEvidence observations (not recovery's), oldest first."""
    found: list[dict[str, Any]] = []
    for event in events:
        if event.kind != EventKind.DELIVERY_EVIDENCE or event.attempt_id != attempt_id:
            continue
        if (event.observed_by or "").startswith(RECOVERY_OBSERVER_PREFIX):
            continue
        try:
            detail = json.loads(event.detail or "{}")
        except ValueError:
            continue
        if isinstance(detail, dict):
            found.append(detail)
    return found


def _last(evidence: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    matching = [e for e in evidence if e.get("observation") == kind]
    return matching[-1] if matching else None


def _observation_from(item: dict[str, Any]) -> Observation:
    """An Observation back from its evidence dict (``Observation.as_evidence``)."""
    sha = item.get("sha256")
    return Observation(
        present=bool(item.get("present")),
        size=item.get("size"),
        mtime=item.get("mtime"),
        sha256=bytes.fromhex(sha) if isinstance(sha, str) else None,
        ack=item.get("ack") if isinstance(item.get("ack"), dict) else None,
    )


def _expected(job: ExportJob) -> FileToDeliver | None:
    if job.expected_file_name is None or job.expected_file_bytes is None or job.expected_file_sha256 is None:
        return None
    return FileToDeliver(
        path=Path(job.expected_file_name),  # never read: only name, size and hash are compared
        final_name=job.expected_file_name,
        size=job.expected_file_bytes,
        sha256=job.expected_file_sha256,
    )


def _ack_tied(observation: Observation, expected: FileToDeliver, attempt_id: UUID) -> bool:
    ack = observation.parsed_ack()
    return ack is not None and ack.acknowledges(
        expected.final_name, expected.size, expected.sha256, temp_name_for(attempt_id, expected.final_name)
    )


def decide_delivery(
    job: ExportJob,
    evidence: list[dict[str, Any]],
    now: Observation | None,
    destination: Destination,
    *,
    observe_error: str | None = None,
) -> Verdict:
    """Decide Completed or OutcomeUnknown for an expired Delivering attempt, from evidence only.

    ``evidence`` is what the attempt itself appended; ``now`` is what the destination shows under the final
    name (``None`` when it could not be asked). The worker's own rules decide what counts
    (``partner.classifier.confirm_delivery``): name and size from an absent baseline, a read-back hash or an
    acknowledgment of this upload where the contract offers one, and never name and size for an overwrite.

    1. A receipt this attempt appended: a read-back after its confirmed rename that those rules accept.
    2. Otherwise the listing now. An original's final name is unique to its delivery key, so it counts
       unless this attempt's baseline already showed a file there. A replacement's name may hold the
       original's file: without this attempt's baseline it proves nothing, and over a baseline that showed
       a file only a hash or acknowledgment tied to this attempt's expected file counts.

    An absent file, or one that does not match, leaves OutcomeUnknown: nothing here concludes Failed.
    """
    expected = _expected(job)
    if expected is None:
        return Verdict(resolution=JobStatus.OUTCOME_UNKNOWN, summary="no expected file recorded at cutoff 2")
    attempt_id = job.attempt_id
    assert attempt_id is not None
    baseline_item = _last(evidence, "baseline")
    baseline = _observation_from(baseline_item) if baseline_item is not None else None
    overwrite = baseline is not None and baseline.present

    receipt = _receipt_verdict(evidence, expected, destination, overwrite=overwrite)
    if receipt is not None:
        return receipt
    if now is None:
        return Verdict(
            resolution=JobStatus.OUTCOME_UNKNOWN,
            summary=f"destination not observed ({observe_error or 'no answer'}); no receipt of this attempt",
        )
    if not now.present:
        # A temporary file, or none at all, is evidence of nothing while the worker might still upload.
        return Verdict(
            resolution=JobStatus.OUTCOME_UNKNOWN, summary="final name absent; no receipt of this attempt"
        )
    if job.replaces_job_id is not None and baseline is None:
        return Verdict(
            resolution=JobStatus.OUTCOME_UNKNOWN,
            summary="replacement without a recorded baseline: a file there may be the original's",
        )
    if job.replaces_job_id is None and overwrite:
        return Verdict(
            resolution=JobStatus.OUTCOME_UNKNOWN,
            summary="final name occupied before this attempt's upload; the listing does not show its file",
        )
    if overwrite and baseline is not None and now.same_as(baseline):
        return Verdict(
            resolution=JobStatus.OUTCOME_UNKNOWN, summary="listing unchanged since this attempt's baseline"
        )
    report = confirm_delivery(
        now, expected, destination, overwrite=overwrite, ack_tied=_ack_tied(now, expected, attempt_id)
    )
    resolution = (
        JobStatus.COMPLETED if report.outcome == DeliveryOutcome.COMPLETED else JobStatus.OUTCOME_UNKNOWN
    )
    basis = "listing by recovery" if baseline is not None else "listing by recovery, no baseline recorded"
    return Verdict(resolution=resolution, summary=f"{basis}: {report.summary}")


def _receipt_verdict(
    evidence: list[dict[str, Any]], expected: FileToDeliver, destination: Destination, *, overwrite: bool
) -> Verdict | None:
    """Completed from the attempt's own read-back after a confirmed rename, when the worker's rules accept it."""
    renamed = _last(evidence, "rename")
    read_back = _last(evidence, "read_back")
    if renamed is None or renamed.get("result") != "ok" or read_back is None:
        return None
    if read_back.get("final_name") not in (None, expected.final_name):
        return None
    ack = _last(evidence, "ack")
    report = confirm_delivery(
        _observation_from(read_back),
        expected,
        destination,
        overwrite=overwrite,
        ack_tied=bool(ack and ack.get("tied")),
    )
    if report.outcome != DeliveryOutcome.COMPLETED:
        return None
    return Verdict(resolution=JobStatus.COMPLETED, summary=f"receipt of this attempt: {report.summary}")


def observation_evidence(
    observation: Observation | None, job: ExportJob, destination_id: UUID, error: str | None
) -> dict[str, Any]:
    """What recovery saw under the final name, as a JSON-able dict of sizes, times and hashes only."""
    seen: dict[str, Any] = observation.as_evidence() if observation is not None else {"error": error}
    return {
        "observation": "recovery_listing",
        "final_name": job.expected_file_name,
        "attempt_id": str(job.attempt_id),
        "destination_id": str(destination_id),
        **seen,
    }


# -- the activities --------------------------------------------------------------------------------

Observe = Callable[[Destination, str], Observation]


class RecoveryActivities:
    """Recovery's activities over a worker pool. ``observe`` lists the final name on the destination
    (default ``partner.delivery.observe_final_name``; a test seam, never a replacement for the server)."""

    def __init__(
        self,
        store: JobStore,
        worker_pool: AsyncConnectionPool,
        settings: Settings,
        *,
        observe: Observe | None = None,
    ) -> None:
        self.store = store
        self.pool = worker_pool
        self.settings = settings
        self._observe = observe or observe_final_name

    def activities(self) -> list[Callable[..., Any]]:
        """The activities to register on the shared task queue."""
        return [self.recover_expired_leases]

    @activity.defn(name="recover_expired_leases")
    async def recover_expired_leases(self, inp: RecoveryBatchInput) -> RecoveryBatchResult:
        """Scan one batch of expired leases and apply the conditional takeover for each candidate."""
        result = RecoveryBatchResult()
        candidates = await self.store.find_expired_leases(limit=inp.limit)
        result.scanned = len(candidates)
        for candidate in candidates:
            activity.heartbeat(str(candidate.id))
            takeover = await self.take_over(candidate, inp.recovery_run_id)
            log.info("recovery %s: job %s %s", inp.recovery_run_id, candidate.id, takeover.value)
            result.count(takeover)
        return result

    async def take_over(self, candidate: ExpiredLease, recovery_run_id: str) -> Takeover:
        """Apply the one takeover statement this candidate's case calls for; errors leave it for next run."""
        try:
            return await self._take_over(candidate, recovery_run_id)
        except (StoreError, DestinationNotFound, OSError, TimeoutError) as exc:
            log.warning("recovery of job %s not decided (%s)", candidate.id, type(exc).__name__)
            return Takeover.ERROR

    async def _take_over(self, candidate: ExpiredLease, run_id: str) -> Takeover:
        job_id, attempt_id = candidate.id, candidate.attempt_id
        max_attempts = self.settings.max_attempts
        if candidate.status == JobStatus.RUNNING:
            # Running means cutoff 2 never committed: nothing was delivered by this attempt.
            if candidate.stop_request_id is not None:
                done = await self.store.stop_expired_attempt(job_id, attempt_id, run_id)
                return Takeover.STOPPED if done else Takeover.MATCHED_NOTHING
            if candidate.attempt_count < max_attempts:
                done = await self.store.requeue_expired_attempt(job_id, attempt_id, max_attempts, run_id)
                return Takeover.REQUEUED if done else Takeover.MATCHED_NOTHING
            done = await self.store.exhaust_expired_attempt(job_id, attempt_id, max_attempts, run_id)
            return Takeover.EXHAUSTED if done else Takeover.MATCHED_NOTHING
        if candidate.status == JobStatus.DELIVERING:
            return await self._resolve_delivery(candidate, run_id)
        return Takeover.MATCHED_NOTHING

    async def _resolve_delivery(self, candidate: ExpiredLease, run_id: str) -> Takeover:
        job = await self.store.get_job(candidate.id)
        if job is None or job.status != JobStatus.DELIVERING or job.attempt_id != candidate.attempt_id:
            return Takeover.MATCHED_NOTHING
        destination = await load_destination(self.pool, job.tenant_id, job.destination_id)
        evidence = attempt_evidence(await self.store.job_events(job.id), candidate.attempt_id)
        observation, error = await self._observe_final_name(destination, job)
        # What recovery saw is kept whatever it decides, under the recovery run's ID.
        await self.store.append_delivery_evidence(
            job.id,
            candidate.attempt_id,
            run_id,
            observation_evidence(observation, job, destination.id, error),
        )
        verdict = decide_delivery(job, evidence, observation, destination, observe_error=error)
        done = await self.store.resolve_expired_delivery(
            job.id, candidate.attempt_id, verdict.resolution, run_id, verdict.summary
        )
        if not done:
            return Takeover.MATCHED_NOTHING
        return Takeover.COMPLETED if verdict.resolution == JobStatus.COMPLETED else Takeover.OUTCOME_UNKNOWN

    async def _observe_final_name(
        self, destination: Destination, job: ExportJob
    ) -> tuple[Observation | None, str | None]:
        """(what the destination shows under the final name, or None with the error's type name)."""
        name = job.expected_file_name or job.final_name
        try:
            observation = await asyncio.wait_for(
                asyncio.to_thread(self._observe, destination, name), timeout=OBSERVE_TIMEOUT_SECONDS
            )
        except Exception as exc:  # noqa: BLE001 - failing to observe is "not observed", never evidence
            return None, type(exc).__name__
        return observation, None
