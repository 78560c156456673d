"""Traces: off unless an OTEL_* variable asks; when on, one trace runs from the API's span through the
outbox hop and a real Temporal workflow into the activity's statement and SFTP spans; attributes carry
IDs, sizes and codes only."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry import trace as trace_api
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.opentelemetry._interceptor import _CompletedWorkflowSpanParams
from temporalio.converter import PayloadConverter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from observability import logs, tracing
from observability.health import instrument_fastapi
from observability.metrics import ExportMetrics, get_metrics, set_metrics
from observability.statements import observe_statement
from observability.temporal import (
    _TRACE_CONTEXT,
    ExportTracingInterceptor,
    LogContextInterceptor,
    _carrier,
    _context_of,
    _with_context,
    temporal_interceptors,
)
from tests.observability.traced_workflow import (
    FailingWorkflow,
    ParentWorkflow,
    StepInput,
    TracedWorkflow,
    failing_step,
    traced_step,
)


@pytest.fixture
def metrics() -> Iterator[ExportMetrics]:
    previous = get_metrics()
    yield set_metrics(ExportMetrics(CollectorRegistry()))
    set_metrics(previous)


@pytest.fixture
def spans(metrics) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.setup_tracing("fenced-exports-test", exporter=exporter, set_global=False)
    yield exporter
    tracing.shutdown_tracing()


@pytest.fixture(scope="module")
def temporal(ts_env: WorkflowEnvironment) -> WorkflowEnvironment:
    """The session's time-skipping test server (tests/fix_temporal.py)."""
    return ts_env


def by_name(exporter: InMemorySpanExporter) -> dict[str, object]:
    return {s.name: s for s in exporter.get_finished_spans()}


# -- on and off -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"OTEL_SERVICE_NAME": "x"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
    ],
)
def test_tracing_is_on_only_when_an_otel_variable_asks(environ, expected):
    assert tracing.requested_exporter(environ) == expected


def test_off_means_no_provider_no_interceptor_and_non_recording_spans(metrics):
    assert tracing.setup_tracing("fenced-exports-test", environ={}, set_global=False) is None
    assert not tracing.tracing_enabled()
    assert temporal_interceptors() == []
    assert instrument_fastapi(FastAPI()) is False
    with observe_statement("claim_if_queued", {"job_id": uuid.uuid4()}) as span:
        assert not span.is_recording()
    assert tracing.current_traceparent() is None
    # Negligible: the whole per-statement helper (span, histogram) with tracing off.
    started = time.perf_counter()
    for _ in range(10_000):
        with observe_statement("claim_if_queued"):
            pass
    per_call = (time.perf_counter() - started) / 10_000
    print(f"observe_statement with tracing off: {per_call * 1e6:.1f} us per call")
    assert per_call < 100e-6


