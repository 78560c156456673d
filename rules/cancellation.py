"""What a cancellation request is, from the state its locked row shows (001 "When Cancellation Loses")."""

from __future__ import annotations

from domain.models import CancellationOutcome, ExportJob, JobStatus


def classify_cancellation(job: ExportJob) -> CancellationOutcome:
    """The outcome of a cancellation request that found ``job`` under its row lock.

    Queued is canceled; Running gets a stop request (or already has one); Canceled, Rejected, Stopped
    and Failed have ended; Delivering, Completed and OutcomeUnknown are past cutoff 2: too late.
    """
    match job.status:
        case JobStatus.QUEUED:
            return CancellationOutcome.CANCELED_WHILE_QUEUED
        case JobStatus.RUNNING if job.stop_request_id is None:
            return CancellationOutcome.STOP_REQUESTED
        case JobStatus.RUNNING:
            return CancellationOutcome.STOP_ALREADY_REQUESTED
        case JobStatus.CANCELED:
            return CancellationOutcome.ALREADY_CANCELED
        case JobStatus.REJECTED | JobStatus.STOPPED | JobStatus.FAILED:
            return CancellationOutcome.ALREADY_ENDED
        case _:  # Delivering, Completed, OutcomeUnknown: delivery was authorized
            return CancellationOutcome.TOO_LATE
