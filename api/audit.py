"""The ledger of operator actions and the approvals of two-person actions over HTTP (issue #26, items 2 and 3):
``GET /audit`` (filters, keyset pages), ``GET /audit.jsonl`` (the filtered ledger as JSON Lines, streamed),
``/approvals`` (read by every role; approved or declined by another principal who may do the action), and the
console's ``/console/audit`` and ``/console/approvals``. Another tenant's approval looks like a missing one.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.templating import Jinja2Templates
from pydantic import AwareDatetime, BeforeValidator

from api.auth import authenticate, console_caller
from api.routes import BODY_ERRORS, ERRORS, respond
from domain.audit import AuditAction, SubjectKind, TwoPersonAction
from service.approvals import Approvals, state_of
from service.audit import ACTIONS, CURSOR_PATTERN, Audit, AuditFilter
from service.auth import Caller
from service.commands import MAX_NAME, NAME_PATTERN, Body, Reason
from service.permissions import TWO_PERSON_PERMISSION, Action, may
from service.views import short, stamp

router = APIRouter(tags=["audit"])
approvals_router = APIRouter(prefix="/approvals", tags=["approvals"])
console_router = APIRouter(prefix="/console", include_in_schema=False)

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
templates.env.filters["short"] = short
templates.env.filters["stamp"] = stamp

CallerDep = Annotated[Caller, Depends(authenticate)]
_FORBIDDEN = {403: {"description": "Your role may not read the ledger (admins and reconcilers may)"}}
_NOT_FOUND = {404: {"description": "No such approval in your tenant (another tenant's looks the same)"}}


def audit(request: Request) -> Audit:
    """The ledger's reads over the app's ``exports_api`` store."""
    return Audit(request.app.state.exports.store)


def approvals(request: Request) -> Approvals:
    """The two-person actions over the app's operations (which registered how each approval runs)."""
    return request.app.state.exports.approvals  # type: ignore[no-any-return]


AuditDep = Annotated[Audit, Depends(audit)]
ApprovalsDep = Annotated[Approvals, Depends(approvals)]

PrincipalQuery = Annotated[
    str | None,
    Query(
        description="only this principal's actions", min_length=1, max_length=MAX_NAME, pattern=NAME_PATTERN
    ),
]
ActionQuery = Annotated[AuditAction | None, Query(description="only this action")]
SubjectKindQuery = Annotated[SubjectKind | None, Query(description="only this kind of subject")]
SubjectQuery = Annotated[
    str | None,
    Query(
        description="only actions on this subject (an export, destination or approval ID; a principal's name)",
        min_length=1,
        max_length=200,
        pattern=r"^[!-~]{1,200}$",
    ),
]
_ISO_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?([Zz]|[+-]\d{2}:?\d{2})$")


def _iso_time(value: object) -> object:
    # A time is an RFC 3339 date-time with its offset, as the schema publishes; pydantic alone would also take
    # a number as seconds since the epoch.
    if isinstance(value, str) and not _ISO_TIME.match(value):
        raise ValueError("an RFC 3339 date-time with its UTC offset, e.g. 2026-12-01T00:00:00+00:00")
    return value


Moment = Annotated[AwareDatetime, BeforeValidator(_iso_time)]
SinceQuery = Annotated[Moment | None, Query(description="at or after this time (with its UTC offset)")]
UntilQuery = Annotated[Moment | None, Query(description="before this time (with its UTC offset)")]


def _filter(
    principal: str | None,
    action: AuditAction | None,
    subject_kind: SubjectKind | None,
    subject_id: str | None,
    since: datetime | None,
    until: datetime | None,
) -> AuditFilter:
    return AuditFilter(
        principal=principal,
        action=action.value if action else None,
        subject_kind=subject_kind.value if subject_kind else None,
        subject_id=subject_id,
        since=since,
        until=until,
    )


@router.get(
    "/audit",
    operation_id="list_operator_actions",
    summary="The ledger of operator actions, newest first, one page at a time (admins and reconcilers)",
    responses={
        400: {"description": "before: not a cursor this API gave out"},
        422: {"description": "A filter the ledger cannot hold (until before since, ...)"},
        **_FORBIDDEN,
        **ERRORS,
    },
)
async def list_operator_actions(
    caller: CallerDep,
    ops: AuditDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    before: Annotated[
        str | None, Query(description="the `next` cursor of the previous page", pattern=CURSOR_PATTERN)
    ] = None,
    principal: PrincipalQuery = None,
    action: ActionQuery = None,
    subject_kind: SubjectKindQuery = None,
    subject_id: SubjectQuery = None,
    since: SinceQuery = None,
    until: UntilQuery = None,
) -> JSONResponse:
    where = _filter(principal, action, subject_kind, subject_id, since, until)
    return respond(await ops.page(caller.tenant_id, caller.role, where, limit=limit, before=before))


@router.get(
    "/audit.jsonl",
    operation_id="export_operator_actions",
    summary="The filtered ledger of operator actions as JSON Lines, newest first, streamed (admins and reconcilers)",
    response_class=StreamingResponse,
    responses={
        200: {"description": "One JSON object per line", "content": {"application/jsonl": {}}},
        **_FORBIDDEN,
        **ERRORS,
    },
)
async def export_operator_actions(
    caller: CallerDep,
    ops: AuditDep,
    principal: PrincipalQuery = None,
    action: ActionQuery = None,
    subject_kind: SubjectKindQuery = None,
    subject_id: SubjectQuery = None,
    since: SinceQuery = None,
    until: UntilQuery = None,
) -> Response:
    forbidden = ops.refused(caller.role)
    if forbidden is not None:
        return respond(forbidden)
    where = _filter(principal, action, subject_kind, subject_id, since, until)
    problem = ops.filter_problem(where)
    if problem:
        return JSONResponse({"detail": problem}, status_code=422)
    return StreamingResponse(
        ops.lines(caller.tenant_id, where),
        media_type="application/jsonl",
        headers={"Content-Disposition": 'attachment; filename="operator-actions.jsonl"'},
    )