class _Collector(BaseHTTPRequestHandler):
    received: list[ExportTraceServiceRequest] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        type(self).received.append(request)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_otlp_endpoint_from_the_environment_receives_the_spans(monkeypatch, metrics):
    # A real OTLP/HTTP receiver on loopback, configured only through OTEL_* variables.
    _Collector.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "fenced-exports-otlp-test")
        assert tracing.setup_tracing("fenced-exports-worker", set_global=False) is not None
        job_id = uuid.uuid4()
        with observe_statement("authorize_delivery_if_running", {"job_id": job_id, "length": 5}):
            pass
        tracing.shutdown_tracing()  # flushes the batch
    finally:
        server.shutdown()
        server.server_close()
    exported = [
        (resource, span)
        for request in _Collector.received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    assert [span.name for _, span in exported] == ["authorize_delivery_if_running"]
    resource, span = exported[0]
    service = {a.key: a.value.string_value for a in resource.resource.attributes}["service.name"]
    assert service == "fenced-exports-otlp-test"  # OTEL_SERVICE_NAME wins over the default
    attributes = {a.key: a.value for a in span.attributes}
    assert attributes["fenced_exports.job_id"].string_value == str(job_id)
    assert attributes["fenced_exports.bytes"].int_value == 5


# -- what a span may carry --------------------------------------------------------------------------------


def test_statement_and_sftp_spans_nest_and_carry_ids_sizes_and_codes(spans):
    job_id, attempt_id = uuid.uuid4(), uuid.uuid4()
    params = {"job_id": job_id, "attempt_id": attempt_id, "reason": "alice@example.com", "sha256": b"\x01"}
    with tracing.tracer().start_as_current_span("RunActivity:deliver") as parent:
        with observe_statement("finish_delivery", {**params, "outcome": "Completed"}) as span:
            tracing.set_attributes(span, result="written")
        with tracing.sftp_span("upload", bytes=1_000_000, error_code=4):
            pass
    found = by_name(spans)
    statement, upload = found["finish_delivery"], found["sftp upload"]
    for child in (statement, upload):
        assert child.parent.span_id == parent.get_span_context().span_id
        assert child.context.trace_id == parent.get_span_context().trace_id
    assert statement.attributes["fenced_exports.statement"] == "finish_delivery"
    assert statement.attributes["fenced_exports.job_id"] == str(job_id)
    assert statement.attributes["fenced_exports.attempt_id"] == str(attempt_id)
    assert statement.attributes["fenced_exports.outcome"] == "Completed"
    assert statement.attributes["fenced_exports.result"] == "written"
    assert upload.attributes["fenced_exports.bytes"] == 1_000_000
    everything = json.dumps([dict(s.attributes) for s in spans.get_finished_spans()], default=str)
    assert "alice" not in everything and "reason" not in everything and "sha256" not in everything


@pytest.mark.parametrize(
    "values",
    [
        {"email": "alice@example.com"},
        {"job_id": "alice@example.com"},
        {"outcome": "alice@example.com"},
        {"rows": "12"},
    ],
)
def test_anything_but_ids_sizes_and_codes_is_refused(spans, values):
    with pytest.raises(ValueError):
        with tracing.statement_span("claim_if_queued", **values):
            pass


def test_an_exception_is_recorded_by_type_never_by_message(spans):
    class UniqueViolation(Exception):
        pass

    with pytest.raises(UniqueViolation):
        with observe_statement("create_original"):
            raise UniqueViolation("Key (email)=(alice@example.com) already exists")
    (span,) = spans.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description == "UniqueViolation"
    assert not span.events
    assert "alice" not in json.dumps(dict(span.attributes))


async def test_fastapi_requests_are_server_spans_around_their_statements(spans):
    app = FastAPI()

    @app.get("/exports/{export_id}")
    async def read(export_id: uuid.UUID) -> dict[str, str]:
        with observe_statement("get_tenant_job", {"job_id": export_id}):
            pass
        return {"id": str(export_id)}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    assert instrument_fastapi(app)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as http:
        assert (await http.get(f"/exports/{uuid.uuid4()}")).status_code == 200
        assert (await http.get("/healthz")).status_code == 200
    found = by_name(spans)
    server, statement = found["GET /exports/{export_id}"], found["get_tenant_job"]
    assert statement.parent.span_id == server.context.span_id
    assert not [name for name in found if "healthz" in name]


# -- one trace through the outbox and Temporal ---------------------------------------------------------


async def run_traced(temporal, workflows, activities, body):
    """``body(client, queue)`` with a worker of ``workflows`` and ``activities`` whose client traces, with
    the log-context interceptor of worker.py's workers."""
    client = Client(**{**temporal.client.config(), "interceptors": temporal_interceptors()})
    queue = f"traced-{uuid.uuid4()}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=workflows,
        activities=activities,
        interceptors=[LogContextInterceptor()],
    ):
        return await body(client, queue)


def assert_parents(found, parents: dict[str, str]) -> None:
    """Each span named on the left is a child of the span named on the right."""
    for child, parent in parents.items():
        assert found[child].parent.span_id == found[parent].context.span_id, (child, parent)


