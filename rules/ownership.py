"""Whether an attempt still owns its job, stated once (000 "A lost response": state and ownership are read
together, and only the attempt named on the row, in the state the step needs, may act on it)."""

from __future__ import annotations

from typing import Protocol, TypeGuard, TypeVar
from uuid import UUID

from domain.models import JobStatus


class AttemptState(Protocol):
    """What a statement's answer or a re-read says of a job: its status and the attempt that holds it."""

    @property
    def status(self) -> JobStatus: ...

    @property
    def attempt_id(self) -> UUID | None: ...


StateT = TypeVar("StateT", bound=AttemptState)


def held_by(state: StateT | None, attempt_id: UUID, *statuses: JobStatus) -> TypeGuard[StateT]:
    """Whether ``state`` (a job row, a policy read, a re-read or a fence's answer) was found and is still
    ``attempt_id``'s in one of ``statuses``: anything else (no row, another attempt, another state) means the
    attempt no longer owns the job and writes nothing more."""
    return state is not None and state.attempt_id == attempt_id and state.status in statuses
