"""Where observability meets the Temporal SDK: the client's tracing interceptor, the workers' log-context
interceptor, and the runtime that serves the SDK's own metrics.

Kept apart from the core (``fields``, ``tracing``, ``metrics``, ``logs``, ``statements``), which the store
and the partner client import and which therefore may not import Temporal.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from observability import fields, logs, tracing


def temporal_interceptors() -> list[Any]:
    """``[TracingInterceptor]`` when tracing is on, else ``[]``: passed to ``Client.connect(interceptors=...)``
    by ``service/temporal.connect_client``; the workers made from that client inherit it, so a client's
    start, the workflow and its activities share one trace."""
    provider = tracing.provider()
    if provider is None:
        return []
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return [TracingInterceptor(provider.get_tracer("temporalio"))]


def workflow_runner() -> SandboxedWorkflowRunner:
    """The workflow sandbox with ``opentelemetry`` passed through (as the SDK's own OpenTelemetryPlugin
    does): the tracing interceptor's workflow side uses it, and re-importing it in every workflow run's
    sandbox cost 15-20 % of an export's CPU here (``python -m bench obs --on temporal``). Passed as
    ``Worker(workflow_runner=...)`` by worker.py; harmless with tracing off."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules("opentelemetry")
    )


def _input_fields(args: Any) -> dict[str, Any]:
    # Activity inputs are pydantic models of IDs (or dicts of them); take the IDs they carry.
    found: dict[str, Any] = {}
    first = args[0] if args else None
    for key in ("job_id", "attempt_id", "tenant_id"):
        value = first.get(key) if isinstance(first, dict) else getattr(first, key, None)
        if value is not None:
            found[key] = value
    return found


class _ActivityContext(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        values = {
            "workflow_id": info.workflow_id,
            "activity": info.activity_type,
            **_input_fields(input.args),
        }
        try:
            cleaned = fields.clean_all(values)
        except ValueError:
            cleaned = fields.clean_all({"activity": info.activity_type})
        with logs.bind(**cleaned):
            return await self.next.execute_activity(input)


class LogContextInterceptor(Interceptor):
    """A worker interceptor that binds ``workflow_id``, the activity type and the ``job_id`` /
    ``attempt_id`` / ``tenant_id`` of the activity's input around every activity, so their log lines
    carry them without a call in each activity. Passed in ``Worker(interceptors=[...])`` of the workers
    in worker.py."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ActivityContext(next)


def temporal_runtime(bind_address: str, *, service: str = "worker") -> Runtime:
    """A Temporal ``Runtime`` whose core serves the SDK's own metrics for Prometheus at ``bind_address``
    (``host:port``, path ``/metrics``): worker task slots, poll and schedule-to-start latencies, activity
    and workflow task outcomes, sticky cache, request failures. Names start ``temporal_``, counters end
    ``_total`` and durations are in seconds, as ours.

    Build it once per process in ``main()`` and pass it to ``Client.connect(runtime=...)``; every worker
    made from that client reports through it. It opens its own listener: give it a port other than
    ``EXPORTS_METRICS_PORT``.
    """
    return Runtime(
        telemetry=TelemetryConfig(
            metrics=PrometheusConfig(
                bind_address=bind_address,
                counters_total_suffix=True,
                unit_suffix=True,
                durations_as_seconds=True,
            ),
            global_tags={"service": service},
        )
    )
