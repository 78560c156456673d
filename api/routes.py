"""The JSON API: thin FastAPI routes over ``service.exports.Exports``; OpenAPI at /openapi.json and /docs."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse

from api.auth import authenticate
from api.limits import MAX_BODY_BYTES
from domain.listing import ExportFilter
from domain.models import JobStatus
from service.auth import Caller
from service.commands import (
    MAX_NAME,
    NAME_PATTERN,
    BulkCancel,
    CancelExport,
    CorrectExport,
    CreateExport,
    EditTerms,
    ReconcileExport,
    ReplaceExport,
)
from service.exports import (
    CURSOR_PATTERN,
    ID_PREFIX_PATTERN,
    IDEMPOTENCY_KEY_PATTERN,
    IF_MATCH_PATTERN,
    Exports,
)
from service.outcomes import Answer, Kind

router = APIRouter(prefix="/exports", tags=["exports"])
batches = APIRouter(prefix="/cancellation-batches", tags=["bulk cancel"])
# Beside /exports rather than under it: /exports/{export_id} would take any name there (its UUID is checked
# after routing), so a method it serves would answer 422 at /exports/counts instead of 405.
counts = APIRouter(prefix="/export-counts", tags=["exports"])

CallerDep = Annotated[Caller, Depends(authenticate)]

# What every route can answer besides its own outcomes. Each is JSON with a ``detail`` for people; a
# request the schema refuses also carries ``errors`` (which field, why), never the submitted value.
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or unknown bearer token"},
    422: {"description": "Invalid body, path or query: wrong UUIDs, missing fields, what the schema refuses"},
    503: {
        "description": "The database did not answer: nothing is known to have changed; retry after Retry-After"
    },
}
BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "The body is not JSON"},
    **ERRORS,
    413: {"description": f"Request body over {MAX_BODY_BYTES} bytes"},
}
_NOT_FOUND = {404: {"description": "No such export in your tenant (another tenant's looks the same)"}}

IdempotencyKey = Annotated[
    str,
    Header(
        alias="Idempotency-Key",
        description="One value per request, reused on retry: the same key and body return the first export.",
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
            'The ETag you read, e.g. "1" (RFC 9110 strong comparison: a weak tag never matches). '
            "Missing: 428. Unquoted or unterminated: 400. Another version: 412."
        ),
        pattern=IF_MATCH_PATTERN,
    ),
]

_EXPORT_ID = "$response.body#/export/id"
_CREATED_LINKS = {
    "ReplaceExport": {"operationId": "replace_export", "parameters": {"export_id": _EXPORT_ID}},
    "ReconcileExport": {"operationId": "reconcile_export", "parameters": {"export_id": _EXPORT_ID}},
    "GetExport": {"operationId": "get_export", "parameters": {"export_id": _EXPORT_ID}},
    "EditExport": {
        "operationId": "edit_export",
        "parameters": {"export_id": _EXPORT_ID, "header.If-Match": "$response.header.ETag"},
    },
    "CancelExport": {"operationId": "cancel_export", "parameters": {"export_id": _EXPORT_ID}},
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
    operation_id="create_export",
    summary="Create an export (idempotent per Idempotency-Key)",
    status_code=201,
    responses={
        200: {"description": "Replay: the first job for this key and request", "links": _CREATED_LINKS},
        201: {"description": "Created, Queued; ETag is its version", "links": _CREATED_LINKS},
        400: {"description": "Idempotency-Key missing or malformed, or the body is not JSON"},
        409: {"description": "Key used for a different request"},
        422: {"description": "Invalid body, or a destination_id that is not your tenant's"},
        **{k: v for k, v in BODY_ERRORS.items() if k != 422},
    },
)
async def create_export(
    body: CreateExport, caller: CallerDep, ops: ExportsDep, idempotency_key: IdempotencyKey
) -> JSONResponse:
    return respond(await ops.create(caller, body, idempotency_key))


# A list or a count past its bound (EXPORTS_LIST_QUERY_TIMEOUT_MS) answers 503 too, never a silent part.
_TOO_SLOW = {
    503: {
        "description": (
            "The database did not answer, or (`code` `query_timeout`, with `timeout_ms`) this filter's read "
            "ran past its bound: nothing is shown rather than part of it; narrow the filter (a status, a "
            "destination, a list, more of the export ID) or retry after Retry-After"
        )
    }
}

StatusFilter = Annotated[list[JobStatus] | None, Query(description="only these statuses")]
ListNameFilter = Annotated[str | None, Query(min_length=1, max_length=MAX_NAME, pattern=NAME_PATTERN)]
IdPrefix = Annotated[
    str | None, Query(description="an export ID, or its first characters", pattern=ID_PREFIX_PATTERN)
]


def export_filter(
    status: StatusFilter = None,
    destination_id: Annotated[UUID | None, Query()] = None,
    list_name: ListNameFilter = None,
    q: IdPrefix = None,
) -> ExportFilter:
    """The list's filters from the query string (FastAPI dependency)."""
    return ExportFilter(tuple(status or ()), destination_id, list_name, q)