# -- approvals ---------------------------------------------------------------------------------------------


class Decision(Body):
    """POST /approvals/{id}/approval: why (optional, recorded)."""

    reason: Reason | None = None


class Refusal(Body):
    """POST /approvals/{id}/refusal: why (recorded)."""

    reason: Reason


@approvals_router.get(
    "",
    operation_id="list_approvals",
    summary="Two-person actions of your tenant, newest first (every role reads them)",
    responses=ERRORS,
)
async def list_approvals(
    caller: CallerDep,
    ops: ApprovalsDep,
    pending: Annotated[bool, Query(description="only those still waiting, unexpired")] = False,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> JSONResponse:
    return respond(await ops.list(caller, pending_only=pending, limit=limit))


@approvals_router.get(
    "/{approval_id}",
    operation_id="get_approval",
    summary="One two-person action: what, asked by whom, until when, decided by whom, what it answered",
    responses={**_NOT_FOUND, **ERRORS},
)
async def get_approval(approval_id: UUID, caller: CallerDep, ops: ApprovalsDep) -> JSONResponse:
    return respond(await ops.show(caller, approval_id))


@approvals_router.post(
    "/{approval_id}/approval",
    operation_id="approve",
    summary="Approve a waiting two-person action as its second person: it runs now, as yours",
    responses={
        200: {"description": "Approved, and the action's own answer (201, 202, 409... as it answered)"},
        403: {"description": "You asked for it, or your role may not do the action"},
        409: {"description": "Already decided, or expired"},
        **_NOT_FOUND,
        **BODY_ERRORS,
    },
)
async def approve(approval_id: UUID, body: Decision, caller: CallerDep, ops: ApprovalsDep) -> JSONResponse:
    return respond(await ops.approve(caller, approval_id, body.reason))


@approvals_router.post(
    "/{approval_id}/refusal",
    operation_id="decline",
    summary="Decline a waiting two-person action: it never runs",
    responses={
        403: {"description": "You asked for it, or your role may not do the action"},
        409: {"description": "Already decided, or expired"},
        **_NOT_FOUND,
        **BODY_ERRORS,
    },
)
async def decline(approval_id: UUID, body: Refusal, caller: CallerDep, ops: ApprovalsDep) -> JSONResponse:
    return respond(await ops.decline(caller, approval_id, body.reason))


# -- the console -----------------------------------------------------------------------------------------


def _page(
    request: Request, caller: Caller, template: str, context: dict[str, Any], status: int = 200
) -> Response:
    from api import console  # the console's page context (it imports the list page's helpers)

    return templates.TemplateResponse(
        request, template, {**console._page_context(request, caller), **context}, status_code=status
    )


def _text(value: str | None, pattern_max: int = 200) -> str | None:
    value = (value or "").strip()
    return value[:pattern_max] if value else None


@console_router.get("/audit", response_class=HTMLResponse)
async def audit_page(
    request: Request,
    principal: str | None = None,
    action: str | None = None,
    subject: str | None = None,
    before: str | None = None,
) -> Response:
    from api import console

    caller = await console_caller(request)
    if caller is None:
        return console._to_login()
    ops = audit(request)
    where = AuditFilter(
        principal=_text(principal),
        action=action if action in ACTIONS else None,
        subject_id=_text(subject),
    )
    answer = await ops.page(caller.tenant_id, caller.role, where, limit=50, before=before or None)
    query = {
        k: v
        for k, v in (("principal", where.principal), ("action", where.action), ("subject", where.subject_id))
        if v
    }
    export_query = {
        k: v
        for k, v in (
            ("principal", where.principal),
            ("action", where.action),
            ("subject_id", where.subject_id),
        )
        if v
    }
    next_cursor = answer.body.get("next") if answer.ok else None
    return _page(
        request,
        caller,
        "audit.html",
        {
            "tenant_name": await request.app.state.exports.tenant_name(caller.tenant_id),
            "allowed": answer.ok,
            "refusal": answer.text if not answer.ok else "",
            "actions": answer.body.get("actions", []),
            "all_actions": ACTIONS,
            "filters": {
                "principal": where.principal or "",
                "action": where.action or "",
                "subject": where.subject_id or "",
            },
            "next_url": f"/console/audit?{urlencode({**query, 'before': next_cursor})}"
            if next_cursor
            else None,
            "first_url": f"/console/audit?{urlencode(query)}" if before else None,
            "export_url": f"/audit.jsonl?{urlencode(export_query)}" if export_query else "/audit.jsonl",
        },
        status=200 if answer.ok else 403,
    )


@console_router.get("/approvals", response_class=HTMLResponse)
async def approvals_page(request: Request) -> Response:
    from api import console

    caller = await console_caller(request)
    if caller is None:
        return console._to_login()
    listed = await approvals(request).list(caller, limit=100)
    rows = listed.body["approvals"]
    for row in rows:
        # what the page offers follows the rules the service applies (which refuses the rest anyway)
        row["may_decide"] = (
            row["state"] == "pending"
            and row["requested_by"] != caller.principal
            and may(caller.role, TWO_PERSON_PERMISSION[row["action"]])
        )
    return _page(
        request,
        caller,
        "approvals.html",
        {
            "tenant_name": await request.app.state.exports.tenant_name(caller.tenant_id),
            "approvals": rows,
            "may_read_audit": may(caller.role, Action.READ_AUDIT),
            "two_person": [a.value for a in TwoPersonAction],
            "state_of": state_of,
        },
    )
