"""A tenant's destinations over HTTP (issue #24, item 1): the JSON routes under /destinations, mapped through
the one ``Kind`` table (``api.routes.HTTP_STATUS``), and the console's pages, one per destination with its
settings, its versions and its changes.

An admin creates, edits (``If-Match`` on the destination's version) and retires; every role that reads exports
reads destinations. Another tenant's destination is indistinguishable from a missing one. A reference to a
secret is shown as "set", never by its value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.templating import Jinja2Templates

from api.auth import authenticate, console_caller
from api.routes import BODY_ERRORS, ERRORS, respond
from service.auth import Caller
from service.connection_tests import ConnectionTests
from service.destinations import (
    CreateDestination,
    Destinations,
    EditDestination,
    PinHostKey,
    RetireDestination,
    UnpinHostKey,
)
from service.exports import IDEMPOTENCY_KEY_PATTERN, IF_MATCH_PATTERN
from service.permissions import Action, may
from service.signals import TemporalStopSignaller
from service.views import short, stamp

router = APIRouter(prefix="/destinations", tags=["destinations"])
console_router = APIRouter(prefix="/console/destinations", include_in_schema=False)

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
templates.env.filters["short"] = short
templates.env.filters["stamp"] = stamp

CallerDep = Annotated[Caller, Depends(authenticate)]


def destinations(request: Request) -> Destinations:
    """The destination operations over the app's ``exports_api`` store (two-person changes through the app's
    approvals); connection tests run on a worker through the stop signaller's Temporal client (none: a test
    answers 503)."""
    exports = request.app.state.exports
    signaller = exports.signaller
    tests = (
        ConnectionTests(signaller.connected_client, request.app.state.settings.task_queue)
        if isinstance(signaller, TemporalStopSignaller)
        else None
    )
    return Destinations(exports.store, tests, approvals=exports.approvals)


DestinationsDep = Annotated[Destinations, Depends(destinations)]

_FORBIDDEN = {403: {"description": "Not an admin: only an admin changes destinations; nothing was recorded"}}
_NOT_FOUND = {404: {"description": "No such destination in your tenant (another tenant's looks the same)"}}
_DESTINATION_ID = "$response.body#/destination/id"
_DESTINATION_LINKS = {
    "GetDestination": {"operationId": "get_destination", "parameters": {"destination_id": _DESTINATION_ID}},
    "EditDestination": {
        "operationId": "edit_destination",
        "parameters": {"destination_id": _DESTINATION_ID, "header.If-Match": "$response.header.ETag"},
    },
    "RetireDestination": {
        "operationId": "retire_destination",
        "parameters": {"destination_id": _DESTINATION_ID},
    },
}

IdempotencyKey = Annotated[
    str,
    Header(
        alias="Idempotency-Key",
        description="One value per request, reused on retry: the same key and body return the first destination.",
        min_length=1,
        max_length=200,
        pattern=IDEMPOTENCY_KEY_PATTERN,
    ),
]
IfMatch = Annotated[
    str,
    Header(
        alias="If-Match",
        description=(
            'The ETag you read, e.g. "1": the destination\'s version (RFC 9110 strong comparison). '
            "Missing: 428. Unquoted or unterminated: 400. Another version: 412."
        ),
        pattern=IF_MATCH_PATTERN,
    ),
]


@router.get(
    "",
    operation_id="list_destinations",
    summary="Your tenant's destinations: the destination_id an export or a bulk cancel names",
    responses={
        200: {
            "description": "The destinations, by ID, name, version and whether retired",
            "links": {
                "CreateExport": {
                    "operationId": "create_export",
                    "requestBody": {"destination_id": "$response.body#/destinations/0/id"},
                },
                "GetDestination": {
                    "operationId": "get_destination",
                    "parameters": {"destination_id": "$response.body#/destinations/0/id"},
                },
                "PreviewBulkCancel": {
                    "operationId": "preview_bulk_cancel",
                    "parameters": {"destination_id": "$response.body#/destinations/0/id"},
                },
                "BulkCancel": {
                    "operationId": "bulk_cancel",
                    "requestBody": {"destination_id": "$response.body#/destinations/0/id"},
                },
            },
        },
        **ERRORS,
    },
)
async def list_destinations(caller: CallerDep, ops: DestinationsDep) -> JSONResponse:
    return respond(await ops.list(caller))


@router.post(
    "",
    operation_id="create_destination",
    summary="Create a destination (admin; idempotent per Idempotency-Key); it starts paused",
    status_code=201,
    responses={
        200: {
            "description": "Replay: the destination this key and request created",
            "links": _DESTINATION_LINKS,
        },
        201: {
            "description": "Created as version 1 (the ETag), paused until resumed",
            "links": _DESTINATION_LINKS,
        },
        400: {"description": "Idempotency-Key missing or malformed, or the body is not JSON"},
        409: {"description": "This Idempotency-Key was used for a different request"},
        422: {
            "description": "Invalid body (which field and why, never its value), or a contract that does not hold"
        },
        **_FORBIDDEN,
        **{k: v for k, v in BODY_ERRORS.items() if k != 422},
    },
)
async def create_destination(
    body: CreateDestination, caller: CallerDep, ops: DestinationsDep, idempotency_key: IdempotencyKey
) -> JSONResponse:
    return respond(await ops.create(caller, body, idempotency_key))


@router.get(
    "/{destination_id}",
    operation_id="get_destination",
    summary="One destination: its settings (references shown as 'set'), its versions and its changes",
    responses={
        200: {
            "description": "The destination and its versions, newest first; the ETag is its version",
            "links": {
                "EditDestination": {
                    "operationId": "edit_destination",
                    "parameters": {
                        "destination_id": "$request.path.destination_id",
                        "header.If-Match": "$response.header.ETag",
                    },
                }
            },
        },
        **_NOT_FOUND,
        **ERRORS,
    },
)
async def get_destination(destination_id: UUID, caller: CallerDep, ops: DestinationsDep) -> JSONResponse:
    return respond(await ops.show(caller, destination_id))


@router.patch(
    "/{destination_id}",
    operation_id="edit_destination",
    summary="Change a destination from the version you read (admin; If-Match: the ETag), with a reason",
    description=(
        "The change is the destination's next version, recorded with who, when, why and each field before "
        "and after. A change of anything a delivery uses (host, port, username, host_key, credential_ref, "
        "remote_dir, the evidence terms) makes exports building for it start again for the new version; "
        "deliveries already authorized finish on the version they were authorized for."
    ),
    responses={
        200: {"description": "Changed (the ETag is the new version), or nothing to change"},
        202: {
            "description": (
                "A change of the host, port, account, credential, host key or encryption keys: waiting for "
                "another admin's approval (GET /approvals); nothing changed yet"
            )
        },
        400: {"description": "If-Match unquoted or unterminated, or the body is not JSON"},
        409: {"description": "The destination is retired: a retired destination never changes"},
        412: {"description": "If-Match names another version, or only weak tags"},
        428: {"description": "If-Match missing"},
        422: {
            "description": (
                "Invalid body (at least one field besides the reason; null only for ack_suffix and "
                "contract_ends_on), or a contract that does not hold"
            )
        },
        **_FORBIDDEN,
        **_NOT_FOUND,
        **{k: v for k, v in BODY_ERRORS.items() if k != 422},
    },
)
async def edit_destination(
    destination_id: UUID, body: EditDestination, caller: CallerDep, ops: DestinationsDep, if_match: IfMatch
) -> JSONResponse:
    return respond(await ops.edit(caller, destination_id, body, if_match))


@router.post(
    "/{destination_id}/host-keys",
    operation_id="pin_host_key",
    summary="Trust one more host key (admin; If-Match: the ETag), with a reason: a rotation overlaps",
    description=(
        "Pins the key (as `ssh-keyscan` prints it) beside the keys pinned already: the destination's next "
        "version, recorded. Check the key's fingerprint with the partner first (a connection test shows the "
        "one the server presents; it never pins anything itself). A change of delivery terms: exports "
        "building for it are rebuilt at cutoff 2. Once the partner serves the new key, remove the old one."
    ),
    responses={
        200: {"description": "Pinned (the ETag is the new version), or already pinned (nothing changed)"},
        400: {"description": "If-Match unquoted or unterminated, or the body is not JSON"},
        409: {"description": "The destination is retired"},
        412: {"description": "If-Match names another version, or only weak tags"},
        428: {"description": "If-Match missing"},
        422: {"description": "Not a public key line, or ten keys are pinned already"},
        **_FORBIDDEN,
        **_NOT_FOUND,
        **{k: v for k, v in BODY_ERRORS.items() if k != 422},
    },
)
async def pin_host_key(
    destination_id: UUID, body: PinHostKey, caller: CallerDep, ops: DestinationsDep, if_match: IfMatch
) -> JSONResponse:
    return respond(await ops.pin_key(caller, destination_id, body, if_match))


@router.post(
    "/{destination_id}/host-keys/removal",
    operation_id="unpin_host_key",
    summary="Stop trusting a pinned host key, by its fingerprint (admin; If-Match: the ETag), with a reason",
    responses={
        200: {"description": "Removed (the ETag is the new version)"},
        400: {"description": "If-Match unquoted or unterminated, or the body is not JSON"},
        404: {"description": "No such destination, or no pinned key with that fingerprint"},
        409: {"description": "The destination is retired"},
        412: {"description": "If-Match names another version, or only weak tags"},
        428: {"description": "If-Match missing"},
        422: {"description": "It is the last pinned key: a destination keeps at least one"},
        **_FORBIDDEN,
        **{k: v for k, v in BODY_ERRORS.items() if k != 422},
    },
)
async def unpin_host_key(
    destination_id: UUID, body: UnpinHostKey, caller: CallerDep, ops: DestinationsDep, if_match: IfMatch
) -> JSONResponse:
    return respond(await ops.unpin_key(caller, destination_id, body, if_match))


@router.post(
    "/{destination_id}/connection-tests",
    operation_id="test_destination_connection",
    summary="Test a destination's connection without trusting it (operator, reconciler, admin)",
    description=(
        "A worker connects and reports the host key the server presented (its line and SHA256 fingerprint) "
        "and whether it is pinned; only when it is, our login's result, whether remote_dir lists and takes a "
        "new file (a temporary name, created and removed), posix-rename support and the write limit "
        "(limits@openssh.com). It never pins a key and records nothing."
    ),
    responses={
        200: {"description": "What the server presented and allowed (an unreachable server is reported too)"},
        **ERRORS,
        503: {
            "description": "No worker answered, every session slot of the partner is in use, or the database "
            "did not answer: nothing was pinned or recorded; retry"
        },
        403: {"description": "A viewer: testing a connection needs the operator, reconciler or admin role"},
        **_NOT_FOUND,
    },
)
async def test_destination_connection(
    destination_id: UUID, caller: CallerDep, ops: DestinationsDep
) -> JSONResponse:
    return respond(await ops.test_connection(caller, destination_id))


@router.post(
    "/{destination_id}/retirement",
    operation_id="retire_destination",
    summary="Retire a destination (admin), with a reason: building exports stop at cutoff 2, queued ones are rejected",
    responses={
        200: {"description": "Retired, as its next version (the ETag)"},
        409: {"description": "Already retired"},
        **_FORBIDDEN,
        **_NOT_FOUND,
        **BODY_ERRORS,
    },
)
async def retire_destination(
    destination_id: UUID, body: RetireDestination, caller: CallerDep, ops: DestinationsDep
) -> JSONResponse:
    return respond(await ops.retire(caller, destination_id, body))


# -- the console -----------------------------------------------------------------------------------------


def _page(
    request: Request, caller: Caller, template: str, context: dict[str, Any], status: int = 200
) -> Response:
    from api import console  # the console's page context (it imports the list page's helpers)

    return templates.TemplateResponse(
        request,
        template,
        {
            **console._page_context(request, caller),
            "may_manage": may(caller.role, Action.MANAGE_DESTINATIONS),
            **context,
        },
        status_code=status,
    )


@console_router.get("", response_class=HTMLResponse)
async def destinations_page(request: Request) -> Response:
    from api import console

    caller = await console_caller(request)
    if caller is None:
        return console._to_login()
    listed = await destinations(request).list(caller)
    return _page(
        request,
        caller,
        "destinations.html",
        {
            "tenant_name": await request.app.state.exports.tenant_name(caller.tenant_id),
            "destinations": listed.body["destinations"],
        },
    )


@console_router.get("/{destination_id}", response_class=HTMLResponse)
async def destination_page(request: Request, destination_id: str) -> Response:
    from api import console

    caller = await console_caller(request)
    if caller is None:
        return console._to_login()
    try:
        found = UUID(destination_id)
    except ValueError:
        found = None
    answer = await destinations(request).show(caller, found) if found else None
    if answer is None or not answer.ok:
        return templates.TemplateResponse(
            request, "not_found.html", console._page_context(request, caller), status_code=404
        )
    destination = answer.body["destination"]
    shown = {k: v for k, v in destination.items() if k not in _NOT_SETTINGS}
    return _page(
        request,
        caller,
        "destination.html",
        {"d": destination, "settings": shown, "versions": answer.body["versions"]},
    )


# What the settings table leaves out: shown elsewhere on the page, or not a setting.
_NOT_SETTINGS = frozenset(
    {
        "id",
        "tenant_id",
        "links",
        "name",
        "deliveries",
        "paused_because",
        "version",
        "delivery_version",
        "host_keys",
        "pinned_host_keys",
        "sessions_in_use",
        # what the partner receives: its own section
        "csv_header",
        "csv_delimiter",
        "csv_columns",
        "compression",
        "pgp_recipient_keys",
        "pgp_signing_key_ref",
    }
)