FilterDep = Annotated[ExportFilter, Depends(export_filter)]


@router.get(
    "",
    operation_id="list_exports",
    summary="List your tenant's exports, newest first, one page at a time",
    responses={400: {"description": "before: not a cursor this API gave out"}, **ERRORS, **_TOO_SLOW},
)
async def list_exports(
    caller: CallerDep,
    ops: ExportsDep,
    filters: FilterDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    before: Annotated[
        str | None, Query(description="the `next` cursor of the previous page", pattern=CURSOR_PATTERN)
    ] = None,
) -> JSONResponse:
    return respond(await ops.list(caller, limit, before=before, filters=filters))


@counts.get(
    "",
    operation_id="count_exports",
    summary="How many of your tenant's exports match the list's filters, in total and per status",
    description=(
        "The same filters as GET /exports. `matching` is the total; `by_status` counts each status under the "
        "other filters (the console's status chips). Each count has a `kind`: `exact` (counted), `estimate` "
        '(PostgreSQL\'s estimate from its statistics, shown as "about 9.8M"; counts the planner expects '
        "above `exact_up_to` are not taken exactly), `more_than` (counting stopped at `exact_up_to`: more than "
        "`count`), or `unknown`. `timed_out` is true when counting ran past its bound of `timeout_ms`; the "
        "counts it could not finish are then estimates."
    ),
    responses={**ERRORS},
)
async def count_exports(caller: CallerDep, ops: ExportsDep, filters: FilterDep) -> JSONResponse:
    return respond(await ops.count(caller, filters))


@router.get(
    "/{export_id}",
    operation_id="get_export",
    summary="One export with its timeline and cancellation requests",
    responses={**_NOT_FOUND, **ERRORS},
)
async def get_export(export_id: UUID, caller: CallerDep, ops: ExportsDep) -> JSONResponse:
    return respond(await ops.status(caller, export_id))


@router.patch(
    "/{export_id}",
    operation_id="edit_export",
    summary="Edit a queued export's terms (If-Match: the ETag you read)",
    responses={
        400: {"description": "If-Match unquoted or unterminated, or the body is not JSON"},
        409: {"description": "No longer queued"},
        412: {"description": "If-Match names another version, or only weak tags"},
        428: {"description": "If-Match missing"},
        422: {
            "description": "Invalid body (at least one field, no nulls), or a destination not your tenant's"
        },
        **_NOT_FOUND,
        **{k: v for k, v in BODY_ERRORS.items() if k != 422},
    },
)
async def edit_export(
    export_id: UUID, body: EditTerms, caller: CallerDep, ops: ExportsDep, if_match: IfMatch
) -> JSONResponse:
    return respond(await ops.edit(caller, export_id, body, if_match))


@router.post(
    "/{export_id}/cancellations",
    operation_id="cancel_export",
    summary="Request cancellation with your own request ID",
    responses={
        200: {"description": "CanceledWhileQueued, or AlreadyCanceled (this request changed nothing)"},
        202: {
            "description": "StopRequested / StopAlreadyRequested; poll the Location for the attempt's ending"
        },
        400: {
            "description": "RequestIdReused: the ID belongs to a different request; or the body is not JSON"
        },
        404: {"description": "NotFound"},
        409: {"description": "AlreadyEnded, or TooLate (delivery was already authorized)"},
        503: {
            "description": "Busy: nothing decided or recorded; retry with the same request ID after Retry-After"
        },
        **{k: v for k, v in BODY_ERRORS.items() if k != 503},
    },
)
async def cancel_export(
    export_id: UUID, body: CancelExport, caller: CallerDep, ops: ExportsDep
) -> JSONResponse:
    return respond(await ops.cancel(caller, export_id, body))


@router.post(
    "/{export_id}/replacements",
    operation_id="replace_export",
    summary="Create a replacement delivery (named creator, reason, optional overwrite agreement)",
    status_code=201,
    responses={
        409: {"description": "The original may not be replaced, or a replacement is live"},
        **_NOT_FOUND,
        **BODY_ERRORS,
    },
)
async def replace_export(
    export_id: UUID, body: ReplaceExport, caller: CallerDep, ops: ExportsDep
) -> JSONResponse:
    return respond(await ops.replace(caller, export_id, body))


