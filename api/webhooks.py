"""Outcome notifications over HTTP: the tenant's webhook endpoints under /webhook-endpoints (mapped through
the same ``Kind`` table as every route, ``api.routes.HTTP_STATUS``), and the console's pages: the endpoints,
and one endpoint with its recent deliveries, failures and a Redeliver button for admins.

Another tenant's endpoint or delivery answers exactly as a missing one does (404, the same body).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.templating import Jinja2Templates

from api.auth import authenticate, console_caller
from api.routes import BODY_ERRORS, ERRORS, IfMatch, respond
from domain.notifications import DeliveryState, NotificationKind
from rules.webhooks import url_origin
from service.auth import Caller
from service.notifications import CreateEndpoint, EditEndpoint, Notifications
from service.permissions import Action, may
from service.views import short, stamp

router = APIRouter(prefix="/webhook-endpoints", tags=["notifications"])
console_router = APIRouter(prefix="/console/webhook-endpoints", include_in_schema=False)

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
templates.env.filters["short"] = short
templates.env.filters["stamp"] = stamp

CallerDep = Annotated[Caller, Depends(authenticate)]

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "No such webhook endpoint in your tenant (another tenant's looks the same)"}
}
_ADMIN: dict[int | str, dict[str, Any]] = {403: {"description": "Your role may not manage notifications"}}


def notifications(request: Request) -> Notifications:
    """The endpoint operations over the app's ``exports_api`` store."""
    return Notifications(request.app.state.exports.store, request.app.state.settings)


NotificationsDep = Annotated[Notifications, Depends(notifications)]


@router.get("", summary="Your tenant's webhook endpoints and how their deliveries stand", responses=ERRORS)
async def list_endpoints(caller: CallerDep, ops: NotificationsDep) -> JSONResponse:
    return respond(await ops.list(caller))


@router.post(
    "",
    summary="Register a webhook endpoint (admins); the answer carries its signing secret, shown once",
    status_code=201,
    responses={
        **BODY_ERRORS,
        **_ADMIN,
        201: {"description": "Registered, enabled; `secret` is in this answer only"},
        409: {"description": "The tenant has as many endpoints as it may"},
        422: {"description": "A URL that is not https (http only to a loopback host), or a malformed body"},
    },
)
async def create_endpoint(
    body: Annotated[CreateEndpoint, Body()], caller: CallerDep, ops: NotificationsDep
) -> JSONResponse:
    return respond(await ops.create(caller, body))


@router.get(
    "/{endpoint_id}",
    summary="One webhook endpoint (never its secret)",
    responses={**ERRORS, **_NOT_FOUND},
)
async def get_endpoint(endpoint_id: UUID, caller: CallerDep, ops: NotificationsDep) -> JSONResponse:
    return respond(await ops.get(caller, endpoint_id))


@router.patch(
    "/{endpoint_id}",
    summary="Change, disable or re-enable an endpoint, or rotate its secret (admins; If-Match)",
    responses={
        **BODY_ERRORS,
        **_ADMIN,
        **_NOT_FOUND,
        412: {"description": "The endpoint changed since the version you read"},
        428: {"description": "If-Match is missing"},
    },
)
async def edit_endpoint(
    endpoint_id: UUID,
    body: Annotated[EditEndpoint, Body()],
    caller: CallerDep,
    ops: NotificationsDep,
    if_match: IfMatch,
) -> JSONResponse:
    return respond(await ops.edit(caller, endpoint_id, body, if_match))


@router.delete(
    "/{endpoint_id}",
    summary="Remove an endpoint and its deliveries (admins)",
    responses={**ERRORS, **_ADMIN, **_NOT_FOUND},
)
async def delete_endpoint(endpoint_id: UUID, caller: CallerDep, ops: NotificationsDep) -> JSONResponse:
    return respond(await ops.delete(caller, endpoint_id))


@router.get(
    "/{endpoint_id}/deliveries",
    summary="An endpoint's deliveries, newest first: state, attempts, the last answer",
    responses={**ERRORS, **_NOT_FOUND},
)
async def list_deliveries(
    endpoint_id: UUID,
    caller: CallerDep,
    ops: NotificationsDep,
    state: DeliveryState | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> JSONResponse:
    return respond(await ops.deliveries(caller, endpoint_id, state=state, limit=limit))


@router.post(
    "/{endpoint_id}/deliveries/{delivery_id}/redelivery",
    summary="Send one delivery again now, with the same event ID, and retry it for another day (admins)",
    status_code=202,
    responses={
        **ERRORS,
        **_ADMIN,
        202: {"description": "Queued: the worker sends it within seconds"},
        404: {"description": "No such endpoint or delivery in your tenant (another tenant's looks the same)"},
    },
)
async def redeliver(
    endpoint_id: UUID, delivery_id: UUID, caller: CallerDep, ops: NotificationsDep
) -> JSONResponse:
    return respond(await ops.redeliver(caller, endpoint_id, delivery_id))


# -- the console ---------------------------------------------------------------------------------------


def _shown_url(caller: Caller, url: str) -> str:
    return url if may(caller.role, Action.MANAGE_NOTIFICATIONS) else url_origin(url)


@console_router.get("", response_class=HTMLResponse)
async def endpoints_page(request: Request) -> Response:
    from api import console  # the console's page context and login redirect

    caller = await console_caller(request)
    if caller is None:
        return console._to_login()
    ops = notifications(request)
    return templates.TemplateResponse(
        request,
        "webhooks.html",
        {
            **console._page_context(request, caller),
            "tenant_name": await request.app.state.exports.tenant_name(caller.tenant_id),
            "endpoints": await ops.endpoints(caller),
            "shown_url": lambda url: _shown_url(caller, url),
            "may_manage": may(caller.role, Action.MANAGE_NOTIFICATIONS),
            "all_kinds": [k.value for k in NotificationKind],
        },
    )


@console_router.get("/{endpoint_id}", response_class=HTMLResponse)
async def endpoint_page(request: Request, endpoint_id: str, state: str | None = None) -> Response:
    from api import console

    caller = await console_caller(request)
    if caller is None:
        return console._to_login()
    ops = notifications(request)
    try:
        wanted = UUID(endpoint_id)
    except ValueError:
        wanted = None
    endpoint = None
    if wanted is not None:
        rows = await ops.store.tenant_webhook_endpoints(caller.tenant_id, wanted)
        endpoint = rows[0] if rows else None
    if endpoint is None:
        return templates.TemplateResponse(
            request, "webhook_not_found.html", console._page_context(request, caller), status_code=404
        )
    shown_state = DeliveryState(state) if state in DeliveryState._value2member_map_ else None
    deliveries = await ops.store.endpoint_deliveries(
        caller.tenant_id, endpoint.id, state=shown_state, limit=100
    )
    return templates.TemplateResponse(
        request,
        "webhook_endpoint.html",
        {
            **console._page_context(request, caller),
            "tenant_name": await request.app.state.exports.tenant_name(caller.tenant_id),
            "e": endpoint,
            "url": _shown_url(caller, endpoint.url),
            "deliveries": deliveries,
            "state": shown_state.value if shown_state else "",
            "may_manage": may(caller.role, Action.MANAGE_NOTIFICATIONS),
        },
    )
