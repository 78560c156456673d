"""The JSON API: thin FastAPI routes over ``service.exports.Exports``; OpenAPI at /openapi.json and /docs."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse

from api.auth import authenticate
from service.auth import Caller
from service.commands import (
    CancelExport,
    CorrectExport,
    CreateExport,
    EditTerms,
    ReconcileExport,
    ReplaceExport,
)
from service.exports import Exports
from service.outcomes import Answer, Kind

router = APIRouter(prefix="/exports", tags=["exports"])

CallerDep = Annotated[Caller, Depends(authenticate)]

_ERRORS = {
    400: {"description": "Malformed header or a reused request ID"},
    401: {"description": "Missing or unknown bearer token"},
    404: {"description": "No such export in your tenant (another tenant's looks the same)"},
    422: {"description": "Invalid body or path: wrong UUIDs, missing fields, oversized strings"},
}


def exports(request: Request) -> Exports:
    """The operations object the app was built with."""
    return request.app.state.exports


ExportsDep = Annotated[Exports, Depends(exports)]


# The one table from an operation's outcome to its HTTP status (001 "What the API returns").
HTTP_STATUS: dict[Kind, int] = {
    Kind.DONE: 200,
    Kind.CREATED: 201,
    Kind.ACCEPTED: 202,
    Kind.MALFORMED: 400,
    Kind.FORBIDDEN: 403,
    Kind.NOT_FOUND: 404,
    Kind.REFUSED: 409,
    Kind.STALE: 412,
    Kind.INVALID: 422,
    Kind.PRECONDITION_REQUIRED: 428,
    Kind.BUSY: 503,
    Kind.PARTIAL: 202,
}


def respond(answer: Answer) -> JSONResponse:
    """An operation's answer as an HTTP response: its status from ``HTTP_STATUS``, its headers."""
    headers = dict(answer.extra)
    if answer.location is not None:
        headers["Location"] = answer.location
    if answer.version is not None:
        headers["ETag"] = f'"{answer.version}"'
    if answer.replayed:
        headers["Idempotent-Replayed"] = "true"
    if answer.retry_after_seconds is not None:
        headers["Retry-After"] = str(answer.retry_after_seconds)
    return JSONResponse(answer.body, status_code=HTTP_STATUS[answer.kind], headers=headers)


@router.post(
    "",
    summary="Create an export (idempotent per Idempotency-Key)",
    status_code=201,
    responses={
        200: {"description": "Replay: the first job for this key and request"},
        409: {"description": "Key used for a different request"},
        **_ERRORS,
    },
)
async def create_export(
    body: CreateExport,
    caller: CallerDep,
    ops: ExportsDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> JSONResponse:
    return respond(await ops.create(caller, body, idempotency_key))


@router.get("", summary="List your tenant's exports, newest first", responses=_ERRORS)
async def list_exports(
    caller: CallerDep, ops: ExportsDep, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> JSONResponse:
    return respond(await ops.list(caller, limit))


@router.get(
    "/{export_id}", summary="One export with its timeline and cancellation requests", responses=_ERRORS
)
async def get_export(export_id: UUID, caller: CallerDep, ops: ExportsDep) -> JSONResponse:
    return respond(await ops.status(caller, export_id))


@router.patch(
    "/{export_id}",
    summary="Edit a queued export's terms (If-Match: the version you read)",
    responses={
        409: {"description": "No longer queued"},
        412: {"description": "Version moved on"},
        428: {"description": "If-Match missing"},
        **_ERRORS,
    },
)
async def edit_export(
    export_id: UUID,
    body: EditTerms,
    caller: CallerDep,
    ops: ExportsDep,
    if_match: Annotated[str | None, Header(alias="If-Match")] = None,
) -> JSONResponse:
    return respond(await ops.edit(caller, export_id, body, if_match))


@router.post(
    "/{export_id}/cancellations",
    summary="Request cancellation with your own request ID",
    responses={
        200: {"description": "CanceledWhileQueued, or AlreadyCanceled (this request changed nothing)"},
        202: {
            "description": "StopRequested / StopAlreadyRequested; poll the Location for the attempt's ending"
        },
        400: {"description": "RequestIdReused: the ID belongs to a different request"},
        404: {"description": "NotFound"},
        409: {"description": "AlreadyEnded, or TooLate (delivery was already authorized)"},
        503: {
            "description": "Busy: nothing decided or recorded; retry with the same request ID after Retry-After"
        },
        401: _ERRORS[401],
        422: _ERRORS[422],
    },
)
async def cancel_export(
    export_id: UUID, body: CancelExport, caller: CallerDep, ops: ExportsDep
) -> JSONResponse:
    return respond(await ops.cancel(caller, export_id, body))


@router.post(
    "/{export_id}/replacements",
    summary="Create a replacement delivery (named creator, reason, optional overwrite agreement)",
    status_code=201,
    responses={409: {"description": "The original may not be replaced, or a replacement is live"}, **_ERRORS},
)
async def replace_export(
    export_id: UUID, body: ReplaceExport, caller: CallerDep, ops: ExportsDep
) -> JSONResponse:
    return respond(await ops.replace(caller, export_id, body))


@router.post(
    "/{export_id}/reconciliation",
    summary="Resolve an OutcomeUnknown to Completed or Failed from evidence (once per attempt)",
    responses={409: {"description": "Not OutcomeUnknown, or already reconciled"}, **_ERRORS},
)
async def reconcile_export(
    export_id: UUID, body: ReconcileExport, caller: CallerDep, ops: ExportsDep
) -> JSONResponse:
    return respond(await ops.reconcile(caller, export_id, body))


@router.post(
    "/{export_id}/corrections",
    summary="Correct a recorded Completed/Failed once (reconciler role only)",
    responses={
        403: {"description": "Not a reconciler"},
        409: {"description": "Nothing matched, or already corrected"},
        **_ERRORS,
    },
)
async def correct_export(
    export_id: UUID, body: CorrectExport, caller: CallerDep, ops: ExportsDep
) -> JSONResponse:
    return respond(await ops.correct(caller, export_id, body))
