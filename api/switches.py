"""The delivery switches over HTTP: the JSON routes under /switches (mapped through the same ``Kind`` table
as every route, ``api.routes.HTTP_STATUS``), the console's switches page, and the list page's banner.

A tenant's operators pause and resume their tenant and its destinations; the global switch is the
platform's (``python starter.py pause --global``), so the API answers 403 for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.templating import Jinja2Templates

from api.auth import authenticate, console_caller
from api.routes import BODY_ERRORS, ERRORS, respond
from service.auth import Caller
from service.switches import Operator, ResumeRequest, Switches, SwitchRequest, banner_lines, state_of
from service.views import short, stamp

router = APIRouter(prefix="/switches", tags=["switches"])
console_router = APIRouter(prefix="/console/switches", include_in_schema=False)

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
templates.env.filters["short"] = short
templates.env.filters["stamp"] = stamp
templates.env.filters["state"] = state_of

CallerDep = Annotated[Caller, Depends(authenticate)]

_SWITCH_ERRORS: dict[int | str, dict[str, Any]] = {
    **BODY_ERRORS,
    403: {"description": "The global switch (command line only)"},
    422: {"description": "No such destination in your tenant, or a body the schema refuses"},
}


def switches(request: Request) -> Switches:
    """The switch operations over the app's ``exports_api`` store (two-person releases through the app's
    approvals)."""
    exports = request.app.state.exports
    return Switches(exports.store, approvals=exports.approvals)


SwitchesDep = Annotated[Switches, Depends(switches)]


def _operator(caller: Caller) -> Operator:
    return Operator(principal=caller.principal, tenant_id=caller.tenant_id, role=caller.role)


@router.get(
    "",
    summary="The delivery switches you can see, whether any pauses you, and their history",
    responses=ERRORS,
)
async def list_switches(caller: CallerDep, ops: SwitchesDep) -> JSONResponse:
    return respond(await ops.view(caller.tenant_id))


@router.post(
    "/pause",
    summary="Pause deliveries for your tenant or one of its destinations, with a reason",
    responses=_SWITCH_ERRORS,
)
async def pause(body: Annotated[SwitchRequest, Body()], caller: CallerDep, ops: SwitchesDep) -> JSONResponse:
    return respond(await ops.pause(_operator(caller), body))


@router.post(
    "/resume",
    summary=(
        "Resume deliveries for your tenant or one of its destinations: release your pauses, or the one named "
        "(another's, or a host-key trip: 202, waiting for a second person); wakes their queued exports"
    ),
    responses={
        **_SWITCH_ERRORS,
        202: {"description": "Waiting for another principal's approval (GET /approvals)"},
    },
)
async def resume(body: Annotated[ResumeRequest, Body()], caller: CallerDep, ops: SwitchesDep) -> JSONResponse:
    return respond(await ops.resume(_operator(caller), body))


# -- the console ---------------------------------------------------------------------------------------


async def banner_for(request: Request, caller: Caller) -> list[str]:
    """The list page's banner: one sentence per paused scope of the caller's tenant (or that they could
    not be read: then deliveries are to be treated as paused)."""
    return await switches(request).banner(caller.tenant_id)


@console_router.get("", response_class=HTMLResponse)
async def switches_page(request: Request) -> Response:
    from api import console  # the console's page context; it imports this module for the banner

    caller = await console_caller(request)
    if caller is None:
        return console._to_login()
    ops = switches(request)
    all_switches = await ops.store.tenant_switches(caller.tenant_id)
    pauses = await ops.store.tenant_pauses(caller.tenant_id)
    history = await ops.store.switch_history(caller.tenant_id, 50)
    names = {s.destination_id: s.destination_name for s in all_switches if s.destination_id}
    return templates.TemplateResponse(
        request,
        "switches.html",
        {
            **console._page_context(request, caller),
            "tenant_name": await request.app.state.exports.tenant_name(caller.tenant_id),
            "switches": all_switches,
            "history": history,
            "names": names,
            "pauses": pauses,
            "switch_banner": banner_lines(all_switches, pauses),
        },
    )
