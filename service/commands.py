"""Request bodies, validated before anything is read or written: unknown fields, wrong UUIDs, missing
fields, oversized strings and NUL characters are refused with a 422 that says which field and why."""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints, model_validator

from domain.models import FailureCode

MAX_NAME = 200
MAX_REASON = 1000


def _no_control_characters(value: str) -> str:
    if any(ord(c) < 32 and c not in "\t\n\r" for c in value):
        raise ValueError("must not contain control characters")
    return value


Name = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_NAME),
    AfterValidator(_no_control_characters),
]
Reason = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_REASON),
    AfterValidator(_no_control_characters),
]
RecordedOutcome = Literal["Completed", "Failed"]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CreateExport(Body):
    """POST /exports: which tenant destination gets which contact list."""

    destination_id: UUID
    list_name: Name


class EditTerms(Body):
    """PATCH /exports/{id}: new terms for a queued export; fields left out keep their value."""

    destination_id: UUID | None = None
    list_name: Name | None = None

    @model_validator(mode="after")
    def _changes_something(self) -> EditTerms:
        if self.destination_id is None and self.list_name is None:
            raise ValueError("give destination_id, list_name or both")
        return self


class CancelExport(Body):
    """POST /exports/{id}/cancellations: one click, with the client's own request ID."""

    request_id: UUID
    reason: Reason | None = None


class ReplaceExport(Body):
    """POST /exports/{id}/replacements: a new job for a named person, with why, and any overwrite agreement."""

    reason: Reason
    overwrite_agreement_ref: Name | None = None


class ReconcileExport(Body):
    """POST /exports/{id}/reconciliation: an OutcomeUnknown attempt resolved from evidence."""

    resolution: RecordedOutcome
    evidence_summary: Reason
    attempt_id: UUID | None = None


class CorrectExport(Body):
    """POST /exports/{id}/corrections: a recorded outcome corrected once, by a reconciler, with why."""

    recorded_status: RecordedOutcome
    corrected_status: RecordedOutcome
    failure_reason: FailureCode | None = None
    evidence_ref: Name
    why: Reason
    attempt_id: UUID | None = None

    @model_validator(mode="after")
    def _consistent(self) -> CorrectExport:
        if self.corrected_status == self.recorded_status:
            raise ValueError("corrected_status must differ from recorded_status")
        if (self.corrected_status == "Failed") != (self.failure_reason is not None):
            raise ValueError("failure_reason is required for Failed and only for Failed")
        return self


class BulkCancel(Body):
    """POST /cancellation-batches: cancel every live export of a destination (optionally of one list).

    ``batch_id`` is the client's, reused on retry: the same batch ID replays the outcomes recorded and
    decides only the exports that were Busy.
    """

    batch_id: UUID
    destination_id: UUID
    list_name: Name | None = None
    reason: Reason