@router.post(
    "/{export_id}/reconciliation",
    operation_id="reconcile_export",
    summary="Resolve an OutcomeUnknown to Completed or Failed from evidence (once per attempt; reconciler role only)",
    responses={
        403: {"description": "Not a reconciler"},
        409: {"description": "Not OutcomeUnknown, or already reconciled"},
        **_NOT_FOUND,
        **BODY_ERRORS,
    },
)
async def reconcile_export(
    export_id: UUID, body: ReconcileExport, caller: CallerDep, ops: ExportsDep
) -> JSONResponse:
    return respond(await ops.reconcile(caller, export_id, body))


@router.post(
    "/{export_id}/corrections",
    operation_id="correct_export",
    summary="Correct a recorded Completed/Failed once (reconciler role only)",
    responses={
        403: {"description": "Not a reconciler"},
        409: {"description": "Nothing matched, or already corrected"},
        **_NOT_FOUND,
        **BODY_ERRORS,
    },
)
async def correct_export(
    export_id: UUID, body: CorrectExport, caller: CallerDep, ops: ExportsDep
) -> JSONResponse:
    return respond(await ops.correct(caller, export_id, body))


# -- bulk cancel ----------------------------------------------------------------------------------------


@batches.get(
    "/preview",
    operation_id="preview_bulk_cancel",
    summary="The live exports a bulk cancel with this filter would cover now (the confirmation), and a token for that set",
    description=(
        "Counts the live exports (Queued, Running, Delivering) by status and lists their IDs "
        "(`export_ids`). Records no cancellation; keeps that exact set for 15 minutes under `preview_token` "
        "(null when nothing matches), which only you, in your tenant, can submit to POST "
        "/cancellation-batches to cancel exactly those exports."
    ),
    responses={
        200: {
            "description": "matching, by_status, export_ids, preview_token, expires_at",
            "links": {
                "ConfirmBulkCancel": {
                    "operationId": "bulk_cancel",
                    "requestBody": {
                        "destination_id": "$request.query.destination_id",
                        "preview_token": "$response.body#/preview_token",
                    },
                }
            },
        },
        **ERRORS,
    },
)
async def preview_bulk_cancel(
    caller: CallerDep,
    ops: ExportsDep,
    destination_id: Annotated[UUID, Query()],
    list_name: Annotated[str | None, Query(min_length=1, max_length=MAX_NAME, pattern=NAME_PATTERN)] = None,
) -> JSONResponse:
    return respond(await ops.bulk_cancel_preview(caller, destination_id, list_name))


@batches.post(
    "",
    operation_id="bulk_cancel",
    summary="Cancel the previewed exports of a destination (or of one list), each through its own request",
    description=(
        "With `preview_token` the batch covers exactly the exports that preview counted: one that ended "
        "since gets its own outcome (AlreadyEnded, TooLate, ...), and one that became live since is not "
        "touched and is listed in `not_in_preview`. Without it, the exports live when the batch is recorded."
    ),
    status_code=201,
    responses={
        200: {
            "description": "A replay: this batch ID was recorded before and every export it covers is decided"
        },
        201: {
            "description": "Recorded, and every export it covers decided: the counts of each outcome",
            "links": {
                "GetBatch": {
                    "operationId": "get_cancellation_batch",
                    "parameters": {"batch_id": "$response.body#/batch_id"},
                }
            },
        },
        202: {
            "description": (
                "Recorded, but some exports were Busy (listed with their request IDs; nothing recorded for "
                "them): retry with the same batch ID after Retry-After; nothing is recorded twice"
            )
        },
        400: {
            "description": (
                "This batch ID belongs to a different bulk cancel (another filter, operator or preview), "
                "or the body is not JSON"
            )
        },
        422: {
            "description": (
                "Invalid body; a destination_id that is not your tenant's; or a preview_token that is not "
                "your unexpired preview of this destination and list (preview again)"
            )
        },
        **{k: v for k, v in BODY_ERRORS.items() if k != 422},
    },
)
async def bulk_cancel(body: BulkCancel, caller: CallerDep, ops: ExportsDep) -> JSONResponse:
    return respond(await ops.bulk_cancel(caller, body))


@batches.get(
    "/{batch_id}",
    operation_id="get_cancellation_batch",
    summary="A recorded bulk cancel: its counts, the exports still without a request, and the live ones it does not cover",
    responses={
        202: {"description": "Some exports it covers have no request yet (Busy): resubmit the batch"},
        404: {"description": "No such batch in your tenant"},
        **ERRORS,
    },
)
async def get_cancellation_batch(batch_id: UUID, caller: CallerDep, ops: ExportsDep) -> JSONResponse:
    return respond(await ops.cancellation_batch(caller, batch_id))
