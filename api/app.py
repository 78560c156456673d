"""The FastAPI application: JSON API under /exports, console under /console, OpenAPI at /openapi.json."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from api import console, routes
from db.errors import TransientStoreError, translate
from service.exports import RETRY_AFTER_SECONDS, Exports
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
    app.add_exception_handler(psycopg.Error, _driver_error)  # type: ignore[arg-type]

    @app.middleware("http")
    async def limit_body(request: Request, call_next):  # noqa: ANN001, ANN202 - Starlette's signature
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return JSONResponse({"detail": f"request body over {MAX_BODY_BYTES} bytes"}, status_code=413)
        return await call_next(request)

    @app.get("/", include_in_schema=False)
    async def home() -> Response:
        return RedirectResponse("/console", status_code=307)

    @app.get("/healthz", include_in_schema=False)
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    app.include_router(routes.router)
    app.include_router(console.router)
    app.mount("/static", StaticFiles(directory=str(Path(__file__).parent / "static")), name="static")
    return app
