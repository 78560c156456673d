"""The FastAPI application: JSON API under /exports, console under /console, OpenAPI at /openapi.json."""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from temporalio.client import Client

from api import console, routes
from api.operations import Exports
from api.signals import StopSignaller, TemporalStopSignaller
from db.errors import TransientStoreError
from db.store import JobStore
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


def create_app(
    settings: Settings,
    *,
    api_store: JobStore,
    reconciler_store: JobStore | None = None,
    signaller: StopSignaller | Client | None = None,
    cancel_lock_timeout: str = "2s",
) -> FastAPI:
    """Build the API and console over open stores (``exports_api``, and ``exports_reconciler`` for
    corrections). ``signaller`` tells a running attempt's workflow about a stop request: a Temporal
    client, any ``StopSignaller``, or ``None`` to run without Temporal (cutoff 2 still enforces stops).
    The caller owns the stores' pools and closes them."""
    if isinstance(signaller, Client):
        signaller = TemporalStopSignaller(signaller)
    app = FastAPI(
        title="Fenced Exports",
        version="1",
        description=(
            "Partner exports that tell the truth about cancellation. Authenticate with "
            "`Authorization: Bearer <token>` (minted with `python starter.py token`)."
        ),
    )
    app.state.settings = settings
    app.state.api_store = api_store
    app.state.exports = Exports(
        api_store,
        reconciler_store,
        signaller,
        temporal_ui_url=settings.temporal_ui_url,
        namespace=settings.temporal_namespace,
        cancel_lock_timeout=cancel_lock_timeout,
    )
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

    @app.get("/healthz", include_in_schema=False)
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    app.include_router(routes.router)
    app.include_router(console.router)
    app.mount("/static", StaticFiles(directory=str(Path(__file__).parent / "static")), name="static")
    return app
