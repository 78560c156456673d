"""Where observability meets the Temporal SDK: the client's tracing interceptor, the workers' log-context
interceptor, and the runtime that serves the SDK's own metrics.

Kept apart from the core (``fields``, ``tracing``, ``metrics``, ``logs``, ``statements``), which the store
and the partner client import and which therefore may not import Temporal.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from temporalio import activity, workflow
from temporalio.contrib.opentelemetry import TracingInterceptor, TracingWorkflowInboundInterceptor
from temporalio.contrib.opentelemetry._interceptor import _TracingWorkflowOutboundInterceptor
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    StartActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from observability import fields, logs, tracing

# W3C trace context only: nothing here sets baggage, and the SDK's default adds a baggage propagator to
# every inject and extract.
_TRACE_CONTEXT = TraceContextTextMapPropagator()


def temporal_interceptors() -> list[Any]:
    """``[ExportTracingInterceptor]`` when tracing is on, else ``[]``: passed to
    ``Client.connect(interceptors=...)`` by ``service/temporal.connect_client``; the workers made from that
    client inherit it, so a client's start, the workflow and its activities share one trace."""
    provider = tracing.provider()
    if provider is None:
        return []
    return [ExportTracingInterceptor(provider.get_tracer("temporalio"))]


class ExportTracingInterceptor(TracingInterceptor):
    """temporalio's ``TracingInterceptor``, customized the way its documentation says to (a subclass on the
    client side and on the workflow side), in two ways:

    - the W3C trace-context propagator alone (no baggage);
    - no ``StartActivity`` span: the workflow still puts its trace context on every activity it schedules,
      so each ``RunActivity`` span is a child of the client's ``StartWorkflow`` span in the same trace, but it
      does not make a zero-length span for the scheduling. Made through the workflow sandbox, those were
      three of an export's five workflow-side spans, and the workflow side was a quarter of what tracing
      cost an export (``python -m bench obs``). The time an activity waited in its queue is on its
      ``RunActivity`` span instead (``fenced_exports.schedule_to_start_seconds``), and in the SDK's
      ``temporal_activity_schedule_to_start_latency_seconds``.

    ``RunWorkflow``, ``CompleteWorkflow``, ``StartWorkflow``, ``RunActivity`` and the spans of signals,
    queries, updates and child workflows are the SDK's, unchanged.
    """

    def __init__(self, tracer: Any) -> None:
        super().__init__(tracer)
        self.text_map_propagator = _TRACE_CONTEXT

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[TracingWorkflowInboundInterceptor]:
        super().workflow_interceptor_class(input)  # registers the extern function the workflow side calls
        return _WorkflowTracing


class _WorkflowTracing(TracingWorkflowInboundInterceptor):
    def __init__(self, next: WorkflowInboundInterceptor) -> None:
        super().__init__(next)
        self.text_map_propagator = _TRACE_CONTEXT

    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        # What TracingWorkflowInboundInterceptor.init does, with activity starts taken out first.
        traced = _TracingWorkflowOutboundInterceptor(outbound, self)
        WorkflowInboundInterceptor.init(self, _ActivitiesWithoutStartSpans(traced, outbound, self))


class _ActivitiesWithoutStartSpans(WorkflowOutboundInterceptor):
    """Activity starts carry the workflow's trace context in their headers, as the SDK's do, without a span
    of their own; everything else goes to the SDK's tracing outbound interceptor."""

    def __init__(
        self, traced: WorkflowOutboundInterceptor, plain: WorkflowOutboundInterceptor, root: _WorkflowTracing
    ) -> None:
        super().__init__(traced)
        self._plain = plain
        self._root = root

    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        if not workflow.unsafe.is_replaying():  # as the SDK: a replayed command is never sent
            input.headers = self._root._context_to_headers(input.headers)
        return self._plain.start_activity(input)


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
        span = trace.get_current_span()  # the SDK's RunActivity span: its interceptor is the outer one
        if span.is_recording():
            waited = (info.started_time - info.current_attempt_scheduled_time).total_seconds()
            tracing.set_attributes(span, schedule_to_start_seconds=max(0.0, waited))
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
