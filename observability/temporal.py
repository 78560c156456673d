"""Where observability meets the Temporal SDK: the client's tracing interceptor, the workers' log-context
interceptor, and the runtime that serves the SDK's own metrics.

Kept apart from the core (``fields``, ``tracing``, ``metrics``, ``logs``, ``statements``), which the store
and the partner client import and which therefore may not import Temporal.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from temporalio import activity, client, workflow
from temporalio.api.common.v1 import Payload
from temporalio.contrib.opentelemetry import TracingInterceptor, TracingWorkflowInboundInterceptor
from temporalio.contrib.opentelemetry._interceptor import (
    _TracingActivityInboundInterceptor,
    _TracingClientOutboundInterceptor,
    _TracingWorkflowOutboundInterceptor,
)
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
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
    client side and on the workflow side). The spans, their names, kinds, parents and attributes are the
    SDK's; what changed is what they cost (``python -m bench obs``; in-process thread CPU per export, on the
    seeds' path of one workflow start and three activities, about 0.7 ms before):

    - the W3C trace-context propagator alone (no baggage), and the header payload encoded and decoded as the
      SDK's default JSON converter does, without the composite converter's lookup;
    - ``StartWorkflow`` and ``RunActivity`` spans started and ended directly, not through three generator
      context managers (``_start_as_current_span``); a failure is recorded by its type, as on the
      statement spans, not by its message and stack;
    - no ``StartActivity`` span: the workflow puts the trace context its start carried on every activity it
      schedules (the same header payload, encoded once), so each ``RunActivity`` span is a child of the
      client's ``StartWorkflow`` span, as with the SDK's own spans, without a zero-length span for the
      scheduling. The time an activity waited in its queue is on its ``RunActivity`` span instead
      (``fenced_exports.schedule_to_start_seconds``), and in the SDK's
      ``temporal_activity_schedule_to_start_latency_seconds``;
    - the workflow's ``RunWorkflow`` and ``CompleteWorkflow`` spans (and ``HandleSignal``/``HandleQuery``/
      update spans) are recorded on the worker's event loop, not inside the workflow's activation: inside
      it, the sandbox routes every ``isinstance`` of the OpenTelemetry SDK through its own wrappers, which
      made each such span cost 90 us instead of 20. They carry the workflow's own timestamps, so nothing in
      the trace changes. Spans whose context goes on an outbound call (child workflows, external signals)
      are still made in place, as the SDK does. A workflow's failure is recorded on ``CompleteWorkflow`` by
      its type, as everywhere here (the SDK records its message and stack).

    Signals, queries and updates from the client, child workflows and Nexus operations are the SDK's,
    unchanged.
    """

    def __init__(self, tracer: Any) -> None:
        super().__init__(tracer)
        self.text_map_propagator = _TRACE_CONTEXT

    def intercept_client(self, next: client.OutboundInterceptor) -> client.OutboundInterceptor:
        return _ClientTracing(next, self)

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ActivityTracing(next, self)

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[TracingWorkflowInboundInterceptor]:
        super().workflow_interceptor_class(input)  # registers the extern function the workflow side calls
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()  # the worker's
        except RuntimeError:
            loop = None
        input.unsafe_extern_functions[_DEFERRED_SPAN] = functools.partial(self._deferred_workflow_span, loop)
        return _WorkflowTracing

    def _deferred_workflow_span(self, loop: asyncio.AbstractEventLoop | None, params: Any) -> None:
        # Called from inside a workflow activation; the span is made on the worker's loop, right after.
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._completed_workflow_span, params)
                return
            except RuntimeError:  # the loop closed in between
                pass
        self._completed_workflow_span(params)

    def _completed_workflow_span(self, params: Any) -> dict[str, Any] | None:
        """The SDK's, but a workflow's failure is recorded by its type (``_error_status``), not as an
        exception event with its message and stack, which quote the activity failures it wraps."""
        if params.parent_missing and not self._always_create_workflow_spans:
            return None
        context = _context_of(params.context)
        links = []
        if params.link_context:
            linked = trace.get_current_span(_context_of(params.link_context))
            if linked is not trace.INVALID_SPAN:
                links = [trace.Link(linked.get_span_context())]
        span = self.tracer.start_span(
            params.name,
            context,
            attributes=params.attributes,
            links=links,
            start_time=params.time_ns,
            kind=params.kind,
        )
        if params.exception is not None:
            _error_status(span, params.exception)
        span.end(end_time=params.time_ns)
        carrier: dict[str, Any] = {}
        self.text_map_propagator.inject(carrier, trace.set_span_in_context(span, context))
        return carrier

    def _context_to_headers(self, headers: Mapping[str, Payload]) -> Mapping[str, Payload]:
        return _with_context(headers, self.header_key, self.text_map_propagator, None)

    def _context_from_headers(self, headers: Mapping[str, Payload]) -> otel_context.Context | None:
        carrier = _carrier(headers.get(self.header_key), self.payload_converter)
        return _context_of(carrier) if carrier else None


