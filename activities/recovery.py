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
from typing import Any
from uuid import UUID

from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel
from temporalio import activity

from db.errors import StoreError
from db.models import EventKind, ExpiredLease, ExportJob, JobStatus
from db.store import JobStore
from settings import Settings

log = logging.getLogger(__name__)


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


def _hex(value: bytes | None) -> str | None:
    return value.hex() if value is not None else None


def _attempt_evidence(events: list[Any], attempt_id: UUID) -> list[dict[str, Any]]:
    """The attempt's own DeliveryEvidence observations (not recovery's), oldest first."""
    found: list[dict[str, Any]] = []
    for event in events:
        if event.kind != EventKind.DELIVERY_EVIDENCE or event.attempt_id != attempt_id:
            continue
        if event.observed_by is not None and event.observed_by.startswith(RECOVERY_OBSERVER_PREFIX):
            continue
        try:
            detail = json.loads(event.detail or "{}")
        except ValueError:
            continue
        if isinstance(detail, dict):
            found.append(detail)
    return found


def _baseline(evidence: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The attempt's recorded baseline listing of the final name, taken before any upload."""
    for item in evidence:
        if item.get("observation") == "baseline":
            return item
    return None


def _receipt_matches(item: dict[str, Any], job: ExportJob, hash_required: bool) -> bool:
    """Whether one of the attempt's own observations shows the expected file under the final name."""
    if item.get("observation") not in ("read_back", "ack", "final_listing", "rename"):
        return False
    if item.get("name", job.expected_file_name) != job.expected_file_name:
        return False
    if item.get("present") is False or item.get("ok") is False:
        return False
    size_ok = item.get("size") == job.expected_file_bytes
    sha_ok = item.get("sha256") is not None and item.get("sha256") == _hex(job.expected_file_sha256)
    if hash_required:
        return sha_ok and (size_ok or item.get("size") is None)
    return size_ok or sha_ok


def decide_delivery(
    job: ExportJob,
    attempt_evidence: list[dict[str, Any]],
    observation: Any | None,
    *,
    hash_evidence: str,
    observe_error: str | None = None,
) -> Verdict:
    """Decide Completed or OutcomeUnknown for an expired Delivering attempt, from evidence only.

    ``observation`` is what the destination shows now under the final name (``partner.delivery.Observation``,
    or ``None`` when it could not be observed). A hash is required wherever the partner's contract gives one
    (``hash_evidence`` other than ``none``). An original is Completed on the expected name and size (and
    hash) changed from the attempt's baseline, or with no baseline recorded since its name is unique to its
    delivery key. A replacement's final name may hold the original's file, so it is Completed only from a
    receipt this attempt appended or a listing changed from this attempt's own recorded baseline, and, where
    that baseline already showed a file, only on a matching hash. Nothing here ever concludes Failed.
    """
    hash_required = hash_evidence != "none"
    size = job.expected_file_bytes
    receipts = [e for e in attempt_evidence if _receipt_matches(e, job, hash_required)]
    if receipts:
        kind = receipts[-1].get("observation")
        return Verdict(
            resolution=JobStatus.COMPLETED, summary=f"receipt {kind} of this attempt matches {size} bytes"
        )
    if observation is None:
        return Verdict(
            resolution=JobStatus.OUTCOME_UNKNOWN,
            summary=f"destination not observed ({observe_error or 'no observation'}); no matching receipt",
        )
    if not observation.present:
        # A temporary file, or none at all, is evidence of nothing while the worker might still upload.
        return Verdict(resolution=JobStatus.OUTCOME_UNKNOWN, summary="final name absent; no matching receipt")
    if observation.size != size:
        return Verdict(
            resolution=JobStatus.OUTCOME_UNKNOWN,
            summary=f"final name present with {observation.size} bytes, expected {size}",
        )
    expected_sha = job.expected_file_sha256
    sha_seen = observation.sha256
    ack_sha = (observation.ack or {}).get("sha256") if isinstance(observation.ack, dict) else None
    hash_matches = (sha_seen is not None and sha_seen == expected_sha) or (
        ack_sha is not None and ack_sha == _hex(expected_sha)
    )
    if hash_required and not hash_matches:
        return Verdict(
            resolution=JobStatus.OUTCOME_UNKNOWN,
            summary=f"final name present with {size} bytes, but no matching hash under the contract ({hash_evidence})",
        )
    baseline = _baseline(attempt_evidence)
    if job.replaces_job_id is not None:
        if baseline is None:
            # A file there may be the original's: without this attempt's baseline, it proves nothing.
            return Verdict(
                resolution=JobStatus.OUTCOME_UNKNOWN,
                summary="replacement without a recorded baseline; a file there may be the original's",
            )
        if baseline.get("present") and not hash_matches:
            return Verdict(
                resolution=JobStatus.OUTCOME_UNKNOWN,
                summary="replacement's baseline already showed a file; name and size cannot show the change",
            )
    if baseline is not None and baseline.get("present"):
        unchanged = baseline.get("size") == observation.size and baseline.get("mtime") == observation.mtime
        if unchanged or not hash_matches:
            return Verdict(
                resolution=JobStatus.OUTCOME_UNKNOWN,
                summary="final name occupied before the upload; the listing does not show this attempt's file",
            )
    how = "name, size and hash" if hash_matches else "name and size"
    return Verdict(
        resolution=JobStatus.COMPLETED,
        summary=f"final name present, {how} match the expected file ({size} bytes)",
    )


RECOVERY_OBSERVER_PREFIX = "recovery"


def observation_evidence(observation: Any | None, job: ExportJob, error: str | None) -> dict[str, Any]:
    """What recovery saw under the final name, as a JSON-able dict of sizes, times and hashes only."""
    if observation is None:
        return {"observation": "recovery_listing", "name": job.expected_file_name, "error": error}
    ack = observation.ack if isinstance(observation.ack, dict) else None
    return {
        "observation": "recovery_listing",
        "name": job.expected_file_name,
        "present": observation.present,
        "size": observation.size,
        "mtime": observation.mtime,
        "sha256": _hex(observation.sha256),
        "ack_sha256": ack.get("sha256") if ack else None,
        "expected_size": job.expected_file_bytes,
        "expected_sha256": _hex(job.expected_file_sha256),
    }


# -- the activities --------------------------------------------------------------------------------

Observe = Callable[[Any, str], Any]


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
        self._observe = observe

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
        except (StoreError, OSError, TimeoutError) as exc:
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
        events = await self.store.job_events(job.id)
        evidence = _attempt_evidence(events, candidate.attempt_id)
        observation, error, hash_evidence = await self._observe_final_name(job)
        await self.store.append_delivery_evidence(
            job.id, candidate.attempt_id, run_id, observation_evidence(observation, job, error)
        )
        verdict = decide_delivery(
            job, evidence, observation, hash_evidence=hash_evidence, observe_error=error
        )
        done = await self.store.resolve_expired_delivery(
            job.id, candidate.attempt_id, verdict.resolution, run_id, verdict.summary
        )
        if not done:
            return Takeover.MATCHED_NOTHING
        return Takeover.COMPLETED if verdict.resolution == JobStatus.COMPLETED else Takeover.OUTCOME_UNKNOWN

    async def _observe_final_name(self, job: ExportJob) -> tuple[Any | None, str | None, str]:
        """(observation or None, error type or None, the contract's hash_evidence)."""
        from partner.delivery import observe_final_name
        from partner.destination import load_destination

        try:
            destination = await load_destination(self.pool, job.tenant_id, job.destination_id)
        except (StoreError, LookupError, ValueError) as exc:
            return None, type(exc).__name__, "none"
        observe = self._observe or observe_final_name
        name = job.expected_file_name or job.final_name
        try:
            observation = await asyncio.wait_for(
                asyncio.to_thread(observe, destination, name), timeout=OBSERVE_TIMEOUT_SECONDS
            )
        except Exception as exc:  # noqa: BLE001 - any failure to observe is "not observed", never evidence
            return None, type(exc).__name__, destination.hash_evidence
        return observation, None, destination.hash_evidence


OBSERVE_TIMEOUT_SECONDS = 60.0
