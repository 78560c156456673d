"""One ledger of operator actions (issue #26, item 2): how an action is recorded, and how the ledger is read.

**What is recorded.** Every control-plane action a principal asks for: cancel, bulk cancel, pause and resume,
reconcile, correct, replacement, destination changes (the host key's included), recurring-export changes,
token mint and revoke, role grants, and the decisions on two-person actions. One row per request that the
operation answered: who (the principal and the role it acted with), when, what (action and subject), why, the
request ID (``X-Request-ID``, or one the API or the command line made), the outcome (the answer's
:class:`~service.outcomes.Kind`), and the subject before and after, without secrets.

**Which refusals are recorded.** Every answer of the operation itself is, refusals included: 403 (the role may
not), 404 (no such subject in the tenant), 409 (the state says no), 412 (a stale version), 422 (the service
found the request invalid) and a 202 that waits for a second person. Not recorded: a request the schema or the
authentication refuses before the operation runs (400, 401, 413, 422 from validation: no principal acted, or
nothing was asked that the operation read), a Busy (503: nothing was decided and nothing recorded, by
contract), and an action whose transaction failed (it did not happen).

**In the action's transaction.** Where the action is a database write, its row is appended in the same
transaction as the write (``StoreBase.recording``, or in the cancellation's pipeline), so an action that rolled
back is not in the ledger and one that committed always is. A refusal is appended on its own. A bulk cancel is
one row per submission, appended after its exports' own transactions (each export's request is in
``cancellation_requests``), with the counts of its outcomes.

**Not on an export's hot path.** Creating an export, the claim, the build, cutoff 2, the delivery and the
terminal write append nothing: the ledger is written on control-plane actions only.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from db.stores.api import ApiStore
from db.stores.base import StoreBase
from domain.audit import ActionRecord, AuditAction, OperatorAction, SubjectKind
from service.outcomes import Answer, Kind, refusal
from service.permissions import Action, refused

REQUEST_ID_PATTERN = r"^[!-~]{1,200}$"  # visible ASCII, as the API's other headers
_REQUEST_ID = re.compile(REQUEST_ID_PATTERN)
PAGE_LIMIT = 100
EXPORT_PAGE = 500  # rows per round trip of the JSON Lines export

# The request an action belongs to: set by the API per HTTP request (X-Request-ID) and by the command line
# per invocation; the ledger records it.
_CURRENT_REQUEST: ContextVar[str | None] = ContextVar("fenced_exports_request_id", default=None)


def new_request_id(prefix: str = "") -> str:
    """A fresh request ID."""
    return f"{prefix}{uuid.uuid4()}"


def acceptable_request_id(value: str | None) -> str | None:
    """A client's request ID if it is one we record (1-200 visible ASCII characters), else ``None``."""
    return value if value is not None and _REQUEST_ID.match(value) else None


def set_request_id(request_id: str | None) -> Any:
    """Make ``request_id`` the current request's ID (returns a token for :func:`reset_request_id`)."""
    return _CURRENT_REQUEST.set(request_id)


def reset_request_id(token: Any) -> None:
    _CURRENT_REQUEST.reset(token)


def current_request_id() -> str | None:
    """The ID of the request being served, if any."""
    return _CURRENT_REQUEST.get()


def answered(record: ActionRecord, answer: Answer) -> Answer:
    """Note ``answer`` as the action's outcome (unless its row was already written in the action's own
    transaction, which then holds the outcome) and return it."""
    if not record.written:
        record.outcome = answer.kind.value
        record.detail = answer.text or None
    return answer


class Ledger:
    """Appends operator actions over one store (its role must hold INSERT on ``operator_actions``)."""

    def __init__(self, store: StoreBase) -> None:
        self.store = store

    def record(
        self,
        *,
        tenant_id: UUID | None,
        principal: str,
        role: str,
        action: AuditAction,
        subject_kind: SubjectKind,
        subject_id: object | None,
        reason: str | None = None,
        before: Any = None,
    ) -> ActionRecord:
        """A ledger row to fill as the action runs (the request ID is the current request's)."""
        return ActionRecord(
            tenant_id=tenant_id,
            principal=principal,
            role=role,
            action=action,
            subject_kind=subject_kind,
            subject_id=None if subject_id is None else str(subject_id),
            request_id=current_request_id(),
            reason=reason,
            before=before,
        )

    @contextlib.asynccontextmanager
    async def action(
        self,
        *,
        tenant_id: UUID | None,
        principal: str,
        role: str,
        action: AuditAction,
        subject_kind: SubjectKind,
        subject_id: object | None,
        reason: str | None = None,
    ) -> AsyncIterator[ActionRecord]:
        """One action, recorded once: the block answers through :func:`answered`, writes its row in the
        action's own transaction if it writes (``store.recording(record)``), and otherwise the row is appended
        here, on its own, as the block ends. Nothing is recorded when the block raises (the action did not
        happen, or its fate is unknown) or answers Busy (nothing was decided)."""
        record = self.record(
            tenant_id=tenant_id,
            principal=principal,
            role=role,
            action=action,
            subject_kind=subject_kind,
            subject_id=subject_id,
            reason=reason,
        )
        yield record
        if not record.written and record.outcome is not None and record.outcome != Kind.BUSY.value:
            await self.store.record_operator_action(record)


