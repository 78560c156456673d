"""What a process's ``main()`` calls to turn observability on, from the settings."""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from psycopg_pool import AsyncConnectionPool
from temporalio.runtime import Runtime

from observability.db_gauges import DatabaseGauges
from observability.health import MetricsServer, standard_readiness
from observability.logs import configure_logging
from observability.metrics import ExportMetrics, process_metrics
from observability.temporal import temporal_runtime
from observability.tracing import setup_tracing, trace_reads
from settings import Settings


def configure_process(settings: Settings, service: str) -> ExportMetrics:
    """Logging, tracing and the metrics object of one process; first thing in ``main()``.

    ``service`` is ``"worker"``, ``"api"`` or ``"demo"`` (the trace's service name is
    ``fenced-exports-<service>`` unless ``OTEL_SERVICE_NAME`` says otherwise). Returns the installed
    ``ExportMetrics``. At exit, ``observability.tracing.shutdown_tracing()`` flushes the spans.
    """
    configure_logging(settings.log_format, level=settings.log_level.upper())
    setup_tracing(f"fenced-exports-{service}")
    trace_reads(settings.trace_reads)
    return process_metrics(tenant_labels=settings.metrics_tenant_labels)


def busy_metrics_ports(settings: Settings) -> list[str]:
    """The worker's metrics ports (``metrics_port``, ``temporal_metrics_port``) that another process holds,
    each as one line naming its setting; checked before anything starts, so a second worker on a host
    with the default ports stops at once with a clear line rather than a traceback from the SDK's core.
    (The servers bind with SO_REUSEADDR, so this test does too: a closed listener's TIME_WAIT is no clash.)"""
    found = []
    for setting, port in (
        ("EXPORTS_METRICS_PORT", settings.metrics_port),
        ("EXPORTS_TEMPORAL_METRICS_PORT", settings.temporal_metrics_port),
    ):
        if not port:
            continue
        with socket.socket(socket.AF_INET6 if ":" in settings.metrics_host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((settings.metrics_host, port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                found.append(
                    f"{setting}: {settings.metrics_host}:{port} is in use by another process "
                    "(give each worker on a host its own port, or 0 to serve none)"
                )
    return found


def worker_runtime(settings: Settings, *, service: str = "worker") -> Runtime | None:
    """The Temporal runtime serving the SDK's metrics on ``temporal_metrics_port`` (``None`` when 0):
    pass to ``Client.connect(runtime=...)`` (``connect_client(settings, runtime=...)``)."""
    if not settings.temporal_metrics_port:
        return None
    return temporal_runtime(f"{settings.metrics_host}:{settings.temporal_metrics_port}", service=service)


@dataclass
class WorkerEndpoints:
    """What ``start_worker_endpoints`` started: the metrics server (``None`` when the port is 0) and the
    database gauges (``None`` when off). ``stop`` undoes both."""

    server: MetricsServer | None
    gauges: DatabaseGauges | None
    registry: CollectorRegistry

    @property
    def url(self) -> str | None:
        """The base URL of ``/metrics``, ``/healthz`` and ``/readyz``, or ``None`` when not served."""
        return self.server.url if self.server is not None else None

    async def stop(self) -> None:
        """Stop serving, unregister the gauges and close their connection (after the workers stopped)."""
        if self.server is not None:
            await self.server.stop()
        if self.gauges is not None:
            self.registry.unregister(self.gauges)
            self.gauges.close()


async def start_worker_endpoints(
    settings: Settings,
    metrics: ExportMetrics,
    pool: AsyncConnectionPool,
    client: Any,
    *,
    registry: CollectorRegistry = REGISTRY,
) -> WorkerEndpoints:
    """Register the database gauges, publish the intervals the alerts use, and start the metrics server
    (``/metrics``, ``/healthz``, ``/readyz`` on ``metrics_host:metrics_port``; no server when the port is
    0). The caller awaits ``stop()`` at shutdown."""
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
    endpoints = WorkerEndpoints(server=None, gauges=gauges, registry=registry)
    if not settings.metrics_port:
        return endpoints
    server = MetricsServer(
        standard_readiness(pool, client),
        host=settings.metrics_host,
        port=settings.metrics_port,
        registry=registry,
    )
    try:
        await server.start()
    except BaseException:
        await endpoints.stop()
        raise
    endpoints.server = server
    return endpoints
