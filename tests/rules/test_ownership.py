"""Whether an attempt still owns its job: its ID on the row, in a state the step needs, and nothing else."""

from __future__ import annotations

import uuid

import pytest

from domain.models import JobStatus, OwnershipState
from rules.ownership import held_by

MINE = uuid.uuid4()


def found(status: JobStatus, attempt_id: uuid.UUID | None = MINE) -> OwnershipState:
    return OwnershipState(
        status=status, attempt_id=attempt_id, stop_request_id=None, lease_current=True, original_status=None
    )


def test_the_attempt_on_the_row_in_a_state_the_step_needs_holds_it():
    assert held_by(found(JobStatus.RUNNING), MINE, JobStatus.RUNNING)
    assert held_by(found(JobStatus.DELIVERING), MINE, JobStatus.RUNNING, JobStatus.DELIVERING)


@pytest.mark.parametrize(
    "state",
    [
        None,  # no row
        found(JobStatus.RUNNING, uuid.uuid4()),  # another attempt took it
        found(JobStatus.QUEUED, None),  # given back or taken over to the queue
        found(JobStatus.DELIVERING),  # this attempt, but not in the state asked for
    ],
)
def test_no_row_another_attempt_or_another_state_does_not_hold_it(state):
    assert not held_by(state, MINE, JobStatus.RUNNING)