# -- reading the ledger ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditFilter:
    """What ``GET /audit`` narrows the ledger to (each ``None``: no filter)."""

    principal: str | None = None
    action: str | None = None
    subject_kind: str | None = None
    subject_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None


ACTIONS = [a.value for a in AuditAction]
SUBJECT_KINDS = [k.value for k in SubjectKind]
CURSOR_PATTERN = r"^[1-9][0-9]{0,18}$"
_CURSOR = re.compile(CURSOR_PATTERN)


def action_json(row: OperatorAction) -> dict[str, Any]:
    """One ledger row as JSON."""
    return row.model_dump(mode="json")


class Audit:
    """The ledger, read: ``GET /audit``, ``GET /audit.jsonl``, ``starter.py audit`` and the console's page."""

    def __init__(self, store: ApiStore) -> None:
        self.store = store

    def refused(self, role: str) -> Answer | None:
        """The 403 for a role that may not read the ledger (admins and reconcilers may)."""
        return refused(role, Action.READ_AUDIT)

    async def page(
        self,
        tenant_id: UUID,
        role: str,
        where: AuditFilter,
        *,
        limit: int = PAGE_LIMIT,
        before: str | None = None,
    ) -> Answer:
        """One page of the tenant's ledger, newest first, and the cursor of the next page (keyset: a page never
        repeats or skips a row because rows were appended meanwhile)."""
        forbidden = self.refused(role)
        if forbidden is not None:
            return forbidden
        bound = None
        if before is not None:
            if not _CURSOR.match(before):
                return refusal(Kind.MALFORMED, "before: not a cursor this API gave out")
            bound = int(before)
        problem = _filter_problem(where)
        if problem:
            return refusal(Kind.INVALID, problem)
        rows = await self._rows(tenant_id, where, limit + 1, bound)
        more = len(rows) > limit
        rows = rows[:limit]
        return Answer(
            Kind.DONE,
            {
                "actions": [action_json(r) for r in rows],
                "next": str(rows[-1].id) if more and rows else None,
            },
        )

    async def lines(self, tenant_id: UUID, where: AuditFilter) -> AsyncIterator[str]:
        """The whole filtered ledger, newest first, as JSON Lines (one row per line), read a page at a time."""
        bound: int | None = None
        while True:
            rows = await self._rows(tenant_id, where, EXPORT_PAGE, bound)
            for row in rows:
                yield json.dumps(action_json(row), separators=(",", ":"), ensure_ascii=False) + "\n"
            if len(rows) < EXPORT_PAGE:
                return
            bound = rows[-1].id

    async def _rows(
        self, tenant_id: UUID, where: AuditFilter, limit: int, before_id: int | None
    ) -> list[OperatorAction]:
        return await self.store.page_operator_actions(
            tenant_id,
            limit=limit,
            before_id=before_id,
            principal=where.principal,
            action=where.action,
            subject_kind=where.subject_kind,
            subject_id=where.subject_id,
            since=where.since,
            until=where.until,
        )

    def filter_problem(self, where: AuditFilter) -> str | None:
        return _filter_problem(where)


def _filter_problem(where: AuditFilter) -> str | None:
    if where.action is not None and where.action not in ACTIONS:
        return f"action: one of {', '.join(ACTIONS)}"
    if where.subject_kind is not None and where.subject_kind not in SUBJECT_KINDS:
        return f"subject_kind: one of {', '.join(SUBJECT_KINDS)}"
    if where.since is not None and where.until is not None and where.until <= where.since:
        return "until must be after since"
    for moment, name in ((where.since, "since"), (where.until, "until")):
        if moment is not None and moment.tzinfo is None:
            return f"{name}: give its UTC offset, e.g. 2026-12-01T00:00:00+00:00"
    return None
