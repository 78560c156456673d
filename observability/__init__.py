"""Metrics, traces, structured logs and health for Fenced Exports (issue 11).

The core, which the store and the partner client import and which therefore imports nothing of ours, no
driver, no Temporal and no web framework (a lint-imports contract): ``fields`` (what a span or a log line
may carry), ``tracing`` (OpenTelemetry from ``OTEL_*``), ``metrics`` (prometheus-client counters and
histograms), ``logs`` (JSON or text lines with the export's IDs) and ``statements`` (one call per
protocol statement feeding all three).

The edges, which the entry points wire: ``temporal`` (the client's tracing interceptor, the workers'
log-context interceptor and sandbox, the SDK's metrics runtime), ``health`` (/healthz, /readyz, the
worker's metrics server, the API's instrumentation), ``db_gauges`` (scrape-time gauges from the database,
whose SQL is db/'s) and ``setup`` (what ``main()`` calls). None of them imports the activities, the
workflows, the service or the API.
"""
