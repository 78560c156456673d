"""The typed outcome of every operation, whatever carries it: ``api/routes.py`` maps ``Kind`` to an HTTP
status and ``starter.py`` to an exit code, each in one table."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Kind(StrEnum):
    """What an operation's answer means."""

    DONE = "done"  # it happened, or had already happened (a replay, an AlreadyCanceled)
    CREATED = "created"  # a new export exists
    ACCEPTED = "accepted"  # recorded; its effect follows (a stop request): poll the status
    MALFORMED = "malformed"  # a malformed header, or a request ID that belongs to another request
    FORBIDDEN = "forbidden"  # the caller's role may not do this
    NOT_FOUND = "not_found"  # no such export in the caller's tenant
    REFUSED = "refused"  # valid, but the export's state says no (too late, already ended, not queued)
    STALE = "stale"  # the version the caller read has moved on
    INVALID = "invalid"  # a reference that does not exist in the tenant
    PRECONDITION_REQUIRED = "precondition_required"  # the version the caller read is missing
    BUSY = "busy"  # nothing decided, nothing recorded: retry with the same request ID
    PARTIAL = "partial"  # a batch recorded, some of its exports Busy: retry with the same batch ID


@dataclass(frozen=True)
class Answer:
    """An operation's answer: its kind, a JSON-able body with a ``message`` or ``detail`` for people, and
    what a transport may turn into headers (where the export is, its version, replay, when to retry)."""

    kind: Kind
    body: dict[str, Any]
    location: str | None = None
    version: int | None = None
    replayed: bool = False
    retry_after_seconds: int | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether the operation did what was asked (or had already done it)."""
        return self.kind in (Kind.DONE, Kind.CREATED, Kind.ACCEPTED)

    @property
    def text(self) -> str:
        """The sentence a person should read."""
        return str(self.body.get("message") or self.body.get("detail") or "")


def refusal(kind: Kind, detail: str, **extra: Any) -> Answer:
    """A refusal with a clear ``detail``."""
    return Answer(kind, {"detail": detail, **extra})
