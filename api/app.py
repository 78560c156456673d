"""The FastAPI application: JSON API under /exports, console under /console, OpenAPI at /openapi.json."""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from api import console, routes
from db.errors import TransientStoreError
from observability.health import health_router, instrument_fastapi, standard_readiness
from service.exports import Exports
from service.signals import TemporalStopSignaller
from settings import Settings

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024


def _field(loc: tuple | list) -> str:
    return ".".join(str(part) for part in loc)


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    # Says which field and why; never echoes the submitted value.
    errors = [{"field": _field(e.get("loc", ())), "problem": e.get("msg", "invalid")} for e in exc.errors()]
    summary = "; ".join(f"{e['field']}: {e['problem']}" for e in errors)
    return JSONResponse({"detail": f"invalid request: {summary}", "errors": errors}, status_code=422)


async def _database_unavailable(request: Request, exc: TransientStoreError) -> JSONResponse:
    log.warning("database did not answer for %s %s (%s)", request.method, request.url.path, exc)
    return JSONResponse(
        {"detail": "the database did not answer; nothing is known to have changed, retry"},
        status_code=503,
        headers={"Retry-After": "2"},
    )


def create_app(settings: Settings, *, exports: Exports) -> FastAPI:
    """Build the API and console over ``exports`` (the operations over open stores, with the stop
    signaller); the caller owns their pools and closes them."""
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
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(TransientStoreError, _database_unavailable)  # type: ignore[arg-type]

    @app.middleware("http")
    async def limit_body(request: Request, call_next):  # noqa: ANN001, ANN202 - Starlette's signature
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return JSONResponse({"detail": f"request body over {MAX_BODY_BYTES} bytes"}, status_code=413)
        return await call_next(request)

    @app.get("/", include_in_schema=False)
    async def home() -> Response:
        return RedirectResponse("/console", status_code=307)

    app.include_router(routes.router)
    app.include_router(console.router)
    app.mount("/static", StaticFiles(directory=str(Path(__file__).parent / "static")), name="static")
    # /healthz, /readyz (PostgreSQL through the API's own pool, migrations, Temporal through the stop
    # signaller's client when there is one) and /metrics (this process's registry); traced when on.
    signaller = exports.signaller
    temporal = signaller.connected_client if isinstance(signaller, TemporalStopSignaller) else None
    app.include_router(health_router(standard_readiness(exports.store.pool, temporal)))
    instrument_fastapi(app)
    return app
