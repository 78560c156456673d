"""The FastAPI application: JSON API under /exports, console under /console, OpenAPI at /openapi.json."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from api import audit, console, destinations, reconciliation, recurring, routes, switches, webhooks
from api.limits import MAX_BODY_BYTES
from db.errors import TransientStoreError, translate
from observability.health import health_router, instrument_fastapi, standard_readiness
from service.audit import acceptable_request_id, new_request_id, reset_request_id, set_request_id
from service.exports import RETRY_AFTER_SECONDS, Exports
from service.recurring import RecurringExports
from service.recurring_schedules import ScheduleSync
from service.signals import TemporalStopSignaller
from settings import Settings

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-ID"


def _field(loc: tuple | list) -> str:
    return ".".join(str(part) for part in loc)


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    # Says which field and why; never echoes the submitted value. A missing If-Match is 428 (the
    # precondition is required), any other header the schema refuses is 400, everything else 422.
    errors = [{"field": _field(e.get("loc", ())), "problem": e.get("msg", "invalid")} for e in exc.errors()]
    summary = "; ".join(f"{e['field']}: {e['problem']}" for e in errors)
    body = {"detail": f"invalid request: {summary}", "errors": errors}
    locations = {tuple(e.get("loc", ()))[:1] for e in exc.errors()}
    if locations == {("header",)}:
        missing_if_match = any(
            tuple(e.get("loc", ()))[1:2] == ("If-Match",) and e.get("type") == "missing" for e in exc.errors()
        )
        if missing_if_match:
            body["detail"] = 'the If-Match header is required: the ETag you read, e.g. If-Match: "1"'
            return JSONResponse(body, status_code=428)
        return JSONResponse(body, status_code=400)
    return JSONResponse(body, status_code=422)


def _leaf_routes(routes: list[Any]) -> list[Any]:
    """Every endpoint route, looking through included routers (FastAPI wraps each ``include_router``)."""
    leaves = []
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            leaves += _leaf_routes(list(included.routes))
        else:
            leaves.append(route)
    return leaves


def allowed_methods(app: FastAPI, scope: dict[str, Any]) -> set[str]:
    """Every method some route serves at this request's path (FastAPI has one route per method)."""
    methods: set[str] = set()
    for route in _leaf_routes(list(app.router.routes)):
        route_methods = getattr(route, "methods", None)
        if not route_methods:
            continue  # a mount (the static files) serves no API path
        match, _ = route.matches({**scope, "method": next(iter(route_methods))})
        if match == Match.FULL:
            methods |= set(route_methods)
    return methods | {"OPTIONS"} if methods else methods


def _allow(methods: set[str]) -> str:
    return ", ".join(sorted(methods))


async def _database_unavailable(request: Request, exc: TransientStoreError) -> JSONResponse:
    # Every path that reads or writes (the token lookup for a bearer or the console's cookie included)
    # goes through the store, whose errors are typed; a connection it could not get in time is one too.
    log.warning("database did not answer for %s %s (%s)", request.method, request.url.path, exc)
    return JSONResponse(
        {"detail": "the database did not answer; nothing is known to have changed, retry"},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


async def _driver_error(request: Request, exc: psycopg.Error) -> Response:
    """A driver error that escaped the store's boundary (a bug, but not the client's): translated here the
    same way, so a lost connection is a 503, never a 500."""
    translated = translate(exc)
    if isinstance(translated, TransientStoreError):
        return await _database_unavailable(request, translated)
    log.error("database error for %s %s (%s)", request.method, request.url.path, type(exc).__name__)
    return JSONResponse({"detail": "internal error"}, status_code=500)


def create_app(settings: Settings, *, exports: Exports, schedules: ScheduleSync | None = None) -> FastAPI:
    """Build the API and console over ``exports`` (the operations over open stores, with the stop
    signaller); the caller owns their pools and closes them. Recurring exports' Schedules are synced over
    ``schedules``, by default through the stop signaller's Temporal client (pending without one)."""
    app = FastAPI(
        title="Fenced Exports",
        version="1",
        description=(
            "Partner exports that tell the truth about cancellation. Authenticate with "
            "`Authorization: Bearer <token>` (minted with `python starter.py token`)."
        ),
    )
    app.state.settings = settings
    app.state.exports = exports
    if schedules is None:
        signaller = exports.signaller
        schedules = ScheduleSync(
            signaller.connected_client if isinstance(signaller, TemporalStopSignaller) else None,
            task_queue=settings.task_queue,
            catchup_window_seconds=settings.recurring_catchup_window_seconds,
        )
    app.state.recurring = RecurringExports(exports.store, schedules)
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(TransientStoreError, _database_unavailable)  # type: ignore[arg-type]
    app.add_exception_handler(psycopg.Error, _driver_error)  # type: ignore[arg-type]

    @app.middleware("http")
    async def request_id(request: Request, call_next):  # noqa: ANN001, ANN202 - Starlette's signature
        # The request's ID, recorded with any operator action it asks for: the client's X-Request-ID if it is
        # one (1-200 visible ASCII characters), else a new one; echoed on the answer either way.
        given = acceptable_request_id(request.headers.get(REQUEST_ID_HEADER))
        current = given or new_request_id()
        token = set_request_id(current)
        try:
            response = await call_next(request)
        finally:
            reset_request_id(token)
        response.headers[REQUEST_ID_HEADER] = current
        return response

    @app.middleware("http")
    async def limit_body(request: Request, call_next):  # noqa: ANN001, ANN202 - Starlette's signature
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return JSONResponse({"detail": f"request body over {MAX_BODY_BYTES} bytes"}, status_code=413)
        return await call_next(request)

    @app.middleware("http")
    async def options_and_allow(request: Request, call_next):  # noqa: ANN001, ANN202 - Starlette's signature
        # OPTIONS answers with every method the path serves; a 405 lists them all too (Starlette's own 405
        # names only the first matching route's methods, and FastAPI has one route per method).
        if request.method == "OPTIONS":
            methods = allowed_methods(app, request.scope)
            if methods:
                return Response(status_code=204, headers={"Allow": _allow(methods)})
        response = await call_next(request)
        if response.status_code == 405:
            response.headers["Allow"] = _allow(allowed_methods(app, request.scope))
        return response

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allow(allowed_methods(app, request.scope))
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    @app.get("/", include_in_schema=False)
    async def home() -> Response:
        return RedirectResponse("/console", status_code=307)

    app.include_router(routes.router)
    app.include_router(routes.batches)
    app.include_router(destinations.router)
    app.include_router(routes.counts)
    app.include_router(console.router)
    app.include_router(destinations.console_router)
    app.include_router(switches.router)
    app.include_router(switches.console_router)
    app.include_router(recurring.router)
    app.include_router(recurring.console_router)
    app.include_router(webhooks.router)
    app.include_router(webhooks.console_router)
    app.include_router(reconciliation.router)
    app.include_router(reconciliation.console_router)
    app.include_router(audit.router)
    app.include_router(audit.approvals_router)
    app.include_router(audit.console_router)
    app.mount("/static", StaticFiles(directory=str(Path(__file__).parent / "static")), name="static")
    # /healthz, /readyz (PostgreSQL through the API's own pool, migrations, Temporal through the stop
    # signaller's client when there is one) and /metrics (this process's registry); traced when on.
    signaller = exports.signaller
    temporal = signaller.connected_client if isinstance(signaller, TemporalStopSignaller) else None
    app.include_router(health_router(standard_readiness(exports.store.pool, temporal)))
    instrument_fastapi(app)
    return app