async def test_one_trace_from_the_api_through_the_outbox_and_temporal_into_the_activity(spans, temporal):
    job_id, attempt_id = str(uuid.uuid4()), str(uuid.uuid4())
    # The API: a request span; the store would write this traceparent into the outbox row.
    with tracing.tracer().start_as_current_span("POST /exports") as api:
        traceparent = tracing.current_traceparent()
    assert traceparent is not None

    async def dispatcher(client, queue):
        # Later and elsewhere: continues the trace read from the row around the start.
        with tracing.continue_trace(traceparent):
            handle = await client.start_workflow(
                TracedWorkflow.run,
                StepInput(job_id=job_id, attempt_id=attempt_id),
                id=f"export-{job_id}",
                task_queue=queue,
            )
        return await handle.result()

    stream = io.StringIO()
    handler = logs.configure_logging("json", stream=stream)
    try:
        assert await run_traced(temporal, [TracedWorkflow], [traced_step], dispatcher) == 1234
    finally:
        logging.getLogger().removeHandler(handler)

    found = by_name(spans)
    # The temporalio interceptor parents the workflow's own spans to the client's StartWorkflow; activity
    # starts carry that context without a StartActivity span of their own (ExportTracingInterceptor).
    assert_parents(
        found,
        {
            "StartWorkflow:TracedWorkflow": "POST /exports",
            "RunWorkflow:TracedWorkflow": "StartWorkflow:TracedWorkflow",
            "RunActivity:traced_step": "StartWorkflow:TracedWorkflow",
            "CompleteWorkflow:TracedWorkflow": "StartWorkflow:TracedWorkflow",
            "claim_if_queued": "RunActivity:traced_step",
            "sftp upload": "RunActivity:traced_step",
        },
    )
    assert not [name for name in found if name.startswith("StartActivity:")]
    waited = found["RunActivity:traced_step"].attributes["fenced_exports.schedule_to_start_seconds"]
    assert isinstance(waited, float) and 0 <= waited < 30
    trace_id = api.get_span_context().trace_id
    assert {s.context.trace_id for s in spans.get_finished_spans()} == {trace_id}

    # The activity's log lines carry the export's IDs, the workflow and the trace.
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    step = next(line for line in lines if line["message"] == "step done")
    assert step["job_id"] == job_id and step["attempt_id"] == attempt_id
    assert step["workflow_id"] == f"export-{job_id}"
    assert step["trace_id"] == format(trace_id, "032x")
    transition = next(line for line in lines if line.get("statement") == "claim_if_queued")
    assert transition["result"] == "written" and transition["job_id"] == job_id


class EndedOn(SpanProcessor):
    """Which thread each span ended on, by name."""

    def __init__(self) -> None:
        self.threads: dict[str, threading.Thread] = {}

    def on_end(self, span: ReadableSpan) -> None:
        self.threads[span.name] = threading.current_thread()


@pytest.fixture
def ended_on(spans) -> EndedOn:
    recorder = EndedOn()
    provider = tracing.provider()
    assert provider is not None
    provider.add_span_processor(recorder)
    return recorder


async def test_workflow_spans_are_made_on_the_workers_loop_not_inside_the_activation(
    spans, ended_on, temporal
):
    """Inside an activation the sandbox wraps every isinstance of the OpenTelemetry SDK: RunWorkflow and
    CompleteWorkflow are recorded on the worker's loop (here the test's, on the main thread), with the
    workflow's timestamps, while a span whose context goes on a call is made in place (below)."""

    async def body(client, queue):
        with tracing.tracer().start_as_current_span("POST /exports"):
            handle = await client.start_workflow(
                TracedWorkflow.run,
                StepInput(job_id=str(uuid.uuid4()), attempt_id=str(uuid.uuid4())),
                id=f"export-{uuid.uuid4()}",
                task_queue=queue,
            )
        return await handle.result()

    assert await run_traced(temporal, [TracedWorkflow], [traced_step], body) == 1234
    found = by_name(spans)
    for name in ("RunWorkflow:TracedWorkflow", "CompleteWorkflow:TracedWorkflow"):
        assert ended_on.threads[name] is threading.main_thread(), name
        assert found[name].start_time == found[name].end_time  # the workflow's time, zero length
    assert found["RunWorkflow:TracedWorkflow"].start_time >= found["StartWorkflow:TracedWorkflow"].start_time


