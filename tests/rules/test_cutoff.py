"""Why cutoff 2 refused, read from state and ownership together (000 "A lost response")."""

from __future__ import annotations

import uuid

from domain.models import AuthorizationResult, JobStatus, OwnershipState
from rules.cutoff import authorization_from

MINE = uuid.uuid4()


def state(status: JobStatus, attempt_id: uuid.UUID | None = MINE, **fields: object) -> OwnershipState:
    values: dict[str, object] = {
        "status": status,
        "attempt_id": attempt_id,
        "stop_request_id": None,
        "lease_current": True,
        "original_status": None,
    }
    values.update(fields)
    return OwnershipState(**values)  # type: ignore[arg-type]


def test_delivering_with_this_attempt_is_authorized_a_lost_response() -> None:
    assert authorization_from(state(JobStatus.DELIVERING), MINE) == AuthorizationResult.AUTHORIZED


def test_another_attempt_or_no_row_is_not_owner() -> None:
    assert authorization_from(None, MINE) == AuthorizationResult.NOT_OWNER
    assert authorization_from(state(JobStatus.RUNNING, uuid.uuid4()), MINE) == AuthorizationResult.NOT_OWNER
    assert (
        authorization_from(state(JobStatus.DELIVERING, uuid.uuid4()), MINE) == AuthorizationResult.NOT_OWNER
    )


def test_a_terminal_state_with_this_attempt_is_not_owner() -> None:
    for status in (JobStatus.STOPPED, JobStatus.FAILED, JobStatus.OUTCOME_UNKNOWN, JobStatus.QUEUED):
        assert authorization_from(state(status), MINE) == AuthorizationResult.NOT_OWNER


def test_a_recorded_stop_request_is_stop_recorded_even_with_a_lapsed_lease() -> None:
    found = state(JobStatus.RUNNING, stop_request_id=uuid.uuid4(), lease_current=False)
    assert authorization_from(found, MINE) == AuthorizationResult.STOP_RECORDED


def test_a_replacement_whose_original_is_completed_is_original_completed() -> None:
    found = state(JobStatus.RUNNING, original_status=JobStatus.COMPLETED)
    assert authorization_from(found, MINE) == AuthorizationResult.ORIGINAL_COMPLETED


def test_running_mine_without_a_stop_is_lease_lapsed_whether_or_not_renewed_since() -> None:
    # The re-read is not atomic with the refusal: a renewal may have landed in between.
    assert (
        authorization_from(state(JobStatus.RUNNING, lease_current=False), MINE)
        == AuthorizationResult.LEASE_LAPSED
    )
    assert (
        authorization_from(state(JobStatus.RUNNING, lease_current=True), MINE)
        == AuthorizationResult.LEASE_LAPSED
    )
