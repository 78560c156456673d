"""Metrics, traces, structured logs and health for Fenced Exports (issue 11).

``metrics`` (prometheus-client counters and histograms, the Temporal SDK's runtime metrics),
``db_gauges`` (scrape-time gauges from PostgreSQL), ``tracing`` (OpenTelemetry from ``OTEL_*``),
``logs`` (JSON or text lines with the export's IDs), ``statements`` (one call per protocol statement
feeding all three), ``health`` (/healthz, /readyz, the worker's metrics server) and ``setup`` (what
``main()`` calls). Nothing here imports the store, the activities or the workflows.
"""