async def test_a_signal_and_a_child_workflow_keep_the_sdks_spans_and_parents(spans, ended_on, temporal):
    inp = StepInput(job_id=str(uuid.uuid4()), attempt_id=str(uuid.uuid4()))

    async def body(client, queue):
        with tracing.tracer().start_as_current_span("POST /exports"):
            handle = await client.start_workflow(
                ParentWorkflow.run, inp, id=f"export-{uuid.uuid4()}", task_queue=queue
            )
        with tracing.tracer().start_as_current_span("operator"):
            await handle.signal(ParentWorkflow.go)
        return await handle.result()

    assert await run_traced(temporal, [ParentWorkflow, TracedWorkflow], [traced_step], body) == 1234
    found = by_name(spans)
    assert_parents(
        found,
        {
            "StartWorkflow:ParentWorkflow": "POST /exports",
            "RunWorkflow:ParentWorkflow": "StartWorkflow:ParentWorkflow",
            "HandleSignal:go": "StartWorkflow:ParentWorkflow",
            "StartChildWorkflow:TracedWorkflow": "StartWorkflow:ParentWorkflow",
            "RunWorkflow:TracedWorkflow": "StartChildWorkflow:TracedWorkflow",
            "RunActivity:traced_step": "StartChildWorkflow:TracedWorkflow",
            "claim_if_queued": "RunActivity:traced_step",
        },
    )
    (link,) = found["HandleSignal:go"].links
    assert link.context.span_id == found["SignalWorkflow:go"].context.span_id
    assert ended_on.threads["HandleSignal:go"] is threading.main_thread()
    # The child's start carries this span's context: made in place, inside the parent's activation.
    assert ended_on.threads["StartChildWorkflow:TracedWorkflow"] is not threading.main_thread()
    # One trace, but for the operator's signal, which has its own and is linked.
    signal = {"operator", "SignalWorkflow:go"}
    assert len({s.context.trace_id for s in spans.get_finished_spans() if s.name not in signal}) == 1


@pytest.mark.parametrize("benign", [False, True])
async def test_a_failed_activity_and_workflow_are_recorded_by_type_never_by_message(spans, temporal, benign):
    async def body(client, queue):
        with tracing.tracer().start_as_current_span("POST /exports"):
            handle = await client.start_workflow(
                FailingWorkflow.run, benign, id=f"export-{uuid.uuid4()}", task_queue=queue
            )
        with pytest.raises(WorkflowFailureError):
            await handle.result()

    await run_traced(temporal, [FailingWorkflow], [failing_step], body)
    found = by_name(spans)
    activity_span, completed = found["RunActivity:failing_step"], found["CompleteWorkflow:FailingWorkflow"]
    if benign:
        assert activity_span.status.status_code == StatusCode.UNSET
    else:
        assert activity_span.status.status_code == StatusCode.ERROR
        assert activity_span.status.description == "ApplicationError"
        assert activity_span.attributes["error.type"] == "ApplicationError"
    assert completed.status.status_code == StatusCode.ERROR  # the workflow failed: ActivityError
    assert completed.attributes["error.type"] == "ActivityError"
    everything = json.dumps(
        [
            [dict(s.attributes), s.status.description, [(e.name, dict(e.attributes)) for e in s.events]]
            for s in spans.get_finished_spans()
        ],
        default=str,
    )
    assert "alice" not in everything


def test_a_workflow_span_deferred_to_a_closed_loop_is_made_at_once(spans):
    """A worker whose loop has closed (the process is ending) still gets its workflow spans, in place."""
    interceptor = temporal_interceptors()[0]
    with tracing.tracer().start_as_current_span("StartWorkflow:W") as start:
        carrier: dict[str, str] = {}
        _TRACE_CONTEXT.inject(carrier)
    params = _CompletedWorkflowSpanParams(
        context=carrier,
        name="CompleteWorkflow:W",
        attributes={"temporalWorkflowID": "w"},
        time_ns=time.time_ns(),
        link_context=None,
        exception=None,
        kind=SpanKind.INTERNAL,
        parent_missing=False,
    )
    loop = asyncio.new_event_loop()
    loop.close()
    interceptor._deferred_workflow_span(loop, params)
    span = by_name(spans)["CompleteWorkflow:W"]
    assert span.parent.span_id == start.get_span_context().span_id


