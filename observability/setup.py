"""What a process's ``main()`` calls to turn observability on, from the settings."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from psycopg_pool import AsyncConnectionPool
from temporalio.runtime import Runtime

from observability.db_gauges import DatabaseGauges
from observability.health import MetricsServer, standard_readiness
from observability.logs import configure_logging
from observability.metrics import ExportMetrics, set_metrics, temporal_runtime
from observability.tracing import setup_tracing
from settings import Settings


def configure_process(settings: Settings, service: str) -> ExportMetrics:
    """Logging, tracing and the metrics object of one process; first thing in ``main()``.

    ``service`` is ``"worker"`` or ``"api"`` (the trace's service name is ``fenced-exports-<service>``
    unless ``OTEL_SERVICE_NAME`` says otherwise). Returns the installed ``ExportMetrics``.
    """
    configure_logging(settings.log_format, level=settings.log_level.upper())
    setup_tracing(f"fenced-exports-{service}")
    return set_metrics(ExportMetrics(tenant_labels=settings.metrics_tenant_labels))


def worker_runtime(settings: Settings) -> Runtime | None:
    """The Temporal runtime serving the SDK's metrics on ``temporal_metrics_port`` (``None`` when 0):
    pass to ``Client.connect(runtime=...)``."""
    if not settings.temporal_metrics_port:
        return None
    return temporal_runtime(f"{settings.metrics_host}:{settings.temporal_metrics_port}", service="worker")


async def start_worker_endpoints(
    settings: Settings,
    metrics: ExportMetrics,
    pool: AsyncConnectionPool,
    client: Any,
    *,
    registry: CollectorRegistry = REGISTRY,
) -> tuple[MetricsServer | None, DatabaseGauges | None]:
    """Register the database gauges, publish the intervals the alerts use, and start the metrics server
    (``/metrics``, ``/healthz``, ``/readyz`` on ``metrics_host:metrics_port``); ``(None, ...)`` when the
    port is 0. The caller stops the server and closes the gauges' connection at shutdown."""
    gauges = None
    if settings.metrics_db_gauges and settings.database_url:
        gauges = DatabaseGauges(settings.database_url, cache_seconds=settings.metrics_db_cache_seconds)
        registry.register(gauges)
    metrics.describe_settings(
        recovery_every_seconds=settings.recovery_every_seconds,
        renew_every_seconds=settings.renew_every_seconds,
        lease_seconds=settings.lease_seconds,
        sweep_after_seconds=settings.sweep_after_seconds,
        sweep_every_seconds=settings.sweep_every_seconds,
    )
    if not settings.metrics_port:
        return None, gauges
    server = MetricsServer(
        standard_readiness(pool, client),
        host=settings.metrics_host,
        port=settings.metrics_port,
        registry=registry,
    )
    await server.start()
    return server, gauges
