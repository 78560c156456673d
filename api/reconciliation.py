"""The reconciler's console (issue 26 item 4) over HTTP: the queue of OutcomeUnknown exports and one export's
evidence as JSON (``GET /reconciliation-queue``, ``GET /exports/{id}/evidence``), a reconciler's request for
today's listing of the final name (``POST /exports/{id}/listing-requests``), and the console's pages: the queue
(``/console/reconciliation``) and the evidence page with its actions (reconcile and replace post to the JSON
API; a correction request to ``/console/reconciliation/{id}/correction``, through
``service.reconciliation.request_correction``).

Every role of the tenant reads the pages; what a page offers follows the role, and the service refuses the rest
anyway. Another tenant's export answers exactly as a missing one does (404, the same body or page).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.templating import Jinja2Templates

from api.auth import authenticate, console_caller
from api.routes import BODY_ERRORS, ERRORS, respond
from service.auth import Caller
from service.commands import CorrectExport
from service.permissions import Action, may
from service.reconciliation import (
    QUEUE_COUNT_CAP,
    QUEUE_CURSOR_PATTERN,
    QUEUE_PAGE_SIZE,
    Reconciliation,
    decode_queue_cursor,
    reconciler_queue_page,
    request_correction,
)
from service.views import short, stamp

router = APIRouter(tags=["reconciliation"])
console_router = APIRouter(prefix="/console/reconciliation", include_in_schema=False)

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
templates.env.filters["short"] = short
templates.env.filters["stamp"] = stamp

CallerDep = Annotated[Caller, Depends(authenticate)]
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "No such export in your tenant (another tenant's looks the same)"}
}


def reconciliation(request: Request) -> Reconciliation:
    """The reconciler's operations over the app's ``exports_api`` store."""
    return Reconciliation(
        request.app.state.exports.store,
        recovery_every_seconds=request.app.state.settings.recovery_every_seconds,
    )


ReconciliationDep = Annotated[Reconciliation, Depends(reconciliation)]


@router.get(
    "/reconciliation-queue",
    summary="Your tenant's OutcomeUnknown exports, oldest first by when each became OutcomeUnknown, with how many wait",
    responses={**ERRORS, 400: {"description": "`after` is not a cursor this API gave out"}},
)
async def reconciliation_queue(
    caller: CallerDep,
    ops: ReconciliationDep,
    after: Annotated[
        str | None,
        Query(
            description="The `next` cursor of the previous page", pattern=QUEUE_CURSOR_PATTERN, max_length=60
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = QUEUE_PAGE_SIZE,
) -> JSONResponse:
    return respond(await ops.page(caller, after=after, limit=limit))


@router.get(
    "/exports/{export_id}/evidence",
    summary="What the evidence of an export's delivery says, line by line, and the listings asked for it",
    responses={**ERRORS, **_NOT_FOUND},
)
async def export_evidence(export_id: UUID, caller: CallerDep, ops: ReconciliationDep) -> JSONResponse:
    return respond(await ops.evidence(caller, export_id))


@router.post(
    "/exports/{export_id}/listing-requests",
    summary="Ask for today's listing of an OutcomeUnknown export's final name (reconcilers); recovery's next run lists it",
    status_code=202,
    responses={
        **ERRORS,
        **_NOT_FOUND,
        202: {
            "description": "Recorded: recovery's next run lists the final name and adds it to the evidence"
        },
        403: {"description": "Not a reconciler"},
        409: {
            "description": "Not OutcomeUnknown, its partner's deliveries paused, or a listing already asked"
        },
    },
)
async def request_listing(export_id: UUID, caller: CallerDep, ops: ReconciliationDep) -> JSONResponse:
    return respond(await ops.request_listing(caller, export_id))


# -- the console -------------------------------------------------------------------------------------------


def _waited(since: datetime | None, now: datetime) -> str:
    """How long an export has waited, for people: ``3 d 4 h``, ``2 h 5 min``, ``7 min``."""
    if since is None:
        return "-"
    minutes = max(0, int((now - since).total_seconds() // 60))
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min"


@console_router.get("", response_class=HTMLResponse)
async def queue_page(request: Request, after: str | None = None) -> Response:
    from api import console  # the console's page context and login redirect

    caller = await console_caller(request)
    if caller is None:
        return console._to_login()
    bound = decode_queue_cursor(after) if after else None
    store = request.app.state.exports.store
    page = await reconciler_queue_page(store, caller.tenant_id, limit=QUEUE_PAGE_SIZE, after=bound)
    now = datetime.now(UTC)
    return templates.TemplateResponse(
        request,
        "reconciliation.html",
        {
            **console._page_context(request, caller),
            "tenant_name": await request.app.state.exports.tenant_name(caller.tenant_id),
            "page": page,
            "paged": bound is not None,
            "count_cap": QUEUE_COUNT_CAP,
            "may_reconcile": may(caller.role, Action.RECONCILE),
            "waited": lambda since: _waited(since, now),
        },
    )


@console_router.get("/{export_id}", response_class=HTMLResponse)
async def evidence_page(request: Request, export_id: str) -> Response:
    from api import console

    caller = await console_caller(request)
    if caller is None:
        return console._to_login()
    try:
        job_id: UUID | None = UUID(export_id)
    except ValueError:
        job_id = None
    detail = await reconciliation(request).detail(caller, job_id) if job_id else None
    if detail is None:
        return templates.TemplateResponse(
            request, "not_found.html", console._page_context(request, caller), status_code=404
        )
    return templates.TemplateResponse(
        request,
        "evidence.html",
        {
            **console._page_context(request, caller),
            "d": detail,
            "job": detail.job,
            "recovery_every_seconds": request.app.state.settings.recovery_every_seconds,
        },
    )


@console_router.post(
    "/{export_id}/correction",
    responses={**BODY_ERRORS, **_NOT_FOUND},
)
async def correction_request(
    request: Request, export_id: UUID, body: Annotated[CorrectExport, Body()], caller: CallerDep
) -> JSONResponse:
    """The evidence page's correction request (the session's cookie and the console's header, as every
    console write): through ``request_correction``, the one function a second person's approval re-points."""
    return respond(await request_correction(request.app.state.exports, caller, export_id, body))