_DEFERRED_SPAN = "__fenced_exports_deferred_workflow_span"
_T = TypeVar("_T")
_JSON_PLAIN = b"json/plain"


# A workflow's start header reaches its RunWorkflow and CompleteWorkflow spans and every activity it
# schedules (the same payload, passed on): extracted once. A Context is immutable, so one can be shared.
_NO_CONTEXT = otel_context.Context()


def _context_of(carrier: Mapping[str, Any]) -> otel_context.Context:
    """What ``_TRACE_CONTEXT.extract(carrier)`` returns, cached by the carrier's two W3C fields."""
    traceparent, tracestate = carrier.get("traceparent"), carrier.get("tracestate")
    if not isinstance(traceparent, str):
        return _NO_CONTEXT  # as extract: nothing to continue
    return _extracted(traceparent, tracestate if isinstance(tracestate, str) else None)


@functools.lru_cache(maxsize=1024)
def _extracted(traceparent: str, tracestate: str | None) -> otel_context.Context:
    carrier = {"traceparent": traceparent}
    if tracestate is not None:
        carrier["tracestate"] = tracestate
    return _TRACE_CONTEXT.extract(carrier)


def _with_context(
    headers: Mapping[str, Payload], key: str, propagator: Any, context: otel_context.Context | None
) -> Mapping[str, Payload]:
    """``headers`` with ``context`` (the current one when ``None``) under ``key``, as the SDK encodes it."""
    carrier: dict[str, str] = {}
    propagator.inject(carrier, context)
    if not carrier:
        return headers
    data = json.dumps(carrier, separators=(",", ":"), sort_keys=True).encode()
    return {**headers, key: Payload(metadata={"encoding": _JSON_PLAIN}, data=data)}


def _carrier(payload: Payload | None, converter: Any) -> dict[str, str] | None:
    """The trace carrier in a header payload: JSON read directly, anything else by the SDK's converter."""
    if not payload:
        return None
    if payload.metadata.get("encoding") == _JSON_PLAIN:
        carrier = json.loads(payload.data)
    else:
        carrier = converter.from_payloads([payload])[0]
    return carrier if isinstance(carrier, dict) and carrier else None


def _error_status(span: trace.Span, exc: Exception) -> None:
    # As the SDK, a benign application error is no error of the span. Unlike it, by type only, as the
    # statement spans: a message can quote what the export carried.
    if not isinstance(exc, ApplicationError) or exc.category != ApplicationErrorCategory.BENIGN:
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        span.set_attribute("error.type", type(exc).__qualname__)


async def _in_span(span: trace.Span, context: otel_context.Context, call: Awaitable[_T]) -> _T:
    """``call`` awaited with ``context`` (which holds ``span``) current; the span ends after it."""
    token = otel_context.attach(context)
    try:
        return await call
    except Exception as exc:
        _error_status(span, exc)
        raise
    finally:
        otel_context.detach(token)
        span.end()