def test_the_trace_header_is_encoded_as_the_sdks_default_converter_does():
    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    ours = _with_context({}, "_tracer-data", _TRACE_CONTEXT, _TRACE_CONTEXT.extract(carrier))["_tracer-data"]
    assert ours == PayloadConverter.default.to_payloads([carrier])[0]
    assert _carrier(ours, PayloadConverter.default) == carrier
    # Another encoding goes through the SDK's converter; an empty or absent payload is no context.
    assert _carrier(PayloadConverter.default.to_payloads([None])[0], PayloadConverter.default) is None
    assert _carrier(None, PayloadConverter.default) is None


@pytest.mark.parametrize(
    "carrier",
    [
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", "tracestate": "a=1,b=2"},
        {"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"},  # invalid: no parent
        {"traceparent": "not a traceparent"},
        {"tracestate": "a=1"},
    ],
)
def test_a_header_is_extracted_once_and_as_the_propagator_does(carrier):
    """The start's header reaches RunWorkflow, CompleteWorkflow and every RunActivity: one decode and
    extract serves them all, and gives what the W3C propagator gives."""
    expected = trace_api.get_current_span(_TRACE_CONTEXT.extract(carrier)).get_span_context()
    payload = PayloadConverter.default.to_payloads([carrier])[0]
    interceptor = ExportTracingInterceptor(trace_api.NoOpTracer())
    first = interceptor._context_from_headers({interceptor.header_key: payload})
    again = interceptor._context_from_headers({interceptor.header_key: payload})
    assert first is again
    assert trace_api.get_current_span(first).get_span_context() == expected
    assert trace_api.get_current_span(_context_of(dict(carrier))).get_span_context() == expected
    assert interceptor._context_from_headers({}) is None


async def test_reads_get_a_span_only_when_asked_and_writes_always(spans, factory):
    """A span costs tens of microseconds of CPU: an export's reads (its row, its destination) are timed by
    the statement histogram but traced only with EXPORTS_TRACE_READS; its writes are always traced."""
    job, attempt = await factory.running()
    await factory.worker.get_job(job.id)
    await factory.worker.renew_lease(job.id, attempt)
    names = [s.name for s in spans.get_finished_spans()]
    assert "renew_lease" in names and "get_job" not in names

    spans.clear()
    tracing.trace_reads(True)
    try:
        await factory.worker.get_job(job.id)
    finally:
        tracing.trace_reads(False)
    assert [s.name for s in spans.get_finished_spans()] == ["get_job"]


def test_an_evidence_append_is_an_event_on_its_step_not_a_span_of_its_own(spans):
    # A span costs tens of microseconds: the six evidence appends of an export were a fifth of its spans.
    job_id, attempt_id = uuid.uuid4(), uuid.uuid4()
    with tracing.sftp_span("rename"):
        with observe_statement(
            "append_delivery_evidence",
            {"job_id": job_id, "attempt_id": attempt_id, "detail": "alice@example.com"},
        ):
            pass
    [rename] = spans.get_finished_spans()
    [event] = rename.events
    assert event.name == "append_delivery_evidence"
    assert event.attributes["fenced_exports.job_id"] == str(job_id)
    assert event.attributes["fenced_exports.attempt_id"] == str(attempt_id)
    assert "alice" not in json.dumps(dict(event.attributes), default=str)


def test_a_failed_sftp_step_ends_its_span_as_an_error_by_type_and_the_exception_goes_on(spans):
    class PartnerSaidNo(OSError):
        pass

    with pytest.raises(PartnerSaidNo, match="alice"):
        with tracing.sftp_span("upload", bytes=10) as span:
            assert span.is_recording()
            raise PartnerSaidNo("alice@example.com: permission denied")
    [upload] = spans.get_finished_spans()
    assert upload.name == "sftp upload" and upload.end_time is not None
    assert upload.status.status_code is StatusCode.ERROR
    assert upload.status.description == "PartnerSaidNo"
    assert "alice" not in json.dumps([dict(upload.attributes), upload.status.description], default=str)


def test_with_tracing_off_an_sftp_step_runs_with_a_span_that_records_nothing():
    before = tracing.provider()
    tracing.use_provider(None)
    try:
        ran = []
        for _ in range(2):  # the off span is one shared object: usable again
            with tracing.sftp_span("rename") as span:
                ran.append(span.is_recording())
        assert ran == [False, False]
    finally:
        tracing.use_provider(before)
