"""Request bodies, validated before anything is read or written: unknown fields, wrong UUIDs, missing
fields, oversized strings and NUL characters are refused with a 422 that says which field and why."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, WithJsonSchema, model_validator

from domain.models import FailureCode

MAX_NAME = 200
MAX_REASON = 1000


# The published constraints, as JSON Schema patterns the server enforces as written (so the OpenAPI document
# says exactly what is refused): no control characters (a reason may hold tabs and line breaks), no
# leading or trailing whitespace, at least one character. A name is one line.
# Whitespace is spelled out (ASCII and Unicode White_Space, and the BOM) rather than written \s, whose
# meaning differs between regex engines (the server's, and a client's that reads the schema).
_BLANK = r"\x00-\x20\x7f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
NAME_PATTERN = rf"^[^{_BLANK}](?:[^\x00-\x1f\x7f]*[^{_BLANK}])?$"
REASON_PATTERN = rf"^[^{_BLANK}](?:[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*[^{_BLANK}])?$"

Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME, pattern=NAME_PATTERN)]
Reason = Annotated[str, StringConstraints(min_length=1, max_length=MAX_REASON, pattern=REASON_PATTERN)]
RecordedOutcome = Literal["Completed", "Failed"]
_NAME_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_NAME,
    "pattern": NAME_PATTERN,
}


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CreateExport(Body):
    """POST /exports: which tenant destination gets which contact list."""

    destination_id: UUID
    list_name: Name


class EditTerms(Body):
    """PATCH /exports/{id}: new terms for a queued export; fields left out keep their value. At least one
    field, and no nulls (the schema says so: ``minProperties``, and neither field is nullable)."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra={"minProperties": 1})

    destination_id: Annotated[UUID | None, WithJsonSchema({"type": "string", "format": "uuid"})] = None
    list_name: Annotated[Name | None, WithJsonSchema(_NAME_SCHEMA)] = None

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(v is None for v in data.values()):
            raise ValueError("a field given must have a value; leave a field out to keep it")
        return data

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
    """POST /exports/{id}/corrections: a recorded outcome corrected once, by a reconciler, with why.

    The schema states the two shapes the server accepts: Completed to Failed with a failure reason, or
    Failed to Completed without one (a correction to the same status is no correction)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "oneOf": [
                {
                    "properties": {
                        "recorded_status": {"const": "Completed"},
                        "corrected_status": {"const": "Failed"},
                        "failure_reason": {"not": {"type": "null"}},
                    },
                    "required": ["failure_reason"],
                },
                {
                    "properties": {
                        "recorded_status": {"const": "Failed"},
                        "corrected_status": {"const": "Completed"},
                        "failure_reason": {"type": "null"},
                    },
                },
            ]
        },
    )

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
    """POST /cancellation-batches: cancel the live exports of a destination (optionally of one list).

    ``batch_id`` is the client's, reused on retry: the same batch ID replays the outcomes recorded and
    decides only the exports that were Busy. ``preview_token`` is the token a preview of the same filter
    gave this caller: the batch then covers exactly the exports that preview counted, and nothing that
    became live since; without it, the exports live when the batch is recorded.
    """

    batch_id: UUID
    destination_id: UUID
    list_name: Name | None = None
    reason: Reason
    preview_token: UUID | None = Field(
        default=None,
        description=(
            "The preview_token of GET /cancellation-batches/preview for this destination and list, by you: "
            "cancel exactly the exports it counted. Omitted: the exports live when the batch is recorded."
        ),
    )
