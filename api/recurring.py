"""Recurring exports over HTTP: the JSON routes under /recurring-exports (mapped through the same ``Kind``
table as every route, ``api.routes.HTTP_STATUS``) and the console's page listing them with their firings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.templating import Jinja2Templates

from api.auth import authenticate, console_caller
from api.routes import BODY_ERRORS, ERRORS, IfMatch, respond
from service.auth import Caller
from service.recurring import (
    DefineRecurringExport,
    EditRecurringExport,
    PauseRecurringExport,
    RecurringExports,
    describe_when,
)
from service.views import short, stamp

router = APIRouter(prefix="/recurring-exports", tags=["recurring exports"])
console_router = APIRouter(prefix="/console/recurring", include_in_schema=False)

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
templates.env.filters["short"] = short
templates.env.filters["stamp"] = stamp
templates.env.filters["when"] = describe_when

CallerDep = Annotated[Caller, Depends(authenticate)]

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "No such recurring export in your tenant (another tenant's looks the same)"}
}
_FORBIDDEN: dict[int | str, dict[str, Any]] = {
    403: {"description": "Your role may not manage recurring exports"}
}
_UNTOUCHED = (
    "Done: the body's exports_untouched counts the exports it already created, by status; none of them "
    "was changed"
)


def recurring(request: Request) -> RecurringExports:
    """The recurring exports' operations the app was built with."""
    return request.app.state.recurring


RecurringDep = Annotated[RecurringExports, Depends(recurring)]


@router.post(
    "",
    operation_id="create_recurring_export",
    summary="Define a recurring export: a list to a destination on a cron expression or an interval",
    status_code=201,
    responses={
        201: {"description": "Defined; its Schedule created (or pending: Temporal did not answer)"},
        422: {
            "description": "Invalid cron, interval, timezone, start/end, or a destination not your tenant's"
        },
        **_FORBIDDEN,
        **{k: v for k, v in BODY_ERRORS.items() if k != 422},
    },
)
async def create_recurring_export(
    body: DefineRecurringExport, caller: CallerDep, ops: RecurringDep
) -> JSONResponse:
    return respond(await ops.create(caller, body))


@router.get(
    "", operation_id="list_recurring_exports", summary="Your tenant's recurring exports", responses=ERRORS
)
async def list_recurring_exports(
    caller: CallerDep,
    ops: RecurringDep,
    include_deleted: Annotated[bool, Query(description="deleted ones too")] = False,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> JSONResponse:
    return respond(await ops.list(caller, include_deleted=include_deleted, limit=limit))


@router.get(
    "/{recurring_export_id}",
    operation_id="get_recurring_export",
    summary="One recurring export with its latest firings (created export X, or skipped and why)",
    responses={**_NOT_FOUND, **ERRORS},
)
async def get_recurring_export(
    recurring_export_id: UUID,
    caller: CallerDep,
    ops: RecurringDep,
    firings: Annotated[int, Query(ge=1, le=500, description="how many firings, newest first")] = 50,
) -> JSONResponse:
    return respond(await ops.show(caller, recurring_export_id, firings=firings))


@router.patch(
    "/{recurring_export_id}",
    operation_id="edit_recurring_export",
    summary="Change a recurring export's terms or timing (If-Match: the ETag you read)",
    responses={
        409: {"description": "Deleted"},
        412: {"description": "If-Match names another version"},
        428: {"description": "If-Match missing"},
        **_FORBIDDEN,
        **_NOT_FOUND,
        **BODY_ERRORS,
    },
)
async def edit_recurring_export(
    recurring_export_id: UUID,
    body: EditRecurringExport,
    caller: CallerDep,
    ops: RecurringDep,
    if_match: IfMatch,
) -> JSONResponse:
    return respond(await ops.edit(caller, recurring_export_id, body, if_match))


@router.post(
    "/{recurring_export_id}/pause",
    operation_id="pause_recurring_export",
    summary="Pause a recurring export (the exports it created are untouched)",
    responses={
        200: {"description": _UNTOUCHED},
        409: {"description": "Deleted"},
        **_FORBIDDEN,
        **_NOT_FOUND,
        **BODY_ERRORS,
    },
)
async def pause_recurring_export(
    recurring_export_id: UUID,
    caller: CallerDep,
    ops: RecurringDep,
    body: Annotated[PauseRecurringExport | None, Body()] = None,
) -> JSONResponse:
    return respond(await ops.pause(caller, recurring_export_id, body or PauseRecurringExport()))


@router.post(
    "/{recurring_export_id}/resume",
    operation_id="resume_recurring_export",
    summary="Resume a paused recurring export (missed firings are not run)",
    responses={
        200: {"description": _UNTOUCHED},
        409: {"description": "Deleted"},
        **_FORBIDDEN,
        **_NOT_FOUND,
        **ERRORS,
    },
)
async def resume_recurring_export(
    recurring_export_id: UUID, caller: CallerDep, ops: RecurringDep
) -> JSONResponse:
    return respond(await ops.resume(caller, recurring_export_id))


@router.delete(
    "/{recurring_export_id}",
    operation_id="delete_recurring_export",
    summary="Delete a recurring export: its Schedule goes, its firings stay, its exports are untouched",
    responses={200: {"description": _UNTOUCHED}, **_FORBIDDEN, **_NOT_FOUND, **ERRORS},
)
async def delete_recurring_export(
    recurring_export_id: UUID, caller: CallerDep, ops: RecurringDep
) -> JSONResponse:
    return respond(await ops.delete(caller, recurring_export_id))


# -- the console -----------------------------------------------------------------------------------------


@console_router.get("", response_class=HTMLResponse)
async def recurring_page(request: Request, show: str | None = None) -> Response:
    """Every recurring export of the tenant, and the firings of each (newest first)."""
    from api import console  # the console's page context

    caller = await console_caller(request)
    if caller is None:
        return console._to_login()
    ops = recurring(request)
    exports = request.app.state.exports
    rows = await ops.store.page_recurring_exports(caller.tenant_id, limit=200, include_deleted=True)
    firings = {r.id: await ops.store.recurring_export_firings(caller.tenant_id, r.id, limit=20) for r in rows}
    return templates.TemplateResponse(
        request,
        "recurring.html",
        {
            **console._page_context(request, caller),
            "tenant_name": await exports.tenant_name(caller.tenant_id),
            "destinations": await exports.destination_names(caller.tenant_id),
            "rows": rows,
            "firings": firings,
        },
    )