class _ClientTracing(_TracingClientOutboundInterceptor):
    """The SDK's client interceptor with ``StartWorkflow`` made directly (see ExportTracingInterceptor)."""

    root: ExportTracingInterceptor

    async def start_workflow(self, input: client.StartWorkflowInput) -> client.WorkflowHandle[Any, Any]:
        if input.start_signal:  # SignalWithStartWorkflow: the SDK's
            return await super().start_workflow(input)
        root = self.root
        span = root.tracer.start_span(
            f"StartWorkflow:{input.workflow}",
            kind=SpanKind.CLIENT,
            attributes={"temporalWorkflowID": input.id},
        )
        context = trace.set_span_in_context(span)
        input.headers = _with_context(input.headers, root.header_key, root.text_map_propagator, context)
        return await _in_span(span, context, self.next.start_workflow(input))


class _ActivityTracing(_TracingActivityInboundInterceptor):
    """The SDK's ``RunActivity`` span, made directly, with the time the activity waited in its queue."""

    root: ExportTracingInterceptor

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        waited = (info.started_time - info.current_attempt_scheduled_time).total_seconds()
        attributes: dict[str, Any] = {
            "temporalActivityID": info.activity_id,
            tracing.ATTRIBUTE_PREFIX + "schedule_to_start_seconds": max(0.0, waited),
        }
        if info.workflow_id:
            attributes["temporalWorkflowID"] = info.workflow_id
        if info.workflow_run_id:
            attributes["temporalRunID"] = info.workflow_run_id
        parent = self.root._context_from_headers(input.headers)
        span = self.root.tracer.start_span(
            f"RunActivity:{info.activity_type}", parent, kind=SpanKind.SERVER, attributes=attributes
        )
        return await _in_span(
            span, trace.set_span_in_context(span, parent), self.next.execute_activity(input)
        )


class _WorkflowTracing(TracingWorkflowInboundInterceptor):
    def __init__(self, next: WorkflowInboundInterceptor) -> None:
        super().__init__(next)
        self.text_map_propagator = _TRACE_CONTEXT
        externs: dict[str, Callable[[Any], Any]] = dict(self._extern_functions)  # type: ignore[arg-type]
        self._make_span_here = externs["__temporal_opentelemetry_completed_span"]
        self._defer_span = externs.get(_DEFERRED_SPAN, self._make_span_here)
        self._carrier_needed = False
        # What the SDK's _completed_span calls: made here when its context goes on an outbound call,
        # else deferred to the worker's loop (see ExportTracingInterceptor).
        externs["__temporal_opentelemetry_completed_span"] = self._span
        self._extern_functions = cast(Any, externs)

    def _span(self, params: Any) -> Any:
        if self._carrier_needed:
            return self._make_span_here(params)
        self._defer_span(params)
        return None

    def _completed_span(self, span_name: str, **kwargs: Any) -> None:
        self._carrier_needed = any(
            kwargs.get(k) for k in ("add_to_outbound", "add_to_outbound_str", "add_to_outbound_model")
        )
        super()._completed_span(span_name, **kwargs)

    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        # What TracingWorkflowInboundInterceptor.init does, with activity starts taken out first.
        traced = _TracingWorkflowOutboundInterceptor(outbound, self)
        WorkflowInboundInterceptor.init(self, _ActivitiesWithoutStartSpans(traced, outbound, self))


class _ActivitiesWithoutStartSpans(WorkflowOutboundInterceptor):
    """Activity starts carry the workflow's trace context in their headers, as the SDK's do, without a span
    of their own; everything else goes to the SDK's tracing outbound interceptor.

    The context the SDK would inject here is the one the workflow's start carried: no workflow-side span
    becomes current (``RunWorkflow`` and the handlers' spans are completed at once), and an activity is
    scheduled from the run or a signal or update handler, all under that context. So the start's header
    payload is passed on as it is, instead of being decoded, re-encoded and decoded again."""

    def __init__(
        self, traced: WorkflowOutboundInterceptor, plain: WorkflowOutboundInterceptor, root: _WorkflowTracing
    ) -> None:
        super().__init__(traced)
        self._plain = plain
        self._root = root

    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        if not workflow.unsafe.is_replaying():  # as the SDK: a replayed command is never sent
            started = workflow.info().headers.get(self._root.header_key)
            if started:
                input.headers = {**input.headers, self._root.header_key: started}
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
