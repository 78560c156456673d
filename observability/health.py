"""Liveness and readiness, and the small HTTP server of a worker's metrics port.

``/healthz`` answers 200 while the process's event loop runs. ``/readyz`` answers 200 only when every
readiness check passes within its timeout (PostgreSQL answers through the process's own pool, Temporal
answers, the database has every migration this build ships), else 503 with each check's verdict::

    {"status": "not ready", "checks": {"postgres": "timeout", "temporal": "ok", "migrations": "ok"}}

The API includes ``health_router`` (it has its own port) and ``instrument_fastapi``; ``worker.py`` runs
``MetricsServer`` on ``EXPORTS_METRICS_PORT`` with ``/metrics``, ``/healthz`` and ``/readyz``. The checks'
statements are the database's (``db.pool.ping``, ``db.migrate.missing_migrations``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import uvicorn
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder
from psycopg_pool import AsyncConnectionPool

from db.migrate import migration_files, missing_migrations
from db.pool import ping
from observability import tracing

Check = Callable[[], Awaitable[None]]
"""A readiness check: returns when ready, raises (anything) when not."""


class NotReady(Exception):
    """A check's own refusal, with a short reason that is safe to show."""


@dataclass(frozen=True)
class ReadinessReport:
    ready: bool
    checks: dict[str, str]

    def as_json(self) -> dict[str, Any]:
        return {"status": "ready" if self.ready else "not ready", "checks": self.checks}


class Readiness:
    """Named checks run concurrently, each bounded by ``timeout_seconds``."""

    def __init__(self, checks: Mapping[str, Check], *, timeout_seconds: float = 2.0) -> None:
        self.checks = dict(checks)
        self.timeout_seconds = timeout_seconds

    async def _run(self, check: Check) -> str:
        try:
            await asyncio.wait_for(check(), self.timeout_seconds)
        except TimeoutError:
            return "timeout"
        except NotReady as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - any failure means not ready; its type says which
            return type(exc).__name__
        return "ok"

    async def report(self) -> ReadinessReport:
        names = list(self.checks)
        verdicts = await asyncio.gather(*(self._run(self.checks[n]) for n in names))
        results = dict(zip(names, verdicts, strict=True))
        return ReadinessReport(ready=all(v == "ok" for v in verdicts), checks=results)


# -- checks -------------------------------------------------------------------------------------------


def postgres_check(pool: AsyncConnectionPool) -> Check:
    """PostgreSQL answers on a connection of ``pool`` (the process's own pool, so a pool that cannot
    reconnect is not ready either). A broken connection is discarded by the pool on return."""

    async def check() -> None:
        await ping(pool)

    return check


def expected_migrations() -> list[str]:
    """The migration files this build ships (db/migrations), by name."""
    return [name for name, _ in migration_files()]


def migrations_check(pool: AsyncConnectionPool, expected: Sequence[str] | None = None) -> Check:
    """Every migration this build ships is recorded in ``schema_migrations`` (readable by every role from
    0004). A database ahead of this build is ready: migrations only add."""
    wanted = list(expected) if expected is not None else expected_migrations()

    async def check() -> None:
        missing = await missing_migrations(pool, wanted)
        if missing:
            raise NotReady(f"missing {', '.join(missing)}")

    return check


def temporal_check(client: Any) -> Check:
    """The Temporal frontend answers ``GetSystemInfo`` (every server, the test servers included).

    ``client`` is a Temporal client, or an async function returning one (the API's signaller, which
    connects on first use).
    """
    from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

    async def check() -> None:
        connected = client if hasattr(client, "workflow_service") else await client()
        await connected.workflow_service.get_system_info(
            GetSystemInfoRequest(), retry=False, timeout=timedelta(seconds=2)
        )

    return check


def standard_readiness(
    pool: AsyncConnectionPool, client: Any | None, *, timeout_seconds: float = 2.0
) -> Readiness:
    """The checks of the API and the worker: ``postgres``, ``migrations`` and, with a client (or an async
    function returning one), ``temporal``."""
    checks: dict[str, Check] = {"postgres": postgres_check(pool), "migrations": migrations_check(pool)}
    if client is not None:
        checks["temporal"] = temporal_check(client)
    return Readiness(checks, timeout_seconds=timeout_seconds)


# -- HTTP -----------------------------------------------------------------------------------------------


def metrics_response(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The exposition of ``registry`` in the format ``accept`` asks for (text or OpenMetrics)."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


def health_router(
    readiness: Readiness | None, *, registry: CollectorRegistry | None = REGISTRY, metrics: bool = True
) -> APIRouter:
    """``/healthz``, ``/readyz`` and (with ``metrics``) ``/metrics`` as FastAPI routes.

    The API includes it in ``create_app`` (replacing its own ``/healthz``); ``readiness`` ``None`` makes
    ``/readyz`` answer like ``/healthz``. The exposition runs in a thread: a database collector's query
    must not hold up the event loop.
    """
    router = APIRouter()

    @router.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        if readiness is None:
            return JSONResponse({"status": "ready", "checks": {}})
        report = await readiness.report()
        return JSONResponse(report.as_json(), status_code=200 if report.ready else 503)

    if metrics:
        exposed = registry if registry is not None else REGISTRY

        @router.get("/metrics", include_in_schema=False)
        async def metrics_route(request: Request) -> Response:
            body, content_type = await asyncio.to_thread(
                metrics_response, exposed, request.headers.get("accept")
            )
            return Response(body, media_type=content_type)

    return router


class MetricsServer(uvicorn.Server):
    """``/metrics``, ``/healthz`` and ``/readyz`` on their own port, in the worker's event loop.

    ``worker.run_worker`` starts it beside the Temporal workers (``await server.start()``) and stops it
    last (``await server.stop()``), so ``/readyz`` keeps answering during the drain.
    """

    def __init__(
        self,
        readiness: Readiness | None,
        *,
        host: str = "127.0.0.1",
        port: int = 9464,
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
        app.include_router(health_router(readiness, registry=registry))
        super().__init__(
            uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
        )
        self._task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the worker owns SIGTERM and SIGINT

    @property
    def url(self) -> str:
        """The base URL it listens on (the real port when 0 was asked for)."""
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def start(self) -> str:
        """Start serving; returns the base URL once it accepts connections."""
        self._task = asyncio.create_task(self.serve(), name="metrics-server")
        while not self.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the metrics server stopped before it started")
            await asyncio.sleep(0.02)
        return self.url

    async def stop(self) -> None:
        """Stop accepting and wait for the server to end."""
        self.should_exit = True
        if self._task is not None:
            await self._task


def instrument_fastapi(app: FastAPI) -> bool:
    """Instrument the API (``api/app.create_app``, after the routes are added) when tracing is on: one
    server span per request, health and metrics routes excluded. Returns whether it instrumented."""
    provider = tracing.provider()
    if provider is None:
        return False
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(
        app,
        tracer_provider=provider,
        excluded_urls="/healthz,/readyz,/metrics,/static",
        exclude_spans=["receive", "send"],
    )
    return True
