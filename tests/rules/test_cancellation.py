"""A cancellation request's outcome follows from the state its locked row shows (001 "When Cancellation
Loses"), one case per state."""

from __future__ import annotations

import uuid

import pytest

from domain.models import CancellationOutcome, FailureCode, JobStatus
from rules.cancellation import classify_cancellation
from tests.rules.factories import job


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (JobStatus.QUEUED, CancellationOutcome.CANCELED_WHILE_QUEUED),
        (JobStatus.RUNNING, CancellationOutcome.STOP_REQUESTED),
        (JobStatus.CANCELED, CancellationOutcome.ALREADY_CANCELED),
        (JobStatus.REJECTED, CancellationOutcome.ALREADY_ENDED),
        (JobStatus.STOPPED, CancellationOutcome.ALREADY_ENDED),
        (JobStatus.DELIVERING, CancellationOutcome.TOO_LATE),
        (JobStatus.COMPLETED, CancellationOutcome.TOO_LATE),
        (JobStatus.OUTCOME_UNKNOWN, CancellationOutcome.TOO_LATE),
    ],
)
def test_the_outcome_follows_from_the_state_found(status: JobStatus, expected: CancellationOutcome) -> None:
    assert classify_cancellation(job(status)) == expected


def test_a_failed_job_has_already_ended() -> None:
    found = job(JobStatus.FAILED, failure_reason=FailureCode.BUILD_FAILED)
    assert classify_cancellation(found) == CancellationOutcome.ALREADY_ENDED


def test_a_running_job_with_a_recorded_stop_request_is_stop_already_requested() -> None:
    found = job(JobStatus.RUNNING, stop_request_id=uuid.uuid4())
    assert classify_cancellation(found) == CancellationOutcome.STOP_ALREADY_REQUESTED


def test_every_status_has_an_outcome_that_records_something() -> None:
    recorded = {
        CancellationOutcome.CANCELED_WHILE_QUEUED,
        CancellationOutcome.STOP_REQUESTED,
        CancellationOutcome.STOP_ALREADY_REQUESTED,
        CancellationOutcome.ALREADY_CANCELED,
        CancellationOutcome.ALREADY_ENDED,
        CancellationOutcome.TOO_LATE,
    }
    for status in JobStatus:
        reason = FailureCode.BUILD_FAILED if status == JobStatus.FAILED else None
        assert classify_cancellation(job(status, failure_reason=reason)) in recorded
